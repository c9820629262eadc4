package counter

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed limit.lua
var limitLua string

//go:embed reserve.lua
var reserveLua string

// Limit is at most Events within any sliding window of Per.
type Limit struct {
	Events int64
	Per    time.Duration
}

// PerSecond is n events a second.
func PerSecond(n int64) Limit { return Limit{Events: n, Per: time.Second} }

// PerMinute is n events a minute.
func PerMinute(n int64) Limit { return Limit{Events: n, Per: time.Minute} }

// Decision is a limiter's answer.
type Decision struct {
	// Allowed is true when the event may go now; it has been counted.
	Allowed bool
	// RetryAfter is how long to wait before asking again when not Allowed,
	// e.g. 700ms when the last second already had its one message.
	RetryAfter time.Duration
}

// Limiter holds destinations to several sliding-window limits at once, with
// the buckets of the counting engine: it may wait up to one bucket longer
// than needed, and never lets a window hold more than its limit.
type Limiter struct {
	rdb     redis.UniversalClient
	script  *redis.Script
	reserve *redis.Script
	prefix  string
}

// NewLimiter returns a limiter whose keys start with prefix.
func NewLimiter(rdb redis.UniversalClient, prefix string) *Limiter {
	return &Limiter{rdb: rdb, script: redis.NewScript(limitLua), reserve: redis.NewScript(reserveLua), prefix: prefix}
}

// Allow counts one event for key if every limit allows it. Limits of other
// periods for the same key (a changed configuration) count afresh.
func (l *Limiter) Allow(ctx context.Context, key string, limits ...Limit) (Decision, error) {
	if len(limits) == 0 {
		return Decision{Allowed: true}, nil
	}
	args := make([]any, 0, 1+4*len(limits))
	args = append(args, len(limits))
	// The state's layout follows the periods, in order: state kept under
	// other periods would be misread (a denial with no wait, for good) or
	// be too short to read, so each list of periods has its own key.
	state := l.prefix + ":rl:" + key + ":"
	for i, lim := range limits {
		if lim.Events < 1 || lim.Per < time.Millisecond {
			return Decision{}, fmt.Errorf("limit %d per %s: want at least 1 per 1ms", lim.Events, lim.Per)
		}
		args = append(args, lim.Events, lim.Per.Milliseconds(), Resolution(lim.Per).Milliseconds(), buckets(lim.Per))
		if i > 0 {
			state += ","
		}
		state += strconv.FormatInt(lim.Per.Milliseconds(), 10)
	}
	r, err := l.script.Run(ctx, l.rdb, []string{state}, args...).Int64Slice()
	var d Decision
	if err == nil {
		d, err = decodeLimit(r)
	}
	if err != nil {
		return Decision{}, fmt.Errorf("rate limit %s: %w", key, err)
	}
	return d, nil
}

// decodeLimit reads limit.lua's reply, {allowed (1 or 0), retry after in
// ms}; another shape is an error rather than a panic.
func decodeLimit(r []int64) (Decision, error) {
	if len(r) != 2 || (r[0] != 0 && r[0] != 1) {
		return Decision{}, fmt.Errorf("limit.lua: unexpected reply %v", r)
	}
	return Decision{Allowed: r[0] == 1, RetryAfter: time.Duration(r[1]) * time.Millisecond}, nil
}

// Reserve takes the next turn of key under limits and says how long until
// it comes: 0 means go now; 3s means the turn three seconds from now is
// this caller's, and nobody else's. Unlike Allow, a caller told to wait
// need not ask again: it comes back at its turn and goes. A turn not used
// is lost, which only leaves a gap in the destination's pace.
func (l *Limiter) Reserve(ctx context.Context, key string, limits ...Limit) (time.Duration, error) {
	if len(limits) == 0 {
		return 0, nil
	}
	args := make([]any, 0, 1+2*len(limits))
	args = append(args, len(limits))
	for _, lim := range limits {
		if lim.Events < 1 || lim.Per < time.Millisecond {
			return 0, fmt.Errorf("limit %d per %s: want at least 1 per 1ms", lim.Events, lim.Per)
		}
		args = append(args, lim.Events, lim.Per.Milliseconds())
	}
	wait, err := l.reserve.Run(ctx, l.rdb, []string{l.prefix + ":turns:" + key}, args...).Int64()
	if err != nil {
		return 0, fmt.Errorf("reserve a turn for %s: %w", key, err)
	}
	return time.Duration(wait) * time.Millisecond, nil
}
