package slack_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/netguard"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
	"github.com/klaxonhq/klaxon/internal/notify/slack"
)

const nastyTitle = notifytest.NastyTitle

var firedAt = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func threshold(id, title string) notify.Notification { return notifytest.Threshold(id, title, firedAt) }

func single(n notify.Notification) *notify.Message { return notifytest.Single(n) }

func digest(n int) *notify.Message {
	m := &notify.Message{ID: "d-1", ProjectID: "5e3eef0679fa3700a0198a49", RuleID: "64ab00000000000000000001", Digest: true}
	for i := range n {
		m.Notifications = append(m.Notifications, threshold(fmt.Sprint("n-", i), fmt.Sprintf("Error number %d: %s", i, strings.Repeat("x", 100))))
	}
	return m
}

// blockTexts returns the text of every block and context element, in order.
func blockTexts(r notifytest.SlackRequest) []string {
	var texts []string
	for _, b := range r.Blocks {
		if text, ok := b["text"].(map[string]any); ok {
			texts = append(texts, text["text"].(string))
		}
		if elems, ok := b["elements"].([]any); ok {
			for _, e := range elems {
				texts = append(texts, e.(map[string]any)["text"].(string))
			}
		}
	}
	return texts
}

func onlyRequest(t *testing.T, srv *notifytest.SlackServer) notifytest.SlackRequest {
	t.Helper()
	reqs := srv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("Slack got %d requests, want 1", len(reqs))
	}
	return reqs[0]
}

func TestSingleMessage(t *testing.T) {
	srv := notifytest.NewSlackServer(t)
	if retry, err := slack.New(nil).Notify(context.Background(), srv.URL, single(threshold("n-1", "TypeError: x is undefined"))); err != nil {
		t.Fatalf("Notify = %t, %v", retry, err)
	}
	r := onlyRequest(t, srv)
	if r.Status != http.StatusOK || r.Header.Get("Content-Type") != "application/json" || r.Header.Get("User-Agent") != "Klaxon" {
		t.Fatalf("Slack answered %d to Content-Type %q, User-Agent %q", r.Status, r.Header.Get("Content-Type"), r.Header.Get("User-Agent"))
	}
	for _, want := range []string{"TypeError: x is undefined", "150 events in the last 1 minute"} {
		if !strings.Contains(r.Text, want) {
			t.Errorf("text %q lacks %q", r.Text, want)
		}
	}
	if len(r.Blocks) == 0 {
		t.Fatal("no blocks")
	}
	first := r.Blocks[0]["text"].(map[string]any)
	if r.Blocks[0]["type"] != "section" || first["type"] != "mrkdwn" || !strings.HasPrefix(first["text"].(string), "`TypeError: x is undefined`\n150 events in the last 1 minute (threshold 100)") {
		t.Errorf("first block = %v", r.Blocks[0])
	}
	all := strings.Join(blockTexts(r), "\n")
	for _, want := range []string{"1 minute window: 150 of 100 events (fired), resets at 2025-01-02T03:05:05Z", "Notification id n-1"} {
		if !strings.Contains(all, want) {
			t.Errorf("blocks lack %q:\n%s", want, all)
		}
	}
}

func TestEscapesTitle(t *testing.T) {
	srv := notifytest.NewSlackServer(t)
	if _, err := slack.New(nil).Notify(context.Background(), srv.URL, single(threshold("n-1", nastyTitle))); err != nil {
		t.Fatal(err)
	}
	r := onlyRequest(t, srv)
	const escaped = "&lt;b&gt;&amp;*_[x]"
	if !strings.Contains(r.Text, escaped) {
		t.Errorf("text %q lacks the escaped title %q", r.Text, escaped)
	}
	texts := append(blockTexts(r), r.Text)
	if !strings.Contains(texts[0], escaped) {
		t.Errorf("first block %q lacks the escaped title", texts[0])
	}
	for _, s := range texts {
		// After escaping, every & starts an entity and no < or > is left.
		rest := strings.NewReplacer("&amp;", "", "&lt;", "", "&gt;", "").Replace(s)
		if strings.ContainsAny(rest, "<>&") {
			t.Errorf("unescaped control character in %q", s)
		}
	}
}

func TestDigest(t *testing.T) {
	srv := notifytest.NewSlackServer(t)
	if _, err := slack.New(nil).Notify(context.Background(), srv.URL, digest(3)); err != nil {
		t.Fatal(err)
	}
	r := onlyRequest(t, srv)
	texts := blockTexts(r)
	if !strings.Contains(texts[0], "3 notifications for rule 64ab00000000000000000001") {
		t.Errorf("first block %q is not the digest header", texts[0])
	}
	all := strings.Join(texts, "\n")
	for i := range 3 {
		if !strings.Contains(all, fmt.Sprintf("• `Error number %d: ", i)) {
			t.Errorf("digest lacks firing %d:\n%s", i, all)
		}
	}
	if !strings.Contains(r.Text, "3 notifications") || !strings.Contains(all, "Digest id d-1") {
		t.Errorf("text %q / blocks lack the digest summary or id", r.Text)
	}
}

func TestHugeDigestFitsSlackLimits(t *testing.T) {
	srv := notifytest.NewSlackServer(t)
	const n, omitted = 2000, 30 // omitted: left out by the deliverer
	m := digest(n)
	m.Omitted = omitted
	if retry, err := slack.New(nil).Notify(context.Background(), srv.URL, m); err != nil {
		t.Fatalf("Notify = %t, %v (the fake enforces Slack's block limits)", retry, err)
	}
	r := onlyRequest(t, srv)
	all := strings.Join(blockTexts(r), "\n")
	shown := strings.Count(all, "• `Error number")
	var more int
	if _, err := fmt.Sscanf(all[strings.Index(all, "… and "):], "… and %d more", &more); err != nil {
		t.Fatalf("no \"… and N more\" line: %v", err)
	}
	if shown+more != n+omitted || shown < 100 {
		t.Errorf("shown %d + more %d, want %d in all and a good share shown", shown, more, n+omitted)
	}
}

func TestRetryClassification(t *testing.T) {
	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		name       string
		failure    notifytest.Failure
		retry      bool
		retryAfter time.Duration
		reason     string
	}{
		{"500", notifytest.Failure{Status: 500}, true, 0, ""},
		{"503 with Retry-After", notifytest.Failure{Status: 503, RetryAfter: 4 * time.Second}, true, 4 * time.Second, ""},
		{"429 with Retry-After", notifytest.Failure{Status: 429, RetryAfter: 5 * time.Second}, true, 5 * time.Second, ""},
		{"429 with a Retry-After date", notifytest.Failure{Status: 429, Header: http.Header{"Retry-After": {date}}}, true, 90 * time.Second, ""},
		{"400", notifytest.Failure{Status: 400, Body: "invalid_payload"}, false, 0, "invalid_payload"},
		{"403", notifytest.Failure{Status: 403, Body: "action_prohibited"}, false, 0, "action_prohibited"},
		{"404", notifytest.Failure{Status: 404, Body: "no_service"}, false, 0, "no_service"},
		{"410", notifytest.Failure{Status: 410, Body: "channel_is_archived"}, false, 0, "channel_is_archived"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := notifytest.NewSlackServer(t)
			srv.Fail(tc.failure)
			retry, err := slack.New(nil).Notify(context.Background(), srv.URL, single(threshold("n-1", "A")))
			if err == nil || retry != tc.retry {
				t.Fatalf("Notify = %t, %v; want retry %t and an error", retry, err, tc.retry)
			}
			var ra notify.RetryAfter
			switch has := errors.As(err, &ra); {
			case has != (tc.retryAfter > 0):
				t.Errorf("error %v: RetryAfter present %t, want %t", err, has, tc.retryAfter > 0)
			case has && (ra.RetryAfter() > tc.retryAfter || ra.RetryAfter() < tc.retryAfter-5*time.Second):
				t.Errorf("RetryAfter = %s, want %s", ra.RetryAfter(), tc.retryAfter)
			}
			var herr *notify.HTTPError
			if !errors.As(err, &herr) || herr.StatusCode != tc.failure.Status || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("error %v: want an HTTPError %d with reason %q", err, tc.failure.Status, tc.reason)
			}
			if strings.Contains(err.Error(), srv.Token) {
				t.Errorf("error %q contains the webhook token", err)
			}
		})
	}
}

func TestWrongURLIsPermanent(t *testing.T) {
	srv := notifytest.NewSlackServer(t)
	wrong := strings.TrimSuffix(srv.URL, srv.Token) + "revoked-s3cr3t"
	retry, err := slack.New(nil).Notify(context.Background(), wrong, single(threshold("n-1", "A")))
	if err == nil || retry || !strings.Contains(err.Error(), "no_service") || strings.Contains(err.Error(), "revoked-s3cr3t") {
		t.Errorf("Notify = %t, %v; want a permanent no_service error without the URL", retry, err)
	}
}

func TestConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + "/services/T0/B0/s3cr3t"
	ln.Close()
	retry, err := slack.New(nil).Notify(context.Background(), url, single(threshold("n-1", "A")))
	if err == nil || !retry || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("Notify = %t, %v; want a retryable error without the URL", retry, err)
	}
}

func TestTimeoutIsRetried(t *testing.T) {
	srv := notifytest.NewSlackServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	retry, err := slack.New(nil).Notify(ctx, srv.URL, single(threshold("n-1", "A")))
	if err == nil || !retry || !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), srv.Token) {
		t.Errorf("Notify = %t, %v; want a retryable context error without the URL", retry, err)
	}
}

func TestBadURLIsPermanent(t *testing.T) {
	retry, err := slack.New(nil).Notify(context.Background(), "hooks.slack.com/services/s3cr3t", single(threshold("n-1", "A")))
	if err == nil || retry || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("Notify = %t, %v; want a permanent error without the URL", retry, err)
	}
}

// A redirect answered to the POST must not turn it into a GET whose 200
// passes for a delivery (as http.Client does for 301, 302 and 303).
func TestRedirectIsNotADelivery(t *testing.T) {
	var gets atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("POST /services/old", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/services/new", http.StatusFound)
	})
	mux.HandleFunc("/services/new", func(w http.ResponseWriter, r *http.Request) {
		gets.Add(1)
		fmt.Fprint(w, "ok")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	retry, err := slack.New(srv.Client()).Notify(context.Background(), srv.URL+"/services/old", single(threshold("n-1", "A")))
	var herr *notify.HTTPError
	if err == nil || retry || !errors.As(err, &herr) || herr.StatusCode != http.StatusFound || gets.Load() != 0 {
		t.Errorf("Notify = %t, %v after %d GETs; want a permanent 302 and no GET", retry, err, gets.Load())
	}
}

// Titles are shown as typed: Python's __init__ or *args must not turn into
// italics or bold, in a single message or in a digest.
func TestTitleShownAsTyped(t *testing.T) {
	const title = "TypeError: __init__() got *args in `f`\nat line 2"
	const want = "`TypeError: __init__() got *args in ˋfˋ at line 2`"
	srv := notifytest.NewSlackServer(t)
	if _, err := slack.New(nil).Notify(context.Background(), srv.URL, single(threshold("n-1", title))); err != nil {
		t.Fatal(err)
	}
	if first := blockTexts(onlyRequest(t, srv))[0]; !strings.HasPrefix(first, want+"\n") {
		t.Errorf("first block %q, want it to start with the title in a code span %q", first, want)
	}
	m := digest(2)
	m.Notifications[0].Event.Title = title
	srv = notifytest.NewSlackServer(t)
	if _, err := slack.New(nil).Notify(context.Background(), srv.URL, m); err != nil {
		t.Fatal(err)
	}
	if all := strings.Join(blockTexts(onlyRequest(t, srv)), "\n"); !strings.Contains(all, "• "+want+" — ") {
		t.Errorf("digest blocks %q lack the title in a code span %q", all, want)
	}
}

// Slack endpoints are Slack's: a rule's URL on another host (or another
// path of Slack's) fails for good before any request, naming the host and
// the setting, never the URL.
func TestEndpointOutsideSlackHostsRefused(t *testing.T) {
	srv := notifytest.NewSlackServer(t)
	hosts, err := netguard.ParsePatterns("hooks.slack.com/services/")
	if err != nil {
		t.Fatal(err)
	}
	n := &slack.Notifier{Hosts: hosts}
	retry, err := n.Notify(context.Background(), srv.URL, single(threshold("n-1", "A")))
	if retry || !netguard.IsRefused(err) || !strings.Contains(err.Error(), "KLAXON_SLACK_HOSTS") ||
		strings.Contains(err.Error(), srv.URL) {
		t.Errorf("Notify = %t, %v; want a permanent refusal naming KLAXON_SLACK_HOSTS", retry, err)
	}
	if len(srv.Requests()) != 0 {
		t.Errorf("the server got %d requests", len(srv.Requests()))
	}
	// A path that starts with the prefix but leads out of it with a dot
	// segment is refused: the server would resolve it to /admin/.
	n.Hosts, _ = netguard.ParsePatterns("127.0.0.1/services/")
	for _, path := range []string{"/services/../admin/x", "/services/%2e%2e/admin/x"} {
		if retry, err := n.Notify(context.Background(), srv.URL+path, single(threshold("n-1", "A"))); retry || !netguard.IsRefused(err) ||
			!strings.Contains(err.Error(), "KLAXON_SLACK_HOSTS") {
			t.Errorf("%s: Notify = %t, %v; want a permanent refusal naming KLAXON_SLACK_HOSTS", path, retry, err)
		}
	}
	if len(srv.Requests()) != 0 {
		t.Errorf("the server got %d requests", len(srv.Requests()))
	}
	// The same server, once its host is a pattern, gets the message.
	local, _ := netguard.ParsePatterns("127.0.0.1")
	n.Hosts = local
	if _, err := n.Notify(context.Background(), srv.URL, single(threshold("n-2", "A"))); err != nil {
		t.Errorf("127.0.0.1 allowed: %v", err)
	}
}

// Through a netguard client: a loopback endpoint is refused for good, a
// 307 to elsewhere is not followed.
func TestGuardedClient(t *testing.T) {
	srv := notifytest.NewSlackServer(t)
	retry, err := slack.New(netguard.Policy{}.Client(netguard.ClientOptions{})).
		Notify(context.Background(), srv.URL, single(threshold("n-1", "A")))
	if retry || !netguard.IsRefused(err) || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("loopback: Notify = %t, %v; want a permanent refusal", retry, err)
	}

	var followed atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("POST /services/old", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/inside", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/inside", func(w http.ResponseWriter, r *http.Request) { followed.Add(1) })
	redirecting := httptest.NewServer(mux)
	t.Cleanup(redirecting.Close)
	client := netguard.Policy{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}.Client(netguard.ClientOptions{})
	retry, err = slack.New(client).Notify(context.Background(), redirecting.URL+"/services/old", single(threshold("n-2", "A")))
	var herr *notify.HTTPError
	if retry || !errors.As(err, &herr) || herr.StatusCode != http.StatusTemporaryRedirect || followed.Load() != 0 ||
		!strings.Contains(err.Error(), "redirected") {
		t.Errorf("307: Notify = %t, %v after %d followed; want a permanent 307 saying it redirected", retry, err, followed.Load())
	}
}

// Slack renders the top-level text as mrkdwn and links URLs in it (an
// incoming webhook ignores "parse"): a title of "*URGENT* reset at
// https://evil.example" showed bold, with a link, in every notification.
// The text puts titles and rule ids in code spans, as the blocks do.
func TestTextIsAsSafeAsBlocks(t *testing.T) {
	const title = "*URGENT* _reset_ ~now~ at https://evil.example <!channel> & `x`"
	const want = "`*URGENT* _reset_ ~now~ at https://evil.example &lt;!channel&gt; &amp; ˋxˋ` — 150 events in the last 1 minute"
	srv := notifytest.NewSlackServer(t)
	if _, err := slack.New(nil).Notify(context.Background(), srv.URL, single(threshold("n-1", title))); err != nil {
		t.Fatal(err)
	}
	if r := onlyRequest(t, srv); r.Text != want {
		t.Errorf("text %q\nwant %q", r.Text, want)
	}

	m := digest(3)
	m.RuleID = "*rule*"
	m.Notifications[0].Event.Title = title
	srv = notifytest.NewSlackServer(t)
	if _, err := slack.New(nil).Notify(context.Background(), srv.URL, m); err != nil {
		t.Fatal(err)
	}
	const wantDigest = "3 notifications for rule `*rule*`: `*URGENT* _reset_ ~now~ at https://evil.example &lt;!channel&gt; &amp; ˋxˋ` and 2 more"
	if r := onlyRequest(t, srv); r.Text != wantDigest {
		t.Errorf("digest text %q\nwant %q", r.Text, wantDigest)
	}
}

// A grouped message names every rule with what it saw, the event once.
func TestGroupedNamesEveryRule(t *testing.T) {
	srv := notifytest.NewSlackServer(t)
	if _, err := slack.New(nil).Notify(context.Background(), srv.URL, notifytest.Grouped(nastyTitle, firedAt)); err != nil {
		t.Fatal(err)
	}
	r := onlyRequest(t, srv)
	all := strings.Join(blockTexts(r), "\n")
	for _, want := range []string{"*3 rules fired for one event in project Shop (5e3eef0679fa3700a0198a49)*",
		"• `100 events in 1 minute` — 150 events in the last 1 minute (threshold 100)",
		"• `new errors` — New event, seen for the first time", "• `Rule 64ab00000000000000000003` — ",
		"Notification id n-a", "Notification id n-c", "Message id group-1"} {
		if !strings.Contains(all, want) {
			t.Errorf("blocks lack %q:\n%s", want, all)
		}
	}
	if strings.Count(all, "&lt;b&gt;&amp;*_[x]") != 1 || !strings.Contains(r.Text, "3 rules fired") {
		t.Errorf("the title is not shown once, escaped, or the text %q does not say how many rules fired:\n%s", r.Text, all)
	}
}

// Nothing from an event or a rule can mention anyone: <!channel> and
// <@U…> are escaped, and a bare @channel, which Slack links when a
// workspace's webhook parses names, is broken by a zero-width space. Nor
// can it start a line with U+2028.
func TestUserTextMentionsNoOne(t *testing.T) {
	for _, m := range notifytest.Hostile(firedAt) {
		srv := notifytest.NewSlackServer(t)
		if _, err := slack.New(nil).Notify(t.Context(), srv.URL, m); err != nil {
			t.Fatal(err)
		}
		r := onlyRequest(t, srv)
		for _, text := range append(blockTexts(r), r.Text) {
			if bad := notifytest.Inert(text); bad != nil {
				t.Errorf("message %s: %q in\n%s", m.ID, bad, text)
			}
		}
	}
}
