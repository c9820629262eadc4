package counter

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// run sends every call of script in one pipeline, loading the script once
// if Redis does not know it (after a restart or failover).
func (e *Engine) run(ctx context.Context, calls []*call) error {
	return e.eval(ctx, e.script, calls)
}

func (e *Engine) eval(ctx context.Context, script *redis.Script, calls []*call) error {
	pending := calls
	loaded, moves, since := false, 0, time.Time{}
	for {
		var wait *redis.Cmd
		_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range pending {
				c.cmd = script.EvalSha(ctx, p, e.declared(ctx, p, c.keys), c.args...)
			}
			if e.waitReplicas > 0 {
				// A pipeline is one connection, and WAIT covers what its
				// connection wrote. A call that writes nothing (a batch
				// replayed after a try whose WAIT failed: another
				// connection made its writes) would pass WAIT at once,
				// and an ack could then outrun the writes it counts on,
				// lost in a failover. A write of the pipeline's own puts
				// it past every earlier write in the replication stream.
				p.Set(ctx, e.prefix+":wait", "", time.Minute)
				wait = p.Do(ctx, "WAIT", e.waitReplicas, e.waitTimeout.Milliseconds())
			}
			return nil
		})
		if err == nil {
			if wait != nil {
				if n, err := wait.Int64(); err != nil || n < int64(e.waitReplicas) {
					return fmt.Errorf("count: %d of %d replicas acknowledged the writes within %s (%v)",
						n, e.waitReplicas, e.waitTimeout, err)
				}
			}
			return nil
		}
		// Only the calls that did not run are sent again; the others counted.
		var missing, moving []*call
		for _, c := range pending {
			if err := c.cmd.Err(); err != nil {
				switch {
				case redis.HasErrorPrefix(err, "NOSCRIPT"):
					missing = append(missing, c)
				case migrating(err): // cluster.go
					moving = append(moving, c)
				default:
					return fmt.Errorf("count %d groups from %s: %w", len(c.keys), c.keys[0], err)
				}
			}
		}
		if len(missing) == 0 && len(moving) == 0 {
			if wait == nil && e.guarded() {
				return nil // only a read of a guard failed: every call ran (cluster.go)
			}
			return fmt.Errorf("count: %w", err)
		}
		if len(missing) > 0 {
			if loaded {
				return fmt.Errorf("count: script still missing after loading it: %w", err)
			}
			// A cluster client sends SCRIPT LOAD to every shard.
			if err := script.Load(ctx, e.rdb).Err(); err != nil {
				return fmt.Errorf("load counting script: %w", err)
			}
			loaded = true
		}
		if len(moving) > 0 {
			if moves == 0 {
				since = time.Now()
			}
			if err := awaitMigration(ctx, moves, since, moving[0].cmd.Err()); err != nil {
				return err
			}
			moves++
			e.slotRetries.Add(int64(len(moving)))
		}
		pending = append(missing, moving...)
	}
}
