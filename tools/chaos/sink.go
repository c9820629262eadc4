package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// request is one webhook request the sink received.
type request struct {
	Key    string // Idempotency-Key
	Body   []byte
	At     time.Time
	Method string
	Path   string
	from   *lookup // who sent it
}

// Sender is the worker process that sent the request ("w2#5": slot 2, fifth
// start), found just after the connection was accepted: the kernel names
// the client's socket (sock_diag), /proc/<pid>/fd its holder. It is "gone"
// when no live worker held that socket any more (a live worker keeps it
// open until it has its answer, so it was killed); "" when the lookup
// failed.
func (r request) Sender() string {
	if r.from == nil {
		return ""
	}
	<-r.from.done
	return r.from.sender
}

// lookup is the search for the process behind one connection.
type lookup struct {
	client, server netip.AddrPort
	accepted       time.Time // when the sink accepted the connection
	done           chan struct{}
	sender         string // set before done closes
}

// sink is the run's webhook endpoint: it records every request and answers
// 200. It stands for the provider, the one fake of a chaos run.
type sink struct {
	URL string

	srv *http.Server
	// workers names the live worker processes by pid.
	workers func() map[int]string

	mu      sync.Mutex
	reqs    []request
	last    time.Time
	pending []*lookup
	wake    chan struct{}
	stop    chan struct{}
	stopped chan struct{}
}

type lookupKey struct{}

// newSink starts the sink on a free port of 127.0.0.1. workers, when not
// nil, lets it tell which worker sent each request.
func newSink(workers func() map[int]string) (*sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("webhook sink: %w", err)
	}
	s := &sink{workers: workers,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{})}
	s.URL = "http://" + ln.Addr().String() + "/hook"
	s.srv = &http.Server{
		// Every request, whatever its method or path: one a worker sends
		// elsewhere is a finding, not a 404 left uncounted.
		Handler:           http.HandlerFunc(s.serve),
		ReadHeaderTimeout: 5 * time.Second,
		// The client is alive while it connects: look it up now, before a
		// kill can take it away, but off the accept loop (resolve).
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			client, cok := c.RemoteAddr().(*net.TCPAddr)
			server, sok := c.LocalAddr().(*net.TCPAddr)
			if !cok || !sok || s.workers == nil {
				return ctx
			}
			l := &lookup{client: client.AddrPort(), server: server.AddrPort(), accepted: time.Now(), done: make(chan struct{})}
			s.mu.Lock()
			s.pending = append(s.pending, l)
			s.mu.Unlock()
			select {
			case s.wake <- struct{}{}:
			default:
			}
			return context.WithValue(ctx, lookupKey{}, l)
		},
	}
	go s.resolve()
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *sink) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	from, _ := r.Context().Value(lookupKey{}).(*lookup)
	if from != nil {
		// Answer only once the sender is known: until it has its answer,
		// a live worker keeps the connection open, so a closed one means
		// the worker died.
		select {
		case <-from.done:
		case <-r.Context().Done():
		}
	}
	now := time.Now()
	s.mu.Lock()
	s.reqs = append(s.reqs, request{Key: r.Header.Get("Idempotency-Key"), Body: body, At: now,
		Method: r.Method, Path: r.URL.Path, from: from})
	s.last = now
	s.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// resolve answers the pending lookups in batches: the kernel names each
// connection's socket (sock_diag), and one scan of the workers'
// descriptors serves every connection accepted meanwhile.
func (s *sink) resolve() {
	defer close(s.stopped)
	for {
		select {
		case <-s.wake:
		case <-s.stop:
			s.mu.Lock()
			batch := s.pending
			s.pending = nil
			s.mu.Unlock()
			for _, l := range batch {
				close(l.done)
			}
			return
		}
		s.mu.Lock()
		batch := s.pending
		s.pending = nil
		s.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		inodes := make([]uint64, len(batch))
		errs := make([]error, len(batch))
		for i, l := range batch {
			inodes[i], errs[i] = tcpInode(unmap(l.client), unmap(l.server))
		}
		owners := socketOwners(s.workers())
		for i, l := range batch {
			switch {
			case errors.Is(errs[i], errGone), errs[i] == nil && inodes[i] == 0:
				l.sender = gone // closed already
			case errs[i] != nil:
			case owners[inodes[i]] != "":
				l.sender = owners[inodes[i]]
			default:
				l.sender = gone // open, but no live worker holds it: its holder died
			}
			close(l.done)
		}
	}
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// errGone says there is no such socket any more.
var errGone = errors.New("no such socket")

// gone names the sender of a request whose process had closed the
// connection, or died, before the sink looked it up.
const gone = "gone"

// requests returns what arrived so far.
func (s *sink) requests() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]request(nil), s.reqs...)
}

// lastRequest is when the last request arrived.
func (s *sink) lastRequest() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

func (s *sink) close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	close(s.stop)
	<-s.stopped
	if err != nil {
		return fmt.Errorf("stop webhook sink: %w", err)
	}
	return nil
}
