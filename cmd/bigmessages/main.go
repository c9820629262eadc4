// Command bigmessages measures what a backlog of big messages costs a
// worker in memory: it fills a queue of its own with N messages of S bytes
// (all over the 256 KiB an event may have, so each is dead-lettered),
// starts the real worker (./cmd/worker) on it, waits until every one is
// dead-lettered, and prints the worker's peak resident set (VmHWM).
//
//	go run ./cmd/bigmessages                                  # 60 × 10 MiB, KLAXON_MAX_HELD_BYTES at its default
//	go run ./cmd/bigmessages -env KLAXON_MAX_HELD_BYTES=16GiB # in effect no byte bound: the prefetch alone
//
// It needs RabbitMQ and Redis, and Go to build the worker unless -worker
// names a binary. Its queues and Redis keys have a prefix unique to the
// run and are deleted at the end.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/wire"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bigmessages:", err)
		os.Exit(1)
	}
}

func run() error {
	n := flag.Int("n", 60, "messages in the backlog")
	mib := flag.Int("mib", 10, "size of each message, MiB")
	amqpURL := flag.String("amqp", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL")
	redisURL := flag.String("redis", "redis://127.0.0.1:6379/0", "Redis URL")
	bin := flag.String("worker", "", "worker binary; built from ./cmd/worker when empty")
	env := flag.String("env", "", "extra worker environment, comma-separated NAME=value (e.g. KLAXON_MAX_HELD_BYTES=32MiB,GOMEMLIMIT=200MiB)")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "klaxon-bigmessages-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if *bin == "" {
		*bin = filepath.Join(dir, "klaxon")
		build := exec.CommandContext(ctx, "go", "build", "-o", *bin, "./cmd/worker")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build the worker: %w", err)
		}
	}
	rulesFile := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte("{}\n"), 0o600); err != nil {
		return err
	}

	prefix := "klaxon-big-" + strings.ToLower(rand.Text()[:10])
	q := prefix + ".in"
	defer cleanup(*amqpURL, *redisURL, prefix, q)
	if err := fill(*amqpURL, q, *n, *mib<<20); err != nil {
		return err
	}

	addr, err := freeAddr()
	if err != nil {
		return err
	}
	cmd := exec.Command(*bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "KLAXON_AMQP_URL=" + *amqpURL, "KLAXON_REDIS_URL=" + *redisURL,
		"KLAXON_QUEUE=" + q, "KLAXON_PREFIX=" + prefix, "KLAXON_RULES_FILE=" + rulesFile, "KLAXON_HTTP_ADDR=" + addr,
		"KLAXON_LOG_LEVEL=warn"}
	for kv := range strings.SplitSeq(*env, ",") {
		if kv = strings.TrimSpace(kv); kv != "" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the worker: %w", err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()

	var peak int64
	for {
		if rss, err := statusKB(cmd.Process.Pid, "VmHWM"); err == nil {
			peak = rss
		}
		if dead, err := deadLettered(ctx, addr); err == nil && dead >= float64(*n) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not every message was dead-lettered within %s (peak RSS so far %d MiB)", *timeout, peak>>20)
		case <-time.After(100 * time.Millisecond):
		}
	}
	fmt.Printf("%d messages of %d MiB dead-lettered in %s; worker peak RSS (VmHWM) %d MiB; env %q\n",
		*n, *mib, time.Since(start).Round(100*time.Millisecond), peak>>20, *env)
	return nil
}

// fill declares q and publishes n messages of size bytes to it, confirmed.
func fill(url, q string, n, size int) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	body := make([]byte, size)
	for i := range n {
		c, err := ch.PublishWithDeferredConfirm("", q, false, false, amqp.Publishing{
			MessageId: fmt.Sprintf("big-%d", i), DeliveryMode: amqp.Persistent, Body: body})
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		if !c.Wait() {
			return errors.New("the broker refused a message (max_message_size?)")
		}
	}
	return nil
}

// deadLettered reads klaxon_events_total{outcome="dead"} from the worker.
func deadLettered(ctx context.Context, addr string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), `klaxon_events_total{outcome="dead"} `); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, sc.Err()
}

// statusKB reads a "kB" line of /proc/<pid>/status, in bytes.
func statusKB(pid int, name string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", name, pid)
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// cleanup deletes the run's queues and Redis keys.
func cleanup(amqpURL, redisURL, prefix, q string) {
	if conn, err := amqp.Dial(amqpURL); err == nil {
		if ch, err := conn.Channel(); err == nil {
			names := []string{q, wire.DeadQueue(q), wire.DeliveryQueue(prefix), wire.FailedQueue(prefix)}
			for _, d := range wire.RetryDelays() {
				names = append(names, wire.RetryQueue(prefix, d))
			}
			for _, name := range names {
				_, _ = ch.QueueDelete(name, false, false, false)
			}
		}
		conn.Close()
	}
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		return
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}
