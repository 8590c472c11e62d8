package wire

import (
	"context"
	"encoding/binary"
	"fmt"

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
	c.bmu.Lock()
	if c.appendOpen(m, limit) {
		c.bmu.Unlock()
		return nil
	}
	c.bmu.Unlock()
	if err := c.acquireBatch(ctx); err != nil {
		return err
	}
	of := outFramePool.Get().(*outFrame)
	if cap(of.buf) < batchBufferSize {
		select {
		case of.buf = <-c.freeBatches:
		default:
			of.buf = make([]byte, 0, batchBufferSize)
		}
	}
	of.buf = appendMessage(append(of.buf[:0], make([]byte, HeaderSize+batchPrefix)...), m)
	if n := len(of.buf) - HeaderSize; n > int(c.max) {
		<-c.batchTokens
		outFramePool.Put(of)
		return fmt.Errorf("%w: %s payload of %d bytes exceeds %d", ErrFrameTooLarge, FrameMessages, n, c.max)
	}
	if err := c.acquireSlot(ctx); err != nil {
		<-c.batchTokens
		outFramePool.Put(of)
		return err
	}
	c.bmu.Lock()
	if c.appendOpen(m, limit) {
		// Another sender opened a batch while this one waited.
		c.bmu.Unlock()
		<-c.slots
		<-c.batchTokens
		outFramePool.Put(of)
		return nil
	}
	of.isBatch, of.batch = true, 1
	c.push(of)
	c.open = of
	c.bmu.Unlock()
	return nil
}

// acquireBatch takes a token for one more batch, waiting while
// maxQueuedBatches are queued or being written.
func (c *Conn) acquireBatch(ctx context.Context) error {
	select {
	case c.batchTokens <- struct{}{}:
		return nil
	default:
	}
	select {
	case c.batchTokens <- struct{}{}:
		return nil
	case <-c.done:
		return c.closedErr()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// appendOpen appends m to the open batch if there is one with room for it;
// c.bmu is held.
func (c *Conn) appendOpen(m *Message, limit int) bool {
	of := c.open
	if of == nil || of.batch >= MaxBatchMessages {
		return false
	}
	mark := len(of.buf)
	of.buf = appendMessage(of.buf, m)
	if len(of.buf)-HeaderSize > limit {
		of.buf = of.buf[:mark] // full: m opens the next batch
		return false
	}
	of.batch++
	return true
}

// sealBatch closes of to further messages if it is the open batch and
// writes its header; the writer calls it when it takes of.
func (c *Conn) sealBatch(of *outFrame) {
	c.bmu.Lock()
	if c.open == of {
		c.open = nil
	}
	count := of.batch
	c.bmu.Unlock()
	putHeader(of.buf, FrameMessages, 0, 0, uint32(len(of.buf)-HeaderSize))
	appendArray32(of.buf[HeaderSize:HeaderSize], uint32(count))
	of.isBatch, of.batch = false, 0
}
