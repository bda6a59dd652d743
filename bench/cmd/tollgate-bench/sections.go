package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/bench/perf"
	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
)

// Sections -sections can measure on their own.
const (
	sectionRegimes    = "regimes"     // section 10 and its Targets rows
	sectionSimRegimes = "sim-regimes" // section 11 and its Targets rows
	// sectionEnvoy (envoycompare.go): section 13, its Targets rows, its charts and its
	// README rows.
)

var sectionNames = []string{sectionRegimes, sectionSimRegimes, sectionEnvoy}

// parseSections reads -sections' comma-separated list.
func parseSections(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(sectionNames, f) {
			return nil, fmt.Errorf("-sections: unknown section %q (want %s)", f, strings.Join(sectionNames, ", "))
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-sections %q: no section named", s)
	}
	return out, nil
}

// measureSections measures the named sections alone and writes their blocks (their
// Targets rows and the sections) to stdout or, when splice is set, into the report at
// o.out in place of the same blocks there.
func measureSections(r *report, o options, names []string, splice bool, logger *log.Logger, stdout io.Writer) error {
	r.machine = readMachine()
	r.regimes.alone = &aloneRun{started: r.started, args: r.args, loadAvg: r.machine.loadAvg}
	if slices.Contains(names, sectionRegimes) {
		if err := measurePacedAlone(r, o, logger); err != nil {
			return err
		}
	}
	if slices.Contains(names, sectionSimRegimes) {
		r.regimes.measureSim(logger)
	}
	if slices.Contains(names, sectionEnvoy) {
		if err := r.measureEnvoyCompare(o, logger); err != nil {
			return err
		}
		if err := os.MkdirAll(o.charts, 0o755); err != nil {
			return fmt.Errorf("charts directory: %w", err)
		}
		if err := r.envoyCharts(o.charts); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
		r.chartsRel = o.charts
		if rel, err := filepath.Rel(filepath.Dir(o.out), o.charts); err == nil {
			r.chartsRel = filepath.ToSlash(rel)
		}
	}
	// The blocks of the named sections, in the report's order.
	type part struct {
		name  string
		write func(io.Writer) error
	}
	var parts []part
	if slices.Contains(names, sectionRegimes) {
		parts = append(parts, part{blockPacedTargets, func(w io.Writer) error { return r.writeRegimeTarget(w, blockPacedTargets) }},
			part{blockPaced, r.writePacedRegimes})
	}
	if slices.Contains(names, sectionSimRegimes) {
		parts = append(parts, part{blockSimTargets, func(w io.Writer) error { return r.writeRegimeTarget(w, blockSimTargets) }},
			part{blockSim, r.writeSimRegimes})
	}
	if slices.Contains(names, sectionEnvoy) {
		parts = append(parts, part{blockEnvoyTargets, r.writeEnvoyTargets}, part{blockEnvoy, r.writeEnvoyCompare})
	}
	blocks := map[string]string{}
	var order []string
	for _, p := range parts {
		var b bytes.Buffer
		if err := p.write(&b); err != nil {
			return err
		}
		blocks[p.name] = b.String()
		order = append(order, p.name)
	}
	if slices.Contains(names, sectionEnvoy) {
		if o.readme != "" {
			old, err := os.ReadFile(o.readme)
			if err != nil {
				return fmt.Errorf("readme: %w", err)
			}
			rows, err := r.envoyReadmeRows()
			if err != nil {
				return err
			}
			doc, err := spliceReadmeRows(string(old), rows)
			if err != nil {
				return err
			}
			if err := os.WriteFile(o.readme, []byte(doc), 0o644); err != nil {
				return fmt.Errorf("readme: %w", err)
			}
			logger.Printf("replaced the real-Envoy rows of %s", o.readme)
		}
	}
	if !splice {
		for _, name := range order {
			if _, err := io.WriteString(stdout, blocks[name]); err != nil {
				return err
			}
		}
		return nil
	}
	old, err := os.ReadFile(o.out)
	if err != nil {
		return fmt.Errorf("report to splice into: %w", err)
	}
	doc := string(old)
	for _, name := range order {
		doc = spliceBlock(doc, name, blocks[name])
	}
	if err := os.WriteFile(o.out, []byte(doc), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	logger.Printf("replaced %s in %s", strings.Join(order, ", "), o.out)
	return nil
}

// measurePacedAlone starts what the paced regimes need (the filter and pass-through
// modules, a redis-server, the sync service) and measures them.
func measurePacedAlone(r *report, o options, logger *log.Logger) error {
	logger.Print("building modules")
	filter, err := perf.BuildModule(perf.FilterPkg)
	if err != nil {
		return err
	}
	empty, err := perf.BuildModule(perf.EmptyPkg)
	if err != nil {
		return err
	}
	srv, err := redistest.Launch(redistest.Options{})
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	svc, err := perf.StartService(store.Standalone, srv.Addrs())
	if err != nil {
		return err
	}
	defer svc.Close()
	ctx := context.Background()
	idle0, err := perf.ReadInfo(ctx, rdb)
	if err != nil {
		return err
	}
	r.machine.redis = idle0.Version
	time.Sleep(2 * time.Second)
	idle1, err := perf.ReadInfo(ctx, rdb)
	if err != nil {
		return err
	}
	r.redisIdleMsPerSec = idle1.Since(idle0).WholeCPU() * 1e3 / 2
	st := &perf.Stack{Filter: filter, Empty: empty, Redis: rdb, Service: svc}
	return r.regimes.measurePaced(st, o, logger)
}

// spliceBlock replaces the block name (its markers included) in doc with text. A block
// the document does not have yet is added: Targets rows at the end of the Targets
// section, a section at the end of the document.
func spliceBlock(doc, name, text string) string {
	begin, end := blockBegin(name), blockEnd(name)
	i := strings.Index(doc, begin)
	j := strings.Index(doc, end)
	if i >= 0 && j > i {
		j += len(end)
		// The block's trailing blank line is part of text.
		for j < len(doc) && doc[j] == '\n' {
			j++
		}
		return doc[:i] + text + doc[j:]
	}
	if strings.HasPrefix(name, "targets-") {
		if t := strings.Index(doc, "\n## Targets\n"); t >= 0 {
			if k := strings.Index(doc[t+1:], "\n## "); k >= 0 {
				at := t + 1 + k + 1
				return doc[:at] + text + doc[at:]
			}
		}
	}
	if !strings.HasSuffix(doc, "\n\n") {
		doc = strings.TrimRight(doc, "\n") + "\n\n"
	}
	return doc + text
}
