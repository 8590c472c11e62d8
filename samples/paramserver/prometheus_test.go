package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// prometheusBinary finds Prometheus, installing Debian's package when it
// is missing and this process may (root, apt-get); it returns why not
// otherwise.
func prometheusBinary(t *testing.T) (string, error) {
	if p, err := exec.LookPath("prometheus"); err == nil {
		return p, nil
	}
	if testing.Short() {
		return "", errors.New("prometheus is not installed (not installing it in -short mode)")
	}
	apt, err := exec.LookPath("apt-get")
	if err != nil {
		return "", errors.New("prometheus is not installed and there is no apt-get to install it")
	}
	var cmd []string
	switch {
	case os.Geteuid() == 0:
		cmd = []string{apt}
	default:
		sudo, err := exec.LookPath("sudo")
		if err != nil || exec.Command(sudo, "-n", "true").Run() != nil {
			return "", errors.New("prometheus is not installed, and installing it needs root (no passwordless sudo)")
		}
		cmd = []string{sudo, "-n", apt}
	}
	t.Log("installing Debian's prometheus package")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, cmd[0], append(cmd[1:], "install", "-y", "-qq", "--no-install-recommends", "prometheus")...)
	c.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := c.CombinedOutput(); err != nil {
		return "", fmt.Errorf("apt-get install prometheus: %v: %s", err, lastLines(out, 5))
	}
	return exec.LookPath("prometheus")
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// promServer is a Prometheus server run by a test.
type promServer struct {
	base string // http://127.0.0.1:port
	cmd  *exec.Cmd
	done chan error
	log  *strings.Builder
}

// startPrometheus runs Prometheus on a free loopback port with its data
// in a temporary directory, scraping target every 100ms, and waits until it
// is ready.
func startPrometheus(t *testing.T, bin, target string) *promServer {
	t.Helper()
	dir := t.TempDir()
	conf := fmt.Sprintf(`global:
  scrape_interval: 100ms
  scrape_timeout: 100ms
scrape_configs:
  - job_name: tensorferry
    static_configs:
      - targets: [%q]
`, target)
	confPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// A port found free may be taken by another process before Prometheus
	// binds it: Prometheus then exits at once, and it runs again on
	// another port.
	for attempt := 1; ; attempt++ {
		p, exited := runPrometheus(t, bin, confPath, filepath.Join(dir, fmt.Sprintf("data%d", attempt)))
		if !exited {
			return p
		}
		if attempt == 5 || !strings.Contains(p.log.String(), "address already in use") {
			err := <-p.done
			p.done <- err // for the cleanup's wait
			t.Fatalf("prometheus exited: %v\n%s", err, p.log.String())
		}
		t.Logf("prometheus found its port taken (attempt %d of 5): trying another", attempt)
	}
}

// readyClient asks whether Prometheus is ready; a port another process
// took need not answer.
var readyClient = &http.Client{Timeout: 2 * time.Second}

// runPrometheus runs Prometheus on a loopback port found free and waits
// until it is ready (exited false) or has exited (true; its error is in
// p.done).
func runPrometheus(t *testing.T, bin, confPath, dataDir string) (p *promServer, exited bool) {
	t.Helper()
	port := freePort(t)
	p = &promServer{base: fmt.Sprintf("http://127.0.0.1:%d", port), done: make(chan error, 1), log: &strings.Builder{}}
	p.cmd = exec.Command(bin,
		"--config.file="+confPath,
		"--storage.tsdb.path="+dataDir,
		"--web.listen-address="+fmt.Sprintf("127.0.0.1:%d", port),
		"--log.level=warn")
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting prometheus: %v", err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := until(ctx, func() bool {
		select {
		case err := <-p.done:
			p.done <- err
			return true
		default:
		}
		resp, err := readyClient.Get(p.base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	select {
	case err := <-p.done:
		p.done <- err
		return p, true
	default:
	}
	if err != nil {
		t.Fatalf("prometheus not ready: %v\n%s", err, p.log.String())
	}
	return p, false
}

// query evaluates expr now and returns its single value; ok is false when
// the result is empty.
func (p *promServer) query(expr string) (v float64, ok bool, err error) {
	resp, err := http.Get(p.base + "/api/v1/query?" + url.Values{"query": {expr}}.Encode())
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, false, err
	}
	var r struct {
		Status string
		Error  string
		Data   struct {
			ResultType string
			Result     []struct {
				Value [2]any
			}
		}
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return 0, false, fmt.Errorf("%v: %s", err, body)
	}
	if r.Status != "success" {
		return 0, false, fmt.Errorf("query %q: %s", expr, r.Error)
	}
	switch len(r.Data.Result) {
	case 0:
		return 0, false, nil
	case 1:
	default:
		return 0, false, fmt.Errorf("query %q: %d series, want 1", expr, len(r.Data.Result))
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	v, err = strconv.ParseFloat(s, 64)
	return v, err == nil, err
}

// waitValue polls expr until it has a value satisfying ok.
func (p *promServer) waitValue(t *testing.T, expr string, ok func(float64) bool) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var last float64
	var lastErr error
	err := until(ctx, func() bool {
		v, has, err := p.query(expr)
		last, lastErr = v, err
		return err == nil && has && ok(v)
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v (last value %v, error %v)\n%s", expr, err, last, lastErr, p.log.String())
	}
	return last
}

// A real Prometheus server scrapes the embedded 3-node cluster while the
// parameter server trains; once a scrape taken after the run is in, the
// staging bytes it recorded (all nodes) equal those the sample reports.
func TestPrometheusScrapesTheParameterServer(t *testing.T) {
	bin, err := prometheusBinary(t)
	if err != nil {
		t.Skip(err)
	}
	o, err := parse([]string{"--dim", "40000", "--steps", "15", "--json", "--metrics-address", "127.0.0.1:0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := startEmbedded(ctx, o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer c.stop()
	p := startPrometheus(t, bin, c.metrics.Addr())
	// The cluster is scraped before the run starts: the counters exist.
	p.waitValue(t, `count(tensorferry_peers_up)`, func(v float64) bool { return v == 3 })

	res, err := c.drive(ctx, o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	end := time.Now()
	want := res.Channels["staging"].Bytes
	if want == 0 {
		t.Fatalf("the run moved nothing over staging: %+v", res.Channels)
	}
	// Wait for a scrape that started after the run ended (every sample's
	// timestamp is its scrape's start).
	p.waitValue(t, `min(timestamp(tensorferry_messages_sent_total))`, func(v float64) bool { return v > float64(end.UnixMilli())/1000 })
	got, has, err := p.query(`sum(tensorferry_transfer_bytes_total{channel="staging",direction="in"})`)
	if err != nil || !has {
		t.Fatalf("staging bytes: %v (has %v)", err, has)
	}
	t.Logf("staging: Prometheus %v bytes, the sample %d bytes in %d transfers", got, want, res.Channels["staging"].Transfers)
	if int64(got) != want {
		t.Errorf("Prometheus has %v staging bytes fetched, the sample reports %d", got, want)
	}
	// What the owners served over staging is what the fetchers fetched.
	served, _, err := p.query(`sum(tensorferry_transfer_bytes_total{channel="staging",direction="out"})`)
	if err != nil || int64(served) != want {
		t.Errorf("staging bytes served %v (%v), want %d", served, err, want)
	}
	n, _, err := p.query(`sum(tensorferry_transfer_duration_seconds_count{channel="staging"})`)
	if err != nil || int64(n) != res.Channels["staging"].Transfers {
		t.Errorf("staging latency histogram counts %v transfers (%v), the sample reports %d", n, err, res.Channels["staging"].Transfers)
	}
	sent, _, err := p.query(`sum(tensorferry_messages_sent_total)`)
	// Finish's replies are sent after each node reported its count.
	if err != nil || int64(sent) < res.MessagesSent {
		t.Errorf("Prometheus has %v messages sent (%v), the sample reports %d", sent, err, res.MessagesSent)
	}
}

// until polls cond every 20ms (each poll is an HTTP request to a server
// that needs time to start and scrape) until it holds or ctx is done.
func until(ctx context.Context, cond func() bool) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
