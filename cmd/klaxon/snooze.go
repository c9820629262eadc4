package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/klaxonhq/klaxon/internal/snooze"
)

const snoozeUsage = `Usage:
  klaxon snooze --project P --rule R [--group G] (--for D | --until TIME) [--no-summary] [--rules FILE] [--json]
  klaxon snooze list [--project P] [--json]
  klaxon snooze remove --project P --rule R [--group G]

Snoozes rule R of project P (or only group G of it): its events are still
counted and its firings recorded, but no message is sent until the snooze
ends. Then one summary message per channel lists what was held back
(--no-summary: none). Every worker reads snoozes from Redis at each
delivery, so a snooze holds everywhere at once. Snoozing a rule or group
already snoozed changes when that snooze ends; it stays one snooze, with
one summary.

--for takes a Go duration (90m, 2h); --until an RFC 3339 time
(2026-12-01T18:00:00Z). "remove" ends a snooze now; its summary follows
within about a minute. "list" shows the snoozes still running.

The rule is looked up (--rules FILE, else KLAXON_RULES_FILE, else MongoDB)
so that a typo does not snooze nothing; Redis and KLAXON_PREFIX are the
worker's.

Exit status: 0 done, 1 remove found no such snooze, 2 the command could
not run.

Flags:
`

func (a *app) snooze(ctx context.Context, args []string) int {
	if len(args) > 0 {
		switch args[0] {
		case "list":
			return a.snoozeList(ctx, args[1:])
		case "remove":
			return a.snoozeRemove(ctx, args[1:])
		}
	}
	const cmd = "snooze"
	run := a.command(cmd, snoozeUsage).withRedis()
	defer run.close()
	project := run.flags.String("project", "", "project id (required)")
	ruleID := run.flags.String("rule", "", "rule id (required)")
	group := run.flags.String("group", "", "snooze this group (groupHash) of the rule only")
	forD := run.flags.Duration("for", 0, "how long, e.g. 2h")
	until := run.flags.String("until", "", "until when, RFC 3339, e.g. 2026-12-01T18:00:00Z")
	noSummary := run.flags.Bool("no-summary", false, "send no summary of what was held back when the snooze ends")
	rulesFile := run.flags.String("rules", "", "YAML rules file [KLAXON_RULES_FILE, else MongoDB]")
	asJSON := run.flags.Bool("json", false, "print the snooze as JSON")
	rest, code, done := run.parseArgs(args)
	if done {
		return code
	}
	now := time.Now()
	var end time.Time
	switch {
	case len(rest) > 0:
		return a.usageError(cmd, "unexpected argument %q (subcommands: list, remove)", rest[0])
	case *project == "" || *ruleID == "":
		return a.usageError(cmd, "--project and --rule are required")
	case (*forD != 0) == (*until != ""):
		return a.usageError(cmd, "give one of --for and --until")
	case *forD < 0:
		return a.usageError(cmd, "--for %s: must be positive", *forD)
	case *forD > 0:
		end = now.Add(*forD)
	default:
		t, err := time.Parse(time.RFC3339, *until)
		if err != nil {
			return a.usageError(cmd, "--until %q: want an RFC 3339 time such as 2026-12-01T18:00:00Z", *until)
		}
		if !t.After(now) {
			return a.usageError(cmd, "--until %s is not in the future", *until)
		}
		end = t
	}
	cfg, rule, code, done := run.rule(ctx, *rulesFile, *project, *ruleID)
	if done {
		return code
	}
	sn, err := snooze.New(run.rdb, cfg.Prefix).Set(ctx, snooze.Snooze{ProjectID: rule.ProjectID, RuleID: rule.ID,
		GroupHash: *group, Until: end, Summary: !*noSummary}, now)
	if err != nil {
		return a.fail(cmd, err)
	}
	if *asJSON {
		json.NewEncoder(a.stdout).Encode(sn)
		return exitOK
	}
	summary := "a summary of what it held back follows"
	if !sn.Summary {
		summary = "no summary follows"
	}
	fmt.Fprintf(a.stdout, "snoozed rule %s of project %s%s until %s (%s); %s\n", sn.RuleID, sn.ProjectID,
		snoozeScope(sn), sn.Until.Format(time.RFC3339), sn.Until.Sub(now).Round(time.Second), summary)
	return exitOK
}

func (a *app) snoozeList(ctx context.Context, args []string) int {
	const cmd = "snooze list"
	run := a.command(cmd, snoozeUsage).withRedis()
	defer run.close()
	project := run.flags.String("project", "", "this project's snoozes only")
	asJSON := run.flags.Bool("json", false, "print the snoozes as a JSON array")
	if code, done := run.parse(args); done {
		return code
	}
	cfg, code, done := run.config()
	if done {
		return code
	}
	all, err := snooze.New(run.rdb, cfg.Prefix).List(ctx, *project)
	if err != nil {
		return a.fail(cmd, err)
	}
	now := time.Now()
	running := []snooze.Snooze{}
	for _, s := range all {
		if s.Until.After(now) {
			running = append(running, s)
		}
	}
	if *asJSON {
		json.NewEncoder(a.stdout).Encode(running)
		return exitOK
	}
	if len(running) == 0 {
		fmt.Fprintln(a.stdout, "no snoozes")
		return exitOK
	}
	fmt.Fprintf(a.stdout, "%-24s  %-16s  %-16s  %-20s  %-9s  %s\n", "PROJECT", "RULE", "GROUP", "UNTIL", "LEFT", "SUMMARY")
	for _, s := range running {
		group := s.GroupHash
		if group == "" {
			group = "(all)"
		}
		summary := "yes"
		if !s.Summary {
			summary = "no"
		}
		fmt.Fprintf(a.stdout, "%-24s  %-16s  %-16s  %-20s  %-9s  %s\n", s.ProjectID, s.RuleID, group,
			s.Until.Format(time.RFC3339), s.Until.Sub(now).Round(time.Second), summary)
	}
	return exitOK
}

func (a *app) snoozeRemove(ctx context.Context, args []string) int {
	const cmd = "snooze remove"
	run := a.command(cmd, snoozeUsage).withRedis()
	defer run.close()
	project := run.flags.String("project", "", "project id (required)")
	ruleID := run.flags.String("rule", "", "rule id (required)")
	group := run.flags.String("group", "", "the group, for a snooze of one group")
	if code, done := run.parse(args); done {
		return code
	}
	if *project == "" || *ruleID == "" {
		return a.usageError(cmd, "--project and --rule are required")
	}
	cfg, code, done := run.config()
	if done {
		return code
	}
	removed, err := snooze.New(run.rdb, cfg.Prefix).Remove(ctx, *project, *ruleID, *group)
	if err != nil {
		return a.fail(cmd, err)
	}
	scope := snoozeScope(snooze.Snooze{GroupHash: *group})
	if !removed {
		fmt.Fprintf(a.stdout, "rule %s of project %s%s was not snoozed\n", *ruleID, *project, scope)
		return exitProblem
	}
	fmt.Fprintf(a.stdout, "removed the snooze of rule %s of project %s%s; its summary, if any, follows within a minute\n", *ruleID, *project, scope)
	return exitOK
}
