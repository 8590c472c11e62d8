package config

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// maxLocalNodes bounds LocalConfig's n.
const maxLocalNodes = 1024

// LocalConfig returns a validated config for n nodes on loopback, for tests
// (memberlist's DefaultLocalConfig): DefaultConfig with nodes
// "node0".."node<n-1>" on 127.0.0.1 with control, data and gossip ports
// picked free by the kernel (the gossip port free for TCP), a random 32-byte secret, and the liveness timings
// shortened so that failures and restarts are noticed quickly (heartbeat
// 100ms, failure timeout 2s, dial timeout 1s, reconnection 10ms..200ms).
// The sections keep their defaults.
// The ports were free when picked; another process may take them before the
// nodes listen.
func LocalConfig(cluster string, n int) (*Config, error) {
	if n < 1 || n > maxLocalNodes {
		return nil, fmt.Errorf("config: local config: %d nodes, want 1..%d", n, maxLocalNodes)
	}
	c := DefaultConfig()
	c.Cluster = cluster
	// Loopback heartbeats are cheap. A killed process is noticed at once
	// (its sockets close); the timeout only covers a hung one.
	c.HeartbeatInterval = 100 * time.Millisecond
	// Twenty missed heartbeats: a test machine under the race detector and
	// parallel packages can stall a process for hundreds of milliseconds,
	// and a live node declared down loses the messages in flight.
	c.FailureTimeout = 2 * time.Second
	// Loopback dials either succeed at once or not at all; the handshake
	// may wait on a loaded machine.
	c.DialTimeout = time.Second
	// Redial a restarted node within tens of milliseconds.
	c.ReconnectMin = 10 * time.Millisecond
	c.ReconnectMax = 200 * time.Millisecond

	// 24 random bytes in base64 make 32 printable bytes (192 bits), so the
	// secret survives a round trip through a file or an environment variable.
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, fmt.Errorf("config: local config: secret: %w", err)
	}
	c.Secret = []byte(base64.RawURLEncoding.EncodeToString(raw[:]))

	// Hold every listener until all ports are picked, so none repeats.
	ls := make([]net.Listener, 0, 3*n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	pick := func() (string, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", fmt.Errorf("config: local config: pick a port: %w", err)
		}
		ls = append(ls, l)
		return l.Addr().String(), nil
	}
	for i := range n {
		ctl, err := pick()
		if err != nil {
			return nil, err
		}
		data, err := pick()
		if err != nil {
			return nil, err
		}
		// Picked too: the default (control port + 200) may be another
		// node's picked port.
		gossip, err := pick()
		if err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, NodeConfig{Name: fmt.Sprintf("node%d", i), Address: ctl, DataAddress: data, GossipAddress: gossip})
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Names of the files WriteFiles writes.
const (
	ConfigFileName = "cluster.yaml"
	SecretFileName = "secret.key"
)

// WriteFiles writes c to dir as ConfigFileName, with the secret in
// SecretFileName (mode 0600) referenced by a relative secret_file, and
// returns the config file's path: what a child process passes to Load.
// c must hold its Secret (as after Validate); c itself is not changed.
func (c *Config) WriteFiles(dir string) (path string, err error) {
	if len(c.Secret) < MinSecretLen {
		return "", fmt.Errorf("config: write files: secret is %d bytes, want at least %d (call Validate first)", len(c.Secret), MinSecretLen)
	}
	if last := c.Secret[len(c.Secret)-1]; last == '\n' || last == '\r' {
		return "", errors.New("config: write files: a secret ending in a newline cannot be stored in a secret file")
	}
	cp := *c
	cp.SecretFile, cp.SecretEnv = SecretFileName, ""
	b, err := cp.Marshal()
	if err != nil {
		return "", err
	}
	secret := append(append(make([]byte, 0, len(c.Secret)+1), c.Secret...), '\n')
	if err := writeFile(filepath.Join(dir, SecretFileName), secret, 0o600); err != nil {
		return "", err
	}
	path = filepath.Join(dir, ConfigFileName)
	if err := writeFile(path, b, 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// writeFile writes b to path with mode perm, also when the file exists with
// another mode.
func writeFile(path string, b []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return fmt.Errorf("config: write files: %w", err)
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("config: write files: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("config: write files: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("config: write files: %w", err)
	}
	return nil
}
