package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"path/filepath"
)

// TLSConfig turns on TLS 1.3, with certificates on both ends, under the
// HMAC handshake of every connection: the handshake still proves cluster
// membership and the node's name; TLS adds confidentiality and integrity
// on the wire. Every node presents CertFile and accepts peers whose
// certificate chains to CAFile (host names are not checked: the node's
// identity is the HMAC handshake's). Paths are resolved against the config
// file's directory.
type TLSConfig struct {
	// CertFile and KeyFile are this node's certificate and private key
	// (PEM), usually a per-host file at the same path on every host.
	CertFile string
	KeyFile  string
	// CAFile holds the PEM certificates that sign the nodes' certificates.
	CAFile string
	// Data also encrypts the data connections (the staging channel's
	// bytes); by default only control connections are, since loopback and
	// datacenter links rarely need the cost at tens of GB/s.
	Data bool

	server, client *tls.Config // built by Validate
}

// maxPEMFile bounds a certificate, key or CA file, in bytes: a bundle of
// a few hundred certificates.
const maxPEMFile = 1 << 20

// load reads the files and builds the TLS configurations of both ends,
// once: validating the config again (every NewNode does) while its nodes
// run only reads them.
func (t *TLSConfig) load(c *Config) error {
	if t.server != nil {
		return nil
	}
	switch {
	case t.CertFile == "":
		return c.errf("tls.cert_file", "required with tls")
	case t.KeyFile == "":
		return c.errf("tls.key_file", "required with tls")
	case t.CAFile == "":
		return c.errf("tls.ca_file", "required with tls")
	}
	certPEM, err := readFile(c.resolvePath(t.CertFile), maxPEMFile, nil)
	if err != nil {
		return c.errf("tls.cert_file", "%w", err)
	}
	keyPEM, err := readFile(c.resolvePath(t.KeyFile), maxPEMFile, nil)
	if err != nil {
		return c.errf("tls.key_file", "%w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return c.errf("tls.cert_file", "%w", err)
	}
	pem, err := readFile(c.resolvePath(t.CAFile), maxPEMFile, nil)
	if err != nil {
		return c.errf("tls.ca_file", "%w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return c.errf("tls.ca_file", "no PEM certificate in %s", t.CAFile)
	}
	verify := func(usage x509.ExtKeyUsage) func(tls.ConnectionState) error {
		return func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: the peer sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, ic := range cs.PeerCertificates[1:] {
				inter.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
			if err != nil {
				return fmt.Errorf("tls: peer certificate: %w", err)
			}
			return nil
		}
	}
	t.server = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAnyClientCert, // verified below, without host names
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verify(x509.ExtKeyUsageClientAuth)(cs)
		},
	}
	t.client = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		// The chain is checked in VerifyConnection against CAFile; host
		// names are not, the HMAC handshake names the node.
		InsecureSkipVerify: true, //nolint:gosec // verified by VerifyConnection
		VerifyConnection:   verify(x509.ExtKeyUsageServerAuth),
	}
	return nil
}

// resolvePath resolves a relative path against the config file's
// directory.
func (c *Config) resolvePath(p string) string {
	if filepath.IsAbs(p) || c.dir == "" {
		return p
	}
	return filepath.Join(c.dir, p)
}

// ServerTLS returns the TLS configuration of the accepting end of a
// connection, built by Validate; nil before.
func (t *TLSConfig) ServerTLS() *tls.Config { return t.server }

// ClientTLS returns the TLS configuration of the dialing end of a
// connection, built by Validate; nil before.
func (t *TLSConfig) ClientTLS() *tls.Config { return t.client }
