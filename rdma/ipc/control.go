package ipc

import (
	"errors"
	"fmt"

	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// Control operations, sent by the fetcher's channel to the owner's through
// rdma.Env.Control.
const (
	// opChallenge asks for a same-host challenge: the owner writes a random
	// token into a fresh file of its shared memory directory and answers
	// with the file's path.
	opChallenge uint8 = 1
	// opProve answers a challenge with HMAC-SHA256(token, fetcher's node
	// name); only a process that can read the owner's /dev/shm can.
	opProve uint8 = 2
	// opBegin acquires an export for one copy: the owner checks the lease,
	// the holder and that the offer matches the export, keeps the tensor
	// lent until opEnd, and gives the IPC handle when asked (to proven
	// peers only).
	opBegin uint8 = 3
	// opEnd ends the acquisition opBegin made.
	opEnd uint8 = 4
	// opRevoke goes the other way, from owner to fetcher: the owner freed
	// the allocations listed (of its incarnation Incarnation) that it had
	// given the fetcher the handle of, and the fetcher closes its mappings
	// of them. Owners also list them in their next begin reply.
	opRevoke uint8 = 5
)

// codeUnproven is the reply code of ErrUnproven.
const codeUnproven = wire.CodeAuth

// codes maps the owner's errors to reply codes and back to the same
// sentinels on the fetcher: rdma's shared entries, then ipc's own
// (ErrUnproven as wire.CodeAuth, errBusy as wire.CodeUnavailable).
var codes = rdma.ControlErrors(errBadMessage,
	wire.CodeError{Code: codeUnproven, Sent: ErrUnproven},
	wire.CodeError{Code: wire.CodeUnavailable, Sent: errBusy})

// Limits on control messages.
const (
	maxControlBytes = 4096
	maxRevoked      = 64 // allocation ids revoked per reply
	macLen          = 32 // HMAC-SHA256
	processIDLen    = 16
	maxPathLen      = 512
)

// request is a control message from fetcher to owner.
type request struct {
	Op          uint8  `msgpack:"o"`
	Incarnation uint64 `msgpack:"i,omitempty"`
	ExportID    uint64 `msgpack:"x,omitempty"`
	Lease       uint64 `msgpack:"l,omitempty"`
	Acq         uint64 `msgpack:"q,omitempty"` // acquisition id, chosen by the fetcher
	Alloc       uint64 `msgpack:"a,omitempty"`
	Offset      uint64 `msgpack:"f,omitempty"`
	Bytes       uint64 `msgpack:"b,omitempty"`
	WantHandle  bool   `msgpack:"w,omitempty"`
	Challenge   uint64 `msgpack:"c,omitempty"`
	MAC         []byte `msgpack:"m,omitempty"`
	// Revoked lists the freed allocations of an opRevoke.
	Revoked []uint64 `msgpack:"r,omitempty"`
}

// reply is the owner's answer.
type reply struct {
	Code wire.ErrCode `msgpack:"c"`
	Msg  string       `msgpack:"m,omitempty"`
	// Handle is the cuIpcMemHandle of the whole driver allocation, of
	// MapSize bytes; the offer's Allocation.Base lies Shift bytes into it.
	Handle  []byte `msgpack:"h,omitempty"`
	MapSize uint64 `msgpack:"n,omitempty"`
	Shift   uint64 `msgpack:"s,omitempty"`
	// Base, Device and Process let a fetcher in the owner's own process
	// (which cannot open its own IPC handles) address the allocation
	// directly: Process is the owner process's random id.
	Base    uint64 `msgpack:"b,omitempty"`
	Device  int    `msgpack:"d,omitempty"`
	Process []byte `msgpack:"p,omitempty"`
	// Revoked lists allocations freed by the owner since the last reply:
	// the fetcher closes its mappings of them.
	Revoked []uint64 `msgpack:"r,omitempty"`
	// Challenge and Path answer opChallenge.
	Challenge uint64 `msgpack:"k,omitempty"`
	Path      string `msgpack:"f,omitempty"`
}

// errBadMessage is wrapped by the errors of malformed offers and control
// messages.
var errBadMessage = errors.New("ipc: bad control message")

func encode(v any) ([]byte, error) { return msgpack.Marshal(v) }

// decodeRequest parses a fetcher's control message.
func decodeRequest(b []byte) (*request, error) {
	var r request
	if err := rdma.DecodeControl(b, maxControlBytes, &r, errBadMessage, "request"); err != nil {
		return nil, err
	}
	switch r.Op {
	case opChallenge, opBegin, opEnd:
	case opRevoke:
		if len(r.Revoked) == 0 || len(r.Revoked) > maxRevoked {
			return nil, fmt.Errorf("%w: revoke of %d allocations", errBadMessage, len(r.Revoked))
		}
	case opProve:
		if len(r.MAC) != macLen {
			return nil, fmt.Errorf("%w: MAC of %d bytes", errBadMessage, len(r.MAC))
		}
	default:
		return nil, fmt.Errorf("%w: unknown op %d", errBadMessage, r.Op)
	}
	if r.Op == opBegin && (r.Offset > maxAllocSize || r.Bytes > maxAllocSize) {
		return nil, fmt.Errorf("%w: range [%d, +%d)", errBadMessage, r.Offset, r.Bytes)
	}
	return &r, nil
}

// decodeReply parses an owner's answer.
func decodeReply(b []byte) (*reply, error) {
	var r reply
	if err := rdma.DecodeControl(b, maxControlBytes, &r, errBadMessage, "reply"); err != nil {
		return nil, err
	}
	switch {
	case len(r.Handle) != 0 && len(r.Handle) != 64:
		return nil, fmt.Errorf("%w: IPC handle of %d bytes", errBadMessage, len(r.Handle))
	case len(r.Process) != 0 && len(r.Process) != processIDLen:
		return nil, fmt.Errorf("%w: process id of %d bytes", errBadMessage, len(r.Process))
	case r.MapSize > maxAllocSize || r.Shift > r.MapSize:
		return nil, fmt.Errorf("%w: mapping of %d bytes at shift %d", errBadMessage, r.MapSize, r.Shift)
	case len(r.Handle) != 0 && r.MapSize == 0:
		return nil, fmt.Errorf("%w: IPC handle without a size", errBadMessage)
	case r.Device < 0 || r.Device > 1<<16:
		return nil, fmt.Errorf("%w: device %d", errBadMessage, r.Device)
	case len(r.Revoked) > maxRevoked:
		return nil, fmt.Errorf("%w: %d revoked allocations", errBadMessage, len(r.Revoked))
	case len(r.Path) > maxPathLen:
		return nil, fmt.Errorf("%w: challenge path of %d bytes", errBadMessage, len(r.Path))
	}
	return &r, nil
}

// errorReply is the reply carrying err.
func errorReply(err error) *reply { return &reply{Code: codes.Code(err), Msg: err.Error()} }

// err rebuilds the owner's error on the fetcher, wrapping the same sentinel.
func (r *reply) err(owner string) error { return rdma.ReplyError(codes, "ipc", owner, r.Code, r.Msg) }
