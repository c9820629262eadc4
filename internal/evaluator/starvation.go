package evaluator

import (
	"context"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/starved"
)

// starvation counts, per rule, the batch's events it cannot count.
type starvation map[starvedKey]int

type starvedKey struct {
	rule   *rules.Rule
	reason string
}

// add notes the rules of an event without event.user that count users.
func (s *starvation) add(matched []*rules.Rule) {
	for _, r := range matched {
		if reason := starved.Lacks(r, ""); reason != "" {
			if *s == nil {
				*s = make(starvation)
			}
			(*s)[starvedKey{r, reason}]++
		}
	}
}

// tellStarved tells Starved of a batch that was counted, once: a batch
// tried again is told of when it succeeds.
func (e *Evaluator) tellStarved(ctx context.Context, s starvation) {
	if e.Starved == nil {
		return
	}
	for k, n := range s {
		e.Starved.Saw(ctx, k.rule.ProjectID, k.rule, k.reason, n)
	}
}
