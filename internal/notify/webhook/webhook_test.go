package webhook_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/netguard"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
	"github.com/klaxonhq/klaxon/internal/notify/webhook"
)

const nastyTitle = notifytest.NastyTitle

var firedAt = time.Date(2025, 1, 2, 3, 4, 5, 0, time.FixedZone("CET", 3600))

func threshold(id, title string) notify.Notification { return notifytest.Threshold(id, title, firedAt) }

func single(n notify.Notification) *notify.Message { return notifytest.Single(n) }

func send(t *testing.T, url string, m *notify.Message) (bool, error) {
	t.Helper()
	return webhook.New(nil).Notify(context.Background(), url, m)
}

func onlyRequest(t *testing.T, sink *notifytest.WebhookSink) notifytest.WebhookRequest {
	t.Helper()
	reqs := sink.Requests()
	if len(reqs) != 1 {
		t.Fatalf("sink got %d requests, want 1", len(reqs))
	}
	return reqs[0]
}

func TestThresholdBody(t *testing.T) {
	sink := notifytest.NewWebhookSink(t)
	n := threshold("n-1", nastyTitle)
	if retry, err := send(t, sink.URL, single(n)); err != nil {
		t.Fatalf("Notify = %t, %v", retry, err)
	}
	r := onlyRequest(t, sink)
	if r.Method != "POST" || r.Path != sink.Path {
		t.Errorf("%s %s, want POST to the endpoint", r.Method, r.Path)
	}
	for k, want := range map[string]string{"Content-Type": "application/json", "Idempotency-Key": "n-1", "User-Agent": "Klaxon"} {
		if got := r.Header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}

	var body map[string]any
	if err := r.JSON(&body); err != nil {
		t.Fatalf("body %s: %v", r.Body, err)
	}
	for _, k := range []string{"version", "id", "type", "projectId", "projectName", "ruleId", "ruleDescription", "event",
		"count", "threshold", "period", "firedAt", "windows"} {
		if _, ok := body[k]; !ok {
			t.Errorf("body lacks %q: %s", k, r.Body)
		}
	}
	want := map[string]any{
		"version": "4", "id": "n-1", "type": "threshold", "projectId": n.ProjectID, "ruleId": n.RuleID,
		"projectName": "", "ruleDescription": "",
		"count": 150.0, "threshold": 100.0, "period": 60000.0,
	}
	for k, v := range want {
		if body[k] != v {
			t.Errorf("%s = %v, want %v", k, body[k], v)
		}
	}
	event := body["event"].(map[string]any)
	if event["title"] != nastyTitle || event["groupHash"] != "11dabb" || event["url"] != "" {
		t.Errorf("event = %v", event)
	}
	if rep, ok := event["repetitionId"]; !ok || rep != nil {
		t.Errorf("event.repetitionId = %v (present %t), want null", rep, ok)
	}
	fired, err := time.Parse(time.RFC3339, body["firedAt"].(string))
	if err != nil || !fired.Equal(firedAt) {
		t.Errorf("firedAt = %v (%v), want RFC 3339 of %s", body["firedAt"], err, firedAt)
	}
	windows := body["windows"].([]any)
	w := windows[0].(map[string]any)
	reset, err := time.Parse(time.RFC3339, w["resetAt"].(string))
	if len(windows) != 1 || w["threshold"] != 100.0 || w["period"] != 60000.0 || w["count"] != 150.0 || err != nil || !reset.Equal(firedAt.Add(time.Minute)) {
		t.Errorf("windows = %v", windows)
	}
}

func TestNewBody(t *testing.T) {
	sink := notifytest.NewWebhookSink(t)
	n := notify.Notification{ID: "n-2", Type: notify.TypeNew, ProjectID: "p", RuleID: "r", Count: 1, FiredAt: firedAt,
		Event: notify.Event{Title: "SyntaxError", GroupHash: "g"}}
	if _, err := send(t, sink.URL, single(n)); err != nil {
		t.Fatal(err)
	}
	var body struct {
		Type    string `json:"type"`
		Count   int    `json:"count"`
		Windows []any  `json:"windows"`
	}
	r := onlyRequest(t, sink)
	if err := r.JSON(&body); err != nil || body.Type != "new" || body.Count != 1 || body.Windows == nil || !strings.Contains(string(r.Body), `"windows":[]`) {
		t.Errorf("body %s (%v): want type new, count 1, windows []", r.Body, err)
	}
}

func TestDigestBody(t *testing.T) {
	sink := notifytest.NewWebhookSink(t)
	ns := []notify.Notification{threshold("n-1", "A"), threshold("n-2", "B"), threshold("n-3", "C")}
	for i := range ns {
		ns[i].ProjectName = "Shop"
	}
	m := &notify.Message{ID: "d-1", ProjectID: ns[0].ProjectID, RuleID: ns[0].RuleID, Digest: true, Notifications: ns, Omitted: 42}
	if _, err := send(t, sink.URL, m); err != nil {
		t.Fatal(err)
	}
	r := onlyRequest(t, sink)
	if got := r.Header.Get("Idempotency-Key"); got != "d-1" {
		t.Errorf("Idempotency-Key = %q, want the digest id", got)
	}
	var d notify.Digest
	if err := r.JSON(&d); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, n := range d.Notifications {
		ids = append(ids, n.ID)
	}
	if d.Omitted != 42 {
		t.Errorf("digest omitted = %d, want the 42 firings the deliverer left out", d.Omitted)
	}
	if d.Version != notify.BodyVersion || d.ProjectName != "Shop" || strings.Count(string(r.Body), `"version"`) != 1 {
		t.Errorf("digest %s: want the body version once, at the top, and the project's name", r.Body)
	}
	if d.Type != "digest" || d.ID != "d-1" || d.ProjectID != ns[0].ProjectID || d.RuleID != ns[0].RuleID || !slices.Equal(ids, []string{"n-1", "n-2", "n-3"}) {
		t.Errorf("digest = %+v", d)
	}
	if d.Notifications[1].Event.Title != "B" || d.Notifications[1].Count != 150 || !d.Notifications[1].FiredAt.Equal(firedAt) {
		t.Errorf("digest notification = %+v", d.Notifications[1])
	}
}

func TestRetryClassification(t *testing.T) {
	for _, tc := range []struct {
		failure    notifytest.Failure
		retry      bool
		retryAfter time.Duration
	}{
		{notifytest.Failure{Status: 500}, true, 0},
		{notifytest.Failure{Status: 503}, true, 0},
		{notifytest.Failure{Status: 429, RetryAfter: 2 * time.Second}, true, 2 * time.Second},
		{notifytest.Failure{Status: 400}, false, 0},
		{notifytest.Failure{Status: 404, Body: "no route"}, false, 0},
	} {
		sink := notifytest.NewWebhookSink(t)
		sink.Fail(tc.failure)
		retry, err := send(t, sink.URL, single(threshold("n-1", "A")))
		if err == nil || retry != tc.retry {
			t.Errorf("%d: Notify = %t, %v; want retry %t and an error", tc.failure.Status, retry, err, tc.retry)
			continue
		}
		var ra notify.RetryAfter
		if got := errors.As(err, &ra); got != (tc.retryAfter > 0) || got && ra.RetryAfter() != tc.retryAfter {
			t.Errorf("%d: error %v: want RetryAfter %s", tc.failure.Status, err, tc.retryAfter)
		}
		if strings.Contains(err.Error(), sink.Path) {
			t.Errorf("%d: error %q contains the URL", tc.failure.Status, err)
		}
	}
}

func TestSucceedsAfterScriptedFailures(t *testing.T) {
	sink := notifytest.NewWebhookSink(t)
	sink.FailNext(2, notifytest.Failure{Status: 502})
	n := webhook.New(nil)
	m := single(threshold("n-1", "A"))
	for i, wantErr := range []bool{true, true, false} {
		retry, err := n.Notify(context.Background(), sink.URL, m)
		if (err != nil) != wantErr || (err != nil && !retry) {
			t.Fatalf("attempt %d: Notify = %t, %v", i+1, retry, err)
		}
	}
	reqs, err := sink.WaitFor(3, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		if r.Header.Get("Idempotency-Key") != "n-1" {
			t.Errorf("retry carried Idempotency-Key %q, want the same id", r.Header.Get("Idempotency-Key"))
		}
	}
}

func TestConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + "/hooks/s3cr3t"
	ln.Close()
	retry, err := send(t, url, single(threshold("n-1", "A")))
	if err == nil || !retry || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("Notify = %t, %v; want a retryable error without the URL", retry, err)
	}
}

func TestRejectsMalformedMessage(t *testing.T) {
	sink := notifytest.NewWebhookSink(t)
	m := single(threshold("n-1", "A"))
	m.Notifications = append(m.Notifications, threshold("n-2", "B"))
	if retry, err := send(t, sink.URL, m); err == nil || retry {
		t.Errorf("Notify = %t, %v; want a permanent error", retry, err)
	}
	if len(sink.Requests()) != 0 {
		t.Error("a malformed message was sent")
	}
}

// A webhook to 127.0.0.1 stands for one to anything inside Klaxon's
// network: refused for good by default, delivered once the operator allows
// the network.
func TestLoopbackRefusedUnlessAllowed(t *testing.T) {
	sink := notifytest.NewWebhookSink(t)
	refusing := webhook.New(netguard.Policy{}.Client(netguard.ClientOptions{}))
	retry, err := refusing.Notify(context.Background(), sink.URL, single(threshold("n-1", "A")))
	if retry || !netguard.IsRefused(err) || !strings.Contains(err.Error(),
		"webhook: endpoint refused: it resolves to 127.0.0.1, a loopback address; allow it with KLAXON_ALLOW_PRIVATE_NETWORKS") {
		t.Errorf("Notify = %t, %v; want a permanent refusal", retry, err)
	}
	if n := len(sink.Requests()); n != 0 {
		t.Fatalf("the sink got %d requests", n)
	}
	allowing := webhook.New(netguard.Policy{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}.Client(netguard.ClientOptions{}))
	if _, err := allowing.Notify(context.Background(), sink.URL, single(threshold("n-2", "A"))); err != nil {
		t.Fatalf("allowed: %v", err)
	}
	onlyRequest(t, sink)
}

// A grouped message is one body naming every rule, each firing as a
// single body without its version (docs/contract.md §5.8).
func TestGroupedBody(t *testing.T) {
	sink := notifytest.NewWebhookSink(t)
	if _, err := send(t, sink.URL, notifytest.Grouped(nastyTitle, firedAt)); err != nil {
		t.Fatal(err)
	}
	r := onlyRequest(t, sink)
	if r.Header.Get("Idempotency-Key") != "group-1" {
		t.Errorf("Idempotency-Key = %q, want the group's id", r.Header.Get("Idempotency-Key"))
	}
	var body struct {
		notify.Grouped
		Raw []map[string]any `json:"notifications"`
	}
	if err := r.JSON(&body); err != nil {
		t.Fatal(err)
	}
	g := body.Grouped
	if g.Version != "4" || g.Type != "grouped" || g.ID != "group-1" || g.ProjectName != "Shop" || g.Event.Title != nastyTitle ||
		!slices.Equal(g.RuleIDs, []string{"64ab00000000000000000001", "64ab00000000000000000002", "64ab00000000000000000003"}) {
		t.Errorf("grouped body %s", r.Body)
	}
	if len(body.Raw) != 3 {
		t.Fatalf("%d notifications, want 3: %s", len(body.Raw), r.Body)
	}
	for i, n := range body.Raw {
		if _, ok := n["version"]; ok || n["ruleId"] != g.RuleIDs[i] || n["windows"] == nil {
			t.Errorf("notification %d: %v", i, n)
		}
	}
	if body.Raw[1]["type"] != "new" || body.Raw[1]["ruleDescription"] != "new errors" {
		t.Errorf("second notification %v", body.Raw[1])
	}
}
