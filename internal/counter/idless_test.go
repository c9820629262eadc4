package counter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/rules"
)

// scriptCalls counts the EVALSHAs a client sends, by script.
type scriptCalls struct {
	observe, cas string // SHAs
	nObserve     atomic.Int64
	nCAS         atomic.Int64
}

func (s *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.count(cmd)
		return next(ctx, cmd)
	}
}

func (s *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			s.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (s *scriptCalls) count(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 2 || cmd.Name() != "evalsha" {
		return
	}
	switch args[1] {
	case s.observe:
		s.nObserve.Add(1)
	case s.cas:
		s.nCAS.Add(1)
	}
}

// TestIdlessStreamCountsOnTheFastPath feeds the stream of tools/bench
// -workload idless (events without id, repetition or time, the same body
// for every event of a group; 100 projects × 5 SEEN_MORE rules of 1 h and
// 1 day, 5,000 groups, one in a hundred four times busier) in batches of
// 1,000, as a worker draining a backlog makes them. Every group is
// counted in the worker, every delivery counts, identical bodies in one
// batch included, and the script calls a batch makes are cas.lua's, one per
// 256 groups: none is observe.lua's.
func TestIdlessStreamCountsOnTheFastPath(t *testing.T) {
	const (
		projects, nrules, groups = 100, 5, 5000
		batches, batchSize       = 10, 1000
		mean                     = 40 // events per group of tools/bench's 200,000
	)
	rdb := testRedis(t)
	e := New(rdb, Options{Prefix: testPrefix(t, rdb), Verbose: true})
	calls := &scriptCalls{observe: e.script.Hash(), cas: e.cas.Hash()}
	rdb.AddHook(calls)
	ruleSets := make([][]*rules.Rule, projects)
	for p := range ruleSets {
		for k := range nrules {
			period := int64(3_600_000)
			if k%2 == 1 {
				period = 86_400_000
			}
			s := rules.Spec{ID: fmt.Sprint("rule-", k), IsEnabled: true, WhatToReceive: rules.SeenMore,
				Threshold: int64(mean * (1.5 + 0.5*float64(k))), ThresholdPeriod: period}
			r, _, err := rules.Compile(fmt.Sprintf("%024x", p), s)
			if err != nil {
				t.Fatal(err)
			}
			ruleSets[p] = append(ruleSets[p], r)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	busy := rng.Perm(groups)[:groups/100]
	counted := make([]int64, groups) // deliveries so far, by group
	ctx := context.Background()
	var wantCAS int64
	repeats := 0 // events of a group seen before in their batch
	for range batches {
		evs := make([]Event, batchSize)
		order := make([]int, batchSize)
		inBatch := map[int]int{}
		for i := range evs {
			g := rng.IntN(groups + 3*len(busy))
			if g >= groups {
				g = busy[(g-groups)/3]
			}
			order[i] = g
			if inBatch[g]++; inBatch[g] > 1 {
				repeats++
			}
			p := g % projects
			evs[i] = Event{ProjectID: fmt.Sprintf("%024x", p), GroupHash: fmt.Sprintf("%064x", g), Rules: ruleSets[p],
				Body: fmt.Appendf(nil, `{"projectId":"%024x","event":{"title":"Error [%d]","groupHash":"%064x"}}`, p, g, g)}
		}
		wantCAS += int64((len(inBatch) + e.storesPerCall - 1) / e.storesPerCall)
		res, err := e.ObserveBatch(ctx, 0, evs)
		if err != nil {
			t.Fatal(err)
		}
		for i, g := range order {
			counted[g]++
			if n := res[i].Outcomes[0].Counts[0]; n != counted[g] {
				t.Fatalf("event %d, delivery %d of its group: counted %d", i, counted[g], n)
			}
		}
	}
	if repeats == 0 {
		t.Fatal("no group had identical bodies in a batch")
	}
	fast, script := e.fastGroups.Load(), e.scriptGroups.Load()
	t.Logf("%d events (%d repeats of a body in its batch): %d groups fast, %d by observe.lua; %d observe.lua calls, %d cas.lua calls (%.4f a event)",
		batches*batchSize, repeats, fast, script, calls.nObserve.Load(), calls.nCAS.Load(), float64(calls.nCAS.Load())/(batches*batchSize))
	if script != 0 || calls.nObserve.Load() != 0 {
		t.Errorf("%d groups, %d calls went to observe.lua", script, calls.nObserve.Load())
	}
	if calls.nCAS.Load() != wantCAS {
		t.Errorf("%d cas.lua calls, want %d (one per %d groups of a batch)", calls.nCAS.Load(), wantCAS, e.storesPerCall)
	}
	if share := float64(calls.nCAS.Load()+calls.nObserve.Load()) / (batches * batchSize); share > 0.005 {
		t.Errorf("script calls are %.2f%% of events: want at most 0.5%%", 100*share)
	}
}
