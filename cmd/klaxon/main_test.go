package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// result is what one invocation of the tool printed, and its exit code.
type result struct {
	code           int
	stdout, stderr string
}

// klaxon runs the tool in-process with env as its whole environment.
func klaxon(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	a := &app{stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }}
	code := a.run(context.Background(), args)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestHelpOnEveryCommand: every command answers --help on stdout with exit
// 0, so `klaxon X --help` is safe to run anywhere; an unknown flag is a
// usage error (2), never taken for a finding (1).
func TestHelpOnEveryCommand(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"help"}, {"rules", "--help"}, {"rules", "check", "--help"}, {"rules", "check", "-h"}, {"rules", "test", "--help"},
		{"backtest", "--help"}, {"test-send", "--help"}, {"explain", "--help"}, {"snooze", "--help"}, {"snooze", "list", "--help"}, {"snooze", "remove", "--help"},
		{"failed", "--help"}, {"failed", "list", "--help"}, {"failed", "replay", "--help"},
	} {
		r := klaxon(t, nil, args...)
		if r.code != exitOK || !strings.Contains(r.stdout, "Usage") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
	for _, args := range [][]string{{}, {"nope"}, {"rules"}, {"rules", "check", "--nope"}, {"backtest", "--nope"}, {"test-send", "--nope"}, {"explain", "--nope"}, {"snooze", "--nope"}, {"snooze", "list", "--nope"},
		{"failed"}, {"failed", "lst"}, {"failed", "replay"}, {"failed", "replay", "x", "--all"}, {"failed", "show"}} {
		if r := klaxon(t, nil, args...); r.code != exitUsage || r.stderr == "" {
			t.Errorf("%v: exit %d, stderr %q; want a usage error", args, r.code, r.stderr)
		}
	}
}

// TestInvalidSettingStopsWithItsName: the tool reads the worker's settings,
// and an invalid one is said as the worker says it.
func TestInvalidSettingStopsWithItsName(t *testing.T) {
	file := writeTemp(t, "rules.yml", "{}\n")
	r := klaxon(t, map[string]string{"KLAXON_LOG_LEVEL": "loud"}, "rules", "check", file)
	if r.code != exitUsage || !strings.Contains(r.stderr, "KLAXON_LOG_LEVEL") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

// A wrong flag is said in one line, with the command to run for help, not
// buried under the whole usage; the flag list writes flags as the usage
// lines do, with two dashes.
func TestFlagErrorIsOneLineWithAHint(t *testing.T) {
	r := klaxon(t, nil, "snooze", "--project", "p", "--rule", "r", "--for", "10x")
	if r.code != exitUsage || strings.Count(r.stderr, "\n") != 1 ||
		!strings.Contains(r.stderr, `invalid value "10x" for flag --for`) || !strings.Contains(r.stderr, "run 'klaxon snooze --help'") ||
		!strings.Contains(r.stderr, "want a duration") {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
	r = klaxon(t, nil, "rules", "check", "--jsn")
	if r.code != exitUsage || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, "run 'klaxon rules check --help'") {
		t.Errorf("unknown flag: exit %d, stderr %q", r.code, r.stderr)
	}
	r = klaxon(t, nil, "snoze")
	if r.code != exitUsage || !strings.Contains(r.stderr, `did you mean "snooze"?`) {
		t.Errorf("misspelt command: exit %d, stderr %q", r.code, r.stderr)
	}
	help := klaxon(t, nil, "rules", "check", "--help").stdout
	if !strings.Contains(help, "[--json]") || !strings.Contains(help, "\n  --json\n") || strings.Contains(help, "\n  -json") {
		t.Errorf("usage and flag list disagree:\n%s", help)
	}
}

// --version answers on stdout with exit 0, whatever the build knows.
func TestVersion(t *testing.T) {
	r := klaxon(t, nil, "--version")
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "klaxon ") || !strings.Contains(r.stdout, "commit ") {
		t.Errorf("exit %d, stdout %q", r.code, r.stdout)
	}
}

// A KLAXON_ variable the tool does not know is warned of with the one it
// most likely meant: KLAXON_RULE_FILE silently read rules from MongoDB.
func TestUnknownVariableIsWarned(t *testing.T) {
	file := writeTemp(t, "rules.yml", "{}\n")
	var out, errOut bytes.Buffer
	a := &app{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" },
		environ: func() []string { return []string{"KLAXON_RULE_FILE=" + file, "HOME=/root"} }}
	code := a.run(context.Background(), []string{"rules", "check", file})
	if code != exitOK || !strings.Contains(errOut.String(), "warning: KLAXON_RULE_FILE is not a Klaxon variable and is ignored (did you mean KLAXON_RULES_FILE?)") {
		t.Errorf("exit %d, stderr %q", code, errOut.String())
	}
}

// The tool as users build it answers --version with its build's commit
// and --help with its usage, and a wrong flag with one line; it reads its
// environment for unknown variables.
func TestBinaryFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the klaxon binary; -short runs only the in-process tests")
	}
	bin := t.TempDir() + "/klaxon"
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	run := func(env []string, args ...string) (int, string, string) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.Run()
		return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
	}
	if code, out, _ := run(nil, "--version"); code != 0 || !strings.HasPrefix(out, "klaxon ") || !strings.Contains(out, "commit ") {
		t.Errorf("--version: exit %d, %q", code, out)
	}
	if code, out, _ := run(nil, "-h"); code != 0 || !strings.Contains(out, "klaxon failed list") {
		t.Errorf("-h: exit %d, %q", code, out)
	}
	if code, _, errOut := run(nil, "backtest", "--evnts", "x"); code != exitUsage || strings.Count(errOut, "\n") != 1 {
		t.Errorf("a wrong flag: exit %d, %q", code, errOut)
	}
	file := writeTemp(t, "rules.yml", "{}\n")
	if code, _, errOut := run([]string{"KLAXON_RULE_FILE=" + file}, "rules", "check", file); code != 0 ||
		!strings.Contains(errOut, "did you mean KLAXON_RULES_FILE?") {
		t.Errorf("an unknown variable: exit %d, %q", code, errOut)
	}
}
