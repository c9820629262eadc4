package deliverer

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/klaxonhq/klaxon/internal/wire"
)

// Defaults of the fairness settings (Config).
const (
	DefaultMaxSends           = 1024
	DefaultMaxSendsPerHost    = 16
	DefaultMaxSendsPerProject = 32
	DefaultCircuitTimeouts    = 5
	DefaultCircuitOpen        = 30 * time.Second
)

// errCircuitOpen is the failure of an attempt that a host's open circuit
// kept from being made: the host timed out again and again, and the job
// is parked until the circuit lets a send through (Deliverer.park).
type errCircuitOpen struct{ wait time.Duration }

func (e *errCircuitOpen) Error() string {
	return fmt.Sprintf("not sent: the host's circuit is open after repeated timeouts; it is tried again in %s", e.wait.Round(time.Millisecond))
}

// RetryAfter makes the retry wait for the circuit (notify.RetryAfter).
func (e *errCircuitOpen) RetryAfter() time.Duration { return e.wait }

// pace holds a job to its provider's rate limit: it reserves the job's turn
// at the destination and says how long until it comes (0: now). A job back
// at its turn goes without asking again, even late: a delay queue lets
// messages out in order, so one ahead with a longer wait can hold it past
// its turn, and asking again would send it to the back of the line, which
// under load starves the destination. The price is a rare pair of sends
// close together, which providers allow as a burst or answer with a 429
// that is retried.
func (d *Deliverer) pace(ctx context.Context, job *wire.Job, dest string) (time.Duration, error) {
	limits := d.cfg.Limits[job.Channel]
	if len(limits) == 0 || job.Paced {
		return 0, nil
	}
	wait, err := d.limiter.Reserve(ctx, dest, limits...)
	if err != nil {
		return 0, err
	}
	return max(wait, 0), nil
}

// paceKey names what a provider paces, one webhook or chat, without its
// endpoint, which may be a secret (a Slack webhook URL, an address): the
// channel and its tag (seal.Keys.Tag: keyed when KLAXON_ENDPOINT_KEY is set).
func paceKey(channel string, tag []byte) string {
	return channel + ":" + hex.EncodeToString(tag[:12])
}

// circuitChanged logs and counts a change of a host's circuit, once per
// change. The endpoint is never logged, only the host.
func (d *Deliverer) circuitChanged(job *wire.Job, host, state string, probe bool) {
	if state == "" {
		return
	}
	d.metrics.CircuitChanges.WithLabelValues(job.Channel, state).Inc()
	switch {
	case state == closed.String():
		d.metrics.CircuitsOpen.WithLabelValues(job.Channel).Dec()
	case state == open.String() && !probe:
		d.metrics.CircuitsOpen.WithLabelValues(job.Channel).Inc()
	}
	log := d.log.With("channel", job.Channel, "host", host)
	switch state {
	case open.String():
		log.Warn("circuit opened: the host keeps timing out; its jobs wait in the retry queues",
			"timeouts", d.cfg.CircuitTimeouts, "open_for", d.cfg.CircuitOpen.String(), "after_probe", probe)
	case halfOpen.String():
		log.Info("circuit half-open: one send probes the host")
	case closed.String():
		log.Info("circuit closed: the host answers again")
	}
}

// isTimeout reports whether err says the endpoint did not answer in time.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}
