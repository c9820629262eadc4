package pacing

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// Thirty messages for one Telegram chat at once (1 a second, 20 a minute):
// each gets a turn of its own, the first at once, and no window of either
// period ever holds more than its limit. The 21st waits for the minute.
func TestReserveGivesEachMessageItsTurn(t *testing.T) {
	l := New(testenv.Redis(t), testenv.KeyPrefix(t))
	ctx := context.Background()
	limits := []Limit{PerSecond(1), PerMinute(20)}
	var turns []time.Time
	for range 30 {
		asked := time.Now()
		wait, err := l.Reserve(ctx, "chat-1", limits...)
		if err != nil {
			t.Fatal(err)
		}
		turns = append(turns, asked.Add(wait))
	}
	if wait := turns[0].Sub(time.Now()); wait > 0 {
		t.Errorf("the first message waits %v, want 0", wait)
	}
	if !slices.IsSortedFunc(turns, func(a, b time.Time) int { return a.Compare(b) }) {
		t.Errorf("turns out of order: %v", turns)
	}
	// Turns are computed in Redis time and read back as waits, so allow the
	// few ms between asking and Redis' clock.
	const slack = 50 * time.Millisecond
	for i := 1; i < len(turns); i++ {
		if gap := turns[i].Sub(turns[i-1]); gap < time.Second-slack {
			t.Errorf("turns %d and %d are %v apart, want a second", i-1, i, gap)
		}
	}
	for i := 20; i < len(turns); i++ {
		if gap := turns[i].Sub(turns[i-20]); gap < time.Minute-slack {
			t.Errorf("turns %d and %d are %v apart, want a minute", i-20, i, gap)
		}
	}
	if wait, _ := l.Reserve(ctx, "chat-2", limits...); wait != 0 {
		t.Errorf("another destination waits %v behind chat-1", wait)
	}
}
