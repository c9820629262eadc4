package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// Endpoints come from rules, which untrusted users write. Without the
// operator's KLAXON_ALLOW_PRIVATE_NETWORKS a webhook on 127.0.0.1 (standing
// for anything inside) gets nothing, and a Slack endpoint outside
// KLAXON_SLACK_HOSTS neither: each firing fails for good with the reason,
// the log says so once per rule and channel, and the rule's email and
// Telegram, whose servers the operator configured (on loopback too), are
// delivered.
func TestRefusedEndpointsFailForGoodOtherChannelsDeliver(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	delete(h.env, "KLAXON_ALLOW_PRIVATE_NETWORKS")
	delete(h.env, "KLAXON_SLACK_HOSTS") // hooks.slack.com/services/ only
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.allChannels()}))
	w := h.start()
	for i := range 3 {
		h.publish(event(project, fmt.Sprintf("Error %d", i), fmt.Sprintf("g%d", i), true))
	}

	for _, ch := range []string{"webhook", "slack"} {
		w.waitMetric(t, 30*time.Second, ch+" failed == 3", func(v float64) bool { return v == 3 },
			"klaxon_notifications_total", "channel", ch, "outcome", "failed")
	}
	for _, ch := range []string{"email", "telegram"} {
		w.waitMetric(t, 30*time.Second, ch+" sent == 3", func(v float64) bool { return v == 3 },
			"klaxon_notifications_total", "channel", ch, "outcome", "sent")
	}
	reasons := map[string][]string{}
	testenv.WaitFor(t, 10*time.Second, "six failed notifications", func() bool {
		for _, d := range getAll(t, h.amqpURL, h.prefix+".failed") {
			var job struct {
				Channel string `json:"channel"`
			}
			if err := json.Unmarshal(d.Body, &job); err != nil {
				t.Fatalf("failed job %s: %v", d.Body, err)
			}
			reasons[job.Channel] = append(reasons[job.Channel], fmt.Sprint(d.Headers["x-klaxon-error"]))
		}
		return len(reasons["webhook"])+len(reasons["slack"]) == 6
	})
	for _, r := range reasons["webhook"] {
		if r != "webhook: endpoint refused: it resolves to 127.0.0.1, a loopback address; allow it with KLAXON_ALLOW_PRIVATE_NETWORKS" {
			t.Errorf("webhook failure reason %q", r)
		}
	}
	for _, r := range reasons["slack"] {
		if !strings.Contains(r, "slack: endpoint refused: host 127.0.0.1") || !strings.Contains(r, "KLAXON_SLACK_HOSTS") {
			t.Errorf("slack failure reason %q", r)
		}
	}
	if n := len(h.webhook.Requests()) + len(h.slack.Requests()); n != 0 {
		t.Errorf("the refused endpoints got %d requests", n)
	}
	for _, ch := range []string{"webhook", "slack"} {
		for _, outcome := range []string{"retried", "sent"} {
			if v := w.metric(t, "klaxon_notifications_total", "channel", ch, "outcome", outcome); v != 0 {
				t.Errorf("%s %s = %v, want 0", ch, outcome, v)
			}
		}
	}
	refused := h.logs.logLines("endpoint refused")
	if len(refused) != 2 {
		t.Errorf("%d 'endpoint refused' lines for three firings on two channels, want 2: %v", len(refused), refused)
	}
	if logs := h.logs.String(); strings.Contains(logs, h.webhook.Path) || strings.Contains(logs, h.webhook.URL) {
		t.Error("the log holds the webhook's URL")
	}
}
