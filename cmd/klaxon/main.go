// Command klaxon is the operators' tool of Klaxon: it checks rules, replays
// events through them, and sends test messages, reading the same settings
// (environment variables, docs/configuration.md) and the same rules
// (KLAXON_RULES_FILE or MongoDB) as the worker.
//
//	klaxon rules check [FILE]                    validate rules, as the worker loads them
//	klaxon rules test [FILE|DIR...]              test cases: events in, messages expected
//	klaxon backtest --events FILE [--rules FILE] what the rules would have fired
//	klaxon test-send --project P --rule R        a marked test message through each channel
//	klaxon explain --project P --rule R --group G why a rule fires or not, and its state in Redis
//	klaxon snooze --project P --rule R --for D   hold back a rule's messages for a while
//	klaxon failed list|show ID|replay ID...      the notifications that failed for good
//
// It is a binary of its own rather than subcommands of the worker's: the
// worker is a long-running service configured only by its environment, and
// every flag or argument it took would be one more way to start it wrong in
// a deployment; the tool, run by people and CI, lives beside it and shares
// its packages, not its entry point.
//
// Exit codes, for CI: 0 all is well; 1 the command ran and found a problem
// (rules with errors, or warnings under --strict; a failed test send);
// 2 it could not run (usage, invalid settings, a store or file that cannot
// be read).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/klaxonhq/klaxon/internal/suggest"
	"github.com/klaxonhq/klaxon/internal/version"
)

// commands are the tool's commands, for "did you mean".
var commands = []string{"rules", "backtest", "test-send", "explain", "snooze", "failed", "help", "version"}

// Exit codes.
const (
	exitOK      = 0
	exitProblem = 1 // the command ran and found something wrong
	exitUsage   = 2 // the command could not run
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	a := &app{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, environ: os.Environ}
	os.Exit(a.run(ctx, os.Args[1:]))
}

// app is one invocation: where it writes and what environment it reads.
type app struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	environ        func() []string // the whole environment, for unknown variables; nil = none
}

const usage = `klaxon: the operators' tool of Klaxon.

Usage:
  klaxon rules check [FILE] [--strict] [--json]
        validate a rules file (or KLAXON_RULES_FILE, or the rules in MongoDB)
        with the worker's own loader; exit 1 on errors
  klaxon rules test [FILE|DIR...] [--json]
        run test cases (NAME.test.yml: events and the messages expected)
        against the rules, with backtest's engine; exit 1 when one fails
  klaxon backtest --events FILE [--rules FILE] [--json]
        replay events (NDJSON of queue messages with event.timestamp) through
        the rules, without Redis or the network, and print what would fire
  klaxon test-send --project P --rule R [--channel C] [--rules FILE] [--json]
        send a marked test message through the rule's channels and say how
        each provider answered
  klaxon explain --project P --rule R (--group G [--title T] | --event FILE) [--json]
        whether the rule matches an event and why, and its live state in
        Redis for the group: counts, cooldown, last firing and its delivery
  klaxon snooze --project P --rule R [--group G] (--for D | --until TIME)
  klaxon snooze list [--project P] [--json]
  klaxon snooze remove --project P --rule R [--group G]
        hold back a rule's messages (still counted and recorded) until a
        time; one summary of what was held back follows
  klaxon failed list [--json]
  klaxon failed show ID [--json]
  klaxon failed replay (ID... | --all) [--json]
        the notifications that failed for good (<KLAXON_PREFIX>.failed):
        list them with their reasons, and send them again once fixed
  klaxon --version

Settings are the worker's environment variables (docs/configuration.md).
Run "klaxon COMMAND --help" for a command's flags.
Exit codes: 0 ok, 1 a problem found, 2 the command could not run.
`

func (a *app) run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(a.stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(a.stdout, usage)
		return exitOK
	case "--version", "-version", "version":
		fmt.Fprintln(a.stdout, "klaxon", version.Read())
		return exitOK
	case "rules":
		if len(args) > 1 && args[1] == "check" {
			return a.rulesCheck(ctx, args[2:])
		}
		if len(args) > 1 && args[1] == "test" {
			return a.rulesTest(ctx, args[2:])
		}
		if len(args) > 1 && isHelp(args[1]) {
			fmt.Fprint(a.stdout, rulesCheckUsage)
			return exitOK
		}
		fmt.Fprint(a.stderr, "klaxon rules: want a subcommand: check or test; run 'klaxon rules check --help' or 'klaxon rules test --help'\n")
		return exitUsage
	case "backtest":
		return a.backtest(ctx, args[1:])
	case "test-send":
		return a.testSend(ctx, args[1:])
	case "explain":
		return a.explain(ctx, args[1:])
	case "snooze":
		return a.snooze(ctx, args[1:])
	case "failed":
		return a.failed(ctx, args[1:])
	}
	hint := ""
	if c := suggest.Closest(args[0], commands); c != "" {
		hint = fmt.Sprintf(" (did you mean %q?)", c)
	}
	fmt.Fprintf(a.stderr, "klaxon: unknown command %q%s; run 'klaxon --help'\n", args[0], hint)
	return exitUsage
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help"
}
