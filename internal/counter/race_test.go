package counter

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/rules"
)

// Eight workers, each with its own Redis connection, hammer the same groups
// in random interleavings: every event is counted once, and each crossing
// fires exactly once, with one id. With state caches, every worker's cached
// states go stale under the others' writes, and are counted again from the
// state cas.lua answers.
func TestConcurrentWorkersFireOnce(t *testing.T) {
	for _, cache := range []int64{0, 1 << 20} {
		t.Run(fmt.Sprint("cache=", cache), func(t *testing.T) { concurrentWorkers(t, cache) })
	}
}

func concurrentWorkers(t *testing.T, cache int64) {
	rdb := testRedis(t)
	prefix := testPrefix(t, rdb)
	threshold := mustRule(t, seenMore(rules.WindowSpec{Threshold: 400, Period: 3_600_000}))
	fresh := mustRule(t, rules.Spec{WhatToReceive: rules.OnlyNew})

	const workers, perWorker, batch, groups = 8, 500, 25, 10
	start := time.Now().Add(-time.Hour).UnixMilli()
	var mu sync.Mutex
	firings := map[string]int{} // rule:group -> firings
	ids := map[string]int{}
	var wg sync.WaitGroup
	var cached, changed int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, DB: rdb.Options().DB})
			defer client.Close()
			e := New(client, Options{Verbose: true, Prefix: prefix, StateCacheBytes: cache})
			defer func() {
				mu.Lock()
				cached, changed = cached+e.cachedStates.Load(), changed+e.changedStates.Load()
				mu.Unlock()
			}()
			for b := 0; b < perWorker; b += batch {
				evs := make([]Event, batch)
				for i := range evs {
					n := int64(w*perWorker + b + i)
					evs[i] = Event{
						ID: fmt.Sprint("m", n), ProjectID: project, GroupHash: fmt.Sprint("g", n%groups),
						Time:  time.UnixMilli(start + n),
						Rules: []*rules.Rule{threshold, fresh},
					}
				}
				res, err := e.ObserveBatch(context.Background(), 0, evs)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for i, r := range res {
					for k, o := range r.Outcomes {
						if o.Fired {
							firings[fmt.Sprint(k, evs[i].GroupHash)]++
							ids[o.ID]++
						}
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("states from the cache: %d, answered changed by cas.lua: %d", cached, changed)
	if cache > 0 && (cached == 0 || changed == 0) {
		t.Errorf("states from the cache %d, answered changed %d: want both paths tried", cached, changed)
	}
	// Each group gets 400 events: the threshold rule crosses once per group.
	for g := range groups {
		for k, name := range []string{"threshold", "ONLY_NEW"} {
			if n := firings[fmt.Sprint(k, "g", g)]; n != 1 {
				t.Errorf("group g%d: %s fired %d times, want 1", g, name, n)
			}
		}
	}
	if len(ids) != 2*groups {
		t.Errorf("%d distinct firing ids, want %d", len(ids), 2*groups)
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("firing id %s reported %d times", id, n)
		}
	}
	e := New(rdb, Options{Verbose: true, Prefix: prefix})
	for g := range groups {
		res := observe(t, e, Event{ProjectID: project, GroupHash: fmt.Sprint("g", g), Time: time.UnixMilli(start), Rules: []*rules.Rule{threshold}})
		if got, want := res[0].Outcomes[0].Counts[0], int64(workers*perWorker/groups+1); got != want {
			t.Errorf("group g%d count %d, want %d: every event counted once", g, got, want)
		}
	}
}
