package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/tensorferry/tensorferry/config"
)

// writePKI writes a CA and a node certificate it signs into a directory
// of dir named for prefix, and returns the paths.
func writePKI(t *testing.T, dir, prefix string) (cert, key, ca string) {
	t.Helper()
	sub := filepath.Join(dir, prefix+"pki")
	if err := os.MkdirAll(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	tc, err := config.LocalTLS(sub, false)
	if err != nil {
		t.Fatal(err)
	}
	return tc.CertFile, tc.KeyFile, tc.CAFile
}

func TestTLSConfigParse(t *testing.T) {
	dir := t.TempDir()
	cert, key, ca := writePKI(t, dir, "")
	if err := os.WriteFile(filepath.Join(dir, "secret.key"), []byte("0123456789abcdef0123"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "cluster: t\nsecret_file: secret.key\nnodes:\n  - {name: a, address: 127.0.0.1:7001}\ntls:\n"
	rel := func(p string) string { r, _ := filepath.Rel(dir, p); return r } // relative to the config's directory
	good := base + "  cert_file: " + rel(cert) + "\n  key_file: " + rel(key) + "\n  ca_file: " + rel(ca) + "\n  data: true\n"
	c, err := config.Parse([]byte(good), dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.TLS == nil || !c.TLS.Data || c.TLS.CAFile != rel(ca) {
		t.Fatalf("tls: %+v", c.TLS)
	}
	// Marshal keeps the block.
	b, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := config.Parse(b, dir)
	if err != nil || back.TLS == nil || back.TLS.KeyFile != c.TLS.KeyFile || !back.TLS.Data {
		t.Fatalf("round trip: %+v, %v\n%s", back.TLS, err, b)
	}
	bad := map[string]struct{ yaml, field string }{
		"no key":       {base + "  cert_file: " + cert + "\n  ca_file: " + ca + "\n", "tls.key_file"},
		"missing ca":   {base + "  cert_file: " + cert + "\n  key_file: " + key + "\n  ca_file: nope.pem\n", "tls.ca_file"},
		"not a ca":     {base + "  cert_file: " + cert + "\n  key_file: " + key + "\n  ca_file: secret.key\n", "tls.ca_file"},
		"key mismatch": {base + "  cert_file: " + ca + "\n  key_file: " + key + "\n  ca_file: " + ca + "\n", "tls.cert_file"},
		"unknown key":  {base + "  cert: x\n", "tls.cert"},
		"bad data":     {base + "  cert_file: " + cert + "\n  key_file: " + key + "\n  ca_file: " + ca + "\n  data: maybe\n", "tls.data"},
	}
	for name, tc := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.yaml), dir)
			var ce *config.Error
			if !errors.As(err, &ce) || ce.Field != tc.field || ce.Line == 0 {
				t.Fatalf("error %v (%+v), want one naming %s and its line", err, ce, tc.field)
			}
		})
	}
}

// TestTLSConfigLoad: Validate builds both ends' TLS configurations, once.
func TestTLSConfigLoad(t *testing.T) {
	cert, key, ca := writePKI(t, t.TempDir(), "")
	cfg, err := config.LocalConfig("tls", 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg.TLS = &config.TLSConfig{CertFile: cert, KeyFile: key, CAFile: ca}
	if cfg.TLS.ServerTLS() != nil || cfg.TLS.ClientTLS() != nil {
		t.Fatal("TLS configurations before Validate")
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv, cli := cfg.TLS.ServerTLS(), cfg.TLS.ClientTLS()
	if srv == nil || cli == nil || len(srv.Certificates) != 1 || srv.VerifyConnection == nil || cli.VerifyConnection == nil {
		t.Fatalf("server %+v, client %+v", srv, cli)
	}
	if err := cfg.Validate(); err != nil || cfg.TLS.ServerTLS() != srv {
		t.Errorf("a second Validate rebuilt the TLS configuration (%v)", err)
	}
}
