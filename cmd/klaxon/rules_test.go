package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

const checkedFile = `5e3eef0679fa3700a0198a49:
  - id: good
    isEnabled: true
    whatToReceive: ONLY_NEW
    channels: {webhook: {isEnabled: true, endpoint: "https://example.com/hook", minPeriod: 0}}
  - id: bad-threshold
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: 0
    thresholdPeriod: 60000
  - id: typo
    isEnabled: true
    whatToReceive: ONLY_NEW
    inclding: [x]
    channels: {webhook: {isEnabled: true, endpoint: "https://example.com/hook", minPeriod: 0}}
`

// TestRulesCheckFile: a CI step on a rules file in git sees every problem
// with its line, and fails on errors only.
func TestRulesCheckFile(t *testing.T) {
	file := writeTemp(t, "rules.yml", checkedFile)
	r := klaxon(t, nil, "rules", "check", file)
	if r.code != exitProblem {
		t.Fatalf("exit %d, want 1:\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		file + ":6: error: project 5e3eef0679fa3700a0198a49 rule bad-threshold: threshold/thresholdPeriod: threshold 0",
		file + `:14: warning: project 5e3eef0679fa3700a0198a49 rule typo: unknown field "inclding" ignored`,
		"1 project, 2 enabled rules loaded; 1 error, 1 warning",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}

	// The same as JSON, for a script.
	r = klaxon(t, nil, "rules", "check", "--json", file)
	var report checkReport
	if err := json.Unmarshal([]byte(r.stdout), &report); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if r.code != exitProblem || report.Errors != 1 || report.Warnings != 1 || report.Rules != 2 ||
		report.Problems[0].Line != 6 || report.Problems[0].Rule != "bad-threshold" || report.Problems[0].Severity != "error" {
		t.Errorf("exit %d, report %+v", r.code, report)
	}
}

// TestRulesCheckWarningsAndStrict: warnings alone pass, unless --strict.
func TestRulesCheckWarningsAndStrict(t *testing.T) {
	file := writeTemp(t, "rules.yml", strings.Replace(checkedFile, "threshold: 0", "threshold: 5", 1))
	if r := klaxon(t, nil, "rules", "check", file); r.code != exitOK || !strings.Contains(r.stdout, "0 errors, 2 warnings") {
		t.Errorf("exit %d:\n%s", r.code, r.stdout)
	}
	// Flags after the file work too.
	if r := klaxon(t, nil, "rules", "check", file, "--strict"); r.code != exitProblem {
		t.Errorf("--strict: exit %d:\n%s", r.code, r.stdout)
	}
	// The configured file is checked when no FILE is given.
	if r := klaxon(t, map[string]string{"KLAXON_RULES_FILE": file}, "rules", "check"); r.code != exitOK || !strings.Contains(r.stdout, file+":14:") {
		t.Errorf("KLAXON_RULES_FILE: exit %d:\n%s", r.code, r.stdout)
	}
}

// TestRulesCheckUnreadable tells a broken file (1: fix it) from one that
// is not there (2: the check did not run).
func TestRulesCheckUnreadable(t *testing.T) {
	broken := writeTemp(t, "rules.yml", "5e3eef0679fa3700a0198a49: [\n")
	if r := klaxon(t, nil, "rules", "check", broken); r.code != exitProblem || !strings.Contains(r.stdout, "error:") {
		t.Errorf("unparsable: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	empty := writeTemp(t, "rules.yml", "")
	if r := klaxon(t, nil, "rules", "check", empty); r.code != exitProblem || !strings.Contains(r.stdout, `write "{}"`) {
		t.Errorf("empty: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := klaxon(t, nil, "rules", "check", broken+".missing"); r.code != exitUsage || !strings.Contains(r.stderr, "no such file") {
		t.Errorf("missing: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := klaxon(t, nil, "rules", "check", "a.yml", "b.yml"); r.code != exitUsage {
		t.Errorf("two files: exit %d", r.code)
	}
}

// TestRulesCheckMongo checks the rules where Hawk keeps them, through the
// worker's MongoDB loader, against a real MongoDB wire server (FerretDB).
func TestRulesCheckMongo(t *testing.T) {
	url := testenv.Mongo(t)
	client, err := mongo.Connect(options.Client().ApplyURI(url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Disconnect(context.Background()) })
	db := client.Database(url[strings.LastIndex(url, "/")+1:])
	project, good, bad := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	hook := bson.M{"webhook": bson.M{"isEnabled": true, "endpoint": "https://example.com/hook", "minPeriod": 0}}
	_, err = db.Collection("projects").InsertOne(context.Background(), bson.M{"_id": project, "notifications": bson.A{
		bson.M{"_id": good, "isEnabled": true, "whatToReceive": "ONLY_NEW", "channels": hook},
		bson.M{"_id": bad, "isEnabled": true, "whatToReceive": "SEEN_MORE", "threshold": 10, "thresholdPeriod": 10, "channels": hook},
	}})
	if err != nil {
		t.Fatal(err)
	}
	r := klaxon(t, map[string]string{"KLAXON_MONGO_URL": url}, "rules", "check")
	want := "error: project " + project.Hex() + " rule " + bad.Hex() + ": threshold/thresholdPeriod: period 10 ms must be at least 1000 ms"
	if r.code != exitProblem || !strings.Contains(r.stdout, want) || !strings.Contains(r.stdout, "1 enabled rule loaded") {
		t.Fatalf("exit %d, want %q in:\n%s%s", r.code, want, r.stdout, r.stderr)
	}
	if strings.Contains(r.stdout+r.stderr, "example.com") {
		t.Errorf("an endpoint was printed:\n%s", r.stdout)
	}
}

// A MongoDB that does not answer is an error within about 5 s naming what
// to change, not a topology dump after 10 s of silence.
func TestRulesCheckSaysMongoDoesNotAnswer(t *testing.T) {
	addr := closedAddr(t)
	start := time.Now()
	r := klaxon(t, map[string]string{"KLAXON_MONGO_URL": "mongodb://" + addr + "/hawk"}, "rules", "check")
	if took := time.Since(start); took > 6*time.Second {
		t.Errorf("answered after %v, want about 5 s at most", took)
	}
	if r.code != exitUsage || !strings.Contains(r.stderr, "MongoDB did not answer") || !strings.Contains(r.stderr, "KLAXON_MONGO_URL") ||
		!strings.Contains(r.stderr, "KLAXON_RULES_FILE") || strings.Contains(r.stderr, "topology") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
}

// rules check reports what a send would meet on the worker's settings, as
// test-send finds out by sending: an endpoint the guard refuses, a channel
// the worker has not configured, an unknown channel (with the one meant);
// and warns of windows that silently replace threshold/thresholdPeriod.
// None of it is found by sending or resolving: the check stays offline.
func TestRulesCheckReportsWhatASendWouldMeet(t *testing.T) {
	file := writeTemp(t, "rules.yml", `5e3eef0679fa3700a0198a49:
  - id: refused
    isEnabled: true
    whatToReceive: ONLY_NEW
    channels:
      webhook: {isEnabled: true, endpoint: "http://127.0.0.1:8080/hook", minPeriod: 0}
      slack: {isEnabled: true, endpoint: "https://chat.example.com/hook", minPeriod: 0}
      email: {isEnabled: true, endpoint: "ops@example.com", minPeriod: 0}
      slak: {isEnabled: true, endpoint: "https://hooks.slack.com/services/T/B/x", minPeriod: 0}
      webPush: {isEnabled: true, endpoint: "subscription-1", minPeriod: 0}
  - id: both
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: 100
    thresholdPeriod: 60000
    windows: [{threshold: 5, period: 1000}]
    inclding: [x]
    channels:
      webhook: {isEnabled: true, endpoint: "https://example.com:8443/hook", minPeriod: 0}
  - id: fine
    isEnabled: true
    whatToReceive: ONLY_NEW
    channels:
      webhook: {isEnabled: true, endpoint: "https://example.com/hook", minPeriod: 0}
      slack: {isEnabled: true, endpoint: "https://hooks.slack.com/services/T/B/x", minPeriod: 0}
`)
	check := func(env map[string]string) checkReport {
		t.Helper()
		r := klaxon(t, env, "rules", "check", "--json", file)
		if r.code != exitProblem {
			t.Fatalf("exit %d, want 1:\n%s%s", r.code, r.stdout, r.stderr)
		}
		var report checkReport
		if err := json.Unmarshal([]byte(r.stdout), &report); err != nil {
			t.Fatal(err)
		}
		return report
	}
	report := check(nil)
	want := []struct {
		severity, rule, reason string
		line                   int
	}{
		{"error", "refused", `channel webhook: the worker's endpoint guard would refuse it: it resolves to 127.0.0.1, a loopback address; allow it with KLAXON_ALLOW_PRIVATE_NETWORKS`, 2},
		{"error", "refused", `channel slack: the worker's endpoint guard would refuse it: host chat.example.com with this path is not one of hooks.slack.com/services/ (KLAXON_SLACK_HOSTS)`, 2},
		{"error", "refused", `channel email: email is not configured on the worker: set KLAXON_SMTP_ADDR`, 2},
		{"error", "refused", `channel "slak" is not one of email, telegram, slack, webhook, loop: its notifications would never be sent (did you mean "slack"?)`, 2},
		{"warning", "refused", `channel "webPush" is Hawk's push channel, which Klaxon does not send (nor do Hawk's sender workers): ignored`, 2},
		{"error", "both", `channel webhook: the worker's endpoint guard would refuse it: port 8443 is not one of 80, 443; allow it with KLAXON_ALLOW_PORTS`, 11},
		{"warning", "both", `windows replace threshold and thresholdPeriod`, 11},
		{"warning", "both", `unknown field "inclding" ignored (did you mean "including"?)`, 17},
	}
	for _, w := range want {
		found := slices.ContainsFunc(report.Problems, func(p checkProblem) bool {
			return p.Severity == w.severity && p.Rule == w.rule && p.Line == w.line && strings.HasPrefix(p.Reason, w.reason)
		})
		if !found {
			t.Errorf("no %s for rule %s on line %d: %q\nin %+v", w.severity, w.rule, w.line, w.reason, report.Problems)
		}
	}
	if report.Errors != 5 || report.Warnings != 3 || len(report.Problems) != 8 {
		t.Errorf("%d errors, %d warnings, %d problems; want 5, 3, 8: %+v", report.Errors, report.Warnings, len(report.Problems), report.Problems)
	}
	for _, p := range report.Problems {
		if strings.Contains(p.Reason, "/hook") || strings.Contains(p.Reason, "ops@") {
			t.Errorf("a reason holds an endpoint: %q", p.Reason)
		}
	}

	// The same rules on settings that allow them: no error is left.
	report = check(map[string]string{"KLAXON_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8", "KLAXON_ALLOW_PORTS": "443,8443",
		"KLAXON_SLACK_HOSTS": "hooks.slack.com/services/,chat.example.com", "KLAXON_SMTP_ADDR": "127.0.0.1:25"})
	if report.Errors != 1 || report.Warnings != 3 { // the unknown channel stays
		t.Errorf("allowed: %d errors, %d warnings; want 1, 3: %+v", report.Errors, report.Warnings, report.Problems)
	}
}

// A YAML syntax error is reported on the line it is on: yaml.v3 says the
// line of the enclosing block, and an indentation slip on line 4 read
// "line 1".
func TestRulesCheckReportsTheLineOfAYAMLError(t *testing.T) {
	file := writeTemp(t, "rules.yml", "5e3eef0679fa3700a0198a49:\n  - id: a\n    isEnabled: true\n   whatToReceive: ONLY_NEW\n")
	r := klaxon(t, nil, "rules", "check", file)
	if r.code != exitProblem || !strings.Contains(r.stdout, "yaml: line 4: ") {
		t.Errorf("exit %d, stdout %q", r.code, r.stdout)
	}
}

// TestRulesCheckOverlongEndpoint: a 3 MB webhook URL, which made every
// firing of its rule a message the broker refuses, is reported with the
// project, rule, channel, length and limit, and fails --strict; the URL
// itself is not printed.
func TestRulesCheckOverlongEndpoint(t *testing.T) {
	url := "https://example.com/hook?k=" + strings.Repeat("s3cr3t", 500_000)
	file := writeTemp(t, "rules.yml", `5e3eef0679fa3700a0198a49:
  - id: huge-url
    isEnabled: true
    whatToReceive: ONLY_NEW
    channels: {webhook: {isEnabled: true, endpoint: "`+url+`"}}
`)
	r := klaxon(t, nil, "rules", "check", "--strict", file)
	want := fmt.Sprintf("warning: project 5e3eef0679fa3700a0198a49 rule huge-url: channel webhook: endpoint is %d bytes long, over the limit of 2048: left out", len(url))
	if r.code != exitProblem || !strings.Contains(r.stdout, want) {
		t.Errorf("exit %d, want 1 and %q:\n%.2000s", r.code, want, r.stdout)
	}
	if strings.Contains(r.stdout+r.stderr, "s3cr3ts3cr3t") {
		t.Error("the endpoint was printed")
	}
}
