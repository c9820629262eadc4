package main

import (
	"strings"
	"testing"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// channelProblem answers as the worker's send would, from the settings
// alone: each case is a send test-send showed fails, or one that goes.
func TestChannelProblem(t *testing.T) {
	load := func(env map[string]string) config.Config {
		c, err := config.Load(func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	none := load(nil)
	allowing := load(map[string]string{"KLAXON_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8,::1/128,10.0.0.0/8",
		"KLAXON_TELEGRAM_TOKEN": "123:abc", "KLAXON_TELEGRAM_ALLOWED_CHATS": "-100123,@ops"})
	hawk := load(map[string]string{"KLAXON_OUTPUT": "hawk-senders"})
	for _, c := range []struct {
		cfg              config.Config
		channel, address string
		want             string // part of the reason; "" = no problem
	}{
		{none, rules.Webhook, "https://example.com/hook", ""},
		{none, rules.Webhook, "http://example.com:80/hook", ""},
		{none, rules.Webhook, "https://example.com:8443/hook", "port 8443"},
		{none, rules.Webhook, "http://localhost:8080/hook", "loopback"},
		{none, rules.Webhook, "http://[::1]/hook", "loopback"},
		{none, rules.Webhook, "http://169.254.169.254/latest", "KLAXON_ALLOW_PRIVATE_NETWORKS"},
		{none, rules.Webhook, "ftp://example.com/x", "not an absolute http(s) URL"},
		{none, rules.Webhook, "https://user:pw@example.com/x", "user name or password"},
		{allowing, rules.Webhook, "http://127.0.0.1:8080/hook", ""},
		{allowing, rules.Webhook, "http://10.1.2.3:9000/hook", ""},
		{allowing, rules.Webhook, "https://internal.example:8443/hook", ""}, // may resolve to an allowed network
		{none, rules.Slack, "https://hooks.slack.com/services/T/B/x", ""},
		{none, rules.Slack, "https://chat.example.com/services/T/B/x", "KLAXON_SLACK_HOSTS"},
		{none, rules.Email, "ops@example.com", "KLAXON_SMTP_ADDR"},
		{none, rules.Telegram, "-100123", "KLAXON_TELEGRAM_TOKEN"},
		{none, rules.Telegram, "https://notify.bot.codex.so/u/abc", ""},
		{none, rules.Telegram, "https://bot.example.com/u/abc", "KLAXON_TELEGRAM_HOOK_HOSTS"},
		{allowing, rules.Telegram, "-100123", ""},
		{allowing, rules.Telegram, "@OPS", ""},
		{allowing, rules.Telegram, "-100999", "KLAXON_TELEGRAM_ALLOWED_CHATS"},
		// Handed to Hawk's senders, which have their own settings.
		{hawk, rules.Email, "ops@example.com", ""},
		{hawk, rules.Telegram, "-100123", ""},
		{hawk, rules.Webhook, "http://localhost:8080/hook", ""},
	} {
		got := channelProblem(c.cfg, rules.Channel{Name: c.channel, Endpoint: c.address})
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s %s: %q, want %q", c.channel, c.address, got, c.want)
		}
	}
}
