package testenv_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"

	"github.com/klaxonhq/klaxon/internal/testenv"
)

func TestMongo(t *testing.T) {
	var first string
	t.Run("write", func(t *testing.T) {
		first = testenv.Mongo(t)
		t.Logf("FerretDB start-up took %s", testenv.MongoStartup())
		ctx := t.Context()
		client := connect(t, first)
		coll := client.Database(dbName(t, first)).Collection("projects")
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "n", Value: int32(7)}}); err != nil {
			t.Fatal(err)
		}
		n, err := coll.CountDocuments(ctx, bson.D{})
		if err != nil || n != 1 {
			t.Fatalf("count = %d, %v; want 1", n, err)
		}
	})
	t.Run("isolated", func(t *testing.T) {
		uri := testenv.Mongo(t)
		if dbName(t, uri) == dbName(t, first) {
			t.Fatalf("two tests got database %s", dbName(t, uri))
		}
		names, err := connect(t, uri).ListDatabaseNames(t.Context(), bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if n == dbName(t, first) {
				t.Errorf("database %s of the finished subtest was not dropped (all: %v)", n, names)
			}
		}
	})
}

func connect(t *testing.T, uri string) *mongo.Client {
	t.Helper()
	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	return client
}

func dbName(t *testing.T, uri string) string {
	t.Helper()
	cs, err := connstring.ParseAndValidate(uri)
	if err != nil || cs.Database == "" {
		t.Fatalf("URI %s: database %q, %v", uri, cs.Database, err)
	}
	return cs.Database
}

func TestRedisKeyPrefix(t *testing.T) {
	rdb := testenv.Redis(t)
	var prefix string
	t.Run("write", func(t *testing.T) {
		prefix = testenv.KeyPrefix(t)
		if !strings.HasPrefix(prefix, "klaxontest:") {
			t.Fatalf("prefix %q", prefix)
		}
		for _, k := range []string{prefix + ":a", prefix + ":{b}:c"} {
			if err := rdb.Set(t.Context(), k, "1", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		}
	})
	if other := testenv.KeyPrefix(t); other == prefix {
		t.Fatalf("two tests got prefix %s", prefix)
	}
	keys, err := rdb.Keys(t.Context(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Errorf("keys left after the subtest: %v", keys)
	}
}

func TestQueueName(t *testing.T) {
	url := testenv.AMQPURL(t)
	var name, extra string
	t.Run("declare", func(t *testing.T) {
		name = testenv.QueueName(t)
		extra = name + ".other"
		testenv.DeleteQueuesAtCleanup(t, extra)
		ch := channel(t, url)
		for _, q := range []string{name, name + ".dead", extra} {
			if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
		}
	})
	if other := testenv.QueueName(t); other == name {
		t.Fatalf("two tests got queue %s", name)
	}
	for _, q := range []string{name, name + ".dead", extra} {
		ch := channel(t, url)
		_, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if amqpErr, ok := err.(*amqp.Error); !ok || amqpErr.Code != amqp.NotFound {
			t.Errorf("queue %s after the subtest: passive declare = %v, want NOT_FOUND", q, err)
		}
	}
	if err := testenv.DeleteQueues(url, "klaxontest.never-declared"); err != nil {
		t.Errorf("deleting a queue that does not exist: %v", err)
	}
}

func channel(t *testing.T, url string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}
