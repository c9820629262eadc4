package store_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/store"
)

// A project's users are not trusted: 10,000 rules of 8 windows of 31 days
// made one Redis script call of 2.28 s, and 100 rules of 1,000 excluding
// words took 29 s of evaluator time for 20 events, while every other
// project waited. Rules over the limits are skipped at load, each with a
// warning naming project and rule, and the project's other rules and the
// other projects keep working.
func TestRulesOverTheLimitsAreSkippedWithAWarning(t *testing.T) {
	coll, uri := projectsCollection(t)
	ctx := t.Context()
	rule := func(i int, extra ...bson.E) bson.D {
		d := bson.D{
			{Key: "_id", Value: oid(t, fmt.Sprintf("64b7f0c2a1b2c3d4e5f7%04x", i))},
			{Key: "isEnabled", Value: true},
			{Key: "whatToReceive", Value: "ONLY_NEW"},
			{Key: "channels", Value: bson.D{{Key: "webhook", Value: channel("https://example.com/"+secret, int32(0))}}},
		}
		for _, e := range extra {
			if i := slices.IndexFunc(d, func(f bson.E) bool { return f.Key == e.Key }); i >= 0 {
				d[i] = e
			} else {
				d = append(d, e)
			}
		}
		return d
	}
	many := bson.A{}
	for i := range 150 {
		many = append(many, rule(i))
	}
	words := func(n, size int) bson.A {
		a := bson.A{}
		for i := range n {
			a = append(a, fmt.Sprintf("%0*d", size, i))
		}
		return a
	}
	windows := bson.A{}
	for i := range 3 {
		windows = append(windows, bson.D{{Key: "threshold", Value: int32(10)}, {Key: "period", Value: int64(60000 * (i + 1))}})
	}
	addrs := make([]string, 2000)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("user%d@example.com", i)
	}
	seenMore := bson.E{Key: "whatToReceive", Value: "SEEN_MORE"}
	abuse := bson.A{
		rule(1000),
		rule(1001, bson.E{Key: "excluding", Value: words(11, 5)}),
		rule(1002, bson.E{Key: "including", Value: words(1, 201)}),
		rule(1003, bson.E{Key: "including", Value: words(10, 200)}, bson.E{Key: "excluding", Value: words(2, 200)}),
		rule(1004, seenMore, bson.E{Key: "windows", Value: windows}),
		rule(1005, bson.E{Key: "channels", Value: bson.D{
			{Key: "email", Value: channel(strings.Join(addrs, ", "), int32(0))},
			{Key: "webhook", Value: channel("https://example.com/"+secret, int32(0))},
		}}),
	}
	if _, err := coll.InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: oid(t, projectA)}, {Key: "notifications", Value: many}},
		bson.D{{Key: "_id", Value: oid(t, projectB)}, {Key: "notifications", Value: abuse}},
	}); err != nil {
		t.Fatal(err)
	}
	log, logs := newLogger()
	limits := rules.Limits{RulesPerProject: 100, WindowsPerRule: 2, FilterWords: 10, FilterWordBytes: 200,
		FilterBytes: 2000, EmailRecipients: 10}
	cache := store.NewCache(mongoSource(t, uri), store.CacheOptions{Logger: log, Limits: limits})
	if err := cache.Refresh(ctx); err != nil {
		t.Fatal(err)
	}

	a := cache.Rules(projectA)
	if len(a) != 100 || a[0].ID != fmt.Sprintf("64b7f0c2a1b2c3d4e5f7%04x", 0) || a[99].ID != fmt.Sprintf("64b7f0c2a1b2c3d4e5f7%04x", 99) {
		t.Errorf("project A serves %d rules, want its first 100", len(a))
	}
	firstOver := fmt.Sprintf("64b7f0c2a1b2c3d4e5f7%04x", 100)
	if n := logs.count(t, "rule skipped", "project", projectA); n != 1 {
		t.Errorf("%d warnings about project A's rules, want one for the 50 over the limit\n%s", n, logs)
	}
	if n := logs.count(t, "rule skipped", "project", projectA, "rule", firstOver,
		"reason", "over the limit of 100 rules per project: 50 enabled rules skipped, from this one on"); n != 1 {
		t.Errorf("the warning does not name the first rule skipped and how many\n%s", logs)
	}

	b := cache.Rules(projectB)
	if ids := ruleIDs(b); len(ids) != 2 || ids[0] != oid(t, "64b7f0c2a1b2c3d4e5f703e8").Hex() ||
		ids[1] != oid(t, "64b7f0c2a1b2c3d4e5f703ed").Hex() {
		t.Errorf("project B serves %v, want the good rule and the one whose email channel is left out", ids)
	}
	if len(b) == 2 && (len(b[1].Channels) != 1 || b[1].Channels[0].Name != rules.Webhook) {
		t.Errorf("channels of the rule with 2,000 addresses: %+v, want its webhook only", b[1].Channels)
	}
	for id, reason := range map[string]string{
		"64b7f0c2a1b2c3d4e5f703e9": "excluding has 11 words: at most 10",
		"64b7f0c2a1b2c3d4e5f703ea": "including[0] is 201 bytes long: at most 200",
		"64b7f0c2a1b2c3d4e5f703eb": "including and excluding words add up to 2400 bytes: at most 2000",
		"64b7f0c2a1b2c3d4e5f703ec": "3 windows: at most 2",
	} {
		if n := logs.count(t, "rule skipped", "project", projectB, "rule", id, "reason", reason); n != 1 {
			t.Errorf("no warning for rule %s saying %q\n%s", id, reason, logs)
		}
	}
	if n := logs.count(t, "rule warning", "project", projectB, "rule", "64b7f0c2a1b2c3d4e5f703ed",
		"reason", "channel email names 2000 addresses, over the limit of 10: left out"); n != 1 {
		t.Errorf("no warning for the email endpoint of 2,000 addresses\n%s", logs)
	}
	if strings.Contains(logs.String(), "@example.com") || strings.Contains(logs.String(), secret) {
		t.Errorf("an endpoint reached the log:\n%s", logs)
	}
}

// A 3 MB webhook URL made every firing of its rule a 3 MB delivery job,
// past the 2 MiB the broker takes, and loaded without a word. From either
// source, the channel is left out with a warning naming the project, the
// rule, the channel, the length and the limit; the rule's other channel
// still notifies.
func TestOverlongEndpointIsLeftOutAtLoad(t *testing.T) {
	huge := "https://example.com/" + secret + strings.Repeat("a", 3<<20)
	reason := fmt.Sprintf("channel webhook: endpoint is %d bytes long, over the limit of %d: left out", len(huge), rules.MaxURLEndpointBytes)
	check := func(t *testing.T, src store.Source) {
		log, logs := newLogger()
		// Reading a 3 MB document takes the embedded FerretDB seconds on a
		// busy machine: the load's time is not what is tested.
		cache := store.NewCache(src, store.CacheOptions{Logger: log, Timeout: 2 * time.Minute})
		if err := cache.Refresh(t.Context()); err != nil {
			t.Fatal(err)
		}
		rs := cache.Rules(projectA)
		if len(rs) != 1 || len(rs[0].Channels) != 1 || rs[0].Channels[0].Name != rules.Slack {
			t.Fatalf("rules %+v, want the rule with its slack channel alone", rs)
		}
		if n := logs.count(t, "rule warning", "project", projectA, "rule", rs[0].ID, "reason", reason); n != 1 {
			t.Errorf("no warning saying %q\n%.2000s", reason, logs)
		}
		if strings.Contains(logs.String(), secret) {
			t.Errorf("the endpoint reached the log:\n%.2000s", logs)
		}
	}
	t.Run("mongodb", func(t *testing.T) {
		coll, uri := projectsCollection(t)
		if _, err := coll.InsertOne(t.Context(), bson.D{{Key: "_id", Value: oid(t, projectA)}, {Key: "notifications", Value: bson.A{
			bson.D{
				{Key: "_id", Value: oid(t, "64b7f0c2a1b2c3d4e5f70001")},
				{Key: "isEnabled", Value: true},
				{Key: "whatToReceive", Value: "ONLY_NEW"},
				{Key: "channels", Value: bson.D{
					{Key: "webhook", Value: channel(huge, int32(0))},
					{Key: "slack", Value: channel("https://hooks.slack.com/services/T/B/x", int32(0))},
				}},
			},
		}}}); err != nil {
			t.Fatal(err)
		}
		check(t, mongoSource(t, uri))
	})
	t.Run("file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "rules.yaml")
		writeFile(t, path, projectA+`:
  - id: rule-1
    isEnabled: true
    whatToReceive: ONLY_NEW
    channels:
      webhook: {isEnabled: true, endpoint: "`+huge+`"}
      slack: {isEnabled: true, endpoint: "https://hooks.slack.com/services/T/B/x"}
`)
		check(t, store.NewFileSource(path))
	})
}
