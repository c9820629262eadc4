package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// webhookRules collects, per project, the rule ids of the webhook bodies
// received so far, each body a single firing or a grouped message.
func (h *harness) webhookRules(t *testing.T) map[string][]string {
	t.Helper()
	got := map[string][]string{}
	for _, r := range h.webhook.Requests() {
		var b struct {
			ProjectID     string `json:"projectId"`
			RuleID        string `json:"ruleId"`
			Notifications []struct {
				RuleID string `json:"ruleId"`
			} `json:"notifications"`
		}
		if err := r.JSON(&b); err != nil {
			t.Fatalf("webhook body: %v", err)
		}
		if len(b.Notifications) == 0 {
			got[b.ProjectID] = append(got[b.ProjectID], b.RuleID)
		}
		for _, n := range b.Notifications {
			got[b.ProjectID] = append(got[b.ProjectID], n.RuleID)
		}
	}
	return got
}

// On a broker with deploy/rabbitmq/klaxon.conf's 2 MiB max_message_size:
// 100 rules sharing one webhook, each with 20 excluding words of 200 '<',
// and an event whose title is 1,000 '<'. Every field is within its limit,
// but JSON writes '<' as 6 bytes, and the firings' one grouped job was
// 3.2 MB: the broker refused it, the batch was held and tried again for
// good, and no other project heard of anything, while /readyz said ok.
// Now the firings go in jobs within the bound: every rule's firing is
// delivered once, the other project's notification too, and no batch
// fails.
func TestBigFiringsOfOneEventStallNoProject(t *testing.T) {
	t.Parallel()
	conf, err := os.ReadFile("../../deploy/rabbitmq/klaxon.conf")
	if err != nil {
		t.Fatal(err)
	}
	node := testenv.StartRabbitMQ(t, string(conf))
	h := newHarness(t)
	h.amqpURL, h.env["KLAXON_AMQP_URL"] = node.URL, node.URL

	const n = 100
	big := make([]bson.M, n)
	for i := range big {
		words := bson.A{}
		for k := range 20 {
			words = append(words, strings.Repeat("<", 196)+fmt.Sprintf("%04d", i*20+k))
		}
		big[i] = rule(bson.M{"whatToReceive": "ONLY_NEW", "excluding": words, "channels": h.webhookOnly()})
	}
	bigProject := h.project(big...)
	other := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))
	w := h.start()

	h.publish(event(bigProject, strings.Repeat("<", 1000), "big-group", true))
	begin := time.Now()
	h.publish(event(other, "DatabaseError: timeout", "other-group", true))

	var got map[string][]string
	testenv.WaitFor(t, 60*time.Second, "every firing delivered", func() bool {
		got = h.webhookRules(t)
		return len(got[bigProject]) >= n && len(got[other]) >= 1
	})
	// How long the other project waited, for docs/benchmarks.md; the
	// fairness tests hold the 2 s bound on a quiet worker.
	for _, r := range h.webhook.Requests() {
		if strings.Contains(string(r.Body), other) {
			t.Logf("the other project's notification in %s", r.Received.Sub(begin).Round(time.Millisecond))
		}
	}
	seen := map[string]int{}
	for _, id := range got[bigProject] {
		seen[id]++
	}
	for _, r := range big {
		if id := r["_id"].(bson.ObjectID).Hex(); seen[id] != 1 {
			t.Errorf("rule %s's firing delivered %d times, want once", id, seen[id])
		}
	}
	if reqs := len(h.webhook.Requests()); reqs < 3 {
		t.Errorf("%d webhook messages: the firings were not split", reqs)
	}
	if v := w.metric(t, "klaxon_batches_total", "stage", "evaluator", "outcome", "error"); v != 0 {
		t.Errorf("%v evaluator batches failed, want none", v)
	}
	if c := h.logCount("handler failed; holding the batch to retry it"); c != 0 {
		t.Errorf("a batch was held (%d log lines)", c)
	}
	// Klaxon's own bound keeps every job under the broker's: the broker
	// never had to refuse one.
	if c := h.logCount("the broker refused a message over its max_message_size: building messages within it"); c != 0 {
		t.Errorf("the broker refused %d publishes for size", c)
	}
	if status, body := w.readyz(t); status != http.StatusOK {
		t.Errorf("/readyz: %d %q", status, body)
	}
}

// A 3 MB webhook URL in a rule loaded without a word, and made every
// firing of the rule a 3 MB message. The channel is left out at load with
// a warning naming the project, the rule, the channel, the length and the
// limit, without the URL; the rule's Slack channel still notifies.
func TestOverlongEndpointIsLeftOutAtLoad(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	url := h.webhook.URL + "?key=" + strings.Repeat("s3cr3t", 500_000)
	r := rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": bson.M{
		"webhook": bson.M{"isEnabled": true, "endpoint": url, "minPeriod": 0},
		"slack":   bson.M{"isEnabled": true, "endpoint": h.slack.URL, "minPeriod": 0},
	}})
	project := h.project(r)
	h.start()
	h.publish(event(project, "TypeError: x is undefined", "g1", true))
	if _, err := h.slack.WaitFor(1, 30*time.Second); err != nil {
		t.Fatalf("slack: %v", err)
	}
	reason := fmt.Sprintf("channel webhook: endpoint is %d bytes long, over the limit of %d: left out", len(url), rules.MaxURLEndpointBytes)
	var found bool
	for _, l := range h.logs.logLines("rule warning") {
		found = found || l["project"] == project && l["rule"] == r["_id"].(bson.ObjectID).Hex() && l["reason"] == reason
	}
	if !found {
		t.Errorf("no rule warning saying %q", reason)
	}
	if strings.Contains(h.logs.String(), "s3cr3ts3cr3t") {
		t.Error("the endpoint reached the log")
	}
	if reqs := h.webhook.Requests(); len(reqs) != 0 {
		t.Errorf("%d webhook requests to the left-out endpoint", len(reqs))
	}
}

// A stage that cannot get past a batch holds every message behind it while
// the broker, Redis and the rules all answer: here a broker policy refuses
// every delivery job. klaxon_batch_held_seconds shows the held batch's
// age, and past KLAXON_MAX_BATCH_HOLD /readyz answers 503 saying which
// stage has held a batch, from which queue, for how long and why; once the
// broker takes the job again the batch goes and /readyz is ready again.
func TestHeldBatchIsReported(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Skip("rabbitmqctl is not installed: this test refuses publishes with a broker policy")
	}
	h := newHarness(t)
	h.env["KLAXON_MAX_BATCH_HOLD"] = "2s"
	// No deliverer: RabbitMQ hands a message to a waiting consumer even
	// through max-length 0, and the jobs are to be refused.
	h.env["KLAXON_ROLE"] = "evaluator"
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))
	w := h.start()

	policy := "klaxon-test-refuse-" + h.prefix
	ctl := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("rabbitmqctl", args...).CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// Both delivery lanes: a job held long enough moves to the bulk lane.
	ctl("set_policy", "--apply-to", "queues", policy, "^"+h.prefix+`\.deliveries(\.bulk)?$`, `{"max-length":0,"overflow":"reject-publish"}`)
	cleared := false
	clear := func() {
		if !cleared {
			cleared = true
			ctl("clear_policy", policy)
		}
	}
	t.Cleanup(clear)

	h.publish(event(project, "TypeError: x is undefined", "g1", true))
	var body string
	testenv.WaitFor(t, 30*time.Second, "/readyz to report the held batch", func() bool {
		var status int
		status, body = w.readyz(t)
		return status == http.StatusServiceUnavailable && strings.Contains(body, "batches: evaluator has held a batch of 1 from "+h.queue)
	})
	if !strings.Contains(body, "nacked") || !strings.Contains(body, "amqp: ok") || !strings.Contains(body, "redis: ok") {
		t.Errorf("/readyz %q: want the broker's refusal, with the dependencies ok", body)
	}
	if v := w.metric(t, "klaxon_batch_held_seconds", "stage", "evaluator"); v <= 2 {
		t.Errorf("klaxon_batch_held_seconds{stage=evaluator} = %v, want over the 2 s limit", v)
	}
	if _, ok := w.metricOK(t, "klaxon_batch_held_seconds", "stage", "deliverer"); ok {
		t.Error("klaxon_batch_held_seconds has a deliverer stage in a worker that does not deliver")
	}

	clear()
	testenv.WaitFor(t, 30*time.Second, "the delivery job queued", func() bool {
		return readyMessages(t, h.amqpURL, h.prefix+".deliveries")+readyMessages(t, h.amqpURL, h.prefix+".deliveries.bulk") == 1
	})
	testenv.WaitFor(t, 30*time.Second, "/readyz ready again", func() bool {
		status, _ := w.readyz(t)
		return status == http.StatusOK
	})
	if v := w.metric(t, "klaxon_batch_held_seconds", "stage", "evaluator"); v != 0 {
		t.Errorf("klaxon_batch_held_seconds{stage=evaluator} = %v once the batch went, want 0", v)
	}
}
