// Package loop delivers notifications to Loop (loop.ru), the messenger
// Hawk's "loop" channel posts to. Loop is built on Mattermost, and Hawk
// sends to it as to a Slack incoming webhook (hawk.workers' Loop worker uses
// @slack/webhook): a JSON POST of {"username": "Hawk", "text": markdown} to
// the rule's endpoint. Klaxon sends the same, so a migrated rule keeps its
// endpoint and its channel sees the same sender.
package loop

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/klaxonhq/klaxon/internal/netguard"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// Name is the channel's name in rules and errors.
const Name = rules.Loop

// Username is who the messages come from, as Hawk names its posts.
const Username = "Hawk"

// Loop's (Mattermost's) limits: a post holds at most 16383 characters.
// Titles are shortened so one line of a digest stays readable.
const (
	maxText        = 16383
	maxTitle       = 500
	maxDigestTitle = 200
	maxDetail      = 300
)

// Payload is the body of an incoming-webhook post.
type Payload struct {
	Username string `json:"username"`
	Text     string `json:"text"`
}

// Notifier posts messages to Loop incoming-webhook URLs (the endpoint, a
// secret: errors never contain it). The zero value uses http.DefaultClient
// and takes any host; deadlines come from the context of each call.
type Notifier struct {
	// Client makes the requests; for endpoints from rules, a netguard
	// client.
	Client *http.Client
	// Hosts, when not nil, are the patterns an endpoint must match
	// (KLAXON_LOOP_HOSTS); any other fails for good.
	Hosts []netguard.Pattern
}

var _ notify.Channel = (*Notifier)(nil)

// Notify posts m to the webhook. 5xx, 408, 429 (honouring Retry-After) and
// network errors are worth retrying; other 4xx (a removed webhook) are not.
func (n *Notifier) Notify(ctx context.Context, webhookURL string, m *notify.Message) (retry bool, err error) {
	if err := notify.CheckMessage(m); err != nil {
		return false, err
	}
	if err := notify.CheckURL(Name, webhookURL); err != nil {
		return false, err
	}
	if err := netguard.CheckEndpoint(webhookURL, n.Hosts, "KLAXON_LOOP_HOSTS"); err != nil {
		return false, fmt.Errorf("%s: %w", Name, err)
	}
	return notify.PostJSON(ctx, n.Client, Name, webhookURL, nil, Payload{Username: Username, Text: Text(m)})
}

// Text renders m as Loop markdown. What comes from an event or a rule sits
// in code (a span for a title, a fenced block for the details), where
// Mattermost shows it as typed: no formatting, no link; Klaxon's own
// wording is escaped. Nothing mentions anyone, in code (quiet) or in
// escaped text.
//
// A single notification:
//
//	`TypeError: x is undefined`
//	150 events in the last 1 minute (threshold 100)
//	```
//	1 minute window: 150 of 100 events (fired), resets at …
//	…
//	```
//
// A digest: its header in bold, one line per firing (as many as fit in a
// post, then how many more there were), and its footer.
func Text(m *notify.Message) string {
	v := notify.Render(m)
	if m.Grouped {
		return groupedText(v)
	}
	if !m.Digest {
		it := v.Items[0]
		return code(notify.Truncate(it.Title, maxTitle)) + "\n" + escape(it.Summary) + link(it.URL, " · ") + "\n" + fence(details(it))
	}
	var b strings.Builder
	b.WriteString("**" + escape(v.Header) + "**\n")
	footer := "\n" + escape(v.Footer)
	shown := v.Fit(&b, maxText, footer, utf8.RuneCountInString, func(it notify.Item) string {
		return fmt.Sprintf("\n- %s — %s, fired at %s%s",
			code(notify.Truncate(it.Title, maxDigestTitle)), escape(it.Summary), it.FiredAt, link(it.URL, " · "))
	})
	if more := shown.More(); more != "" {
		b.WriteString("\n\n" + escape(more))
	}
	b.WriteString("\n" + footer)
	return b.String()
}

// groupedText shows the event once, then each rule's firing: the rule and
// what it saw, and its details in a code block; as many as fit in a post,
// then how many more there were.
func groupedText(v notify.View) string {
	var b strings.Builder
	b.WriteString("**" + escape(v.Header) + "**\n" + code(notify.Truncate(v.Title, maxTitle)) + link(v.URL, " · ") + "\n")
	footer := "\n" + escape(v.Footer)
	shown := v.Fit(&b, maxText, footer, utf8.RuneCountInString, func(it notify.Item) string {
		return "\n- " + code(notify.Truncate(it.Rule, maxDigestTitle)) + " — " + escape(it.Summary) + "\n" + fence(details(it))
	})
	if more := shown.More(); more != "" {
		b.WriteString("\n\n" + escape(more))
	}
	b.WriteString("\n" + footer)
	return b.String()
}

// details are its details, each cut to maxDetail.
func details(it notify.Item) []string {
	out := make([]string, len(it.Details))
	for i, d := range it.Details {
		out[i] = notify.Truncate(d, maxDetail)
	}
	return out
}

// link is a markdown link to the event after sep, or "" without a URL.
// The URL is Klaxon's (the operator's template, its parts escaped); what
// would end a markdown link destination is percent-encoded.
func link(url, sep string) string {
	if url == "" {
		return ""
	}
	url = strings.NewReplacer("(", "%28", ")", "%29", " ", "%20", "<", "%3C", ">", "%3E").Replace(url)
	return sep + "[" + notify.ViewEvent + "](" + url + ")"
}

// code shows s as typed in an inline code span. A span cannot hold a
// backtick or a line break: those become a look-alike (ˋ) and a space
// (every line break, as notify.OneLine has it). Nothing in it mentions
// anyone (quiet).
func code(s string) string {
	return "`" + quiet(strings.ReplaceAll(notify.OneLine(s), "`", "ˋ")) + "`"
}

// quiet keeps text in code from mentioning anyone. Mattermost reads an
// incoming webhook's text as Slack's before anything else, code included:
// it turns <!channel>, <!here> and <!all> into @channel, @here and @all,
// and <@id> into @name, the user's. A zero-width space after every "<!"
// and every @ (notify.Unmention) leaves nothing for it to turn, nor a
// mention for its parser to find, whether or not it skips code; the text
// reads the same.
func quiet(s string) string {
	return notify.Unmention(strings.ReplaceAll(s, "<!", "<\u200B!"))
}

// fence shows lines as typed in a fenced code block; a backtick becomes a
// look-alike, so no line can close the fence, and no @ mentions anyone.
func fence(lines []string) string {
	r := strings.NewReplacer("`", "ˋ")
	var b strings.Builder
	b.WriteString("```\n")
	for _, l := range lines {
		b.WriteString(quiet(r.Replace(notify.OneLine(l))) + "\n")
	}
	b.WriteString("```")
	return b.String()
}

// escape makes s literal markdown text: every character Mattermost's
// markdown gives a meaning inside a line is backslash-escaped, and an @
// is followed by a zero-width space (notify.Unmention): a backslash does
// not stop Mattermost from reading "\\@channel" in a project name as a
// mention of the whole channel. (With < and ! escaped, no <!channel> is
// left for Mattermost to turn into @channel.)
func escape(s string) string {
	s = notify.Unmention(s)
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune("\\`*_~[]()<>|#!", r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
