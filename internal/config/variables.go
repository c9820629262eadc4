package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/mail"
	"strings"
	"time"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/seal"
	"github.com/klaxonhq/klaxon/internal/smtptls"
)

// Variable describes one environment variable Load reads.
type Variable struct {
	Name    string // e.g. "KLAXON_AMQP_URL"
	Alias   string // Hawk's name for the same setting, or ""
	Default string // the value used when the variable is unset or empty; "" = unset
	Range   string // the values a number may take, e.g. "1–65535"; "" = not a bounded number
	Secret  bool   // the value, or part of it, is a credential and is never printed
	// Section is the table of docs/configuration.md that lists it:
	// SectionEssential, or one of the advanced settings' sections.
	Section string
	Doc     string // its meaning, as docs/configuration.md gives it (Markdown)
}

// Sections of docs/configuration.md, in its order.
const (
	SectionEssential  = "essential"  // what most deployments set
	SectionQueues     = "queues"     // queues and roles
	SectionThroughput = "throughput" // throughput and batching
	SectionDurability = "durability" // Redis durability
	SectionMessages   = "messages"   // rules and messages
	SectionEndpoints  = "endpoints"  // endpoints from rules
	SectionOperator   = "operator"   // the operator channel
	SectionLimits     = "limits"     // limits per project
	SectionBounds     = "bounds"     // bounds on shared resources
	SectionFairness   = "fairness"   // fairness between projects
	SectionDiagnosis  = "diagnosis"
)

// Variables lists every variable Load reads, in the order it reads them;
// docs/configuration.md's tables list them by Section in this order. Each
// call returns a new slice.
func Variables() []Variable {
	specs := variables(new(Config))
	out := make([]Variable, len(specs))
	for i, s := range specs {
		out[i] = Variable{Name: s.name, Alias: s.alias, Default: s.value.def, Range: s.value.span,
			Secret: s.secret, Section: s.section, Doc: strings.ReplaceAll(s.doc, rangeMark, s.value.span)}
	}
	return out
}

// rangeMark stands in a spec's doc for its range, which is written once, in
// its value.
const rangeMark = "{range}"

// spec declares one variable: what Variables says of it, how Load reads it
// and where in a Config its value goes, and how the configuration shows it.
type spec struct {
	name    string
	alias   string // Hawk's name, or ""
	section string
	secret  bool
	raw     bool // used as is, surrounding white space included
	value   value
	// check is what else a set value must be, in the light of the
	// variables read before it; errors.Join for several problems.
	check func(v string) error
	log   logAs
	// logAlso is a value derived from this one that the log shows next.
	logAlso func() slog.Attr
	doc     string // with rangeMark where the range goes
}

// logAs is how the configuration shows a variable's value.
type logAs int

const (
	logValue      logAs = iota // as it is; a secret's as logHidden
	logURL                     // without user info and credential parameters
	logHidden                  // xxxxx when set
	logWhetherSet              // true or false only: personal data
	logNot                     // not at all
)

// Defaults that code besides the table needs.
const (
	defaultMongoDB       = "hawk"        // Hawk's accounts database
	defaultEventsDB      = "hawk_events" // Hawk's events database
	defaultSlackHosts    = "hooks.slack.com/services/"
	defaultTelegramHooks = "notify.bot.codex.so"
	// Loop is installed on each customer's own servers: no host is
	// everyone's. Operators narrow it to theirs.
	defaultLoopHosts = "*"
	// Hawk's own page of an event group, by the group document's _id, as
	// Hawk's senders link to it (hawk.api loads an event by that id).
	defaultEventURL = "https://garage.hawk.so/project/{projectId}/event/{eventId}/overview"
	// defaultEventURLFallback is the link of the default KLAXON_EVENT_URL
	// when the event's id is unknown: Garage has no page of a group by its
	// hash, so the project's page, which lists its events.
	defaultEventURLFallback = "https://garage.hawk.so/project/{projectId}"
	// noEventURL leaves the link out: an empty value takes the default,
	// as for every variable.
	noEventURL = "none"
)

// maxQueueShards bounds KLAXON_QUEUE_SHARDS: each hashed queue a worker
// consumes is a connection of its own, and docs/scaling.md plans 1M
// events/s with 48.
const maxQueueShards = 256

// variables declares every variable Load reads, each once, with its value
// going into c, in the order Load reads them, and reports their problems
// in: a check may look at the values read before it.
func variables(c *Config) []spec {
	return []spec{
		{name: EnvAMQPURL, alias: "REGISTRY_URL", secret: true, section: SectionEssential, log: logURL,
			value: text(&c.AMQPURL, "amqp://guest:guest@127.0.0.1:5672/"), check: checkAMQPURL,
			doc: "RabbitMQ, `amqp://` or `amqps://`; the path is the vhost ([details](#rabbitmq-url))."},
		{name: EnvQueue, section: SectionQueues, value: text(&c.Queue, "notifier"), check: checkQueue,
			doc: "The incoming queue, Hawk's `notifier`; declared durable if missing; poison goes to `<KLAXON_QUEUE>.dead`. At most 250 bytes, not `amq.…`."},
		// classic: what every earlier Klaxon made, so an upgrade finds its
		// queues as it declares them, and a single broker gains nothing from
		// quorum.
		{name: EnvQueueType, section: SectionQueues, value: oneOf(&c.QueueType, "classic", "classic", "quorum"),
			doc: "`classic` or `quorum` for the queues Klaxon creates; an existing queue is used as it is ([which to choose](guarantees.md#a-broker-node-lost-queue-types))."},
		{name: EnvQueueShards, section: SectionQueues, value: whole(&c.QueueShards, 0, 0, maxQueueShards),
			doc: "N hashed incoming queues behind the exchange `<KLAXON_QUEUE>.hash`, past one queue's ceiling ({range}) ([scaling.md](scaling.md#several-incoming-queues))."},
		{name: EnvQueues, section: SectionQueues,
			value: canonical(&c.Queues, "", func(v string) (string, error) { return parseQueues(v, c.Queue, c.QueueShards) }),
			doc:   "The incoming queues this worker consumes, e.g. `notifier,notifier.0`; unset: all ([scaling.md](scaling.md#several-incoming-queues))."},
		{name: EnvRedisURL, alias: "REDIS_URL", secret: true, section: SectionEssential, log: logURL,
			value: text(&c.RedisURL, "redis://127.0.0.1:6379/0"),
			check: func(v string) error { _, err := parseRedisURL(v); return err },
			doc:   "Redis: single node, Sentinel or Cluster, chosen by the scheme ([Redis URLs](#redis-urls))."},
		{name: EnvMongoURL, alias: "MONGO_ACCOUNTS_DATABASE_URI", secret: true, section: SectionEssential, log: logURL,
			value:   mongoURL(&c.MongoURL, &c.MongoDatabase, "mongodb://127.0.0.1:27017/"+defaultMongoDB, defaultMongoDB),
			logAlso: func() slog.Attr { return slog.String("mongo_database", c.MongoDatabase) },
			doc:     "The rules store, Hawk's accounts database; the path names the database (`hawk` when it names none) ([MongoDB URLs](#mongodb-urls))."},
		{name: EnvEventsMongoURL, alias: "MONGO_EVENTS_DATABASE_URI", secret: true, section: SectionEssential, log: logURL,
			value:   mongoURL(&c.EventsMongoURL, &c.EventsDatabase, "", defaultEventsDB),
			logAlso: func() slog.Attr { return slog.String("events_database", c.EventsDatabase) },
			doc:     "Hawk's events database, optional: group history in messages, resolved groups that come back fire as `regressed`, ignored groups stay silent ([rules.md](rules.md#hawks-events-database)); events without a time or user take Hawk's ([which](rules.md#what-klaxon-reads-from-hawks-events-database))."},
		{name: EnvRulesFile, section: SectionEssential, value: text(&c.RulesFile, ""),
			doc: "A YAML rules file, used instead of MongoDB ([rules.md](rules.md#where-rules-live)), at most 64 MiB; a reload reads it again only when its size, times or inode change."},
		{name: EnvPrefix, section: SectionQueues, value: text(&c.Prefix, "klaxon"), check: checkPrefix,
			doc: "Namespace of every Redis key and every queue Klaxon creates, so installations can share a Redis and a broker. At most 64 bytes, no white space, `{` or `}`."},
		{name: EnvHTTPAddr, section: SectionEssential, value: text(&c.HTTPAddr, "127.0.0.1:9464"), check: checkListenAddr,
			doc: "Where `/metrics`, `/healthz` and `/readyz` listen ([details](#http-endpoints)); `0.0.0.0:9464` in a container (the image sets it)."},
		{name: EnvSMTPAddr, section: SectionEssential, value: text(&c.SMTPAddr, ""),
			check: func(v string) error {
				if err := checkHostPort(v, true); err != nil {
					return fmt.Errorf("%q is not host:port (for example smtp.example.com:587): %v", v, err)
				}
				return nil
			},
			doc: "SMTP server `host:port`; unset, the email channel is off and sends to it fail for good."},
		{name: EnvSMTPUsername, section: SectionEssential, value: text(&c.SMTPUsername, ""),
			doc: "SMTP user name; unset, no authentication."},
		{name: EnvSMTPPassword, secret: true, raw: true, section: SectionEssential, value: text(&c.SMTPPassword, ""),
			check: func(string) error {
				if c.SMTPUsername == "" {
					return errors.New("is set but " + EnvSMTPUsername + " is not")
				}
				return nil
			},
			doc: "SMTP password; needs `KLAXON_SMTP_USERNAME`. Used as is, white space included."},
		{name: EnvSMTPFrom, section: SectionEssential, value: text(&c.SMTPFrom, "klaxon@localhost"),
			check: func(v string) error {
				if _, err := mail.ParseAddress(v); err != nil {
					return fmt.Errorf("%q is not an email address: %v", v, err)
				}
				return nil
			},
			doc: "Sender of notification emails, e.g. `Klaxon <alerts@example.com>`; set it, many servers refuse `localhost` senders."},
		{name: EnvSMTPTLS, section: SectionEssential,
			value: oneOf(&c.SMTPTLS, smtptls.StartTLS, smtptls.None, smtptls.StartTLS, smtptls.Implicit),
			// The email channel refuses to send a password in clear beyond
			// this machine; say so here, naming the variable, not when it is
			// built.
			check: func(v string) error {
				host, _, err := net.SplitHostPort(c.SMTPAddr)
				if c.SMTPTLS == smtptls.None && c.SMTPUsername != "" && err == nil && !smtptls.IsLocalhost(host) {
					return fmt.Errorf("%q would send %s in clear to %s: use starttls or tls (none is for a relay on localhost)",
						v, EnvSMTPPassword, host)
				}
				return nil
			},
			doc: "`starttls` (usually port 587), `tls` (usually 465) or `none` (a local relay only; refused with a user name unless the server is on loopback)."},
		{name: EnvTelegramToken, secret: true, section: SectionEssential, value: text(&c.TelegramToken, ""), check: checkTelegramToken,
			doc: "Bot token, for Telegram endpoints that are chat ids; Hawk's hook URLs need none."},
		{name: EnvTelegramAPIURL, section: SectionMessages, log: logURL,
			value: canonical(&c.TelegramAPI, "https://api.telegram.org", func(v string) (string, error) {
				return strings.TrimRight(v, "/"), checkHTTPURL(v)
			}),
			doc: "Telegram Bot API base URL (`http` or `https`, no query); a local Bot API server or a test double."},
		{name: EnvLogLevel, section: SectionEssential, value: logLevel(&c.LogLevel),
			doc: "`debug`, `info`, `warn` or `error`; JSON lines on stderr."},
		{name: EnvRole, section: SectionQueues, value: oneOf(&c.Role, RoleAll, RoleAll, RoleEvaluator, RoleDeliverer),
			doc: "`all`, `evaluator` (counts, publishes delivery jobs) or `deliverer` (sends), to scale the stages apart."},
		{name: EnvPrefetch, section: SectionThroughput, value: whole(&c.Prefetch, 2000, 1, 65535),
			doc: "Unacknowledged events a worker holds per incoming queue ({range}) ([batching](#batching))."},
		{name: EnvBatchSize, section: SectionThroughput, value: batchSize(&c.BatchSize, &c.Prefetch, 1000),
			doc: "Most events counted in one Redis round trip; at most `KLAXON_PREFETCH` ([batching](#batching))."},
		{name: EnvBatchesInFlight, section: SectionThroughput, value: whole(&c.BatchesInFlight, 1, 1, 4),
			doc: "Batches of a queue handled at once ({range}); more can help near a worker's capacity, at some Redis cost ([batching](#batching))."},
		// 0, unlike in other durations, is a choice: no wait.
		{name: EnvBatchLinger, section: SectionThroughput, value: upTo(&c.BatchLinger, 2*time.Millisecond, 100*time.Millisecond),
			doc: "How long a batch not yet full waits for more ({range}) ([batching](#batching))."},
		{name: EnvMaxHeldBytes, section: SectionThroughput, value: size(&c.MaxHeldBytes, 64<<20, 1<<20, 16<<30),
			doc: "Bytes of incoming messages a worker holds per queue before it pauses consuming, {range} ([batching](#batching))."},
		{name: EnvMaxBatchHold, section: SectionDiagnosis, value: positive(&c.MaxBatchHold, time.Minute),
			doc: "How long a stage may hold a batch it retries after a failure before `/readyz` answers 503 naming the stage, its queue, the batch's age and the last error ([details](#http-endpoints))."},
		{name: EnvGroupsPerCall, section: SectionThroughput, value: whole(&c.GroupsPerCall, 32, 1, 1000),
			doc: "Groups counted in one Lua call on a single node or Sentinel ({range}); a call storing counts the worker made takes eight times as many. `1` behind a proxy that routes by key (then one each)."},
		{name: EnvStateCache, section: SectionThroughput, value: size(&c.StateCache, 16<<20, 0, 16<<30),
			doc: "Memory a worker keeps the group states it wrote last in ({range}; `0`: none), so that counting a group again needs no read of it; a state another worker wrote since costs one more answer from Redis, never a wrong count ([batching](#batching))."},
		{name: EnvDedupTTL, section: SectionDurability, value: positive(&c.DedupTTL, 10*time.Minute),
			doc: "How long, at least, a message's identity (`message-id`, else `repetitionId`) is remembered (at most twice this); an id costs 8–12 bytes of Redis. Set it above the longest broker outage to ride out."},
		{name: EnvWaitReplicas, section: SectionDurability, value: whole(&c.WaitReplicas, 0, 0, 16),
			check: func(string) error { return checkWait(c) },
			doc:   "Replicas that must hold a batch's writes (Redis `WAIT`) before its messages are acked ({range}; not on Cluster) ([Sentinel failover](guarantees.md#redis-sentinel-failover))."},
		{name: EnvWaitTimeout, section: SectionDurability, value: positive(&c.WaitTimeout, time.Second),
			doc: "How long a write waits for those replicas before its batch is held and retried."},
		{name: EnvRulesRefresh, section: SectionMessages, value: positive(&c.RulesRefresh, 5*time.Second),
			doc: "How often rules are reloaded; keep it at most `10s` for the \"edits apply within 10 s\" promise."},
		{name: EnvSendTimeout, section: SectionMessages, value: positive(&c.SendTimeout, 10*time.Second),
			doc: "Time limit of one delivery attempt (an HTTP request or an SMTP session); a timeout is retried."},
		{name: EnvPprof, section: SectionDiagnosis, value: truth(&c.Pprof, false),
			doc: "`true` serves Go's profiler under `/debug/pprof/` on `KLAXON_HTTP_ADDR` ([details](#profiling)); keep it off in production."},
		{name: EnvStormOver, section: SectionMessages, value: truth(&c.StormOver, false), log: logNot,
			doc: "`true`: a \"storm over\" message after every `SEEN_MORE` rule's storm, unless the rule says `stormOver: false` ([rules.md](rules.md#storm-over))."},
		{name: EnvOutput, section: SectionQueues, value: oneOf(&c.Output, OutputSend, OutputSend, OutputHawkSenders),
			doc: "What the deliverer does with a firing: `send` sends it through Klaxon's channels; `hawk-senders` publishes the task Hawk's notifier would publish to Hawk's own sender workers, which render and send it ([replacing Hawk's notifier alone](hawk.md))."},
		// Hawk's sender workers consume sender/email, sender/telegram, …
		{name: EnvHawkSenderQueues, section: SectionQueues, value: text(&c.HawkSenderQueues, "sender/"), check: checkHawkSenderQueues,
			doc: "With `KLAXON_OUTPUT=hawk-senders`: the prefix of Hawk's sender queues, `<prefix>email`, `<prefix>telegram`, `<prefix>slack`, `<prefix>webhook`, `<prefix>loop`."},
		{name: EnvAllowPrivateNetworks, section: SectionEssential, value: canonical(&c.AllowPrivateNetworks, "", canonicalNetworks),
			doc: "CIDRs that endpoints from rules may reach besides the public internet, on any port: your own receivers; `127.0.0.1/32` for a local test ([endpoint policy](guarantees.md#endpoints-from-rules))."},
		{name: EnvAllowPorts, section: SectionEndpoints, value: canonical(&c.AllowPorts, "80,443", canonicalPorts),
			doc: "Ports endpoints from rules may reach on public addresses."},
		{name: EnvSlackHosts, section: SectionEndpoints, value: canonical(&c.SlackHosts, defaultSlackHosts, canonicalPatterns),
			doc: "Patterns a Slack endpoint must match: `host`, `host/path-prefix`, `*.domain` or `*`."},
		{name: EnvTelegramHookHosts, section: SectionEndpoints, value: canonical(&c.TelegramHookHosts, defaultTelegramHooks, canonicalPatterns),
			doc: "The same for Telegram hook URLs (Hawk's CodeX notify bot)."},
		{name: EnvLoopHosts, section: SectionEndpoints, value: canonical(&c.LoopHosts, defaultLoopHosts, canonicalPatterns),
			doc: "The same for Loop endpoints; any host by default, since Loop runs on each customer's servers: set it to yours, e.g. `loop.example.com/hooks/`."},
		{name: EnvDigestMaxFirings, section: SectionBounds, value: whole(&c.DigestMaxFirings, 500, 1, 10_000), log: logNot,
			doc: "Most firings one digest lists ({range}); the rest are counted as omitted."},
		{name: EnvDigestMaxBytes, section: SectionBounds, value: size(&c.DigestMaxBytes, 1<<20, 1<<10, 16<<20), log: logNot,
			doc: "Most bytes of firings one digest gathers in Redis ({range}); the first is always kept."},
		{name: EnvDeadMaxMessages, section: SectionBounds, value: whole(&c.DeadMaxMessages, 100_000, 1, 100_000_000), log: logNot,
			doc: "Most messages `<KLAXON_QUEUE>.dead` and `<KLAXON_PREFIX>.failed` each keep ({range}); the oldest go first."},
		{name: EnvDeadMaxBytes, section: SectionBounds, value: size(&c.DeadMaxBytes, 256<<20, 1<<20, 1<<40), log: logNot,
			doc: "Most bytes of bodies each of those queues keeps ({range})."},
		{name: EnvTelegramAllowedChats, section: SectionEndpoints, value: canonical(&c.TelegramAllowedChats, "", canonicalChats),
			doc: "Chat ids and `@usernames` the bot may post to; unset, any chat it is in ([security](guarantees.md#personal-data-and-secrets))."},
		{name: EnvEventURL, section: SectionEssential, value: eventURL(&c.EventURL),
			doc: "The link to an event in every message. Placeholders: `{projectId}`, `{groupHash}`, and `{eventId}`, the `_id` of the group's document in Hawk's events database, which is what Hawk's pages and senders link by (it needs `KLAXON_EVENTS_MONGO_URL`). Point it at your own Hawk, or `none` for no link. A producer without an events database links by `{groupHash}`."},
		{name: EnvEventURLFallback, section: SectionEssential, value: eventURLFallback(&c.EventURLFallback, &c.EventURL),
			doc: "The link when `KLAXON_EVENT_URL` has `{eventId}` and the event's id is unknown: no events database, the group not (yet) in it, or the read failed or was late. Placeholders `{projectId}` and `{groupHash}` (not `{eventId}`); `none` leaves the link out (webhook `event.url` is `\"\"`). The default goes with the default `KLAXON_EVENT_URL`: Garage has no page of a group by its hash, so the project's page. With a `KLAXON_EVENT_URL` of your own, unset leaves the link out. [Links](channels.md#the-link-to-the-event)."},
		{name: EnvMaxSends, section: SectionFairness, value: whole(&c.MaxSends, 1024, 16, 65535),
			doc: "Delivery jobs one worker works on at once, sends in flight included ({range}), half for each delivery lane; one channel may take half ([fairness](guarantees.md#fairness))."},
		{name: EnvMaxSendsPerHost, section: SectionFairness, value: whole(&c.MaxSendsPerHost, 16, 1, 4096),
			doc: "Sends one host (an endpoint's host:port, the SMTP server, the Bot API) may have in flight in a worker ({range}); four times that per resolved address."},
		{name: EnvMaxSendsPerProject, section: SectionFairness, value: whole(&c.MaxSendsPerProject, 32, 1, 4096),
			doc: "Sends one project may have in flight in a worker ({range})."},
		{name: EnvMaxGroups, section: SectionFairness, value: whole(&c.MaxGroups, 100_000, 0, 100_000_000), check: checkMaxGroups,
			doc: "Groups one project may keep a counting state for in Redis, counted over the last one to two days (32 to 64 days for rules whose state outlives a day); {range}, at least 1000 unless 0, for no bound. Past it, the events of its groups without a state are counted together as one group until it falls below nine tenths ([live groups](guarantees.md#live-groups-per-project))."},
		{name: EnvCircuitTimeouts, section: SectionFairness, value: whole(&c.CircuitTimeouts, 5, 1, 1000),
			doc: "Timeouts in a row that open a host's circuit ({range})."},
		{name: EnvCircuitOpen, section: SectionFairness, value: positive(&c.CircuitOpen, 30*time.Second),
			doc: "How long an open circuit keeps a host's jobs waiting before one send probes it."},
		{name: EnvEndpointKey, secret: true, section: SectionEndpoints, value: text(&c.EndpointKey, ""),
			check: func(v string) error { _, err := seal.Parse(v); return err },
			doc:   "Base64 keys of 32 bytes (`openssl rand -base64 32`); the first seals endpoints in queues and Redis, any opens them ([secrets](guarantees.md#personal-data-and-secrets))."},
		{name: EnvOperatorWebhook, secret: true, section: SectionOperator, value: text(&c.OperatorWebhook, ""), check: checkOperatorWebhook,
			doc: "`http(s)` URL that receives a JSON `POST` when notifications are delayed or a channel keeps failing, and when that is over; unset, no alerts. The endpoint guard does not apply (it is the operator's own)."},
		// Addresses are personal data: the log says whether there are any.
		{name: EnvOperatorEmail, section: SectionOperator, value: text(&c.OperatorEmail, ""), log: logWhetherSet,
			check: func(v string) error { return checkOperatorEmail(v, c.SMTPAddr) },
			doc:   "Comma-separated addresses that receive the same alerts by email, through `KLAXON_SMTP_ADDR` (which must be set)."},
		{name: EnvOperatorDelay, section: SectionOperator, value: positive(&c.OperatorDelay, 2*time.Minute),
			doc: "How long messages may wait untaken, events be counted late, or a channel fail before the operator is alerted."},
		{name: EnvMaxRules, section: SectionLimits, value: whole(&c.Limits.RulesPerProject, rules.DefaultRulesPerProject, 1, 1_000_000),
			doc: "Enabled rules loaded per project, in stored order ({range})."},
		{name: EnvMaxWindows, section: SectionLimits, value: whole(&c.Limits.WindowsPerRule, rules.MaxWindowsPerRule, 1, rules.MaxWindowsPerRule),
			doc: "Windows a rule may have ({range})."},
		{name: EnvMaxFilterWords, section: SectionLimits, value: whole(&c.Limits.FilterWords, rules.DefaultFilterWords, 1, 1_000_000),
			doc: "Words `including`, and `excluding`, may each hold ({range})."},
		{name: EnvMaxFilterWordBytes, section: SectionLimits, value: whole(&c.Limits.FilterWordBytes, rules.DefaultFilterWordBytes, 1, 1<<20),
			doc: "Longest filter word, in bytes ({range})."},
		{name: EnvMaxFilterBytes, section: SectionLimits, value: whole(&c.Limits.FilterBytes, rules.DefaultFilterBytes, 1, 1<<30),
			doc: "Bytes a rule's filter words may add up to ({range})."},
		{name: EnvMaxMatchedTitle, section: SectionLimits, value: whole(&c.Limits.MatchedTitleBytes, rules.DefaultMatchedTitleBytes, 1, 1<<30),
			doc: "How much of a title, from its start, the filters search, in bytes ({range})."},
		{name: EnvMaxEmailRecipients, section: SectionLimits, value: whole(&c.Limits.EmailRecipients, rules.DefaultEmailRecipients, 1, 10_000),
			doc: "Addresses an email endpoint may name ({range})."},
	}
}
