package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/mail"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/deliverer"
	"github.com/klaxonhq/klaxon/internal/notify/telegram"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/seal"
	"github.com/klaxonhq/klaxon/internal/suggest"
	"github.com/klaxonhq/klaxon/internal/wire"
)

const failedUsage = `Usage:
  klaxon failed list [--json]
  klaxon failed show ID [--json]
  klaxon failed replay (ID... | --all) [--json]

The failed queue, <KLAXON_PREFIX>.failed, holds the notifications that
failed for good: a permanent refusal (a 4xx, an endpoint the endpoint guard
refused, a channel not configured) or every retry spent. Nothing consumes
it; these commands read it without taking anything out.

"list" shows each message: its ID, when it failed, the project, rule,
channel, attempts made and the reason (its x-klaxon-error header). The
endpoint is never shown: only its host, or "sealed" (KLAXON_ENDPOINT_KEY).
"show" prints one message with the firings it carried.

"replay" publishes each named message (or all of them) to the delivery
queue again, with a fresh count of attempts: the worker sends it once more,
on the rule's channel, as it was. A firing recorded as failed is done for
the worker, so replay first clears that record in Redis; a firing recorded
any other way (sent by an earlier replay) keeps its record, and replaying
it again sends nothing: one replay sends a failed firing once, however
often it is repeated. The message leaves the failed queue only once the broker has
confirmed the replay. Fix the cause first (the endpoint, the provider,
KLAXON_ALLOW_PRIVATE_NETWORKS, ...): a replay that fails again comes back.
Digests and snooze summaries are not replayed: "show" lists their firings.

While a command runs, the messages it read are held from other readers of
the failed queue; on a quorum queue each reading counts as a delivery.

Exit status: 0 done, 1 an ID was not found or a replay failed, 2 the
command could not run.

Flags:
`

// failedMessage is a message of the failed queue as the tool shows it.
type failedMessage struct {
	ID       string    `json:"id"`
	Kind     string    `json:"kind"`
	FailedAt time.Time `json:"failedAt,omitzero"`
	// Project is the project's name, else its id.
	ProjectID   string `json:"projectId"`
	ProjectName string `json:"projectName,omitempty"`
	RuleID      string `json:"ruleId,omitempty"`
	Channel     string `json:"channel"`
	Attempts    int    `json:"attempts"`
	// Host is where the endpoint points, never the endpoint itself.
	Host   string `json:"host"`
	Reason string `json:"reason"`
	// Firings are the firings the message carried (show only).
	Firings []failedFiring `json:"firings,omitempty"`

	tag    uint64
	failed deliverer.Failed
}

type failedFiring struct {
	ID      string    `json:"id"`
	Type    string    `json:"type"`
	RuleID  string    `json:"ruleId"`
	Title   string    `json:"title"`
	Count   int64     `json:"count"`
	FiredAt time.Time `json:"firedAt"`
}

func (a *app) failed(ctx context.Context, args []string) int {
	switch {
	case len(args) == 0:
		fmt.Fprintln(a.stderr, "klaxon failed: want a subcommand: list, show or replay; run 'klaxon failed --help'")
		return exitUsage
	case isHelp(args[0]):
		fmt.Fprint(a.stdout, failedUsage+"  --all\n    \treplay: every message of the failed queue\n  --json\n    \tprint JSON\n")
		return exitOK
	}
	sub, args := args[0], args[1:]
	cmd := "failed " + sub
	run := a.command(cmd, failedUsage)
	asJSON := run.flags.Bool("json", false, "print JSON")
	all := false
	if sub == "replay" {
		run.flags.BoolVar(&all, "all", false, "replay every message of the failed queue")
	}
	ids, code, done := run.parseArgs(args)
	if done {
		return code
	}
	switch {
	case sub != "list" && sub != "show" && sub != "replay":
		hint := ""
		if s := suggest.Closest(sub, []string{"list", "show", "replay"}); s != "" {
			hint = fmt.Sprintf(" (did you mean %q?)", s)
		}
		return a.usageError("failed", "unknown subcommand %q%s: want list, show or replay", sub, hint)
	case sub == "list" && len(ids) > 0:
		return a.usageError(cmd, "unexpected argument %q", ids[0])
	case sub == "show" && len(ids) != 1:
		return a.usageError(cmd, "want one ID")
	case sub == "replay" && (len(ids) == 0) == !all:
		return a.usageError(cmd, "give IDs or --all, not both and not neither")
	}
	cfg, code, done := run.config()
	if done {
		return code
	}
	conn, err := amqp.DialConfig(cfg.AMQPURL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second),
		Properties: amqp.Table{"connection_name": "klaxon " + cmd}})
	if err != nil {
		return a.fail(cmd, fmt.Errorf("RabbitMQ (%s) does not answer: %w", config.EnvAMQPURL, err))
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return a.fail(cmd, err)
	}
	// Closing the channel gives back every message read and not acked.
	defer ch.Close()
	msgs, err := readFailed(ch, wire.FailedQueue(cfg.Prefix), cfg.EndpointKeys())
	if err != nil {
		return a.fail(cmd, err)
	}

	switch sub {
	case "list":
		return a.failedList(msgs, *asJSON)
	case "show":
		i := slices.IndexFunc(msgs, func(m failedMessage) bool { return m.ID == ids[0] })
		if i < 0 {
			fmt.Fprintf(a.stderr, "klaxon %s: no message %q in %s (run 'klaxon failed list')\n", cmd, ids[0], wire.FailedQueue(cfg.Prefix))
			return exitProblem
		}
		return a.failedShow(msgs[i], *asJSON)
	}
	return a.failedReplay(ctx, cfg, conn, ch, msgs, ids, all, *asJSON)
}

// readFailed reads every message of the failed queue q without acking any.
func readFailed(ch *amqp.Channel, q string, keys *seal.Keys) ([]failedMessage, error) {
	var out []failedMessage
	for {
		d, ok, err := ch.Get(q, false)
		if err != nil {
			var aerr *amqp.Error
			if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
				return nil, fmt.Errorf("there is no queue %s: no worker with this KLAXON_PREFIX has run on this broker", q)
			}
			return nil, fmt.Errorf("read %s: %w", q, err)
		}
		if !ok {
			return out, nil
		}
		out = append(out, describeFailed(d, keys))
	}
}

// describeFailed is what the tool shows of delivery d of the failed queue.
func describeFailed(d amqp.Delivery, keys *seal.Keys) failedMessage {
	m := failedMessage{ID: d.MessageId, tag: d.DeliveryTag, Attempts: 1, Kind: "unreadable", Host: "?"}
	if m.ID == "" {
		m.ID = fmt.Sprintf("#%d", d.DeliveryTag)
	}
	if reason, ok := d.Headers[wire.ErrorHeader].(string); ok {
		m.Reason = reason
	}
	if !d.Timestamp.IsZero() {
		m.FailedAt = d.Timestamp.UTC()
	}
	f, err := deliverer.DecodeFailed(d.Body)
	if err != nil {
		m.Reason = strings.TrimSpace(m.Reason + "; " + err.Error())
		return m
	}
	m.failed = f
	m.Kind, m.ProjectID, m.RuleID, m.Channel, m.Attempts = f.Label(), f.ProjectID, f.Rule(), f.Channel, f.Attempt+1
	m.Host = endpointHost(f.Channel, f.Endpoint)
	for _, n := range f.Notifications {
		if m.ProjectName == "" {
			m.ProjectName = n.ProjectName
		}
		m.Firings = append(m.Firings, failedFiring{ID: n.ID, Type: n.Type, RuleID: n.RuleID, Title: n.Event.Title,
			Count: n.Count, FiredAt: n.FiredAt})
		if d.Timestamp.IsZero() && n.FiredAt.After(m.FailedAt) {
			// Set aside by an earlier version, without a timestamp: the
			// last firing's time is the closest known.
			m.FailedAt = n.FiredAt.UTC()
		}
	}
	if m.RuleID == "" && len(f.Firings) > 0 {
		m.RuleID = f.Firings[0].RuleID + fmt.Sprintf(" (+%d)", len(f.Firings)-1)
	}
	return m
}

// endpointHost is where an endpoint points, without the endpoint: a URL's
// host, an address's domain, "chat" for a Telegram chat, "sealed" when it
// travels sealed (KLAXON_ENDPOINT_KEY).
func endpointHost(channel, endpoint string) string {
	switch {
	case seal.Sealed(endpoint):
		return "sealed"
	case channel == rules.Email:
		var domains []string
		for _, part := range strings.Split(endpoint, ",") {
			if a, err := mail.ParseAddress(strings.TrimSpace(part)); err == nil {
				_, domain, _ := strings.Cut(a.Address, "@")
				domains = append(domains, "@"+domain)
			}
		}
		return strings.Join(slices.Compact(domains), ",")
	case channel == rules.Telegram && !telegram.IsHook(endpoint):
		return "chat"
	}
	if u, err := url.Parse(endpoint); err == nil && u.Host != "" {
		return u.Hostname()
	}
	return "?"
}

func (a *app) failedList(msgs []failedMessage, asJSON bool) int {
	if asJSON {
		for i := range msgs {
			msgs[i].Firings = nil
		}
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(struct {
			Messages []failedMessage `json:"messages"`
		}{append([]failedMessage{}, msgs...)})
		return exitOK
	}
	if len(msgs) == 0 {
		fmt.Fprintln(a.stdout, "the failed queue is empty")
		return exitOK
	}
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tFAILED AT\tPROJECT\tRULE\tCHANNEL\tATTEMPTS\tHOST\tREASON")
	for _, m := range msgs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", m.ID, formatTime(m.FailedAt), projectLabel(m),
			m.RuleID, m.Channel, m.Attempts, m.Host, oneLine(m.Reason, 120))
	}
	w.Flush()
	fmt.Fprintf(a.stdout, "%s; 'klaxon failed show ID' for one, 'klaxon failed replay ID' to send it again\n", plural(len(msgs), "message"))
	return exitOK
}

func (a *app) failedShow(m failedMessage, asJSON bool) int {
	if asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(m)
		return exitOK
	}
	fmt.Fprintf(a.stdout, "id:        %s\nkind:      %s\nfailed at: %s\nproject:   %s\nrule:      %s\nchannel:   %s (host %s)\nattempts:  %d\nreason:    %s\n",
		m.ID, m.Kind, formatTime(m.FailedAt), projectLabel(m), m.RuleID, m.Channel, m.Host, m.Attempts, m.Reason)
	if len(m.Firings) > 0 {
		fmt.Fprintln(a.stdout, "firings:")
		for _, f := range m.Firings {
			fmt.Fprintf(a.stdout, "  %s  %s  rule %s  %s  %q (count %d)\n", formatTime(f.FiredAt), f.Type, f.RuleID, f.ID, f.Title, f.Count)
		}
	}
	return exitOK
}

// replayResult is what replay did with one message.
type replayResult struct {
	ID       string `json:"id"`
	Replayed bool   `json:"replayed"`
	Error    string `json:"error,omitempty"`
}

func (a *app) failedReplay(ctx context.Context, cfg config.Config, conn *amqp.Connection, ch *amqp.Channel,
	msgs []failedMessage, ids []string, all, asJSON bool) int {
	const cmd = "failed replay"
	targets := msgs
	var results []replayResult
	if !all {
		targets = nil
		for _, id := range ids {
			i := slices.IndexFunc(msgs, func(m failedMessage) bool { return m.ID == id })
			if i < 0 {
				results = append(results, replayResult{ID: id, Error: "no such message in " + wire.FailedQueue(cfg.Prefix)})
				continue
			}
			targets = append(targets, msgs[i])
		}
	}
	rdb, err := redisClient(cfg)
	if err != nil {
		return a.fail(cmd, err)
	}
	defer rdb.Close()
	pub, err := conn.Channel()
	if err != nil {
		return a.fail(cmd, err)
	}
	defer pub.Close()
	if err := pub.Confirm(false); err != nil {
		return a.fail(cmd, err)
	}
	delivery := wire.DeliveryQueue(cfg.Prefix)
	if _, err := pub.QueueDeclarePassive(delivery, true, false, false, false, nil); err != nil {
		return a.fail(cmd, fmt.Errorf("there is no queue %s to replay to: %w", delivery, err))
	}
	for _, m := range targets {
		res := replayResult{ID: m.ID}
		if err := replayOne(ctx, cfg, rdb, pub, ch, delivery, m); err != nil {
			res.Error = err.Error()
		} else {
			res.Replayed = true
		}
		results = append(results, res)
	}

	code := exitOK
	for _, r := range results {
		if !r.Replayed {
			code = exitProblem
		}
	}
	if asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(struct {
			Results []replayResult `json:"results"`
		}{append([]replayResult{}, results...)})
		return code
	}
	for _, r := range results {
		if r.Replayed {
			fmt.Fprintf(a.stdout, "%s: replayed to %s\n", r.ID, delivery)
		} else {
			fmt.Fprintf(a.stdout, "%s: NOT replayed: %s\n", r.ID, r.Error)
		}
	}
	if len(results) == 0 {
		fmt.Fprintln(a.stdout, "the failed queue is empty: nothing to replay")
	}
	return code
}

// replayOne clears the failed records of m's firings, publishes its job to
// the delivery queue, and once the broker confirmed it, acks m off the
// failed queue. Cut short between the two, m stays in the failed queue
// and its replay may be on its way: replaying it again then sends
// nothing more, as its firings are no longer recorded as failed but as
// sent (or being sent).
func replayOne(ctx context.Context, cfg config.Config, rdb redis.UniversalClient, pub, failedCh *amqp.Channel, delivery string, m failedMessage) error {
	if m.Kind == "unreadable" {
		return errors.New("the message cannot be read: " + m.Reason)
	}
	job, err := m.failed.Replay()
	if err != nil {
		return err
	}
	msg, err := job.Message(delivery)
	if err != nil {
		return err
	}
	if _, err := deliverer.ClearFailed(ctx, rdb, cfg.Prefix, &job); err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	confirm, err := pub.PublishWithDeferredConfirmWithContext(pctx, "", msg.RoutingKey, false, false, amqp.Publishing{
		ContentType: msg.ContentType, DeliveryMode: amqp.Persistent, MessageId: msg.MessageID, Body: msg.Body})
	if err != nil {
		return fmt.Errorf("publish to %s: %w", delivery, err)
	}
	acked, err := confirm.WaitContext(pctx)
	switch {
	case err != nil:
		return fmt.Errorf("publish to %s: no confirmation: %w", delivery, err)
	case !acked:
		return fmt.Errorf("publish to %s: the broker refused it", delivery)
	}
	if err := failedCh.Ack(m.tag, false); err != nil {
		return fmt.Errorf("replayed, but not removed from the failed queue (a replay of it again sends nothing more): %w", err)
	}
	return nil
}

func projectLabel(m failedMessage) string {
	if m.ProjectName != "" {
		return fmt.Sprintf("%s (%s)", m.ProjectName, m.ProjectID)
	}
	return m.ProjectID
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// oneLine is s on one line, cut to n bytes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n-1] + "…"
	}
	return s
}
