package notifytest

import (
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"testing"
	"unicode/utf8"
)

// SlackServer is a fake Slack incoming webhook. Like Slack, it answers 200
// "ok", 404 "no_service" for a wrong URL, 400 "invalid_payload" for a body
// that is not JSON, 400 "no_text" for a message with neither text nor
// blocks, and 400 "invalid_blocks" for more than 50 blocks or a text object
// over 3000 characters. Tests post to its URL, whose path embeds its Token
// as Slack's webhook URLs embed theirs.
type SlackServer struct {
	incomingHook[SlackRequest]
}

// SlackRequest is one POST the fake received.
type SlackRequest struct {
	HookRequest
	Blocks []map[string]any // the payload's "blocks", decoded
}

// NewSlackServer starts a fake Slack webhook, closed when the test ends.
func NewSlackServer(t testing.TB) *SlackServer {
	t.Helper()
	s := &SlackServer{}
	s.listen(t, "/services/T0KLAXON/B0KLAXON/", s.serve)
	return s
}

func (s *SlackServer) serve(w http.ResponseWriter, r *http.Request) {
	var req SlackRequest
	status, reason := s.take(w, r, &req.HookRequest, func() (int, string) { return s.answer(r, &req) })
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
