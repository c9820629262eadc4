package notify_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/netguard"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
)

func TestPostJSONSendsJSON(t *testing.T) {
	sink := notifytest.NewWebhookSink(t)
	body := map[string]any{"id": "n-1", "title": "<b>&"}
	retry, err := notify.PostJSON(context.Background(), nil, "test", sink.URL, http.Header{"Idempotency-Key": {"n-1"}}, body)
	if err != nil || retry {
		t.Fatalf("PostJSON = %t, %v; want success", retry, err)
	}
	reqs := sink.Requests()
	if len(reqs) != 1 {
		t.Fatalf("sink got %d requests, want 1", len(reqs))
	}
	r := reqs[0]
	for k, want := range map[string]string{"Content-Type": "application/json", "User-Agent": "Klaxon", "Idempotency-Key": "n-1"} {
		if got := r.Header.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	var got map[string]any
	if err := r.JSON(&got); err != nil || got["title"] != "<b>&" || r.Method != http.MethodPost {
		t.Errorf("%s with body %s (%v)", r.Method, r.Body, err)
	}
}

func TestPostJSONClassifiesStatus(t *testing.T) {
	date := time.Now().Add(2 * time.Minute).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		name       string
		failure    notifytest.Failure
		retry      bool
		retryAfter time.Duration // 0: the error must not implement RetryAfter
		approx     bool          // retryAfter is computed from a date: allow a few seconds
	}{
		{"500", notifytest.Failure{Status: 500}, true, 0, false},
		{"502", notifytest.Failure{Status: 502}, true, 0, false},
		{"503 with Retry-After", notifytest.Failure{Status: 503, RetryAfter: 7 * time.Second}, true, 7 * time.Second, false},
		{"429 with Retry-After seconds", notifytest.Failure{Status: 429, RetryAfter: 3 * time.Second}, true, 3 * time.Second, false},
		{"429 with Retry-After date", notifytest.Failure{Status: 429, Header: http.Header{"Retry-After": {date}}}, true, 2 * time.Minute, true},
		{"429 without Retry-After", notifytest.Failure{Status: 429}, true, 0, false},
		{"408", notifytest.Failure{Status: 408}, true, 0, false},
		{"400", notifytest.Failure{Status: 400, Body: "bad payload"}, false, 0, false},
		{"401", notifytest.Failure{Status: 401}, false, 0, false},
		{"404", notifytest.Failure{Status: 404}, false, 0, false},
		{"410", notifytest.Failure{Status: 410}, false, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := notifytest.NewWebhookSink(t)
			sink.Fail(tc.failure)
			retry, err := notify.PostJSON(context.Background(), nil, "webhook", sink.URL, nil, "x")
			if err == nil {
				t.Fatal("PostJSON succeeded, want an error")
			}
			if retry != tc.retry {
				t.Errorf("retry = %t, want %t (%v)", retry, tc.retry, err)
			}
			var herr *notify.HTTPError
			if !errors.As(err, &herr) || herr.StatusCode != tc.failure.Status || herr.Channel != "webhook" {
				t.Errorf("error %v is not an HTTPError for %d", err, tc.failure.Status)
			}
			if tc.failure.Body != "" && herr != nil && herr.Reason != tc.failure.Body {
				t.Errorf("Reason = %q, want %q", herr.Reason, tc.failure.Body)
			}
			var ra notify.RetryAfter
			switch hasRA := errors.As(err, &ra); {
			case tc.retryAfter == 0 && hasRA:
				t.Errorf("error implements RetryAfter (%s), want it not to", ra.RetryAfter())
			case tc.retryAfter != 0 && !hasRA:
				t.Errorf("error %v does not implement RetryAfter", err)
			case hasRA && tc.approx && (ra.RetryAfter() > tc.retryAfter || ra.RetryAfter() < tc.retryAfter-5*time.Second):
				t.Errorf("RetryAfter = %s, want about %s", ra.RetryAfter(), tc.retryAfter)
			case hasRA && !tc.approx && ra.RetryAfter() != tc.retryAfter:
				t.Errorf("RetryAfter = %s, want %s", ra.RetryAfter(), tc.retryAfter)
			}
			if strings.Contains(err.Error(), sink.Path) {
				t.Errorf("error %q contains the URL", err)
			}
		})
	}
}

func TestPostJSONNeverShowsTheURL(t *testing.T) {
	sink := notifytest.NewWebhookSink(t)
	// Servers echo the path ("Cannot POST /hooks/…"), and it holds the token.
	sink.Fail(notifytest.Failure{Status: 404, Body: "Cannot POST " + sink.Path})
	_, err := notify.PostJSON(context.Background(), nil, "webhook", sink.URL+"?token=s3cr3t-query", nil, "x")
	if err == nil {
		t.Fatal("want an error")
	}
	msg := err.Error()
	if strings.Contains(msg, sink.Path) || strings.Contains(msg, "s3cr3t-query") {
		t.Errorf("error %q contains the URL", msg)
	}
	if !strings.Contains(msg, "404") || !strings.Contains(msg, "webhook") || !strings.Contains(msg, "[redacted]") {
		t.Errorf("error %q should name the channel and status and show the redacted reason", msg)
	}
}

func TestPostJSONConnectionRefused(t *testing.T) {
	url := "http://" + closedAddr(t) + "/hooks/s3cr3t-token"
	retry, err := notify.PostJSON(context.Background(), nil, "webhook", url, nil, "x")
	if err == nil || !retry {
		t.Fatalf("PostJSON = %t, %v; want a retryable error", retry, err)
	}
	if strings.Contains(err.Error(), "s3cr3t-token") {
		t.Errorf("error %q contains the URL", err)
	}
}

func TestPostJSONTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release // never answers while the test runs
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	retry, err := notify.PostJSON(ctx, srv.Client(), "webhook", srv.URL+"/s3cr3t", nil, "x")
	if !retry || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PostJSON = %t, %v; want a retryable deadline error", retry, err)
	}
	if strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("error %q contains the URL", err)
	}
}

func TestPostJSONRejectsBadURLs(t *testing.T) {
	for _, u := range []string{"", "not a url s3cr3t", "ftp://host/s3cr3t", "/relative/s3cr3t", "http://%zz/s3cr3t"} {
		retry, err := notify.PostJSON(context.Background(), nil, "webhook", u, nil, "x")
		if err == nil || retry {
			t.Errorf("PostJSON(%q) = %t, %v; want a permanent error", u, retry, err)
		} else if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("error %q repeats the URL", err)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"120", 2 * time.Minute, true},
		{" 0 ", 0, true},
		{"Thu, 02 Jan 2025 03:05:05 GMT", time.Minute, true},
		{"Thu, 02 Jan 2025 03:00:00 GMT", 0, true}, // in the past
		{"99999999", 24 * time.Hour, true},
		{"", 0, false},
		{"-5", 0, false},
		{"soon", 0, false},
	} {
		got, ok := notify.ParseRetryAfter(tc.v, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseRetryAfter(%q) = %s, %t; want %s, %t", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}

func TestWithRetryAfter(t *testing.T) {
	base := errors.New("slow down")
	err := notify.WithRetryAfter(base, 3*time.Second)
	var ra notify.RetryAfter
	if !errors.As(err, &ra) || ra.RetryAfter() != 3*time.Second || !errors.Is(err, base) {
		t.Errorf("WithRetryAfter: %v", err)
	}
	if notify.WithRetryAfter(base, 0) != base || notify.WithRetryAfter(nil, time.Second) != nil {
		t.Error("WithRetryAfter should leave err alone for a zero delay and nil for nil")
	}
}

func TestRedactError(t *testing.T) {
	base := errors.New(`Post "https://api/bot123:abc/sendMessage": refused`)
	if got := notify.RedactError(base, "123:abc").Error(); strings.Contains(got, "123:abc") || !strings.Contains(got, "[redacted]") {
		t.Errorf("RedactError = %q", got)
	}
	other := errors.New("fine")
	if notify.RedactError(other, "123:abc") != other {
		t.Error("RedactError replaced an error without secrets")
	}
}

// closedAddr returns a local address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestPostJSONDoesNotTurnIntoGET(t *testing.T) {
	var gets atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("POST /old", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/new", http.StatusFound) })
	mux.HandleFunc("/new", func(w http.ResponseWriter, r *http.Request) { gets.Add(1) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	retry, err := notify.PostJSON(context.Background(), srv.Client(), "webhook", srv.URL+"/old", nil, "x")
	var herr *notify.HTTPError
	if retry || !errors.As(err, &herr) || herr.StatusCode != http.StatusFound || gets.Load() != 0 {
		t.Errorf("PostJSON = %t, %v after %d GETs; want a permanent 302 and no GET", retry, err, gets.Load())
	}
}

// The reason is read from the start of the body only. When that cut falls
// inside an echo of the URL, the part of the token before it must not show.
func TestReasonCutInsideTheURL(t *testing.T) {
	sink := notifytest.NewWebhookSink(t)
	// Whitespace, as in an indented error page, shrinks to nothing in the
	// reason, so the echo lands near its start.
	body := strings.Repeat(" ", 1000) + "Cannot POST " + sink.Path
	sink.Fail(notifytest.Failure{Status: 404, Body: body})
	_, err := notify.PostJSON(context.Background(), nil, "webhook", sink.URL, nil, "x")
	if err == nil {
		t.Fatal("want an error")
	}
	token := strings.TrimPrefix(sink.Path, "/hooks/")
	if msg := err.Error(); strings.Contains(msg, token[:4]) {
		t.Errorf("error %q shows the start of the token %q", msg, token)
	}
}

// A 307 or 308 would repeat the POST, with its Referer the full original
// URL, wherever the endpoint points: inside Klaxon's network too. No
// redirect is followed, and the 3xx is permanent with a reason that says so.
func TestPostJSONFollowsNoRedirect(t *testing.T) {
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		var followed atomic.Int32
		mux := http.NewServeMux()
		mux.HandleFunc("POST /old", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/inside", code) })
		mux.HandleFunc("/inside", func(w http.ResponseWriter, r *http.Request) { followed.Add(1) })
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		retry, err := notify.PostJSON(context.Background(), srv.Client(), "webhook", srv.URL+"/old", nil, "x")
		var herr *notify.HTTPError
		if retry || !errors.As(err, &herr) || herr.StatusCode != code || followed.Load() != 0 {
			t.Errorf("%d: PostJSON = %t, %v after %d followed; want a permanent %d", code, retry, err, followed.Load(), code)
		} else if !strings.Contains(err.Error(), "the endpoint redirected") {
			t.Errorf("%d: reason %q does not say the endpoint redirected", code, err)
		}
	}
}

// user:pass@ in an endpoint would become an Authorization header, and is a
// credential in a rule; the send is refused before any request.
func TestPostJSONRefusesCredentialsInURL(t *testing.T) {
	sink := notifytest.NewWebhookSink(t)
	withUser := strings.Replace(sink.URL, "http://", "http://admin:s3cret@", 1)
	retry, err := notify.PostJSON(context.Background(), nil, "webhook", withUser, nil, "x")
	if retry || !netguard.IsRefused(err) || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("PostJSON = %t, %v; want a permanent refusal without the password", retry, err)
	}
	if n := len(sink.Requests()); n != 0 {
		t.Errorf("the endpoint got %d requests", n)
	}
}

// A connection the client's policy refuses is refused again next time:
// permanent, with the reason, without the URL.
func TestPostJSONRefusedAddressIsPermanent(t *testing.T) {
	sink := notifytest.NewWebhookSink(t)
	client := netguard.Policy{}.Client(netguard.ClientOptions{})
	retry, err := notify.PostJSON(context.Background(), client, "webhook", sink.URL, nil, "x")
	if retry || !netguard.IsRefused(err) || !strings.Contains(err.Error(), "127.0.0.1, a loopback address") ||
		strings.Contains(err.Error(), sink.Path) {
		t.Errorf("PostJSON = %t, %v; want a permanent refusal naming the address", retry, err)
	}
	if n := len(sink.Requests()); n != 0 {
		t.Errorf("the endpoint got %d requests", n)
	}
}
