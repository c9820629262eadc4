package hawkdb

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Repetition is what Hawk's events database says of a group's later
// occurrence: a document of repetitions:<projectId>, whose _id is the
// repetitionId the grouper publishes.
type Repetition struct {
	// GroupHash is the group it repeats.
	GroupHash string
	// Time is when it happened (timestamp, Unix seconds, as Hawk's
	// collector stamps an event on receipt; payload.timestamp in older
	// documents); zero when the document has none.
	Time time.Time
	// UserID is its user's id where the document names one.
	UserID string
	// SameUser reports that the document names no user because the
	// repetition's is the first occurrence's: Hawk's grouper stores a
	// repetition as its difference (delta) from the group's first payload.
	SameUser bool
}

// User is the repetition's user's id given its group: its own, or the
// first occurrence's where it has the same; "" for none.
func (r Repetition) User(first Group) string {
	if r.SameUser {
		return first.UserID
	}
	return r.UserID
}

// failure is a project whose repetitions are not read until it expires.
type failure struct {
	err     error
	expires time.Time
}

var repetitionProjection = bson.D{
	{Key: "groupHash", Value: 1}, {Key: "timestamp", Value: 1}, {Key: "delta", Value: 1},
	{Key: "payload.timestamp", Value: 1}, {Key: "payload.user.id", Value: 1},
}

// Repetitions reads a project's repetitions by their ids in one query,
// bounded by Options.Timeout, and returns the ones found by id. Hawk's ids
// are ObjectIds: any other is not asked for. After a failed read the
// project's repetitions are not asked for until Options.TTL has passed,
// and the error is returned at once: a sick database costs one timeout per
// project and period, never one per batch.
func (r *Reader) Repetitions(ctx context.Context, projectID string, ids []string) (map[string]Repetition, error) {
	now := r.opt.Now()
	r.mu.Lock()
	f, down := r.down[projectID]
	r.mu.Unlock()
	if down && now.Before(f.expires) {
		return nil, f.err
	}
	asked := make(map[bson.ObjectID]string, len(ids))
	in := make(bson.A, 0, len(ids))
	for _, id := range ids {
		oid, err := bson.ObjectIDFromHex(id)
		if err != nil {
			continue
		}
		if _, ok := asked[oid]; !ok {
			asked[oid] = id
			in = append(in, oid)
		}
	}
	if len(in) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.opt.Timeout)
	defer cancel()
	out, err := r.readRepetitions(ctx, projectID, in, asked)
	if err != nil {
		if ctx.Err() == nil || context.Cause(ctx) == context.DeadlineExceeded {
			r.remember(projectID, failure{err: err, expires: now.Add(r.opt.TTL)})
		}
		return nil, err
	}
	return out, nil
}

func (r *Reader) readRepetitions(ctx context.Context, projectID string, in bson.A, asked map[bson.ObjectID]string) (map[string]Repetition, error) {
	cur, err := r.db.Collection("repetitions:"+projectID).
		Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: in}}}}, options.Find().SetProjection(repetitionProjection))
	if err != nil {
		return nil, fmt.Errorf("find %d repetitions of project %s: %w", len(in), projectID, err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	out := make(map[string]Repetition, len(in))
	for cur.Next(ctx) {
		// Read field by field: one document some other writer shaped
		// differently costs its own fields, not the batch's.
		doc := cur.Current
		id, ok := doc.Lookup("_id").ObjectIDOK()
		if !ok {
			continue
		}
		group, _ := doc.Lookup("groupHash").StringValueOK()
		rep := Repetition{GroupHash: group}
		ts := seconds(doc.Lookup("timestamp"))
		if ts == 0 {
			ts = seconds(doc.Lookup("payload", "timestamp"))
		}
		if ts != 0 {
			rep.Time = time.UnixMilli(int64(ts * 1000)).UTC()
		}
		if u := userID(doc.Lookup("payload", "user", "id")); u != "" {
			rep.UserID = u
		} else {
			rep.UserID, rep.SameUser = deltaUser(doc.Lookup("delta"))
		}
		out[asked[id]] = rep
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("read repetitions of project %s: %w", projectID, err)
	}
	return out, nil
}

// remember notes a project's failed read, making room as store does.
func (r *Reader) remember(projectID string, f failure) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.down) >= r.opt.MaxEntries {
		clear(r.down)
	}
	r.down[projectID] = f
}

// deltaUser reads a repetition's user out of its delta: the JSON of
// jsondiffpatch's delta (as @n1ru4l/json-patch-plus makes it, old values
// replaced by null) from the group's first payload to the repetition's.
// same reports that the delta leaves the user as it was; a delta Klaxon
// cannot read names no user.
func deltaUser(delta bson.RawValue) (id string, same bool) {
	switch delta.Type {
	case 0, bson.TypeNull, bson.TypeUndefined:
		return "", true // no difference at all
	case bson.TypeString:
	default:
		return "", false
	}
	var d struct {
		User jsontext.Value `json:"user"`
	}
	if json.Unmarshal([]byte(delta.StringValue()), &d, jsontext.AllowDuplicateNames(true)) != nil {
		return "", false
	}
	if d.User == nil {
		return "", true
	}
	var v any
	if json.Unmarshal(d.User, &v) != nil {
		return "", false
	}
	switch v := v.(type) {
	case []any: // the user added, replaced or removed as a whole
		user, _ := changed(v).(map[string]any)
		return jsonID(user["id"]), false
	case map[string]any: // some of the user's fields changed
		idDelta, ok := v["id"]
		if !ok {
			return "", true
		}
		entry, _ := idDelta.([]any)
		return jsonID(changed(entry)), false
	}
	return "", false
}

// changed is the value a delta entry sets: [new] adds it, [old, new]
// replaces the old; [old, 0, 0] deletes, and any other entry sets nothing
// Klaxon can read.
func changed(entry []any) any {
	switch len(entry) {
	case 1:
		return entry[0]
	case 2:
		return entry[1]
	}
	return nil
}

// jsonID is a user id as JavaScript's String() writes it: a string as it
// is, a number in its shortest form; "" for anything else.
func jsonID(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return ""
}

// userID reads a user id the grouper stored (a string; a number another
// catcher sent is taken in its decimal form).
func userID(v bson.RawValue) string {
	switch v.Type {
	case bson.TypeString:
		return v.StringValue()
	case bson.TypeInt32:
		return strconv.FormatInt(int64(v.Int32()), 10)
	case bson.TypeInt64:
		return strconv.FormatInt(v.Int64(), 10)
	case bson.TypeDouble:
		return strconv.FormatFloat(v.Double(), 'g', -1, 64)
	}
	return ""
}

// seconds reads a time as the grouper stores it, Unix seconds (a
// JavaScript number), or a date some other writer used; 0 when it is
// neither, or not a time of the decoder's range (event.Decode).
func seconds(v bson.RawValue) float64 {
	var s float64
	switch v.Type {
	case bson.TypeInt32:
		s = float64(v.Int32())
	case bson.TypeInt64:
		s = float64(v.Int64())
	case bson.TypeDouble:
		s = v.Double()
	case bson.TypeDateTime:
		s = float64(v.DateTime()) / 1000
	}
	if !(s > 0 && s <= 1e11) {
		return 0
	}
	return s
}
