package staging

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/tracehook"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
)

// MaxConnsPerPeer bounds the data connections a fetcher keeps to one owner;
// it is also the number of transfers from one owner that run at once (the
// others wait for a connection), and the most stripes of one transfer.
const MaxConnsPerPeer = config.MaxStripes

var _ rdma.Channel = (*Channel)(nil)
var _ rdma.ConnServer = (*Channel)(nil)

// Channel is the staging channel. It is both ends: the fetcher side dials
// data connections through Env.Dial and pulls, the owner side serves the
// connections handed to ServeConn from the Env's Store.
//
// Connections: a fetcher keeps a small pool of data connections per owner
// (at most MaxConnsPerPeer). Each connection carries one transfer at a time,
// as a stream of DATA frames answering one REQUEST, so a connection owns
// its staging ring outright and a large transfer never waits behind another
// one's chunks. Idle connections are reused; a connection that failed, or
// whose transfer was cancelled, is closed and a new one is dialled.
type Channel struct {
	env       *rdma.Env
	log       *zap.Logger
	chunk     int
	window    int
	maxRing   int   // config.StagingConfig.MaxRingBytes
	stripeMin int64 // config.StagingConfig.StripeMin

	mu     sync.Mutex
	closed bool
	peers  map[string]*peerPool
	served map[*serverConn]struct{}
	wg     sync.WaitGroup

	idleTimeout time.Duration // config.StagingConfig.IdleTimeout
	sweeping    bool          // the idle sweeper runs (under mu)
	stop        chan struct{} // closed by Close: the sweeper ends

	stripes  atomic.Int32 // see SetStripes
	fetching atomic.Int64 // transfers in progress on the fetcher side
	serving  atomic.Int64 // streams in progress on the owner side
}

type peerPool struct {
	slots  chan struct{} // one token per transfer in progress
	idle   []*clientConn
	active map[*clientConn]struct{}
}

type clientConn struct {
	conn   net.Conn
	fr     *Framer
	stream uint32
	ring   *pinnedRing           // used only by the transfer holding the conn
	down   atomic.Pointer[error] // why the channel closed the conn (ErrPeerDown, ErrClosed)
	idleAt time.Time             // when it went back to the pool
}

// close closes the connection and frees its ring; only the goroutine that
// holds cc (its transfer, or the pool while idle) may call it.
func (cc *clientConn) close() {
	_ = cc.conn.Close()
	cc.ring.free()
	cc.ring = nil
}

type serverConn struct {
	conn net.Conn
	peer string
	ring *pinnedRing // used by one request at a time
	down atomic.Pointer[error]
}

// New returns a staging channel for the node described by env. env.Dial is
// needed to fetch and env.Store to serve; the chunk size, window, ring
// bound and striping come from env.Staging (zero fields take the defaults
// of config.DefaultStagingConfig; zero Stripes, DefaultStripes).
func New(env *rdma.Env) (*Channel, error) {
	if env == nil || env.Store == nil {
		return nil, errors.New("staging: Env with a Store required")
	}
	cfg := env.Staging.WithDefaults()
	if cfg.ChunkSize < 0 || cfg.ChunkSize > MaxChunkSize {
		return nil, fmt.Errorf("staging: chunk size %d outside (0, %d]", cfg.ChunkSize, MaxChunkSize)
	}
	if cfg.ChunksInFlight < 0 || cfg.ChunksInFlight > MaxWindow {
		return nil, fmt.Errorf("staging: %d chunks in flight outside (0, %d]", cfg.ChunksInFlight, MaxWindow)
	}
	if cfg.MaxRingBytes < cfg.ChunkSize || cfg.StripeMin < 2 {
		return nil, fmt.Errorf("staging: ring bound %d below the chunk size %d, or striping minimum %d below 2", cfg.MaxRingBytes, cfg.ChunkSize, cfg.StripeMin)
	}
	c := &Channel{
		env:       env,
		log:       env.Logger().Named("staging"),
		chunk:     cfg.ChunkSize,
		window:    cfg.ChunksInFlight,
		maxRing:   cfg.MaxRingBytes,
		stripeMin: cfg.StripeMin,
		peers:     map[string]*peerPool{},
		served:    map[*serverConn]struct{}{},
		stop:      make(chan struct{}),

		idleTimeout: cfg.IdleTimeout,
	}
	c.SetStripes(cmp.Or(cfg.Stripes, DefaultStripes()))
	return c, nil
}

// Name returns rdma.Staging.
func (c *Channel) Name() string { return rdma.Staging }

// Offer returns nil: the fetcher reaches the owner through Env.Dial, and the
// owner checks every request against its Store.
func (c *Channel) Offer(context.Context, *tensor.Export, string) ([]byte, error) { return nil, nil }

// InFlight returns the number of transfers in progress at this node, as
// fetcher and as owner. Tests use it to check that nothing was left behind.
func (c *Channel) InFlight() int { return int(c.fetching.Load() + c.serving.Load()) }

// codes maps the owner's errors to status codes and back to the same
// sentinels on the fetcher: rdma's shared entries, and context.Canceled as
// wire.CodeCancelled. Staging has no sentinel for a bad request: its
// wire.CodeProtocol status unwraps to nothing.
var codes = rdma.ControlErrors(nil, wire.CodeError{Code: wire.CodeCancelled, Sent: context.Canceled})

// RemoteError is a failure reported by the owner for one transfer. It
// unwraps to the sentinel of its code: tensor.ErrUnknownExport,
// tensor.ErrBadLease, tensor.ErrStale, tensor.ErrStoreClosed,
// memory.ErrOutOfRange, rdma.ErrPeerDown (the owner's channel closed) or
// context.Canceled.
type RemoteError struct {
	Owner   string
	Code    wire.ErrCode
	Message string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("staging: owner %s: %s: %s", e.Owner, e.Code, e.Message)
}

// Unwrap returns the sentinel matching the code, or nil.
func (e *RemoteError) Unwrap() error { return codes.Sentinel(e.Code) }

// Fetch pulls the d.Bytes bytes of the export into the start of dst. A dst
// smaller than d.Bytes fails with rdma.ErrTooSmall before any I/O. Errors
// reported by the owner are *RemoteError (errors.Is matches
// tensor.ErrUnknownExport, tensor.ErrBadLease, tensor.ErrStale); a lost
// connection gives rdma.ErrPeerDown, Close rdma.ErrClosed, and a cancelled
// or expired ctx its error.
//
// A transfer of at least StagingConfig.StripeMin bytes is split into
// stripes (see StagingConfig.Stripes), contiguous ranges fetched at once over as many data
// connections, each with its own staging ring: one TCP stream is bound by
// the core that copies it, and a host with cores to spare moves a large
// tensor several times faster over several.
func (c *Channel) Fetch(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer) error {
	return c.FetchStream(ctx, d, dst, rdma.Progress{})
}

// fetchStriped fetches bytes [off, off+n) of the export into the same
// range of dst, in stripes (stripeRanges) when n is large enough.
func (c *Channel) fetchStriped(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer, off, n int64) error {
	ranges := c.stripeRanges(n)
	tracehook.Stripes(ctx, len(ranges))
	if len(ranges) == 1 {
		return c.fetchRange(ctx, d, dst, off, n)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(ranges))
	var wg sync.WaitGroup
	for i, r := range ranges {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = c.fetchRange(sctx, d, dst, off+r[0], r[1]); errs[i] != nil {
				cancel() // the other stripes stop
			}
		}()
	}
	wg.Wait()
	// The first failure that is not the cancellation it caused.
	var first error
	for _, err := range errs {
		if err != nil && (first == nil || (errors.Is(first, context.Canceled) && !errors.Is(err, context.Canceled))) {
			first = err
		}
	}
	if first != nil && ctx.Err() != nil {
		return fmt.Errorf("staging: fetch %v: %w", d, ctx.Err())
	}
	return first
}

// FetchStream implements rdma.StreamFetcher: Fetch in pieces of four
// staging chunks per stripe, one piece after the other (each striped as
// Fetch stripes a transfer), each fetched once p.Ready says the owner
// holds it and told to p.Landed once it is in dst.
func (c *Channel) FetchStream(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer, p rdma.Progress) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("staging: fetch: %w", err)
	}
	if int64(dst.Len()) < d.Bytes {
		return fmt.Errorf("staging: fetch %v into %d bytes: %w", d, dst.Len(), rdma.ErrTooSmall)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("staging: fetch %v: %w", d, err)
	}
	c.fetching.Add(1)
	defer c.fetching.Add(-1)
	if (p.Ready == nil && p.Landed == nil) || d.Bytes == 0 {
		return c.fetchStriped(ctx, d, dst, 0, d.Bytes) // whole, at once
	}
	piece := 4 * int64(c.chunk) * int64(c.stripes.Load())
	var avail int64 // what the source holds, as far as p told
	for off := int64(0); off < d.Bytes; {
		n := min(piece, d.Bytes-off)
		if off+n > avail {
			var err error
			if avail, err = p.Await(ctx, off+n); err != nil {
				return fmt.Errorf("staging: fetch %v: %w", d, err)
			}
		}
		if err := c.fetchStriped(ctx, d, dst, off, n); err != nil {
			return err
		}
		if off += n; p.Landed != nil {
			p.Landed(off)
		}
	}
	return nil
}

var _ rdma.StreamFetcher = (*Channel)(nil)

// MaxStripes bounds SetStripes (and MaxConnsPerPeer bounds the
// connections all transfers from one owner use at once).
const MaxStripes = MaxConnsPerPeer

// DefaultStripes returns the default stripes of a transfer (those of a
// zero StagingConfig.Stripes): 4 on a host
// with at least 8 CPUs for Go (GOMAXPROCS), 2 with at least 4, else 1 (each
// stream needs a core on both ends to copy).
func DefaultStripes() int {
	switch p := runtime.GOMAXPROCS(0); {
	case p >= 8:
		return 4
	case p >= 4:
		return 2
	}
	return 1
}

// SetStripes sets how many stripes a large transfer is split into (1: no
// striping), clamped to [1, MaxStripes], in place of the configured
// StagingConfig.Stripes.
func (c *Channel) SetStripes(n int) {
	c.stripes.Store(int32(max(1, min(n, MaxStripes))))
}

// stripeRanges splits n bytes into the (offset, length) ranges fetched at
// once: whole chunks each, the last taking the rest.
func (c *Channel) stripeRanges(n int64) [][2]int64 {
	k := int64(c.stripes.Load())
	if n < c.stripeMin || k <= 1 {
		return [][2]int64{{0, n}}
	}
	k = min(k, n/(c.stripeMin/2))
	chunk := int64(c.chunk)
	per := ((n+k-1)/k + chunk - 1) / chunk * chunk // ceil(n/k), in whole chunks
	var out [][2]int64
	for off := int64(0); off < n; off += per {
		out = append(out, [2]int64{off, min(per, n-off)})
	}
	return out
}

// fetchRange pulls bytes [off, off+n) of the export into the same range of
// dst over one data connection of the owner's pool.
func (c *Channel) fetchRange(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer, off, n int64) error {
	p, err := c.pool(d.Owner)
	if err != nil {
		return fmt.Errorf("staging: fetch %v: %w", d, err)
	}
	defer c.wg.Done()
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("staging: fetch %v: waiting for a connection: %w", d, ctx.Err())
	}
	defer func() { <-p.slots }()
	for attempt := 0; ; attempt++ {
		cc, reused, err := c.conn(ctx, d.Owner, p)
		if err != nil {
			return fmt.Errorf("staging: fetch %v: %w", d, err)
		}
		var sink deviceSink
		if !dst.Device().IsHost() && n > 0 {
			view, err := dst.Slice(int(off), int(n))
			if err == nil {
				sink, err = newDeviceSink(&cc.ring, view, c.chunk, c.window)
			}
			if err != nil {
				c.putConn(d.Owner, p, cc, true)
				return fmt.Errorf("staging: fetch %v: %w", d, err)
			}
		}
		started, keep, err := c.transfer(ctx, cc, d, uint64(off), uint64(n), dst, sink)
		if sink != nil {
			sink.close()
		}
		c.putConn(d.Owner, p, cc, keep)
		if err != nil && reused && !started && attempt == 0 && ctx.Err() == nil && cc.down.Load() == nil {
			// A pooled connection the owner had already closed: redial once.
			continue
		}
		return err
	}
}

func (c *Channel) pool(owner string) (*peerPool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, rdma.ErrClosed
	}
	c.wg.Add(1) // Close waits for the fetch
	p := c.peers[owner]
	if p == nil {
		p = &peerPool{slots: make(chan struct{}, MaxConnsPerPeer), active: map[*clientConn]struct{}{}}
		c.peers[owner] = p
	}
	return p, nil
}

// conn returns an idle connection of p, or dials one.
func (c *Channel) conn(ctx context.Context, owner string, p *peerPool) (cc *clientConn, reused bool, err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, false, rdma.ErrClosed
	}
	if c.peers[owner] != p {
		c.mu.Unlock()
		return nil, false, fmt.Errorf("%w: %s", rdma.ErrPeerDown, owner)
	}
	if n := len(p.idle); n > 0 {
		cc = p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.active[cc] = struct{}{}
		c.mu.Unlock()
		return cc, true, nil
	}
	c.mu.Unlock()
	if c.env.Dial == nil {
		return nil, false, errors.New("staging: Env.Dial not set")
	}
	conn, err := c.env.Dial(ctx, owner, rdma.Staging)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			// net reports a dial cut short by the deadline as an i/o
			// timeout: say which (errors.Is(err, context.DeadlineExceeded)).
			err = fmt.Errorf("%w (%w)", ctxErr, err)
		}
		return nil, false, fmt.Errorf("dial %s: %w", owner, err)
	}
	cc = &clientConn{conn: conn, fr: NewFramer(conn, conn, MaxChunkSize)}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		err = rdma.ErrClosed
	case c.peers[owner] != p:
		err = fmt.Errorf("%w: %s", rdma.ErrPeerDown, owner)
	}
	if err != nil {
		_ = conn.Close()
		return nil, false, err
	}
	p.active[cc] = struct{}{}
	return cc, false, nil
}

func (c *Channel) putConn(owner string, p *peerPool, cc *clientConn, keep bool) {
	c.mu.Lock()
	delete(p.active, cc)
	if keep && !c.closed && c.peers[owner] == p && cc.down.Load() == nil && len(p.idle) < MaxConnsPerPeer {
		cc.idleAt = time.Now()
		p.idle = append(p.idle, cc)
		if !c.sweeping && c.idleTimeout > 0 {
			c.sweeping = true
			c.wg.Add(1)
			go c.sweepIdle()
		}
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	cc.close()
}

// sweepIdle closes the pooled connections unused for the idle timeout
// (the owner frees the ring it holds for each), until Close.
func (c *Channel) sweepIdle() {
	defer c.wg.Done()
	t := time.NewTicker(max(c.idleTimeout/2, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			var stale []*clientConn
			c.mu.Lock()
			for _, p := range c.peers {
				keep := p.idle[:0]
				for _, cc := range p.idle {
					if now.Sub(cc.idleAt) >= c.idleTimeout {
						stale = append(stale, cc)
					} else {
						keep = append(keep, cc)
					}
				}
				clear(p.idle[len(keep):])
				p.idle = keep
			}
			c.mu.Unlock()
			for _, cc := range stale {
				cc.close() // taken out of the pool: this goroutine holds it
			}
			if len(stale) > 0 {
				c.log.Debug("idle data connections closed", zap.Int("conns", len(stale)))
			}
		}
	}
}

// ServedConns returns the data connections this node serves as owner.
func (c *Channel) ServedConns() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.served)
}

// IdleConns returns the data connections pooled unused, to every owner.
func (c *Channel) IdleConns() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, p := range c.peers {
		n += len(p.idle)
	}
	return n
}

// aLongTimeAgo is a deadline in the past, used to interrupt blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)

// transfer runs one request for bytes [base, base+length) on cc, into the
// same range of dst (sink, when not nil, writes a view of that range).
// started reports whether any response arrived, keep whether cc can carry
// another transfer.
func (c *Channel) transfer(ctx context.Context, cc *clientConn, d *tensor.Descriptor, base, length uint64, dst memory.Buffer, sink deviceSink) (started, keep bool, err error) {
	interrupted := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = cc.conn.SetDeadline(aLongTimeAgo)
		close(interrupted)
	})
	defer func() {
		if !stop() {
			// The deadline was set: the connection cannot be reused.
			<-interrupted
			keep = false
			if err != nil && ctx.Err() != nil {
				// Tell the owner to stop at once, then drop the connection.
				_ = cc.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				_ = cc.fr.WriteCancel(cc.stream)
				err = fmt.Errorf("staging: fetch %v: %w", d, ctx.Err())
			}
		}
	}()
	fail := func(err error) (bool, bool, error) {
		if why := cc.down.Load(); why != nil {
			return started, false, fmt.Errorf("staging: fetch %v: %w", d, *why)
		}
		if ctx.Err() != nil {
			// Cancelled (a sibling stripe failed, or the caller): the
			// cause is the cancellation, even where the deadline that
			// interrupts the connection has not been set yet.
			return started, false, fmt.Errorf("staging: fetch %v: %w", d, ctx.Err())
		}
		var ne net.Error
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || errors.As(err, &ne) {
			return started, false, fmt.Errorf("staging: fetch %v: connection to %s lost: %w: %w", d, d.Owner, rdma.ErrPeerDown, err)
		}
		return started, false, fmt.Errorf("staging: fetch %v from %s: %w", d, d.Owner, err)
	}

	cc.stream++
	stream := cc.stream
	req := Request{
		ExportID:    d.ExportID,
		Lease:       d.Lease,
		Incarnation: d.Incarnation,
		Offset:      base,
		Length:      length,
		ChunkSize:   uint32(c.chunk),
		Window:      uint32(c.window),
	}
	if err := cc.fr.WriteRequest(stream, req); err != nil {
		return fail(err)
	}
	host := dst.Host()
	end := base + length
	next := base
	for {
		h, err := cc.fr.ReadHeader()
		if err != nil {
			return fail(err)
		}
		started = true
		if h.Stream != stream {
			return fail(fmt.Errorf("%w: %v for stream %d during stream %d", ErrBadFrame, h.Type, h.Stream, stream))
		}
		switch h.Type {
		case FrameData:
			off, n, err := cc.fr.ReadDataOffset(h)
			if err != nil {
				return fail(err)
			}
			if off != next || n > c.chunk || uint64(n) > end-next || (n == 0 && length > 0) {
				return fail(fmt.Errorf("%w: DATA [%d, +%d) out of order or range (expected offset %d of [%d, %d), chunk %d)", ErrBadFrame, off, n, next, base, end, c.chunk))
			}
			if sink == nil {
				if _, err := io.ReadFull(cc.conn, host[off:off+uint64(n)]); err != nil {
					return fail(unexpectedEOF(err))
				}
			} else {
				slot, err := sink.slot(ctx, n)
				if err != nil {
					return fail(err)
				}
				if _, err := io.ReadFull(cc.conn, slot); err != nil {
					return fail(unexpectedEOF(err))
				}
				if err := sink.commit(ctx, int(off-base), n); err != nil {
					return fail(err)
				}
			}
			next += uint64(n)
		case FrameEnd, FrameError:
			st, err := cc.fr.ReadStatus(h)
			if err != nil {
				return fail(err)
			}
			if h.Type == FrameEnd && st.Code == wire.CodeNoError {
				if next != end {
					return fail(fmt.Errorf("%w: END after %d of %d bytes", ErrBadFrame, next-base, length))
				}
				if sink != nil {
					if err := sink.finish(ctx); err != nil {
						return started, false, err
					}
				}
				return started, true, nil
			}
			return started, true, &RemoteError{Owner: d.Owner, Code: st.Code, Message: st.Message}
		default:
			return fail(fmt.Errorf("%w: unexpected %v from the owner", ErrBadFrame, h.Type))
		}
	}
}

// ServeConn serves a data connection accepted (and authenticated) by the
// node for peer. It returns at once; the channel owns conn from then on and
// closes it when the peer closes it, on a protocol error, on PeerDown(peer)
// or on Close.
func (c *Channel) ServeConn(conn net.Conn, peer string) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = conn.Close()
		return
	}
	sc := &serverConn{conn: conn, peer: peer}
	c.served[sc] = struct{}{}
	c.wg.Add(1)
	c.mu.Unlock()
	go c.serve(sc)
}

// serve reads the requests of one connection; each is answered on a
// goroutine of its own so that a CANCEL can stop it.
func (c *Channel) serve(sc *serverConn) {
	defer c.wg.Done()
	fr := NewFramer(sc.conn, sc.conn, MaxChunkSize)
	var (
		cur    uint32
		cancel context.CancelFunc = func() {}
		done                      = make(chan struct{})
		last   uint32
	)
	close(done)
	defer func() {
		cancel()
		_ = sc.conn.Close()
		<-done
		sc.ring.free()
		c.mu.Lock()
		delete(c.served, sc)
		c.mu.Unlock()
	}()
	for {
		h, err := fr.ReadHeader()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && sc.down.Load() == nil {
				c.log.Debug("data connection ends", zap.String("peer", sc.peer), zap.Error(err))
			}
			return
		}
		switch h.Type {
		case FrameRequest:
			req, err := fr.ReadRequest(h)
			if err != nil {
				return
			}
			if h.Stream <= last {
				c.log.Debug("stream id reused", zap.String("peer", sc.peer), zap.Uint32("stream", h.Stream))
				return
			}
			<-done // one transfer at a time per connection
			last, cur = h.Stream, h.Stream
			ctx, cancelStream := context.WithCancel(context.Background())
			cancel = cancelStream
			done = make(chan struct{})
			c.serving.Add(1)
			go func(done chan struct{}, stream uint32) {
				defer close(done)
				defer c.serving.Add(-1)
				defer cancelStream()
				c.send(ctx, sc, fr, stream, req)
			}(done, h.Stream)
		case FrameCancel:
			if h.Stream == cur {
				cancel()
			}
		default:
			c.log.Debug("unexpected frame from fetcher", zap.String("peer", sc.peer), zap.Stringer("type", h.Type))
			return
		}
	}
}

// send answers one request. It reads only the export named by the request,
// within its bounds.
func (c *Channel) send(ctx context.Context, sc *serverConn, fr *Framer, stream uint32, req Request) {
	status := func(t FrameType, code wire.ErrCode, msg string) {
		if err := fr.WriteStatus(t, stream, Status{Code: code, Message: msg}); err != nil {
			_ = sc.conn.Close()
		}
	}
	e, release, err := c.env.Store.Acquire(req.Incarnation, req.ExportID, req.Lease)
	if err != nil {
		status(FrameError, codes.Code(err), err.Error())
		return
	}
	defer release()
	buf := e.Tensor.Buffer()
	size := uint64(buf.Len())
	if req.Offset > size || req.Length > size-req.Offset {
		status(FrameError, wire.CodeOutOfRange, fmt.Sprintf("[%d, +%d) outside export %d of %d bytes", req.Offset, req.Length, req.ExportID, size))
		return
	}
	chunk, window := int(req.ChunkSize), int(req.Window)
	if chunk == 0 {
		chunk = DefaultChunkSize
	}
	if window == 0 {
		window = DefaultWindow
	}
	if chunk > MaxChunkSize || window > MaxWindow {
		status(FrameError, wire.CodeProtocol, fmt.Sprintf("chunk %d or window %d above %d, %d", chunk, window, MaxChunkSize, MaxWindow))
		return
	}
	// The window only sizes this end's staging ring: the owner caps it by
	// its own setting and by its ring bound, whatever the fetcher asked.
	window = max(1, min(window, c.window, c.maxRing/chunk))
	off, n := int(req.Offset), int(req.Length)
	if n == 0 {
		status(FrameEnd, wire.CodeNoError, "")
		return
	}
	canceled := func() bool {
		if ctx.Err() != nil {
			status(FrameEnd, wire.CodeCancelled, "canceled by the fetcher")
			return true
		}
		return false
	}
	if host := buf.Host(); host != nil {
		for done := 0; done < n; {
			if canceled() {
				return
			}
			k := min(chunk, n-done)
			if err := fr.WriteData(stream, uint64(off+done), host[off+done:off+done+k]); err != nil {
				_ = sc.conn.Close()
				return
			}
			done += k
		}
		c.reportServed(n)
		status(FrameEnd, wire.CodeNoError, "")
		return
	}
	part, err := buf.Slice(off, n)
	if err != nil {
		status(FrameError, wire.CodeOutOfRange, err.Error())
		return
	}
	src, err := newDeviceSource(&sc.ring, part, chunk, window)
	if err != nil {
		status(FrameError, wire.CodeInternal, err.Error())
		return
	}
	defer src.close()
	for done := 0; done < n; {
		if canceled() {
			return
		}
		o, p, err := src.next(ctx)
		if err != nil {
			if ctx.Err() == nil {
				status(FrameError, codes.Code(err), err.Error())
			} else {
				canceled()
			}
			return
		}
		if err := fr.WriteData(stream, uint64(off+o), p); err != nil {
			_ = sc.conn.Close()
			return
		}
		done += len(p)
	}
	c.reportServed(n)
	status(FrameEnd, wire.CodeNoError, "")
}

// reportServed reports n bytes served to the Env's Served hook.
func (c *Channel) reportServed(n int) {
	if c.env.Served != nil {
		c.env.Served(rdma.Staging, int64(n))
	}
}

// PeerDown closes every data connection to and from node; its transfers in
// flight fail with rdma.ErrPeerDown.
func (c *Channel) PeerDown(node string) {
	why := fmt.Errorf("%w: %s", rdma.ErrPeerDown, node)
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.peers[node]; p != nil {
		delete(c.peers, node)
		p.closeAll(why)
	}
	for sc := range c.served {
		if sc.peer == node {
			sc.down.Store(&why)
			_ = sc.conn.Close()
		}
	}
}

func (p *peerPool) closeAll(why error) {
	for _, cc := range p.idle {
		cc.close()
	}
	p.idle = nil
	for cc := range p.active {
		cc.down.Store(&why)
		_ = cc.conn.Close()
	}
}

// Close closes every connection and waits for the transfers in flight to
// fail (with rdma.ErrClosed) and for the channel's goroutines to end.
func (c *Channel) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	why := rdma.ErrClosed
	for node, p := range c.peers {
		delete(c.peers, node)
		p.closeAll(why)
	}
	for sc := range c.served {
		sc.down.Store(&why)
		_ = sc.conn.Close()
	}
	close(c.stop)
	c.mu.Unlock()
	c.wg.Wait()
	return nil
}
