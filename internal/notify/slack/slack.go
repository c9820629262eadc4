// Package slack delivers notifications to Slack incoming webhooks as a text
// summary plus Block Kit blocks. github.com/slack-go/slack provides the
// payload types; notify.PostJSON sends them, as it does webhook bodies, so
// the status, Retry-After and the reason in Slack's reply ("no_service")
// are read in one place for every HTTP channel.
package slack

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	slackapi "github.com/slack-go/slack"

	"github.com/klaxonhq/klaxon/internal/netguard"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// Name is the channel's name in rules and errors.
const Name = rules.Slack

// Slack's limits: a payload over them is refused with 400 invalid_blocks,
// which would lose the message for good.
const (
	maxBlocks    = 50
	maxBlockText = 3000
	// Titles are shortened so a single line of a digest stays readable and
	// a block stays under maxBlockText even when escaping grows it.
	maxTitle       = 500
	maxDigestTitle = 200
)

// Notifier posts messages to Slack incoming-webhook URLs (the endpoint,
// which is a secret: errors never contain it). The zero value uses
// http.DefaultClient and takes any host; deadlines come from the context of
// each call.
type Notifier struct {
	// Client makes the requests; for endpoints from rules, a netguard
	// client.
	Client *http.Client
	// Hosts, when not nil, are the patterns an endpoint must match
	// (KLAXON_SLACK_HOSTS); any other fails for good.
	Hosts []netguard.Pattern
}

var _ notify.Channel = (*Notifier)(nil)

// New returns a Notifier using client (nil: http.DefaultClient).
func New(client *http.Client) *Notifier { return &Notifier{Client: client} }

// Notify posts m to the webhook. 5xx, 408, 429 and network errors are worth
// retrying, and a 429's Retry-After is honoured (the error implements
// notify.RetryAfter); other 4xx ("no_service", "channel_is_archived") are
// not.
func (n *Notifier) Notify(ctx context.Context, webhookURL string, m *notify.Message) (retry bool, err error) {
	if err := notify.CheckMessage(m); err != nil {
		return false, err
	}
	if err := netguard.CheckEndpoint(webhookURL, n.Hosts, "KLAXON_SLACK_HOSTS"); err != nil {
		return false, fmt.Errorf("%s: %w", Name, err)
	}
	// PostJSON follows no redirect, classifies the status (Retry-After in
	// either form) and keeps the URL and its token out of errors.
	return notify.PostJSON(ctx, n.Client, Name, webhookURL, nil, payload(m))
}

// payload renders m as an incoming-webhook message. The text (what
// notifications and old clients show) holds the title and, for a
// threshold, the count and period in words; the blocks hold the rest.
func payload(m *notify.Message) *slackapi.WebhookMessage {
	v := notify.Render(m)
	var blocks []slackapi.Block
	switch {
	case m.Grouped:
		blocks = groupedBlocks(v)
	case m.Digest:
		blocks = digestBlocks(v)
	default:
		it := v.Items[0]
		blocks = []slackapi.Block{
			section(code(notify.Truncate(it.Title, maxTitle)) + "\n" + escape(it.Summary) + link(it.URL, " · ")),
			contextBlock(escape(strings.Join(it.Details, "\n"))),
		}
	}
	noUnfurl := false
	return &slackapi.WebhookMessage{
		Text:        text(m, v),
		Blocks:      &slackapi.Blocks{BlockSet: blocks},
		UnfurlLinks: &noUnfurl,
		UnfurlMedia: &noUnfurl,
	}
}

// text is the message's top-level text, which notifications and old clients
// show. Slack renders it as mrkdwn, auto-linking URLs (an incoming webhook
// ignores "parse"), so it is made as safe as the blocks: what comes from
// an event or a rule sits in code spans, shown as typed and never linked;
// the rest is Klaxon's own wording, escaped.
func text(m *notify.Message, v notify.View) string {
	if m.Grouped {
		return code(notify.Truncate(v.Title, notify.SubjectTitle)) + " — " +
			escape(fmt.Sprintf("%d rules fired", len(v.Items)))
	}
	if !m.Digest {
		n := m.Notifications[0]
		return code(notify.Truncate(v.Items[0].Title, notify.SubjectTitle)) + " — " + escape(notify.ShortSummary(n))
	}
	if m.Quiet != nil {
		return escape(notify.RecapSummary(m.Quiet))
	}
	noun := "notifications"
	if len(v.Items) == 1 {
		noun = "notification"
	}
	s := fmt.Sprintf("%d %s for rule %s: %s", len(v.Items), noun, code(m.RuleID),
		code(notify.Truncate(v.Items[0].Title, notify.SubjectTitle)))
	if more := len(v.Items) - 1; more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}

// digestBlocks lists one line per firing, packed into as few sections as
// Slack's limits allow; what does not fit is counted, not dropped silently.
func digestBlocks(v notify.View) []slackapi.Block {
	blocks := []slackapi.Block{section("*" + escape(v.Header) + "*")}
	const room = maxBlocks - 3 // header, "and N more", footer
	var cur strings.Builder
	shown := 0
	for _, it := range v.Items {
		line := fmt.Sprintf("• %s — %s, fired at %s%s",
			code(notify.Truncate(it.Title, maxDigestTitle)), escape(it.Summary), it.FiredAt, link(it.URL, " · "))
		if cur.Len() > 0 && cur.Len()+1+len(line) > maxBlockText {
			if len(blocks) == room {
				break
			}
			blocks = append(blocks, section(cur.String()))
			cur.Reset()
		}
		if cur.Len() > 0 {
			cur.WriteByte('\n')
		}
		cur.WriteString(line)
		shown++
	}
	if cur.Len() > 0 {
		blocks = append(blocks, section(cur.String()))
	}
	if more := v.Limit(shown).More(); more != "" {
		blocks = append(blocks, contextBlock(escape(more)))
	}
	return append(blocks, contextBlock(escape(v.Footer)))
}

// groupedBlocks shows the event once, then each rule's firing as a section
// (the rule and what it saw) and a context block (its details), as many as
// Slack's 50 blocks hold; what does not fit is counted.
func groupedBlocks(v notify.View) []slackapi.Block {
	blocks := []slackapi.Block{
		section("*" + escape(v.Header) + "*"),
		section(code(notify.Truncate(v.Title, maxTitle)) + link(v.URL, " · ")),
	}
	const room = maxBlocks - 2 // "and N more", footer
	shown := 0
	for _, it := range v.Items {
		if len(blocks)+2 > room {
			break
		}
		blocks = append(blocks,
			section("• "+code(notify.Truncate(it.Rule, maxDigestTitle))+" — "+escape(it.Summary)),
			contextBlock(escape(strings.Join(it.Details, "\n"))))
		shown++
	}
	if more := v.Limit(shown).More(); more != "" {
		blocks = append(blocks, contextBlock(escape(more)))
	}
	return append(blocks, contextBlock(escape(v.Footer)))
}

// link is Slack's link to the event after sep, or "" without a URL. The
// URL is Klaxon's (the operator's template, its parts escaped); a | or >
// in it would end the link early, so they are percent-encoded.
func link(url, sep string) string {
	if url == "" {
		return ""
	}
	url = strings.NewReplacer("|", "%7C", ">", "%3E", "<", "%3C").Replace(url)
	return sep + "<" + strings.ReplaceAll(url, "&", "&amp;") + "|" + notify.ViewEvent + ">"
}

func section(text string) slackapi.Block {
	return slackapi.NewSectionBlock(mrkdwn(text), nil, nil)
}

func contextBlock(text string) slackapi.Block {
	return slackapi.NewContextBlock("", mrkdwn(text))
}

// mrkdwn is a text object shown verbatim: no auto-linked URLs or channel
// names taken from event titles.
func mrkdwn(text string) *slackapi.TextBlockObject {
	return slackapi.NewTextBlockObject(slackapi.MarkdownType, notify.Truncate(text, maxBlockText), false, true)
}

// code shows an event title as typed, in an inline code span: mrkdwn has no
// escape for * _ ~ and `, so "__init__" or "*args" in bold text would turn
// into formatting. A code span cannot hold a backtick or a line break: those
// become a look-alike (ˋ) and a space (every line break, as notify.OneLine
// has it).
func code(title string) string {
	return "`" + escape(strings.ReplaceAll(notify.OneLine(title), "`", "ˋ")) + "`"
}

// escape replaces the three characters Slack treats as control characters
// (&, <, >) with HTML entities, as Slack requires, so no <!channel>,
// <!here> or <@U…> mention is left; and it follows every @ with a
// zero-width space (notify.Unmention), so a bare @channel mentions no one
// even where a webhook parses names.
func escape(s string) string {
	s = notify.Unmention(strings.ReplaceAll(s, "&", "&amp;"))
	s = strings.ReplaceAll(s, "<", "&lt;")
	return strings.ReplaceAll(s, ">", "&gt;")
}
