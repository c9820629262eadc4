package config

import (
	"log/slog"
	"strconv"
	"strings"
)

// attrs is the configuration as it may be shown: URLs without their user
// info or credential parameters, and secrets as xxxxx when set.
func (c Config) attrs() []slog.Attr {
	secret := func(v string) string {
		if v == "" {
			return ""
		}
		return redacted
	}
	return []slog.Attr{
		slog.String("amqp_url", redactURL(c.AMQPURL)),
		slog.String("queue", c.Queue),
		slog.Int("queue_shards", c.QueueShards),
		slog.String("queues", c.Queues),
		slog.String("redis_url", redactURL(c.RedisURL)),
		slog.String("mongo_url", redactURL(c.MongoURL)),
		slog.String("mongo_database", c.MongoDatabase),
		slog.String("events_mongo_url", redactURL(c.EventsMongoURL)),
		slog.String("events_database", c.EventsDatabase),
		slog.String("rules_file", c.RulesFile),
		slog.String("prefix", c.Prefix),
		slog.String("http_addr", c.HTTPAddr),
		slog.String("smtp_addr", c.SMTPAddr),
		slog.String("smtp_username", c.SMTPUsername),
		slog.String("smtp_password", secret(c.SMTPPassword)),
		slog.String("smtp_from", c.SMTPFrom),
		slog.String("smtp_tls", string(c.SMTPTLS)),
		slog.String("telegram_token", secret(c.TelegramToken)),
		slog.String("telegram_api_url", redactURL(c.TelegramAPI)),
		slog.String("log_level", c.LogLevel.String()),
		slog.String("role", string(c.Role)),
		slog.String("output", string(c.Output)),
		slog.String("hawk_sender_queues", c.HawkSenderQueues),
		slog.String("queue_type", c.QueueType),
		slog.Int("prefetch", c.Prefetch),
		slog.Int("batch_size", c.BatchSize),
		slog.Int("batches_in_flight", c.BatchesInFlight),
		slog.String("batch_linger", c.BatchLinger.String()),
		slog.Int64("max_held_bytes", c.MaxHeldBytes),
		slog.String("max_batch_hold", c.MaxBatchHold.String()),
		slog.Int("redis_groups_per_call", c.GroupsPerCall),
		slog.String("dedup_ttl", c.DedupTTL.String()), // JSON logs would show ns
		slog.Int("redis_wait_replicas", c.WaitReplicas),
		slog.String("redis_wait_timeout", c.WaitTimeout.String()),
		slog.String("rules_refresh", c.RulesRefresh.String()),
		slog.String("send_timeout", c.SendTimeout.String()),
		slog.Bool("pprof", c.Pprof),
		slog.String("allow_private_networks", c.AllowPrivateNetworks),
		slog.String("allow_ports", c.AllowPorts),
		slog.String("slack_hosts", c.SlackHosts),
		slog.String("telegram_hook_hosts", c.TelegramHookHosts),
		slog.String("loop_hosts", c.LoopHosts),
		slog.String("telegram_allowed_chats", c.TelegramAllowedChats),
		slog.String("event_url", c.EventURL),
		slog.String("event_url_fallback", c.EventURLFallback),
		slog.Int("max_rules_per_project", c.Limits.RulesPerProject),
		slog.Int("max_windows_per_rule", c.Limits.WindowsPerRule),
		slog.Int("max_filter_words", c.Limits.FilterWords),
		slog.Int("max_filter_word_bytes", c.Limits.FilterWordBytes),
		slog.Int("max_filter_bytes", c.Limits.FilterBytes),
		slog.Int("max_matched_title_bytes", c.Limits.MatchedTitleBytes),
		slog.Int("max_email_recipients", c.Limits.EmailRecipients),
		slog.Int("max_sends", c.MaxSends),
		slog.Int("max_sends_per_host", c.MaxSendsPerHost),
		slog.Int("max_sends_per_project", c.MaxSendsPerProject),
		slog.Int("max_groups_per_project", c.MaxGroups),
		slog.Int("circuit_timeouts", c.CircuitTimeouts),
		slog.String("circuit_open", c.CircuitOpen.String()),
		slog.String("endpoint_key", secret(c.EndpointKey)),
		slog.String("operator_webhook", secret(c.OperatorWebhook)),
		slog.Bool("operator_email", c.OperatorEmail != ""), // addresses are personal data
		slog.String("operator_delay", c.OperatorDelay.String()),
	}
}

// LogValue makes slog print the configuration as a group, secrets redacted:
// slog.Info("starting", "config", cfg).
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(c.attrs()...)
}

// String returns key=value pairs, secrets redacted.
func (c Config) String() string {
	var b strings.Builder
	for i, a := range c.attrs() {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(a.Key)
		b.WriteByte('=')
		v := a.Value.String()
		if v == "" || strings.ContainsAny(v, " \"=") {
			v = strconv.Quote(v)
		}
		b.WriteString(v)
	}
	return b.String()
}

// GoString keeps %#v from printing the secret fields.
func (c Config) GoString() string {
	return "config.Config{" + c.String() + "}"
}
