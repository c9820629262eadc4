package store_test

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/rules"
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
		bson.D{
			{Key: "_id", Value: oid(t, ruleSpike)},
			{Key: "isEnabled", Value: true},
			{Key: "whatToReceive", Value: "SEEN_MORE"},
			{Key: "windows", Value: bson.A{
				bson.D{{Key: "threshold", Value: int32(50)}, {Key: "period", Value: int32(300000)},
					{Key: "spike", Value: bson.D{{Key: "factor", Value: 2.5}, {Key: "baseline", Value: int64(86400000)}, {Key: "floor", Value: float64(4)}}}},
				bson.D{{Key: "threshold", Value: int32(500)}, {Key: "period", Value: int32(60000)},
					{Key: "spike", Value: bson.D{{Key: "factor", Value: int32(5)}, {Key: "baseline", Value: float64(3600000)}}}},
			}},
			{Key: "channels", Value: bson.D{{Key: "webhook", Value: channel("https://example.com/"+secret, int32(0))}}},
		},
	}
}

// ruleSpike is the rule of hawkRules with spike windows.
const ruleSpike = "64b7f0c2a1b2c3d4e5f6005b"

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
	if len(want) != 4 {
		t.Fatalf("MongoDB gave %d rules, want 4: %v", len(want), fromMongo.Snapshot().Problems())
	}
	spikes := []rules.Spike{{Factor: 2.5, Baseline: 24 * time.Hour, Floor: 4}, {Factor: 5, Baseline: time.Hour}}
	for i, w := range want[3].Windows {
		if w.Spike == nil || *w.Spike != spikes[i] {
			t.Errorf("rule %s window %d: spike %+v, want %+v", want[3].ID, i, w.Spike, spikes[i])
		}
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
	export := func(t *testing.T, doc bson.Raw, canonical bool) string {
		js, err := bson.MarshalExtJSON(doc, canonical, false)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(js), `"_id":{"$oid":"`) {
			t.Fatalf("export %s has no {$oid} _id", js)
		}
		return string(js)
	}
	// Rules one by one under their project, or the whole project document
	// (whose name then comes along).
	for _, mode := range []struct {
		name         string
		canonical    bool
		wholeProject bool
	}{{"relaxed rules", false, false}, {"canonical rules", true, false}, {"relaxed project", false, true}, {"canonical project", true, true}} {
		t.Run(mode.name, func(t *testing.T) {
			var file strings.Builder
			if mode.wholeProject {
				file.WriteString(projectA + ": " + export(t, doc, mode.canonical) + "\n")
			} else {
				file.WriteString(projectA + ":\n")
				for _, v := range values {
					file.WriteString("  - " + export(t, v.Document(), mode.canonical) + "\n")
				}
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
			if !mode.wholeProject {
				// A bare list of rules names no project.
				named := make([]*rules.Rule, len(got))
				for i, r := range got {
					if r.ProjectName != "" {
						t.Errorf("rule %s has project name %q", r.ID, r.ProjectName)
					}
					c := *r
					c.ProjectName = "Shop"
					named[i] = &c
				}
				got = named
			}
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

// A project in the file may be a mapping shaped like Hawk's project
// document, whose name messages then show; the plain list of rules keeps
// working and names nothing.
func TestFileSourceProjectNames(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, `
5e3eef0679fa3700a0198a49:
  name: "Shop\nfront"
  notifications:
    - {id: a, isEnabled: true, whatToReceive: ONLY_NEW}
5e3eef0679fa3700a0198a4a:
  - {id: b, isEnabled: true, whatToReceive: ONLY_NEW}
5e3eef0679fa3700a0198a4b:
  _id: {$oid: 5e3eef0679fa3700a0198a4c}
  notifications: [{id: c, isEnabled: true, whatToReceive: ONLY_NEW}]
5e3eef0679fa3700a0198a4d:
  name: [not, a, string]
  token: `+secret+`
  notifications: [{id: d, isEnabled: true, whatToReceive: ONLY_NEW}]
5e3eef0679fa3700a0198a4e:
  name: no rules key
`)
	log, logs := newLogger()
	cache := store.NewCache(store.NewFileSource(path), store.CacheOptions{Logger: log})
	if err := cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	for project, want := range map[string]string{
		"5e3eef0679fa3700a0198a49": "Shop front", "5e3eef0679fa3700a0198a4a": "", "5e3eef0679fa3700a0198a4d": "",
	} {
		if rs := cache.Rules(project); len(rs) != 1 || rs[0].ProjectName != want {
			t.Errorf("project %s: %+v, want one rule named %q", project, rs, want)
		}
	}
	for _, project := range []string{"5e3eef0679fa3700a0198a4b", "5e3eef0679fa3700a0198a4e"} {
		if rs := cache.Rules(project); rs != nil {
			t.Errorf("project %s: %d rules, want it skipped", project, len(rs))
		}
	}
	for _, want := range []string{"_id is not the project id", "want a list of rules, or a mapping with notifications",
		"name is not a string", `unknown field \"token\" ignored`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no warning %q\n%s", want, logs)
		}
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("a secret reached the log:\n%s", logs)
	}
}
