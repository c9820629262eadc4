package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
	"github.com/klaxonhq/klaxon/internal/testenv"
)

// The worker's logs and metrics keep one naming convention, which
// dashboards, alerts and log queries rely on: a JSON log line names each
// key once; a duration is a string ("5s") or a number under a key saying
// its unit (took_ms); the label queue always holds a queue name, and a
// stage is the label stage. A line once held "queue" twice, another
// "outage":5000000000, and klaxon_consumer_pauses_total{queue} held stage
// names.
func TestLogsAndMetricsKeepTheirConventions(t *testing.T) {
	h := newHarness(t)
	project := h.project(rule(bson.M{"whatToReceive": "ONLY_NEW", "channels": h.webhookOnly()}))
	// A retry, a success, a failure for good and a dead letter: the lines
	// of the paths most worth reading.
	h.webhook.Fail(notifytest.Failure{Status: http.StatusServiceUnavailable}, notifytest.Failure{Status: http.StatusBadRequest})
	w := h.start()
	h.publish(event(project, "first", "g1", true), event(project, "second", "g2", true), message{Body: "not json"})
	if _, err := h.webhook.WaitFor(3, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the failure for good logged", func() bool {
		return len(h.logs.logLines("notification failed for good")) > 0 && len(h.logs.logLines("dead-lettered a message")) > 0
	})

	lines := 0
	for line := range strings.Lines(h.logs.String()) {
		if strings.TrimSpace(line) == "" {
			continue
		}
		lines++
		for _, problem := range logLineProblems([]byte(line)) {
			t.Errorf("%s in %s", problem, line)
		}
	}
	if lines < 10 {
		t.Fatalf("only %d log lines: the test saw too little", lines)
	}

	resp, err := http.Get("http://" + w.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	stages := map[string]bool{"evaluator": true, "deliverer": true}
	seen := 0
	for _, m := range metricLabel.FindAllStringSubmatch(string(body), -1) {
		name, label, value := m[1], m[2], m[3]
		switch label {
		case "queue":
			seen++
			if !strings.HasPrefix(value, h.queue) && !strings.HasPrefix(value, h.prefix+".") {
				t.Errorf("%s{queue=%q}: not a queue of this worker", name, value)
			}
		case "stage":
			if !stages[value] {
				t.Errorf("%s{stage=%q}: not a stage", name, value)
			}
		}
	}
	if seen == 0 || !strings.Contains(string(body), fmt.Sprintf(`klaxon_consumer_pauses_total{queue=%q}`, h.queue)) {
		t.Errorf("the queue metrics are not there:\n%s", body)
	}
}

// metricLabel matches each label of a sample of Klaxon's metrics.
var metricLabel = regexp.MustCompile(`(?m)^(klaxon_\w+)\{(?:[^}]*?,)?(\w+)="([^"]*)"`)

// durationKey names values that are durations: without a unit in the
// key, such a value must be a string.
var durationKey = regexp.MustCompile(`(?i)(took|outage|wait|delay|timeout|deadline|duration|elapsed|interval|retry_in|open_for|linger|ttl|refresh|age|lag|backoff|after)$`)

// logLineProblems lists what breaks the log conventions in one JSON line:
// keys repeated within an object, and durations as bare numbers.
func logLineProblems(line []byte) []string {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var problems []string
	var walk func(path string) error
	walk = func(path string) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			keys := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				key := k.(string)
				if keys[key] {
					problems = append(problems, fmt.Sprintf("key %q repeated", path+key))
				}
				keys[key] = true
				if err := walkValue(dec, path+key, &problems, walk); err != nil {
					return err
				}
			}
			_, err = dec.Token() // }
			return err
		case json.Delim('['):
			for dec.More() {
				if err := walk(path); err != nil {
					return err
				}
			}
			_, err = dec.Token() // ]
			return err
		}
		return nil
	}
	if err := walk(""); err != nil {
		problems = append(problems, "not JSON: "+err.Error())
	}
	return problems
}

// walkValue checks the value of key and walks into it.
func walkValue(dec *json.Decoder, key string, problems *[]string, walk func(string) error) error {
	if !dec.More() {
		return nil
	}
	// Peek by decoding a raw value, then walk it again for objects.
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return err
	}
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) > 0 && (trimmed[0] == '{' || trimmed[0] == '[') {
		for _, p := range logLineProblems(trimmed) {
			*problems = append(*problems, strings.Replace(p, `"`, `"`+key+".", 1))
		}
		return nil
	}
	if len(trimmed) > 0 && (trimmed[0] == '-' || trimmed[0] >= '0' && trimmed[0] <= '9') && durationKey.MatchString(lastPart(key)) {
		*problems = append(*problems, fmt.Sprintf("duration %q is a bare number (%s): give it as a string or a key with its unit", key, trimmed))
	}
	return nil
}

func lastPart(key string) string { return key[strings.LastIndex(key, ".")+1:] }

// The checker above must catch what it looks for, or it checks nothing.
func TestLogLineProblemsCatchesRepeatsAndBareDurations(t *testing.T) {
	for line, want := range map[string]string{
		`{"msg":"x","queue":"a","queue":"b"}`:           `key "queue" repeated`,
		`{"msg":"x","outage":5000000000}`:               `duration "outage" is a bare number`,
		`{"msg":"x","config":{"batch_linger":2000000}}`: `duration "config.batch_linger" is a bare number`,
		`{"msg":"x","config":{"a":1,"a":2}}`:            `key "config.a" repeated`,
	} {
		got := logLineProblems([]byte(line))
		if len(got) != 1 || !strings.HasPrefix(got[0], want) {
			t.Errorf("%s: %q, want %q", line, got, want)
		}
	}
	if got := logLineProblems([]byte(`{"msg":"x","took_ms":12,"outage":"5s","attempt":3}`)); len(got) != 0 {
		t.Errorf("a good line: %q", got)
	}
}
