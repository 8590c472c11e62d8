// Package rawtcp is the raw TCP baseline of the bandwidth benchmarks: one
// loopback connection on which a message of n bytes is written in one call,
// read in full by the peer into a buffer it keeps, and acknowledged with one
// byte. Nothing else (no framing, no allocation per message) is on the path,
// so it is the ceiling a data channel over TCP on the same host can reach.
//
//	p, _ := rawtcp.Open(rawtcp.Options{})
//	defer p.Close()
//	d, err := p.Send(buf) // time from the first byte written until the ack
//
// A Receive hook runs on the receiving side after the bytes arrived and
// before the ack (the naive GPU baseline copies them to the device there).
package rawtcp
