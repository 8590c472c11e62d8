package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/tensorferry/tensorferry/shm"
)

// The two-process floors: raw-tcp's echo and count servers in a child
// process of this program, on TCP (raw-tcp-procs) or on package shm's rings
// (raw-shm-procs): the floors of tensorferry-procs-tcp and
// tensorferry-procs-shm, in the same run. One-way counts come back on
// request: a message of payloadSize 0xff bytes asks the count server for
// its count, which it writes back as 8 bytes after counting every message
// before the question.

// rawChildEnv names the transport of a raw child ("tcp" or "shm"); set:
// this process is the child.
const rawChildEnv = "TF_REMOTE_RAW_CHILD"

func init() {
	if tr := os.Getenv(rawChildEnv); tr != "" {
		os.Exit(runRawChild(tr == "shm"))
	}
	extraPaths = append(extraPaths,
		path{name: "raw-tcp-procs", open: func() (*endpoints, error) { return openRawProcs(false) }},
		path{name: "raw-shm-procs", open: func() (*endpoints, error) { return openRawProcs(true) }})
}

var countQuestion = func() (q [payloadSize]byte) {
	for i := range q {
		q[i] = 0xff
	}
	return q
}()

// runRawChild serves connections until its standard input closes; it
// prints its listener's address first.
func runRawChild(onShm bool) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "remote raw child:", err)
		return 2
	}
	fmt.Println(ln.Addr())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return 2
		}
		c.(*net.TCPConn).SetNoDelay(true)
		var nc net.Conn = c
		if onShm {
			ctx, cancel := context.WithTimeout(context.Background(), upgradeTimeout)
			nc, err = shm.Upgrade(ctx, c, shmConfig(true), false)
			cancel()
			if err != nil {
				fmt.Fprintln(os.Stderr, "remote raw child:", err)
				return 2
			}
		}
		go serveRawChild(nc)
	}
}

func serveRawChild(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	mode, err := br.ReadByte()
	if err != nil {
		return
	}
	var buf [payloadSize]byte
	count := uint64(0)
	for {
		if _, err := io.ReadFull(br, buf[:]); err != nil {
			return
		}
		switch {
		case mode == modeEcho:
			if _, err := c.Write(buf[:]); err != nil {
				return
			}
		case buf == countQuestion:
			if _, err := c.Write(binary.BigEndian.AppendUint64(nil, count)); err != nil {
				return
			}
		default:
			count++
		}
	}
}

type rawProcs struct {
	child  *exec.Cmd
	stdin  io.WriteCloser
	waited chan error
	echo   net.Conn
	sink   net.Conn
	sinkW  *bufio.Writer
	req    [payloadSize]byte
	resp   [payloadSize]byte
	once   sync.Once
}

func openRawProcs(onShm bool) (*endpoints, error) {
	r := &rawProcs{waited: make(chan error, 1)}
	for i := range r.req {
		r.req[i] = byte(i)
	}
	tr := "tcp"
	if onShm {
		tr = "shm"
	}
	r.child = exec.Command(os.Args[0])
	r.child.Env = append(os.Environ(), rawChildEnv+"="+tr, childSpinEnv+"="+shmSpin.String())
	r.child.Stderr = os.Stderr
	out, err := r.child.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if r.stdin, err = r.child.StdinPipe(); err != nil {
		return nil, err
	}
	if err := r.child.Start(); err != nil {
		return nil, err
	}
	var addr string
	_, err = fmt.Fscanln(out, &addr)
	go func() {
		_, _ = io.Copy(io.Discard, out)
		r.waited <- r.child.Wait()
	}()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("raw child: address: %w", err), r.close())
	}
	dial := func(mode byte) (net.Conn, error) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, err
		}
		c.(*net.TCPConn).SetNoDelay(true)
		var nc net.Conn = c
		if onShm {
			ctx, cancel := context.WithTimeout(context.Background(), upgradeTimeout)
			nc, err = shm.Upgrade(ctx, c, shmConfig(true), true)
			cancel()
			if err != nil {
				c.Close()
				return nil, err
			}
		}
		if _, err := nc.Write([]byte{mode}); err != nil {
			nc.Close()
			return nil, err
		}
		return nc, nil
	}
	if r.echo, err = dial(modeEcho); err == nil {
		r.sink, err = dial(modeCount)
	}
	if err != nil {
		return nil, errors.Join(err, r.close())
	}
	r.sinkW = bufio.NewWriterSize(r.sink, 64<<10)
	return &endpoints{pinger: r, sender: r, close: r.close}, nil
}

// RoundTrip writes one request and reads the echoed response.
func (r *rawProcs) RoundTrip() error {
	if _, err := r.echo.Write(r.req[:]); err != nil {
		return err
	}
	if _, err := io.ReadFull(r.echo, r.resp[:]); err != nil {
		return err
	}
	if r.resp != r.req {
		return errors.New("raw procs: response differs from request")
	}
	return nil
}

// Send buffers one message; full buffers go out as they fill.
func (r *rawProcs) Send() error {
	_, err := r.sinkW.Write(r.req[:])
	return err
}

// WaitReceived asks the count server for its count until it reaches total.
func (r *rawProcs) WaitReceived(total int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var n [8]byte
	for {
		if _, err := r.sinkW.Write(countQuestion[:]); err != nil {
			return err
		}
		if err := r.sinkW.Flush(); err != nil {
			return err
		}
		if _, err := io.ReadFull(r.sink, n[:]); err != nil {
			return err
		}
		if int(binary.BigEndian.Uint64(n[:])) >= total {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("raw procs: %d of %d messages counted after %v", binary.BigEndian.Uint64(n[:]), total, timeout)
		}
	}
}

func (r *rawProcs) close() error {
	var err error
	r.once.Do(func() {
		for _, c := range []net.Conn{r.echo, r.sink} {
			if c != nil {
				c.Close()
			}
		}
		r.stdin.Close()
		select {
		case werr := <-r.waited:
			if werr != nil {
				err = fmt.Errorf("raw child: %w", werr)
			}
		case <-time.After(10 * time.Second):
			_ = r.child.Process.Kill()
			err = fmt.Errorf("raw child: did not stop; killed: %v", <-r.waited)
		}
	})
	return err
}
