package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterEnv names an existing Redis Cluster to test against
// (comma-separated addresses); unset, Cluster starts one.
const ClusterEnv = "KLAXON_TEST_REDIS_CLUSTER"

// Cluster returns a client of the cluster named by KLAXON_TEST_REDIS_CLUSTER,
// or of a 3-master cluster of redis-server processes of the test's own
// (StartCluster), stopped when it ends, once every node serves every slot.
func Cluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	skipShort(t, "a Redis Cluster")
	addrs := strings.Split(os.Getenv(ClusterEnv), ",")
	if addrs[0] == "" {
		addrs = StartCluster(t).Addrs
	}
	ctx := context.Background()
	// Every node must see every slot served before the first command, or
	// one may still answer CLUSTERDOWN.
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, err := node.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384") {
				break
			}
			if time.Now().After(deadline) {
				node.Close()
				t.Fatalf("Redis Cluster node %s not ready: %v %q", addr, err, info)
			}
			time.Sleep(100 * time.Millisecond) // polling a condition with a deadline
		}
		node.Close()
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() }); err != nil {
		t.Fatalf("Redis Cluster %v: %v", addrs, err)
	}
	return rdb
}

// LocalCluster is a Redis Cluster of the test's own: three masters, no replicas,
// each a redis-server process on a free port of 127.0.0.1, stopped when the
// test ends. Reshard moves slots between them with redis-cli, as an
// operator would.
type LocalCluster struct {
	t     testing.TB
	dir   string
	Addrs []string
}

// StartCluster starts the cluster and returns once every node sees every
// slot served.
func StartCluster(t testing.TB) *LocalCluster {
	t.Helper()
	skipShort(t, "a Redis Cluster")
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("testenv: redis-server not found (scripts/services.sh installs it): %v", err)
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("testenv: redis-cli not found (scripts/services.sh installs it): %v", err)
	}
	c := &LocalCluster{t: t, dir: t.TempDir()}
	s := &Sentinel{t: t, dir: c.dir, bin: bin} // for spawn and waitFor
	for i := range 3 {
		port := freePort(t)
		p := s.spawn(port, "--port", port, "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-config-file", fmt.Sprintf("nodes-%d.conf", i),
			"--dir", c.dir, "--save", "", "--appendonly", "no", "--logfile", filepath.Join(c.dir, fmt.Sprintf("redis-%d.log", i)))
		t.Cleanup(func() { s.kill(p) })
		c.Addrs = append(c.Addrs, p.addr())
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.waitStable()
	return c
}

// waitStable waits until every node says the cluster is ok with every slot
// served, and no slot is migrating or importing.
func (c *LocalCluster) waitStable() {
	c.t.Helper()
	s := &Sentinel{t: c.t, dir: c.dir}
	for _, addr := range c.Addrs {
		node := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		s.waitFor("Redis Cluster node "+addr+" ready", func() (bool, string) {
			info, err := node.ClusterInfo(context.Background()).Result()
			ok := err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384")
			return ok, fmt.Sprintf("%q (%v)", info, err)
		})
		_ = node.Close()
	}
}

// nodeIDs returns the node id of each address, in Addrs order.
func (c *LocalCluster) nodeIDs(ctx context.Context) ([]string, error) {
	ids := make([]string, len(c.Addrs))
	for i, addr := range c.Addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		id, err := node.Do(ctx, "CLUSTER", "MYID").Text()
		_ = node.Close()
		if err != nil {
			return nil, fmt.Errorf("CLUSTER MYID of %s: %w", addr, err)
		}
		ids[i] = id
	}
	return ids, nil
}

// Slots returns the slots node i serves, in order.
func (c *LocalCluster) Slots(i int) []int {
	c.t.Helper()
	node := redis.NewClient(&redis.Options{Addr: c.Addrs[i]})
	defer node.Close()
	ranges, err := node.ClusterSlots(context.Background()).Result()
	if err != nil {
		c.t.Fatalf("testenv: CLUSTER SLOTS: %v", err)
	}
	var slots []int
	for _, r := range ranges {
		if len(r.Nodes) > 0 && r.Nodes[0].Addr == c.Addrs[i] {
			for s := r.Start; s <= r.End; s++ {
				slots = append(slots, s)
			}
		}
	}
	sort.Ints(slots)
	return slots
}

// Reshard moves n slots from node from to node to with redis-cli --cluster
// reshard (the lowest-numbered of from's slots: redis-cli takes them in
// order), keys and all, while clients go on. Right after a reshard the
// nodes may not agree yet on who owns what (gossip), which redis-cli
// refuses: it is asked again for up to 10 s. It returns what redis-cli
// printed and its error, so that a caller running it on a goroutine
// reports it itself.
func (c *LocalCluster) Reshard(ctx context.Context, from, to, n int) (string, error) {
	ids, err := c.nodeIDs(ctx)
	if err != nil {
		return "", err
	}
	start := time.Now()
	for {
		out, err := exec.CommandContext(ctx, "redis-cli", "--cluster", "reshard", c.Addrs[0],
			"--cluster-from", ids[from], "--cluster-to", ids[to], "--cluster-slots", fmt.Sprint(n),
			"--cluster-yes").CombinedOutput()
		if err == nil {
			return string(out), c.waitAgreed(ctx)
		}
		if !Unsettled(string(out)) || time.Since(start) > 10*time.Second || ctx.Err() != nil {
			return string(out), fmt.Errorf("redis-cli --cluster reshard %d slots %s → %s after %s: %w",
				n, c.Addrs[from], c.Addrs[to], time.Since(start).Round(time.Millisecond), err)
		}
		time.Sleep(100 * time.Millisecond) // the nodes' gossip, polled with a deadline
	}
}

// waitAgreed waits, for up to 10 s, until every node tells the same owner
// of every slot: moving the same slots again before the last move reached
// every node can leave a slot with no owner (seen with Redis 7.0).
func (c *LocalCluster) waitAgreed(ctx context.Context) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var first, last string
		agreed := true
		for i, addr := range c.Addrs {
			node := redis.NewClient(&redis.Options{Addr: addr})
			slots, err := node.ClusterSlots(ctx).Result()
			_ = node.Close()
			if err != nil {
				return fmt.Errorf("CLUSTER SLOTS of %s: %w", addr, err)
			}
			sort.Slice(slots, func(a, b int) bool { return slots[a].Start < slots[b].Start })
			var b strings.Builder
			covered := 0
			for _, r := range slots {
				fmt.Fprintf(&b, "%d-%d:%s ", r.Start, r.End, r.Nodes[0].Addr)
				covered += r.End - r.Start + 1
			}
			last = b.String()
			if i == 0 {
				first = last
			}
			if last != first || covered != 16384 {
				agreed = false
			}
		}
		if agreed {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the nodes do not agree on the slots 10 s after a reshard: %s / %s", first, last)
		}
		time.Sleep(50 * time.Millisecond) // the nodes' gossip, polled with a deadline
	}
}

// Unsettled reports whether redis-cli refused to reshard only because the
// nodes do not agree yet on the configuration a moment ago changed.
func Unsettled(redisCLIOutput string) bool {
	return strings.Contains(redisCLIOutput, "Nodes don't agree about configuration")
}

// ReshardPhaseEnv runs the tests that move Redis Cluster slots while
// events flow: they take tens of seconds of both cores, so scripts/test.sh
// runs them in the phase of the Sentinel tests, after the others.
const ReshardPhaseEnv = "KLAXON_TEST_RESHARD"

// ReshardPhase skips t unless ReshardPhaseEnv is 1.
func ReshardPhase(t testing.TB) {
	t.Helper()
	if os.Getenv(ReshardPhaseEnv) != "1" {
		t.Skipf("moves Redis Cluster slots mid-stream; set %s=1 to run it (scripts/test.sh does)", ReshardPhaseEnv)
	}
}
