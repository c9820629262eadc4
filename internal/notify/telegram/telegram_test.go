package telegram_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/netguard"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
	"github.com/klaxonhq/klaxon/internal/notify/telegram"
)

const (
	token      = "123456789:AAF-s3cr3t-t0ken_xyz"
	nastyTitle = notifytest.NastyTitle
)

var firedAt = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func threshold(id, title string) notify.Notification { return notifytest.Threshold(id, title, firedAt) }

func single(n notify.Notification) *notify.Message { return notifytest.Single(n) }

func newNotifier(t *testing.T, apiURL string) *telegram.Notifier {
	t.Helper()
	n, err := telegram.New(telegram.Config{Token: token, APIURL: apiURL})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func onlyRequest(t *testing.T, srv *notifytest.TelegramServer) notifytest.TelegramRequest {
	t.Helper()
	reqs := srv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("Telegram got %d requests, want 1", len(reqs))
	}
	return reqs[0]
}

func TestNewMakesNoRequest(t *testing.T) {
	srv := notifytest.NewTelegramServer(t, token)
	newNotifier(t, srv.URL)
	if reqs := srv.Requests(); len(reqs) != 0 {
		t.Errorf("New made %d requests (e.g. getMe), want none", len(reqs))
	}
	// Nor does it need the API to be up.
	if _, err := telegram.New(telegram.Config{Token: token, APIURL: "http://" + closedAddr(t)}); err != nil {
		t.Errorf("New with the API down: %v", err)
	}
}

func TestNewChecksConfig(t *testing.T) {
	for _, cfg := range []telegram.Config{
		{Token: "12/34"},
		{Token: token, APIURL: "api.telegram.org"},
	} {
		if _, err := telegram.New(cfg); err == nil {
			t.Errorf("New(%+v) = nil error", cfg)
		} else if cfg.Token != "" && strings.Contains(err.Error(), cfg.Token) {
			t.Errorf("error %q contains the token", err)
		}
	}
}

func TestSendMessage(t *testing.T) {
	srv := notifytest.NewTelegramServer(t, token)
	if retry, err := newNotifier(t, srv.URL).Notify(context.Background(), "-1001234567890", single(threshold("n-1", "TypeError: x is undefined"))); err != nil {
		t.Fatalf("Notify = %t, %v", retry, err)
	}
	r := onlyRequest(t, srv)
	if r.Method != "sendMessage" || r.Status != http.StatusOK || r.ChatID != "-1001234567890" || r.ParseMode != "HTML" {
		t.Fatalf("request %+v", r)
	}
	if !strings.HasPrefix(r.Text, "<b>TypeError: x is undefined</b>\n") {
		t.Errorf("text %q does not start with the bold title", r.Text)
	}
	for _, want := range []string{"150 events in the last 1 minute (threshold 100)", "1 minute window: 150 of 100 events (fired)", "Notification id n-1"} {
		if !strings.Contains(r.Visible, want) {
			t.Errorf("text lacks %q:\n%s", want, r.Visible)
		}
	}
}

func TestChannelUsername(t *testing.T) {
	srv := notifytest.NewTelegramServer(t, token)
	if _, err := newNotifier(t, srv.URL).Notify(context.Background(), "@klaxon_alerts", single(threshold("n-1", "A"))); err != nil {
		t.Fatal(err)
	}
	if r := onlyRequest(t, srv); r.ChatID != "@klaxon_alerts" {
		t.Errorf("chat_id = %q", r.ChatID)
	}
}

func TestEscapesTitle(t *testing.T) {
	srv := notifytest.NewTelegramServer(t, token)
	// The fake refuses text that is not valid Telegram HTML, as Telegram does.
	if retry, err := newNotifier(t, srv.URL).Notify(context.Background(), "42", single(threshold("n-1", nastyTitle))); err != nil {
		t.Fatalf("Notify = %t, %v", retry, err)
	}
	r := onlyRequest(t, srv)
	if !strings.Contains(r.Text, "<b>&lt;b&gt;&amp;*_[x]</b>") {
		t.Errorf("text %q lacks the escaped title", r.Text)
	}
	if !strings.HasPrefix(r.Visible, nastyTitle+"\n") {
		t.Errorf("reader sees %q, want the title verbatim first", r.Visible)
	}
}

func TestDigest(t *testing.T) {
	// A digest the deliverer bounded counts what it left out (omitted)
	// with what does not fit the message.
	for _, tc := range []struct{ n, omitted int }{{3, 0}, {1000, 0}, {3, 7}} {
		n := tc.n
		srv := notifytest.NewTelegramServer(t, token)
		m := &notify.Message{ID: "d-1", ProjectID: "p", RuleID: "r", Digest: true, Omitted: int64(tc.omitted)}
		for i := range n {
			m.Notifications = append(m.Notifications, threshold(fmt.Sprint("n-", i), fmt.Sprintf("Error <%d> & more", i)))
		}
		if retry, err := newNotifier(t, srv.URL).Notify(context.Background(), "42", m); err != nil {
			t.Fatalf("%d: Notify = %t, %v (the fake enforces the 4096-character limit)", n, retry, err)
		}
		v := onlyRequest(t, srv).Visible
		if !strings.HasPrefix(v, fmt.Sprintf("%d notifications for rule r in project p\n", n+tc.omitted)) || !strings.HasSuffix(v, "Digest id d-1") {
			t.Errorf("%d: digest reads\n%s", n, v)
		}
		shown := strings.Count(v, "\n• Error <")
		more := 0
		if i := strings.Index(v, "… and "); i >= 0 {
			fmt.Sscanf(v[i:], "… and %d more", &more)
		}
		if shown+more != n+tc.omitted || shown == 0 {
			t.Errorf("%d: shown %d + more %d", n, shown, more)
		}
	}
}

func TestRetryClassification(t *testing.T) {
	for _, tc := range []struct {
		name       string
		failure    notifytest.Failure
		retry      bool
		retryAfter time.Duration
	}{
		{"429 retry_after", notifytest.Failure{Status: 429, RetryAfter: 7 * time.Second}, true, 7 * time.Second},
		{"500", notifytest.Failure{Status: 500, Body: "Internal Server Error"}, true, 0},
		{"502 from a proxy", notifytest.Failure{Status: 502, Body: "<html>Bad Gateway</html>", Raw: true}, true, 0},
		{"400 chat not found", notifytest.Failure{Status: 400, Body: "Bad Request: chat not found"}, false, 0},
		{"403 blocked", notifytest.Failure{Status: 403, Body: "Forbidden: bot was blocked by the user"}, false, 0},
		{"404 from a proxy", notifytest.Failure{Status: 404, Body: "not here", Raw: true}, false, 0},
		// Gateways often answer in JSON of their own: it decodes, but is not
		// a Bot API error and says nothing about the message.
		{"502 from a proxy, JSON", notifytest.Failure{Status: 502, Body: `{"message":"Bad Gateway"}`, Raw: true}, true, 0},
		{"503 from a proxy, JSON", notifytest.Failure{Status: 503, Body: `{"error":"upstream unavailable"}`, Raw: true}, true, 0},
		{"400 from a proxy, JSON", notifytest.Failure{Status: 400, Body: `{"error":"bad request"}`, Raw: true}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := notifytest.NewTelegramServer(t, token)
			srv.Fail(tc.failure)
			retry, err := newNotifier(t, srv.URL).Notify(context.Background(), "42", single(threshold("n-1", "A")))
			if err == nil || retry != tc.retry {
				t.Fatalf("Notify = %t, %v; want retry %t and an error", retry, err, tc.retry)
			}
			var ra notify.RetryAfter
			if has := errors.As(err, &ra); has != (tc.retryAfter > 0) || has && ra.RetryAfter() != tc.retryAfter {
				t.Errorf("error %v: want RetryAfter %s", err, tc.retryAfter)
			}
			if !tc.failure.Raw && !strings.Contains(err.Error(), tc.failure.Body) {
				t.Errorf("error %q lacks Telegram's description", err)
			}
			if strings.Contains(err.Error(), token) {
				t.Errorf("error %q contains the token", err)
			}
		})
	}
}

func TestWrongTokenIsPermanent(t *testing.T) {
	srv := notifytest.NewTelegramServer(t, "987:other")
	retry, err := newNotifier(t, srv.URL).Notify(context.Background(), "42", single(threshold("n-1", "A")))
	var apiErr *telegram.APIError
	if err == nil || retry || !errors.As(err, &apiErr) || apiErr.Code != 401 || strings.Contains(err.Error(), token) {
		t.Errorf("Notify = %t, %v; want a permanent 401 without the token", retry, err)
	}
}

func TestConnectionRefused(t *testing.T) {
	retry, err := newNotifier(t, "http://"+closedAddr(t)).Notify(context.Background(), "42", single(threshold("n-1", "A")))
	if err == nil || !retry {
		t.Fatalf("Notify = %t, %v; want a retryable error", retry, err)
	}
	if strings.Contains(err.Error(), token) || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("error %q contains the token", err)
	}
}

func TestTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	retry, err := newNotifier(t, srv.URL).Notify(ctx, "42", single(threshold("n-1", "A")))
	if !retry || !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), token) {
		t.Errorf("Notify = %t, %v; want a retryable deadline error without the token", retry, err)
	}
}

func TestMigratedChatSaysWhere(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"ok":false,"error_code":400,"description":"Bad Request: group chat was upgraded to a supergroup chat","parameters":{"migrate_to_chat_id":-1009876}}`)
	}))
	t.Cleanup(srv.Close)
	retry, err := newNotifier(t, srv.URL).Notify(context.Background(), "-42", single(threshold("n-1", "A")))
	if err == nil || retry || !strings.Contains(err.Error(), "-1009876") {
		t.Errorf("Notify = %t, %v; want a permanent error naming the new chat id", retry, err)
	}
}

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

// Telegram refuses a text over 4096 characters for good: a long
// repetitionId, which comes from the event as is, must not make the
// message too long and lose it.
func TestLongDetailsFit(t *testing.T) {
	srv := notifytest.NewTelegramServer(t, token)
	n := threshold("n-1", strings.Repeat("T", 2000))
	rep := strings.Repeat("r", 5000)
	n.Event.RepetitionID = &rep
	if retry, err := newNotifier(t, srv.URL).Notify(context.Background(), "42", single(n)); err != nil {
		t.Fatalf("Notify = %t, %v (the fake enforces the 4096-character limit)", retry, err)
	}
	if v := onlyRequest(t, srv).Visible; !strings.Contains(v, "Notification id n-1") || !strings.Contains(v, "repetition rrrr") {
		t.Errorf("text lacks the ids:\n%s", v)
	}

	// Every @ grows by a zero-width space (no mention): a message of them
	// fits still.
	srv = notifytest.NewTelegramServer(t, token)
	ats := strings.Repeat("@", 5000)
	n = threshold("n-2", ats)
	n.ProjectName, n.RuleDescription, n.Event.GroupHash, n.Event.RepetitionID = ats, ats, ats[:200], &ats
	n.History = &notify.History{TotalCount: 2, TopFrame: ats}
	if retry, err := newNotifier(t, srv.URL).Notify(context.Background(), "42", single(n)); err != nil {
		t.Fatalf("Notify = %t, %v (the fake enforces the 4096-character limit)", retry, err)
	}
}

// codexHook is CodeX's notify bot as Hawk uses it: a hook URL per chat that
// takes a form of parse_mode and message.
type codexHook struct {
	mu     sync.Mutex
	forms  []url.Values
	status int // answered, 200 when 0
}

func (h *codexHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/x-www-form-urlencoded" {
		http.Error(w, "want a form POST", http.StatusBadRequest)
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	h.forms = append(h.forms, r.PostForm)
	status := h.status
	h.mu.Unlock()
	if status != 0 {
		// Echo the path, as servers do: the hook's secret must not leak.
		http.Error(w, "cannot deliver to "+r.URL.Path, status)
		return
	}
	fmt.Fprint(w, "OK")
}

// Hawk's telegram endpoints are hooks of CodeX's notify bot: the message
// goes there as Hawk sends it, with no bot token needed; a chat id without a
// token fails for good, saying why.
func TestHawkHookEndpoint(t *testing.T) {
	hook := &codexHook{}
	srv := httptest.NewServer(hook)
	t.Cleanup(srv.Close)
	endpoint := srv.URL + "/u/S3CR3THOOK"
	n, err := telegram.New(telegram.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if retry, err := n.Notify(context.Background(), endpoint, single(threshold("n-1", nastyTitle))); err != nil {
		t.Fatalf("Notify = %t, %v", retry, err)
	}
	if len(hook.forms) != 1 {
		t.Fatalf("hook got %d messages, want 1", len(hook.forms))
	}
	form := hook.forms[0]
	if form.Get("parse_mode") != "HTML" || !strings.HasPrefix(form.Get("message"), "<b>&lt;b&gt;&amp;*_[x]</b>\n") {
		t.Errorf("form %v: want parse_mode HTML and the message with the escaped title first", form)
	}

	for status, wantRetry := range map[int]bool{http.StatusBadGateway: true, http.StatusNotFound: false} {
		hook.mu.Lock()
		hook.status = status
		hook.mu.Unlock()
		retry, err := n.Notify(context.Background(), endpoint, single(threshold("n-2", "t")))
		if err == nil || retry != wantRetry || strings.Contains(err.Error(), "S3CR3THOOK") {
			t.Errorf("hook answering %d: retry %t, err %v; want retry %t and no secret", status, retry, err, wantRetry)
		}
	}

	retry, err := n.Notify(context.Background(), "-1001234567890", single(threshold("n-3", "t")))
	if err == nil || retry || !strings.Contains(err.Error(), "no bot token") {
		t.Errorf("a chat id without a token: retry %t, err %v; want a permanent error saying so", retry, err)
	}
}

// Hook URLs come from rules: only the notify bot's hosts are taken, through
// the hook client (a netguard client), while the Bot API, which the
// operator configured, is reached with the trusted client even on
// loopback.
func TestHookHostsAndClient(t *testing.T) {
	hook := &codexHook{}
	hookSrv := httptest.NewServer(hook)
	t.Cleanup(hookSrv.Close)
	api := notifytest.NewTelegramServer(t, token)
	codex, _ := netguard.ParsePatterns("notify.bot.codex.so")
	n, err := telegram.New(telegram.Config{Token: token, APIURL: api.URL, HookHosts: codex,
		HookClient: netguard.Policy{}.Client(netguard.ClientOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	endpoint := hookSrv.URL + "/u/S3CR3THOOK"
	retry, err := n.Notify(context.Background(), endpoint, single(threshold("n-1", "t")))
	if retry || !netguard.IsRefused(err) || !strings.Contains(err.Error(), "KLAXON_TELEGRAM_HOOK_HOSTS") ||
		strings.Contains(err.Error(), "S3CR3THOOK") {
		t.Errorf("hook on another host: retry %t, err %v; want a permanent refusal naming the setting", retry, err)
	}
	local, _ := netguard.ParsePatterns("127.0.0.1/u/")
	n, err = telegram.New(telegram.Config{Token: token, APIURL: api.URL, HookHosts: local,
		HookClient: netguard.Policy{}.Client(netguard.ClientOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	retry, err = n.Notify(context.Background(), endpoint, single(threshold("n-2", "t")))
	if retry || !netguard.IsRefused(err) || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("hook on loopback: retry %t, err %v; want a permanent refusal", retry, err)
	}
	if len(hook.forms) != 0 {
		t.Errorf("the hook got %d messages", len(hook.forms))
	}
	if _, err := n.Notify(context.Background(), "-1001234", single(threshold("n-3", "t"))); err != nil {
		t.Errorf("chat id through the Bot API on loopback: %v", err)
	}
	onlyRequest(t, api)
}

// With one bot token shared by every project, any project's rule could
// post to any chat the bot is in. The deployment's allowlist refuses other
// chats for good, before any request, with a reason that says so and does
// not repeat the chat.
func TestChatAllowlist(t *testing.T) {
	srv := notifytest.NewTelegramServer(t, token)
	n, err := telegram.New(telegram.Config{Token: token, APIURL: srv.URL, AllowedChats: []string{"-1001234567", " @Alerts_Team "}})
	if err != nil {
		t.Fatal(err)
	}
	for _, chat := range []string{"-1001234567", "@alerts_team", "@ALERTS_TEAM"} {
		if retry, err := n.Notify(context.Background(), chat, single(threshold("n-1", "A"))); err != nil {
			t.Errorf("allowed chat %s: Notify = %t, %v", chat, retry, err)
		}
	}
	for _, chat := range []string{"-1009999999", "@other_team", "1234567"} {
		retry, err := n.Notify(context.Background(), chat, single(threshold("n-2", "A")))
		if err == nil || retry || !strings.Contains(err.Error(), "KLAXON_TELEGRAM_ALLOWED_CHATS") || strings.Contains(err.Error(), chat) {
			t.Errorf("chat %s outside the allowlist: Notify = %t, %v; want a permanent error naming the setting, not the chat", chat, retry, err)
		}
	}
	var sent []string
	for _, r := range srv.Requests() {
		sent = append(sent, r.ChatID)
	}
	if len(sent) != 3 || sent[0] != "-1001234567" {
		t.Errorf("Telegram got sendMessage for chats %q, want the 3 allowed only", sent)
	}

	// Without an allowlist, any chat the bot is in.
	if _, err := newNotifier(t, srv.URL).Notify(context.Background(), "-1009999999", single(threshold("n-3", "A"))); err != nil {
		t.Errorf("no allowlist: %v", err)
	}
}

// A grouped message names every rule with what it saw, the event once.
func TestGroupedNamesEveryRule(t *testing.T) {
	srv := notifytest.NewTelegramServer(t, token)
	if _, err := newNotifier(t, srv.URL).Notify(context.Background(), "-100123", notifytest.Grouped("TypeError: x", firedAt)); err != nil {
		t.Fatal(err)
	}
	r := onlyRequest(t, srv)
	for _, want := range []string{"3 rules fired for one event in project Shop", "100 events in 1 minute — 150 events in the last 1 minute",
		"new errors — New event", "Rule 64ab00000000000000000003 — ", "Notification id n-c", "Message id group-1"} {
		if !strings.Contains(r.Visible, want) {
			t.Errorf("text lacks %q:\n%s", want, r.Visible)
		}
	}
	if strings.Count(r.Visible, "TypeError: x") != 1 {
		t.Errorf("the event's title is not shown once:\n%s", r.Visible)
	}
}

// Nothing from an event or a rule can mention anyone: Telegram notifies
// the member of a group an @username names. Nor can it start a line with
// U+2028. The text stays valid Telegram HTML (the fake checks it).
func TestUserTextMentionsNoOne(t *testing.T) {
	for _, m := range notifytest.Hostile(firedAt) {
		srv := notifytest.NewTelegramServer(t, token)
		if _, err := newNotifier(t, srv.URL).Notify(t.Context(), "-100123", m); err != nil {
			t.Fatal(err)
		}
		r := onlyRequest(t, srv)
		if bad := notifytest.Inert(r.Text); bad != nil {
			t.Errorf("message %s: %q in\n%s", m.ID, bad, r.Text)
		}
	}
}
