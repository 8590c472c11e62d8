package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"

	"github.com/tensorferry/tensorferry/config"
)

// secure returns nc under TLS, handshaken within DialTimeout, when the
// config asks for TLS on connections of this kind (data or control), as
// the dialing end (client) or the accepting one; else nc itself. On error
// nc is closed.
func secure(ctx context.Context, c *config.Config, nc net.Conn, data, client bool) (net.Conn, error) {
	t := c.TLS
	if t == nil || t.ServerTLS() == nil || (data && !t.Data) {
		return nc, nil
	}
	var tc *tls.Conn
	if client {
		tc = tls.Client(nc, t.ClientTLS())
	} else {
		tc = tls.Server(nc, t.ServerTLS())
	}
	ctx, cancel := context.WithTimeout(ctx, c.DialTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		return nil, fmt.Errorf("cluster: tls handshake with %s: %w", nc.RemoteAddr(), err)
	}
	return tc, nil
}
