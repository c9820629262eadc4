package deliverer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/wire"
)

// Failed is a message of the failed queue (<prefix>.failed): the job that
// failed for good and the firings it carried (docs/operating.md), as
// wire.FailedRecord wrote it.
type Failed struct {
	wire.Job
	// Notifications are the firings the failed message carried: the job's
	// own, a grouped job's, or a digest's.
	Notifications []notify.Notification `json:"notifications,omitempty"`
}

// DecodeFailed reads a failed queue message's body, of this version or an
// earlier one: the job's kind is told by its shape (wire.ParseJob).
func DecodeFailed(body []byte) (Failed, error) {
	var f Failed
	if err := json.Unmarshal(body, &f); err != nil {
		return f, fmt.Errorf("failed message is not JSON: %w", err)
	}
	job, err := wire.ParseJob(body)
	if err != nil {
		return f, err
	}
	f.Job = job
	if f.Channel == "" || f.ProjectID == "" {
		return f, errors.New("failed message lacks channel or projectId")
	}
	return f, nil
}

// Label says what the failed message was: "firing", "grouped" (the
// firings of one event on one destination), "digest" (a minPeriod digest)
// or "snooze summary".
func (f *Failed) Label() string {
	switch {
	case f.Kind == wire.KindFirings && len(f.Firings) > 1:
		return "grouped"
	case f.Kind == wire.KindFirings:
		return "firing"
	case f.Kind == wire.KindSnooze:
		return "snooze summary"
	}
	return "digest"
}

// ErrNotReplayable is the error of Replay for a digest or snooze summary:
// the firings they gathered are recorded as digested or snoozed, not as
// failed, and no job re-sends them as they were.
var ErrNotReplayable = errors.New("a digest or snooze summary is not replayed: 'klaxon failed show' lists its firings")

// Replay is the delivery job that sends a failed firing (or grouped
// firings) once more: the same job, with a fresh count of attempts and no
// turn reserved, to be published to the delivery queue.
//
// Before it is published, the firing's claim records must be cleared
// (ClearFailed): a firing recorded as failed is done for the deliverer,
// which would drop the replayed job as a duplicate.
func (f *Failed) Replay() (wire.Job, error) {
	if f.Kind != wire.KindFirings {
		return wire.Job{}, ErrNotReplayable
	}
	job := f.Job
	job.Attempt, job.NotBefore, job.Paced, job.Generation = 0, time.Time{}, false, ""
	return job, nil
}

// clearFailed deletes a claim record if, and only if, it says "failed": a
// record that says "sent" (an earlier replay that went out) must stay, so
// that a replay of the same message again is dropped as a duplicate.
var clearFailed = redis.NewScript(`if redis.call('GET', KEYS[1]) == 'failed' then return redis.call('DEL', KEYS[1]) end return 0`)

// ClearFailed clears the "failed" records of the firings job carries, under
// prefix, so that the deliverer sends the job once more; records of any
// other outcome stay, and with them the guarantee that a firing is sent
// once: replaying a message twice sends it once. It returns how many
// records it cleared.
func ClearFailed(ctx context.Context, rdb redis.UniversalClient, prefix string, job *wire.Job) (int, error) {
	d := &Deliverer{cfg: Config{Prefix: prefix}}
	var keys []string
	for _, f := range job.Firings {
		keys = append(keys, d.claimKey(wire.FiringKey(f.Notification.ID, job.Channel)))
	}
	cleared := 0
	for _, k := range keys { // one call a key: they may lie in different cluster slots
		n, err := clearFailed.Run(ctx, rdb, []string{k}).Int()
		if err != nil {
			return cleared, fmt.Errorf("clear the failed record of %s: %w", job.Key(), err)
		}
		cleared += n
	}
	return cleared, nil
}
