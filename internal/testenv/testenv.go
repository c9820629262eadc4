// Package testenv gives tests the real services Klaxon runs against, each
// isolated per test:
//
//   - Mongo: an embedded FerretDB (MongoDB wire protocol over SQLite),
//     started in-process once per test binary; each test gets its own
//     database, dropped when the test ends.
//   - Redis: the Redis at KLAXON_TEST_REDIS_URL [redis://127.0.0.1:6379/0];
//     each test gets its own key prefix, whose keys are deleted when it ends.
//   - AMQPURL: the RabbitMQ at KLAXON_TEST_AMQP_URL
//     [amqp://guest:guest@127.0.0.1:5672/]; each test gets its own queue
//     names, deleted when it ends.
//
// Redis and RabbitMQ are not faked: a test that asks for one that does not
// answer fails, saying how to start it (.ci/run starts both). Under
// go test -short every helper that gives a service (these, and the
// deployments a test starts of its own) skips the test instead, so that
// -short runs the tests that need none, with no service running.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/klaxonhq/klaxon/internal/queue"
)

// Environment variables naming the services tests use, and their defaults.
const (
	RedisURLEnv     = "KLAXON_TEST_REDIS_URL"
	DefaultRedisURL = "redis://127.0.0.1:6379/0"
	AMQPURLEnv      = "KLAXON_TEST_AMQP_URL"
	DefaultAMQPURL  = "amqp://guest:guest@127.0.0.1:5672/"
)

// dialTimeout bounds each check that a service answers, and each cleanup.
const dialTimeout = 5 * time.Second

// ferret is the FerretDB shared by every test of one test binary.
//
// It is this package's only package-level mutable state, and it is there on
// purpose: tests of different packages and files call Mongo without sharing
// anything else, one server per binary keeps them fast, and ferretdb.New
// itself writes a global (version.Get().Package), so starting one server per
// test would race under -race when tests run in parallel. It is written once,
// inside once.Do, and only read afterwards.
var ferret struct {
	once    sync.Once
	uri     *url.URL // mongodb://127.0.0.1:port/
	dir     string
	startup time.Duration // from ferretdb.New to a successful ping
	err     error
}

// Mongo returns a MongoDB URI whose path names a database unique to the test,
// for example "mongodb://127.0.0.1:40123/t_TestLoad_3f9c0a6e1b2d". The server
// is an embedded FerretDB (SQLite handler, data in a temporary directory)
// that the first call starts and that lives as long as the test binary; the
// database is dropped when the test ends.
//
// Read cursors to the end or close them: FerretDB's SQLite handler holds a
// connection per open cursor.
func Mongo(t testing.TB) string {
	t.Helper()
	skipShort(t, "MongoDB (an embedded FerretDB)")
	ferret.once.Do(startFerret)
	if ferret.err != nil {
		t.Fatalf("testenv: start embedded FerretDB: %v", ferret.err)
	}
	t.Logf("testenv: embedded FerretDB at %s (data in %s) started in %s", ferret.uri, ferret.dir, ferret.startup)

	db := "t_" + sanitize(t.Name(), 40) + "_" + randomHex(6)
	u := *ferret.uri
	u.Path = "/" + db
	uri := u.String()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
		defer cancel()
		if err := dropDatabase(ctx, uri, db); err != nil {
			t.Errorf("testenv: drop MongoDB database %s: %v", db, err)
		}
	})
	return uri
}

// MongoStartup is how long the embedded FerretDB took to start and answer a
// ping, or 0 before the first call of Mongo.
func MongoStartup() time.Duration {
	return ferret.startup
}

// ferretDirPattern names the data directories, in os.TempDir().
const ferretDirPattern = "klaxon-testenv-ferretdb-*"

func startFerret() {
	removeStaleDirs()
	dir, err := os.MkdirTemp("", ferretDirPattern)
	if err != nil {
		ferret.err = fmt.Errorf("create data directory: %w", err)
		return
	}
	ferret.dir = dir
	begin := time.Now()
	f, err := ferretdb.New(&ferretdb.Config{
		// New binds the listener, so the port is known before Run.
		Listener: ferretdb.ListenerConfig{TCP: "127.0.0.1:0"},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})).
			With("component", "testenv-ferretdb"),
		Handler:   "sqlite",
		SQLiteURL: (&url.URL{Scheme: "file", Path: dir + "/"}).String(),
	})
	if err != nil {
		ferret.err = err
		return
	}
	// The server runs until the test binary exits; every test database is
	// dropped by its own test, so the directory is left empty (and removed
	// by a test binary a day later).
	go func() { _ = f.Run(context.Background()) }()

	uri, err := url.Parse(f.MongoDBURI())
	if err != nil {
		ferret.err = fmt.Errorf("parse FerretDB URI: %w", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pingMongo(ctx, uri.String()); err != nil {
		ferret.err = fmt.Errorf("ping FerretDB at %s: %w", uri, err)
		return
	}
	ferret.uri = uri
	ferret.startup = time.Since(begin)
}

// removeStaleDirs removes the data directories that earlier test binaries
// left, empty, more than a day ago (a binary cannot remove its own when it
// exits). os.Remove leaves a directory that is not empty.
func removeStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), ferretDirPattern))
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() && time.Since(fi.ModTime()) > 24*time.Hour {
			_ = os.Remove(d)
		}
	}
}

func pingMongo(ctx context.Context, uri string) (err error) {
	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() { err = errors.Join(err, client.Disconnect(context.WithoutCancel(ctx))) }()
	return client.Ping(ctx, nil)
}

func dropDatabase(ctx context.Context, uri, db string) (err error) {
	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() { err = errors.Join(err, client.Disconnect(context.WithoutCancel(ctx))) }()
	return client.Database(db).Drop(ctx)
}

// RedisURL returns KLAXON_TEST_REDIS_URL or redis://127.0.0.1:6379/0.
func RedisURL() string {
	return envOr(RedisURLEnv, DefaultRedisURL)
}

// Redis returns a client of the test Redis (see RedisURL), closed when the
// test ends. The test fails at once if Redis does not answer. Keep keys under
// KeyPrefix(t): tests of every package share this Redis.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	skipShort(t, "Redis")
	rdb, err := dialRedis()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func dialRedis() (*redis.Client, error) {
	raw := RedisURL()
	opts, err := redis.ParseURL(raw)
	if err != nil {
		return nil, fmt.Errorf("%s=%q: %w", RedisURLEnv, redact(raw), err)
	}
	rdb := redis.NewClient(opts)
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("Redis at %s does not answer (%w); start it with scripts/services.sh, or point %s at one",
			redact(raw), err, RedisURLEnv)
	}
	return rdb, nil
}

// KeyPrefix returns a Redis key prefix unique to the test, such as
// "klaxontest:9b1f03c2e4a5", to use as the namespace of every key the test
// writes. When the test ends, every key starting with it is deleted from the
// test Redis (see RedisURL). The test fails at once if Redis does not answer.
func KeyPrefix(t testing.TB) string {
	t.Helper()
	skipShort(t, "Redis")
	rdb, err := dialRedis()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	prefix := "klaxontest:" + randomHex(6)
	t.Cleanup(func() {
		defer rdb.Close()
		// A scan visits the whole keyspace: give a Redis that other tests or
		// benchmarks fill with many keys time to finish it.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := deleteKeys(ctx, rdb, prefix); err != nil {
			t.Errorf("testenv: delete Redis keys %s*: %v", prefix, err)
		}
	})
	return prefix
}

// deleteKeys deletes every key that starts with prefix, which holds no glob
// metacharacters.
func deleteKeys(ctx context.Context, rdb *redis.Client, prefix string) error {
	iter := rdb.Scan(ctx, 0, prefix+"*", 5000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			if err := rdb.Unlink(ctx, batch...).Err(); err != nil {
				return fmt.Errorf("unlink: %w", err)
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("scan: %w", err)
	}
	if len(batch) > 0 {
		if err := rdb.Unlink(ctx, batch...).Err(); err != nil {
			return fmt.Errorf("unlink: %w", err)
		}
	}
	return nil
}

// AMQPURL returns the URL of the test RabbitMQ: KLAXON_TEST_AMQP_URL or
// amqp://guest:guest@127.0.0.1:5672/. The test fails at once if RabbitMQ
// does not accept a connection there.
func AMQPURL(t testing.TB) string {
	t.Helper()
	skipShort(t, "RabbitMQ")
	raw := envOr(AMQPURLEnv, DefaultAMQPURL)
	conn, err := dialAMQP(raw)
	if err != nil {
		t.Fatalf("testenv: RabbitMQ at %s does not answer (%v); start it with scripts/services.sh, or point %s at one",
			redact(raw), err, AMQPURLEnv)
	}
	_ = conn.Close()
	return raw
}

func dialAMQP(raw string) (*amqp.Connection, error) {
	return amqp.DialConfig(raw, amqp.Config{
		Dial:       amqp.DefaultDial(dialTimeout),
		Properties: amqp.Table{"connection_name": "klaxon-testenv"},
	})
}

// QueueName returns a RabbitMQ queue name unique to the test, such as
// "klaxontest.TestDeadLetter.5d2c9a0e71fb". When the test ends, that queue
// and the dead-letter queue docs/contract.md §6 derives from it (name + ".dead") are
// deleted if they exist; register any other queue the test makes with
// DeleteQueuesAtCleanup.
func QueueName(t testing.TB) string {
	t.Helper()
	raw := AMQPURL(t)
	name := "klaxontest." + sanitize(t.Name(), 60) + "." + randomHex(6)
	t.Cleanup(func() {
		if err := DeleteQueues(raw, name, name+".dead"); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	return name
}

// DeleteQueuesAtCleanup deletes the named queues from the test RabbitMQ when
// the test ends (whether or not they exist then).
func DeleteQueuesAtCleanup(t testing.TB, names ...string) {
	t.Helper()
	raw := AMQPURL(t)
	t.Cleanup(func() {
		if err := DeleteQueues(raw, names...); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
}

// DeleteQueues deletes the named queues, with their messages, from the
// RabbitMQ at amqpURL. A queue that does not exist is not an error.
func DeleteQueues(amqpURL string, names ...string) error {
	pub, err := queue.NewPublisher(queue.PublisherConfig{URL: amqpURL, ConnectionName: "klaxon-testenv",
		Logger: slog.New(slog.DiscardHandler)}) // its failures come back as errors
	if err != nil {
		return fmt.Errorf("delete queues %q: %w", names, err)
	}
	defer pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	if err := pub.Delete(ctx, names...); err != nil {
		return fmt.Errorf("delete queues %q at %s: %w", names, redact(amqpURL), err)
	}
	return nil
}

// skipShort skips t under go test -short, which runs only the tests that
// need no service.
func skipShort(t testing.TB, service string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s; -short runs only the pure tests", service)
	}
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_]+`)

// sanitize turns a test name into [A-Za-z0-9_], at most n bytes, valid in
// database, key and queue names alike.
func sanitize(name string, n int) string {
	s := strings.Trim(unsafeChars.ReplaceAllString(name, "_"), "_")
	if len(s) > n {
		s = s[:n]
	}
	return s
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand.Read)
	return hex.EncodeToString(b)
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// redact hides the password of a URL, for messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
