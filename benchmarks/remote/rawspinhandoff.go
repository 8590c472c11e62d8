package main

import (
	"errors"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// raw-tcp-spin-detached-handoff is raw-tcp-spin-detached (both ends read
// with a 50 µs spin out of the runtime's poller, as tensorferry's control
// connections do on hosts with idle cores) plus the two goroutine
// hand-offs of protoactor's RequestFuture to an actor with a default
// mailbox, and nothing else: the server's reader starts a goroutine per
// request that writes the response (a default mailbox starts one per
// activation), the client's reader wakes the caller waiting on a
// sync.Cond (a protoactor future), and each reader yields its processor
// after a hand-off, as wire.Conn's reader does when its read spins. Beside
// raw-tcp-spin-detached (no hand-off: what Node.Request to an actor with
// inline delivery is built on), it is the floor of RequestFuture over a
// spinning transport on this host. Its variants take one thing away:
// "-noyield" the readers' yield after a hand-off (the woken goroutine then
// waits in the reader's run queue until another processor steals it),
// "-chan" the goroutine per request (the server's reader hands requests
// over a channel to one long-lived goroutine, whose stack has grown
// already: what a new goroutine's start and stack growth cost).
// raw-tcp-pollspin-detached-handoff spins on poll(2) instead of read(2),
// as raw-tcp-pollspin-detached does: read(2) holds the socket's lock, and
// here another goroutine writes on the socket while its reader spins (a
// writer that finds the lock held sleeps in the kernel until it is
// released), which it does not in raw-tcp-spin-detached.
func init() {
	extraPaths = append(extraPaths,
		path{name: "raw-tcp-spin-detached-handoff", rttOnly: true, open: func() (*endpoints, error) { return openRawSpinHandoff(rawSpin, true, false) }},
		path{name: "raw-tcp-spin-detached-handoff-noyield", rttOnly: true, open: func() (*endpoints, error) { return openRawSpinHandoff(rawSpin, false, false) }},
		path{name: "raw-tcp-spin-detached-handoff-chan", rttOnly: true, open: func() (*endpoints, error) { return openRawSpinHandoff(rawSpin, true, true) }},
		path{name: "raw-tcp-pollspin-detached-handoff", rttOnly: true, open: func() (*endpoints, error) { return openRawSpinHandoff(-rawSpin, true, false) }})
}

type rawSpinHandoff struct {
	yield, toChan  bool // yield after a hand-off; hand requests to one goroutine
	client, server *detachedSocket
	req            [payloadSize]byte
	served         sync.WaitGroup // the server's reader and its goroutines
	read           chan struct{}  // closed when the client's reader ends

	mu   sync.Mutex
	cond *sync.Cond
	resp []byte // the response, once the client's reader has it
	err  error  // why the client's reader ended
}

// openRawSpinHandoff opens raw-tcp-spin-detached-handoff or a variant:
// spin is the sockets' (detachedSocket; negative: on poll(2)).
func openRawSpinHandoff(spin time.Duration, yield, toChan bool) (*endpoints, error) {
	c, s, err := loopbackPair()
	if err != nil {
		return nil, err
	}
	p := &rawSpinHandoff{yield: yield, toChan: toChan, read: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	for i := range p.req {
		p.req[i] = byte(i)
	}
	if p.client, err = newDetachedSocket(c, spin, 0); err == nil {
		if p.server, err = newDetachedSocket(s, spin, 0); err != nil {
			_ = p.client.close()
		}
	}
	if err != nil {
		c.Close()
		s.Close()
		return nil, err
	}
	p.served.Add(1)
	go p.serve()
	go p.readResponses()
	return &endpoints{pinger: p, close: p.close}, nil
}

// serve reads requests and starts a goroutine for each that writes the
// response (the server's writes are ordered: one request is in flight),
// or hands them to one such goroutine (toChan).
func (p *rawSpinHandoff) serve() {
	defer p.served.Done()
	var inbox chan []byte
	if p.toChan {
		inbox = make(chan []byte, 1)
		defer close(inbox)
		p.served.Add(1)
		go func() {
			defer p.served.Done()
			for buf := range inbox {
				_ = p.server.writeAll(buf)
			}
		}()
	}
	for {
		buf := make([]byte, payloadSize)
		if p.server.readFull(buf) != nil {
			return
		}
		if inbox != nil {
			inbox <- buf
		} else {
			p.served.Add(1)
			go func() {
				defer p.served.Done()
				_ = p.server.writeAll(buf)
			}()
		}
		if p.yield {
			runtime.Gosched()
		}
	}
}

// readResponses reads responses and hands each to the waiting caller.
func (p *rawSpinHandoff) readResponses() {
	defer close(p.read)
	for {
		buf := make([]byte, payloadSize)
		err := p.client.readFull(buf)
		p.mu.Lock()
		p.resp, p.err = buf, err
		p.mu.Unlock()
		p.cond.Signal()
		if err != nil {
			return
		}
		if p.yield {
			runtime.Gosched()
		}
	}
}

// RoundTrip writes one request and waits for the client's reader to hand
// over the response.
func (p *rawSpinHandoff) RoundTrip() error {
	if err := p.client.writeAll(p.req[:]); err != nil {
		return err
	}
	p.mu.Lock()
	for p.resp == nil && p.err == nil {
		p.cond.Wait()
	}
	resp, err := p.resp, p.err
	p.resp = nil
	p.mu.Unlock()
	switch {
	case err != nil:
		return err
	case [payloadSize]byte(resp) != p.req:
		return errors.New("raw-tcp-spin-detached-handoff: response differs from request")
	}
	return nil
}

func (p *rawSpinHandoff) close() error {
	// Both readers see EOF; the sockets close once they have ended.
	err := unix.Shutdown(p.client.fd, unix.SHUT_RDWR)
	p.served.Wait()
	<-p.read
	return errors.Join(err, p.client.close(), p.server.close())
}
