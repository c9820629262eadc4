package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
	"github.com/klaxonhq/klaxon/internal/testenv"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// installation is a worker binary running against the test broker and
// Redis, with its own queue and prefix, and a webhook sink its one rule
// sends to.
type installation struct {
	env     map[string]string
	sink    *notifytest.WebhookSink
	queue   string
	amqpURL string
}

func startInstallation(t *testing.T) *installation {
	t.Helper()
	in := &installation{sink: notifytest.NewWebhookSink(t), queue: testenv.QueueName(t), amqpURL: testenv.AMQPURL(t)}
	prefix := testenv.KeyPrefix(t)
	queues := []string{wire.DeliveryQueue(prefix), wire.FailedQueue(prefix)}
	for _, d := range wire.RetryDelays() {
		queues = append(queues, wire.RetryQueue(prefix, d))
	}
	testenv.DeleteQueuesAtCleanup(t, queues...)
	rules := writeTemp(t, "rules.yml", fmt.Sprintf(`%s:
  name: Shop
  notifications:
    - id: new-errors
      isEnabled: true
      whatToReceive: ONLY_NEW
      channels:
        webhook: {isEnabled: true, endpoint: %q, minPeriod: 0}
`, projectA, in.sink.URL))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	in.env = map[string]string{
		"KLAXON_AMQP_URL": in.amqpURL, "KLAXON_QUEUE": in.queue, "KLAXON_REDIS_URL": testenv.RedisURL(),
		"KLAXON_PREFIX": prefix, "KLAXON_RULES_FILE": rules, "KLAXON_HTTP_ADDR": addr,
		"KLAXON_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8,::1/128",
		"KLAXON_EVENT_URL":              "https://hawk.example.com/p/{projectId}/e/{groupHash}",
	}

	bin := t.TempDir() + "/klaxon-worker"
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/klaxonhq/klaxon/cmd/worker").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range in.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	})
	testenv.WaitFor(t, 60*time.Second, "the worker ready", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return in
}

// metrics is the worker's /metrics.
func (in *installation) metrics(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + in.env["KLAXON_HTTP_ADDR"] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// publish sends a new error of the project to the installation's queue.
func (in *installation) publish(t *testing.T, title, group string) {
	t.Helper()
	body := fmt.Sprintf(`{"projectId":%q,"event":{"title":%q,"groupHash":%q,"isNew":true,"repetitionId":null}}`, projectA, title, group)
	in.publishTo(t, in.queue, amqp.Publishing{Body: []byte(body)})
}

// publishTo publishes m to queue q through the default exchange.
func (in *installation) publishTo(t *testing.T, q string, m amqp.Publishing) {
	t.Helper()
	conn, err := amqp.Dial(in.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(context.Background(), "", q, false, false, m); err != nil {
		t.Fatal(err)
	}
}

func (in *installation) list(t *testing.T) []failedMessage {
	t.Helper()
	r := klaxon(t, in.env, "failed", "list", "--json")
	if r.code != exitOK {
		t.Fatalf("failed list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var out struct{ Messages []failedMessage }
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatal(err)
	}
	return out.Messages
}

// A notification the endpoint refused for good (400) waits in the failed
// queue; list shows it with its reason and never its endpoint; replayed
// once the endpoint answers 200, it arrives exactly once, and the failed
// queue is empty. Replaying the same message again sends nothing more.
func TestFailedListAndReplay(t *testing.T) {
	in := startInstallation(t)
	in.sink.FailNext(1, notifytest.Failure{Status: http.StatusBadRequest, Body: "bad payload"})
	in.publish(t, "TypeError: x is undefined", "g1")

	var msgs []failedMessage
	testenv.WaitFor(t, 30*time.Second, "the refused notification in the failed queue", func() bool {
		msgs = in.list(t)
		return len(msgs) == 1
	})
	m := msgs[0]
	if m.ProjectID != projectA || m.ProjectName != "Shop" || m.RuleID != "new-errors" || m.Channel != "webhook" ||
		m.Attempts != 1 || m.Host != "127.0.0.1" || !strings.Contains(m.Reason, "400") || m.FailedAt.IsZero() || m.Kind != "firing" {
		t.Errorf("listed %+v", m)
	}
	text := klaxon(t, in.env, "failed", "list")
	if !strings.Contains(text.stdout, m.ID) || !strings.Contains(text.stdout, "400") ||
		strings.Contains(text.stdout, in.sink.Path) || strings.Contains(text.stdout, in.sink.URL) {
		t.Errorf("list:\n%s", text.stdout)
	}
	if show := klaxon(t, in.env, "failed", "show", m.ID); show.code != exitOK || !strings.Contains(show.stdout, "TypeError: x is undefined") {
		t.Errorf("show: exit %d\n%s%s", show.code, show.stdout, show.stderr)
	}
	if miss := klaxon(t, in.env, "failed", "show", "nope"); miss.code != exitProblem {
		t.Errorf("show of a missing id: exit %d", miss.code)
	}
	if got := len(in.sink.Requests()); got != 1 {
		t.Fatalf("%d requests before the replay, want the one refused", got)
	}

	// The endpoint is fixed: it answers 200 from now on.
	r := klaxon(t, in.env, "failed", "replay", m.ID)
	if r.code != exitOK || !strings.Contains(r.stdout, "replayed") {
		t.Fatalf("replay: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	reqs, err := in.sink.WaitFor(2, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if reqs[1].Status != http.StatusOK || !strings.Contains(string(reqs[1].Body), "TypeError: x is undefined") {
		t.Errorf("the replay arrived as %d %s", reqs[1].Status, reqs[1].Body)
	}
	if left := in.list(t); len(left) != 0 {
		t.Errorf("the failed queue still holds %+v", left)
	}

	// A second replay of the same job (as if the tool had died before
	// removing it from the failed queue) must not send it again: put the
	// same message back and replay it.
	republishFailed(t, in, m.ID)
	if r := klaxon(t, in.env, "failed", "replay", "--all"); r.code != exitOK {
		t.Fatalf("second replay: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The worker takes the replayed job for the duplicate it is: it counts
	// it so, and sends nothing.
	testenv.WaitFor(t, 30*time.Second, "the second replay dropped as a duplicate", func() bool {
		return strings.Contains(in.metrics(t), `klaxon_notifications_total{channel="webhook",outcome="duplicate"} 1`)
	})
	if n := len(in.sink.Requests()); n != 2 {
		t.Errorf("%d requests, want 2: the refused one and the replay", n)
	}
	if left := in.list(t); len(left) != 0 {
		t.Errorf("the failed queue still holds %+v", left)
	}
}

// republishFailed puts a copy of the replayed firing back in the failed
// queue, as a tool that died between publishing the replay and removing
// the message would have left it.
func republishFailed(t *testing.T, in *installation, id string) {
	t.Helper()
	reqs := in.sink.Requests()
	var n map[string]any
	if err := json.Unmarshal(reqs[1].Body, &n); err != nil {
		t.Fatal(err)
	}
	job := map[string]any{"channel": "webhook", "endpoint": in.sink.URL, "projectId": projectA, "ruleId": "new-errors",
		"notification": n, "throttled": true}
	body, _ := json.Marshal(job)
	in.publishTo(t, wire.FailedQueue(in.env["KLAXON_PREFIX"]),
		amqp.Publishing{MessageId: id, Body: body, Headers: amqp.Table{wire.ErrorHeader: "webhook: 400 Bad Request"}})
}
