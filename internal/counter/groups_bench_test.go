package counter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/rules"
)

// BenchmarkManyGroups measures the engine on tools/bench's default workload
// without the broker: 100 projects × 5 rules (three filters, periods of
// 1 min, 10 min and 1 h, one ONLY_NEW), 5,000 groups, batches of 100
// events with ids, the groups either uniform or Zipf-distributed (a few
// hot groups); and tools/bench -scale's shape, 1,000 projects × 10 rules,
// 100,000 uniform groups, batches of 1,000; and tools/bench -workload
// idless's, events without ids over 5,000 uniform groups in batches of
// 1,000. Each runs without a state cache and with the default one. It
// reports Redis' script time per event (EVALSHA usec, the commands inside
// included), Redis' CPU time and commands per event, the figures every
// worker shares. Run:
//
//	go test -run '^$' -bench ManyGroups -benchtime 100000x ./internal/counter
func BenchmarkManyGroups(b *testing.B) {
	type workload struct {
		name                           string
		projects, rules, groups, batch int
		cache                          int64
	}
	var loads []workload
	for _, w := range []workload{
		{name: "uniform", projects: 100, rules: 5, groups: 5000, batch: 100},
		{name: "zipf", projects: 100, rules: 5, groups: 5000, batch: 100},
		// tools/bench -scale's shape: every event of its own group, mostly.
		{name: "scale", projects: 1000, rules: 10, groups: 100_000, batch: 1000},
		{name: "idless", projects: 100, rules: 5, groups: 5000, batch: 1000},
	} {
		for _, cache := range []int64{0, 16 << 20} {
			w.cache = cache
			loads = append(loads, w)
		}
	}
	for _, w := range loads {
		dist := w.name
		b.Run(fmt.Sprintf("%s/cache=%dMiB", dist, w.cache>>20), func(b *testing.B) {
			rdb := countTrips(testRedis(b))
			e := New(rdb.Client, Options{Prefix: testPrefix(b, rdb.Client), StateCacheBytes: w.cache})
			projects, groups, batch := w.projects, w.groups, w.batch
			ruleSets := make([][]*rules.Rule, projects)
			for p := range ruleSets {
				pid := fmt.Sprintf("%024x", p)
				for k := range w.rules {
					s := rules.Spec{ID: fmt.Sprint("rule-", k), IsEnabled: true, WhatToReceive: rules.SeenMore}
					switch {
					case dist == "idless":
						// tools/bench -workload idless's: 1 h and 1 day in
						// turn, thresholds 1.5-3.5 × the 40 events a group.
						s.Threshold, s.ThresholdPeriod = int64(60+20*k), int64(3_600_000)
						if k%2 == 1 {
							s.ThresholdPeriod = 86_400_000
						}
					case k%4 == 0:
						s.Threshold, s.ThresholdPeriod = 1000, 60_000
					case k%4 == 1:
						s.Including = []string{"error"}
						s.Windows = []rules.WindowSpec{{Threshold: 2000, Period: 60_000}, {Threshold: 10_000, Period: 600_000}}
					case k%4 == 2:
						s.Excluding = []string{"staging"}
						s.Threshold, s.ThresholdPeriod = 10_000, 3_600_000
					case k%4 == 3:
						s.WhatToReceive, s.Including = rules.OnlyNew, []string{"database"}
					}
					r, _, err := rules.Compile(pid, s)
					if err != nil {
						b.Fatal(err)
					}
					ruleSets[p] = append(ruleSets[p], r)
				}
			}
			rng := rand.New(rand.NewPCG(1, 2))
			zipf := rand.NewZipf(rng, 1.1, 1, uint64(groups-1))
			pick := func() int {
				if dist == "zipf" {
					return int(zipf.Uint64())
				}
				return rng.IntN(groups)
			}
			ctx := context.Background()
			start := time.Now()
			b.ResetTimer()
			scripts, cpu := scriptMicros(ctx, rdb), redisCPU(ctx, rdb)
			for done := 0; done < b.N; done += batch {
				evs := make([]Event, min(batch, b.N-done))
				for i := range evs {
					g := pick()
					p := g % projects
					// Every rule but ONLY_NEW (k%4 == 3) matches: titles say
					// "error", not "database".
					var matched []*rules.Rule
					for k, r := range ruleSets[p] {
						if k%4 != 3 || dist == "idless" {
							matched = append(matched, r)
						}
					}
					evs[i] = Event{ID: fmt.Sprint("m", done+i), ProjectID: fmt.Sprintf("%024x", p),
						GroupHash: fmt.Sprintf("%064x", g), Rules: matched,
						Time: start.Add(time.Duration(done+i) * 50 * time.Microsecond)}
					if dist == "idless" {
						// No id, no time: every delivery counts, at Redis' clock.
						evs[i].ID, evs[i].Time = "", time.Time{}
						evs[i].Body = fmt.Appendf(nil, `{"projectId":"%024x","event":{"title":"Error %d","groupHash":"%064x"}}`, p, done+i, g)
					}
				}
				if _, err := e.ObserveBatch(ctx, 0, evs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((scriptMicros(ctx, rdb)-scripts)/float64(b.N), "scriptµs/event")
			b.ReportMetric((redisCPU(ctx, rdb)-cpu)/float64(b.N), "redisCPUµs/event")
			b.ReportMetric(float64(e.cachedStates.Load())/float64(b.N), "cached/event")
		})
	}
}
