package cuda

import (
	"testing"
)

// BenchmarkPeerCopy compares ways of copying 256 MiB from device 0 to device
// 1: cuMemcpyPeerAsync and cuMemcpyDtoDAsync (unified addressing) issued on
// a stream of the destination or of the source, with and without peer
// access, in one call or in 64 MiB chunks.
func BenchmarkPeerCopy(b *testing.B) {
	if err := Init(); err != nil {
		b.Skip(err)
	}
	if n, _ := DeviceCount(); n < 2 {
		b.Skip("needs 2 devices")
	}
	c0, _ := Primary(0)
	c1, _ := Primary(1)
	const n = 256 << 20
	src, err := c0.MemAlloc(n)
	if err != nil {
		b.Fatal(err)
	}
	defer c0.MemFree(src)
	dst, err := c1.MemAlloc(n)
	if err != nil {
		b.Fatal(err)
	}
	defer c1.MemFree(dst)
	s0, _ := c0.NewStream()
	defer s0.Destroy()
	s1, _ := c1.NewStream()
	defer s1.Destroy()
	run := func(name string, chunk int, f func(off, m int) error, s *Stream) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(n)
			for b.Loop() {
				for off := 0; off < n; off += chunk {
					if err := f(off, min(chunk, n-off)); err != nil {
						b.Fatal(err)
					}
				}
				if err := s.Synchronize(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	o := func(p DevicePtr, off int) DevicePtr { return p + DevicePtr(off) }
	peerOnDst := func(off, m int) error { return c1.MemcpyPeerAsync(o(dst, off), c1, o(src, off), c0, m, s1) }
	peerOnSrc := func(off, m int) error { return c0.MemcpyPeerAsync(o(dst, off), c1, o(src, off), c0, m, s0) }
	run("peer-nopeeraccess-dst", n, peerOnDst, s1)
	if err := c0.EnablePeerAccess(c1); err != nil {
		b.Fatal(err)
	}
	if err := c1.EnablePeerAccess(c0); err != nil {
		b.Fatal(err)
	}
	run("peer-dst-whole", n, peerOnDst, s1)
	run("peer-dst-64MiB", 64<<20, peerOnDst, s1)
	run("peer-src-whole", n, peerOnSrc, s0)
	run("dtod-dst-whole", n, func(off, m int) error { return c1.MemcpyDtoDAsync(o(dst, off), o(src, off), m, s1) }, s1)
	run("dtod-src-whole", n, func(off, m int) error { return c0.MemcpyDtoDAsync(o(dst, off), o(src, off), m, s0) }, s0)
	run("dtod-src-64MiB", 64<<20, func(off, m int) error { return c0.MemcpyDtoDAsync(o(dst, off), o(src, off), m, s0) }, s0)
}
