package deliverer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A message's claim key records its delivery on a channel: while a
// deliverer sends it, a claim token (claimTokenPrefix, the deliverer's
// instance and the delivery tag); then its outcome, "sent", "failed",
// "digested", "omitted", "snoozed" or "quiet", for Keep.

// claimTokenPrefix starts every claim token, so that a claim is told from
// an outcome.
const claimTokenPrefix = "c:"

// Outcomes of a claim.
const (
	claimed = iota // ours to send
	done           // sent, digested or failed before
	busy           // another deliverer holds it
)

// claimKey is the Redis key recording a notification's delivery on a
// channel; id is "<message id>:<channel>".
func (d *Deliverer) claimKey(id string) string { return d.cfg.Prefix + ":sent:" + id }

// claimToken is what this deliverer's claim of a delivery holds: the same
// at every try of the delivery's batch, so that a try finds its own claim.
func (d *Deliverer) claimToken(deliveryTag uint64) string {
	return claimTokenPrefix + d.instance + ":" + strconv.FormatUint(deliveryTag, 10)
}

// isClaimToken reports whether a claim key's value is a claim in progress
// rather than an outcome.
func isClaimToken(v string) bool {
	return len(v) > len(claimTokenPrefix) && strings.HasPrefix(v, claimTokenPrefix)
}

// claim marks a notification as being sent by us. A claim left by a crashed
// deliverer expires after twice the send timeout. The value found and its
// TTL are read in one transaction: read one after the other, the holder
// could record the notification as sent in between, and the record's TTL
// (Keep, 48 h) would be taken for the claim's, parking the job for the
// longest retry delay.
func (d *Deliverer) claim(ctx context.Context, key, token string) (int, time.Duration, error) {
	return d.claimAndRead(ctx, key, token, nil)
}

// claimAndRead is claim, with read's commands sent in the same round trip
// where they can be: in the claim's transaction on a single node or
// Sentinel; on a cluster, whose transactions hold one slot's keys, after
// it, and only once the claim is ours.
func (d *Deliverer) claimAndRead(ctx context.Context, key, token string, read func(redis.Cmdable)) (int, time.Duration, error) {
	var set *redis.StatusCmd
	var ttl *redis.DurationCmd
	_, cluster := d.rdb.(*redis.ClusterClient)
	err := d.replicated(ctx, func(rdb redis.Cmdable) error {
		_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			set = p.SetArgs(ctx, key, token, redis.SetArgs{Mode: "NX", Get: true, TTL: 2 * d.cfg.SendTimeout})
			ttl = p.PTTL(ctx, key)
			if read != nil && !cluster {
				read(p)
			}
			return nil
		})
		if errors.Is(err, redis.Nil) {
			err = nil // no claim before ours: set says so below
		}
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("claim %s: %w", key, err)
	}
	old, err := set.Result()
	switch {
	case errors.Is(err, redis.Nil), err == nil && old == token: // ours; or our own, from a failed try of this batch
		if read != nil && cluster {
			read(d.rdb)
		}
		return claimed, 0, nil
	case err != nil:
		return 0, 0, fmt.Errorf("claim %s: %w", key, err)
	case isClaimToken(old):
		return busy, max(ttl.Val(), 0), nil
	}
	return done, 0, nil
}

// release drops our claims, so that the job, scheduled to come back, may
// be claimed again. One DEL a key, pipelined: the keys of a grouped job's
// firings may lie in different cluster slots.
func (d *Deliverer) release(ctx context.Context, keys ...string) error {
	_, err := d.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Del(ctx, k)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("release claims %s: %w", strings.Join(keys, ", "), err)
	}
	return nil
}

func (d *Deliverer) record(ctx context.Context, key, state string) error {
	return d.recordAll(ctx, []string{key}, state)
}

// recordAll records the outcome of a message under each of its keys: on a
// single node or Sentinel in one transaction, so that a grouped message is
// recorded for all of its firings or none; on a cluster, whose slots a
// transaction cannot span, in one pipeline.
func (d *Deliverer) recordAll(ctx context.Context, keys []string, state string) error {
	err := d.replicated(ctx, func(rdb redis.Cmdable) error {
		if len(keys) == 1 {
			return rdb.Set(ctx, keys[0], state, d.cfg.Keep).Err()
		}
		write := rdb.TxPipelined
		if _, cluster := d.rdb.(*redis.ClusterClient); cluster {
			write = rdb.Pipelined
		}
		_, err := write(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.Set(ctx, k, state, d.cfg.Keep)
			}
			return nil
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("record %s as %s: %w", strings.Join(keys, ", "), state, err)
	}
	return nil
}

// replicated runs write and, with Config.WaitReplicas, then waits until
// that many replicas hold it. WAIT counts what its own connection wrote,
// so both run on one connection taken from the pool.
func (d *Deliverer) replicated(ctx context.Context, write func(redis.Cmdable) error) error {
	client, single := d.rdb.(*redis.Client)
	if d.cfg.WaitReplicas <= 0 || !single {
		return write(d.rdb)
	}
	conn := client.Conn()
	defer conn.Close()
	if err := write(conn); err != nil {
		return err
	}
	// write may have written nothing (a record another connection made):
	// a write of this connection's own makes WAIT cover every earlier
	// write in the replication stream, that one included.
	if err := conn.Set(ctx, d.cfg.Prefix+":wait", "", time.Minute).Err(); err != nil {
		return err
	}
	n, err := conn.Do(ctx, "WAIT", d.cfg.WaitReplicas, d.cfg.WaitTimeout.Milliseconds()).Int64()
	if err == nil && n < int64(d.cfg.WaitReplicas) {
		err = fmt.Errorf("%d of %d replicas acknowledged the write within %s", n, d.cfg.WaitReplicas, d.cfg.WaitTimeout)
	}
	return err
}

// Flush records, before the process stops, the outcomes it could not
// record yet (Redis failed right after a send). Kept only in memory, they
// would go with it, and the job's next deliverer would send the message
// again once the claim expired. It tries until every one is recorded or
// ctx ends, and then says how many are left.
func (d *Deliverer) Flush(ctx context.Context) error {
	for {
		var left int
		var last error
		d.unrecorded.Range(func(k, v any) bool {
			if err := d.record(ctx, k.(string), v.(unrecorded).state); err != nil {
				left, last = left+1, err
				return true
			}
			d.unrecorded.Delete(k)
			return true
		})
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d notification outcomes left unrecorded: their messages may be sent again: %w", left, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// unrecorded is an outcome this process could not record (Redis failed
// right after a send).
type unrecorded struct {
	state string
	at    time.Time
}

// remember keeps an outcome that could not be recorded, for settled, under
// each of the message's keys. Outcomes older than Keep are forgotten: their
// job went elsewhere.
func (d *Deliverer) remember(keys []string, state string) {
	now := d.now()
	d.unrecorded.Range(func(k, v any) bool {
		if now.Sub(v.(unrecorded).at) > d.cfg.Keep {
			d.unrecorded.Delete(k)
		}
		return true
	})
	for _, key := range keys {
		d.unrecorded.Store(key, unrecorded{state: state, at: now})
	}
}

// settled records the outcome of an earlier try of this job that could not
// be recorded then. ok reports whether there was one: then the message is
// done, and what it was made of may be cleaned up, once err is nil.
func (d *Deliverer) settled(ctx context.Context, key string) (ok bool, err error) {
	v, ok := d.unrecorded.Load(key)
	if !ok {
		return false, nil
	}
	if err := d.record(ctx, key, v.(unrecorded).state); err != nil {
		return true, err
	}
	d.unrecorded.Delete(key)
	d.log.Info("recorded a notification's outcome after Redis failed", "outcome", v.(unrecorded).state)
	return true, nil
}
