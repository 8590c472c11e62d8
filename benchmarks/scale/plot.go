package main

import (
	"fmt"
	"math"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/tensorferry/tensorferry/config"
)

// figure is one plot: a figure of the rows against N, one line per
// series.
type figure struct {
	file, title, ylabel string
	series              []series
	target              float64 // a horizontal line, when > 0
	targetLabel         string
}

type series struct {
	label string
	mode  string
	value func(row) (float64, bool)
}

// perMode is one series per mode of value.
func perMode(value func(row) float64) []series {
	var out []series
	for _, m := range []string{modeMesh, modeGossip, modeGossipOnly} {
		out = append(out, series{label: m, mode: m, value: func(r row) (float64, bool) { return value(r), true }})
	}
	return out
}

// positive leaves out the points ≤ 0 of ss (a heap figure an earlier
// cluster's freed memory made negative).
func positive(ss []series) []series {
	for i, s := range ss {
		ss[i].value = func(r row) (float64, bool) {
			v, ok := s.value(r)
			return v, ok && v > 0
		}
	}
	return ss
}

// drawAll writes the bench-scale-*.svg figures into dir.
func drawAll(dir string, rows []row, cfg *config.Config) error {
	detected := func(med, max float64, missed int) (float64, bool) { return max, !(med == 0 && missed > 0) }
	figs := []figure{
		{file: "bench-scale-fds.svg", title: "Open descriptors (sockets) per node", ylabel: "descriptors per node",
			series: perMode(func(r row) float64 { return r.FDsPerNode })},
		{file: "bench-scale-msgs.svg", title: "Background messages sent per node, idle cluster", ylabel: "messages per node per second",
			series: perMode(func(r row) float64 { return r.MsgsPerNodeS })},
		{file: "bench-scale-bytes.svg", title: "Background bytes sent per node, idle cluster", ylabel: "bytes per node per second",
			series: perMode(func(r row) float64 { return r.BytesPerNodeS })},
		{file: "bench-scale-cpu.svg", title: "CPU per node, idle cluster (all nodes in one process, 2 cores)", ylabel: "% of one core per node",
			series: perMode(func(r row) float64 { return r.CPUPctPerNode })},
		{file: "bench-scale-heap.svg", title: "Live heap per node", ylabel: "KiB per node",
			series: positive(perMode(func(r row) float64 { return r.HeapKiBPerNode }))},
		{file: "bench-scale-false.svg", title: "False NodeDowns (idle period and detections)", ylabel: "nodes wrongly reported down",
			series: perMode(func(r row) float64 { return float64(r.FalseDowns) })},
		{file: "bench-scale-detect.svg", title: "Time until every other node reports a stopped node down", ylabel: "seconds",
			target: (cfg.FailureTimeout + cfg.Gossip.GossipInterval).Seconds(), targetLabel: "failure_timeout + 1 gossip round",
			series: []series{
				{label: "mesh, frozen", mode: modeMesh, value: func(r row) (float64, bool) { return detected(r.FreezeMedianS, r.FreezeMaxS, r.FreezeMissed) }},
				{label: "gossip, frozen", mode: modeGossip, value: func(r row) (float64, bool) { return detected(r.FreezeMedianS, r.FreezeMaxS, r.FreezeMissed) }},
				{label: "gossip only, frozen", mode: modeGossipOnly, value: func(r row) (float64, bool) { return detected(r.FreezeMedianS, r.FreezeMaxS, r.FreezeMissed) }},
				{label: "mesh, killed", mode: modeMesh, value: func(r row) (float64, bool) { return detected(r.KillMedianS, r.KillMaxS, r.KillMissed) }},
				{label: "gossip, killed", mode: modeGossip, value: func(r row) (float64, bool) { return detected(r.KillMedianS, r.KillMaxS, r.KillMissed) }},
				{label: "gossip only, killed", mode: modeGossipOnly, value: func(r row) (float64, bool) { return detected(r.KillMedianS, r.KillMaxS, r.KillMissed) }},
			}},
	}
	for _, f := range figs {
		if err := draw(filepath.Join(dir, f.file), f, rows); err != nil {
			return err
		}
	}
	return nil
}

func draw(path string, f figure, rows []row) error {
	p := plot.New()
	p.Title.Text = f.title
	p.X.Label.Text = "nodes (N)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = nTicks{}
	p.Y.Label.Text = f.ylabel
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, true
	lo, hi, top := math.Inf(1), 0.0, 0.0
	drawn := 0
	for i, s := range f.series {
		var pts plotter.XYs
		for _, r := range rows {
			if r.Mode != s.mode || r.Skipped != "" {
				continue
			}
			if v, ok := s.value(r); ok {
				pts = append(pts, plotter.XY{X: float64(r.N), Y: v})
				lo, hi, top = min(lo, float64(r.N)), max(hi, float64(r.N)), max(top, v)
			}
		}
		if len(pts) == 0 {
			continue
		}
		ln, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", path, s.label, err)
		}
		ln.Color, sc.Color, sc.Shape = plotutil.Color(i), plotutil.Color(i), plotutil.Shape(i)
		ln.Dashes = plotutil.Dashes(i / 2)
		p.Add(ln, sc)
		p.Legend.Add(s.label, ln, sc)
		drawn++
	}
	if drawn == 0 {
		return fmt.Errorf("%s: %w", path, errNoRows)
	}
	if f.target > 0 {
		t, err := plotter.NewLine(plotter.XYs{{X: lo, Y: f.target}, {X: hi, Y: f.target}})
		if err != nil {
			return err
		}
		t.Color = plotutil.Color(6)
		t.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		p.Add(t)
		p.Legend.Add(f.targetLabel, t)
		top = max(top, f.target)
	}
	p.Y.Min, p.Y.Max = 0, max(top*1.35, 1)
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

// nTicks marks powers of two on the N axis.
type nTicks struct{}

func (nTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := max(0, int(math.Floor(math.Log2(lo)))); e <= int(math.Ceil(math.Log2(hi))) && e < 31; e++ {
		v := math.Ldexp(1, e)
		if v >= lo && v <= hi {
			ts = append(ts, plot.Tick{Value: v, Label: strconv.Itoa(1 << e)})
		}
	}
	return ts
}
