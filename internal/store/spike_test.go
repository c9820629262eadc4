package store_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/store"
)

// A window's spike is read from the rules file like its other fields: a
// typo in it is an unknown field, a fraction where ms are due skips the
// rule, and a bad value skips it with the rule, window and field named.
func TestFileSourceSpikes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, `
5e3eef0679fa3700a0198a49:
  - id: spike
    isEnabled: true
    whatToReceive: SEEN_MORE
    windows: [{threshold: 50, period: 300000, spike: {factor: 5, baseline: 86400000, floor: 1, flor: 2}}]
  - id: half-baseline
    isEnabled: true
    whatToReceive: SEEN_MORE
    windows: [{threshold: 50, period: 300000, spike: {factor: 5, baseline: 86400000.5}}]
  - id: low-factor
    isEnabled: true
    whatToReceive: SEEN_MORE
    windows: [{threshold: 50, period: 300000}, {threshold: 5, period: 60000, spike: {factor: 0.5, baseline: 86400000}}]
`)
	log, logs := newLogger()
	cache := store.NewCache(store.NewFileSource(path), store.CacheOptions{Logger: log})
	if err := cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	rs := cache.Rules("5e3eef0679fa3700a0198a49")
	if ids := ruleIDs(rs); strings.Join(ids, ",") != "spike" {
		t.Fatalf("rules %v, want only spike", ids)
	}
	want := rules.Spike{Factor: 5, Baseline: 24 * time.Hour, Floor: 1}
	if sp := rs[0].Windows[0].Spike; sp == nil || *sp != want {
		t.Errorf("spike %+v, want %+v", sp, want)
	}
	if !strings.Contains(logs.String(), `unknown field \"windows[0].spike.flor\" ignored`) {
		t.Errorf("no warning of the typo:\n%s", logs)
	}
	wantSkipped(t, logs, "half-baseline", "windows[0].spike.baseline 86400000.5")
	wantSkipped(t, logs, "low-factor", "windows[1]: spike factor 0.5 must be above 1 and at most 1000")
}
