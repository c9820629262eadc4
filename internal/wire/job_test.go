package wire

import (
	"strings"
	"testing"
	"time"
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
	if _, err := DecodeJob([]byte(`{"channel":"webhook","endpoint":"e","projectId":"p","ruleId":"r"}`)); err != nil {
		t.Errorf("a good flush job: %v", err)
	}
}

// A grouped job needs no ruleId of its own; its key names the set of its
// firings, whatever their order, and each firing keeps its own key.
func TestGroupedJob(t *testing.T) {
	j, err := DecodeJob([]byte(`{"channel":"webhook","endpoint":"e","projectId":"p","firings":[` +
		`{"ruleId":"a","notification":{"id":"n1"}},{"ruleId":"b","minPeriod":60000,"notification":{"id":"n2"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	swapped := j
	swapped.Firings = []Firing{j.Firings[1], j.Firings[0]}
	if j.Key() != swapped.Key() || !strings.HasPrefix(j.Key(), "group-") || !strings.HasSuffix(j.Key(), ":webhook") {
		t.Errorf("keys %q and %q: want one group key whatever the order", j.Key(), swapped.Key())
	}
	if one := j.Single(1); one.RuleID != "b" || one.MinPeriod != 60000 || one.Key() != "n2:webhook" {
		t.Errorf("Single(1) = %+v, key %q", one, one.Key())
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
