// Package config reads Klaxon's settings from environment variables
// (docs/configuration.md lists them), applies defaults and Hawk's alias
// names, and validates every value before anything starts.
//
// Load is the only entry point. It never reads the process environment
// itself: main passes os.Getenv, tests pass a map lookup. A value that is
// present but invalid yields an error of one line naming the variable;
// secrets (passwords, tokens, credentials inside URLs) never appear in errors,
// in Config.String or in Config.LogValue.
//
// docs/configuration.md is the user's reference for every variable.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/mail"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/seal"
	"github.com/klaxonhq/klaxon/internal/smtptls"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// Names of the environment variables Load reads.
const (
	EnvAMQPURL         = "KLAXON_AMQP_URL"
	EnvQueue           = "KLAXON_QUEUE"
	EnvQueueType       = "KLAXON_QUEUE_TYPE"
	EnvQueueShards     = "KLAXON_QUEUE_SHARDS"
	EnvQueues          = "KLAXON_QUEUES"
	EnvRedisURL        = "KLAXON_REDIS_URL"
	EnvMongoURL        = "KLAXON_MONGO_URL"
	EnvEventsMongoURL  = "KLAXON_EVENTS_MONGO_URL"
	EnvRulesFile       = "KLAXON_RULES_FILE"
	EnvPrefix          = "KLAXON_PREFIX"
	EnvHTTPAddr        = "KLAXON_HTTP_ADDR"
	EnvSMTPAddr        = "KLAXON_SMTP_ADDR"
	EnvSMTPUsername    = "KLAXON_SMTP_USERNAME"
	EnvSMTPPassword    = "KLAXON_SMTP_PASSWORD"
	EnvSMTPFrom        = "KLAXON_SMTP_FROM"
	EnvSMTPTLS         = "KLAXON_SMTP_TLS"
	EnvTelegramToken   = "KLAXON_TELEGRAM_TOKEN"
	EnvTelegramAPIURL  = "KLAXON_TELEGRAM_API_URL"
	EnvLogLevel        = "KLAXON_LOG_LEVEL"
	EnvRole            = "KLAXON_ROLE"
	EnvPrefetch        = "KLAXON_PREFETCH"
	EnvBatchSize       = "KLAXON_BATCH_SIZE"
	EnvBatchesInFlight = "KLAXON_BATCHES_IN_FLIGHT"
	EnvBatchLinger     = "KLAXON_BATCH_LINGER"
	EnvMaxHeldBytes    = "KLAXON_MAX_HELD_BYTES"
	EnvMaxBatchHold    = "KLAXON_MAX_BATCH_HOLD"
	EnvGroupsPerCall   = "KLAXON_REDIS_GROUPS_PER_CALL"
	EnvDedupTTL        = "KLAXON_DEDUP_TTL"
	EnvWaitReplicas    = "KLAXON_REDIS_WAIT_REPLICAS"
	EnvWaitTimeout     = "KLAXON_REDIS_WAIT_TIMEOUT"
	EnvRulesRefresh    = "KLAXON_RULES_REFRESH"
	EnvSendTimeout     = "KLAXON_SEND_TIMEOUT"
	EnvPprof           = "KLAXON_PPROF"
	EnvStormOver       = "KLAXON_STORM_OVER"
	// Where firings go: sent by Klaxon, or handed to Hawk's sender workers.
	EnvOutput           = "KLAXON_OUTPUT"
	EnvHawkSenderQueues = "KLAXON_HAWK_SENDER_QUEUES"
	// Endpoints from rules (internal/netguard).
	EnvAllowPrivateNetworks = "KLAXON_ALLOW_PRIVATE_NETWORKS"
	EnvAllowPorts           = "KLAXON_ALLOW_PORTS"
	EnvSlackHosts           = "KLAXON_SLACK_HOSTS"
	EnvTelegramHookHosts    = "KLAXON_TELEGRAM_HOOK_HOSTS"
	EnvLoopHosts            = "KLAXON_LOOP_HOSTS"
	// Bounds on what one project's firings and messages may take.
	EnvDigestMaxFirings = "KLAXON_DIGEST_MAX_FIRINGS"
	EnvDigestMaxBytes   = "KLAXON_DIGEST_MAX_BYTES"
	EnvDeadMaxMessages  = "KLAXON_DEAD_MAX_MESSAGES"
	EnvDeadMaxBytes     = "KLAXON_DEAD_MAX_BYTES"

	EnvTelegramAllowedChats = "KLAXON_TELEGRAM_ALLOWED_CHATS"
	EnvMaxRules             = "KLAXON_MAX_RULES_PER_PROJECT"
	EnvMaxWindows           = "KLAXON_MAX_WINDOWS_PER_RULE"
	EnvMaxFilterWords       = "KLAXON_MAX_FILTER_WORDS"
	EnvMaxFilterWordBytes   = "KLAXON_MAX_FILTER_WORD_BYTES"
	EnvMaxFilterBytes       = "KLAXON_MAX_FILTER_BYTES"
	EnvMaxMatchedTitle      = "KLAXON_MAX_MATCHED_TITLE_BYTES"
	EnvMaxEmailRecipients   = "KLAXON_MAX_EMAIL_RECIPIENTS"
	EnvEventURL             = "KLAXON_EVENT_URL"
	EnvEventURLFallback     = "KLAXON_EVENT_URL_FALLBACK"
	// Fairness between projects in the deliverer.
	EnvMaxSends           = "KLAXON_MAX_SENDS"
	EnvMaxSendsPerHost    = "KLAXON_MAX_SENDS_PER_HOST"
	EnvMaxSendsPerProject = "KLAXON_MAX_SENDS_PER_PROJECT"
	EnvCircuitTimeouts    = "KLAXON_CIRCUIT_TIMEOUTS"
	EnvCircuitOpen        = "KLAXON_CIRCUIT_OPEN"
	// Endpoints sealed wherever they leave the process (internal/seal).
	EnvEndpointKey = "KLAXON_ENDPOINT_KEY"
	// The operator channel: alerts about Klaxon itself (internal/watchdog).
	EnvOperatorWebhook = "KLAXON_OPERATOR_WEBHOOK"
	EnvOperatorEmail   = "KLAXON_OPERATOR_EMAIL"
	EnvOperatorDelay   = "KLAXON_OPERATOR_DELAY"
)

// Hawk's names for the same settings, and the defaults.
const (
	aliasAMQPURL        = "REGISTRY_URL"
	aliasRedisURL       = "REDIS_URL"
	aliasMongoURL       = "MONGO_ACCOUNTS_DATABASE_URI"
	aliasEventsMongoURL = "MONGO_EVENTS_DATABASE_URI"
	defaultEventsDB     = "hawk_events" // Hawk's events database
	defaultAMQPURL      = "amqp://guest:guest@127.0.0.1:5672/"
	defaultQueue        = "notifier"
	defaultRedisURL     = "redis://127.0.0.1:6379/0"
	defaultMongoDB      = "hawk" // Hawk's accounts database
	defaultMongoURL     = "mongodb://127.0.0.1:27017/" + defaultMongoDB
	defaultPrefix       = "klaxon"
	defaultHTTPAddr     = "127.0.0.1:9464"
	defaultSMTPFrom     = "klaxon@localhost"
	defaultSMTPTLS      = smtptls.StartTLS
	defaultTelegramAPI  = "https://api.telegram.org"
	defaultLogLevel     = "info"
	defaultRole         = string(RoleAll)
	// classic: what every earlier Klaxon made, so an upgrade finds its queues
	// as it declares them, and a single broker gains nothing from quorum.
	defaultQueueType       = "classic"
	defaultPrefetch        = 2000
	defaultBatchSize       = 1000
	defaultBatchesInFlight = 1
	defaultBatchLinger     = 2 * time.Millisecond
	maxBatchLinger         = 100 * time.Millisecond
	defaultBatchHold       = time.Minute
	defaultGroupsPerCall   = 32
	defaultDedupTTL        = 10 * time.Minute
	defaultWaitTimeout     = time.Second
	defaultRefresh         = 5 * time.Second
	defaultSendTimeout     = 10 * time.Second
	defaultPprof           = false
	defaultStormOver       = false
	defaultAllowPorts      = "80,443"
	defaultSlackHosts      = "hooks.slack.com/services/"
	defaultTelegramHooks   = "notify.bot.codex.so"
	// Loop is installed on each customer's own servers: no host is
	// everyone's. Operators narrow it to theirs.
	defaultLoopHosts     = "*"
	defaultDigestFirings = 500
	defaultDigestBytes   = 1 << 20
	defaultDeadMessages  = 100_000
	defaultDeadBytes     = 256 << 20
	defaultHeldBytes     = 64 << 20
	// Hawk's own page of an event group, by the group document's _id, as
	// Hawk's senders link to it (hawk.api loads an event by that id).
	defaultEventURL = "https://garage.hawk.so/project/{projectId}/event/{eventId}/overview"
	// defaultEventURLFallback is the link of the default KLAXON_EVENT_URL
	// when the event's id is unknown: Garage has no page of a group by its
	// hash, so the project's page, which lists its events.
	defaultEventURLFallback = "https://garage.hawk.so/project/{projectId}"
	// noEventURL leaves the link out: an empty value takes the default,
	// as for every variable.
	noEventURL          = "none"
	defaultSends        = 1024
	defaultSendsPerHost = 16
	defaultSendsPerProj = 32

	defaultCircuitTrips = 5
	defaultCircuitOpen  = 30 * time.Second

	defaultOutput = string(OutputSend)
	// Hawk's sender workers consume sender/email, sender/telegram, …
	defaultHawkSenderQueues = "sender/"
	defaultOperatorDelay    = 2 * time.Minute
)

// Variable describes one environment variable Load reads.
type Variable struct {
	Name    string // e.g. "KLAXON_AMQP_URL"
	Alias   string // Hawk's name for the same setting, or ""
	Default string // the value used when the variable is unset or empty; "" = unset
	Secret  bool   // the value, or part of it, is a credential and is never printed
	Usage   string // one sentence for humans
}

// Variables lists every variable Load reads, in the order of
// docs/configuration.md. Each call returns a new slice.
func Variables() []Variable {
	return []Variable{
		{EnvAMQPURL, aliasAMQPURL, defaultAMQPURL, true, "RabbitMQ URL (amqp:// or amqps://)"},
		{EnvQueue, "", defaultQueue, false, "queue of incoming Hawk events, declared durable if missing"},
		{EnvQueueType, "", defaultQueueType, false, "type of the queues Klaxon creates: classic or quorum; existing queues are used as they are"},
		{EnvQueueShards, "", "0", false, "hashed incoming queues <KLAXON_QUEUE>.0 … .N-1 that the consistent-hash exchange <KLAXON_QUEUE>.hash spreads events over by groupHash (0-256; 0 = KLAXON_QUEUE alone)"},
		{EnvQueues, "", "", false, "the incoming queues this worker consumes, comma-separated, among KLAXON_QUEUE and its hashed queues; empty = all of them"},
		{EnvRedisURL, aliasRedisURL, defaultRedisURL, true, "Redis URL: redis[s]:// single node, redis[s]+sentinel://, redis[s]+cluster://"},
		{EnvMongoURL, aliasMongoURL, defaultMongoURL, true, "MongoDB URL of the rules store; its path names the database"},
		{EnvEventsMongoURL, aliasEventsMongoURL, "", true, "MongoDB URL of Hawk's events database, for group history and resolved/ignored marks; unset = not used"},
		{EnvRulesFile, "", "", false, "YAML rules file used instead of MongoDB when set"},
		{EnvPrefix, "", defaultPrefix, false, "namespace of every Redis key and every queue Klaxon creates"},
		{EnvHTTPAddr, "", defaultHTTPAddr, false, "host:port serving /metrics, /healthz and /readyz"},
		{EnvSMTPAddr, "", "", false, "SMTP server host:port; email is disabled when unset"},
		{EnvSMTPUsername, "", "", false, "SMTP user name; no authentication when unset"},
		{EnvSMTPPassword, "", "", true, "SMTP password"},
		{EnvSMTPFrom, "", defaultSMTPFrom, false, "sender address of notification emails"},
		{EnvSMTPTLS, "", string(defaultSMTPTLS), false, "SMTP transport security: none, starttls or tls"},
		{EnvTelegramToken, "", "", true, "Telegram bot token; Telegram is disabled when unset"},
		{EnvTelegramAPIURL, "", defaultTelegramAPI, false, "Telegram Bot API base URL"},
		{EnvLogLevel, "", defaultLogLevel, false, "debug, info, warn or error"},
		{EnvRole, "", defaultRole, false, "what this process runs: all, evaluator or deliverer"},
		{EnvPrefetch, "", strconv.Itoa(defaultPrefetch), false, "unacknowledged messages one worker holds per queue (1-65535)"},
		{EnvBatchSize, "", strconv.Itoa(defaultBatchSize), false, "most events counted in one Redis call; at most KLAXON_PREFETCH"},
		{EnvBatchesInFlight, "", strconv.Itoa(defaultBatchesInFlight), false, "batches of an incoming queue one worker handles at once (1-4): with more than 1 the others decode and match while one counts, in smaller batches: more Redis reads and writes of each group's state an event"},
		{EnvBatchLinger, "", formatDuration(defaultBatchLinger), false, "how long a batch smaller than KLAXON_BATCH_SIZE waits for more events (0-100ms, 0: not at all): fewer Redis round trips an event, for that much latency"},
		{EnvMaxHeldBytes, "", formatSize(defaultHeldBytes), false, "bytes of incoming messages a worker holds unacknowledged before it pauses consuming (1MiB-16GiB)"},
		{EnvMaxBatchHold, "", formatDuration(defaultBatchHold), false, "how long a stage may hold a batch it retries after a failure before /readyz reports it"},
		{EnvGroupsPerCall, "", strconv.Itoa(defaultGroupsPerCall), false, "(project, group)s counted in one Lua call on a single Redis node or Sentinel (1-1000; always 1 on Cluster); 1 behind a proxy that routes commands by key"},
		{EnvDedupTTL, "", formatDuration(defaultDedupTTL), false, "how long a message's identity (message-id, else repetitionId) is remembered for de-duplication"},
		{EnvRulesRefresh, "", formatDuration(defaultRefresh), false, "how often rules are reloaded from MongoDB or the file"},
		{EnvSendTimeout, "", formatDuration(defaultSendTimeout), false, "time limit of one delivery attempt to a provider"},
		{EnvPprof, "", strconv.FormatBool(defaultPprof), false, "serve Go's profiler (net/http/pprof) under /debug/pprof/ on KLAXON_HTTP_ADDR"},
		{EnvStormOver, "", strconv.FormatBool(defaultStormOver), false, "send a \"storm over\" message after every SEEN_MORE rule's storm, unless the rule says stormOver: false"},
		{EnvOutput, "", defaultOutput, false, "what the deliverer does with a firing: send sends it through Klaxon's channels; hawk-senders publishes Hawk's sender task to <KLAXON_HAWK_SENDER_QUEUES><channel> for Hawk's own sender workers (docs/hawk.md)"},
		{EnvHawkSenderQueues, "", defaultHawkSenderQueues, false, "prefix of the queues of Hawk's sender workers, for KLAXON_OUTPUT=hawk-senders: <prefix>email, <prefix>telegram, …"},
		{EnvWaitReplicas, "", "0", false, "Redis replicas that must acknowledge a batch's writes before its messages are acked (0-16; Sentinel or single node)"},
		{EnvWaitTimeout, "", formatDuration(defaultWaitTimeout), false, "how long a write waits for KLAXON_REDIS_WAIT_REPLICAS before its batch is held and retried"},
		{EnvAllowPrivateNetworks, "", "", false, "CIDRs that endpoints from rules may reach besides the public internet, on any port"},
		{EnvAllowPorts, "", defaultAllowPorts, false, "ports endpoints from rules may reach on public addresses"},
		{EnvSlackHosts, "", defaultSlackHosts, false, "host[/path-prefix] patterns a Slack endpoint must match"},
		{EnvTelegramHookHosts, "", defaultTelegramHooks, false, "host[/path-prefix] patterns a Telegram hook URL must match"},
		{EnvLoopHosts, "", defaultLoopHosts, false, "host[/path-prefix] patterns a Loop endpoint must match"},
		{EnvDigestMaxFirings, "", strconv.Itoa(defaultDigestFirings), false, "most firings one digest lists (1-10000); the rest are counted as omitted"},
		{EnvDigestMaxBytes, "", formatSize(defaultDigestBytes), false, "most bytes of firings one digest gathers (1KiB-16MiB); the rest are counted as omitted"},
		{EnvDeadMaxMessages, "", strconv.Itoa(defaultDeadMessages), false, "most messages <queue>.dead and <prefix>.failed keep each; the oldest go first"},
		{EnvDeadMaxBytes, "", formatSize(defaultDeadBytes), false, "most bytes of bodies <queue>.dead and <prefix>.failed keep each; the oldest go first"},
		{EnvTelegramAllowedChats, "", "", false, "comma-separated chat ids and @usernames the bot may post to; empty = any chat the bot is in"},
		{EnvMaxRules, "", strconv.Itoa(rules.DefaultRulesPerProject), false, "enabled rules loaded per project; the rest are skipped with a warning"},
		{EnvMaxWindows, "", strconv.Itoa(rules.MaxWindowsPerRule), false, "windows a rule may have (1-8)"},
		{EnvMaxFilterWords, "", strconv.Itoa(rules.DefaultFilterWords), false, "words including, and excluding, may each hold"},
		{EnvMaxFilterWordBytes, "", strconv.Itoa(rules.DefaultFilterWordBytes), false, "longest filter word, in bytes"},
		{EnvMaxFilterBytes, "", strconv.Itoa(rules.DefaultFilterBytes), false, "bytes a rule's filter words may add up to"},
		{EnvMaxMatchedTitle, "", strconv.Itoa(rules.DefaultMatchedTitleBytes), false, "bytes at the start of an event title that filters search"},
		{EnvMaxEmailRecipients, "", strconv.Itoa(rules.DefaultEmailRecipients), false, "addresses an email endpoint may name"},
		{EnvEventURL, "", defaultEventURL, false, "link to an event in messages, with {projectId}, {groupHash} and {eventId} (the _id of the group in Hawk's events database); none leaves it out"},
		{EnvEventURLFallback, "", defaultEventURLFallback, false, "link when KLAXON_EVENT_URL has {eventId} and the event's id is unknown, with {projectId} and {groupHash}; none leaves it out; the default goes with the default KLAXON_EVENT_URL: with one of your own, unset leaves it out"},
		{EnvMaxSends, "", strconv.Itoa(defaultSends), false, "delivery jobs one worker works on at once, sends in flight included (16-65535); one channel may take half"},
		{EnvMaxSendsPerHost, "", strconv.Itoa(defaultSendsPerHost), false, "sends one host (host:port of an endpoint, the SMTP server, the Bot API) may have in flight in a worker (1-4096); four times that per resolved address"},
		{EnvMaxSendsPerProject, "", strconv.Itoa(defaultSendsPerProj), false, "sends one project may have in flight in a worker (1-4096)"},
		{EnvCircuitTimeouts, "", strconv.Itoa(defaultCircuitTrips), false, "consecutive timeouts that open a destination's circuit (1-1000)"},
		{EnvCircuitOpen, "", formatDuration(defaultCircuitOpen), false, "how long an open circuit keeps a destination's jobs waiting before one send probes it"},
		{EnvEndpointKey, "", "", true, "comma-separated base64 keys of 32 bytes: endpoints are sealed (AES-GCM) with the first in queues and Redis, opened with any; unset = in clear"},
		{EnvOperatorWebhook, "", "", true, "http(s) URL that receives Klaxon's alerts about itself (notifications delayed, a channel failing) as JSON, sent directly by each worker; unset = none"},
		{EnvOperatorEmail, "", "", false, "comma-separated addresses that receive the same alerts by email through KLAXON_SMTP_ADDR; unset = none"},
		{EnvOperatorDelay, "", formatDuration(defaultOperatorDelay), false, "how long notifications may be held up (messages waiting untaken, events counted late) or a channel fail before KLAXON_OPERATOR_WEBHOOK is alerted"},
	}
}

// Config is Klaxon's validated configuration. Its zero value is not useful;
// get one from Load.
//
// Fields that hold credentials (AMQPURL, RedisURL, MongoURL, SMTPPassword,
// TelegramToken) are plain strings for the code that connects; print a Config
// only through String or LogValue, which redact them.
type Config struct {
	AMQPURL       string // KLAXON_AMQP_URL
	Queue         string // KLAXON_QUEUE; dead letters go to Queue + ".dead"
	QueueType     string // KLAXON_QUEUE_TYPE: "classic" or "quorum"
	QueueShards   int    // KLAXON_QUEUE_SHARDS: hashed queues wire.HashedQueue(Queue, i); 0 for none
	Queues        string // KLAXON_QUEUES, canonical comma-separated; "" = all (use IncomingQueues)
	RedisURL      string // KLAXON_REDIS_URL; use RedisOptions to connect
	MongoURL      string // KLAXON_MONGO_URL, as given (pass it to the driver)
	MongoDatabase string // the database named by MongoURL's path, "hawk" when none
	// EventsMongoURL is Hawk's events database (KLAXON_EVENTS_MONGO_URL),
	// "" when not configured; EventsDatabase is the database its path
	// names, "hawk_events" when none.
	EventsMongoURL  string
	EventsDatabase  string
	RulesFile       string        // KLAXON_RULES_FILE; "" = rules come from MongoDB
	Prefix          string        // KLAXON_PREFIX
	HTTPAddr        string        // KLAXON_HTTP_ADDR
	SMTPAddr        string        // KLAXON_SMTP_ADDR; "" = email channel not configured
	SMTPUsername    string        // KLAXON_SMTP_USERNAME; "" = no SMTP AUTH
	SMTPPassword    string        // KLAXON_SMTP_PASSWORD
	SMTPFrom        string        // KLAXON_SMTP_FROM, an RFC 5322 address
	SMTPTLS         smtptls.Mode  // KLAXON_SMTP_TLS
	TelegramToken   string        // KLAXON_TELEGRAM_TOKEN; "" = Telegram channel not configured
	TelegramAPI     string        // KLAXON_TELEGRAM_API_URL, without a trailing slash
	LogLevel        slog.Level    // KLAXON_LOG_LEVEL
	Role            Role          // KLAXON_ROLE
	Prefetch        int           // KLAXON_PREFETCH, 1..65535
	BatchSize       int           // KLAXON_BATCH_SIZE, 1..Prefetch
	BatchesInFlight int           // KLAXON_BATCHES_IN_FLIGHT, 1..4
	BatchLinger     time.Duration // KLAXON_BATCH_LINGER, 0..100ms; 0 = none
	MaxHeldBytes    int64         // KLAXON_MAX_HELD_BYTES, of the incoming queue's consumer
	MaxBatchHold    time.Duration // KLAXON_MAX_BATCH_HOLD, > 0
	GroupsPerCall   int           // KLAXON_REDIS_GROUPS_PER_CALL, 1..1000
	DedupTTL        time.Duration // KLAXON_DEDUP_TTL, > 0
	WaitReplicas    int           // KLAXON_REDIS_WAIT_REPLICAS, 0..16; 0 = no WAIT
	WaitTimeout     time.Duration // KLAXON_REDIS_WAIT_TIMEOUT, > 0
	RulesRefresh    time.Duration // KLAXON_RULES_REFRESH, > 0
	SendTimeout     time.Duration // KLAXON_SEND_TIMEOUT, > 0
	Pprof           bool          // KLAXON_PPROF: serve /debug/pprof/ on HTTPAddr
	StormOver       bool          // KLAXON_STORM_OVER: "storm over" messages for rules that do not say
	Output          Output        // KLAXON_OUTPUT
	// HawkSenderQueues is the prefix of Hawk's sender queues
	// (KLAXON_HAWK_SENDER_QUEUES), used when Output is OutputHawkSenders.
	HawkSenderQueues string
	// What endpoints from rules may reach, in canonical comma-separated
	// form (kept as strings so that a Config compares with ==); use
	// EndpointPolicy, SlackPatterns and TelegramHookPatterns.
	AllowPrivateNetworks string // KLAXON_ALLOW_PRIVATE_NETWORKS, e.g. "127.0.0.0/8,::1/128"; "" = none
	AllowPorts           string // KLAXON_ALLOW_PORTS, e.g. "80,443"
	SlackHosts           string // KLAXON_SLACK_HOSTS
	TelegramHookHosts    string // KLAXON_TELEGRAM_HOOK_HOSTS
	LoopHosts            string // KLAXON_LOOP_HOSTS
	// DigestMaxFirings and DigestMaxBytes bound a (rule, channel)'s
	// digest (KLAXON_DIGEST_MAX_FIRINGS, KLAXON_DIGEST_MAX_BYTES).
	DigestMaxFirings int
	DigestMaxBytes   int
	// DeadMaxMessages and DeadMaxBytes bound <queue>.dead and
	// <prefix>.failed (KLAXON_DEAD_MAX_MESSAGES, KLAXON_DEAD_MAX_BYTES).
	DeadMaxMessages int
	DeadMaxBytes    int64
	// TelegramAllowedChats are the chats the bot may post to
	// (KLAXON_TELEGRAM_ALLOWED_CHATS), comma-separated without spaces;
	// empty means any. A string keeps Config comparable.
	TelegramAllowedChats string
	// EventURL is the template of a link to an event in messages, with
	// {projectId}, {groupHash} and {eventId} (KLAXON_EVENT_URL); "" leaves
	// it out.
	EventURL string
	// EventURLFallback is the link, with {projectId} and {groupHash}, of
	// an event whose id is unknown when EventURL has {eventId}
	// (KLAXON_EVENT_URL_FALLBACK); "" leaves it out.
	EventURLFallback string
	// Limits bound each project's rules (KLAXON_MAX_*).
	Limits rules.Limits
	// MaxSends bounds the delivery jobs one worker works on at once;
	// MaxSendsPerHost and MaxSendsPerProject bound the sends in flight in
	// it per host and per project; a host whose sends time out
	// CircuitTimeouts times in a row has its circuit opened for
	// CircuitOpen (KLAXON_MAX_SENDS*, KLAXON_CIRCUIT_*).
	MaxSends           int
	MaxSendsPerHost    int
	MaxSendsPerProject int
	CircuitTimeouts    int
	CircuitOpen        time.Duration
	// EndpointKey is KLAXON_ENDPOINT_KEY as given (a string keeps Config
	// comparable; Load checked it); use EndpointKeys.
	EndpointKey string
	// OperatorWebhook receives alerts about Klaxon itself
	// (KLAXON_OPERATOR_WEBHOOK), "" for none; OperatorDelay is how long a
	// delay or a failing channel lasts before it does (KLAXON_OPERATOR_DELAY).
	OperatorWebhook string
	OperatorEmail   string // KLAXON_OPERATOR_EMAIL, addresses; "" for none
	OperatorDelay   time.Duration
}

// OperatorAlerts reports whether an operator channel is configured.
func (c Config) OperatorAlerts() bool { return c.OperatorWebhook != "" || c.OperatorEmail != "" }

// EndpointKeys are the keys endpoints are sealed and opened with; nil when
// KLAXON_ENDPOINT_KEY is unset, and endpoints travel in clear.
func (c Config) EndpointKeys() *seal.Keys {
	ks, _ := seal.Parse(c.EndpointKey) // checked by Load
	return ks
}

// EmailEnabled reports whether the email channel is configured.
func (c Config) EmailEnabled() bool { return c.SMTPAddr != "" }

// TelegramEnabled reports whether the Telegram channel is configured.
func (c Config) TelegramEnabled() bool { return c.TelegramToken != "" }

// IncomingQueue is an incoming queue the worker consumes.
type IncomingQueue struct {
	Name string
	// Exchange is the consistent-hash exchange the queue is bound to, ""
	// for KLAXON_QUEUE itself, which producers reach through the default
	// exchange (Hawk's routing key `notifier`).
	Exchange string
}

// IncomingQueues are the queues this worker consumes (KLAXON_QUEUES):
// KLAXON_QUEUE and its hashed queues unless it names fewer.
func (c Config) IncomingQueues() []IncomingQueue {
	names := incomingQueues(c.Queue, c.QueueShards)
	if c.Queues != "" {
		names = strings.Split(c.Queues, ",")
	}
	out := make([]IncomingQueue, len(names))
	for i, n := range names {
		out[i] = IncomingQueue{Name: n}
		if n != c.Queue {
			out[i].Exchange = wire.HashExchange(c.Queue)
		}
	}
	return out
}

// Role is which stages a process runs.
type Role string

// Roles (KLAXON_ROLE).
const (
	RoleAll       Role = "all"       // evaluator and deliverer in one process
	RoleEvaluator Role = "evaluator" // consumes events, counts, publishes delivery jobs
	RoleDeliverer Role = "deliverer" // consumes delivery jobs and sends notifications
)

// Evaluates reports whether the role consumes incoming events.
func (r Role) Evaluates() bool { return r == RoleAll || r == RoleEvaluator }

// Delivers reports whether the role sends notifications.
func (r Role) Delivers() bool { return r == RoleAll || r == RoleDeliverer }

// Error reports one variable that is set but invalid. Its message is one line
// and never contains a secret.
type Error struct {
	Var    string // the KLAXON_ name of the setting
	Via    string // the Hawk alias the value was read from, or ""
	Reason string // what is wrong, e.g. `"ssl" is not one of none, starttls, tls`
}

func (e *Error) Error() string {
	if e.Via != "" {
		return e.Via + " (alias of " + e.Var + "): " + e.Reason
	}
	return e.Var + ": " + e.Reason
}

// errorList is what Load returns when several variables are invalid: still
// one line, each problem separated by "; ".
type errorList []error

func (l errorList) Error() string {
	msgs := make([]string, len(l))
	for i, err := range l {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (l errorList) Unwrap() []error { return l }

// loader collects the values and the problems of one Load call.
type loader struct {
	getenv  func(string) string
	secrets []string // strings that must never appear in a message
	errs    errorList
}

// setting is one variable's raw value and where it came from.
type setting struct {
	name  string // KLAXON_ name
	via   string // alias it was read from, or ""
	value string // raw value; "" when unset
}

func (s setting) set() bool { return s.value != "" }

// lookup reads a variable, falling back to its Hawk alias. The KLAXON_ name
// wins when both are set. Values are trimmed of surrounding white space
// (a trailing newline from a mounted secret is a classic) unless raw is set.
func (l *loader) lookup(name, alias string, raw bool) setting {
	trim := func(v string) string {
		if raw {
			return v
		}
		return strings.TrimSpace(v)
	}
	if v := trim(l.getenv(name)); v != "" {
		return setting{name: name, value: v}
	}
	if alias != "" {
		if v := trim(l.getenv(alias)); v != "" {
			return setting{name: name, via: alias, value: v}
		}
	}
	return setting{name: name}
}

// eventURL reads KLAXON_EVENT_URL and KLAXON_EVENT_URL_FALLBACK: absolute
// http(s) URLs once their placeholders are filled in, or "none". The
// fallback stands in for an unknown {eventId}, so it may not have one.
func (l *loader) eventURL(c *Config) {
	s := l.lookup(EnvEventURL, "", false)
	switch {
	case !s.set():
		c.EventURL = defaultEventURL
	case strings.EqualFold(s.value, noEventURL):
		c.EventURL = ""
	default:
		c.EventURL = l.linkTemplate(s, "{projectId}, {groupHash} and {eventId}")
	}
	f := l.lookup(EnvEventURLFallback, "", false)
	switch {
	case !f.set():
		// Garage's project page is no fallback for an installation of
		// one's own: without a fallback set, its link is left out.
		if c.EventURL == defaultEventURL {
			c.EventURLFallback = defaultEventURLFallback
		}
	case strings.EqualFold(f.value, noEventURL):
	case strings.Contains(f.value, "{eventId}"):
		l.fail(f, fmt.Sprintf("%q has {eventId}, which is what is unknown when the fallback is used; use {projectId} and {groupHash}, or none", f.value))
	default:
		c.EventURLFallback = l.linkTemplate(f, "{projectId} and {groupHash}")
	}
}

// linkTemplate checks that s is an absolute http(s) URL once its
// placeholders are filled in.
func (l *loader) linkTemplate(s setting, placeholders string) string {
	filled := strings.NewReplacer("{projectId}", "5e3eef0679fa3700a0198a49", "{groupHash}", "0", "{eventId}", "65f0c0ffee0000000000beef").Replace(s.value)
	if u, err := url.Parse(filled); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		l.fail(s, fmt.Sprintf("%q is not an absolute http(s) URL (with %s), or none", s.value, placeholders))
	}
	return s.value
}

// endpointKey reads KLAXON_ENDPOINT_KEY: base64 keys of 32 bytes.
func (l *loader) endpointKey() string {
	s := l.lookup(EnvEndpointKey, "", false)
	if _, err := seal.Parse(s.value); err != nil {
		l.fail(s, err.Error())
	}
	return s.value
}

// fail records that s is invalid. The reason is reduced to one line and
// scrubbed of every known secret, whatever a library put into it.
func (l *loader) fail(s setting, reason string) {
	reason = strings.Join(strings.Fields(reason), " ")
	for _, secret := range l.secrets {
		reason = strings.ReplaceAll(reason, secret, redacted)
	}
	l.errs = append(l.errs, &Error{Var: s.name, Via: s.via, Reason: reason})
}

// Load reads every Klaxon variable through getenv (os.Getenv in main),
// applies defaults and Hawk aliases, and validates the result. An empty value
// counts as unset. When a value is invalid, the error names the variable in
// one line (several problems are joined by "; " on that same line); errors.As
// with *Error finds the first.
func Load(getenv func(string) string) (Config, error) {
	l := &loader{getenv: getenv}
	for _, v := range Variables() {
		if !v.Secret {
			continue
		}
		for _, name := range []string{v.Name, v.Alias} {
			if name != "" {
				l.secrets = append(l.secrets, secretParts(getenv(name))...)
			}
		}
	}

	var c Config
	c.AMQPURL = l.amqpURL()
	c.Queue = l.queue()
	c.QueueType = l.queueType()
	c.QueueShards = l.count(EnvQueueShards, 0, 0, maxQueueShards)
	c.Queues = l.queues(c.Queue, c.QueueShards)
	c.RedisURL = l.redisURL()
	c.MongoURL, c.MongoDatabase = l.mongoURL()
	c.EventsMongoURL, c.EventsDatabase = l.eventsMongoURL()
	c.RulesFile = l.lookup(EnvRulesFile, "", false).value
	c.Prefix = l.prefix()
	c.HTTPAddr = l.listenAddr(EnvHTTPAddr, defaultHTTPAddr)
	l.smtp(&c)
	c.TelegramToken, c.TelegramAPI = l.telegram()
	c.LogLevel = l.logLevel()
	c.Role = l.role()
	c.Prefetch, c.BatchSize = l.batching()
	c.BatchesInFlight = l.count(EnvBatchesInFlight, defaultBatchesInFlight, 1, 4)
	c.BatchLinger = l.linger()
	c.MaxHeldBytes = l.size(EnvMaxHeldBytes, defaultHeldBytes, 1<<20, 16<<30)
	c.MaxBatchHold = l.duration(EnvMaxBatchHold, defaultBatchHold)
	c.GroupsPerCall = l.groupsPerCall()
	c.DedupTTL = l.duration(EnvDedupTTL, defaultDedupTTL)
	c.WaitReplicas, c.WaitTimeout = l.wait(c.RedisURL)
	c.RulesRefresh = l.duration(EnvRulesRefresh, defaultRefresh)
	c.SendTimeout = l.duration(EnvSendTimeout, defaultSendTimeout)
	c.Pprof = l.boolean(EnvPprof, defaultPprof)
	c.StormOver = l.boolean(EnvStormOver, defaultStormOver)
	c.Output = l.output()
	c.HawkSenderQueues = l.hawkSenderQueues()
	l.endpoints(&c)
	c.DigestMaxFirings = l.count(EnvDigestMaxFirings, defaultDigestFirings, 1, 10_000)
	c.DigestMaxBytes = int(l.size(EnvDigestMaxBytes, defaultDigestBytes, 1<<10, 16<<20))
	c.DeadMaxMessages = l.count(EnvDeadMaxMessages, defaultDeadMessages, 1, 100_000_000)
	c.DeadMaxBytes = l.size(EnvDeadMaxBytes, defaultDeadBytes, 1<<20, 1<<40)
	c.TelegramAllowedChats = l.chats()
	l.eventURL(&c)
	c.MaxSends = l.count(EnvMaxSends, defaultSends, 16, 65535)
	c.MaxSendsPerHost = l.count(EnvMaxSendsPerHost, defaultSendsPerHost, 1, 4096)
	c.MaxSendsPerProject = l.count(EnvMaxSendsPerProject, defaultSendsPerProj, 1, 4096)
	c.CircuitTimeouts = l.count(EnvCircuitTimeouts, defaultCircuitTrips, 1, 1000)
	c.CircuitOpen = l.duration(EnvCircuitOpen, defaultCircuitOpen)
	c.EndpointKey = l.endpointKey()
	if s := l.lookup(EnvOperatorWebhook, "", false); s.set() {
		// The URL may hold a token: the error says what is wrong, not the value.
		if u, err := url.Parse(s.value); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			l.fail(s, "is not an absolute http(s) URL")
		} else if u.User != nil {
			l.fail(s, "holds a user name or password (user:pass@), which is not sent; put a token in the path or query instead")
		}
		c.OperatorWebhook = s.value
	}
	if s := l.lookup(EnvOperatorEmail, "", false); s.set() {
		// Addresses are personal data: the error says which, by position.
		for i, a := range strings.Split(s.value, ",") {
			if _, err := mail.ParseAddress(strings.TrimSpace(a)); err != nil {
				l.fail(s, fmt.Sprintf("address %d is not an email address", i+1))
			}
		}
		if c.SMTPAddr == "" {
			l.fail(s, "is set but "+EnvSMTPAddr+" is not: the alerts are sent through it")
		}
		c.OperatorEmail = s.value
	}
	c.OperatorDelay = l.duration(EnvOperatorDelay, defaultOperatorDelay)
	c.Limits = rules.Limits{
		RulesPerProject:   l.count(EnvMaxRules, rules.DefaultRulesPerProject, 1, 1_000_000),
		WindowsPerRule:    l.count(EnvMaxWindows, rules.MaxWindowsPerRule, 1, rules.MaxWindowsPerRule),
		FilterWords:       l.count(EnvMaxFilterWords, rules.DefaultFilterWords, 1, 1_000_000),
		FilterWordBytes:   l.count(EnvMaxFilterWordBytes, rules.DefaultFilterWordBytes, 1, 1<<20),
		FilterBytes:       l.count(EnvMaxFilterBytes, rules.DefaultFilterBytes, 1, 1<<30),
		MatchedTitleBytes: l.count(EnvMaxMatchedTitle, rules.DefaultMatchedTitleBytes, 1, 1<<30),
		EmailRecipients:   l.count(EnvMaxEmailRecipients, rules.DefaultEmailRecipients, 1, 10_000),
	}

	switch len(l.errs) {
	case 0:
		return c, nil
	case 1:
		return Config{}, l.errs[0]
	default:
		return Config{}, l.errs
	}
}

func (l *loader) amqpURL() string {
	s := l.lookup(EnvAMQPURL, aliasAMQPURL, false)
	if !s.set() {
		return defaultAMQPURL
	}
	if err := checkAMQPURL(s.value); err != nil {
		l.fail(s, err.Error())
	}
	return s.value
}

func checkAMQPURL(raw string) error {
	u, err := splitURL(raw)
	if err != nil {
		return err
	}
	if u.scheme != "amqp" && u.scheme != "amqps" {
		return fmt.Errorf("scheme %q is not one of amqp, amqps", u.scheme)
	}
	if len(u.hosts) != 1 {
		return errors.New("names several hosts; an AMQP URL names one")
	}
	if err := checkHostPort(u.hosts[0], false); err != nil {
		return err
	}
	uri, err := amqp.ParseURI(raw)
	if err != nil {
		return fmt.Errorf("not a valid AMQP URL: %s", innerURLError(err))
	}
	// amqp091 reads these only when it dials, and fails every dial on a bad
	// one: the worker would retry forever, never ready, instead of stopping.
	for _, m := range uri.AuthMechanism {
		switch strings.ToUpper(m) {
		case "PLAIN", "AMQPLAIN", "EXTERNAL":
		default:
			return fmt.Errorf("auth_mechanism %q is not one of PLAIN, AMQPLAIN, EXTERNAL", m)
		}
	}
	if uri.Scheme == "amqps" {
		// amqp091 sends no client certificate, without a word, unless it
		// has both halves.
		if (uri.CertFile == "") != (uri.KeyFile == "") {
			return errors.New("certfile and keyfile go together: set both for a client certificate, or neither")
		}
		for _, f := range []struct{ param, path string }{
			{"cacertfile", uri.CACertFile}, {"certfile", uri.CertFile}, {"keyfile", uri.KeyFile},
		} {
			if f.path == "" {
				continue
			}
			if _, err := os.ReadFile(f.path); err != nil {
				return fmt.Errorf("%s: %w", f.param, err)
			}
		}
	}
	return nil
}

func (l *loader) queue() string {
	s := l.lookup(EnvQueue, "", false)
	if !s.set() {
		return defaultQueue
	}
	switch {
	case strings.HasPrefix(s.value, "amq."):
		l.fail(s, fmt.Sprintf("%q starts with amq., which RabbitMQ reserves", s.value))
	case len(s.value)+len(".dead") > 255:
		l.fail(s, fmt.Sprintf("is %d bytes long; the limit is 250 so that %q fits RabbitMQ's 255", len(s.value), "<queue>.dead"))
	case strings.IndexFunc(s.value, unicode.IsControl) >= 0:
		l.fail(s, fmt.Sprintf("%q contains a control character", s.value))
	}
	return s.value
}

// maxQueueShards bounds KLAXON_QUEUE_SHARDS: each hashed queue a worker
// consumes is a connection of its own, and docs/scaling.md plans 1M
// events/s with 48.
const maxQueueShards = 256

// queues reads KLAXON_QUEUES: names among base and its hashed queues, each
// once.
func (l *loader) queues(base string, shards int) string {
	s := l.lookup(EnvQueues, "", false)
	if !s.set() {
		return ""
	}
	known := incomingQueues(base, shards)
	var names []string
	for name := range strings.SplitSeq(s.value, ",") {
		name = strings.TrimSpace(name)
		switch {
		case name == "":
			continue
		case slices.Contains(names, name):
			l.fail(s, fmt.Sprintf("names %q twice", name))
			return ""
		case !slices.Contains(known, name):
			l.fail(s, fmt.Sprintf("%q is not one of the incoming queues: %s (%s=%q, %s=%d)",
				name, describeQueues(known), EnvQueue, base, EnvQueueShards, shards))
			return ""
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		l.fail(s, "names no queue")
	}
	return strings.Join(names, ",")
}

// incomingQueues are base and its hashed queues, in that order.
func incomingQueues(base string, shards int) []string {
	out := []string{base}
	for i := range shards {
		out = append(out, wire.HashedQueue(base, i))
	}
	return out
}

// describeQueues lists queues for an error: the first two, an ellipsis and
// the last when there are many.
func describeQueues(qs []string) string {
	if len(qs) > 4 {
		return strings.Join(qs[:2], ", ") + " … " + qs[len(qs)-1]
	}
	return strings.Join(qs, ", ")
}

func (l *loader) redisURL() string {
	s := l.lookup(EnvRedisURL, aliasRedisURL, false)
	if !s.set() {
		return defaultRedisURL
	}
	if _, err := parseRedisURL(s.value); err != nil {
		l.fail(s, err.Error())
	}
	return s.value
}

func (l *loader) mongoURL() (string, string) {
	s := l.lookup(EnvMongoURL, aliasMongoURL, false)
	if !s.set() {
		return defaultMongoURL, defaultMongoDB
	}
	db, err := parseMongoURL(s.value)
	if err != nil {
		l.fail(s, err.Error())
	}
	return s.value, db
}

// eventsMongoURL is optional: unset, Klaxon reads no events database.
func (l *loader) eventsMongoURL() (string, string) {
	s := l.lookup(EnvEventsMongoURL, aliasEventsMongoURL, false)
	if !s.set() {
		return "", ""
	}
	db, err := parseMongoURL(s.value)
	if err != nil {
		l.fail(s, err.Error())
	}
	if !hasDatabase(s.value) {
		db = defaultEventsDB
	}
	return s.value, db
}

// hasDatabase reports whether a MongoDB URL's path names a database.
func hasDatabase(raw string) bool {
	_, rest, _ := strings.Cut(raw, "://")
	_, path, _ := strings.Cut(rest, "/")
	path, _, _ = strings.Cut(path, "?")
	return path != ""
}

// parseMongoURL checks the parts of a MongoDB connection string Klaxon relies
// on and returns the database its path names. The driver validates the
// options when it connects; it is not called here because a mongodb+srv URL
// would make it look up DNS.
func parseMongoURL(raw string) (string, error) {
	u, err := splitURL(raw)
	if err != nil {
		return "", err
	}
	switch u.scheme {
	case "mongodb":
		for _, h := range u.hosts {
			if err := checkHostPort(h, false); err != nil {
				return "", err
			}
		}
	case "mongodb+srv":
		if len(u.hosts) != 1 || strings.Contains(u.hosts[0], ":") {
			return "", errors.New("a mongodb+srv URL names exactly one host name, without a port")
		}
		if err := checkHostPort(u.hosts[0], false); err != nil {
			return "", err
		}
	default:
		return "", fmt.Errorf("scheme %q is not one of mongodb, mongodb+srv", u.scheme)
	}
	if u.rest != "" && !strings.HasPrefix(u.rest, "/") {
		return "", errors.New(`needs a "/" between the hosts and the options, as in mongodb://host:27017/hawk?replicaSet=rs0`)
	}
	path, _, _ := strings.Cut(u.rest, "?")
	db, err := urlUnescape(strings.TrimPrefix(path, "/"))
	if err != nil {
		return "", fmt.Errorf("database name in the path: %w", err)
	}
	if db == "" {
		db = defaultMongoDB
	} else if i := strings.IndexAny(db, "/\\. \"$*<>:|?"); i >= 0 || len(db) >= 64 {
		return "", fmt.Errorf("database name %q is not valid in MongoDB (no /\\. \"$*<>:|? and under 64 bytes)", db)
	}
	if err := checkMongoOptions(raw, u); err != nil {
		return "", err
	}
	return db, nil
}

// checkMongoOptions has the driver's own parser check the options, as it
// would when the worker builds its client: otherwise a bad option stops the
// worker after it started, in an error naming no variable. The parser looks
// up a mongodb+srv URL's DNS records, which must not decide whether a
// configuration is valid; that form is checked as the mongodb:// URL of the
// same host, without the options only SRV allows.
func checkMongoOptions(raw string, u urlParts) error {
	if u.scheme == "mongodb+srv" {
		_, after, _ := strings.Cut(raw, "://")
		base, query, hasQuery := strings.Cut(after, "?")
		raw = "mongodb://" + base
		if hasQuery {
			var kept []string
			for pair := range strings.SplitSeq(query, "&") {
				k, _, _ := strings.Cut(pair, "=")
				if k := strings.ToLower(k); k != "srvmaxhosts" && k != "srvservicename" {
					kept = append(kept, pair)
				}
			}
			raw += "?" + strings.Join(kept, "&")
		}
	}
	if _, err := connstring.ParseAndValidate(raw); err != nil {
		msg := err.Error()
		for _, prefix := range []string{"error parsing uri: ", "error validating uri: "} {
			msg = strings.TrimPrefix(msg, prefix)
		}
		return errors.New(msg)
	}
	return nil
}

func (l *loader) prefix() string {
	s := l.lookup(EnvPrefix, "", false)
	if !s.set() {
		return defaultPrefix
	}
	switch {
	case strings.ContainsAny(s.value, "{}"):
		l.fail(s, fmt.Sprintf("%q contains { or }, which would make a Redis Cluster hash tag", s.value))
	case strings.IndexFunc(s.value, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		l.fail(s, fmt.Sprintf("%q contains white space", s.value))
	case s.value == "amq" || strings.HasPrefix(s.value, "amq."):
		l.fail(s, fmt.Sprintf("%q would name queues amq.*, which RabbitMQ reserves", s.value))
	case len(s.value) > 64:
		l.fail(s, fmt.Sprintf("is %d bytes long; the limit is 64", len(s.value)))
	}
	return s.value
}

// listenAddr reads a host:port to listen on; the host may be empty (all
// interfaces) and the port 0 (any free port).
func (l *loader) listenAddr(name, def string) string {
	s := l.lookup(name, "", false)
	if !s.set() {
		return def
	}
	host, port, err := net.SplitHostPort(s.value)
	if err == nil {
		err = checkPort(port, 0)
	}
	if err == nil && strings.ContainsAny(host, " /@") {
		err = fmt.Errorf("host %q is not valid", host)
	}
	if err != nil {
		l.fail(s, fmt.Sprintf("%q is not host:port (for example 0.0.0.0:9464): %v", s.value, err))
	}
	return s.value
}

func (l *loader) smtp(c *Config) {
	if s := l.lookup(EnvSMTPAddr, "", false); s.set() {
		c.SMTPAddr = s.value
		if err := checkHostPort(s.value, true); err != nil {
			l.fail(s, fmt.Sprintf("%q is not host:port (for example smtp.example.com:587): %v", s.value, err))
		}
	}
	user := l.lookup(EnvSMTPUsername, "", false)
	pass := l.lookup(EnvSMTPPassword, "", true)
	c.SMTPUsername, c.SMTPPassword = user.value, pass.value
	if pass.set() && !user.set() {
		l.fail(pass, "is set but "+EnvSMTPUsername+" is not")
	}

	c.SMTPFrom = defaultSMTPFrom
	if s := l.lookup(EnvSMTPFrom, "", false); s.set() {
		c.SMTPFrom = s.value
		if _, err := mail.ParseAddress(s.value); err != nil {
			l.fail(s, fmt.Sprintf("%q is not an email address: %v", s.value, err))
		}
	}

	c.SMTPTLS = defaultSMTPTLS
	if s := l.lookup(EnvSMTPTLS, "", false); s.set() {
		switch m := smtptls.Mode(strings.ToLower(s.value)); m {
		case smtptls.None, smtptls.StartTLS, smtptls.Implicit:
			c.SMTPTLS = m
		default:
			l.fail(s, fmt.Sprintf("%q is not one of none, starttls, tls", s.value))
		}
		// The email channel refuses to send a password in clear beyond this
		// machine; say so here, naming the variable, not when it is built.
		host, _, err := net.SplitHostPort(c.SMTPAddr)
		if c.SMTPTLS == smtptls.None && c.SMTPUsername != "" && err == nil && !smtptls.IsLocalhost(host) {
			l.fail(s, fmt.Sprintf("%q would send %s in clear to %s: use starttls or tls (none is for a relay on localhost)",
				s.value, EnvSMTPPassword, host))
		}
	}
}

func (l *loader) telegram() (token, api string) {
	if s := l.lookup(EnvTelegramToken, "", false); s.set() {
		token = s.value
		if strings.IndexFunc(token, func(r rune) bool {
			return strings.ContainsRune("/?#%", r) || unicode.IsSpace(r) || unicode.IsControl(r)
		}) >= 0 {
			l.fail(s, "contains white space or one of / ? # %; a bot token looks like 123456789:AAE...")
		}
	}

	api = defaultTelegramAPI
	if s := l.lookup(EnvTelegramAPIURL, "", false); s.set() {
		api = strings.TrimRight(s.value, "/")
		if err := checkHTTPURL(s.value); err != nil {
			l.fail(s, err.Error())
		}
	}
	return token, api
}

func checkHTTPURL(raw string) error {
	u, err := splitURL(raw)
	if err != nil {
		return err
	}
	if u.scheme != "http" && u.scheme != "https" {
		return fmt.Errorf("scheme %q is not one of http, https", u.scheme)
	}
	if len(u.hosts) != 1 || u.hosts[0] == "" {
		return errors.New("needs exactly one host, as in https://api.telegram.org")
	}
	if err := checkHostPort(u.hosts[0], false); err != nil {
		return err
	}
	if strings.ContainsAny(u.rest, "?#") {
		return errors.New("must not have a query or a fragment")
	}
	if _, err := url.Parse(raw); err != nil {
		return errors.New("is not a valid URL: check its percent-encoding")
	}
	return nil
}

func (l *loader) logLevel() slog.Level {
	s := l.lookup(EnvLogLevel, "", false)
	if !s.set() {
		return slog.LevelInfo
	}
	switch strings.ToLower(s.value) {
	case "debug":
		return slog.LevelDebug
	case "info":
		return slog.LevelInfo
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	l.fail(s, fmt.Sprintf("%q is not one of debug, info, warn, error", s.value))
	return slog.LevelInfo
}

func (l *loader) role() Role {
	s := l.lookup(EnvRole, "", false)
	if !s.set() {
		return RoleAll
	}
	switch r := Role(strings.ToLower(s.value)); r {
	case RoleAll, RoleEvaluator, RoleDeliverer:
		return r
	}
	l.fail(s, fmt.Sprintf("%q is not one of all, evaluator, deliverer", s.value))
	return RoleAll
}

// Output is what the deliverer does with a firing (KLAXON_OUTPUT).
type Output string

const (
	// OutputSend sends firings through Klaxon's own channels.
	OutputSend Output = "send"
	// OutputHawkSenders publishes, for each firing and channel, the task
	// Hawk's notifier would publish to Hawk's sender workers, which render
	// and send it (docs/hawk.md).
	OutputHawkSenders Output = "hawk-senders"
)

func (l *loader) output() Output {
	s := l.lookup(EnvOutput, "", false)
	if !s.set() {
		return OutputSend
	}
	switch o := Output(strings.ToLower(s.value)); o {
	case OutputSend, OutputHawkSenders:
		return o
	}
	l.fail(s, fmt.Sprintf("%q is not one of send, hawk-senders", s.value))
	return OutputSend
}

// longestChannel is the longest rule channel name, which a Hawk sender
// queue's name ends with.
const longestChannel = len(rules.Telegram)

func (l *loader) hawkSenderQueues() string {
	s := l.lookup(EnvHawkSenderQueues, "", false)
	if !s.set() {
		return defaultHawkSenderQueues
	}
	switch {
	case strings.HasPrefix(s.value, "amq."):
		l.fail(s, fmt.Sprintf("%q would name queues amq.*, which RabbitMQ reserves", s.value))
	case strings.IndexFunc(s.value, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		l.fail(s, fmt.Sprintf("%q contains white space", s.value))
	case len(s.value)+longestChannel > 255:
		l.fail(s, fmt.Sprintf("is %d bytes long; the limit is %d so that <prefix>telegram fits RabbitMQ's 255", len(s.value), 255-longestChannel))
	}
	return s.value
}

func (l *loader) batching() (prefetch, batch int) {
	prefetch = defaultPrefetch
	if s := l.lookup(EnvPrefetch, "", false); s.set() {
		n, err := strconv.Atoi(s.value)
		if err != nil || n < 1 || n > 65535 {
			l.fail(s, fmt.Sprintf("%q is not a whole number from 1 to 65535", s.value))
		} else {
			prefetch = n
		}
	}

	batch = min(defaultBatchSize, prefetch)
	if s := l.lookup(EnvBatchSize, "", false); s.set() {
		n, err := strconv.Atoi(s.value)
		switch {
		case err != nil || n < 1:
			l.fail(s, fmt.Sprintf("%q is not a whole number of 1 or more", s.value))
		case n > prefetch:
			l.fail(s, fmt.Sprintf("%d is more than %s (%d); a batch is made of prefetched messages", n, EnvPrefetch, prefetch))
		default:
			batch = n
		}
	}
	return prefetch, batch
}

func (l *loader) groupsPerCall() int {
	s := l.lookup(EnvGroupsPerCall, "", false)
	if !s.set() {
		return defaultGroupsPerCall
	}
	n, err := strconv.Atoi(s.value)
	if err != nil || n < 1 || n > 1000 {
		l.fail(s, fmt.Sprintf("%q is not a whole number from 1 to 1000", s.value))
		return defaultGroupsPerCall
	}
	return n
}

// wait reads KLAXON_REDIS_WAIT_REPLICAS and KLAXON_REDIS_WAIT_TIMEOUT. A
// WAIT covers the writes of one connection, so it needs a client that
// writes a batch on one node: a single node or Sentinel. On Cluster, or a
// Sentinel client that routes reads to replicas (itself a cluster client in
// go-redis), it could not be kept: refused rather than ignored.
func (l *loader) wait(redisURL string) (int, time.Duration) {
	n := l.count(EnvWaitReplicas, 0, 0, 16)
	d := l.duration(EnvWaitTimeout, defaultWaitTimeout)
	if n == 0 {
		return 0, d
	}
	if o, err := parseRedisURL(redisURL); err == nil && (o.Cluster != nil || o.routesToReplicas()) {
		l.fail(l.lookup(EnvWaitReplicas, "", false),
			"needs a single node or a Sentinel URL without route_by_latency or route_randomly: on Cluster a WAIT cannot follow a batch's writes")
		return 0, d
	}
	return n, d
}

// count reads a whole number from lo to hi.
// linger reads KLAXON_BATCH_LINGER, where 0, unlike in other durations,
// is a choice: no wait.
func (l *loader) linger() time.Duration {
	s := l.lookup(EnvBatchLinger, "", false)
	if !s.set() {
		return defaultBatchLinger
	}
	d, err := time.ParseDuration(s.value)
	if err != nil || d < 0 || d > maxBatchLinger {
		l.fail(s, fmt.Sprintf("%q is not a duration from 0 to %s (write it as Go does: 0, 500us, 2ms)", s.value, maxBatchLinger))
		return defaultBatchLinger
	}
	return d
}

func (l *loader) count(name string, def, lo, hi int) int {
	s := l.lookup(name, "", false)
	if !s.set() {
		return def
	}
	n, err := strconv.Atoi(s.value)
	if err != nil || n < lo || n > hi {
		l.fail(s, fmt.Sprintf("%q is not a whole number from %d to %d", s.value, lo, hi))
		return def
	}
	return n
}

// sizeUnits are the suffixes size accepts, in bytes.
var sizeUnits = []struct {
	suffix string
	bytes  int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// size reads a number of bytes from lo to hi: a whole number, optionally
// followed by B, KiB, MiB or GiB ("256MiB").
func (l *loader) size(name string, def, lo, hi int64) int64 {
	s := l.lookup(name, "", false)
	if !s.set() {
		return def
	}
	num, unit := s.value, int64(1)
	for _, u := range sizeUnits {
		if rest, ok := strings.CutSuffix(s.value, u.suffix); ok {
			num, unit = strings.TrimSpace(rest), u.bytes
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < lo/unit || n > hi/unit || n*unit < lo {
		l.fail(s, fmt.Sprintf("%q is not a size from %s to %s (a whole number of bytes, or of KiB, MiB, GiB)", s.value, formatSize(lo), formatSize(hi)))
		return def
	}
	return n * unit
}

// formatDuration writes d as people write it, and as docs/configuration.md
// gives defaults: "10m" and "1h" rather than time's "10m0s" and "1h0m0s".
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// formatSize writes n bytes in the largest unit that divides it.
func formatSize(n int64) string {
	for _, u := range sizeUnits {
		if n >= u.bytes && n%u.bytes == 0 {
			return strconv.FormatInt(n/u.bytes, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// TelegramChats lists TelegramAllowedChats; nil means any chat.
func (c Config) TelegramChats() []string {
	if c.TelegramAllowedChats == "" {
		return nil
	}
	return strings.Split(c.TelegramAllowedChats, ",")
}

// chats reads the Telegram allowlist: chat ids (-1001234567) and channel
// usernames (@name), comma-separated.
func (l *loader) chats() string {
	s := l.lookup(EnvTelegramAllowedChats, "", false)
	if !s.set() {
		return ""
	}
	var chats []string
	for c := range strings.SplitSeq(s.value, ",") {
		c = strings.TrimSpace(c)
		if c == "" {
			continue
		}
		if _, err := strconv.ParseInt(c, 10, 64); err != nil && !validUsername(c) {
			l.fail(s, fmt.Sprintf("%q is neither a chat id (-1001234567) nor a channel username (@name)", c))
			return ""
		}
		chats = append(chats, c)
	}
	return strings.Join(chats, ",")
}

// validUsername reports whether s is "@" and a Telegram username: letters,
// digits and underscores.
func validUsername(s string) bool {
	name, ok := strings.CutPrefix(s, "@")
	if !ok || name == "" {
		return false
	}
	return strings.IndexFunc(name, func(r rune) bool {
		return !(r == '_' || '0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z')
	}) < 0
}

// boolean reads a true/false variable (1, t, true, 0, f, false, any case);
// unset is false.
func (l *loader) boolean(name string, def bool) bool {
	s := l.lookup(name, "", false)
	if !s.set() {
		return def
	}
	b, err := strconv.ParseBool(s.value)
	if err != nil {
		l.fail(s, fmt.Sprintf("%q is not true or false", s.value))
	}
	return b
}

func (l *loader) duration(name string, def time.Duration) time.Duration {
	s := l.lookup(name, "", false)
	if !s.set() {
		return def
	}
	d, err := time.ParseDuration(s.value)
	switch {
	case err != nil:
		l.fail(s, fmt.Sprintf("%q is not a duration (write it as Go does: 500ms, 5s, 1m30s, 24h)", s.value))
	case d <= 0:
		l.fail(s, fmt.Sprintf("%q is not positive", s.value))
	case d < time.Millisecond:
		// Klaxon's Redis scripts and keys count whole milliseconds: a shorter
		// KLAXON_DEDUP_TTL became 0 ms and turned de-duplication off.
		l.fail(s, fmt.Sprintf("%q is below 1ms, the shortest Klaxon can use", s.value))
	default:
		return d
	}
	return def
}

// checkHostPort checks "host", "host:port", "[v6]" or "[v6]:port"; with
// needPort the port must be present.
func checkHostPort(hp string, needPort bool) error {
	if hp == "" {
		return errors.New("a host is empty")
	}
	host, port := hp, ""
	if h, p, err := net.SplitHostPort(hp); err == nil {
		host, port = h, p
	} else if strings.HasPrefix(hp, "[") && strings.HasSuffix(hp, "]") {
		host = hp[1 : len(hp)-1]
	} else if strings.Contains(hp, ":") {
		return fmt.Errorf("%q is not host:port", hp)
	}
	if host == "" {
		return fmt.Errorf("%q has no host", hp)
	}
	if strings.IndexFunc(host, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || strings.ContainsRune("/@?#[]", r)
	}) >= 0 {
		return fmt.Errorf("host %q is not valid", host)
	}
	if port == "" {
		if needPort {
			return fmt.Errorf("%q has no port", hp)
		}
		return nil
	}
	return checkPort(port, 1)
}

func checkPort(port string, lowest int) error {
	n, err := strconv.Atoi(port)
	if err != nil || n < lowest || n > 65535 {
		return fmt.Errorf("port %q is not a number from %d to 65535", port, lowest)
	}
	return nil
}

func (l *loader) queueType() string {
	s := l.lookup(EnvQueueType, "", false)
	if !s.set() {
		return defaultQueueType
	}
	switch t := strings.ToLower(s.value); t {
	case "classic", "quorum":
		return t
	}
	l.fail(s, fmt.Sprintf("%q is not one of classic, quorum", s.value))
	return defaultQueueType
}
