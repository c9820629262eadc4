// Package counter decides, atomically and for any number of workers, whether
// an event makes a rule fire. Counts live in Redis and are updated by a Lua
// script (observe.lua): one call for up to 32 (project, group)s of a batch,
// or on Redis Cluster one per (project, group); model.go states the same
// semantics in plain Go.
//
// Semantics, per (rule, group):
//   - An event counts at its own time te: its timestamp clamped to Redis' now,
//     or Redis' now when it has none.
//   - The rule's clock L is the newest te seen. Each window counts the events
//     in the window ending at L, in buckets of Resolution(period): a count may
//     include events up to one bucket older than the window and never misses
//     one inside it. A late event counts in the bucket where it belongs, as
//     long as that bucket is still inside the window.
//   - The rule fires at the first event at which, with L at or past the rearm
//     time, some window's count reaches its threshold; it then stays quiet
//     until L + cooldown. A rule without windows (ONLY_NEW) fires at every
//     event while armed, so its cooldown (24 h) makes it once per group.
//   - countBy users counts distinct users whose newest event is in the window.
package counter

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/rules"
)

//go:embed observe.lua
var observeLua string

// Resolution is the bucket width of a window of the given period: period/60,
// but at least 100 ms. A count may include events up to this much older than
// the window.
func Resolution(period time.Duration) time.Duration {
	b := (period / 60).Truncate(time.Millisecond)
	return max(b, 100*time.Millisecond)
}

// buckets is how many buckets a window of this period keeps: enough for the
// span from floor((L-period)/b) to floor(L/b).
func buckets(period time.Duration) int64 {
	b := Resolution(period).Milliseconds()
	p := period.Milliseconds()
	return (p+b-1)/b + 1
}

// Event is one incoming event with the rules it matched.
type Event struct {
	// ID identifies the message for de-duplication: a redelivered message
	// with the same ID neither counts nor fires again, but gets its first
	// result back. Empty means no de-duplication.
	ID        string
	ProjectID string
	GroupHash string
	// UserID is counted by rules that count users; empty counts for nothing there.
	UserID string
	// Time is when the event happened; zero means Redis' now.
	Time  time.Time
	Rules []*rules.Rule
}

// Result is what observing one event decided.
type Result struct {
	// Time is when the event counted (its clamped timestamp, or Redis' now).
	Time time.Time
	// Duplicate is true when the event's ID was seen before: nothing was
	// counted, and the outcomes that fired then are reported as then; the
	// others are empty (not fired, no counts).
	Duplicate bool
	// Outcomes has one entry per rule of the event, in the same order.
	Outcomes []Outcome
}

// Outcome is one rule's state after an event.
type Outcome struct {
	Rule *rules.Rule
	// Fired is true when the rule fires at this event.
	Fired bool
	// ID identifies the firing: the same events give the same ID, distinct
	// firings distinct IDs. Empty unless Fired.
	ID string
	// Window is the index in Rule.Windows of the window that fired, or -1.
	Window int
	// Counts holds every window's count, in Rule.Windows order.
	Counts []int64
	// At is the rule's clock: the newest event time seen for the group.
	At time.Time
	// Rearm is when the rule may fire again for the group.
	Rearm time.Time
}

// ResetAt is when window i will have slid past every event it counts now,
// if no more events come.
func (o *Outcome) ResetAt(i int) time.Time {
	p := o.Rule.Windows[i].Period
	if o.Rule.Users {
		return o.At.Add(p)
	}
	b := Resolution(p).Milliseconds()
	newest := o.At.UnixMilli() / b
	return time.UnixMilli((newest + 1) * b).Add(p)
}

// FiringID is the deterministic id of a firing of rule for group at clock t.
func FiringID(projectID, ruleID, groupHash string, t time.Time) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%d", projectID, ruleID, groupHash, t.UnixMilli())
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Options configure an Engine. The zero value works.
type Options struct {
	// Prefix namespaces every key [klaxon].
	Prefix string
	// DedupTTL is how long an event ID is remembered [10m]. A message
	// redelivered later than that counts again.
	DedupTTL time.Duration
	// GroupsPerCall is how many (project, group)s one script call counts
	// on a single node or Sentinel [32]. Such a call touches keys of several
	// hash slots: set 1 behind a proxy that routes commands by key. On
	// Cluster (and Ring) it is always 1.
	GroupsPerCall int
}

// Engine counts events in Redis.
type Engine struct {
	rdb      redis.UniversalClient
	script   *redis.Script
	prefix   string
	dedupTTL int64
	// groupsPerCall is Options.GroupsPerCall, 1 where keys of different
	// hash slots may live on different nodes.
	groupsPerCall int
}

// New returns an engine on rdb (single node, Sentinel or Cluster).
func New(rdb redis.UniversalClient, opts Options) *Engine {
	if opts.Prefix == "" {
		opts.Prefix = "klaxon"
	}
	if opts.DedupTTL <= 0 {
		opts.DedupTTL = 10 * time.Minute
	}
	if opts.GroupsPerCall <= 0 {
		opts.GroupsPerCall = 32
	}
	if _, single := rdb.(*redis.Client); !single {
		opts.GroupsPerCall = 1
	}
	return &Engine{
		rdb:           rdb,
		script:        redis.NewScript(observeLua),
		prefix:        opts.Prefix,
		dedupTTL:      opts.DedupTTL.Milliseconds(),
		groupsPerCall: opts.GroupsPerCall,
	}
}

// group is the events of one (project, group) in a batch.
type group struct {
	base   string
	events []int // indexes into the batch
}

// call is one script call: the events of up to groupsPerCall groups.
type call struct {
	groups []*group
	keys   []string
	rules  []*rules.Rule
	index  map[ruleKey]int // into rules
	args   []any
	cmd    *redis.Cmd
}

// Observe counts a batch of events and returns one Result per event, in
// order; an event without rules costs nothing and gets a zero Result. It
// costs one Redis round trip (per Cluster node): script calls of up to 32
// (project, group)s, or on Cluster one per (project, group), pipelined.
// Observing the same batch again after an error is safe for events with an
// ID.
func (e *Engine) Observe(ctx context.Context, events []Event) ([]Result, error) {
	calls := e.plan(events)
	if len(calls) == 0 {
		return make([]Result, len(events)), nil
	}
	if err := e.run(ctx, calls); err != nil {
		return nil, err
	}
	results := make([]Result, len(events))
	for _, c := range calls {
		if err := decode(c, events, results); err != nil {
			return nil, fmt.Errorf("decode reply for %s: %w", c.keys[0], err)
		}
	}
	return results, nil
}

// plan groups the events by (project, group), keeping their order, and the
// groups into calls.
func (e *Engine) plan(events []Event) []*call {
	byBase := make(map[string]*group)
	var groups []*group
	for i := range events {
		ev := &events[i]
		if len(ev.Rules) == 0 {
			continue
		}
		base := e.prefix + ":{" + ev.ProjectID + ":" + ev.GroupHash + "}"
		g := byBase[base]
		if g == nil {
			g = &group{base: base}
			byBase[base] = g
			groups = append(groups, g)
		}
		g.events = append(g.events, i)
	}
	// Enough groups a call to pay its fixed cost rarely, few enough that one
	// script, which Redis runs alone, ends within milliseconds.
	per := e.groupsPerCall
	var calls []*call
	for lo := 0; lo < len(groups); lo += per {
		c := &call{groups: groups[lo:min(lo+per, len(groups))]}
		for _, g := range c.groups {
			c.keys = append(c.keys, g.base)
		}
		calls = append(calls, c)
	}
	for _, c := range calls {
		c.args = e.args(c, events)
	}
	return calls
}

// ruleKey names a rule's state by id and version, not by pointer: a batch
// may hold the same rule from two snapshots of the rules, which must share
// a state.
type ruleKey struct{ id, version string }

// add counts r among the call's rules once, and returns its index there.
func (c *call) add(r *rules.Rule) int {
	k := ruleKey{r.ID, r.Version}
	if i, ok := c.index[k]; ok {
		return i
	}
	if c.index == nil {
		c.index = make(map[ruleKey]int)
	}
	c.index[k] = len(c.rules)
	c.rules = append(c.rules, r)
	return len(c.rules) - 1
}

// args encodes a call as the script's ARGV.
func (e *Engine) args(c *call, events []Event) []any {
	size := 2
	for _, g := range c.groups {
		size++
		for _, i := range g.events {
			size += 4 + len(events[i].Rules)
			for _, r := range events[i].Rules {
				c.add(r)
			}
		}
	}
	for _, r := range c.rules {
		size += 5 + 4*len(r.Windows)
	}
	args := make([]any, 0, size)
	args = append(args, e.dedupTTL, len(c.rules))
	for _, r := range c.rules {
		users := 0
		if r.Users {
			users = 1
		}
		args = append(args, r.ID+":"+r.Version, ruleTag(r.ID), r.Cooldown.Milliseconds(), users, len(r.Windows))
		for _, w := range r.Windows {
			args = append(args, w.Threshold, w.Period.Milliseconds(),
				Resolution(w.Period).Milliseconds(), buckets(w.Period))
		}
	}
	for _, g := range c.groups {
		args = append(args, len(g.events))
		for _, i := range g.events {
			ev := &events[i]
			ts := int64(-1)
			if !ev.Time.IsZero() {
				ts = eventMilli(ev.Time)
			}
			args = append(args, ev.ID, ts, ev.UserID, len(ev.Rules))
			for _, r := range ev.Rules {
				args = append(args, c.add(r)+1)
			}
		}
	}
	return args
}

// eventMilli is an event's time in ms for the script: 0 for any time before
// 1970, and -1 (Redis' now, where the script clamps every future time) for
// one too far ahead for int64 ms, where UnixMilli wraps around, often to a
// time before 1970 (a timestamp in nanoseconds sent as seconds does that).
func eventMilli(t time.Time) int64 {
	switch s := t.Unix(); {
	case s < 0:
		return 0
	case s >= math.MaxInt64/1000:
		return -1
	}
	return t.UnixMilli()
}

// run sends every call in one pipeline, loading the script once if Redis
// does not know it (after a restart or failover).
func (e *Engine) run(ctx context.Context, calls []*call) error {
	pending := calls
	for attempt := 0; ; attempt++ {
		_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range pending {
				c.cmd = e.script.EvalSha(ctx, p, c.keys, c.args...)
			}
			return nil
		})
		if err == nil {
			return nil
		}
		var missing []*call
		for _, c := range pending {
			if err := c.cmd.Err(); err != nil {
				if !redis.HasErrorPrefix(err, "NOSCRIPT") {
					return fmt.Errorf("observe %d groups from %s: %w", len(c.groups), c.keys[0], err)
				}
				missing = append(missing, c)
			}
		}
		if len(missing) == 0 {
			return fmt.Errorf("observe: %w", err)
		}
		if attempt > 0 {
			return fmt.Errorf("observe: script still missing after loading it: %w", err)
		}
		// Only the calls that did not run are sent again; the others counted.
		if err := e.load(ctx); err != nil {
			return err
		}
		pending = missing
	}
}

func (e *Engine) load(ctx context.Context) error {
	// A cluster client sends SCRIPT LOAD to every shard.
	if err := e.script.Load(ctx, e.rdb).Err(); err != nil {
		return fmt.Errorf("load observe script: %w", err)
	}
	return nil
}

// decode turns a call's flat reply into Results.
func decode(c *call, events []Event, results []Result) error {
	vals, err := c.cmd.Int64Slice()
	if err != nil {
		return err
	}
	r := &reply{vals: vals}
	for _, g := range c.groups {
		for _, i := range g.events {
			results[i] = r.result(&events[i])
		}
	}
	if r.err != nil {
		return r.err
	}
	if r.p != len(vals) {
		return fmt.Errorf("reply has %d values, decoded %d", len(vals), r.p)
	}
	return nil
}

// reply reads a script's flat reply; its first error sticks.
type reply struct {
	vals []int64
	p    int
	err  error
}

func (r *reply) next() int64 {
	if r.p >= len(r.vals) {
		if r.err == nil {
			r.err = errors.New("reply too short")
		}
		return 0
	}
	r.p++
	return r.vals[r.p-1]
}

// result reads one event's result.
func (r *reply) result(ev *Event) Result {
	te, dup, n := r.next(), r.next(), r.next()
	res := Result{Time: time.UnixMilli(te), Duplicate: dup != 0}
	if dup == 2 {
		res.Outcomes = r.replay(ev, int(n))
		return res
	}
	if int(n) != len(ev.Rules) {
		// A replay of a first observation made with other rules: the stored
		// outcomes do not line up with today's rules, so report none rather
		// than guess.
		if dup != 1 && r.err == nil {
			r.err = fmt.Errorf("reply has %d outcomes for %d rules", n, len(ev.Rules))
		}
		for range n {
			r.outcome(nil)
		}
		return res
	}
	res.Outcomes = make([]Outcome, n)
	for k, rule := range ev.Rules {
		o := r.outcome(rule)
		if o.Fired {
			o.ID = FiringID(ev.ProjectID, rule.ID, ev.GroupHash, o.At)
		}
		res.Outcomes[k] = o
	}
	return res
}

// replay reads the n tagged outcomes of a repeat whose first observation
// fired, and gives each to the event's rule of that tag: the rules matched
// may have changed since (an edit between a crash and the redelivery), and
// a firing must go to its own rule or, if that rule is gone or has another
// number of windows now, nowhere. Rules without a recorded outcome get an
// empty one.
func (r *reply) replay(ev *Event, n int) []Outcome {
	byTag := make(map[int64]int, len(ev.Rules))
	for i, rule := range ev.Rules {
		byTag[ruleTag(rule.ID)] = i
	}
	outs := make([]Outcome, len(ev.Rules))
	for i, rule := range ev.Rules {
		outs[i] = Outcome{Rule: rule, Window: -1, Counts: []int64{}}
	}
	for range n {
		tag := r.next()
		i, ok := byTag[tag]
		if !ok {
			r.outcome(nil)
			continue
		}
		o := r.outcome(ev.Rules[i])
		if len(o.Counts) != len(o.Rule.Windows) {
			// The rule has other windows now: what fired then cannot be
			// told in today's terms, so it is not told at all.
			continue
		}
		if o.Fired {
			o.ID = FiringID(ev.ProjectID, o.Rule.ID, ev.GroupHash, o.At)
		}
		outs[i] = o
	}
	return outs
}

// ruleTag is a number for a rule's id that Lua can store and give back
// exactly: 46 bits, so that Lua's own number formatting (14 digits) keeps it.
func ruleTag(id string) int64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	return int64(h.Sum64() >> 18)
}

// outcome reads one rule's outcome.
func (r *reply) outcome(rule *rules.Rule) Outcome {
	fired, at, rearm, which, nw := r.next(), r.next(), r.next(), r.next(), r.next()
	if nw < 0 || r.p+int(nw) > len(r.vals) {
		if r.err == nil {
			r.err = errors.New("reply too short")
		}
		return Outcome{}
	}
	counts := r.vals[r.p : r.p+int(nw) : r.p+int(nw)]
	r.p += int(nw)
	return Outcome{
		Rule:   rule,
		Fired:  fired == 1,
		Window: int(which),
		Counts: counts,
		At:     unixMilli(at),
		Rearm:  unixMilli(rearm),
	}
}

// unixMilli is t in ms, with 0 (a replay's empty outcome) as the zero time.
func unixMilli(t int64) time.Time {
	if t == 0 {
		return time.Time{}
	}
	return time.UnixMilli(t)
}
