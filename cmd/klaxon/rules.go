package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"time"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/store"
)

// ruleSource is where a command reads rules: file when given, else
// KLAXON_RULES_FILE, else MongoDB at KLAXON_MONGO_URL, as the worker does.
// name says which, without credentials; close releases it.
func ruleSource(cfg config.Config, file string) (src store.Source, name string, close func(), err error) {
	if file == "" {
		file = cfg.RulesFile
	}
	if file != "" {
		return store.NewFileSource(file), file, func() {}, nil
	}
	mongo, err := store.NewMongoSource(cfg.MongoURL, cfg.MongoDatabase)
	if err != nil {
		return nil, "", nil, err
	}
	return mongo, "MongoDB database " + mongo.Database(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		mongo.Close(ctx)
	}, nil
}

// readRules reads and validates the rules of file, else KLAXON_RULES_FILE,
// else MongoDB, as the worker does, and says where they came from.
func readRules(ctx context.Context, cfg config.Config, file string) (*store.Snapshot, string, error) {
	src, name, closeSrc, err := ruleSource(cfg, file)
	if err != nil {
		return nil, "", err
	}
	defer closeSrc()
	snap, err := loadRules(ctx, src, cfg)
	return snap, name, err
}

// loadRules reads and validates the rules of src within the configured
// limits, as the worker's rule cache does.
func loadRules(ctx context.Context, src store.Source, cfg config.Config) (*store.Snapshot, error) {
	snap, _, err := loadSpecs(ctx, src, cfg)
	return snap, err
}

// mongoWithin bounds the wait for MongoDB to answer: a store that is down
// or mistyped is said within 5 s, with what to check.
const mongoWithin = 4500 * time.Millisecond

// loadSpecs is loadRules, with the specs the snapshot was compiled from.
func loadSpecs(ctx context.Context, src store.Source, cfg config.Config) (*store.Snapshot, store.Specs, error) {
	ctx, cancel := context.WithTimeout(ctx, store.DefaultTimeout)
	defer cancel()
	if mongo, ok := src.(*store.MongoSource); ok {
		if err := mongo.Reachable(ctx, mongoWithin); err != nil {
			return nil, store.Specs{}, fmt.Errorf("%w; %s", err, cfg.RulesStoreHint())
		}
	}
	specs, err := src.Load(ctx)
	if err != nil {
		return nil, specs, err
	}
	return store.CompileWithin(specs, time.Now(), cfg.Limits), specs, nil
}

const rulesCheckUsage = `Usage: klaxon rules check [FILE] [--strict] [--json]

Validates rules with the worker's own loader and limits (KLAXON_MAX_*), and
prints every error and warning with its project, rule and, in a file,
line. FILE is a YAML rules file; without it, KLAXON_RULES_FILE, else the
rules in MongoDB at KLAXON_MONGO_URL.

Errors: a rule the worker would skip; a channel it would never deliver on
these settings: an endpoint the endpoint guard refuses (checked without
sending or resolving a name: KLAXON_ALLOW_PRIVATE_NETWORKS,
KLAXON_ALLOW_PORTS, KLAXON_SLACK_HOSTS, ...), a channel not configured here
(email without KLAXON_SMTP_ADDR, a Telegram chat without a token), or an
unknown channel name. Warnings: a rule that works, but probably not as
meant (an unknown field; windows given with threshold/thresholdPeriod,
which they replace). Unknown names come with the likeliest meant one.
Run it with the worker's settings, as the endpoint checks depend on them.

Exit status: 0 no errors (warnings allowed unless --strict), 1 errors (or
warnings under --strict), 2 the rules could not be read at all (missing
file, MongoDB unreachable, invalid settings). A file that cannot be parsed
is an error of the file: 1.

Flags:
`

// checkReport is the --json output of rules check.
type checkReport struct {
	Source   string         `json:"source"`
	Projects int            `json:"projects"` // with at least one enabled rule loaded
	Rules    int            `json:"rules"`    // enabled rules loaded
	Errors   int            `json:"errors"`
	Warnings int            `json:"warnings"`
	Problems []checkProblem `json:"problems"`
}

type checkProblem struct {
	Severity string `json:"severity"` // "error" (skipped) or "warning"
	Project  string `json:"project,omitempty"`
	Rule     string `json:"rule,omitempty"`
	Line     int    `json:"line,omitempty"`
	Reason   string `json:"reason"`
	skipped  bool   // the worker leaves the rule (or project) out
}

func (a *app) rulesCheck(ctx context.Context, args []string) int {
	const cmd = "rules check"
	run := a.command(cmd, rulesCheckUsage)
	strict := run.flags.Bool("strict", false, "fail (exit 1) on warnings too")
	asJSON := run.flags.Bool("json", false, "print the report as one JSON object")
	files, code, done := run.parseArgs(args)
	if done {
		return code
	}
	if len(files) > 1 {
		return a.usageError(cmd, "one FILE at most, got %d", len(files))
	}
	cfg, code, done := run.config()
	if done {
		return code
	}
	file := ""
	if len(files) == 1 {
		file = files[0]
	}
	src, name, closeSrc, err := ruleSource(cfg, file)
	if err != nil {
		return a.fail(cmd, err)
	}
	defer closeSrc()

	report := checkReport{Source: name, Problems: []checkProblem{}}
	snap, specs, err := loadSpecs(ctx, src, cfg)
	var pathErr *fs.PathError
	switch {
	case err != nil && (errors.As(err, &pathErr) || !isFile(src)):
		// Nothing was read: no verdict on the rules.
		return a.fail(cmd, err)
	case err != nil:
		// The file was read and cannot be parsed: the worker keeps its last
		// good rules and would never load these.
		reason := err.Error()
		if data, rerr := os.ReadFile(src.(*store.FileSource).Path()); rerr == nil {
			reason = store.CorrectYAMLLine(reason, data)
		}
		report.Problems = append(report.Problems, checkProblem{Severity: "error", Reason: reason})
	default:
		report.Projects, report.Rules = snap.Projects(), snap.Len()
		for _, p := range snap.Problems() {
			cp := checkProblem{Severity: "warning", Project: p.ProjectID, Rule: p.RuleID, Line: p.Line, Reason: p.Reason}
			if p.Skipped {
				cp.Severity, cp.skipped = "error", true
			}
			report.Problems = append(report.Problems, withSuggestion(cp))
		}
		// What a send would meet on these settings, and what the loader
		// takes silently.
		added := append(deliveryProblems(cfg, snap, specs), windowProblems(specs)...)
		slices.SortFunc(added, func(x, y checkProblem) int {
			return cmp.Or(cmp.Compare(x.Project, y.Project), cmp.Compare(x.Rule, y.Rule), cmp.Compare(x.Reason, y.Reason))
		})
		report.Problems = append(report.Problems, added...)
		// In a file, in the order of the file; problems without a line
		// (a project's) first.
		slices.SortStableFunc(report.Problems, func(x, y checkProblem) int { return cmp.Compare(x.Line, y.Line) })
	}
	for _, p := range report.Problems {
		if p.Severity == "error" {
			report.Errors++
		} else {
			report.Warnings++
		}
	}

	if *asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(report)
	} else {
		printCheck(a, report)
	}
	if report.Errors > 0 || *strict && report.Warnings > 0 {
		return exitProblem
	}
	return exitOK
}

func isFile(src store.Source) bool {
	_, ok := src.(*store.FileSource)
	return ok
}

// printCheck prints a report as a compiler would: one line a problem,
// starting with where it is, then a summary.
func printCheck(a *app, r checkReport) {
	for _, p := range r.Problems {
		where := r.Source
		if p.Line > 0 {
			where += fmt.Sprintf(":%d", p.Line)
		}
		what := ""
		switch {
		case p.Rule != "":
			what = fmt.Sprintf("project %s rule %s: ", p.Project, p.Rule)
		case p.Project != "":
			what = fmt.Sprintf("project %s: ", p.Project)
		}
		suffix := ""
		if p.Severity == "error" && p.Project != "" && p.skipped {
			suffix = " (skipped)"
		}
		fmt.Fprintf(a.stdout, "%s: %s: %s%s%s\n", where, p.Severity, what, p.Reason, suffix)
	}
	fmt.Fprintf(a.stdout, "%s: %s, %s loaded; %s, %s\n", r.Source,
		plural(r.Projects, "project"), plural(r.Rules, "enabled rule"),
		plural(r.Errors, "error"), plural(r.Warnings, "warning"))
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
