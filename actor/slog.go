package actor

import (
	"context"
	"log/slog"

	pa "github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapHandler forwards protoactor-go's slog records to the node's zap logger,
// so one logger (and one level) covers the whole node.
type zapHandler struct {
	log   *zap.Logger
	attrs []zap.Field
}

func (h *zapHandler) Enabled(_ context.Context, l slog.Level) bool {
	return h.log.Core().Enabled(zapLevel(l))
}

func (h *zapHandler) Handle(_ context.Context, r slog.Record) error {
	fields := append([]zap.Field(nil), h.attrs...)
	r.Attrs(func(a slog.Attr) bool {
		fields = append(fields, zap.Any(a.Key, a.Value.Any()))
		return true
	})
	if ce := h.log.Check(zapLevel(r.Level), r.Message); ce != nil {
		ce.Write(fields...)
	}
	return nil
}

func (h *zapHandler) WithAttrs(as []slog.Attr) slog.Handler {
	out := &zapHandler{log: h.log, attrs: append([]zap.Field(nil), h.attrs...)}
	for _, a := range as {
		out.attrs = append(out.attrs, zap.Any(a.Key, a.Value.Any()))
	}
	return out
}

func (h *zapHandler) WithGroup(name string) slog.Handler {
	return &zapHandler{log: h.log.Named(name), attrs: h.attrs}
}

func zapLevel(l slog.Level) zapcore.Level {
	switch {
	case l >= slog.LevelError:
		return zapcore.ErrorLevel
	case l >= slog.LevelWarn:
		return zapcore.WarnLevel
	case l >= slog.LevelInfo:
		return zapcore.InfoLevel
	}
	return zapcore.DebugLevel
}

func systemLogger(log *zap.Logger) pa.ConfigOption {
	l := slog.New(&zapHandler{log: log.Named("protoactor")})
	return pa.WithLoggerFactory(func(*pa.ActorSystem) *slog.Logger { return l })
}
