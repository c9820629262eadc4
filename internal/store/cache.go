package store

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klaxonhq/klaxon/internal/rules"
)

// Defaults of CacheOptions.
const (
	// DefaultInterval between loads: an edit is served within 5 s plus one
	// load, inside the 10 s docs/contract.md §3.1 promises.
	DefaultInterval = 5 * time.Second
	// DefaultTimeout of one load.
	DefaultTimeout = 10 * time.Second
)

// CacheOptions configure a Cache. The zero value is usable.
type CacheOptions struct {
	// Interval between two loads by Run [DefaultInterval].
	Interval time.Duration
	// Timeout of one load [DefaultTimeout].
	Timeout time.Duration
	// Logger receives each rule Problem once, when it first appears, and
	// Run's failed loads [slog.Default()].
	Logger *slog.Logger
	// Limits bound each project's rules (rules.Limits; zero fields take
	// their defaults).
	Limits rules.Limits
	// OnLoad, when set, is called after every load attempt, successful or
	// not, one call at a time; it must return quickly and not call Refresh.
	// The worker turns it into metrics.
	OnLoad func(LoadResult)
}

// LoadResult tells OnLoad how one load went.
type LoadResult struct {
	// Err says why the load failed; nil when it succeeded.
	Err error
	// Duration is how long the load took.
	Duration time.Duration
	// Served is the snapshot Rules serves from now on: the new one after a
	// successful load, the last good one (nil if none yet) after a failure.
	// Its Len, Skipped and LoadedAt make the gauges.
	Served *Snapshot
}

// Cache holds the latest good Snapshot of a Source. Rules reads it without
// locks; Refresh and Run replace it.
type Cache struct {
	src  Source
	opts CacheOptions
	snap atomic.Pointer[Snapshot]

	mu     sync.Mutex           // serializes loads; guards logged and digest
	logged map[Problem]struct{} // problems of the last good load, all logged
	digest string               // of the specs the snapshot was compiled from
}

// NewCache returns a cache of src, empty (not Ready) until the first load.
func NewCache(src Source, opts CacheOptions) *Cache {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Cache{src: src, opts: opts}
}

// Rules returns the enabled rules of the project (case-insensitive 24-hex
// id) in the current snapshot, or nil. It takes no lock and does not
// allocate. The rules are shared: do not modify them.
func (c *Cache) Rules(projectID string) []*rules.Rule {
	return c.snap.Load().Rules(projectID)
}

// Matcher returns the matcher of the project's enabled rules in the
// current snapshot, or nil. It takes no lock and does not allocate.
func (c *Cache) Matcher(projectID string) *rules.Matcher {
	return c.snap.Load().Matcher(projectID)
}

// Snapshot returns the current snapshot, or nil before the first good load.
func (c *Cache) Snapshot() *Snapshot {
	return c.snap.Load()
}

// Ready reports whether a load has succeeded, so Rules serves real rules.
func (c *Cache) Ready() bool {
	return c.snap.Load() != nil
}

// Refresh loads the rules now and serves them. On failure it returns the
// error, logs nothing, and the last good snapshot stays in service. Rule
// problems do not fail a load: they are logged at warning level, each once
// while it persists.
func (c *Cache) Refresh(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	begin := time.Now()
	specs, err := c.src.Load(ctx)
	if err != nil {
		err = fmt.Errorf("load rules: %w", err)
		c.report(LoadResult{Err: err, Duration: time.Since(begin), Served: c.snap.Load()})
		return err
	}
	if cur := c.snap.Load(); cur != nil && specs.Digest != "" && specs.Digest == c.digest {
		// Unchanged: parsing and compiling thousands of rules every few
		// seconds would cost the worker more than anything else it does.
		c.report(LoadResult{Duration: time.Since(begin), Served: cur})
		return nil
	}
	snap := CompileWithin(specs, begin, c.opts.Limits)
	c.digest = specs.Digest
	c.snap.Store(snap)
	c.logNewProblems(snap.Problems())
	c.report(LoadResult{Duration: time.Since(begin), Served: snap})
	return nil
}

// Run refreshes the rules every Interval until ctx is done, then returns
// nil. It loads at once if nothing was loaded yet. A failed load leaves the
// last good snapshot in service; Run logs the first failure of a streak,
// then at most one line per FailureLogInterval while loads keep failing, and
// one when they recover. OnLoad sees every attempt.
func (c *Cache) Run(ctx context.Context) error {
	ticker := time.NewTicker(c.opts.Interval)
	defer ticker.Stop()
	var streak failureStreak
	refresh := func() {
		err := c.Refresh(ctx)
		if ctx.Err() != nil {
			return // stopping: a load cut short is no failure worth a line
		}
		streak.observe(c.opts.Logger, err, time.Now(), c.Ready())
	}
	if !c.Ready() {
		refresh()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			refresh()
		}
	}
}

// FailureLogInterval is how often Run repeats that loads keep failing.
const FailureLogInterval = time.Minute

// failureStreak decides which load failures Run logs.
type failureStreak struct {
	failures int       // consecutive failed loads
	since    time.Time // first failure of the streak
	logged   time.Time // last line about it
}

func (s *failureStreak) observe(log *slog.Logger, err error, now time.Time, ready bool) {
	switch {
	case err == nil && s.failures > 0:
		log.Info("rules load recovered", "failed_loads", s.failures, "outage", now.Sub(s.since).Round(time.Millisecond).String())
		*s = failureStreak{}
	case err == nil:
	case s.failures == 0:
		s.failures, s.since, s.logged = 1, now, now
		log.Error("rules load failed; serving the last good rules", "err", err, "ready", ready)
	default:
		s.failures++
		if now.Sub(s.logged) >= FailureLogInterval {
			s.logged = now
			log.Error("rules load still failing; serving the last good rules", "err", err, "ready", ready,
				"failed_loads", s.failures, "since", s.since)
		}
	}
}

// logNewProblems logs the problems that the last good load did not have.
// Called with c.mu held.
func (c *Cache) logNewProblems(problems []Problem) {
	current := make(map[Problem]struct{}, len(problems))
	for _, p := range problems {
		current[p] = struct{}{}
		if _, ok := c.logged[p]; ok {
			continue
		}
		msg := "rule warning"
		switch {
		case p.RuleID == "" && p.Skipped:
			msg = "project's rules skipped"
		case p.RuleID == "":
			msg = "project warning"
		case p.Skipped:
			msg = "rule skipped"
		}
		attrs := []any{"project", p.ProjectID}
		if p.RuleID != "" {
			attrs = append(attrs, "rule", p.RuleID)
		}
		if p.Line > 0 {
			attrs = append(attrs, "line", p.Line)
		}
		attrs = append(attrs, "reason", p.Reason)
		c.opts.Logger.Warn(msg, attrs...)
	}
	c.logged = current
}

func (c *Cache) report(r LoadResult) {
	if c.opts.OnLoad != nil {
		c.opts.OnLoad(r)
	}
}
