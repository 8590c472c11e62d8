// Package progress prints a progress line while a long command runs (ferry
// bench, the benchmark programs): on stderr, when it is a terminal or when
// asked (--progress), and never on the results' stdout.
//
// The measured loops only add to an atomic counter (Add); a goroutine
// redraws the line a few times a second, so the progress costs the
// measurement nothing it could notice.
//
//	p := progress.New(os.Stderr, *showProgress)
//	defer p.Close()
//	p.Phase(1, 3, "tensorferry rtt", 20000)
//	for ... { p.Add(1) }
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Redraw intervals: on a terminal the line is rewritten in place; on
// anything else (--progress into a file or pipe) a new line is written
// less often.
const (
	terminalEvery = 250 * time.Millisecond
	fileEvery     = 5 * time.Second
)

// Line is a progress line; the nil *Line and one made off do nothing.
type Line struct {
	w    io.Writer
	tty  bool
	done atomic.Int64

	mu      sync.Mutex
	phase   string
	i, n    int
	total   int64
	started time.Time
	width   int // of the last line drawn on a terminal

	stop, stopped chan struct{}
	once          sync.Once
}

// IsTerminal reports whether w is a terminal (a character device).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// New returns a line drawn on w when w is a terminal or force is set;
// otherwise nil (whose methods do nothing). Close stops it.
func New(w io.Writer, force bool) *Line {
	tty := IsTerminal(w)
	if !tty && !force {
		return nil
	}
	l := &Line{w: w, tty: tty, stop: make(chan struct{}), stopped: make(chan struct{})}
	every := fileEvery
	if tty {
		every = terminalEvery
	}
	go l.loop(every)
	return l
}

func (l *Line) loop(every time.Duration) {
	defer close(l.stopped)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.draw()
		}
	}
}

// Phase starts step i of n, named name, of total items (0: not counted).
func (l *Line) Phase(i, n int, name string, total int64) {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.phase, l.i, l.n, l.total, l.started = name, i, n, total, time.Now()
	l.done.Store(0)
	l.mu.Unlock()
	l.draw()
}

// Add counts k items of the phase done.
func (l *Line) Add(k int64) {
	if l != nil {
		l.done.Add(k)
	}
}

// text returns the line's text; mu is held.
func (l *Line) text() string {
	var b strings.Builder
	if l.n > 0 {
		fmt.Fprintf(&b, "[%d/%d] ", l.i, l.n)
	}
	b.WriteString(l.phase)
	elapsed := time.Since(l.started)
	if l.total <= 0 {
		if done := l.done.Load(); done > 0 {
			fmt.Fprintf(&b, " %d done", done)
		}
	} else {
		done := min(l.done.Load(), l.total)
		fmt.Fprintf(&b, " %d/%d (%d%%)", done, l.total, done*100/l.total)
		if done > 0 && done < l.total {
			left := time.Duration(float64(elapsed) * float64(l.total-done) / float64(done))
			fmt.Fprintf(&b, " %v left", left.Round(time.Second))
		}
	}
	fmt.Fprintf(&b, " %v", elapsed.Round(100*time.Millisecond))
	return b.String()
}

func (l *Line) draw() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.phase == "" {
		return
	}
	s := l.text()
	if !l.tty {
		fmt.Fprintln(l.w, s)
		return
	}
	pad := max(0, l.width-len(s))
	l.width = len(s)
	// The cursor goes back to the line's start: what another part of the
	// program writes to the terminal overwrites the line instead of
	// following it.
	fmt.Fprintf(l.w, "\r%s%s\r", s, strings.Repeat(" ", pad))
}

// Writer returns a writer for the log lines printed beside the progress
// line on w: each write clears the line, writes, and draws it again below.
// It returns w itself when l is nil.
func (l *Line) Writer(w io.Writer) io.Writer {
	if l == nil {
		return w
	}
	return lineWriter{l, w}
}

type lineWriter struct {
	l *Line
	w io.Writer
}

func (lw lineWriter) Write(p []byte) (int, error) {
	l := lw.l
	l.mu.Lock()
	if l.tty && l.width > 0 {
		fmt.Fprintf(l.w, "\r%s\r", strings.Repeat(" ", l.width))
		l.width = 0
	}
	n, err := lw.w.Write(p)
	l.mu.Unlock()
	if l.tty {
		l.draw()
	}
	return n, err
}

// Close stops the line and clears it from a terminal.
func (l *Line) Close() {
	if l == nil {
		return
	}
	l.once.Do(func() {
		close(l.stop)
		<-l.stopped
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.tty && l.width > 0 {
			fmt.Fprintf(l.w, "\r%s\r", strings.Repeat(" ", l.width))
		}
	})
}
