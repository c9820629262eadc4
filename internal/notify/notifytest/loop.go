package notifytest

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"testing"
	"unicode/utf8"
)

// LoopServer is a fake Loop (Mattermost) incoming webhook at
// /hooks/<token>. Like Mattermost, it answers 200 "ok"; 400 with a JSON
// error for an unknown hook, a body that is not JSON or a message without
// text; and, where Mattermost would split a long message into several
// posts, 400 for text over 16383 characters, so that a test sees a message
// that would not arrive whole. Tests post to its URL, whose path embeds its
// Token.
type LoopServer struct {
	incomingHook[LoopRequest]
}

// LoopRequest is one POST the fake received.
type LoopRequest struct {
	HookRequest
	Username string // the payload's "username"
}

// NewLoopServer starts a fake Loop webhook, closed when the test ends.
func NewLoopServer(t testing.TB) *LoopServer {
	t.Helper()
	s := &LoopServer{}
	s.listen(t, "/hooks/", s.serve)
	return s
}

func (s *LoopServer) serve(w http.ResponseWriter, r *http.Request) {
	var req LoopRequest
	status, reason := s.take(w, r, &req.HookRequest, func() (int, string) { return s.answer(r, &req) })
	s.reqs.add(req)
	if status == http.StatusOK {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, "ok")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"id": "web.incoming_webhook.error", "message": reason, "status_code": status})
}

// answer validates the request as Mattermost would and decodes it into req.
func (s *LoopServer) answer(r *http.Request, req *LoopRequest) (int, string) {
	if r.URL.Path != s.path {
		return http.StatusBadRequest, "Invalid webhook"
	}
	if r.Method != http.MethodPost {
		return http.StatusMethodNotAllowed, "method not allowed"
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		return http.StatusBadRequest, "Unable to parse incoming data"
	}
	var p struct {
		Text     string `json:"text"`
		Username string `json:"username"`
	}
	if err := json.Unmarshal(req.Body, &p); err != nil {
		return http.StatusBadRequest, "Unable to parse incoming data"
	}
	req.Text, req.Username = p.Text, p.Username
	if p.Text == "" {
		return http.StatusBadRequest, "No text specified"
	}
	if n := utf8.RuneCountInString(p.Text); n > 16383 {
		return http.StatusBadRequest, fmt.Sprintf("text of %d characters would be split", n)
	}
	return http.StatusOK, "ok"
}
