package hawkdb_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/hawkdb"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// A group's first occurrence's user is the payload's, as the grouper
// stores the catcher's event.
func TestGroupReadsTheFirstOccurrencesUser(t *testing.T) {
	h := NewHawkDB(t)
	h.Group(t, "with-user", 1, 1700000000, 1, nil)
	testenv.HawkGroupUser(t, h.DB, project, "with-user", "alice")
	h.Group(t, "without", 1, 1700000000, 1, nil)
	r := newReader(t, h, hawkdb.Options{})
	for group, want := range map[string]string{"with-user": "alice", "without": ""} {
		if g, err := r.Group(context.Background(), project, group); err != nil || g.UserID != want {
			t.Errorf("%s: user %q, %v; want %q", group, g.UserID, err, want)
		}
	}
}

// Repetitions are read by their ids in one query, as Hawk's grouper writes
// them: the time on top, the user in the delta from the first payload when
// it differs, and nowhere when it is the first occurrence's; an older
// writer's whole payload is read too. Ids that are no ObjectId, or that
// the database does not hold, are not in the answer.
func TestRepetitionsReadHawksDocuments(t *testing.T) {
	h := NewHawkDB(t)
	reps := h.DB.Collection("repetitions:" + project)
	changedID := testenv.HawkRepetition(t, h.DB, project, "g", 1700000010, testenv.HawkUserDelta("bob"))
	sameUser := testenv.HawkRepetition(t, h.DB, project, "g", 1700000020, `{"context":{"b":[2]}}`)
	identical := testenv.HawkRepetition(t, h.DB, project, "g", 1700000030, "")
	added := testenv.HawkRepetition(t, h.DB, project, "g", 1700000040, `{"user":[{"id":"carol","name":"Carol"}]}`)
	replaced := testenv.HawkRepetition(t, h.DB, project, "g", 1700000050, `{"user":[null,{"id":42}]}`)
	removed := testenv.HawkRepetition(t, h.DB, project, "g", 1700000060, `{"user":[null,0,0]}`)
	unreadable := testenv.HawkRepetition(t, h.DB, project, "g", 1700000070, `{"user":`)
	older := bson.NewObjectID()
	if _, err := reps.InsertOne(context.Background(), bson.M{"_id": older, "groupHash": "g",
		"payload": bson.M{"timestamp": 1700000080.5, "user": bson.M{"id": "dave"}}}); err != nil {
		t.Fatal(err)
	}
	missing := bson.NewObjectID().Hex()
	r := newReader(t, h, hawkdb.Options{})

	at := func(s float64) time.Time { return time.UnixMilli(int64(s * 1000)).UTC() }
	got, err := r.Repetitions(context.Background(), project,
		[]string{changedID, sameUser, identical, added, replaced, removed, unreadable, older.Hex(), missing, "r1", changedID})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]hawkdb.Repetition{
		changedID:   {GroupHash: "g", Time: at(1700000010), UserID: "bob"},
		sameUser:    {GroupHash: "g", Time: at(1700000020), SameUser: true},
		identical:   {GroupHash: "g", Time: at(1700000030), SameUser: true},
		added:       {GroupHash: "g", Time: at(1700000040), UserID: "carol"},
		replaced:    {GroupHash: "g", Time: at(1700000050), UserID: "42"},
		removed:     {GroupHash: "g", Time: at(1700000060)},
		unreadable:  {GroupHash: "g", Time: at(1700000070)},
		older.Hex(): {GroupHash: "g", Time: at(1700000080.5), UserID: "dave"},
	}
	if !maps.Equal(got, want) {
		t.Errorf("repetitions\n%+v\nwant\n%+v", got, want)
	}
	first := hawkdb.Group{UserID: "alice"}
	if u := got[sameUser].User(first); u != "alice" {
		t.Errorf("a repetition of the first occurrence's user: %q, want alice", u)
	}
	if u := got[changedID].User(first); u != "bob" {
		t.Errorf("a repetition of another user: %q, want bob", u)
	}
	if got, err := r.Repetitions(context.Background(), project, []string{"r1", "not-hex"}); err != nil || got != nil {
		t.Errorf("ids that are no ObjectIds: %v, %v; want nothing asked", got, err)
	}
}

// A database that does not answer costs one timeout per project, then the
// failure is remembered for the TTL: the evaluator is not held up batch
// after batch.
func TestRepetitionsOfAnUnreachableDatabaseFailFastAndAreRemembered(t *testing.T) {
	r := unreachable(t)
	ids := []string{bson.NewObjectID().Hex()}
	start := time.Now()
	for range 3 {
		if _, err := r.Repetitions(context.Background(), project, ids); err == nil {
			t.Fatal("repetitions read from an unreachable database")
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("three reads took %s; want about one 50ms timeout", d)
	}
}

func newReader(t testing.TB, h *HawkDB, opt hawkdb.Options) *hawkdb.Reader {
	t.Helper()
	r, err := hawkdb.NewReader(h.URL, h.Name, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}
