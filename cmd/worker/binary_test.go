package main

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// buildBinary builds the worker as users build it.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := t.TempDir() + "/klaxon"
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// The real binary stops on SIGTERM, draining what it holds, and exits 0
// within 10 s.
func TestBinaryStopsOnSIGTERM(t *testing.T) {
	h := newHarness(t)
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))
	bin := buildBinary(t)
	addr := freeAddr(t)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "KLAXON_HTTP_ADDR="+addr)
	for k, v := range h.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
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
	waitFor(t, 30*time.Second, "the binary ready", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	h.publish(event(project, "before stop", "g1", true))
	h.webhookBodies(1)

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
	if !strings.Contains(stderr.String(), `"msg":"klaxon stopped"`) {
		t.Errorf("no stop line in the log:\n%s", stderr.String())
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
