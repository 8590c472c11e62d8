package discovery

import (
	"bytes"
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

// etcdServer is a real etcd (Debian's etcd-server package) on loopback,
// killed at the end of the test.
type etcdServer struct {
	t          testing.TB
	bin        string
	dataDir    string
	logPath    string
	clientURL  string
	peerURL    string
	mu         sync.Mutex
	cmd        *exec.Cmd
	exited     chan struct{}
	httpClient *http.Client
}

// startEtcd starts etcd on free loopback ports, skipping the test when no
// etcd binary is installed (scripts/deps.sh installs it).
func startEtcd(t testing.TB) *etcdServer {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("etcd is not installed (Debian package etcd-server; scripts/deps.sh installs it): skipping the tests against a real etcd")
	}
	dir := t.TempDir()
	s := &etcdServer{
		t: t, bin: bin, dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "etcd.log"),
		clientURL:  "http://" + freeAddr(t),
		peerURL:    "http://" + freeAddr(t),
		httpClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second},
	}
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			if b, err := os.ReadFile(s.logPath); err == nil {
				t.Logf("etcd's log:\n%s", b[max(0, len(b)-8000):])
			}
		}
	})
	s.start()
	return s
}

// freeAddr returns a loopback host:port free a moment ago.
func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// start runs etcd (again, on the same data dir after kill) and waits
// until it answers /health.
func (s *etcdServer) start() {
	s.t.Helper()
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(s.bin,
		"--name", "test",
		"--data-dir", s.dataDir,
		"--listen-client-urls", s.clientURL,
		"--advertise-client-urls", s.clientURL,
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
	poll.Until(s.t, "etcd answers /health", func() bool {
		select {
		case <-exited:
			s.t.Fatalf("etcd exited: see %s", s.logPath)
		default:
		}
		resp, err := s.httpClient.Get(s.clientURL + "/health")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var h struct{ Health string }
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&h) == nil && h.Health == "true"
	})
}

// kill kills etcd (SIGKILL: no goodbye to its clients) and waits for it.
func (s *etcdServer) kill() {
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

// do posts body to path of etcd's gateway and decodes the answer into out
// (when not nil), for the test's own writes.
func (s *etcdServer) do(path string, body any, out any) {
	s.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := s.httpClient.Post(s.clientURL+path, "application/json", bytes.NewReader(b))
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

// put writes key = value with no lease.
func (s *etcdServer) put(key string, value []byte) {
	s.t.Helper()
	s.do("/v3/kv/put", map[string]any{"key": []byte(key), "value": value}, nil)
}

// revision returns etcd's current revision.
func (s *etcdServer) revision() int64 {
	s.t.Helper()
	var r struct {
		Header header `json:"header"`
	}
	s.do("/v3/kv/range", map[string]any{"key": []byte("\x00")}, &r)
	return int64(r.Header.Revision)
}

// compact drops the history up to rev.
func (s *etcdServer) compact(rev int64) {
	s.t.Helper()
	s.do("/v3/kv/compaction", map[string]any{"revision": strconv.FormatInt(rev, 10), "physical": true}, nil)
}
