package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/notify/hawksender"
	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

const telegramToken = "123456:TEST-token-never-logged"

// harness is one Klaxon installation for a test: its own queue, key prefix
// and MongoDB database on the real services, and fakes of the providers.
type harness struct {
	t        *testing.T
	env      map[string]string
	amqpURL  string
	queue    string
	prefix   string
	db       *mongo.Database
	webhook  *notifytest.WebhookSink
	slack    *notifytest.SlackServer
	loop     *notifytest.LoopServer
	telegram *notifytest.TelegramServer
	smtp     *notifytest.SMTPServer
	logs     *syncBuffer
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{
		t:        t,
		amqpURL:  testenv.AMQPURL(t),
		queue:    testenv.QueueName(t),
		prefix:   testenv.KeyPrefix(t),
		webhook:  notifytest.NewWebhookSink(t),
		slack:    notifytest.NewSlackServer(t),
		loop:     notifytest.NewLoopServer(t),
		telegram: notifytest.NewTelegramServer(t, telegramToken),
		smtp:     notifytest.NewSMTPServer(t, notifytest.SMTPOptions{}),
		logs:     &syncBuffer{},
	}
	mongoURL := testenv.Mongo(t)
	client, err := mongo.Connect(options.Client().ApplyURI(mongoURL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Disconnect(context.Background()) })
	h.db = client.Database(dbName(mongoURL))
	h.env = map[string]string{
		"KLAXON_AMQP_URL":         h.amqpURL,
		"KLAXON_QUEUE":            h.queue,
		"KLAXON_REDIS_URL":        testenv.RedisURL(),
		"KLAXON_MONGO_URL":        mongoURL,
		"KLAXON_PREFIX":           h.prefix,
		"KLAXON_SMTP_ADDR":        h.smtp.Addr,
		"KLAXON_SMTP_FROM":        "klaxon@example.com",
		"KLAXON_SMTP_TLS":         "none",
		"KLAXON_TELEGRAM_TOKEN":   telegramToken,
		"KLAXON_TELEGRAM_API_URL": h.telegram.URL,
		"KLAXON_RULES_REFRESH":    "200ms",
		"KLAXON_LOG_LEVEL":        "debug",
		// The fakes listen on loopback, which endpoints from rules may not
		// reach unless the operator allows it.
		"KLAXON_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8,::1/128",
		"KLAXON_SLACK_HOSTS":            "127.0.0.1",
		"KLAXON_TELEGRAM_HOOK_HOSTS":    "127.0.0.1",
		"KLAXON_LOOP_HOSTS":             "127.0.0.1/hooks/",
		// Hawk's sender queues of the test's own, for KLAXON_OUTPUT=hawk-senders.
		"KLAXON_HAWK_SENDER_QUEUES": hawkSenderPrefix(h.prefix),
	}
	var queues []string
	for _, q := range []string{"deliveries", "deliveries.bulk", "failed"} {
		queues = append(queues, h.prefix+"."+q)
	}
	for _, d := range []string{"100ms", "250ms", "500ms", "1s", "2s", "4s", "8s", "16s", "32s", "1m4s", "2m8s", "4m16s", "8m32s"} {
		queues = append(queues, h.prefix+".retry."+d)
	}
	for _, c := range rules.ChannelNames {
		queues = append(queues, hawksender.Queue(hawkSenderPrefix(h.prefix), c))
	}
	testenv.DeleteQueuesAtCleanup(t, queues...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker logs:\n%s", h.logs.String())
		}
	})
	return h
}

// hawkSenderPrefix is the prefix of a harness' queues of Hawk's senders.
func hawkSenderPrefix(prefix string) string { return prefix + ".sender/" }

func dbName(uri string) string {
	path := uri[strings.LastIndex(uri, "/")+1:]
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	return path
}

// worker is one running worker of a harness.
type worker struct {
	// Addr is the worker's KLAXON_HTTP_ADDR: /metrics, /healthz, /readyz.
	Addr string
}

// start runs a worker with the harness' settings until the test ends, and
// waits until it is ready.
func (h *harness) start() *worker {
	h.t.Helper()
	w := h.startUnready()
	testenv.WaitFor(h.t, 30*time.Second, "worker ready", func() bool { return answers(w.Addr, "/readyz") == http.StatusOK })
	return w
}

// answers GETs path from the worker at addr and returns the status, 0 when
// nothing answers.
func answers(addr, path string) int {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// startUnready runs a worker with the harness' settings until the test
// ends, and waits until it serves /healthz, not until it is ready.
func (h *harness) startUnready() *worker {
	h.t.Helper()
	env := map[string]string{"KLAXON_HTTP_ADDR": freeAddr(h.t)}
	for k, v := range h.env {
		env[k] = v
	}
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		h.t.Fatal(err)
	}
	log := slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, log) }()
	h.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				h.t.Errorf("worker: %v", err)
			}
		case <-time.After(10 * time.Second):
			h.t.Error("worker did not stop within 10 s")
		}
	})
	testenv.WaitFor(h.t, 30*time.Second, "worker serving /healthz", func() bool { return answers(cfg.HTTPAddr, "/healthz") != 0 })
	return &worker{Addr: cfg.HTTPAddr}
}

// project stores a Hawk project with rules and returns its id.
func (h *harness) project(rules ...bson.M) string {
	h.t.Helper()
	id := bson.NewObjectID()
	arr := bson.A{}
	for _, r := range rules {
		arr = append(arr, r)
	}
	_, err := h.db.Collection("projects").InsertOne(context.Background(), bson.M{"_id": id, "name": "test project", "notifications": arr})
	if err != nil {
		h.t.Fatal(err)
	}
	return id.Hex()
}

// allChannels enables every channel of a rule, each to its fake.
func (h *harness) allChannels() bson.M {
	return bson.M{
		"webhook":  bson.M{"isEnabled": true, "endpoint": h.webhook.URL, "minPeriod": 0},
		"slack":    bson.M{"isEnabled": true, "endpoint": h.slack.URL, "minPeriod": 0},
		"telegram": bson.M{"isEnabled": true, "endpoint": "-1001234", "minPeriod": 0},
		"email":    bson.M{"isEnabled": true, "endpoint": "ops@example.com, dev@example.com", "minPeriod": 0},
	}
}

func (h *harness) webhookOnly() bson.M {
	return bson.M{"webhook": bson.M{"isEnabled": true, "endpoint": h.webhook.URL, "minPeriod": 0}}
}

func rule(fields bson.M) bson.M {
	r := bson.M{"_id": bson.NewObjectID(), "isEnabled": true, "uidAdded": bson.NewObjectID(), "including": bson.A{}, "excluding": bson.A{}}
	for k, v := range fields {
		r[k] = v
	}
	return r
}

// message is a Hawk notifier message.
type message struct {
	ID   string // AMQP message-id; "" for none
	Body string
	Key  string // routing key through a hash exchange (publishVia): the groupHash
}

// event is a Hawk event; extra members are added to "event", and one that
// sets repetitionId replaces the default null (the decoder refuses a
// member named twice, as a poison message).
func event(project, title, group string, isNew bool, extra ...string) message {
	ev := fmt.Sprintf(`"title":%q,"groupHash":%q,"isNew":%t`, title, group, isNew)
	repetition := false
	for _, e := range extra {
		ev += "," + e
		repetition = repetition || strings.HasPrefix(e, `"repetitionId":`)
	}
	if !repetition {
		ev += `,"repetitionId":null`
	}
	return message{Body: fmt.Sprintf(`{"projectId":%q,"event":{%s}}`, project, ev), Key: group}
}

func (h *harness) publish(msgs ...message) {
	h.t.Helper()
	if err := publishErr(h.amqpURL, h.queue, msgs); err != nil {
		h.t.Fatal(err)
	}
}

// webhookBodies waits for n webhook requests and decodes them.
func (h *harness) webhookBodies(n int) []map[string]any {
	h.t.Helper()
	reqs, err := h.webhook.WaitFor(n, 30*time.Second)
	if err != nil {
		h.t.Fatalf("webhook: %v", err)
	}
	var bodies []map[string]any
	for _, r := range reqs {
		var b map[string]any
		if err := r.JSON(&b); err != nil {
			h.t.Fatalf("webhook body %s: %v", r.Body, err)
		}
		bodies = append(bodies, b)
	}
	return bodies
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logLines returns the decoded JSON log lines whose msg is msg.
func (b *syncBuffer) logLines(msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(b.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}
