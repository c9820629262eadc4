// Package pacing holds destinations to their providers' rate limits
// ("1 per second and 20 per minute" for a Telegram chat): Reserve gives
// each message its turn in Redis (reserve.lua), shared by every worker, so
// that a storm of notifications is paced rather than refused.
package pacing

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

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

// Limiter holds destinations to several sliding-window limits at once: it
// gives each message a turn, and never lets a window hold more than its
// limit.
type Limiter struct {
	rdb     redis.UniversalClient
	reserve *redis.Script
	prefix  string
}

// New returns a limiter whose keys start with prefix.
func New(rdb redis.UniversalClient, prefix string) *Limiter {
	return &Limiter{rdb: rdb, reserve: redis.NewScript(reserveLua), prefix: prefix}
}

// Reserve takes the next turn of key under limits and says how long until
// it comes: 0 means go now; 3s means the turn three seconds from now is
// this caller's, and nobody else's. A caller told to wait need not ask
// again: it comes back at its turn and goes. A turn not used is lost, which
// only leaves a gap in the destination's pace.
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
