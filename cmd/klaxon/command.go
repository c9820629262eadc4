package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// command is one run of a subcommand, and the preamble every subcommand
// begins with: its flags, parsed the tool's way, then, as it needs them,
// the worker's settings, the rule it names and a client of the worker's
// Redis. A step that returns done has said why (help on stdout, a problem
// on stderr), and the subcommand returns code.
type command struct {
	app   *app
	name  string // what its messages start with, after "klaxon": "snooze remove"
	usage string // its help text, which its flags follow
	flags *flag.FlagSet
	// needsRedis has config and rule make rdb, a client of the worker's
	// Redis, which close closes.
	needsRedis bool
	rdb        redis.UniversalClient
	// projectRules are the enabled rules of the project of the rule that
	// rule found.
	projectRules []*rules.Rule
}

func (a *app) command(name, usage string) *command {
	return &command{app: a, name: name, usage: usage, flags: flag.NewFlagSet(name, flag.ContinueOnError)}
}

// withRedis has the settings come with a client of the worker's Redis,
// c.rdb, which the subcommand closes with c.close.
func (c *command) withRedis() *command {
	c.needsRedis = true
	return c
}

// close closes what the preamble opened.
func (c *command) close() {
	if c.rdb != nil {
		c.rdb.Close()
	}
}

// parse parses args, which may hold flags only.
func (c *command) parse(args []string) (code int, done bool) {
	rest, code, done := c.parseArgs(args)
	if !done && len(rest) > 0 {
		return c.app.usageError(c.name, "unexpected argument %q", rest[0]), true
	}
	return code, done
}

// parseArgs parses args, flags and positional arguments in any order, and
// returns the positional ones. done is true when the caller must return
// code: help was asked for (printed on stdout, 0), or the arguments are
// wrong (said on stderr in one line with where to find help, 2).
func (c *command) parseArgs(args []string) (positional []string, code int, done bool) {
	fs := c.flags
	fs.SetOutput(io.Discard)
	for {
		err := fs.Parse(args)
		switch {
		case errors.Is(err, flag.ErrHelp):
			fmt.Fprint(c.app.stdout, c.usage)
			printFlags(c.app.stdout, fs)
			return nil, exitOK, true
		case err != nil:
			// The flag package names flags with one dash; the usage texts,
			// with two.
			msg := strings.ReplaceAll(err.Error(), " -", " --")
			if _, name, ok := strings.Cut(msg, " for flag --"); ok {
				name, _, _ = strings.Cut(name, ":")
				if g, ok := fs.Lookup(name).Value.(flag.Getter); ok {
					if _, isDuration := g.Get().(time.Duration); isDuration {
						msg += " (want a duration such as 90s, 30m, 2h or 1h30m)"
					}
				}
			}
			return nil, c.app.usageError(fs.Name(), "%s", msg), true
		}
		if fs.NArg() == 0 {
			return positional, exitOK, false
		}
		// The standard flag package stops at the first argument that is no
		// flag: go on after it, so "check rules.yml --strict" works too.
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// printFlags lists the flags of fs as the usage texts write them, with two
// dashes (the flag package takes either).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// config reads the worker's settings, and connects to its Redis if the
// subcommand needs it.
func (c *command) config() (cfg config.Config, code int, done bool) {
	cfg, code, done = c.settings()
	if done {
		return cfg, code, true
	}
	code, done = c.connect(cfg)
	return cfg, code, done
}

// settings reads the worker's settings; an invalid one is a usage error. A
// KLAXON_ variable the worker does not know is warned of, as the worker
// does, with the one it most likely meant.
func (c *command) settings() (cfg config.Config, code int, done bool) {
	a := c.app
	if a.environ != nil {
		for _, u := range config.Unknown(a.environ()) {
			fmt.Fprintf(a.stderr, "klaxon %s: warning: %s\n", c.name, u)
		}
	}
	cfg, err := config.Load(a.getenv)
	if err != nil {
		fmt.Fprintf(a.stderr, "klaxon %s: %v\n", c.name, err)
		return cfg, exitUsage, true
	}
	return cfg, exitOK, false
}

// rule reads the settings and finds the rule the subcommand names, in file
// or where the worker reads rules; then it connects to Redis if the
// subcommand needs it.
func (c *command) rule(ctx context.Context, file, project, ruleID string) (cfg config.Config, rule *rules.Rule, code int, done bool) {
	cfg, code, done = c.settings()
	if done {
		return cfg, nil, code, true
	}
	snap, name, err := readRules(ctx, cfg, file)
	if err == nil {
		rule, err = ruleIn(snap, name, project, ruleID)
	}
	if err != nil {
		return cfg, nil, c.app.fail(c.name, err), true
	}
	c.projectRules = snap.Rules(rule.ProjectID)
	code, done = c.connect(cfg)
	return cfg, rule, code, done
}

// connect makes c.rdb if the subcommand needs Redis.
func (c *command) connect(cfg config.Config) (code int, done bool) {
	if !c.needsRedis {
		return exitOK, false
	}
	rdb, err := redisClient(cfg)
	if err != nil {
		return c.app.fail(c.name, err), true
	}
	c.rdb = rdb
	return exitOK, false
}

// redisClient is a client of the worker's Redis.
func redisClient(cfg config.Config) (redis.UniversalClient, error) {
	opts, err := cfg.RedisOptions()
	if err != nil {
		return nil, err
	}
	return opts.NewClient(), nil
}

// usageError says what is wrong with the arguments, and how to ask for help.
func (a *app) usageError(cmd, format string, args ...any) int {
	fmt.Fprintf(a.stderr, "klaxon %s: %s (run 'klaxon %s --help')\n", cmd, fmt.Sprintf(format, args...), cmd)
	return exitUsage
}

// fail reports an error that kept a command from running.
func (a *app) fail(cmd string, err error) int {
	fmt.Fprintf(a.stderr, "klaxon %s: %s\n", cmd, strings.TrimSpace(err.Error()))
	return exitUsage
}
