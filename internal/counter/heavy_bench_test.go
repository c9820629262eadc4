package counter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/rules"
)

// BenchmarkHeavyProject measures the longest script call a project of
// many rules can make Redis run, Redis running one script at a time: a
// project at the default limits (100 rules of 8 windows up to 31 days,
// half of them counting users, each rule its own filter so that no ring is
// shared), every event matching every rule, events of one group in
// batches of 1,000 (which observe.lua takes in chunks), and of new groups.
// It reports the longest EVALSHA of the run from Redis' SLOWLOG (which
// logs calls over slowlog-log-slower-than, 10 ms by default: 0 means none
// was that long) and the average script time per event. Run:
//
//	go test -run '^$' -bench HeavyProject -benchtime 3000x ./internal/counter
func BenchmarkHeavyProject(b *testing.B) {
	for _, shape := range []string{"one-group", "new-groups"} {
		b.Run(shape, func(b *testing.B) {
			rdb := countTrips(testRedis(b))
			e := New(rdb.Client, Options{Prefix: testPrefix(b, rdb.Client)})
			const day = 86_400_000
			var rs []*rules.Rule
			for k := range 100 {
				s := rules.Spec{ID: fmt.Sprint("heavy-", k), IsEnabled: true, WhatToReceive: rules.SeenMore,
					Including: []string{fmt.Sprint("w", k)}}
				for w := range 8 {
					s.Windows = append(s.Windows, rules.WindowSpec{Threshold: 1 << 30, Period: int64(w+1) * 31 * day / 8})
				}
				if k%2 == 0 {
					s.CountBy = rules.CountUsers
				}
				r, _, err := rules.Compile(project, s)
				if err != nil {
					b.Fatal(err)
				}
				rs = append(rs, r)
			}
			ctx := context.Background()
			start := time.Now().Add(-time.Hour)
			b.ResetTimer()
			scripts := scriptMicros(ctx, rdb)
			var since int64 = -1
			if logged := rdb.SlowLogGet(ctx, 1).Val(); len(logged) > 0 {
				since = logged[0].ID
			}
			for done := 0; done < b.N; {
				n := min(1000, b.N-done)
				evs := make([]Event, n)
				for i := range evs {
					g := "hot"
					if shape == "new-groups" {
						g = fmt.Sprint("new-", done+i)
					}
					evs[i] = Event{ID: fmt.Sprint("m", done+i), ProjectID: project, GroupHash: g,
						UserID: fmt.Sprint("u", (done+i)%500), Rules: rs, Time: start.Add(time.Duration(done+i) * time.Millisecond)}
				}
				if _, err := e.ObserveBatch(ctx, 0, evs); err != nil {
					b.Fatal(err)
				}
				done += n
			}
			b.ReportMetric((scriptMicros(ctx, rdb)-scripts)/float64(b.N), "scriptµs/event")
			var longest time.Duration
			for _, l := range rdb.SlowLogGet(ctx, 128).Val() {
				if l.ID > since && len(l.Args) > 0 && strings.EqualFold(l.Args[0], "evalsha") {
					longest = max(longest, l.Duration)
				}
			}
			b.ReportMetric(float64(longest.Microseconds()), "longestCallµs")
		})
	}
}
