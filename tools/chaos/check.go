package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// compare matches the requests against the expected firings.
func compare(res *Result, p *plan, reqs []request, f *fleet) {
	res.Received = len(reqs)
	for _, r := range reqs {
		switch sender := r.Sender(); {
		case sender == "":
			res.UnknownSender++
		case sender != gone && f.killTime(sender).IsZero():
			res.LogChecked++
			if logged, _ := f.sentLine(sender, r.Key); !logged {
				res.Unlogged++
				res.UnloggedSample = appendSample(res.UnloggedSample, r.Key+" from "+sender)
			}
		}
	}
	byID := map[string][]request{}
	for _, r := range reqs {
		type firing struct {
			ID        string    `json:"id"`
			ProjectID string    `json:"projectId"`
			RuleID    string    `json:"ruleId"`
			FiredAt   time.Time `json:"firedAt"`
			Event     struct {
				GroupHash string `json:"groupHash"`
			} `json:"event"`
		}
		var body struct {
			firing
			Type string `json:"type"`
			// A grouped message (docs/contract.md §5.8) carries the
			// firings of several rules for one event: each counts as
			// delivered by it.
			Notifications []firing `json:"notifications"`
		}
		if err := json.Unmarshal(r.Body, &body); err != nil || body.ID != r.Key || r.Method != "POST" || r.Path != "/hook" {
			res.Bad++
			continue
		}
		firings := []firing{body.firing}
		if body.Type == "grouped" {
			firings = body.Notifications
		}
		for _, f := range firings {
			byID[f.ID] = append(byID[f.ID], r)
			if want, ok := p.Expected[f.ID]; ok && (f.ProjectID != want.ProjectID || f.RuleID != want.RuleID ||
				f.Event.GroupHash != want.GroupHash || !f.FiredAt.Equal(want.At)) {
				res.Bad++
			}
		}
	}
	for id := range p.Expected {
		got := byID[id]
		if len(got) == 0 {
			res.Missed++
			// With the rule, group and time, the workers' logs (at info
			// with -log-dir) can be searched for the events that led up
			// to the firing, which no log line names by its id.
			f := p.Expected[id]
			res.Missing = appendSample(res.Missing, fmt.Sprintf("%s (rule %s, group %s, at %s)",
				id, f.RuleID, f.GroupHash, f.At.UTC().Format(time.RFC3339Nano)))
			continue
		}
		if len(got) == 1 {
			continue
		}
		res.Repeats += len(got) - 1
		first := got[0]
		rp := repeat{ID: id, Copies: len(got), Sender: first.Sender(), Gap: got[1].At.Sub(first.At).Round(time.Millisecond).String()}
		for _, r := range got {
			rp.Senders = append(rp.Senders, r.Sender())
		}
		// Each copy but the last caused the next one: its sender must have
		// died before recording it, and the next copy must have waited for
		// its claim to expire.
		for i, r := range got[:len(got)-1] {
			after, killed := killedAfter(f, r)
			if i == 0 && killed && r.Sender() != gone {
				rp.KilledAfter = after.Round(time.Microsecond).String()
			}
			switch waited := got[i+1].At.Sub(r.At) >= minRepeatGap; {
			case waited && killedBeforeRecording(f, r, got[i+1].At):
				res.RepeatsAfterKill++
			case waited && f.unrecorded(r.Sender(), id, r.Key):
				res.RepeatsUnrecorded++
			}
		}
		res.Repeated = append(res.Repeated, rp)
	}
	for id := range byID {
		if _, ok := p.Expected[id]; !ok {
			res.Extra++
			res.Extras = appendSample(res.Extras, id)
		}
	}
	slices.SortFunc(res.Repeated, func(a, b repeat) int { return strings.Compare(a.ID, b.ID) })
	slices.Sort(res.Missing)
	slices.Sort(res.Extras)
}

// The crash window as the tool sees it, and what it implies.
const (
	// sendTimeout is the workers' KLAXON_SEND_TIMEOUT: a dead sender's
	// claim expires twice that after it was taken, before the send.
	sendTimeout = 2 * time.Second
	// crashWindow bounds how far from the sink's reading a request a
	// worker may have been SIGKILLed for the kill to explain a repeat sent
	// by a process gone before the sink could name it (or how long before
	// the read a named sender's kill may come). After the sink answers,
	// the worker records the send with one Redis command; the kills seen
	// so far fell between 12 ms before and 84 ms after the read on a
	// saturated machine. It is kept under the mean kill interval, so that
	// an unrelated kill seldom explains a repeat.
	crashWindow = 250 * time.Millisecond
	// minRepeatGap is the least time between a copy read by the sink and
	// the next: the dead sender's claim lasts 2×sendTimeout from before its
	// send, which ended within sendTimeout (read up to crashWindow later).
	minRepeatGap = sendTimeout - crashWindow
)

// killedBeforeRecording reports whether r's sender was SIGKILLed between
// the sink reading r and the sender recording it, the next copy coming at
// next. A named sender's own log says: it was killed after the read (or
// just before, crashWindow) and before next, and it never logged the send
// as recorded (fleet.recorded), however long the record took (a Redis
// fault, a worker starved of CPU). A sender gone before the lookup has no
// log to read: some worker must have been killed between its connection
// (less crashWindow) and crashWindow after the read, or, for a send read
// during a Redis fault (no write acknowledged meanwhile: a failover, a
// WAIT for a replica being resynced), until the fault was over.
func killedBeforeRecording(f *fleet, r request, next time.Time) bool {
	switch sender := r.Sender(); sender {
	case "":
		return false
	case gone:
		late := crashWindow
		if e := f.faultEnd(r.At); !e.IsZero() {
			late = e.Sub(r.At) + crashWindow
		}
		return f.killedBetween(r.from.accepted.Add(-crashWindow), r.At.Add(late))
	default:
		t := f.killTime(sender)
		return !t.IsZero() && !t.Before(r.At.Add(-crashWindow)) && t.Before(next) && !f.recorded(sender, r.Key)
	}
}

// killedAfter says whether the sender of r was SIGKILLed, and how long
// after the sink read r: negative when the kill came after the request was
// written but before the sink read it. A sender already gone when the sink
// looked counts as killed at once.
func killedAfter(f *fleet, r request) (time.Duration, bool) {
	switch sender := r.Sender(); sender {
	case "":
		return 0, false
	case gone:
		return 0, true
	default:
		t := f.killTime(sender)
		return t.Sub(r.At), !t.IsZero()
	}
}

func appendSample(s []string, id string) []string {
	if len(s) < 10 {
		return append(s, id)
	}
	return s
}
