// Package etcdtest runs a real etcd server (Debian's etcd-server package,
// which scripts/deps.sh installs) on loopback for tests, as users run one
// for discovery: a single member on free ports with a temporary data
// directory, killed at the end of the test.
package etcdtest

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/internal/poll"
)

// Server is one etcd process.
type Server struct {
	// ClientURL is the URL of its client port (http://127.0.0.1:port).
	ClientURL string

	t       testing.TB
	bin     string
	dataDir string
	logPath string
	peerURL string
	http    *http.Client

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start starts etcd on free loopback ports and waits until it is healthy.
// It skips the test, saying why, when no etcd binary is installed.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("etcd is not installed (Debian package etcd-server; scripts/deps.sh installs it): skipping the tests against a real etcd")
	}
	dir := t.TempDir()
	s := &Server{
		t: t, bin: bin, logPath: filepath.Join(dir, "etcd.log"),
		http: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second},
	}
	t.Cleanup(func() {
		s.Kill()
		if t.Failed() {
			if b, err := os.ReadFile(s.logPath); err == nil {
				t.Logf("etcd's log:\n%s", b[max(0, len(b)-8000):])
			}
		}
	})
	// A port found free may be taken by another test's process before
	// etcd binds it: etcd then exits at once, and it runs again on other
	// ports, in a data directory of its own.
	for attempt := 1; ; attempt++ {
		s.ClientURL, s.peerURL = "http://"+freeAddr(t), "http://"+freeAddr(t)
		s.dataDir = filepath.Join(dir, "data"+strconv.Itoa(attempt))
		logged := s.logSize()
		if s.run() {
			return s
		}
		if attempt == maxBindAttempts || !s.loggedSince(logged, "address already in use") {
			t.Fatalf("etcd exited: see %s", s.logPath)
		}
		t.Logf("etcd found a port taken (attempt %d of %d): trying others", attempt, maxBindAttempts)
	}
}

// freeAddr is FreeAddr; a test of Start's retry replaces it.
var freeAddr = FreeAddr

// maxBindAttempts bounds the runs of Start that find a port taken.
const maxBindAttempts = 5

// logSize is the length of etcd's log so far.
func (s *Server) logSize() int64 {
	fi, err := os.Stat(s.logPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// loggedSince reports whether etcd's log holds what past its first from
// bytes.
func (s *Server) loggedSince(from int64, what string) bool {
	b, err := os.ReadFile(s.logPath)
	if err != nil || int64(len(b)) < from {
		return false
	}
	return bytes.Contains(b[from:], []byte(what))
}

// FreeAddr returns a loopback host:port that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Restart runs etcd (again, on the same data directory and ports after
// Kill) and waits until it answers /health.
func (s *Server) Restart() {
	s.t.Helper()
	if !s.run() {
		s.t.Fatalf("etcd exited: see %s", s.logPath)
	}
}

// run runs etcd and waits until it answers /health (true) or exits
// (false).
func (s *Server) run() bool {
	s.t.Helper()
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(s.bin,
		"--name", "test",
		"--data-dir", s.dataDir,
		"--listen-client-urls", s.ClientURL,
		"--advertise-client-urls", s.ClientURL,
		"--listen-peer-urls", s.peerURL,
		"--initial-advertise-peer-urls", s.peerURL,
		"--initial-cluster", "test="+s.peerURL,
		"--heartbeat-interval", "20",
		"--election-timeout", "200",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start etcd: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	// A health check in flight ends when etcd exits (the port may be
	// another process's, which need not answer).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	healthy := false
	poll.Until(s.t, "etcd answers /health or exits", func() bool {
		select {
		case <-exited:
			return true
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.ClientURL+"/health", nil)
		if err != nil {
			s.t.Fatal(err)
		}
		resp, err := s.http.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var h struct{ Health string }
		healthy = resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&h) == nil && h.Health == "true"
		return healthy
	})
	if !healthy {
		s.mu.Lock()
		s.cmd = nil
		s.mu.Unlock()
	}
	return healthy
}

// Kill kills etcd (SIGKILL: no goodbye to its clients) and waits for it.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// Delete deletes key, as an operator (or a lease's expiry) would.
func (s *Server) Delete(key string) {
	s.t.Helper()
	s.Do("/v3/kv/deleterange", map[string]any{"key": []byte(key)}, nil)
}

// Put writes key = value with no lease, as an operator (or anyone who may
// write under the prefix) would.
func (s *Server) Put(key string, value []byte) {
	s.t.Helper()
	s.Do("/v3/kv/put", map[string]any{"key": []byte(key), "value": value}, nil)
}

// Revision returns etcd's current revision.
func (s *Server) Revision() int64 {
	s.t.Helper()
	var r struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	s.Do("/v3/kv/range", map[string]any{"key": []byte("\x00")}, &r)
	rev, err := strconv.ParseInt(r.Header.Revision, 10, 64)
	if err != nil {
		s.t.Fatalf("revision %q: %v", r.Header.Revision, err)
	}
	return rev
}

// Compact drops the history up to rev: a watch from before it fails.
func (s *Server) Compact(rev int64) {
	s.t.Helper()
	s.Do("/v3/kv/compaction", map[string]any{"revision": strconv.FormatInt(rev, 10), "physical": true}, nil)
}

// Do posts the JSON of body to path of etcd's HTTP/JSON gateway and
// decodes the answer into out (when not nil), failing the test on any
// error.
func (s *Server) Do(path string, body, out any) {
	s.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := s.http.Post(s.ClientURL+path, "application/json", bytes.NewReader(b))
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("%s: %s", path, resp.Status)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			s.t.Fatalf("%s: %v", path, err)
		}
	}
}
