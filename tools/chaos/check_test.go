package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/counter"
)

// The checker's own logic, without workers: compare and OK must fail a run
// in which Klaxon misbehaved, whatever the kills.

var t0 = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

// onePlan expects n firings of one group.
func onePlan(n int) *plan {
	p := &plan{Expected: map[string]firing{}}
	for i := range n {
		at := t0.Add(time.Duration(i) * time.Second)
		f := firing{ProjectID: projectA, RuleID: "storm-20-in-60s", GroupHash: "g1", At: at}
		f.ID = counter.FiringID(f.ProjectID, f.RuleID, f.GroupHash, f.At)
		p.Expected[f.ID] = f
	}
	return p
}

func (p *plan) ids() []string {
	var out []string
	for id := range p.Expected {
		out = append(out, id)
	}
	return out
}

// sent is a request for firing id, read by the sink at at, from sender
// (accepted just before).
func sent(t *testing.T, p *plan, id, sender string, at time.Time) request {
	t.Helper()
	f := p.Expected[id]
	body, err := json.Marshal(map[string]any{"id": id, "projectId": f.ProjectID, "ruleId": f.RuleID,
		"firedAt": f.At, "event": map[string]string{"groupHash": f.GroupHash}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	close(done)
	return request{Key: id, Body: body, At: at, Method: http.MethodPost, Path: "/hook",
		from: &lookup{done: done, sender: sender, accepted: at.Add(-time.Millisecond)}}
}

// killed is a fleet whose named processes were SIGKILLed when given (zero:
// never).
func killed(at map[string]time.Time) *fleet {
	f := &fleet{}
	for name, t := range at {
		f.all = append(f.all, &worker{name: name, killedAt: t})
	}
	return f
}

func check(p *plan, reqs []request, f *fleet) *Result {
	res := &Result{Expected: len(p.Expected)}
	compare(res, p, reqs, f)
	return res
}

func TestCleanRunIsOK(t *testing.T) {
	p := onePlan(3)
	var reqs []request
	for i, id := range p.ids() {
		reqs = append(reqs, sent(t, p, id, "w1#1", t0.Add(time.Duration(i)*time.Millisecond)))
	}
	if res := check(p, reqs, killed(map[string]time.Time{"w1#1": {}})); !res.OK() {
		t.Fatalf("a clean run fails: %+v", res)
	}
}

// A repeat is allowed only when the previous copy's sender was SIGKILLed
// between the sink reading it and recording it (a named sender's log must
// not show the send recorded), and the next copy waited for the dead
// sender's claim to expire.
func TestRepeatMustBeExplainedByAKillInTheCrashWindow(t *testing.T) {
	p := onePlan(1)
	id := p.ids()[0]
	for _, c := range []struct {
		name      string
		sender    string
		killedAt  time.Duration // after the first copy was read; -1: never
		killOther string        // another process killed then, if not ""
		gap       time.Duration
		ok        bool
		recorded  bool // the sender's log says it recorded the send
	}{
		{"killed 3 ms after the read, next copy at claim expiry", "w1#1", 3 * time.Millisecond, "", 4 * time.Second, true, false},
		{"killed 1 ms before the read", "w1#1", -time.Millisecond, "", 4 * time.Second, true, false},
		{"gone, a worker killed just before", gone, -2 * time.Millisecond, "w2#1", 4 * time.Second, true, false},
		{"never killed", "w1#1", -1, "", 4 * time.Second, false, false},
		{"killed 3 ms after the read, its log showing the send recorded", "w1#1", 3 * time.Millisecond, "", 4 * time.Second, false, true},
		{"killed 600 ms after the read: recorded long before", "w1#1", 600 * time.Millisecond, "", 4 * time.Second, false, true},
		{"killed 600 ms after the read, its log showing no record", "w1#1", 600 * time.Millisecond, "", 4 * time.Second, true, false},
		{"killed 900 ms before the read", "w1#1", -900 * time.Millisecond, "", 4 * time.Second, false, false},
		{"killed 10 s later", "w1#1", 10 * time.Second, "", 4 * time.Second, false, false},
		{"gone, but nobody was killed", gone, -1, "", 4 * time.Second, false, false},
		{"gone, the only kill 800 ms earlier", gone, -800 * time.Millisecond, "w2#1", 4 * time.Second, false, false},
		{"unknown sender", "", -1, "", 4 * time.Second, false, false},
		{"killed at once, but the next copy came before the claim expired", "w1#1", 3 * time.Millisecond, "", 50 * time.Millisecond, false, false},
		// A Redis fault from 1 s before the read to 5 s after it: the
		// sender could not record its send until then.
		{"killed 2.6 s after the read, during a Redis fault", "w1#1", 2600 * time.Millisecond, "", 16 * time.Second, true, false},
		{"gone, a worker killed 2.6 s after the read, during a Redis fault", gone, 2600 * time.Millisecond, "w2#1", 16 * time.Second, true, false},
		{"killed 6 s after the read, after the Redis fault", "w1#1", 6 * time.Second, "", 16 * time.Second, false, true},
		{"killed 2 s before the read, during the Redis fault", "w1#1", -2 * time.Second, "", 16 * time.Second, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			kills := map[string]time.Time{"w1#1": {}, "w2#1": {}}
			victim := c.sender
			if c.killOther != "" {
				victim = c.killOther
			}
			if c.killedAt != -1 && victim != "" {
				kills[victim] = t0.Add(c.killedAt)
			}
			reqs := []request{sent(t, p, id, c.sender, t0), sent(t, p, id, "w3#1", t0.Add(c.gap))}
			f := killed(kills)
			if c.recorded {
				path := filepath.Join(t.TempDir(), "w1-1.log")
				line := `{"level":"INFO","msg":"notification sent","notification_id":"` + id + `","took_ms":3,"recorded":true}` + "\n"
				if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
					t.Fatal(err)
				}
				for _, w := range f.all {
					if w.name == c.sender {
						w.log = path
					}
				}
			}
			if strings.Contains(c.name, "Redis fault") {
				f.faulted(t0.Add(-time.Second), t0.Add(5*time.Second))
			}
			res := check(p, reqs, f)
			if res.Repeats != 1 {
				t.Fatalf("repeats %d, want 1", res.Repeats)
			}
			if res.OK() != c.ok {
				t.Errorf("OK() = %t, want %t (repeats %d, after a kill %d)", res.OK(), c.ok, res.Repeats, res.RepeatsAfterKill)
			}
		})
	}
}

// Notifications the deliverer gave up on, and events dead-lettered, are
// findings: the sink answers 200 to everything.
func TestFailedAndDeadLettersFail(t *testing.T) {
	if (&Result{Failed: 1}).OK() {
		t.Error("a run with a failed notification is OK")
	}
	if (&Result{Dead: 1}).OK() {
		t.Error("a run with a dead-lettered event is OK")
	}
}

// Every request reaching the sink is counted, whatever its method or path.
func TestSinkRecordsEveryRequest(t *testing.T) {
	s, err := newSink(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close(t.Context())
	p := onePlan(2)
	ids := p.ids()
	other := strings.TrimSuffix(s.URL, "/hook") + "/elsewhere"
	for _, c := range []struct{ method, url, id string }{
		{http.MethodPost, other, ids[0]},
		{http.MethodPut, s.URL, ids[1]},
	} {
		body, _ := json.Marshal(map[string]string{"id": c.id})
		req, _ := http.NewRequest(c.method, c.url, strings.NewReader(string(body)))
		req.Header.Set("Idempotency-Key", c.id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	reqs := s.requests()
	if len(reqs) != 2 {
		t.Fatalf("the sink recorded %d requests of 2", len(reqs))
	}
	res := check(p, reqs, killed(nil))
	if res.Bad != 2 || res.OK() {
		t.Errorf("bad %d, OK %t: want 2 bad, not OK", res.Bad, res.OK())
	}
}

// Two different firings with one id would be one expected notification:
// the plan refuses them rather than expect less.
func TestPlanRefusesFiringIDCollisions(t *testing.T) {
	defer func(orig func(string, string, string, time.Time) string) { firingID = orig }(firingID)
	firingID = func(project, _, group string, at time.Time) string { // the rule left out
		return counter.FiringID(project, "", group, at)
	}
	rulesOf, err := writeRules(t.Context(), t.TempDir()+"/rules.yaml", ruleSpecs("http://127.0.0.1:1/hook"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := makePlan(7, "test", 2000, 40, rulesOf, time.Now()); err == nil {
		t.Error("makePlan accepted firings of different rules under one id")
	}
}

// Mutations of what was received: each must fail the run.
func TestTamperedReceiptsFail(t *testing.T) {
	p := onePlan(4)
	ids := p.ids()
	clean := func() []request {
		var reqs []request
		for i, id := range ids {
			reqs = append(reqs, sent(t, p, id, "w1#1", t0.Add(time.Duration(i)*time.Second)))
		}
		return reqs
	}
	fl := killed(map[string]time.Time{"w1#1": {}})
	for name, mutate := range map[string]func([]request) []request{
		"one dropped":    func(r []request) []request { return r[1:] },
		"one duplicated": func(r []request) []request { return append(r, r[2]) },
		"one duplicated later": func(r []request) []request {
			d := r[0]
			d.At = d.At.Add(5 * time.Second)
			return append(r, d)
		},
		"an unexpected id": func(r []request) []request {
			x := r[0]
			x.Key = "0123456789abcdef0123456789abcdef"
			x.Body = []byte(`{"id":"0123456789abcdef0123456789abcdef"}`)
			return append(r, x)
		},
		"a body for another rule": func(r []request) []request {
			r[1].Body = []byte(strings.Replace(string(r[1].Body), "storm-20-in-60s", "users-6-in-30s", 1))
			return r
		},
		"a body with another id": func(r []request) []request {
			r[1].Body = []byte(strings.Replace(string(r[1].Body), ids[1], ids[2], 1))
			return r
		},
	} {
		if res := check(p, mutate(clean()), fl); res.OK() {
			t.Errorf("%s: OK", name)
		}
	}
}

// A grouped message delivers each firing it lists; a firing also sent
// alone is a repeat.
func TestGroupedMessageDeliversEachFiring(t *testing.T) {
	p := onePlan(3)
	ids := p.ids()
	var listed []map[string]any
	for _, id := range ids[:2] {
		f := p.Expected[id]
		listed = append(listed, map[string]any{"id": id, "projectId": f.ProjectID, "ruleId": f.RuleID,
			"firedAt": f.At, "event": map[string]string{"groupHash": f.GroupHash}})
	}
	body, err := json.Marshal(map[string]any{"id": "group-1", "type": "grouped", "notifications": listed})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	close(done)
	group := request{Key: "group-1", Body: body, At: t0, Method: http.MethodPost, Path: "/hook",
		from: &lookup{done: done, sender: "w1#1", accepted: t0.Add(-time.Millisecond)}}
	reqs := []request{group, sent(t, p, ids[2], "w1#1", t0)}
	if res := check(p, reqs, killed(map[string]time.Time{"w1#1": {}})); !res.OK() || res.Missed != 0 {
		t.Fatalf("a grouped message and a single one fail: %+v", res)
	}
	reqs = append(reqs, sent(t, p, ids[0], "w1#1", t0.Add(time.Second)))
	if res := check(p, reqs, killed(map[string]time.Time{"w1#1": {}})); res.OK() || res.Repeats != 1 {
		t.Fatalf("a firing sent in a group and alone passes: %+v", res)
	}
}

// A repeat whose first sender lived but logged that Redis refused to record
// its send is the failover's documented repeat: another job of the same
// firing, taken once the claim lapsed. Without that line, or before the
// claim could lapse, it fails the run.
func TestRepeatExplainedByARefusedRecord(t *testing.T) {
	p := onePlan(1)
	id := p.ids()[0]
	refused := `{"level":"WARN","msg":"handler failed; holding the batch to retry it","err":"record k:sent:other:webhook, k:sent:` +
		id + `:webhook as sent: 0 of 1 replicas acknowledged the write within 1s"}` + "\n"
	for _, c := range []struct {
		name string
		log  string
		gap  time.Duration
		ok   bool
	}{
		{"record refused, next copy after the claim lapsed", refused, 16 * time.Second, true},
		{"record refused, next copy too soon", refused, 50 * time.Millisecond, false},
		// The deliverer's own line, at info whatever the consumer logs of
		// the batch it holds.
		{"sent, not recorded, next copy after the claim lapsed",
			`{"level":"INFO","msg":"notification sent","notification_id":"` + id + `","took_ms":3,"recorded":false}` + "\n", 16 * time.Second, true},
		{"sent and recorded", `{"level":"INFO","msg":"notification sent","notification_id":"` + id + `","took_ms":3,"recorded":true}` + "\n", 16 * time.Second, false},
		{"nothing refused", `{"msg":"notification sent","notification_id":"` + id + `"}` + "\n", 16 * time.Second, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "w1-1.log")
			if err := os.WriteFile(path, []byte(c.log), 0o600); err != nil {
				t.Fatal(err)
			}
			f := &fleet{all: []*worker{{name: "w1#1", log: path}}}
			res := check(p, []request{sent(t, p, id, "w1#1", t0), sent(t, p, id, "w2#1", t0.Add(c.gap))}, f)
			if res.OK() != c.ok {
				t.Errorf("OK() = %t, want %t (repeats %d, unrecorded %d)", res.OK(), c.ok, res.Repeats, res.RepeatsUnrecorded)
			}
		})
	}
}
