package main

import (
	"context"

	"github.com/klaxonhq/klaxon/internal/counter"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/store"
)

// levels tells a quiet period's recap which groups are still above a
// threshold (deliverer.Levels): a group of a SEEN_MORE rule counting
// events one of whose windows, over the period ending at Redis' clock,
// holds its threshold's events or more, at the resolution of the counter.
// Rules counting users keep no history to tell it: never above here.
type levels struct {
	rules *store.Cache
	rings *counter.Engine
}

func (l levels) StillAbove(ctx context.Context, projectID, ruleID, groupHash string) (bool, error) {
	var r *rules.Rule
	for _, x := range l.rules.Rules(projectID) {
		if x.ID == ruleID {
			r = x
		}
	}
	if r == nil || r.OnlyNew || r.Users {
		return false, nil
	}
	for w, win := range r.Windows {
		ring, err := l.rings.Ring(ctx, projectID, groupHash, r, w)
		if err != nil {
			return false, err
		}
		oldest := ring.Now.Add(-win.Period).UnixMilli() / ring.Bucket.Milliseconds()
		var n int64
		for bucket, c := range ring.Counts {
			if bucket >= oldest {
				n += c
			}
		}
		if n >= win.Threshold {
			return true, nil
		}
	}
	return false, nil
}
