package rdma

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

// Names of the built-in channels (see package builtin), in order of
// preference.
const (
	Local   = "local"
	IPC     = "ipc"
	Verbs   = "verbs"
	Staging = "staging"
)

// Errors shared by channels.
var (
	// ErrNotViable is wrapped by the error a channel constructor returns when
	// the channel cannot run on this machine (no driver, no device); the
	// node then runs without it and reports the reason.
	ErrNotViable = errors.New("rdma: channel not viable here")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("rdma: channel closed")
	// ErrPeerDown fails transfers whose other end went away.
	ErrPeerDown = errors.New("rdma: peer down")
	// ErrTooSmall is returned when the destination is smaller than the source.
	ErrTooSmall = errors.New("rdma: destination smaller than source")
	// ErrNoOffer is returned when a descriptor carries no offer for the
	// channel asked to fetch it.
	ErrNoOffer = errors.New("rdma: descriptor has no offer for this channel")
)

// Channel moves the bytes of exported tensors from the node that owns them
// (the owner) to a node that received their descriptor (the fetcher). Every
// transfer is a pull: the fetcher allocates the destination and asks.
//
// A Channel is safe for concurrent use.
type Channel interface {
	// Name returns the name its Backend is registered under.
	Name() string
	// Offer runs on the owner while a descriptor of e is being encoded for
	// peer. It returns the bytes to place in Descriptor.Offers[Name()], or
	// nil when the channel offers nothing for that peer. Offers must not
	// grant anything to other peers (an RDMA key, an IPC handle).
	Offer(ctx context.Context, e *tensor.Export, peer string) ([]byte, error)
	// Fetch runs on the fetcher: it copies the d.Bytes bytes of the export
	// into the start of dst. dst smaller than d.Bytes gives ErrTooSmall. It
	// does not release the lease: the caller does, after Fetch returns.
	Fetch(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer) error
	// PeerDown drops everything held for the named node: connections,
	// mappings, registrations; its transfers in flight fail.
	PeerDown(node string)
	// Close releases every resource; transfers in flight fail with ErrClosed.
	Close() error
}

// DirectFetcher is implemented by channels that can fetch some
// descriptors without waiting for anything from another node: no control
// round trip, no data connection, only local work (a device copy from an
// allocation the channel has already mapped, as ipc's direct offers
// allow). A node may then fetch on the goroutine that reads the owner's
// connection, which must never wait for a frame that only that goroutine
// would read.
type DirectFetcher interface {
	// FetchDirect fetches as Fetch does, and reports done, when it can do
	// so without waiting for another node. Otherwise it reports done=false
	// having done nothing (no lease used, nothing copied):
	// the caller then fetches with Fetch, on a goroutine that may wait.
	FetchDirect(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer) (done bool, err error)
}

// Progress lets a fetch follow a source that is still being written, and
// tell how far its own copy got. Both fields may be nil.
type Progress struct {
	// Ready returns once the source holds at least its first n bytes,
	// with how many it holds (n or more), or the error that ended the
	// source's own fetch. nil: the source is whole.
	Ready func(ctx context.Context, n int64) (int64, error)
	// Landed is told, with n growing, each time the first n bytes of the
	// destination hold their copy.
	Landed func(n int64)
}

// Await returns how many bytes the source holds once it holds at least
// its first n: Ready's answer, checked to be n or more; with no Ready (the
// source is whole) math.MaxInt64.
func (p Progress) Await(ctx context.Context, n int64) (int64, error) {
	if p.Ready == nil {
		return math.MaxInt64, nil
	}
	got, err := p.Ready(ctx, n)
	if err == nil && got < n {
		err = fmt.Errorf("rdma: the source holds %d bytes, asked for %d", got, n)
	}
	return got, err
}

// StreamFetcher is implemented by channels that copy in pieces and can
// pipeline behind a source that is still being written (fan-out by relay:
// a receiver copies what its holder already has while the rest crosses
// the link to the holder).
type StreamFetcher interface {
	// FetchStream fetches as Fetch does, copying no byte before p.Ready
	// says the source holds it, and telling p.Landed as the destination
	// fills.
	FetchStream(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer, p Progress) error
}

// Putter is implemented by channels that can also move bytes the other
// way: into an export its owner lent to this node so that this node
// writes it (fan-out by relay, pushed: a holder writes the copies of the
// receivers that share its GPU from its own context, instead of each
// receiver copying from the holder in its own, which makes the GPU switch
// between contexts at every piece).
type Putter interface {
	// PutStream writes src's first d.Bytes bytes into the export d
	// describes (lent to this node, its holder), queuing no piece before
	// p.Ready says src holds it, and telling p.Landed as the export
	// fills (either may be nil). src smaller than d.Bytes gives
	// ErrTooSmall. It does not release the lease: the caller does, after
	// PutStream returns. The owner checks the lease as for Fetch.
	PutStream(ctx context.Context, d *tensor.Descriptor, src memory.Buffer, p Progress) error
}

// ConnServer is implemented by channels that receive data connections (the
// staging channel). The node accepts and authenticates the connection, then
// hands it over; the channel owns it from then on.
type ConnServer interface {
	ServeConn(conn net.Conn, peer string)
}

// ControlHandler is implemented by channels that exchange set-up messages
// over the control plane (RDMA queue pair numbers, IPC host proofs).
type ControlHandler interface {
	// HandleControl answers a request sent by peer's channel of the same
	// name through Env.Control.
	HandleControl(ctx context.Context, peer string, req []byte) ([]byte, error)
}

// Env is what a node gives its channels.
type Env struct {
	Node        string
	Incarnation uint64
	// Store is the node's table of exports; channels serve only its ids.
	Store *tensor.Store
	Log   *zap.Logger
	// Dial opens an authenticated data connection to node's data listener,
	// to be served by that node's channel of the same name (ConnServer).
	Dial func(ctx context.Context, node, channel string) (net.Conn, error)
	// Control sends req to node's channel of the given name (its
	// ControlHandler) over the authenticated control connection.
	Control func(ctx context.Context, node, channel string, req []byte) ([]byte, error)
	// Staging, IPC and Verbs are the node's config sections of the
	// channels of those names; a zero field takes its default (see
	// package config).
	Staging config.StagingConfig
	IPC     config.IPCConfig
	Verbs   config.VerbsConfig
	// Served, if not nil, is called by channels in which the owner takes
	// part in a transfer (staging) with the bytes of each request it
	// served from Store; it must be quick.
	Served func(channel string, bytes int64)
}

// Logger returns Log or a no-op logger.
func (e *Env) Logger() *zap.Logger {
	if e == nil || e.Log == nil {
		return zap.NewNop()
	}
	return e.Log
}

// CacheHolder is implemented by channels that keep registrations in
// memory.RegCaches (verbs); a node reports their counters (metrics).
type CacheHolder interface {
	RegCaches() []*memory.RegCache
}
