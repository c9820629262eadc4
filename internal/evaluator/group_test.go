package evaluator_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/klaxonhq/klaxon/internal/evaluator"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// The firings of one event are grouped by destination: rules sharing a
// channel and endpoint make one job naming each firing, with each rule's
// own minPeriod; another endpoint, another channel or another project's
// event makes jobs of their own. A redelivered batch makes the same jobs.
func TestFiringsOfOneEventGroupedByDestination(t *testing.T) {
	hook := func(url string, minPeriod int64) map[string]rules.ChannelSpec {
		return map[string]rules.ChannelSpec{rules.Webhook: {IsEnabled: true, Endpoint: url, MinPeriod: minPeriod}}
	}
	both := hook("http://127.0.0.1:1/shared", 0)
	both[rules.Slack] = rules.ChannelSpec{IsEnabled: true, Endpoint: "https://hooks.slack.com/services/T/B/x"}
	snap := compile(t, map[string][]rules.Spec{
		project: {
			{ID: "a", IsEnabled: true, WhatToReceive: rules.OnlyNew, Channels: both},
			{ID: "b", IsEnabled: true, WhatToReceive: rules.OnlyNew, Channels: hook("http://127.0.0.1:1/shared", 60_000)},
			{ID: "c", IsEnabled: true, WhatToReceive: rules.OnlyNew, Channels: hook("http://127.0.0.1:1/other", 0)},
		},
		other: {
			{ID: "d", IsEnabled: true, WhatToReceive: rules.OnlyNew, Channels: hook("http://127.0.0.1:1/shared", 0)},
		},
	})
	fc := &fakeCounter{fire: map[string]bool{"a": true, "b": true, "c": true, "d": true}}
	pub := &fakePublisher{}
	e, _ := newEvaluator(snap, fc, pub)
	batch := func() *queue.Batch {
		return &queue.Batch{ID: 7, Deliveries: []queue.Delivery{
			delivery(hawk(project, "boom", "g1", true), "m1"),
			delivery(hawk(other, "boom", "g1", true), "m2"),
		}}
	}
	if err := e.Handle(context.Background(), batch()); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, msg := range pub.msgs {
		job, err := wire.DecodeJob(msg.Body)
		if err != nil {
			t.Fatal(err)
		}
		if msg.MessageID != job.Key() {
			t.Errorf("message id %q, job key %q", msg.MessageID, job.Key())
		}
		desc := job.ProjectID[len(job.ProjectID)-1:] + " " + job.Channel + " " + strings.TrimPrefix(job.Endpoint, "http://127.0.0.1:1") + ":"
		for _, f := range job.Firings {
			desc += " " + f.RuleID
			if f.MinPeriod > 0 {
				desc += "(paced)"
			}
			if f.Notification.RuleID != f.RuleID || f.Notification.ProjectID != job.ProjectID {
				t.Errorf("firing %+v in a job of project %s", f.Notification, job.ProjectID)
			}
		}
		got = append(got, desc)
	}
	slices.Sort(got)
	want := []string{
		"9 webhook /shared: a b(paced)",
		"9 slack https://hooks.slack.com/services/T/B/x: a",
		"9 webhook /other: c",
		"a webhook /shared: d",
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("jobs:\n%q\nwant\n%q", got, want)
	}

	sameJobsAgain(t, e, pub, batch())
}

// sameJobsAgain handles b, the batch whose jobs pub holds, again, and
// checks that it makes the same jobs with the same ids: what a redelivered
// batch must do.
func sameJobsAgain(t *testing.T, e *evaluator.Evaluator, pub *fakePublisher, b *queue.Batch) {
	t.Helper()
	first := slices.Clone(pub.msgs)
	pub.msgs = nil
	if err := e.Handle(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if len(pub.msgs) != len(first) {
		t.Fatalf("redelivered batch made %d jobs, first %d", len(pub.msgs), len(first))
	}
	for i := range first {
		if pub.msgs[i].MessageID != first[i].MessageID || string(pub.msgs[i].Body) != string(first[i].Body) {
			t.Errorf("job %d differs when the batch comes again:\n%.500s\n%.500s", i, first[i].Body, pub.msgs[i].Body)
		}
	}
}
