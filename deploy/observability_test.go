package deploy_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"gopkg.in/yaml.v3"

	"github.com/klaxonhq/klaxon/internal/metrics"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// labelValues are the values Klaxon gives each label: evaluator.outcomeName,
// the deliverer's outcomes, the worker's dependency checks and stages. A
// dashboard or alert matching any other value would never see a series.
var labelValues = map[string][]string{
	"klaxon_events_total/outcome":        {"counted", "duplicate", "unmatched", "no_rules", "dead"},
	"klaxon_firings_total/type":          {"new", "threshold"},
	"klaxon_rules_starved_total/reason":  {"no_user"},
	"klaxon_notifications_total/outcome": {"sent", "digested", "retried", "throttled", "deferred", "parked", "failed", "duplicate", "omitted", "snoozed"},
	"klaxon_notifications_total/channel": rules.ChannelNames[:],
	"klaxon_batches_total/stage":         {"evaluator", "deliverer"},
	"klaxon_batches_total/outcome":       {"ok", "error"},
	"klaxon_batch_held_seconds/stage":    {"evaluator", "deliverer"},
	"klaxon_rule_loads_total/outcome":    {"ok", "error"},
	"klaxon_storms_total/outcome":        {"started", "over", "dropped", "error"},
	"klaxon_dependency_up/dependency":    {"amqp", "redis", "rules"},
}

// scrapeLabels registers Klaxon's metrics as the worker does, makes one
// series of each, scrapes /metrics, and returns every series name (with
// the _bucket, _sum and _count of histograms) and its label names. Labels
// Prometheus adds at scrape time (job, instance) are allowed everywhere.
func scrapeLabels(t *testing.T) map[string]map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	// A vector exports nothing until it has a child: make one of each,
	// with as many values as it has labels.
	v := reflect.ValueOf(m).Elem()
	for i := range v.NumField() {
		with := v.Field(i).MethodByName("WithLabelValues")
		if !with.IsValid() {
			continue
		}
		for n := 0; n <= 4; n++ { // the label count is found by trying
			args := make([]reflect.Value, n)
			for k := range args {
				args[k] = reflect.ValueOf("x")
			}
			if tryCall(with, args) {
				break
			}
		}
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	series := map[string]map[string]bool{}
	labelName := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, labels, _ := strings.Cut(strings.Fields(line)[0], "{")
		if series[name] == nil {
			series[name] = map[string]bool{"job": true, "instance": true}
		}
		for _, l := range labelName.FindAllStringSubmatch(labels, -1) {
			series[name][l[1]] = true
		}
	}
	return series
}

func tryCall(f reflect.Value, args []reflect.Value) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	f.Call(args)
	return true
}

var (
	metricRef  = regexp.MustCompile(`\b(klaxon_[a-z_]+)\b(\{[^}]*\})?`)
	matcher    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	grouping   = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	labelsUsed = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
)

// checkExpr checks that every Klaxon metric expr names is one the worker
// exports, and every label it matches or groups by is one of that metric,
// with a value Klaxon gives it. It returns the labels the result keeps.
func checkExpr(t *testing.T, where, expr string, series map[string]map[string]bool) []string {
	t.Helper()
	refs := metricRef.FindAllStringSubmatch(expr, -1)
	if len(refs) == 0 {
		t.Errorf("%s: %q uses no Klaxon metric", where, expr)
	}
	known := map[string]bool{"le": true}
	for _, ref := range refs {
		name, labels := ref[1], series[ref[1]]
		if labels == nil {
			t.Errorf("%s: metric %s is not exported (expr %q)", where, name, expr)
			continue
		}
		for l := range labels {
			known[l] = true
		}
		for _, mt := range matcher.FindAllStringSubmatch(ref[2], -1) {
			label, op, value := mt[1], mt[2], mt[3]
			if !labels[label] {
				t.Errorf("%s: %s has no label %q", where, name, label)
				continue
			}
			allowed, ok := labelValues[strings.TrimSuffix(name, "_bucket")+"/"+label]
			if !ok || strings.HasPrefix(value, "$") || op == "=~" || op == "!~" {
				continue // free values (queue names), or a dashboard variable
			}
			if !slices.Contains(allowed, value) {
				t.Errorf("%s: %s{%s=%q}: Klaxon gives %s only %v", where, name, label, value, label, allowed)
			}
		}
	}
	var kept []string
	for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
		for l := range strings.SplitSeq(g[1], ",") {
			l = strings.TrimSpace(l)
			if !known[l] {
				t.Errorf("%s: groups by %q, which no metric of %q has", where, l, expr)
			}
			kept = append(kept, l)
		}
	}
	return kept
}

// TestDashboardUsesExportedMetrics: every query of deploy/grafana/klaxon.json
// names metrics, labels and values the worker exports, and the file is a
// dashboard Grafana imports (uid, title, panels with Prometheus targets,
// the datasource as an input).
func TestDashboardUsesExportedMetrics(t *testing.T) {
	series := scrapeLabels(t)
	raw, err := os.ReadFile("grafana/klaxon.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID, Title string
		Inputs     []struct{ Name, PluginID string } `json:"__inputs"`
		Templating struct {
			List []struct {
				Name  string
				Query struct{ Query string }
			}
		}
		Panels []struct {
			ID      int
			Type    string
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("klaxon.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" || len(dash.Inputs) != 1 || dash.Inputs[0].PluginID != "prometheus" {
		t.Errorf("not an importable dashboard: uid %q, title %q, inputs %+v", dash.UID, dash.Title, dash.Inputs)
	}
	// What the issue asks the dashboard to show, by the metric that shows it.
	want := map[string]bool{"klaxon_events_total": false, "klaxon_firings_total": false, "klaxon_notifications_total": false,
		"klaxon_delivery_latency_seconds_bucket": false, "klaxon_event_lag_seconds_bucket": false,
		"klaxon_queue_messages": false, "klaxon_dependency_up": false}
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			checkExpr(t, "panel "+p.Title, target.Expr, series)
			for _, ref := range metricRef.FindAllStringSubmatch(target.Expr, -1) {
				if _, ok := want[ref[1]]; ok {
					want[ref[1]] = true
				}
			}
		}
	}
	for _, v := range dash.Templating.List {
		checkExpr(t, "variable "+v.Name, v.Query.Query, series)
	}
	for name, shown := range want {
		if !shown {
			t.Errorf("no panel shows %s", name)
		}
	}
}

// TestAlertRulesUseExportedMetrics: every alert of
// deploy/prometheus/klaxon-rules.yml queries metrics, labels and values the
// worker exports, and its annotations name only labels its result keeps.
// When promtool is installed, it must accept the file too.
func TestAlertRulesUseExportedMetrics(t *testing.T) {
	series := scrapeLabels(t)
	const file = "prometheus/klaxon-rules.yml"
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert       string
				Expr        string
				For         string
				Labels      map[string]string
				Annotations map[string]string
			}
		}
	}
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	alerts := map[string]bool{}
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || alerts[r.Alert] {
				t.Errorf("alert %q: empty or twice", r.Alert)
			}
			alerts[r.Alert] = true
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s needs a severity, a summary and a description", r.Alert)
			}
			kept := checkExpr(t, "alert "+r.Alert, r.Expr, series)
			for _, text := range r.Annotations {
				for _, l := range labelsUsed.FindAllStringSubmatch(text, -1) {
					if !slices.Contains(kept, l[1]) {
						t.Errorf("alert %s: annotation uses $labels.%s, which %q does not keep", r.Alert, l[1], r.Expr)
					}
				}
			}
		}
	}
	// What the issue asks to be alerted on.
	for _, name := range []string{"KlaxonNotificationsFailing", "KlaxonEventLagGrowing", "KlaxonBacklogGrowing",
		"KlaxonDeadLetters", "KlaxonDependencyDown", "KlaxonNoEvents"} {
		if !alerts[name] {
			t.Errorf("no alert %s", name)
		}
	}
	if promtool, err := exec.LookPath("promtool"); err == nil {
		if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
			t.Errorf("promtool check rules: %v\n%s", err, out)
		}
	} else {
		t.Log("promtool is not installed: the rules' PromQL is checked by the tests above only")
	}
}
