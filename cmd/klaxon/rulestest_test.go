package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRulesTestExamples runs the test files of the example rules: what the
// documentation says those rules do is what they do.
func TestRulesTestExamples(t *testing.T) {
	r := klaxon(t, nil, "rules", "test", "../../docs/examples")
	if r.code != exitOK {
		t.Fatalf("exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	wantLines(t, r.stdout,
		"ok    ../../docs/examples/database-storm.test.yml: 100 database errors in 5 minutes send one Slack message",
		"ok    ../../docs/examples/error-spike.test.yml: a busy group's usual volume does not fire",
		"ok    ../../docs/examples/first-rule.test.yml: a new database error calls the webhook once",
		"12 passed, 0 failed",
	)
}

// TestRulesTestFailsWhenThresholdRaised: a rule edited past what its
// fixture sends fails its test, and the diff names the case, rule,
// channel, group and time of the message that no longer comes.
func TestRulesTestFailsWhenThresholdRaised(t *testing.T) {
	dir := t.TempDir()
	rulesYAML, err := os.ReadFile("../../docs/examples/database-storm.yml")
	if err != nil {
		t.Fatal(err)
	}
	raised := strings.Replace(string(rulesYAML), "threshold: 100", "threshold: 101", 1)
	if raised == string(rulesYAML) {
		t.Fatal("the example has no threshold: 100 to raise")
	}
	tests, err := os.ReadFile("../../docs/examples/database-storm.test.yml")
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "database-storm.yml"), raised)
	write(t, filepath.Join(dir, "database-storm.test.yml"), string(tests))

	r := klaxon(t, nil, "rules", "test", dir)
	if r.code != exitProblem {
		t.Fatalf("exit %d, want 1:\n%s%s", r.code, r.stdout, r.stderr)
	}
	wantLines(t, r.stdout,
		"FAIL  "+filepath.Join(dir, "database-storm.test.yml")+": 100 database errors in 5 minutes send one Slack message",
		"- rule database-storm, channel slack, group db-timeout, at 2024-06-01T12:01:39.000Z: want 1 message, got 0",
		"sent: nothing",
		"ok    "+filepath.Join(dir, "database-storm.test.yml")+": 99 are not enough",
	)

	r = klaxon(t, nil, "rules", "test", dir, "--json")
	if r.code != exitProblem {
		t.Fatalf("--json: exit %d", r.code)
	}
	var rep testReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if rep.Failed == 0 || rep.Cases[0].Passed || len(rep.Cases[0].Failures) != 1 {
		t.Fatalf("report %+v", rep)
	}
	if f := rep.Cases[0].Failures[0]; f.Rule != "database-storm" || f.Channel != "slack" || f.Group != "db-timeout" ||
		f.When != "2024-06-01T12:01:39.000Z" || f.Want != 1 || f.Got != 0 {
		t.Fatalf("failure %+v", f)
	}
}

const testRules = projectA + `:
  - id: storm
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: 3
    thresholdPeriod: 60000
    cooldown: 2500
    channels:
      webhook: {isEnabled: true, endpoint: "https://example.com/hook", minPeriod: 60}
      slack: {isEnabled: true, endpoint: "https://hooks.slack.com/services/T/B/X", minPeriod: 0}
`

// TestRulesTestDigestsAndUnexpected: firings inside a channel's minPeriod
// arrive as one digest when it ends, while a channel without one gets each;
// a message no expectation names fails the case, marked "+".
func TestRulesTestDigestsAndUnexpected(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "rules.yml"), testRules)
	write(t, filepath.Join(dir, "rules.test.yml"), `project: `+projectA+`
cases:
  - name: three storms
    events:
      # fires at 2s, then after each 2.5 s cooldown at 5s and 8s
      - {at: 0s, title: t, group: a, repeat: 9, every: 1s}
    expect:
      - {rule: storm, channel: webhook, at: 2s, firings: 1}
      - {rule: storm, channel: webhook, at: 62s, firings: 2}
      - {rule: storm, channel: slack, between: [0s, 10s], count: 3}
  - name: unlisted
    events:
      - {at: 0s, title: t, group: a, repeat: 3, every: 1s}
    expect:
      - {rule: storm, channel: slack}
`)
	r := klaxon(t, nil, "rules", "test", filepath.Join(dir, "rules.test.yml"))
	if r.code != exitProblem {
		t.Fatalf("exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	wantLines(t, r.stdout,
		"ok    "+filepath.Join(dir, "rules.test.yml")+": three storms",
		"FAIL  "+filepath.Join(dir, "rules.test.yml")+": unlisted",
		"+ rule storm, channel webhook, group a, at 2024-06-01T12:00:02.000Z: not expected: a firing of 1 firing",
		"1 passed, 1 failed",
	)
}

// TestRulesTestUnreadable: files that cannot be read or are no valid test
// file exit 2 with what is wrong, never 1 (a failed case).
func TestRulesTestUnreadable(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "rules.yml"), testRules)
	for name, tc := range map[string]struct{ file, want string }{
		"missing":       {"", "no such file"},
		"misspelt":      {"cases:\n  - name: x\n    events: []\n    expect:\n      - {rule: storm, chanel: slack}\n", "field chanel not found"},
		"bad time":      {"cases:\n  - name: x\n    events: [{at: soon}]\n", `"soon" is neither an offset`},
		"no cases":      {"project: x\n", "no cases"},
		"no project":    {"cases:\n  - name: x\n    events: [{title: t}]\n", "event 1 has no project"},
		"rules missing": {"rules: nowhere.yml\ncases:\n  - name: x\n", "nowhere.yml"},
	} {
		path := filepath.Join(dir, "absent.test.yml")
		if tc.file != "" {
			path = filepath.Join(dir, "rules.test.yml")
			write(t, path, tc.file)
		}
		r := klaxon(t, nil, "rules", "test", path)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s: exit %d, want 2 and %q: %s%s", name, r.code, tc.want, r.stdout, r.stderr)
		}
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// wantLines fails t for each of wants that out lacks.
func wantLines(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestRulesTestUsersAndNewGroups: events carry users for countBy: users
// and isNew for ONLY_NEW, as the queue's messages do.
func TestRulesTestUsersAndNewGroups(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "rules.yml"), projectA+`:
  - id: three-users
    isEnabled: true
    whatToReceive: SEEN_MORE
    countBy: users
    threshold: 3
    thresholdPeriod: 60000
    channels: {webhook: {isEnabled: true, endpoint: "https://example.com/hook", minPeriod: 0}}
  - id: new
    isEnabled: true
    whatToReceive: ONLY_NEW
    channels: {webhook: {isEnabled: true, endpoint: "https://example.com/hook", minPeriod: 0}}
`)
	write(t, filepath.Join(dir, "rules.test.yml"), `project: `+projectA+`
cases:
  - name: one user many times, then two more
    events:
      - {at: 0s, title: t, group: a, isNew: true, user: u1}
      - {at: 1s, title: t, group: a, user: u1, repeat: 10, every: 1s}
      - {at: 20s, title: t, group: a, user: u2}
      - {at: 30s, title: t, group: a, user: u3}
    expect:
      - {rule: new, group: a, at: 0s}
      - {rule: three-users, group: a, at: 30s}
`)
	if r := klaxon(t, nil, "rules", "test", dir); r.code != exitOK {
		t.Fatalf("exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
}
