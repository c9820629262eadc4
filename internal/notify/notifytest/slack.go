package notifytest

import (
	"crypto/rand"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
	"unicode/utf8"
)

// SlackServer is a fake Slack incoming webhook. Like Slack, it answers 200
// "ok", 404 "no_service" for a wrong URL, 400 "invalid_payload" for a body
// that is not JSON, 400 "no_text" for a message with neither text nor
// blocks, and 400 "invalid_blocks" for more than 50 blocks or a text object
// over 3000 characters.
type SlackServer struct {
	// URL is the webhook URL to post to. Its path embeds Token, as Slack's
	// URLs embed theirs.
	URL string
	// Token is the secret part of URL, for tests that check it never leaks.
	Token string

	path  string
	reqs  journal[SlackRequest]
	fails script[Failure]
}

// SlackRequest is one POST the fake received.
type SlackRequest struct {
	Header http.Header
	Body   []byte           // raw JSON
	Text   string           // the payload's "text"
	Blocks []map[string]any // the payload's "blocks", decoded
	Status int              // what the fake answered
	// Received is when the request arrived, before its body was read.
	Received time.Time
}

// NewSlackServer starts a fake Slack webhook, closed when the test ends.
func NewSlackServer(t testing.TB) *SlackServer {
	t.Helper()
	token := rand.Text()
	s := &SlackServer{Token: token, path: "/services/T0KLAXON/B0KLAXON/" + token}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	s.URL = srv.URL + s.path
	return s
}

// Fail scripts the answers to the next requests, one failure each.
func (s *SlackServer) Fail(fs ...Failure) { s.fails.push(fs...) }

// FailNext makes the next n requests fail with f.
func (s *SlackServer) FailNext(n int, f Failure) { s.fails.push(repeat(n, f)...) }

// Requests returns every request received so far, refused ones included.
func (s *SlackServer) Requests() []SlackRequest { return s.reqs.all() }

// WaitFor waits until at least n requests have arrived and returns them all;
// after timeout it returns those that did and an error.
func (s *SlackServer) WaitFor(n int, timeout time.Duration) ([]SlackRequest, error) {
	return s.reqs.waitFor(n, timeout)
}

func (s *SlackServer) serve(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	body, _ := io.ReadAll(r.Body)
	req := SlackRequest{Header: r.Header.Clone(), Body: body, Received: received}
	status, reason := s.answer(r, &req)
	if status == http.StatusOK {
		if f, ok := s.fails.pop(); ok {
			status, reason = f.Status, f.Body
			if reason == "" {
				reason = http.StatusText(f.Status)
			}
			f.writeHeader(w)
		}
	}
	req.Status = status
	s.reqs.add(req)
	w.Header().Set("Content-Type", "text/html")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, reason)
}

// answer validates the request as Slack would and decodes it into req.
func (s *SlackServer) answer(r *http.Request, req *SlackRequest) (int, string) {
	if r.URL.Path != s.path {
		return http.StatusNotFound, "no_service"
	}
	if r.Method != http.MethodPost {
		return http.StatusMethodNotAllowed, "invalid_method"
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		return http.StatusBadRequest, "invalid_payload"
	}
	var p struct {
		Text   string           `json:"text"`
		Blocks []map[string]any `json:"blocks"`
	}
	if err := json.Unmarshal(req.Body, &p); err != nil {
		return http.StatusBadRequest, "invalid_payload"
	}
	req.Text, req.Blocks = p.Text, p.Blocks
	if p.Text == "" && len(p.Blocks) == 0 {
		return http.StatusBadRequest, "no_text"
	}
	if len(p.Blocks) > 50 || !textsFit(p.Blocks, 3000) {
		return http.StatusBadRequest, "invalid_blocks"
	}
	return http.StatusOK, "ok"
}

// textsFit reports whether every text object in v (the "text" of a block or
// of a context element) has 1 to limit characters.
func textsFit(v any, limit int) bool {
	switch v := v.(type) {
	case []map[string]any:
		for _, b := range v {
			if !textsFit(b, limit) {
				return false
			}
		}
	case []any:
		for _, e := range v {
			if !textsFit(e, limit) {
				return false
			}
		}
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok && k == "text" {
				if n := utf8.RuneCountInString(s); n == 0 || n > limit {
					return false
				}
			} else if !textsFit(e, limit) {
				return false
			}
		}
	}
	return true
}
