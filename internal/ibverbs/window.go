package ibverbs

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"time"
	"unsafe"
)

var (
	// ErrNoWindows is wrapped by ProbeWindows's error on a device without
	// type-2 memory windows.
	ErrNoWindows = errors.New("ibverbs: no type-2 memory windows")
	// ErrWindowBounds is wrapped by ProbeWindows's error when a device binds
	// type-2 windows but does not confine remote access to them (a read past
	// a window's bound, or through an invalidated window, succeeded).
	ErrWindowBounds = errors.New("ibverbs: memory window bounds not enforced")
)

// probeTimeout bounds each completion ProbeWindows waits for.
const probeTimeout = 5 * time.Second

// ProbeWindows checks, over loopback queue pairs on port of c, that type-2
// memory windows grant exactly what they bind: a read of a bound window's
// whole range returns its bytes; a read one byte past its end fails; a read
// through its rkey after IBV_WR_LOCAL_INV fails; and the region's own rkey
// (registered with AccessMWBind alone) reads nothing. It returns nil when
// all hold, an error wrapping ErrNoWindows when the device has no type-2
// windows, one wrapping ErrWindowBounds (saying which check failed) when
// the device lets a read through that it should have refused, and other
// errors when the verbs calls fail. It takes a few round trips; callers
// probe once per device.
func ProbeWindows(c *Context, port PortInfo) error {
	attr, err := c.QueryDevice()
	if err != nil {
		return err
	}
	if !attr.MemoryWindowType2() {
		return fmt.Errorf("%w: %s (device_cap_flags %#x)", ErrNoWindows, c.Name(), uint32(attr.CapFlags))
	}
	const page = 4096
	src := make([]byte, 3*page)
	for i := range src {
		src[i] = byte(i*7 + i>>8)
	}
	dst := make([]byte, 2*page)
	defer runtime.KeepAlive(src)
	defer runtime.KeepAlive(dst)
	base := uintptr(unsafe.Pointer(unsafe.SliceData(src)))

	pd, err := c.AllocPD()
	if err != nil {
		return err
	}
	var closers []func() error
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i]()
		}
		_ = pd.Close()
	}()
	mr, err := pd.RegMR(base, len(src), AccessMWBind)
	if err != nil {
		return err
	}
	closers = append(closers, mr.Close)
	dmr, err := pd.RegMR(uintptr(unsafe.Pointer(unsafe.SliceData(dst))), len(dst), AccessLocalWrite)
	if err != nil {
		return err
	}
	closers = append(closers, dmr.Close)

	// pair returns a connected reader and owner on a CQ of their own.
	pair := func() (reader, owner *QP, cq *CQ, err error) {
		if cq, err = c.CreateCQ(16); err != nil {
			return nil, nil, nil, err
		}
		closers = append(closers, cq.Close)
		if reader, err = pd.CreateRCQP(cq, QPCaps{MaxSendWR: 8}); err != nil {
			return nil, nil, nil, err
		}
		closers = append(closers, reader.Close)
		if owner, err = pd.CreateRCQP(cq, QPCaps{MaxSendWR: 8}); err != nil {
			return nil, nil, nil, err
		}
		closers = append(closers, owner.Close)
		re, oe := reader.LocalEndpoint(port, 0x111), owner.LocalEndpoint(port, 0x222)
		opts := ConnectOptions{Timeout: 12, RetryCount: 3}
		if err := reader.Connect(port, 0, oe, re.PSN, opts); err != nil {
			return nil, nil, nil, err
		}
		if err := owner.Connect(port, AccessRemoteRead, re, oe.PSN, opts); err != nil {
			return nil, nil, nil, err
		}
		return reader, owner, cq, nil
	}
	read := func(qp *QP, cq *CQ, wrid uint64, raddr uint64, n int, rkey uint32) error {
		err := qp.PostReads([]ReadRequest{{WRID: wrid, LocalAddr: uintptr(dmr.Addr()), LKey: dmr.LKey(), Length: uint32(n),
			RemoteAddr: raddr, RKey: rkey, Signaled: true}})
		if err != nil {
			return err
		}
		wc, err := waitWR(cq, wrid)
		if err != nil {
			return err
		}
		return wc.Err()
	}
	bind := func(owner *QP, cq *CQ, wrid uint64) (uint32, error) {
		mw, err := pd.AllocMW()
		if err != nil {
			return 0, err
		}
		closers = append(closers, mw.Close)
		rkey, err := owner.BindMW(wrid, mw, mr, uint64(base+page), page, AccessRemoteRead)
		if err != nil {
			return 0, err
		}
		wc, err := waitWR(cq, wrid)
		if err != nil {
			return 0, err
		}
		if err := wc.Err(); err != nil {
			return 0, fmt.Errorf("binding a memory window: %w", err)
		}
		return rkey, nil
	}
	win := uint64(base + page)

	// A: the window reads its range, and nothing once invalidated.
	reader, owner, cq, err := pair()
	if err != nil {
		return err
	}
	rkey, err := bind(owner, cq, 1)
	if err != nil {
		return err
	}
	if err := read(reader, cq, 2, win, page, rkey); err != nil {
		return fmt.Errorf("reading a bound memory window: %w", err)
	}
	if !bytes.Equal(dst[:page], src[page:2*page]) {
		return fmt.Errorf("%w: a read of a bound window returned other bytes", ErrWindowBounds)
	}
	if err := owner.LocalInvalidate(3, rkey); err != nil {
		return err
	}
	if wc, err := waitWR(cq, 3); err != nil {
		return err
	} else if err := wc.Err(); err != nil {
		return fmt.Errorf("invalidating a memory window: %w", err)
	}
	if read(reader, cq, 4, win, page, rkey) == nil {
		return fmt.Errorf("%w: %s: a read through an invalidated window's rkey succeeded", ErrWindowBounds, c.Name())
	}

	// B: one byte past the window's end.
	reader, owner, cq, err = pair()
	if err != nil {
		return err
	}
	if rkey, err = bind(owner, cq, 5); err != nil {
		return err
	}
	if read(reader, cq, 6, win+1, page, rkey) == nil {
		return fmt.Errorf("%w: %s: a read of [%d, %d) of a window bound to [0, %d) succeeded", ErrWindowBounds, c.Name(), 1, page+1, page)
	}

	// C: the region's own rkey, registered for binding only.
	reader, _, cq, err = pair()
	if err != nil {
		return err
	}
	if read(reader, cq, 7, uint64(base), page, mr.RKey()) == nil {
		return fmt.Errorf("%w: %s: a region registered for window binding only was read through its own rkey", ErrWindowBounds, c.Name())
	}
	return nil
}

func waitWR(cq *CQ, wrid uint64) (WorkCompletion, error) { return cq.Await(wrid, probeTimeout) }

// Await polls q until the completion of work request wrid arrives and
// returns it; completions of other work requests polled meanwhile are
// dropped, so use it on a CQ whose work requests are awaited one at a time.
// It fails after timeout.
func (q *CQ) Await(wrid uint64, timeout time.Duration) (WorkCompletion, error) {
	deadline := time.Now().Add(timeout)
	wcs := make([]WorkCompletion, 8)
	for spin := 0; ; spin++ {
		n, err := q.Poll(wcs)
		if err != nil {
			return WorkCompletion{}, err
		}
		for _, wc := range wcs[:n] {
			if wc.WRID == wrid {
				return wc, nil
			}
		}
		if n > 0 {
			continue
		}
		if time.Now().After(deadline) {
			return WorkCompletion{}, fmt.Errorf("ibverbs: no completion for work request %d after %v", wrid, timeout)
		}
		if spin < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
}
