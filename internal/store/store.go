// Package store is where rules come from: a Source reads every project's
// rules as users wrote them (MongoDB in Hawk's schema, or a YAML file),
// Compile turns them into an immutable Snapshot of validated rules, and a
// Cache keeps the latest good Snapshot for the hot path to read without
// locks, refreshing it in the background.
//
// A rule that cannot be read or fails validation is left out with a Problem
// naming its project and rule; the other rules keep working. A load that
// fails as a whole (database down, YAML unparsable) changes nothing: the
// last good Snapshot stays in service.
//
// Channel endpoints are secrets (webhook URLs with tokens, addresses): no
// Problem, error or log line of this package contains one.
package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/klaxonhq/klaxon/internal/quiet"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// Source reads the rules of every project.
type Source interface {
	// Load reads every project's rules. An error means nothing could be read
	// (the store is unreachable, the file is unparsable); a rule or project
	// that alone cannot be read is reported in Specs.Problems instead.
	Load(ctx context.Context) (Specs, error)
}

// Specs is what a Source read: rules as written, before validation.
type Specs struct {
	// Projects maps a project id (24 lower-case hex digits) to its rules,
	// in stored order.
	Projects map[string][]rules.Spec
	// Names maps a project id to the project's name, for messages; a
	// project without one is not in it.
	Names map[string]string
	// Quiet maps a project id to the project's quiet hours (its
	// document's `quiet`, a Klaxon extension), which its rules that set
	// none of their own, and are not critical, take; a project without
	// them is not in it.
	Quiet map[string]ProjectQuiet
	// Problems are projects and rules the source could not read; they are
	// not in Projects.
	Problems []Problem
	// Digest identifies what was read: equal digests, equal rules. A source
	// that finds its content unchanged returns its last Specs as they were,
	// and the cache serves its snapshot as it is. Empty means unknown.
	Digest string
	// Lines, from a file, maps a project id to the line of each of its
	// rules, in stored order, so that a Problem can say where the rule is
	// written; nil when the source has no lines (MongoDB).
	Lines map[string][]int
}

// ProjectQuiet is a project's quiet hours as read.
type ProjectQuiet struct {
	Spec quiet.Spec
	// Err says why the field could not be decoded ("" when it could).
	Err string
}

// Problem is something wrong with one rule, or one project's rules.
type Problem struct {
	ProjectID string
	// RuleID names the rule: its id, or "#3" (its position, from 0) when it
	// has none that can be read; empty when the problem is the project's.
	RuleID string
	// Reason says what is wrong. It never holds a channel endpoint.
	Reason string
	// Line is where the rule (or project) is written in a rules file, from
	// 1; 0 when unknown or not from a file.
	Line int
	// Skipped is true when the rule (or the project's rules) was left out,
	// false for a rule that works but probably not as its author meant.
	Skipped bool
}

func (p Problem) String() string {
	what := "project " + p.ProjectID
	if p.RuleID != "" {
		what += " rule " + p.RuleID
	}
	if p.Line > 0 {
		what += fmt.Sprintf(" (line %d)", p.Line)
	}
	if p.Skipped {
		return what + " skipped: " + p.Reason
	}
	return what + ": " + p.Reason
}

// Snapshot is one load's rules, validated and enabled, by project, each
// project's compiled into one rules.Matcher when loaded, so that matching
// an event costs its title's length whatever the project's words. It never
// changes once made; neither do the rules it holds, which callers must not
// modify.
type Snapshot struct {
	byProject map[string]*rules.Matcher
	problems  []Problem
	count     int
	loadedAt  time.Time
}

// Compile is CompileWithin with the default limits.
func Compile(specs Specs, loadedAt time.Time) *Snapshot {
	return CompileWithin(specs, loadedAt, rules.Limits{})
}

// CompileWithin validates every spec with limits.Compile and returns the
// snapshot of the enabled ones, stamped with loadedAt. Disabled rules are
// left out quietly; a malformed rule, or a second rule with the id of an
// earlier one of the same project, is left out with a Problem; rules.Compile's
// warnings become Problems that do not skip the rule. A project keeps its
// first limits.RulesPerProject enabled rules; the rest are skipped with one
// Problem saying how many, and are not validated (a project of 10,000 rules
// would otherwise cost every load 10,000 compilations and as many log
// lines). Problems come sorted by project, then in stored order, after those
// of specs.
func CompileWithin(specs Specs, loadedAt time.Time, limits rules.Limits) *Snapshot {
	s := &Snapshot{
		byProject: make(map[string]*rules.Matcher, len(specs.Projects)),
		problems:  slices.Clone(specs.Problems),
		loadedAt:  loadedAt,
	}
	maxRules := limits.MaxRules()
	for _, projectID := range sortedKeys(specs.Projects) {
		var compiled []*rules.Rule
		seen := map[string]bool{}
		name := projectName(specs.Names[projectID])
		over, firstOver, overLine := 0, "", 0
		lines := specs.Lines[projectID]
		projectQuiet, quietErr := compileQuiet(specs.Quiet, projectID)
		for i, spec := range specs.Projects[projectID] {
			ruleID := spec.ID
			if ruleID == "" {
				ruleID = fmt.Sprintf("#%d", i)
			}
			line := 0
			if i < len(lines) {
				line = lines[i]
			}
			if len(compiled) == maxRules {
				if spec.IsEnabled {
					if over == 0 {
						firstOver, overLine = ruleID, line
					}
					over++
				}
				continue
			}
			r, warnings, err := limits.Compile(projectID, spec)
			if err != nil {
				s.problems = append(s.problems, Problem{ProjectID: projectID, RuleID: ruleID, Reason: err.Error(), Skipped: true, Line: line})
				continue
			}
			if r == nil {
				continue // disabled
			}
			r.ProjectName = name
			if seen[r.ID] {
				s.problems = append(s.problems, Problem{ProjectID: projectID, RuleID: ruleID,
					Reason: "another rule of the project has this id", Skipped: true, Line: line})
				continue
			}
			if spec.Quiet == nil && !r.Critical && (projectQuiet != nil || quietErr != "") {
				// Malformed like a field of the rule's own: the rule is
				// skipped, critical rules and those with their own quiet
				// hours keep working.
				if quietErr != "" {
					s.problems = append(s.problems, Problem{ProjectID: projectID, RuleID: ruleID,
						Reason: "the project's quiet hours: " + quietErr, Skipped: true, Line: line})
					continue
				}
				r.Quiet = projectQuiet
			}
			seen[r.ID] = true
			for _, w := range warnings {
				s.problems = append(s.problems, Problem{ProjectID: projectID, RuleID: ruleID, Reason: w, Line: line})
			}
			compiled = append(compiled, r)
		}
		if over > 0 {
			s.problems = append(s.problems, Problem{ProjectID: projectID, RuleID: firstOver, Skipped: true, Line: overLine,
				Reason: fmt.Sprintf("over the limit of %d rules per project: %d enabled rules skipped, from this one on", maxRules, over)})
		}
		if len(compiled) > 0 {
			s.byProject[projectID] = rules.NewMatcher(slices.Clip(compiled))
			s.count += len(compiled)
		}
	}
	return s
}

// compileQuiet compiles a project's quiet hours once for all its rules:
// the schedule, nil when the project has none, or why it is malformed.
func compileQuiet(all map[string]ProjectQuiet, projectID string) (*quiet.Schedule, string) {
	pq, ok := all[projectID]
	switch {
	case !ok:
		return nil, ""
	case pq.Err != "":
		return nil, pq.Err
	}
	sc, err := quiet.Compile(pq.Spec)
	if err != nil {
		return nil, err.Error()
	}
	return sc, ""
}

// Ready is true: a snapshot is rules that were loaded.
func (s *Snapshot) Ready() bool { return true }

// Rules returns the enabled rules of the project, in stored order, or nil.
// The project id is matched case-insensitively. A nil Snapshot has no rules.
func (s *Snapshot) Rules(projectID string) []*rules.Rule {
	return s.Matcher(projectID).Rules()
}

// Matcher returns the matcher of the project's enabled rules, or nil (no
// rules). The project id is matched case-insensitively.
func (s *Snapshot) Matcher(projectID string) *rules.Matcher {
	if s == nil {
		return nil
	}
	return s.byProject[strings.ToLower(projectID)] // no allocation when already lower-case
}

// Projects is the number of projects with at least one enabled rule.
func (s *Snapshot) Projects() int {
	if s == nil {
		return 0
	}
	return len(s.byProject)
}

// Len is the number of enabled rules of all projects.
func (s *Snapshot) Len() int {
	if s == nil {
		return 0
	}
	return s.count
}

// Problems returns what was wrong with the rules of this load. The caller
// must not modify the slice.
func (s *Snapshot) Problems() []Problem {
	if s == nil {
		return nil
	}
	return s.problems
}

// Skipped is the number of rules (and projects) left out by Problems.
func (s *Snapshot) Skipped() int {
	n := 0
	for _, p := range s.Problems() {
		if p.Skipped {
			n++
		}
	}
	return n
}

// LoadedAt is when the rules were read.
func (s *Snapshot) LoadedAt() time.Time {
	if s == nil {
		return time.Time{}
	}
	return s.loadedAt
}

// maxProjectName bounds the project name a message repeats: it is written
// by the project's users.
const maxProjectName = 200

// projectName is name on one line, cut to maxProjectName bytes at a rune
// boundary.
func projectName(name string) string {
	name = strings.Join(strings.Fields(strings.ToValidUTF8(name, "")), " ")
	if len(name) <= maxProjectName {
		return name
	}
	cut := maxProjectName
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut] + "…"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
