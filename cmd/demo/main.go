// Command demo runs Klaxon end to end on this machine: it starts a MongoDB
// stand-in (cmd/devmongo) if none answers, stores a Hawk project with two
// rules, runs the worker binary, publishes sample events to RabbitMQ and
// prints the notifications as a local webhook and a local SMTP server get
// them. scripts/demo.sh builds everything and starts Redis and RabbitMQ.
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
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func main() {
	worker := flag.String("worker", "bin/klaxon-worker", "the worker binary")
	devmongo := flag.String("devmongo", "bin/devmongo", "the MongoDB stand-in binary, started if nothing answers on -mongo")
	mongoAddr := flag.String("mongo", "127.0.0.1:27017", "MongoDB address")
	amqpURL := flag.String("amqp", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL")
	redisURL := flag.String("redis", "redis://127.0.0.1:6379/0", "Redis URL")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, *worker, *devmongo, *mongoAddr, *amqpURL, *redisURL); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) {
	fmt.Printf("%s  "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

func run(ctx context.Context, workerBin, devmongoBin, mongoAddr, amqpURL, redisURL string) error {
	// 1. MongoDB: use one that answers, else start the FerretDB stand-in.
	if !answers(mongoAddr) {
		cmd := exec.Command(devmongoBin, "-listen", mongoAddr)
		cmd.Stderr = io.Discard
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", devmongoBin, err)
		}
		defer func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() }()
		if err := waitUntil(ctx, func() bool { return answers(mongoAddr) }); err != nil {
			return fmt.Errorf("MongoDB stand-in did not start on %s", mongoAddr)
		}
		say("MongoDB stand-in (FerretDB on SQLite) started on %s", mongoAddr)
	} else {
		say("MongoDB answers on %s", mongoAddr)
	}

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

	// 3. A Hawk project with two rules, stored as Hawk stores them.
	mongoURL := "mongodb://" + mongoAddr + "/hawk"
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
	_, err = client.Database("hawk").Collection("projects").InsertOne(ctx, bson.M{
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
	queue := "klaxon-demo"
	worker := exec.CommandContext(ctx, workerBin)
	worker.Env = append(os.Environ(),
		"KLAXON_AMQP_URL="+amqpURL, "KLAXON_REDIS_URL="+redisURL, "KLAXON_MONGO_URL="+mongoURL,
		"KLAXON_QUEUE="+queue, "KLAXON_PREFIX=klaxon-demo", "KLAXON_HTTP_ADDR=127.0.0.1:9465",
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
	if err := waitUntil(ctx, func() bool { return httpOK("http://127.0.0.1:9465/readyz") }); err != nil {
		return errors.New("the worker did not become ready (see its log above)")
	}
	say("worker running (pid %d); metrics on http://127.0.0.1:9465/metrics", worker.Process.Pid)

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
		return ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body)})
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
	say("done: every firing reached every channel once. Stopping the worker.")
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
