package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
	"github.com/klaxonhq/klaxon/internal/testenv"
	"github.com/klaxonhq/klaxon/internal/watchdog"
)

// TestOperatorAlertedWhenDeliveriesStall: with nothing consuming the
// delivery queue (two workers that only evaluate), the operator webhook
// hears "delayed" once the job has waited KLAXON_OPERATOR_DELAY, once for
// both workers, and "recovered" once a deliverer takes the job; the user's
// notification then arrives. The operator's message goes around the stuck
// queue, or it could never say the queue is stuck.
func TestOperatorAlertedWhenDeliveriesStall(t *testing.T) {
	const limit = 2 * time.Second
	h := newHarness(t)
	operator := notifytest.NewWebhookSink(t)
	h.env["KLAXON_OPERATOR_WEBHOOK"] = operator.URL
	h.env["KLAXON_OPERATOR_EMAIL"] = "oncall@example.com"
	h.env["KLAXON_OPERATOR_DELAY"] = limit.String()
	h.env["KLAXON_ROLE"] = "evaluator"
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))
	h.start()
	h.start()

	published := time.Now()
	h.publish(event(project, "TypeError: x is undefined", "g1", true))
	// Alerted after the limit, within the limit and a few looks of 200 ms.
	reqs, err := operator.WaitFor(1, limit+5*time.Second)
	if err != nil {
		t.Fatalf("operator webhook: %v", err)
	}
	var delayed watchdog.Alert
	if err := reqs[0].JSON(&delayed); err != nil {
		t.Fatal(err)
	}
	if delayed.State != watchdog.StateDelayed || delayed.Incident != watchdog.IncidentDelayed || len(delayed.Reasons) == 0 {
		t.Fatalf("first operator message %+v, want delayed with its reasons", delayed)
	}
	if early := reqs[0].Received.Sub(published); early < limit {
		t.Fatalf("alerted %s after the job was published, before the limit of %s", early, limit)
	}
	if n := len(h.webhook.Requests()); n != 0 {
		t.Fatalf("%d user notifications sent with no deliverer running", n)
	}

	h.env["KLAXON_ROLE"] = "deliverer"
	h.start()
	h.webhookBodies(1)
	reqs, err = operator.WaitFor(2, 30*time.Second)
	if err != nil {
		t.Fatalf("operator webhook: %v", err)
	}
	var recovered watchdog.Alert
	if err := reqs[1].JSON(&recovered); err != nil {
		t.Fatal(err)
	}
	// Both evaluating workers saw the stall until the deliverer ran: a
	// second "delayed" from either would have come before "recovered".
	if recovered.State != watchdog.StateRecovered || recovered.Incident != watchdog.IncidentDelayed {
		t.Fatalf("second operator message %+v, want recovered (messages: %d)", recovered, len(reqs))
	}
	if n := len(operator.Requests()); n != 2 {
		t.Fatalf("%d operator messages, want delayed and recovered", n)
	}
	// The same two by email, through the SMTP server.
	mails, err := h.smtp.WaitFor(2, 10*time.Second)
	if err != nil {
		t.Fatalf("operator email: %v", err)
	}
	for i, subject := range []string{"Subject: [Klaxon] Klaxon's notifications are delayed", "Subject: [Klaxon] Klaxon's notifications flow again"} {
		if !strings.Contains(string(mails[i].Data), subject) || fmt.Sprint(mails[i].To) != "[oncall@example.com]" {
			t.Errorf("mail %d to %v lacks %q:\n%s", i, mails[i].To, subject, mails[i].Data)
		}
	}
	if n := len(h.smtp.Messages()); n != 2 {
		t.Fatalf("%d operator mails, want 2", n)
	}
	testenv.WaitFor(t, 10*time.Second, "the alerts in the log and metric", func() bool {
		return len(h.logs.logLines("operator alerted: Klaxon's notifications are delayed")) == 1 &&
			len(h.logs.logLines("operator alerted: Klaxon's notifications flow again")) == 1
	})
}
