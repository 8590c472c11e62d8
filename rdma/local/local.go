package local

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
)

// ErrNotLocal is returned by Fetch for a descriptor owned by another node or
// another incarnation of this one.
var ErrNotLocal = errors.New("local: descriptor not owned by this process")

// hostChunk is how many bytes a host-to-host copy moves between checks for
// cancellation and Close.
const hostChunk = 16 << 20

var _ rdma.Channel = (*Channel)(nil)

// Channel is the same-process channel.
type Channel struct {
	env *rdma.Env

	mu       sync.RWMutex // held for reading by each Fetch, for writing by Close
	closed   bool
	inFlight atomic.Int64
}

// New returns the local channel of the node described by env, which must
// have a Store.
func New(env *rdma.Env) (*Channel, error) {
	if env == nil || env.Store == nil {
		return nil, errors.New("local: Env with a Store required")
	}
	return &Channel{env: env}, nil
}

// Name returns rdma.Local.
func (c *Channel) Name() string { return rdma.Local }

// Offer returns nil: Fetch recognises its own node's descriptors by owner
// and incarnation.
func (c *Channel) Offer(context.Context, *tensor.Export, string) ([]byte, error) { return nil, nil }

// InFlight returns the number of Fetch calls in progress.
func (c *Channel) InFlight() int { return int(c.inFlight.Load()) }

// Fetch copies the export named by d from this node's Store into the start
// of dst. It fails with rdma.ErrTooSmall when dst is smaller than d.Bytes,
// ErrNotLocal for another node's descriptor, the Store's errors
// (tensor.ErrUnknownExport, tensor.ErrBadLease, tensor.ErrStale) for an
// export that is not live, rdma.ErrClosed after Close, and ctx's error when
// it is cancelled (host copies check it every 16 MiB).
func (c *Channel) Fetch(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("local: fetch: %w", err)
	}
	if int64(dst.Len()) < d.Bytes {
		return fmt.Errorf("local: fetch %v into %d bytes: %w", d, dst.Len(), rdma.ErrTooSmall)
	}
	if d.Owner != c.env.Node {
		return fmt.Errorf("%w: %v (this is %s)", ErrNotLocal, d, c.env.Node)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("local: fetch %v: %w", d, err)
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return rdma.ErrClosed
	}
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	e, done, err := c.env.Store.Acquire(d.Incarnation, d.ExportID, d.Lease)
	if err != nil {
		return fmt.Errorf("local: fetch %v: %w", d, err)
	}
	defer done()
	src := e.Tensor.Buffer()
	if int64(src.Len()) != d.Bytes {
		return fmt.Errorf("local: fetch %v: export holds %d bytes: %w", d, src.Len(), tensor.ErrBadSize)
	}
	out, err := dst.Slice(0, src.Len())
	if err != nil {
		return fmt.Errorf("local: fetch %v: %w", d, err)
	}
	if s, o := src.Host(), out.Host(); s != nil && o != nil {
		for off := 0; off < len(s); off += hostChunk {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("local: fetch %v: %w", d, err)
			}
			end := min(off+hostChunk, len(s))
			copy(o[off:end], s[off:end])
		}
		return nil
	}
	if err := memory.Copy(ctx, out, src); err != nil {
		return fmt.Errorf("local: fetch %v: %w", d, err)
	}
	return nil
}

// PeerDown does nothing: the local channel holds nothing for other nodes.
func (c *Channel) PeerDown(string) {}

// Close waits for the fetches in progress and makes later ones fail with
// rdma.ErrClosed.
func (c *Channel) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}
