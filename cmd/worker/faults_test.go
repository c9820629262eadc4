package main

// Fault injection against the real services: each test takes a dependency
// away (or feeds the worker what it should refuse) and requires an exact
// outcome. Rules used as witnesses:
//
//   - a SEEN_MORE rule whose threshold is the number of events of a group
//     fires once, at the last one, with that count: no event was lost;
//   - a SEEN_MORE rule whose threshold is one more never fires: no event
//     was counted twice.
//
// Each test has its own queue, key prefix, database and fakes, so they run
// in parallel with each other.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

const hour = int64(time.Hour / time.Millisecond)

func ruleID(r bson.M) string { return r["_id"].(bson.ObjectID).Hex() }

// editRule sets fields of the project document holding rule r.
func (h *harness) editRule(r bson.M, set bson.M) {
	h.t.Helper()
	res, err := h.db.Collection("projects").UpdateOne(context.Background(), bson.M{"notifications._id": r["_id"]}, bson.M{"$set": set})
	if err != nil {
		h.t.Fatal(err)
	}
	if res.ModifiedCount != 1 {
		h.t.Fatalf("edit of rule %s modified %d documents", ruleID(r), res.ModifiedCount)
	}
}

// timedEvent is event with a timestamp (Unix seconds).
func timedEvent(project, title, group string, isNew bool, ts float64) message {
	return event(project, title, group, isNew, fmt.Sprintf(`"timestamp":%.3f`, ts))
}

// byRule sorts webhook bodies by rule id and type.
func byRule(bodies []map[string]any) map[string][]map[string]any {
	out := map[string][]map[string]any{}
	for _, b := range bodies {
		out[b["ruleId"].(string)] = append(out[b["ruleId"].(string)], b)
	}
	return out
}

func distinctIDs(t *testing.T, reqs []notifytest.WebhookRequest) map[string]int {
	t.Helper()
	ids := map[string]int{}
	for _, r := range reqs {
		var b map[string]any
		if err := r.JSON(&b); err != nil {
			t.Fatalf("webhook body %s: %v", r.Body, err)
		}
		ids[b["id"].(string)]++
	}
	return ids
}

// Redis stopped mid-stream (SIGTERM, as an orderly shutdown does) and
// started again with its append-only file: nothing is acked that was not
// counted, /readyz and klaxon_dependency_up say Redis is down meanwhile,
// and once it is back every event has counted exactly once.
func TestRedisStoppedMidStream(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	h := newHarness(t)
	h.env["KLAXON_REDIS_URL"] = rs.URL()
	const total = 2000
	exact := rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": total, "thresholdPeriod": hour, "channels": h.webhookOnly()})
	over := rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": total + 1, "thresholdPeriod": hour, "channels": h.webhookOnly()})
	fresh := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()})
	project := h.project(exact, over, fresh)
	w := h.start()

	start := float64(time.Now().Add(-40*time.Minute).UnixMilli()) / 1000
	msgs := make([]message, total)
	for i := range msgs {
		// One event is new: the one at 1500, published once Redis is down.
		msgs[i] = timedEvent(project, "Redis went away", "storm", i == 1500, start+float64(i))
	}
	// Events keep coming while Redis stops: 500 at once, 1000 more in
	// chunks, and the last 500 once Redis is down.
	h.publish(msgs[:500]...)
	stopped := make(chan struct{})
	var wg sync.WaitGroup
	var pubErr error
	wg.Go(func() {
		for i := 500; i < total; i += 50 {
			if i == 1500 {
				<-stopped
			}
			if pubErr = publishErr(h.amqpURL, h.queue, msgs[i:i+50]); pubErr != nil {
				return
			}
		}
	})
	w.waitMetric(t, 30*time.Second, "700 events counted", func(v float64) bool { return v >= 700 },
		"klaxon_events_total", "outcome", "counted")
	rs.stop()
	close(stopped)
	wg.Wait()
	if pubErr != nil {
		t.Fatal(pubErr)
	}

	// The gauge follows Redis by itself, without a /readyz probe.
	w.waitMetric(t, 10*time.Second, `klaxon_dependency_up{dependency="redis"} == 0`, func(v float64) bool { return v == 0 },
		"klaxon_dependency_up", "dependency", "redis")
	status, body := w.readyz(t)
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "redis: ") || strings.Contains(body, "redis: ok") {
		t.Errorf("/readyz with Redis down: %d %q, want 503 naming redis", status, body)
	}
	// Nothing acked that was not counted: the queue holds exactly the
	// events not counted yet (ready, or delivered to the worker and held).
	var counted float64
	var ready, unacked int
	if _, _, ok := queueMessages(t, h.queue); ok {
		testenv.WaitFor(t, 15*time.Second, "queue to hold every uncounted event", func() bool {
			counted = w.metric(t, "klaxon_events_total", "outcome", "counted")
			ready, unacked, _ = queueMessages(t, h.queue)
			return ready+unacked == total-int(counted)
		})
		t.Logf("Redis down: %v events counted, %d ready and %d unacked in the queue", counted, ready, unacked)
	} else {
		// rabbitmqctl does not see this broker: what the worker holds
		// unacked cannot be counted from here.
		counted = w.metric(t, "klaxon_events_total", "outcome", "counted")
		t.Logf("Redis down: %v events counted, %d ready in the queue", counted, readyMessages(t, h.amqpURL, h.queue))
	}
	if counted > total-500 {
		t.Fatalf("%v events counted with Redis down", counted)
	}

	if failed := h.logs.logLines("handler failed; holding the batch to retry it"); len(failed) > 0 {
		t.Logf("the batch in flight failed with: %v", failed[0]["err"])
	}

	rs.start()
	bodies := h.webhookBodies(2)
	rules := byRule(bodies)
	if got := rules[ruleID(exact)]; len(got) != 1 || got[0]["type"] != "threshold" || got[0]["count"] != float64(total) {
		t.Errorf("threshold notifications %v, want one with count %d", got, total)
	}
	if got := rules[ruleID(fresh)]; len(got) != 1 || got[0]["type"] != "new" {
		t.Errorf("new-error notifications %v, want one", got)
	}
	testenv.WaitFor(t, 30*time.Second, "the queue to drain", func() bool {
		if ready, unacked, ok := queueMessages(t, h.queue); ok && ready+unacked != 0 {
			return false
		}
		return readyMessages(t, h.amqpURL, h.queue) == 0
	})
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 2)
	if got := byRule(h.webhookBodies(2))[ruleID(over)]; len(got) != 0 {
		t.Errorf("threshold %d fired: an event counted twice: %v", total+1, got)
	}
	counted = w.metric(t, "klaxon_events_total", "outcome", "counted")
	dups := w.metric(t, "klaxon_events_total", "outcome", "duplicate")
	if counted > total || counted+dups < total {
		t.Errorf("events counted %v, duplicate %v; want %d counted in all", counted, dups, total)
	}
	w.waitMetric(t, 10*time.Second, `klaxon_dependency_up{dependency="redis"} == 1`, func(v float64) bool { return v == 1 },
		"klaxon_dependency_up", "dependency", "redis")
	if status, body := w.readyz(t); status != http.StatusOK {
		t.Errorf("/readyz after Redis came back: %d %q", status, body)
	}
}

// The connection to Redis breaks after Redis ran the counting script and
// before its reply arrived: the retry must count nothing twice, whether the
// messages carry ids (Hawk's repetitionId) or not (the batch's own token
// tells its earlier attempt's writes). A proxy holds Redis' replies from
// the script on, the script runs, then the connections are cut.
func TestRedisReplyLost(t *testing.T) {
	t.Parallel()
	for _, ids := range []bool{true, false} {
		t.Run(fmt.Sprint("ids=", ids), func(t *testing.T) {
			t.Parallel()
			rs := startRedis(t)
			p := newTCPProxy(t, "127.0.0.1:"+rs.port)
			h := newHarness(t)
			h.env["KLAXON_REDIS_URL"] = p.proxyURL(t, rs.URL())
			const total = 600
			exact := rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": total, "thresholdPeriod": hour, "channels": h.webhookOnly()})
			over := rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": total + 1, "thresholdPeriod": hour, "channels": h.webhookOnly()})
			project := h.project(exact, over)
			w := h.start()
			var msgs []message
			for i := range total {
				if ids {
					msgs = append(msgs, event(project, "Lost reply", "lost", false, fmt.Sprintf(`"repetitionId":"r%d"`, i)))
				} else {
					msgs = append(msgs, event(project, "Lost reply", "lost", false))
				}
			}
			h.publish(msgs[:total/2]...)
			w.waitMetric(t, 30*time.Second, "the first half counted", func(v float64) bool { return v == total/2 },
				"klaxon_events_total", "outcome", "counted")

			// The worker reads group states, then writes them with a
			// script: the replies are held from that script on, so that it
			// runs and its reply is lost.
			calls := rs.scriptCalls(t)
			p.holdOnRequest("EVALSHA")
			h.publish(msgs[total/2:]...)
			testenv.WaitFor(t, 30*time.Second, "Redis to run the script with its reply held", func() bool { return rs.scriptCalls(t) > calls })
			p.cut()
			p.release()

			b := h.webhookBodies(1)[0]
			if b["ruleId"] != ruleID(exact) || b["count"] != float64(total) {
				t.Errorf("notification %v, want rule %s with count %d", b, ruleID(exact), total)
			}
			waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 1)
			if n := readyMessages(t, h.amqpURL, h.queue); n != 0 {
				t.Errorf("%d messages left in the queue", n)
			}
		})
	}
}

// Redis stops while a notification is on its way: the provider takes it,
// and the deliverer cannot record that it did. When Redis is back, the
// notification must not be sent again.
func TestRedisDownWhileSending(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	h := newHarness(t)
	h.env["KLAXON_REDIS_URL"] = rs.URL()
	// In front of the webhook sink: the first request stops Redis before
	// the sink answers it.
	stopReq, stopped := make(chan struct{}), make(chan struct{})
	var once sync.Once
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() {
			select {
			case stopReq <- struct{}{}:
				<-stopped
			case <-time.After(30 * time.Second):
			}
		})
		req, err := http.NewRequestWithContext(r.Context(), r.Method, h.webhook.URL, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(front.Close)
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": bson.M{
		"webhook": bson.M{"isEnabled": true, "endpoint": front.URL + "/hook", "minPeriod": 0},
	}}))
	w := h.start()
	h.publish(event(project, "Redis away mid-send", "g", true))
	select {
	case <-stopReq:
	case <-time.After(30 * time.Second):
		t.Fatal("no notification sent")
	}
	rs.stop()
	close(stopped)
	w.waitMetric(t, 30*time.Second, "a delivery batch to fail", func(v float64) bool { return v >= 1 },
		"klaxon_batches_total", "stage", "deliverer", "outcome", "error")
	rs.start()
	w.waitMetric(t, 30*time.Second, "a delivery batch to succeed", func(v float64) bool { return v >= 1 },
		"klaxon_batches_total", "stage", "deliverer", "outcome", "ok")
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 1)
	if v := w.metric(t, "klaxon_notifications_total", "channel", "webhook", "outcome", "sent"); v != 1 {
		t.Errorf("sent = %v, want 1", v)
	}
}

// brokerOutage runs a stream of events through a worker while the broker
// goes away twice: once while events are being counted, once while
// notifications are being delivered, their first failSends sends having
// failed so that their jobs wait in the retry queues. down and up take the
// broker away and bring it back. Every event of the groups × perGroup must
// count once and every notification be delivered once.
func brokerOutage(t *testing.T, h *harness, perGroup, failSends int, down, up func()) {
	const groups = 100
	fresh := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()})
	exact := rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": perGroup, "thresholdPeriod": hour, "channels": h.webhookOnly()})
	over := rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": perGroup + 1, "thresholdPeriod": hour, "channels": h.webhookOnly()})
	project := h.project(fresh, exact, over)
	// Small batches: many of them in flight when the broker goes.
	h.env["KLAXON_PREFETCH"], h.env["KLAXON_BATCH_SIZE"] = "40", "10"
	// The first sends fail: their jobs wait in the retry queues while the
	// broker is away the second time.
	h.webhook.FailNext(failSends, notifytest.Failure{Status: http.StatusServiceUnavailable})
	w := h.start()

	var msgs []message
	for i := range groups * perGroup {
		msgs = append(msgs, event(project, "Broker outage", fmt.Sprint("g", i%groups), i < groups, fmt.Sprintf(`"repetitionId":"r%d"`, i)))
	}
	h.publish(msgs[:1000]...)
	// The rest goes on being published, straight to the broker, while the
	// worker loses it; a chunk the broker did not confirm is published
	// again, which the worker must take as the duplicate it is.
	var wg sync.WaitGroup
	pubDone := make(chan struct{})
	var pubErrs []error
	wg.Go(func() {
		defer close(pubDone)
		deadline := time.Now().Add(60 * time.Second)
		for i := 1000; i < len(msgs); i += 100 {
			for {
				err := publishErr(h.amqpURL, h.queue, msgs[i:min(i+100, len(msgs))])
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					pubErrs = append(pubErrs, err)
					return
				}
				time.Sleep(100 * time.Millisecond) // the broker is away: try again
			}
		}
	})
	t.Cleanup(wg.Wait)

	outage := func(what string) {
		t.Helper()
		unavailable := h.logCount("rabbitmq unavailable")
		down()
		t.Logf("broker going away %s: %v events counted, %d webhook requests", what,
			w.metric(t, "klaxon_events_total", "outcome", "counted"), len(h.webhook.Requests()))
		testenv.WaitFor(t, 30*time.Second, "/readyz to name the broker", func() bool {
			status, body := w.readyz(t)
			return status == http.StatusServiceUnavailable && strings.Contains(body, "amqp: ") && !strings.Contains(body, "amqp: ok")
		})
		w.waitMetric(t, 10*time.Second, `klaxon_dependency_up{dependency="amqp"} == 0`, func(v float64) bool { return v == 0 },
			"klaxon_dependency_up", "dependency", "amqp")
		// The worker tried to reconnect and was refused.
		testenv.WaitFor(t, 30*time.Second, "a failed reconnect", func() bool { return h.logCount("rabbitmq unavailable") > unavailable })
		up()
		testenv.WaitFor(t, 60*time.Second, "/readyz after the broker came back", func() bool {
			status, _ := w.readyz(t)
			return status == http.StatusOK
		})
	}

	w.waitMetric(t, 30*time.Second, "500 events counted", func(v float64) bool { return v >= 500 },
		"klaxon_events_total", "outcome", "counted")
	outage("while counting")
	if _, err := h.webhook.WaitFor(60, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	outage("while delivering")

	select {
	case <-pubDone:
	case <-time.After(90 * time.Second):
		t.Fatal("publishing did not finish")
	}
	if len(pubErrs) > 0 {
		t.Fatalf("publish: %v", pubErrs)
	}
	if _, err := h.webhook.WaitFor(2*groups+failSends, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 2*groups+failSends)
	var delivered []notifytest.WebhookRequest
	var bodies []map[string]any
	for _, r := range h.webhook.Requests() {
		if r.Status != http.StatusOK {
			continue
		}
		delivered = append(delivered, r)
		var b map[string]any
		if err := r.JSON(&b); err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, b)
	}
	for id, n := range distinctIDs(t, delivered) {
		if n != 1 {
			t.Errorf("notification %s delivered %d times", id, n)
		}
	}
	perRule := byRule(bodies)
	if n := len(perRule[ruleID(fresh)]); n != groups {
		t.Errorf("%d new-error notifications, want %d", n, groups)
	}
	seen := map[string]bool{}
	for _, b := range perRule[ruleID(exact)] {
		g := b["event"].(map[string]any)["groupHash"].(string)
		if b["count"] != float64(perGroup) || seen[g] {
			t.Errorf("threshold notification %v (group seen before: %t)", b, seen[g])
		}
		seen[g] = true
	}
	if len(seen) != groups {
		t.Errorf("%d groups reached %d events, want %d: events were lost", len(seen), perGroup, groups)
	}
	if n := len(perRule[ruleID(over)]); n != 0 {
		t.Errorf("threshold %d fired %d times: events counted twice", perGroup+1, n)
	}
	testenv.WaitFor(t, 30*time.Second, "the queues to drain", func() bool {
		for _, q := range []string{h.queue, h.prefix + ".deliveries", h.prefix + ".deliveries.bulk"} {
			if ready, unacked, ok := queueMessages(t, q); ok && ready+unacked != 0 {
				return false
			}
			if readyMessages(t, h.amqpURL, q) != 0 {
				return false
			}
		}
		return true
	})
	counted := w.metric(t, "klaxon_events_total", "outcome", "counted")
	dups := w.metric(t, "klaxon_events_total", "outcome", "duplicate")
	if counted > float64(len(msgs)) || counted+dups < float64(len(msgs)) {
		t.Errorf("events counted %v, duplicate %v; want %d counted in all", counted, dups, len(msgs))
	}
	if n := len(getAll(t, h.amqpURL, h.prefix+".failed")); n != 0 {
		t.Errorf("%d notifications failed", n)
	}
}

// The broker's connections are cut, and new ones refused for a while,
// twice: through a TCP proxy between the worker and RabbitMQ, so the broker
// itself keeps serving the tests running in parallel.
func TestBrokerConnectionsCutMidStream(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	p := newTCPProxy(t, hostPort(t, h.amqpURL, "5672"))
	h.env["KLAXON_AMQP_URL"] = p.proxyURL(t, h.amqpURL)
	brokerOutage(t, h, 30, 40,
		func() {
			p.refuse(true)
			if n := p.cut(); n == 0 {
				t.Error("no connection through the proxy to cut")
			}
		},
		func() { p.refuse(false) },
	)
}

// BrokerRestartEnv enables TestBrokerRestart, which stops the shared
// RabbitMQ: scripts/test.sh sets it in a phase of its own, after every
// other test has finished.
const brokerRestartEnv = "KLAXON_TEST_BROKER_RESTART"

// A real broker restart (rabbitmqctl stop_app / start_app) mid-stream.
func TestBrokerRestart(t *testing.T) {
	if os.Getenv(brokerRestartEnv) != "1" {
		t.Skipf("stops the shared RabbitMQ; set %s=1 to run it alone (scripts/test.sh does)", brokerRestartEnv)
	}
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Fatalf("rabbitmqctl not found: %v", err)
	}
	rabbitmqctl := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		if out, err := exec.CommandContext(ctx, "rabbitmqctl", args...).CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	h := newHarness(t)
	restarted := false
	t.Cleanup(func() {
		if !restarted { // a failure between stop and start: leave the broker running
			_ = exec.Command("rabbitmqctl", "start_app").Run()
			_ = exec.Command("rabbitmqctl", "await_startup").Run()
		}
	})
	// More events and failed sends than through the proxy: stop_app takes
	// a second or two, and the broker must go while work is in flight.
	brokerOutage(t, h, 100, 150,
		func() {
			restarted = false
			rabbitmqctl("stop_app")
		},
		func() {
			rabbitmqctl("start_app")
			rabbitmqctl("await_startup")
			restarted = true
		},
	)
}

// A webhook answering 500 twice, then 200: sent once, after two retries,
// with the same Idempotency-Key each time.
func TestWebhookRetriedAfter5xx(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.webhook.FailNext(2, notifytest.Failure{Status: http.StatusInternalServerError, Body: "upstream down"})
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))
	w := h.start()
	h.publish(event(project, "Flaky receiver", "g", true))
	reqs, err := h.webhook.WaitFor(3, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 3)
	for i, want := range []int{500, 500, 200} {
		if reqs[i].Status != want || reqs[i].Header.Get("Idempotency-Key") != reqs[0].Header.Get("Idempotency-Key") {
			t.Errorf("request %d: status %d, key %q", i, reqs[i].Status, reqs[i].Header.Get("Idempotency-Key"))
		}
	}
	w.waitMetric(t, 10*time.Second, "sent == 1", func(v float64) bool { return v == 1 },
		"klaxon_notifications_total", "channel", "webhook", "outcome", "sent")
	if v := w.metric(t, "klaxon_notifications_total", "channel", "webhook", "outcome", "retried"); v != 2 {
		t.Errorf("retried = %v, want 2", v)
	}
	if v := w.metric(t, "klaxon_notifications_total", "channel", "webhook", "outcome", "failed"); v != 0 {
		t.Errorf("failed = %v, want 0", v)
	}
}

// Slack and Telegram saying 429 with a delay of 2 s: delivered once, and
// the second attempt did not come before the delay.
func TestRateLimitedProvidersHonourRetryAfter(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const delay = 2 * time.Second
	h.slack.Fail(notifytest.Failure{Status: http.StatusTooManyRequests, RetryAfter: delay, Body: "rate_limited"})
	h.telegram.Fail(notifytest.Failure{Status: http.StatusTooManyRequests, RetryAfter: delay})
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": bson.M{
		"slack":    bson.M{"isEnabled": true, "endpoint": h.slack.URL, "minPeriod": 0},
		"telegram": bson.M{"isEnabled": true, "endpoint": "-100777", "minPeriod": 0},
	}}))
	w := h.start()
	h.publish(event(project, "Too chatty", "g", true))

	slackReqs, err := h.slack.WaitFor(2, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tgReqs, err := h.telegram.WaitFor(2, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, func() int { return len(h.slack.Requests()) + len(h.telegram.Requests()) }, 4)
	if s := []int{slackReqs[0].Status, slackReqs[1].Status}; s[0] != 429 || s[1] != 200 {
		t.Errorf("Slack answered %v, want 429 then 200", s)
	}
	if gap := slackReqs[1].Received.Sub(slackReqs[0].Received); gap < delay {
		t.Errorf("Slack retried %s after a 429 with Retry-After: 2", gap)
	}
	if s := []int{tgReqs[0].Status, tgReqs[1].Status}; s[0] != 429 || s[1] != 200 {
		t.Errorf("Telegram answered %v, want 429 then 200", s)
	}
	if gap := tgReqs[1].Received.Sub(tgReqs[0].Received); gap < delay {
		t.Errorf("Telegram retried %s after retry_after 2", gap)
	}
	for _, ch := range []string{"slack", "telegram"} {
		w.waitMetric(t, 10*time.Second, ch+" sent == 1", func(v float64) bool { return v == 1 },
			"klaxon_notifications_total", "channel", ch, "outcome", "sent")
		if v := w.metric(t, "klaxon_notifications_total", "channel", ch, "outcome", "retried"); v != 1 {
			t.Errorf("%s retried = %v, want 1", ch, v)
		}
	}
}

// An SMTP server answering 451 (try again later), then accepting: one mail.
func TestSMTPTransientFailureRetried(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.smtp.Fail(notifytest.SMTPFailure{Code: 451})
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": bson.M{
		"email": bson.M{"isEnabled": true, "endpoint": "ops@example.com", "minPeriod": 0},
	}}))
	w := h.start()
	h.publish(event(project, "Mail server busy", "g", true))
	if _, err := h.smtp.WaitFor(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, func() int { return len(h.smtp.Messages()) }, 1)
	w.waitMetric(t, 10*time.Second, "email sent == 1", func(v float64) bool { return v == 1 },
		"klaxon_notifications_total", "channel", "email", "outcome", "sent")
	if v := w.metric(t, "klaxon_notifications_total", "channel", "email", "outcome", "retried"); v != 1 {
		t.Errorf("email retried = %v, want 1", v)
	}
}

// Permanent failures (webhook 400, SMTP 550) are not retried: the
// notification lands in <prefix>.failed with the reason.
func TestPermanentFailuresGoToFailedQueue(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.webhook.Fail(notifytest.Failure{Status: http.StatusBadRequest, Body: "unknown receiver"})
	h.smtp.Fail(notifytest.SMTPFailure{Code: 550, Message: "mailbox unavailable"})
	r := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": bson.M{
		"webhook": bson.M{"isEnabled": true, "endpoint": h.webhook.URL, "minPeriod": 0},
		"email":   bson.M{"isEnabled": true, "endpoint": "ops@example.com", "minPeriod": 0},
	}})
	project := h.project(r)
	w := h.start()
	h.publish(event(project, "Nobody listens", "g", true))

	for _, ch := range []string{"webhook", "email"} {
		w.waitMetric(t, 30*time.Second, ch+" failed == 1", func(v float64) bool { return v == 1 },
			"klaxon_notifications_total", "channel", ch, "outcome", "failed")
	}
	reasons := map[string]string{}
	testenv.WaitFor(t, 10*time.Second, "two failed notifications", func() bool {
		for _, d := range getAll(t, h.amqpURL, h.prefix+".failed") {
			var job struct {
				Channel string `json:"channel"`
				RuleID  string `json:"ruleId"`
			}
			if err := json.Unmarshal(d.Body, &job); err != nil {
				t.Fatalf("failed job %s: %v", d.Body, err)
			}
			if job.RuleID != ruleID(r) {
				t.Errorf("failed job of rule %q", job.RuleID)
			}
			reasons[job.Channel] = fmt.Sprint(d.Headers["x-klaxon-error"])
		}
		return len(reasons) == 2
	})
	if !strings.Contains(reasons["webhook"], "HTTP 400") || !strings.Contains(reasons["webhook"], "unknown receiver") {
		t.Errorf("webhook failure reason %q", reasons["webhook"])
	}
	if !strings.Contains(reasons["email"], "550") || !strings.Contains(reasons["email"], "mailbox unavailable") {
		t.Errorf("email failure reason %q", reasons["email"])
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) + len(h.smtp.Messages()) }, 1)
	for _, ch := range []string{"webhook", "email"} {
		for _, outcome := range []string{"retried", "sent"} {
			if v := w.metric(t, "klaxon_notifications_total", "channel", ch, "outcome", outcome); v != 0 {
				t.Errorf("%s %s = %v, want 0", ch, outcome, v)
			}
		}
	}
}

// Five firings within a channel's minPeriod of 2 s: the first is sent at
// once, the other four in one digest when the period ends.
func TestMinPeriodDigest(t *testing.T) {
	// Not parallel: the gap between two messages is measured.
	h := newHarness(t)
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": bson.M{
		"webhook": bson.M{"isEnabled": true, "endpoint": h.webhook.URL, "minPeriod": 2},
		"loop":    bson.M{"isEnabled": true, "endpoint": h.loop.URL, "minPeriod": 2},
	}}))
	// Loop's digest is refused once: it is retried, not lost or repeated.
	h.loop.Fail(notifytest.Failure{Status: 200}, notifytest.Failure{Status: 502})
	w := h.start()
	var msgs []message
	for i := range 5 {
		msgs = append(msgs, event(project, "Cascade", fmt.Sprint("g", i), true))
	}
	h.publish(msgs...)
	reqs, err := h.webhook.WaitFor(2, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 2)
	var first, digest map[string]any
	if err := reqs[0].JSON(&first); err != nil {
		t.Fatal(err)
	}
	if err := reqs[1].JSON(&digest); err != nil {
		t.Fatal(err)
	}
	if first["type"] != "new" {
		t.Errorf("first message %v, want a single new-error notification", first)
	}
	ns, _ := digest["notifications"].([]any)
	if digest["type"] != "digest" || len(ns) != 4 || digest["projectId"] != project {
		t.Fatalf("second message %v, want a digest of 4", digest)
	}
	groups := map[any]bool{first["event"].(map[string]any)["groupHash"]: true}
	for _, n := range ns {
		groups[n.(map[string]any)["event"].(map[string]any)["groupHash"]] = true
	}
	if len(groups) != 5 {
		t.Errorf("groups notified %v, want all 5", groups)
	}
	if gap := reqs[1].Received.Sub(reqs[0].Received); gap < 2*time.Second {
		t.Errorf("digest sent %s after the first message, inside the minPeriod of 2 s", gap)
	}
	if reqs[1].Header.Get("Idempotency-Key") != digest["id"] {
		t.Errorf("digest Idempotency-Key %q, id %v", reqs[1].Header.Get("Idempotency-Key"), digest["id"])
	}
	w.waitMetric(t, 10*time.Second, "sent == 2", func(v float64) bool { return v == 2 },
		"klaxon_notifications_total", "channel", "webhook", "outcome", "sent")
	if v := w.metric(t, "klaxon_notifications_total", "channel", "webhook", "outcome", "digested"); v != 4 {
		t.Errorf("digested = %v, want 4", v)
	}

	// Loop, the same: one message, then one digest of the other four.
	loopReqs, err := h.loop.WaitFor(3, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, func() int { return len(h.loop.Requests()) }, 3)
	if loopReqs[1].Status != 502 || loopReqs[2].Status != 200 || loopReqs[1].Text != loopReqs[2].Text {
		t.Errorf("loop answers %d, %d: want the digest refused, then the same digest accepted", loopReqs[1].Status, loopReqs[2].Status)
	}
	if !strings.Contains(loopReqs[0].Text, "Notification id ") || !strings.Contains(loopReqs[2].Text, "**4 notifications for rule") {
		t.Errorf("loop messages %q, %q: want one notification, then a digest of 4", loopReqs[0].Text, loopReqs[2].Text)
	}
	w.waitMetric(t, 10*time.Second, "loop sent == 2", func(v float64) bool { return v == 2 },
		"klaxon_notifications_total", "channel", "loop", "outcome", "sent")
}

// MongoDB unreachable after the rules loaded: the worker goes on with the
// last good rules and stays ready; when MongoDB is back, an edit made
// meanwhile applies.
func TestMongoUnreachableKeepsLastGoodRules(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	mongoURL := h.env["KLAXON_MONGO_URL"]
	p := newTCPProxy(t, hostPort(t, mongoURL, "27017"))
	h.env["KLAXON_MONGO_URL"] = p.proxyURL(t, mongoURL)
	r := rule(bson.M{"whatToReceive": "ONLY_NEW", "including": bson.A{"alpha"}, "channels": h.webhookOnly()})
	project := h.project(r)
	w := h.start()
	h.publish(event(project, "alpha 1", "a1", true))
	h.webhookBodies(1)

	errors0 := w.metric(t, "klaxon_rule_loads_total", "outcome", "error")
	p.refuse(true)
	p.cut()
	w.waitMetric(t, 30*time.Second, "a failed rule load", func(v float64) bool { return v > errors0 },
		"klaxon_rule_loads_total", "outcome", "error")
	okAtCut := w.metric(t, "klaxon_rule_loads_total", "outcome", "ok")
	if status, body := w.readyz(t); status != http.StatusOK {
		t.Errorf("/readyz with MongoDB away: %d %q, want 200: the last good rules serve", status, body)
	}
	if v := w.metric(t, "klaxon_dependency_up", "dependency", "rules"); v != 0 {
		t.Errorf(`klaxon_dependency_up{dependency="rules"} = %v with MongoDB away, want 0`, v)
	}

	// Edited while the worker cannot see it: "alpha" still fires, "beta"
	// does not yet.
	h.editRule(r, bson.M{"notifications.0.including": bson.A{"beta"}})
	unmatched := w.metric(t, "klaxon_events_total", "outcome", "unmatched")
	h.publish(event(project, "alpha 2", "a2", true), event(project, "beta 1", "b1", true))
	w.waitMetric(t, 30*time.Second, "beta 1 unmatched", func(v float64) bool { return v == unmatched+1 },
		"klaxon_events_total", "outcome", "unmatched")
	bodies := h.webhookBodies(2)
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 2)
	if g := bodies[1]["event"].(map[string]any)["groupHash"]; g != "a2" {
		t.Errorf("notified group %v with MongoDB away, want a2", g)
	}

	p.refuse(false)
	w.waitMetric(t, 60*time.Second, "a rule load after MongoDB came back", func(v float64) bool { return v > okAtCut },
		"klaxon_rule_loads_total", "outcome", "ok")
	w.waitMetric(t, 10*time.Second, `klaxon_dependency_up{dependency="rules"} == 1`, func(v float64) bool { return v == 1 },
		"klaxon_dependency_up", "dependency", "rules")
	unmatched = w.metric(t, "klaxon_events_total", "outcome", "unmatched")
	h.publish(event(project, "alpha 3", "a3", true), event(project, "beta 2", "b2", true))
	w.waitMetric(t, 30*time.Second, "alpha 3 unmatched", func(v float64) bool { return v == unmatched+1 },
		"klaxon_events_total", "outcome", "unmatched")
	bodies = h.webhookBodies(3)
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 3)
	if g := bodies[2]["event"].(map[string]any)["groupHash"]; g != "b2" {
		t.Errorf("notified group %v after MongoDB came back, want b2", g)
	}
	if status, body := w.readyz(t); status != http.StatusOK {
		t.Errorf("/readyz: %d %q", status, body)
	}
}

// Input the worker must refuse (over the size limit, not UTF-8, a 1 MB
// title) is dead-lettered with the reason while the queue keeps flowing;
// a 200 KB title is accepted and truncated on every channel.
func TestEdgeInput(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.allChannels()}))
	w := h.start()

	big := event(project, "big", "g-big", true, `"context":"`+strings.Repeat("x", 300<<10)+`"`)
	big.ID = "too-big"
	// Raw bytes: event() would quote them as escapes.
	notUTF8 := message{ID: "not-utf8", Body: `{"projectId":"` + project + `","event":{"title":"bad ` + "\xff\xfe" + ` bytes","groupHash":"g-utf8","isNew":true}}`}
	hugeTitle := event(project, strings.Repeat("T", 1<<20), "g-huge", true)
	hugeTitle.ID = "huge-title"
	longTitle := "Long " + strings.Repeat("é", 100<<10) // 200 KB
	h.publish(big, notUTF8, hugeTitle, event(project, longTitle, "g-long", true), event(project, "after the poison", "g-ok", true))

	bodies := h.webhookBodies(2)
	waitQuiet(t, func() int {
		return len(h.webhook.Requests()) + len(h.slack.Requests()) + len(h.telegram.Requests()) + len(h.smtp.Messages())
	}, 8)
	for _, b := range bodies {
		ev := b["event"].(map[string]any)
		title := ev["title"].(string)
		switch ev["groupHash"] {
		case "g-long":
			if len(title) > 1100 || !strings.HasPrefix(longTitle, strings.TrimSuffix(title, "…")) {
				t.Errorf("long title arrived as %d bytes (%.40q…), want it truncated", len(title), title)
			}
		case "g-ok":
		default:
			t.Errorf("notified %v", ev)
		}
	}
	for _, r := range h.slack.Requests() {
		if r.Status != 200 {
			t.Errorf("Slack refused a message: %d", r.Status)
		}
	}
	for _, r := range h.telegram.Requests() {
		if r.Status != 200 {
			t.Errorf("Telegram refused a message: %d %s", r.Status, r.Description)
		}
	}

	reasons := map[string]string{}
	testenv.WaitFor(t, 10*time.Second, "3 dead letters", func() bool {
		for _, d := range getAll(t, h.amqpURL, h.queue+".dead") {
			reasons[d.MessageId] = fmt.Sprint(d.Headers["x-klaxon-error"])
			if d.MessageId == "huge-title" && len(d.Body) != len(hugeTitle.Body) {
				t.Errorf("dead letter of %d bytes, published %d", len(d.Body), len(hugeTitle.Body))
			}
		}
		return len(reasons) == 3
	})
	for id, want := range map[string]string{
		"too-big": "over the 262144 byte limit", "not-utf8": "not valid UTF-8", "huge-title": "over the 262144 byte limit",
	} {
		if !strings.Contains(reasons[id], want) {
			t.Errorf("dead letter %s says %q, want %q", id, reasons[id], want)
		}
	}
	if v := w.metric(t, "klaxon_events_total", "outcome", "dead"); v != 3 {
		t.Errorf("dead events = %v, want 3", v)
	}
	if n := readyMessages(t, h.amqpURL, h.queue); n != 0 {
		t.Errorf("%d messages left in the queue", n)
	}
}

// A project with 2,000 rules, all matching one event: each fires once, in
// a few grouped messages, and the batch completes on its first try.
func TestTwoThousandRules(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const n = 2000
	var rs []bson.M
	for i := range n {
		if i%2 == 0 {
			rs = append(rs, rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))
		} else {
			rs = append(rs, rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": 1, "thresholdPeriod": 60000, "channels": h.webhookOnly()}))
		}
	}
	project := h.project(rs...)
	h.env["KLAXON_RULES_REFRESH"] = "5s" // the default: not 2,000 rules reloaded 5 times a second
	// Over the default limit of 100: an operator who trusts a project
	// raises it, and the worker must then cope.
	h.env["KLAXON_MAX_RULES_PER_PROJECT"] = "2000"
	w := h.start()
	begin := time.Now()
	h.publish(event(project, "Everything is on fire", "g", true))
	// One event, one endpoint: grouped messages naming every rule once,
	// as few as the bound on a delivery job's size allows (2,000 firings
	// are over 1 MiB of JSON: three jobs of at most 512 KiB).
	testenv.WaitFor(t, 30*time.Second, "every rule notified", func() bool {
		return len(firingsOf(t, h.webhookBodies(len(h.webhook.Requests())))) >= n
	})
	sent := len(h.webhook.Requests())
	t.Logf("%d messages for %d firings in %s", sent, n, time.Since(begin).Round(time.Millisecond))
	if sent > 4 {
		t.Errorf("%d messages for one event on one endpoint, want the fewest within the bound", sent)
	}
	// A second event of the group: every rule is quiet now.
	h.publish(event(project, "Everything is on fire", "g", false, `"repetitionId":"2"`))
	w.waitMetric(t, 30*time.Second, "2 events counted", func(v float64) bool { return v == 2 },
		"klaxon_events_total", "outcome", "counted")
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, sent)
	seen := firingsOf(t, h.webhookBodies(sent))
	for _, r := range rs {
		if c := seen[ruleID(r)+"/g"]; len(c) != 1 || c[0] != "grouped" {
			t.Errorf("rule %s notified in %v", ruleID(r), c)
		}
	}
	if v := w.metric(t, "klaxon_firings_total"); v != n {
		t.Errorf("firings = %v, want %d", v, n)
	}
	if v := w.metric(t, "klaxon_batches_total", "stage", "evaluator", "outcome", "error"); v != 0 {
		t.Errorf("%v evaluator batches failed", v)
	}
}

// A threshold edited while events stream in: once the rules reload, the
// new threshold applies to the counts so far, and nothing breaks.
func TestRuleEditedMidStream(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := rule(bson.M{"whatToReceive": "SEEN_MORE", "threshold": 1000, "thresholdPeriod": hour, "channels": h.webhookOnly()})
	project := h.project(r)
	w := h.start()
	var msgs []message
	for i := range 400 {
		msgs = append(msgs, event(project, "Edited", "g", false, fmt.Sprintf(`"repetitionId":"r%d"`, i)))
	}
	var wg sync.WaitGroup
	var pubErr error
	wg.Go(func() {
		for i := 0; i < 300; i += 20 {
			if err := publishErr(h.amqpURL, h.queue, msgs[i:i+20]); err != nil {
				pubErr = err
				return
			}
		}
	})
	w.waitMetric(t, 30*time.Second, "100 events counted", func(v float64) bool { return v >= 100 },
		"klaxon_events_total", "outcome", "counted")
	loads := w.metric(t, "klaxon_rule_loads_total", "outcome", "ok")
	h.editRule(r, bson.M{"notifications.0.threshold": 50})
	// Two loads later, one began after the edit.
	w.waitMetric(t, 30*time.Second, "the rules to reload", func(v float64) bool { return v >= loads+2 },
		"klaxon_rule_loads_total", "outcome", "ok")
	wg.Wait()
	if pubErr != nil {
		t.Fatal(pubErr)
	}
	h.publish(msgs[300:]...)
	// A threshold edit keeps the counts: the rule fires at the first event
	// counted under the new threshold, with every event so far counted.
	b := h.webhookBodies(1)[0]
	var k int
	fmt.Sscanf(b["event"].(map[string]any)["repetitionId"].(string), "r%d", &k)
	if b["threshold"] != 50.0 || b["count"] != float64(k+1) || k+1 < 100 {
		t.Errorf("fired at event r%d with threshold %v, count %v; want 50, and %d counted (at least 100)", k, b["threshold"], b["count"], k+1)
	}
	w.waitMetric(t, 30*time.Second, "400 events counted", func(v float64) bool { return v == 400 },
		"klaxon_events_total", "outcome", "counted")
	waitQuiet(t, func() int { return len(h.webhook.Requests()) }, 1)
	if status, body := w.readyz(t); status != http.StatusOK {
		t.Errorf("/readyz: %d %q", status, body)
	}
	if v := w.metric(t, "klaxon_batches_total", "stage", "evaluator", "outcome", "error"); v != 0 {
		t.Errorf("%v evaluator batches failed", v)
	}
}
