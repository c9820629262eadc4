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

// An exchange type the broker does not know is refused with COMMAND_INVALID
// (RabbitMQ 3) or PRECONDITION_FAILED (RabbitMQ 4); for the consistent-hash
// type the error says which plugin to enable. The real broker answers for a
// made-up type (the shared test broker has the plugin on), and the same
// answer, for the hash type, is turned into ErrNoHashExchange, as are both
// versions' answers; an exchange of another kind is not taken for one.
func TestUnknownExchangeTypeIsExplained(t *testing.T) {
	// testenv, which imports this package, cannot give the broker here.
	if testing.Short() {
		t.Skip("needs RabbitMQ; -short runs only the pure tests")
	}
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
	t.Logf("the broker's answer: %v", err)
	if !strings.Contains(err.Error(), "has no x-klaxon-no-such-type exchange type") {
		t.Errorf("error %q does not say the type is unknown", err)
	}

	// What the broker said above, for the hash exchange's type.
	reason := strings.ReplaceAll(err.Error(), "x-klaxon-no-such-type", HashExchangeType)
	got := explainDeclare(name, HashExchangeType, &amqp.Error{Code: amqp.CommandInvalid, Reason: reason})
	if !errors.Is(got, ErrNoHashExchange) || !strings.Contains(got.Error(), "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange") {
		t.Errorf("missing plugin reported as %q", got)
	}

	for _, c := range []struct {
		name    string
		refusal *amqp.Error
		missing bool
	}{
		{"RabbitMQ 3.10", &amqp.Error{Code: amqp.CommandInvalid, Reason: "COMMAND_INVALID - unknown exchange type 'x-consistent-hash'"}, true},
		{"RabbitMQ 4.0", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - unknown exchange type 'x-consistent-hash'"}, true},
		{"another kind", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'notifier.hash' in vhost '/': received 'x-consistent-hash' but current is 'direct'"}, false},
	} {
		got := explainDeclare("notifier.hash", HashExchangeType, c.refusal)
		if errors.Is(got, ErrNoHashExchange) != c.missing {
			t.Errorf("%s: %q taken for a missing plugin: %v, want %v", c.name, got, !c.missing, c.missing)
		}
		if !c.missing && !strings.Contains(got.Error(), "exists with other settings") {
			t.Errorf("%s: reported as %q", c.name, got)
		}
	}
}
