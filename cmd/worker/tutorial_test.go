package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/store"
)

// The README's "Your first rule" is what a new user runs first, so it must
// work as written: the rules file it shows, the settings it gives the
// worker and the event it publishes bring the notification it shows to
// the receiver the rules file names.
const (
	readmePath    = "../../README.md"
	firstRulePath = "../../docs/examples/first-rule.yml"
	repoRoot      = "../.."
)

// tutorial is what the README's "Your first rule" tells the reader to do.
type tutorial struct {
	env        map[string]string // the worker's settings, as the README sets them
	routingKey string            // amqp-publish -r
	body       string            // amqp-publish -b
	output     []string          // the lines the README shows the receiver printing
}

// readTutorial finds the steps in the README's "Your first rule" section.
func readTutorial(t *testing.T) tutorial {
	t.Helper()
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	start := strings.Index(section, "\n## Your first rule\n")
	if start < 0 {
		t.Fatal(`README.md has no "## Your first rule" section`)
	}
	section = section[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	tu := tutorial{env: map[string]string{}}
	for _, m := range regexp.MustCompile(`(?m)^(KLAXON_[A-Z_]+)=(\S+)`).FindAllStringSubmatch(section, -1) {
		tu.env[m[1]] = m[2]
	}
	if tu.env[config.EnvRulesFile] == "" {
		t.Fatalf("README's first rule sets no %s for the worker", config.EnvRulesFile)
	}
	pub := regexp.MustCompile(`(?m)^amqp-publish -r (\S+) -b '([^']+)'$`).FindStringSubmatch(section)
	if pub == nil {
		t.Fatal("README's first rule has no `amqp-publish -r QUEUE -b 'BODY'` line")
	}
	tu.routingKey, tu.body = pub[1], pub[2]
	out := regexp.MustCompile("(?s)The receiver prints:\n\n```json\n(.*?)```").FindStringSubmatch(section)
	if out == nil {
		t.Fatal("README's first rule shows no ```json block after \"The receiver prints:\"")
	}
	tu.output = strings.Split(strings.TrimSuffix(out[1], "\n"), "\n")
	return tu
}

// Pages that show an example rules file show it whole, and the tests load
// the file itself: the copy on the page must be the same text.
func TestDocsShowExampleFilesAsTheyAre(t *testing.T) {
	for page, examples := range map[string][]string{
		readmePath:            {firstRulePath},
		"../../docs/rules.md": {"../../docs/examples/database-storm.yml", "../../docs/examples/quiet-hours.yml"},
	} {
		doc, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, example := range examples {
			file, err := os.ReadFile(example)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(doc, []byte("```yaml\n"+string(file)+"```\n")) {
				t.Errorf("%s does not show %s as it is, in a ```yaml block: copy the file into it again", page, example)
			}
		}
	}
	if tu := readTutorial(t); filepath.Clean(filepath.Join(repoRoot, tu.env[config.EnvRulesFile])) != filepath.Clean(firstRulePath) {
		t.Errorf("the README's worker reads %s=%s, not docs/examples/first-rule.yml", config.EnvRulesFile, tu.env[config.EnvRulesFile])
	}
}

// Every example rules file loads as the worker loads it, without a
// warning: an example that only half works teaches the wrong thing. The
// *.test.yml beside them are klaxon rules test's cases, not rules.
func TestExampleRulesLoadWithoutProblems(t *testing.T) {
	cfg, err := config.Load(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("../../docs/examples/*.yml")
	if err != nil || len(files) < 2 {
		t.Fatalf("example rules files: %v %v", files, err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, ".test.yml") {
			continue
		}
		specs, err := store.NewFileSource(f).Load(context.Background())
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		snap := store.CompileWithin(specs, time.Now(), cfg.Limits)
		if p := snap.Problems(); len(p) > 0 {
			t.Errorf("%s: %+v", f, p)
		}
		if len(specs.Projects) == 0 {
			t.Errorf("%s: no project", f)
		}
	}
}

func TestFirstRuleTutorial(t *testing.T) {
	tu := readTutorial(t)
	if want := defaultOf(t, config.EnvQueue); tu.routingKey != want {
		t.Fatalf("the README publishes to %q, but the worker consumes %q", tu.routingKey, want)
	}
	rules, err := os.ReadFile(firstRulePath)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s+endpoint: (\S+)$`).FindSubmatch(rules)
	if m == nil {
		t.Fatalf("%s names no webhook endpoint", firstRulePath)
	}
	endpoint, err := url.Parse(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	received := listenAt(t, endpoint)

	// The harness gives the worker a queue and key prefix of its own; the
	// rest is the README's, and no MongoDB: the rules come from the file.
	h := newHarness(t)
	for k, v := range tu.env {
		h.env[k] = v
	}
	h.env[config.EnvRulesFile] = filepath.Join(repoRoot, tu.env[config.EnvRulesFile])
	h.env[config.EnvMongoURL] = "mongodb://127.0.0.1:1/hawk" // nothing listens there
	h.start()
	h.publish(message{Body: tu.body})

	var body []byte
	select {
	case body = <-received.bodies:
	case <-time.After(30 * time.Second):
		t.Fatalf("no notification at %s within 30 s", endpoint)
	}
	var indented bytes.Buffer
	if err := json.Indent(&indented, body, "", "  "); err != nil {
		t.Fatalf("notification is not JSON: %v: %s", err, body)
	}
	// The receiver prints the body indented: every line the README shows
	// must be there, but the id and the time, which differ from run to run.
	got := strings.Split(indented.String(), "\n")
	for _, line := range tu.output {
		if strings.Contains(line, `"id":`) || strings.Contains(line, `"firedAt":`) {
			continue
		}
		if !slices.Contains(got, line) {
			t.Errorf("the README shows %q, the receiver got:\n%s", line, indented.String())
		}
	}
	if len(got) != len(tu.output) {
		t.Errorf("the README shows %d lines, the receiver printed %d:\n%s", len(tu.output), len(got), indented.String())
	}
	// One event, one notification.
	waitQuiet(t, received.count, 1)
}

// receiver is a webhook receiver at a fixed address.
type receiver struct {
	bodies chan []byte
	mu     sync.Mutex
	n      int
}

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// listenAt serves POSTs to endpoint's path on its host and port, as the
// tutorial's receiver does, until the test ends.
func listenAt(t *testing.T, endpoint *url.URL) *receiver {
	t.Helper()
	l, err := net.Listen("tcp", endpoint.Host)
	if err != nil {
		t.Fatalf("the first rule's receiver address %s: %v (is something else listening there?)", endpoint.Host, err)
	}
	r := &receiver{bodies: make(chan []byte, 8)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil || req.Method != http.MethodPost || req.URL.Path != endpoint.Path {
			t.Errorf("receiver: %s %s (%v)", req.Method, req.URL.Path, err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.n++
		r.mu.Unlock()
		r.bodies <- body
		w.WriteHeader(http.StatusNoContent)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return r
}

func defaultOf(t *testing.T, name string) string {
	t.Helper()
	for _, v := range config.Variables() {
		if v.Name == name {
			return v.Default
		}
	}
	t.Fatalf("config.Variables() has no %s", name)
	return ""
}
