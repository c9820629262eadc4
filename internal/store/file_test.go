package store_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/store"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// writeFile replaces the file at path atomically, as the docs advise.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// loadedCache is a cache of the rules file at path, loaded once.
func loadedCache(t *testing.T, path string) *store.Cache {
	t.Helper()
	cache := store.NewCache(store.NewFileSource(path), store.CacheOptions{})
	if err := cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	return cache
}

func rulesFile(threshold string) string {
	return `
5e3eef0679fa3700a0198a49:
  - id: rule-1
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: ` + threshold + `
    thresholdPeriod: 60000
    channels:
      webhook: {isEnabled: true, endpoint: "http://127.0.0.1:8080/hook", minPeriod: 0}
`
}

const mixedFile = `
# Comments are fine.
5e3eef0679fa3700a0198a49:
  - id: rule-1
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: 100
    thresholdPeriod: 6e4
    stormOver: true
    including: [TypeError, "ReferenceError"]
    channels:
      webhook: {isEnabled: true, endpoint: "http://127.0.0.1:8080/hook?key=s3cr3t-T0KEN", minPeriod: 0}
      slack: {isEnabled: false}
  - id: rule-typo
    isEnabled: true
    whatToReceive: ONLY_NEW
    treshold: 5
    windows: [{threshold: 1, period: 1000, perod: 5}]
    channels:
      telegram: {isEnabled: true, endpoint: "-100s3cr3t-T0KEN", minPeriod: 60, minPeriods: 1}
  - id: rule-bad-type
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: s3cr3t-T0KEN
    thresholdPeriod: 60000
  - id: rule-bad-value
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: 0
    thresholdPeriod: 60000
    channels:
      webhook: {isEnabled: true, endpoint: "http://x/s3cr3t-T0KEN"}
  - id: rule-huge-cooldown
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: 1
    thresholdPeriod: 1000
    cooldown: 1000000000000000
  - id: rule-huge-minperiod
    isEnabled: true
    whatToReceive: ONLY_NEW
    channels:
      webhook: {isEnabled: true, endpoint: "http://x/", minPeriod: 10000000000}
  - just a string
  - isEnabled: true
    whatToReceive: ONLY_NEW
  - id: rule-1
    isEnabled: true
    whatToReceive: ONLY_NEW
5E3EEF0679FA3700A0198A4A:
  - id: upper
    isEnabled: true
    whatToReceive: ONLY_NEW
    channels:
      email: {isEnabled: true, endpoint: "ops@example.com"}
5e3eef0679fa3700a0198a4b: []
5e3eef0679fa3700a0198a4c:
my-project:
  - id: x
    isEnabled: true
    whatToReceive: ONLY_NEW
5e3eef0679fa3700a0198a4d: {id: not-a-list}
`

func TestFileSource(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, mixedFile)
	log, logs := newLogger()
	cache := store.NewCache(store.NewFileSource(path), store.CacheOptions{Logger: log})
	if err := cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}

	a := cache.Rules("5e3eef0679fa3700a0198a49")
	if ids := ruleIDs(a); strings.Join(ids, ",") != "rule-1,rule-typo" {
		t.Fatalf("project a rules %v, want rule-1,rule-typo", ids)
	}
	if w := a[0].Windows; len(w) != 1 || w[0] != (rules.Window{Threshold: 100, Period: time.Minute}) {
		t.Errorf("rule-1 windows %+v", w)
	}
	if a[0].StormOver != rules.Yes || a[1].StormOver != rules.Unset {
		t.Errorf("stormOver %v, %v; want yes, and unset where the rule does not say", a[0].StormOver, a[1].StormOver)
	}
	if !a[0].Matches("a referenceerror", false) || a[0].Matches("other", false) {
		t.Error("rule-1 including not applied")
	}
	if got := cache.Rules("5e3eef0679fa3700a0198a4a"); len(got) != 1 || got[0].ProjectID != "5e3eef0679fa3700a0198a4a" {
		t.Errorf("upper-case key: %+v, want its rule under the lower-case id", got)
	}

	for _, want := range []struct{ msg, project, rule, reason string }{
		{"rule skipped", "5e3eef0679fa3700a0198a49", "rule-bad-type", "cannot unmarshal"},
		{"rule skipped", "5e3eef0679fa3700a0198a49", "rule-bad-value", "threshold 0"},
		{"rule skipped", "5e3eef0679fa3700a0198a49", "rule-huge-cooldown", "cooldown 1000000000000000 ms is longer than"},
		{"rule skipped", "5e3eef0679fa3700a0198a49", "rule-huge-minperiod", "minPeriod 10000000000 s is longer than"},
		{"rule skipped", "5e3eef0679fa3700a0198a49", "#6", "mapping"},
		{"rule skipped", "5e3eef0679fa3700a0198a49", "#7", "no id"},
		{"rule skipped", "5e3eef0679fa3700a0198a49", "rule-1", "another rule"},
		{"rule warning", "5e3eef0679fa3700a0198a49", "rule-typo", `unknown field "treshold"`},
		{"rule warning", "5e3eef0679fa3700a0198a49", "rule-typo", `unknown field "windows[0].perod"`},
		{"rule warning", "5e3eef0679fa3700a0198a49", "rule-typo", `unknown field "channels.telegram.minPeriods"`},
		{"project's rules skipped", "my-project", "", "24 hex digits"},
		{"project's rules skipped", "5e3eef0679fa3700a0198a4d", "", "list of rules"},
	} {
		found := false
		for _, rec := range logs.records(t, want.msg) {
			reason, _ := rec["reason"].(string)
			rule, _ := rec["rule"].(string)
			if rec["project"] == want.project && rule == want.rule && strings.Contains(reason, want.reason) {
				found = true
			}
		}
		if !found {
			t.Errorf("no %q naming project %s rule %q with reason %q\n%s", want.msg, want.project, want.rule, want.reason, logs)
		}
	}
	if strings.Contains(logs.String(), "s3cr3t") {
		t.Errorf("a secret reached the log:\n%s", logs)
	}
	if got := cache.Snapshot().Projects(); got != 2 {
		t.Errorf("%d projects with rules, want 2", got)
	}
}

func TestFileSourceInvalidFileKeepsLastGood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, rulesFile("100"))
	var results []store.LoadResult
	cache := store.NewCache(store.NewFileSource(path), store.CacheOptions{
		OnLoad: func(r store.LoadResult) { results = append(results, r) },
	})
	if err := cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	good := cache.Snapshot()

	for name, content := range map[string]string{
		"unparsable":  "5e3eef0679fa3700a0198a49:\n  - id: [unclosed\n",
		"not a map":   "- id: rule-1\n",
		"empty":       "",
		"only spaces": "  \n# just a comment\n",
		"missing":     "",
	} {
		t.Run(name, func(t *testing.T) {
			if name == "missing" {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			} else {
				writeFile(t, path, content)
			}
			results = nil
			err := cache.Refresh(t.Context())
			if err == nil {
				t.Fatal("Refresh succeeded")
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file", err)
			}
			if cache.Snapshot() != good || len(cache.Rules("5e3eef0679fa3700a0198a49")) != 1 || !cache.Ready() {
				t.Error("the last good rules are no longer served")
			}
			if len(results) != 1 || results[0].Err == nil || results[0].Served != good {
				t.Errorf("OnLoad got %+v, want one failure still serving the last good snapshot", results)
			}
		})
	}

	writeFile(t, path, "{}\n")
	if err := cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if cache.Rules("5e3eef0679fa3700a0198a49") != nil || !cache.Ready() {
		t.Error(`"{}" should mean no rules`)
	}
}

func TestCacheRunPicksUpFileEdit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, rulesFile("100"))
	log, logs := newLogger()
	cache := store.NewCache(store.NewFileSource(path), store.CacheOptions{Interval: 50 * time.Millisecond, Logger: log})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- cache.Run(ctx) }()
	threshold := func() int64 {
		rs := cache.Rules("5e3eef0679fa3700a0198a49")
		if len(rs) == 0 {
			return 0
		}
		return rs[0].Windows[0].Threshold
	}
	testenv.WaitFor(t, 5*time.Second, "Run's first load", func() bool { return threshold() == 100 })

	writeFile(t, path, rulesFile("7"))
	testenv.WaitFor(t, 5*time.Second, "the edit served", func() bool { return threshold() == 7 })

	writeFile(t, path, rulesFile("[broken"))
	testenv.WaitFor(t, 5*time.Second, "the failure logged", func() bool {
		return logs.count(t, "rules load failed; serving the last good rules") == 1
	})
	if got := threshold(); got != 7 {
		t.Errorf("after a broken edit: threshold %d, want the last good 7", got)
	}

	writeFile(t, path, rulesFile("8"))
	testenv.WaitFor(t, 5*time.Second, "the fix served", func() bool { return threshold() == 8 })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run returned %v", err)
	}
	if n := logs.count(t, "rules load failed; serving the last good rules"); n != 1 {
		t.Errorf("failure logged %d times, want once\n%s", n, logs)
	}
}

func TestCacheLogsEachProblemOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	broken := rulesFile("0")
	writeFile(t, path, broken)
	log, logs := newLogger()
	cache := store.NewCache(store.NewFileSource(path), store.CacheOptions{Logger: log})
	refresh := func() {
		t.Helper()
		if err := cache.Refresh(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	skipped := func() int { return logs.count(t, "rule skipped", "rule", "rule-1") }
	for range 3 {
		refresh()
	}
	if n := skipped(); n != 1 {
		t.Fatalf("the same problem logged %d times over 3 loads, want once\n%s", n, logs)
	}
	writeFile(t, path, rulesFile("5"))
	refresh()
	writeFile(t, path, broken)
	refresh()
	refresh()
	if n := skipped(); n != 2 {
		t.Errorf("a problem fixed and back was logged %d times in all, want 2\n%s", n, logs)
	}
}

func TestCacheConcurrentReads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, rulesFile("1"))
	cache := loadedCache(t, path)
	if allocs := testing.AllocsPerRun(100, func() { cache.Rules("5e3eef0679fa3700a0198a49") }); allocs != 0 {
		t.Errorf("Rules allocates %.0f times per call, want 0", allocs)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				rs := cache.Rules("5e3eef0679fa3700a0198a49")
				if len(rs) != 1 || rs[0].Windows[0].Threshold < 1 {
					t.Errorf("read %d rules", len(rs))
					return
				}
			}
		})
	}
	for i := range 20 {
		writeFile(t, path, rulesFile(string(rune('1'+i%9))))
		if err := cache.Refresh(t.Context()); err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
}

func TestCompile(t *testing.T) {
	spec := func(id string, enabled bool) rules.Spec {
		return rules.Spec{ID: id, IsEnabled: enabled, WhatToReceive: rules.OnlyNew,
			Channels: map[string]rules.ChannelSpec{rules.Webhook: {IsEnabled: true, Endpoint: "http://x"}}}
	}
	loaded := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	snap := store.Compile(store.Specs{
		Projects: map[string][]rules.Spec{
			"5e3eef0679fa3700a0198a49": {spec("a", true), spec("b", false), spec("a", true), spec("", true), spec("c", true)},
			"5e3eef0679fa3700a0198a4a": {spec("a", false)},
		},
		Problems: []store.Problem{{ProjectID: "x", Reason: "from the source", Skipped: true}},
	}, loaded)
	if ids := ruleIDs(snap.Rules("5e3eef0679fa3700a0198a49")); strings.Join(ids, ",") != "a,c" {
		t.Errorf("rules %v, want a,c", ids)
	}
	if snap.Projects() != 1 || snap.Len() != 2 || snap.Skipped() != 3 || !snap.LoadedAt().Equal(loaded) {
		t.Errorf("projects %d len %d skipped %d loadedAt %s", snap.Projects(), snap.Len(), snap.Skipped(), snap.LoadedAt())
	}
	var got []string
	for _, p := range snap.Problems() {
		got = append(got, p.String())
	}
	want := []string{
		"project x skipped: from the source",
		"project 5e3eef0679fa3700a0198a49 rule a skipped: another rule of the project has this id",
		"project 5e3eef0679fa3700a0198a49 rule #3 skipped: rule has no id",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var empty *store.Snapshot
	if empty.Rules("5e3eef0679fa3700a0198a49") != nil || empty.Len() != 0 {
		t.Error("a nil snapshot has rules")
	}
}

// An unchanged file is neither parsed nor compiled again: the very same
// snapshot keeps serving; an edit replaces it.
func TestCacheSkipsUnchangedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, rulesFile("100"))
	cache := loadedCache(t, path)
	first := cache.Snapshot()
	if err := cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if cache.Snapshot() != first {
		t.Error("an unchanged file was compiled again")
	}
	writeFile(t, path, rulesFile("7"))
	if err := cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if cache.Snapshot() == first || cache.Rules("5e3eef0679fa3700a0198a49")[0].Windows[0].Threshold != 7 {
		t.Error("an edited file was not compiled again")
	}
}

// yaml.v3 cuts the fraction of a number decoded into an integer (threshold
// 2.5 becomes 2, 0.5 becomes 0): such a rule is skipped, naming the field,
// as MongoDB's decoding does, rather than run with a threshold nobody wrote.
func TestFileSourceRejectsFractions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, `
5e3eef0679fa3700a0198a49:
  - id: half-threshold
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: 2.5
    thresholdPeriod: 60000
  - id: half-window
    isEnabled: true
    whatToReceive: SEEN_MORE
    windows: [{threshold: 5, period: 1500.5}]
  - id: half-minperiod
    isEnabled: true
    whatToReceive: ONLY_NEW
    channels:
      webhook: {isEnabled: true, endpoint: "http://x/", minPeriod: 0.5}
  - id: whole
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: 2.0
    thresholdPeriod: 6e4
`)
	log, logs := newLogger()
	cache := store.NewCache(store.NewFileSource(path), store.CacheOptions{Logger: log})
	if err := cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ids := ruleIDs(cache.Rules("5e3eef0679fa3700a0198a49")); strings.Join(ids, ",") != "whole" {
		t.Errorf("rules %v, want only the one with whole numbers", ids)
	}
	for rule, field := range map[string]string{
		"half-threshold": "threshold 2.5",
		"half-window":    "windows[0].period 1500.5",
		"half-minperiod": "channels.webhook.minPeriod 0.5",
	} {
		wantSkipped(t, logs, rule, field)
	}
}

// Anchors and merge keys are YAML's way to share settings between rules:
// what they bring is checked like the rule's own fields, and the merge key
// is not reported as an unknown field.
func TestFileSourceAnchorsAndMergeKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, `
5e3eef0679fa3700a0198a49:
  - &base
    id: base
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: 5
    thresholdPeriod: 60000
    channels: &hook
      webhook: {isEnabled: true, endpoint: "http://x/", minPeriod: 0}
  - <<: *base
    id: merged
    threshold: 7
    treshold: 8
  - id: aliased
    isEnabled: true
    whatToReceive: ONLY_NEW
    channels: *hook
  - id: anchor-holder
    isEnabled: false
    whatToReceive: ONLY_NEW
    channels: &half
      webhook: {isEnabled: true, endpoint: "http://x/", minPeriod: 0.5}
  - id: half-through-alias
    isEnabled: true
    whatToReceive: ONLY_NEW
    channels: *half
  - <<: [*base]
    id: half-through-merge
    thresholdPeriod: 1500.5
`)
	log, logs := newLogger()
	cache := store.NewCache(store.NewFileSource(path), store.CacheOptions{Logger: log})
	if err := cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ids := ruleIDs(cache.Rules("5e3eef0679fa3700a0198a49")); strings.Join(ids, ",") != "base,merged,aliased" {
		t.Errorf("rules %v, want base,merged,aliased", ids)
	}
	if n := logs.count(t, "rule warning", "reason", `unknown field "<<" ignored`); n != 0 {
		t.Errorf("a merge key was reported as an unknown field\n%s", logs)
	}
	if n := logs.count(t, "rule warning", "rule", "merged", "reason", `unknown field "treshold" ignored`); n != 1 {
		t.Errorf("a typo beside a merge key was not reported\n%s", logs)
	}
	for rule, field := range map[string]string{
		"half-through-alias": "channels.webhook.minPeriod 0.5",
		"half-through-merge": "thresholdPeriod 1500.5",
	} {
		wantSkipped(t, logs, rule, field)
	}
}

// wantSkipped checks that rule was logged as skipped for a reason naming field.
func wantSkipped(t *testing.T, logs *logBuffer, rule, field string) {
	t.Helper()
	for _, rec := range logs.records(t, "rule skipped") {
		reason, _ := rec["reason"].(string)
		if rec["rule"] == rule && strings.Contains(reason, field) {
			return
		}
	}
	t.Errorf("no rule skipped for %s naming %q\n%s", rule, field, logs)
}

// TestProblemsCarryTheirLine: `klaxon rules check` points a rule author at
// the line to fix, for what the file's parser finds and for what
// validation finds alike.
func TestProblemsCarryTheirLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yml")
	writeFile(t, path, `5e3eef0679fa3700a0198a49:
  - id: good
    isEnabled: true
    whatToReceive: ONLY_NEW
    channels: {webhook: {isEnabled: true, endpoint: "http://x/", minPeriod: 0}}
  - id: bad-threshold
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: 0
    thresholdPeriod: 60000
  - id: typo
    isEnabled: true
    whatToReceive: ONLY_NEW
    inclding: [x]
not-a-project: []
`)
	specs, err := store.NewFileSource(path).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	snap := store.Compile(specs, time.Now())
	lines := map[string]int{}
	for _, p := range snap.Problems() {
		key := p.RuleID
		if strings.Contains(p.Reason, "unknown field") {
			key += "/unknown"
		} else if strings.Contains(p.Reason, "no enabled channel") {
			key += "/channels"
		}
		if key == "" {
			key = p.ProjectID
		}
		lines[key] = p.Line
	}
	want := map[string]int{"bad-threshold": 6, "typo/unknown": 14, "typo/channels": 11, "not-a-project": 15}
	for k, line := range want {
		if lines[k] != line {
			t.Errorf("%s: line %d, want %d (all: %v)", k, lines[k], line, lines)
		}
	}
}

// A rules file over the limit fails the load with a reason naming the
// limit, before it is read, and the last good rules keep serving: a huge
// file must not exhaust the worker's memory.
func TestRulesFileOverLimitRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, rulesFile("100"))
	cache := loadedCache(t, path)
	good := cache.Snapshot()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Sparse: the size is there, the disk space is not.
	if err := f.Truncate(store.MaxRulesFileBytes + 1); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	err = cache.Refresh(t.Context())
	if err == nil || !strings.Contains(err.Error(), "64 MiB") || !strings.Contains(err.Error(), path) {
		t.Errorf("Refresh = %v, want an error naming the file and the 64 MiB limit", err)
	}
	if cache.Snapshot() != good {
		t.Error("the last good rules are no longer served")
	}
}

// An edit that keeps the file's size, made in place within the same tick
// of the file system's clock (so that its modification time does not
// move), is picked up at the next load.
func TestSameSizeEditInPlaceIsPickedUp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(rulesFile("100")), 0o600); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	cache := loadedCache(t, path)
	if err := os.WriteFile(path, []byte(rulesFile("700")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, info.ModTime(), info.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := cache.Rules("5e3eef0679fa3700a0198a49")[0].Windows[0].Threshold; got != 700 {
		t.Errorf("threshold %d after the edit, want 700", got)
	}
}
