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
// Wake-ups: an end with nothing to read (or no room to write) spins for a
// while, adaptively and bounded (Config.Spin; no spin by default with
// fewer than wire.SpinMinProcs processors, where it would take the CPU the
// peer needs), then sets a
// flag in the region and sleeps in Go's poller on a FIFO, to which the
// other end writes one byte when it finds the flag set.
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
// values, never on the ring's contents. A peer that truncates the region's
// file makes this end's accesses fault: that is an error of this Conn, not
// a crash. Every such failure costs only that connection. With TLS on the
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
