package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// TestExplainShowsQuietHours: explain says a rule's quiet hours, its own
// or its project's, whether it is quiet now and until when, else when the
// next quiet period comes; and that a critical rule passes through them.
func TestExplainShowsQuietHours(t *testing.T) {
	now := time.Now().UTC()
	clock := func(d time.Duration) string { return now.Add(d).Format("15:04") }
	file := writeTemp(t, "rules.yml", projectA+`:
  name: Shop
  quiet: {timezone: UTC, hours: [{from: "`+clock(-time.Hour)+`", to: "`+clock(time.Hour)+`"}]}
  notifications:
    - {id: inherits, isEnabled: true, whatToReceive: ONLY_NEW}
    - {id: later, isEnabled: true, whatToReceive: ONLY_NEW,
       quiet: {timezone: UTC, hours: [{from: "`+clock(2*time.Hour)+`", to: "`+clock(3*time.Hour)+`"}]}}
    - {id: pager, isEnabled: true, whatToReceive: ONLY_NEW, critical: true}
`)
	env := map[string]string{"KLAXON_REDIS_URL": testenv.RedisURL(), "KLAXON_PREFIX": testenv.KeyPrefix(t), "KLAXON_RULES_FILE": file}
	explain := func(rule string) result {
		t.Helper()
		r := klaxon(t, env, "explain", "--project", projectA, "--rule", rule, "--group", "g")
		if r.code != exitOK {
			t.Fatalf("explain %s: exit %d, %s", rule, r.code, r.stderr)
		}
		return r
	}
	until := now.Add(time.Hour).Truncate(time.Minute).Format(time.RFC3339)
	for rule, want := range map[string]string{
		"inherits": "quiet hours every day " + clock(-time.Hour) + "–" + clock(time.Hour) + " (UTC): QUIET NOW, until " + until,
		"later":    "next quiet period from " + now.Add(2*time.Hour).Truncate(time.Minute).Format(time.RFC3339),
		"pager":    "critical: passes through quiet hours",
	} {
		if r := explain(rule); !strings.Contains(r.stdout, want) {
			t.Errorf("explain %s lacks %q:\n%s", rule, want, r.stdout)
		}
	}
	r := klaxon(t, env, "explain", "--project", projectA, "--rule", "inherits", "--group", "g", "--json")
	var x explanation
	if err := json.Unmarshal([]byte(r.stdout), &x); err != nil || x.Quiet == nil || !x.Quiet.Now || x.Quiet.Until.Format(time.RFC3339) != until {
		t.Errorf("--json quiet %+v, %v:\n%s", x.Quiet, err, r.stdout)
	}
}
