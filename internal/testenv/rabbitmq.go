package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RabbitMQ is a RabbitMQ node of a test's own, on free ports, for what the
// shared broker must not be put through: a restart, or a setting of
// rabbitmq.conf. It starts in 10 to 30 s on a busy machine.
type RabbitMQ struct {
	t    testing.TB
	node string
	env  []string
	// URL is the node's AMQP URL (guest/guest).
	URL string
}

// StartRabbitMQ starts a node with conf added to its rabbitmq.conf, and
// stops it when the test ends. It skips the test where rabbitmq-server is
// not installed.
func StartRabbitMQ(t testing.TB, conf string) *RabbitMQ {
	t.Helper()
	skipShort(t, "a RabbitMQ node")
	if _, err := exec.LookPath("rabbitmq-server"); err != nil {
		t.Skip("rabbitmq-server is not installed: this test needs a RabbitMQ node of its own")
	}
	dir, err := os.MkdirTemp("", "klaxon-testenv-rabbitmq-")
	if err != nil {
		t.Fatal(err)
	}
	port, dist := freePort(t), freePort(t)
	node := "klaxontest" + port + "@localhost"
	for _, d := range []string{"mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o777); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"rabbitmq.conf":   "listeners.tcp.default = " + port + "\nloopback_users = none\n" + conf + "\n",
		"enabled_plugins": "[].\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The packaged scripts run the node as the rabbitmq user: it must be
	// able to write here.
	_ = filepath.Walk(dir, func(p string, _ os.FileInfo, _ error) error { return os.Chmod(p, 0o777) })
	r := &RabbitMQ{t: t, node: node, URL: "amqp://guest:guest@127.0.0.1:" + port + "/", env: append(os.Environ(),
		"RABBITMQ_NODENAME="+node, "RABBITMQ_NODE_PORT="+port, "RABBITMQ_DIST_PORT="+dist,
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"), "RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "pid"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "rabbitmq-env.conf"))}
	cmd := exec.Command("rabbitmq-server")
	cmd.Env = r.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // so that cleanup can end the node with its script
	out, err := os.Create(filepath.Join(dir, "server.out"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start rabbitmq-server: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); out.Close(); close(exited) }()
	t.Cleanup(func() {
		if r.ctl("stop") != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		_ = os.RemoveAll(dir)
	})
	// The node is not known to epmd for its first seconds; until then
	// await_startup fails at once.
	deadline := time.Now().Add(90 * time.Second)
	for r.ctl("ping") != nil && time.Now().Before(deadline) {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "server.out"))
			t.Fatalf("RabbitMQ node %s exited at start:\n%s", node, log)
		case <-time.After(500 * time.Millisecond):
		}
	}
	if err := r.ctl("await_startup"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.out"))
		t.Fatalf("RabbitMQ node %s did not start: %v\n%s", node, err, log)
	}
	return r
}

// StopApp stops the broker application, as a restart does: every
// connection closes, and nothing answers on the port until StartApp.
func (r *RabbitMQ) StopApp() {
	r.t.Helper()
	if err := r.ctl("stop_app"); err != nil {
		r.t.Fatal(err)
	}
}

// StartApp starts the broker application again after StopApp.
func (r *RabbitMQ) StartApp() {
	r.t.Helper()
	if err := r.ctl("start_app"); err != nil {
		r.t.Fatal(err)
	}
}

func (r *RabbitMQ) ctl(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-n", r.node}, args...)...)
	cmd.Env = r.env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}
