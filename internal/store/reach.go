package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"
)

// UnreachableError says that MongoDB did not answer a ping in time, in
// words: the driver's own error is a dump of its topology ("server
// selection error: context canceled, current topology: { Type: Unknown,
// …"), which tells a user nothing about what to fix.
type UnreachableError struct {
	Within time.Duration
	// Cause is the last connection error the driver saw, e.g. "dial tcp
	// 127.0.0.1:27017: connect: connection refused"; "" when none.
	Cause string
}

func (e *UnreachableError) Error() string {
	s := fmt.Sprintf("MongoDB did not answer within %s", e.Within)
	if e.Cause != "" {
		s += " (" + e.Cause + ")"
	}
	return s
}

// Reachable pings MongoDB and waits at most within for the answer; an
// *UnreachableError when none came.
func (s *MongoSource) Reachable(ctx context.Context, within time.Duration) error {
	return Ping(ctx, s.client, within)
}

// Ping pings the MongoDB of client and waits at most within for the
// answer; an *UnreachableError when none came.
func Ping(ctx context.Context, client *mongo.Client, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	err := client.Ping(ctx, readpref.PrimaryPreferred())
	if err == nil {
		return nil
	}
	if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
		var sel topology.ServerSelectionError
		if !errors.As(err, &sel) {
			return fmt.Errorf("ping MongoDB: %w", err) // an answer, if an unhappy one (authentication, …)
		}
	}
	return &UnreachableError{Within: within, Cause: lastServerError(err)}
}

// lastServerError is the last connection error of a server the driver
// tried, from a server selection error.
func lastServerError(err error) string {
	var sel topology.ServerSelectionError
	if !errors.As(err, &sel) {
		return ""
	}
	for _, srv := range sel.Desc.Servers {
		if srv.LastError != nil {
			return srv.LastError.Error()
		}
	}
	return ""
}
