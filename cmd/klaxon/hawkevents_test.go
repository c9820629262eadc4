package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/hawkdb"
	"github.com/klaxonhq/klaxon/internal/store"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// stockHawk is a message as stock Hawk's grouper publishes it: no
// timestamp, no user; rep "" for a group's first (isNew).
func stockHawk(group, rep string) string {
	if rep == "" {
		return fmt.Sprintf(`{"projectId":%q,"event":{"title":"TypeError: x is undefined","groupHash":%q,"isNew":true,"repetitionId":null}}`, projectA, group)
	}
	return fmt.Sprintf(`{"projectId":%q,"event":{"title":"TypeError: x is undefined","groupHash":%q,"isNew":false,"repetitionId":%q}}`, projectA, group, rep)
}

// hawkStream writes into db a group g of projectA first seen at t0 by
// alice and its repetitions, as Hawk's grouper writes them, and returns the
// stream the grouper published for them, one message a line, with the
// time and user each happened at and to. "" is a repetition of the first
// occurrence's user, whose delta leaves it out.
func hawkStream(t *testing.T, db *mongo.Database, t0 int32) (lines []string, at []time.Time, users []string) {
	t.Helper()
	testenv.HawkGroup(t, db, projectA, "g", 9, t0, 1, nil)
	testenv.HawkGroupUser(t, db, projectA, "g", "alice")
	lines, at, users = []string{stockHawk("g", "")}, []time.Time{time.Unix(int64(t0), 0)}, []string{"alice"}
	for _, r := range []struct {
		after int32
		user  string
	}{{15, "bob"}, {20, ""}, {314, "carol"}, {480, ""}, {660, "dave"}, {900, "erin"}, {920, ""}, {940, "frank"}} {
		delta, user := "", "alice"
		if r.user != "" {
			delta, user = testenv.HawkUserDelta(r.user), r.user
		}
		lines = append(lines, stockHawk("g", testenv.HawkRepetition(t, db, projectA, "g", t0+r.after, delta)))
		at, users = append(at, time.Unix(int64(t0+r.after), 0)), append(users, user)
	}
	return lines, at, users
}

// hawkRules: "burst" counts events, 3 in a minute, and fires twice on the
// times of hawkStream (at its third event and at its last); "users" counts
// 3 users in 5 minutes, reached at the fourth event (bob, alice by a
// repetition of the first occurrence's user, carol; the first event is
// out of the window by then).
const hawkRules = projectA + `:
  - id: burst
    isEnabled: true
    whatToReceive: SEEN_MORE
    threshold: 3
    thresholdPeriod: 60000
    cooldown: 60000
    channels: {webhook: {isEnabled: true, endpoint: "https://example.com/hook", minPeriod: 0}}
  - id: users
    isEnabled: true
    whatToReceive: SEEN_MORE
    countBy: users
    threshold: 3
    thresholdPeriod: 300000
    cooldown: 3600000
    channels: {webhook: {isEnabled: true, endpoint: "https://example.com/hook", minPeriod: 0}}
`

// A stock-Hawk stream replays at the times Hawk's events database holds,
// with its users: the first event at its group's, each repetition at its
// own, with its own user or the first occurrence's. Taken at any other
// time the burst rule would fire elsewhere, or at other times; without
// the users, the users rule would not fire.
func TestBacktestTakesTimesAndUsersFromHawksEventsDatabase(t *testing.T) {
	uri, db := testenv.HawkDatabase(t)
	t0 := int32(time.Now().Add(-2 * time.Hour).Unix())
	lines, at, _ := hawkStream(t, db, t0)
	rulesFile := writeTemp(t, "rules.yml", hawkRules)
	eventsFile := writeTemp(t, "events.ndjson", strings.Join(lines, "\n")+"\n")

	r := klaxon(t, map[string]string{"KLAXON_EVENTS_MONGO_URL": uri}, "backtest", "--rules", rulesFile, "--events", eventsFile, "--json")
	if r.code != exitOK {
		t.Fatalf("exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	var rep replayReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	type fired struct {
		rule  string
		line  int
		count int64
	}
	want := []fired{{"burst", 3, 3}, {"users", 4, 3}, {"burst", 9, 3}}
	if len(rep.Firings) != len(want) {
		t.Fatalf("firings %+v, want %+v", rep.Firings, want)
	}
	for i, f := range rep.Firings {
		if w := want[i]; f.RuleID != w.rule || f.Line != w.line || f.Count != w.count || !f.Time.Equal(at[w.line-1]) {
			t.Errorf("firing %d: %s at line %d (%v), count %d; want %s at line %d (%v), count %d",
				i, f.RuleID, f.Line, f.Time, f.Count, w.rule, w.line, at[w.line-1], w.count)
		}
	}
	if e := rep.Events; e.Counted != len(lines) || e.Dead != 0 {
		t.Errorf("events %+v, want all %d counted", e, len(lines))
	}
}

// What each event of the stream takes: its time and its user, read as
// the worker reads them.
func TestFromHawkGivesEachEventItsTimeAndUser(t *testing.T) {
	uri, db := testenv.HawkDatabase(t)
	lines, at, users := hawkStream(t, db, 1700000000)
	reader, err := hawkdb.NewReader(uri, db.Name(), hawkdb.Options{Timeout: hawkTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reader.Close(context.Background()) })
	msgs := make([]*event.Message, len(lines))
	for i, l := range lines {
		m, err := event.Decode([]byte(l))
		if err != nil {
			t.Fatal(err)
		}
		msgs[i] = &m
	}
	taken, err := fromHawk(context.Background(), reader, msgs, func(*event.Message) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range msgs {
		if !m.Event.Time().Equal(at[i]) || m.Event.UserID() != users[i] || taken[i].why != "" {
			t.Errorf("line %d: at %v by %q (%q); want at %v by %q", i+1, m.Event.Time(), m.Event.UserID(), taken[i].why, at[i], users[i])
		}
	}
}

// countedHawk counts the repetition queries of a replay, and fails them
// with err when it is set.
type countedHawk struct {
	hawkEvents
	err error

	mu      sync.Mutex
	queries int
}

func (c *countedHawk) Repetitions(ctx context.Context, projectID string, ids []string) (map[string]hawkdb.Repetition, error) {
	c.mu.Lock()
	c.queries++
	c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	return c.hawkEvents.Repetitions(ctx, projectID, ids)
}

// A replay reads the repetitions of 1,000 lines at a time, in one query
// per project: 2,500 lines, three. A read that fails stops it, saying so.
func TestBacktestReadsRepetitionsInChunks(t *testing.T) {
	uri, db := testenv.HawkDatabase(t)
	lines, _, _ := hawkStream(t, db, int32(time.Now().Add(-time.Hour).Unix()))
	reader, err := hawkdb.NewReader(uri, db.Name(), hawkdb.Options{Timeout: hawkTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reader.Close(context.Background()) })
	specs, err := store.NewFileSource(writeTemp(t, "rules.yml", hawkRules)).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	snap := store.Compile(specs, time.Now())
	var stream []string
	for i := range 2500 {
		stream = append(stream, lines[1+i%(len(lines)-1)]) // repetitions: each read again, counted once
	}
	c := &countedHawk{hawkEvents: reader}
	rep, err := replay(context.Background(), strings.NewReader(strings.Join(stream, "\n")), snap, c, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if c.queries != 3 || rep.Events.Counted != len(lines)-1 || rep.Events.Duplicate != 2500-(len(lines)-1) {
		t.Errorf("%d queries, events %+v; want 3 queries, %d counted", c.queries, rep.Events, len(lines)-1)
	}

	c = &countedHawk{hawkEvents: reader, err: errors.New("connection reset")}
	_, err = replay(context.Background(), strings.NewReader(strings.Join(stream, "\n")), snap, c, time.Now())
	if err == nil || !strings.Contains(err.Error(), "Hawk's events database (KLAXON_EVENTS_MONGO_URL): connection reset") || c.queries != 1 {
		t.Errorf("after %d queries: %v; want the failure of the first, named", c.queries, err)
	}
}

// An event the database gives no time stops the replay, naming its line
// and why; so does a database that does not answer, within seconds; and
// without the database, the error says where the times could come from.
func TestBacktestSaysWhyAnEventHasNoTime(t *testing.T) {
	uri, db := testenv.HawkDatabase(t)
	lines, _, _ := hawkStream(t, db, int32(time.Now().Add(-time.Hour).Unix()))
	rulesFile := writeTemp(t, "rules.yml", hawkRules)
	env := map[string]string{"KLAXON_EVENTS_MONGO_URL": uri}
	const unknown = "65f0a1b2c3d4e5f6a7b8c9d0"
	for _, c := range []struct {
		line, want string
	}{
		{stockHawk("g", unknown), "repetition " + unknown + " not found in repetitions:" + projectA},
		{stockHawk("g", "r9"), "repetition r9 not found in repetitions:" + projectA},
		{stockHawk("nope", ""), "group nope not found in events:" + projectA},
		{fmt.Sprintf(`{"projectId":%q,"event":{"title":"x","groupHash":"g","isNew":false,"repetitionId":null}}`, projectA),
			"it is not its group's first (isNew) and has no repetitionId"},
	} {
		eventsFile := writeTemp(t, "events.ndjson", lines[0]+"\n"+c.line+"\n")
		r := klaxon(t, env, "backtest", "--rules", rulesFile, "--events", eventsFile)
		if r.code != exitUsage || !strings.Contains(r.stderr, "line 2: event.timestamp is missing, and Hawk's events database has none: "+c.want) {
			t.Errorf("%s: exit %d: %s%s", c.line, r.code, r.stdout, r.stderr)
		}
	}

	addr := closedAddr(t)
	eventsFile := writeTemp(t, "events.ndjson", strings.Join(lines, "\n")+"\n")
	start := time.Now()
	r := klaxon(t, map[string]string{"KLAXON_EVENTS_MONGO_URL": "mongodb://" + addr + "/hawk_events"}, "backtest", "--rules", rulesFile, "--events", eventsFile)
	if took := time.Since(start); took > 6*time.Second {
		t.Errorf("answered after %v, want about 5 s at most", took)
	}
	if r.code != exitUsage || !strings.Contains(r.stderr, "Hawk's events database (KLAXON_EVENTS_MONGO_URL): MongoDB did not answer") ||
		strings.Contains(r.stderr, "topology") || r.stdout != "" {
		t.Errorf("unreachable: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}

	// Events that say when they happened need no database, up or down.
	timed := writeTemp(t, "timed.ndjson", fmt.Sprintf(`{"projectId":%q,"event":{"title":"x","groupHash":"g","timestamp":1700000000}}`+"\n", projectA))
	r = klaxon(t, map[string]string{"KLAXON_EVENTS_MONGO_URL": "mongodb://" + addr + "/hawk_events"}, "backtest", "--rules", rulesFile, "--events", timed)
	if r.code != exitOK || !strings.Contains(r.stdout, "1 event: 1 counted") {
		t.Errorf("timed events, the database down: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}

	r = klaxon(t, nil, "backtest", "--rules", rulesFile, "--events", eventsFile)
	if r.code != exitUsage || !strings.Contains(r.stderr, "line 1: event.timestamp is missing") || !strings.Contains(r.stderr, "KLAXON_EVENTS_MONGO_URL") {
		t.Errorf("without the database: exit %d: %s", r.code, r.stderr)
	}
}

// closedAddr is an address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
