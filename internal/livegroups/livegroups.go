// Package livegroups bounds how many groups one project keeps a counting
// state for in Redis. A group's state (~350–520 B with the event ids it
// remembers) lives as long as its rules' longest window or cooldown after
// its last event, so a producer that mints a new group hash per event (a
// hash over a message with a time in it, say) would make one project hold
// a state per event, without a bound.
//
// Each worker adds the groups it counts to a HyperLogLog per project and
// generation in Redis, once per group and generation, in the background: a
// generation lasts a little longer than a state lives (26 h; 32 days for a
// project whose rules keep state longer than a day), and a project's live
// groups are those of its current and previous generations, one PFCOUNT of
// two keys. A worker reads a project's estimate back when it has added a
// hundredth of the bound since it last did, every few minutes while it adds
// any, and at every flush while the project is full: a small project costs
// Redis a PFADD a flush and a PFCOUNT every few minutes. A project
// whose estimate reaches Max is full until it falls below nine tenths of
// it: meanwhile the events of its groups that have no state are counted
// together, as one group, Overflow. A threshold rule then fires on their
// sum, sooner than on any one of them would, once per cooldown for all of
// them; an ONLY_NEW rule still fires for every new error, since deciding
// that needs no state (the evaluator fires it without counting). Alerts of
// a full project are coarser, never missing; the log says so once an hour
// per project and klaxon_projects_over_group_cap shows it.
package livegroups

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"hash/maphash"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/metrics"
)

// Overflow is the group that a full project's events of groups without a
// state are counted under.
const Overflow = "klaxon:overflow"

// States tells which (project, group)s have a counting state
// (counter.Engine).
type States interface {
	HasState(ctx context.Context, groups [][2]string) ([]bool, error)
}

// Config builds a Cap. Max 0 sets no bound: Admit and Saw do nothing.
type Config struct {
	Redis   redis.UniversalClient
	States  States
	Prefix  string // KLAXON_PREFIX
	Max     int64  // KLAXON_MAX_GROUPS_PER_PROJECT
	Log     *slog.Logger
	Metrics *metrics.Metrics
	Now     func() time.Time // nil: time.Now
	// Every is how often Run adds the groups seen and reads estimates
	// back [2s]: how late a flood is noticed.
	Every time.Duration
}

// Cap bounds each project's live groups; one is shared by a worker's
// evaluators, and Run keeps it in step with Redis.
type Cap struct {
	cfg  Config
	seed maphash.Seed
	full atomic.Int64 // projects full, for Admit's cheap "none"

	mu       sync.Mutex
	seen     map[uint64]int64 // (project, group, span) → the bucket it was added to
	pending  map[bucket][]string
	npending int
	projects map[string]*project
	expiring map[bucket]bool // buckets whose expiry this worker set
}

// A bucket is one HyperLogLog: a project's groups counted in one
// generation.
type bucket struct {
	project string
	long    bool // of the long generations, for rules whose state outlives a day
	index   int64
}

type project struct {
	estimate int64
	readAt   time.Time
	added    int // groups added since the estimate was read
	long     bool
	full     bool
	warnedAt time.Time
}

const (
	hour = time.Hour
	day  = 24 * time.Hour
	// short and long are the generations' lengths: longer than a state
	// lives, at most a day and a second (ONLY_NEW's cooldown) for the
	// short, 31 days (the longest window or cooldown) for the long, so
	// that a live group is always in the current generation or the one
	// before.
	short = 26 * hour
	long  = 32 * day
	// maxSeen bounds the worker's memory of groups added (~40 B each);
	// past it, it starts again, at the cost of adding groups once more.
	maxSeen = 1 << 18
	// maxPending bounds the groups waiting for Run; past it, Saw leaves
	// groups out until the next flush, to be added at their next event.
	maxPending = 1 << 16
	// reread is how long an estimate holds for a project far from Max
	// that adds groups.
	reread = 5 * time.Minute
	// maxExpiring bounds the worker's memory of keys whose expiry it set.
	maxExpiring = 1 << 16
)

// New returns a Cap.
func New(c Config) *Cap {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Every <= 0 {
		c.Every = 2 * time.Second
	}
	return &Cap{cfg: c, seed: maphash.MakeSeed(), seen: make(map[uint64]int64),
		pending: make(map[bucket][]string), projects: make(map[string]*project), expiring: make(map[bucket]bool)}
}

// AnyFull reports whether this worker found some project full.
func (c *Cap) AnyFull() bool { return c.cfg.Max > 0 && c.full.Load() > 0 }

// Overflowing returns which of groups, (project, group) pairs of the
// batch's events, are to be counted as Overflow: those of a full project
// that have no state. It costs a round trip only when some project is full.
func (c *Cap) Overflowing(ctx context.Context, groups [][2]string) ([]bool, error) {
	if c.cfg.Max <= 0 || c.full.Load() == 0 {
		return nil, nil
	}
	var ask [][2]string
	var at []int
	c.mu.Lock()
	for i, g := range groups {
		if p := c.projects[g[0]]; p != nil && p.full {
			ask, at = append(ask, g), append(at, i)
		}
	}
	c.mu.Unlock()
	if len(ask) == 0 {
		return nil, nil
	}
	has, err := c.cfg.States.HasState(ctx, ask)
	if err != nil {
		return nil, err
	}
	over := make([]bool, len(groups))
	for k, i := range at {
		over[i] = !has[k]
	}
	return over, nil
}

// Saw records that group of project was counted, with rules whose state
// lives for lifetime.
func (c *Cap) Saw(project, group string, lifetime time.Duration) {
	if c.cfg.Max <= 0 || group == Overflow {
		return
	}
	lasting := lifetime > day+time.Second
	b := bucket{project: project, long: lasting, index: c.index(c.cfg.Now(), lasting)}
	var h maphash.Hash
	h.SetSeed(c.seed)
	h.WriteString(project)
	h.WriteByte(0)
	h.WriteString(group)
	if lasting {
		h.WriteByte(1)
	}
	k := h.Sum64()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen[k] == b.index+1 || c.npending >= maxPending {
		return
	}
	if len(c.seen) >= maxSeen {
		clear(c.seen)
	}
	c.seen[k] = b.index + 1 // 0 is "not seen"
	c.pending[b] = append(c.pending[b], group)
	c.npending++
}

func (c *Cap) index(t time.Time, lasting bool) int64 {
	return t.Unix() / int64(generation(lasting)/time.Second)
}

func generation(lasting bool) time.Duration {
	if lasting {
		return long
	}
	return short
}

// Run adds the groups Saw recorded to Redis and reads back the estimates
// of the projects that added some, every Config.Every, until ctx ends. A
// Redis that fails costs the caps' freshness, never counting: it returns
// only ctx's error.
func (c *Cap) Run(ctx context.Context) error {
	if c.cfg.Max <= 0 {
		return nil
	}
	t := time.NewTicker(c.cfg.Every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		switch err := c.Flush(ctx); {
		case ctx.Err() != nil:
		case err != nil && !failing:
			failing = true
			c.cfg.Log.Warn("live groups not counted; projects' caps stay as last read until Redis answers", "error", err)
		case err == nil && failing:
			failing = false
			c.cfg.Log.Info("live groups counted again")
		}
	}
}

// Flush adds what Saw recorded and reads the estimates due; Run calls it.
func (c *Cap) Flush(ctx context.Context) error {
	c.mu.Lock()
	pending := c.pending
	c.pending, c.npending = make(map[bucket][]string), 0
	now := c.cfg.Now()
	for id, p := range c.projects {
		// A project that added nothing for longer than an hour's
		// buckets count is read afresh if it comes back.
		if !p.full && p.added == 0 && now.Sub(p.readAt) > 2*short {
			delete(c.projects, id)
		}
	}
	for b, gs := range pending {
		p := c.project(b.project)
		p.added += len(gs)
		p.long = p.long || b.long
	}
	var due []string
	for id, p := range c.projects {
		if p.full || int64(p.added) >= max(1, c.cfg.Max/100) || (p.added > 0 && now.Sub(p.readAt) >= reread) {
			due = append(due, id)
		}
	}
	lasting := make([]bool, len(due))
	for i, id := range due {
		lasting[i] = c.projects[id].long
	}
	c.mu.Unlock()

	counts := make([]*redis.IntCmd, len(due))
	_, err := c.cfg.Redis.Pipelined(ctx, func(p redis.Pipeliner) error {
		for b, gs := range pending {
			k := c.key(b)
			members := make([]any, len(gs))
			for i, g := range gs {
				members[i] = g
			}
			p.PFAdd(ctx, k, members...)
			if !c.expiring[b] {
				p.PExpire(ctx, k, c.expiry(b).Sub(now))
			}
		}
		for i, id := range due {
			counts[i] = p.PFCount(ctx, c.keys(id, lasting[i], now)...)
		}
		return nil
	})
	if err != nil {
		// What was pending is added at the groups' next events: Saw
		// forgets them.
		c.mu.Lock()
		clear(c.seen)
		c.mu.Unlock()
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.expiring) >= maxExpiring {
		clear(c.expiring)
	}
	for b := range pending {
		c.expiring[b] = true
	}
	for i, id := range due {
		c.update(id, c.projects[id], counts[i].Val(), now)
	}
	return nil
}

func (c *Cap) project(id string) *project {
	p := c.projects[id]
	if p == nil {
		p = &project{}
		c.projects[id] = p
	}
	return p
}

// update takes a project's new estimate, and tells when it fills or
// empties.
func (c *Cap) update(id string, p *project, n int64, now time.Time) {
	p.estimate, p.readAt, p.added = n, now, 0
	switch {
	case !p.full && n >= c.cfg.Max:
		p.full = true
		c.full.Add(1)
		c.cfg.Metrics.ProjectsOverGroupCap.Inc()
		if now.Sub(p.warnedAt) >= hour {
			p.warnedAt = now
			c.cfg.Log.Warn("project over its live groups: the events of its groups without a state are counted together, as one group, until it falls below nine tenths",
				"project", id, "groups", n, "max", c.cfg.Max, "group", Overflow, "setting", "KLAXON_MAX_GROUPS_PER_PROJECT")
		}
	case p.full && n < c.cfg.Max*9/10:
		p.full = false
		c.full.Add(-1)
		c.cfg.Metrics.ProjectsOverGroupCap.Dec()
		c.cfg.Log.Info("project back under its live groups: its new groups are counted each on its own again", "project", id, "groups", n, "max", c.cfg.Max)
	}
}

// key is a bucket's HyperLogLog, in the project's hash slot so that one
// PFCOUNT reads all of a project's.
func (c *Cap) key(b bucket) string {
	span := "s"
	if b.long {
		span = "l"
	}
	return c.base(b.project) + ":" + span + ":" + strconv.FormatInt(b.index, 10)
}

func (c *Cap) base(project string) string {
	sum := sha256.Sum256([]byte(project))
	return c.cfg.Prefix + ":lg:{" + hex.EncodeToString(sum[:12]) + "}"
}

// keys are the buckets a project's estimate counts at now: the current
// generation and the one before, of each length the project uses.
func (c *Cap) keys(project string, lasting bool, now time.Time) []string {
	var ks []string
	for _, l := range []bool{false, true} {
		if l && !lasting {
			break
		}
		i := c.index(now, l)
		ks = append(ks, c.key(bucket{project: project, long: l, index: i}), c.key(bucket{project: project, long: l, index: i - 1}))
	}
	return ks
}

// expiry is when a bucket leaves every count: at the end of the next
// generation.
func (c *Cap) expiry(b bucket) time.Time {
	g := generation(b.long)
	return time.Unix(0, 0).Add(time.Duration(b.index+2) * g)
}
