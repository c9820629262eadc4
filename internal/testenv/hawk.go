package testenv

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// HawkDatabase is a test's own events database in the embedded FerretDB
// (Mongo): its URI, as KLAXON_EVENTS_MONGO_URL takes it, and a handle on
// it to write Hawk's documents with.
func HawkDatabase(t testing.TB) (string, *mongo.Database) {
	t.Helper()
	uri := Mongo(t)
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	return uri, client.Database(strings.TrimPrefix(u.Path, "/"))
}

// HawkGroup writes an event group of project into Hawk's events database
// db as Hawk's grouper writes it (events:<projectId>: the first
// occurrence's time, totalCount, a payload with a backtrace whose top
// frame is app/cart.js:42), with marks as hawk.api's toggleEventMark sets
// them (Unix seconds; nil for none), and one dailyEvents document per day
// it happened from firstSeen on. It returns the document's _id (an
// ObjectId, as the grouper's insert makes it), in hex.
func HawkGroup(t testing.TB, db *mongo.Database, project, groupHash string, total, firstSeen int32, days int, marks bson.M) string {
	t.Helper()
	ctx := context.Background()
	id := bson.NewObjectID()
	doc := bson.M{
		"_id": id, "groupHash": groupHash, "totalCount": total, "catcherType": "errors/javascript",
		"usersAffected": int32(1), "visitedBy": bson.A{}, "timestamp": firstSeen,
		"payload": bson.M{
			"title": "TypeError: x is undefined", "timestamp": firstSeen,
			"backtrace": bson.A{
				bson.M{"file": "app/cart.js", "line": int32(42), "column": int32(7),
					"sourceCode": bson.A{bson.M{"line": int32(42), "content": "x.y()"}}},
				bson.M{"file": "app/main.js", "line": int32(3)},
			},
			"context": `{"a":1}`, "addons": "{}",
		},
	}
	if marks != nil {
		doc["marks"] = marks
	}
	if _, err := db.Collection("events:"+project).InsertOne(ctx, doc); err != nil {
		t.Fatal(err)
	}
	for d := range days {
		day := firstSeen + int32(d)*86400
		if _, err := db.Collection("dailyEvents:"+project).InsertOne(ctx, bson.M{
			"groupHash": groupHash, "groupingTimestamp": day, "count": int32(3), "lastRepetitionTime": day,
		}); err != nil {
			t.Fatal(err)
		}
	}
	return id.Hex()
}

// HawkMark sets a group's mark to at (Unix seconds), or clears it when at
// is 0, as hawk.api's toggleEventMark does ($set or $unset "marks.<mark>").
func HawkMark(t testing.TB, db *mongo.Database, project, groupHash, mark string, at int32) {
	t.Helper()
	update := bson.M{"$set": bson.M{"marks." + mark: at}}
	if at == 0 {
		update = bson.M{"$unset": bson.M{"marks." + mark: ""}}
	}
	if _, err := db.Collection("events:"+project).UpdateOne(context.Background(), bson.M{"groupHash": groupHash}, update); err != nil {
		t.Fatal(err)
	}
}

// HawkGroupUser gives a group's first occurrence a user, as the grouper
// stores the catcher's payload.user ({id, name, ...}).
func HawkGroupUser(t testing.TB, db *mongo.Database, project, groupHash, userID string) {
	t.Helper()
	update := bson.M{"$set": bson.M{"payload.user": bson.M{"id": userID, "name": "User " + userID}}}
	if _, err := db.Collection("events:"+project).UpdateOne(context.Background(), bson.M{"groupHash": groupHash}, update); err != nil {
		t.Fatal(err)
	}
}

// HawkRepetition writes a repetition of a group into repetitions:<project>
// as Hawk's grouper writes it: its time (Unix seconds) and delta, the JSON
// of its difference from the group's first payload ("" for none: the
// grouper then stores no delta). It returns the document's _id in hex, the
// repetitionId the grouper publishes.
func HawkRepetition(t testing.TB, db *mongo.Database, project, groupHash string, at int32, delta string) string {
	t.Helper()
	id := bson.NewObjectID()
	doc := bson.M{"_id": id, "groupHash": groupHash, "timestamp": at}
	if delta != "" {
		doc["delta"] = delta
	}
	if _, err := db.Collection("repetitions:"+project).InsertOne(context.Background(), doc); err != nil {
		t.Fatal(err)
	}
	return id.Hex()
}

// HawkUserDelta is the delta the grouper stores for a repetition whose
// user's id differs from the first occurrence's (and whose context does).
func HawkUserDelta(userID string) string {
	return fmt.Sprintf(`{"context":{"b":[2]},"user":{"id":[null,%q],"name":[null,%q]}}`, userID, "User "+userID)
}
