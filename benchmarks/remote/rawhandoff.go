package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

func init() {
	extraPaths = append(extraPaths, path{name: "raw-tcp-handoff", open: openRawHandoff})
}

// rawHandoff is raw TCP with the goroutine hand-offs an actor runtime makes
// and nothing else: the server's reader hands each message to another
// goroutine (the actor) that answers or counts it, the client's reader
// hands each response to the waiting caller, and one-way sends are handed
// to a writer goroutine that batches them. It is the floor of a
// goroutine-per-actor design on this host: the gap between raw-tcp and this
// path is what the hand-offs cost, the gap between this path and an actor
// runtime is what the runtime adds.
type rawHandoff struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
	done  chan struct{}

	echo   net.Conn
	resp   chan []byte   // responses, handed from the client's reader
	dead   chan struct{} // closed when the client's reader stops
	sink   net.Conn
	out    chan []byte // one-way messages, handed to the client's writer
	count  counter
	req    [payloadSize]byte
	closed bool
}

func openRawHandoff() (*endpoints, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &rawHandoff{ln: ln, done: make(chan struct{}), resp: make(chan []byte, 1), dead: make(chan struct{}), out: make(chan []byte, 4096)}
	for i := range r.req {
		r.req[i] = byte(i)
	}
	r.wg.Add(1)
	go r.accept()
	if r.echo, err = r.dial(modeEcho); err == nil {
		r.sink, err = r.dial(modeCount)
	}
	if err != nil {
		r.close()
		return nil, err
	}
	r.wg.Add(2)
	go r.readResponses()
	go r.writeOneWay()
	return &endpoints{pinger: r, sender: r, close: r.close}, nil
}

func (r *rawHandoff) dial(mode byte) (net.Conn, error) {
	c, err := net.Dial("tcp", r.ln.Addr().String())
	if err != nil {
		return nil, err
	}
	c.(*net.TCPConn).SetNoDelay(true)
	if _, err := c.Write([]byte{mode}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (r *rawHandoff) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		c.(*net.TCPConn).SetNoDelay(true)
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			c.Close()
			return
		}
		r.conns = append(r.conns, c)
		r.mu.Unlock()
		r.wg.Add(1)
		go r.serve(c)
	}
}

// serve reads messages and hands each to the connection's actor goroutine.
func (r *rawHandoff) serve(c net.Conn) {
	defer r.wg.Done()
	br := bufio.NewReaderSize(c, 64<<10)
	mode, err := br.ReadByte()
	if err != nil {
		return
	}
	inbox := make(chan []byte, 1024)
	r.wg.Add(1)
	go func() { // the actor
		defer r.wg.Done()
		for m := range inbox {
			if mode == modeEcho {
				if _, err := c.Write(m); err != nil {
					return
				}
			} else {
				r.count.add(1)
			}
		}
	}()
	defer close(inbox)
	for {
		m := make([]byte, payloadSize)
		if _, err := io.ReadFull(br, m); err != nil {
			return
		}
		inbox <- m
	}
}

// readResponses hands every response to the caller waiting in RoundTrip.
func (r *rawHandoff) readResponses() {
	defer r.wg.Done()
	defer close(r.dead)
	for {
		m := make([]byte, payloadSize)
		if _, err := io.ReadFull(r.echo, m); err != nil {
			return
		}
		select {
		case r.resp <- m:
		case <-r.done:
			return
		}
	}
}

// writeOneWay writes what Send handed over, flushing when nothing waits.
func (r *rawHandoff) writeOneWay() {
	defer r.wg.Done()
	w := bufio.NewWriterSize(r.sink, 64<<10)
	for {
		select {
		case m := <-r.out:
			if _, err := w.Write(m); err != nil {
				return
			}
			if len(r.out) == 0 {
				if err := w.Flush(); err != nil {
					return
				}
			}
		case <-r.done:
			return
		}
	}
}

// RoundTrip writes one request on the caller's goroutine and waits for the
// reader to hand the response over.
func (r *rawHandoff) RoundTrip() error {
	if _, err := r.echo.Write(r.req[:]); err != nil {
		return err
	}
	select {
	case m := <-r.resp:
		if [payloadSize]byte(m) != r.req {
			return errors.New("raw-tcp-handoff: response differs from request")
		}
		return nil
	case <-r.dead:
		return errors.New("raw-tcp-handoff: connection closed")
	}
}

// Send hands one message to the writer goroutine.
func (r *rawHandoff) Send() error {
	m := make([]byte, payloadSize)
	copy(m, r.req[:])
	r.out <- m
	return nil
}

// WaitReceived waits for the server's actor to have counted total messages.
func (r *rawHandoff) WaitReceived(total int, timeout time.Duration) error {
	return r.count.wait(total, timeout)
}

func (r *rawHandoff) close() error {
	r.mu.Lock()
	r.closed = true
	conns := r.conns
	r.mu.Unlock()
	close(r.done)
	err := r.ln.Close()
	for _, c := range []net.Conn{r.echo, r.sink} {
		if c != nil {
			c.Close()
		}
	}
	for _, c := range conns {
		c.Close()
	}
	r.wg.Wait()
	if err != nil {
		return fmt.Errorf("raw-tcp-handoff: close: %w", err)
	}
	return nil
}
