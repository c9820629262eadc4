package config

import (
	"strings"
	"testing"
	"time"
)

// The operator webhook may hold a token: a bad one is named by its
// variable, never shown, and the configuration prints it redacted.
func TestOperatorSettings(t *testing.T) {
	const hook = "https://ops.example.com/hooks/klaxon?token=s3cr3t-operator"
	c, err := Load(env(map[string]string{EnvOperatorWebhook: hook, EnvOperatorDelay: "30s"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.OperatorWebhook != hook || c.OperatorDelay != 30*time.Second {
		t.Fatalf("got %q %s", c.OperatorWebhook, c.OperatorDelay)
	}
	if strings.Contains(c.String(), "s3cr3t") {
		t.Fatalf("configuration shows the webhook's token: %s", c)
	}
	for value, want := range map[string]string{
		"ops.example.com/s3cr3t":            "KLAXON_OPERATOR_WEBHOOK",
		"ftp://ops.example.com/s3cr3t":      "is not an absolute http(s) URL",
		"https://u:s3cr3t@ops.example.com/": "holds a user name or password",
	} {
		_, err := Load(env(map[string]string{EnvOperatorWebhook: value}))
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: error %v, want one saying %q without the value", value, err, want)
		}
	}
	if _, err := Load(env(map[string]string{EnvOperatorDelay: "soon"})); err == nil || !strings.Contains(err.Error(), EnvOperatorDelay) {
		t.Errorf("KLAXON_OPERATOR_DELAY=soon: %v", err)
	}
}
