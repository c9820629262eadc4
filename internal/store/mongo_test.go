package store_test

import (
	"context"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/store"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// secret stands for a channel endpoint's secret part: it must never reach a
// log line or an error.
const secret = "s3cr3t-T0KEN"

// projectsCollection returns the projects collection of a fresh test
// database, and the URL of that database.
func projectsCollection(t *testing.T) (*mongo.Collection, string) {
	t.Helper()
	uri := testenv.Mongo(t)
	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	return client.Database(strings.TrimPrefix(u.Path, "/")).Collection("projects"), uri
}

func mongoSource(t *testing.T, uri string) *store.MongoSource {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	src, err := store.NewMongoSource(uri, strings.TrimPrefix(u.Path, "/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close(context.Background()) })
	return src
}

func oid(t *testing.T, hex string) bson.ObjectID {
	t.Helper()
	id, err := bson.ObjectIDFromHex(hex)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func channel(endpoint string, minPeriod any) bson.D {
	return bson.D{{Key: "isEnabled", Value: true}, {Key: "endpoint", Value: endpoint}, {Key: "minPeriod", Value: minPeriod}}
}

const (
	projectA      = "5e3eef0679fa3700a0198a49"
	projectB      = "5e3eef0679fa3700a0198a4a"
	projectEmpty  = "5e3eef0679fa3700a0198a4b"
	projectNone   = "5e3eef0679fa3700a0198a4c"
	ruleSeenMore  = "64b7f0c2a1b2c3d4e5f60001"
	ruleOnlyNew   = "64b7f0c2a1b2c3d4e5f60002"
	ruleDisabled  = "64b7f0c2a1b2c3d4e5f60003"
	ruleNoEnabled = "64b7f0c2a1b2c3d4e5f60004"
	ruleWindows   = "64b7f0c2a1b2c3d4e5f60005"
	ruleBadType   = "64b7f0c2a1b2c3d4e5f60006"
	ruleBadValue  = "64b7f0c2a1b2c3d4e5f60007"
	ruleGood      = "64b7f0c2a1b2c3d4e5f60008"
	ruleFraction  = "64b7f0c2a1b2c3d4e5f60009"
)

// hawkProjects are project documents as Hawk stores them, numbers in every
// BSON type Hawk's Node.js code may leave behind, fields Klaxon ignores, and
// broken rules among good ones.
func hawkProjects(t *testing.T) []any {
	return []any{
		bson.D{
			{Key: "_id", Value: oid(t, projectA)},
			{Key: "name", Value: "Shop"},
			{Key: "token", Value: "project-integration-" + secret},
			{Key: "notifications", Value: bson.A{
				bson.D{
					{Key: "_id", Value: oid(t, ruleSeenMore)},
					{Key: "uidAdded", Value: oid(t, "64b7f0c2a1b2c3d4e5f6ffff")},
					{Key: "isEnabled", Value: true},
					{Key: "whatToReceive", Value: "SEEN_MORE"},
					{Key: "including", Value: bson.A{"TypeError"}},
					{Key: "excluding", Value: bson.A{}},
					{Key: "threshold", Value: int32(100)},
					{Key: "thresholdPeriod", Value: int64(60000)},
					{Key: "channels", Value: bson.D{
						{Key: "webhook", Value: channel("http://127.0.0.1:8080/hook?k="+secret, float64(0))},
						{Key: "email", Value: bson.D{{Key: "isEnabled", Value: false}, {Key: "endpoint", Value: ""}, {Key: "minPeriod", Value: int32(60)}}},
					}},
				},
				bson.D{
					{Key: "_id", Value: oid(t, ruleOnlyNew)},
					{Key: "isEnabled", Value: true},
					{Key: "whatToReceive", Value: "ONLY_NEW"},
					{Key: "including", Value: nil},
					{Key: "threshold", Value: nil},
					{Key: "thresholdPeriod", Value: float64(3600000)},
					{Key: "channels", Value: bson.D{
						{Key: "telegram", Value: channel("-100123"+secret, int64(60))},
						{Key: "slack", Value: channel("https://hooks.slack.com/services/"+secret, int32(0))},
					}},
				},
				bson.D{
					{Key: "_id", Value: oid(t, ruleDisabled)},
					{Key: "isEnabled", Value: false},
					{Key: "whatToReceive", Value: "SEEN_MORE"},
					{Key: "threshold", Value: int32(0)}, // invalid, but disabled: quietly ignored
				},
				bson.D{
					{Key: "_id", Value: oid(t, ruleNoEnabled)},
					{Key: "whatToReceive", Value: "ONLY_NEW"},
					{Key: "channels", Value: bson.D{{Key: "webhook", Value: channel("http://x/"+secret, int32(0))}}},
				},
			}},
		},
		bson.D{
			{Key: "_id", Value: oid(t, projectB)},
			{Key: "notifications", Value: bson.A{
				bson.D{
					{Key: "_id", Value: oid(t, ruleBadType)},
					{Key: "isEnabled", Value: true},
					{Key: "whatToReceive", Value: "SEEN_MORE"},
					{Key: "threshold", Value: "ten"},
					{Key: "thresholdPeriod", Value: int32(60000)},
					{Key: "channels", Value: bson.D{{Key: "webhook", Value: channel("http://x/"+secret, int32(0))}}},
				},
				bson.D{
					{Key: "_id", Value: oid(t, ruleBadValue)},
					{Key: "isEnabled", Value: true},
					{Key: "whatToReceive", Value: "SEEN_MORE"},
					{Key: "threshold", Value: int32(5)},
					{Key: "thresholdPeriod", Value: int32(10)}, // < 1000 ms
					{Key: "channels", Value: bson.D{{Key: "webhook", Value: channel("http://x/"+secret, int32(0))}}},
				},
				int32(42), // not a document
				bson.D{
					{Key: "_id", Value: oid(t, ruleFraction)},
					{Key: "isEnabled", Value: true},
					{Key: "whatToReceive", Value: "SEEN_MORE"},
					{Key: "threshold", Value: 2.5},
					{Key: "thresholdPeriod", Value: int32(60000)},
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
					{Key: "stormOver", Value: false},
					{Key: "channels", Value: bson.D{{Key: "webhook", Value: channel("http://x/"+secret, int32(30))}}},
				},
				bson.D{
					{Key: "_id", Value: oid(t, ruleGood)},
					{Key: "isEnabled", Value: true},
					{Key: "whatToReceive", Value: "ONLY_NEW"},
					{Key: "channels", Value: bson.D{{Key: "email", Value: channel("ops@example.com", int32(0))}}},
				},
			}},
		},
		bson.D{{Key: "_id", Value: oid(t, projectEmpty)}, {Key: "notifications", Value: bson.A{}}},
		bson.D{{Key: "_id", Value: oid(t, projectNone)}, {Key: "name", Value: "No rules"}},
	}
}

func TestMongoSourceHawkDocuments(t *testing.T) {
	coll, uri := projectsCollection(t)
	ctx := t.Context()
	if _, err := coll.InsertMany(ctx, hawkProjects(t)); err != nil {
		t.Fatal(err)
	}
	src := mongoSource(t, uri)
	if err := src.Ping(ctx); err != nil {
		t.Fatal(err)
	}

	specs, err := src.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(func(yield func(string) bool) {
		for k := range specs.Projects {
			if !yield(k) {
				return
			}
		}
	}); !slices.Equal(got, []string{projectA, projectB}) {
		t.Errorf("loaded projects %v, want only those with notifications: %v", got, []string{projectA, projectB})
	}

	log, logs := newLogger()
	cache := store.NewCache(src, store.CacheOptions{Logger: log})
	if cache.Ready() {
		t.Fatal("ready before any load")
	}
	if err := cache.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if !cache.Ready() {
		t.Fatal("not ready after a good load")
	}

	a := cache.Rules(projectA)
	if ids := ruleIDs(a); !slices.Equal(ids, []string{ruleSeenMore, ruleOnlyNew}) {
		t.Fatalf("project A rules %v, want the two enabled ones", ids)
	}
	seen := a[0]
	if seen.OnlyNew || len(seen.Windows) != 1 || seen.Windows[0] != (rules.Window{Threshold: 100, Period: time.Minute}) {
		t.Errorf("SEEN_MORE rule: onlyNew %v windows %+v", seen.OnlyNew, seen.Windows)
	}
	if len(seen.Channels) != 1 || seen.Channels[0].Name != rules.Webhook || seen.Channels[0].MinPeriod != 0 {
		t.Errorf("SEEN_MORE rule channels %+v", seen.Channels)
	}
	if !seen.Matches("TypeError: x", false) || seen.Matches("RangeError", false) {
		t.Error("including filter not applied")
	}
	only := a[1]
	if !only.OnlyNew || len(only.Channels) != 2 ||
		only.Channels[0].Name != rules.Telegram || only.Channels[0].MinPeriod != time.Minute ||
		only.Channels[1].Name != rules.Slack {
		t.Errorf("ONLY_NEW rule: %+v", only)
	}
	if got := cache.Rules(strings.ToUpper(projectA)); len(got) != 2 {
		t.Errorf("upper-case project id: %d rules, want 2", len(got))
	}

	b := cache.Rules(projectB)
	if ids := ruleIDs(b); !slices.Equal(ids, []string{ruleWindows, ruleGood}) {
		t.Fatalf("project B rules %v, want the two good ones", ids)
	}
	w := b[0]
	wantWindows := []rules.Window{{Threshold: 20, Period: time.Minute}, {Threshold: 5, Period: 3 * time.Second}}
	if !slices.Equal(w.Windows, wantWindows) || !w.Users || w.Cooldown != 2*time.Minute || w.Channels[0].MinPeriod != 30*time.Second ||
		w.StormOver != rules.No {
		t.Errorf("windows rule: %+v", w)
	}
	for _, p := range []string{projectEmpty, projectNone, "000000000000000000000000"} {
		if got := cache.Rules(p); got != nil {
			t.Errorf("project %s: %d rules, want none", p, len(got))
		}
	}

	for _, rule := range []string{ruleBadType, ruleBadValue, "#2", ruleFraction} {
		if n := logs.count(t, "rule skipped", "project", projectB, "rule", rule); n != 1 {
			t.Errorf("warnings naming project B rule %s: %d, want 1\n%s", rule, n, logs)
		}
	}
	if n := logs.count(t, "rule skipped"); n != 4 {
		t.Errorf("%d rules skipped, want 4\n%s", n, logs)
	}
	if got := cache.Snapshot().Skipped(); got != 4 {
		t.Errorf("snapshot counts %d skipped, want 4", got)
	}
	if n := logs.count(t, "rule warning", "project", projectB, "rule", ruleGood); n != 0 {
		t.Errorf("a good rule was warned about\n%s", logs)
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("a secret reached the log:\n%s", logs)
	}
	if got := cache.Snapshot().Len(); got != 4 {
		t.Errorf("snapshot holds %d rules, want 4", got)
	}
}

func ruleIDs(rs []*rules.Rule) []string {
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
	}
	return ids
}

func TestMongoSourceRuleEditAfterRefresh(t *testing.T) {
	coll, uri := projectsCollection(t)
	ctx := t.Context()
	project := func(threshold any, enabled bool) bson.D {
		return bson.D{
			{Key: "_id", Value: oid(t, projectA)},
			{Key: "notifications", Value: bson.A{bson.D{
				{Key: "_id", Value: oid(t, ruleSeenMore)},
				{Key: "isEnabled", Value: enabled},
				{Key: "whatToReceive", Value: "SEEN_MORE"},
				{Key: "threshold", Value: threshold},
				{Key: "thresholdPeriod", Value: int32(60000)},
				{Key: "channels", Value: bson.D{{Key: "webhook", Value: channel("http://x/", int32(0))}}},
			}}},
		}
	}
	if _, err := coll.InsertOne(ctx, project(int32(10), true)); err != nil {
		t.Fatal(err)
	}
	cache := store.NewCache(mongoSource(t, uri), store.CacheOptions{})
	threshold := func() int64 {
		t.Helper()
		if err := cache.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		rs := cache.Rules(projectA)
		if len(rs) == 0 {
			return 0
		}
		return rs[0].Windows[0].Threshold
	}
	if got := threshold(); got != 10 {
		t.Fatalf("threshold %d, want 10", got)
	}
	before := cache.Rules(projectA)
	unchanged := cache.Snapshot()
	if threshold(); cache.Snapshot() != unchanged {
		t.Error("unchanged documents were compiled again")
	}

	if _, err := coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: oid(t, projectA)}}, project(int64(25), true)); err != nil {
		t.Fatal(err)
	}
	if got := threshold(); got != 25 {
		t.Fatalf("after the edit: threshold %d, want 25", got)
	}
	if before[0].Windows[0].Threshold != 10 {
		t.Error("a refresh changed a rule of the previous snapshot")
	}

	if _, err := coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: oid(t, projectA)}}, project(int64(25), false)); err != nil {
		t.Fatal(err)
	}
	if got := threshold(); got != 0 {
		t.Fatalf("after disabling: still served with threshold %d", got)
	}
}

func TestMongoSourceUnreachable(t *testing.T) {
	t.Run("never reached", func(t *testing.T) {
		src := mongoSource(t, "mongodb://"+closedAddr(t)+"/hawk")
		if src.Database() != "hawk" {
			t.Errorf("database %q, want hawk", src.Database())
		}
		var results []store.LoadResult
		cache := store.NewCache(src, store.CacheOptions{
			Timeout: 500 * time.Millisecond,
			OnLoad:  func(r store.LoadResult) { results = append(results, r) },
		})
		err := cache.Refresh(t.Context())
		if err == nil {
			t.Fatal("Refresh succeeded with MongoDB unreachable")
		}
		if cache.Ready() || cache.Rules(projectA) != nil {
			t.Error("ready without a good load")
		}
		if len(results) != 1 || results[0].Err == nil || results[0].Served != nil {
			t.Errorf("OnLoad got %+v, want one failure serving nothing", results)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		if err := src.Ping(ctx); err == nil {
			t.Error("Ping succeeded with MongoDB unreachable")
		}
	})

	t.Run("goes away and comes back", func(t *testing.T) {
		coll, uri := projectsCollection(t)
		if _, err := coll.InsertMany(t.Context(), hawkProjects(t)); err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(uri)
		if err != nil {
			t.Fatal(err)
		}
		p := startProxy(t, u.Host)
		u.Host = p.addr
		log, logs := newLogger()
		var mu = make(chan struct{}, 1)
		var failures, successes int
		cache := store.NewCache(mongoSource(t, u.String()), store.CacheOptions{
			Interval: 20 * time.Millisecond,
			Timeout:  300 * time.Millisecond,
			Logger:   log,
			OnLoad: func(r store.LoadResult) {
				mu <- struct{}{}
				defer func() { <-mu }()
				if r.Err != nil {
					failures++
					if r.Served.Len() != 4 {
						t.Errorf("failed load reports serving %d rules, want the last good 4", r.Served.Len())
					}
				} else {
					successes++
				}
			},
		})
		counts := func() (int, int) {
			mu <- struct{}{}
			defer func() { <-mu }()
			return failures, successes
		}
		if err := cache.Refresh(t.Context()); err != nil {
			t.Fatal(err)
		}
		warnings := logs.count(t, "rule skipped")

		p.stop()
		if err := cache.Refresh(t.Context()); err == nil {
			t.Fatal("Refresh succeeded with MongoDB gone")
		}
		if got := len(cache.Rules(projectA)); got != 2 || !cache.Ready() {
			t.Fatalf("after a failed load: %d rules of project A, ready %v; want the last good 2", got, cache.Ready())
		}

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- cache.Run(ctx) }()
		testenv.WaitFor(t, 10*time.Second, "four failed loads", func() bool { f, _ := counts(); return f >= 4 })
		if n := logs.count(t, "rules load failed; serving the last good rules"); n != 1 {
			t.Errorf("the same failure was logged %d times, want once\n%s", n, logs)
		}
		if got := len(cache.Rules(projectB)); got != 2 {
			t.Errorf("while MongoDB is gone: %d rules of project B, want the last good 2", got)
		}

		p.start()
		testenv.WaitFor(t, 15*time.Second, "a good load after MongoDB came back", func() bool { _, s := counts(); return s >= 2 })
		testenv.WaitFor(t, time.Second, "recovery logged", func() bool { return logs.count(t, "rules load recovered") == 1 })
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v", err)
		}
		if n := logs.count(t, "rule skipped"); n != warnings {
			t.Errorf("rule warnings logged again after recovery: %d, want %d", n, warnings)
		}
	})
}

// The rule hawk.api's createProject adds to every project, as its Node.js
// driver stores it (numbers as int32, uidAdded, autoAdded, disabled channels
// Klaxon does not have), loads without a warning; a rule saved by an older
// hawk.api with telegram enabled but empty keeps its email channel.
func TestMongoSourceHawkDefaultRule(t *testing.T) {
	coll, uri := projectsCollection(t)
	ctx := t.Context()
	off := func() bson.D {
		return bson.D{{Key: "isEnabled", Value: false}, {Key: "endpoint", Value: ""}, {Key: "minPeriod", Value: int32(60)}}
	}
	email := bson.D{{Key: "isEnabled", Value: true}, {Key: "endpoint", Value: "owner@example.com"}, {Key: "minPeriod", Value: int32(60)}}
	doc := bson.D{
		{Key: "_id", Value: oid(t, projectA)},
		{Key: "notifications", Value: bson.A{
			bson.D{
				{Key: "_id", Value: oid(t, ruleSeenMore)},
				{Key: "uidAdded", Value: oid(t, "64b7f0c2a1b2c3d4e5f6ffff")},
				{Key: "isEnabled", Value: true},
				{Key: "whatToReceive", Value: "SEEN_MORE"},
				{Key: "channels", Value: bson.D{
					{Key: "email", Value: email},
					{Key: "telegram", Value: off()},
					{Key: "slack", Value: off()},
					{Key: "loop", Value: off()},
				}},
				{Key: "including", Value: bson.A{}},
				{Key: "excluding", Value: bson.A{}},
				{Key: "autoAdded", Value: "$$NOW"},
				{Key: "threshold", Value: int32(20)},
				{Key: "thresholdPeriod", Value: int32(3600000)},
			},
			bson.D{
				{Key: "_id", Value: oid(t, ruleOnlyNew)},
				{Key: "uidAdded", Value: oid(t, "64b7f0c2a1b2c3d4e5f6ffff")},
				{Key: "isEnabled", Value: true},
				{Key: "whatToReceive", Value: "ONLY_NEW"},
				{Key: "channels", Value: bson.D{
					{Key: "email", Value: email},
					{Key: "telegram", Value: bson.D{{Key: "isEnabled", Value: true}, {Key: "endpoint", Value: ""}, {Key: "minPeriod", Value: int32(60)}}},
					{Key: "slack", Value: off()},
				}},
				{Key: "including", Value: bson.A{}},
				{Key: "excluding", Value: bson.A{}},
			},
		}},
	}
	if _, err := coll.InsertOne(ctx, doc); err != nil {
		t.Fatal(err)
	}
	log, logs := newLogger()
	cache := store.NewCache(mongoSource(t, uri), store.CacheOptions{Logger: log})
	if err := cache.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	rs := cache.Rules(projectA)
	if ids := ruleIDs(rs); !slices.Equal(ids, []string{ruleSeenMore, ruleOnlyNew}) {
		t.Fatalf("rules %v, want both\n%s", ids, logs)
	}
	for _, r := range rs {
		if len(r.Channels) != 1 || r.Channels[0].Name != rules.Email || r.Channels[0].MinPeriod != time.Minute {
			t.Errorf("rule %s channels %+v, want email every minute", r.ID, r.Channels)
		}
	}
	if rs[0].Windows[0] != (rules.Window{Threshold: 20, Period: time.Hour}) {
		t.Errorf("default rule windows %+v, want 20 per hour", rs[0].Windows)
	}
	if n := logs.count(t, "rule warning", "project", projectA, "rule", ruleSeenMore); n != 0 {
		t.Errorf("Hawk's default rule was warned about\n%s", logs)
	}
	if n := logs.count(t, "rule warning", "project", projectA, "rule", ruleOnlyNew); n != 1 {
		t.Errorf("%d warnings about the empty telegram channel, want 1\n%s", n, logs)
	}
}
