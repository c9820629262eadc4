package snooze

import (
	"context"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// TestSetExtendsRemoveEnds: snoozing a running snooze again moves its end
// but keeps it the same snooze (one summary); a rule's snooze covers
// every group, a group's only its own; Remove ends it; ended snoozes are
// pruned and the hash expires with its last one.
func TestSetExtendsRemoveEnds(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := New(rdb, testenv.KeyPrefix(t))
	now := time.Now().Truncate(time.Millisecond)
	a, err := s.Set(ctx, Snooze{ProjectID: "P", RuleID: "r", Until: now.Add(time.Hour), Summary: true}, now)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Set(ctx, Snooze{ProjectID: "p", RuleID: "r", Until: now.Add(2 * time.Hour), Summary: true}, now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if !b.Since.Equal(a.Since) || a.ID() != b.ID() || !b.Until.Equal(now.Add(2*time.Hour)) {
		t.Errorf("extension %+v of %+v: want the same snooze, later end", b, a)
	}
	if _, err := s.Set(ctx, Snooze{ProjectID: "p", RuleID: "q", GroupHash: "g", Until: now.Add(3 * time.Hour)}, now); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(ctx, s.key("p")).Val(); ttl < 2*time.Hour || ttl > 3*time.Hour+time.Minute {
		t.Errorf("ttl %v, want the last snooze's end", ttl)
	}
	for _, c := range []struct {
		rule, group string
		want        bool
	}{{"r", "any", true}, {"q", "g", true}, {"q", "h", false}, {"x", "g", false}} {
		got, err := s.Active(ctx, "p", c.rule, c.group, now.Add(time.Minute))
		if err != nil || (got != nil) != c.want {
			t.Errorf("Active(%s, %s) = %+v, %v; want %v", c.rule, c.group, got, err, c.want)
		}
	}
	if got, _ := s.Active(ctx, "p", "r", "g", now.Add(2*time.Hour)); got != nil {
		t.Errorf("active after its end: %+v", got)
	}
	list, err := s.List(ctx, "")
	if err != nil || len(list) != 2 || list[0].RuleID != "q" || list[1].RuleID != "r" {
		t.Fatalf("list %+v, %v", list, err)
	}
	if ok, err := s.Remove(ctx, "p", "r", ""); !ok || err != nil {
		t.Fatalf("remove: %v, %v", ok, err)
	}
	if ok, _ := s.Remove(ctx, "p", "r", ""); ok {
		t.Error("removed twice")
	}
	// A snooze after the end of another is a new one, and prunes the old.
	if _, err := s.Set(ctx, Snooze{ProjectID: "p", RuleID: "z", Until: now.Add(5 * time.Hour)}, now.Add(4*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.List(ctx, "p"); len(list) != 1 || list[0].RuleID != "z" {
		t.Errorf("after the others ended: %+v", list)
	}
}
