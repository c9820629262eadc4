package evaluator

import (
	"fmt"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/queue"
)

// A project puts its burst into the main lane, then one job a second; the
// rest of its jobs go to the bulk lane, and another project keeps its own
// share whatever the first sent. Messages for other queues stay where
// they were going.
func TestLanesKeepAProjectToItsShare(t *testing.T) {
	now := time.Now()
	l := &Lanes{Bulk: "bulk", Burst: 4, Rate: 1, Now: func() time.Time { return now }}
	jobs := func(n int) []queue.Message {
		var ms []queue.Message
		for i := range n {
			ms = append(ms, queue.Message{RoutingKey: "main", MessageID: fmt.Sprint(i)})
		}
		return append(ms, queue.Message{RoutingKey: "dead"})
	}
	lanes := func(ms []queue.Message) (main, bulk, other int) {
		for _, m := range ms {
			switch m.RoutingKey {
			case "main":
				main++
			case "bulk":
				bulk++
			default:
				other++
			}
		}
		return
	}
	noisy := jobs(10)
	l.route("noisy", "main", noisy)
	if main, bulk, other := lanes(noisy); main != 4 || bulk != 6 || other != 1 {
		t.Errorf("a burst of 10: %d main, %d bulk, %d elsewhere; want 4, 6, 1", main, bulk, other)
	}
	quiet := jobs(2)
	l.route("quiet", "main", quiet)
	if main, bulk, _ := lanes(quiet); main != 2 || bulk != 0 {
		t.Errorf("another project's 2 jobs: %d main, %d bulk; want both in the main lane", main, bulk)
	}
	now = now.Add(2500 * time.Millisecond)
	later := jobs(5)
	l.route("noisy", "main", later)
	if main, bulk, _ := lanes(later); main != 2 || bulk != 3 {
		t.Errorf("5 more jobs 2.5 s later: %d main, %d bulk; want the 2 earned since in the main lane", main, bulk)
	}
	var none *Lanes
	all := jobs(10)
	none.route("noisy", "main", all)
	if main, _, _ := lanes(all); main != 10 {
		t.Errorf("without lanes, %d of 10 jobs in the main lane", main)
	}
}
