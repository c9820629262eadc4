// Package telegram delivers notifications with the Telegram Bot API's
// sendMessage, through github.com/go-telegram-bot-api/telegram-bot-api/v5,
// as HTML-formatted text; or, to an endpoint that is a URL, the way Hawk
// does: through a hook of CodeX's notify bot (@codex_bot).
package telegram

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"

	tgbotapi "github.com/go-telegram-bot-api/telegram-bot-api/v5"

	"github.com/klaxonhq/klaxon/internal/netguard"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// Name is the channel's name in rules and errors.
const Name = rules.Telegram

// DefaultAPIURL is the Bot API's base URL.
const DefaultAPIURL = "https://api.telegram.org"

// Telegram refuses a text over 4096 characters (UTF-16 code units, after
// entity parsing) with 400, which would lose the message for good.
const (
	maxText  = 4096
	maxTitle = 500
	// maxDetail bounds each line of details: the ids line repeats the
	// event's repetitionId, which has no length limit. With at most 8
	// windows, a single message stays well under maxText.
	maxDetail = 300
)

// Config is what the channel needs from the operator.
type Config struct {
	// Token is the bot's token from @BotFather. It is a secret: it is never
	// logged and never appears in an error. Without one, only hook URLs
	// can be sent to.
	Token string
	// APIURL is the Bot API's base URL; empty means DefaultAPIURL. Method
	// URLs are {APIURL}/bot{Token}/{method}.
	APIURL string
	// Client makes the requests to the Bot API, which the operator
	// configured; nil means http.DefaultClient. Deadlines come from the
	// context of each call.
	Client *http.Client
	// HookClient makes the requests to hook URLs, which come from rules: a
	// netguard client. nil means Client.
	HookClient *http.Client
	// HookHosts, when not nil, are the patterns a hook URL must match
	// (KLAXON_TELEGRAM_HOOK_HOSTS); any other fails for good.
	HookHosts []netguard.Pattern
	// AllowedChats are the chat ids ("-1001234567") and usernames
	// ("@alerts", any case) the bot may post to; empty means any chat the
	// bot is in. With one token shared by every project, any project's rule
	// could otherwise post to any other's chat.
	AllowedChats []string
}

// Notifier sends messages to Telegram chats.
type Notifier struct {
	token      string
	endpoint   string // tgbotapi's format: {api}/bot%s/%s
	apiHost    string // the Bot API's host[:port]
	client     *http.Client
	hookClient *http.Client
	hookHosts  []netguard.Pattern
	allowed    map[string]bool // by chatKey; nil = any chat
}

var _ notify.Channel = (*Notifier)(nil)

// Host is the server a send to endpoint goes through: the Bot API's for a
// chat, "" for a hook URL (its own host).
func (n *Notifier) Host(endpoint string) string {
	if IsHook(endpoint) {
		return ""
	}
	return n.apiHost
}

// New checks cfg and returns a Notifier. It makes no request: tgbotapi's
// constructors call getMe, which would make start-up depend on Telegram, so
// each send builds its own tgbotapi.BotAPI instead.
func New(cfg Config) (*Notifier, error) {
	if strings.ContainsAny(cfg.Token, "/?#% \t\r\n") {
		return nil, errors.New("telegram: token is malformed")
	}
	api := strings.TrimRight(cfg.APIURL, "/")
	if api == "" {
		api = DefaultAPIURL
	}
	if err := notify.CheckURL(Name, api); err != nil {
		return nil, fmt.Errorf("telegram: API URL: %w", err)
	}
	u, err := url.Parse(api)
	if err != nil {
		return nil, fmt.Errorf("telegram: API URL: %w", err)
	}
	client := cfg.Client
	if client == nil {
		client = http.DefaultClient
	}
	hookClient := cfg.HookClient
	if hookClient == nil {
		hookClient = client
	}
	var allowed map[string]bool
	for _, c := range cfg.AllowedChats {
		if c = strings.TrimSpace(c); c != "" {
			if allowed == nil {
				allowed = map[string]bool{}
			}
			allowed[chatKey(c)] = true
		}
	}
	return &Notifier{
		allowed: allowed,
		token:   cfg.Token,
		// A % in the base URL would read as a verb of tgbotapi's format.
		endpoint:   strings.ReplaceAll(api, "%", "%%") + "/bot%s/%s",
		apiHost:    u.Host,
		client:     client,
		hookClient: hookClient,
		hookHosts:  cfg.HookHosts,
	}, nil
}

// Notify sends m to the chat chatID (a numeric id or "@channelusername")
// with sendMessage in HTML parse mode. 429 (honouring retry_after), 5xx and
// network errors are worth retrying; other errors (400 chat not found, 403
// bot blocked) are not.
//
// An endpoint that is an http(s) URL is a hook of CodeX's notify bot, which
// is what Hawk stores for its Telegram rules (https://notify.bot.codex.so/u/
// …): m goes there as Hawk sends it, a form of parse_mode and message.
func (n *Notifier) Notify(ctx context.Context, chatID string, m *notify.Message) (retry bool, err error) {
	if err := notify.CheckMessage(m); err != nil {
		return false, err
	}
	chatID = strings.TrimSpace(chatID)
	if chatID == "" {
		return false, errors.New("telegram: empty chat id")
	}
	if IsHook(chatID) {
		if err := netguard.CheckEndpoint(chatID, n.hookHosts, "KLAXON_TELEGRAM_HOOK_HOSTS"); err != nil {
			return false, fmt.Errorf("%s: %w", Name, err)
		}
		retry, err = notify.PostForm(ctx, n.hookClient, Name, chatID,
			url.Values{"parse_mode": {tgbotapi.ModeHTML}, "message": {Text(m)}})
		return retry, notify.RedactError(err, notify.URLSecrets(chatID)...)
	}
	if n.token == "" {
		return false, errors.New("telegram: no bot token is configured: only hook URLs (Hawk's @codex_bot) can be sent to")
	}
	if n.allowed != nil && !n.allowed[chatKey(chatID)] {
		// The chat id is an endpoint: not repeated here.
		return false, errors.New("telegram: the chat is not one this deployment allows (KLAXON_TELEGRAM_ALLOWED_CHATS)")
	}
	msg := tgbotapi.MessageConfig{
		BaseChat:              tgbotapi.BaseChat{ChannelUsername: chatID},
		Text:                  Text(m),
		ParseMode:             tgbotapi.ModeHTML,
		DisableWebPagePreview: true,
	}
	if id, err := strconv.ParseInt(chatID, 10, 64); err == nil && id != 0 {
		msg.BaseChat = tgbotapi.BaseChat{ChatID: id}
	}
	doer := &contextDoer{ctx: ctx, client: n.client}
	// A BotAPI is a token, an endpoint and a client; building one per send
	// costs nothing and binds the request to ctx, which tgbotapi v5 does not
	// take.
	bot := &tgbotapi.BotAPI{Token: n.token, Client: doer}
	bot.SetAPIEndpoint(n.endpoint)
	// Request, not Send: Send also decodes the sent message, and a decoding
	// hiccup after Telegram accepted it must not cause a duplicate.
	_, err = bot.Request(msg)
	if err == nil {
		return false, nil
	}
	retry, err = classify(err, doer.status)
	return retry, notify.RedactError(err, n.token)
}

// chatKey is how a chat is compared with the allowlist: a numeric id as
// its number ("+42" and "42" are one chat), a username in lower case, as
// Telegram's usernames are case-insensitive.
func chatKey(chat string) string {
	if id, err := strconv.ParseInt(chat, 10, 64); err == nil {
		return strconv.FormatInt(id, 10)
	}
	return strings.ToLower(chat)
}

// classify maps a tgbotapi error to retry-or-not. status is the HTTP status
// of the response, 0 if there was none.
func classify(err error, status int) (bool, error) {
	var apiErr *tgbotapi.Error
	var urlErr *url.Error
	switch {
	// A Bot API error always has an error_code. Without one, the body was
	// some other JSON that decoded into nothing (a gateway's {"message":
	// "Bad Gateway"}): the HTTP status decides below, or a 502 would be
	// taken for a permanent refusal and the message lost.
	case errors.As(err, &apiErr) && apiErr.Code != 0:
		e := &APIError{Code: apiErr.Code, Description: apiErr.Message,
			RetryAfterSeconds: apiErr.RetryAfter, MigrateToChatID: apiErr.MigrateToChatID}
		if !notify.RetryableStatus(apiErr.Code) {
			return false, e
		}
		return true, notify.WithRetryAfter(e, time.Duration(apiErr.RetryAfter)*time.Second)
	case errors.As(err, &urlErr):
		return notify.TransportError(Name, err)
	case status != 0:
		// The body was not the Bot API's JSON: a proxy's error page.
		herr := &notify.HTTPError{Channel: Name, StatusCode: status, Reason: "response is not Bot API JSON"}
		if status/100 == 2 {
			// Telegram may well have sent it; a retry risks a repeat with
			// the same id, which beats losing the message.
			return true, fmt.Errorf("telegram: decode response: %w", err)
		}
		return notify.RetryableStatus(status), herr
	default:
		return true, fmt.Errorf("telegram: %w", err)
	}
}

// IsHook reports whether a rule's telegram endpoint is a notify-bot hook URL
// rather than a chat id.
func IsHook(endpoint string) bool {
	e := strings.ToLower(strings.TrimSpace(endpoint))
	return strings.HasPrefix(e, "https://") || strings.HasPrefix(e, "http://")
}

// APIError is an error answer of the Bot API.
type APIError struct {
	Code        int    // error_code, the HTTP status
	Description string // "Bad Request: chat not found"
	// RetryAfterSeconds is parameters.retry_after of a 429.
	RetryAfterSeconds int
	// MigrateToChatID is set when a group became a supergroup: the rule's
	// endpoint must change to it.
	MigrateToChatID int64
}

func (e *APIError) Error() string {
	s := fmt.Sprintf("telegram: error %d: %s", e.Code, e.Description)
	if e.MigrateToChatID != 0 {
		s += fmt.Sprintf(" (the chat is now %d: change the endpoint)", e.MigrateToChatID)
	}
	return s
}

// contextDoer binds tgbotapi's requests to a context and remembers the last
// response's status, which tgbotapi ignores.
type contextDoer struct {
	ctx    context.Context
	client *http.Client
	status int
}

func (d *contextDoer) Do(req *http.Request) (*http.Response, error) {
	req = req.WithContext(d.ctx)
	req.Header.Set("User-Agent", notify.UserAgent)
	resp, err := d.client.Do(req)
	if err == nil {
		d.status = resp.StatusCode
	}
	return resp, err
}

// Text renders m in Telegram's HTML parse mode: the title in bold, then the
// summary and details; for a digest the header and one line per firing,
// as many as fit in one message, then how many more there were.
func Text(m *notify.Message) string {
	v := notify.Render(m)
	if m.Grouped {
		return groupedText(v)
	}
	if !m.Digest {
		it := v.Items[0]
		lines := []string{"<b>" + escape(notify.Truncate(it.Title, maxTitle)) + "</b>", escape(it.Summary) + link(it.URL, " · "), ""}
		for _, d := range it.Details {
			lines = append(lines, escape(notify.Truncate(d, maxDetail)))
		}
		return strings.Join(lines, "\n")
	}
	var b strings.Builder
	b.WriteString("<b>" + escape(v.Header) + "</b>\n")
	footer := "\n" + escape(v.Footer)
	shown := v.Fit(&b, maxText, footer, utf16Len, func(it notify.Item) string {
		return fmt.Sprintf("\n• <b>%s</b> — %s, fired at %s%s",
			escape(notify.Truncate(it.Title, 200)), escape(it.Summary), it.FiredAt, link(it.URL, " · "))
	})
	if more := shown.More(); more != "" {
		b.WriteString("\n" + escape(more))
	}
	b.WriteString("\n" + footer)
	return b.String()
}

// groupedText shows the event once, then each rule's firing with its
// details, as many as fit in one message, then how many more there were.
func groupedText(v notify.View) string {
	var b strings.Builder
	b.WriteString("<b>" + escape(v.Header) + "</b>\n\n<b>" + escape(notify.Truncate(v.Title, maxTitle)) + "</b>" + link(v.URL, " · ") + "\n")
	footer := "\n" + escape(v.Footer)
	shown := v.Fit(&b, maxText, footer, utf16Len, func(it notify.Item) string {
		part := "\n• <b>" + escape(notify.Truncate(it.Rule, 200)) + "</b> — " + escape(it.Summary)
		for _, d := range it.Details {
			part += "\n" + escape(notify.Truncate(d, maxDetail))
		}
		return part + "\n"
	})
	if more := shown.More(); more != "" {
		b.WriteString("\n" + escape(more) + "\n")
	}
	b.WriteString(footer)
	return b.String()
}

// link is an HTML link to the event after sep, or "" without a URL.
func link(url, sep string) string {
	if url == "" {
		return ""
	}
	return sep + `<a href="` + strings.ReplaceAll(html(url), `"`, "&quot;") + `">` + notify.ViewEvent + "</a>"
}

// escape makes s literal text in Telegram's HTML parse mode (html), in
// which no @username notifies anyone (notify.Unmention).
func escape(s string) string { return notify.Unmention(html(s)) }

// html escapes <, > and &, the characters Telegram's HTML parse mode
// reserves.
func html(s string) string {
	s = strings.ReplaceAll(s, "&", "&amp;")
	s = strings.ReplaceAll(s, "<", "&lt;")
	return strings.ReplaceAll(s, ">", "&gt;")
}

func utf16Len(s string) int { return len(utf16.Encode([]rune(s))) }
