package counter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// Slots move while events flow: redis-cli --cluster reshard sends the same
// slots from one master to another and back, again and again, while
// streams whose groups live in those slots are counted, with repeats (the
// firing records), enough ids a group for pages of ids, and rules that
// count users (their sorted sets). Every event's firings, replays
// included, must be the model's; a batch that failed while its slot moved
// is observed again with its token, as the worker does, and counts once.
func TestClusterReshardingMidStream(t *testing.T) {
	testenv.ReshardPhase(t)
	c := testenv.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()

	// redis-cli takes the lowest-numbered slots of the source, so these
	// go round, 0 → 1 → 2 → 0 …: moving slots straight back to the node
	// they just left makes Redis 7.0 lose track of their owner now and
	// then (each node names the other), which no client can work around.
	const moved = 64
	slots := c.Slots(0)[:moved]
	const reshards, refusals, limit = 16, 60, 3 * time.Minute
	var done atomic.Int32
	var refused atomic.Int64
	var finished atomic.Bool
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	reshardErr := make(chan error, 1)
	start := time.Now()
	go func() {
		defer close(reshardErr)
		defer finished.Store(true)
		for r := 0; (done.Load() < reshards || refused.Load() < refusals) && time.Since(start) < limit && rctx.Err() == nil; r++ {
			if out, err := c.Reshard(rctx, r%3, (r+1)%3, moved); err != nil {
				if rctx.Err() == nil {
					reshardErr <- fmt.Errorf("%w\n%s", err, tail(out, 2000))
				}
				return
			}
			done.Add(1)
		}
	}()

	const streams = 3
	var wg sync.WaitGroup
	stats := make([]reshardStats, streams)
	for s := range streams {
		wg.Go(func() {
			stats[s] = reshardStream(t, rdb, uint64(s), slots, &refused, finished.Load)
		})
	}
	wg.Wait()
	stop()
	if err := <-reshardErr; err != nil {
		t.Fatalf("a reshard failed while the engine counted: %v", err)
	}
	var total reshardStats
	for _, st := range stats {
		total.events += st.events
		total.firings += st.firings
		total.retries += st.retries
		total.duplicates += st.duplicates
		total.slotRetries += st.slotRetries
	}
	t.Logf("%d reshards of %d slots; %d events, %d firings (replays included) as the model's; "+
		"%d script calls refused while their slot moved and sent again, %d batches observed again, %d repeats",
		done.Load(), moved, total.events, total.firings, total.slotRetries, total.retries, total.duplicates)
	if t.Failed() {
		return
	}
	if done.Load() < reshards || total.firings == 0 || total.duplicates == 0 || total.slotRetries < refusals {
		t.Errorf("a weak run: %d reshards, %d firings, %d repeats, %d calls met a migrating slot",
			done.Load(), total.firings, total.duplicates, total.slotRetries)
	}
}

type reshardStats struct{ events, firings, retries, duplicates, slotRetries int }

// reshardStream counts a random stream into groups of the moving slots
// until enough reshards are done, comparing every event's firings with
// the model's.
func reshardStream(t *testing.T, rdb *redis.ClusterClient, seed uint64, slots []int, refused *atomic.Int64, enough func() bool) reshardStats {
	rng := rand.New(rand.NewPCG(seed, 0x7265736861726421))
	e := New(rdb, Options{Prefix: testPrefix(t, rdb)})
	project := fmt.Sprintf("reshard-%d", seed)
	groups := groupsInSlots(t, rdb, e.prefix, project, slots, 16)
	rs := []*rules.Rule{
		mustRule(t, seenMore(rules.WindowSpec{Threshold: 5, Period: 3000})),
		mustRule(t, rules.Spec{WhatToReceive: rules.SeenMore, Including: []string{"db"}, Cooldown: 20_000,
			Windows: []rules.WindowSpec{{Threshold: 12, Period: 10_000}, {Threshold: 40, Period: 60_000}}}),
		mustRule(t, rules.Spec{WhatToReceive: rules.SeenMore, CountBy: rules.CountUsers,
			Windows: []rules.WindowSpec{{Threshold: 3, Period: 5000}}}),
		mustRule(t, rules.Spec{WhatToReceive: rules.OnlyNew}),
	}
	titles := []string{"DB timeout", "TypeError", "db down"}
	users := []string{"u1", "u2", "u3", "u4", "u5"}
	model := NewModel()
	clock := time.Now().Add(-12 * time.Hour).UnixMilli()
	var sent []Event
	var st reshardStats
	for !enough() || len(sent) < 2000 {
		if t.Failed() || len(sent) > 2_000_000 {
			return st
		}
		batch := make([]Event, 1+rng.IntN(60))
		for i := range batch {
			if len(sent) > 0 && rng.IntN(12) == 0 {
				batch[i] = sent[rng.IntN(len(sent))] // a redelivery: replays its firings
				batch[i].Redelivered = true
				continue
			}
			clock += rng.Int64N(60)
			at := clock
			if rng.IntN(10) == 0 {
				at -= rng.Int64N(8000) // late
			}
			title, isNew := titles[rng.IntN(len(titles))], rng.IntN(20) == 0
			var matched []*rules.Rule
			for _, r := range rs {
				if r.Matches(title, isNew) {
					matched = append(matched, r)
				}
			}
			batch[i] = Event{ID: fmt.Sprintf("m%d-%d", len(sent), i), ProjectID: project,
				GroupHash: groups[rng.IntN(len(groups))], UserID: users[rng.IntN(len(users))],
				Time: time.UnixMilli(at), Rules: matched}
		}
		got, retries := observeUntilDone(t, e, rng.Int64N(1<<52)+1, batch)
		st.retries += retries
		for i, ev := range batch {
			if len(ev.Rules) == 0 {
				continue
			}
			want := model.Observe(ev, ev.Time)
			if want.Duplicate {
				st.duplicates++
			}
			if !got[i].Time.Equal(ev.Time) {
				t.Errorf("stream %d event %s: counted at %v, sent %v", seed, ev.ID, got[i].Time, ev.Time)
				return st
			}
			g, w := firedIDs(got[i]), firedIDs(want)
			if !slices.Equal(g, w) {
				t.Errorf("stream %d event %s (group %s, t=%d, repeat %v, duplicate %v, the model's %v): fired %v, the model %v",
					seed, ev.ID, ev.GroupHash, ev.Time.UnixMilli(), ev.Redelivered, got[i].Duplicate, want.Duplicate, g, w)
				return st
			}
			st.firings += len(w)
		}
		st.events += len(batch)
		refused.Add(e.slotRetries.Load() - int64(st.slotRetries))
		st.slotRetries = int(e.slotRetries.Load())
		sent = append(sent, batch...)
	}
	return st
}

// observeUntilDone observes a batch, and again with the same token after
// an error, as the worker holds and retries a batch, for up to a minute.
func observeUntilDone(t *testing.T, e *Engine, token int64, batch []Event) ([]Result, int) {
	deadline := time.Now().Add(time.Minute)
	for retries := 0; ; retries++ {
		got, err := e.ObserveBatch(context.Background(), token, batch)
		if err == nil {
			return got, retries
		}
		if time.Now().After(deadline) {
			t.Fatalf("a batch failed for a minute: %v", err)
		}
		if retries < 3 {
			t.Logf("batch failed, observing it again: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // the worker's hold before a retry, shortened
	}
}

// firedIDs are the ids of the firings a result tells, fresh or replayed:
// what the worker publishes, and the deliverer sends once per id.
func firedIDs(r Result) []string {
	var ids []string
	for _, o := range r.Outcomes {
		if o.Fired {
			ids = append(ids, o.ID)
		}
	}
	slices.Sort(ids)
	return ids
}

// groupsInSlots names n groups of project whose keys live in slots.
func groupsInSlots(t *testing.T, rdb *redis.ClusterClient, prefix, project string, slots []int, n int) []string {
	in := make(map[int64]bool, len(slots))
	for _, s := range slots {
		in[int64(s)] = true
	}
	var groups []string
	for i := 0; len(groups) < n; i++ {
		g := fmt.Sprint("g", i)
		slot, err := rdb.ClusterKeySlot(context.Background(), GroupKey(prefix, project, g)+":s").Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT: %v", err)
		}
		if in[slot] {
			groups = append(groups, g)
		}
		if i > 100_000 {
			t.Fatal("no group name falls in the moving slots")
		}
	}
	return groups
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
