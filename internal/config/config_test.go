package config

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/seal"
	"github.com/klaxonhq/klaxon/internal/smtptls"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// env is a getenv over a map.
func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLoadDefaults(t *testing.T) {
	got, err := Load(env(nil))
	if err != nil {
		t.Fatalf("Load(empty environment): %v", err)
	}
	want := Config{
		AMQPURL:           "amqp://guest:guest@127.0.0.1:5672/",
		Queue:             "notifier",
		RedisURL:          "redis://127.0.0.1:6379/0",
		MongoURL:          "mongodb://127.0.0.1:27017/hawk",
		MongoDatabase:     "hawk",
		Prefix:            "klaxon",
		HTTPAddr:          "127.0.0.1:9464",
		SMTPFrom:          "klaxon@localhost",
		SMTPTLS:           smtptls.StartTLS,
		TelegramAPI:       "https://api.telegram.org",
		LogLevel:          slog.LevelInfo,
		Role:              RoleAll,
		Output:            OutputSend,
		HawkSenderQueues:  "sender/",
		QueueType:         "classic",
		Prefetch:          2000,
		BatchSize:         1000,
		BatchesInFlight:   1,
		BatchLinger:       2 * time.Millisecond,
		MaxHeldBytes:      64 << 20,
		GroupsPerCall:     32,
		StateCache:        16 << 20,
		DedupTTL:          10 * time.Minute,
		WaitTimeout:       time.Second,
		RulesRefresh:      5 * time.Second,
		SendTimeout:       10 * time.Second,
		MaxBatchHold:      time.Minute,
		AllowPorts:        "80,443",
		SlackHosts:        "hooks.slack.com/services/",
		TelegramHookHosts: "notify.bot.codex.so",
		LoopHosts:         "*",
		EventURL:          "https://garage.hawk.so/project/{projectId}/event/{eventId}/overview",
		EventURLFallback:  "https://garage.hawk.so/project/{projectId}",

		DigestMaxFirings: 500,
		DigestMaxBytes:   1 << 20,
		DeadMaxMessages:  100_000,
		DeadMaxBytes:     256 << 20,
		Limits: rules.Limits{RulesPerProject: 100, WindowsPerRule: 8, FilterWords: 50, FilterWordBytes: 200,
			FilterBytes: 4096, MatchedTitleBytes: 8192, EmailRecipients: 10},
		MaxSends:           1024,
		MaxSendsPerHost:    16,
		MaxSendsPerProject: 32,
		MaxGroups:          100_000,
		CircuitTimeouts:    5,
		CircuitOpen:        30 * time.Second,
		OperatorDelay:      2 * time.Minute,
	}
	if got != want {
		t.Errorf("defaults:\n got %#v\nwant %#v", got, want)
	}
	if got.EmailEnabled() || got.TelegramEnabled() {
		t.Error("email and Telegram should be disabled by default")
	}
	if wire.DeadQueue(got.Queue) != "notifier.dead" {
		t.Errorf("DeadQueue = %q", wire.DeadQueue(got.Queue))
	}
}

// Every documented default must be what Load uses, and setting it explicitly
// must change nothing.
func TestVariablesDefaultsMatchLoad(t *testing.T) {
	def, err := Load(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, v := range Variables() {
		if !strings.HasPrefix(v.Name, "KLAXON_") {
			t.Errorf("%s does not start with KLAXON_", v.Name)
		}
		if seen[v.Name] || (v.Alias != "" && seen[v.Alias]) {
			t.Errorf("%s listed twice", v.Name)
		}
		seen[v.Name], seen[v.Alias] = true, v.Alias != ""
		if v.Doc == "" {
			t.Errorf("%s has no doc", v.Name)
		}
		if v.Default == "" {
			continue
		}
		got, err := Load(env(map[string]string{v.Name: v.Default}))
		if err != nil {
			t.Errorf("%s=%q (its default): %v", v.Name, v.Default, err)
			continue
		}
		if got != def {
			t.Errorf("%s=%q (its default) changes the configuration:\n got %v\nwant %v", v.Name, v.Default, got, def)
		}
	}
}

func TestLoadAliases(t *testing.T) {
	tests := []struct {
		alias, value string
		get          func(Config) string
	}{
		{"REGISTRY_URL", "amqp://hawk:pw@rabbit:5672/hawk", func(c Config) string { return c.AMQPURL }},
		{"REDIS_URL", "redis://redis:6380/2", func(c Config) string { return c.RedisURL }},
		{"MONGO_ACCOUNTS_DATABASE_URI", "mongodb://mongo:27017/accounts", func(c Config) string { return c.MongoURL }},
		{"MONGO_EVENTS_DATABASE_URI", "mongodb://mongo:27017/events", func(c Config) string { return c.EventsMongoURL }},
	}
	for _, tt := range tests {
		t.Run(tt.alias, func(t *testing.T) {
			c, err := Load(env(map[string]string{tt.alias: tt.value}))
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.get(c); got != tt.value {
				t.Errorf("got %q, want %q", got, tt.value)
			}
		})
	}

	c, err := Load(env(map[string]string{"MONGO_ACCOUNTS_DATABASE_URI": "mongodb://mongo:27017/accounts"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.MongoDatabase != "accounts" {
		t.Errorf("MongoDatabase = %q, want accounts", c.MongoDatabase)
	}

	// Hawk's events database is optional; its URL's path names it, and
	// Hawk's own name for it is the default.
	for url, want := range map[string]string{"": "", "mongodb://mongo:27017/ev": "ev", "mongodb://mongo:27017": "hawk_events", "mongodb://mongo:27017/?replicaSet=rs0": "hawk_events"} {
		c, err := Load(env(map[string]string{"KLAXON_EVENTS_MONGO_URL": url}))
		if err != nil {
			t.Fatal(err)
		}
		if c.EventsDatabase != want || c.EventsMongoURL != url {
			t.Errorf("KLAXON_EVENTS_MONGO_URL=%q: database %q, want %q", url, c.EventsDatabase, want)
		}
	}
	if _, err := Load(env(map[string]string{"MONGO_EVENTS_DATABASE_URI": "http://mongo"})); err == nil || !strings.Contains(err.Error(), "KLAXON_EVENTS_MONGO_URL") {
		t.Errorf("an invalid events URL: err = %v, want one naming KLAXON_EVENTS_MONGO_URL", err)
	}

	var names []string
	for _, v := range Variables() {
		if v.Alias != "" {
			names = append(names, v.Alias)
		}
	}
	slices.Sort(names)
	if want := []string{"MONGO_ACCOUNTS_DATABASE_URI", "MONGO_EVENTS_DATABASE_URI", "REDIS_URL", "REGISTRY_URL"}; !slices.Equal(names, want) {
		t.Errorf("aliases = %v, want %v", names, want)
	}
}

func TestLoadKlaxonNameWinsOverAlias(t *testing.T) {
	c, err := Load(env(map[string]string{
		"KLAXON_AMQP_URL":             "amqp://guest:guest@klaxon-rabbit:5672/",
		"REGISTRY_URL":                "amqp://guest:guest@hawk-rabbit:5672/",
		"KLAXON_REDIS_URL":            "redis://klaxon-redis:6379/0",
		"REDIS_URL":                   "redis://hawk-redis:6379/0",
		"KLAXON_MONGO_URL":            "mongodb://klaxon-mongo:27017/klaxon",
		"MONGO_ACCOUNTS_DATABASE_URI": "mongodb://hawk-mongo:27017/hawk",
	}))
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range []string{c.AMQPURL, c.RedisURL, c.MongoURL} {
		if !strings.Contains(got, "klaxon-") {
			t.Errorf("alias won over the KLAXON_ name: %q", got)
		}
	}
	if c.MongoDatabase != "klaxon" {
		t.Errorf("MongoDatabase = %q, want klaxon", c.MongoDatabase)
	}

	// An invalid alias does not matter when the KLAXON_ name is set.
	if _, err := Load(env(map[string]string{"KLAXON_REDIS_URL": "redis://r:6379/0", "REDIS_URL": "http://x"})); err != nil {
		t.Errorf("invalid alias shadowed by KLAXON_REDIS_URL: %v", err)
	}
}

func TestLoadValues(t *testing.T) {
	tests := []struct {
		name  string
		env   map[string]string
		check func(Config) bool
	}{
		{"mongo without database", map[string]string{EnvMongoURL: "mongodb://m:27017"}, func(c Config) bool { return c.MongoDatabase == "hawk" }},
		{"mongo with options", map[string]string{EnvMongoURL: "mongodb://a:1,b:2/hawk?replicaSet=rs0"}, func(c Config) bool { return c.MongoDatabase == "hawk" }},
		{"mongo srv", map[string]string{EnvMongoURL: "mongodb+srv://u:p@cluster0.example.net/accounts?retryWrites=true"}, func(c Config) bool { return c.MongoDatabase == "accounts" }},
		{"mongo escaped db", map[string]string{EnvMongoURL: "mongodb://m/my%2Ddb"}, func(c Config) bool { return c.MongoDatabase == "my-db" }},
		{"amqps", map[string]string{EnvAMQPURL: "amqps://u:p%40ss@rabbit.example.com:5671/vhost?heartbeat=10"}, func(c Config) bool { return c.AMQPURL != "" }},
		{"smtp tls upper case", map[string]string{EnvSMTPTLS: "TLS"}, func(c Config) bool { return c.SMTPTLS == smtptls.Implicit }},
		{"smtp none", map[string]string{EnvSMTPTLS: "none"}, func(c Config) bool { return c.SMTPTLS == smtptls.None }},
		{"smtp full", map[string]string{EnvSMTPAddr: "mailpit:1025", EnvSMTPUsername: "u", EnvSMTPPassword: " p w ", EnvSMTPFrom: "Klaxon <alerts@example.com>"},
			func(c Config) bool {
				return c.EmailEnabled() && c.SMTPPassword == " p w " && c.SMTPFrom == "Klaxon <alerts@example.com>"
			}},
		{"endpoint keys", map[string]string{EnvEndpointKey: " " + testKey(1) + "," + testKey(2) + "\n"},
			func(c Config) bool {
				ks := c.EndpointKeys()
				sealed := ks.Seal("ops@example.com", "p", "email")
				opened, err := ks.Open(sealed, "p", "email")
				return seal.Sealed(sealed) && err == nil && opened == "ops@example.com"
			}},
		{"no endpoint key", map[string]string{}, func(c Config) bool { return c.EndpointKeys() == nil }},
		{"held bytes default", map[string]string{}, func(c Config) bool { return c.MaxHeldBytes == 64<<20 }},
		{"held bytes", map[string]string{EnvMaxHeldBytes: "200MiB"}, func(c Config) bool { return c.MaxHeldBytes == 200<<20 }},
		{"log level", map[string]string{EnvLogLevel: "DEBUG"}, func(c Config) bool { return c.LogLevel == slog.LevelDebug }},
		{"log warn", map[string]string{EnvLogLevel: "warn"}, func(c Config) bool { return c.LogLevel == slog.LevelWarn }},
		{"role", map[string]string{EnvRole: "deliverer"}, func(c Config) bool { return c.Role == RoleDeliverer && c.Role.Delivers() && !c.Role.Evaluates() }},
		{"http any port", map[string]string{EnvHTTPAddr: "127.0.0.1:0"}, func(c Config) bool { return c.HTTPAddr == "127.0.0.1:0" }},
		{"http all interfaces", map[string]string{EnvHTTPAddr: ":9464"}, func(c Config) bool { return c.HTTPAddr == ":9464" }},
		{"http ipv6", map[string]string{EnvHTTPAddr: "[::]:9464"}, func(c Config) bool { return c.HTTPAddr == "[::]:9464" }},
		{"trimmed", map[string]string{EnvQueue: " events\n"}, func(c Config) bool { return c.Queue == "events" }},
		{"queue type default", map[string]string{}, func(c Config) bool { return c.QueueType == "classic" }},
		{"queue type", map[string]string{EnvQueueType: "Quorum"}, func(c Config) bool { return c.QueueType == "quorum" }},
		{"one queue by default", nil, func(c Config) bool {
			return slices.Equal(c.IncomingQueues(), []IncomingQueue{{Name: "notifier"}})
		}},
		{"batches in flight, default", nil, func(c Config) bool { return c.BatchesInFlight == 1 }},
		{"two batches in flight", map[string]string{EnvBatchesInFlight: "2"}, func(c Config) bool { return c.BatchesInFlight == 2 }},
		{"linger default", map[string]string{}, func(c Config) bool { return c.BatchLinger == 2*time.Millisecond }},
		{"no linger", map[string]string{EnvBatchLinger: "0"}, func(c Config) bool { return c.BatchLinger == 0 }},
		{"linger", map[string]string{EnvBatchLinger: "500us"}, func(c Config) bool { return c.BatchLinger == 500*time.Microsecond }},
		{"hashed queues, all consumed", map[string]string{EnvQueueShards: "2"}, func(c Config) bool {
			return slices.Equal(c.IncomingQueues(), []IncomingQueue{{Name: "notifier"},
				{Name: "notifier.0", Exchange: "notifier.hash"}, {Name: "notifier.1", Exchange: "notifier.hash"}})
		}},
		{"hashed queues, some consumed", map[string]string{EnvQueue: "ev", EnvQueueShards: "4", EnvQueues: " ev.3, ,ev.1 "}, func(c Config) bool {
			return c.Queues == "ev.3,ev.1" && slices.Equal(c.IncomingQueues(), []IncomingQueue{
				{Name: "ev.3", Exchange: "ev.hash"}, {Name: "ev.1", Exchange: "ev.hash"}})
		}},
		{"small prefetch lowers the default batch", map[string]string{EnvPrefetch: "10"}, func(c Config) bool { return c.Prefetch == 10 && c.BatchSize == 10 }},
		{"batch", map[string]string{EnvPrefetch: "500", EnvBatchSize: "200"}, func(c Config) bool { return c.BatchSize == 200 }},
		{"groups per call", map[string]string{EnvGroupsPerCall: "1"}, func(c Config) bool { return c.GroupsPerCall == 1 }},
		{"no state cache", map[string]string{EnvStateCache: "0"}, func(c Config) bool { return c.StateCache == 0 }},
		{"state cache", map[string]string{EnvStateCache: "64MiB"}, func(c Config) bool { return c.StateCache == 64<<20 }},
		{"durations", map[string]string{EnvDedupTTL: "1h30m", EnvRulesRefresh: "500ms", EnvSendTimeout: "3s"},
			func(c Config) bool {
				return c.DedupTTL == 90*time.Minute && c.RulesRefresh == 500*time.Millisecond && c.SendTimeout == 3*time.Second
			}},
		{"telegram", map[string]string{EnvTelegramToken: "123:ABC-def_1", EnvTelegramAPIURL: "http://127.0.0.1:8081/"},
			func(c Config) bool { return c.TelegramEnabled() && c.TelegramAPI == "http://127.0.0.1:8081" }},
		{"rules file", map[string]string{EnvRulesFile: "/etc/klaxon/rules.yaml"}, func(c Config) bool { return c.RulesFile == "/etc/klaxon/rules.yaml" }},
		{"prefix", map[string]string{EnvPrefix: "klaxon-staging:v2"}, func(c Config) bool { return c.Prefix == "klaxon-staging:v2" }},
		{"pprof", map[string]string{EnvPprof: "TRUE"}, func(c Config) bool { return c.Pprof }},
		{"pprof off", map[string]string{EnvPprof: "0"}, func(c Config) bool { return !c.Pprof }},
		{"storm over", map[string]string{EnvStormOver: "true"}, func(c Config) bool { return c.StormOver }},
		{"storm over off by default", map[string]string{}, func(c Config) bool { return !c.StormOver }},
		{"output to Hawk's senders", map[string]string{EnvOutput: "Hawk-Senders"}, func(c Config) bool { return c.Output == OutputHawkSenders }},
		{"Hawk's sender queues", map[string]string{EnvHawkSenderQueues: "test.sender/"}, func(c Config) bool { return c.HawkSenderQueues == "test.sender/" }},
		{"bounds", map[string]string{EnvDigestMaxFirings: "50", EnvDigestMaxBytes: "64KiB", EnvDeadMaxMessages: "1000", EnvDeadMaxBytes: "1GiB"},
			func(c Config) bool {
				return c.DigestMaxFirings == 50 && c.DigestMaxBytes == 64<<10 && c.DeadMaxMessages == 1000 && c.DeadMaxBytes == 1<<30
			}},
		{"size in bytes", map[string]string{EnvDigestMaxBytes: "2048"}, func(c Config) bool { return c.DigestMaxBytes == 2048 }},
		{"telegram allowlist", map[string]string{EnvTelegramAllowedChats: " -1001234567, @Alerts_Team ,,42"},
			func(c Config) bool {
				return slices.Equal(c.TelegramChats(), []string{"-1001234567", "@Alerts_Team", "42"})
			}},
		{"telegram any chat", nil, func(c Config) bool { return c.TelegramChats() == nil }},
		{"limits", map[string]string{EnvMaxRules: "10", EnvMaxWindows: "2", EnvMaxFilterWords: "5", EnvMaxFilterWordBytes: "20",
			EnvMaxFilterBytes: "64", EnvMaxMatchedTitle: "1000", EnvMaxEmailRecipients: "1"},
			func(c Config) bool {
				return c.Limits == rules.Limits{RulesPerProject: 10, WindowsPerRule: 2, FilterWords: 5, FilterWordBytes: 20,
					FilterBytes: 64, MatchedTitleBytes: 1000, EmailRecipients: 1}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(env(tt.env))
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Errorf("unexpected configuration: %v", c)
			}
		})
	}
}

// secret appears in every credential of the invalid cases below; no error
// may contain it.
const secret = "s3cr3t"

func TestLoadInvalid(t *testing.T) {
	tests := []struct {
		env     map[string]string
		wantVar string // must be named in the error
		want    string // must appear in the error
	}{
		{map[string]string{EnvAMQPURL: "http://guest:s3cr3t@rabbit/"}, EnvAMQPURL, `"http" is not one of amqp, amqps`},
		{map[string]string{EnvAMQPURL: "amqp://guest:s3cr3t@rabbit:notaport/"}, EnvAMQPURL, `port "notaport"`},
		{map[string]string{EnvAMQPURL: "amqp://guest:s3cr3t/x@rabbit/"}, EnvAMQPURL, "percent-encode"},
		{map[string]string{EnvAMQPURL: "amqp://guest:s3cr3t%zz@rabbit/"}, EnvAMQPURL, "percent-encode"},
		{map[string]string{EnvAMQPURL: "amqp://guest:s3cr3t @rabbit/"}, EnvAMQPURL, "white space"},
		{map[string]string{EnvAMQPURL: "guest:s3cr3t@rabbit"}, EnvAMQPURL, "not a URL"},
		{map[string]string{EnvAMQPURL: "amqp://u:s3cr3t@rabbit/?heartbeat=x"}, EnvAMQPURL, "heartbeat"},
		{map[string]string{"REGISTRY_URL": "redis://u:s3cr3t@rabbit/"}, "REGISTRY_URL (alias of KLAXON_AMQP_URL)", "scheme"},
		{map[string]string{EnvQueue: "amq.events"}, EnvQueue, "reserves"},
		{map[string]string{EnvQueueType: "stream"}, EnvQueueType, "classic, quorum"},
		{map[string]string{EnvQueue: strings.Repeat("q", 251)}, EnvQueue, "250"},
		{map[string]string{EnvBatchesInFlight: "0"}, EnvBatchesInFlight, "from 1 to 4"},
		{map[string]string{EnvBatchesInFlight: "5"}, EnvBatchesInFlight, "from 1 to 4"},
		{map[string]string{EnvBatchLinger: "-1ms"}, EnvBatchLinger, "from 0 to 100ms"},
		{map[string]string{EnvBatchLinger: "1s"}, EnvBatchLinger, "from 0 to 100ms"},
		{map[string]string{EnvBatchLinger: "2"}, EnvBatchLinger, "from 0 to 100ms"},
		{map[string]string{EnvQueueShards: "-1"}, EnvQueueShards, "from 0 to 256"},
		{map[string]string{EnvQueueShards: "257"}, EnvQueueShards, "from 0 to 256"},
		{map[string]string{EnvQueueShards: "four"}, EnvQueueShards, "whole number"},
		{map[string]string{EnvQueueShards: "8", EnvQueues: "notifier,notifier.8"}, EnvQueues,
			`"notifier.8" is not one of the incoming queues: notifier, notifier.0 … notifier.7 (KLAXON_QUEUE="notifier", KLAXON_QUEUE_SHARDS=8)`},
		{map[string]string{EnvQueues: "notifier.0"}, EnvQueues, "KLAXON_QUEUE_SHARDS=0"},
		{map[string]string{EnvQueueShards: "2", EnvQueues: "notifier.1,notifier.1"}, EnvQueues, `names "notifier.1" twice`},
		{map[string]string{EnvQueues: " , "}, EnvQueues, "names no queue"},
		{map[string]string{EnvRedisURL: "http://:s3cr3t@redis:6379/0"}, EnvRedisURL, `scheme "http"`},
		{map[string]string{EnvRedisURL: "redis://:s3cr3t@redis:6379/x"}, EnvRedisURL, "database"},
		{map[string]string{EnvRedisURL: "redis://:s3cr3t@redis:6379/0?bogus=1"}, EnvRedisURL, "bogus"},
		{map[string]string{EnvRedisURL: "redis://:s3cr3t@r1:6379,r2:6379/0"}, EnvRedisURL, "redis+cluster://"},
		{map[string]string{EnvRedisURL: "redis+cluster://:s3cr3t@r1:7000/1"}, EnvRedisURL, "database 0 only"},
		{map[string]string{EnvRedisURL: "redis+sentinel://:s3cr3t@s1:26379"}, EnvRedisURL, "name the master"},
		{map[string]string{EnvRedisURL: "redis+sentinel://s1:26379/m?sentinel_password=s3cr3t&bogus=1"}, EnvRedisURL, "bogus"},
		{map[string]string{EnvRedisURL: "redis://:s3cr3t@redis/0?skip_verify=true"}, EnvRedisURL, "rediss"},
		{map[string]string{EnvRedisURL: "redis://:s3cr3t@redis/0?password=other"}, EnvRedisURL, "password"},
		{map[string]string{EnvRedisURL: "redis+ring://r:6379"}, EnvRedisURL, "redis+ring"},
		{map[string]string{EnvRedisURL: "redis://:s3cr3t@redis:99999/0"}, EnvRedisURL, "port"},
		{map[string]string{"REDIS_URL": "redis://:s3cr3t@redis:6379/x"}, "REDIS_URL (alias of KLAXON_REDIS_URL)", "database"},
		{map[string]string{EnvMongoURL: "postgres://u:s3cr3t@m/hawk"}, EnvMongoURL, "not one of mongodb, mongodb+srv"},
		{map[string]string{EnvMongoURL: "mongodb://u:s3cr3t@m/ha.wk"}, EnvMongoURL, "database name"},
		{map[string]string{EnvMongoURL: "mongodb://u:s3cr3t@m?replicaSet=x"}, EnvMongoURL, `"/"`},
		{map[string]string{EnvMongoURL: "mongodb+srv://u:s3cr3t@cluster0.example.net:27017/hawk"}, EnvMongoURL, "without a port"},
		{map[string]string{EnvMongoURL: "mongodb://u:s3cr3t@a:1,:2/hawk"}, EnvMongoURL, "no host"},
		{map[string]string{"MONGO_ACCOUNTS_DATABASE_URI": "mongodb://u:s3cr3t@m/a b"}, "MONGO_ACCOUNTS_DATABASE_URI (alias of KLAXON_MONGO_URL)", "white space"},
		{map[string]string{EnvPrefix: "{klaxon}"}, EnvPrefix, "hash tag"},
		{map[string]string{EnvPrefix: "kla xon"}, EnvPrefix, "white space"},
		{map[string]string{EnvPrefix: "amq"}, EnvPrefix, "reserves"},
		{map[string]string{EnvHTTPAddr: "9464"}, EnvHTTPAddr, "host:port"},
		{map[string]string{EnvHTTPAddr: "localhost:http"}, EnvHTTPAddr, "port"},
		{map[string]string{EnvSMTPAddr: "smtp.example.com"}, EnvSMTPAddr, "host:port"},
		{map[string]string{EnvSMTPAddr: ":25"}, EnvSMTPAddr, "no host"},
		{map[string]string{EnvSMTPPassword: "s3cr3t"}, EnvSMTPPassword, "KLAXON_SMTP_USERNAME is not"},
		{map[string]string{EnvSMTPFrom: "not an address"}, EnvSMTPFrom, "not an email address"},
		{map[string]string{EnvSMTPTLS: "ssl"}, EnvSMTPTLS, `"ssl" is not one of none, starttls, tls`},
		{map[string]string{EnvTelegramToken: "s3cr3t/../x"}, EnvTelegramToken, "bot token"},
		{map[string]string{EnvTelegramToken: "s3cr3t token"}, EnvTelegramToken, "white space"},
		{map[string]string{EnvTelegramAPIURL: "ftp://api.telegram.org"}, EnvTelegramAPIURL, `"ftp"`},
		{map[string]string{EnvTelegramAPIURL: "https://u:s3cr3t@api.telegram.org/?x=1"}, EnvTelegramAPIURL, "query"},
		{map[string]string{EnvLogLevel: "verbose"}, EnvLogLevel, `"verbose" is not one of debug, info, warn, error`},
		{map[string]string{EnvRole: "both"}, EnvRole, "all, evaluator, deliverer"},
		{map[string]string{EnvPrefetch: "0"}, EnvPrefetch, "1 to 65535"},
		{map[string]string{EnvPrefetch: "70000"}, EnvPrefetch, "1 to 65535"},
		{map[string]string{EnvBatchSize: "-1"}, EnvBatchSize, "1 or more"},
		{map[string]string{EnvGroupsPerCall: "0"}, EnvGroupsPerCall, "from 1 to 1000"},
		{map[string]string{EnvPrefetch: "10", EnvBatchSize: "20"}, EnvBatchSize, "more than KLAXON_PREFETCH (10)"},
		{map[string]string{EnvDedupTTL: "24"}, EnvDedupTTL, "not a duration"},
		{map[string]string{EnvMaxHeldBytes: "512KiB"}, EnvMaxHeldBytes, "not a size from 1MiB to 16GiB"},
		{map[string]string{EnvEndpointKey: "s3cr3t"}, EnvEndpointKey, "key 1 is 4 bytes, want 32"},
		{map[string]string{EnvEndpointKey: testKey(1) + ",s3cr3t!"}, EnvEndpointKey, "key 2 is not base64"},
		{map[string]string{EnvRulesRefresh: "0s"}, EnvRulesRefresh, "not positive"},
		{map[string]string{EnvSendTimeout: "-1s"}, EnvSendTimeout, "not positive"},
		{map[string]string{EnvPprof: "yes"}, EnvPprof, `"yes" is not true or false`},
		{map[string]string{EnvStormOver: "all"}, EnvStormOver, `"all" is not true or false`},
		{map[string]string{EnvOutput: "hawk"}, EnvOutput, "send, hawk-senders"},
		{map[string]string{EnvHawkSenderQueues: "amq.sender/"}, EnvHawkSenderQueues, "RabbitMQ reserves"},
		{map[string]string{EnvHawkSenderQueues: "sender /"}, EnvHawkSenderQueues, "white space"},
		{map[string]string{EnvHawkSenderQueues: strings.Repeat("q", 250)}, EnvHawkSenderQueues, "the limit is 247"},
		{map[string]string{EnvDigestMaxFirings: "0"}, EnvDigestMaxFirings, "from 1 to 10000"},
		{map[string]string{EnvDigestMaxBytes: "1MB"}, EnvDigestMaxBytes, "not a size from 1KiB to 16MiB"},
		{map[string]string{EnvDigestMaxBytes: "100"}, EnvDigestMaxBytes, "not a size from 1KiB"},
		{map[string]string{EnvDeadMaxMessages: "lots"}, EnvDeadMaxMessages, "not a whole number"},
		{map[string]string{EnvDeadMaxBytes: "-1MiB"}, EnvDeadMaxBytes, "not a size"},
		{map[string]string{EnvTelegramAllowedChats: "-100123, https://t.me/x"}, EnvTelegramAllowedChats, `"https://t.me/x" is neither a chat id`},
		{map[string]string{EnvTelegramAllowedChats: "@"}, EnvTelegramAllowedChats, "channel username"},
		{map[string]string{EnvMaxRules: "0"}, EnvMaxRules, "from 1 to 1000000"},
		{map[string]string{EnvMaxWindows: "9"}, EnvMaxWindows, `"9" is not a whole number from 1 to 8`},
		{map[string]string{EnvMaxFilterWords: "many"}, EnvMaxFilterWords, "whole number"},
		{map[string]string{EnvMaxFilterWordBytes: "-5"}, EnvMaxFilterWordBytes, "whole number"},
		{map[string]string{EnvMaxFilterBytes: "1.5"}, EnvMaxFilterBytes, "whole number"},
		{map[string]string{EnvMaxMatchedTitle: "0"}, EnvMaxMatchedTitle, "whole number"},
		{map[string]string{EnvMaxEmailRecipients: "10001"}, EnvMaxEmailRecipients, "from 1 to 10000"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.env), func(t *testing.T) {
			_, err := Load(env(tt.env))
			if err == nil {
				t.Fatal("Load succeeded")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, tt.wantVar+": ") {
				t.Errorf("error %q does not start with %q", msg, tt.wantVar+": ")
			}
			if !strings.Contains(msg, tt.want) {
				t.Errorf("error %q does not contain %q", msg, tt.want)
			}
			if strings.ContainsAny(msg, "\r\n") {
				t.Errorf("error is not one line: %q", msg)
			}
			if strings.Contains(msg, secret) {
				t.Errorf("error leaks a secret: %q", msg)
			}
			var e *Error
			if !errors.As(err, &e) || e.Var == "" || !strings.HasPrefix(e.Var, "KLAXON_") {
				t.Errorf("error %v is not a *config.Error naming a KLAXON_ variable", err)
			}
		})
	}
}

func TestLoadReportsEveryProblemOnOneLine(t *testing.T) {
	_, err := Load(env(map[string]string{EnvSMTPTLS: "ssl", EnvLogLevel: "loud", EnvRedisURL: "redis://:s3cr3t@r:1/x"}))
	if err == nil {
		t.Fatal("Load succeeded")
	}
	msg := err.Error()
	for _, name := range []string{EnvSMTPTLS, EnvLogLevel, EnvRedisURL} {
		if !strings.Contains(msg, name) {
			t.Errorf("error %q does not name %s", msg, name)
		}
	}
	if strings.ContainsAny(msg, "\r\n") || strings.Contains(msg, secret) {
		t.Errorf("error is not one secret-free line: %q", msg)
	}
	var e *Error
	if !errors.As(err, &e) || e.Var != EnvRedisURL {
		t.Errorf("errors.As found %v, want the first problem in variable order (%s)", e, EnvRedisURL)
	}
}

// A library error quoting its input must be scrubbed too.
func TestLoadScrubsSecretsFromLibraryErrors(t *testing.T) {
	l := &loader{secrets: secretParts("amqp://user:s3cr3t-pass@h/")}
	l.fail(setting{name: EnvAMQPURL}, `parse "amqp://user:s3cr3t-pass@h/": boom`+"\n"+"second line")
	msg := l.errs.Error()
	if strings.Contains(msg, secret) || strings.Contains(msg, "\n") {
		t.Errorf("scrubbed message = %q", msg)
	}
}

// withSecrets is an environment in which every credential contains secret.
var withSecrets = map[string]string{
	EnvAMQPURL:        "amqps://klaxon:s3cr3t-amqp@rabbit:5671/prod",
	EnvRedisURL:       "rediss+sentinel://default:s3cr3t-redis@s1:26379,s2/mymaster/1?sentinel_password=s3cr3t-sentinel",
	EnvMongoURL:       "mongodb+srv://klaxon:s3cr3t-mongo@cluster0.example.net/hawk?authMechanismProperties=AWS_SESSION_TOKEN:s3cr3t-aws",
	EnvSMTPAddr:       "smtp.example.com:587",
	EnvSMTPUsername:   "alerts",
	EnvSMTPPassword:   "s3cr3t-smtp",
	EnvTelegramToken:  "123456:s3cr3t-telegram",
	EnvTelegramAPIURL: "https://proxy:s3cr3t-proxy@tg.example.com/",
	EnvEndpointKey:    "s3cr3tAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
}

func TestOutputHasNoSecrets(t *testing.T) {
	c, err := Load(env(withSecrets))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("starting", "config", c)
	outputs := map[string]string{
		"String":   c.String(),
		"%v":       fmt.Sprintf("%v", c),
		"%+v":      fmt.Sprintf("%+v", c),
		"%#v":      fmt.Sprintf("%#v", c),
		"%s":       fmt.Sprintf("%s", c),
		"LogValue": buf.String(),
	}
	for name, out := range outputs {
		if strings.Contains(out, secret) {
			t.Errorf("%s leaks a secret: %s", name, out)
		}
		for _, want := range []string{"rabbit:5671", "s1:26379,s2", "cluster0.example.net", "smtp_password=", "alerts", "tg.example.com"} {
			if name != "LogValue" && !strings.Contains(out, want) {
				t.Errorf("%s lacks %q: %s", name, want, out)
			}
		}
	}
	if !strings.Contains(buf.String(), `"endpoint_key":"xxxxx"`) {
		t.Errorf("LogValue does not say the endpoint key is set: %s", buf.String())
	}
	if !strings.Contains(buf.String(), `"smtp_password":"xxxxx"`) || !strings.Contains(buf.String(), `"redis_url":"rediss+sentinel://xxxxx@s1:26379,s2/mymaster/1?sentinel_password=xxxxx"`) {
		t.Errorf("LogValue output: %s", buf.String())
	}
	if !strings.Contains(buf.String(), `"dedup_ttl":"10m0s"`) {
		t.Errorf("LogValue shows durations other than as written: %s", buf.String())
	}
}

func TestRedactURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"},
		{"amqp://guest:guest@h:5672/", "amqp://xxxxx@h:5672/"},
		{"redis://:pw@h/0?dial_timeout=3s&password=pw", "redis://xxxxx@h/0?dial_timeout=3s&password=xxxxx"},
		{"mongodb://a:1,b:2/hawk?replicaSet=rs0#frag", "mongodb://a:1,b:2/hawk?replicaSet=rs0#frag"},
		{"not a url with s3cr3t", "xxxxx"},
	}
	for _, tt := range tests {
		if got := redactURL(tt.in); got != tt.want {
			t.Errorf("redactURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// docs/configuration.md must document every variable, and only those.
func TestDocumentationListsEveryVariable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, v := range Variables() {
		known[v.Name] = true
		for _, want := range []string{"`" + v.Name + "`", v.Alias} {
			if !bytes.Contains(doc, []byte(want)) {
				t.Errorf("docs/configuration.md does not mention %s", want)
			}
		}
		if v.Default != "" && !bytes.Contains(doc, []byte("`"+v.Default+"`")) {
			t.Errorf("docs/configuration.md does not give %s's default `%s`", v.Name, v.Default)
		}
	}
	for _, name := range regexp.MustCompile(`KLAXON_[A-Z0-9_]+`).FindAll(doc, -1) {
		if !known[string(name)] {
			t.Errorf("docs/configuration.md mentions unknown variable %s", name)
		}
	}
}

// testKey is a valid KLAXON_ENDPOINT_KEY key, the same for the same n.
func testKey(n byte) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{n}, seal.KeySize))
}
