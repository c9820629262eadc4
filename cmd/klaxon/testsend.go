package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"time"

	"github.com/klaxonhq/klaxon/internal/channels"
	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/evaluator"
	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/netguard"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/notify/telegram"
	"github.com/klaxonhq/klaxon/internal/rules"
)

const testSendUsage = `Usage: klaxon test-send --project P --rule R [--channel C] [--rules FILE] [--json]

Sends one test message, marked "[TEST]" in its title and with an id
starting "test-", to each enabled channel of rule R of project P (or to
channel C alone), through the worker's own channel code: the same
endpoint checks (KLAXON_ALLOW_PRIVATE_NETWORKS, KLAXON_SLACK_HOSTS, …),
rendering and error classification. The message is made as a firing of
the rule is: the project's name, the rule's description and the event's
link (KLAXON_EVENT_URL) are those a real firing shows. It says how each provider answered,
in words ("Slack says the webhook was revoked or does not exist (404
no_service)"), and whether the worker would retry such a failure. It
bypasses minPeriod and digests, and sends once, without retries.

Rules come from --rules FILE, else KLAXON_RULES_FILE, else MongoDB.

Exit status: 0 every provider accepted the message, 1 one did not, 2 the
command could not run (usage, no such enabled rule or channel, settings).

Flags:
`

// sendResult is one channel's answer to a test message.
type sendResult struct {
	Channel string `json:"channel"`
	OK      bool   `json:"ok"`
	// Answer says in words what the provider answered.
	Answer string `json:"answer"`
	// Retry is whether the worker would try such a failure again.
	Retry bool `json:"retry"`
	// Error is the error as the worker would log it; empty on success.
	Error string `json:"error,omitempty"`
}

type sendReport struct {
	ProjectID string       `json:"projectId"`
	RuleID    string       `json:"ruleId"`
	ID        string       `json:"id"`
	Results   []sendResult `json:"results"`
}

func (a *app) testSend(ctx context.Context, args []string) int {
	const cmd = "test-send"
	run := a.command(cmd, testSendUsage)
	project := run.flags.String("project", "", "project id (required)")
	ruleID := run.flags.String("rule", "", "rule id (required)")
	only := run.flags.String("channel", "", "send to this channel of the rule only: "+strings.Join(rules.ChannelNames[:], ", "))
	rulesFile := run.flags.String("rules", "", "YAML rules file [KLAXON_RULES_FILE, else MongoDB]")
	asJSON := run.flags.Bool("json", false, "print the answers as one JSON object")
	if code, done := run.parse(args); done {
		return code
	}
	if *project == "" || *ruleID == "" {
		return a.usageError(cmd, "--project and --rule are required")
	}
	cfg, rule, code, done := run.rule(ctx, *rulesFile, *project, *ruleID)
	if done {
		return code
	}
	targets := rule.Channels
	if *only != "" {
		i := slices.IndexFunc(targets, func(c rules.Channel) bool { return c.Name == *only })
		if i < 0 {
			var names []string
			for _, c := range rule.Channels {
				names = append(names, c.Name)
			}
			return a.fail(cmd, fmt.Errorf("rule %s has no enabled channel %q (it has: %s)", *ruleID, *only, strings.Join(names, ", ")))
		}
		targets = targets[i : i+1]
	}
	if len(targets) == 0 {
		return a.fail(cmd, fmt.Errorf("rule %s has no enabled channel with an endpoint", *ruleID))
	}
	chans, err := channels.Build(cfg, 1)
	if err != nil {
		return a.fail(cmd, err)
	}

	report := sendReport{ProjectID: rule.ProjectID, RuleID: rule.ID, ID: testID()}
	msg := &notify.Message{ID: report.ID, ProjectID: rule.ProjectID, RuleID: rule.ID,
		Notifications: []notify.Notification{testNotification(rule, report.ID, evaluator.Link{Template: cfg.EventURL, Fallback: cfg.EventURLFallback}, time.Now())}}
	code = exitOK
	for _, c := range targets {
		res := sendResult{Channel: c.Name}
		ch := chans[c.Name]
		if ch == nil {
			res.Answer = "not configured here: set KLAXON_SMTP_ADDR (and the other KLAXON_SMTP_ settings) to send email"
		} else {
			sctx, cancel := context.WithTimeout(ctx, cfg.SendTimeout)
			retry, err := ch.Notify(sctx, c.Endpoint, msg)
			cancel()
			res.OK, res.Retry = err == nil, retry && err != nil
			res.Answer = describe(c.Name, err)
			if err != nil {
				res.Error = err.Error()
			}
		}
		if !res.OK {
			code = exitProblem
		}
		report.Results = append(report.Results, res)
	}

	if *asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(report)
		return code
	}
	fmt.Fprintf(a.stdout, "test message %s for project %s rule %s:\n", report.ID, report.ProjectID, report.RuleID)
	for _, r := range report.Results {
		verdict := "ok"
		switch {
		case r.OK:
		case r.Retry:
			verdict = "FAILED (the worker would retry)"
		default:
			verdict = "FAILED (for good: the worker would not retry)"
		}
		fmt.Fprintf(a.stdout, "  %-8s %s: %s\n", r.Channel, verdict, r.Answer)
	}
	return code
}

// testID is a fresh id for a test message: receivers that de-duplicate by
// id (the webhook's Idempotency-Key) must take every test as new.
func testID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "test-" + hex.EncodeToString(b)
}

// testGroup is the group of a test message's made-up event.
const testGroup = "klaxon-test-send"

// testNotification is a firing of rule as the worker makes it, by the
// evaluator's own builder (evaluator.Notification and Link, as its
// jobs are made): the project's name, the rule's description and the
// event's link (KLAXON_EVENT_URL) are a real firing's; the made-up event
// has no id in Hawk's events database, so a link by {eventId} is the
// fallback's (KLAXON_EVENT_URL_FALLBACK). Only the event is
// made up, marked as a test in the title every channel shows, and a
// threshold rule's windows are shown as just reached.
func testNotification(r *rules.Rule, id string, link evaluator.Link, now time.Time) notify.Notification {
	if !r.OnlyNew && len(r.Windows) == 0 {
		only := *r
		only.OnlyNew = true
		r = &only
	}
	m := event.Message{ProjectID: r.ProjectID, Event: event.Event{
		Title:     "[TEST] Klaxon test message for rule " + r.ID + ": no error happened, nothing to do",
		GroupHash: testGroup, IsNew: r.OnlyNew,
	}}
	ev := counter.Event{ID: id, ProjectID: r.ProjectID, GroupHash: testGroup, Time: now, Rules: []*rules.Rule{r}}
	o := counter.Outcome{Rule: r, Fired: true, ID: id, At: now}
	if !r.OnlyNew {
		for _, w := range r.Windows {
			o.Counts = append(o.Counts, justReached(w))
		}
		for _, w := range r.Windows {
			if sp := w.Spike; sp != nil {
				// The baseline that puts the count at factor × the usual rate.
				o.Counts = append(o.Counts, int64(float64(justReached(w))*float64(sp.Baseline)/(float64(w.Period)*sp.Factor)))
			}
		}
	}
	n := evaluator.Notification(&ev, &m, &o)
	n.Event.URL = link.URL(r.ProjectID, testGroup, "")
	return n
}

// justReached is the least count that fires window w: its threshold, or
// for a spike window factor × floor if more.
func justReached(w rules.Window) int64 {
	if sp := w.Spike; sp != nil {
		return max(w.Threshold, int64(math.Ceil(sp.Factor*float64(sp.Floor))))
	}
	return w.Threshold
}

// providers names who answers for each channel.
var providers = map[string]string{
	rules.Webhook: "The webhook endpoint", rules.Slack: "Slack", rules.Telegram: "Telegram", rules.Email: "The SMTP server",
}

// slackReasons are Slack's incoming-webhook errors in words
// (https://api.slack.com/messaging/webhooks#handling_errors).
var slackReasons = map[string]string{
	"no_service":                        "the webhook was revoked or does not exist",
	"no_service_id":                     "the webhook URL is incomplete",
	"no_team":                           "the workspace does not exist or was deleted",
	"team_disabled":                     "the workspace is disabled",
	"invalid_token":                     "the webhook's token is invalid",
	"channel_not_found":                 "the webhook's channel no longer exists",
	"channel_is_archived":               "the webhook's channel is archived",
	"action_prohibited":                 "an admin restricted posting to the channel",
	"posting_to_general_channel_denied": "only admins may post to the channel",
	"invalid_payload":                   "the message was malformed",
	"invalid_blocks":                    "the message's blocks were refused",
	"no_text":                           "the message was empty",
	"too_many_attachments":              "the message had too many attachments",
}

// telegramReasons are Bot API descriptions in words, by a part of them.
var telegramReasons = []struct{ part, words string }{
	{"chat not found", "the chat does not exist, or the bot was never added to it"},
	{"bot was blocked by the user", "the user blocked the bot"},
	{"bot was kicked", "the bot was removed from the chat"},
	{"bot is not a member", "the bot is not a member of the chat"},
	{"not enough rights", "the bot may not post in the chat"},
	{"Unauthorized", "the bot token (KLAXON_TELEGRAM_TOKEN) is not valid"},
	{"group chat was upgraded", "the group became a supergroup: the rule's endpoint must change"},
	{"Too Many Requests", "the bot sends too fast: it asks to slow down"},
}

// describe says in words how the provider of channel answered a send that
// returned err.
func describe(channel string, err error) string {
	who := providers[channel]
	if err == nil {
		return who + " accepted the test message"
	}
	var refused *netguard.Error
	var herr *notify.HTTPError
	var tg *telegram.APIError
	var smtpReply *textproto.Error
	switch {
	case errors.As(err, &refused):
		return "Klaxon refused the endpoint before sending anything: " + refused.Reason
	case errors.As(err, &tg):
		words := "it refused the message"
		for _, r := range telegramReasons {
			if strings.Contains(tg.Description, r.part) {
				words = r.words
				break
			}
		}
		if tg.MigrateToChatID != 0 {
			words += fmt.Sprintf(" (the chat is now %d)", tg.MigrateToChatID)
		}
		return fmt.Sprintf("Telegram says %s (%d %s)", words, tg.Code, tg.Description)
	case errors.As(err, &herr):
		words, ok := slackReasons[herr.Reason]
		if channel != rules.Slack || !ok {
			words = statusWords(herr.StatusCode)
		}
		reason := herr.Reason
		if reason == "" || reason == notify.RedirectReason {
			reason = http.StatusText(herr.StatusCode)
		}
		answer := strings.TrimSpace(fmt.Sprintf("%d %s", herr.StatusCode, reason))
		if channel == rules.Slack {
			return fmt.Sprintf("Slack says %s (%s)", words, answer)
		}
		return fmt.Sprintf("%s answered that %s (%s)", who, words, answer)
	case errors.As(err, &smtpReply):
		verdict := "refused the message for good"
		if smtpReply.Code/100 == 4 {
			verdict = "deferred the message (try again later)"
		}
		return fmt.Sprintf("%s %s (%d %s)", who, verdict, smtpReply.Code, smtpReply.Msg)
	}
	return fmt.Sprintf("%s could not be reached or did not answer: %v", who, err)
}

// statusWords says what an HTTP status means for a notification.
func statusWords(code int) string {
	switch {
	case code/100 == 3:
		return "the message should go elsewhere: it redirected, and Klaxon follows no redirects"
	case code == 401 || code == 403:
		return "the request is not authorised: the endpoint's token may be wrong or revoked"
	case code == 404:
		return "nothing is there: the URL is wrong or was removed"
	case code == 410:
		return "the endpoint is gone for good"
	case code == 413:
		return "the message is too large"
	case code == 429:
		return "Klaxon sends too fast: it asks to slow down"
	case code >= 500:
		return "it failed on its side"
	}
	return "it refused the message"
}
