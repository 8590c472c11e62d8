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
//
// Before hashing, a field's string is compared with that field's previous
// one (last): the messages of a burst mostly repeat their target, sender
// node and type, and comparing costs a few nanoseconds where hashing byte
// by byte costs tens.
type stringCache struct {
	slots [stringCacheSlots]string
	last  [stringFields]string
}

// The fields whose previous string stringCache.field remembers.
const (
	fieldTarget = iota
	fieldSenderNode
	fieldType
	stringFields
)

const (
	stringCacheSlots  = 256 // a power of two
	stringCacheMaxLen = 128
)

// field interns b, the string of message field f (fieldTarget…).
func (c *stringCache) field(f int, b []byte) string {
	if c == nil || len(b) > stringCacheMaxLen {
		return string(b)
	}
	if last := c.last[f]; last == string(b) { // no allocation
		return last
	}
	s := c.get(b)
	c.last[f] = s
	return s
}

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

// parseMessage decodes a FrameMessage payload; the body is copied, unless
// the Framer reuses its frame (reuseMsg): the frame and the body then
// alias the Framer's, as a batch's do.
func (fr *Framer) parseMessage(h FrameHeader, p []byte) (Frame, error) {
	var f *MessageFrame
	if fr.reuseMsg {
		if fr.msg == nil {
			fr.msg = new(MessageFrame)
		}
		f = fr.msg
		f.FrameHeader = h
	} else {
		f = &MessageFrame{FrameHeader: h}
	}
	rest, err := readMessage(p, &f.Message, &fr.strs, !fr.reuseMsg)
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

// appendMessagesPayload appends the FrameMessages payload carrying msgs to
// dst (what Conn.SendMessage builds incrementally).
func appendMessagesPayload(dst []byte, msgs []Message) []byte {
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
	fr.wbuf = appendMessagesPayload(fr.wbuf, msgs)
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
// with DirectWrite writes it on the caller's goroutine as a FrameMessage,
// unless m is part of a one-way burst; otherwise it joins
// the FrameMessages batch still waiting in the queue, or opens a new one,
// so that messages sent while the writer is busy leave together. m is
// encoded before SendMessage returns (its Body may be reused). It blocks,
// like Send, only while the queue is full.
//
// Senders append under c.bmu, which the writer takes once per batch to
// close it (sealBatch).
func (c *Conn) SendMessage(ctx context.Context, m *Message) error {
	if c.directWriteAllowed() { // checked before encoding: in a burst, m goes to a batch
		of := outFramePool.Get().(*outFrame)
		of.buf = appendMessage(append(of.buf[:0], make([]byte, HeaderSize)...), m)
		n := len(of.buf) - HeaderSize
		if n > int(c.max) {
			outFramePool.Put(of)
			return fmt.Errorf("%w: %s payload of %d bytes exceeds %d", ErrFrameTooLarge, FrameMessage, n, c.max)
		}
		putHeader(of.buf, FrameMessage, 0, 0, uint32(n))
		if done, err := c.writeDirect(of); done {
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
	of, err := c.acquireBatch(ctx)
	if err != nil {
		return err
	}
	if err := c.acquireSlot(ctx); err != nil {
		c.freeBatches <- of
		return err
	}
	c.bmu.Lock()
	if c.appendOpen(m, limit) {
		// Another sender opened a batch while this one waited.
		c.bmu.Unlock()
		<-c.slots
		c.freeBatches <- of
		return nil
	}
	if of.buf == nil || cap(of.buf) > 64<<10 { // new, or grown by one large message
		of.buf = make([]byte, 0, batchBufferSize)
	}
	of.ids, of.count = batchIDs{}, 1
	of.buf = of.ids.appendMessage(append(of.buf[:0], make([]byte, HeaderSize+batchPrefix)...), m)
	if n := len(of.buf) - HeaderSize; n > int(c.max) {
		of.buf = nil // the next batch gets a buffer of the usual size
		c.bmu.Unlock()
		<-c.slots
		c.freeBatches <- of
		return fmt.Errorf("%w: %s payload of %d bytes exceeds %d", ErrFrameTooLarge, FrameMessages, n, c.max)
	}
	c.push(of)
	c.open = of
	c.bmu.Unlock()
	return nil
}

// appendOpen appends m to c.open, the batch messages may join, if there
// is one with room for m; c.bmu is held. A batch without room for m is
// closed: m opens the next one.
func (c *Conn) appendOpen(m *Message, limit int) bool {
	of := c.open
	if of == nil {
		return false
	}
	if of.count < MaxBatchMessages {
		n := len(of.buf)
		b := of.ids.appendMessage(of.buf, m)
		if len(b)-HeaderSize <= limit {
			of.buf, of.count = b, of.count+1
			return true
		}
		of.buf = b[:n]
	}
	c.open = nil
	return false
}

// acquireBatch takes a batch from the free list, waiting while
// maxQueuedBatches are queued or being written. Its buf is set by the
// caller, under c.bmu.
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
		of = &outFrame{isBatch: true}
	}
	return of, nil
}

// sealBatch closes of to further messages and returns its bytes with the
// frame and array headers written; the writer calls it when it takes of.
func (c *Conn) sealBatch(of *outFrame) []byte {
	c.bmu.Lock()
	if c.open == of {
		c.open = nil
	}
	buf, count := of.buf, of.count
	c.bmu.Unlock()
	putHeader(buf, FrameMessages, 0, 0, uint32(len(buf)-HeaderSize))
	appendArray32(buf[HeaderSize:HeaderSize], uint32(count))
	return buf
}

// batchIDs remembers where a batch's buffer holds the encoding of the
// identifying fields (appendMessageIDs) of its last message, so that the
// next message to the same target from the same sender copies those bytes
// instead of encoding them again. The encoding is the same. It is used
// under Conn.bmu while the batch is open (a failed append closes it).
type batchIDs struct {
	target, senderNode, senderID, typ string
	ser                               uint8
	at, n                             int // the bytes in the buffer; n == 0: none
}

// appendMessage appends the encoding of m to dst, a batch's buffer, and
// remembers where its identifying fields are.
func (ids *batchIDs) appendMessage(dst []byte, m *Message) []byte {
	dst = msgp.AppendMapHeader(dst, messageFields(m))
	if ids.n > 0 && m.Target == ids.target && m.SenderNode == ids.senderNode &&
		m.SenderID == ids.senderID && m.Type == ids.typ && m.Ser == ids.ser {
		at := len(dst)
		dst = append(dst, dst[ids.at:ids.at+ids.n]...)
		ids.at = at
	} else {
		at := len(dst)
		dst = appendMessageIDs(dst, m)
		*ids = batchIDs{target: m.Target, senderNode: m.SenderNode, senderID: m.SenderID, typ: m.Type, ser: m.Ser,
			at: at, n: len(dst) - at}
	}
	return appendMessageRest(dst, m)
}
