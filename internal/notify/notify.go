// Package notify turns firings into messages on email, Telegram, Slack, Loop
// and webhooks. The types here are the contract between the evaluator, which
// creates notifications, and the channels, which deliver them.
package notify

import (
	"context"
	"time"
)

// Notification types (the webhook body's "type").
const (
	TypeNew       = "new"
	TypeThreshold = "threshold"
	// TypeRegressed is an ONLY_NEW rule firing for a group the tracker
	// had marked resolved (docs/contract.md §4.6).
	TypeRegressed = "regressed"
	TypeDigest    = "digest"
	// TypeGrouped is one message for the firings of several rules of a
	// project for one event that share a destination (docs/contract.md
	// §5.8).
	TypeGrouped = "grouped"
	// TypeStormOver closes a SEEN_MORE firing's storm: its window stayed
	// below the threshold for a whole period (package storm).
	TypeStormOver = "storm_over"
)

// BodyVersion is the "version" of webhook bodies. Version 2 added
// projectName, ruleDescription and event.url to version 1 (bodies without
// "version"); version 3 added "history", "resolvedAt" and the type
// "regressed"; version 4 the type "grouped", a body of its own (Grouped),
// and "storm" with the type "storm_over". Versions only add fields, so a
// receiver of an older one keeps working (one that switches on "type"
// should expect new values).
const BodyVersion = "4"

// Notification is one firing of a rule for a group of events. Its JSON form
// is the webhook body of docs/contract.md §5.1.
type Notification struct {
	// Version is BodyVersion in a webhook body; empty elsewhere (delivery
	// jobs, and the notifications a digest lists).
	Version   string `json:"version,omitempty"`
	ID        string `json:"id"`   // deterministic; the same for every channel
	Type      string `json:"type"` // TypeNew, TypeThreshold, TypeRegressed or TypeStormOver
	ProjectID string `json:"projectId"`
	// ProjectName is the project's name, "" when the rules store has none.
	ProjectName string `json:"projectName"`
	RuleID      string `json:"ruleId"`
	// RuleDescription is the rule in words: "100 events in 1 minute,
	// title containing "database"".
	RuleDescription string `json:"ruleDescription"`
	Event           Event  `json:"event"`
	// Count, Threshold and Period (ms) are those of the window that fired;
	// a TypeNew notification has Count 1 and no window.
	Count     int64          `json:"count"`
	Threshold int64          `json:"threshold"`
	Period    int64          `json:"period"`
	CountBy   string         `json:"countBy,omitempty"` // "events" or "users"
	FiredAt   time.Time      `json:"firedAt"`
	Windows   []WindowStatus `json:"windows"`
	// History is what Hawk's events database says of the group when the
	// rule fired; nil when it is not configured or did not answer in time.
	History *History `json:"history,omitempty"`
	// ResolvedAt is when the group had been marked resolved, for a
	// TypeRegressed notification; zero (absent) otherwise.
	ResolvedAt time.Time `json:"resolvedAt,omitzero"`
	// Storm is the storm a TypeStormOver notification closes; nil
	// (absent) otherwise.
	Storm *Storm `json:"storm,omitempty"`
}

// Storm is what a "storm over" message says of the storm it closes. Its
// notification's Count is Events, Threshold and Period those of the window
// that fired, and FiredAt when the storm was found over (QuietSince plus
// the period).
type Storm struct {
	// FiringID is the id of the storm's first firing, whose message this
	// one closes; firings during the storm belong to it too.
	FiringID  string    `json:"firingId"`
	StartedAt time.Time `json:"startedAt"` // the first firing's time
	// QuietSince is when the window fell below its threshold for good.
	QuietSince time.Time `json:"quietSince"`
	Duration   int64     `json:"duration"` // ms, StartedAt to QuietSince
	// Events is how many events the window counted from the first
	// firing's window to QuietSince.
	Events int64 `json:"events"`
	// Exact is false when a check came more than a period late (an
	// outage): Events is then a lower bound, and QuietSince and Duration
	// upper bounds.
	Exact bool `json:"exact"`
}

// History is a group's past as the tracker knows it, as Hawk's own
// messages show it.
type History struct {
	TotalCount   int64     `json:"totalCount"`         // events of the group so far
	FirstSeen    time.Time `json:"firstSeen,omitzero"` // absent when unknown
	DaysRepeated int64     `json:"daysRepeated"`       // days on which it happened
	TopFrame     string    `json:"topFrame"`           // "file:line" of the top backtrace frame, "" when none
}

// Event is what a notification says about the event that fired it.
type Event struct {
	Title        string  `json:"title"`
	GroupHash    string  `json:"groupHash"`
	RepetitionID *string `json:"repetitionId"`
	// URL is the event's page in the tracker (KLAXON_EVENT_URL), "" when
	// not configured.
	URL string `json:"url"`
}

// WindowStatus is one window of the rule at the moment it fired.
type WindowStatus struct {
	Threshold int64     `json:"threshold"`
	Period    int64     `json:"period"` // ms
	Count     int64     `json:"count"`
	ResetAt   time.Time `json:"resetAt"` // when the window will have slid past every counted event
	// Spike is what a spike window's baseline said; nil (absent) for a
	// plain window.
	Spike *Spike `json:"spike,omitempty"`
}

// Spike is a spike window's baseline at the moment its rule fired: the
// window fires when its count reaches its threshold and Factor × Rate.
type Spike struct {
	Factor   float64 `json:"factor"`   // the rule's
	Baseline int64   `json:"baseline"` // ms, the baseline's period
	Floor    int64   `json:"floor"`    // the least Rate, the rule's
	// BaselineCount is the events of the baseline period, the window's
	// own included.
	BaselineCount int64 `json:"baselineCount"`
	// Rate is the usual rate, in events per window period:
	// BaselineCount × period / Baseline, and at least Floor.
	Rate float64 `json:"rate"`
	// Ratio is the window's count over Rate: "7× the usual rate"; 0 when
	// Rate is 0.
	Ratio float64 `json:"ratio"`
}

// Message is what one send carries to one destination: a single
// notification, a digest of the firings gathered during a channel's
// minPeriod, or the firings of several rules for one event that share the
// destination (Grouped).
type Message struct {
	ID            string // the notification's id, the digest's or the group's
	ProjectID     string
	RuleID        string         // "" when Grouped: each notification names its rule
	Notifications []Notification // one, unless Digest or Grouped
	Digest        bool
	// Grouped marks the firings of several rules for one event, one per
	// rule, in the order of the project's rules.
	Grouped bool
	// Omitted counts the firings of a digest left out of Notifications
	// because the digest was full (the deliverer's digest bounds): every
	// channel says "and N more".
	Omitted int64
	// Quiet makes a digest the recap of a quiet period, of one rule's
	// firings or several's (RuleID ""); nil for any other message.
	Quiet *Recap
}

// Digest is the webhook body of a digest message (docs/contract.md §5.2).
type Digest struct {
	Version       string         `json:"version"` // BodyVersion
	Type          string         `json:"type"`    // TypeDigest
	ID            string         `json:"id"`
	ProjectID     string         `json:"projectId"`
	ProjectName   string         `json:"projectName"`
	RuleID        string         `json:"ruleId"`
	Notifications []Notification `json:"notifications"`
	// Omitted is how many more firings the digest stands for but does not
	// list, because it was full; 0 when it lists them all.
	Omitted int64 `json:"omitted"`
	// Quiet is set in the recap of a quiet period (its id "quiet-…"),
	// whose ruleId is "" when it lists several rules' firings.
	Quiet *Recap `json:"quiet,omitempty"`
}

// Grouped is the webhook body of a grouped message (docs/contract.md
// §5.8): the firings of several rules of one project for one event, sent
// to one destination as one message.
type Grouped struct {
	Version     string `json:"version"` // BodyVersion
	Type        string `json:"type"`    // TypeGrouped
	ID          string `json:"id"`
	ProjectID   string `json:"projectId"`
	ProjectName string `json:"projectName"`
	// RuleIDs are the rules that fired, as the notifications list them.
	RuleIDs []string `json:"ruleIds"`
	// Event is the event all of them fired for.
	Event Event `json:"event"`
	// Notifications has one body per rule, as a single message's.
	Notifications []Notification `json:"notifications"`
}

// A Channel delivers a message to one endpoint (an address, chat id or
// URL). It knows its provider, so it decides whether a failure is worth
// retrying: retry is true for transient failures (5xx, timeouts, 429, SMTP
// 4xx). An error may also implement RetryAfter.
type Channel interface {
	Notify(ctx context.Context, endpoint string, m *Message) (retry bool, err error)
}

// RetryAfter is implemented by errors from providers that said when to try
// again (HTTP 429 with Retry-After, Telegram's retry_after).
type RetryAfter interface {
	RetryAfter() time.Duration
}
