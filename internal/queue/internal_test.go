package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPlanSettle(t *testing.T) {
	ds := func(tags ...uint64) []Delivery {
		out := make([]Delivery, len(tags))
		for i, tag := range tags {
			out[i].DeliveryTag = tag
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		ds      []Delivery
		requeue []bool
		younger bool // another batch with lower tags is still in flight
		want    []settleOp
	}{
		{"all acked: one multiple ack", ds(5, 6, 7, 8), nil, false,
			[]settleOp{{tag: 8, ack: true, multiple: true}}},
		{"all requeued: one multiple nack", ds(5, 6, 7), []bool{true, true, true}, false,
			[]settleOp{{tag: 7, multiple: true}}},
		{"runs in tag order", ds(1, 2, 3, 4, 5, 6), []bool{false, false, true, false, true, true}, false,
			[]settleOp{{tag: 2, ack: true, multiple: true}, {tag: 3, multiple: true}, {tag: 4, ack: true, multiple: true}, {tag: 6, multiple: true}}},
		{"single", ds(9), nil, false, []settleOp{{tag: 9, ack: true, multiple: true}}},
		{"tags not increasing: one by one", ds(3, 2), []bool{false, true}, false,
			[]settleOp{{tag: 3, ack: true}, {tag: 2}}},
		{"an older batch in flight: one by one", ds(9, 10, 11), []bool{false, true, false}, true,
			[]settleOp{{tag: 9, ack: true}, {tag: 10}, {tag: 11, ack: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := planSettle(tc.ds, tc.requeue, !tc.younger); !slices.Equal(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestBackoffDelay(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	for n, ceil := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 500: time.Second} {
		for range 200 {
			if d := b.Delay(n); d < ceil/2 || d > ceil {
				t.Fatalf("Delay(%d) = %s, want %s…%s", n, d, ceil/2, ceil)
			}
		}
	}
	if d := (Backoff{}).Delay(1); d < 50*time.Millisecond || d > 100*time.Millisecond {
		t.Errorf("default Delay(1) = %s", d)
	}
}

func TestURLsNeverShowPasswords(t *testing.T) {
	for raw, want := range map[string]string{
		"amqp://user:hunter2@rabbit:5672/vh":           "amqp://rabbit:5672/vh",
		"amqps://user@rabbit/%2f":                      "amqps://rabbit/%2f",
		"amqp://user:hunter2@rabbit/vh?heartbeat=10#x": "amqp://rabbit/vh",
		"amqp://rabbit":                                "amqp://rabbit",
	} {
		// No user info at all, not even the user name.
		if got := redactURL(raw); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", raw, got, want)
		}
	}
	for _, bad := range []string{"amqp://user:hunter2@rabbit:port/", "amqp://user:hun ter2@rabbit/", "http://user:hunter2@rabbit/", "amqp://user:hunter2@[::1/"} {
		err := validateURL(bad)
		if err == nil {
			t.Errorf("validateURL(%q) = nil", bad)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("validateURL(%q) = %q: leaks the password", bad, err)
		}
	}
	if err := validateURL("amqp://guest:guest@127.0.0.1:5672/"); err != nil {
		t.Error(err)
	}
}

// TestConnStateLogsOutagesNotRetries: a broker that stays away is one line,
// then one reminder an interval however many attempts fail, and the
// reconnection says how many did.
func TestConnStateLogsOutagesNotRetries(t *testing.T) {
	var out strings.Builder
	var ups []bool
	s := newConnState(slog.New(slog.NewTextHandler(&out, nil)), func(up bool) { ups = append(ups, up) })
	s.remind = time.Hour
	s.setUp()
	s.setDown(errors.New("read: connection reset by peer"))
	for i := range 50 {
		s.setDown(fmt.Errorf("dial tcp 127.0.0.1:%d: connection refused", 40000+i))
	}
	s.remind = 0 // the next failure is a reminder's worth later
	s.setDown(errors.New("dial tcp: connection refused"))
	s.setUp()

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		`msg="rabbitmq connected"`,
		`msg="rabbitmq connection lost"`,
		`msg="rabbitmq unavailable"`,
		`msg="rabbitmq still unavailable" failed_attempts=51`,
		`msg="rabbitmq connected" failed_attempts=51`,
	}
	if len(lines) != len(want) {
		t.Fatalf("logged %d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Errorf("line %d = %s, want it to contain %s", i, lines[i], w)
		}
	}
	if !slices.Equal(ups, []bool{true, false, true}) {
		t.Errorf("hook saw %v, want up, down, up", ups)
	}
}

// TestCauseOfAClosedChannelIsItsClose: when a channel shuts down, amqp091
// closes the cancel listeners along with the close listeners; a closed
// cancel listener is not a broker-side cancel, and must not be reported as
// one (a network cut logged as "queue deleted?").
func TestCauseOfAClosedChannelIsItsClose(t *testing.T) {
	closeErr := errors.New(`channel closed: Exception (501) Reason: "EOF"`)
	for range 100 {
		s := &session{cancels: make(chan string, 1), feeder: &feeder{}}
		s.deadCtx, s.markDead = context.WithCancel(context.Background())
		close(s.cancels) // before the watcher saw the close, or after: either way
		go func() {
			s.closeErr = closeErr
			s.markDead()
		}()
		if err := s.cause(); err != closeErr {
			t.Fatalf("cause() = %v, want the channel's close %v", err, closeErr)
		}
	}

	// A real broker-side cancel, on a channel that lives, is reported as such.
	s := &session{cancels: make(chan string, 1), feeder: &feeder{}}
	s.deadCtx, s.markDead = context.WithCancel(context.Background())
	defer s.markDead()
	s.cancels <- "klaxon-consumer-x"
	if err := s.cause(); err == nil || !strings.Contains(err.Error(), "broker cancelled consumer klaxon-consumer-x") {
		t.Errorf("cause() = %v, want the broker's cancel", err)
	}
}
