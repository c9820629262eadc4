package hawkdb_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/klaxonhq/klaxon/internal/hawkdb"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

const project = "5e3eef0679fa3700a0198a49"

// HawkDB is a test's events database, written as Hawk writes it.
type HawkDB struct {
	URL, Name string
	DB        *mongo.Database
}

// NewHawkDB starts (or reuses) FerretDB and gives the test its own events
// database.
func NewHawkDB(t *testing.T) *HawkDB {
	t.Helper()
	uri, db := testenv.HawkDatabase(t)
	return &HawkDB{URL: uri, Name: db.Name(), DB: db}
}

// Group inserts a group document as Hawk's grouper writes it, with its
// marks as hawk.api's toggleEventMark sets them (Unix seconds), and one
// dailyEvents document per day it happened.
func (h *HawkDB) Group(t *testing.T, groupHash string, total int32, firstSeen int32, days int, marks bson.M) string {
	t.Helper()
	return testenv.HawkGroup(t, h.DB, project, groupHash, total, firstSeen, days, marks)
}

// Mark sets or clears a mark as hawk.api's toggleEventMark does.
func (h *HawkDB) Mark(t *testing.T, groupHash, mark string, at int32) {
	t.Helper()
	testenv.HawkMark(t, h.DB, project, groupHash, mark, at)
}

func TestGroupReadsHawksDocuments(t *testing.T) {
	h := NewHawkDB(t)
	id := h.Group(t, "g1", 1234, 1700000000, 3, bson.M{"resolved": int32(1700500000)})
	h.Group(t, "g2", 5, 1700000000, 1, bson.M{"ignored": int32(1700500000), "starred": int32(1700500001)})
	r, err := hawkdb.NewReader(h.URL, h.Name, hawkdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })

	g, err := r.Group(context.Background(), project, "g1")
	if err != nil {
		t.Fatal(err)
	}
	want := hawkdb.Group{ID: id, TotalCount: 1234, FirstSeen: time.Unix(1700000000, 0).UTC(), DaysRepeated: 3,
		TopFrame: "app/cart.js:42", Resolved: 1700500000}
	if g != want {
		t.Errorf("g1 = %+v\nwant %+v", g, want)
	}
	if g, err := r.Group(context.Background(), project, "g2"); err != nil || !g.Ignored || g.Resolved != 0 {
		t.Errorf("g2 = %+v, %v; want ignored, not resolved", g, err)
	}
	if _, err := r.Group(context.Background(), project, "unknown"); !errors.Is(err, hawkdb.ErrNotFound) {
		t.Errorf("unknown group: err = %v, want ErrNotFound", err)
	}
}

// A link to an event names it by the group document's _id: Hawk's are
// ObjectIds, read as their hex digits; another writer's string is taken as
// it is, and an _id of no type a link could carry is no id.
func TestGroupIDIsTheDocumentsID(t *testing.T) {
	h := NewHawkDB(t)
	c := h.DB.Collection("events:" + project)
	for _, doc := range []bson.M{
		{"_id": "evt-1", "groupHash": "by-string", "totalCount": int32(1)},
		{"_id": bson.M{"a": 1}, "groupHash": "by-document", "totalCount": int32(1)},
	} {
		if _, err := c.InsertOne(context.Background(), doc); err != nil {
			t.Fatal(err)
		}
	}
	oid := h.Group(t, "by-objectid", 1, 1700000000, 1, nil)
	r, err := hawkdb.NewReader(h.URL, h.Name, hawkdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	for group, want := range map[string]string{"by-objectid": oid, "by-string": "evt-1", "by-document": ""} {
		g, err := r.Group(context.Background(), project, group)
		if err != nil || g.ID != want {
			t.Errorf("%s: ID %q, %v; want %q", group, g.ID, err, want)
		}
	}
	if len(oid) != 24 {
		t.Errorf("ObjectId %q: want 24 hex digits", oid)
	}
}

// Marks are cached for TTL only: a resolution made in the tracker is seen
// by the next lookup after it, not before.
func TestGroupCachesForTTL(t *testing.T) {
	h := NewHawkDB(t)
	h.Group(t, "g1", 1, 1700000000, 1, nil)
	now := time.Unix(1800000000, 0)
	r, err := hawkdb.NewReader(h.URL, h.Name, hawkdb.Options{TTL: 5 * time.Second, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	ctx := context.Background()
	if g, _ := r.Group(ctx, project, "g1"); g.Resolved != 0 {
		t.Fatalf("resolved before the mark: %+v", g)
	}
	h.Mark(t, "g1", "resolved", 1700600000)
	if g, _ := r.Group(ctx, project, "g1"); g.Resolved != 0 {
		t.Errorf("within the TTL the cached answer is expected, got %+v", g)
	}
	now = now.Add(5 * time.Second)
	if g, _ := r.Group(ctx, project, "g1"); g.Resolved != 1700600000 {
		t.Errorf("after the TTL: %+v, want resolved at 1700600000", g)
	}
}

// A database that does not answer costs one timeout, then the failure is
// remembered: the evaluator is not held up event after event.
func TestUnreachableDatabaseFailsFastAndIsRemembered(t *testing.T) {
	r := unreachable(t)
	start := time.Now()
	if _, err := r.Group(context.Background(), project, "g1"); err == nil {
		t.Fatal("lookup in an unreachable database succeeded")
	}
	if _, err := r.Group(context.Background(), project, "g1"); err == nil {
		t.Fatal("second lookup succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("two lookups took %s; want about one 50ms timeout", d)
	}
}

// unreachable is a Reader of a database that never answers, with a 50 ms
// timeout. 192.0.2.1 (TEST-NET-1) is never routed: every connection
// attempt hangs.
func unreachable(t *testing.T) *hawkdb.Reader {
	t.Helper()
	r, err := hawkdb.NewReader("mongodb://192.0.2.1:27017/?connectTimeoutMS=10000&serverSelectionTimeoutMS=10000", "hawk_events",
		hawkdb.Options{Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}

// What a lookup costs on the evaluator's path: a cache hit (every event
// after its group's first in 5 s) and a miss (a FerretDB round trip: the
// group document and its days).
func BenchmarkGroup(b *testing.B) {
	uri := testenv.Mongo(b)
	u, _ := url.Parse(uri)
	name := strings.TrimPrefix(u.Path, "/")
	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		b.Fatal(err)
	}
	defer client.Disconnect(context.Background())
	db := client.Database(name)
	if _, err := db.Collection("events:"+project).InsertOne(context.Background(), bson.M{
		"groupHash": "g1", "totalCount": int32(10), "timestamp": int32(1700000000),
		"payload": bson.M{"title": "T", "backtrace": bson.A{bson.M{"file": "a.js", "line": int32(1)}}},
		"marks":   bson.M{"resolved": int32(1700500000)},
	}); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		ttl  time.Duration
	}{{"hit", time.Hour}, {"miss", time.Nanosecond}} {
		b.Run(bc.name, func(b *testing.B) {
			r, err := hawkdb.NewReader(uri, name, hawkdb.Options{TTL: bc.ttl, Timeout: 5 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close(context.Background())
			if _, err := r.Group(context.Background(), project, "g1"); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := r.Group(context.Background(), project, "g1"); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
