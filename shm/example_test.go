//go:build linux

package shm_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/tensorferry/tensorferry/shm"
)

// Both ends of a socket that has passed the handshake upgrade it; the
// stream then goes through shared memory.
func ExampleUpgrade() {
	dir, _ := os.MkdirTemp("", "shm-example-")
	defer os.RemoveAll(dir)
	cfg := shm.Config{Dir: dir} // default: /dev/shm
	dialed, accepted := net.Pipe()
	done := make(chan net.Conn)
	go func() {
		c, err := shm.Upgrade(context.Background(), accepted, cfg, false)
		if err != nil {
			fmt.Println(err)
		}
		done <- c
	}()
	c, err := shm.Upgrade(context.Background(), dialed, cfg, true)
	if err != nil {
		fmt.Println(err) // errors.Is(err, shm.ErrFallback): go on over dialed
		return
	}
	peer := <-done
	defer c.Close()
	defer peer.Close()
	go c.Write([]byte("hello"))
	buf := make([]byte, 5)
	io.ReadFull(peer, buf)
	_, onRings := c.(*shm.Conn)
	fmt.Println(string(buf), onRings)
	// Output: hello true
}
