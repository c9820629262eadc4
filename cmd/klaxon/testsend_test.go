package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
)

const testToken = "123456:TEST-token-never-logged"

// fakes are the providers of a test-send test, on loopback.
type fakes struct {
	webhook  *notifytest.WebhookSink
	slack    *notifytest.SlackServer
	telegram *notifytest.TelegramServer
	smtp     *notifytest.SMTPServer
	env      map[string]string
	rules    string // path of a rules file: rule "all" sends to every fake
}

func newFakes(t *testing.T) *fakes {
	f := &fakes{
		webhook:  notifytest.NewWebhookSink(t),
		slack:    notifytest.NewSlackServer(t),
		telegram: notifytest.NewTelegramServer(t, testToken),
		smtp:     notifytest.NewSMTPServer(t, notifytest.SMTPOptions{}),
	}
	f.env = map[string]string{
		"KLAXON_SMTP_ADDR": f.smtp.Addr, "KLAXON_SMTP_FROM": "klaxon@example.com", "KLAXON_SMTP_TLS": "none",
		"KLAXON_TELEGRAM_TOKEN": testToken, "KLAXON_TELEGRAM_API_URL": f.telegram.URL,
		"KLAXON_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8,::1/128", "KLAXON_SLACK_HOSTS": "127.0.0.1",
		"KLAXON_SEND_TIMEOUT": "5s",
	}
	f.rules = writeTemp(t, "rules.yml", fmt.Sprintf(`%s:
  - id: all
    isEnabled: true
    whatToReceive: SEEN_MORE
    windows: [{threshold: 100, period: 60000}]
    channels:
      webhook: {isEnabled: true, endpoint: %q, minPeriod: 60}
      slack: {isEnabled: true, endpoint: %q, minPeriod: 0}
      telegram: {isEnabled: true, endpoint: "-1001234", minPeriod: 0}
      email: {isEnabled: true, endpoint: "ops@example.com", minPeriod: 0}
  - id: off
    isEnabled: false
    whatToReceive: ONLY_NEW
`, projectA, f.webhook.URL, f.slack.URL))
	return f
}

// TestTestSendReachesEveryChannel: a test message goes through each of the
// rule's channels, marked as a test, and every provider's acceptance is
// reported; exit 0.
func TestTestSendReachesEveryChannel(t *testing.T) {
	f := newFakes(t)
	r := klaxon(t, f.env, "test-send", "--rules", f.rules, "--project", projectA, "--rule", "all")
	if r.code != exitOK {
		t.Fatalf("exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"webhook  ok: The webhook endpoint accepted", "slack    ok: Slack accepted",
		"telegram ok: Telegram accepted", "email    ok: The SMTP server accepted"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}
	// Each provider got one message, marked as a test; minPeriod does not
	// hold it back.
	hooks, err := f.webhook.WaitFor(1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	if err := hooks[0].JSON(&body); err != nil {
		t.Fatal(err)
	}
	if id, _ := body["id"].(string); !strings.HasPrefix(id, "test-") || !strings.Contains(fmt.Sprint(body["event"]), "[TEST]") ||
		hooks[0].Header.Get("Idempotency-Key") != id {
		t.Errorf("webhook body %s, headers %v", hooks[0].Body, hooks[0].Header)
	}
	if reqs, err := f.slack.WaitFor(1, 5*time.Second); err != nil || !strings.Contains(reqs[0].Text, "[TEST]") {
		t.Errorf("slack: %v %+v", err, reqs)
	}
	if reqs, err := f.telegram.WaitFor(1, 5*time.Second); err != nil || !strings.Contains(reqs[0].Text, "[TEST]") || reqs[0].ChatID != "-1001234" {
		t.Errorf("telegram: %v %+v", err, reqs)
	}
	msgs, err := f.smtp.WaitFor(1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if parsed, err := msgs[0].Parse(); err != nil || !strings.Contains(parsed.Header.Get("Subject"), "[TEST]") {
		t.Errorf("email: %v %s", err, msgs[0].Data)
	}
}

// TestTestSendSaysWhatProvidersAnswered: failures are told in words, with
// the provider's own code, and whether the worker would retry; exit 1.
func TestTestSendSaysWhatProvidersAnswered(t *testing.T) {
	f := newFakes(t)
	f.slack.FailNext(1, notifytest.Failure{Status: 404, Body: "no_service"})
	f.telegram.FailNext(1, notifytest.Failure{Status: 400, Body: "Bad Request: chat not found"})
	f.webhook.FailNext(1, notifytest.Failure{Status: 503})
	f.smtp.FailNext(1, notifytest.SMTPFailure{Code: 550, Message: "5.1.1 mailbox unavailable"})
	r := klaxon(t, f.env, "test-send", "--rules", f.rules, "--project", projectA, "--rule", "all", "--json")
	var rep sendReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v: %s%s", err, r.stdout, r.stderr)
	}
	if r.code != exitProblem || len(rep.Results) != 4 {
		t.Fatalf("exit %d: %+v", r.code, rep)
	}
	want := map[string]struct {
		answer string
		retry  bool
	}{
		"slack":    {"Slack says the webhook was revoked or does not exist (404 no_service)", false},
		"telegram": {"Telegram says the chat does not exist, or the bot was never added to it (400 Bad Request: chat not found)", false},
		"webhook":  {"The webhook endpoint answered that it failed on its side (503", true},
		"email":    {"The SMTP server refused the message for good (550", false},
	}
	for _, res := range rep.Results {
		w := want[res.Channel]
		if res.OK || !strings.HasPrefix(res.Answer, w.answer) || res.Retry != w.retry {
			t.Errorf("%s: %+v, want answer %q, retry %t", res.Channel, res, w.answer, w.retry)
		}
	}
}

// TestTestSendOneChannelAndRefusals: --channel sends to that channel alone;
// an endpoint the worker's policy refuses is said so, before anything is
// sent; a disabled rule or a channel the rule lacks is a usage error.
func TestTestSendOneChannelAndRefusals(t *testing.T) {
	f := newFakes(t)
	delete(f.env, "KLAXON_ALLOW_PRIVATE_NETWORKS")
	r := klaxon(t, f.env, "test-send", "--rules", f.rules, "--project", projectA, "--rule", "all", "--channel", "webhook")
	if r.code != exitProblem || !strings.Contains(r.stdout, "webhook  FAILED (for good: the worker would not retry): Klaxon refused the endpoint before sending anything") ||
		strings.Contains(r.stdout, "slack") || strings.Contains(r.stdout, f.webhook.URL) {
		t.Errorf("exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := len(f.webhook.Requests()); n != 0 {
		t.Errorf("the refused webhook got %d requests", n)
	}
	if r := klaxon(t, f.env, "test-send", "--rules", f.rules, "--project", projectA, "--rule", "off"); r.code != exitUsage ||
		!strings.Contains(r.stderr, "no enabled rule off") {
		t.Errorf("disabled rule: exit %d: %s", r.code, r.stderr)
	}
	if r := klaxon(t, f.env, "test-send", "--rules", f.rules, "--project", projectA, "--rule", "all", "--channel", "pager"); r.code != exitUsage ||
		!strings.Contains(r.stderr, "it has: email, telegram, slack, webhook") {
		t.Errorf("unknown channel: exit %d: %s", r.code, r.stderr)
	}
	if r := klaxon(t, f.env, "test-send", "--rule", "all"); r.code != exitUsage {
		t.Errorf("no project: exit %d", r.code)
	}
}

// A test message is what a firing of the rule shows: the worker's firing
// and test-send's message of the same rule differ only in what the made-up
// event and the test marker make different (id, times, title, group and
// the link built from it). Test-send once sent an empty projectName,
// ruleDescription and url where a firing had them.
func TestTestSendRendersAsAFiring(t *testing.T) {
	in := startInstallation(t)
	in.publish(t, "TypeError: x is undefined", "g1")
	reqs, err := in.sink.WaitFor(1, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r := klaxon(t, in.env, "test-send", "--project", projectA, "--rule", "new-errors")
	if r.code != exitOK {
		t.Fatalf("test-send: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	reqs, err = in.sink.WaitFor(2, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var firing, test map[string]any
	if err := reqs[0].JSON(&firing); err != nil {
		t.Fatal(err)
	}
	if err := reqs[1].JSON(&test); err != nil {
		t.Fatal(err)
	}
	if firing["projectName"] != "Shop" || firing["ruleDescription"] == "" {
		t.Fatalf("the firing itself lacks a project name or description: %v", firing)
	}
	fe, te := firing["event"].(map[string]any), test["event"].(map[string]any)
	if fe["url"] != "https://hawk.example.com/p/"+projectA+"/e/g1" || te["url"] != "https://hawk.example.com/p/"+projectA+"/e/"+testGroup {
		t.Errorf("links: firing %v, test %v", fe["url"], te["url"])
	}
	if !strings.HasPrefix(test["id"].(string), "test-") || !strings.Contains(te["title"].(string), "[TEST]") {
		t.Errorf("the test message is not marked: %v", test)
	}
	for _, body := range []map[string]any{firing, test} {
		delete(body, "id")
		delete(body, "firedAt")
		ev := body["event"].(map[string]any)
		for _, k := range []string{"title", "groupHash", "url", "repetitionId"} {
			delete(ev, k)
		}
	}
	f, _ := json.Marshal(firing)
	g, _ := json.Marshal(test)
	if string(f) != string(g) {
		t.Errorf("test-send renders unlike a firing:\nfiring %s\ntest   %s", f, g)
	}
	if reqs[0].Header.Get("Content-Type") != reqs[1].Header.Get("Content-Type") {
		t.Errorf("content types differ: %q, %q", reqs[0].Header.Get("Content-Type"), reqs[1].Header.Get("Content-Type"))
	}
}
