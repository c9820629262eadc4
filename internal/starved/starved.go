// Package starved tells of rules that see events they cannot count. A
// countBy users rule counts distinct event.user.id, and stock Hawk's
// grouper never sends event.user: behind it, such a rule matches every
// event and fires never, and nothing else says so.
//
// A Watch is told, per batch, how many of a rule's events lacked the
// field. It counts them all in klaxon_rules_starved_total{reason}, logs
// "rule starved" at most once per rule and period (an hour) in each
// worker, and leaves a mark in Redis that klaxon explain reads, so that the
// question "why does my rule never fire" has an answer where it is asked.
//
// Rules that count events need no field: an event without event.timestamp
// counts at its arrival, on Redis' clock, which is no starvation.
package starved

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// NoUser is the reason of a countBy users rule that sees an event without
// event.user (or with an empty id): the value of the metric's label.
const NoUser = "no_user"

// Field is the event field whose lack a reason names.
func Field(reason string) string {
	if reason == NoUser {
		return "event.user"
	}
	return reason
}

// Lacks returns the reason rule r cannot count an event whose user id is
// userID, or "" when it can.
func Lacks(r *rules.Rule, userID string) string {
	if r.Users && userID == "" {
		return NoUser
	}
	return ""
}

// Period is how often a Watch warns of one rule, and how long its mark
// in Redis says the rule starved.
const Period = time.Hour

// markTimeout bounds the write of a mark, once per rule and period: a
// Redis that does not answer costs an explanation, never the batch.
const markTimeout = time.Second

// Watch watches rules for starvation; it is safe for concurrent use, and
// one is shared by a worker's evaluators.
type Watch struct {
	redis   redis.UniversalClient
	prefix  string
	log     *slog.Logger
	metrics *metrics.Metrics
	now     func() time.Time

	mu     sync.Mutex
	warned map[key]time.Time
}

type key struct{ project, rule, reason string }

// maxWarned bounds the memory of warnings: past it, those older than a
// period go (deleted rules' among them).
const maxWarned = 10_000

// Config builds a Watch. Redis nil leaves no marks; Now nil is time.Now.
type Config struct {
	Redis   redis.UniversalClient
	Prefix  string // KLAXON_PREFIX
	Log     *slog.Logger
	Metrics *metrics.Metrics
	Now     func() time.Time
}

// New returns a Watch.
func New(c Config) *Watch {
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Watch{redis: c.Redis, prefix: c.Prefix, log: c.Log, metrics: c.Metrics, now: c.Now, warned: make(map[key]time.Time)}
}

// Saw records that n events of project reached rule r without what
// reason names.
func (w *Watch) Saw(ctx context.Context, project string, r *rules.Rule, reason string, n int) {
	w.metrics.RulesStarved.WithLabelValues(reason).Add(float64(n))
	now := w.now()
	k := key{project, r.ID, reason}
	w.mu.Lock()
	last, seen := w.warned[k]
	due := !seen || now.Sub(last) >= Period
	if due {
		if len(w.warned) >= maxWarned {
			for old, at := range w.warned {
				if now.Sub(at) >= Period {
					delete(w.warned, old)
				}
			}
		}
		w.warned[k] = now
	}
	w.mu.Unlock()
	if !due {
		return
	}
	w.log.Warn("rule starved: its events lack a field it counts by, so it cannot fire on them",
		"project", project, "rule", r.ID, "reason", reason, "field", Field(reason), "events", n,
		"hint", hint(reason), "next_warning_in", Period.String())
	if w.redis == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, markTimeout)
	defer cancel()
	if err := w.mark(ctx, project, r.ID, Mark{Reason: reason, At: now.UTC()}); err != nil {
		w.log.Debug("starved rule's mark not written; klaxon explain will not tell of it", "project", project, "rule", r.ID, "error", err)
	}
}

func hint(reason string) string {
	if reason == NoUser {
		return "countBy users counts distinct event.user.id; stock Hawk sends no event.user (docs/rules.md)"
	}
	return ""
}

// Mark is what Redis keeps of a rule's starvation, for klaxon explain.
type Mark struct {
	Reason string    `json:"reason"`
	At     time.Time `json:"at"` // when a worker last warned of it
}

// markKey is the hash of a project's marks, field the rule's id.
func markKey(prefix, project string) string {
	return prefix + ":starved:" + strings.ToLower(project)
}

func (w *Watch) mark(ctx context.Context, project, ruleID string, m Mark) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	k := markKey(w.prefix, project)
	_, err = w.redis.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, k, ruleID, b)
		p.PExpire(ctx, k, 2*Period)
		return nil
	})
	return err
}

// Read returns the rule's mark when a worker warned of it within the last
// two periods (a worker warns once a period while it goes on).
func Read(ctx context.Context, rdb redis.UniversalClient, prefix, project, ruleID string, now time.Time) (Mark, bool, error) {
	b, err := rdb.HGet(ctx, markKey(prefix, project), ruleID).Bytes()
	if err == redis.Nil {
		return Mark{}, false, nil
	}
	if err != nil {
		return Mark{}, false, fmt.Errorf("read the starvation mark of rule %s: %w", ruleID, err)
	}
	var m Mark
	if err := json.Unmarshal(b, &m); err != nil {
		return Mark{}, false, fmt.Errorf("starvation mark of rule %s: %w", ruleID, err)
	}
	return m, now.Sub(m.At) < 2*Period, nil
}
