package starved_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/starved"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

const project = "5e3eef0679fa3700a0198a49"

// warnings are the "rule starved" lines logged (Saw logs in the caller's
// goroutine: the tests' buffers need no lock).
func warnings(logs *bytes.Buffer) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && strings.HasPrefix(m["msg"].(string), "rule starved") {
			out = append(out, m)
		}
	}
	return out
}

// starvedEvents reads klaxon_rules_starved_total{reason="no_user"}.
func starvedEvents(t *testing.T, m *metrics.Metrics) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.RulesStarved.WithLabelValues(starved.NoUser).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetCounter().GetValue()
}

// Only a countBy users rule needs a field: event.user.
func TestLacks(t *testing.T) {
	users := &rules.Rule{ID: "u", Users: true}
	events := &rules.Rule{ID: "e"}
	for _, tt := range []struct {
		r    *rules.Rule
		user string
		want string
	}{{users, "", starved.NoUser}, {users, "u1", ""}, {events, "", ""}} {
		if got := starved.Lacks(tt.r, tt.user); got != tt.want {
			t.Errorf("rule %s, user %q: %q, want %q", tt.r.ID, tt.user, got, tt.want)
		}
	}
	if starved.Field(starved.NoUser) != "event.user" {
		t.Errorf("field of no_user: %q", starved.Field(starved.NoUser))
	}
}

// Every starved event counts in the metric, but the log warns once per
// rule and hour, each rule on its own; the mark klaxon explain reads is in
// Redis from the first warning on, and says nothing two hours after it.
func TestWarnsOncePerRuleAndHourAndLeavesAMark(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.KeyPrefix(t)
	logs := &bytes.Buffer{}
	m := metrics.New(prometheus.NewRegistry())
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	w := starved.New(starved.Config{Redis: rdb, Prefix: prefix, Metrics: m,
		Log: slog.New(slog.NewJSONHandler(logs, nil)), Now: func() time.Time { return now }})
	ctx := context.Background()
	a := &rules.Rule{ID: "a", ProjectID: project, Users: true}
	b := &rules.Rule{ID: "b", ProjectID: project, Users: true}

	if _, ok, err := starved.Read(ctx, rdb, prefix, project, "a", now); err != nil || ok {
		t.Fatalf("mark before any event: %v, %v", ok, err)
	}
	w.Saw(ctx, project, a, starved.NoUser, 3)
	now = now.Add(30 * time.Minute)
	w.Saw(ctx, project, a, starved.NoUser, 4)
	w.Saw(ctx, project, b, starved.NoUser, 1)
	if got := starvedEvents(t, m); got != 8 {
		t.Errorf("klaxon_rules_starved_total{reason=no_user} = %v, want 8 (every event)", got)
	}
	warned := warnings(logs)
	if len(warned) != 2 || warned[0]["rule"] != "a" || warned[0]["field"] != "event.user" || warned[0]["events"] != 3.0 || warned[1]["rule"] != "b" {
		t.Fatalf("warnings %v: want one for a (3 events, event.user), one for b", warned)
	}
	mark, ok, err := starved.Read(ctx, rdb, prefix, project, "a", now)
	if err != nil || !ok || mark.Reason != starved.NoUser || !mark.At.Equal(now.Add(-30*time.Minute)) {
		t.Errorf("a's mark %+v, %v, %v: want no_user at the first warning", mark, ok, err)
	}

	now = now.Add(30 * time.Minute) // an hour after a's warning
	w.Saw(ctx, project, a, starved.NoUser, 1)
	if warned := warnings(logs); len(warned) != 3 || warned[2]["rule"] != "a" {
		t.Errorf("an hour on, warnings %v: want a third, for a", warned)
	}
	if _, ok, _ := starved.Read(ctx, rdb, prefix, project, "b", now.Add(90*time.Minute)); ok {
		t.Errorf("b's mark two hours after its only warning still says starved")
	}
}

// Without Redis the watch still logs and counts: the mark is for explain
// only.
func TestWatchWithoutRedis(t *testing.T) {
	logs := &bytes.Buffer{}
	m := metrics.New(prometheus.NewRegistry())
	w := starved.New(starved.Config{Metrics: m, Log: slog.New(slog.NewJSONHandler(logs, nil))})
	w.Saw(context.Background(), project, &rules.Rule{ID: "a", Users: true}, starved.NoUser, 2)
	if len(warnings(logs)) != 1 || starvedEvents(t, m) != 2 {
		t.Errorf("logs %v: want one warning and 2 starved events", warnings(logs))
	}
}
