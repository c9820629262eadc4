package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// sink is the webhook endpoint of every rule. It counts notifications and
// records when each latency probe's notification arrives.
type sink struct {
	srv      *http.Server
	url      string
	received atomic.Int64 // every notification: a grouped message counts each firing it carries

	mu       sync.Mutex
	run      string      // the probes being timed
	sent     []time.Time // publish time of probe n
	arrivals []time.Duration
	fired    []time.Duration // publish → the firing's firedAt (Redis' clock), same order
	seen     map[int]bool
}

func startSink() (*sink, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &sink{url: "http://" + l.Addr().String() + "/hook"}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

func (s *sink) close() { _ = s.srv.Close() }

// expect starts timing the probes of run: n of them.
func (s *sink) expect(run string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.run, s.sent, s.arrivals, s.fired, s.seen = run, make([]time.Time, n), nil, nil, map[int]bool{}
}

// stamp records that probe n is being published now.
func (s *sink) stamp(n int) {
	s.mu.Lock()
	s.sent[n] = time.Now()
	s.mu.Unlock()
}

// latencies returns the publish→notification latencies recorded so far,
// and publish→firing: the part before the firing's firedAt.
func (s *sink) latencies() (arrivals, fired []time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.arrivals), slices.Clone(s.fired)
}

func (s *sink) serve(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	var n struct {
		Type          string            `json:"type"`
		Notifications []json.RawMessage `json:"notifications"`
		FiredAt       time.Time         `json:"firedAt"`
		Event         struct {
			RepetitionID *string `json:"repetitionId"`
		} `json:"event"`
	}
	err := json.Unmarshal(body, &n)
	if err == nil && n.Type == "grouped" {
		s.received.Add(int64(len(n.Notifications)))
	} else {
		s.received.Add(1)
	}
	if err == nil && n.Event.RepetitionID != nil {
		if run, i, ok := parseProbeID(*n.Event.RepetitionID); ok {
			s.mu.Lock()
			if run == s.run && i < len(s.sent) && !s.sent[i].IsZero() && !s.seen[i] {
				s.seen[i] = true
				s.arrivals = append(s.arrivals, now.Sub(s.sent[i]))
				s.fired = append(s.fired, n.FiredAt.Sub(s.sent[i]))
			}
			s.mu.Unlock()
		}
	}
	w.WriteHeader(http.StatusOK)
}
