package counter

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

// The same scripts on a 3-node Redis Cluster: every call touches one slot.
func TestClusterAgreesWithModel(t *testing.T) {
	rdb := testenv.Cluster(t)
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
