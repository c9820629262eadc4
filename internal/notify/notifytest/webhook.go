package notifytest

import (
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// WebhookSink is a fake webhook receiver. It records every request and
// answers 200, or the scripted failures.
type WebhookSink struct {
	// URL is the endpoint to post to. Its path embeds a random secret, as
	// users' webhook URLs often do.
	URL string
	// Path is URL's path, the part a test checks never leaks.
	Path string

	reqs  journal[WebhookRequest]
	fails script[Failure]
}

// WebhookRequest is one request the sink received.
type WebhookRequest struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
	Status int // what the sink answered
	// Received is when the request arrived, before its body was read.
	Received time.Time
}

// JSON decodes the request body into v.
func (r WebhookRequest) JSON(v any) error { return json.Unmarshal(r.Body, v) }

// NewWebhookSink starts a webhook receiver, closed when the test ends.
func NewWebhookSink(t testing.TB) *WebhookSink {
	t.Helper()
	s := &WebhookSink{Path: "/hooks/" + rand.Text()}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	s.URL = srv.URL + s.Path
	return s
}

// Fail scripts the answers to the next requests, one failure each. A
// failure's Body is sent as is (text/plain).
func (s *WebhookSink) Fail(fs ...Failure) { s.fails.push(fs...) }

// FailNext makes the next n requests fail with f.
func (s *WebhookSink) FailNext(n int, f Failure) { s.fails.push(repeat(n, f)...) }

// Requests returns every request received so far, refused ones included.
func (s *WebhookSink) Requests() []WebhookRequest { return s.reqs.all() }

// WaitFor waits until at least n requests have arrived and returns them all;
// after timeout it returns those that did and an error.
func (s *WebhookSink) WaitFor(n int, timeout time.Duration) ([]WebhookRequest, error) {
	return s.reqs.waitFor(n, timeout)
}

func (s *WebhookSink) serve(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	body, _ := io.ReadAll(r.Body)
	req := WebhookRequest{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body, Status: http.StatusOK, Received: received}
	f, failed := s.fails.pop()
	if failed {
		req.Status = f.Status
		f.writeHeader(w)
	}
	s.reqs.add(req)
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(req.Status)
	if failed {
		_, _ = io.WriteString(w, f.Body)
	}
}
