package store_test

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/store"
)

// hawkRules are rules as hawk.api writes them (uidAdded, numbers in the
// BSON types Node.js leaves), plus one with Klaxon's extensions.
func hawkRules(t *testing.T) bson.A {
	return bson.A{
		bson.D{
			{Key: "_id", Value: oid(t, ruleSeenMore)},
			{Key: "uidAdded", Value: oid(t, "64b7f0c2a1b2c3d4e5f6ffff")},
			{Key: "isEnabled", Value: true},
			{Key: "whatToReceive", Value: "SEEN_MORE"},
			{Key: "including", Value: bson.A{"TypeError", " editor"}},
			{Key: "excluding", Value: bson.A{}},
			{Key: "threshold", Value: int32(100)},
			{Key: "thresholdPeriod", Value: int64(60000)},
			{Key: "channels", Value: bson.D{
				{Key: "webhook", Value: channel("https://example.com/hook?k="+secret, float64(0))},
				{Key: "email", Value: bson.D{{Key: "isEnabled", Value: false}, {Key: "endpoint", Value: ""}, {Key: "minPeriod", Value: int32(60)}}},
			}},
		},
		bson.D{
			{Key: "_id", Value: oid(t, ruleOnlyNew)},
			{Key: "uidAdded", Value: oid(t, "64b7f0c2a1b2c3d4e5f6ffff")},
			{Key: "autoAdded", Value: "true"},
			{Key: "isEnabled", Value: true},
			{Key: "whatToReceive", Value: "ONLY_NEW"},
			{Key: "including", Value: bson.A{}},
			{Key: "excluding", Value: bson.A{"staging"}},
			{Key: "channels", Value: bson.D{
				{Key: "telegram", Value: channel("-100123", int64(60))},
				{Key: "slack", Value: channel("https://hooks.slack.com/services/"+secret, int32(0))},
			}},
		},
		bson.D{
			{Key: "_id", Value: oid(t, ruleWindows)},
			{Key: "isEnabled", Value: true},
			{Key: "whatToReceive", Value: "SEEN_MORE"},
			{Key: "windows", Value: bson.A{
				bson.D{{Key: "threshold", Value: float64(20)}, {Key: "period", Value: int64(60000)}},
				bson.D{{Key: "threshold", Value: int32(5)}, {Key: "period", Value: float64(3000)}},
			}},
			{Key: "countBy", Value: "users"},
			{Key: "cooldown", Value: int64(120000)},
			{Key: "channels", Value: bson.D{{Key: "webhook", Value: channel("https://example.com/"+secret, int32(30))}}},
		},
	}
}

// A rule copied from MongoDB, as mongoexport writes it in either of its
// modes (relaxed, its default: {"$oid": …} and plain numbers; canonical:
// {"$numberInt": …} too), pasted into the rules file under its project,
// must compile to exactly the rule MongoSource reads from the same
// document, with no warning: that is how people move rules between the two.
func TestFileSourceLoadsRulesCopiedFromMongo(t *testing.T) {
	coll, uri := projectsCollection(t)
	ctx := t.Context()
	if _, err := coll.InsertOne(ctx, bson.D{
		{Key: "_id", Value: oid(t, projectA)},
		{Key: "name", Value: "Shop"},
		{Key: "notifications", Value: hawkRules(t)},
	}); err != nil {
		t.Fatal(err)
	}
	fromMongo := store.NewCache(mongoSource(t, uri), store.CacheOptions{})
	if err := fromMongo.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	want := fromMongo.Rules(projectA)
	if len(want) != 3 {
		t.Fatalf("MongoDB gave %d rules, want 3: %v", len(want), fromMongo.Snapshot().Problems())
	}

	// What MongoDB stores, read back as it is.
	var doc bson.Raw
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: oid(t, projectA)}}).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	values, err := doc.Lookup("notifications").Array().Values()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []struct {
		name      string
		canonical bool
	}{{"relaxed", false}, {"canonical", true}} {
		t.Run(mode.name, func(t *testing.T) {
			var file strings.Builder
			file.WriteString(projectA + ":\n")
			for _, v := range values {
				js, err := bson.MarshalExtJSON(v.Document(), mode.canonical, false)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(string(js), `"_id":{"$oid":"`) {
					t.Fatalf("export %s has no {$oid} _id", js)
				}
				file.WriteString("  - " + string(js) + "\n")
			}
			path := filepath.Join(t.TempDir(), "rules.yaml")
			writeFile(t, path, file.String())

			log, logs := newLogger()
			fromFile := store.NewCache(store.NewFileSource(path), store.CacheOptions{Logger: log})
			if err := fromFile.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
			if p := fromFile.Snapshot().Problems(); len(p) != 0 {
				t.Errorf("problems %v, want none\n%s", p, file.String())
			}
			got := fromFile.Rules(projectA)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("from the file:\n%+v\nfrom MongoDB:\n%+v", deref(got), deref(want))
			}
			if strings.Contains(logs.String(), secret) {
				t.Errorf("a secret reached the log:\n%s", logs)
			}
		})
	}
}

// The file takes a rule's id as _id (Hawk's name) or id (Klaxon's); a rule
// that gives both must give the same, and a wrapper that cannot stand for
// what Hawk stores is refused with a reason, never a guess.
func TestFileSourceRuleIDForms(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, `
5e3eef0679fa3700a0198a49:
  - {_id: underscore, isEnabled: true, whatToReceive: ONLY_NEW}
  - {id: plain, isEnabled: true, whatToReceive: ONLY_NEW}
  - {_id: {$oid: 64B7F0C2A1B2C3D4E5F60001}, isEnabled: true, whatToReceive: ONLY_NEW}
  - {_id: same, id: same, isEnabled: true, whatToReceive: ONLY_NEW}
  - {_id: one, id: other, isEnabled: true, whatToReceive: ONLY_NEW}
  - {_id: {$oid: "not-hex-`+secret+`"}, isEnabled: true, whatToReceive: ONLY_NEW}
  - {id: bad-number, isEnabled: true, whatToReceive: SEEN_MORE, threshold: {$numberInt: "`+secret+`"}, thresholdPeriod: 60000}
  - {id: half, isEnabled: true, whatToReceive: SEEN_MORE, threshold: {$numberDouble: "2.5"}, thresholdPeriod: 60000}
  - {id: a-date, isEnabled: true, whatToReceive: SEEN_MORE, threshold: {$date: "2024-01-01"}, thresholdPeriod: 60000}
  - {id: whole-double, isEnabled: true, whatToReceive: SEEN_MORE, threshold: {$numberDouble: "7.0"}, thresholdPeriod: {$numberLong: "60000"}}
`)
	log, logs := newLogger()
	cache := store.NewCache(store.NewFileSource(path), store.CacheOptions{Logger: log})
	if err := cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := cache.Rules("5e3eef0679fa3700a0198a49")
	if ids := strings.Join(ruleIDs(got), ","); ids != "underscore,plain,64b7f0c2a1b2c3d4e5f60001,same,whole-double" {
		t.Errorf("rules %s", ids)
	}
	if n := len(got); n == 5 && (got[4].Windows[0].Threshold != 7 || got[4].Windows[0].Period != time.Minute) {
		t.Errorf("whole-double windows %+v", got[4].Windows)
	}
	for rule, reason := range map[string]string{
		"other":      "_id and id differ",
		"#5":         "$oid must be 24 hex digits",
		"bad-number": "$numberInt is not an integer",
		"half":       "threshold 2.5",
		"a-date":     "cannot unmarshal",
	} {
		wantSkipped(t, logs, rule, reason)
	}
	if strings.Contains(logs.String(), "unknown field") {
		t.Errorf("an id form was taken for an unknown field\n%s", logs)
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("a secret reached the log:\n%s", logs)
	}
}

func deref[T any](ps []*T) []T {
	out := make([]T, len(ps))
	for i, p := range ps {
		out[i] = *p
	}
	return out
}
