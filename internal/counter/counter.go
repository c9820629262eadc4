// Package counter decides, atomically and for any number of workers, whether
// an event makes a rule fire. A group's counts live in one Redis string;
// the worker counts into it and stores it with a compare-and-set (fast.go,
// state.go, cas.lua), and where that cannot be (a state written meanwhile,
// a repeat or redelivery, users) observe.lua counts atomically in Redis.
// model.go states the semantics in plain Go.
//
// Semantics, per (rule, group):
//   - An event counts at its own time te: its timestamp clamped to Redis' now,
//     or Redis' now when it has none.
//   - Rules of one title filter count the same events: each (filter, period)
//     has one ring of buckets of Resolution(period), whose window ends at the
//     newest te it has seen; a count may include events up to one bucket
//     older than the window and never misses one inside it. A late event
//     counts in the bucket where it belongs, if still inside the window.
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
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
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
	// DedupTTL is how long an event ID is remembered at least [10m]; it is
	// forgotten within twice that. A message redelivered later counts again.
	DedupTTL time.Duration
	// GroupsPerCall is how many (project, group)s one script call counts
	// on a single node or Sentinel [32]. Such a call touches keys of several
	// hash slots: set 1 behind a proxy that routes commands by key. On
	// Cluster (and Ring) it is always 1.
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
	// eventsPerCall bounds a group's events in one observe.lua call.
	eventsPerCall int
	verbose       bool
	waitReplicas  int
	waitTimeout   time.Duration
	cas           *redis.Script
	// scriptOnly counts every group with observe.lua (tests of the script).
	scriptOnly bool
	// Groups counted in the worker and stored, and counted by the script.
	fastGroups, scriptGroups atomic.Int64
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
		script:        redis.NewScript(observeLua),
		cas:           redis.NewScript(casLua),
		prefix:        opts.Prefix,
		dedupTTL:      opts.DedupTTL.Milliseconds(),
		groupsPerCall: opts.GroupsPerCall,
		eventsPerCall: 32,
		verbose:       opts.Verbose,
		waitReplicas:  opts.WaitReplicas,
		waitTimeout:   opts.WaitTimeout,
	}
}

// GroupKey is the base of every Redis key of a (project, group): a hash of
// both, so that no crafted id can make two groups' keys meet, in a hash tag
// so that they share a Cluster slot.
func GroupKey(prefix, projectID, groupHash string) string {
	sum := sha256.Sum256([]byte(projectID + "\x00" + groupHash))
	return prefix + ":{" + hex.EncodeToString(sum[:12]) + "}"
}

// group is the events of one (project, group) in a batch.
type group struct {
	base   string
	events []int // indexes into the batch
	// Of the fast path: the generation of the state as read, and what
	// counting it in Go made of it: the state, firing records, and pages of
	// ids to write ("set" or "append", key, bytes).
	gen     string
	state   []byte
	expiry  int64
	records []any
	pages   []any
}

// part is the events of one group that one script call counts: all of
// them, or for observe.lua a chunk of at most eventsPerCall, and the
// tokens that mark this write and the later ones of the same batch (see
// chunks).
type part struct {
	g      *group
	events []int
	token  int64
	done   []int64
	work   int // of its events (eventWork)
}

// call is one script call: parts of up to groupsPerCall groups, one each.
type call struct {
	parts []part
	keys  []string
	rules []*rules.Rule
	index map[ruleKey]int // into rules
	args  []any
	cmd   *redis.Cmd
}

// ObserveBatch counts a batch of events and returns one Result per event,
// in order; an event without rules costs nothing and gets a zero Result.
//
// Most groups cost Redis three commands (GET, and GETRANGE and SET in
// cas.lua, pages of a busy group aside): their states are read, counted
// into by the worker (state.go) and written back by cas.lua if no other
// worker wrote them meanwhile. The others (a repeat, a redelivery, users),
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
	state, id, ttl int64 // stateTag, idTag, stateTTL
	rings          []ringSpec
}

// ringSpec is one window's ring: its tag, period and bucket (ms).
type ringSpec struct{ tag, period, bucket int64 }

func (b *batch) info(r *rules.Rule) *ruleInfo {
	if in, ok := b.infos[r]; ok {
		return in
	}
	in := &ruleInfo{state: stateTag(r), id: idTag(r), ttl: stateTTL(r)}
	for _, w := range r.Windows {
		in.rings = append(in.rings, ringSpec{ringTag(r, w.Period), w.Period.Milliseconds(), Resolution(w.Period).Milliseconds()})
	}
	if b.infos == nil {
		b.infos = make(map[*rules.Rule]*ruleInfo)
	}
	b.infos[r] = in
	return in
}

// group sorts the events with rules by (project, group), keeping their
// order.
func (e *Engine) group(b *batch) []*group {
	type name struct{ project, group string }
	byName := make(map[name]*group)
	var groups []*group
	for i := range b.events {
		ev := &b.events[i]
		if len(ev.Rules) == 0 {
			continue
		}
		b.keys[i], b.modes[i] = eventKey(ev)
		g := byName[name{ev.ProjectID, ev.GroupHash}]
		if g == nil {
			g = &group{base: GroupKey(e.prefix, ev.ProjectID, ev.GroupHash)}
			byName[name{ev.ProjectID, ev.GroupHash}] = g
			groups = append(groups, g)
		}
		g.events = append(g.events, i)
	}
	return groups
}

// plan puts groups into observe.lua calls: enough groups a call to pay
// its fixed cost rarely, few enough, and few enough events of each, that
// one script, which Redis runs alone, ends within milliseconds whatever a
// project's rules. A group of more events goes in chunks, one a call, in
// order.
func (e *Engine) plan(b *batch, groups []*group) []*call {
	var rounds [][]part // round r: chunk r of every group that has one
	for _, g := range groups {
		for r, p := range e.chunks(b, g) {
			if r == len(rounds) {
				rounds = append(rounds, nil)
			}
			rounds[r] = append(rounds[r], p)
		}
	}
	var calls []*call
	for _, round := range rounds {
		for len(round) > 0 {
			n, work := 0, 0
			for n < len(round) && n < e.groupsPerCall && (n == 0 || work+round[n].work <= callWork) {
				work += round[n].work
				n++
			}
			c := &call{parts: round[:n:n]}
			round = round[n:]
			for _, p := range c.parts {
				c.keys = append(c.keys, p.g.base+":s")
			}
			c.args = e.args(c, b)
			calls = append(calls, c)
		}
	}
	return calls
}

// callWork bounds the work of one observe.lua call, in units of eventWork:
// about 8 ms of Redis at the worst (rules that count users, each a dozen
// commands an event), a few hundred events of ordinary rules.
const callWork = 12_000

// eventWork is a measure of what observe.lua does for an event: a unit a
// rule and a window, and for rules that count users, whose sorted set
// takes commands of their own, four times that.
func eventWork(ev *Event) int {
	w := 1
	for _, r := range ev.Rules {
		n := 1 + len(r.Windows)
		if r.Users {
			n *= 4
		}
		w += n
	}
	return w
}

// chunks splits a group's events into parts of at most eventsPerCall, and
// of at most callWork unless a part is a single event. Each
// part's token is a hash of the batch's token, the part's place and its
// events, so
// that the same batch makes the same tokens at every attempt; a part is
// done when the group's state holds its token, the token of a later part
// (written after it), or the batch's own token, which the fast path writes
// for a whole group. Should the parts change between attempts (rules
// edited meanwhile), the tokens change with them: events without ids may
// then count twice, never zero times.
func (e *Engine) chunks(b *batch, g *group) []part {
	var parts []part
	for lo := 0; lo < len(g.events); {
		hi, work := lo, 0
		for hi < len(g.events) && hi-lo < e.eventsPerCall {
			w := eventWork(&b.events[g.events[hi]])
			if hi > lo && work+w > callWork {
				break
			}
			work += w
			hi++
		}
		evs := g.events[lo:hi]
		var buf [48]byte // "<batch token>,<lo>,"
		head := append(strconv.AppendInt(buf[:0], b.token, 10), ',')
		h := fnvAdd(fnvOffset, append(strconv.AppendInt(head, int64(lo), 10), ','))
		for _, i := range evs {
			h = fnvAdd(h, b.keys[i])
		}
		parts = append(parts, part{g: g, events: evs, token: int64(h%(1<<53-1)) + 1, work: work})
		lo = hi
	}
	for i := range parts {
		parts[i].done = append(parts[i].done, b.token)
		for _, later := range parts[i+1:] {
			parts[i].done = append(parts[i].done, later.token)
		}
	}
	return parts
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

// Identity modes of an event, as the script reads them.
const (
	modeBody        = "0" // no id: counts at every delivery
	modeID          = "1" // counted once per id
	modeRedelivered = "2" // no id, redelivered: counts, and replays its body's firings
)

// eventKey is the 8 bytes that stand for an event in the script: a hash of
// its id, or of its body when it has none.
func eventKey(ev *Event) (key, mode string) {
	h := sha256.New()
	switch {
	case ev.ID != "":
		h.Write([]byte("id\x00" + ev.ID))
		mode = modeID
	case ev.Redelivered:
		h.Write(ev.Body)
		mode = modeRedelivered
	default:
		h.Write(ev.Body)
		mode = modeBody
	}
	return string(h.Sum(nil)[:8]), mode
}

// args encodes a call as the script's ARGV.
func (e *Engine) args(c *call, b *batch) []any {
	events := b.events
	size := 3
	for _, p := range c.parts {
		size += 3 + len(p.done)
		for _, i := range p.events {
			size += 5 + len(events[i].Rules)
			for _, r := range events[i].Rules {
				c.add(r)
			}
		}
	}
	for _, r := range c.rules {
		size += 6 + 4*len(r.Windows)
	}
	verbose := 0
	if e.verbose {
		verbose = 1
	}
	args := make([]any, 0, size)
	args = append(args, e.dedupTTL, verbose, len(c.rules))
	for _, r := range c.rules {
		users := 0
		if r.Users {
			users = 1
		}
		info := b.info(r)
		args = append(args, info.state, info.id, info.ttl, r.Cooldown.Milliseconds(), users, len(r.Windows))
		for i, w := range r.Windows {
			args = append(args, info.rings[i].tag, w.Threshold, info.rings[i].period, info.rings[i].bucket)
		}
	}
	for _, p := range c.parts {
		args = append(args, p.token, len(p.done))
		for _, t := range p.done {
			args = append(args, t)
		}
		args = append(args, len(p.events))
		for _, i := range p.events {
			ev := &events[i]
			ts := int64(-1)
			if !ev.Time.IsZero() {
				ts = eventMilli(ev.Time)
			}
			args = append(args, b.keys[i], b.modes[i], ts, ev.UserID, len(ev.Rules))
			for _, r := range ev.Rules {
				args = append(args, c.add(r)+1)
			}
		}
	}
	return args
}

// stateTTL is how long (ms) a rule's state in a group is kept after its
// last event: its longest window or cooldown, and a second.
func stateTTL(r *rules.Rule) int64 {
	return (max(r.MaxPeriod(), r.Cooldown) + time.Second).Milliseconds()
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

// run sends every call of script in one pipeline, loading the script once
// if Redis does not know it (after a restart or failover).
func (e *Engine) run(ctx context.Context, calls []*call) error {
	return e.eval(ctx, e.script, calls)
}

func (e *Engine) eval(ctx context.Context, script *redis.Script, calls []*call) error {
	pending := calls
	loaded, moves, since := false, 0, time.Time{}
	for {
		var wait *redis.Cmd
		_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range pending {
				c.cmd = script.EvalSha(ctx, p, e.declared(ctx, p, c.keys), c.args...)
			}
			if e.waitReplicas > 0 {
				// A pipeline is one connection, and WAIT covers what its
				// connection wrote. A call that writes nothing (a batch
				// replayed after a try whose WAIT failed: another
				// connection made its writes) would pass WAIT at once,
				// and an ack could then outrun the writes it counts on,
				// lost in a failover. A write of the pipeline's own puts
				// it past every earlier write in the replication stream.
				p.Set(ctx, e.prefix+":wait", "", time.Minute)
				wait = p.Do(ctx, "WAIT", e.waitReplicas, e.waitTimeout.Milliseconds())
			}
			return nil
		})
		if err == nil {
			if wait != nil {
				if n, err := wait.Int64(); err != nil || n < int64(e.waitReplicas) {
					return fmt.Errorf("count: %d of %d replicas acknowledged the writes within %s (%v)",
						n, e.waitReplicas, e.waitTimeout, err)
				}
			}
			return nil
		}
		// Only the calls that did not run are sent again; the others counted.
		var missing, moving []*call
		for _, c := range pending {
			if err := c.cmd.Err(); err != nil {
				switch {
				case redis.HasErrorPrefix(err, "NOSCRIPT"):
					missing = append(missing, c)
				case migrating(err): // cluster.go
					moving = append(moving, c)
				default:
					return fmt.Errorf("count %d groups from %s: %w", len(c.keys), c.keys[0], err)
				}
			}
		}
		if len(missing) == 0 && len(moving) == 0 {
			if wait == nil && e.guarded() {
				return nil // only a read of a guard failed: every call ran (cluster.go)
			}
			return fmt.Errorf("count: %w", err)
		}
		if len(missing) > 0 {
			if loaded {
				return fmt.Errorf("count: script still missing after loading it: %w", err)
			}
			// A cluster client sends SCRIPT LOAD to every shard.
			if err := script.Load(ctx, e.rdb).Err(); err != nil {
				return fmt.Errorf("load counting script: %w", err)
			}
			loaded = true
		}
		if len(moving) > 0 {
			if moves == 0 {
				since = time.Now()
			}
			if err := awaitMigration(ctx, moves, since, moving[0].cmd.Err()); err != nil {
				return err
			}
			moves++
			e.slotRetries.Add(int64(len(moving)))
		}
		pending = append(missing, moving...)
	}
}

// Kinds of reply items.
const (
	itemQuiet     = 0 // an outcome that did not fire (verbose replies only)
	itemFired     = 1
	itemReplayed  = 2 // a firing an earlier delivery caused
	itemDuplicate = 3 // the event's id was seen before
)

// decode turns a call's reply into Results: every event of the call gets
// its time and an empty outcome per rule, then the reply's items fill in
// what happened.
func decode(c *call, events []Event, results []Result) error {
	vals, err := c.cmd.Int64Slice()
	if err != nil {
		return err
	}
	if len(vals) == 0 {
		return errors.New("empty reply")
	}
	now := vals[0]
	var order []int // the call's events, as the script numbers them from 1
	for _, p := range c.parts {
		for _, i := range p.events {
			ev := &events[i]
			te := now
			if !ev.Time.IsZero() {
				if ts := eventMilli(ev.Time); ts >= 0 && ts <= now {
					te = ts
				}
			}
			outs := make([]Outcome, len(ev.Rules))
			for k, r := range ev.Rules {
				outs[k] = Outcome{Rule: r, Window: -1}
			}
			results[i] = Result{Time: time.UnixMilli(te), Outcomes: outs}
			order = append(order, i)
		}
	}
	for p := 1; p < len(vals); {
		if p+3 > len(vals) {
			return errors.New("reply cut inside an item")
		}
		ev, id, kind := vals[p], vals[p+1], vals[p+2]
		p += 3
		if ev < 1 || int(ev) > len(order) {
			return fmt.Errorf("reply names event %d of %d", ev, len(order))
		}
		i := order[ev-1]
		if kind == itemDuplicate {
			results[i].Duplicate = true
			continue
		}
		if p+4 > len(vals) || vals[p+3] < 0 || p+4+int(vals[p+3]) > len(vals) {
			return errors.New("reply cut inside an outcome")
		}
		at, rearm, which, nw := vals[p], vals[p+1], vals[p+2], int(vals[p+3])
		counts := vals[p+4 : p+4+nw : p+4+nw]
		p += 4 + nw
		k := ruleIndex(&events[i], id)
		if k < 0 {
			continue // a replayed firing of a rule the event no longer has
		}
		o := &results[i].Outcomes[k]
		rule := o.Rule
		if nw != len(rule.Windows) || which >= int64(nw) {
			// The rule has other windows now: what fired then cannot be told
			// in today's terms, so it is not told at all.
			if kind == itemReplayed {
				continue
			}
			return fmt.Errorf("reply has %d windows for rule %s of %d", nw, rule.ID, len(rule.Windows))
		}
		if o.Fired && kind == itemReplayed {
			continue // fired now: that firing is the one to tell
		}
		*o = Outcome{
			Rule: rule, Fired: kind != itemQuiet, Replayed: kind == itemReplayed,
			Window: int(which), Counts: counts, At: unixMilli(at), Rearm: unixMilli(rearm),
		}
		if o.Fired {
			o.ID = FiringID(events[i].ProjectID, rule.ID, events[i].GroupHash, o.At)
		}
	}
	return nil
}

// ruleIndex is the index among ev.Rules of the rule whose idTag is id, or
// -1: a replayed firing goes to its own rule, even if the rule was edited,
// added, removed or moved since.
func ruleIndex(ev *Event, id int64) int {
	for k, r := range ev.Rules {
		if idTag(r) == id {
			return k
		}
	}
	return -1
}

// stateTag numbers a rule's state in a group by the rule's id and version,
// so that an edit that changes what the state means starts it afresh. The
// tags are 46 bits, which Lua's numbers and its '%.14g' formatting keep
// exactly.
func stateTag(r *rules.Rule) int64 { return tag46("state", r.ID, r.Version) }

// idTag numbers a rule by its id alone, for the firings told in replies.
func idTag(r *rules.Rule) int64 { return tag46("rule", r.ID) }

// ringTag numbers the ring of buckets that counts a rule's events over one
// period: every rule with the same title filter counts the same events, so
// rules of one filter and period share a ring.
func ringTag(r *rules.Rule, period time.Duration) int64 {
	var ms [20]byte
	h := fnvPart(fnvPart(fnvOffset, "ring"), r.FilterKey())
	return int64(fnvPart(h, strconv.AppendInt(ms[:0], period.Milliseconds(), 10)) >> 18)
}

// tag46 is the 64-bit FNV-1a hash of parts, each followed by a zero byte,
// cut to 46 bits. It is hashed here rather than with hash/fnv, whose
// Write takes a []byte: tags are worked out for every rule of every batch,
// and this allocates nothing.
func tag46(parts ...string) int64 {
	h := uint64(fnvOffset)
	for _, p := range parts {
		h = fnvPart(h, p)
	}
	return int64(h >> 18)
}

// The 64-bit FNV-1a parameters.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnvAdd adds p to FNV-1a hash h.
func fnvAdd[T ~string | ~[]byte](h uint64, p T) uint64 {
	for i := 0; i < len(p); i++ {
		h = (h ^ uint64(p[i])) * fnvPrime
	}
	return h
}

// fnvPart adds part and the zero byte after it to FNV-1a hash h.
func fnvPart[T ~string | ~[]byte](h uint64, part T) uint64 {
	return fnvAdd(h, part) * fnvPrime // h ^ 0 is h
}

// unixMilli is t in ms, with 0 (a state never written) as the zero time.
func unixMilli(t int64) time.Time {
	if t == 0 {
		return time.Time{}
	}
	return time.UnixMilli(t)
}
