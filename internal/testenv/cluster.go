package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterEnv names an existing Redis Cluster to test against
// (comma-separated addresses); unset, Cluster starts one.
const ClusterEnv = "KLAXON_TEST_REDIS_CLUSTER"

// Cluster returns a client of the cluster named by KLAXON_TEST_REDIS_CLUSTER,
// or of a 3-master cluster of redis-server processes of the test's own,
// stopped when it ends, once every node serves every slot.
func Cluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	addrs := strings.Split(os.Getenv(ClusterEnv), ",")
	if addrs[0] == "" {
		addrs = startCluster(t)
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

func startCluster(t testing.TB) []string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found: install Debian's redis-server (see .ci/run): %v", err)
	}
	dir := t.TempDir()
	var addrs []string
	for i := range 3 {
		addr := "127.0.0.1:" + freePort(t)
		_, port, _ := strings.Cut(addr, ":")
		cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-config-file", fmt.Sprintf("nodes-%d.conf", i),
			"--dir", dir, "--save", "", "--appendonly", "no", "--logfile", fmt.Sprintf("%s/redis-%d.log", dir, i))
		if err := cmd.Start(); err != nil {
			t.Fatalf("start redis-server: %v", err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		waitAnswers(t, addr)
		addrs = append(addrs, addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	return addrs
}

func waitAnswers(t testing.TB, addr string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server at %s did not start", addr)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}
