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

// Connection modes, the first byte a raw-tcp client writes.
const (
	modeEcho  = 'e' // echo every payloadSize-byte message back
	modeCount = 'c' // count payloadSize-byte messages
)

// rawTCPPath is the floor: plain Go TCP on loopback with TCP_NODELAY, a
// server goroutine echoing fixed-size messages, no framing beyond the size.
func rawTCPPath() path { return path{name: "raw-tcp", open: openRawTCP} }

type rawTCP struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn // server side, closed on close

	echo   net.Conn // client side of the echo connection
	sink   net.Conn // client side of the counting connection
	sinkW  *bufio.Writer
	count  counter
	req    [payloadSize]byte
	resp   [payloadSize]byte
	closed bool
}

func openRawTCP() (*endpoints, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &rawTCP{ln: ln}
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
	r.sinkW = bufio.NewWriterSize(r.sink, 64<<10)
	return &endpoints{pinger: r, sender: r, close: r.close}, nil
}

func (r *rawTCP) dial(mode byte) (net.Conn, error) {
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

func (r *rawTCP) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return // listener closed
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

// serve runs one server-side connection until it is closed.
func (r *rawTCP) serve(c net.Conn) {
	defer r.wg.Done()
	br := bufio.NewReaderSize(c, 64<<10)
	mode, err := br.ReadByte()
	if err != nil {
		return
	}
	var buf [payloadSize]byte
	for {
		if _, err := io.ReadFull(br, buf[:]); err != nil {
			return
		}
		switch mode {
		case modeEcho:
			if _, err := c.Write(buf[:]); err != nil {
				return
			}
		case modeCount:
			// Count every whole message already buffered at once.
			k := 1 + br.Buffered()/payloadSize
			for range k - 1 {
				if _, err := io.ReadFull(br, buf[:]); err != nil {
					return
				}
			}
			r.count.add(k)
		default:
			return
		}
	}
}

// RoundTrip writes one request and reads the echoed response.
func (r *rawTCP) RoundTrip() error {
	if _, err := r.echo.Write(r.req[:]); err != nil {
		return err
	}
	if _, err := io.ReadFull(r.echo, r.resp[:]); err != nil {
		return err
	}
	if r.resp != r.req {
		return errors.New("raw-tcp: response differs from request")
	}
	return nil
}

// Send buffers one message; full buffers go out as they fill.
func (r *rawTCP) Send() error {
	_, err := r.sinkW.Write(r.req[:])
	return err
}

// WaitReceived flushes what Send buffered and waits for the server's count.
func (r *rawTCP) WaitReceived(total int, timeout time.Duration) error {
	if err := r.sinkW.Flush(); err != nil {
		return err
	}
	return r.count.wait(total, timeout)
}

func (r *rawTCP) close() error {
	r.mu.Lock()
	r.closed = true
	conns := r.conns
	r.mu.Unlock()
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
		return fmt.Errorf("raw-tcp: close: %w", err)
	}
	return nil
}
