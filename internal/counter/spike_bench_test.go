package counter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/rules"
)

// workerCPU is this process' CPU time so far (user and system), in µs.
func workerCPU() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e3
}

// BenchmarkSpikeWindow measures what a spike window costs beside a plain
// one, on BenchmarkManyGroups' uniform shape: 100 projects, 5,000 groups,
// batches of 100 events with ids; each project has one rule, "50 in 5
// minutes", plain or with a spike over the last 24 hours. The events are
// spread over 25 hours, so that a group's baseline holds a day of its
// events. Counted in the worker (the fast path) and by observe.lua alone,
// it reports, per event, the worker's CPU time, Redis' script and CPU
// time, commands and round trips, and the state's bytes per group. Run:
//
//	go test -run '^$' -bench SpikeWindow -benchtime 100000x ./internal/counter
func BenchmarkSpikeWindow(b *testing.B) {
	type shape struct {
		name       string
		window     rules.WindowSpec
		scriptOnly bool
	}
	var shapes []shape
	for _, path := range []string{"worker", "script"} {
		shapes = append(shapes,
			shape{path + "/plain", rules.WindowSpec{Threshold: 50, Period: 300_000}, path == "script"},
			shape{path + "/spike", rules.WindowSpec{Threshold: 50, Period: 300_000,
				Spike: &rules.SpikeSpec{Factor: 5, Baseline: 86_400_000, Floor: 1}}, path == "script"})
	}
	for _, w := range shapes {
		b.Run(w.name, func(b *testing.B) {
			const projects, groups, batch = 100, 5000, 100
			rdb := countTrips(testRedis(b))
			prefix := testPrefix(b, rdb.Client)
			e := New(rdb.Client, Options{Prefix: prefix})
			// The script's cost, where the worker cannot count (repeats,
			// redeliveries, users, a state written meanwhile).
			e.scriptOnly = w.scriptOnly
			rs := make([]*rules.Rule, projects)
			for p := range rs {
				r, _, err := rules.Compile(fmt.Sprintf("%024x", p), rules.Spec{ID: "rule", IsEnabled: true,
					WhatToReceive: rules.SeenMore, Windows: []rules.WindowSpec{w.window}})
				if err != nil {
					b.Fatal(err)
				}
				rs[p] = r
			}
			rng := rand.New(rand.NewPCG(1, 2))
			ctx := context.Background()
			start, step := time.Now().Add(-25*time.Hour), 25*time.Hour/time.Duration(b.N)
			b.ResetTimer()
			scripts, cpu, cmds, trips := scriptMicros(ctx, rdb), redisCPU(ctx, rdb), commandsProcessed(ctx, rdb), rdb.trips.Load()
			own := workerCPU()
			for done := 0; done < b.N; done += batch {
				evs := make([]Event, min(batch, b.N-done))
				for i := range evs {
					g := rng.IntN(groups)
					p := g % projects
					evs[i] = Event{ID: fmt.Sprint("m", done+i), ProjectID: fmt.Sprintf("%024x", p),
						GroupHash: fmt.Sprintf("%064x", g), Rules: rs[p:][:1], Time: start.Add(time.Duration(done+i) * step)}
				}
				if _, err := e.ObserveBatch(ctx, 0, evs); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			n := float64(b.N)
			b.ReportMetric((workerCPU()-own)/n, "workerCPUµs/event")
			b.ReportMetric((scriptMicros(ctx, rdb)-scripts)/n, "scriptµs/event")
			b.ReportMetric((redisCPU(ctx, rdb)-cpu)/n, "redisCPUµs/event")
			b.ReportMetric(float64(commandsProcessed(ctx, rdb)-cmds)/n, "commands/event")
			b.ReportMetric(float64(rdb.trips.Load()-trips)/n, "trips/event")
			var bytes, keys int64
			iter := rdb.Scan(ctx, 0, prefix+":{*}:s", 1000).Iterator()
			for iter.Next(ctx) {
				bytes += rdb.StrLen(ctx, iter.Val()).Val()
				keys++
			}
			if keys > 0 {
				b.ReportMetric(float64(bytes)/float64(keys), "stateB/group")
			}
		})
	}
}
