//go:build linux

package shm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"
)

// Upgrade moves the byte stream of nc, a connection that has just passed
// wire.Handshake with shared memory agreed by both ends, to a pair of rings
// in shared memory when both ends are processes of one host. The initiator
// (the end that dialed) offers its host id; the acceptor, on the same host,
// makes a region (a file of memory and four FIFOs, mode 0600, named by 128
// random bits in Config.Dir) and names it; the initiator maps it, checks
// its header against the nonce the acceptor sent, writes its own nonce in
// it as proof and unlinks the files; the acceptor checks the proof and
// starts. Nothing is mapped before the handshake authenticated both ends,
// and only a process of the same user can open the files, for the moments
// they exist.
//
// It returns a *Conn, through which the stream goes on and which keeps nc
// open as its liveness channel; or an error wrapping ErrFallback, with nc
// left open for the stream to go on over it (the error says why); or
// another error (an I/O error, a malformed message: a broken peer), with nc
// closed. ctx bounds the exchange (DefaultTimeout if it has no deadline).
func Upgrade(ctx context.Context, nc net.Conn, cfg Config, initiator bool) (net.Conn, error) {
	return upgrade(ctx, nc, cfg, initiator, nil, nil)
}

// upgrade is Upgrade, with the region counted in lim (nil: no limits);
// refuse, when not nil, is why this end declines without making or mapping
// anything.
func upgrade(ctx context.Context, nc net.Conn, cfg Config, initiator bool, lim *Limits, refuse error) (net.Conn, error) {
	deadline := time.Now().Add(DefaultTimeout)
	if d, ok := ctx.Deadline(); ok {
		deadline = d
	}
	if err := nc.SetDeadline(deadline); err != nil {
		nc.Close()
		return nil, fmt.Errorf("shm: upgrade: set deadline: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	var c *Conn
	var err error
	if initiator {
		c, err = initiate(nc, cfg, lim, refuse)
	} else {
		c, err = accept(nc, cfg, lim, refuse)
	}
	if !stop() {
		if err == nil {
			c.Close()
		}
		nc.Close()
		return nil, fmt.Errorf("shm: upgrade: %w", ctx.Err())
	}
	if err == nil || errors.Is(err, ErrFallback) {
		if derr := nc.SetDeadline(time.Time{}); derr != nil {
			if c != nil {
				c.Close()
			}
			nc.Close()
			return nil, fmt.Errorf("shm: upgrade: clear deadline: %w", derr)
		}
	} else {
		nc.Close()
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

func fallback(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrFallback}, args...)...)
}

func send(nc net.Conn, m *msg) error {
	if _, err := nc.Write(appendMsg(make([]byte, 0, 64), m)); err != nil {
		return fmt.Errorf("shm: send %s: %w", msgNames[m.kind], err)
	}
	return nil
}

func initiate(nc net.Conn, cfg Config, lim *Limits, refuse error) (*Conn, error) {
	offer := msg{kind: msgOffer, ok: true}
	if _, err := rand.Read(offer.nonce[:]); err != nil {
		return nil, fmt.Errorf("shm: nonce: %w", err)
	}
	host, herr := cfg.hostID()
	if herr == nil {
		herr = cfg.Usable()
	}
	if herr == nil {
		herr = refuse
	}
	if herr != nil {
		offer.ok, offer.reason = false, herr.Error()
	}
	offer.host = host
	if err := send(nc, &offer); err != nil {
		return nil, err
	}
	if !offer.ok {
		// The acceptor still answers, so that both ends leave the
		// exchange at the same point.
		if _, err := readMsg(nc, msgAccept); err != nil {
			return nil, err
		}
		return nil, fallback("%w", herr)
	}
	acc, err := readMsg(nc, msgAccept)
	if err != nil {
		return nil, err
	}
	if !acc.ok {
		return nil, fallback("the peer declined: %s", acc.reason)
	}
	release, err := lim.reserve(int64(regionSize(acc.ringSize)))
	if err != nil {
		if serr := send(nc, &msg{kind: msgConfirm, reason: err.Error()}); serr != nil {
			return nil, serr
		}
		return nil, fallback("%w", err)
	}
	reg, err := openRegion(cfg.dir(), acc.name, acc.ringSize, acc.nonce)
	if err != nil {
		release()
		if serr := send(nc, &msg{kind: msgConfirm, reason: err.Error()}); serr != nil {
			return nil, serr
		}
		return nil, fallback("%v", err)
	}
	if testHookChecked != nil {
		testHookChecked(filepath.Join(cfg.dir(), acc.name+".mem"))
	}
	if err := guard("write the proof", func() { copy(reg.mem[hdrProof:hdrProof+nonceSize], offer.nonce[:]) }); err != nil {
		reg.closeBells()
		reg.unmap()
		release()
		// The peer (or a process of this user) shrank the region: the
		// connection is broken, not only the upgrade.
		_ = send(nc, &msg{kind: msgConfirm, reason: err.Error()})
		return nil, err
	}
	if err := send(nc, &msg{kind: msgConfirm, ok: true}); err != nil {
		reg.closeBells()
		reg.unmap()
		release()
		return nil, err
	}
	start, err := readMsg(nc, msgStart)
	if err == nil && !start.ok {
		err = fallback("the peer declined: %s", start.reason)
	}
	if err != nil {
		reg.closeBells()
		reg.unmap()
		release()
		return nil, err
	}
	c := newConn(reg, false, nc, cfg.Spin)
	c.release = release
	return c, nil
}

func accept(nc net.Conn, cfg Config, lim *Limits, refuse error) (*Conn, error) {
	offer, err := readMsg(nc, msgOffer)
	if err != nil {
		return nil, err
	}
	decline := func(why error) (*Conn, error) {
		if err := send(nc, &msg{kind: msgAccept, reason: why.Error()}); err != nil {
			return nil, err
		}
		return nil, fallback("%w", why)
	}
	if !offer.ok {
		if err := send(nc, &msg{kind: msgAccept, reason: "you declined"}); err != nil {
			return nil, err
		}
		return nil, fallback("the peer declined: %s", offer.reason)
	}
	host, err := cfg.hostID()
	if err == nil {
		err = cfg.Usable()
	}
	if err == nil {
		err = refuse
	}
	if err != nil {
		return decline(err)
	}
	if offer.host != host {
		return decline(fmt.Errorf("shm: on another host (host id %q, here %q)", offer.host, host))
	}
	size, _ := cfg.ringSize() // checked by Usable
	var nonce [nonceSize]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, fmt.Errorf("shm: nonce: %w", err)
	}
	unreserve, err := lim.reserve(int64(regionSize(size)))
	if err != nil {
		return decline(err)
	}
	reg, name, err := createRegion(cfg.dir(), size, nonce)
	if err != nil {
		unreserve()
		return decline(err)
	}
	defer reg.unlink()
	release := func() {
		reg.closeBells()
		reg.unmap()
		unreserve()
	}
	if err := send(nc, &msg{kind: msgAccept, ok: true, nonce: nonce, ringSize: size, name: name}); err != nil {
		release()
		return nil, err
	}
	conf, err := readMsg(nc, msgConfirm)
	if err != nil {
		release()
		return nil, err
	}
	if !conf.ok {
		release()
		return nil, fallback("the peer could not map the region: %s", conf.reason)
	}
	var proof [nonceSize]byte
	if err := guard("read the proof", func() { copy(proof[:], reg.mem[hdrProof:]) }); err != nil {
		release()
		_ = send(nc, &msg{kind: msgStart, reason: err.Error()})
		return nil, err
	}
	if proof != offer.nonce {
		release()
		if err := send(nc, &msg{kind: msgStart, reason: "no proof in the region: not the same memory"}); err != nil {
			return nil, err
		}
		return nil, fallback("the peer mapped other memory than this end's region")
	}
	if err := send(nc, &msg{kind: msgStart, ok: true}); err != nil {
		release()
		return nil, err
	}
	c := newConn(reg, true, nc, cfg.Spin)
	c.release = unreserve
	return c, nil
}
