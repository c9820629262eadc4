package main

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// buildBinary builds the worker as users build it. Under -short it skips
// the test instead: a build takes seconds of both cores.
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the worker binary; -short runs only the in-process tests")
	}
	bin := t.TempDir() + "/klaxon-worker"
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startBinary builds and starts the worker with env added to this process'
// environment; exited gets its exit, and a test's end kills it if it runs.
func startBinary(t *testing.T, env ...string) (*exec.Cmd, <-chan error, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(buildBinary(t))
	cmd.Env = append(os.Environ(), env...)
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	})
	return cmd, exited, stderr
}

// startBinary builds and starts the worker with the harness' settings and
// extra ones ("KEY=value"), and waits until it is ready.
func (h *harness) startBinary(extra ...string) (*worker, *exec.Cmd, <-chan error, *bytes.Buffer) {
	h.t.Helper()
	addr := freeAddr(h.t)
	env := []string{"KLAXON_HTTP_ADDR=" + addr}
	for k, v := range h.env {
		env = append(env, k+"="+v)
	}
	cmd, exited, stderr := startBinary(h.t, append(env, extra...)...)
	testenv.WaitFor(h.t, 60*time.Second, "the binary ready", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return &worker{Addr: addr}, cmd, exited, stderr
}

// stopBinary sends SIGTERM and requires an exit 0 within 10 s.
func stopBinary(t *testing.T, cmd *exec.Cmd, exited <-chan error, stderr *bytes.Buffer) {
	t.Helper()
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, stderr.String())
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("stopped after %v, want within 10 s", took)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("still running 15 s after SIGTERM\n%s", stderr.String())
	}
}

// The real binary stops on SIGTERM, draining what it holds, and exits 0
// within 10 s.
func TestBinaryStopsOnSIGTERM(t *testing.T) {
	h := newHarness(t)
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))
	_, cmd, exited, stderr := h.startBinary()
	h.publish(event(project, "before stop", "g1", true))
	h.webhookBodies(1)

	stopBinary(t, cmd, exited, stderr)
	if !strings.Contains(stderr.String(), `"msg":"klaxon stopped"`) {
		t.Errorf("no stop line in the log:\n%s", stderr.String())
	}
}

// Unless GOMAXPROCS is set, a worker runs on one of Go's processors per
// queue it consumes; GOMAXPROCS still wins.
func TestBinaryRunsOneProcessorPerQueue(t *testing.T) {
	if os.Getenv("GOMAXPROCS") != "" {
		t.Skip("GOMAXPROCS is set in the test's environment")
	}
	h := newHarness(t)
	w, cmd, exited, stderr := h.startBinary()
	if got := w.metric(t, "go_sched_gomaxprocs_threads"); got != 1 {
		t.Errorf("one queue: %v processors, want 1", got)
	}
	stopBinary(t, cmd, exited, stderr)

	w, cmd, exited, stderr = h.startBinary("GOMAXPROCS=2")
	if got := w.metric(t, "go_sched_gomaxprocs_threads"); got != 2 {
		t.Errorf("GOMAXPROCS=2: %v processors, want 2", got)
	}
	stopBinary(t, cmd, exited, stderr)
}

func TestProcessors(t *testing.T) {
	for _, c := range []struct{ queues, available, want int }{
		{1, 2, 1}, {1, 16, 1}, {3, 16, 3}, {4, 2, 2}, {0, 4, 1}, {2, 1, 1},
	} {
		if got := processors(c.queues, c.available); got != c.want {
			t.Errorf("processors(%d queues, %d available) = %d, want %d", c.queues, c.available, got, c.want)
		}
	}
}

// A setting that is present but invalid stops start-up with one line naming
// the variable, and never prints a secret.
func TestBinaryRejectsInvalidSetting(t *testing.T) {
	bin := buildBinary(t)
	for _, tc := range []struct{ env, want string }{
		{"KLAXON_SMTP_TLS=ssl", "KLAXON_SMTP_TLS"},
		{"KLAXON_AMQP_URL=http://guest:s3cret@127.0.0.1/", "KLAXON_AMQP_URL"},
		{"REDIS_URL=nope://x", "REDIS_URL"},
		{"KLAXON_PREFIX={bad}", "KLAXON_PREFIX"},
		{"KLAXON_ALLOW_PRIVATE_NETWORKS=10.0.0.1/8", "KLAXON_ALLOW_PRIVATE_NETWORKS"},
	} {
		cmd := exec.Command(bin)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), tc.env}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Errorf("%s: exit %v, want a failure", tc.env, err)
			continue
		}
		out := strings.TrimSpace(stderr.String())
		if strings.Count(out, "\n") != 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%s: stderr %q, want one line naming %s", tc.env, out, tc.want)
		}
		if strings.Contains(out, "s3cret") {
			t.Errorf("%s: the password is printed: %q", tc.env, out)
		}
	}
}

// While RabbitMQ does not answer, the binary waits for it behind a live
// /healthz, an unready /readyz and klaxon_dependency_up, instead of exiting
// (a crash loop under a supervisor) or serving nothing (a liveness probe
// would restart it over and over); SIGTERM then still exits 0.
func TestBinaryWaitsForTheBrokerBehindHealthz(t *testing.T) {
	rules := t.TempDir() + "/rules.yaml"
	if err := os.WriteFile(rules, []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd, exited, stderr := startBinary(t, "KLAXON_HTTP_ADDR="+addr, "KLAXON_RULES_FILE="+rules,
		"KLAXON_AMQP_URL=amqp://guest:guest@"+freeAddr(t)+"/") // nothing listens there
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	testenv.WaitFor(t, 30*time.Second, "/healthz to answer while the broker is away", func() bool {
		status, _ := get("/healthz")
		return status == http.StatusOK
	})
	testenv.WaitFor(t, 30*time.Second, "/metrics to say the broker is down", func() bool {
		_, body := get("/metrics")
		return strings.Contains(body, `klaxon_dependency_up{dependency="amqp"} 0`)
	})
	if status, body := get("/readyz"); status != http.StatusServiceUnavailable || !strings.Contains(body, "amqp") {
		t.Errorf("/readyz answered %d %q, want 503 naming amqp", status, body)
	}

	stopBinary(t, cmd, exited, stderr)
	if n := strings.Count(stderr.String(), `"msg":"rabbitmq unavailable"`); n != 1 {
		t.Errorf("logged the outage %d times, want once:\n%s", n, stderr.String())
	}
}

// The worker takes no arguments but --version and --help. Anything else
// stops it with one line before it starts anything: "bin/klaxon --help"
// once started a worker with default settings against the real broker.
func TestBinaryArguments(t *testing.T) {
	bin := buildBinary(t)
	run := func(args ...string) (int, string, string) {
		cmd := exec.Command(bin, args...)
		// Were it to start, it would find nothing to talk to.
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "KLAXON_HTTP_ADDR=" + freeAddr(t),
			"KLAXON_AMQP_URL=amqp://guest:guest@" + freeAddr(t) + "/", "KLAXON_RULES_FILE=/nonexistent"}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		done := make(chan error, 1)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Fatalf("%v: still running after 10 s: it started a worker\n%s", args, stderr.String())
		}
		return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
	}
	if code, out, _ := run("--version"); code != 0 || !strings.HasPrefix(out, "klaxon-worker ") || !strings.Contains(out, "commit ") {
		t.Errorf("--version: exit %d, stdout %q", code, out)
	}
	for _, help := range []string{"--help", "-h"} {
		if code, out, _ := run(help); code != 0 || !strings.Contains(out, "Usage") || !strings.Contains(out, "KLAXON_") {
			t.Errorf("%s: exit %d, stdout %q", help, code, out)
		}
	}
	for _, args := range [][]string{{"--nope"}, {"run"}, {"rules", "check"}, {"--version", "extra"}, {"-config=klaxon.yml"}} {
		code, out, errOut := run(args...)
		if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "run 'klaxon-worker --help'") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and one line", args, code, out, errOut)
		}
	}
}

// A misspelt variable and a MongoDB that does not answer are said within
// 5 s of start, naming what to change: KLAXON_RULE_FILE once left the
// worker reading MongoDB, which logged a topology dump 5 s later.
func TestBinarySaysWhatIsWrongWithItsSettings(t *testing.T) {
	bin := buildBinary(t)
	addr := freeAddr(t)
	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "KLAXON_HTTP_ADDR=" + addr,
		"KLAXON_RULE_FILE=/etc/klaxon/rules.yml",
		"KLAXON_MONGO_URL=mongodb://" + freeAddr(t) + "/hawk",     // nothing listens there
		"KLAXON_AMQP_URL=amqp://guest:guest@" + freeAddr(t) + "/"} // nor there
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	started := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	logged := func(part string) bool { return strings.Contains(stderr.String(), part) }
	testenv.WaitFor(t, 5*time.Second, "the warnings", func() bool {
		return logged(`"variable":"KLAXON_RULE_FILE","did_you_mean":"KLAXON_RULES_FILE"`) &&
			logged(`"msg":"rules not loaded yet"`)
	})
	if took := time.Since(started); took > 5*time.Second {
		t.Errorf("warned after %v, want within 5 s", took)
	}
	for line := range strings.Lines(stderr.String()) {
		if strings.Contains(line, "rules not loaded yet") &&
			(!strings.Contains(line, "MongoDB did not answer") || !strings.Contains(line, "KLAXON_MONGO_URL") ||
				!strings.Contains(line, "KLAXON_RULES_FILE") || strings.Contains(line, "topology")) {
			t.Errorf("the warning does not say what to change: %s", line)
		}
	}
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "KLAXON_MONGO_URL") {
		t.Errorf("/readyz answered %d %q, want 503 naming KLAXON_MONGO_URL", resp.StatusCode, body)
	}
}
