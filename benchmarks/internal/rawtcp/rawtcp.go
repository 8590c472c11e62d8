package rawtcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// MaxMessage bounds one message (the receiver's buffer grows to the largest
// message sent).
const MaxMessage = 4 << 30

// Receive is called on the receiving side with the bytes of each message,
// valid until it returns, before the ack is written. An error fails the
// message and closes the connection.
type Receive func(p []byte) error

// Options change the receiving side.
type Options struct {
	// Receive, when set, runs on each message before the ack.
	Receive Receive
	// FreshBuffer makes the receiver allocate a new buffer for every
	// message, as a runtime that hands each message its own destination
	// does, instead of reusing one.
	FreshBuffer bool
}

// Pair is the two ends of one loopback connection in this process.
type Pair struct {
	ln     net.Listener
	client net.Conn
	server net.Conn
	opts   Options

	wg      sync.WaitGroup
	errMu   sync.Mutex
	recvErr error

	bufMu sync.Mutex // held by the receiver while it handles a message
	buf   []byte     // receiver's buffer
}

// Open listens on 127.0.0.1, connects, and starts the receiving side.
func Open(opts Options) (*Pair, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("rawtcp: %w", err)
	}
	p := &Pair{ln: ln, opts: opts}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	p.client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		<-accepted
		return nil, fmt.Errorf("rawtcp: %w", err)
	}
	c, ok := <-accepted
	if !ok {
		p.client.Close()
		ln.Close()
		return nil, errors.New("rawtcp: accept failed")
	}
	p.server = c
	for _, c := range []net.Conn{p.client, p.server} {
		c.(*net.TCPConn).SetNoDelay(true)
	}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// serve reads length-prefixed messages and acks each with one byte.
func (p *Pair) serve() {
	defer p.wg.Done()
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(p.server, hdr[:]); err != nil {
			p.fail(err)
			return
		}
		n := binary.LittleEndian.Uint64(hdr[:])
		if n > MaxMessage {
			p.fail(fmt.Errorf("rawtcp: message of %d bytes > %d", n, uint64(MaxMessage)))
			return
		}
		if err := p.receive(int(n)); err != nil {
			p.fail(err)
			return
		}
	}
}

// receive reads one message of n bytes, hands it to onRecv and acks it.
func (p *Pair) receive(n int) error {
	p.bufMu.Lock()
	defer p.bufMu.Unlock()
	if cap(p.buf) < n || p.opts.FreshBuffer {
		p.buf = nil // let the old one go before the new one is made
		p.buf = make([]byte, n)
	}
	b := p.buf[:n]
	if _, err := io.ReadFull(p.server, b); err != nil {
		return err
	}
	if p.opts.Receive != nil {
		if err := p.opts.Receive(b); err != nil {
			return err
		}
	}
	_, err := p.server.Write([]byte{1})
	if p.opts.FreshBuffer {
		p.buf = nil
	}
	return err
}

func (p *Pair) fail(err error) {
	p.errMu.Lock()
	if p.recvErr == nil {
		p.recvErr = err
	}
	p.errMu.Unlock()
	p.server.Close()
}

// Send writes b as one message and waits for its ack; it returns the time
// from the first byte written until the ack was read. The 8-byte length
// prefix goes out in its own write before the clock starts.
func (p *Pair) Send(b []byte) (time.Duration, error) {
	var hdr [8]byte
	binary.LittleEndian.PutUint64(hdr[:], uint64(len(b)))
	if _, err := p.client.Write(hdr[:]); err != nil {
		return 0, p.err(err)
	}
	t0 := time.Now()
	if _, err := p.client.Write(b); err != nil {
		return 0, p.err(err)
	}
	var ack [1]byte
	if _, err := io.ReadFull(p.client, ack[:]); err != nil {
		return 0, p.err(err)
	}
	return time.Since(t0), nil
}

// err prefers the receiving side's error, which says why the connection
// broke.
func (p *Pair) err(err error) error {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	if p.recvErr != nil && !errors.Is(p.recvErr, net.ErrClosed) {
		return fmt.Errorf("rawtcp: receiver: %w", p.recvErr)
	}
	return fmt.Errorf("rawtcp: %w", err)
}

// FreeBuffer drops the receiver's buffer, so that the memory can go back
// between sizes; call it between Sends.
func (p *Pair) FreeBuffer() {
	p.bufMu.Lock()
	p.buf = nil
	p.bufMu.Unlock()
}

// Close closes both ends and waits for the receiving goroutine.
func (p *Pair) Close() error {
	err := p.ln.Close()
	p.client.Close()
	p.server.Close()
	p.wg.Wait()
	if err != nil {
		return fmt.Errorf("rawtcp: %w", err)
	}
	return nil
}
