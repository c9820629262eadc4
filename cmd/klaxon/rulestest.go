package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/store"
)

const rulesTestUsage = `Usage: klaxon rules test [FILE|DIR...] [--json]

Runs test cases against rules: each case sends events through the rules
with backtest's engine (the worker's decoding, matching, counting and
cooldowns, without Redis or the network), turns the firings into the
messages each channel would get (minPeriod digests included), and compares
them with what the case expects. A case lists every message it expects: one
it does not list fails it, so "expect: []" says nothing is sent.

FILE is a test file (NAME.test.yml); a DIR stands for every *.test.yml in
it; without arguments, those in the current directory. A test file:

  rules: rules.yml            # optional; default NAME.yml beside NAME.test.yml
  project: 5e3eef0679fa3700a0198a49   # optional; the cases' default
  start: 2024-06-01T12:00:00Z # optional; what offsets count from
  cases:
    - name: a storm of database errors
      events:                 # in the order the queue delivers them
        - at: 0s              # an offset from start, or an RFC 3339 time
          title: Database timeout
          group: g1           # groupHash (default "group")
          isNew: false
          user: u1            # event.user.id, for countBy: users
          project: ...        # default the case's, else the file's
          repeat: 100         # this event this many times (default 1)
          every: 1s           # apart (default 0)
      expect:
        - rule: database-storm
          channel: slack      # optional: any channel
          group: g1           # optional: a message naming this group
          at: 1m39s           # optional: sent at this time, or
          between: [0s, 5m]   #   within this range (inclusive)
          count: 1            # messages that match (default 1; 0 = none)
          firings: 1          # optional: firings in each message

Exit status: 0 every case passed, 1 a case failed (each difference is
printed: case, rule, group, channel, time), 2 a file could not be read or is
not a valid test file.

Flags:
`

// defaultTestStart is when a test file's offsets count from if it does
// not say: a fixed time, so a file means the same wherever it runs.
var defaultTestStart = time.Date(2024, 6, 1, 12, 0, 0, 0, time.UTC)

// testFile is a rules test file.
type testFile struct {
	Rules   string     `yaml:"rules"`
	Project string     `yaml:"project"`
	Start   *time.Time `yaml:"start"`
	Cases   []testCase `yaml:"cases"`
}

type testCase struct {
	Name    string       `yaml:"name"`
	Project string       `yaml:"project"`
	Events  []testEvent  `yaml:"events"`
	Expect  []testExpect `yaml:"expect"`
}

type testEvent struct {
	At      when          `yaml:"at"`
	Title   string        `yaml:"title"`
	Group   string        `yaml:"group"`
	IsNew   bool          `yaml:"isNew"`
	User    string        `yaml:"user"`
	Project string        `yaml:"project"`
	Repeat  int           `yaml:"repeat"`
	Every   time.Duration `yaml:"every"`
}

type testExpect struct {
	Rule    string `yaml:"rule"`
	Channel string `yaml:"channel"`
	Group   string `yaml:"group"`
	At      *when  `yaml:"at"`
	Between []when `yaml:"between"`
	Count   *int   `yaml:"count"`
	Firings int    `yaml:"firings"`
}

// when is a time in a test file: an offset from the file's start ("90s")
// or an RFC 3339 time.
type when struct {
	offset time.Duration
	abs    time.Time
}

func (w *when) UnmarshalYAML(n *yaml.Node) error {
	if d, err := time.ParseDuration(n.Value); err == nil {
		w.offset = d
		return nil
	}
	t, err := time.Parse(time.RFC3339Nano, n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is neither an offset (90s, 5m) nor an RFC 3339 time", n.Line, n.Value)
	}
	w.abs = t
	return nil
}

func (w when) at(start time.Time) time.Time {
	if !w.abs.IsZero() {
		return w.abs
	}
	return start.Add(w.offset)
}

// message is one message a channel would get: a firing, or a digest of
// the firings a minPeriod gathered.
type message struct {
	ProjectID string    `json:"projectId"`
	RuleID    string    `json:"ruleId"`
	Channel   string    `json:"channel"`
	Time      time.Time `json:"time"`
	Kind      string    `json:"kind"` // "firing" or "digest"
	Groups    []string  `json:"groups"`
	Firings   int       `json:"firings"`
}

// testFailure is one difference between a case and what was sent.
type testFailure struct {
	Case    string `json:"case"`
	Rule    string `json:"rule"`
	Channel string `json:"channel,omitempty"`
	Group   string `json:"group,omitempty"`
	When    string `json:"when,omitempty"`
	Want    int    `json:"want"` // messages expected; -1 for one not expected
	Got     int    `json:"got"`
	Reason  string `json:"reason"`
}

type caseResult struct {
	File     string        `json:"file"`
	Name     string        `json:"name"`
	Passed   bool          `json:"passed"`
	Messages []message     `json:"messages"`
	Failures []testFailure `json:"failures"`
}

type testReport struct {
	Passed int          `json:"passed"`
	Failed int          `json:"failed"`
	Cases  []caseResult `json:"cases"`
}

func (a *app) rulesTest(ctx context.Context, args []string) int {
	const cmd = "rules test"
	run := a.command(cmd, rulesTestUsage)
	asJSON := run.flags.Bool("json", false, "print the results as one JSON object")
	paths, code, done := run.parseArgs(args)
	if done {
		return code
	}
	cfg, code, done := run.config()
	if done {
		return code
	}
	files, err := testFiles(paths)
	if err != nil {
		return a.fail(cmd, err)
	}
	rep := testReport{Cases: []caseResult{}}
	for _, file := range files {
		results, err := runTestFile(ctx, file, func(ctx context.Context, rulesFile string) (*store.Snapshot, error) {
			snap, _, err := readRules(ctx, cfg, rulesFile)
			if err == nil && snap.Skipped() > 0 {
				fmt.Fprintf(a.stderr, "klaxon rules test: %s: %s skipped as the worker would skip them; see klaxon rules check\n", rulesFile, plural(snap.Skipped(), "rule"))
			}
			return snap, err
		})
		if err != nil {
			return a.fail(cmd, err)
		}
		for _, r := range results {
			if r.Passed {
				rep.Passed++
			} else {
				rep.Failed++
			}
		}
		rep.Cases = append(rep.Cases, results...)
	}
	if *asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return a.fail(cmd, err)
		}
	} else {
		printTestReport(a.stdout, &rep)
	}
	if rep.Failed > 0 {
		return exitProblem
	}
	return exitOK
}

// testFiles expands directories to their *.test.yml files.
func testFiles(paths []string) ([]string, error) {
	if len(paths) == 0 {
		paths = []string{"."}
	}
	var files []string
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !info.IsDir() {
			files = append(files, p)
			continue
		}
		found, err := filepath.Glob(filepath.Join(p, "*.test.yml"))
		if err != nil {
			return nil, err
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("%s: no *.test.yml files", p)
		}
		files = append(files, found...)
	}
	return files, nil
}

// rulesOf is the rules file a test file tests: its "rules", relative to
// it, else NAME.yml beside NAME.test.yml.
func rulesOf(file string, tf *testFile) (string, error) {
	if tf.Rules != "" {
		if filepath.IsAbs(tf.Rules) {
			return tf.Rules, nil
		}
		return filepath.Join(filepath.Dir(file), tf.Rules), nil
	}
	base, ok := strings.CutSuffix(file, ".test.yml")
	if !ok {
		return "", fmt.Errorf("%s: say which rules it tests with \"rules: FILE\" (only NAME.test.yml defaults to NAME.yml)", file)
	}
	return base + ".yml", nil
}

// readTestFile parses a test file, refusing unknown fields so that a
// misspelt expectation is not silently ignored.
func readTestFile(file string) (*testFile, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var tf testFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&tf); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(tf.Cases) == 0 {
		return nil, fmt.Errorf("%s: no cases", file)
	}
	for i, c := range tf.Cases {
		if c.Name == "" {
			return nil, fmt.Errorf("%s: case %d has no name", file, i+1)
		}
		for _, e := range c.Expect {
			if e.Rule == "" {
				return nil, fmt.Errorf("%s: case %q: an expectation without a rule", file, c.Name)
			}
			if e.At != nil && e.Between != nil {
				return nil, fmt.Errorf("%s: case %q, rule %s: at or between, not both", file, c.Name, e.Rule)
			}
			if e.Between != nil && len(e.Between) != 2 {
				return nil, fmt.Errorf("%s: case %q, rule %s: between wants [FROM, TO]", file, c.Name, e.Rule)
			}
		}
	}
	return &tf, nil
}

// runTestFile runs the cases of file against the rules load reads.
func runTestFile(ctx context.Context, file string, load func(context.Context, string) (*store.Snapshot, error)) ([]caseResult, error) {
	tf, err := readTestFile(file)
	if err != nil {
		return nil, err
	}
	rulesFile, err := rulesOf(file, tf)
	if err != nil {
		return nil, err
	}
	snap, err := load(ctx, rulesFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	start := defaultTestStart
	if tf.Start != nil {
		start = *tf.Start
	}
	var results []caseResult
	for ci, c := range tf.Cases {
		lines, err := caseMessages(&c, cmp.Or(c.Project, tf.Project), start, ci)
		if err != nil {
			return nil, fmt.Errorf("%s: case %q: %w", file, c.Name, err)
		}
		// now is after every event, so none is clamped: a test means the
		// same whenever it runs.
		rep, err := replay(ctx, strings.NewReader(lines), snap, nil, time.Now().Add(100*365*24*time.Hour))
		if err != nil {
			return nil, fmt.Errorf("%s: case %q: %w", file, c.Name, err)
		}
		msgs := deliveries(rep.Firings, snap)
		fails := compare(&c, msgs, start)
		results = append(results, caseResult{File: file, Name: c.Name, Passed: len(fails) == 0, Messages: msgs, Failures: fails})
	}
	return results, nil
}

// caseMessages writes a case's events as the queue's NDJSON messages.
func caseMessages(c *testCase, project string, start time.Time, ci int) (string, error) {
	var b strings.Builder
	n := 0
	for i, e := range c.Events {
		p := cmp.Or(e.Project, project)
		if p == "" {
			return "", fmt.Errorf("event %d has no project (set project on it, its case or the file)", i+1)
		}
		for k := range max(e.Repeat, 1) {
			t := e.At.at(start).Add(time.Duration(k) * e.Every)
			ts := float64(t.UnixNano()) / 1e9
			rep := fmt.Sprintf("case%d-%d", ci, n)
			n++
			m := event.Message{ProjectID: p, Event: event.Event{
				Title: e.Title, GroupHash: cmp.Or(e.Group, "group"), IsNew: e.IsNew, RepetitionID: &rep, Timestamp: &ts,
			}}
			if e.User != "" {
				m.Event.User = &event.User{ID: e.User}
			}
			line, err := json.Marshal(m)
			if err != nil {
				return "", err
			}
			b.Write(line)
			b.WriteByte('\n')
		}
	}
	return b.String(), nil
}

// deliveries turns firings into the messages each enabled channel of
// their rule would get, as the deliverer paces them (docs/contract.md
// §5.2): with a minPeriod, the first firing goes at once and starts the
// period; those during it go as one message when it ends, which starts
// the next.
func deliveries(firings []firing, snap *store.Snapshot) []message {
	type key struct{ project, rule, channel string }
	type pace struct {
		last    time.Time
		sent    bool
		pending []firing
	}
	paces := map[key]*pace{}
	var keys []key
	var msgs []message
	send := func(k key, at time.Time, fs []firing) {
		m := message{ProjectID: k.project, RuleID: k.rule, Channel: k.channel, Time: at, Kind: "firing", Firings: len(fs), Groups: []string{}}
		if len(fs) > 1 {
			m.Kind = "digest"
		}
		for _, f := range fs {
			if !slices.Contains(m.Groups, f.GroupHash) {
				m.Groups = append(m.Groups, f.GroupHash)
			}
		}
		msgs = append(msgs, m)
	}
	flush := func(k key, p *pace, mp time.Duration, until time.Time) {
		if len(p.pending) > 0 && !p.last.Add(mp).After(until) {
			p.last = p.last.Add(mp)
			send(k, p.last, p.pending)
			p.pending = nil
		}
	}
	minPeriods := map[key]time.Duration{}
	fs := slices.Clone(firings)
	slices.SortStableFunc(fs, func(a, b firing) int { return a.Time.Compare(b.Time) })
	for _, f := range fs {
		for _, r := range snap.Rules(f.ProjectID) {
			if r.ID != f.RuleID {
				continue
			}
			for _, ch := range r.Channels {
				k := key{f.ProjectID, f.RuleID, ch.Name}
				p := paces[k]
				if p == nil {
					p = &pace{}
					paces[k] = p
					keys = append(keys, k)
					minPeriods[k] = ch.MinPeriod
				}
				flush(k, p, ch.MinPeriod, f.Time)
				if ch.MinPeriod == 0 || len(p.pending) == 0 && (!p.sent || !f.Time.Before(p.last.Add(ch.MinPeriod))) {
					p.last, p.sent = f.Time, true
					send(k, f.Time, []firing{f})
					continue
				}
				p.pending = append(p.pending, f)
			}
		}
	}
	for _, k := range keys {
		p := paces[k]
		if len(p.pending) > 0 {
			flush(k, p, minPeriods[k], p.last.Add(minPeriods[k]))
		}
	}
	slices.SortStableFunc(msgs, func(a, b message) int { return a.Time.Compare(b.Time) })
	return msgs
}

// compare holds a case's expectations to the messages sent: each
// expectation counts the messages it matches; a message no expectation
// matches is one not expected.
func compare(c *testCase, msgs []message, start time.Time) []testFailure {
	fails := []testFailure{}
	claimed := make([]bool, len(msgs))
	for _, e := range c.Expect {
		want := 1
		if e.Count != nil {
			want = *e.Count
		}
		got := 0
		var wrongFirings []string
		for i, m := range msgs {
			if !e.matches(m, start) {
				continue
			}
			claimed[i] = true
			got++
			if e.Firings > 0 && m.Firings != e.Firings {
				wrongFirings = append(wrongFirings, fmt.Sprintf("%d at %s", m.Firings, stamp(m.Time)))
			}
		}
		f := testFailure{Case: c.Name, Rule: e.Rule, Channel: e.Channel, Group: e.Group, When: e.describe(start), Want: want, Got: got}
		switch {
		case got != want:
			f.Reason = fmt.Sprintf("want %s, got %d", plural(want, "message"), got)
			fails = append(fails, f)
		case len(wrongFirings) > 0:
			f.Reason = fmt.Sprintf("want %s in each message, got %s", plural(e.Firings, "firing"), strings.Join(wrongFirings, ", "))
			fails = append(fails, f)
		}
	}
	for i, m := range msgs {
		if claimed[i] {
			continue
		}
		fails = append(fails, testFailure{Case: c.Name, Rule: m.RuleID, Channel: m.Channel, Group: strings.Join(m.Groups, ","),
			When: stamp(m.Time), Want: -1, Got: 1,
			Reason: fmt.Sprintf("not expected: a %s of %s", m.Kind, plural(m.Firings, "firing"))})
	}
	return fails
}

func (e *testExpect) matches(m message, start time.Time) bool {
	if m.RuleID != e.Rule || e.Channel != "" && m.Channel != e.Channel ||
		e.Group != "" && !slices.Contains(m.Groups, e.Group) {
		return false
	}
	switch {
	case e.At != nil:
		return m.Time.Equal(e.At.at(start))
	case e.Between != nil:
		return !m.Time.Before(e.Between[0].at(start)) && !m.Time.After(e.Between[1].at(start))
	}
	return true
}

func (e *testExpect) describe(start time.Time) string {
	switch {
	case e.At != nil:
		return stamp(e.At.at(start))
	case e.Between != nil:
		return stamp(e.Between[0].at(start)) + " to " + stamp(e.Between[1].at(start))
	}
	return ""
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func printTestReport(w io.Writer, rep *testReport) {
	for _, c := range rep.Cases {
		if c.Passed {
			fmt.Fprintf(w, "ok    %s: %s\n", c.File, c.Name)
			continue
		}
		fmt.Fprintf(w, "FAIL  %s: %s\n", c.File, c.Name)
		for _, f := range c.Failures {
			sign := "-"
			if f.Want < 0 {
				sign = "+"
			}
			where := "rule " + f.Rule
			if f.Channel != "" {
				where += ", channel " + f.Channel
			}
			if f.Group != "" {
				where += ", group " + f.Group
			}
			if f.When != "" {
				where += ", at " + f.When
			}
			fmt.Fprintf(w, "      %s %s: %s\n", sign, where, f.Reason)
		}
		if len(c.Messages) == 0 {
			fmt.Fprintln(w, "      sent: nothing")
		} else {
			fmt.Fprintln(w, "      sent:")
		}
		for _, m := range c.Messages {
			fmt.Fprintf(w, "        %s  rule %s, channel %s, group %s: %s of %s\n", stamp(m.Time), m.RuleID, m.Channel,
				strings.Join(m.Groups, ","), m.Kind, plural(m.Firings, "firing"))
		}
	}
	fmt.Fprintf(w, "\n%d passed, %d failed\n", rep.Passed, rep.Failed)
}
