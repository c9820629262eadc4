package deliverer

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/quiet"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// levels answers StillAbove from a set of "rule/group".
type levels map[string]bool

func (l levels) StillAbove(_ context.Context, _, rule, group string) (bool, error) {
	return l[rule+"/"+group], nil
}

// quietJob is a firings job to endpoint of firings made during quiet
// period sp, one per id, of rule "r-<id>" unless rules says otherwise.
func quietJob(t *testing.T, endpoint string, sp *quiet.Span, ids []string, rules ...string) []byte {
	t.Helper()
	j := wire.Job{Kind: wire.KindFirings, Channel: "webhook", Endpoint: endpoint, ProjectID: "p"}
	for i, id := range ids {
		rule := "r-" + id
		if i < len(rules) {
			rule = rules[i]
		}
		j.Firings = append(j.Firings, wire.Firing{RuleID: rule, Quiet: sp, Notification: &notify.Notification{
			ID: id, RuleID: rule, Type: notify.TypeThreshold, Event: notify.Event{GroupHash: "g-" + id}, FiredAt: sp.Since.Add(time.Minute)}})
	}
	body, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// A quiet period holds the firings made in it, counted and recorded
// "quiet", and schedules one recap per destination, with the first
// firing held; the recap waits for the period's end, then goes once,
// listing every firing with what each rule fired and which groups are
// still above a threshold. A firing whose job comes again after the
// recap (its worker killed before it recorded) is not sent again; one
// that comes late, never held, goes on its own.
func TestMachineQuietHoursHoldThenOneRecapPerDestination(t *testing.T) {
	m := newMachine(t)
	m.d.cfg.Levels = levels{"r-storm/g-b": true}
	now := m.clock.now()
	sp := &quiet.Span{Since: now.Add(-time.Hour), Until: now.Add(time.Hour), Timezone: "UTC"}
	const one, two = "https://example.com/one", "https://example.com/two"

	m.handle(quietJob(t, one, sp, []string{"a", "b"}, "r-storm", "r-storm"))
	_, recap := m.published(queuesUpTo(m.d, time.Hour)...)
	if recap.Kind != wire.KindQuiet || recap.Quiet == nil || !recap.Quiet.Until.Equal(sp.Until) || recap.Endpoint != one {
		t.Fatalf("scheduled %+v, want the recap of the quiet period to %s", recap, one)
	}
	m.handle(quietJob(t, one, sp, []string{"c"}))
	m.nothingPublished() // one recap per destination
	m.handle(quietJob(t, two, sp, []string{"d"}))
	_, recapTwo := m.published(queuesUpTo(m.d, time.Hour)...)
	m.wantSent()
	for _, id := range []string{"a", "b", "c", "d"} {
		if got := m.record(id); got != "quiet" {
			t.Errorf("%s recorded %q, want quiet", id, got)
		}
	}
	if got := counterValue(t, m.d, "webhook", "quiet"); got != 4 {
		t.Errorf("quiet metric %v, want 4", got)
	}

	body, _ := json.Marshal(recap)
	m.handle(body) // before the end: back later, nothing sent
	if _, again := m.published(queuesUpTo(m.d, time.Hour)...); again.Kind != wire.KindQuiet {
		t.Fatalf("rescheduled %+v", again)
	}
	m.wantSent()

	m.clock.advance(time.Hour)
	m.handle(body)
	m.handle(body) // a second recap job (a holder killed before it recorded schedules another)
	m.nothingPublished()
	m.wantSent("digest a b c")
	msg := m.ch.sent()[0]
	r := msg.Quiet
	if r == nil || r.Firings != 3 || len(r.Rules) != 2 || r.Rules[0].RuleID != "r-storm" || r.Rules[0].Firings != 2 ||
		r.StillAbove != 1 || len(r.Rules[0].StillAbove) != 1 || r.Rules[0].StillAbove[0] != "g-b" || msg.RuleID != "" {
		t.Fatalf("recap %+v of message %+v", r, msg)
	}
	if len(msg.ID) != len("quiet-")+32 || msg.ID[:6] != "quiet-" {
		t.Errorf("recap id %q", msg.ID)
	}

	// Killed before it recorded, a's worker left no record; its job comes
	// again after the recap, which listed it.
	if err := m.d.rdb.Del(t.Context(), m.d.claimKey("a:webhook")).Err(); err != nil {
		t.Fatal(err)
	}
	m.handle(quietJob(t, one, sp, []string{"a"}, "r-storm"))
	m.nothingPublished()
	m.wantSent("digest a b c")
	// A firing of the period that comes after its recap goes alone.
	m.handle(quietJob(t, one, sp, []string{"e"}))
	m.wantSent("digest a b c", "single e")

	body, _ = json.Marshal(recapTwo)
	m.handle(body)
	m.wantSent("digest a b c", "single e", "digest d")
	if r := m.ch.sent()[2]; r.Quiet == nil || r.RuleID != "r-d" || r.ID == msg.ID {
		t.Errorf("second destination's recap %+v", r)
	}
}

// A recap whose send was cut short by a killed worker is sent again, the
// same message with the same id (the one repeat §4.5 allows), once.
func TestMachineQuietRecapRetriedAsTheSame(t *testing.T) {
	m := newMachine(t, reply{status: 503})
	now := m.clock.now()
	sp := &quiet.Span{Since: now.Add(-time.Hour), Until: now.Add(time.Minute), Timezone: "Europe/Berlin"}
	m.handle(quietJob(t, "https://example.com/hook", sp, []string{"a", "b"}))
	_, recap := m.published(queuesUpTo(m.d, time.Hour)...)
	m.clock.advance(time.Minute)
	body, _ := json.Marshal(recap)
	m.handle(body)
	_, retry := m.published(queuesUpTo(m.d, time.Hour)...)
	if retry.Kind != wire.KindQuiet || retry.Attempt != 1 {
		t.Fatalf("retry %+v", retry)
	}
	// A late firing meanwhile does not join the recap being retried.
	m.handle(quietJob(t, "https://example.com/hook", sp, []string{"c"}))
	body, _ = json.Marshal(retry)
	m.handle(body)
	m.handle(body)
	sent := m.ch.sent()
	if len(sent) != 3 || sent[0].ID != sent[2].ID || sentAs(sent)[2] != "digest a b" || sentAs(sent)[1] != "single c" {
		t.Fatalf("sent %q, want the recap, c alone, the recap again", sentAs(sent))
	}
}
