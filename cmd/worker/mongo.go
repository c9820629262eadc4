package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/klaxonhq/klaxon/internal/store"
)

// mongoSource is the MongoDB rule source, built on the first load that can
// build it. The driver resolves a mongodb+srv URL's DNS records before it
// makes a client at all, so building it up front turned a DNS outage at
// start-up into an exit, and under a supervisor into a crash loop. Until it
// is built, loads fail like those of any unreachable store: the worker is
// not ready, holds its events, and the rule cache retries and logs.
type mongoSource struct {
	url, database string

	mu     sync.Mutex
	src    *store.MongoSource // nil until built
	loaded bool               // a load succeeded: no more pings first
}

// reachWithin bounds the ping that precedes every load until one succeeds:
// a MongoDB that is down or mistyped is said, in words, within 5 s of start
// rather than as the driver's topology dump at the end of a load's timeout.
const reachWithin = 4 * time.Second

// newMongoSource builds the source now if it can. Only a failed DNS lookup
// is put off; any other error is the URL's and stops the worker at once.
func newMongoSource(url, database string, log *slog.Logger) (*mongoSource, error) {
	s := &mongoSource{url: url, database: database}
	if _, err := s.source(); err != nil {
		var dnsErr *net.DNSError
		if !errors.As(err, &dnsErr) {
			return nil, err
		}
		log.Warn("MongoDB name does not resolve yet; retrying at each rules load", "error", err)
	}
	return s, nil
}

func (s *mongoSource) source() (*store.MongoSource, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.src == nil {
		src, err := store.NewMongoSource(s.url, s.database)
		if err != nil {
			return nil, err
		}
		s.src = src
	}
	return s.src, nil
}

// Load implements store.Source.
func (s *mongoSource) Load(ctx context.Context) (store.Specs, error) {
	src, err := s.source()
	if err != nil {
		return store.Specs{}, err
	}
	s.mu.Lock()
	loaded := s.loaded
	s.mu.Unlock()
	if !loaded {
		if err := src.Reachable(ctx, reachWithin); err != nil {
			return store.Specs{}, err
		}
	}
	specs, err := src.Load(ctx)
	if err == nil && !loaded {
		s.mu.Lock()
		s.loaded = true
		s.mu.Unlock()
	}
	return specs, err
}

// Close disconnects from MongoDB, if the client was ever built.
func (s *mongoSource) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.src == nil {
		return nil
	}
	return s.src.Close(ctx)
}
