package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

func endpointKey(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

// sealedChannels are every channel of a rule, each to its fake; the
// webhook's minPeriod keeps a digest pending in Redis for a while.
func (h *harness) sealedChannels() (bson.M, []string) {
	ch := h.allChannels()
	ch["loop"] = bson.M{"isEnabled": true, "endpoint": h.loop.URL, "minPeriod": 0}
	ch["webhook"] = bson.M{"isEnabled": true, "endpoint": h.webhook.URL, "minPeriod": 5}
	// What must never be stored in clear: the URLs (a Slack URL is a
	// secret), the chat id and the addresses.
	secrets := []string{h.webhook.URL, h.slack.URL, h.loop.URL, "-1001234", "ops@example.com", "dev@example.com"}
	return ch, secrets
}

// peekQueue returns the bodies of every message ready in a queue and puts
// them back (the channel closes without acking them).
func peekQueue(t *testing.T, amqpURL, queue string) [][]byte {
	t.Helper()
	var out [][]byte
	withChannel(t, amqpURL, func(ch *amqp.Channel) {
		for {
			d, ok, err := ch.Get(queue, false)
			if err != nil {
				t.Fatalf("get from %s: %v", queue, err)
			}
			if !ok {
				return
			}
			out = append(out, append(d.Body, fmt.Sprint(d.Headers)...))
		}
	})
	return out
}

// redisValues returns every value under prefix, by key: strings, hash
// fields and values, list, set and sorted-set members.
func redisValues(t *testing.T, rdb *redis.Client, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		var v any
		var err error
		switch typ, _ := rdb.Type(ctx, k).Result(); typ {
		case "string":
			v, err = rdb.Get(ctx, k).Result()
		case "hash":
			v, err = rdb.HGetAll(ctx, k).Result()
		case "list":
			v, err = rdb.LRange(ctx, k, 0, -1).Result()
		case "set":
			v, err = rdb.SMembers(ctx, k).Result()
		case "zset":
			v, err = rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
		default:
			continue // gone meanwhile, or a type Klaxon does not write
		}
		if err != nil && err != redis.Nil {
			t.Fatalf("read %s: %v", k, err)
		}
		out[k] = fmt.Sprint(v)
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func holdsAny(b []byte, secrets []string) string {
	for _, s := range secrets {
		if bytes.Contains(b, []byte(s)) {
			return s
		}
	}
	return ""
}

// With KLAXON_ENDPOINT_KEY set, no delivery job, retry, failed
// notification or digest in Redis holds an endpoint in clear, and every
// channel still gets its message. The evaluator seals with the old key and
// the deliverer runs with the new one first: a rotation under way.
func TestEndpointsSealedInQueuesAndRedis(t *testing.T) {
	h := newHarness(t)
	rdb := testenv.Redis(t)
	channels, secrets := h.sealedChannels()
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": channels}))
	oldKey, newKey := endpointKey(t), endpointKey(t)

	// The evaluator alone first, so that the delivery jobs wait in their queue.
	h.env["KLAXON_ROLE"] = "evaluator"
	h.env["KLAXON_ENDPOINT_KEY"] = oldKey
	h.start()
	h.publish(event(project, "Sealed", "g1", true))
	testenv.WaitFor(t, 30*time.Second, "5 delivery jobs queued", func() bool { return h.deliveryJobsReady(t) == 5 })
	// A project's jobs past its share of the main lane wait in the bulk lane.
	jobs := append(peekQueue(t, h.amqpURL, h.prefix+".deliveries"), peekQueue(t, h.amqpURL, h.prefix+".deliveries.bulk")...)
	if len(jobs) != 5 {
		t.Fatalf("%d delivery jobs, want 5", len(jobs))
	}
	for _, j := range jobs {
		if s := holdsAny(j, secrets); s != "" || !bytes.Contains(j, []byte(`"endpoint":"sealed:v1:`)) {
			t.Errorf("delivery job %s: want a sealed endpoint and none in clear", j)
		}
	}

	// Loop refuses its first message for good: it goes to .failed. Slack's
	// first is retried: it goes through a retry queue.
	h.loop.Fail(notifytest.Failure{Status: http.StatusBadRequest, Body: "no such hook"})
	h.slack.Fail(notifytest.Failure{Status: http.StatusBadGateway})
	h.env["KLAXON_ROLE"] = "deliverer"
	h.env["KLAXON_ENDPOINT_KEY"] = newKey + "," + oldKey
	w := h.start()
	h.publish(event(project, "Sealed again", "g2", true))

	// g2's webhook firing waits in its digest: Redis holds it meanwhile.
	w.waitMetric(t, 30*time.Second, "webhook digested == 1", func(v float64) bool { return v == 1 },
		"klaxon_notifications_total", "channel", "webhook", "outcome", "digested")
	pending := 0
	for k, v := range redisValues(t, rdb, h.prefix) {
		if strings.HasSuffix(k, ":pending") && strings.Contains(v, "sealed:v1:") {
			pending++
		}
		if s := holdsAny([]byte(v), secrets); s != "" {
			t.Errorf("Redis %s holds an endpoint in clear: %.300s", k, v)
		}
	}
	if pending == 0 {
		t.Error("no digest pending in Redis with a sealed endpoint: the scan saw nothing to check")
	}

	// Every channel gets its messages: g1 and g2 (webhook: g1, then the digest).
	for name, wait := range map[string]func() error{
		"webhook":  func() error { _, err := h.webhook.WaitFor(2, 30*time.Second); return err },
		"slack":    func() error { _, err := h.slack.WaitFor(3, 30*time.Second); return err }, // one refused
		"telegram": func() error { _, err := h.telegram.WaitFor(2, 30*time.Second); return err },
		"email":    func() error { _, err := h.smtp.WaitFor(2, 30*time.Second); return err },
		"loop":     func() error { _, err := h.loop.WaitFor(2, 30*time.Second); return err }, // one refused
	} {
		if err := wait(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if got := h.webhook.Requests(); len(got) > 0 && got[0].Header.Get("Idempotency-Key") == "" {
		t.Error("webhook request without its Idempotency-Key")
	}
	for _, m := range h.smtp.Messages() {
		if got := strings.Join(m.To, ","); got != "ops@example.com,dev@example.com" {
			t.Errorf("mail to %v, want the opened addresses", m.To)
		}
	}
	failed := peekQueue(t, h.amqpURL, h.prefix+".failed")
	if len(failed) != 1 {
		t.Fatalf("%d failed notifications, want loop's refused one", len(failed))
	}
	if s := holdsAny(failed[0], secrets); s != "" || !bytes.Contains(failed[0], []byte("sealed:v1:")) {
		t.Errorf("failed notification %s: want the endpoint sealed", failed[0])
	}
	if v := w.metric(t, "klaxon_notifications_total", "channel", "slack", "outcome", "retried"); v != 1 {
		t.Errorf("slack retried = %v, want 1", v)
	}
	if logs := h.logs.String(); strings.Contains(logs, h.slack.URL) || strings.Contains(logs, "ops@example.com") {
		t.Error("the log shows an endpoint")
	}
}

// A job sealed with a key the deliverer no longer holds fails for good at
// once, with a reason saying so and a metric, and nothing is sent: no
// retry loop, no crash loop.
func TestEndpointSealedWithUnknownKeyFailsForGood(t *testing.T) {
	h := newHarness(t)
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))
	h.env["KLAXON_ROLE"] = "evaluator"
	h.env["KLAXON_ENDPOINT_KEY"] = endpointKey(t)
	h.start()
	h.publish(event(project, "Old key", "g1", true))
	testenv.WaitFor(t, 30*time.Second, "a delivery job queued", func() bool {
		return readyMessages(t, h.amqpURL, h.prefix+".deliveries") == 1
	})

	h.env["KLAXON_ROLE"] = "deliverer"
	h.env["KLAXON_ENDPOINT_KEY"] = endpointKey(t) // the old key dropped too early
	w := h.start()
	w.waitMetric(t, 30*time.Second, "webhook failed == 1", func(v float64) bool { return v == 1 },
		"klaxon_notifications_total", "channel", "webhook", "outcome", "failed")
	if v := w.metric(t, "klaxon_endpoints_unopened_total", "channel", "webhook"); v != 1 {
		t.Errorf("klaxon_endpoints_unopened_total = %v, want 1", v)
	}
	var reason string
	testenv.WaitFor(t, 10*time.Second, "the failed notification", func() bool {
		for _, d := range getAll(t, h.amqpURL, h.prefix+".failed") {
			reason = fmt.Sprint(d.Headers["x-klaxon-error"])
		}
		return reason != ""
	})
	if !strings.Contains(reason, "KLAXON_ENDPOINT_KEY does not hold") {
		t.Errorf("failure reason %q, want it to say the key is not configured", reason)
	}
	if n := len(h.webhook.Requests()); n != 0 {
		t.Errorf("%d webhook requests, want none", n)
	}
	if v := w.metric(t, "klaxon_notifications_total", "channel", "webhook", "outcome", "retried"); v != 0 {
		t.Errorf("retried = %v, want 0: the failure is for good", v)
	}
}

// Without KLAXON_ENDPOINT_KEY, the worker says once at start that the
// queues and Redis hold endpoints in clear, naming the setting, and never
// an endpoint; with it, it says nothing of the kind.
func TestWarnsOnceThatEndpointsAreInClear(t *testing.T) {
	const warning = "endpoints are kept in clear: KLAXON_ENDPOINT_KEY is unset"
	h := newHarness(t)
	channels, secrets := h.sealedChannels()
	h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": channels}))
	h.start()
	lines := h.logs.logLines(warning)
	if len(lines) != 1 || lines[0]["level"] != "WARN" {
		t.Fatalf("%d warnings %q, want one:\n%s", len(lines), warning, h.logs)
	}
	for _, want := range []string{"delivery", "failed", "digests", "Redis"} {
		if !strings.Contains(fmt.Sprint(lines[0]), want) {
			t.Errorf("the warning does not say it protects %q: %v", want, lines[0])
		}
	}
	if s := holdsAny([]byte(h.logs.String()), secrets); s != "" {
		t.Errorf("the log holds the endpoint %q", s)
	}

	sealed := newHarness(t)
	sealed.env["KLAXON_ENDPOINT_KEY"] = endpointKey(t)
	sealed.start()
	if lines := sealed.logs.logLines(warning); len(lines) != 0 {
		t.Errorf("with a key: %v", lines)
	}
}
