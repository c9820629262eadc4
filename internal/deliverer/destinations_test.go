package deliverer

import (
	"testing"
	"time"
)

// One destination gets at most its share of the sends in flight, and one
// project its own, whatever endpoints it spreads its jobs over; others'
// jobs still get theirs.
func TestSendsInFlightBoundedPerDestinationAndProject(t *testing.T) {
	s := newDestinations(2, 3, 5, time.Minute, 10*time.Second)
	now := time.Now()
	var slots []*slot
	for range 2 {
		v := s.enter("webhook:hung", "p1", now)
		if v.slot == nil {
			t.Fatalf("a send within the destination's bound refused: %+v", v)
		}
		slots = append(slots, v.slot)
	}
	later := now.Add(400 * time.Millisecond)
	if v := s.enter("webhook:hung", "p2", later); !v.busy || v.wait != 400*time.Millisecond {
		t.Errorf("a third send to a destination with two in flight for 400ms: %+v, want busy for 400ms", v)
	}
	if v := s.enter("webhook:other", "p1", now); v.slot == nil {
		t.Errorf("project p1's third send, to another destination, refused: %+v", v)
	}
	if v := s.enter("webhook:third", "p1", now); !v.busy {
		t.Errorf("project p1's fourth send in flight admitted: %+v", v)
	}
	if v := s.enter("webhook:third", "p2", now); v.slot == nil {
		t.Errorf("another project's send refused: %+v", v)
	}
	s.leave(slots[0], answered, now)
	if v := s.enter("webhook:hung", "p2", now); v.slot == nil {
		t.Errorf("a send refused after one ended: %+v", v)
	}
}

// Consecutive timeouts open the circuit; it keeps jobs away for openFor,
// then lets one probe through, and closes when the probe is answered or
// opens again when it times out. Each change is reported once.
func TestCircuitOpensOnTimeoutsAndProbes(t *testing.T) {
	s := newDestinations(8, 64, 3, 30*time.Second, 10*time.Second)
	now := time.Now()
	send := func(o answer) string {
		t.Helper()
		v := s.enter("slack:x", "p", now)
		if v.slot == nil {
			t.Fatalf("send refused: %+v", v)
		}
		return s.leave(v.slot, o, now)
	}
	send(timedOut)
	send(answered) // an answer resets the count
	send(timedOut)
	if c := send(timedOut); c != "" {
		t.Fatalf("circuit changed to %q after two timeouts in a row", c)
	}
	if c := send(timedOut); c != "open" {
		t.Fatalf("after three timeouts in a row the circuit is %q, want open", c)
	}
	if w := s.blocked("slack:x", now); w != 30*time.Second {
		t.Errorf("blocked for %v, want 30s", w)
	}
	if v := s.enter("slack:x", "p", now.Add(time.Second)); v.slot != nil || v.busy || v.wait != 29*time.Second {
		t.Errorf("a send while open: %+v, want kept away 29s", v)
	}
	if w := s.blocked("other", now); w != 0 {
		t.Errorf("another destination blocked for %v", w)
	}

	now = now.Add(31 * time.Second)
	if w := s.blocked("slack:x", now); w != 0 {
		t.Errorf("blocked for %v once the circuit may probe", w)
	}
	probe := s.enter("slack:x", "p", now)
	if probe.slot == nil || probe.change != "half_open" {
		t.Fatalf("the first send after openFor: %+v, want a probe half-opening the circuit", probe)
	}
	if v := s.enter("slack:x", "p", now); v.slot != nil || v.wait != 10*time.Second {
		t.Errorf("a second send during the probe: %+v, want kept away for the probe's 10s", v)
	}
	if c := s.leave(probe.slot, timedOut, now); c != "open" {
		t.Fatalf("a probe timing out left the circuit %q, want open", c)
	}
	now = now.Add(31 * time.Second)
	probe = s.enter("slack:x", "p", now)
	if c := s.leave(probe.slot, answered, now); c != "closed" {
		t.Fatalf("an answered probe left the circuit %q, want closed", c)
	}
	if v := s.enter("slack:x", "p", now); v.slot == nil || v.change != "" {
		t.Errorf("a send after the circuit closed: %+v", v)
	}
}

func TestEndpointHostNeverTheURL(t *testing.T) {
	for endpoint, want := range map[string]string{
		"https://hooks.slack.com/services/T0/B0/secret": "hooks.slack.com",
		"ops@example.com":   "",
		"-1001234567":       "",
		"https://u@x:8443/": "x",
	} {
		if got := endpointHost(endpoint); got != want {
			t.Errorf("endpointHost(%q) = %q, want %q", endpoint, got, want)
		}
	}
}
