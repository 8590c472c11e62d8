// Package shm is the transport of control connections between processes of
// one host: after wire.Handshake has authenticated both ends of a socket
// (and both agreed to it: HandshakeConfig.SharedMemory), Upgrade moves the
// connection's byte stream to two single-producer single-consumer rings in
// shared memory, one per direction, and returns a *Conn, a net.Conn on
// which wire.Conn's framing runs unchanged. Processes on other hosts, or
// that cannot share the memory, stay on the socket (ErrFallback).
//
// Setup: the initiator sends its host id (the kernel's boot id); the
// acceptor, on the same host, makes a region in Config.Dir (a 0600 file of
// memory and four FIFOs, named by 128 random bits, created exclusively) and
// names it; the initiator opens it, checks owner, mode, size and the
// header's nonce, unlinks the files, and writes its own nonce into the
// region as proof that both map the same memory; the acceptor checks the
// proof. Nothing is mapped before the handshake succeeded.
//
// Limits (cluster's membership uses one per node) bounds what upgrades
// hold: at most one in flight per peer name and direction, and the bytes of
// the regions in flight or established within Config.RegionBudget; an
// upgrade past either is declined in the exchange and both ends stay on
// the socket (ErrRefused, with ErrFallback). A peer that starts hundreds of
// upgrades at once so holds one region and its four FIFOs, not hundreds.
//
// Wake-ups: an end with nothing to read (or no room to write) spins for a
// while, bounded and adaptive (Config.Spin: internal/park's Spin, plus one
// yield after the first poll and a switch that stops spinning while the
// spin rarely ends a wait; no spin by default with fewer than
// fastpath.MinProcs processors and CPUs, where it would take the CPU the
// peer needs, unless TENSORFERRY_FASTPATHS=on), then sets a flag in the
// region and sleeps in Go's poller on a FIFO, to which the other end
// writes one byte when it finds the flag set (park.Wait and park.Wake).
//
// A Conn is a wire.InterruptibleReader: a read deadline set in the past
// ends a Read that spins or sleeps, with nothing read, so a caller waiting
// for its reply may read the rings itself (wire.Conn.Await), as it reads
// a socket.
//
// Liveness: the socket stays open, silent, beside the rings: when the peer
// closes it or dies, this end reads what is left in the ring and then
// io.EOF; writes fail.
//
// Trust: the peer is authenticated, and a process of the same user, but
// may still be broken. It can write any byte of the region at any time.
// Each end reads only the peer's index word and checks it against its own
// copy of its index and the ring's fixed capacity on every read (ErrCorrupt
// for a tail behind the data read or more than a ring ahead, a head that
// went back or past the data written); it copies the ring's bytes out
// before anything parses them (wire's framer bounds every length); unsafe
// is used only to view the aligned index and flag words as sync/atomic
// values, never on the ring's contents. Every such failure costs only that
// connection.
//
// Faults: a region is a file of Config.Dir, which the peer, or any process
// of this user while the files exist, may truncate; an access past its end
// then faults (SIGBUS). Every access to a mapping, at every stage (the
// acceptor's header and its reading of the proof, the initiator's reading
// of the header and writing of the proof, and Conn.Read and Conn.Write
// afterwards), runs with runtime/debug.SetPanicOnFault on and recovers the
// fault as an error: during the upgrade it fails that connection (or, for
// the initiator's header, leaves it on the socket), afterwards that Conn,
// for good. The alternative, a memfd sealed against shrinking
// (F_SEAL_SHRINK) whose size the opener checks, would need the fd passed
// between the ends: they talk over TCP (no SCM_RIGHTS), and opening
// /proc/<pid>/fd/<n> of a pid the peer claims needs ptrace access, which
// hardened hosts (hidepid, non-dumpable processes, other pid namespaces)
// refuse. The guard covers every access with one deferred call per Read
// or Write, and a truncation by anyone, the peer or a racing process,
// costs at most that connection. With TLS on the
// socket, the rings still carry plaintext: they never leave the host, and
// only processes of the same user can map them.
//
// Use (cluster's membership does this for every control connection):
//
//	peer, err := wire.Handshake(ctx, nc, wire.HandshakeConfig{..., SharedMemory: cfg.Usable() == nil}, initiator)
//	if err == nil && peer.SharedMemory {
//		if c, uerr := shm.Upgrade(ctx, nc, cfg, initiator); uerr == nil {
//			nc = c // the rings
//		} else if !errors.Is(uerr, shm.ErrFallback) {
//			return uerr // nc is closed
//		}
//	}
//	conn := wire.NewConn(nc, peer, opts)
package shm
