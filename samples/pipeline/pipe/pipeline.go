package pipe

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/tensor"
)

// BatchResult is what happened to one micro-batch.
type BatchResult struct {
	Batch   int
	Latency time.Duration // from sending the input to stage 1 to stage 3's answer
	OK      bool          // the output equals Reference bit for bit
	Err     error         // why the micro-batch failed, or what differed
}

// Result is a pipeline run.
type Result struct {
	Batches []BatchResult
	Elapsed time.Duration
	Failed  int // micro-batches that failed or differed from the reference
}

// batchTimeout bounds one micro-batch's trip through the pipeline.
const batchTimeout = time.Minute

// Run spawns stage i+1 on nodes[i] (three distinct, connected nodes), sends
// cfg.Batches micro-batches through the pipeline from nodes[2], at most
// cfg.InFlight at a time, checks every output against Reference, stops the
// stages and returns what happened. progress, if not nil, is called (from
// several goroutines, one call at a time) as each micro-batch completes.
func Run(ctx context.Context, nodes []*actor.Node, cfg Config, progress func(BatchResult)) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(nodes) != 3 || nodes[0].Name() == nodes[1].Name() || nodes[1].Name() == nodes[2].Name() || nodes[0].Name() == nodes[2].Name() {
		return nil, errors.New("pipe: want three distinct nodes")
	}
	stops := make([]func(), 0, 3)
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	var next *pa.PID
	for i := 2; i >= 0; i-- {
		// A stage's activations live on its node's first device (a GPU
		// when the config gives one) and travel GPU to GPU; its arithmetic
		// runs on the host (see stage.hostValues).
		s := &stage{node: nodes[i], cfg: cfg, w: Weights(&cfg, i+1), next: next, dev: nodes[i].Device()}
		props := pa.PropsFromProducer(func() pa.Actor { return s }, nodes[i].WithDevice(s.dev))
		pid, err := nodes[i].Root().SpawnNamed(props, fmt.Sprintf("pipe-stage%d", i+1))
		if err != nil {
			return nil, fmt.Errorf("pipe: spawn stage %d: %w", i+1, err)
		}
		root := nodes[i].Root()
		stops = append(stops, func() { _ = root.StopFuture(pid).Wait() })
		next = nodes[0].PID(nodes[i].Name(), pid.Id)
	}
	first := next
	driver := nodes[2]

	res := &Result{Batches: make([]BatchResult, cfg.Batches)}
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex // serializes progress
		sem = make(chan struct{}, cfg.InFlight)
	)
	start := time.Now()
	var err error
loop:
	for b := range cfg.Batches {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			err = fmt.Errorf("pipe: %w", ctx.Err())
			break loop
		}
		x, xerr := tensor.FromFloat32s(InputBatch(&cfg, b), tensor.Shape{int64(cfg.Rows), int64(cfg.Dim)})
		if xerr != nil {
			<-sem
			err = xerr
			break
		}
		sent := time.Now()
		f := driver.Root().RequestFuture(first, &Input{Batch: b, X: x}, batchTimeout)
		wg.Add(1)
		go func() {
			defer wg.Done()
			reply, ferr := f.Result()
			r := BatchResult{Batch: b, Latency: time.Since(sent)}
			<-sem
			r.Err = check(&cfg, b, reply, ferr)
			r.OK = r.Err == nil
			// x was lent to stage 1's node: free it once that node fetched it.
			wctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			if werr := x.WaitReleased(wctx); werr == nil {
				_ = x.Free()
			}
			cancel()
			res.Batches[b] = r
			if progress != nil {
				mu.Lock()
				progress(r)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	for _, r := range res.Batches {
		if !r.OK {
			res.Failed++
		}
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// check compares a reply with the reference output of micro-batch b and
// frees the reply's tensor.
func check(cfg *Config, b int, reply any, err error) error {
	if err != nil {
		return err
	}
	out, ok := reply.(*Output)
	if !ok {
		return fmt.Errorf("pipe: batch %d: answer %T", b, reply)
	}
	if out.Y != nil {
		defer out.Y.Free()
	}
	if out.Err != "" {
		return errors.New(out.Err)
	}
	if out.Batch != b {
		return fmt.Errorf("pipe: batch %d: answer for batch %d", b, out.Batch)
	}
	got, err := values(out.Y, cfg.Rows*cfg.Out)
	if err != nil {
		return fmt.Errorf("pipe: batch %d: %w", b, err)
	}
	want := Reference(cfg, b)
	for i := range want {
		if got[i] != want[i] {
			return fmt.Errorf("pipe: batch %d: output[%d] = %v, reference %v", b, i, got[i], want[i])
		}
	}
	return nil
}
