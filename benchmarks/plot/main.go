package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/benchmarks/internal/size"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// inputs collects repeated --in flags.
type inputs []string

func (i *inputs) String() string     { return strings.Join(*i, ",") }
func (i *inputs) Set(v string) error { *i = append(*i, v); return nil }

// settings are what one plot is drawn from.
type settings struct {
	in     []string
	out    string
	bench  string // "" keeps every program's results
	metric string
	title  string
	logY   bool
	paths  []string // paths to draw; nil draws all
	// atSize, when set, draws the metric against the number of receivers
	// (Result.Receivers) at this size instead of against the size;
	// results without receivers at that size (NCCL's) become flat lines.
	atSize int64
}

func main() {
	var s settings
	var in inputs
	flag.Var(&in, "in", "a file of JSON lines (repeat for several)")
	flag.StringVar(&s.out, "out", "bench.svg", "output file; .svg, .png or .pdf")
	flag.StringVar(&s.bench, "bench", "", "keep the results of this program: transfer or gpu (default: all)")
	flag.StringVar(&s.metric, "metric", report.GBps, "the metric to draw")
	flag.StringVar(&s.title, "title", "", "the plot's title (default: from --bench)")
	flag.BoolVar(&s.logY, "logy", false, "logarithmic y axis")
	paths := flag.String("paths", "", "comma-separated paths to draw (default: all)")
	receivers := flag.String("receivers-at", "", "draw the metric against the number of receivers at this size (fan-out), e.g. 1GiB")
	flag.Parse()
	s.in = in
	if *receivers != "" {
		n, err := size.Parse(*receivers)
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "plot: --receivers-at %q: want a size\n", *receivers)
			os.Exit(2)
		}
		s.atSize = int64(n)
	}
	if *paths != "" {
		s.paths = strings.Split(*paths, ",")
	}
	if err := draw1(s); err != nil {
		fmt.Fprintf(os.Stderr, "plot: %v\n", err)
		os.Exit(1)
	}
}

// draw1 reads s.in and writes the plot to s.out.
func draw1(s settings) error {
	if len(s.in) == 0 {
		return errors.New("plot: no --in file")
	}
	var all []report.Result
	for _, name := range s.in {
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		rs, err := report.Read(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("plot: %s: %w", name, err)
		}
		all = append(all, rs...)
	}
	lines := series(all, s.bench, s.metric)
	if s.atSize > 0 {
		lines = byReceivers(all, s.bench, s.metric, s.atSize)
	}
	if s.paths != nil {
		lines = slices.DeleteFunc(lines, func(l line) bool { return !slices.Contains(s.paths, l.path) })
	}
	if len(lines) == 0 {
		return fmt.Errorf("plot: no %q results of bench %q with a size in %s", s.metric, s.bench, strings.Join(s.in, ", "))
	}
	p, err := build(lines, s)
	if err != nil {
		return err
	}
	ext := strings.TrimPrefix(strings.ToLower(filepath.Ext(s.out)), ".")
	if !slices.Contains([]string{"svg", "png", "pdf"}, ext) {
		return fmt.Errorf("plot: output %q: want a .svg, .png or .pdf file", s.out)
	}
	if err := p.Save(8*vg.Inch, 5*vg.Inch, s.out); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

// line is one path's points, sorted by size.
type line struct {
	path string
	pts  plotter.XYs
}

// series groups the results of bench (with bench "gpu", also the NCCL
// script's) with the metric and a size into one line per path, in the order
// paths first appear; of several results at one path and size the last
// wins.
func series(rs []report.Result, bench, metric string) []line {
	var order []string
	byPath := map[string]map[int64]float64{}
	for _, r := range rs {
		keep := bench == "" || r.Bench == bench || (bench == "gpu" && r.Bench == "nccl")
		if !keep || r.Metric != metric || r.Size <= 0 || r.Value <= 0 || math.IsInf(r.Value, 0) || math.IsNaN(r.Value) {
			continue
		}
		m, ok := byPath[r.Path]
		if !ok {
			m = map[int64]float64{}
			byPath[r.Path] = m
			order = append(order, r.Path)
		}
		m[r.Size] = r.Value
	}
	var out []line
	for _, path := range order {
		sizes := make([]int64, 0, len(byPath[path]))
		for size := range byPath[path] {
			sizes = append(sizes, size)
		}
		slices.Sort(sizes)
		l := line{path: path}
		for _, size := range sizes {
			l.pts = append(l.pts, plotter.XY{X: float64(size), Y: byPath[path][size]})
		}
		out = append(out, l)
	}
	return out
}

// byReceivers is series against the number of receivers at one size: a
// line per path of the results with receivers, and for each path without
// (a baseline such as NCCL's) a flat line across their range.
func byReceivers(rs []report.Result, bench, metric string, at int64) []line {
	var order []string
	byPath := map[string]map[int]float64{}
	flat := map[string]float64{}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rs {
		keep := bench == "" || r.Bench == bench || (bench == "gpu" && r.Bench == "nccl")
		if !keep || r.Metric != metric || r.Size != at || r.Value <= 0 || math.IsInf(r.Value, 0) || math.IsNaN(r.Value) {
			continue
		}
		if _, ok := byPath[r.Path]; !ok {
			if _, ok := flat[r.Path]; !ok {
				order = append(order, r.Path)
			}
		}
		if r.Receivers <= 0 {
			flat[r.Path] = r.Value
			continue
		}
		m, ok := byPath[r.Path]
		if !ok {
			m = map[int]float64{}
			byPath[r.Path] = m
		}
		m[r.Receivers] = r.Value
		lo, hi = min(lo, float64(r.Receivers)), max(hi, float64(r.Receivers))
	}
	var out []line
	for _, path := range order {
		l := line{path: path}
		if m, ok := byPath[path]; ok {
			ns := make([]int, 0, len(m))
			for n := range m {
				ns = append(ns, n)
			}
			slices.Sort(ns)
			for _, n := range ns {
				l.pts = append(l.pts, plotter.XY{X: float64(n), Y: m[n]})
			}
		} else if hi >= lo {
			l.pts = plotter.XYs{{X: lo, Y: flat[path]}, {X: hi, Y: flat[path]}}
		}
		if len(l.pts) > 0 {
			out = append(out, l)
		}
	}
	return out
}

// build makes the plot of lines.
func build(lines []line, s settings) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = s.title
	if p.Title.Text == "" {
		p.Title.Text = map[string]string{
			"transfer": "Tensor messages on loopback vs raw TCP",
			"gpu":      "GPU0 → GPU1: tensorferry vs cuMemcpyPeer, NCCL, TCP",
		}[s.bench]
	}
	p.X.Label.Text = "message size (bytes)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = sizeTicks{}
	if s.atSize > 0 {
		p.X.Label.Text = "receivers, " + size.Format(int(s.atSize)) + " each"
		p.X.Scale = plot.LinearScale{}
		p.X.Tick.Marker = plot.DefaultTicks{}
	}
	p.Y.Label.Text = "bandwidth (GB/s)"
	if s.metric != report.GBps {
		p.Y.Label.Text = s.metric
	}
	if s.logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	for i, l := range lines {
		ln, pts, err := plotter.NewLinePoints(l.pts)
		if err != nil {
			return nil, fmt.Errorf("plot: %s: %w", l.path, err)
		}
		ln.Color = plotutil.Color(i)
		ln.Dashes = plotutil.Dashes(i / 7) // colours repeat after 7 lines
		pts.Color = ln.Color
		pts.Shape = plotutil.Shape(i)
		p.Add(ln, pts)
		p.Legend.Add(l.path, ln, pts)
	}
	// Room above the highest point for the legend (top left).
	top := 0.0
	for _, l := range lines {
		for _, pt := range l.pts {
			top = max(top, pt.Y)
		}
	}
	p.Y.Min, p.Y.Max = 0, top*1.3
	if s.logY {
		p.Y.Max = top * 4
		p.Y.Min = math.Inf(1)
		for _, l := range lines {
			for _, pt := range l.pts {
				p.Y.Min = min(p.Y.Min, pt.Y)
			}
		}
	}
	return p, nil
}

// sizeTicks marks powers of two on a logarithmic size axis, labelling
// every second one (4KiB, 16KiB, 64KiB, ...).
type sizeTicks struct{}

func (sizeTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := max(0, int(math.Floor(math.Log2(lo)))); e <= int(math.Ceil(math.Log2(hi))) && e < 63; e++ {
		v := math.Ldexp(1, e)
		if v < lo || v > hi {
			continue
		}
		t := plot.Tick{Value: v}
		if e%2 == 0 || lo*16 > hi {
			t.Label = size.Format(1 << e)
		}
		ts = append(ts, t)
	}
	return ts
}

var _ plot.Ticker = sizeTicks{}
