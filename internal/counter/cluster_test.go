package counter

import (
	"context"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// The same scripts on a 3-node Redis Cluster: every call touches one slot.
func TestClusterAgreesWithModel(t *testing.T) {
	rdb := testCluster(t)
	differential(t, rdb, 40, 7)
	// The streams' groups must have spread over every node.
	var used atomic.Int32
	rdb.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		if n, _ := c.DBSize(ctx).Result(); n > 0 {
			used.Add(1)
		}
		return nil
	})
	if used.Load() < 3 {
		t.Errorf("keys on %d of 3 masters: the test did not exercise cross-node batches", used.Load())
	}
}

// testCluster returns a client of the cluster named by
// KLAXON_TEST_REDIS_CLUSTER (comma-separated addresses), or of a 3-master
// cluster of redis-server processes it starts for this test.
func testCluster(t *testing.T) *redis.ClusterClient {
	t.Helper()
	addrs := strings.Split(os.Getenv("KLAXON_TEST_REDIS_CLUSTER"), ",")
	if addrs[0] == "" {
		addrs = testenv.StartCluster(t).Addrs
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
