package counter

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// On Redis Cluster a group's keys share one slot (their hash tag), and a
// slot moves between nodes key by key (MIGRATE), so while it migrates the
// group's keys are split between two nodes. A script declares only the
// group's state key, yet reads and writes its pages of ids, firing
// records and users' sets too. Left alone, Redis runs such a call where
// the state key is, and then either fails it halfway, after some writes
// ("Script attempted to access a non local key"), or, on the importing node
// with ASKING, runs it on a part of the group's keys: a page or a firing
// record still on the other node reads as missing, an id counts twice, a
// replay is lost, and a key the call creates there breaks the migration
// (MIGRATE answers BUSYKEY). Declaring every key is not possible: which
// pages exist depends on the state the call reads.
//
// So every call on Cluster also declares "<base>:m", which nothing ever
// writes. Redis serves a call of several keys on a migrating or importing
// slot only when all of them exist, so while the slot migrates the call
// never runs: the node it leaves redirects it (ASK, Redis 7.0) and the
// node it goes to refuses it (TRYAGAIN); outside a migration the key
// costs nothing. The engine sends a refused call again
// once the slot has moved, and gives up (the batch is held and retried
// with its token, counting once) after migrationPatience.

// slotGuard is the key no script writes, declared after the state keys.
func slotGuard(stateKey string) string { return stateKey[:len(stateKey)-1] + "m" }

// guarded reports whether calls declare a slot guard: on Cluster.
func (e *Engine) guarded() bool {
	_, cluster := e.rdb.(*redis.ClusterClient)
	return cluster
}

// declared is the KEYS of a call: its state keys, and on Cluster the guard
// of the (one) group's slot. There it also queues, before the call, a read
// of the guard (EXISTS, 0): go-redis' cluster pipeline sends a node's
// whole batch again when the batch's first reply is TRYAGAIN, and with
// it a call that an ASK already sent elsewhere, so that one call goes to
// two nodes at once (a data race in the client, and the call counted
// twice, which its token turns into a replay). A guard's read, never
// refused with TRYAGAIN, keeps a call from being first.
func (e *Engine) declared(ctx context.Context, p redis.Pipeliner, keys []string) []string {
	if !e.guarded() || len(keys) == 0 {
		return keys
	}
	guard := slotGuard(keys[0])
	p.Exists(ctx, guard)
	return append(keys[:len(keys):len(keys)], guard)
}

// migrating reports whether a call was refused, without running, because
// its slot is moving: TRYAGAIN, or a redirection go-redis gave up on.
func migrating(err error) bool {
	return redis.HasErrorPrefix(err, "TRYAGAIN") || redis.HasErrorPrefix(err, "ASK") ||
		redis.HasErrorPrefix(err, "MOVED")
}

// migrationPatience bounds how long a call waits for its slot to move: a
// slot of a few thousand keys moves in milliseconds; redis-cli takes them
// one slot at a time.
const migrationPatience = 2 * time.Second

// awaitMigration sleeps before the calls refused during a migration are
// sent again (the attempt-th time), or says the slot did not settle.
func awaitMigration(ctx context.Context, attempt int, since time.Time, err error) error {
	if time.Since(since) > migrationPatience {
		return fmt.Errorf("count: a slot still migrating after %s: %w", migrationPatience, err)
	}
	d := min(5*time.Millisecond<<min(attempt, 6), 200*time.Millisecond)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("count: waiting for a slot to migrate: %w", ctx.Err())
	case <-t.C:
		return nil
	}
}
