package loop_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/klaxonhq/klaxon/internal/netguard"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/notify/loop"
	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
)

var firedAt = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func threshold(id, title string) notify.Notification { return notifytest.Threshold(id, title, firedAt) }

func single(n notify.Notification) *notify.Message { return notifytest.Single(n) }

func digest(n int, title func(int) string) *notify.Message {
	m := &notify.Message{ID: "d-1", ProjectID: "5e3eef0679fa3700a0198a49", RuleID: "64ab00000000000000000001", Digest: true}
	for i := range n {
		m.Notifications = append(m.Notifications, threshold(fmt.Sprint("n-", i), title(i)))
	}
	return m
}

func onlyRequest(t *testing.T, srv *notifytest.LoopServer) notifytest.LoopRequest {
	t.Helper()
	reqs := srv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("Loop got %d requests, want 1", len(reqs))
	}
	return reqs[0]
}

// A message goes as Hawk's Loop worker sends it: a JSON POST of username
// Hawk and a markdown text holding the title, the count and the period in
// words, and the notification id.
func TestSingleMessage(t *testing.T) {
	srv := notifytest.NewLoopServer(t)
	if retry, err := (&loop.Notifier{}).Notify(t.Context(), srv.URL, single(threshold("n-1", "TypeError: x is undefined"))); err != nil {
		t.Fatalf("Notify = %t, %v", retry, err)
	}
	r := onlyRequest(t, srv)
	if r.Status != http.StatusOK || r.Header.Get("Content-Type") != "application/json" || r.Header.Get("User-Agent") != "Klaxon" {
		t.Fatalf("Loop answered %d to Content-Type %q, User-Agent %q", r.Status, r.Header.Get("Content-Type"), r.Header.Get("User-Agent"))
	}
	if r.Username != "Hawk" {
		t.Errorf("username %q, want Hawk", r.Username)
	}
	for _, want := range []string{"`TypeError: x is undefined`\n", "150 events in the last 1 minute \\(threshold 100\\)",
		"1 minute window: 150 of 100 events (fired)", "Notification id n-1"} {
		if !strings.Contains(r.Text, want) {
			t.Errorf("text lacks %q:\n%s", want, r.Text)
		}
	}
}

// Titles and ids from events sit in code, where Mattermost shows them as
// typed: no bold from *x*, no link, and no backtick that could close the
// code early; an @ is followed by a zero-width space, so no @channel ping.
func TestTitleShownAsTyped(t *testing.T) {
	const title = "*URGENT* __init__ [x](https://evil.example) @channel `f`\nline 2"
	srv := notifytest.NewLoopServer(t)
	n := threshold("n-1", title)
	n.Event.GroupHash = "g```\n@all"
	if _, err := (&loop.Notifier{}).Notify(t.Context(), srv.URL, single(n)); err != nil {
		t.Fatal(err)
	}
	text := onlyRequest(t, srv).Text
	if want := "`*URGENT* __init__ [x](https://evil.example) @\u200Bchannel ˋfˋ line 2`\n"; !strings.HasPrefix(text, want) {
		t.Errorf("text does not start with the title in a code span %q:\n%s", want, text)
	}
	// The details are one fenced block: its only fences are its own.
	if strings.Count(text, "```") != 2 || !strings.Contains(text, "group gˋˋˋ @\u200Ball") {
		t.Errorf("details not confined to one code block:\n%s", text)
	}

	srv = notifytest.NewLoopServer(t)
	if _, err := (&loop.Notifier{}).Notify(t.Context(), srv.URL, digest(2, func(int) string { return title })); err != nil {
		t.Fatal(err)
	}
	text = onlyRequest(t, srv).Text
	if want := "\n- `*URGENT* __init__ [x](https://evil.example) @\u200Bchannel ˋfˋ line 2` — "; !strings.Contains(text, want) {
		t.Errorf("digest lacks the title in a code span %q:\n%s", want, text)
	}
}

// A digest lists its firings under a header; one too big for a post lists
// what fits and says how many more there were, so it is never refused.
func TestDigest(t *testing.T) {
	srv := notifytest.NewLoopServer(t)
	m := digest(3, func(i int) string { return fmt.Sprint("Error number ", i) })
	m.Omitted = 2
	if _, err := (&loop.Notifier{}).Notify(t.Context(), srv.URL, m); err != nil {
		t.Fatal(err)
	}
	text := onlyRequest(t, srv).Text
	for _, want := range []string{"**5 notifications for rule 64ab00000000000000000001 in project 5e3eef0679fa3700a0198a49**",
		"- `Error number 0` — 150 events", "- `Error number 2` — ", "… and 2 more not shown here", "Digest id d-1"} {
		if !strings.Contains(text, want) {
			t.Errorf("digest lacks %q:\n%s", want, text)
		}
	}

	srv = notifytest.NewLoopServer(t)
	huge := digest(500, func(i int) string { return fmt.Sprintf("Error %d %s", i, strings.Repeat("é", 300)) })
	if _, err := (&loop.Notifier{}).Notify(t.Context(), srv.URL, huge); err != nil {
		t.Fatal(err)
	}
	text = onlyRequest(t, srv).Text
	shown := strings.Count(text, "\n- `")
	if n := utf8.RuneCountInString(text); n > 16383 || shown == 0 || shown >= 500 {
		t.Fatalf("%d characters, %d firings shown", n, shown)
	}
	if want := fmt.Sprintf("… and %d more not shown here", 500-shown); !strings.Contains(text, want) {
		t.Errorf("huge digest lacks %q", want)
	}
}

func TestRetryClassification(t *testing.T) {
	for _, tc := range []struct {
		name       string
		failure    notifytest.Failure
		retry      bool
		retryAfter time.Duration
	}{
		{"500", notifytest.Failure{Status: 500}, true, 0},
		{"502", notifytest.Failure{Status: 502}, true, 0},
		{"429 with Retry-After", notifytest.Failure{Status: 429, RetryAfter: 5 * time.Second}, true, 5 * time.Second},
		{"400", notifytest.Failure{Status: 400, Body: "Invalid webhook"}, false, 0},
		{"403", notifytest.Failure{Status: 403, Body: "Incoming webhooks have been disabled"}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := notifytest.NewLoopServer(t)
			srv.Fail(tc.failure)
			retry, err := (&loop.Notifier{}).Notify(t.Context(), srv.URL, single(threshold("n-1", "A")))
			if err == nil || retry != tc.retry {
				t.Fatalf("Notify = %t, %v; want retry %t and an error", retry, err, tc.retry)
			}
			var ra notify.RetryAfter
			if has := errors.As(err, &ra); has != (tc.retryAfter > 0) || has && ra.RetryAfter() != tc.retryAfter {
				t.Errorf("error %v: want RetryAfter %s", err, tc.retryAfter)
			}
			var herr *notify.HTTPError
			if !errors.As(err, &herr) || herr.StatusCode != tc.failure.Status || herr.Channel != "loop" {
				t.Errorf("error %v: want a loop HTTPError %d", err, tc.failure.Status)
			}
			if strings.Contains(err.Error(), srv.Token) {
				t.Errorf("error %q contains the webhook token", err)
			}
		})
	}
}

// A removed webhook fails for good, and the error never repeats its URL.
func TestWrongURLIsPermanent(t *testing.T) {
	srv := notifytest.NewLoopServer(t)
	wrong := strings.TrimSuffix(srv.URL, srv.Token) + "revoked-s3cr3t"
	retry, err := (&loop.Notifier{}).Notify(t.Context(), wrong, single(threshold("n-1", "A")))
	if err == nil || retry || !strings.Contains(err.Error(), "Invalid webhook") || strings.Contains(err.Error(), "revoked-s3cr3t") {
		t.Errorf("Notify = %t, %v; want a permanent error without the URL", retry, err)
	}
	for _, bad := range []string{"loop.example.com/hooks/s3cr3t", "ftp://loop.example.com/hooks/s3cr3t"} {
		if retry, err := (&loop.Notifier{}).Notify(t.Context(), bad, single(threshold("n-1", "A"))); err == nil || retry ||
			strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: Notify = %t, %v; want a permanent error without the URL", bad, retry, err)
		}
	}
}

// KLAXON_LOOP_HOSTS narrows where Loop endpoints may point: another host
// fails for good before any request, naming the setting, never the URL.
func TestEndpointOutsideLoopHostsRefused(t *testing.T) {
	srv := notifytest.NewLoopServer(t)
	hosts, err := netguard.ParsePatterns("loop.example.com/hooks/")
	if err != nil {
		t.Fatal(err)
	}
	n := &loop.Notifier{Hosts: hosts}
	retry, err := n.Notify(t.Context(), srv.URL, single(threshold("n-1", "A")))
	if retry || !netguard.IsRefused(err) || !strings.Contains(err.Error(), "KLAXON_LOOP_HOSTS") ||
		strings.Contains(err.Error(), srv.Token) {
		t.Errorf("Notify = %t, %v; want a permanent refusal naming KLAXON_LOOP_HOSTS", retry, err)
	}
	if len(srv.Requests()) != 0 {
		t.Errorf("the server got %d requests", len(srv.Requests()))
	}
	n.Hosts, _ = netguard.ParsePatterns("127.0.0.1/hooks/")
	if _, err := n.Notify(t.Context(), srv.URL, single(threshold("n-2", "A"))); err != nil {
		t.Errorf("127.0.0.1/hooks/ allowed: %v", err)
	}
}

// Endpoints come from rules: through a netguard client a loopback endpoint
// is refused for good, and a redirect is not followed.
func TestGuardedClient(t *testing.T) {
	srv := notifytest.NewLoopServer(t)
	retry, err := (&loop.Notifier{Client: netguard.Policy{}.Client(netguard.ClientOptions{})}).
		Notify(t.Context(), srv.URL, single(threshold("n-1", "A")))
	if retry || !netguard.IsRefused(err) || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("loopback: Notify = %t, %v; want a permanent refusal", retry, err)
	}

	var followed atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hooks/old", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/inside", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/inside", func(http.ResponseWriter, *http.Request) { followed.Add(1) })
	redirecting := httptest.NewServer(mux)
	t.Cleanup(redirecting.Close)
	client := netguard.Policy{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}.Client(netguard.ClientOptions{})
	retry, err = (&loop.Notifier{Client: client}).Notify(context.Background(), redirecting.URL+"/hooks/old", single(threshold("n-2", "A")))
	var herr *notify.HTTPError
	if retry || !errors.As(err, &herr) || herr.StatusCode != http.StatusTemporaryRedirect || followed.Load() != 0 {
		t.Errorf("307: Notify = %t, %v after %d followed; want a permanent 307", retry, err, followed.Load())
	}
}

// A grouped message names every rule with what it saw, the event once.
func TestGroupedNamesEveryRule(t *testing.T) {
	srv := notifytest.NewLoopServer(t)
	if _, err := (&loop.Notifier{}).Notify(t.Context(), srv.URL, notifytest.Grouped("TypeError: x", firedAt)); err != nil {
		t.Fatal(err)
	}
	text := onlyRequest(t, srv).Text
	for _, want := range []string{"**3 rules fired for one event in project Shop \\(5e3eef0679fa3700a0198a49\\)**\n`TypeError: x`",
		"- `100 events in 1 minute` — 150 events", "- `new errors` — New event", "- `Rule 64ab00000000000000000003` — ",
		"Notification id n-b", "Message id group-1"} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
	if strings.Count(text, "`TypeError: x`") != 1 {
		t.Errorf("the event's title is not shown once:\n%s", text)
	}
}

// Nothing from an event or a rule can mention anyone: Mattermost reads
// @channel, @all, @here and @someone anywhere in a post, a backslash
// before the @ included, so the project name in a digest's header could
// page a whole channel; and it turns Slack's <!channel> and <@id> into
// mentions, in code too. Nor can it start a line with U+2028.
func TestUserTextMentionsNoOne(t *testing.T) {
	for _, m := range notifytest.Hostile(firedAt) {
		text := loop.Text(m)
		if bad := notifytest.Inert(text); bad != nil {
			t.Errorf("message %s: %q in\n%s", m.ID, bad, text)
		}
		if !strings.Contains(text, "@\u200Bchannel") {
			t.Errorf("message %s lost the @ of @channel:\n%s", m.ID, text)
		}
	}
}
