package notifytest

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf16"
)

// TelegramServer is a fake Telegram Bot API. It serves POST
// /bot<Token>/<method> with parameters as a form or JSON, as the Bot API
// does, and answers in the Bot API's JSON. sendMessage is checked as
// Telegram checks it: chat_id and text are required, text may have at most
// 4096 characters after entity parsing, and with parse_mode HTML the text
// must use supported tags only and escape every other <, > and &. getMe
// answers with a bot; other methods get 404.
type TelegramServer struct {
	// URL is the API base URL (KLAXON_TELEGRAM_API_URL); method URLs are
	// URL + "/bot" + Token + "/" + method.
	URL   string
	Token string

	reqs  journal[TelegramRequest]
	fails script[Failure]
	msgID atomic.Int64
}

// TelegramRequest is one Bot API call the fake received.
type TelegramRequest struct {
	Method    string // "sendMessage", "getMe", …
	ChatID    string
	Text      string // as sent, with markup and entities
	ParseMode string
	// Visible is Text as a reader sees it: tags removed and entities
	// decoded when ParseMode is HTML, else Text.
	Visible string
	Params  url.Values // every parameter, from the form or the JSON body
	Status  int        // the HTTP status the fake answered
	// Description is the Bot API's description of an error answer.
	Description string
	// Received is when the call arrived, before its parameters were read.
	Received time.Time
}

// NewTelegramServer starts a fake Bot API for the bot with this token,
// closed when the test ends.
func NewTelegramServer(t testing.TB, token string) *TelegramServer {
	t.Helper()
	s := &TelegramServer{Token: token}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// Fail scripts the answers to the next calls, one failure each, in the Bot
// API's error format:
//
//	{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 3","parameters":{"retry_after":3}}
func (s *TelegramServer) Fail(fs ...Failure) { s.fails.push(fs...) }

// FailNext makes the next n calls fail with f.
func (s *TelegramServer) FailNext(n int, f Failure) { s.fails.push(repeat(n, f)...) }

// Requests returns every call received so far, refused ones included.
func (s *TelegramServer) Requests() []TelegramRequest { return s.reqs.all() }

// WaitFor waits until at least n calls have arrived and returns them all;
// after timeout it returns those that did and an error.
func (s *TelegramServer) WaitFor(n int, timeout time.Duration) ([]TelegramRequest, error) {
	return s.reqs.waitFor(n, timeout)
}

type apiAnswer struct {
	OK          bool            `json:"ok"`
	Result      any             `json:"result,omitempty"`
	ErrorCode   int             `json:"error_code,omitempty"`
	Description string          `json:"description,omitempty"`
	Parameters  *apiRetryParams `json:"parameters,omitempty"`
}

type apiRetryParams struct {
	RetryAfter int `json:"retry_after"`
}

func (s *TelegramServer) serve(w http.ResponseWriter, r *http.Request) {
	req := TelegramRequest{Params: url.Values{}, Received: time.Now()}
	rest, found := strings.CutPrefix(r.URL.Path, "/bot")
	token, method, _ := strings.Cut(rest, "/")
	req.Method = method
	if err := readParams(r, req.Params); err != nil {
		s.reply(w, &req, apiError(http.StatusBadRequest, "Bad Request: "+err.Error()))
		return
	}
	req.ChatID = req.Params.Get("chat_id")
	req.Text = req.Params.Get("text")
	req.ParseMode = req.Params.Get("parse_mode")
	req.Visible = req.Text
	switch {
	case !found:
		s.reply(w, &req, apiError(http.StatusNotFound, "Not Found"))
		return
	case token != s.Token:
		s.reply(w, &req, apiError(http.StatusUnauthorized, "Unauthorized"))
		return
	}
	if f, ok := s.fails.pop(); ok {
		f.writeHeader(w)
		if f.Raw {
			req.Status = f.Status
			s.reqs.add(req)
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(f.Status)
			_, _ = io.WriteString(w, f.Body)
			return
		}
		a := apiError(f.Status, f.Body)
		if f.Body == "" && f.Status == http.StatusTooManyRequests {
			a.Description = fmt.Sprintf("Too Many Requests: retry after %d", int(f.RetryAfter/time.Second))
		}
		if f.RetryAfter > 0 {
			a.Parameters = &apiRetryParams{RetryAfter: int(f.RetryAfter / time.Second)}
		}
		s.reply(w, &req, a)
		return
	}
	switch method {
	case "getMe":
		s.reply(w, &req, apiAnswer{OK: true, Result: map[string]any{
			"id": 1, "is_bot": true, "first_name": "Klaxon", "username": "klaxon_test_bot"}})
	case "sendMessage":
		s.reply(w, &req, s.sendMessage(&req))
	default:
		s.reply(w, &req, apiError(http.StatusNotFound, "Not Found"))
	}
}

func (s *TelegramServer) sendMessage(req *TelegramRequest) apiAnswer {
	if req.ChatID == "" {
		return apiError(http.StatusBadRequest, "Bad Request: chat_id is empty")
	}
	switch req.ParseMode {
	case "":
	case "HTML":
		visible, err := telegramHTML(req.Text)
		if err != nil {
			return apiError(http.StatusBadRequest, "Bad Request: can't parse entities: "+err.Error())
		}
		req.Visible = visible
	default:
		return apiError(http.StatusBadRequest, "Bad Request: unsupported parse_mode")
	}
	switch n := len(utf16.Encode([]rune(req.Visible))); {
	case strings.TrimSpace(req.Visible) == "":
		return apiError(http.StatusBadRequest, "Bad Request: message text is empty")
	case n > 4096:
		return apiError(http.StatusBadRequest, "Bad Request: message is too long")
	}
	return apiAnswer{OK: true, Result: map[string]any{
		"message_id": s.msgID.Add(1),
		"date":       time.Now().Unix(),
		"chat":       chat(req.ChatID),
		"text":       req.Visible,
	}}
}

// chat is the Bot API's Chat for a chat_id: a numeric id, or a channel's
// @username.
func chat(chatID string) map[string]any {
	if id, err := strconv.ParseInt(chatID, 10, 64); err == nil {
		return map[string]any{"id": id, "type": "private"}
	}
	return map[string]any{"id": -1000000000001, "type": "channel", "username": strings.TrimPrefix(chatID, "@")}
}

func apiError(code int, description string) apiAnswer {
	if description == "" {
		description = http.StatusText(code)
	}
	return apiAnswer{ErrorCode: code, Description: description}
}

func (s *TelegramServer) reply(w http.ResponseWriter, req *TelegramRequest, a apiAnswer) {
	req.Status = http.StatusOK
	if !a.OK {
		req.Status = a.ErrorCode
		req.Description = a.Description
	}
	s.reqs.add(*req)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(req.Status)
	_ = json.NewEncoder(w).Encode(a)
}

// readParams collects the call's parameters from a JSON body, a form, or a
// multipart form, whichever the client sent.
func readParams(r *http.Request, into url.Values) error {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch mt {
	case "application/json":
		var m map[string]any
		if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
			return fmt.Errorf("invalid JSON: %w", err)
		}
		for k, v := range m {
			if s, ok := v.(string); ok {
				into.Set(k, s)
			} else {
				b, _ := json.Marshal(v)
				into.Set(k, string(b))
			}
		}
		return nil
	case "multipart/form-data":
		if err := r.ParseMultipartForm(1 << 20); err != nil {
			return err
		}
	default:
		if err := r.ParseForm(); err != nil {
			return err
		}
	}
	for k, vs := range r.Form {
		into[k] = vs
	}
	return nil
}

var (
	telegramTagRE  = regexp.MustCompile(`^<(/?)([a-z-]+)(\s[^<>]*)?>`)
	telegramEntity = regexp.MustCompile(`^&(lt|gt|amp|quot|#[0-9]+|#x[0-9a-fA-F]+);`)
)

// telegramTag reports whether Telegram's HTML parse mode supports the tag.
func telegramTag(name string) bool {
	switch name {
	case "b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "a",
		"code", "pre", "span", "tg-spoiler", "tg-emoji", "blockquote":
		return true
	}
	return false
}

// telegramHTML checks text as Telegram's HTML parse mode does and returns
// what a reader sees.
func telegramHTML(text string) (string, error) {
	var visible strings.Builder
	var open []string
	for i := 0; i < len(text); {
		switch text[i] {
		case '<':
			m := telegramTagRE.FindStringSubmatch(text[i:])
			if m == nil || !telegramTag(m[2]) {
				return "", fmt.Errorf("unsupported start tag or unescaped '<' at byte offset %d", i)
			}
			if m[1] == "" {
				open = append(open, m[2])
			} else if len(open) == 0 || open[len(open)-1] != m[2] {
				return "", fmt.Errorf("can't find start tag for end tag %q at byte offset %d", m[2], i)
			} else {
				open = open[:len(open)-1]
			}
			i += len(m[0])
		case '>':
			return "", fmt.Errorf("unescaped '>' at byte offset %d", i)
		case '&':
			m := telegramEntity.FindString(text[i:])
			if m == "" {
				return "", fmt.Errorf("unescaped '&' at byte offset %d", i)
			}
			visible.WriteString(html.UnescapeString(m))
			i += len(m)
		default:
			visible.WriteByte(text[i])
			i++
		}
	}
	if len(open) > 0 {
		return "", fmt.Errorf("can't find end tag corresponding to start tag %q", open[len(open)-1])
	}
	return visible.String(), nil
}
