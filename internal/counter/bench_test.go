package counter

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/tools/baseline"
)

// algorithm is one way of counting a stream of events for one rule:
// observe sends a batch in one pipeline and returns how many fired.
type algorithm struct {
	name    string
	observe func(ctx context.Context, evs []Event) (int, error)
}

func algorithms(tb testing.TB, rdb *tripCounter, prefix string, rule *rules.Rule) []algorithm {
	e := New(rdb.Client, Options{Prefix: prefix})
	w := rule.Windows[0]
	perEvent := func(script *redis.Script, key string, extra bool) func(context.Context, []Event) (int, error) {
		if err := script.Load(context.Background(), rdb.Client).Err(); err != nil {
			tb.Fatal(err)
		}
		return func(ctx context.Context, evs []Event) (int, error) {
			cmds := make([]*redis.Cmd, len(evs))
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, ev := range evs {
					args := []any{ev.Time.UnixMilli(), w.Period.Milliseconds(), w.Threshold}
					if extra {
						args = append(args, ev.ID)
					}
					cmds[i] = script.EvalSha(ctx, p, []string{prefix + ":" + key + ":" + ev.GroupHash}, args...)
				}
				return nil
			})
			fired := 0
			for _, c := range cmds {
				if n, _ := c.Int(); n == 1 {
					fired++
				}
			}
			return fired, err
		}
	}
	return []algorithm{
		{"klaxon", func(ctx context.Context, evs []Event) (int, error) {
			res, err := e.ObserveBatch(ctx, 0, evs)
			fired := 0
			for _, r := range res {
				if r.Outcomes[0].Fired {
					fired++
				}
			}
			return fired, err
		}},
		{"hawk-fixed", perEvent(redis.NewScript(baseline.HawkLua), "hawk", false)},
		{"zset-log", perEvent(redis.NewScript(baseline.LogLua), "zlog", true)},
		// Not a counter: the commands an idempotent one cannot skip, the
		// bound below which no engine with Klaxon's guarantees goes.
		{"floor", perEvent(redis.NewScript(baseline.FloorLua), "floor", true)},
	}
}

// stream is n events of one rule over groups, evenly spread over span.
func stream(rule *rules.Rule, start time.Time, span time.Duration, n, groups int, tag string) []Event {
	evs := make([]Event, n)
	for i := range evs {
		evs[i] = Event{
			ID:        tag + strconv.Itoa(i),
			ProjectID: project,
			GroupHash: fmt.Sprint("g", i%groups),
			Time:      start.Add(span * time.Duration(i) / time.Duration(n)),
			Rules:     []*rules.Rule{rule},
		}
	}
	return evs
}

// BenchmarkAlgorithms compares Klaxon's engine with Hawk's fixed window and
// the sorted-set log on the same workload: a rule of 10,000 events per
// minute, events spread over 10 groups or all in one (a single error's
// storm), sent in pipelined batches. "floor" runs the bare commands of an
// idempotent counter (baseline/floor.lua): it counts nothing and so misses
// the trap, and bounds what a call can cost. Reported per algorithm and
// batch size: events/s, Redis round trips, commands and
// script time (EVALSHA's usec in INFO commandstats) per event, MEMORY USAGE
// of one group's counters after 10,000 events in 60 s, and of the ids kept
// to recognise redeliveries per event, and alerts missed on DESIGN.md's
// fixed-window trap. Run:
//
//	go test -run '^$' -bench Algorithms -benchtime 20000x ./internal/counter
func BenchmarkAlgorithms(b *testing.B) {
	rdb := countTrips(testRedis(b))
	rule := mustRule(b, seenMore(rules.WindowSpec{Threshold: 10_000, Period: 60_000}))
	trapRule := mustRule(b, seenMore(rules.WindowSpec{Threshold: 1000, Period: 120_000}))
	for _, groups := range []int{10, 1} {
		for _, batch := range []int{1, 10, 100, 256, 1000} {
			for i, algo := range algorithms(b, rdb, "", rule) {
				b.Run(fmt.Sprintf("%s/groups=%d/batch=%d", algo.name, groups, batch), func(b *testing.B) {
					benchmarkAlgorithm(b, rdb, rule, trapRule, i, groups, batch)
				})
			}
		}
	}
}

// benchmarkAlgorithm runs algorithm i on 10,000 events a minute over groups,
// in batches, and reports its metrics.
func benchmarkAlgorithm(b *testing.B, rdb *tripCounter, rule, trapRule *rules.Rule, i, groups, batch int) {
	ctx := context.Background()
	prefix := testPrefix(b, rdb)
	algo := algorithms(b, rdb, prefix, rule)[i]
	mem, dedup := memoryPerKey(b, rdb, prefix, rule, i)
	missed := missedOnTrap(b, rdb, prefix, trapRule, i)

	evs := stream(rule, time.Now().Add(-time.Hour), time.Duration(b.N)*6*time.Millisecond, b.N, groups, "bench")
	// The INFO that reads the commands is the only one they include.
	scripts := scriptMicros(ctx, rdb)
	commands := commandsProcessed(ctx, rdb)
	trips := rdb.trips.Load()
	b.ResetTimer()
	for lo := 0; lo < len(evs); lo += batch {
		if _, err := algo.observe(ctx, evs[lo:min(lo+batch, len(evs))]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(n/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(rdb.trips.Load()-trips)/n, "roundtrips/event")
	// INFO itself is one command.
	b.ReportMetric(float64(commandsProcessed(ctx, rdb)-commands-1)/n, "rediscmds/event")
	b.ReportMetric((scriptMicros(ctx, rdb)-scripts)/n, "scriptµs/event")
	b.ReportMetric(mem, "bytes/key")
	b.ReportMetric(dedup, "dedupbytes/event")
	b.ReportMetric(float64(missed), "missed/trap")
	b.ReportMetric(0, "ns/op")
}

// memoryPerKey feeds 10,000 events in 60 s to one group and returns the
// MEMORY USAGE of the group's counter key(s), and of its de-duplication
// entries per event.
func memoryPerKey(b *testing.B, rdb *tripCounter, prefix string, rule *rules.Rule, algo int) (float64, float64) {
	ctx := context.Background()
	mprefix := prefix + ":mem"
	a := algorithms(b, rdb, mprefix, rule)[algo]
	evs := stream(rule, time.Now().Add(-2*time.Minute), time.Minute, 10_000, 1, "mem")
	for lo := 0; lo < len(evs); lo += 500 {
		if _, err := a.observe(ctx, evs[lo:lo+500]); err != nil {
			b.Fatal(err)
		}
	}
	keys, err := rdb.Keys(ctx, mprefix+":*").Result()
	if err != nil || len(keys) == 0 {
		b.Fatalf("no keys after 10,000 events: %v", err)
	}
	var total, dedup int64
	for _, k := range keys {
		// SAMPLES 0: measure every element, not an estimate from five.
		n, err := rdb.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			b.Fatal(err)
		}
		switch {
		case strings.Contains(k, ":m:"), strings.Contains(k, "}:d:"): // ids: floor's keys, klaxon's pages
			dedup += n
		case strings.HasSuffix(k, "}:s"):
			// Klaxon's state keeps a slot's first ids inline (header bytes
			// 16 and 35: their lengths): they are ids, not counters.
			h, err := rdb.GetRange(ctx, k, 0, headerSize-1).Bytes()
			if err != nil || len(h) < headerSize {
				b.Fatalf("state %s: %v", k, err)
			}
			inline := int64(binary.LittleEndian.Uint32(h[16:])) + int64(binary.LittleEndian.Uint32(h[35:]))
			dedup += inline
			total += n - inline
		default:
			total += n
		}
	}
	return float64(total), float64(dedup) / float64(len(evs))
}

// missedOnTrap runs DESIGN.md's trap (1000 in 2 min: 1, 900, 900 events in
// three consecutive minutes) and returns 1 if the algorithm never fired.
func missedOnTrap(b *testing.B, rdb *tripCounter, prefix string, rule *rules.Rule, algo int) int {
	ctx := context.Background()
	a := algorithms(b, rdb, prefix+":trap", rule)[algo]
	start := time.Now().Add(-time.Hour)
	fired := 0
	for m, n := range []int{1, 900, 900} {
		evs := stream(rule, start.Add(time.Duration(m)*time.Minute), time.Minute, n, 1, fmt.Sprint("trap", m, "-"))
		f, err := a.observe(ctx, evs)
		if err != nil {
			b.Fatal(err)
		}
		fired += f
	}
	if fired == 0 {
		return 1
	}
	return 0
}

// commandsProcessed is Redis' count of the commands it ran, scripts' own
// commands included.
func commandsProcessed(ctx context.Context, rdb *tripCounter) int64 {
	n, _ := strconv.ParseInt(infoField(ctx, rdb, "stats", "total_commands_processed"), 10, 64)
	return n
}

// scriptMicros is Redis' time in EVALSHA so far, in µs: the scripts' own
// cost, without the network or the client.
func scriptMicros(ctx context.Context, rdb *tripCounter) float64 {
	for _, kv := range strings.Split(infoField(ctx, rdb, "commandstats", "cmdstat_evalsha"), ",") {
		if v, ok := strings.CutPrefix(kv, "usec="); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return n
		}
	}
	return 0
}

// redisCPU is the Redis server's CPU time so far (user and system), in µs:
// unlike a command's usec it does not grow while Redis waits for a core.
func redisCPU(ctx context.Context, rdb *tripCounter) float64 {
	var total float64
	for _, key := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, _ := strconv.ParseFloat(infoField(ctx, rdb, "cpu", key), 64)
		total += v
	}
	return total * 1e6
}

// infoField is the value of a "key:value" line in a section of INFO.
func infoField(ctx context.Context, rdb *tripCounter, section, key string) string {
	for _, line := range strings.Split(rdb.Info(ctx, section).Val(), "\r\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return v
		}
	}
	return ""
}

// tripCounter counts the client's round trips: one per command sent alone,
// one per pipeline.
type tripCounter struct {
	*redis.Client
	trips atomic.Int64
}

func countTrips(c *redis.Client) *tripCounter {
	t := &tripCounter{Client: c}
	c.AddHook(t)
	return t
}

func (t *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (t *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		t.trips.Add(1)
		return next(ctx, cmd)
	}
}

func (t *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		t.trips.Add(1)
		return next(ctx, cmds)
	}
}
