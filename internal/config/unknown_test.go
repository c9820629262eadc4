package config

import (
	"slices"
	"testing"
)

// A misspelled variable leaves its setting at the default without a word
// unless something says so: each unknown KLAXON_ name is reported with the
// known one it most likely meant.
func TestUnknownNamesTheClosestVariable(t *testing.T) {
	got := Unknown([]string{
		"KLAXON_RULE_FILE=/etc/klaxon/rules.yml",
		"KLAXON_QUEU=notifier",
		"KLAXON_SMTP_PASS=secret",
		"KLAXON_RULES_FILE=/x",    // known
		"REDIS_URL=redis://x",     // a known alias
		"PATH=/bin",               // not ours
		"KLAXON_TEST_REDIS_URL=x", // the test suite's
		"KLAXON_WHATEVER_THIS_IS=1",
		"KLAXON_RULE_FILE=again", // reported once
		// Kubernetes' links to the klaxon-metrics Service
		"KLAXON_METRICS_SERVICE_HOST=10.0.0.1", "KLAXON_METRICS_SERVICE_PORT=9464", "KLAXON_METRICS_SERVICE_PORT_METRICS=9464",
		"KLAXON_METRICS_PORT=tcp://10.0.0.1:9464", "KLAXON_METRICS_PORT_9464_TCP=tcp://10.0.0.1:9464",
		"KLAXON_METRICS_PORT_9464_TCP_PROTO=tcp", "KLAXON_METRICS_PORT_9464_TCP_PORT=9464", "KLAXON_METRICS_PORT_9464_TCP_ADDR=10.0.0.1",
	})
	want := []UnknownVariable{
		{"KLAXON_RULE_FILE", EnvRulesFile},
		{"KLAXON_QUEU", EnvQueue},
		{"KLAXON_SMTP_PASS", EnvSMTPPassword},
		{"KLAXON_WHATEVER_THIS_IS", ""},
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
	if s := got[0].String(); s != "KLAXON_RULE_FILE is not a Klaxon variable and is ignored (did you mean KLAXON_RULES_FILE?)" {
		t.Errorf("String() = %q", s)
	}
}
