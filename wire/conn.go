package wire

import (
	"bufio"
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
	"github.com/tensorferry/tensorferry/internal/mono"
	"github.com/tensorferry/tensorferry/internal/park"
	"go.uber.org/zap"
)

// DefaultSendQueue is the default number of frames a Conn queues before
// Send blocks: the transport section's default (config.DefaultSendQueue).
const DefaultSendQueue = config.DefaultSendQueue

// connBufferSize is the size of a Conn's read and write buffers.
const connBufferSize = 64 << 10

// ConnOptions configures a Conn.
type ConnOptions struct {
	// MaxFrameSize is the largest payload read or written, in bytes
	// (default DefaultMaxFrameSize, at most MaxFrameSizeLimit; a node sets
	// the config's transport.max_frame_size). Both ends must use the same
	// value. The read buffer grows to the largest frame
	// received and is reused.
	MaxFrameSize uint32
	// SendQueue is the number of frames queued for the writer (default
	// DefaultSendQueue). When it is full, Send blocks: memory stays bounded.
	SendQueue int
	// Logger receives the reason a connection closes (default: none).
	Logger *zap.Logger
	// Handler is called for every frame received, in order, from the single
	// reader goroutine. Frame bodies are decoded before the call and own
	// their memory, except UnknownFrame.Payload, the whole of a
	// *MessagesFrame (the frame, its Messages and their Bodies) and, with
	// TransientMessages, of a *MessageFrame, which are valid only until
	// Handler returns: copy what must outlive the call.
	// Handler must not block for long (it stalls all reading, unless
	// HandlerTakeover is set) and must not call Close; it may call Fail.
	// Unknown frame types are passed on for Handler to ignore or Fail.
	Handler func(Frame)
	// HandlerTakeover, when positive, lets Handler block on a single
	// message: a call for a FrameMessage (whose memory Handler owns; the
	// frame that may run an actor's handler inline) that called MayBlock
	// and has not returned between HandlerTakeover/2 and HandlerTakeover
	// after it no longer holds up the connection. A call that did not
	// call MayBlock is never taken over, however long it runs: the frame
	// behind it must not overtake it. Calls for other frames (batches alias the
	// reader's buffers; connection-level frames must stay in order) are
	// never taken over. A new goroutine takes over reading and handling the next
	// frames (the reader goroutine, when the call ran on a caller's
	// goroutine in Await); the goroutine in Handler ends, or returns from
	// Await, when Handler returns. Frames
	// are still passed to Handler in order, but a later frame's call may
	// then run, and return, before the slow one returns. One watchdog
	// goroutine per process, idle while no Handler call is in progress,
	// watches every Conn that sets it.
	HandlerTakeover time.Duration
	// ReadSpin, when positive, makes the reader poll the socket for up to
	// this long after it finds nothing to read before it parks (see
	// DefaultReadSpinFor): a reply that arrives within it is read without
	// a thread wake-up, at the price of a processor kept busy meanwhile.
	// Only for connections that expose their socket (TCP, Unix; not TLS).
	// On Linux, unless ReadSpinInPoller, Start takes a TCP connection with
	// a read spin out of the runtime's network poller (up to 128 per
	// process): the Conn then reads and writes the socket with its own
	// system calls, and the caller must no longer use nc.
	ReadSpin time.Duration
	// ReadSpinInPoller keeps a TCP connection with a read spin in the
	// runtime's network poller: its reader spins through it
	// (config transport.read_spin_detach: off).
	ReadSpinInPoller bool
	// OnClose is called once, with the cause, after the Conn's goroutines
	// have exited. It must not call Close.
	OnClose func(error)
	// DirectWrite lets Send and SendMessage write on the caller's
	// goroutine when nothing is queued or being written, saving the hand-off
	// to the writer goroutine (lower latency for request/response traffic).
	// Order is kept. The cost: such a write is not bounded by ctx, so on a
	// stalled peer it blocks until the socket drains or the Conn closes
	// (rely on liveness checks to close stalled connections). A Send from
	// Handler then writes on the reader goroutine: two peers that both stop
	// reading while writing would stall until one side's liveness check
	// closes the connection.
	DirectWrite bool
	// CallerReads lets a goroutine waiting for a frame from the peer read
	// the connection itself (Await) while nobody else needs to; after it
	// has read its frame, the read role waits this long for the next
	// such caller before the reader goroutine takes it back, and frames
	// that arrive meanwhile wait as long (default DefaultCallerReads;
	// negative: callers never read). Only for connections whose reads a
	// read deadline interrupts cleanly: sockets (TCP, Unix) and
	// InterruptibleReaders (shared memory), not TLS. A Conn whose users never call
	// Await reads as if it were off.
	CallerReads time.Duration
	// TransientMessages makes a *MessageFrame passed to Handler, its Body
	// and Tensors, valid only until Handler returns, as a *MessagesFrame
	// always is: a single message is then read without a new frame and a
	// copy of its body (two allocations a message). A Handler call taken
	// over (HandlerTakeover) keeps its frame: the reading goes on into new
	// buffers.
	TransientMessages bool
}

// Conn is an authenticated connection carrying frames. Sends from any
// goroutine are queued and written, in the order they were queued, by one
// writer goroutine that batches whatever is queued into few writes; one
// reader goroutine decodes frames and passes them to the Handler.
type Conn struct {
	nc    net.Conn
	peer  Remote
	opts  ConnOptions
	log   *zap.Logger
	max   uint32
	queue chan *outFrame
	slots chan struct{} // one token per queued frame or reserved place
	br    *bufio.Reader
	rd    *Framer

	wmu     sync.Mutex    // held while writing to bw
	bw      *bufio.Writer // guarded by wmu
	pending atomic.Int64  // frames queued and not yet written or skipped

	// The senders' fields, on a cache line of their own: the writer
	// updates pending and wmu once per frame, senders take bmu once per
	// message.
	_ cacheLinePad
	// bmu orders queueing: held while a frame enters the queue (into a
	// slot reserved beforehand), while a message is appended to a batch,
	// and by the writer while it closes the batch it takes (sealBatch).
	bmu sync.Mutex
	// open is the FrameMessages batch at the tail of the queue that
	// messages may join, nil when none may (guarded by bmu).
	open *outFrame
	_    cacheLinePad
	// freeBatches holds the batches not queued nor being written, at most
	// maxQueuedBatches (nil: a place whose batch is not allocated yet): a
	// sender that would open one more waits (backpressure in bytes, not
	// only in frames), and the few buffers in use stay warm (a sync.Pool
	// would lose them at every collection).
	freeBatches chan *outFrame

	mu      sync.Mutex
	started bool
	closing bool
	// saidGoodbye: this end sent a GOAWAY, so the peer closing the
	// connection (EOF) is the expected answer, not an error.
	saidGoodbye atomic.Bool
	err         error

	done       chan struct{} // closed when the Conn starts closing
	writerDone chan struct{} // closed when the writer goroutine has exited
	closed     chan struct{} // closed after goroutines exited and OnClose returned
	wg         sync.WaitGroup
	goAway     atomic.Pointer[GoAway]

	// Burst detection for DirectWrite: frames read so far, and the read
	// count and time (mono.Now) of the last direct write.
	reads      atomic.Uint64
	lastReads  atomic.Uint64
	lastDirect atomic.Int64

	// running: started and not closing (set and cleared under mu), what
	// a direct write checks without taking mu.
	running atomic.Bool

	// rstate is the reader's guarded Handler call: a sequence number and a
	// phase (takeover.go); takeovers counts the calls taken over.
	rstate    atomic.Uint64
	takeovers atomic.Uint64

	// lead is the read role callers may take (Await); nil when they
	// cannot.
	lead *lead
}

// cacheLinePad keeps the fields before and after it on different cache
// lines.
type cacheLinePad [64]byte

// burstWindow: a Send within this time of the previous direct write, with
// no frame read in between, is part of a one-way burst and goes through the
// writer goroutine, which batches the burst into few writes. Request and
// response traffic (a read between two writes) keeps writing directly.
const burstWindow = 200 * time.Microsecond

// outFrame is one queued frame: header and payload in buf. A flush marker
// has no buf and has written, which the writer closes once everything
// queued before it is written.
type outFrame struct {
	buf     []byte
	written chan struct{}
	state   atomic.Int32 // frameQueued, frameTaken, frameCancelled
	err     error
	isBatch bool // a FrameMessages batch of Conn.freeBatches
	// A batch's messages and the encoding of the last one's ids,
	// guarded by Conn.bmu while the batch is open.
	count int
	ids   batchIDs
}

const (
	frameQueued int32 = iota
	frameTaken
	frameCancelled
)

var outFramePool = sync.Pool{New: func() any { return new(outFrame) }}

// NewConn wraps nc, which has completed Handshake with peer. Call Start to
// begin reading and writing.
func NewConn(nc net.Conn, peer Remote, opts ConnOptions) *Conn {
	if opts.SendQueue <= 0 {
		opts.SendQueue = DefaultSendQueue
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if dc := newDetachable(nc, opts.ReadSpin); dc != nil && !opts.ReadSpinInPoller {
		nc = dc // it spins itself: no spinReader below
	}
	c := &Conn{
		nc:          nc,
		peer:        peer,
		opts:        opts,
		log:         log.With(zap.String("peer", peer.Node), zap.Uint64("incarnation", peer.Incarnation), zap.String("purpose", peer.Purpose)),
		max:         clampFrameSize(opts.MaxFrameSize),
		queue:       make(chan *outFrame, opts.SendQueue),
		slots:       make(chan struct{}, opts.SendQueue),
		freeBatches: make(chan *outFrame, maxQueuedBatches),
		bw:          bufio.NewWriterSize(nc, connBufferSize),
		done:        make(chan struct{}),
		writerDone:  make(chan struct{}),
		closed:      make(chan struct{}),
	}
	for range maxQueuedBatches {
		c.freeBatches <- nil
	}
	var src io.Reader = nc
	if sr := newSpinReader(nc, opts.ReadSpin); sr != nil {
		src = sr
	}
	if c.lead = newLead(nc, opts); c.lead != nil {
		src = &leadSource{c: c, r: src}
	}
	c.br = bufio.NewReaderSize(src, connBufferSize)
	c.rd = NewFramer(nil, c.br)
	c.rd.reuseMsg = opts.TransientMessages
	c.rd.SetMaxReadFrameSize(c.max)
	return c
}

// Remote returns the authenticated other end.
func (c *Conn) Remote() Remote { return c.peer }

// Done returns a channel closed when the Conn starts closing.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns the cause the Conn closed with, or nil while it is open.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Start starts the reader and writer goroutines. It does nothing on a
// started or closed Conn.
func (c *Conn) Start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started || c.closing {
		return
	}
	c.started = true
	c.running.Store(true)
	detachOnStart(c.nc)
	c.wg.Add(2)
	if c.opts.HandlerTakeover > 0 && c.opts.Handler != nil {
		takeoverWatch.register(c)
	}
	go c.readLoop()
	go c.writeLoop()
	go func() {
		c.wg.Wait()
		c.finish()
	}()
}

// Close closes the connection with cause err (nil means ErrClosed) and
// waits until its goroutines have exited and OnClose has returned. Frames
// still queued are discarded; call Flush first for a graceful close. Close
// is idempotent and returns nil; it must not be called from Handler or
// OnClose (use Fail).
func (c *Conn) Close(err error) error {
	c.end(err, true)
	<-c.closed
	return nil
}

// Fail starts closing the connection with cause err and returns at once.
// It is safe to call from Handler. The cause is logged as a warning.
func (c *Conn) Fail(err error) {
	c.end(err, false)
}

// End is Fail for an expected end (the peer said goodbye, the node
// stops): the cause is logged at debug level only.
func (c *Conn) End(err error) {
	c.end(err, true)
}

func (c *Conn) fail(err error) { c.end(err, false) }

func (c *Conn) end(err error, expected bool) {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return
	}
	c.closing = true
	c.running.Store(false)
	if err == nil {
		err = ErrClosed
	}
	c.err = err
	started := c.started
	c.mu.Unlock()

	if !expected && c.saidGoodbye.Load() && errors.Is(err, io.EOF) {
		expected = true
	}
	if !expected && !errors.Is(err, ErrClosed) {
		c.log.Warn("wire: closing connection", zap.Error(err))
	} else {
		c.log.Debug("wire: closing connection", zap.Error(err))
	}
	close(c.done)
	c.nc.Close()
	if !started {
		close(c.writerDone)
		c.finish()
	}
}

func (c *Conn) finish() {
	if c.opts.HandlerTakeover > 0 {
		takeoverWatch.unregister(c)
	}
	if c.opts.OnClose != nil {
		c.opts.OnClose(c.Err())
	}
	close(c.closed)
}

// closedErr is the error sends return once the Conn is closing.
func (c *Conn) closedErr() error {
	err := c.Err()
	if err == nil || errors.Is(err, ErrClosed) {
		return ErrClosed
	}
	return fmt.Errorf("%w: %w", ErrClosed, err)
}

func (c *Conn) checkType(t FrameType) error {
	if t.isHandshake() {
		return fmt.Errorf("wire: send: %s is a handshake frame", t)
	}
	return nil
}

// Send queues a frame whose payload is the msgpack encoding of body (nil
// for an empty payload). It blocks while the send queue is full, until
// ctx is done (returning ctx.Err()) or the Conn closes (returning an
// error that wraps ErrClosed). A nil error means the frame was queued, not
// that the peer received it. Encoding errors and ErrFrameTooLarge are
// returned before anything is queued.
func (c *Conn) Send(ctx context.Context, t FrameType, flags Flags, stream uint32, body any) error {
	if err := c.checkType(t); err != nil {
		return err
	}
	if t == FrameGoAway {
		c.saidGoodbye.Store(true)
	}
	of := outFramePool.Get().(*outFrame)
	var err error
	of.buf, err = appendFrame(of.buf[:0], t, flags, stream, body, c.max)
	if err != nil {
		outFramePool.Put(of)
		return err
	}
	if done, err := c.tryDirect(of); done {
		return err
	}
	return c.enqueue(ctx, of)
}

// Flush waits until every frame queued before it has been written to the
// connection (handed to the kernel). Flush then Close closes gracefully.
func (c *Conn) Flush(ctx context.Context) error {
	return c.sendAndWait(ctx, &outFrame{written: make(chan struct{})})
}

func (c *Conn) sendAndWait(ctx context.Context, of *outFrame) error {
	if err := c.enqueue(ctx, of); err != nil {
		return err
	}
	select {
	case <-of.written:
		return of.err
	case <-ctx.Done():
		if of.state.CompareAndSwap(frameQueued, frameCancelled) {
			return ctx.Err()
		}
		select { // taken: wait for the write to finish
		case <-of.written:
			return of.err
		case <-c.writerDone:
		}
	case <-c.writerDone:
	}
	select {
	case <-of.written:
		return of.err
	default:
		return c.closedErr()
	}
}

// tryDirect writes of on the caller's goroutine if DirectWrite is on, the
// Conn is started and open, and no other frame is queued or being written.
// It reports whether it handled of, and the result.
func (c *Conn) tryDirect(of *outFrame) (bool, error) {
	if !c.directAllowed() {
		return false, nil
	}
	return c.writeDirect(of)
}

// directAllowed reports whether a frame may be written on the caller's
// goroutine: DirectWrite is on, nothing is queued, and the frame is not
// part of a one-way burst (see burstWindow).
func (c *Conn) directAllowed() bool {
	if !c.opts.DirectWrite || c.pending.Load() != 0 {
		return false
	}
	// A frame read since the last direct write (request/response) needs
	// no clock.
	return c.reads.Load() != c.lastReads.Load() || mono.Now()-c.lastDirect.Load() >= int64(burstWindow)
}

// writeDirect is tryDirect once directAllowed said yes.
func (c *Conn) writeDirect(of *outFrame) (bool, error) {
	if !c.wmu.TryLock() {
		return false, nil
	}
	defer c.wmu.Unlock()
	if c.pending.Load() != 0 || !c.running.Load() {
		return false, nil
	}
	of.state.Store(frameTaken)
	c.lastReads.Store(c.reads.Load())
	var err error
	if c.bw.Buffered() == 0 && of.written == nil {
		// Nothing waits in the buffer: the frame goes out as it is,
		// without a copy into it.
		_, err = c.nc.Write(of.buf)
		if cap(of.buf) <= 64<<10 {
			outFramePool.Put(of)
		}
	} else if err = c.writeFrameLocked(of); err == nil {
		err = c.bw.Flush()
	}
	c.lastDirect.Store(mono.Now())
	if err != nil {
		err = fmt.Errorf("wire: write to %s: %w", c.peer.Node, err)
		c.fail(err)
		return true, fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return true, nil
}

func (c *Conn) enqueue(ctx context.Context, of *outFrame) error {
	if err := c.acquireSlot(ctx); err != nil {
		return err
	}
	c.bmu.Lock()
	// Later messages must not join a batch queued before this frame.
	c.open = nil
	c.push(of)
	c.bmu.Unlock()
	return nil
}

// acquireSlot reserves room for one frame in the queue, waiting while it is
// full until ctx is done or the Conn closes. Senders wait here, never while
// holding c.bmu, which the writer needs to seal a batch.
func (c *Conn) acquireSlot(ctx context.Context) error {
	select {
	case <-c.done:
		return c.closedErr()
	default:
	}
	select {
	case c.slots <- struct{}{}:
		return nil
	case <-c.done:
		return c.closedErr()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// push queues of into the slot its sender reserved; c.bmu is held.
func (c *Conn) push(of *outFrame) {
	c.pending.Add(1)
	c.queue <- of // never blocks: a slot is reserved
}

// take returns the next queued frame, or nil; only the writer takes.
func (c *Conn) take() *outFrame {
	select {
	case of := <-c.queue:
		<-c.slots
		return of
	default:
		return nil
	}
}

func (c *Conn) writeLoop() {
	defer c.wg.Done()
	defer close(c.writerDone)
	for {
		var of *outFrame
		select {
		case of = <-c.queue:
			<-c.slots
		case <-c.done:
			return
		}
		if err := c.writeBatch(of); err != nil {
			c.fail(fmt.Errorf("wire: write to %s: %w", c.peer.Node, err))
			return
		}
	}
}

// writeBatch writes of and whatever else is queued, then flushes once.
func (c *Conn) writeBatch(of *outFrame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for of != nil {
		err := c.writeFrame(of)
		c.pending.Add(-1)
		if err != nil {
			return err
		}
		of = c.take()
	}
	return c.bw.Flush()
}

// writeFrame writes a queued frame unless its sender cancelled it.
func (c *Conn) writeFrame(of *outFrame) error {
	if of.written != nil && !of.state.CompareAndSwap(frameQueued, frameTaken) {
		return nil // cancelled by the sender
	}
	if !of.isBatch {
		return c.writeFrameLocked(of)
	}
	_, err := c.bw.Write(c.sealBatch(of))
	c.freeBatches <- of // never blocks: one place per batch taken
	return err
}

// writeFrameLocked writes of into bw; c.wmu is held and of is taken.
func (c *Conn) writeFrameLocked(of *outFrame) error {
	if of.written == nil {
		_, err := c.bw.Write(of.buf)
		if cap(of.buf) <= 64<<10 {
			outFramePool.Put(of)
		}
		return err
	}
	err := c.bw.Flush()
	if err != nil {
		of.err = fmt.Errorf("%w: write: %w", ErrClosed, err)
	}
	close(of.written)
	return err
}

// Takeovers returns how many Handler calls ran past HandlerTakeover and
// were left to finish on their own while a new goroutine went on reading.
func (c *Conn) Takeovers() uint64 { return c.takeovers.Load() }

// readLoop is the reader goroutine, started by Start or, after a take-over,
// by the watchdog; it holds one place in c.wg, which a reader that was
// taken over leaves to its successor.
func (c *Conn) readLoop() {
	if c.readFrames() {
		c.wg.Done()
	}
}

// readFrames reads and handles frames until the connection fails (true)
// or the watchdog hands reading to a new goroutine while Handler ran
// (false: the caller must not touch the Conn's reading state again).
// Between frames, with nothing buffered, it may leave the read role to
// callers (Await) and wait until it is given back.
func (c *Conn) readFrames() bool {
	for {
		if c.lead != nil && c.br.Buffered() == 0 {
			c.keepRole()
		}
		f, err := c.rd.ReadFrame()
		if err != nil {
			c.fail(c.readError(err))
			return true
		}
		switch c.handleFrame(f) {
		case frameFatal:
			return true
		case frameTakenOver:
			return false // a new reader took over
		}
		if c.opts.ReadSpin > 0 && c.br.Buffered() == 0 {
			// A goroutine that Handler made runnable (a protoactor
			// future's caller, an actor's mailbox) waits in this
			// processor's run queue, where the read spin, which never
			// yields, would hold it until another processor steals it
			// or the spin ends: it runs first.
			runtime.Gosched()
		}
	}
}

// Results of handleFrame.
const (
	frameHandled   = iota
	frameFatal     // the connection failed: stop reading
	frameTakenOver // Handler ran past HandlerTakeover: the reading went on elsewhere
)

// handleFrame passes a frame, read by the holder of the read role, to
// Handler.
func (c *Conn) handleFrame(f Frame) int {
	c.reads.Add(1)
	h := f.Header()
	if h.Type.isHandshake() {
		c.fail(connErr(CodeProtocol, nil, "%s after the handshake", h))
		return frameFatal
	}
	if g, ok := f.(*GoAwayFrame); ok {
		ga := g.GoAway
		c.goAway.Store(&ga)
	}
	if c.opts.Handler == nil {
		return frameHandled
	}
	if c.opts.HandlerTakeover > 0 && h.Type == FrameMessage {
		// Only the holder of the read role moves rstate out of
		// phaseReading.
		s := (c.rstate.Load()&^phaseMask + phaseMask + 1) | phaseHandling
		park.Publish(&c.rstate, s) // then wake the watchdog: see package park
		takeoverWatch.poke()
		c.opts.Handler(f)
		if !c.endGuarded(s) {
			return frameTakenOver
		}
		return frameHandled
	}
	c.opts.Handler(f)
	return frameHandled
}

// endGuarded ends the reader's guarded Handler call, which it marked s
// (phaseHandling): false when the watchdog handed the reading to a new
// goroutine meanwhile (rstate is then the abandoned s, or already a call
// of the new reader).
func (c *Conn) endGuarded(s uint64) bool {
	done := s &^ phaseMask
	return c.rstate.CompareAndSwap(s, done) || c.rstate.CompareAndSwap(done|phaseBlocking, done)
}

func (c *Conn) readError(err error) error {
	select {
	case <-c.done:
		return err // closing already; the cause is set
	default:
	}
	if errors.Is(err, io.EOF) {
		if g := c.goAway.Load(); g != nil {
			return &ConnError{Code: g.Code, Reason: "peer went away: " + g.Reason, Err: ErrClosed}
		}
		return fmt.Errorf("wire: %s closed the connection: %w", c.peer.Node, err)
	}
	var ce *ConnError
	if errors.As(err, &ce) {
		return err
	}
	return fmt.Errorf("wire: read from %s: %w", c.peer.Node, err)
}
