//go:build !linux

package wire

import (
	"net"
	"time"
)

// MaxDetachedConns is 0 where control connections are never taken out of
// the runtime's network poller (Linux only).
const MaxDetachedConns = 0

func detachOnStart(net.Conn) {}

func newDetachable(net.Conn, time.Duration) net.Conn { return nil }
