package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/exp/trace"
)

// event is one goroutine event of either process.
type event struct {
	at   int64 // ns, CLOCK_MONOTONIC
	line string
}

// marks is the --mark flag: NAME=REGEXP, repeated.
type marks []mark

type mark struct {
	name string
	re   *regexp.Regexp
}

func (m *marks) String() string { return fmt.Sprint(len(*m)) }

func (m *marks) Set(s string) error {
	name, expr, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return errors.New("want NAME=REGEXP")
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return err
	}
	*m = append(*m, mark{name, re})
	return nil
}

func main() {
	sender := flag.String("sender", "", "execution trace of the sending process")
	receiver := flag.String("receiver", "", "execution trace of the receiving process (default: SENDER.receiver)")
	from := flag.Int("from", 0, "timeline: index of the first event printed")
	n := flag.Int("n", 200, "timeline: events printed")
	cycle := flag.String("cycle", "", "breakdown: regular expression of the event that starts a round trip")
	var ms marks
	flag.Var(&ms, "mark", "breakdown: NAME=REGEXP, the event ending a stage (repeat, in order)")
	flag.Parse()
	if *sender == "" {
		fmt.Fprintln(os.Stderr, "traceline: --sender is required")
		os.Exit(2)
	}
	if *receiver == "" {
		*receiver = *sender + ".receiver"
	}
	var evs []event
	for _, f := range []struct{ path, who string }{{*sender, "S"}, {*receiver, "R"}} {
		var err error
		if evs, err = load(f.path, f.who, evs); err != nil {
			fmt.Fprintln(os.Stderr, "traceline:", err)
			os.Exit(1)
		}
	}
	slices.SortStableFunc(evs, func(a, b event) int { return int(a.at - b.at) })
	if *cycle == "" {
		timeline(os.Stdout, evs, *from, *n)
		return
	}
	re, err := regexp.Compile(*cycle)
	if err != nil {
		fmt.Fprintln(os.Stderr, "traceline: --cycle:", err)
		os.Exit(2)
	}
	stages, cycles := breakdown(evs, re, ms)
	fmt.Printf("%d round trips with every mark\n", cycles)
	fmt.Printf("%-16s %10s %10s\n", "stage", "p50 µs", "p90 µs")
	var total float64
	for _, s := range stages {
		p50, p90 := quantile(s.d, 0.5), quantile(s.d, 0.9)
		total += p50
		fmt.Printf("%-16s %10.1f %10.1f\n", s.name, us(p50), us(p90))
	}
	fmt.Printf("%-16s %10.1f\n", "sum of p50", us(total))
}

func us(ns float64) float64 { return ns / 1e3 }

// load appends the goroutine events of the trace at path, tagged who.
func load(path, who string, evs []event) ([]event, error) {
	f, err := os.Open(path)
	if err != nil {
		return evs, err
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		return evs, fmt.Errorf("%s: %w", path, err)
	}
	for {
		e, err := r.ReadEvent()
		if err == io.EOF {
			return evs, nil
		}
		if err != nil {
			return evs, fmt.Errorf("%s: %w", path, err)
		}
		if line, ok := describe(e); ok {
			evs = append(evs, event{int64(e.Time()), fmt.Sprintf("%s %s", who, line)})
		}
	}
}

// describe renders the goroutine transitions worth seeing on a latency
// path: blocking (with its reason and stack), syscalls, wake-ups,
// creation and running; and the program's own runtime/trace.Log events.
func describe(e trace.Event) (string, bool) {
	if e.Kind() == trace.EventLog {
		// runtime/trace.Log calls, for stages a program marks itself.
		l := e.Log()
		return fmt.Sprintf("g%-6d log %s %s", e.Goroutine(), l.Category, l.Message), true
	}
	if e.Kind() != trace.EventStateTransition {
		return "", false
	}
	st := e.StateTransition()
	if st.Resource.Kind != trace.ResourceGoroutine {
		return "", false
	}
	from, to := st.Goroutine()
	g := fmt.Sprintf("g%-6d", st.Resource.Goroutine())
	switch {
	case to == trace.GoWaiting || to == trace.GoSyscall:
		return fmt.Sprintf("%s %v->%v [%s] %s", g, from, to, st.Reason, frames(e.Stack(), 5)), true
	case from == trace.GoWaiting && to == trace.GoRunnable:
		return fmt.Sprintf("%s wake by g%d", g, e.Goroutine()), true
	case from == trace.GoNotExist && to == trace.GoRunnable:
		return fmt.Sprintf("%s created by g%d %s", g, e.Goroutine(), frames(e.Stack(), 3)), true
	case from == trace.GoSyscall:
		return fmt.Sprintf("%s syscall end ->%v", g, to), true
	case to == trace.GoRunning:
		return g + " run", true
	}
	return "", false
}

// frames is the top n frames of st, innermost first, without package paths.
func frames(st trace.Stack, n int) string {
	var parts []string
	for f := range st.Frames() {
		fn := f.Func
		if i := strings.LastIndex(fn, "/"); i >= 0 {
			fn = fn[i+1:]
		}
		parts = append(parts, fn)
		if len(parts) == n {
			break
		}
	}
	return strings.Join(parts, " < ")
}

func timeline(w io.Writer, evs []event, from, n int) {
	if from < 0 || from >= len(evs) {
		fmt.Fprintf(w, "no events from %d (%d in all)\n", from, len(evs))
		return
	}
	end := min(from+n, len(evs))
	t0 := evs[from].at
	for _, e := range evs[from:end] {
		fmt.Fprintf(w, "%12.1f %s\n", float64(e.at-t0)/1e3, e.line)
	}
}

// stage is one mark's durations, one per complete cycle.
type stage struct {
	name string
	d    []float64 // ns
}

// breakdown splits evs into cycles, each starting at an event matching
// cycle, and finds in each the marks in order; it returns each stage's
// durations over the cycles where every mark was found, and their count.
func breakdown(evs []event, cycle *regexp.Regexp, ms marks) ([]stage, int) {
	stages := make([]stage, len(ms))
	for i, m := range ms {
		stages[i].name = m.name
	}
	var starts []int
	for i, e := range evs {
		if cycle.MatchString(e.line) {
			starts = append(starts, i)
		}
	}
	complete := 0
	for k, s := range starts {
		end := len(evs)
		if k+1 < len(starts) {
			end = starts[k+1]
		}
		at := make([]int64, 0, len(ms))
		prev, j := evs[s].at, s+1
		for _, m := range ms {
			for j < end && !m.re.MatchString(evs[j].line) {
				j++
			}
			if j == end {
				break
			}
			at = append(at, evs[j].at-prev)
			prev = evs[j].at
			j++
		}
		if len(at) != len(ms) {
			continue
		}
		complete++
		for i, d := range at {
			stages[i].d = append(stages[i].d, float64(d))
		}
	}
	return stages, complete
}

// quantile is the q-quantile of d (nearest rank); 0 when d is empty.
func quantile(d []float64, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
