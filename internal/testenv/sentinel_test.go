package testenv

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// The deployment fails over both ways a test needs, and a Sentinel client
// follows it: what the tests of failovers build on.
func TestSentinelFailsOver(t *testing.T) {
	SentinelPhase(t)
	s := StartSentinel(t)
	ctx := context.Background()
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster,
		SentinelAddrs: []string{s.sentinels[0].addr(), s.sentinels[1].addr(), s.sentinels[2].addr()}})
	defer rdb.Close()
	if err := rdb.Set(ctx, "k", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Master().Wait(ctx, 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	first := s.MasterAddr()
	old, promoted := s.KillMaster()
	if old != first || promoted == first || s.MasterAddr() != promoted {
		t.Fatalf("after SIGKILL: old %s, promoted %s, sentinel says %s", old, promoted, s.MasterAddr())
	}
	if v, err := rdb.Get(ctx, "k").Result(); err != nil || v != "1" {
		t.Fatalf("GET through the client after the failover: %q, %v", v, err)
	}
	if old, promoted = s.Failover(); old != promoted && promoted != first {
		t.Fatalf("planned failover promoted %s, want %s back", promoted, first)
	}
	if err := rdb.Set(ctx, "k", "2", 0).Err(); err != nil {
		t.Fatalf("SET through the client after a planned failover: %v", err)
	}
}
