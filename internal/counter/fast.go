package counter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// observeFast counts, in the worker, the groups it can: it takes their
// states from what it stored last (stateCache) or reads them, with Redis'
// clock, in one round trip, and the pages of ids busy groups need in
// another, counts each group's events into its state as observe.lua would,
// and stores the states with cas.lua. A group another worker wrote in
// between is counted again from the state cas.lua answers, and stored
// once more. It returns the groups left for observe.lua: those with an
// event that repeats or was redelivered, a rule that counts users, and
// those written by someone else twice.
func (e *Engine) observeFast(ctx context.Context, b *batch, groups []*group) (slow []*group, err error) {
	var fast []*group
	for _, g := range groups {
		if e.fastCandidate(b, g) {
			fast = append(fast, g)
		} else {
			e.states.drop(g.base) // observe.lua writes it
			slow = append(slow, g)
		}
	}
	if len(fast) == 0 {
		return slow, nil
	}
	raws, now, err := e.readStates(ctx, fast)
	if err != nil {
		return nil, err
	}
	slot := now / e.dedupTTL
	counted, rest, err := e.countGroups(ctx, b, fast, raws, now, slot)
	if err != nil {
		return nil, err
	}
	slow = append(slow, rest...)
	for try := 0; len(counted) > 0; try++ {
		changed, states, err := e.storeStates(ctx, b, counted, slot)
		if err != nil {
			return nil, err
		}
		if try == 1 || len(changed) == 0 {
			// Written by another worker twice in a row: a busy group
			// shared by several; the script counts it where it lies.
			return append(slow, changed...), nil
		}
		if counted, rest, err = e.countGroups(ctx, b, changed, states, now, slot); err != nil {
			return nil, err
		}
		slow = append(slow, rest...)
	}
	return slow, nil
}

// readStates returns the state strings of groups (nil for none) and
// Redis' clock (ms): from the cache where it has them, else read.
func (e *Engine) readStates(ctx context.Context, groups []*group) ([][]byte, int64, error) {
	raws := make([][]byte, len(groups))
	var clock *redis.TimeCmd
	gets := make([]*redis.StringCmd, len(groups))
	_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		clock = p.Time(ctx)
		for i, g := range groups {
			var ok bool
			if raws[i], ok = e.states.get(g.base); ok {
				e.cachedStates.Add(1)
			} else {
				gets[i] = p.Get(ctx, g.base+":s")
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, fmt.Errorf("read %d group states: %w", len(groups), err)
	}
	for i, g := range groups {
		if gets[i] == nil {
			continue
		}
		raw, err := gets[i].Bytes()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, 0, fmt.Errorf("read state of %s: %w", g.base, err)
		}
		raws[i] = raw
	}
	return raws, clock.Val().UnixMilli(), nil
}

// countGroups counts each group's events into its state string raws[i],
// reading the pages of ids they need first. It returns the groups counted,
// ready for storeStates, and those the script must count.
func (e *Engine) countGroups(ctx context.Context, b *batch, groups []*group, raws [][]byte, now, slot int64) (counted, slow []*group, err error) {
	states := make([]*groupState, len(groups))
	var pageKeys []string
	for i, g := range groups {
		g.gen = ""
		if raw := raws[i]; len(raw) > genOffset {
			g.gen = string(raw[genOffset:min(genOffset+4, len(raw))])
		}
		states[i] = decodeState(raws[i], now, slot)
		pageKeys = append(pageKeys, states[i].pagesToRead(g.base, newIDs(b, g))...)
	}
	// Busy groups keep their ids in pages: read those the batch needs, in
	// one more round trip. The state's generation covers them too: every
	// write of a page comes with one of its state.
	pages, err := e.readPages(ctx, pageKeys)
	if err != nil {
		return nil, nil, err
	}
	for i, g := range groups {
		if e.countGroup(b, g, states[i], pages, now, slot) {
			counted = append(counted, g)
		} else {
			e.states.drop(g.base)
			slow = append(slow, g)
		}
	}
	return counted, slow, nil
}

// storeStates stores what countGroups made of groups with cas.lua and
// keeps each stored state in the cache. It returns the groups whose state
// had changed since it was read (nothing of them written, their events'
// results cleared) with the state each has now.
func (e *Engine) storeStates(ctx context.Context, b *batch, groups []*group, slot int64) (changed []*group, current [][]byte, err error) {
	var calls []*call
	for lo := 0; lo < len(groups); lo += e.storesPerCall {
		these := groups[lo:min(lo+e.storesPerCall, len(groups))]
		nargs := 1
		for _, g := range these {
			nargs += 5 + len(g.records) + len(g.pages) // gen state expiry nrecords npages, then those
		}
		c := &call{parts: make([]part, 0, len(these)), keys: make([]string, 0, len(these)), args: make([]any, 0, nargs)}
		for _, g := range these {
			c.parts = append(c.parts, part{g: g, events: g.events, token: b.token})
		}
		c.args = append(c.args, (slot+2)*e.dedupTTL)
		for _, p := range c.parts {
			g := p.g
			c.keys = append(c.keys, g.base+":s")
			c.args = append(c.args, g.gen, g.state, g.expiry, len(g.records)/2)
			c.args = append(c.args, g.records...)
			c.args = append(c.args, len(g.pages)/3)
			c.args = append(c.args, g.pages...)
		}
		calls = append(calls, c)
	}
	if err := e.eval(ctx, e.cas, calls); err != nil {
		return nil, nil, err
	}
	for _, c := range calls {
		answers, err := c.cmd.Slice()
		if err != nil {
			return nil, nil, fmt.Errorf("store states from %s: %w", c.keys[0], err)
		}
		if len(answers) != len(c.parts) {
			return nil, nil, fmt.Errorf("store states from %s: %d answers for %d groups", c.keys[0], len(answers), len(c.parts))
		}
		for i, p := range c.parts {
			g := p.g
			switch a := answers[i].(type) {
			case int64:
				e.states.put(g.base, g.state)
			case string:
				// Another worker wrote the state meanwhile: a is
				// the state now, to count again from.
				for _, ev := range g.events {
					b.results[ev] = Result{}
				}
				e.states.drop(g.base)
				e.changedStates.Add(1)
				changed, current = append(changed, g), append(current, []byte(a))
			default:
				return nil, nil, fmt.Errorf("store state of %s: answer %T", g.base, a)
			}
		}
	}
	return changed, current, nil
}

// fastCandidate reports whether a group's events may be counted in the
// worker at all: users sets and redeliveries' replays are the script's.
func (e *Engine) fastCandidate(b *batch, g *group) bool {
	for _, i := range g.events {
		if b.modes[i] == modeRedelivered {
			return false
		}
		for _, r := range b.events[i].Rules {
			if r.Users {
				return false
			}
		}
	}
	return true
}

// countGroup counts g's events into its state as observe.lua's loop does
// for one group, fills their results, and keeps what cas.lua is to store.
// It returns false, having changed nothing, where the script must count:
// an id seen before, this batch's token already in the state, or ids
// that would leave the state for pages.
func (e *Engine) countGroup(b *batch, g *group, st *groupState, pages map[string][]byte, now, slot int64) bool {
	// This batch wrote the group already (an attempt whose reply was lost),
	// in the worker or in the script's chunks: the script replays it.
	if st.replayed(b.token) {
		return false
	}
	for _, p := range e.chunks(b, g) {
		if st.replayed(p.token) {
			return false
		}
	}
	ids := newIDs(b, g)
	// A repeat inside the batch is the script's too. A set, not a scan: a
	// storm puts a thousand ids of one group in a batch.
	inBatch := make(map[string]struct{}, len(ids)/8)
	for i := 0; i+8 <= len(ids); i += 8 {
		k := ids[i : i+8]
		if _, again := inBatch[string(k)]; again || st.holds(g.base, k, pages) {
			return false
		}
		inBatch[string(k)] = struct{}{}
	}
	st.tokens = [4]int64{b.token, st.tokens[0], st.tokens[1], st.tokens[2]}
	var records map[string]*strings.Builder
	var order []string
	counts := make([]int64, 0, 8)
	for n, i := range g.events {
		ev := &b.events[i]
		te := now
		if !ev.Time.IsZero() {
			if ts := eventMilli(ev.Time); ts >= 0 && ts <= now {
				te = ts
			}
		}
		// Rings first, once each, however many of the event's rules share them.
		for _, r := range ev.Rules {
			for _, w := range b.info(r).rings {
				ring := st.ring(w.tag, w.period, w.bucket, now)
				if ring.seen != int64(n+1) {
					ring.seen = int64(n + 1)
					ring.add(te)
					ring.until = now + ring.period + ring.bucket + 1000
				}
			}
		}
		res := Result{Time: time.UnixMilli(te), Outcomes: make([]Outcome, len(ev.Rules))}
		for k, r := range ev.Rules {
			info := b.info(r)
			s := st.rule(info.state, now)
			counts = counts[:0]
			for _, w := range info.rings {
				counts = append(counts, st.ring(w.tag, 0, 0, now).sum())
			}
			s.at = max(s.at, te)
			s.until = now + info.ttl
			which, fired := -1, false
			if s.at >= s.rearm {
				which = firstReached(r, counts)
				fired = len(r.Windows) == 0 || which >= 0
				if fired {
					s.rearm = s.at + max(r.Cooldown.Milliseconds(), 1)
				}
			}
			o := Outcome{Rule: r, Window: -1}
			if fired || e.verbose {
				o = Outcome{Rule: r, Fired: fired, Window: which, Counts: append([]int64(nil), counts...),
					At: unixMilli(s.at), Rearm: unixMilli(s.rearm)}
			}
			if fired {
				o.ID = FiringID(ev.ProjectID, r.ID, ev.GroupHash, o.At)
				key := b.keys[i]
				if records == nil {
					records = make(map[string]*strings.Builder)
				}
				rec := records[key]
				if rec == nil {
					rec = &strings.Builder{}
					records[key] = rec
					order = append(order, key)
				}
				writeRecord(rec, info.id, s.at, s.rearm, which, counts)
			}
			res.Outcomes[k] = o
		}
		b.results[i] = res
	}
	set, add := st.remember(g.base, ids, pages)
	g.pages = g.pages[:0]
	for k, v := range set {
		g.pages = append(g.pages, "set", k, v)
	}
	for k, v := range add {
		g.pages = append(g.pages, "append", k, v)
	}
	g.state, g.expiry = st.encode(now, slot, e.dedupTTL)
	g.records = g.records[:0]
	for _, k := range order {
		g.records = append(g.records, k, records[k].String())
	}
	return true
}

// newIDs are the keys of a group's events that have an id, back to back.
func newIDs(b *batch, g *group) []byte {
	var ids []byte
	for _, i := range g.events {
		if b.modes[i] == modeID {
			ids = append(ids, b.keys[i]...)
		}
	}
	return ids
}

// readPages reads pages of ids, by key; a missing page holds nothing.
func (e *Engine) readPages(ctx context.Context, keys []string) (map[string][]byte, error) {
	pages := make(map[string][]byte, len(keys))
	if len(keys) == 0 {
		return pages, nil
	}
	cmds := make([]*redis.StringCmd, len(keys))
	_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.Get(ctx, k)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read %d pages of ids: %w", len(keys), err)
	}
	for i, k := range keys {
		v, err := cmds[i].Bytes()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("read page %s: %w", k, err)
		}
		pages[k] = v
	}
	return pages, nil
}
