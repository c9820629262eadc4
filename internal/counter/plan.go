package counter

import (
	"crypto/sha256"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/rules"
)

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
// rule and a ring (a window, or a spike's baseline), and for rules that
// count users, whose sorted set takes commands of their own, four times
// that.
func eventWork(ev *Event) int {
	w := 1
	for _, r := range ev.Rules {
		n := 1 + countsOf(r)
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
		size += 7 + 4*len(r.Windows) + 6*(countsOf(r)-len(r.Windows))
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
		args = append(args, info.state, info.id, info.ttl, r.Cooldown.Milliseconds(), users, len(r.Windows), len(info.rings)-len(r.Windows))
		for i, w := range r.Windows {
			args = append(args, info.rings[i].tag, w.Threshold, info.rings[i].period, info.rings[i].bucket)
		}
		base := info.rings[len(r.Windows):]
		for i, w := range r.Windows {
			if sp := w.Spike; sp != nil {
				// The factor as go-redis writes a float64, the shortest
				// decimal that reads back as the same number: Lua's
				// tonumber gets it exactly.
				args = append(args, i+1, base[0].tag, base[0].period, base[0].bucket, sp.Factor, sp.Floor)
				base = base[1:]
			}
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
