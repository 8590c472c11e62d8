package wire

import "fmt"

// Frame bodies. All are msgpack maps with short keys; zero fields are
// omitted and unknown keys are ignored, so fields can be added later.

// Hello opens the handshake (initiator → acceptor).
type Hello struct {
	Version uint16 `msgpack:"v,omitempty"`
	Cluster string `msgpack:"c,omitempty"`
	Nonce   []byte `msgpack:"n,omitempty"` // NonceSize random bytes
	Purpose string `msgpack:"p,omitempty"` // PurposeControl or PurposeData
	// SharedMemory: the initiator offers to move the connection to shared
	// memory after the handshake (package shm), if both ends are on one host.
	SharedMemory bool `msgpack:"s,omitempty"`
}

// Challenge answers Hello (acceptor → initiator). It reveals nothing but the
// acceptor's protocol version and a fresh nonce.
type Challenge struct {
	Version uint16 `msgpack:"v,omitempty"`
	Nonce   []byte `msgpack:"n,omitempty"`
}

// Auth proves the initiator knows the secret (initiator → acceptor).
type Auth struct {
	Node        string `msgpack:"n,omitempty"`
	Incarnation uint64 `msgpack:"i,omitempty"`
	MAC         []byte `msgpack:"m,omitempty"`
}

// Welcome proves the acceptor knows the secret and ends the handshake
// (acceptor → initiator).
type Welcome struct {
	Node        string `msgpack:"n,omitempty"`
	Incarnation uint64 `msgpack:"i,omitempty"`
	MAC         []byte `msgpack:"m,omitempty"`
	// SharedMemory: the acceptor takes up the initiator's offer; both ends
	// then run shm.Upgrade before anything else.
	SharedMemory bool `msgpack:"s,omitempty"`
}

// Caps carries a node's capabilities. Body is opaque msgpack defined by the
// layer above (decode it with DecodeMsgpack).
type Caps struct {
	Body []byte `msgpack:"b,omitempty"`
}

// Message carries one user message to an actor.
type Message struct {
	Target     string            `msgpack:"t,omitempty"`  // actor id on the receiving node
	SenderNode string            `msgpack:"sn,omitempty"` // node of the sender
	SenderID   string            `msgpack:"si,omitempty"` // sender actor id; empty if none
	Type       string            `msgpack:"ty,omitempty"` // registered type name (see Registry)
	Ser        uint8             `msgpack:"s,omitempty"`  // serializer id
	Body       []byte            `msgpack:"b,omitempty"`  // serialized message
	Header     map[string]string `msgpack:"h,omitempty"`
	// Request is the key of the request a reply answers, in place of
	// Target (the layer above maps keys to its reply addresses); 0 if
	// none.
	Request uint64 `msgpack:"r,omitempty"`
	// Tensors is the message's tensor table, beside the body: the
	// transfer engine's encoding of the tensors the body's tensor fields
	// refer to (inline bytes, or descriptors to fetch). Opaque to wire.
	Tensors []byte `msgpack:"x,omitempty"`
}

// SystemKind is the kind of a System frame.
type SystemKind uint8

// System kinds.
const (
	SystemWatch      SystemKind = 1
	SystemUnwatch    SystemKind = 2
	SystemTerminated SystemKind = 3
	SystemStop       SystemKind = 4
	SystemPoison     SystemKind = 5
	SystemDeadLetter SystemKind = 6
)

var systemKindNames = [...]string{
	SystemWatch:      "Watch",
	SystemUnwatch:    "Unwatch",
	SystemTerminated: "Terminated",
	SystemStop:       "Stop",
	SystemPoison:     "Poison",
	SystemDeadLetter: "DeadLetter",
}

// String returns the kind's name.
func (k SystemKind) String() string {
	if int(k) < len(systemKindNames) && systemKindNames[k] != "" {
		return systemKindNames[k]
	}
	return fmt.Sprintf("SystemKind(%d)", uint8(k))
}

// System carries an actor system message (watch, termination, stop...)
// for the actor Target of the receiving node.
type System struct {
	Kind   SystemKind `msgpack:"k,omitempty"`
	Target string     `msgpack:"t,omitempty"`
	// AboutNode and AboutID name the other actor the message is about:
	// the watcher (Watch, Unwatch), the actor that terminated
	// (Terminated), the actor a message did not reach (DeadLetter).
	AboutNode string `msgpack:"wn,omitempty"`
	AboutID   string `msgpack:"wi,omitempty"`
	// Why is a Terminated's protoactor TerminatedReason, a DeadLetter's
	// DeadLetterNoActor or DeadLetterFailed.
	Why    int32  `msgpack:"w,omitempty"`
	Detail string `msgpack:"d,omitempty"`
}

// Why of a SystemDeadLetter.
const (
	// DeadLetterNoActor: the actor does not exist (protoactor's
	// DeadLetterResponse).
	DeadLetterNoActor int32 = 0
	// DeadLetterFailed: the message could not be delivered to it (bad
	// body, tensors refused or not fetched, a refused lifecycle message).
	DeadLetterFailed int32 = 1
)

// Ping is a liveness probe; the peer answers with a Pong echoing it.
type Ping struct {
	Seq      uint64 `msgpack:"s,omitempty"`
	UnixNano int64  `msgpack:"t,omitempty"`
}

// Pong answers a Ping.
type Pong struct {
	Seq      uint64 `msgpack:"s,omitempty"`
	UnixNano int64  `msgpack:"t,omitempty"`
}

// GoAway announces that the sender closes the connection.
type GoAway struct {
	Code   ErrCode `msgpack:"c,omitempty"`
	Reason string  `msgpack:"r,omitempty"`
}

// Error fails one request or transfer, identified by Stream.
type Error struct {
	Code   ErrCode `msgpack:"c,omitempty"`
	Stream uint32  `msgpack:"s,omitempty"`
	Msg    string  `msgpack:"m,omitempty"`
}

// Release returns a lease on an exported tensor to its owner.
type Release struct {
	ExportID    uint64 `msgpack:"e,omitempty"`
	Lease       uint64 `msgpack:"l,omitempty"`
	Incarnation uint64 `msgpack:"i,omitempty"`
}
