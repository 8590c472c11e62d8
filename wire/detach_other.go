//go:build !linux

package wire

import (
	"net"
	"time"
)

// Control connections are taken out of the runtime's network poller on
// Linux only.

func detachOnStart(net.Conn) {}

func newDetachable(net.Conn, time.Duration) net.Conn { return nil }
