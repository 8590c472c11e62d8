package wire

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"

	"github.com/tinylib/msgp/msgp"
)

// A FrameMessages payload is a msgpack array of Message maps, each encoded
// exactly as a FrameMessage body. Conn.SendMessage fills one while the
// writer is busy, so that a burst of small messages costs one frame header,
// one queue slot and one decode pass per batch instead of per message.

// Batch limits: a batch is closed at MaxBatchMessages messages or once its
// payload reaches maxBatchBytes (a single larger message still travels
// alone, up to the maximum frame size).
const (
	// MaxBatchMessages is the most messages Conn.SendMessage puts in one
	// FrameMessages.
	MaxBatchMessages = 1024
	maxBatchBytes    = 32 << 10
)

// maxQueuedBatches is the most FrameMessages batches a Conn holds queued
// or being written (at most maxQueuedBatches × maxBatchBytes of messages).
const maxQueuedBatches = 8

// batchPrefix is the array32 header that starts a batch payload; its count
// is written when the writer takes the batch.
const batchPrefix = 5

// batchBufferSize is the capacity a batch buffer starts with: room for a
// full batch and the message that overflows it, without regrowing.
const batchBufferSize = maxBatchBytes + 4<<10

// stringCache interns the strings that repeat from message to message
// (actor ids, node names, type names) so that decoding them allocates
// nothing. It is a direct-mapped table: a name that does not repeat (a
// future's id) only overwrites one slot, so the table never grows nor
// rehashes and memory stays bounded whatever the peer sends. It belongs to
// one Framer (one reader goroutine).
type stringCache struct {
	slots [stringCacheSlots]string
}

const (
	stringCacheSlots  = 256 // a power of two
	stringCacheMaxLen = 128
)

func (c *stringCache) get(b []byte) string {
	if c == nil || len(b) > stringCacheMaxLen {
		return string(b)
	}
	h := uint32(2166136261) // FNV-1a
	for _, x := range b {
		h = (h ^ uint32(x)) * 16777619
	}
	slot := &c.slots[h&(stringCacheSlots-1)]
	if *slot == string(b) { // no allocation
		return *slot
	}
	s := string(b)
	*slot = s
	return s
}

// parseMessage decodes a FrameMessage payload; the body is copied.
func (fr *Framer) parseMessage(h FrameHeader, p []byte) (Frame, error) {
	f := &MessageFrame{FrameHeader: h}
	rest, err := readMessage(p, &f.Message, &fr.strs, true)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%w: %w", ErrBadBody, errMsgpackTrailing)
	}
	if err != nil {
		return nil, bodyError(h, err)
	}
	return f, nil
}

// parseMessages decodes a FrameMessages payload into the Framer's reused
// frame; the bodies alias p.
func (fr *Framer) parseMessages(h FrameHeader, p []byte) (Frame, error) {
	n, rest, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil {
		return nil, bodyError(h, fmt.Errorf("%w: messages: %w", ErrBadBody, err))
	}
	// Each message takes at least one byte: the count is checked against
	// the bytes that are there before the slice is sized from it.
	if n > MaxBatchMessages || uint64(n) > uint64(len(rest)) {
		return nil, bodyError(h, fmt.Errorf("%w: %d messages in one batch of %d bytes (at most %d)", ErrBadBody, n, len(rest), MaxBatchMessages))
	}
	f := &fr.batch
	f.FrameHeader = h
	if cap(f.Messages) < int(n) {
		f.Messages = make([]Message, n, max(n, 64))
	}
	f.Messages = f.Messages[:n]
	for i := range f.Messages {
		if rest, err = readMessage(rest, &f.Messages[i], &fr.strs, false); err != nil {
			return nil, bodyError(h, fmt.Errorf("message %d: %w", i, err))
		}
	}
	if len(rest) != 0 {
		return nil, bodyError(h, fmt.Errorf("%w: %w", ErrBadBody, errMsgpackTrailing))
	}
	return f, nil
}

// AppendMessagesPayload appends the FrameMessages payload carrying msgs to
// dst (what Conn.SendMessage builds incrementally).
func AppendMessagesPayload(dst []byte, msgs []Message) []byte {
	dst = appendArray32(dst, uint32(len(msgs)))
	for i := range msgs {
		dst = appendMessage(dst, &msgs[i])
	}
	return dst
}

// WriteMessages writes a FrameMessages frame carrying msgs (stream 0), in
// one Write call. At most MaxBatchMessages messages fit in one frame.
func (fr *Framer) WriteMessages(msgs []Message) error {
	if len(msgs) > MaxBatchMessages {
		return fmt.Errorf("wire: %d messages in one batch (at most %d)", len(msgs), MaxBatchMessages)
	}
	fr.wbuf = append(fr.wbuf[:0], make([]byte, HeaderSize)...)
	fr.wbuf = AppendMessagesPayload(fr.wbuf, msgs)
	n := len(fr.wbuf) - HeaderSize
	if n > int(fr.maxWrite) {
		return fmt.Errorf("%w: %s payload of %d bytes exceeds %d", ErrFrameTooLarge, FrameMessages, n, fr.maxWrite)
	}
	putHeader(fr.wbuf, FrameMessages, 0, 0, uint32(n))
	_, err := fr.w.Write(fr.wbuf)
	fr.shrinkWriteBuf()
	return err
}

// appendArray32 appends an array header in its 5-byte form (array32),
// whatever n is: a batch's count is patched in place (sealBatch) when the
// batch closes, so its header has a fixed width.
func appendArray32(dst []byte, n uint32) []byte {
	return binary.BigEndian.AppendUint32(append(dst, 0xdd), n)
}

// SendMessage queues m, ordered with the Conn's other sends. An idle Conn
// with DirectWrite writes it at once as a FrameMessage; otherwise it joins
// the FrameMessages batch still waiting in the queue, or opens a new one,
// so that messages sent while the writer is busy leave together. m is
// encoded before SendMessage returns (its Body may be reused). It blocks,
// like Send, only while the queue is full.
//
// A message joins the open batch without c.bmu and without waiting for the
// writer: it claims the batch through the batch's state word (see
// batchAppending), which the writer also uses to seal the batch when it
// takes it, so that neither ever parks on the other.
func (c *Conn) SendMessage(ctx context.Context, m *Message) error {
	if c.opts.DirectWrite && c.pending.Load() == 0 {
		of := outFramePool.Get().(*outFrame)
		of.buf = appendMessage(append(of.buf[:0], make([]byte, HeaderSize)...), m)
		n := len(of.buf) - HeaderSize
		if n > int(c.max) {
			outFramePool.Put(of)
			return fmt.Errorf("%w: %s payload of %d bytes exceeds %d", ErrFrameTooLarge, FrameMessage, n, c.max)
		}
		putHeader(of.buf, FrameMessage, 0, 0, uint32(n))
		if done, err := c.tryDirect(of); done {
			return err
		}
		outFramePool.Put(of)
	}
	limit := min(maxBatchBytes, int(c.max))
	if of := c.open.Load(); of != nil {
		switch c.appendTo(of, m, limit, false) {
		case appended:
			return nil
		case busy: // another sender is appending: take turns under c.bmu
			c.bmu.Lock()
			done := c.appendOpen(m, limit)
			c.bmu.Unlock()
			if done {
				return nil
			}
		}
	}
	of, err := c.acquireBatch(ctx)
	if err != nil {
		return err
	}
	of.buf = appendMessage(append(of.buf[:0], make([]byte, HeaderSize+batchPrefix)...), m)
	if n := len(of.buf) - HeaderSize; n > int(c.max) {
		c.releaseBatch(of)
		return fmt.Errorf("%w: %s payload of %d bytes exceeds %d", ErrFrameTooLarge, FrameMessages, n, c.max)
	}
	if err := c.acquireSlot(ctx); err != nil {
		c.releaseBatch(of)
		return err
	}
	c.bmu.Lock()
	if c.appendOpen(m, limit) {
		// Another sender opened a batch while this one waited.
		c.bmu.Unlock()
		<-c.slots
		c.releaseBatch(of)
		return nil
	}
	// Senders holding a stale pointer to of (its previous use) find it
	// sealed until this store, which publishes the message written above.
	of.bstate.Store(1)
	c.push(of)
	c.open.Store(of)
	c.bmu.Unlock()
	return nil
}

// A batch's state word (outFrame.bstate) holds the number of messages in
// it and two flags. A sender sets batchAppending (compare-and-swap from a
// state without either flag) before it appends a message to buf, and
// clears it, with the count one higher, after; the writer sets batchSealed
// when it takes the batch, once no sender is appending. A sealed batch
// takes no more messages; buf and the count then belong to the writer.
// A sender also seals a batch that has no room for its message. The word
// stays sealed while the batch is written and back on the free list, so a
// sender that read c.open before the batch was taken finds it closed.
const (
	batchAppending = 1 << 30
	batchSealed    = 1 << 31
	batchCountMask = batchAppending - 1
)

// appendResult is what appendTo did.
type appendResult int

const (
	appended appendResult = iota // m is in the batch
	closed                       // the batch is sealed or full: open another
	busy                         // another sender is appending (only when !wait)
)

// appendTo appends m to the batch of if it is open and has room for it.
// With wait, it waits for another sender's append to end (c.bmu is then
// held, so at most one sender waits); without, it returns busy.
func (c *Conn) appendTo(of *outFrame, m *Message, limit int, wait bool) appendResult {
	var s uint32
	for i := 0; ; i++ {
		s = of.bstate.Load()
		if s&batchSealed != 0 || s&batchCountMask >= MaxBatchMessages {
			return closed
		}
		if s&batchAppending == 0 {
			if of.bstate.CompareAndSwap(s, s|batchAppending) {
				break
			}
			continue
		}
		if !wait {
			return busy
		}
		spinWait(i)
	}
	mark := len(of.buf)
	of.buf = appendMessage(of.buf, m)
	if len(of.buf)-HeaderSize > limit {
		of.buf = of.buf[:mark] // full: m opens the next batch
		of.bstate.Store(s | batchSealed)
		return closed
	}
	of.bstate.Store(s + 1)
	return appended
}

// appendOpen appends m to the open batch if there is one with room for
// it; c.bmu is held.
func (c *Conn) appendOpen(m *Message, limit int) bool {
	of := c.open.Load()
	return of != nil && c.appendTo(of, m, limit, true) == appended
}

// spinWait is the i-th wait for a state word that a running goroutine
// changes within a message's encoding: it spins, then yields the
// processor (the goroutine it waits for may have been preempted).
func spinWait(i int) {
	if i >= 64 {
		runtime.Gosched()
	}
}

// acquireBatch takes a batch from the free list, waiting while
// maxQueuedBatches are queued or being written; its buf is empty.
func (c *Conn) acquireBatch(ctx context.Context) (*outFrame, error) {
	var of *outFrame
	select {
	case of = <-c.freeBatches:
	default:
		select {
		case of = <-c.freeBatches:
		case <-c.done:
			return nil, c.closedErr()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if of == nil { // a place not used yet
		of = &outFrame{isBatch: true, buf: make([]byte, 0, batchBufferSize)}
		of.bstate.Store(batchSealed)
	}
	return of, nil
}

// releaseBatch puts of, sealed, back on the free list. A buffer that grew
// past 64 KiB (one large message) is dropped for a new one.
func (c *Conn) releaseBatch(of *outFrame) {
	if cap(of.buf) > 64<<10 {
		of.buf = make([]byte, 0, batchBufferSize)
	}
	of.buf = of.buf[:0]
	c.freeBatches <- of // never blocks: one place per batch taken
}

// sealBatch closes of to further messages and writes its header; the
// writer calls it when it takes of. It waits, without parking, for a
// sender's append in progress to end.
func (c *Conn) sealBatch(of *outFrame) {
	var s uint32
	for i := 0; ; i++ {
		s = of.bstate.Load()
		if s&batchAppending == 0 && (s&batchSealed != 0 || of.bstate.CompareAndSwap(s, s|batchSealed)) {
			break
		}
		spinWait(i)
	}
	putHeader(of.buf, FrameMessages, 0, 0, uint32(len(of.buf)-HeaderSize))
	appendArray32(of.buf[HeaderSize:HeaderSize], s&batchCountMask)
}
