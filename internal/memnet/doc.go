// Package memnet is an in-memory network for tests of failure: nodes listen
// and dial by address through buffered duplex connections, and the test
// injects faults between hosts (a stalled link, a cut connection, a delay
// per write, a partition) and heals them, without real sockets and without
// waiting for the kernel. It plays the part etcd's rafttest network plays
// for raft, for a stream transport.
//
// Every endpoint belongs to a host, named by the test; faults are set
// between hosts, so a node that listens on two addresses (control and data)
// is one host. Network.Host gives an endpoint that listens and dials as
// that host; the Network's own Listen and DialContext act as the host
// named "".
//
// Faults draw from a generator seeded by New, so a run that failed replays
// the same draws (delays, resets) when the goroutines are scheduled alike.
//
//	n := memnet.New(1)
//	a, b := n.Host("a"), n.Host("b")
//	ln, _ := b.Listen("b:1")
//	go func() { c, _ := ln.Accept(); io.Copy(c, c) }() // an echo server
//	c, _ := a.DialContext(ctx, "b:1")
//	n.Stall("a", "b") // bytes stop flowing both ways; writes fill the buffer
//	n.Heal()          // they flow again, in order
//	n.Cut("a", "b")   // open connections between a and b are reset
//
// Connections implement net.Conn fully: deadlines (os.ErrDeadlineExceeded,
// a timeout), io.EOF after the peer's Close once its bytes are read,
// net.ErrClosed on a closed end, syscall.ECONNRESET after Cut and
// syscall.ECONNREFUSED for a dial to no listener or across a partition,
// each inside a *net.OpError.
package memnet
