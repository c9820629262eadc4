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
// Each variable is declared once, in variables.go: its name, alias,
// default, range, secrecy, section and meaning, how it is read and where its
// value goes. Load, Variables, the configuration's log output and the
// tables of docs/configuration.md, the user's reference, all read that
// table.
package config

import (
	"log/slog"
	"strings"
	"time"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/seal"
	"github.com/klaxonhq/klaxon/internal/smtptls"
	"github.com/klaxonhq/klaxon/internal/wire"
)

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
	StateCache      int64         // KLAXON_STATE_CACHE, bytes; 0 = none
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
	// MaxGroups bounds the groups one project keeps a counting state
	// for (KLAXON_MAX_GROUPS_PER_PROJECT); 0 for no bound.
	MaxGroups       int
	CircuitTimeouts int
	CircuitOpen     time.Duration
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

// TelegramChats lists TelegramAllowedChats; nil means any chat.
func (c Config) TelegramChats() []string {
	if c.TelegramAllowedChats == "" {
		return nil
	}
	return strings.Split(c.TelegramAllowedChats, ",")
}

// Load reads every Klaxon variable through getenv (os.Getenv in main),
// applies defaults and Hawk aliases, and validates the result. An empty value
// counts as unset. When a value is invalid, the error names the variable in
// one line (several problems are joined by "; " on that same line); errors.As
// with *Error finds the first.
func Load(getenv func(string) string) (Config, error) {
	var c Config
	specs := variables(&c)
	l := &loader{getenv: getenv}
	for _, v := range specs {
		if !v.secret {
			continue
		}
		for _, name := range []string{v.name, v.alias} {
			if name != "" {
				l.secrets = append(l.secrets, secretParts(getenv(name))...)
			}
		}
	}
	for _, v := range specs {
		s := l.lookup(v.name, v.alias, v.raw)
		v.value.read(l, s)
		if s.set() && v.check != nil {
			if err := v.check(s.value); err != nil {
				l.failEach(s, err)
			}
		}
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
