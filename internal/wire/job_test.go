package wire

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/snooze"
)

func TestDecodeJobRefusesBadJobs(t *testing.T) {
	for body, want := range map[string]string{
		`{`: "not JSON",
		`{"channel":"slack","endpoint":"https://x/","projectId":"p"}`:                                      "lacks",
		`{"channel":"pager-` + strings.Repeat("x", 100) + `","endpoint":"e","projectId":"p","ruleId":"r"}`: "is not one of [email telegram slack webhook loop]",
		`{"channel":"slack","endpoint":"e","projectId":"p","ruleId":"r","notification":{}}`:                "no id",
		`{"channel":"slack","endpoint":"e","projectId":"p","firings":[{"ruleId":"r"}]}`:                    "without ruleId or notification id",
		`{"channel":"slack","endpoint":"e","projectId":"p","firings":[{"notification":{"id":"n"}}]}`:       "without ruleId or notification id",
	} {
		_, err := DecodeJob([]byte(body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("DecodeJob(%.60s…) = %v, want an error saying %q", body, err, want)
		}
		if err != nil && strings.Contains(err.Error(), strings.Repeat("x", 50)) {
			t.Errorf("the error repeats an unbounded channel name: %v", err)
		}
	}
	for _, body := range []string{
		`{"kind":"firings","channel":"slack","endpoint":"e","projectId":"p"}`,
		`{"kind":"firings","channel":"slack","endpoint":"e","projectId":"p","firings":[{"ruleId":"r","notification":{"id":"n"}}],"notification":{"id":"n"}}`,
		`{"kind":"flush","channel":"slack","endpoint":"e","projectId":"p"}`,
		`{"kind":"snooze","channel":"slack","endpoint":"e","projectId":"p","ruleId":"r"}`,
		`{"kind":"page","channel":"slack","endpoint":"e","projectId":"p","ruleId":"r"}`,
	} {
		if _, err := DecodeJob([]byte(body)); err == nil {
			t.Errorf("DecodeJob(%s) took it", body)
		}
	}
	if _, err := DecodeJob([]byte(`{"channel":"webhook","endpoint":"e","projectId":"p","ruleId":"r"}`)); err != nil {
		t.Errorf("a good flush job: %v", err)
	}
}

// A job of several firings needs no ruleId of its own; its key names the
// set of its firings, whatever their order. A job of one firing has that
// firing's key, as before jobs had kinds.
func TestFiringsJobKeys(t *testing.T) {
	j, err := DecodeJob([]byte(`{"kind":"firings","channel":"webhook","endpoint":"e","projectId":"p","firings":[` +
		`{"ruleId":"a","notification":{"id":"n1"}},{"ruleId":"b","minPeriod":60000,"notification":{"id":"n2"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	swapped := j
	swapped.Firings = []Firing{j.Firings[1], j.Firings[0]}
	if j.Key() != swapped.Key() || !strings.HasPrefix(j.Key(), "group-") || !strings.HasSuffix(j.Key(), ":webhook") || j.Rule() != "" {
		t.Errorf("keys %q and %q, rule %q: want one group key whatever the order, and no rule", j.Key(), swapped.Key(), j.Rule())
	}
	one := j
	one.Firings = j.Firings[1:]
	if one.Key() != "n2:webhook" || one.Rule() != "b" {
		t.Errorf("job of firing n2: key %q, rule %q", one.Key(), one.Rule())
	}
}

// Jobs that a worker of the previous version left in the queues have no
// kind, and a single firing at the top level: they decode to the job of
// their kind, with the same key, so that their claims are the same and a
// firing is still sent once across an upgrade; a firing that passed its
// gate ("throttled") stays past it.
func TestJobsOfTheEarlierShapeDecode(t *testing.T) {
	for _, tc := range []struct {
		body string
		want Job
		key  string
	}{
		{`{"channel":"slack","endpoint":"https://hooks.example/T1","minPeriod":60000,"projectId":"p","ruleId":"r",` +
			`"notification":{"id":"n1","type":"new"},"attempt":2,"throttled":true}`,
			Job{Kind: KindFirings, Channel: "slack", Endpoint: "https://hooks.example/T1", ProjectID: "p", Attempt: 2,
				Firings: []Firing{{RuleID: "r", MinPeriod: 60000, Notification: &notify.Notification{ID: "n1", Type: "new"}, Gated: true}}},
			"n1:slack"},
		{`{"channel":"webhook","endpoint":"e","projectId":"p","ruleId":"","firings":[` +
			`{"ruleId":"a","notification":{"id":"n1"}},{"ruleId":"b","minPeriod":1000,"notification":{"id":"n2"},"throttled":true}]}`,
			Job{Kind: KindFirings, Channel: "webhook", Endpoint: "e", ProjectID: "p", Firings: []Firing{
				{RuleID: "a", Notification: &notify.Notification{ID: "n1"}},
				{RuleID: "b", MinPeriod: 1000, Notification: &notify.Notification{ID: "n2"}, Gated: true}}},
			GroupID([]string{"n1", "n2"}) + ":webhook"},
		{`{"channel":"slack","endpoint":"e","minPeriod":60000,"projectId":"p","ruleId":"r","generation":"7"}`,
			Job{Kind: KindFlush, Channel: "slack", Endpoint: "e", MinPeriod: 60000, ProjectID: "p", RuleID: "r", Generation: "7"}, ""},
		{`{"channel":"slack","endpoint":"e","projectId":"p","ruleId":"r","snooze":{"projectId":"p","ruleId":"r","summary":true}}`,
			Job{Kind: KindSnooze, Channel: "slack", Endpoint: "e", ProjectID: "p", RuleID: "r",
				Snooze: &snooze.Snooze{ProjectID: "p", RuleID: "r", Summary: true}}, ""},
	} {
		got, err := DecodeJob([]byte(tc.body))
		if err != nil {
			t.Errorf("DecodeJob(%s): %v", tc.body, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) || got.Key() != tc.key {
			t.Errorf("DecodeJob(%s) =\n%+v, key %q\nwant\n%+v, key %q", tc.body, got, got.Key(), tc.want, tc.key)
		}
		// What this version writes of it decodes to the same job.
		msg, err := got.Message("q")
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeJob(msg.Body)
		if err != nil || !reflect.DeepEqual(again, got) || msg.MessageID != tc.key && tc.key != "" {
			t.Errorf("%s written as %s: decoded %+v, %v; message id %q", tc.body, msg.Body, again, err, msg.MessageID)
		}
	}
}

// What earlier versions read is written in their shape: a digest's
// firings (MarshalFlat) and the failed queue's records, whose fields
// docs/contract.md §6 lists.
func TestFlatShapes(t *testing.T) {
	n := &notify.Notification{ID: "n1", Type: "new"}
	one := Job{Kind: KindFirings, Channel: "slack", Endpoint: "e", ProjectID: "p",
		Firings: []Firing{{RuleID: "r", MinPeriod: 60000, Notification: n}}}
	body, err := one.MarshalFlat()
	if err != nil {
		t.Fatal(err)
	}
	var old struct {
		Kind         *string              `json:"kind"`
		RuleID       *string              `json:"ruleId"`
		MinPeriod    int64                `json:"minPeriod"`
		Notification *notify.Notification `json:"notification"`
		Firings      []Firing             `json:"firings"`
	}
	if err := json.Unmarshal(body, &old); err != nil {
		t.Fatal(err)
	}
	if old.Kind != nil || old.RuleID == nil || *old.RuleID != "r" || old.MinPeriod != 60000 || old.Notification == nil ||
		old.Notification.ID != "n1" || old.Firings != nil {
		t.Errorf("flat single firing %s: want ruleId, minPeriod and notification at the top, no kind, no firings", body)
	}
	if back, err := DecodeJob(body); err != nil || !reflect.DeepEqual(back, one) {
		t.Errorf("flat %s decoded to %+v, %v", body, back, err)
	}

	grouped := Job{Kind: KindFirings, Channel: "slack", Endpoint: "e", ProjectID: "p", Attempt: 3,
		Firings: []Firing{{RuleID: "a", Notification: n}, {RuleID: "b", Notification: &notify.Notification{ID: "n2"}}}}
	rec, err := FailedRecord(&grouped, []notify.Notification{*n, {ID: "n2"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"ruleId":""`, `"firings":[`, `"attempt":3`, `"notifications":[{"id":"n1"`} {
		if !strings.Contains(string(rec), want) {
			t.Errorf("failed record %s lacks %s", rec, want)
		}
	}
	if strings.Contains(string(rec), `"kind"`) {
		t.Errorf("failed record %s has a kind", rec)
	}
	if back, err := ParseJob(rec); err != nil || !reflect.DeepEqual(back, grouped) {
		t.Errorf("failed record %s parsed to %+v, %v", rec, back, err)
	}
}

// The queue names are the contract's (docs/contract.md §6): workers of
// two versions side by side must agree on them.
func TestQueueNames(t *testing.T) {
	for got, want := range map[string]string{
		DeadQueue("notifier"):                 "notifier.dead",
		DeliveryQueue("klaxon"):               "klaxon.deliveries",
		FailedQueue("klaxon"):                 "klaxon.failed",
		RetryQueue("klaxon", 64*time.Second):  "klaxon.retry.1m4s",
		RetryQueue("k", 100*time.Millisecond): "k.retry.100ms",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	if d := RetryDelays(); len(d) != 13 || d[0] != 100*time.Millisecond || d[12] != 512*time.Second {
		t.Errorf("RetryDelays() = %v", d)
	}
}
