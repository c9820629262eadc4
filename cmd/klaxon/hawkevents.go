package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/event"
	"github.com/klaxonhq/klaxon/internal/hawkdb"
)

// hawkEvents is Hawk's events database as the commands read it
// (hawkdb.Reader, lazyHawk).
type hawkEvents interface {
	Group(ctx context.Context, projectID, groupHash string) (hawkdb.Group, error)
	Repetitions(ctx context.Context, projectID string, ids []string) (map[string]hawkdb.Repetition, error)
}

// hawkTimeout bounds one read of the events database. A command can wait
// longer than the worker (250 ms): it does not go on without the answer.
const hawkTimeout = 10 * time.Second

// lazyHawk is Hawk's events database as the settings name it
// (KLAXON_EVENTS_MONGO_URL), opened at its first read: a command whose
// events say all it needs reads nothing, and runs with the database down.
// Opening checks that the database answers, so that one that does not is
// said in words within seconds. It is not safe for concurrent use.
type lazyHawk struct {
	cfg config.Config
	r   *hawkdb.Reader
	err error
}

// newHawk is the events database the settings name; nil when they name
// none.
func newHawk(cfg config.Config) *lazyHawk {
	if cfg.EventsMongoURL == "" {
		return nil
	}
	return &lazyHawk{cfg: cfg}
}

func (l *lazyHawk) open(ctx context.Context) (*hawkdb.Reader, error) {
	if l.r != nil || l.err != nil {
		return l.r, l.err
	}
	r, err := hawkdb.NewReader(l.cfg.EventsMongoURL, l.cfg.EventsDatabase, hawkdb.Options{Timeout: hawkTimeout})
	if err == nil {
		if err = r.Reachable(ctx, mongoWithin); err != nil {
			r.Close(context.WithoutCancel(ctx))
		}
	}
	if err != nil {
		l.err = err
		return nil, err
	}
	l.r = r
	return r, nil
}

func (l *lazyHawk) Group(ctx context.Context, projectID, groupHash string) (hawkdb.Group, error) {
	r, err := l.open(ctx)
	if err != nil {
		return hawkdb.Group{}, err
	}
	return r.Group(ctx, projectID, groupHash)
}

func (l *lazyHawk) Repetitions(ctx context.Context, projectID string, ids []string) (map[string]hawkdb.Repetition, error) {
	r, err := l.open(ctx)
	if err != nil {
		return nil, err
	}
	return r.Repetitions(ctx, projectID, ids)
}

// Close disconnects, if it connected.
func (l *lazyHawk) Close(ctx context.Context) {
	if l.r != nil {
		l.r.Close(ctx)
	}
}

// hawkError names the database that failed and the setting that names it.
func hawkError(err error) error {
	return fmt.Errorf("Hawk's events database (%s): %w", config.EnvEventsMongoURL, err)
}

// hawkTaken is what the events database gave one message.
type hawkTaken struct {
	// read is the collection read for it, "events:<projectId>" (its
	// group's document) or "repetitions:<projectId>"; "" for none.
	read string
	// why says why it still has no time; "" when it has one.
	why string
}

// fromHawk gives msgs the time and user they lack as the worker takes them
// from Hawk's events database: an isNew message from its group's document,
// a message with a repetitionId for which repetition holds from its
// repetition's document (and the user, if the same as the first
// occurrence's, from its group's), read in one query per project. What a
// message says itself is kept. A failed read is an error: the answers
// would be wrong without it.
func fromHawk(ctx context.Context, db hawkEvents, msgs []*event.Message, repetition func(*event.Message) bool) ([]hawkTaken, error) {
	taken := make([]hawkTaken, len(msgs))
	ask := map[string][]int{} // by project, the messages to read the repetition of
	var order []string
	for i, m := range msgs {
		ev := &m.Event
		switch {
		case ev.Timestamp != nil && ev.UserID() != "":
		case ev.IsNew:
			if err := fromGroup(ctx, db, m, &taken[i]); err != nil {
				return nil, err
			}
		case ev.RepetitionID == nil || *ev.RepetitionID == "":
			taken[i].why = "it is not its group's first (isNew) and has no repetitionId to read its time by"
		case repetition(m):
			if _, ok := ask[m.ProjectID]; !ok {
				order = append(order, m.ProjectID)
			}
			ask[m.ProjectID] = append(ask[m.ProjectID], i)
		default:
			taken[i].why = "the worker reads a repetition only for an event without event.user in a project with a countBy users rule"
		}
	}
	for _, project := range order {
		if err := fromRepetitions(ctx, db, project, msgs, ask[project], taken); err != nil {
			return nil, err
		}
	}
	for i, m := range msgs {
		if m.Event.Timestamp != nil {
			taken[i].why = ""
		}
	}
	return taken, nil
}

// fromGroup gives an isNew message its group's first occurrence's time and
// user.
func fromGroup(ctx context.Context, db hawkEvents, m *event.Message, t *hawkTaken) error {
	t.read = "events:" + m.ProjectID
	g, err := db.Group(ctx, m.ProjectID, m.Event.GroupHash)
	switch {
	case errors.Is(err, hawkdb.ErrNotFound):
		t.why = fmt.Sprintf("group %s not found in %s", m.Event.GroupHash, t.read)
		return nil
	case err != nil:
		return hawkError(err)
	case g.FirstSeen.IsZero():
		t.why = fmt.Sprintf("group %s in %s has no timestamp", m.Event.GroupHash, t.read)
	}
	m.Event.Fill(g.FirstSeen, g.UserID)
	return nil
}

// fromRepetitions gives the messages at which of a project their
// repetitions' times and users, read in one query.
func fromRepetitions(ctx context.Context, db hawkEvents, project string, msgs []*event.Message, which []int, taken []hawkTaken) error {
	ids := make([]string, len(which))
	for j, i := range which {
		ids[j] = *msgs[i].Event.RepetitionID
	}
	reps, err := db.Repetitions(ctx, project, ids)
	if err != nil {
		return hawkError(err)
	}
	in := "repetitions:" + project
	for _, i := range which {
		ev := &msgs[i].Event
		t := &taken[i]
		t.read = in
		rep, ok := reps[*ev.RepetitionID]
		switch {
		case !ok:
			t.why = fmt.Sprintf("repetition %s not found in %s", *ev.RepetitionID, in)
			continue
		case rep.GroupHash != ev.GroupHash:
			// Not this group's: not Hawk's repetition of it.
			t.why = fmt.Sprintf("repetition %s in %s is of group %s, not %s", *ev.RepetitionID, in, rep.GroupHash, ev.GroupHash)
			continue
		case rep.Time.IsZero():
			t.why = fmt.Sprintf("repetition %s in %s has no timestamp", *ev.RepetitionID, in)
		}
		var first hawkdb.Group
		if rep.SameUser && ev.UserID() == "" {
			// The first occurrence's user is in its group's document.
			first, err = db.Group(ctx, project, ev.GroupHash)
			if err != nil && !errors.Is(err, hawkdb.ErrNotFound) {
				return hawkError(err)
			}
		}
		ev.Fill(rep.Time, rep.User(first))
	}
	return nil
}
