// Command demo runs Klaxon end to end on this machine: it starts a MongoDB
// stand-in of its own (tools/devmongo, on a free port, its data in a
// temporary directory), stores a Hawk project with two rules there, runs
// the worker binary, publishes sample events to RabbitMQ and prints the
// notifications as a local webhook and a local SMTP server get them.
// scripts/demo.sh builds everything and starts Redis and RabbitMQ if they
// do not answer.
//
// The demo is a guest on the broker and Redis it is given: it writes no
// database it did not create, changes no broker setting or plugin, and
// uses only its own names, the queues klaxon-demo… and the Redis keys
// klaxon-demo:…, which it deletes when it starts (what an interrupted run
// left) and when it ends. -clean deletes them and does nothing else.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/mail"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/emersion/go-smtp"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/klaxonhq/klaxon/internal/wire"
)

// The demo's names: its incoming queue, and the KLAXON_PREFIX of the
// queues and Redis keys the worker makes.
const (
	demoQueue  = "klaxon-demo"
	demoPrefix = "klaxon-demo"
	demoDB     = "klaxon_demo"
)

func main() {
	worker := flag.String("worker", "bin/klaxon-worker", "the worker binary")
	devmongo := flag.String("devmongo", "bin/devmongo", "the MongoDB stand-in binary")
	amqpURL := flag.String("amqp", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL")
	redisURL := flag.String("redis", "redis://127.0.0.1:6379/0", "Redis URL")
	clean := flag.Bool("clean", false, "only delete what a demo run leaves (its queues and Redis keys), then exit")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "demo: unexpected argument %q; run 'demo --help'\n", flag.Arg(0))
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	names := demoNames()
	if *clean {
		r, err := cleanUp(ctx, *amqpURL, *redisURL, names)
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			os.Exit(1)
		}
		say("cleaned up: %s", r)
		return
	}
	err := run(ctx, *worker, *devmongo, *amqpURL, *redisURL)
	// Whatever happened, leave nothing behind on the shared services.
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	r, cerr := cleanUp(cctx, *amqpURL, *redisURL, names)
	if cerr != nil {
		fmt.Fprintln(os.Stderr, "demo: clean-up:", cerr, "(run 'scripts/demo.sh -clean' to try again)")
	} else {
		say("cleaned up: %s", r)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) {
	fmt.Printf("%s  "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

// names are what a demo run makes on the broker and in Redis.
type names struct {
	Queues    []string
	KeyPrefix string // every Redis key starts with it
}

func demoNames() names {
	return workerNames(demoQueue, demoPrefix)
}

// workerNames are the queues a worker with KLAXON_QUEUE q and
// KLAXON_PREFIX prefix makes, and the start of its Redis keys.
func workerNames(q, prefix string) names {
	n := names{Queues: []string{q, wire.DeadQueue(q), wire.DeliveryQueue(prefix), wire.BulkQueue(prefix), wire.FailedQueue(prefix)}, KeyPrefix: prefix + ":"}
	for _, d := range wire.RetryDelays() {
		n.Queues = append(n.Queues, wire.RetryQueue(prefix, d))
	}
	return n
}

// cleaned is what cleanUp removed.
type cleaned struct {
	queues, messages, keys int
}

func (c cleaned) String() string {
	return fmt.Sprintf("%d queues (%d messages in them) and %d Redis keys deleted", c.queues, c.messages, c.keys)
}

// cleanUp deletes the queues of n, with their messages, and the Redis keys
// starting with n.KeyPrefix. A queue that is not there is no error.
func cleanUp(ctx context.Context, amqpURL, redisURL string, n names) (cleaned, error) {
	var c cleaned
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return c, fmt.Errorf("RabbitMQ: %w", err)
	}
	defer conn.Close()
	for _, q := range n.Queues {
		// A channel a queue: a passive declare of a missing queue closes it.
		ch, err := conn.Channel()
		if err != nil {
			return c, fmt.Errorf("RabbitMQ: %w", err)
		}
		if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
			continue // not there
		}
		msgs, err := ch.QueueDelete(q, false, false, false)
		ch.Close()
		if err != nil {
			return c, fmt.Errorf("delete queue %s: %w", q, err)
		}
		c.queues++
		c.messages += msgs
	}
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		return c, fmt.Errorf("Redis URL: %w", err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	iter := rdb.Scan(ctx, 0, n.KeyPrefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		if err := rdb.Unlink(ctx, iter.Val()).Err(); err != nil {
			return c, fmt.Errorf("Redis: %w", err)
		}
		c.keys++
	}
	if err := iter.Err(); err != nil {
		return c, fmt.Errorf("Redis: %w", err)
	}
	return c, nil
}

func run(ctx context.Context, workerBin, devmongoBin, amqpURL, redisURL string) error {
	// 0. What an interrupted run left, consumed by this one, would make it
	// behave otherwise.
	if r, err := cleanUp(ctx, amqpURL, redisURL, demoNames()); err != nil {
		return err
	} else if r.queues > 0 || r.keys > 0 {
		say("removed what an earlier run left: %s", r)
	}
	say("uses RabbitMQ at %s (queues %s…) and Redis at %s (keys %s*), deleted at the end; changes no setting or plugin",
		redactURL(amqpURL), demoQueue, redactURL(redisURL), demoNames().KeyPrefix)

	// 1. MongoDB: a stand-in of the demo's own, on a free port, with its
	// data in a temporary directory: no database of anyone else's is
	// written.
	mongoAddr, err := freeAddr()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "klaxon-demo-mongo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	mongod := exec.Command(devmongoBin, "-listen", mongoAddr, "-dir", dir)
	mongod.Stderr = io.Discard
	if err := mongod.Start(); err != nil {
		return fmt.Errorf("start %s: %w", devmongoBin, err)
	}
	defer func() { mongod.Process.Signal(os.Interrupt); mongod.Wait() }()
	if err := waitUntil(ctx, func() bool { return answers(mongoAddr) }); err != nil {
		return fmt.Errorf("MongoDB stand-in did not start on %s", mongoAddr)
	}
	say("MongoDB stand-in (FerretDB on SQLite, data in %s, removed at the end) started on %s", dir, mongoAddr)

	// 2. Where notifications arrive: a webhook and an SMTP server, both local.
	got := make(chan string, 16)
	hook, err := webhookSink(got)
	if err != nil {
		return err
	}
	smtpAddr, stopSMTP, err := smtpSink(got)
	if err != nil {
		return err
	}
	defer stopSMTP()

	// 3. A Hawk project with two rules, stored as Hawk stores them, in the
	// demo's database.
	mongoURL := "mongodb://" + mongoAddr + "/" + demoDB
	client, err := mongo.Connect(options.Client().ApplyURI(mongoURL))
	if err != nil {
		return err
	}
	defer client.Disconnect(context.Background())
	project := bson.NewObjectID()
	channels := bson.M{
		"webhook": bson.M{"isEnabled": true, "endpoint": hook, "minPeriod": 0},
		"email":   bson.M{"isEnabled": true, "endpoint": "oncall@example.com", "minPeriod": 0},
	}
	_, err = client.Database(demoDB).Collection("projects").InsertOne(ctx, bson.M{
		"_id": project, "name": "Klaxon demo",
		"notifications": bson.A{
			bson.M{"_id": bson.NewObjectID(), "isEnabled": true, "whatToReceive": "ONLY_NEW",
				"including": bson.A{}, "excluding": bson.A{}, "channels": channels},
			bson.M{"_id": bson.NewObjectID(), "isEnabled": true, "whatToReceive": "SEEN_MORE",
				"including": bson.A{"timeout"}, "excluding": bson.A{}, "threshold": 1000, "thresholdPeriod": 120000,
				"channels": channels},
		},
	})
	if err != nil {
		return fmt.Errorf("store the demo project: %w", err)
	}
	say("stored project %s: rule 1 = every new error; rule 2 = 'timeout' errors, 1000 in 2 minutes", project.Hex())

	// 4. The worker, as it runs in production.
	httpAddr, err := freeAddr()
	if err != nil {
		return err
	}
	worker := exec.CommandContext(ctx, workerBin)
	worker.Env = append(os.Environ(),
		"KLAXON_AMQP_URL="+amqpURL, "KLAXON_REDIS_URL="+redisURL, "KLAXON_MONGO_URL="+mongoURL,
		"KLAXON_QUEUE="+demoQueue, "KLAXON_PREFIX="+demoPrefix, "KLAXON_HTTP_ADDR="+httpAddr,
		"KLAXON_SMTP_ADDR="+smtpAddr, "KLAXON_SMTP_FROM=klaxon@example.com", "KLAXON_SMTP_TLS=none",
		"KLAXON_LOG_LEVEL=warn",
		// The demo's webhook listens on loopback, which endpoints from rules
		// may not reach unless the operator allows it.
		"KLAXON_ALLOW_PRIVATE_NETWORKS=127.0.0.0/8,::1/128")
	worker.Stdout, worker.Stderr = os.Stdout, os.Stderr
	if err := worker.Start(); err != nil {
		return fmt.Errorf("start %s: %w", workerBin, err)
	}
	defer func() { worker.Process.Signal(os.Interrupt); worker.Wait() }()
	if err := waitUntil(ctx, func() bool { return httpOK("http://" + httpAddr + "/readyz") }); err != nil {
		return errors.New("the worker did not become ready (see its log above)")
	}
	say("worker running (pid %d); metrics on http://%s/metrics", worker.Process.Pid, httpAddr)

	// 5. Events, in Hawk's notifier format.
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	publish := func(body string) error {
		return ch.PublishWithContext(ctx, "", demoQueue, false, false, amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body)})
	}
	say("publish: a new error 'TypeError: x is undefined'")
	if err := publish(fmt.Sprintf(`{"projectId":%q,"event":{"title":"TypeError: x is undefined","groupHash":"demo-new","isNew":true,"repetitionId":null}}`, project.Hex())); err != nil {
		return err
	}
	say("publish: 1 + 900 + 900 'Database timeout' events over three minutes (a fixed window would never see 1000)")
	start := float64(time.Now().Add(-5 * time.Minute).Unix())
	for m, n := range []int{1, 900, 900} {
		for i := range n {
			ts := start + float64(m)*60 + float64(i)*60/float64(n)
			body := fmt.Sprintf(`{"projectId":%q,"event":{"title":"Database timeout","groupHash":"demo-timeout","isNew":false,"repetitionId":"r%d-%d","timestamp":%f}}`, project.Hex(), m, i, ts)
			if err := publish(body); err != nil {
				return err
			}
		}
	}

	// 6. Two firings × two channels.
	for i := range 4 {
		select {
		case line := <-got:
			say("%d/4 %s", i+1, line)
		case <-ctx.Done():
			return errors.New("notifications did not all arrive in time")
		}
	}
	say("done: every firing reached every channel once. Stopping the worker and cleaning up.")
	return nil
}

// webhookSink serves a webhook on a free local port and reports each body.
func webhookSink(got chan<- string) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n struct {
			Type   string `json:"type"`
			ID     string `json:"id"`
			Count  int64  `json:"count"`
			Period int64  `json:"period"`
			Event  struct {
				Title string `json:"title"`
			} `json:"event"`
		}
		json.NewDecoder(r.Body).Decode(&n)
		what := "new error"
		if n.Type == "threshold" {
			what = fmt.Sprintf("%d events in %s", n.Count, time.Duration(n.Period)*time.Millisecond)
		}
		got <- fmt.Sprintf("webhook  %-9s %q — %s (id %s…)", n.Type, n.Event.Title, what, n.ID[:8])
	}))
	return "http://" + l.Addr().String() + "/hook", nil
}

// smtpSink runs an SMTP server on a free local port and reports each mail.
func smtpSink(got chan<- string) (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	s := smtp.NewServer(backend{got})
	s.AllowInsecureAuth = true
	go s.Serve(l)
	return l.Addr().String(), func() { s.Close() }, nil
}

type backend struct{ got chan<- string }

func (b backend) NewSession(*smtp.Conn) (smtp.Session, error) { return &session{got: b.got}, nil }

type session struct {
	got chan<- string
	to  []string
}

func (s *session) Mail(string, *smtp.MailOptions) error { return nil }
func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.to = append(s.to, to)
	return nil
}
func (s *session) Reset()        { s.to = nil }
func (s *session) Logout() error { return nil }
func (s *session) Data(r io.Reader) error {
	m, err := mail.ReadMessage(r)
	if err != nil {
		return err
	}
	subject, _ := new(mime.WordDecoder).DecodeHeader(m.Header.Get("Subject"))
	s.got <- fmt.Sprintf("email    to %s: %q", strings.Join(s.to, ","), subject)
	return nil
}

func answers(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func httpOK(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitUntil polls cond until it holds or ctx ends.
func waitUntil(ctx context.Context, cond func() bool) error {
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// freeAddr is a free TCP address on loopback.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// redactURL is raw without its user info.
func redactURL(raw string) string {
	if at := strings.LastIndex(raw, "@"); at >= 0 {
		if scheme := strings.Index(raw, "://"); scheme >= 0 && scheme < at {
			return raw[:scheme+3] + "…@" + raw[at+1:]
		}
	}
	return raw
}
