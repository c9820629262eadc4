package notifytest

import (
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// incomingHook is what the fakes of chat incoming webhooks (Slack, Loop)
// share: a URL whose path embeds a secret token, the requests received (R,
// the fake's own record of one), and the failures scripted for the next.
type incomingHook[R any] struct {
	// URL is the webhook URL to post to. Its path embeds Token, as the
	// service's URLs embed theirs.
	URL string
	// Token is the secret part of URL, for tests that check it never leaks.
	Token string

	path  string
	reqs  journal[R]
	fails script[Failure]
}

// listen serves the hook at pathPrefix and a fresh token with serve, until
// the test ends.
func (h *incomingHook[R]) listen(t testing.TB, pathPrefix string, serve http.HandlerFunc) {
	t.Helper()
	h.Token = rand.Text()
	h.path = pathPrefix + h.Token
	srv := httptest.NewServer(serve)
	t.Cleanup(srv.Close)
	h.URL = srv.URL + h.path
}

// Fail scripts the answers to the next requests, one failure each.
func (h *incomingHook[R]) Fail(fs ...Failure) { h.fails.push(fs...) }

// FailNext makes the next n requests fail with f.
func (h *incomingHook[R]) FailNext(n int, f Failure) { h.fails.push(repeat(n, f)...) }

// Requests returns every request received so far, refused ones included.
func (h *incomingHook[R]) Requests() []R { return h.reqs.all() }

// WaitFor waits until at least n requests have arrived and returns them all;
// after timeout it returns those that did and an error.
func (h *incomingHook[R]) WaitFor(n int, timeout time.Duration) ([]R, error) {
	return h.reqs.waitFor(n, timeout)
}

// HookRequest is what the fakes of chat incoming webhooks record of every
// POST; each fake's request adds what its payload has of its own.
type HookRequest struct {
	Header http.Header
	Body   []byte // raw JSON
	Text   string // the payload's "text"
	Status int    // what the fake answered
	// Received is when the request arrived, before its body was read.
	Received time.Time
}

// take reads a request into req, has answer judge it, and returns the
// answer to write: answer's, or the next scripted failure in place of a
// success.
func (h *incomingHook[R]) take(w http.ResponseWriter, r *http.Request, req *HookRequest, answer func() (int, string)) (int, string) {
	req.Received = time.Now()
	req.Header = r.Header.Clone()
	req.Body, _ = io.ReadAll(r.Body)
	status, reason := answer()
	status, reason = h.scripted(w, status, reason)
	req.Status = status
	return status, reason
}

// scripted returns the answer to a request the fake answered with status
// and reason: the next scripted failure, with its headers written to w,
// in place of a success.
func (h *incomingHook[R]) scripted(w http.ResponseWriter, status int, reason string) (int, string) {
	if status != http.StatusOK {
		return status, reason
	}
	f, ok := h.fails.pop()
	if !ok {
		return status, reason
	}
	f.writeHeader(w)
	if f.Body == "" {
		return f.Status, http.StatusText(f.Status)
	}
	return f.Status, f.Body
}
