package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/config"
)

// Redis faults a run may inject besides the worker kills.
const (
	FaultNone     = ""
	FaultFailover = "failover" // SENTINEL FAILOVER of a redis+sentinel:// deployment
	FaultReshard  = "reshard"  // redis-cli --cluster reshard of a redis+cluster:// one
)

// faulter injects one kind of Redis fault, one at a time, each waited out
// until the deployment is steady again.
type faulter interface {
	inject(ctx context.Context) (string, error)
}

// newFaulter checks that the Redis URL is of the deployment the fault
// needs and returns its faulter.
func newFaulter(kind string, opts *config.RedisOptions, slots int) (faulter, error) {
	switch kind {
	case FaultFailover:
		if opts.Failover == nil {
			return nil, errors.New("the failover fault needs a redis+sentinel:// URL (-redis)")
		}
		return &failover{opts: opts.Failover}, nil
	case FaultReshard:
		if opts.Cluster == nil {
			return nil, errors.New("the reshard fault needs a redis+cluster:// URL (-redis)")
		}
		if _, err := exec.LookPath("redis-cli"); err != nil {
			return nil, fmt.Errorf("the reshard fault runs redis-cli (Debian's redis-tools): %w", err)
		}
		if slots < 1 {
			return nil, fmt.Errorf("reshard-slots %d: want at least 1", slots)
		}
		return &reshard{opts: opts.Cluster, slots: slots}, nil
	}
	return nil, fmt.Errorf("fault %q: want %q, %q or none", kind, FaultFailover, FaultReshard)
}

// faults injects a fault every interval (after the previous one settled)
// until ctx ends, and returns how many it injected.
// Each fault's span, from injection until it was over, goes to record.
func faults(ctx context.Context, f faulter, every time.Duration, record func(from, to time.Time), log *slog.Logger) (int, error) {
	n := 0
	for {
		if err := pause(ctx, every); err != nil {
			return n, err
		}
		// A fault once injected runs its course (inject bounds itself): cut
		// short, a failover would go on unwatched into the settle phase.
		start := time.Now()
		what, err := f.inject(context.WithoutCancel(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return n, ctx.Err()
			}
			return n, fmt.Errorf("fault %d: %w", n+1, err)
		}
		n++
		record(start, time.Now())
		log.Info("fault", "n", n, "what", what, "took", time.Since(start).Round(time.Millisecond))
	}
}

// failover asks the sentinels for a planned failover and waits until the
// promoted replica is the master every sentinel announces, with a replica
// of its own online again (the old master, resynced), so that the next
// failover can happen and a WAIT for one replica can succeed.
type failover struct{ opts *redis.FailoverOptions }

// watch counts the master changes the first sentinel announces
// (+switch-master) until stop, which returns the count. A planned failover
// is one; more are failovers no one asked for: a master taken for dead,
// a second failure.
func (f *failover) watch(ctx context.Context) (stop func() int) {
	ctx, cancel := context.WithCancel(ctx)
	c := f.sentinel(f.opts.SentinelAddrs[0])
	sub := c.Subscribe(ctx, "+switch-master")
	n, end := 0, make(chan struct{})
	go func() {
		defer close(end)
		for {
			if _, err := sub.ReceiveMessage(ctx); err != nil {
				if pause(ctx, 100*time.Millisecond) != nil {
					return
				}
				continue
			}
			n++
		}
	}()
	return func() int {
		// A receive waiting on the connection does not see ctx: closing
		// the subscription ends it.
		cancel()
		_ = sub.Close()
		<-end
		_ = c.Close()
		return n
	}
}

func (f *failover) sentinel(addr string) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{Addr: addr, Username: f.opts.SentinelUsername,
		Password: f.opts.SentinelPassword, TLSConfig: f.opts.TLSConfig, MaxRetries: -1})
}

func (f *failover) master(ctx context.Context, addr string) (string, error) {
	c := f.sentinel(addr)
	defer c.Close()
	hp, err := c.GetMasterAddrByName(ctx, f.opts.MasterName).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

func (f *failover) inject(ctx context.Context) (string, error) {
	first := f.opts.SentinelAddrs[0]
	old, err := f.master(ctx, first)
	if err != nil {
		return "", fmt.Errorf("ask sentinel %s for the master: %w", first, err)
	}
	// A sentinel refuses while it has no replica fit to promote yet
	// (NOGOODSLAVE) or another failover runs (INPROG): ask again.
	deadline := time.Now().Add(60 * time.Second)
	for {
		c := f.sentinel(first)
		err = c.Failover(ctx, f.opts.MasterName).Err()
		_ = c.Close()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("SENTINEL FAILOVER: %w", err)
		}
		if err := pause(ctx, 200*time.Millisecond); err != nil {
			return "", err
		}
	}
	var promoted string
	err = poll(ctx, time.Until(deadline), func() (bool, string) {
		for _, addr := range f.opts.SentinelAddrs {
			m, err := f.master(ctx, addr)
			if err != nil || m == old || (promoted != "" && m != promoted) {
				return false, fmt.Sprintf("sentinel %s announces %s (%v)", addr, m, err)
			}
			promoted = m
		}
		node := redis.NewClient(&redis.Options{Addr: promoted, Username: f.opts.Username, Password: f.opts.Password,
			TLSConfig: f.opts.TLSConfig, MaxRetries: -1})
		defer node.Close()
		info, err := node.Info(ctx, "replication").Result()
		if err != nil || !strings.Contains(info, "role:master") || !strings.Contains(info, "state=online") {
			return false, fmt.Sprintf("%s replication: %q (%v)", promoted, info, err)
		}
		return true, ""
	})
	if err != nil {
		return "", fmt.Errorf("after SENTINEL FAILOVER from %s: %w", old, err)
	}
	return old + " → " + promoted, nil
}

// reshard moves slots round the masters, from each to the next in the
// order of their ids, with redis-cli --cluster reshard, keys and all, while
// the workers go on. Round, not back and forth: slots moved straight back
// to the master they just left made Redis 7.0 lose track of their owner
// (docs/guarantees.md).
type reshard struct {
	opts  *redis.ClusterOptions
	slots int
	n     int // reshards done
}

func (r *reshard) inject(ctx context.Context) (string, error) {
	seed := r.opts.Addrs[0]
	c := redis.NewClient(&redis.Options{Addr: seed, Username: r.opts.Username, Password: r.opts.Password, TLSConfig: r.opts.TLSConfig})
	defer c.Close()
	shards, err := c.ClusterShards(ctx).Result()
	if err != nil {
		return "", fmt.Errorf("CLUSTER SHARDS of %s: %w", seed, err)
	}
	type master struct {
		id    string
		slots int64
	}
	var masters []master
	for _, s := range shards {
		var n int64
		for _, rg := range s.Slots {
			n += rg.End - rg.Start + 1
		}
		for _, node := range s.Nodes {
			if node.Role == "master" && node.Health == "online" {
				masters = append(masters, master{node.ID, n})
			}
		}
	}
	if len(masters) < 2 {
		return "", fmt.Errorf("cluster of %d masters: nothing to reshard", len(masters))
	}
	slices.SortFunc(masters, func(a, b master) int { return strings.Compare(a.id, b.id) })
	from, to := masters[r.n%len(masters)], masters[(r.n+1)%len(masters)]
	if from.slots < int64(r.slots) {
		return "", fmt.Errorf("master %.8s holds %d slots, fewer than -reshard-slots %d", from.id, from.slots, r.slots)
	}
	r.n++
	// Right after a reshard the nodes may not agree yet on who owns what
	// (gossip), which redis-cli refuses: ask again for a while.
	deadline := time.Now().Add(10 * time.Second)
	for {
		cmd := exec.CommandContext(ctx, "redis-cli", "--cluster", "reshard", seed, "--cluster-from", from.id,
			"--cluster-to", to.id, "--cluster-slots", fmt.Sprint(r.slots), "--cluster-yes")
		cmd.Env = os.Environ()
		if r.opts.Password != "" {
			cmd.Env = append(cmd.Env, "REDISCLI_AUTH="+r.opts.Password)
		}
		out, err := cmd.CombinedOutput()
		if err == nil {
			return fmt.Sprintf("%d slots %.8s → %.8s", r.slots, from.id, to.id), nil
		}
		settling := strings.Contains(string(out), "Nodes don't agree about configuration")
		if !settling || time.Now().After(deadline) {
			tail := string(out)
			if len(tail) > 2000 {
				tail = "…" + tail[len(tail)-2000:]
			}
			return "", fmt.Errorf("redis-cli --cluster reshard: %w\n%s", err, tail)
		}
		if err := pause(ctx, 100*time.Millisecond); err != nil {
			return "", err
		}
	}
}

// poll calls cond until it holds, for up to limit.
func poll(ctx context.Context, limit time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, last := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out: %s", last)
		}
		if err := pause(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}
