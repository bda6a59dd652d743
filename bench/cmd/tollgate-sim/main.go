// Command tollgate-sim runs the fleet simulation (package bench/sim) once or over a
// sweep of one parameter and prints a table: over-admission, false rejections and what
// the sync costs in Redis operations and bytes. A run is deterministic for its seed.
//
//	tollgate-sim -traffic adversarial -gateways 4 -duration 60s
//	tollgate-sim -traffic ninety -sweep gateways=1,2,4,8,16,20
//	tollgate-sim -traffic bursty -sweep interval=25ms,50ms,100ms,200ms,500ms
//	tollgate-sim -regimes   # the bounds of a 16-gateway fleet, met or missed (make sim)
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tollgate-rl/tollgate/bench/sim"
	"github.com/tollgate-rl/tollgate/shared/algo"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "tollgate-sim:", err)
		os.Exit(2)
	}
}

func run(args []string, out, stderr io.Writer) error {
	fs := flag.NewFlagSet("tollgate-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg                                         sim.Config
		traffic, latency, outage, sweep, kind, wgts string
		limit, window, burst                        int64
	)
	fs.IntVar(&cfg.Gateways, "gateways", 4, "gateways (Envoys) in the fleet")
	fs.IntVar(&cfg.Workers, "workers", 2, "worker VMs per gateway")
	fs.IntVar(&cfg.Keys, "keys", 10, "distinct caller keys")
	fs.StringVar(&traffic, "traffic", "steady", "steady|bursty|zipf|adversarial|ninety|mixed|realistic")
	fs.IntVar(&cfg.BurstSize, "burst-size", 10, "realistic: requests per session")
	fs.Float64Var(&cfg.NewKeys, "new-keys", 0.5, "realistic: share of keys that arrive during the run (negative: none)")
	fs.Float64Var(&cfg.ZipfS, "zipf-s", 1.1, "zipf, realistic: exponent of the key popularity (> 1)")
	fs.IntVar(&cfg.Spread, "spread", 0, "gateways each key's requests go to (0: all)")
	fs.Float64Var(&cfg.AdversarialShare, "adversarial-share", 0.01, "mixed: share of keys at 10x their limit")
	fs.Float64Var(&cfg.Load, "load", 0, "offered rate per key as a multiple of the limit rate (realistic: the most popular key's; 0: the traffic's default, at most 200k requests/s in all)")
	fs.DurationVar(&cfg.Interval, "interval", 100*time.Millisecond, "sync interval")
	fs.StringVar(&latency, "latency", "1ms+1ms", "one-way callout latency: base[+mean exponential extra]")
	fs.Float64Var(&cfg.Loss, "loss", 0, "probability that a callout is lost")
	fs.StringVar(&outage, "outage", "", "service outage start:duration, e.g. 20s:5s")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "simulated time")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "random seed (same seed, same result)")
	fs.StringVar(&sweep, "sweep", "", "name=v1,v2,...: gateways, workers, keys, interval, latency, loss, load, traffic, spread")
	fs.DurationVar(&cfg.Skew, "skew", 0, "largest gateway clock skew")
	fs.StringVar(&kind, "algo", "token_bucket", "token_bucket|gcra|fixed_window|sliding_window_counter")
	fs.Int64Var(&limit, "limit", 100, "permits per window")
	fs.Int64Var(&window, "window", 1000, "window in ms")
	fs.Int64Var(&burst, "burst", 0, "token bucket capacity (0: limit)")
	fs.StringVar(&wgts, "weights", "", "comma-separated share of traffic per gateway")
	fs.DurationVar(&cfg.Timeout, "timeout", 250*time.Millisecond, "callout timeout")
	fs.DurationVar(&cfg.Stale, "stale", 10*time.Second, "longest consumption waits unreported (sync.stale_ms)")
	fs.IntVar(&cfg.TableSlots, "table-slots", 4096, "shared-data slots per gateway (sync.table_slots)")
	penalty := fs.Bool("penalty", true, "progressive penalties (false: workers report no early retries)")
	regimes := fs.Bool("regimes", false, "run the regimes a 16-gateway fleet is held to (sim.Regimes) and print each bound met or missed; other flags are ignored")
	explain := fs.Bool("explain", false, "with -regimes: also count each regime's held requests and false rejections by cause")
	coldFleet := fs.Bool("cold-fleet", false, "with -regimes: the service has not counted the gateways before the run (sim.Config.ColdFleet)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *regimes {
		return printRegimes(out, stderr, sim.RegimeOptions{Explain: *explain, ColdFleet: *coldFleet})
	}
	var err error
	if cfg.Traffic, err = sim.ParseTraffic(traffic); err != nil {
		return err
	}
	if cfg.Latency, err = sim.ParseLatency(latency); err != nil {
		return err
	}
	if outage != "" {
		if cfg.Outage, err = sim.ParseWindow(outage); err != nil {
			return err
		}
	}
	cfg.NoPenalty = !*penalty
	k, ok := algo.ParseKind(kind)
	if !ok {
		return fmt.Errorf("unknown algorithm %q", kind)
	}
	cfg.Params = algo.Params{Kind: k, Limit: limit, WindowUs: window * 1000, Burst: burst}
	if wgts != "" {
		for _, f := range strings.Split(wgts, ",") {
			v, err := strconv.ParseFloat(f, 64)
			if err != nil {
				return fmt.Errorf("weights %q: %w", wgts, err)
			}
			cfg.Weights = append(cfg.Weights, v)
		}
	}

	name, points, err := parseSweep(sweep)
	if err != nil {
		return err
	}
	cfgs := []sim.Config{cfg}
	if name != "" {
		cfgs = cfgs[:0]
		for _, v := range points {
			c := cfg
			if err := set(&c, name, v); err != nil {
				return err
			}
			cfgs = append(cfgs, c)
		}
	} else {
		name = "gateways"
	}
	for i := range cfgs {
		c := cfgs[i].WithDefaults()
		if err := c.Validate(); err != nil {
			return err
		}
		cfgs[i] = c
	}
	c0 := cfgs[0]
	fmt.Fprintf(out, "traffic %s, %d keys, load %.3g× limit, %s %d/%v burst %d, %d gateways × %d workers, spread %d, interval %v, latency %v, loss %g, penalties %v, %v simulated, seed %d\n",
		c0.Traffic, c0.Keys, c0.Load, c0.Params.Kind, c0.Params.Limit, time.Duration(c0.Params.WindowUs)*time.Microsecond,
		c0.Params.Capacity(), c0.Gateways, c0.Workers, c0.Spread, c0.Interval, c0.Latency, c0.Loss, !c0.NoPenalty, c0.Duration, c0.Seed)
	if c0.Outage.Dur > 0 {
		fmt.Fprintf(out, "outage from %v for %v\n", c0.Outage.Start, c0.Outage.Dur)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, name+"\trequests\tadmitted\tref admitted\tover % worst\tover % mean\tfalse rej %\tcalm false rej %\t(local/svc/pen/degr)\tdegraded\twaited\twait p99\tsyncs/gw/s\tacquires/s\tdeltas/s\tredis calls/s\tKB/s\tstate B/key\t")
	// The table is a function of the flags alone; wall time goes to stderr.
	start := time.Now()
	for _, c := range cfgs {
		r := sim.Run(c)
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.2f\t%.3f\t%.4f\t%.4f\t%d/%d/%d/%d\t%d\t%d\t%v\t%.2f\t%.0f\t%.0f\t%.0f\t%.1f\t%.1f\t\n",
			value(&c, name), r.Requests, r.Admitted, r.RefAdmitted, r.OverAdmissionPct, r.MeanOverAdmissionPct,
			r.FalseRejectionPct, r.CalmFalsePct, r.FalseBy.Local, r.FalseBy.Service, r.FalseBy.Penalty, r.FalseBy.Degraded,
			r.Degraded, r.Waited, r.WaitP99, r.SyncsPerGateway, r.ChecksPerSec, r.DeltasPerSec, r.RedisOpsPerSec, r.BytesPerSec/1024, r.StateBytes)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "%d runs in %v\n", len(cfgs), time.Since(start).Round(time.Millisecond))
	return nil
}

func parseSweep(s string) (string, []string, error) {
	if s == "" {
		return "", nil, nil
	}
	name, list, ok := strings.Cut(s, "=")
	if !ok || list == "" {
		return "", nil, fmt.Errorf("sweep %q: want name=v1,v2", s)
	}
	return name, strings.Split(list, ","), nil
}

var errSweep = errors.New("unknown sweep parameter")

// set assigns one sweep point to c.
func set(c *sim.Config, name, v string) error {
	var err error
	switch name {
	case "gateways":
		c.Gateways, err = strconv.Atoi(v)
		c.Weights = nil
	case "workers":
		c.Workers, err = strconv.Atoi(v)
	case "keys":
		c.Keys, err = strconv.Atoi(v)
	case "spread":
		c.Spread, err = strconv.Atoi(v)
	case "interval":
		c.Interval, err = time.ParseDuration(v)
	case "latency":
		c.Latency, err = sim.ParseLatency(v)
	case "loss":
		c.Loss, err = strconv.ParseFloat(v, 64)
	case "load":
		c.Load, err = strconv.ParseFloat(v, 64)
	case "traffic":
		c.Traffic, err = sim.ParseTraffic(v)
		c.Load = 0
	default:
		return fmt.Errorf("%w %q", errSweep, name)
	}
	if err != nil {
		return fmt.Errorf("sweep %s=%q: %w", name, v, err)
	}
	return nil
}

func value(c *sim.Config, name string) string {
	switch name {
	case "gateways":
		return strconv.Itoa(c.Gateways)
	case "workers":
		return strconv.Itoa(c.Workers)
	case "keys":
		return strconv.Itoa(c.Keys)
	case "spread":
		return strconv.Itoa(c.Spread)
	case "interval":
		return c.Interval.String()
	case "latency":
		return c.Latency.String()
	case "loss":
		return strconv.FormatFloat(c.Loss, 'g', -1, 64)
	case "load":
		return strconv.FormatFloat(c.Load, 'g', 3, 64)
	case "traffic":
		return c.Traffic.String()
	}
	return ""
}

// printRegimes runs sim.Regimes and prints one line per bound: what the run measured
// and whether the bound is met.
func printRegimes(out, stderr io.Writer, o sim.RegimeOptions) error {
	start := time.Now()
	points := sim.RunRegimesWith(o)
	fmt.Fprintf(out, "%d gateways × 2 workers, interval 100ms, latency 1ms+1ms, seed 1\n", sim.RegimeGateways)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "regime\tbound\tmeasured\t\trequests\theld %\tfalse rej % (calm)\tover % worst\tacquires/s\tdeltas/s\t")
	for _, p := range points {
		r := p.Result
		calm := strconv.FormatFloat(r.CalmFalsePct, 'f', 4, 64)
		if p.Regime.OverLimit {
			calm = "-"
		}
		for _, t := range p.Regime.Targets {
			fmt.Fprintf(tw, "%s\t%s\t%.4g\t%s\t%d\t%.2f\t%s\t%.2f\t%.0f\t%.0f\t\n", p.Regime.Name, t.What, t.Value(r), metWord(t.Met(r)),
				r.Requests, sim.HeldPct(r), calm, r.OverAdmissionPct, r.ChecksPerSec, r.DeltasPerSec)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range points {
		if len(p.Result.Why) == 0 {
			continue
		}
		fmt.Fprintf(out, "\n%s: %d requests, %d held, %d calm false rejections\n", p.Regime.Name, p.Result.Requests, p.Result.Waited, p.Result.CalmFalse)
		causes := slices.Sorted(maps.Keys(p.Result.Why))
		for _, c := range causes {
			fmt.Fprintf(out, "  %8d  %s\n", p.Result.Why[c], c)
		}
	}
	fmt.Fprintf(stderr, "%d regimes in %v\n", len(points), time.Since(start).Round(time.Millisecond))
	return nil
}

func metWord(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
