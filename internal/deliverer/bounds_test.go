package deliverer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/pacing"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// messages is a provider that keeps every message it accepts.
type messages struct {
	mu   sync.Mutex
	sent []*notify.Message
}

func (m *messages) Notify(_ context.Context, _ string, msg *notify.Message) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sent = append(m.sent, msg)
	return false, nil
}

// gatherMany passes n firings of one rule and channel through a one-hour
// minPeriod, then ends the minPeriod and flushes the digest once.
func gatherMany(t *testing.T, d *Deliverer, n int) (flush *wire.Job, pendingFields int64) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		j := periodJob(t, "n"+time.Duration(i).String(), time.Hour)
		if err := d.deliverFirings(ctx, &j, "tok"); err != nil {
			t.Fatal(err)
		}
	}
	flush = flushJob(&wire.Job{Channel: "slack", Endpoint: "https://hooks.example/T1", ProjectID: "p"}, "r", time.Hour.Milliseconds())
	keys := d.minPeriodKeys(flush)
	pendingFields = d.rdb.HLen(ctx, keys.pending).Val()
	if err := d.rdb.HSet(ctx, keys.state, "last", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := d.deliverDigest(ctx, flush, "tok"); err != nil {
		t.Fatal(err)
	}
	return flush, pendingFields
}

// A minPeriod of 30 s and 20,000 new groups made a 14.5 MB pending hash, a
// 180 ms flush script and an 8.4 MB webhook POST. What one (rule, channel)
// gathers is bounded by count; the rest is counted, and the digest says so.
func TestDigestIsBoundedByCountAndSaysHowManyItLeftOut(t *testing.T) {
	rec := &messages{}
	_, d := declaredDeliverer(t, Config{DigestMaxFirings: 20, Limits: map[string][]pacing.Limit{}}, map[string]notify.Channel{"slack": rec})
	const n = 300
	_, fields := gatherMany(t, d, n)
	// 20 jobs and the digest's own count, size and omitted fields.
	if fields > 20+3 {
		t.Errorf("pending hash has %d fields, want at most 20 firings and 3 counts", fields)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.sent) != 2 {
		t.Fatalf("sent %d messages, want the first firing at once, then one digest", len(rec.sent))
	}
	dg := rec.sent[1]
	if !dg.Digest || len(dg.Notifications) != 20 || dg.Omitted != n-1-20 {
		t.Errorf("digest lists %d firings and omits %d (digest %v), want 20 and %d", len(dg.Notifications), dg.Omitted, dg.Digest, n-1-20)
	}
	if got := counterValue(t, d, "slack", "omitted"); got != n-1-20 {
		t.Errorf("omitted counter %v, want %d", got, n-1-20)
	}
}

// The byte bound holds whatever the count: big firings fill a digest sooner.
func TestDigestIsBoundedByBytes(t *testing.T) {
	rec := &messages{}
	_, d := declaredDeliverer(t, Config{DigestMaxBytes: 2000, Limits: map[string][]pacing.Limit{}}, map[string]notify.Channel{"slack": rec})
	const n = 100
	gatherMany(t, d, n)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.sent) != 2 {
		t.Fatalf("sent %d messages, want the first firing at once, then one digest", len(rec.sent))
	}
	dg := rec.sent[1]
	listed := len(dg.Notifications)
	if listed == 0 || listed > 2000/200 || int64(listed)+dg.Omitted != n-1 {
		t.Errorf("digest lists %d firings and omits %d, want a few (jobs are over 200 bytes) and %d in all", listed, dg.Omitted, n-1)
	}
}

// A job left out of a full digest, redelivered because its worker died
// before recording it, is not counted twice.
func TestRedeliveredOmittedJobCountsOnce(t *testing.T) {
	ctx := context.Background()
	rec := &messages{}
	_, d := declaredDeliverer(t, Config{DigestMaxFirings: 1, Limits: map[string][]pacing.Limit{}}, map[string]notify.Channel{"slack": rec})
	for _, id := range []string{"a", "b", "c", "c"} { // c comes twice
		j := periodJob(t, id, time.Hour)
		if id == "c" {
			d.rdb.Del(ctx, d.claimKey(j.Key())) // its record was never written
		}
		if err := d.deliverFirings(ctx, &j, "tok"); err != nil {
			t.Fatal(err)
		}
	}
	flush := flushJob(&wire.Job{Channel: "slack", Endpoint: "https://hooks.example/T1", ProjectID: "p"}, "r", time.Hour.Milliseconds())
	d.rdb.HSet(ctx, d.minPeriodKeys(flush).state, "last", 0)
	if err := d.deliverDigest(ctx, flush, "tok"); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if dg := rec.sent[len(rec.sent)-1]; len(dg.Notifications) != 1 || dg.Omitted != 1 {
		t.Errorf("digest lists %d and omits %d, want b listed and c omitted once", len(dg.Notifications), dg.Omitted)
	}
}

// The failed queue, which nothing consumes, kept every failure of every
// project: bounded, it keeps the newest.
func TestFailedQueueIsBounded(t *testing.T) {
	pub, d := declaredDeliverer(t, Config{FailedBounds: queue.Bounds{MaxMessages: 3}}, nil)
	for i := range 5 {
		if err := pub.Publish(t.Context(), queue.Message{RoutingKey: d.cfg.FailedQueue, MessageID: fmt.Sprint(i), Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := pub.Depth(t.Context(), d.cfg.FailedQueue)
	if err != nil || n != 3 {
		t.Errorf("failed queue holds %d messages (%v), want its bound of 3", n, err)
	}
}
