// Package snooze keeps operators' snoozes in Redis: a rule, or one group
// of it, whose firings are counted and recorded but not sent until a
// time. Every worker reads them at each delivery, so a snooze holds
// everywhere at once; the deliverer sends one summary of what a snooze
// held back once it ends (unless the snooze opted out).
//
// A project's snoozes are one hash, <prefix>:snooze:<project>, field the
// rule id or "rule/group", value JSON; it expires with its last snooze.
package snooze

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed set.lua
var setLua string

// Snooze holds back the firings of a rule, or of one group of it.
type Snooze struct {
	ProjectID string `json:"projectId"`
	RuleID    string `json:"ruleId"`
	// GroupHash is the group snoozed; "" for every group of the rule.
	GroupHash string `json:"groupHash,omitempty"`
	// Since is when the snooze began; extending a running snooze keeps it.
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
	// Summary asks for one message, once the snooze ends, listing what it
	// held back.
	Summary bool `json:"summary"`
}

// ID names the snooze: the same for its extensions, new for a snooze set
// after it ended. The summary's message id derives from it.
func (s *Snooze) ID() string {
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%s\x00%s\x00%d", s.ProjectID, s.RuleID, s.GroupHash, s.Since.UnixMilli()))
	return hex.EncodeToString(h[:16])
}

// Covers reports whether the snooze holds back a firing of rule for group
// at t.
func (s *Snooze) Covers(ruleID, group string, t time.Time) bool {
	return s.RuleID == ruleID && (s.GroupHash == "" || s.GroupHash == group) && t.Before(s.Until)
}

// record is a snooze as stored, times in ms.
type record struct {
	ProjectID string `json:"projectId"`
	RuleID    string `json:"ruleId"`
	GroupHash string `json:"groupHash"`
	Since     int64  `json:"since"`
	Until     int64  `json:"until"`
	Summary   bool   `json:"summary"`
}

func (r record) snooze() Snooze {
	return Snooze{ProjectID: r.ProjectID, RuleID: r.RuleID, GroupHash: r.GroupHash,
		Since: time.UnixMilli(r.Since).UTC(), Until: time.UnixMilli(r.Until).UTC(), Summary: r.Summary}
}

// Store reads and writes snoozes under a key prefix.
type Store struct {
	rdb    redis.UniversalClient
	prefix string
	set    *redis.Script
}

// New returns the snoozes under prefix (KLAXON_PREFIX).
func New(rdb redis.UniversalClient, prefix string) *Store {
	return &Store{rdb: rdb, prefix: prefix, set: redis.NewScript(setLua)}
}

func (s *Store) key(projectID string) string {
	return s.prefix + ":snooze:" + strings.ToLower(projectID)
}

func field(ruleID, group string) string {
	if group == "" {
		return ruleID
	}
	return ruleID + "/" + group
}

// Set snoozes sn's rule (or group) from now until sn.Until, and returns
// the snooze stored: a snooze of the same rule and group still running is
// extended to sn.Until, and keeps its Since.
func (s *Store) Set(ctx context.Context, sn Snooze, now time.Time) (Snooze, error) {
	if !sn.Until.After(now) {
		return Snooze{}, fmt.Errorf("snooze until %s: that is not in the future", sn.Until.Format(time.RFC3339))
	}
	rec := record{ProjectID: strings.ToLower(sn.ProjectID), RuleID: sn.RuleID, GroupHash: sn.GroupHash,
		Since: now.UnixMilli(), Until: sn.Until.UnixMilli(), Summary: sn.Summary}
	body, err := json.Marshal(rec)
	if err != nil {
		return Snooze{}, fmt.Errorf("encode snooze: %w", err)
	}
	stored, err := s.set.Run(ctx, s.rdb, []string{s.key(sn.ProjectID)}, field(sn.RuleID, sn.GroupHash), body,
		rec.Until, rec.Since).Text()
	if err != nil {
		return Snooze{}, fmt.Errorf("snooze rule %s of project %s: %w", sn.RuleID, sn.ProjectID, err)
	}
	if err := json.Unmarshal([]byte(stored), &rec); err != nil {
		return Snooze{}, fmt.Errorf("snooze rule %s of project %s: stored %q: %w", sn.RuleID, sn.ProjectID, stored, err)
	}
	return rec.snooze(), nil
}

// Remove ends the snooze of a rule (group "") or of one group of it now;
// false when there was none.
func (s *Store) Remove(ctx context.Context, projectID, ruleID, group string) (bool, error) {
	n, err := s.rdb.HDel(ctx, s.key(projectID), field(ruleID, group)).Result()
	if err != nil {
		return false, fmt.Errorf("remove snooze of rule %s of project %s: %w", ruleID, projectID, err)
	}
	return n > 0, nil
}

// Get is the snooze of a rule (group "") or of one group of it, ended or
// not; nil when there is none.
func (s *Store) Get(ctx context.Context, projectID, ruleID, group string) (*Snooze, error) {
	v, err := s.rdb.HGet(ctx, s.key(projectID), field(ruleID, group)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read snooze of rule %s of project %s: %w", ruleID, projectID, err)
	}
	var rec record
	if err := json.Unmarshal(v, &rec); err != nil {
		return nil, fmt.Errorf("read snooze of rule %s of project %s: %w", ruleID, projectID, err)
	}
	sn := rec.snooze()
	return &sn, nil
}

// List is the snoozes of a project, or of every project when projectID is
// "", ended ones included until pruned, by project, rule and group.
func (s *Store) List(ctx context.Context, projectID string) ([]Snooze, error) {
	keys := []string{s.key(projectID)}
	if projectID == "" {
		keys = nil
		// One key per project with snoozes: few, so SCAN is cheap. On
		// Cluster, go-redis scans one node; ForEachMaster would be needed.
		iter := s.rdb.Scan(ctx, 0, s.prefix+":snooze:*", 100).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			return nil, fmt.Errorf("list snoozes: %w", err)
		}
	}
	var out []Snooze
	for _, k := range keys {
		vals, err := s.rdb.HVals(ctx, k).Result()
		if err != nil {
			return nil, fmt.Errorf("list snoozes of %s: %w", k, err)
		}
		for _, v := range vals {
			var rec record
			if err := json.Unmarshal([]byte(v), &rec); err != nil {
				return nil, fmt.Errorf("list snoozes of %s: %w", k, err)
			}
			out = append(out, rec.snooze())
		}
	}
	slices.SortFunc(out, func(a, b Snooze) int {
		return strings.Compare(a.ProjectID+"\x00"+a.RuleID+"\x00"+a.GroupHash, b.ProjectID+"\x00"+b.RuleID+"\x00"+b.GroupHash)
	})
	return out, nil
}

// Active is the snooze holding back a firing of rule for group at now:
// of the rule's and the group's, the one that ends last; nil when none.
func (s *Store) Active(ctx context.Context, projectID, ruleID, group string, now time.Time) (*Snooze, error) {
	return s.Lookup(ctx, s.rdb, projectID, ruleID, group).Active(now)
}

// A Lookup is Active's read, queued in a pipeline or transaction of the
// caller's so that it costs no round trip of its own.
type Lookup struct {
	cmd                      *redis.SliceCmd
	projectID, ruleID, group string
}

// Lookup sends, or queues on a pipeline, the read of the snoozes of rule
// for group; its Active answers once it ran.
func (s *Store) Lookup(ctx context.Context, c redis.Cmdable, projectID, ruleID, group string) *Lookup {
	return &Lookup{
		cmd:       c.HMGet(ctx, s.key(projectID), field(ruleID, ""), field(ruleID, group)),
		projectID: projectID, ruleID: ruleID, group: group,
	}
}

// Active is what Store.Active says, from the lookup's answer.
func (l *Lookup) Active(now time.Time) (*Snooze, error) {
	vals, err := l.cmd.Result()
	if err != nil {
		return nil, fmt.Errorf("read snoozes of rule %s of project %s: %w", l.ruleID, l.projectID, err)
	}
	var best *Snooze
	for _, v := range vals {
		str, ok := v.(string)
		if !ok {
			continue // nil: no such field
		}
		var rec record
		if err := json.Unmarshal([]byte(str), &rec); err != nil {
			return nil, fmt.Errorf("read snoozes of rule %s of project %s: %w", l.ruleID, l.projectID, err)
		}
		sn := rec.snooze()
		if sn.Covers(l.ruleID, l.group, now) && (best == nil || sn.Until.After(best.Until)) {
			best = &sn
		}
	}
	return best, nil
}
