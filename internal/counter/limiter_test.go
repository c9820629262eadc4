package counter

import (
	"context"
	"testing"
	"time"
)

func TestLimiterSeveralWindows(t *testing.T) {
	rdb := testRedis(t)
	l := NewLimiter(rdb, testPrefix(t, rdb))
	ctx := context.Background()
	// 3 per 10 s and 1000 per minute: the first three go, the rest wait for
	// the 10-second window, never longer than it and one bucket.
	var allowed int
	for i := range 6 {
		d, err := l.Allow(ctx, "chat-1", Limit{Events: 3, Per: 10 * time.Second}, PerMinute(1000))
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
			if i >= 3 {
				t.Errorf("attempt %d allowed after the limit", i)
			}
			continue
		}
		if d.RetryAfter <= 0 || d.RetryAfter > 10*time.Second+Resolution(10*time.Second) {
			t.Errorf("attempt %d: retry after %v, want within the 10 s window", i, d.RetryAfter)
		}
	}
	if allowed != 3 {
		t.Errorf("%d allowed, want 3", allowed)
	}
	// Another destination has its own limits.
	if d, _ := l.Allow(ctx, "chat-2", Limit{Events: 3, Per: 10 * time.Second}); !d.Allowed {
		t.Error("another key was limited")
	}
}

// One per second: after a message, the next waits at most a second and a
// bucket, and goes once that wait has passed.
func TestLimiterRetryAfterIsEnough(t *testing.T) {
	rdb := testRedis(t)
	l := NewLimiter(rdb, testPrefix(t, rdb))
	ctx := context.Background()
	if d, _ := l.Allow(ctx, "k", PerSecond(1)); !d.Allowed {
		t.Fatal("first message not allowed")
	}
	d, err := l.Allow(ctx, "k", PerSecond(1))
	if err != nil || d.Allowed {
		t.Fatalf("second message within a second: %+v %v", d, err)
	}
	if d.RetryAfter <= 0 || d.RetryAfter > 1100*time.Millisecond {
		t.Fatalf("retry after %v, want (0, 1.1s]", d.RetryAfter)
	}
	time.Sleep(d.RetryAfter) // waiting out the limiter's own answer is the behaviour under test
	if d, _ := l.Allow(ctx, "k", PerSecond(1)); !d.Allowed {
		t.Errorf("not allowed after waiting the RetryAfter it gave: %+v", d)
	}
}

// Limits of other periods for a key (a changed configuration) count afresh:
// the state kept under the old ones is neither misread (a denial with no
// wait, that a caller retrying every second keeps for good) nor too short
// to read (an error).
func TestLimiterLimitsChanged(t *testing.T) {
	rdb := testRedis(t)
	l := NewLimiter(rdb, testPrefix(t, rdb))
	ctx := context.Background()
	for range 5 {
		if d, err := l.Allow(ctx, "k", Limit{Events: 5, Per: 10 * time.Second}); err != nil || !d.Allowed {
			t.Fatalf("under 5 per 10 s: %+v %v", d, err)
		}
	}
	for _, limits := range [][]Limit{
		{Limit{Events: 5, Per: time.Second}},                // a shorter state
		{Limit{Events: 5, Per: time.Second}, PerMinute(20)}, // a longer one
		{PerMinute(20), Limit{Events: 5, Per: time.Second}}, // the same length, reordered
	} {
		d, err := l.Allow(ctx, "k", limits...)
		if err != nil || !d.Allowed {
			t.Errorf("first message under %v: %+v %v, want allowed", limits, d, err)
		}
		for range 6 {
			d, err := l.Allow(ctx, "k", limits...)
			if err != nil || !d.Allowed && d.RetryAfter <= 0 {
				t.Errorf("under %v: %+v %v, want allowed or a wait", limits, d, err)
			}
		}
	}
}
