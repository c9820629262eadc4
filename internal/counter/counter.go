// Package counter decides, atomically and for any number of workers, whether
// an event makes a rule fire. A group's counts live in one Redis string;
// the worker counts into it and stores it with a compare-and-set (fast.go,
// state.go, cas.lua), and where that cannot be (a state written meanwhile,
// a repeat or redelivery, users) observe.lua counts atomically in Redis:
// plan.go puts the groups into script calls, eval.go sends them and
// reply.go reads what they decided; tags.go names rules and rings in the
// state. model.go states the semantics in plain Go.
//
// Semantics, per (rule, group):
//   - An event counts at its own time te: its timestamp clamped to Redis' now,
//     or Redis' now when it has none.
//   - Rules of one title filter count the same events: each (filter, period)
//     has one ring of buckets of Resolution(period), whose window ends at the
//     newest te it has seen; a count may include events up to one bucket
//     older than the window and never misses one inside it. A late event
//     counts in the bucket where it belongs, if still inside the window.
//   - A spike window's baseline is one more ring, of the baseline's period;
//     such a window reaches its threshold only when its count is also at
//     least factor × the baseline's count scaled to the window's period, or
//     factor × floor if more (rules.Window.Reached).
//   - The rule's clock L is the newest te it has seen. The rule fires at the
//     first event at which, with L at or past the rearm time, some window's
//     count reaches its threshold; it then stays quiet until L + cooldown. A
//     rule without windows (ONLY_NEW) fires at every event while armed, so
//     its cooldown (24 h) makes it once per group.
//   - countBy users counts distinct users whose newest event is in the window.
//   - An event with an ID counts once; a repeat gets the firings of its first
//     delivery back. One without counts at every delivery, and a redelivered
//     one gets back the firings its body caused.
package counter

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/rules"
)

//go:embed observe.lua
var observeLua string

//go:embed cas.lua
var casLua string

// Resolution is the bucket width of a window of the given period: period/60,
// but at least 100 ms. A count may include events up to this much older than
// the window.
func Resolution(period time.Duration) time.Duration {
	b := (period / 60).Truncate(time.Millisecond)
	return max(b, 100*time.Millisecond)
}

// Event is one incoming event with the rules it matched.
type Event struct {
	// ID identifies the message (its AMQP message-id, or Hawk's
	// repetitionId): a redelivery with the same ID neither counts nor fires
	// again, but gets its first firings back. Empty means the message has
	// no identity, and every delivery of it counts.
	ID string
	// Body is the message as delivered. Without an ID, a copy that the
	// broker redelivers (Redelivered) counts again and also gets back the
	// firings a delivery of the same body caused, so that a crash between
	// counting and publishing the delivery jobs loses no notification.
	Body        []byte
	Redelivered bool
	ProjectID   string
	GroupHash   string
	// UserID is counted by rules that count users; empty counts for nothing there.
	UserID string
	// Time is when the event happened; zero means Redis' now.
	Time  time.Time
	Rules []*rules.Rule
}

// Result is what observing one event decided.
type Result struct {
	// Time is when the event counted, or would have (a duplicate): its
	// timestamp clamped to Redis' now, or Redis' now.
	Time time.Time
	// Duplicate is true when the event's ID was seen before: nothing was
	// counted, and the rules that fired then are reported as then.
	Duplicate bool
	// Outcomes has one entry per rule of the event, in the same order. Only
	// firings are reported, unless Options.Verbose: the others have
	// Window -1 and no counts.
	Outcomes []Outcome
}

// Outcome is one rule's state after an event.
type Outcome struct {
	Rule *rules.Rule
	// Fired is true when the rule fires at this event.
	Fired bool
	// Replayed is true for a firing that an earlier delivery of the same
	// message caused: it is told again, with the same ID.
	Replayed bool
	// ID identifies the firing: the same events give the same ID, distinct
	// firings distinct IDs. Empty unless Fired.
	ID string
	// Window is the index in Rule.Windows of the window that fired, or -1.
	Window int
	// Counts holds every window's count, in Rule.Windows order, then the
	// count of each spike window's baseline, in the same order (Baseline).
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

// Baseline is the count of window i's baseline, the events of its spike's
// baseline period; 0 for a plain window.
func (o *Outcome) Baseline(i int) int64 {
	k := len(o.Rule.Windows)
	for _, w := range o.Rule.Windows[:i] {
		if w.Spike != nil {
			k++
		}
	}
	if o.Rule.Windows[i].Spike == nil || k >= len(o.Counts) {
		return 0
	}
	return o.Counts[k]
}

// ringPeriods are the periods a rule's rings count over, in the order of
// its counts (Outcome.Counts): its windows', then each spike window's
// baseline's.
func ringPeriods(r *rules.Rule) []time.Duration {
	ps := make([]time.Duration, 0, countsOf(r))
	for _, w := range r.Windows {
		ps = append(ps, w.Period)
	}
	for _, w := range r.Windows {
		if w.Spike != nil {
			ps = append(ps, w.Spike.Baseline)
		}
	}
	return ps
}

// countsOf is how many counts a rule's outcomes have.
func countsOf(r *rules.Rule) int {
	n := len(r.Windows)
	for _, w := range r.Windows {
		if w.Spike != nil {
			n++
		}
	}
	return n
}

// firstReached is the first window of r that counts (in Outcome.Counts'
// order) make fire, or -1: as observe.lua's count decides.
func firstReached(r *rules.Rule, counts []int64) int {
	k := len(r.Windows) // where the next baseline's count is
	for i, w := range r.Windows {
		var base int64
		if w.Spike != nil {
			base = counts[k]
			k++
		}
		if w.Reached(counts[i], base) {
			return i
		}
	}
	return -1
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
	// DedupTTL is how long an event ID is remembered at least [10m]; it is
	// forgotten within twice that. A message redelivered later counts again.
	DedupTTL time.Duration
	// GroupsPerCall is how many (project, group)s one script call counts
	// on a single node or Sentinel [32], and a cas.lua call stores eight
	// times as many. Such a call touches keys of several hash slots: set 1
	// behind a proxy that routes commands by key. On Cluster (and Ring) it
	// is always 1.
	GroupsPerCall int
	// Verbose reports every rule's outcome with its counts, not only the
	// firings: for tests and tools; it makes replies larger.
	Verbose bool
	// WaitReplicas, when above 0, makes every write wait (Redis WAIT, on
	// the connection that wrote) until that many replicas acknowledged it,
	// for at most WaitTimeout [1s]; fewer fails the ObserveBatch, so that
	// the batch is held and tried again rather than acked on writes a
	// failover could lose. Single node and Sentinel only: on Cluster it is ignored
	// (a WAIT cannot follow a pipeline across nodes).
	WaitReplicas int
	WaitTimeout  time.Duration
	// StateCacheBytes bounds the memory that keeps the states this worker
	// stored, so that counting a group again needs no read of it [0: none].
	// A state another worker wrote since costs an answer of cas.lua, never
	// a wrong count.
	StateCacheBytes int64
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
	// storesPerCall bounds the groups of one cas.lua call: storing costs
	// Redis a fraction of counting, so eight times groupsPerCall, but 1
	// where a call must keep to one hash slot.
	storesPerCall int
	// eventsPerCall bounds a group's events in one observe.lua call.
	eventsPerCall int
	verbose       bool
	waitReplicas  int
	waitTimeout   time.Duration
	cas           *redis.Script
	states        *stateCache // nil: every state is read
	// scriptOnly counts every group with observe.lua (tests of the script).
	scriptOnly bool
	// Groups counted in the worker and stored, and counted by the script.
	fastGroups, scriptGroups atomic.Int64
	// Of those counted in the worker: states the cache gave, and states
	// cas.lua answered changed.
	cachedStates, changedStates atomic.Int64
	// Script calls sent again because their slot was migrating (cluster.go).
	slotRetries atomic.Int64
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
	if opts.WaitTimeout <= 0 {
		opts.WaitTimeout = time.Second
	}
	if _, single := rdb.(*redis.Client); !single {
		opts.GroupsPerCall = 1
		opts.WaitReplicas = 0
	}
	return &Engine{
		rdb:           rdb,
		script:        redis.NewScript(withLayout(observeLua)),
		cas:           redis.NewScript(withLayout(casLua)),
		prefix:        opts.Prefix,
		dedupTTL:      opts.DedupTTL.Milliseconds(),
		groupsPerCall: opts.GroupsPerCall,
		storesPerCall: storesPerCall(opts.GroupsPerCall),
		eventsPerCall: 32,
		verbose:       opts.Verbose,
		waitReplicas:  opts.WaitReplicas,
		waitTimeout:   opts.WaitTimeout,
		states:        newStateCache(opts.StateCacheBytes),
	}
}

func storesPerCall(groupsPerCall int) int {
	if groupsPerCall == 1 {
		return 1
	}
	return 8 * groupsPerCall
}

// GroupKey is the base of every Redis key of a (project, group): a hash of
// both, so that no crafted id can make two groups' keys meet, in a hash tag
// so that they share a Cluster slot.
func GroupKey(prefix, projectID, groupHash string) string {
	sum := sha256.Sum256([]byte(projectID + "\x00" + groupHash))
	return prefix + ":{" + hex.EncodeToString(sum[:12]) + "}"
}

// ObserveBatch counts a batch of events and returns one Result per event,
// in order; an event without rules costs nothing and gets a zero Result.
//
// Most groups cost Redis three commands (GET, and GETRANGE and SET in
// cas.lua, pages of a busy group aside), two where the state cache holds
// their state: their states are read, counted into by the worker
// (state.go) and written back by cas.lua if no other worker wrote them
// meanwhile (else counted again from the state cas.lua answers). The others (a repeat, a redelivery, users),
// are counted by observe.lua, atomically, in up to 32 (project, group)s a
// call, or on Cluster one.
//
// token (from 1 to 2^53-1) names the batch, the same at every attempt.
// Each group's state keeps the tokens of the last four writes, so that an
// attempt whose writes landed though its reply was lost (Redis stopped, a
// connection cut, a pipeline the client sent twice) is not counted again
// by the next one, with or without message ids: its events are reported as
// duplicates, with their firings. A token out of that range (0) gets a
// random one: observing the same events again after an error is then safe
// for events with an ID; one without may count twice (never zero times).
func (e *Engine) ObserveBatch(ctx context.Context, token int64, events []Event) ([]Result, error) {
	if token < 1 || token >= 1<<53 {
		// 0 is what an empty state holds: it would read as "counted".
		token = rand.Int64N(1<<53-1) + 1
	}
	b := &batch{events: events, keys: make([]string, len(events)), modes: make([]string, len(events)),
		results: make([]Result, len(events)), token: token}
	groups := e.group(b)
	if len(groups) == 0 {
		return b.results, nil
	}
	slow := groups
	if !e.scriptOnly {
		var err error
		if slow, err = e.observeFast(ctx, b, groups); err != nil {
			return nil, err
		}
	}
	if len(slow) == 0 {
		e.fastGroups.Add(int64(len(groups)))
		return b.results, nil
	}
	e.fastGroups.Add(int64(len(groups) - len(slow)))
	e.scriptGroups.Add(int64(len(slow)))
	calls := e.plan(b, slow)
	if err := e.run(ctx, calls); err != nil {
		return nil, err
	}
	for _, c := range calls {
		if err := decode(c, events, b.results); err != nil {
			return nil, fmt.Errorf("decode reply for %s: %w", c.keys[0], err)
		}
	}
	return b.results, nil
}

// batch is one ObserveBatch's events, their keys and identity modes, and the
// results.
type batch struct {
	events  []Event
	keys    []string
	modes   []string
	results []Result
	token   int64
	infos   map[*rules.Rule]*ruleInfo
}

// ruleInfo is what counting needs of a rule, worked out once a batch.
type ruleInfo struct {
	state, id, ttl int64      // stateTag, idTag, stateTTL
	rings          []ringSpec // in the order of ringPeriods
}

// ringSpec is one ring of a rule: its tag, period and bucket (ms).
type ringSpec struct{ tag, period, bucket int64 }

func (b *batch) info(r *rules.Rule) *ruleInfo {
	if in, ok := b.infos[r]; ok {
		return in
	}
	in := &ruleInfo{state: stateTag(r), id: idTag(r), ttl: stateTTL(r)}
	for _, p := range ringPeriods(r) {
		in.rings = append(in.rings, ringSpec{ringTag(r, p), p.Milliseconds(), Resolution(p).Milliseconds()})
	}
	if b.infos == nil {
		b.infos = make(map[*rules.Rule]*ruleInfo)
	}
	b.infos[r] = in
	return in
}
