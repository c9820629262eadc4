package evaluator

import (
	"context"
	"sync"

	"github.com/klaxonhq/klaxon/internal/hawkdb"
	"github.com/klaxonhq/klaxon/internal/rules"
)

// Repetitions reads Hawk's repetition documents of a project by their ids
// (hawkdb.Reader: one query, bounded in time). An error means "unknown":
// the events go on as they came.
type Repetitions interface {
	Repetitions(ctx context.Context, projectID string, ids []string) (map[string]hawkdb.Repetition, error)
}

// fromHawk gives the batch's events what they do not say themselves,
// when to count them at and whose they are, from Hawk's events database:
//
//   - an isNew event is its group's first occurrence, whose time and user
//     the group's document has, which the batch read anyway;
//   - an event without event.user of a project with a countBy users rule
//     that has a repetitionId gets its repetition's user and time: one
//     query per project and batch.
//
// A field the event has is kept; what the database does not answer in
// time stays as it came, and never holds the batch. The answer is the
// database's, the same at every try of a batch but for a read that failed
// at one and not at another.
func (e *Evaluator) fromHawk(ctx context.Context, pending []pendingEvent, groups map[groupKey]hawkdb.Group) {
	if groups == nil && e.Repetitions == nil {
		return
	}
	var (
		ask   = map[string][]int{} // by project, the events to read the repetition of
		order []string
		users = map[*rules.Matcher]bool{}
	)
	for i := range pending {
		p := &pending[i]
		ev := &p.m.Event
		g, known := groups[groupKey{p.m.ProjectID, ev.GroupHash}]
		switch {
		case known && g.Ignored:
			continue // never counted
		case ev.IsNew:
			if known {
				ev.Fill(g.FirstSeen, g.UserID)
			}
			continue
		}
		if e.Repetitions == nil || ev.UserID() != "" || ev.RepetitionID == nil || *ev.RepetitionID == "" ||
			!countsUsers(p.matcher, users) {
			continue
		}
		if _, ok := ask[p.m.ProjectID]; !ok {
			order = append(order, p.m.ProjectID)
		}
		ask[p.m.ProjectID] = append(ask[p.m.ProjectID], i)
	}
	if len(order) == 0 {
		return
	}
	found := make([]map[string]hawkdb.Repetition, len(order))
	var (
		wg  sync.WaitGroup
		sem = make(chan struct{}, lookupConcurrency)
	)
	for k, project := range order {
		ids := make([]string, len(ask[project]))
		for j, i := range ask[project] {
			ids[j] = *pending[i].m.Event.RepetitionID
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			reps, err := e.Repetitions.Repetitions(ctx, project, ids)
			if err != nil {
				e.Log.Debug("events database lookup of repetitions failed; going on without it",
					"project", project, "repetitions", len(ids), "error", err)
				return
			}
			found[k] = reps
		})
	}
	wg.Wait()
	for k, project := range order {
		for _, i := range ask[project] {
			ev := &pending[i].m.Event
			rep, ok := found[k][*ev.RepetitionID]
			if !ok || rep.GroupHash != ev.GroupHash {
				continue // not this group's: not Hawk's repetition of it
			}
			// A repetition of the first occurrence's user needs the
			// group's document; without it the user is unknown.
			ev.Fill(rep.Time, rep.User(groups[groupKey{project, ev.GroupHash}]))
		}
	}
}

// countsUsers reports whether m has a countBy users rule, once per matcher.
func countsUsers(m *rules.Matcher, seen map[*rules.Matcher]bool) bool {
	yes, ok := seen[m]
	if !ok {
		for _, r := range m.Rules() {
			yes = yes || r.Users
		}
		seen[m] = yes
	}
	return yes
}
