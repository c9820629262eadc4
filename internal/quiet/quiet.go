// Package quiet keeps quiet hours: a weekly schedule in one time zone
// during which a rule's firings are counted and held, then told in one
// recap per destination when the quiet period ends (docs/rules.md "Quiet
// hours"). It only computes: the deliverer holds and recaps.
//
// A schedule is compiled once per rule load into at most 7 × MaxPeriods
// disjoint intervals of the week, so that telling whether a time is quiet
// costs O(periods) and reads nothing. Periods that touch or overlap make
// one quiet period ("every night, and all weekend" is one from Friday
// 22:00 to Monday 07:00, with one recap), and a period whose end is not
// after its start runs into the next day: it belongs to the day it starts.
package quiet

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	// Zones are read from the system, else from the rules Go embeds, so
	// that a worker without a zone database keeps every zone.
	_ "time/tzdata"
)

// MaxPeriods is the most periods a schedule may list.
const MaxPeriods = 16

// Spec is quiet hours as users write them: `quiet` of a rule or of a
// project (a Klaxon extension of Hawk's documents).
type Spec struct {
	// Timezone is an IANA zone name (Europe/Berlin, UTC); required.
	Timezone string `json:"timezone" yaml:"timezone" bson:"timezone"`
	// Hours are the quiet periods of each week, 1 to MaxPeriods.
	Hours []PeriodSpec `json:"hours" yaml:"hours" bson:"hours"`
}

// PeriodSpec is one weekly quiet period: on each of Days (every day when
// empty), from From until To, wall-clock times "HH:MM" or "HH:MM:SS" in
// the schedule's zone. From defaults to 00:00 and To to 24:00 (the end of
// the day), so {days: [sat, sun]} is the whole weekend. A To not after
// From ends on the next day.
type PeriodSpec struct {
	Days []string `json:"days,omitempty" yaml:"days" bson:"days"`
	From string   `json:"from,omitempty" yaml:"from" bson:"from"`
	To   string   `json:"to,omitempty" yaml:"to" bson:"to"`
}

// Schedule is a compiled Spec. It never changes once made.
type Schedule struct {
	loc  *time.Location
	zone string
	// spans are disjoint, sorted intervals of the week in seconds from
	// Monday 00:00 wall-clock time; the last may end past the week's end
	// (a period from Sunday into Monday), then wrapping onto the next.
	spans []interval
	words string
}

type interval struct{ start, end int64 }

const (
	day  = 24 * 60 * 60
	week = 7 * day
)

// Span is one quiet period: from Since until Until (exclusive), times in
// the schedule's zone.
type Span struct {
	Since    time.Time `json:"since"`
	Until    time.Time `json:"until"`
	Timezone string    `json:"timezone"`
}

var dayNames = map[string]int{
	"mon": 0, "monday": 0, "tue": 1, "tuesday": 1, "wed": 2, "wednesday": 2, "thu": 3, "thursday": 3,
	"fri": 4, "friday": 4, "sat": 5, "saturday": 5, "sun": 6, "sunday": 6,
}

var shortDays = [7]string{"mon", "tue", "wed", "thu", "fri", "sat", "sun"}

// Compile validates s. Errors name the field, as quiet.hours[1].from.
func Compile(s Spec) (*Schedule, error) {
	if strings.TrimSpace(s.Timezone) == "" {
		return nil, fmt.Errorf("quiet.timezone is missing: give an IANA zone such as Europe/Berlin, or UTC")
	}
	loc, err := loadZone(strings.TrimSpace(s.Timezone))
	if err != nil {
		return nil, fmt.Errorf("quiet.timezone %q: not a known IANA time zone (such as Europe/Berlin, or UTC)", cut(s.Timezone))
	}
	switch {
	case len(s.Hours) == 0:
		return nil, fmt.Errorf("quiet.hours is empty: give at least one period, such as {from: \"22:00\", to: \"07:00\"}")
	case len(s.Hours) > MaxPeriods:
		return nil, fmt.Errorf("quiet.hours has %d periods: at most %d", len(s.Hours), MaxPeriods)
	}
	sc := &Schedule{loc: loc, zone: loc.String()}
	var all []interval
	var words []string
	for i, p := range s.Hours {
		field := fmt.Sprintf("quiet.hours[%d]", i)
		days, err := parseDays(field, p.Days)
		if err != nil {
			return nil, err
		}
		from, to := int64(0), int64(day)
		if p.From != "" {
			if from, err = parseClock(field+".from", p.From, false); err != nil {
				return nil, err
			}
		}
		if p.To != "" {
			if to, err = parseClock(field+".to", p.To, true); err != nil {
				return nil, err
			}
		}
		if from == to {
			return nil, fmt.Errorf("%s: from and to are both %s, an empty period; leave both out for the whole day", field, clock(from))
		}
		end := to
		if to <= from {
			end = to + day // into the next day
		}
		for _, d := range days {
			start := int64(d)*day + from
			all = append(all, interval{start, int64(d)*day + end})
		}
		words = append(words, describe(days, from, to))
	}
	sc.spans = merge(all)
	if len(sc.spans) == 1 && sc.spans[0].end-sc.spans[0].start >= week {
		return nil, fmt.Errorf("quiet.hours cover the whole week: nothing would ever be sent; disable the rule instead")
	}
	sc.words = strings.Join(words, ", ") + " (" + sc.zone + ")"
	return sc, nil
}

// loadZone is time.LoadLocation, but for "Local": the worker's own zone
// may differ from worker to worker.
func loadZone(name string) (*time.Location, error) {
	if name == "Local" {
		return nil, fmt.Errorf("the worker's local zone is not one zone for every worker")
	}
	return time.LoadLocation(name)
}

func parseDays(field string, names []string) ([]int, error) {
	if len(names) == 0 {
		return []int{0, 1, 2, 3, 4, 5, 6}, nil
	}
	var days []int
	for j, n := range names {
		d, ok := dayNames[strings.ToLower(strings.TrimSpace(n))]
		if !ok {
			return nil, fmt.Errorf("%s.days[%d] %q: want a day of the week, mon to sun", field, j, cut(n))
		}
		days = append(days, d)
	}
	slices.Sort(days)
	return slices.Compact(days), nil
}

// parseClock reads "HH:MM" or "HH:MM:SS" as seconds from midnight;
// "24:00" only as an end.
func parseClock(field, s string, end bool) (int64, error) {
	bad := func() (int64, error) {
		return 0, fmt.Errorf("%s %q: want a time of day, HH:MM or HH:MM:SS, from 00:00 to 23:59:59 (24:00 as an end)", field, cut(s))
	}
	parts := strings.Split(strings.TrimSpace(s), ":")
	if len(parts) < 2 || len(parts) > 3 {
		return bad()
	}
	var v [3]int64
	for i, p := range parts {
		if len(p) < 1 || len(p) > 2 || i > 0 && len(p) != 2 {
			return bad()
		}
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 0 {
			return bad()
		}
		v[i] = n
	}
	secs := v[0]*3600 + v[1]*60 + v[2]
	switch {
	case v[1] > 59 || v[2] > 59:
		return bad()
	case secs == day && end:
		return day, nil
	case secs >= day:
		return bad()
	}
	return secs, nil
}

// merge sorts intervals and joins those that overlap or touch, across the
// week's end too.
func merge(in []interval) []interval {
	var split []interval
	for _, iv := range in {
		if iv.end > week {
			split = append(split, interval{iv.start, week}, interval{0, iv.end - week})
			continue
		}
		split = append(split, iv)
	}
	slices.SortFunc(split, func(a, b interval) int { return int(a.start - b.start) })
	var out []interval
	for _, iv := range split {
		if n := len(out); n > 0 && iv.start <= out[n-1].end {
			out[n-1].end = max(out[n-1].end, iv.end)
			continue
		}
		out = append(out, iv)
	}
	if n := len(out); n > 1 && out[0].start == 0 && out[n-1].end == week {
		out[n-1].end = week + out[0].end
		out = out[1:]
	}
	return out
}

// String says the schedule in words: "mon to fri 22:00–07:00, sat sun all
// day (Europe/Berlin)".
func (s *Schedule) String() string { return s.words }

// Zone is the schedule's IANA zone name.
func (s *Schedule) Zone() string { return s.zone }

// At is the quiet period t falls in, and whether it falls in one.
func (s *Schedule) At(t time.Time) (Span, bool) {
	local := t.In(s.loc)
	monday, sow := weekOf(local)
	for _, iv := range s.spans {
		var from int64 // the week the period began in, relative to local's
		switch {
		case iv.start <= sow && sow < iv.end:
		case iv.end > week && sow+week < iv.end:
			from = -week // it began last week
		default:
			continue
		}
		sp := Span{Since: s.wall(monday, from+iv.start), Until: s.wall(monday, from+iv.end), Timezone: s.zone}
		// A wall time repeated or skipped by a clock change may map before
		// t: the period is then over.
		if !sp.Until.After(t) {
			return Span{}, false
		}
		if sp.Since.After(t) {
			sp.Since = t.In(s.loc)
		}
		return sp, true
	}
	return Span{}, false
}

// Next is the quiet period t falls in, or else the next one to begin.
func (s *Schedule) Next(t time.Time) Span {
	if sp, ok := s.At(t); ok {
		return sp
	}
	local := t.In(s.loc)
	monday, sow := weekOf(local)
	for _, w := range []int64{0, week} {
		for _, iv := range s.spans {
			if w+iv.start > sow {
				return Span{Since: s.wall(monday, w+iv.start), Until: s.wall(monday, w+iv.end), Timezone: s.zone}
			}
		}
	}
	return Span{} // unreachable: a schedule has at least one interval
}

// weekOf is the Monday of local's week (its date at midnight) and the
// seconds of local's wall-clock time since then.
func weekOf(local time.Time) (time.Time, int64) {
	wd := (int(local.Weekday()) + 6) % 7 // Monday 0
	y, m, d := local.Date()
	h, mi, sec := local.Clock()
	return time.Date(y, m, d-wd, 0, 0, 0, 0, local.Location()), int64(wd)*day + int64(h*3600+mi*60+sec)
}

// wall is the moment of the wall-clock time secs after monday 00:00.
func (s *Schedule) wall(monday time.Time, secs int64) time.Time {
	days, rem := secs/day, secs%day
	if rem < 0 {
		days, rem = days-1, rem+day
	}
	y, m, d := monday.Date()
	return time.Date(y, m, d+int(days), int(rem/3600), int(rem%3600/60), int(rem%60), 0, s.loc)
}

// describe says one period in words.
func describe(days []int, from, to int64) string {
	var when string
	if len(days) == 7 {
		when = "every day"
	} else {
		names := make([]string, len(days))
		for i, d := range days {
			names[i] = shortDays[d]
		}
		when = strings.Join(names, " ")
	}
	if from == 0 && to == day {
		return when + " all day"
	}
	return when + " " + clock(from) + "–" + clock(to)
}

func clock(secs int64) string {
	s := fmt.Sprintf("%02d:%02d", secs/3600, secs%3600/60)
	if secs%60 != 0 {
		s += fmt.Sprintf(":%02d", secs%60)
	}
	return s
}

// cut bounds what an error quotes of a user's value.
func cut(s string) string {
	if len(s) <= 64 {
		return s
	}
	n := 64
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
