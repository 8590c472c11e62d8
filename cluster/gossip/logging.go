package gossip

import (
	"bytes"
	"log"
	"sync"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newStdLogger returns a *log.Logger for memberlist whose lines go to l at
// the level of their "[LEVEL]" prefix, until the writer is stopped.
func newStdLogger(l *zap.Logger) (*log.Logger, *zapWriter) {
	w := &zapWriter{l: l.WithOptions(zap.AddCallerSkip(3))}
	return log.New(w, "", 0), w
}

// zapWriter turns memberlist's log lines ("[WARN] memberlist: text") into
// zap entries. memberlist logs a peer's network failures at [ERR]: they are
// warnings for this node, which goes on; [DEBUG] and [INFO] keep theirs.
//
// memberlist's loops may still log as they wind down after Shutdown; stop
// drops those lines, so that nothing is logged after Shutdown returns.
type zapWriter struct {
	l       *zap.Logger
	mu      sync.RWMutex
	stopped bool
}

// stop drops every later line; it returns once no line is being written.
func (w *zapWriter) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
}

func (w *zapWriter) Write(p []byte) (int, error) {
	n := len(p)
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.stopped {
		return n, nil
	}
	p = bytes.TrimRight(p, "\n")
	lvl := zapcore.InfoLevel
	for _, pre := range []struct {
		tag string
		lvl zapcore.Level
	}{
		{"[DEBUG] ", zapcore.DebugLevel},
		{"[INFO] ", zapcore.InfoLevel},
		{"[WARN] ", zapcore.WarnLevel},
		{"[ERR] ", zapcore.WarnLevel},
		{"[ERROR] ", zapcore.WarnLevel},
	} {
		if rest, ok := bytes.CutPrefix(p, []byte(pre.tag)); ok {
			p, lvl = rest, pre.lvl
			break
		}
	}
	if w.l.Core().Enabled(lvl) {
		if ce := w.l.Check(lvl, string(bytes.TrimPrefix(p, []byte("memberlist: ")))); ce != nil {
			ce.Write()
		}
	}
	return n, nil
}
