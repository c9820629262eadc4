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
// 100,000 uniform groups, batches of 1,000. It reports Redis' script time per event (EVALSHA usec,
// the commands inside included) and Redis' CPU time per event, the figures
// every worker shares. Run:
//
//	go test -run '^$' -bench ManyGroups -benchtime 100000x ./internal/counter
func BenchmarkManyGroups(b *testing.B) {
	for _, w := range []struct {
		name                           string
		projects, rules, groups, batch int
	}{
		{"uniform", 100, 5, 5000, 100}, {"zipf", 100, 5, 5000, 100},
		// tools/bench -scale's shape: every event of its own group, mostly.
		{"scale", 1000, 10, 100_000, 1000},
	} {
		dist := w.name
		b.Run(dist, func(b *testing.B) {
			rdb := countTrips(testRedis(b))
			e := New(rdb.Client, Options{Prefix: testPrefix(b, rdb.Client)})
			projects, groups, batch := w.projects, w.groups, w.batch
			ruleSets := make([][]*rules.Rule, projects)
			for p := range ruleSets {
				pid := fmt.Sprintf("%024x", p)
				for k := range w.rules {
					s := rules.Spec{ID: fmt.Sprint("rule-", k), IsEnabled: true, WhatToReceive: rules.SeenMore}
					switch k % 4 {
					case 0:
						s.Threshold, s.ThresholdPeriod = 1000, 60_000
					case 1:
						s.Including = []string{"error"}
						s.Windows = []rules.WindowSpec{{Threshold: 2000, Period: 60_000}, {Threshold: 10_000, Period: 600_000}}
					case 2:
						s.Excluding = []string{"staging"}
						s.Threshold, s.ThresholdPeriod = 10_000, 3_600_000
					case 3:
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
						if k%4 != 3 {
							matched = append(matched, r)
						}
					}
					evs[i] = Event{ID: fmt.Sprint("m", done+i), ProjectID: fmt.Sprintf("%024x", p),
						GroupHash: fmt.Sprintf("%064x", g), Rules: matched,
						Time: start.Add(time.Duration(done+i) * 50 * time.Microsecond)}
				}
				if _, err := e.ObserveBatch(ctx, 0, evs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((scriptMicros(ctx, rdb)-scripts)/float64(b.N), "scriptµs/event")
			b.ReportMetric((redisCPU(ctx, rdb)-cpu)/float64(b.N), "redisCPUµs/event")
		})
	}
}
