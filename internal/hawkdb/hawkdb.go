// Package hawkdb reads Hawk's events database: what the tracker knows of an
// event group (how often and since when it happens, its top backtrace
// frame, its first occurrence's user), the marks people set on it
// (resolved, ignored), and when and to whom a repetition happened.
// docs/contract.md §4.6 describes the documents as Hawk writes them.
//
// Lookups sit on the evaluator's path, so each is bounded: a Reader answers
// groups from a small cache for a few seconds, reads a batch's repetitions
// of a project in one query, and remembers a lookup that is slow or fails
// as failed for as long, so that a sick database costs one timeout per
// group (or project) and period, never one per event.
package hawkdb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/klaxonhq/klaxon/internal/store"
)

// Group is what Hawk's events database says about one event group.
type Group struct {
	// ID is the group document's _id (an ObjectId's hex digits, as
	// hawk.api loads an event and Hawk's pages link to it); "" when it is
	// of no type a link could carry.
	ID string
	// TotalCount is Hawk's count of the group's events (totalCount).
	TotalCount int64
	// FirstSeen is when Hawk first saw the group (timestamp); zero when
	// unknown.
	FirstSeen time.Time
	// DaysRepeated is on how many days the group happened: the number
	// of its dailyEvents documents, as Hawk's senders count it.
	DaysRepeated int64
	// TopFrame is the first frame of the backtrace, "file:line" (or the
	// file alone), "" when the event has none.
	TopFrame string
	// Resolved is when the group was marked resolved (marks.resolved,
	// Unix seconds), 0 when it is not: it names the resolution.
	Resolved int64
	// Ignored reports whether the group is marked ignored.
	Ignored bool
	// UserID is the first occurrence's user (payload.user.id), "" when it
	// has none: the user of the group's isNew event, and of a repetition
	// whose user Hawk did not store because it is the same (Repetition).
	UserID string
}

// ErrNotFound is returned for a group the events database does not hold
// (yet: Hawk's grouper may not have written a new group when Klaxon reads).
var ErrNotFound = errors.New("event group not found")

// Options tune a Reader; zero values take the defaults.
type Options struct {
	// Timeout bounds one lookup [250ms].
	Timeout time.Duration
	// TTL is how long an answer, or a failure, is reused [5s].
	TTL time.Duration
	// MaxEntries bounds the cache [100,000 groups].
	MaxEntries int
	// Now is the clock [time.Now].
	Now func() time.Time
}

// Reader looks groups up in Hawk's events database through a cache. It is
// safe for concurrent use.
type Reader struct {
	client *mongo.Client
	db     *mongo.Database
	opt    Options

	mu    sync.Mutex
	cache map[key]entry
	down  map[string]failure // projects whose repetitions failed to read
}

type key struct{ project, group string }

type entry struct {
	g       Group
	err     error
	expires time.Time
}

// NewReader makes a Reader of the database at url; it connects lazily.
func NewReader(url, database string, opt Options) (*Reader, error) {
	client, err := mongo.Connect(options.Client().ApplyURI(url).SetAppName("klaxon"))
	if err != nil {
		return nil, fmt.Errorf("MongoDB client of the events database: %w", err)
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 250 * time.Millisecond
	}
	if opt.TTL <= 0 {
		opt.TTL = 5 * time.Second
	}
	if opt.MaxEntries <= 0 {
		opt.MaxEntries = 100_000
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	return &Reader{client: client, db: client.Database(database), opt: opt, cache: make(map[key]entry),
		down: make(map[string]failure)}, nil
}

// Reachable pings the database and waits at most within for the answer:
// a store.UnreachableError says in words that none came. Callers that
// must not go on without the database (the command-line tools) ask first.
func (r *Reader) Reachable(ctx context.Context, within time.Duration) error {
	return store.Ping(ctx, r.client, within)
}

// Close disconnects from the database.
func (r *Reader) Close(ctx context.Context) error { return r.client.Disconnect(ctx) }

// Group returns what the events database says about a project's group,
// from the cache when it answered within TTL. An error (ErrNotFound, a
// timeout, a failure) means "unknown": callers go on without it.
func (r *Reader) Group(ctx context.Context, projectID, groupHash string) (Group, error) {
	k := key{projectID, groupHash}
	now := r.opt.Now()
	r.mu.Lock()
	e, ok := r.cache[k]
	r.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.g, e.err
	}
	ctx, cancel := context.WithTimeout(ctx, r.opt.Timeout)
	defer cancel()
	g, err := r.read(ctx, projectID, groupHash)
	if err != nil && ctx.Err() != nil && context.Cause(ctx) != context.DeadlineExceeded {
		// The caller gave up, not the database: remember nothing.
		return g, err
	}
	r.store(k, entry{g: g, err: err, expires: now.Add(r.opt.TTL)}, now)
	return g, err
}

// store keeps an answer, making room first: expired entries go, and if
// that is not enough, all of them (a burst of new groups costs a round of
// misses, never unbounded memory).
func (r *Reader) store(k key, e entry, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.cache) >= r.opt.MaxEntries {
		for k, old := range r.cache {
			if !now.Before(old.expires) {
				delete(r.cache, k)
			}
		}
		if len(r.cache) >= r.opt.MaxEntries {
			clear(r.cache)
		}
	}
	r.cache[k] = e
}

// groupDoc is the part of Hawk's group document (events:<projectId>) read.
type groupDoc struct {
	ID         bson.RawValue `bson:"_id"`
	TotalCount int64         `bson:"totalCount"`
	Timestamp  float64       `bson:"timestamp"`
	Payload    struct {
		Timestamp float64 `bson:"timestamp"`
		User      struct {
			ID bson.RawValue `bson:"id"`
		} `bson:"user"`
		Backtrace []struct {
			File string `bson:"file"`
			Line int64  `bson:"line"`
		} `bson:"backtrace"`
	} `bson:"payload"`
	Marks struct {
		Resolved bson.RawValue `bson:"resolved"`
		Ignored  bson.RawValue `bson:"ignored"`
	} `bson:"marks"`
}

var projection = bson.D{
	{Key: "totalCount", Value: 1}, {Key: "timestamp", Value: 1},
	{Key: "payload.timestamp", Value: 1}, {Key: "payload.backtrace", Value: 1},
	{Key: "payload.user.id", Value: 1}, {Key: "marks", Value: 1},
}

func (r *Reader) read(ctx context.Context, projectID, groupHash string) (Group, error) {
	var d groupDoc
	err := r.db.Collection("events:"+projectID).
		FindOne(ctx, bson.D{{Key: "groupHash", Value: groupHash}}, options.FindOne().SetProjection(projection)).
		Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return Group{}, ErrNotFound
	}
	if err != nil {
		return Group{}, fmt.Errorf("find group %s of project %s: %w", groupHash, projectID, err)
	}
	days, err := r.db.Collection("dailyEvents:"+projectID).CountDocuments(ctx, bson.D{{Key: "groupHash", Value: groupHash}})
	if err != nil {
		return Group{}, fmt.Errorf("count days of group %s of project %s: %w", groupHash, projectID, err)
	}
	g := Group{
		ID:           docID(d.ID),
		TotalCount:   d.TotalCount,
		DaysRepeated: days,
		Resolved:     mark(d.Marks.Resolved),
		Ignored:      mark(d.Marks.Ignored) != 0,
		UserID:       userID(d.Payload.User.ID),
	}
	// Hawk's grouper writes the first occurrence's time at the top; older
	// documents have it only in the payload.
	if ts := d.Timestamp; ts > 0 || d.Payload.Timestamp > 0 {
		if ts == 0 {
			ts = d.Payload.Timestamp
		}
		g.FirstSeen = time.UnixMilli(int64(ts * 1000)).UTC()
	}
	if len(d.Payload.Backtrace) > 0 {
		f := d.Payload.Backtrace[0]
		g.TopFrame = f.File
		if f.Line > 0 {
			g.TopFrame = fmt.Sprintf("%s:%d", f.File, f.Line)
		}
	}
	return g, nil
}

// docID reads a document's _id: Hawk's are ObjectIds; a string that some
// other writer used is taken as it is.
func docID(v bson.RawValue) string {
	switch v.Type {
	case bson.TypeObjectID:
		return v.ObjectID().Hex()
	case bson.TypeString:
		return v.StringValue()
	}
	return ""
}

// mark reads a mark as hawk.api's toggleEventMark sets it, Unix seconds
// (a JavaScript number: int32, int64 or double); a date or a true some
// other writer may have left counts as set, false or null as unset.
func mark(v bson.RawValue) int64 {
	switch v.Type {
	case bson.TypeInt32:
		return int64(v.Int32())
	case bson.TypeInt64:
		return v.Int64()
	case bson.TypeDouble:
		return int64(v.Double())
	case bson.TypeDateTime:
		return v.DateTime() / 1000
	case bson.TypeBoolean:
		if v.Boolean() {
			return 1
		}
	}
	return 0
}
