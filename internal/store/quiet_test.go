package store_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/store"
)

// quietRules indexes a project's loaded rules by id.
func quietRules(rs []*rules.Rule) map[string]*rules.Rule {
	out := map[string]*rules.Rule{}
	for _, r := range rs {
		out[r.ID] = r
	}
	return out
}

// wednesdayNight is a time inside "22:00 to 07:00" in Berlin, and
// wednesdayNoon one outside.
var (
	wednesdayNight = time.Date(2026, 1, 7, 22, 30, 0, 0, time.UTC)
	wednesdayNoon  = time.Date(2026, 1, 7, 12, 0, 0, 0, time.UTC)
)

// A project's quiet hours hold its rules' firings; a rule's own replace
// them, and a critical rule passes through both. A malformed schedule is
// a malformed field: the rule it applies to is skipped with a warning
// naming project, rule and field, and the rules it does not apply to
// (critical ones, those with their own) keep working.
func TestFileSourceQuietHours(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, `
5e3eef0679fa3700a0198a49:
  name: Shop
  quiet:
    timezone: Europe/Berlin
    hours: [{from: 22:00, to: 07:00}, {days: [sat, sun]}]
    hourz: []
  notifications:
    - {id: inherits, isEnabled: true, whatToReceive: ONLY_NEW}
    - {id: critical, isEnabled: true, whatToReceive: ONLY_NEW, critical: true}
    - {id: own, isEnabled: true, whatToReceive: ONLY_NEW, quiet: {timezone: UTC, hours: [{from: "12:00", to: "13:00"}]}}
    - {id: bad-zone, isEnabled: true, whatToReceive: ONLY_NEW, quiet: {timezone: Mars/Olympus, hours: [{}]}}
    - {id: bad-time, isEnabled: true, whatToReceive: ONLY_NEW, quiet: {timezone: UTC, hours: [{from: "22:00", to: "7h"}]}}
5e3eef0679fa3700a0198a4a:
  quiet: {timezone: Europe/Berlin, hours: [{days: [mon, funday]}]}
  notifications:
    - {id: skipped, isEnabled: true, whatToReceive: ONLY_NEW}
    - {id: still-critical, isEnabled: true, whatToReceive: ONLY_NEW, critical: true}
    - {id: own-ok, isEnabled: true, whatToReceive: ONLY_NEW, quiet: {timezone: UTC, hours: [{days: [sun]}]}}
`)
	log, logs := newLogger()
	cache := store.NewCache(store.NewFileSource(path), store.CacheOptions{Logger: log})
	if err := cache.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	shop := quietRules(cache.Rules("5e3eef0679fa3700a0198a49"))
	if len(shop) != 3 {
		t.Fatalf("loaded %v, want inherits, critical and own", shop)
	}
	if sp := shop["inherits"].QuietAt(wednesdayNight); sp == nil || sp.Timezone != "Europe/Berlin" {
		t.Errorf("inherits at night: %+v, want the project's quiet period", sp)
	}
	if sp := shop["inherits"].QuietAt(wednesdayNoon); sp != nil {
		t.Errorf("inherits at noon: %+v, want none", sp)
	}
	if sp := shop["critical"].QuietAt(wednesdayNight); sp != nil || !shop["critical"].Critical {
		t.Errorf("critical at night: %+v, want it to pass", sp)
	}
	if shop["own"].QuietAt(wednesdayNight) != nil || shop["own"].QuietAt(wednesdayNoon) == nil {
		t.Error("own: want its own hours (noon), not the project's")
	}
	other := quietRules(cache.Rules("5e3eef0679fa3700a0198a4a"))
	if other["skipped"] != nil || other["still-critical"] == nil || other["own-ok"] == nil {
		t.Errorf("project with malformed quiet hours loaded %v, want still-critical and own-ok", other)
	}
	for _, want := range []string{
		`"rule":"bad-zone"`, `quiet.timezone \"Mars/Olympus\": not a known IANA time zone`,
		`quiet.hours[0].to \"7h\": want a time of day`,
		`the project's quiet hours: quiet.hours[0].days[1] \"funday\": want a day of the week`,
		`unknown field \"quiet.hourz\" ignored`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no warning %q\n%s", want, logs)
		}
	}
	if n := logs.count(t, "rule skipped", "rule", "skipped", "project", "5e3eef0679fa3700a0198a4a"); n != 1 {
		t.Errorf("%d warnings for rule skipped, want 1\n%s", n, logs)
	}
}

// Hawk's project documents carry quiet hours as a Klaxon extension, the
// rules quiet and critical as fields of their own.
func TestMongoSourceQuietHours(t *testing.T) {
	coll, uri := projectsCollection(t)
	ctx := t.Context()
	night := bson.D{{Key: "from", Value: "22:00"}, {Key: "to", Value: "07:00"}}
	_, err := coll.InsertMany(ctx, []any{
		bson.D{
			{Key: "_id", Value: oid(t, projectA)},
			{Key: "quiet", Value: bson.D{{Key: "timezone", Value: "Europe/Berlin"}, {Key: "hours", Value: bson.A{night}}}},
			{Key: "notifications", Value: bson.A{
				bson.D{{Key: "_id", Value: oid(t, ruleOnlyNew)}, {Key: "isEnabled", Value: true}, {Key: "whatToReceive", Value: "ONLY_NEW"}},
				bson.D{{Key: "_id", Value: oid(t, ruleGood)}, {Key: "isEnabled", Value: true}, {Key: "whatToReceive", Value: "ONLY_NEW"},
					{Key: "critical", Value: true}},
			}},
		},
		bson.D{
			{Key: "_id", Value: oid(t, projectB)},
			{Key: "quiet", Value: "every night"},
			{Key: "notifications", Value: bson.A{
				bson.D{{Key: "_id", Value: oid(t, ruleSeenMore)}, {Key: "isEnabled", Value: true}, {Key: "whatToReceive", Value: "ONLY_NEW"}},
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	log, logs := newLogger()
	cache := store.NewCache(mongoSource(t, uri), store.CacheOptions{Logger: log})
	if err := cache.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	a := quietRules(cache.Rules(projectA))
	if a[ruleOnlyNew] == nil || a[ruleOnlyNew].QuietAt(wednesdayNight) == nil {
		t.Errorf("rule %s: want the project's quiet hours", ruleOnlyNew)
	}
	if a[ruleGood] == nil || a[ruleGood].QuietAt(wednesdayNight) != nil {
		t.Errorf("rule %s: want it critical, passing quiet hours", ruleGood)
	}
	if rs := cache.Rules(projectB); rs != nil {
		t.Errorf("project B: %d rules, want the one taking its undecodable quiet hours skipped", len(rs))
	}
	if !strings.Contains(logs.String(), "the project's quiet hours: decode quiet") {
		t.Errorf("no warning for project B's quiet field\n%s", logs)
	}
}
