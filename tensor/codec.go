package tensor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/vmihailenco/msgpack/v5"
)

// How a tensor field is carried in a message body.
const (
	wireInline     = 1 // the bytes follow
	wireDescriptor = 2 // a descriptor follows; fetched before delivery
	wireRef        = 3 // a descriptor follows; delivered as a lazy Ref
)

// ErrNoSession is returned when a descriptor is met while decoding outside a
// node (for example with plain msgpack.Unmarshal).
var ErrNoSession = errors.New("tensor: descriptor met outside a node session")

// EncodeSession is the sending node's side of message encoding.
type EncodeSession interface {
	// ExportTensor is called for each tensor in a message: for a *Tensor
	// field (asRef false) and for a Ref made by NewRef (asRef true). It
	// returns nil to send the bytes inline, or the descriptor to send
	// instead.
	ExportTensor(t *Tensor, asRef bool) (*Descriptor, error)
}

// DecodeSession is the receiving node's side of message decoding.
type DecodeSession interface {
	// InlineTensor makes a tensor from inline bytes (data is valid only
	// during the call).
	InlineTensor(dt DType, shape Shape, data []byte) (*Tensor, error)
	// ImportTensor returns the tensor a descriptor will be fetched into
	// before the message is delivered.
	ImportTensor(d *Descriptor) (*Tensor, error)
	// ImportRef returns a Ref bound to the node's fetcher.
	ImportRef(d *Descriptor) (Ref, error)
}

type encodeWriter struct {
	*bytes.Buffer
	s EncodeSession
}

type decodeReader struct {
	*bytes.Reader
	s DecodeSession
}

// Marshal encodes v with msgpack, routing its tensors through s.
func Marshal(v any, s EncodeSession) ([]byte, error) {
	w := &encodeWriter{Buffer: new(bytes.Buffer), s: s}
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(w)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return w.Bytes(), nil
}

// NewDecoder returns a msgpack decoder over b that routes tensors through s.
// The caller must have bounded every length in b (wire does).
func NewDecoder(b []byte, s DecodeSession) *msgpack.Decoder {
	return msgpack.NewDecoder(&decodeReader{Reader: bytes.NewReader(b), s: s})
}

// Sessions bound to encoders and decoders made elsewhere (wire.Registry's
// hooks), keyed by the encoder's or decoder's pointer.
var (
	boundEncoders sync.Map // *msgpack.Encoder → EncodeSession
	boundDecoders sync.Map // *msgpack.Decoder → DecodeSession
)

// BindEncoder routes the tensors encoded by enc through s until the returned
// function is called. Use it from a hook that receives the encoder.
func BindEncoder(enc *msgpack.Encoder, s EncodeSession) (unbind func()) {
	boundEncoders.Store(enc, s)
	return func() { boundEncoders.Delete(enc) }
}

// BindDecoder routes the tensors decoded by dec through s until the returned
// function is called.
func BindDecoder(dec *msgpack.Decoder, s DecodeSession) (unbind func()) {
	boundDecoders.Store(dec, s)
	return func() { boundDecoders.Delete(dec) }
}

func encodeSession(enc *msgpack.Encoder) EncodeSession {
	if w, ok := enc.Writer().(*encodeWriter); ok {
		return w.s
	}
	if s, ok := boundEncoders.Load(enc); ok {
		return s.(EncodeSession)
	}
	return nil
}

func decodeSession(dec *msgpack.Decoder) DecodeSession {
	if r, ok := dec.Buffered().(*decodeReader); ok {
		return r.s
	}
	if s, ok := boundDecoders.Load(dec); ok {
		return s.(DecodeSession)
	}
	return nil
}

var (
	_ msgpack.CustomEncoder = (*Tensor)(nil)
	_ msgpack.CustomDecoder = (*Tensor)(nil)
	_ msgpack.CustomEncoder = Ref{}
	_ msgpack.CustomDecoder = (*Ref)(nil)
)

// EncodeMsgpack implements msgpack.CustomEncoder. Within a node the session
// decides between inline bytes and a descriptor; elsewhere the bytes go
// inline.
func (t *Tensor) EncodeMsgpack(enc *msgpack.Encoder) error {
	if s := encodeSession(enc); s != nil {
		d, err := s.ExportTensor(t, false)
		if err != nil {
			return err
		}
		if d != nil {
			return encodeDescriptor(enc, wireDescriptor, d)
		}
	}
	if err := enc.EncodeArrayLen(4); err != nil {
		return err
	}
	if err := enc.EncodeUint8(wireInline); err != nil {
		return err
	}
	if err := enc.EncodeUint8(uint8(t.dtype)); err != nil {
		return err
	}
	if err := enc.Encode([]int64(t.shape)); err != nil {
		return err
	}
	if b := t.buf.Host(); b != nil || t.buf.Len() == 0 {
		return enc.EncodeBytes(b)
	}
	host, err := t.To(context.Background(), memory.CPU)
	if err != nil {
		return fmt.Errorf("tensor: inline copy of %v: %w", t, err)
	}
	defer host.Free()
	return enc.EncodeBytes(host.buf.Host())
}

func encodeDescriptor(enc *msgpack.Encoder, kind uint8, d *Descriptor) error {
	if err := enc.EncodeArrayLen(2); err != nil {
		return err
	}
	if err := enc.EncodeUint8(kind); err != nil {
		return err
	}
	return enc.Encode(d)
}

// DecodeMsgpack implements msgpack.CustomDecoder.
func (t *Tensor) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	kind, err := dec.DecodeUint8()
	if err != nil {
		return err
	}
	s := decodeSession(dec)
	switch {
	case kind == wireInline && n == 4:
		dt, err := dec.DecodeUint8()
		if err != nil {
			return err
		}
		var shape Shape
		if err := shape.DecodeMsgpack(dec); err != nil {
			return err
		}
		size, err := shape.ByteSize(DType(dt))
		if err != nil {
			return err
		}
		data, err := dec.DecodeBytes()
		if err != nil {
			return err
		}
		if int64(len(data)) != size {
			return fmt.Errorf("%w: inline %v of %v has %d bytes, want %d", ErrBadSize, shape, DType(dt), len(data), size)
		}
		var out *Tensor
		if s != nil {
			out, err = s.InlineTensor(DType(dt), shape, data)
		} else {
			out, err = FromBuffer(memory.WrapHost(data), DType(dt), shape)
		}
		if err != nil {
			return err
		}
		*t = Tensor{dtype: out.dtype, shape: out.shape, buf: out.buf, idle: out.idle}
		return nil
	case kind == wireDescriptor && n == 2:
		d, err := decodeDescriptor(dec)
		if err != nil {
			return err
		}
		if s == nil {
			return fmt.Errorf("%w: %v", ErrNoSession, d)
		}
		out, err := s.ImportTensor(d)
		if err != nil {
			return err
		}
		*t = Tensor{dtype: out.dtype, shape: out.shape, buf: out.buf, idle: out.idle}
		return nil
	}
	return fmt.Errorf("tensor: bad tensor encoding (kind %d, %d fields)", kind, n)
}

func decodeDescriptor(dec *msgpack.Decoder) (*Descriptor, error) {
	d := new(Descriptor)
	if err := dec.Decode(d); err != nil {
		return nil, err
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return d, nil
}

// EncodeMsgpack implements msgpack.CustomEncoder. A Ref always travels as a
// descriptor; a received Ref is forwarded with its original descriptor.
func (r Ref) EncodeMsgpack(enc *msgpack.Encoder) error {
	if r.st == nil {
		return enc.EncodeNil()
	}
	if r.st.local != nil {
		s := encodeSession(enc)
		if s == nil {
			return fmt.Errorf("%w: a local Ref can be sent only by a node", ErrNoSession)
		}
		d, err := s.ExportTensor(r.st.local, true)
		if err != nil {
			return err
		}
		if d == nil {
			return errors.New("tensor: session returned no descriptor for a Ref")
		}
		return encodeDescriptor(enc, wireRef, d)
	}
	r.st.mu.Lock()
	spent, d := r.st.spent, r.st.desc
	r.st.mu.Unlock()
	if spent {
		return fmt.Errorf("%w: cannot forward", ErrRefSpent)
	}
	return encodeDescriptor(enc, wireRef, d)
}

// DecodeMsgpack implements msgpack.CustomDecoder.
func (r *Ref) DecodeMsgpack(dec *msgpack.Decoder) error {
	code, err := dec.PeekCode()
	if err != nil {
		return err
	}
	if code == 0xc0 { // nil
		*r = Ref{}
		return dec.DecodeNil()
	}
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	kind, err := dec.DecodeUint8()
	if err != nil {
		return err
	}
	if kind != wireRef || n != 2 {
		return fmt.Errorf("tensor: bad Ref encoding (kind %d, %d fields)", kind, n)
	}
	d, err := decodeDescriptor(dec)
	if err != nil {
		return err
	}
	s := decodeSession(dec)
	if s == nil {
		*r = RefFromDescriptor(d, nil)
		return nil
	}
	*r, err = s.ImportRef(d)
	return err
}

var _ io.Reader = (*decodeReader)(nil)
