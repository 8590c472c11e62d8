package progress

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer is a bytes.Buffer safe for the line's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestOffUnlessTerminalOrForced(t *testing.T) {
	var b syncBuffer
	l := New(&b, false)
	if l != nil {
		t.Fatal("a line on a buffer without force")
	}
	l.Phase(1, 2, "x", 10) // nil: does nothing
	l.Add(1)
	l.Close()
	if b.String() != "" {
		t.Fatalf("wrote %q", b.String())
	}
}

func TestForcedLineShowsPhaseAndCount(t *testing.T) {
	var b syncBuffer
	l := New(&b, true)
	l.Phase(2, 3, "tensorferry rtt", 200)
	l.Add(50)
	l.draw()
	l.Close()
	out := b.String()
	if !strings.Contains(out, "[2/3] tensorferry rtt 0/200 (0%)") || !strings.Contains(out, "[2/3] tensorferry rtt 50/200 (25%)") {
		t.Fatalf("output %q", out)
	}
	if strings.Contains(out, "\r") {
		t.Fatalf("carriage return written to a non-terminal: %q", out)
	}
}

func TestWriterKeepsLogLinesApart(t *testing.T) {
	var b syncBuffer
	l := New(&b, true)
	l.tty = true // draw as on a terminal
	l.Phase(1, 1, "run", 0)
	l.Add(3)
	w := l.Writer(&b)
	if _, err := w.Write([]byte("a result\n")); err != nil {
		t.Fatal(err)
	}
	l.Close()
	out := b.String()
	// The line is drawn, cleared before the log line, drawn again after it.
	i := strings.Index(out, "a result\n")
	if i < 0 || !strings.Contains(out[:i], "[1/1] run") || !strings.HasSuffix(out[:i], "\r") || !strings.Contains(out[i:], "run 3 done") {
		t.Fatalf("output %q", out)
	}
	if New(&b, false).Writer(&b) != &b {
		t.Fatal("a nil line's writer is not the writer itself")
	}
}
