package counter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/rules"
)

// spikeStream is an hour and more of two groups under one rule: "busy",
// 60 events a minute all along and then a burst of 400 in a minute, and
// "quiet", an event every ten minutes and then 70 in a minute. Events are
// a second apart or less, in time order, from start.
func spikeStream(start time.Time, rs ...*rules.Rule) []Event {
	var evs []Event
	add := func(group string, at time.Duration) {
		evs = append(evs, Event{ID: fmt.Sprint("m", len(evs)), ProjectID: project, GroupHash: group,
			Time: start.Add(at), Rules: rs})
	}
	const steady = 70 * time.Minute
	for at := time.Duration(0); at < steady; at += time.Second {
		add("busy", at)
		if at%(10*time.Minute) == 0 {
			add("quiet", at)
		}
	}
	for i := range 70 {
		add("quiet", steady+time.Duration(i)*500*time.Millisecond)
	}
	for i := range 400 {
		add("busy", steady+2*time.Minute+time.Duration(i)*150*time.Millisecond)
	}
	return evs
}

// A spike rule ("50 in a minute, and 5× the last hour's rate, which is at
// least 13 a minute") under a busy and a quiet group fires for the quiet
// group's real spike and for the busy group's burst, never for the busy
// group's normal volume, which a plain "50 in a minute" rule fires on
// every minute — exactly as the model says, counted in the worker or by
// the script. The floor is what keeps the busy group quiet in its first
// hour, while its baseline holds less than an hour of its volume.
func TestSpikeFiresForTheQuietGroupNotForTheBusyGroupsVolume(t *testing.T) {
	rdb := testRedis(t)
	spike := mustRule(t, seenMore(rules.WindowSpec{Threshold: 50, Period: 60_000,
		Spike: &rules.SpikeSpec{Factor: 5, Baseline: 3_600_000, Floor: 13}}))
	plain := mustRule(t, seenMore(rules.WindowSpec{Threshold: 50, Period: 60_000}))
	start := time.Now().Add(-2 * time.Hour).Truncate(time.Minute)
	steadyEnd := start.Add(70 * time.Minute)
	for _, scriptOnly := range []bool{false, true} {
		t.Run(fmt.Sprint("scriptOnly=", scriptOnly), func(t *testing.T) {
			e := New(rdb, Options{Verbose: true, Prefix: testPrefix(t, rdb)})
			e.scriptOnly = scriptOnly
			model := NewModel()
			evs := spikeStream(start, spike, plain)
			fired := map[string][]Outcome{} // by group: the spike rule's firings
			plainFired := map[string]int{}
			var last Outcome // the quiet group's, last
			for lo := 0; lo < len(evs); lo += 200 {
				batch := evs[lo:min(lo+200, len(evs))]
				got := observe(t, e, batch...)
				for i, ev := range batch {
					want := model.Observe(ev, got[i].Time)
					if err := sameResult(got[i], want); err != nil {
						t.Fatalf("event %s (group %s, %v after start): %v", ev.ID, ev.GroupHash, ev.Time.Sub(start), err)
					}
					if o := got[i].Outcomes[0]; o.Fired {
						fired[ev.GroupHash] = append(fired[ev.GroupHash], o)
					}
					if got[i].Outcomes[1].Fired {
						plainFired[ev.GroupHash]++
					}
					if ev.GroupHash == "quiet" {
						last = got[i].Outcomes[0]
					}
				}
			}
			if plainFired["busy"] < 60 {
				t.Errorf("the plain rule fired %d times for the busy group's 60 a minute, want every minute", plainFired["busy"])
			}
			for _, group := range []string{"quiet", "busy"} {
				if len(fired[group]) != 1 || fired[group][0].At.Before(steadyEnd) {
					t.Fatalf("the spike rule fired for group %s %d times (%v), want once, at its burst", group, len(fired[group]), fired[group])
				}
			}
			q, b := fired["quiet"][0], fired["busy"][0]
			if q.Counts[0] != 65 || q.Baseline(0) != 65+6 {
				t.Errorf("quiet group fired at count %d, baseline %d: want 65 (5× the floor), and those and its 6 earlier events of the last hour (one bucket more)", q.Counts[0], q.Baseline(0))
			}
			if r := spike.Windows[0].Rate(b.Baseline(0)); float64(b.Counts[0]) < 5*r || r < 60 {
				t.Errorf("busy group fired at count %d, rate %.1f: want 5× a rate over 60", b.Counts[0], r)
			}
			// Inspect reads the same counts, the baseline's too.
			outs, _, err := e.Inspect(context.Background(), project, "quiet", []*rules.Rule{spike})
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(outs[0].Counts) != fmt.Sprint(last.Counts) || outs[0].Baseline(0) != last.Baseline(0) {
				t.Errorf("inspect: counts %v, the last event's %v", outs[0].Counts, last.Counts)
			}
		})
	}
}
