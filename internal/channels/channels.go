// Package channels builds the notification channels a configuration
// enables, the one way the worker's deliverer and `klaxon test-send` both
// make them, so that a test message goes through exactly the code (clients,
// endpoint checks, rendering, error classification) a firing goes through.
// With KLAXON_OUTPUT=hawk-senders the worker's channels are HawkSenders
// instead, which hand firings to Hawk's own sender workers.
package channels

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/netguard"
	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/notify/email"
	"github.com/klaxonhq/klaxon/internal/notify/hawksender"
	"github.com/klaxonhq/klaxon/internal/notify/loop"
	"github.com/klaxonhq/klaxon/internal/notify/slack"
	"github.com/klaxonhq/klaxon/internal/notify/telegram"
	"github.com/klaxonhq/klaxon/internal/notify/webhook"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// Build makes the channels cfg configures, by rule channel name. Webhook,
// Slack and Loop need no settings; email is there only when KLAXON_SMTP_ADDR is
// set, and a rule using it elsewhere fails its deliveries with a clear
// reason. connsPerHost is how many idle connections to one host to keep:
// as many as sends may run at once.
//
// Endpoints from rules (webhook, Slack and Loop URLs, Telegram hook URLs) are
// written by untrusted users: they go through a netguard client, which
// reaches the public internet and KLAXON_ALLOW_PRIVATE_NETWORKS only. What
// the operator configured (the Bot API, SMTP) is trusted and is not.
func Build(cfg config.Config, connsPerHost int) (map[string]notify.Channel, error) {
	// net/http keeps 2 idle connections per host; the deliverer sends many
	// at once, often to one host.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = connsPerHost
	trusted := &http.Client{Timeout: cfg.SendTimeout, Transport: transport}
	fromRules := cfg.EndpointPolicy().Client(netguard.ClientOptions{
		Timeout: cfg.SendTimeout, MaxIdleConnsPerHost: connsPerHost})
	chans := map[string]notify.Channel{
		rules.Webhook: webhook.New(fromRules),
		rules.Slack:   &slack.Notifier{Client: fromRules, Hosts: cfg.SlackPatterns()},
		rules.Loop:    &loop.Notifier{Client: fromRules, Hosts: cfg.LoopPatterns()},
	}
	if cfg.EmailEnabled() {
		e, err := email.New(email.Config{
			Addr: cfg.SMTPAddr, Username: cfg.SMTPUsername, Password: cfg.SMTPPassword,
			From: cfg.SMTPFrom, TLS: cfg.SMTPTLS, Timeout: cfg.SendTimeout,
			MaxRecipients: cfg.Limits.EmailRecipients,
		})
		if err != nil {
			return nil, fmt.Errorf("email channel: %w", err)
		}
		chans[rules.Email] = e
	}
	// Telegram is there without a token too: Hawk's rules send through hook
	// URLs of CodeX's notify bot, which need none; a chat id then fails with
	// that reason.
	t, err := telegram.New(telegram.Config{Token: cfg.TelegramToken, APIURL: cfg.TelegramAPI, Client: trusted,
		HookClient: fromRules, HookHosts: cfg.TelegramHookPatterns(), AllowedChats: cfg.TelegramChats()})
	if err != nil {
		return nil, fmt.Errorf("telegram channel: %w", err)
	}
	chans[rules.Telegram] = t
	return chans, nil
}

// HawkSenders makes the channels of KLAXON_OUTPUT=hawk-senders: one for
// every rule channel name, each publishing Hawk's sender task to pub, on
// the queue <KLAXON_HAWK_SENDER_QUEUES><name>, for Hawk's own sender
// workers to render and send. counted counts the firings published and
// left out; nil counts nothing.
func HawkSenders(cfg config.Config, pub hawksender.Publisher, counted hawksender.Counter, log *slog.Logger) map[string]notify.Channel {
	chans := make(map[string]notify.Channel, len(rules.ChannelNames))
	for _, name := range rules.ChannelNames {
		chans[name] = &hawksender.Channel{Name: name, Queue: hawksender.Queue(cfg.HawkSenderQueues, name),
			Publisher: pub, Counter: counted, Log: log}
	}
	return chans
}

// HawkSenderQueues are the queues HawkSenders publishes to, in
// rules.ChannelNames order.
func HawkSenderQueues(cfg config.Config) []string {
	var qs []string
	for _, name := range rules.ChannelNames {
		qs = append(qs, hawksender.Queue(cfg.HawkSenderQueues, name))
	}
	return qs
}
