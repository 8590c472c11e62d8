package verbs

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/internal/tracehook"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

// drainTimeout is how long a cancelled transfer waits for its outstanding
// reads before it flushes the queue pair (failing the other transfers on
// it) so that it can return without the NIC still writing its destination.
const drainTimeout = time.Second

// controlTimeout bounds the begin and end messages of a read.
const controlTimeout = 10 * time.Second

var errCacheClosed = errors.New("verbs: connection closed")

// fetchPeer is the fetcher's connection to one owner: a protection domain,
// one RC queue pair and its completion queue, a poller that hands
// completions to the transfers waiting for them. Its destination
// registrations are in the channel's cache under destKey.
type fetchPeer struct {
	c     *Channel
	node  string
	rail  int           // index in c.rails, and of the owner's device it connects to
	ready chan struct{} // closed when set-up finished; err says how
	err   error

	pd      *ibverbs.PD
	cq      *ibverbs.CQ
	qp      *ibverbs.QP
	destKey string // the cache's peer string for this connection's registrations

	slots chan struct{} // one token per posted work request
	wake  chan struct{}
	quit  chan struct{}
	done  chan struct{} // closed when the poller returned

	mu      sync.Mutex
	broken  error
	waiters map[uint64]chan<- ibverbs.WorkCompletion
	nextWR  uint64
	users   sync.WaitGroup
}

// control sends req to node's verbs channel and decodes the reply.
func (c *Channel) control(ctx context.Context, node string, req *request) (*reply, error) {
	b, err := encode(req)
	if err != nil {
		return nil, err
	}
	rb, err := c.env.Control(ctx, node, rdma.Verbs, b)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("verbs: control message to %s: %w", node, err)
	}
	rep, err := decodeReply(rb)
	if err != nil {
		return nil, err
	}
	return rep, rep.err(node)
}

// Fetch reads the export named by d from its owner into the start of dst
// with RDMA READs of Config.ChunkSize bytes, Config.Window outstanding. The
// owner checks the lease first (tensor.ErrUnknownExport, ErrBadLease,
// ErrStale come back from it). dst smaller than d.Bytes gives
// rdma.ErrTooSmall, a descriptor without a verbs offer rdma.ErrNoOffer. A
// work completion error fails the transfer with an *ibverbs.WCError (and
// rdma.ErrPeerDown when the owner stopped answering); cancelling ctx
// returns ctx's error once no read still writes into dst.
func (c *Channel) Fetch(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("verbs: fetch: %w", err)
	}
	if int64(dst.Len()) < d.Bytes {
		return fmt.Errorf("verbs: fetch %v into %d bytes: %w", d, dst.Len(), rdma.ErrTooSmall)
	}
	raw, ok := d.Offers[rdma.Verbs]
	if !ok {
		return fmt.Errorf("verbs: fetch %v: %w", d, rdma.ErrNoOffer)
	}
	off, err := decodeOffer(raw)
	if err != nil {
		return fmt.Errorf("verbs: fetch %v: %w", d, err)
	}
	if off.Len != d.Bytes {
		return fmt.Errorf("verbs: fetch %v: offer of %d bytes: %w", d, off.Len, tensor.ErrBadSize)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("verbs: fetch %v: %w", d, err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return rdma.ErrClosed
	}
	c.fetching.Add(1)
	c.bg.Add(1)
	c.mu.Unlock()
	defer c.bg.Done()
	defer c.fetching.Add(-1)

	if d.Bytes == 0 {
		// Nothing to read: the owner only checks the lease.
		rep, err := c.begin(ctx, d, 0)
		if err != nil {
			return fmt.Errorf("verbs: fetch %v: %w", d, err)
		}
		c.endRead(ctx, d.Owner, 0, rep.Token)
		if rep.Len != 0 {
			return fmt.Errorf("verbs: fetch %v: owner holds %d bytes: %w", d, rep.Len, tensor.ErrBadSize)
		}
		return nil
	}
	out, err := dst.Slice(0, int(d.Bytes))
	if err != nil {
		return fmt.Errorf("verbs: fetch %v: %w", d, err)
	}
	if err := c.fetchSlices(ctx, d, out); err != nil {
		return fmt.Errorf("verbs: fetch %v: %w", d, err)
	}
	return nil
}

// railsFor returns how many rails a transfer of n bytes uses.
func (c *Channel) railsFor(n int64) int {
	return int(max(1, min(int64(len(c.rails)), n/c.cfg.RailMinBytes)))
}

// fetchSlices reads d into out, split in railsFor(d.Bytes) slices read
// concurrently, slice i over rail i (fetchSlice). A slice that fails
// cancels the others.
func (c *Channel) fetchSlices(ctx context.Context, d *tensor.Descriptor, out memory.Buffer) error {
	k := c.railsFor(d.Bytes)
	if k == 1 {
		return c.fetchSlice(ctx, d, out, 0, 0)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	per := (d.Bytes + int64(k) - 1) / int64(k)
	parts := make([]memory.Buffer, k)
	for i := range k {
		off := int64(i) * per
		var err error
		if parts[i], err = out.Slice(int(off), int(min(per, d.Bytes-off))); err != nil {
			return err
		}
	}
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i, part := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = c.fetchSlice(ctx, d, part, int64(i)*per, i); errs[i] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	return telling(failed)
}

// fetchSlice reads the bytes of d from off into part over rail first. When
// that rail fails (its connection breaks, a read fails or stalls, the owner
// has no such rail) the slice is read again over the other rails in turn;
// errors no other rail can mend (the lease, the size, ctx, the channel
// closing) end it at once.
func (c *Channel) fetchSlice(ctx context.Context, d *tensor.Descriptor, part memory.Buffer, off int64, first int) error {
	var errs []error
	for try := range len(c.rails) {
		r := (first + try) % len(c.rails)
		err := c.fetchRail(ctx, d, part, off, r)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
		if final(ctx, err) {
			break
		}
		if try+1 < len(c.rails) {
			c.log.Debug("rail failed: reading its slice over another", zap.String("owner", d.Owner),
				zap.Int("rail", r), zap.Int64("offset", off), zap.Error(err))
			c.stats.failovers.Add(1)
		}
	}
	return telling(errs)
}

// telling returns the error of errs (attempts at a transfer or its slices,
// in order) that explains the failure best: one no rail could mend (the
// lease, the size; a cancellation only if nothing else failed), else the
// owner being down (its NICs all fail; which error each read saw depends
// on how far the owner's teardown got), else the first.
func telling(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	for _, err := range errs {
		if final(context.Background(), err) {
			return err
		}
	}
	for _, err := range errs {
		if errors.Is(err, rdma.ErrPeerDown) {
			return err
		}
	}
	for _, err := range errs {
		if !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return errs[0]
}

// final reports whether err fails a transfer whichever rail it uses.
func final(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, tensor.ErrBadLease) || errors.Is(err, tensor.ErrUnknownExport) ||
		errors.Is(err, tensor.ErrStale) || errors.Is(err, tensor.ErrBadSize) || errors.Is(err, rdma.ErrClosed) ||
		errors.Is(err, tensor.ErrStoreClosed)
}

// fetchRail reads bytes [off, off+out.Len()) of d into out over one rail,
// connecting first (a window is bound through the owner's queue pair for
// this connection when the read begins); a connection torn down under it
// is set up again once.
func (c *Channel) fetchRail(ctx context.Context, d *tensor.Descriptor, out memory.Buffer, off int64, rail int) error {
	for attempt := 0; ; attempt++ {
		fp, err := c.fetchPeer(ctx, d.Owner, rail)
		if err != nil {
			return err
		}
		err = c.fetchOnce(ctx, fp, d, out, off)
		if errors.Is(err, errCacheClosed) && attempt == 0 {
			continue // the connection was torn down under us: one retry
		}
		return err
	}
}

// begin asks d's owner to begin a read on a rail. It is not cancelled half
// way: an acquisition the owner made but whose reply was dropped would stay
// until PeerDown.
func (c *Channel) begin(ctx context.Context, d *tensor.Descriptor, rail int) (*reply, error) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), controlTimeout)
	defer cancel()
	return c.control(bctx, d.Owner, &request{Op: opBegin, Incarnation: d.Incarnation, ExportID: d.ExportID, Lease: d.Lease, Rail: uint8(rail)})
}

// fetchOnce begins a read of d on fp's connection, reads its bytes from off
// into out and ends the read.
func (c *Channel) fetchOnce(ctx context.Context, fp *fetchPeer, d *tensor.Descriptor, out memory.Buffer, off int64) error {
	rep, err := c.begin(ctx, d, fp.rail)
	if err != nil {
		return err
	}
	defer c.endRead(ctx, d.Owner, fp.rail, rep.Token)
	if err := ctx.Err(); err != nil {
		return err
	}
	if rep.Len != d.Bytes {
		return fmt.Errorf("owner holds %d bytes: %w", rep.Len, tensor.ErrBadSize)
	}
	return fp.read(ctx, out, rep.Addr+uint64(off), rep.RKey)
}

// endRead tells the owner the read is over, even when ctx was cancelled.
func (c *Channel) endRead(ctx context.Context, owner string, rail int, token uint64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), controlTimeout)
	defer cancel()
	if _, err := c.control(ctx, owner, &request{Op: opEnd, Token: token, Rail: uint8(rail)}); err != nil {
		c.log.Debug("ending a read", zap.String("owner", owner), zap.Error(err))
	}
}

// fetchPeer returns the connection to owner on a rail, setting it up on
// first use.
func (c *Channel) fetchPeer(ctx context.Context, owner string, rail int) (*fetchPeer, error) {
	k := railKey{owner, rail}
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, rdma.ErrClosed
		}
		fp := c.fetches[k]
		create := fp == nil
		if create {
			fp = &fetchPeer{c: c, node: owner, rail: rail, ready: make(chan struct{})}
			c.fetches[k] = fp
		}
		c.mu.Unlock()
		if create {
			fp.err = fp.setup(ctx)
			if fp.err != nil {
				c.mu.Lock()
				if c.fetches[k] == fp {
					delete(c.fetches, k)
				}
				c.mu.Unlock()
			}
			close(fp.ready)
			return fp, fp.err
		}
		select {
		case <-fp.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if fp.err == nil || attempt > 0 {
			return fp, fp.err
		}
		// Another transfer's set-up failed (perhaps its context ended): try
		// once ourselves.
	}
}

// setup creates the queue pair, exchanges endpoints with the owner and
// starts the poller.
func (fp *fetchPeer) setup(ctx context.Context) (err error) {
	c := fp.c
	r := c.rails[fp.rail]
	if fp.pd, err = r.ctx.AllocPD(); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			fp.destroy()
		}
	}()
	if fp.cq, err = r.ctx.CreateCQ(c.cfg.SendQueue); err != nil {
		return err
	}
	if fp.qp, err = fp.pd.CreateRCQP(fp.cq, ibverbs.QPCaps{MaxSendWR: uint32(c.cfg.SendQueue), MaxRecvWR: 1}); err != nil {
		return err
	}
	psn := randomPSN()
	local := fp.qp.LocalEndpoint(r.port, psn)
	rep, err := c.control(ctx, fp.node, &request{Op: opConnect, Endpoint: endpointToMsg(local), Rail: uint8(fp.rail)})
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", fp.node, err)
	}
	remote, err := rep.Endpoint.endpoint()
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", fp.node, err)
	}
	if remote.HasGID != local.HasGID {
		return fmt.Errorf("connecting to %s: link layers differ (GID here %v, there %v)", fp.node, local.HasGID, remote.HasGID)
	}
	if err := fp.qp.Connect(r.port, 0, remote, psn, c.cfg.Connect); err != nil {
		return fmt.Errorf("connecting to %s: %w", fp.node, err)
	}
	fp.destKey = fmt.Sprintf("%s#%d", fp.node, c.destSeq.Add(1))
	c.mu.Lock()
	c.destPDs[fp.destKey] = fp.pd
	c.mu.Unlock()
	fp.slots = make(chan struct{}, c.cfg.SendQueue)
	fp.wake = make(chan struct{}, 1)
	fp.quit = make(chan struct{})
	fp.done = make(chan struct{})
	fp.waiters = map[uint64]chan<- ibverbs.WorkCompletion{}
	c.stats.conns.Add(1)
	c.bg.Add(1)
	go fp.poll()
	return nil
}

// destroy frees what setup made, in order. Only without users.
func (fp *fetchPeer) destroy() {
	warn := func(what string, err error) {
		if err != nil {
			fp.c.log.Warn(what, zap.String("owner", fp.node), zap.Error(err))
		}
	}
	if fp.qp != nil {
		warn("destroying a queue pair", fp.qp.Close())
	}
	if fp.destKey != "" {
		// No transfer uses the connection any more: its registrations are
		// all idle and go now, before the protection domain.
		fp.c.dropDests(fp.destKey)
		fp.c.mu.Lock()
		delete(fp.c.destPDs, fp.destKey)
		fp.c.mu.Unlock()
	}
	if fp.cq != nil {
		warn("destroying a completion queue", fp.cq.Close())
	}
	if fp.pd != nil {
		warn("freeing a protection domain", fp.pd.Close())
	}
}

// fail breaks the connection: the queue pair is moved to the error state so
// every outstanding read completes (flushed), and once the transfers using
// it have returned, everything is destroyed in the background.
func (fp *fetchPeer) fail(err error) {
	fp.mu.Lock()
	if fp.broken != nil {
		fp.mu.Unlock()
		return
	}
	fp.broken = err
	fp.mu.Unlock()
	c := fp.c
	c.mu.Lock()
	if k := (railKey{fp.node, fp.rail}); c.fetches[k] == fp {
		delete(c.fetches, k)
	}
	c.mu.Unlock()
	if e := fp.qp.SetError(); e != nil {
		c.log.Debug("flushing a queue pair", zap.String("owner", fp.node), zap.Error(e))
	}
	// Idle destination registrations go now, ones in use when their
	// transfer returns.
	c.dropDests(fp.destKey)
	c.log.Debug("connection broken", zap.String("owner", fp.node), zap.Error(err))
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		fp.users.Wait()
		close(fp.quit)
		<-fp.done
		fp.destroy()
	}()
}

// teardown breaks a connection that may still be setting up.
func (fp *fetchPeer) teardown(err error) {
	<-fp.ready
	if fp.err == nil {
		fp.fail(err)
	}
}

// enter counts a transfer as a user of the connection.
func (fp *fetchPeer) enter() error {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	if fp.broken != nil {
		return fmt.Errorf("%w: %w", errCacheClosed, fp.broken)
	}
	fp.users.Add(1)
	return nil
}

func (fp *fetchPeer) brokenErr() error {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	return fp.broken
}

// post registers a waiter for one READ and posts it.
func (fp *fetchPeer) post(req ibverbs.ReadRequest, comps chan<- ibverbs.WorkCompletion) error {
	fp.mu.Lock()
	if fp.broken != nil {
		fp.mu.Unlock()
		return fp.broken
	}
	fp.nextWR++
	req.WRID = fp.nextWR
	fp.waiters[req.WRID] = comps
	fp.mu.Unlock()
	if err := fp.qp.PostReads([]ibverbs.ReadRequest{req}); err != nil {
		fp.mu.Lock()
		delete(fp.waiters, req.WRID)
		fp.mu.Unlock()
		return err
	}
	select {
	case fp.wake <- struct{}{}:
	default:
	}
	return nil
}

// read copies n = dst.Len() bytes from the owner's (raddr, rkey) into dst.
func (fp *fetchPeer) read(ctx context.Context, dst memory.Buffer, raddr uint64, rkey uint32) error {
	if err := fp.enter(); err != nil {
		return err
	}
	defer fp.users.Done()
	mr, put, err := fp.destination(ctx, dst)
	if err != nil {
		return err
	}
	defer put()
	c := fp.c
	n := int64(dst.Len())
	chunk := int64(c.cfg.ChunkSize)
	window := c.cfg.Window
	laddr := dst.Ptr()
	lkey := mr.LKey()
	comps := make(chan ibverbs.WorkCompletion, window)

	var (
		next        int64
		outstanding int
		firstErr    error
		ctxDone     = ctx.Done()
		drain       <-chan time.Time
	)
	stop := func(err error) {
		if firstErr == nil {
			firstErr = err
		}
	}
	for {
		// Post while the window and the send queue have room.
		for firstErr == nil && next < n && outstanding < window {
			if outstanding > 0 {
				select {
				case fp.slots <- struct{}{}:
				default:
					goto wait // the queue pair is full: wait for our own reads
				}
			} else {
				select {
				case fp.slots <- struct{}{}:
				case <-ctxDone:
					stop(ctx.Err())
					goto wait
				}
			}
			length := min(chunk, n-next)
			err := fp.post(ibverbs.ReadRequest{
				LocalAddr: laddr + uintptr(next), LKey: lkey, Length: uint32(length),
				RemoteAddr: raddr + uint64(next), RKey: rkey, Signaled: true,
			}, comps)
			if err != nil {
				<-fp.slots
				stop(err)
				break
			}
			outstanding++
			next += length
		}
	wait:
		if outstanding == 0 {
			break
		}
		select {
		case wc := <-comps:
			outstanding--
			<-fp.slots
			if err := wc.Err(); err != nil {
				stop(err)
				fp.fail(fmt.Errorf("read from %s failed: %w", fp.node, err))
			}
		case <-ctxDone:
			// Stop posting; the reads already posted still write dst.
			stop(ctx.Err())
			ctxDone = nil
			drain = time.After(drainTimeout)
		case <-drain:
			drain = nil
			fp.fail(fmt.Errorf("cancelled transfer: reads from %s outstanding after %v", fp.node, drainTimeout))
		}
	}
	if firstErr == nil {
		return nil
	}
	var wce *ibverbs.WCError
	if errors.As(firstErr, &wce) {
		switch wce.Status {
		case ibverbs.WCRetryExcErr, ibverbs.WCRNRRetryExcErr:
			return fmt.Errorf("%w: %s stopped answering: %w", rdma.ErrPeerDown, fp.node, firstErr)
		case ibverbs.WCWRFlushErr:
			if b := fp.brokenErr(); b != nil {
				return fmt.Errorf("%w (%w)", b, firstErr)
			}
		}
	}
	return firstErr
}

// destination returns dst registered for local writes in fp's protection
// domain and a function that gives it back: its whole allocation, through
// the channel's registration cache, or, where that cannot be used, dst
// alone for this transfer. Whether the cache held it is recorded on the
// fetch's span.
func (fp *fetchPeer) destination(ctx context.Context, dst memory.Buffer) (*ibverbs.MR, func(), error) {
	c := fp.c
	if !cacheable(dst) {
		mr, err := regBuffer(fp.pd, dst, 0, dst.Len(), ibverbs.AccessLocalWrite)
		if err != nil {
			return nil, nil, fmt.Errorf("verbs: registering a destination: %w", err)
		}
		c.stats.fetchReg.Add(1)
		return mr, func() {
			if err := mr.Close(); err != nil {
				c.log.Warn("deregistering a destination", zap.Error(err))
			}
		}, nil
	}
	reg, put, err := c.dests.Get(dst.Allocation(), fp.destKey)
	if err != nil {
		return nil, nil, err
	}
	d, ok := reg.(*destReg)
	if !ok {
		put()
		return nil, nil, fmt.Errorf("verbs: foreign registration %T", reg)
	}
	tracehook.CacheHit(ctx, d.used.Swap(true))
	return d.mr, put, nil
}

// poll hands completions to the transfers waiting for them until quit.
func (fp *fetchPeer) poll() {
	defer fp.c.bg.Done()
	defer close(fp.done)
	wcs := make([]ibverbs.WorkCompletion, 32)
	idle := 0
	progress := time.Now() // last completion, or when reads were first pending
	for {
		n, err := fp.cq.Poll(wcs)
		if err != nil {
			fp.fail(fmt.Errorf("polling completions: %w", err))
		}
		if n > 0 {
			progress = time.Now()
		}
		for _, wc := range wcs[:n] {
			fp.mu.Lock()
			ch := fp.waiters[wc.WRID]
			delete(fp.waiters, wc.WRID)
			fp.mu.Unlock()
			if ch != nil {
				ch <- wc // buffered for the transfer's whole window
			}
		}
		if n > 0 {
			idle = 0
			continue
		}
		fp.mu.Lock()
		pending := len(fp.waiters)
		fp.mu.Unlock()
		if pending == 0 {
			select {
			case <-fp.wake:
			case <-fp.quit:
				return
			}
			progress = time.Now()
			continue
		}
		if stall := fp.c.cfg.StallTimeout; time.Since(progress) > stall {
			fp.fail(fmt.Errorf("%w: %s: no read completed for %v", rdma.ErrPeerDown, fp.node, stall))
			progress = time.Now()
		}
		select {
		case <-fp.quit:
			return
		default:
		}
		idle++
		if idle < 32 {
			runtime.Gosched()
		} else {
			time.Sleep(time.Duration(min(idle, 500)) * time.Microsecond)
		}
	}
}
