package staging_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/poll"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/rdmatest"
	"github.com/tensorferry/tensorferry/rdma/staging"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
)

// ownerNode is a staging owner with a Store and an export of n bytes.
type ownerNode struct {
	store *tensor.Store
	ch    *staging.Channel
	t     *tensor.Tensor
	d     *tensor.Descriptor
}

func newOwner(t *testing.T, n int) *ownerNode {
	t.Helper()
	store := tensor.NewStore("owner", 1)
	ch, err := staging.New(&rdma.Env{Node: "owner", Incarnation: 1, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{int64(n)})
	if err != nil {
		t.Fatal(err)
	}
	rdmatest.Fill(1, x.Host())
	_, d, err := store.Export(x, "fetcher", 0)
	if err != nil {
		t.Fatal(err)
	}
	o := &ownerNode{store: store, ch: ch, t: x, d: d}
	t.Cleanup(func() {
		_ = ch.Close()
		store.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := x.WaitReleased(ctx); err != nil {
			t.Errorf("export still lent after close: %v", err)
		}
	})
	return o
}

// rawClient speaks the staging protocol by hand to an owner.
func rawClient(t *testing.T, o *ownerNode) (net.Conn, *staging.Framer) {
	t.Helper()
	a, b := net.Pipe()
	o.ch.ServeConn(b, "fetcher")
	t.Cleanup(func() { _ = a.Close() })
	_ = a.SetDeadline(time.Now().Add(20 * time.Second))
	return a, staging.NewFramer(a, a, 0)
}

// TestRemoteErrorKeepsSentinels: a status code from the owner unwraps to
// the sentinel the owner met.
func TestRemoteErrorKeepsSentinels(t *testing.T) {
	for code, want := range map[wire.ErrCode]error{
		wire.CodeNotFound:   tensor.ErrUnknownExport,
		wire.CodeReleased:   tensor.ErrBadLease,
		wire.CodeStale:      tensor.ErrStale,
		wire.CodeShutdown:   tensor.ErrStoreClosed,
		wire.CodeOutOfRange: memory.ErrOutOfRange,
		wire.CodeClosed:     rdma.ErrPeerDown,
		wire.CodeCancelled:  context.Canceled,
	} {
		if err := (&staging.RemoteError{Owner: "o", Code: code, Message: "m"}); !errors.Is(err, want) {
			t.Errorf("%v: %v does not wrap %v", code, err, want)
		}
	}
	for _, code := range []wire.ErrCode{wire.CodeInternal, wire.CodeProtocol, 999} {
		if err := (&staging.RemoteError{Owner: "o", Code: code}); err.Unwrap() != nil {
			t.Errorf("%v unwraps to %v", code, err.Unwrap())
		}
	}
}

func TestOwnerAnswersBadRequestsPerStream(t *testing.T) {
	const n = 1000
	o := newOwner(t, n)
	_, fr := rawClient(t, o)
	good := staging.Request{ExportID: o.d.ExportID, Lease: o.d.Lease, Incarnation: 1, Offset: 0, Length: n, ChunkSize: 128, Window: 2}
	mod := func(f func(r *staging.Request)) staging.Request { r := good; f(&r); return r }
	tests := []struct {
		name string
		req  staging.Request
		want wire.ErrCode
	}{
		{"unknown id", mod(func(r *staging.Request) { r.ExportID = 999 }), wire.CodeNotFound},
		{"bad lease", mod(func(r *staging.Request) { r.Lease++ }), wire.CodeReleased},
		{"stale incarnation", mod(func(r *staging.Request) { r.Incarnation = 2 }), wire.CodeStale},
		{"past the end", mod(func(r *staging.Request) { r.Offset, r.Length = 900, 101 }), wire.CodeOutOfRange},
		{"offset beyond", mod(func(r *staging.Request) { r.Offset, r.Length = 1001, 0 }), wire.CodeOutOfRange},
		{"length overflows", mod(func(r *staging.Request) { r.Offset, r.Length = 10, ^uint64(0)-5 }), wire.CodeOutOfRange},
		{"chunk too large", mod(func(r *staging.Request) { r.ChunkSize = staging.MaxChunkSize + 1 }), wire.CodeProtocol},
		{"window too large", mod(func(r *staging.Request) { r.Window = staging.MaxWindow + 1 }), wire.CodeProtocol},
	}
	stream := uint32(0)
	for _, tc := range tests {
		stream++
		if err := fr.WriteRequest(stream, tc.req); err != nil {
			t.Fatal(err)
		}
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if f.Type != staging.FrameError || f.Stream != stream || f.Status.Code != tc.want {
			t.Fatalf("%s: got %v stream %d %v (%s), want ERROR %v", tc.name, f.Type, f.Stream, f.Status.Code, f.Status.Message, tc.want)
		}
	}
	// The connection is still up: a range inside the export is served.
	stream++
	if err := fr.WriteRequest(stream, mod(func(r *staging.Request) { r.Offset, r.Length = 100, 500 })); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if f.Type == staging.FrameEnd {
			if f.Status.Code != wire.CodeNoError {
				t.Fatalf("END %v", f.Status)
			}
			break
		}
		if f.Type != staging.FrameData || f.Offset != uint64(100+len(got)) || len(f.Data) > 128 {
			t.Fatalf("unexpected %v offset %d, %d bytes", f.Type, f.Offset, len(f.Data))
		}
		got = append(got, f.Data...)
	}
	if !bytes.Equal(got, o.t.Host()[100:600]) {
		t.Fatal("served bytes differ from the export")
	}
	// A late CANCEL for a finished stream is ignored.
	if err := fr.WriteCancel(stream); err != nil {
		t.Fatal(err)
	}
	stream++
	if err := fr.WriteRequest(stream, mod(func(r *staging.Request) { r.Length = 0 })); err != nil {
		t.Fatal(err)
	}
	if f, err := fr.ReadFrame(); err != nil || f.Type != staging.FrameEnd || f.Status.Code != wire.CodeNoError {
		t.Fatalf("empty range: %+v %v", f, err)
	}
	if got := o.t.Leases(); got != 1 {
		t.Fatalf("export has %d leases after serving, want 1", got)
	}
}

func TestOwnerClosesConnectionOnProtocolError(t *testing.T) {
	tests := []struct {
		name string
		send func(fr *staging.Framer, conn net.Conn) error
	}{
		{"garbage", func(_ *staging.Framer, c net.Conn) error {
			_, err := c.Write(bytes.Repeat([]byte{0xff}, 16))
			return err
		}},
		{"data from the fetcher", func(fr *staging.Framer, _ net.Conn) error { return fr.WriteData(1, 0, []byte{1}) }},
		{"stream id reused", func(fr *staging.Framer, _ net.Conn) error {
			if err := fr.WriteRequest(5, staging.Request{ExportID: 999}); err != nil {
				return err
			}
			if _, err := fr.ReadFrame(); err != nil {
				return err
			}
			return fr.WriteRequest(5, staging.Request{ExportID: 999})
		}},
		{"truncated request", func(_ *staging.Framer, c net.Conn) error {
			_, err := c.Write([]byte{1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 48, 1, 2})
			if err == nil {
				err = c.(interface{ CloseWrite() error }).CloseWrite()
			}
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := newOwner(t, 10)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			o.ch.ServeConn(s, "fetcher")
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			fr := staging.NewFramer(c, c, 0)
			if err := tc.send(fr, c); err != nil {
				t.Fatal(err)
			}
			// EOF, or a reset when the owner closed with our bytes unread.
			var ne net.Error
			if _, err := io.Copy(io.Discard, c); errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the owner did not close the connection: %v", err)
			}
		})
	}
}

// slowConn delays every read, so that a transfer is surely in flight,
// and counts the reads that got bytes.
type slowConn struct {
	net.Conn
	reads *atomic.Int64
}

func (c slowConn) Read(p []byte) (int, error) {
	// A delay on purpose, not a synchronization: the transfer under test
	// must last long enough to be stopped in the middle.
	time.Sleep(time.Millisecond)
	n, err := c.Conn.Read(p[:min(len(p), 64<<10)])
	if n > 0 {
		c.reads.Add(1)
	}
	return n, err
}

// pair is an owner and a fetcher staging channel over loopback.
type pair struct {
	owner, fetcher *staging.Channel
	o              *ownerNode
	dials          int
	mu             sync.Mutex
	reads          atomic.Int64 // reads that got bytes on slow connections
}

func newPair(t *testing.T, n int, slow bool) *pair {
	t.Helper()
	return newPairConfig(t, n, slow, config.StagingConfig{ChunkSize: 1 << 20})
}

// newPairConfig is newPair with the fetcher's staging section.
func newPairConfig(t *testing.T, n int, slow bool, sc config.StagingConfig) *pair {
	t.Helper()
	o := newOwner(t, n)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			o.ch.ServeConn(c, "fetcher")
		}
	}()
	p := &pair{owner: o.ch, o: o}
	fetcher, err := staging.New(&rdma.Env{
		Node: "fetcher", Incarnation: 1, Store: tensor.NewStore("fetcher", 1),
		Dial: func(ctx context.Context, node, channel string) (net.Conn, error) {
			if node != "owner" || channel != rdma.Staging {
				return nil, fmt.Errorf("no %s channel at %s", channel, node)
			}
			p.mu.Lock()
			p.dials++
			p.mu.Unlock()
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
			if err == nil && slow {
				c = slowConn{c, &p.reads}
			}
			return c, err
		},
		Staging: sc,
	})
	if err != nil {
		t.Fatal(err)
	}
	p.fetcher = fetcher
	t.Cleanup(func() {
		_ = fetcher.Close()
		_ = ln.Close()
		wg.Wait()
	})
	return p
}

func (p *pair) fetch(ctx context.Context) (memory.Buffer, error) {
	dst, err := memory.NewHostBuffer(int(p.o.d.Bytes))
	if err != nil {
		return nil, err
	}
	return dst, p.fetcher.Fetch(ctx, p.o.d, dst)
}

// inFlight runs a fetch, calls stop once it is surely under way and returns
// the fetch's error.
func inFlight(t *testing.T, p *pair, stop func()) error {
	t.Helper()
	res := make(chan error, 1)
	go func() {
		_, err := p.fetch(context.Background())
		res <- err
	}()
	poll.Until(t, "the owner serves the transfer", func() bool { return p.owner.InFlight() != 0 })
	// Bytes of the transfer arrive at the fetcher: it is under way.
	reads := p.reads.Load()
	poll.Until(t, "the fetcher reads the transfer's bytes", func() bool { return p.reads.Load() > reads })
	stopped := time.Now()
	stop()
	select {
	case err := <-res:
		t.Logf("fetch failed %v after the stop: %v", time.Since(stopped), err)
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("fetch did not return")
		return nil
	}
}

func TestInFlightTransfersFail(t *testing.T) {
	const n = 64 << 20 // at 64 KiB per millisecond: about a second
	tests := []struct {
		name string
		stop func(p *pair)
		want error
	}{
		{"fetcher PeerDown", func(p *pair) { p.fetcher.PeerDown("owner") }, rdma.ErrPeerDown},
		{"fetcher Close", func(p *pair) { _ = p.fetcher.Close() }, rdma.ErrClosed},
		{"owner PeerDown", func(p *pair) { p.owner.PeerDown("fetcher") }, rdma.ErrPeerDown},
		{"owner Close", func(p *pair) { _ = p.owner.Close() }, rdma.ErrPeerDown},
	}
	for _, tc := range tests {
		for _, stripes := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/stripes=%d", tc.name, stripes), func(t *testing.T) {
				p := newPair(t, n, true)
				p.fetcher.SetStripes(stripes)
				err := inFlight(t, p, func() { tc.stop(p) })
				if !errors.Is(err, tc.want) {
					t.Fatalf("fetch: %v, want %v", err, tc.want)
				}
				// Neither end holds anything for the failed transfer.
				poll.Until(t, "nothing in flight after the failure", func() bool {
					return p.owner.InFlight()+p.fetcher.InFlight() == 0
				})
			})
		}
	}
}

// TestStripedFetch: a large transfer split into stripes, over as many
// connections, lands byte for byte, ranges of whole chunks with the rest in
// the last; the connections are reused by the next fetch.
func TestStripedFetch(t *testing.T) {
	const n = 40<<20 + 3
	p := newPair(t, n, false)
	p.fetcher.SetStripes(4)
	ctx := context.Background()
	for range 2 {
		dst, err := p.fetch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dst.Host(), p.o.t.Host()) {
			t.Fatal("wrong bytes")
		}
	}
	if p.dials != 4 {
		t.Fatalf("%d dials for two fetches in 4 stripes, want 4", p.dials)
	}
	// Below StagingConfig.StripeMin: one connection.
	small := newPair(t, int(config.DefaultStagingConfig().StripeMin)-1, false)
	small.fetcher.SetStripes(4)
	if _, err := small.fetch(ctx); err != nil {
		t.Fatal(err)
	}
	if small.dials != 1 {
		t.Fatalf("%d dials for a transfer below StagingConfig.StripeMin", small.dials)
	}
}

// TestStripingFromConfig: the staging section's stripes and stripe_min
// decide how a transfer is split, without SetStripes.
func TestStripingFromConfig(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		sc    config.StagingConfig
		n     int
		dials int
	}{
		{"3 stripes of a small minimum", config.StagingConfig{ChunkSize: 1 << 20, Stripes: 3, StripeMin: 4 << 20}, 6 << 20, 3},
		{"limited by the minimum", config.StagingConfig{ChunkSize: 1 << 20, Stripes: 8, StripeMin: 4 << 20}, 5 << 20, 2},
		{"striping off", config.StagingConfig{ChunkSize: 1 << 20, Stripes: 1}, 40 << 20, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPairConfig(t, tc.n, false, tc.sc)
			dst, err := p.fetch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dst.Host(), p.o.t.Host()) {
				t.Fatal("wrong bytes")
			}
			if p.dials != tc.dials {
				t.Errorf("%d dials, want %d", p.dials, tc.dials)
			}
		})
	}
}

func TestFetchAfterClose(t *testing.T) {
	p := newPair(t, 10, false)
	_ = p.fetcher.Close()
	if _, err := p.fetch(context.Background()); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("fetch after Close: %v", err)
	}
	_ = p.owner.Close()
	a, b := net.Pipe()
	defer a.Close()
	p.owner.ServeConn(b, "fetcher")
	if _, err := a.Read(make([]byte, 1)); err == nil {
		t.Fatal("a closed owner served a connection")
	}
}

func TestConnectionsAreReusedAndRedialled(t *testing.T) {
	p := newPair(t, 3<<20, false)
	ctx := context.Background()
	for range 3 {
		dst, err := p.fetch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dst.Host(), p.o.t.Host()) {
			t.Fatal("wrong bytes")
		}
	}
	if p.dials != 1 {
		t.Fatalf("%d dials for 3 sequential fetches, want 1", p.dials)
	}
	// The owner drops its connections: the pooled one is dead, the next
	// fetch redials transparently.
	p.owner.PeerDown("fetcher")
	if _, err := p.fetch(ctx); err != nil {
		t.Fatalf("fetch after the owner dropped the connection: %v", err)
	}
	if p.dials != 2 {
		t.Fatalf("%d dials, want 2", p.dials)
	}
	// After PeerDown on the fetcher side the next fetch dials again.
	p.fetcher.PeerDown("owner")
	if _, err := p.fetch(ctx); err != nil {
		t.Fatal(err)
	}
	if p.dials != 3 {
		t.Fatalf("%d dials, want 3", p.dials)
	}
}

// A pooled connection unused for the idle timeout is closed (and the
// owner's side with it); the next fetch dials again.
func TestIdleConnectionsAreClosed(t *testing.T) {
	p := newPairConfig(t, 1<<20, false, config.StagingConfig{ChunkSize: 1 << 20, IdleTimeout: 20 * time.Millisecond})
	ctx := context.Background()
	if _, err := p.fetch(ctx); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the idle connection closed", func() bool { return p.fetcher.IdleConns() == 0 })
	poll.Until(t, "the owner's side closed", func() bool { return p.owner.InFlight() == 0 && p.owner.ServedConns() == 0 })
	dst, err := p.fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst.Host(), p.o.t.Host()) {
		t.Fatal("wrong bytes")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dials != 2 {
		t.Fatalf("%d dials, want 2 (one after the idle close)", p.dials)
	}
}

func TestNewRejectsBadEnv(t *testing.T) {
	store := tensor.NewStore("n", 1)
	for _, env := range []*rdma.Env{
		nil,
		{Node: "n"},
		{Node: "n", Store: store, Staging: config.StagingConfig{ChunkSize: staging.MaxChunkSize + 1}},
		{Node: "n", Store: store, Staging: config.StagingConfig{ChunkSize: -1}},
		{Node: "n", Store: store, Staging: config.StagingConfig{ChunksInFlight: staging.MaxWindow + 1}},
		{Node: "n", Store: store, Staging: config.StagingConfig{ChunkSize: 8 << 20, MaxRingBytes: 4 << 20}},
	} {
		if _, err := staging.New(env); err == nil {
			t.Errorf("New(%+v) succeeded", env)
		}
	}
}

// BenchmarkStagingLoopback moves one export repeatedly over TCP loopback
// with the production chunk size and window, host to host and, where GPUs
// are present, through the pinned rings (cuda:0 to cuda:1, or cuda:0 to
// cuda:0 on one GPU).
func BenchmarkStagingLoopback(b *testing.B) {
	defaults := func(env *rdma.Env) (rdma.Channel, error) {
		env.Staging = config.StagingConfig{} // the production defaults
		return staging.New(env)
	}
	pairs := []struct{ owner, fetcher memory.Device }{
		{memory.CPU, memory.CPU},
		{memory.CUDA(0), memory.CUDA(1)},
		{memory.CUDA(0), memory.CUDA(0)},
	}
	for _, pr := range pairs {
		for _, n := range []int{64 << 10, 4 << 20, 64 << 20, 256 << 20} {
			b.Run(fmt.Sprintf("%s-%s/%dKiB", pr.owner, pr.fetcher, n>>10), func(b *testing.B) {
				for _, dev := range []memory.Device{pr.owner, pr.fetcher} {
					if a, err := memory.AllocatorFor(dev); err != nil {
						b.Skipf("needs %s: %v", dev, err)
					} else if buf, err := a.Alloc(1); err != nil {
						b.Skipf("needs %s: %v", dev, err)
					} else {
						_ = buf.Free()
					}
				}
				p := rdmatest.InProcessPair(b, defaults, pr.owner, pr.fetcher)
				d := p.Export(b, 1, n)
				a, err := memory.AllocatorFor(pr.fetcher)
				if err != nil {
					b.Fatal(err)
				}
				dst, err := a.Alloc(n)
				if err != nil {
					b.Fatal(err)
				}
				defer dst.Free()
				ctx := context.Background()
				if err := p.Fetcher.Fetch(ctx, d, dst); err != nil { // warm: connection, rings
					b.Fatal(err)
				}
				b.SetBytes(int64(n))
				b.ResetTimer()
				for b.Loop() {
					if err := p.Fetcher.Fetch(ctx, d, dst); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				_ = p.Release(b, d)
			})
		}
	}
}

// BenchmarkRawTCPLoopback is the ceiling for BenchmarkStagingLoopback: n
// bytes written by one goroutine into a loopback socket and read into a
// host buffer by another, per request, on one connection.
func BenchmarkRawTCPLoopback(b *testing.B) {
	for _, n := range []int{64 << 10, 4 << 20, 64 << 20, 256 << 20} {
		b.Run(fmt.Sprintf("%dKiB", n>>10), func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			src, dst := make([]byte, n), make([]byte, n)
			done := make(chan struct{})
			go func() {
				defer close(done)
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				req := make([]byte, 1)
				for {
					if _, err := io.ReadFull(c, req); err != nil {
						return
					}
					if _, err := c.Write(src); err != nil {
						return
					}
				}
			}()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(n))
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.Write([]byte{1}); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, dst); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			_ = c.Close()
			<-done
		})
	}
}
