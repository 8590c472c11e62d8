//go:build !linux

package shm

import (
	"context"
	"errors"
	"net"
)

func viable(string) error { return errors.New("shm: shared memory rings need Linux") }

// Upgrade never upgrades off Linux (Config.Usable says so, so no handshake
// agrees to it): it returns an error wrapping ErrFallback.
func Upgrade(ctx context.Context, nc net.Conn, cfg Config, initiator bool) (net.Conn, error) {
	return nil, errors.Join(ErrFallback, viable(""))
}

// Conn is the shared-memory stream on Linux; off Linux Upgrade never
// returns one.
type Conn struct{ net.Conn }

func upgrade(ctx context.Context, nc net.Conn, cfg Config, initiator bool, _ *Limits, _ error) (net.Conn, error) {
	return Upgrade(ctx, nc, cfg, initiator)
}
