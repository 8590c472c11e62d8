package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/tracing"
)

// startTracing reads the OTEL_* variables (tracing.FromEnv): the node
// option that makes the node trace (none when they ask for no tracing),
// and the function that flushes the last spans, to call before exiting.
func startTracing() ([]actor.Option, func(), error) {
	tp, shutdown, err := tracing.FromEnv(context.Background())
	if err != nil {
		return nil, nil, &exitError{code: 2, err: err}
	}
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "ferry: flushing traces: %v\n", err)
		}
	}
	if tp == nil {
		return nil, stop, nil
	}
	return []actor.Option{actor.WithTracerProvider(tp)}, stop, nil
}
