package deliverer

import (
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The deliverer's Lua scripts, each with its keys named and its reply read
// by a decoder of its own: a reply of another shape (a script of another
// version, a proxy in the way) is an error that holds the batch, never a
// panic. The scripts' own comments say what each key holds.

//go:embed gate.lua
var gateLua string

//go:embed flush.lua
var flushLua string

//go:embed drop.lua
var dropLua string

//go:embed hold.lua
var holdLua string

//go:embed sent.lua
var sentLua string

//go:embed quiet_hold.lua
var quietHoldLua string

//go:embed quiet_take.lua
var quietTakeLua string

//go:embed quiet_done.lua
var quietDoneLua string

// scripts are the deliverer's scripts, loaded once (EVALSHA, falling back
// to EVAL).
type scripts struct {
	gate, flush, drop, hold, sent   *redis.Script
	quietHold, quietTake, quietDone *redis.Script
}

func newScripts() scripts {
	return scripts{
		gate:  redis.NewScript(gateLua),
		flush: redis.NewScript(flushLua),
		drop:  redis.NewScript(dropLua),
		hold:  redis.NewScript(holdLua),
		sent:  redis.NewScript(sentLua),

		quietHold: redis.NewScript(quietHoldLua),
		quietTake: redis.NewScript(quietTakeLua),
		quietDone: redis.NewScript(quietDoneLua),
	}
}

// minPeriodKeys are the keys of a (rule, channel)'s minPeriod. They share a
// hash tag, so that a script may take them together on a cluster.
type minPeriodKeys struct {
	state    string // hash: last (ms of the last send), sched (ms a flush is due), gen
	pending  string // hash: id → job gathered for the next digest, and '#' counters
	inflight string // hash: the digest being sent, as pending was when taken
	gathered string // sorted set: the ids gathered, by ms
}

// Replies of gate.lua.
const (
	gateSendNow  = 0 // send now: the minPeriod starts now, and again when the send ends
	gateGathered = 1 // gathered (now or before); no flush to schedule
	gateFlushIn  = 2 // gathered; schedule a flush in the reply's delay
)

type gateReply struct {
	code    int64
	flushIn time.Duration // gateFlushIn: when the flush is due
	omitted bool          // the digest was full: the job is only counted
}

func decodeGate(r []int64) (gateReply, error) {
	switch {
	case len(r) == 1 && r[0] == gateSendNow:
		return gateReply{code: gateSendNow}, nil
	case len(r) == 3 && (r[0] == gateGathered || r[0] == gateFlushIn) && r[1] >= 0 && (r[2] == 0 || r[2] == 1):
		return gateReply{code: r[0], flushIn: time.Duration(r[1]) * time.Millisecond, omitted: r[2] == 1}, nil
	}
	return gateReply{}, fmt.Errorf("gate.lua: unexpected reply %v", r)
}

// Replies of flush.lua.
const (
	flushTaken    = 0 // send this digest, just taken from what was pending
	flushTooEarly = 1 // the minPeriod is not over: come back in the reply's delay
	flushNothing  = 2 // nothing to send
	flushInFlight = 3 // send the digest already in flight (again)
)

type flushReply struct {
	code int64
	wait time.Duration // flushTooEarly
	// generation tells this digest from the next ones (flushTaken,
	// flushInFlight; "" otherwise).
	generation string
	omitted    int64    // firings the digest counted but left out
	jobs       []string // the jobs gathered, as JSON
}

func decodeFlush(r []any) (flushReply, error) {
	bad := func(why string) (flushReply, error) {
		return flushReply{}, fmt.Errorf("flush.lua: unexpected reply (%s)", why)
	}
	if len(r) == 0 {
		return bad("empty")
	}
	code, ok := r[0].(int64)
	if !ok {
		return bad(fmt.Sprintf("code %T", r[0]))
	}
	out := flushReply{code: code}
	switch code {
	case flushTooEarly:
		wait, ok := r[len(r)-1].(int64)
		if len(r) != 2 || !ok || wait < 0 {
			return bad("a delay in ms")
		}
		out.wait = time.Duration(wait) * time.Millisecond
		return out, nil
	case flushNothing:
		if len(r) != 1 {
			return bad("nothing to send, with more")
		}
		return out, nil
	case flushTaken, flushInFlight:
	default:
		return bad(fmt.Sprintf("code %d", code))
	}
	if len(r)%2 != 1 {
		return bad("a field without a value")
	}
	for i := 1; i < len(r); i += 2 {
		field, ok1 := r[i].(string)
		value, ok2 := r[i+1].(string)
		if !ok1 || !ok2 {
			return bad(fmt.Sprintf("field %T, value %T", r[i], r[i+1]))
		}
		switch {
		case field == "#":
			out.generation = value
		case field == "#omitted":
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil {
				return bad("#omitted is not a number")
			}
			out.omitted = n
		case strings.HasPrefix(field, "#"):
			// the digest's own counters, not a firing
		default:
			out.jobs = append(out.jobs, value)
		}
	}
	return out, nil
}

// decodeHold reads hold.lua's reply: whether the caller must schedule the
// check that sends the snooze's summary.
func decodeHold(r int64) (schedule bool, err error) {
	if r != 0 && r != 1 {
		return false, fmt.Errorf("hold.lua: unexpected reply %d", r)
	}
	return r == 1, nil
}
