package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/tensorferry/tensorferry/shm"
)

// The same-host paths: raw-shm is raw-tcp's echo and count servers on
// package shm's rings (the floor of the shared-memory transport: no framing
// beyond the size), tensorferry-shm is the tensorferry path with its control
// connection moved to shared memory, as two nodes of one host do by default.
// Both run beside raw-tcp in the same run.
var shmSpin = flag.Duration("shm-spin", 0, "longest spin of the shared-memory paths before sleeping (0: package shm's default, shm.DefaultSpin with GOMAXPROCS ≥ 8 or TENSORFERRY_FASTPATHS=on, none below; negative: never)")

func init() {
	extraPaths = append(extraPaths,
		path{name: "raw-shm", open: openRawShm},
		path{name: "tensorferry-shm", open: func() (*endpoints, error) { return openTensorferry(true, true) }})
}

// shmConfig is the shared-memory config of the benchmark's nodes: on with
// --shm-spin, or off (the TCP paths).
func shmConfig(on bool) shm.Config {
	return shm.Config{Disable: !on, Spin: *shmSpin}
}

// upgradeTimeout bounds the set-up of one raw-shm connection.
const upgradeTimeout = 10 * time.Second

// openRawShm opens raw-tcp's two connections, echo and count, and moves
// each to shared memory before anything else crosses it.
func openRawShm() (*endpoints, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &rawTCP{ln: ln}
	for i := range r.req {
		r.req[i] = byte(i)
	}
	r.wg.Add(1)
	go acceptShm(r)
	if r.echo, err = dialShm(r, modeEcho); err == nil {
		r.sink, err = dialShm(r, modeCount)
	}
	if err != nil {
		return nil, errors.Join(err, r.close())
	}
	r.sinkW = bufio.NewWriterSize(r.sink, 64<<10)
	return &endpoints{pinger: r, sender: r, close: func() error {
		spinReport("echo", r.echo)
		spinReport("count", r.sink)
		return r.close()
	}}, nil
}

func dialShm(r *rawTCP, mode byte) (net.Conn, error) {
	c, err := net.Dial("tcp", r.ln.Addr().String())
	if err != nil {
		return nil, err
	}
	c.(*net.TCPConn).SetNoDelay(true)
	ctx, cancel := context.WithTimeout(context.Background(), upgradeTimeout)
	defer cancel()
	sc, err := shm.Upgrade(ctx, c, shmConfig(true), true)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("raw-shm: %w", err)
	}
	if _, err := sc.Write([]byte{mode}); err != nil {
		sc.Close()
		return nil, err
	}
	return sc, nil
}

// acceptShm is rawTCP.accept with the upgrade of every connection.
func acceptShm(r *rawTCP) {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return // listener closed
		}
		c.(*net.TCPConn).SetNoDelay(true)
		ctx, cancel := context.WithTimeout(context.Background(), upgradeTimeout)
		sc, err := shm.Upgrade(ctx, c, shmConfig(true), false)
		cancel()
		if err != nil {
			c.Close()
			continue // the dialer sees its own upgrade fail
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			sc.Close()
			return
		}
		r.conns = append(r.conns, sc)
		r.mu.Unlock()
		r.wg.Add(1)
		go r.serve(sc)
	}
}

// spinReport prints how the spins of a raw-shm connection ended.
func spinReport(name string, c net.Conn) {
	sc, ok := c.(*shm.Conn)
	if !ok {
		return
	}
	rs, rw, ws, ww := sc.SpinStats()
	fmt.Fprintf(os.Stderr, "remote: raw-shm: %s connection, client end: reads ended by the spin %d, slept %d; writes ended by the spin %d, slept %d\n", name, rs, rw, ws, ww)
}
