package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Values that every library Klaxon hands them to would refuse, or would
// silently misuse, must stop Load naming the variable, not surface later as
// an unnamed failure (or a retry loop) after the worker has started.
func TestLoadRefusesWhatTheComponentsWouldRefuse(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	tests := []struct {
		name    string
		env     map[string]string
		wantVar string
		want    string
	}{
		// counter.Engine works in whole milliseconds: 500µs became a
		// de-duplication TTL of 0 ms, which its Lua script divides by.
		{"dedup ttl under 1ms", map[string]string{EnvDedupTTL: "500us"}, EnvDedupTTL, "1ms"},
		{"refresh under 1ms", map[string]string{EnvRulesRefresh: "1ns"}, EnvRulesRefresh, "1ms"},
		{"send timeout under 1ms", map[string]string{EnvSendTimeout: "999us"}, EnvSendTimeout, "1ms"},
		// A Sentinel client with replica_only=true answered every batch with
		// READONLY while /readyz said 200 and 300 messages waited.
		{"sentinel replica only", map[string]string{EnvRedisURL: "redis+sentinel://s1,s2/mymaster?replica_only=true"}, EnvRedisURL, "READONLY"},
		// counter.New drops WAIT for a cluster client: the setting would be
		// ignored, and failovers would lose writes it was set to keep.
		{"wait on cluster", map[string]string{EnvRedisURL: "redis+cluster://n1:7000", EnvWaitReplicas: "1"}, EnvWaitReplicas, "Cluster"},
		{"wait on sentinel routing reads", map[string]string{EnvRedisURL: "redis+sentinel://s1/mymaster?route_randomly=true", EnvWaitReplicas: "1"}, EnvWaitReplicas, "route_randomly"},
		{"wait replicas", map[string]string{EnvWaitReplicas: "17"}, EnvWaitReplicas, "from 0 to 16"},
		{"wait timeout", map[string]string{EnvWaitTimeout: "0s"}, EnvWaitTimeout, "not positive"},
		// The MongoDB driver refused these at start-up, after "klaxon
		// starting", in an error that named no variable.
		{"mongo option value", map[string]string{EnvMongoURL: "mongodb://u:s3cr3t@m/hawk?connectTimeoutMS=abc"}, EnvMongoURL, "connectTimeoutMS"},
		{"mongo option combination", map[string]string{EnvMongoURL: "mongodb://u:s3cr3t@a,b/hawk?directConnection=true"}, EnvMongoURL, "direct connection"},
		{"mongo srv option value", map[string]string{EnvMongoURL: "mongodb+srv://u:s3cr3t@cluster0.example.net/hawk?journal=maybe"}, EnvMongoURL, "journal"},
		{"mongo alias option", map[string]string{"MONGO_ACCOUNTS_DATABASE_URI": "mongodb://u:s3cr3t@m/hawk?w=majority&journal=maybe"},
			"MONGO_ACCOUNTS_DATABASE_URI (alias of KLAXON_MONGO_URL)", "journal"},
		// The email channel refused this at start-up, naming no variable.
		{"smtp password in clear", map[string]string{EnvSMTPAddr: "smtp.example.com:25", EnvSMTPTLS: "none", EnvSMTPUsername: "u", EnvSMTPPassword: "s3cr3t"},
			EnvSMTPTLS, "in clear"},
		// The Telegram channel refused these at start-up.
		{"telegram token with %", map[string]string{EnvTelegramToken: "123:s3cr3t%41"}, EnvTelegramToken, "%"},
		{"telegram api bad escape", map[string]string{EnvTelegramAPIURL: "https://api.telegram.org/x%zz"}, EnvTelegramAPIURL, "percent"},
		// amqp091 refused these on every dial: the worker retried forever,
		// never ready, instead of stopping.
		{"amqp auth mechanism", map[string]string{EnvAMQPURL: "amqp://u:s3cr3t@rabbit/?auth_mechanism=SCRAM-SHA-256"}, EnvAMQPURL, "auth_mechanism"},
		{"amqps missing ca file", map[string]string{EnvAMQPURL: "amqps://u:s3cr3t@rabbit/?cacertfile=" + missing}, EnvAMQPURL, "cacertfile"},
		{"amqps client cert without key", map[string]string{EnvAMQPURL: "amqps://u:s3cr3t@rabbit/?certfile=" + missing}, EnvAMQPURL, "keyfile"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(env(tt.env))
			if err == nil {
				t.Fatal("Load succeeded")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, tt.wantVar+": ") || !strings.Contains(msg, tt.want) {
				t.Errorf("error %q: want it to start with %q and contain %q", msg, tt.wantVar+": ", tt.want)
			}
			if strings.ContainsAny(msg, "\r\n") || strings.Contains(msg, secret) {
				t.Errorf("error is not one secret-free line: %q", msg)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Errorf("error %v is not a *config.Error", err)
			}
		})
	}
}

// The checks above must not refuse what works.
func TestLoadAcceptsWhatTheComponentsAccept(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, []byte("not checked here: amqp091 reads it as it comes"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, e := range []map[string]string{
		{EnvDedupTTL: "1ms", EnvRulesRefresh: "1ms", EnvSendTimeout: "1ms"},
		{EnvMongoURL: "mongodb://u:p@a:1,b:2/hawk?replicaSet=rs0&connectTimeoutMS=3000&journal=true"},
		{EnvMongoURL: "mongodb+srv://u:p@cluster0.example.net/hawk?srvMaxHosts=2&srvServiceName=custom&retryWrites=true"},
		{EnvMongoURL: "mongodb+srv://AKID:key@cluster0.example.net/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:tok"},
		{EnvMongoURL: "mongodb+srv://cluster0.example.net/hawk?srvMaxHosts=3"},
		{EnvSMTPAddr: "localhost:1025", EnvSMTPTLS: "none", EnvSMTPUsername: "u", EnvSMTPPassword: "p"},
		{EnvSMTPAddr: "mailpit:1025", EnvSMTPTLS: "none"},
		{EnvSMTPAddr: "smtp.example.com:587", EnvSMTPUsername: "u", EnvSMTPPassword: "p"},
		{EnvAMQPURL: "amqp://u:p@rabbit/?auth_mechanism=plain&auth_mechanism=AMQPLAIN"},
		{EnvAMQPURL: "amqps://rabbit/?auth_mechanism=EXTERNAL&cacertfile=" + ca + "&certfile=" + ca + "&keyfile=" + ca},
		{EnvTelegramAPIURL: "https://tg.example.com/bot%2Dproxy"},
	} {
		t.Run(fmt.Sprint(e), func(t *testing.T) {
			if _, err := Load(env(e)); err != nil {
				t.Errorf("Load: %v", err)
			}
		})
	}
}
