// Package notifytest provides fakes of the services Klaxon notifies: a Slack
// incoming webhook, the Telegram Bot API, a webhook receiver and an SMTP
// server. They serve tests of the channels and of anything that sends
// through them.
//
// Every fake listens on 127.0.0.1, is closed by t.Cleanup, records what it
// received, can be scripted to fail the next requests, and has WaitFor so a
// test waits for requests instead of sleeping:
//
//	srv := notifytest.NewSlackServer(t)
//	srv.FailNext(2, notifytest.Failure{Status: 429, RetryAfter: 3 * time.Second})
//	… start the code under test, pointed at srv.URL …
//	reqs, err := srv.WaitFor(3, 5*time.Second) // two refusals, then success
//
// A recorded request is visible as soon as the client has its answer: the
// fakes record before they reply.
package notifytest

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Failure is a scripted error answer of an HTTP fake.
type Failure struct {
	// Status is the HTTP status, and for Telegram also the error_code.
	Status int
	// RetryAfter, when positive, is sent as a Retry-After header in whole
	// seconds, and by the Telegram fake as parameters.retry_after.
	RetryAfter time.Duration
	// Body is the error text: Slack's plain-text reason ("no_service"),
	// Telegram's description, or the webhook sink's whole body. Empty: a
	// default that fits Status.
	Body string
	// Raw makes the Telegram fake send Body verbatim instead of wrapping it
	// in the Bot API's JSON error, as a proxy in front of the API would.
	Raw bool
	// Header holds extra response headers, e.g. a Retry-After HTTP-date.
	Header http.Header
}

func (f Failure) writeHeader(w http.ResponseWriter) {
	for k, vs := range f.Header {
		w.Header()[http.CanonicalHeaderKey(k)] = vs
	}
	if f.RetryAfter > 0 && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", strconv.Itoa(int(f.RetryAfter/time.Second)))
	}
}

// journal is a list of recorded items that a test can wait on.
type journal[T any] struct {
	mu      sync.Mutex
	items   []T
	changed chan struct{} // closed and replaced on every add
}

func (j *journal[T]) add(v T) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.items = append(j.items, v)
	if j.changed != nil {
		close(j.changed)
		j.changed = nil
	}
}

func (j *journal[T]) all() []T {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]T(nil), j.items...)
}

// waitFor returns the items once there are at least n, or an error after
// timeout with what arrived by then.
func (j *journal[T]) waitFor(n int, timeout time.Duration) ([]T, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		j.mu.Lock()
		if len(j.items) >= n {
			items := append([]T(nil), j.items...)
			j.mu.Unlock()
			return items, nil
		}
		if j.changed == nil {
			j.changed = make(chan struct{})
		}
		changed, got := j.changed, len(j.items)
		j.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			return j.all(), fmt.Errorf("waited %s for %d requests, got %d", timeout, n, got)
		}
	}
}

// script is a queue of scripted failures, consumed one per request.
type script[F any] struct {
	mu    sync.Mutex
	queue []F
}

func (s *script[F]) push(fs ...F) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, fs...)
}

func (s *script[F]) pop() (F, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var f F
	if len(s.queue) == 0 {
		return f, false
	}
	f, s.queue = s.queue[0], s.queue[1:]
	return f, true
}

func repeat[F any](n int, f F) []F {
	fs := make([]F, n)
	for i := range fs {
		fs[i] = f
	}
	return fs
}
