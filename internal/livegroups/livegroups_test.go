package livegroups_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/livegroups"
	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// A project that adds groups past Max is full: its groups without a state
// overflow, those with one do not, another project is untouched, and it
// empties once its groups' buckets have aged out.
func TestProjectOverItsGroupsOverflows(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.KeyPrefix(t)
	engine := counter.New(rdb, counter.Options{Prefix: prefix})
	m := metrics.New(prometheus.NewRegistry())
	var logs bytes.Buffer
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c := livegroups.New(livegroups.Config{Redis: rdb, States: engine, Prefix: prefix, Max: 1000, Metrics: m,
		Log: slog.New(slog.NewJSONHandler(&logs, nil)), Now: func() time.Time { return now }})

	// One group with a state: counted by the engine.
	rule := &rules.Rule{ID: "r1", ProjectID: "busy", Windows: []rules.Window{{Threshold: 100, Period: time.Minute}}, Cooldown: time.Minute}
	if _, err := engine.ObserveBatch(ctx, 1, []counter.Event{{ID: "e1", ProjectID: "busy", GroupHash: "kept", Rules: []*rules.Rule{rule}}}); err != nil {
		t.Fatal(err)
	}
	for i := range 800 {
		c.Saw("busy", fmt.Sprintf("g%d", i), time.Minute)
	}
	c.Saw("quiet", "q1", time.Minute)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	asked := [][2]string{{"busy", "kept"}, {"busy", "fresh"}, {"quiet", "fresh"}}
	if over, err := c.Overflowing(ctx, asked); err != nil || over != nil {
		t.Fatalf("800 groups of 1000: Overflowing = %v, %v; want none", over, err)
	}
	for i := 800; i < 1200; i++ {
		c.Saw("busy", fmt.Sprintf("g%d", i), time.Minute)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	over, err := c.Overflowing(ctx, asked)
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{false, true, false}; fmt.Sprint(over) != fmt.Sprint(want) {
		t.Errorf("Overflowing(%v) = %v, want %v", asked, over, want)
	}
	if got := full(t, m); got != 1 {
		t.Errorf("klaxon_projects_over_group_cap = %v, want 1", got)
	}
	if n := strings.Count(logs.String(), "project over its live groups"); n != 1 {
		t.Errorf("%d warnings of a full project, want 1:\n%s", n, logs.String())
	}

	// Two generations later none counts these groups: the project empties.
	now = now.Add(53 * time.Hour)
	c.Saw("busy", "later", time.Minute)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if over, err := c.Overflowing(ctx, asked); err != nil || over != nil {
		t.Errorf("53 h later: Overflowing = %v, %v; want none", over, err)
	}
	if got := full(t, m); got != 0 {
		t.Errorf("klaxon_projects_over_group_cap = %v after the project emptied, want 0", got)
	}
}

// Groups whose rules keep state longer than a day count in day buckets,
// and still count a week later.
func TestLongLivedGroupsCountForDays(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.KeyPrefix(t)
	m := metrics.New(prometheus.NewRegistry())
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c := livegroups.New(livegroups.Config{Redis: rdb, States: counter.New(rdb, counter.Options{Prefix: prefix}), Prefix: prefix,
		Max: 1000, Metrics: m, Log: slog.New(slog.DiscardHandler), Now: func() time.Time { return now }})
	for i := range 1200 {
		c.Saw("p", fmt.Sprintf("g%d", i), 7*24*time.Hour)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	now = now.Add(7 * 24 * time.Hour)
	c.Saw("p", "another", 7*24*time.Hour)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := full(t, m); got != 1 {
		t.Errorf("a week later, klaxon_projects_over_group_cap = %v, want 1: week-long states still live", got)
	}
}

// full reads klaxon_projects_over_group_cap.
func full(t *testing.T, m *metrics.Metrics) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.ProjectsOverGroupCap.Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetGauge().GetValue()
}
