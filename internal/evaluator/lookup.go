package evaluator

import (
	"context"
	"errors"
	"sync"

	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/hawkdb"
	"github.com/klaxonhq/klaxon/internal/queue"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// pendingEvent is a decoded event of a project with rules, before matching.
type pendingEvent struct {
	d       *queue.Delivery
	m       event.Message
	matcher *rules.Matcher
}

type groupKey struct{ project, group string }

// lookupConcurrency bounds the reads of Hawk's events database one batch
// has in flight; each is bounded in time by the reader.
const lookupConcurrency = 16

// lookupGroups reads the batch's groups, each once, concurrently: what the
// database does not answer in time is absent, and the events go on
// without it.
func (e *Evaluator) lookupGroups(ctx context.Context, pending []pendingEvent) map[groupKey]hawkdb.Group {
	if e.Groups == nil || len(pending) == 0 {
		return nil
	}
	seen := make(map[groupKey]bool)
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out = make(map[groupKey]hawkdb.Group)
		sem = make(chan struct{}, lookupConcurrency)
	)
	for i := range pending {
		k := groupKey{pending[i].m.ProjectID, pending[i].m.Event.GroupHash}
		if seen[k] {
			continue
		}
		seen[k] = true
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			g, err := e.Groups.Group(ctx, k.project, k.group)
			if err != nil {
				if !errors.Is(err, hawkdb.ErrNotFound) {
					e.Log.Debug("events database lookup failed; going on without it", "project", k.project, "group", k.group, "error", err)
				}
				return
			}
			mu.Lock()
			out[k] = g
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}
