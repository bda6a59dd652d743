package perf

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Chart size: 768 × 432 px at the PNG canvas's 96 dpi, a few tens of KB each.
const (
	chartW = 8 * vg.Inch
	chartH = 4.5 * vg.Inch
)

// series is one line of a sweep chart.
type series struct {
	label string
	xy    plotter.XYs
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	return p
}

func addLines(p *plot.Plot, ss []series) error {
	for i, s := range ss {
		l, pts, err := plotter.NewLinePoints(s.xy)
		if err != nil {
			return fmt.Errorf("chart %q: %w", s.label, err)
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i)
		pts.Color = plotutil.Color(i)
		pts.Shape = plotutil.Shape(i)
		p.Add(l, pts)
		p.Legend.Add(s.label, l, pts)
	}
	return nil
}

// legendRoom starts the Y axis at 0 and leaves the top third of the plot to the legend.
func legendRoom(p *plot.Plot, ss []series) {
	top := 0.0
	for _, s := range ss {
		for _, xy := range s.xy {
			top = max(top, xy.Y)
		}
	}
	p.Y.Min = 0
	p.Y.Max = max(top, 0.1) * 1.6
}

// sweepSeries turns sim points into the four lines both sweep charts show.
func sweepSeries(points []SimPoint, x func(SimPoint) float64) []series {
	ss := []series{
		{label: "over-admission, worst key (adversarial 10x)"},
		{label: "over-admission, mean over keys (adversarial 10x)"},
		{label: "false rejections (bursty)"},
		{label: "false rejections (ninety: 90 % of limit)"},
	}
	for _, pt := range points {
		r := pt.Result
		switch pt.Scenario {
		case "adversarial 10x":
			ss[0].xy = append(ss[0].xy, plotter.XY{X: x(pt), Y: r.OverAdmissionPct})
			ss[1].xy = append(ss[1].xy, plotter.XY{X: x(pt), Y: r.MeanOverAdmissionPct})
		case "bursty":
			ss[2].xy = append(ss[2].xy, plotter.XY{X: x(pt), Y: r.FalseRejectionPct})
		case "ninety":
			ss[3].xy = append(ss[3].xy, plotter.XY{X: x(pt), Y: r.FalseRejectionPct})
		}
	}
	return ss
}

// sweepPanels draws a sweep as two panels sharing the X axis: over-admission on top,
// false rejections below (their scales differ by orders of magnitude).
func sweepPanels(title, xlabel string, points []SimPoint, x func(SimPoint) float64, ticks plot.Ticker, logX bool, path string) error {
	ss := sweepSeries(points, x)
	over := newPlot(title, "", "over-admission, % of capacity")
	rej := newPlot("", xlabel, "false rejections, %")
	for _, p := range []*plot.Plot{over, rej} {
		if logX {
			p.X.Scale = plot.LogScale{}
		}
		if ticks != nil {
			p.X.Tick.Marker = ticks
		}
	}
	if err := addLines(over, ss[:2]); err != nil {
		return err
	}
	legendRoom(over, ss[:2])
	if err := addLines(rej, ss[2:]); err != nil {
		return err
	}
	legendRoom(rej, ss[2:])
	return savePanels(path, over, rej)
}

// savePanels stacks plots vertically in one PNG.
func savePanels(path string, plots ...*plot.Plot) error {
	img := vgimg.New(chartW, chartH*vg.Length(len(plots))*0.6)
	dc := draw.New(img)
	grid := make([][]*plot.Plot, len(plots))
	for i, p := range plots {
		grid[i] = []*plot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8), PadY: vg.Points(10)}
	canvases := plot.Align(grid, tiles, dc)
	for i, p := range plots {
		p.Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("chart %q: %w", path, err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("chart %q: %w", path, err)
	}
	return f.Close()
}

// ChartSimGateways draws over-admission and false rejections against fleet size.
func ChartSimGateways(points []SimPoint, path string) error {
	var ticks plot.ConstantTicks
	seen := map[int]bool{}
	for _, pt := range points {
		if !seen[pt.Gateways] {
			seen[pt.Gateways] = true
			ticks = append(ticks, plot.Tick{Value: float64(pt.Gateways), Label: strconv.Itoa(pt.Gateways)})
		}
	}
	return sweepPanels(fmt.Sprintf("Fleet simulation: %d keys, token bucket 100/s, 100 ms sync, %s simulated", SimKeys, SimDuration),
		"gateways (2 workers each)", points, func(pt SimPoint) float64 { return float64(pt.Gateways) }, ticks, false, path)
}

// ChartSimInterval draws over-admission and false rejections against the sync interval.
func ChartSimInterval(points []SimPoint, path string) error {
	var ticks plot.ConstantTicks
	seen := map[time.Duration]bool{}
	for _, pt := range points {
		if !seen[pt.Interval] {
			seen[pt.Interval] = true
			ticks = append(ticks, plot.Tick{Value: float64(pt.Interval.Milliseconds()), Label: strconv.FormatInt(pt.Interval.Milliseconds(), 10)})
		}
	}
	return sweepPanels(fmt.Sprintf("Fleet simulation: %d keys, 4 gateways, lease horizon 2 intervals, %s simulated", SimKeys, SimDuration),
		"sync interval (ms, log scale)", points, func(pt SimPoint) float64 { return float64(pt.Interval.Milliseconds()) }, ticks, true, path)
}

// Bars is one series of a grouped bar chart: a value per group.
type Bars struct {
	Label  string
	Values []float64
}

// ChartGroupedBars draws groups of bars (one bar per series in each group).
func ChartGroupedBars(title, ylabel string, groups []string, bars []Bars, logY bool, path string) error {
	p := newPlot(title, "", ylabel)
	w := vg.Points(float64(chartW) / float64(len(groups)*(len(bars)+1)) * 0.8)
	for i, b := range bars {
		vals := make(plotter.Values, len(b.Values))
		for j, v := range b.Values {
			vals[j] = v
			if logY {
				vals[j] = math.Log10(max(v, 1))
			}
		}
		bc, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return fmt.Errorf("chart %q: %w", b.Label, err)
		}
		bc.Color = plotutil.Color(i)
		bc.LineStyle.Width = 0
		bc.Offset = w * vg.Length(float64(i)-float64(len(bars)-1)/2)
		p.Add(bc)
		p.Legend.Add(b.Label, bc)
		// Print each bar's value above it.
		labels, err := plotter.NewLabels(barLabels(vals, b.Values))
		if err == nil {
			for k := range labels.TextStyle {
				labels.TextStyle[k].XAlign = draw.XCenter
				labels.TextStyle[k].Font.Size = vg.Points(8)
			}
			labels.Offset = vg.Point{X: bc.Offset, Y: vg.Points(2)}
			p.Add(labels)
		}
	}
	p.NominalX(groups...)
	p.Y.Min = 0
	if logY {
		var ticks plot.ConstantTicks
		top := 0.0
		for _, b := range bars {
			for _, v := range b.Values {
				top = max(top, math.Log10(max(v, 1)))
			}
		}
		for e := 0; float64(e) <= top+1; e++ {
			ticks = append(ticks, plot.Tick{Value: float64(e), Label: humanCount(math.Pow(10, float64(e)))})
		}
		p.Y.Tick.Marker = ticks
		p.Y.Max = math.Ceil(top) + 1.5
	} else {
		top := 0.0
		for _, b := range bars {
			for _, v := range b.Values {
				top = max(top, v)
			}
		}
		p.Y.Max = top * 1.4
	}
	p.Legend.Top = true
	p.Legend.Left = false
	p.X.Tick.Label.Color = color.Black
	return p.Save(chartW, chartH, path)
}

func barLabels(heights plotter.Values, raw []float64) plotter.XYLabels {
	out := plotter.XYLabels{}
	for j, h := range heights {
		out.XYs = append(out.XYs, plotter.XY{X: float64(j), Y: h})
		out.Labels = append(out.Labels, humanCount(raw[j]))
	}
	return out
}

// humanCount formats a count compactly: 950, 12k, 1.2M.
func humanCount(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return trimZero(fmt.Sprintf("%.1f", v/1e6)) + "M"
	case a >= 1e3:
		return trimZero(fmt.Sprintf("%.1f", v/1e3)) + "k"
	case a >= 10 || a == 0:
		return fmt.Sprintf("%.0f", v)
	default:
		return trimZero(fmt.Sprintf("%.2f", v))
	}
}

func trimZero(s string) string {
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// ChartPath joins the charts directory and a file name.
func ChartPath(dir, name string) string { return filepath.Join(dir, name) }

// ChartMesh draws the mesh sweep: over-admission and calm callers' false rejections
// (top), Redis state per key (bottom), against fleet size on a log axis.
func ChartMesh(points []SimPoint, path string) error {
	var ticks plot.ConstantTicks
	ss := []series{{label: "over-admission, worst key and 1-minute window (% of limit)"}, {label: "false rejections of callers within their limit (%)"}}
	state := []series{{label: "bucket value per key at the service (bytes, mean)"}, {label: "... (bytes, largest)"}}
	for _, pt := range points {
		x := float64(pt.Gateways)
		ticks = append(ticks, plot.Tick{Value: x, Label: strconv.Itoa(pt.Gateways)})
		r := pt.Result
		ss[0].xy = append(ss[0].xy, plotter.XY{X: x, Y: r.OverAdmissionPct})
		ss[1].xy = append(ss[1].xy, plotter.XY{X: x, Y: r.CalmFalsePct})
		state[0].xy = append(state[0].xy, plotter.XY{X: x, Y: r.StateBytes})
		state[1].xy = append(state[1].xy, plotter.XY{X: x, Y: float64(r.StateBytesMax)})
	}
	top := newPlot(fmt.Sprintf("Mesh simulation: %d keys, each through %d gateways, %d per minute", MeshKeys, MeshSpread, MeshLimit), "", "%")
	bottom := newPlot("", "gateways (2 workers each, log scale)", "bytes per key")
	for _, p := range []*plot.Plot{top, bottom} {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = ticks
	}
	if err := addLines(top, ss); err != nil {
		return err
	}
	legendRoom(top, ss)
	if err := addLines(bottom, state); err != nil {
		return err
	}
	legendRoom(bottom, state)
	return savePanels(path, top, bottom)
}

// LatencyLine is one limiter's latency percentiles against the offered rate.
type LatencyLine struct {
	Label           string
	Rate            []float64 // requests/s offered
	P50, P99, P99p9 []float64 // ms
}

// ChartLatencyVsRate draws p50, p99 and p99.9 (three panels, log scale) against the
// offered rate, one line per limiter.
func ChartLatencyVsRate(title string, lines []LatencyLine, path string) error {
	panels := []struct {
		name string
		get  func(LatencyLine) []float64
	}{
		{"p50", func(l LatencyLine) []float64 { return l.P50 }},
		{"p99", func(l LatencyLine) []float64 { return l.P99 }},
		{"p99.9", func(l LatencyLine) []float64 { return l.P99p9 }},
	}
	var plots []*plot.Plot
	for i, pn := range panels {
		t, x := "", ""
		if i == 0 {
			t = title
		}
		if i == len(panels)-1 {
			x = "offered requests/s (open loop, Poisson; latency from the scheduled time)"
		}
		p := newPlot(t, x, pn.name+" ms (log scale)")
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		var ss []series
		for _, l := range lines {
			s := series{label: l.Label}
			for j, r := range l.Rate {
				s.xy = append(s.xy, plotter.XY{X: r, Y: max(pn.get(l)[j], 0.01)})
			}
			ss = append(ss, s)
		}
		if err := addLines(p, ss); err != nil {
			return err
		}
		if i > 0 { // one legend, in the top panel
			p.Legend = plot.New().Legend
		}
		p.Legend.Left = true
		plots = append(plots, p)
	}
	return savePanels(path, plots...)
}
