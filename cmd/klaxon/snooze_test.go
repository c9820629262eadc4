package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/klaxonhq/klaxon/internal/snooze"
)

// TestSnoozeListRemove: a snooze is set for a rule that exists (a typo is
// refused, not silently snoozing nothing), listed, extended in place,
// and removed; removing it again says there was none (exit 1).
func TestSnoozeListRemove(t *testing.T) {
	env, _ := redisEnv(t)
	if r := klaxon(t, env, "snooze", "--project", projectA, "--rule", "strom", "--for", "2h"); r.code != exitUsage || !strings.Contains(r.stderr, "no enabled rule strom") {
		t.Errorf("unknown rule: exit %d, %s", r.code, r.stderr)
	}
	if r := klaxon(t, env, "snooze", "--project", projectA, "--rule", "storm"); r.code != exitUsage {
		t.Errorf("no --for or --until: exit %d", r.code)
	}
	r := klaxon(t, env, "snooze", "--project", projectA, "--rule", "storm", "--for", "2h")
	if r.code != exitOK || !strings.Contains(r.stdout, "snoozed rule storm of project "+projectA+", every group until") {
		t.Fatalf("exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	r = klaxon(t, env, "snooze", "--project", projectA, "--rule", "storm", "--group", "g1", "--until", "2999-01-01T00:00:00Z", "--no-summary")
	if r.code != exitOK || !strings.Contains(r.stdout, "group g1 until 2999-01-01T00:00:00Z") || !strings.Contains(r.stdout, "no summary") {
		t.Fatalf("exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	r = klaxon(t, env, "snooze", "list")
	if r.code != exitOK || strings.Count(r.stdout, "storm") != 2 || !strings.Contains(r.stdout, "(all)") {
		t.Fatalf("list: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	// Extended: still one snooze of the rule, with the new end.
	klaxon(t, env, "snooze", "--project", projectA, "--rule", "storm", "--for", "3h")
	var list []snooze.Snooze
	r = klaxon(t, env, "snooze", "list", "--project", projectA, "--json")
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 2 {
		t.Fatalf("list --json: %v %s", err, r.stdout)
	}
	if d := list[0].Until.Sub(list[0].Since); list[0].GroupHash != "" || d < 3*3600e9-60e9 || !list[0].Summary {
		t.Errorf("extended snooze %+v", list[0])
	}
	// explain shows the snooze.
	if r := klaxon(t, env, "explain", "--project", projectA, "--rule", "storm", "--group", "g1"); strings.Count(r.stdout, "snoozed until") != 2 {
		t.Errorf("explain does not show both snoozes:\n%s", r.stdout)
	}
	if r := klaxon(t, env, "snooze", "remove", "--project", projectA, "--rule", "storm"); r.code != exitOK {
		t.Fatalf("remove: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	if r := klaxon(t, env, "snooze", "remove", "--project", projectA, "--rule", "storm"); r.code != exitProblem || !strings.Contains(r.stdout, "was not snoozed") {
		t.Errorf("remove again: exit %d: %s", r.code, r.stdout)
	}
	r = klaxon(t, env, "snooze", "list")
	if strings.Count(r.stdout, "storm") != 1 || !strings.Contains(r.stdout, "g1") {
		t.Errorf("after remove:\n%s", r.stdout)
	}
}
