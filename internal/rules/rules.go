// Package rules holds Klaxon's notification rules: the schema users write
// (Hawk's, plus Klaxon's extensions), validation, and matching an event
// against a rule. It does no I/O.
package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/klaxonhq/klaxon/internal/quiet"
)

// What a rule reacts to (Hawk's whatToReceive).
const (
	OnlyNew  = "ONLY_NEW"  // the first event of a new group
	SeenMore = "SEEN_MORE" // a group's event count crossing a threshold
)

// What a SEEN_MORE rule counts (Klaxon's countBy).
const (
	CountEvents = "events"
	CountUsers  = "users" // distinct event.user.id
)

// Channel names, as keys of Spec.Channels.
const (
	Email    = "email"
	Telegram = "telegram"
	Slack    = "slack"
	Webhook  = "webhook"
	Loop     = "loop" // Hawk's Loop messenger: a Slack-compatible incoming webhook
)

// ChannelNames lists every channel a rule may use, in a stable order.
var ChannelNames = [...]string{Email, Telegram, Slack, Webhook, Loop}

// NewGroupCooldown is how long an ONLY_NEW rule stays quiet for a group after
// it fired for it.
const NewGroupCooldown = 24 * time.Hour

// Spec is one rule as users write it: an element of a Hawk project's
// `notifications` array, or of a project's list in the YAML rules file.
// Integers are milliseconds where the field says so, as in Hawk.
type Spec struct {
	ID              string                 `json:"_id" yaml:"id" bson:"-"`
	IsEnabled       bool                   `json:"isEnabled" yaml:"isEnabled" bson:"isEnabled"`
	WhatToReceive   string                 `json:"whatToReceive" yaml:"whatToReceive" bson:"whatToReceive"`
	Including       []string               `json:"including" yaml:"including" bson:"including"`
	Excluding       []string               `json:"excluding" yaml:"excluding" bson:"excluding"`
	Threshold       int64                  `json:"threshold" yaml:"threshold" bson:"threshold"`
	ThresholdPeriod int64                  `json:"thresholdPeriod" yaml:"thresholdPeriod" bson:"thresholdPeriod"`
	Channels        map[string]ChannelSpec `json:"channels" yaml:"channels" bson:"channels"`
	Windows         []WindowSpec           `json:"windows,omitempty" yaml:"windows" bson:"windows"`
	CountBy         string                 `json:"countBy,omitempty" yaml:"countBy" bson:"countBy"`
	Cooldown        int64                  `json:"cooldown,omitempty" yaml:"cooldown" bson:"cooldown"`
	// StormOver asks for a "storm over" message after a SEEN_MORE firing
	// (package storm); nil leaves it to KLAXON_STORM_OVER.
	StormOver *bool `json:"stormOver,omitempty" yaml:"stormOver" bson:"stormOver"`
	// Quiet holds the rule's firings during quiet hours, for one recap
	// when they end (package quiet); nil takes the project's.
	Quiet *quiet.Spec `json:"quiet,omitempty" yaml:"quiet" bson:"quiet"`
	// Critical rules pass through quiet hours, the project's and their own.
	Critical bool `json:"critical,omitempty" yaml:"critical" bson:"critical"`
}

// WindowSpec is one sliding window: Threshold events within Period ms, and
// with Spike only when they are also a spike over a longer baseline.
type WindowSpec struct {
	Threshold int64      `json:"threshold" yaml:"threshold" bson:"threshold"`
	Period    int64      `json:"period" yaml:"period" bson:"period"`
	Spike     *SpikeSpec `json:"spike,omitempty" yaml:"spike" bson:"spike"`
}

// SpikeSpec (Klaxon's extension) holds a window to a spike: its count must
// also be at least Factor times the usual rate, the events of the last
// Baseline ms scaled to the window's period, and never less than Floor
// events a period (so that a group without history needs Factor × Floor).
type SpikeSpec struct {
	Factor   float64 `json:"factor" yaml:"factor" bson:"factor"`
	Baseline int64   `json:"baseline" yaml:"baseline" bson:"baseline"` // ms
	Floor    int64   `json:"floor,omitempty" yaml:"floor" bson:"floor"`
}

// ChannelSpec is one destination of a rule. MinPeriod is in seconds.
type ChannelSpec struct {
	IsEnabled bool   `json:"isEnabled" yaml:"isEnabled" bson:"isEnabled"`
	Endpoint  string `json:"endpoint" yaml:"endpoint" bson:"endpoint"`
	MinPeriod int64  `json:"minPeriod" yaml:"minPeriod" bson:"minPeriod"`
}

// Rule is a validated, enabled rule ready for matching and counting.
type Rule struct {
	ProjectID string
	// ProjectName is the project's name (Hawk's projects.name, or the
	// rules file's name), for messages; "" when unknown. The rule store
	// sets it, so that no event needs a lookup.
	ProjectName string
	ID          string
	OnlyNew     bool
	// Description is the rule in words, for messages: "100 events in
	// 1 minute, title containing "database", not "staging"".
	Description string
	including   []string // lower-cased
	excluding   []string // lower-cased
	filterKey   string
	// titleBytes is how much of a title the filters search (Limits).
	titleBytes int
	// Windows are the sliding windows of a SEEN_MORE rule; empty for ONLY_NEW.
	Windows []Window
	// Users counts distinct event.user.id instead of events.
	Users bool
	// Cooldown is how long the rule stays quiet for a group after firing.
	Cooldown time.Duration
	// Channels are the enabled destinations, in ChannelNames order.
	Channels []Channel
	// StormOver says whether the rule asked for "storm over" messages:
	// Unset when it did not say (KLAXON_STORM_OVER decides).
	StormOver Choice
	// Quiet is the rule's quiet hours, its own or its project's (the
	// store sets those); nil for none, and for a Critical rule.
	Quiet *quiet.Schedule
	// Critical rules pass through quiet hours.
	Critical bool
	// Version changes whenever what the counter keeps for the rule would
	// change meaning (window and spike baseline periods, countBy), so such
	// an edit starts fresh counters; a threshold or cooldown edit keeps
	// them.
	Version string
}

// Choice is a rule's yes or no to an optional behaviour, or no word.
type Choice int8

const (
	Unset Choice = iota // the rule did not say
	No
	Yes
)

// WantsStormOver says whether the rule gets "storm over" messages, with
// all the setting that turns them on for every rule that did not say. Only
// SEEN_MORE rules counting events can: a storm of users leaves no history
// of when each user came (countBy users keeps a user's last time only).
func (r *Rule) WantsStormOver(all bool) bool {
	if r.OnlyNew || r.Users {
		return false
	}
	return r.StormOver == Yes || r.StormOver == Unset && all
}

// QuietAt is the quiet period during which a firing of the rule at t is
// held, and nil when it goes at once: outside quiet hours, or a critical
// rule.
func (r *Rule) QuietAt(t time.Time) *quiet.Span {
	if r.Quiet == nil || r.Critical {
		return nil
	}
	sp, ok := r.Quiet.At(t)
	if !ok {
		return nil
	}
	return &sp
}

// Window is a sliding window: the rule fires when Threshold matching events
// (or users) fall within Period, and for a spike window when they are also
// a spike (Reached).
type Window struct {
	Threshold int64
	Period    time.Duration
	// Spike is nil for a plain window.
	Spike *Spike
}

// Spike is a window's spike condition: the window's count must also be at
// least Factor times the usual rate (Rate), which its baseline, the events
// of the last Baseline (the window's own included), sets.
type Spike struct {
	Factor   float64 // in (1, MaxSpikeFactor]
	Baseline time.Duration
	Floor    int64 // the least usual rate: events per window period
}

// MaxSpikeFactor is the largest spike factor.
const MaxSpikeFactor = 1000

// Rate is the usual rate a spike window's count is held to, in events per
// window period: base, the events of the baseline period, scaled to the
// window's period, and at least Floor. 0 for a plain window.
func (w Window) Rate(base int64) float64 {
	if w.Spike == nil {
		return 0
	}
	return max(float64(base)*float64(w.Period)/float64(w.Spike.Baseline), float64(w.Spike.Floor))
}

// Reached reports whether a window whose count is count, and whose
// baseline holds base events, fires: count reaches the threshold and, for
// a spike window, Factor × Rate(base). It is worked in float64 without a
// division, as observe.lua does with Lua's numbers: the same operations in
// the same order, so both decide alike to the last bit.
func (w Window) Reached(count, base int64) bool {
	if count < w.Threshold {
		return false
	}
	s := w.Spike
	if s == nil {
		return true
	}
	p, b := float64(w.Period.Milliseconds()), float64(s.Baseline.Milliseconds())
	return float64(count)*b >= s.Factor*max(float64(base)*p, float64(s.Floor)*b)
}

// Channel is an enabled destination of a rule.
type Channel struct {
	Name      string // one of ChannelNames
	Endpoint  string // address, chat id or URL; may be a secret
	MinPeriod time.Duration
}

// FilterKey names the rule's title filter: rules with the same key match
// exactly the same events (SEEN_MORE matching depends on the title alone),
// so they can share what counts them.
func (r *Rule) FilterKey() string { return r.filterKey }

func filterKey(including, excluding []string) string {
	inc, exc := slices.Clone(including), slices.Clone(excluding)
	slices.Sort(inc)
	slices.Sort(exc)
	return strings.Join(slices.Compact(inc), "\x00") + "\x01" + strings.Join(slices.Compact(exc), "\x00")
}

// MaxPeriod is the longest window of the rule (0 for ONLY_NEW).
func (r *Rule) MaxPeriod() time.Duration {
	var longest time.Duration
	for _, w := range r.Windows {
		longest = max(longest, w.Period)
	}
	return longest
}

// Matches reports whether an event with this title and newness is one the
// rule reacts to. Title filters are case-insensitive substrings of the
// title's first Limits.MatchedTitleBytes bytes.
func (r *Rule) Matches(title string, isNew bool) bool {
	if r.OnlyNew && !isNew {
		return false
	}
	if len(r.including) == 0 && len(r.excluding) == 0 {
		return true
	}
	lower := strings.ToLower(cutTitle(title, r.titleBytes))
	for _, s := range r.excluding {
		if strings.Contains(lower, s) {
			return false
		}
	}
	if len(r.including) == 0 {
		return true
	}
	for _, s := range r.including {
		if strings.Contains(lower, s) {
			return true
		}
	}
	return false
}

// Explain is Matches with its reason in words, for operators' tools
// (klaxon explain): which excluding or including word decided, or that
// an ONLY_NEW rule saw a group that is not new. It agrees with Matches.
func (r *Rule) Explain(title string, isNew bool) (bool, string) {
	if r.OnlyNew && !isNew {
		return false, "not new: the rule is ONLY_NEW and the event's group was seen before (isNew false)"
	}
	lower := strings.ToLower(cutTitle(title, r.titleBytes))
	for _, s := range r.excluding {
		if strings.Contains(lower, s) {
			return false, fmt.Sprintf("excluded: the title contains excluding word %q", s)
		}
	}
	if len(r.including) == 0 {
		if len(r.excluding) == 0 {
			return true, "the rule has no title filter"
		}
		return true, fmt.Sprintf("the title contains none of the excluding words %q", r.excluding)
	}
	for _, s := range r.including {
		if strings.Contains(lower, s) {
			return true, fmt.Sprintf("the title contains including word %q", s)
		}
	}
	return false, fmt.Sprintf("the title contains none of the including words %q", r.including)
}

// Compile is Limits{}.Compile: it validates a spec within the default
// limits.
func Compile(projectID string, s Spec) (*Rule, []string, error) {
	return Limits{}.Compile(projectID, s)
}

// Compile validates a spec of project projectID. It returns (nil, nil, nil)
// for a disabled rule, an error naming the problem for a malformed one (one
// over the limits included), and warnings for a rule that works but
// probably not as its author meant.
func (l Limits) Compile(projectID string, s Spec) (*Rule, []string, error) {
	if !s.IsEnabled {
		return nil, nil, nil
	}
	if s.ID == "" {
		return nil, nil, fmt.Errorf("rule has no id")
	}
	l = l.withDefaults()
	r := &Rule{ProjectID: projectID, ID: s.ID, titleBytes: l.MatchedTitleBytes}
	var warnings []string
	switch s.WhatToReceive {
	case OnlyNew:
		r.OnlyNew = true
		r.Cooldown = NewGroupCooldown
	case SeenMore:
		windows, w, err := compileWindows(s, l.WindowsPerRule)
		if err != nil {
			return nil, nil, err
		}
		r.Windows, warnings = windows, w
		switch s.CountBy {
		case "", CountEvents:
		case CountUsers:
			r.Users = true
		default:
			return nil, nil, fmt.Errorf("countBy %q: want %q or %q", s.CountBy, CountEvents, CountUsers)
		}
		switch {
		case s.Cooldown < 0:
			return nil, nil, fmt.Errorf("cooldown %d ms: must not be negative", s.Cooldown)
		case s.Cooldown > int64(MaxWindowPeriod/time.Millisecond):
			// Also keeps the conversion to time.Duration from overflowing.
			return nil, nil, fmt.Errorf("cooldown %d ms is longer than %s", s.Cooldown, MaxWindowPeriod)
		case s.Cooldown == 0:
			r.Cooldown = r.MaxPeriod()
		default:
			r.Cooldown = time.Duration(s.Cooldown) * time.Millisecond
		}
	default:
		return nil, nil, fmt.Errorf("whatToReceive %q: want %q or %q", s.WhatToReceive, OnlyNew, SeenMore)
	}
	r.including = lowerNonEmpty(s.Including)
	r.excluding = lowerNonEmpty(s.Excluding)
	r.filterKey = filterKey(r.including, r.excluding)
	if err := l.checkFilters(r.including, r.excluding); err != nil {
		return nil, nil, err
	}
	for _, name := range ChannelNames {
		c, ok := s.Channels[name]
		if !ok || !c.IsEnabled {
			continue
		}
		if strings.TrimSpace(c.Endpoint) == "" {
			// Hawk sends each channel on its own: the rule's other
			// channels keep working.
			warnings = append(warnings, fmt.Sprintf("channel %s is enabled but has no endpoint: left out", name))
			continue
		}
		if w := l.checkEndpoint(name, c.Endpoint); w != "" {
			// Like a missing endpoint: the rule's other channels keep
			// working.
			warnings = append(warnings, w)
			continue
		}
		if c.MinPeriod < 0 {
			return nil, nil, fmt.Errorf("channel %s: minPeriod %d s must not be negative", name, c.MinPeriod)
		}
		if c.MinPeriod > int64(MaxWindowPeriod/time.Second) {
			// Also keeps the conversion to time.Duration from overflowing.
			return nil, nil, fmt.Errorf("channel %s: minPeriod %d s is longer than %s", name, c.MinPeriod, MaxWindowPeriod)
		}
		r.Channels = append(r.Channels, Channel{
			Name:      name,
			Endpoint:  strings.TrimSpace(c.Endpoint),
			MinPeriod: time.Duration(c.MinPeriod) * time.Second,
		})
	}
	for _, name := range slices.Sorted(maps.Keys(s.Channels)) {
		// Hawk's rules carry channels Klaxon does not have (webPush,
		// desktopPush), usually disabled: only an enabled one loses messages.
		if !knownChannel(name) && s.Channels[name].IsEnabled {
			warnings = append(warnings, fmt.Sprintf("channel %q is not supported: ignored", name))
		}
	}
	if len(r.Channels) == 0 {
		warnings = append(warnings, "no enabled channel: the rule counts but notifies nobody")
	}
	if s.StormOver != nil {
		r.StormOver = No
		if *s.StormOver {
			r.StormOver = Yes
		}
		switch {
		case !*s.StormOver:
		case r.OnlyNew:
			warnings = append(warnings, "stormOver applies to SEEN_MORE rules only: ignored")
		case r.Users:
			warnings = append(warnings, "stormOver is not supported with countBy users (a user's earlier times are not kept): ignored")
		}
	}
	r.Critical = s.Critical
	if s.Quiet != nil {
		sc, err := quiet.Compile(*s.Quiet)
		if err != nil {
			return nil, nil, err
		}
		if r.Critical {
			warnings = append(warnings, "quiet is ignored: the rule is critical, and passes through quiet hours")
		} else {
			r.Quiet = sc
		}
	}
	r.Version = version(r)
	r.Description = describe(r)
	return r, warnings, nil
}

// describe says what the rule reacts to, in words: its windows (or "new
// errors"), then its title filters.
func describe(r *Rule) string {
	var b strings.Builder
	if r.OnlyNew {
		b.WriteString("new errors")
	} else {
		noun := "events"
		if r.Users {
			noun = "affected users"
		}
		for i, w := range r.Windows {
			if i > 0 {
				b.WriteString(" or ")
			}
			fmt.Fprintf(&b, "%d %s in %s", w.Threshold, noun, words(w.Period))
			if sp := w.Spike; sp != nil {
				fmt.Fprintf(&b, " at %s× the rate over %s", strconv.FormatFloat(sp.Factor, 'f', -1, 64), words(sp.Baseline))
			}
		}
	}
	quote := func(ws []string) string {
		q := make([]string, len(ws))
		for i, w := range ws {
			q[i] = strconv.Quote(w)
		}
		return strings.Join(q, " or ")
	}
	if len(r.including) > 0 {
		b.WriteString(", title containing " + quote(r.including))
	}
	if len(r.excluding) > 0 {
		b.WriteString(", not " + quote(r.excluding))
	}
	return b.String()
}

// words says a window's period as people set them ("1 minute", "1 day",
// "90 seconds"): in its largest whole unit.
func words(d time.Duration) string {
	for _, u := range []struct {
		size time.Duration
		name string
	}{{7 * 24 * time.Hour, "week"}, {24 * time.Hour, "day"}, {time.Hour, "hour"}, {time.Minute, "minute"}, {time.Second, "second"}} {
		if d%u.size == 0 {
			if n := d / u.size; n != 1 {
				return fmt.Sprintf("%d %ss", n, u.name)
			}
			return "1 " + u.name
		}
	}
	return d.String()
}

func compileWindows(s Spec, maxWindows int) ([]Window, []string, error) {
	specs := s.Windows
	if len(specs) == 0 {
		specs = []WindowSpec{{Threshold: s.Threshold, Period: s.ThresholdPeriod}}
	}
	if len(specs) > maxWindows {
		return nil, nil, fmt.Errorf("%d windows: at most %d", len(specs), maxWindows)
	}
	windows := make([]Window, len(specs))
	for i, w := range specs {
		name := "threshold/thresholdPeriod"
		if len(s.Windows) > 0 {
			name = fmt.Sprintf("windows[%d]", i)
		}
		if w.Threshold < 1 || w.Threshold > MaxThreshold {
			return nil, nil, fmt.Errorf("%s: threshold %d must be from 1 to %d", name, w.Threshold, int64(MaxThreshold))
		}
		if w.Period < 1000 {
			return nil, nil, fmt.Errorf("%s: period %d ms must be at least 1000 ms", name, w.Period)
		}
		if w.Period > int64(MaxWindowPeriod/time.Millisecond) {
			return nil, nil, fmt.Errorf("%s: period %d ms is longer than %s", name, w.Period, MaxWindowPeriod)
		}
		windows[i] = Window{Threshold: w.Threshold, Period: time.Duration(w.Period) * time.Millisecond}
		if w.Spike != nil {
			sp, err := compileSpike(s, w)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: spike %w", name, err)
			}
			windows[i].Spike = sp
		}
	}
	var warnings []string
	// A longer window with a higher rate always fires first: the other can
	// never be the one that decides. A spike window fires only at a spike,
	// so it shadows none.
	for i, a := range windows {
		for j, b := range windows {
			shadows := b.Spike == nil && (b.Period > a.Period && b.Threshold <= a.Threshold ||
				b.Period == a.Period && b.Threshold < a.Threshold)
			if i != j && shadows {
				warnings = append(warnings, fmt.Sprintf(
					"window %d (%d per %s) can never fire before window %d (%d per %s)",
					i, a.Threshold, a.Period, j, b.Threshold, b.Period))
			}
		}
	}
	return windows, warnings, nil
}

// compileSpike checks a window's spike; its errors follow "spike".
func compileSpike(s Spec, w WindowSpec) (*Spike, error) {
	sp := w.Spike
	maxMS := int64(MaxWindowPeriod / time.Millisecond)
	switch {
	case s.CountBy == CountUsers:
		// A user's earlier times are not kept: no baseline of users.
		return nil, fmt.Errorf("is not supported with countBy users")
	case !(sp.Factor > 1 && sp.Factor <= MaxSpikeFactor): // NaN too
		return nil, fmt.Errorf("factor %v must be above 1 and at most %d", sp.Factor, MaxSpikeFactor)
	case sp.Baseline <= w.Period:
		return nil, fmt.Errorf("baseline %d ms must be longer than the window's period (%d ms)", sp.Baseline, w.Period)
	case sp.Baseline > maxMS:
		return nil, fmt.Errorf("baseline %d ms is longer than %s", sp.Baseline, MaxWindowPeriod)
	case sp.Floor < 0 || sp.Floor > MaxThreshold:
		return nil, fmt.Errorf("floor %d must be from 0 to %d", sp.Floor, int64(MaxThreshold))
	case sp.Factor*float64(w.Period) > float64(sp.Baseline):
		// The baseline holds the window's events too: a count c makes a
		// rate of at least c × period / baseline.
		return nil, fmt.Errorf("can never fire: its baseline counts the window's own events, so the baseline must be at least factor × period (%d ms), not %d ms",
			int64(math.Ceil(sp.Factor*float64(w.Period))), sp.Baseline)
	}
	return &Spike{Factor: sp.Factor, Baseline: time.Duration(sp.Baseline) * time.Millisecond, Floor: sp.Floor}, nil
}

// MaxThreshold is the largest threshold: the counter keeps a window's count
// in 32 bits, so a larger one could never be reached.
const MaxThreshold = math.MaxUint32

// MaxWindowPeriod is the longest window a rule may have.
const MaxWindowPeriod = 31 * 24 * time.Hour

func lowerNonEmpty(in []string) []string {
	var out []string
	for _, s := range in {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, strings.ToLower(s))
		}
	}
	return out
}

func knownChannel(name string) bool {
	for _, n := range ChannelNames {
		if n == name {
			return true
		}
	}
	return false
}

func version(r *Rule) string {
	h := sha256.New()
	fmt.Fprintf(h, "%t|%t", r.OnlyNew, r.Users)
	// Periods shape the stored buckets; thresholds and cooldowns do not, so
	// editing those keeps the counts of a storm in progress.
	for _, w := range r.Windows {
		fmt.Fprintf(h, "|%d", w.Period.Milliseconds())
		if w.Spike != nil {
			// The baseline's period, not its factor or floor: those are
			// thresholds.
			fmt.Fprintf(h, "~%d", w.Spike.Baseline.Milliseconds())
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:4])
}
