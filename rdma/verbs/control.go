package verbs

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// Control operations, sent by the fetcher's channel to the owner's through
// rdma.Env.Control.
const (
	// opConnect carries the fetcher's queue pair endpoint; the owner answers
	// with the endpoint of the queue pair it created for the fetcher.
	opConnect uint8 = 1
	// opBegin asks to read an export: the owner checks the lease, keeps the
	// export lent and answers with its address, length and rkey.
	opBegin uint8 = 2
	// opEnd ends the acquisition opBegin made.
	opEnd uint8 = 3
)

// codes maps the owner's errors to reply codes and back to the same
// sentinels on the fetcher (rdma's shared entries; any other error is
// wire.CodeInternal).
var codes = rdma.ControlErrors(errBadMessage)

// maxControlBytes bounds a control message or reply.
const maxControlBytes = 1024

// endpointMsg is an ibverbs.Endpoint on the wire.
type endpointMsg struct {
	QPN uint32 `msgpack:"q"`
	PSN uint32 `msgpack:"p"`
	LID uint16 `msgpack:"l"`
	GID []byte `msgpack:"g"` // 16 bytes, or empty without a GRH
	MTU uint8  `msgpack:"m"`
}

func endpointToMsg(e ibverbs.Endpoint) endpointMsg {
	m := endpointMsg{QPN: e.QPN, PSN: e.PSN, LID: e.LID, MTU: uint8(e.MTU)}
	if e.HasGID {
		m.GID = append([]byte(nil), e.GID[:]...)
	}
	return m
}

func (m endpointMsg) endpoint() (ibverbs.Endpoint, error) {
	e := ibverbs.Endpoint{QPN: m.QPN & 0xffffff, PSN: m.PSN & 0xffffff, LID: m.LID, MTU: ibverbs.MTU(m.MTU)}
	switch len(m.GID) {
	case 0:
	case 16:
		copy(e.GID[:], m.GID)
		e.HasGID = true
	default:
		return e, fmt.Errorf("%w: GID of %d bytes", errBadMessage, len(m.GID))
	}
	if e.MTU.Bytes() == 0 {
		return e, fmt.Errorf("%w: MTU code %d", errBadMessage, m.MTU)
	}
	if e.QPN == 0 {
		return e, fmt.Errorf("%w: queue pair number 0", errBadMessage)
	}
	return e, nil
}

// request is a control message from fetcher to owner.
type request struct {
	Op          uint8       `msgpack:"o"`
	Endpoint    endpointMsg `msgpack:"e,omitempty"`
	Incarnation uint64      `msgpack:"i,omitempty"`
	ExportID    uint64      `msgpack:"x,omitempty"`
	Lease       uint64      `msgpack:"l,omitempty"`
	Token       uint64      `msgpack:"t,omitempty"`
	// Rail is the fetcher's rail (device index) the message is for: the
	// owner serves it with its own device of that index.
	Rail uint8 `msgpack:"r,omitempty"`
}

// reply is the owner's answer.
type reply struct {
	Code     wire.ErrCode `msgpack:"c"`
	Msg      string       `msgpack:"m,omitempty"`
	Endpoint endpointMsg  `msgpack:"e,omitempty"`
	Token    uint64       `msgpack:"t,omitempty"`
	Addr     uint64       `msgpack:"a,omitempty"`
	RKey     uint32       `msgpack:"k,omitempty"`
	Len      int64        `msgpack:"n,omitempty"`
}

var errBadMessage = errors.New("verbs: bad control message")

func encode(v any) ([]byte, error) { return msgpack.Marshal(v) }

// decodeRequest parses a fetcher's control message.
func decodeRequest(b []byte) (*request, error) {
	var r request
	if err := rdma.DecodeControl(b, maxControlBytes, &r, errBadMessage, "request"); err != nil {
		return nil, err
	}
	switch r.Op {
	case opConnect:
		if _, err := r.Endpoint.endpoint(); err != nil {
			return nil, err
		}
	case opBegin, opEnd:
	default:
		return nil, fmt.Errorf("%w: unknown op %d", errBadMessage, r.Op)
	}
	return &r, nil
}

// decodeReply parses an owner's answer.
func decodeReply(b []byte) (*reply, error) {
	var r reply
	if err := rdma.DecodeControl(b, maxControlBytes, &r, errBadMessage, "reply"); err != nil {
		return nil, err
	}
	if r.Len < 0 {
		return nil, fmt.Errorf("%w: reply length %d", errBadMessage, r.Len)
	}
	return &r, nil
}

// err rebuilds the owner's error on the fetcher, wrapping the same sentinel.
func (r *reply) err(owner string) error {
	return rdma.ReplyError(codes, "verbs", owner, r.Code, r.Msg)
}

// offerLen is the size of an encoded offer: version, address, length, rkey.
const offerLen = 1 + 8 + 8 + 4

const offerVersion = 1

// offer is what Offer puts in a descriptor for the verbs channel: where the
// export lies in the owner's address space and the rkey that reads it.
type offer struct {
	Addr uint64
	Len  int64
	RKey uint32
}

func (o offer) encode() []byte {
	b := make([]byte, offerLen)
	b[0] = offerVersion
	binary.LittleEndian.PutUint64(b[1:], o.Addr)
	binary.LittleEndian.PutUint64(b[9:], uint64(o.Len))
	binary.LittleEndian.PutUint32(b[17:], o.RKey)
	return b
}

// decodeOffer parses an offer from a descriptor.
func decodeOffer(b []byte) (offer, error) {
	if len(b) != offerLen || b[0] != offerVersion {
		return offer{}, fmt.Errorf("%w: offer of %d bytes", errBadMessage, len(b))
	}
	o := offer{
		Addr: binary.LittleEndian.Uint64(b[1:]),
		Len:  int64(binary.LittleEndian.Uint64(b[9:])),
		RKey: binary.LittleEndian.Uint32(b[17:]),
	}
	if o.Len < 0 {
		return offer{}, fmt.Errorf("%w: offer length %d", errBadMessage, o.Len)
	}
	return o, nil
}
