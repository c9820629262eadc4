package deliverer

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/snooze"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// grouped is a grouped job of one event on the machine's webhook: one
// firing per id, of rule "r-<id>", paced by minPeriod when the id is in
// paced.
func grouped(t *testing.T, minPeriod time.Duration, ids []string, paced ...string) []byte {
	t.Helper()
	j := wire.Job{Kind: wire.KindFirings, Channel: "webhook", Endpoint: "https://example.com/hook", ProjectID: "p"}
	for _, id := range ids {
		f := wire.Firing{RuleID: "r-" + id, Notification: &notify.Notification{ID: id, RuleID: "r-" + id, Type: notify.TypeNew, FiredAt: time.Unix(1, 0)}}
		if slices.Contains(paced, id) {
			f.MinPeriod = minPeriod.Milliseconds()
		}
		j.Firings = append(j.Firings, f)
	}
	body, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// firingOf is the job of firing id of rule "r-<id>" alone.
func firingOf(t *testing.T, id string, minPeriod time.Duration) []byte {
	t.Helper()
	body, err := json.Marshal(oneFiring("webhook", "https://example.com/hook", "r-"+id, minPeriod,
		&notify.Notification{ID: id, RuleID: "r-" + id, Type: notify.TypeNew, FiredAt: time.Unix(1, 0)}))
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// sentAs describes each message sent: its id's kind and its firings.
func sentAs(ms []*notify.Message) []string {
	var out []string
	for _, m := range ms {
		s := "single"
		switch {
		case m.Grouped:
			s = "grouped"
		case m.Digest:
			s = "digest"
		}
		for _, n := range m.Notifications {
			s += " " + n.ID
		}
		out = append(out, s)
	}
	return out
}

func (m *machine) wantSent(want ...string) {
	m.t.Helper()
	if got := sentAs(m.ch.sent()); !slices.Equal(got, want) {
		m.t.Fatalf("sent %q, want %q", got, want)
	}
}

// Three rules' firings for one event on one destination go as one message,
// recorded as sent for each firing; the job again sends nothing.
func TestMachineGroupedSentOnce(t *testing.T) {
	m := newMachine(t)
	m.handle(grouped(t, 0, []string{"a", "b", "c"}))
	m.nothingPublished()
	m.wantSent("grouped a b c")
	msg := m.ch.sent()[0]
	if msg.ID != wire.GroupID([]string{"c", "b", "a"}) || msg.RuleID != "" {
		t.Errorf("message id %q, rule %q; want the group's id and no rule", msg.ID, msg.RuleID)
	}
	for _, id := range []string{"a", "b", "c"} {
		if got := m.record(id); got != "sent" {
			t.Errorf("record of %s %q, want sent", id, got)
		}
	}
	m.handle(grouped(t, 0, []string{"a", "b", "c"}))
	m.handle(firingOf(t, "b", 0))
	m.nothingPublished()
	m.wantSent("grouped a b c")
	if v := counterValue(t, m.d, "webhook", "duplicate"); v != 4 {
		t.Errorf("%v duplicates counted, want 4", v)
	}
}

// A replay that groups another set of firings (a rule added or edited in
// between) sends only what was not sent: alone when one is left, else as
// a group of those left, with their own id.
func TestMachineReplayGroupsAnotherSet(t *testing.T) {
	m := newMachine(t)
	m.handle(firingOf(t, "a", 0))               // sent before grouping: a single job
	m.handle(grouped(t, 0, []string{"a", "b"})) // the replay finds rule b too
	m.handle(grouped(t, 0, []string{"a", "b", "c", "d"}))
	m.nothingPublished()
	m.wantSent("single a", "single b", "grouped c d")
	if got := m.ch.sent()[2].ID; got != wire.GroupID([]string{"c", "d"}) {
		t.Errorf("third message id %q, want the id of c and d", got)
	}
}

// Pacing stays per rule: a firing whose rule is inside its minPeriod goes
// to that rule's digest, the others of its event are grouped; a firing
// whose rule's period is over goes in the group, and starts its period.
func TestMachineGroupedKeepsEachRulesMinPeriod(t *testing.T) {
	m := newMachine(t)
	m.handle(firingOf(t, "b0", time.Minute)) // rule r-b0's period starts
	m.wantSent("single b0")
	// Rule r-b0 fires again, with rules r-a and r-c, inside its period.
	j := wire.Job{Kind: wire.KindFirings, Channel: "webhook", Endpoint: "https://example.com/hook", ProjectID: "p", Firings: []wire.Firing{
		{RuleID: "r-a", Notification: &notify.Notification{ID: "a", RuleID: "r-a", FiredAt: time.Unix(2, 0)}},
		{RuleID: "r-b0", MinPeriod: time.Minute.Milliseconds(), Notification: &notify.Notification{ID: "b1", RuleID: "r-b0", FiredAt: time.Unix(2, 0)}},
		{RuleID: "r-c", Notification: &notify.Notification{ID: "c", RuleID: "r-c", FiredAt: time.Unix(2, 0)}},
	}}
	body, _ := json.Marshal(j)
	m.handle(body)
	_, flush := m.published(queuesUpTo(m.d, time.Minute)...)
	if flush.Kind != wire.KindFlush || flush.RuleID != "r-b0" || len(flush.Firings) != 0 {
		t.Errorf("scheduled %+v, want the flush of rule r-b0's digest", flush)
	}
	m.wantSent("single b0", "grouped a c")
	if got := m.record("b1"); got != "digested" {
		t.Errorf("b1 recorded %q, want digested", got)
	}

	// A paced rule outside its period goes with the group, and its next
	// firing is gathered.
	m.handle(grouped(t, time.Minute, []string{"d", "e"}, "e"))
	m.nothingPublished()
	m.handle(firingOf(t, "e", time.Minute)) // the same firing again: a duplicate
	m.handle(grouped(t, time.Minute, []string{"f", "e2"}, "e2"))
	m.nothingPublished() // r-e2 is a rule of its own: outside its period
	m.wantSent("single b0", "grouped a c", "grouped d e", "grouped f e2")
	second := wire.Job{Kind: wire.KindFirings, Channel: "webhook", Endpoint: "https://example.com/hook", ProjectID: "p", Firings: []wire.Firing{
		{RuleID: "r-g", Notification: &notify.Notification{ID: "g", RuleID: "r-g", FiredAt: time.Unix(3, 0)}},
		{RuleID: "r-e", MinPeriod: time.Minute.Milliseconds(), Notification: &notify.Notification{ID: "e3", RuleID: "r-e", FiredAt: time.Unix(3, 0)}},
	}}
	body, _ = json.Marshal(second)
	m.handle(body)
	m.published(queuesUpTo(m.d, time.Minute)...) // r-e's digest flush
	m.wantSent("single b0", "grouped a c", "grouped d e", "grouped f e2", "single g")
}

// A grouped message that fails is retried as one, with the firings that
// passed their minPeriod marked so, and the same id; its claims are
// released meanwhile.
func TestMachineGroupedRetry(t *testing.T) {
	m := newMachine(t, reply{status: 503})
	m.handle(grouped(t, time.Minute, []string{"a", "b"}, "b"))
	msg, retry := m.published(m.d.delayQueue(500*time.Millisecond), m.d.delayQueue(time.Second))
	if len(retry.Firings) != 2 || retry.Firings[0].Gated || !retry.Firings[1].Gated || retry.Attempt != 1 {
		t.Fatalf("retry job %+v, want both firings, b past its gate, attempt 1", retry)
	}
	if msg.MessageID != retry.Key() || m.record("a")+m.record("b") != "" {
		t.Errorf("retry message id %q, records %q %q; want the group's key and the claims released", msg.MessageID, m.record("a"), m.record("b"))
	}
	m.handle(msg.Body)
	m.nothingPublished()
	sent := m.ch.sent()
	m.wantSent("grouped a b", "grouped a b")
	if sent[0].ID != sent[1].ID || m.record("a")+" "+m.record("b") != "sent sent" {
		t.Errorf("ids %q and %q, records %q %q", sent[0].ID, sent[1].ID, m.record("a"), m.record("b"))
	}
}

// A worker killed after a partial send: firing a of a grouped job was
// recorded sent, b is still claimed by the dead deliverer. The job again
// sends neither now; b comes back once the dead claim expires, and goes
// then, alone. Nothing is sent twice, nothing lost.
func TestMachineGroupedAfterAPartialSend(t *testing.T) {
	m := newMachine(t)
	ctx := t.Context()
	if err := m.d.rdb.Set(ctx, m.d.claimKey("a:webhook"), "sent", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if err := m.d.rdb.Set(ctx, m.d.claimKey("b:webhook"), claimTokenPrefix+"dead:1", 2*m.d.cfg.SendTimeout).Err(); err != nil {
		t.Fatal(err)
	}
	m.handle(grouped(t, 0, []string{"a", "b", "c"}))
	msg, later := m.published(queuesUpTo(m.d, time.Hour)...)
	if len(later.Firings) != 1 || later.Firings[0].Notification.ID != "b" || later.Rule() != "r-b" {
		t.Fatalf("scheduled %+v, want b's single job", later)
	}
	m.wantSent("single c")
	if err := m.d.rdb.Del(ctx, m.d.claimKey("b:webhook")).Err(); err != nil { // the dead claim expires
		t.Fatal(err)
	}
	m.handle(msg.Body)
	m.handle(grouped(t, 0, []string{"a", "b", "c"})) // and the batch again
	m.nothingPublished()
	m.wantSent("single c", "single b")
}

// A snoozed rule's firing in a grouped job is held back, recorded as
// snoozed, and the others go; the snooze's summary is its rule's own.
func TestMachineGroupedHoldsASnoozedRule(t *testing.T) {
	m := newMachine(t)
	// Redis' clock expires snoozes: the machine's must agree with it here.
	now := time.Now()
	m.clock.advance(now.Sub(m.clock.now()))
	if _, err := snooze.New(m.d.rdb, m.d.cfg.Prefix).Set(t.Context(),
		snooze.Snooze{ProjectID: "p", RuleID: "r-b", Until: now.Add(time.Hour), Summary: true}, now); err != nil {
		t.Fatal(err)
	}
	m.handle(grouped(t, 0, []string{"a", "b", "c"}))
	_, summary := m.published(queuesUpTo(m.d, time.Hour)...)
	if summary.Kind != wire.KindSnooze || summary.Snooze == nil || summary.RuleID != "r-b" {
		t.Errorf("scheduled %+v, want rule r-b's snooze summary", summary)
	}
	m.wantSent("grouped a c")
	if got := m.record("b"); got != "snoozed" {
		t.Errorf("b recorded %q, want snoozed", got)
	}
}

// earlier is a job of the previous version, which had no kind and kept a
// single firing at the top level: literal, as it sits in a queue.
func earlier(id, extra string) []byte {
	return []byte(`{"channel":"webhook","endpoint":"https://example.com/hook","minPeriod":60000,"projectId":"p","ruleId":"r",` +
		`"notification":{"id":"` + id + `","type":"new","ruleId":"r","firedAt":"1970-01-01T00:00:01Z"}` + extra + `}`)
}

// Jobs the previous version left in the queues, and the firings it left in
// a digest, are delivered as they would have been: under the same claims,
// a retry past its gate not gathered again, a flush of the earlier shape
// sending what both versions gathered.
func TestMachineJobsOfThePreviousVersion(t *testing.T) {
	m := newMachine(t)
	m.handle(earlier("n1", ""))
	m.nothingPublished()
	m.handle(earlier("n1", "")) // redelivered: a duplicate
	m.nothingPublished()
	if got := m.record("n1"); got != "sent" {
		t.Fatalf("n1 recorded %q, want sent", got)
	}
	m.handle(earlier("n2", "")) // inside r's minPeriod: gathered
	_, flush := m.published(queuesUpTo(m.d, time.Minute)...)
	if flush.Kind != wire.KindFlush || flush.RuleID != "r" || flush.MinPeriod != 60000 {
		t.Fatalf("scheduled %+v, want r's flush", flush)
	}
	m.handle(earlier("n3", `,"attempt":1,"throttled":true`)) // a retry past its gate goes
	m.nothingPublished()
	m.wantSent("single n1", "single n3")

	// The previous version gathered n4 into the same digest.
	keys := m.d.minPeriodKeys(&flush)
	ctx := t.Context()
	if err := m.d.rdb.HSet(ctx, keys.pending, "n4", earlier("n4", "")).Err(); err != nil {
		t.Fatal(err)
	}
	m.d.rdb.HIncrBy(ctx, keys.pending, "#n", 1)
	if err := m.d.rdb.HIncrBy(ctx, keys.state, "last", -time.Minute.Milliseconds()).Err(); err != nil {
		t.Fatal(err)
	}
	m.handle([]byte(`{"channel":"webhook","endpoint":"https://example.com/hook","minPeriod":60000,"projectId":"p","ruleId":"r"}`))
	m.nothingPublished()
	m.wantSent("single n1", "single n3", "digest n2 n4")
	if got := m.record("n2") + " " + m.record("n3"); got != "digested sent" {
		t.Errorf("records of n2 and n3 %q", got)
	}
}
