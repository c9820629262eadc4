package deliverer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/wire"
)

// Delivery is what the deliverer recorded of one firing on one channel,
// read without changing it (klaxon explain).
type Delivery struct {
	Channel string
	// State is the record of the firing on the channel: "sent", "failed"
	// (its job is in the failed queue), "digested" (gathered for the
	// channel's minPeriod digest), "omitted" (counted in a full digest),
	// "snoozed" (held back while its rule was snoozed), "quiet" (held for
	// its quiet period's recap), "sending" (a
	// deliverer holds it now), or "" when there is no record: not
	// delivered yet, or remembered no more (records last 48 h).
	State string
	// DigestDue is, for a firing waiting in a digest not sent yet, when
	// the digest is due; zero otherwise.
	DigestDue time.Time
}

// Inspect reads the delivery records of firing id of a rule on each
// channel, under prefix, without changing anything.
func Inspect(ctx context.Context, rdb redis.UniversalClient, prefix, projectID, ruleID, id string, channels []string) ([]Delivery, error) {
	d := &Deliverer{cfg: Config{Prefix: prefix}}
	out := make([]Delivery, len(channels))
	for i, ch := range channels {
		out[i].Channel = ch
		state, err := rdb.Get(ctx, d.claimKey(id+":"+ch)).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read delivery of %s on %s: %w", id, ch, err)
		}
		if isClaimToken(state) {
			state = "sending"
		}
		out[i].State = state
		if state != "digested" {
			continue
		}
		keys := d.minPeriodKeys(&wire.Job{ProjectID: projectID, RuleID: ruleID, Channel: ch})
		pending, err := rdb.HExists(ctx, keys.pending, id).Result()
		if err != nil {
			return nil, fmt.Errorf("read digest of rule %s on %s: %w", ruleID, ch, err)
		}
		if !pending {
			continue
		}
		sched, err := rdb.HGet(ctx, keys.state, "sched").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("read digest of rule %s on %s: %w", ruleID, ch, err)
		}
		if ms, err := strconv.ParseInt(sched, 10, 64); err == nil {
			out[i].DigestDue = time.UnixMilli(ms)
		}
	}
	return out, nil
}
