package evaluator

import (
	"slices"
	"sync"
	"time"

	"github.com/klaxonhq/klaxon/internal/queue"
)

// Lanes keep a project's place in the deliverer's line from depending on
// how much other projects sent before it. Each project may put Burst
// delivery jobs at once into the main delivery queue, and Rate more a
// second; its jobs past that go to the bulk queue, which the deliverer
// consumes beside the main one with a share of its own. A project that
// fires rarely is always in the main lane, behind at most every other
// project's burst; a flood of one project's firings, or many projects'
// firings to a provider that is down, waits in the bulk lane. Nothing is
// dropped or merged: a job's lane changes when it is sent, never whether.
//
// Each worker keeps its own counts: with several workers a project may put
// up to Burst jobs into the main lane through each.
type Lanes struct {
	Bulk  string           // the bulk delivery queue
	Burst int              // jobs a project may put into the main lane at once [16]
	Rate  float64          // and a second, after [1]
	Now   func() time.Time // [time.Now]

	mu      sync.Mutex
	buckets map[string]*bucket
}

// Defaults of Lanes.
const (
	DefaultLaneBurst = 4
	DefaultLaneRate  = 1.0
)

type bucket struct {
	tokens float64
	at     time.Time
}

// keptBuckets is how many projects' counts are kept before all are
// forgotten: a project forgotten starts with a full burst again.
const keptBuckets = 100_000

// route sends the jobs of project in msgs past its share of the main lane
// (the messages whose routing key is main) to the bulk lane. A nil Lanes
// leaves every job in the main lane.
func (l *Lanes) route(project, main string, msgs []queue.Message) {
	if l == nil || l.Bulk == "" || !slices.ContainsFunc(msgs, func(m queue.Message) bool { return m.RoutingKey == main }) {
		return // most events fire nothing: no lock, no clock
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b := l.buckets[project]
	if b == nil {
		if l.buckets == nil || len(l.buckets) >= keptBuckets {
			l.buckets = map[string]*bucket{}
		}
		b = &bucket{tokens: float64(l.burst()), at: now}
		l.buckets[project] = b
	}
	b.tokens = min(float64(l.burst()), b.tokens+now.Sub(b.at).Seconds()*l.rate())
	b.at = now
	for i := range msgs {
		if msgs[i].RoutingKey != main {
			continue
		}
		if b.tokens >= 1 {
			b.tokens--
			continue
		}
		msgs[i].RoutingKey = l.Bulk
	}
}

func (l *Lanes) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

func (l *Lanes) burst() int {
	if l.Burst > 0 {
		return l.Burst
	}
	return DefaultLaneBurst
}

func (l *Lanes) rate() float64 {
	if l.Rate > 0 {
		return l.Rate
	}
	return DefaultLaneRate
}
