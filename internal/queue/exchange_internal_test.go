package queue

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// An exchange type the broker does not know closes the connection with
// COMMAND_INVALID; for the consistent-hash type the error says which plugin
// to enable. The real broker answers for a made-up type (the shared test
// broker has the plugin on), and the same answer, for the hash type, is
// turned into ErrNoHashExchange.
func TestUnknownExchangeTypeIsExplained(t *testing.T) {
	url := os.Getenv("KLAXON_TEST_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := Dial(context.Background(), url, "klaxon-test")
	if err != nil {
		t.Fatalf("RabbitMQ does not answer: %v", err)
	}
	defer conn.Close()
	name := "klaxon-test-unknown-type-" + rand.Text()[:8]
	err = bind(conn, name, "x-klaxon-no-such-type", "klaxon-test-nothing")
	if err == nil {
		t.Fatal("an unknown exchange type was accepted")
	}
	if !strings.Contains(err.Error(), "has no x-klaxon-no-such-type exchange type") {
		t.Errorf("error %q does not say the type is unknown", err)
	}

	// What the broker said above, for the hash exchange's type.
	reason := strings.ReplaceAll(err.Error(), "x-klaxon-no-such-type", HashExchangeType)
	got := explainDeclare(name, HashExchangeType, &amqp.Error{Code: amqp.CommandInvalid, Reason: reason})
	if !errors.Is(got, ErrNoHashExchange) || !strings.Contains(got.Error(), "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange") {
		t.Errorf("missing plugin reported as %q", got)
	}
}
