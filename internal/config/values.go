package config

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// value is how a variable is read: its default and range as the table of
// variables writes them, what Load does with its setting (which may be
// unset), and what the configuration shows of it.
type value struct {
	def  string // as Variable.Default gives it
	span string // as Variable.Range gives it
	read func(l *loader, s setting)
	show func() slog.Value
}

// parsed is a value parse reads from a set variable into p; unset, or
// invalid, it is def. defText and span are def and the range as written.
func parsed[T any](p *T, def T, defText, span string, parse func(string) (T, error), show func(T) slog.Value) value {
	return value{
		def:  defText,
		span: span,
		read: func(l *loader, s setting) {
			*p = def
			if !s.set() {
				return
			}
			v, err := parse(s.value)
			if err != nil {
				l.fail(s, err.Error())
				return
			}
			*p = v
		},
		show: func() slog.Value { return show(*p) },
	}
}

// text is a string taken as it is; the spec's check says what it must be.
func text(p *string, def string) value {
	return canonical(p, def, func(v string) (string, error) { return v, nil })
}

// canonical is a string kept in the form parse writes it in, so that
// writing a default out changes nothing.
func canonical(p *string, def string, parse func(string) (string, error)) value {
	return parsed(p, def, def, "", parse, slog.StringValue)
}

// oneOf is one of choices, in any case.
func oneOf[T ~string](p *T, def T, choices ...T) value {
	names := make([]string, len(choices))
	for i, c := range choices {
		names[i] = string(c)
	}
	return parsed(p, def, string(def), "", func(v string) (T, error) {
		for _, c := range choices {
			if strings.ToLower(v) == string(c) {
				return c, nil
			}
		}
		return def, fmt.Errorf("%q is not one of %s", v, strings.Join(names, ", "))
	}, func(v T) slog.Value { return slog.StringValue(string(v)) })
}

// logLevel is debug, info, warn or error, in any case.
func logLevel(p *slog.Level) value {
	levels := map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}
	return parsed(p, slog.LevelInfo, "info", "", func(v string) (slog.Level, error) {
		if lv, ok := levels[strings.ToLower(v)]; ok {
			return lv, nil
		}
		return 0, fmt.Errorf("%q is not one of debug, info, warn, error", v)
	}, func(lv slog.Level) slog.Value { return slog.StringValue(lv.String()) })
}

// whole is a whole number from lo to hi.
func whole(p *int, def, lo, hi int) value {
	return parsed(p, def, strconv.Itoa(def), fmt.Sprintf("%d–%d", lo, hi), func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return 0, fmt.Errorf("%q is not a whole number from %d to %d", v, lo, hi)
		}
		return n, nil
	}, slog.IntValue)
}

// batchSize is a whole number from 1 to the prefetch read before it; by
// default def, or the prefetch when that is lower.
func batchSize(p, prefetch *int, def int) value {
	parse := func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		switch {
		case err != nil || n < 1:
			return 0, fmt.Errorf("%q is not a whole number of 1 or more", v)
		case n > *prefetch:
			return 0, fmt.Errorf("%d is more than %s (%d); a batch is made of prefetched messages", n, EnvPrefetch, *prefetch)
		}
		return n, nil
	}
	return value{
		def: strconv.Itoa(def),
		read: func(l *loader, s setting) {
			parsed(p, min(def, *prefetch), "", "", parse, slog.IntValue).read(l, s)
		},
		show: func() slog.Value { return slog.IntValue(*p) },
	}
}

// sizeUnits are the suffixes size accepts, in bytes.
var sizeUnits = []struct {
	suffix string
	bytes  int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// size is a number of bytes from lo to hi: a whole number, optionally
// followed by B, KiB, MiB or GiB ("256MiB").
func size[T int | int64](p *T, def, lo, hi int64) value {
	return parsed(p, T(def), formatSize(def), formatSize(lo)+"–"+formatSize(hi), func(v string) (T, error) {
		num, unit := v, int64(1)
		for _, u := range sizeUnits {
			if rest, ok := strings.CutSuffix(v, u.suffix); ok {
				num, unit = strings.TrimSpace(rest), u.bytes
				break
			}
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n < lo/unit || n > hi/unit || n*unit < lo {
			return 0, fmt.Errorf("%q is not a size from %s to %s (a whole number of bytes, or of KiB, MiB, GiB)", v, formatSize(lo), formatSize(hi))
		}
		return T(n * unit), nil
	}, func(n T) slog.Value { return slog.Int64Value(int64(n)) })
}

// formatSize writes n bytes in the largest unit that divides it.
func formatSize(n int64) string {
	for _, u := range sizeUnits {
		if n >= u.bytes && n%u.bytes == 0 {
			return strconv.FormatInt(n/u.bytes, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// positive is a duration of 1ms or more.
func positive(p *time.Duration, def time.Duration) value {
	return parsed(p, def, formatDuration(def), "", func(v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		switch {
		case err != nil:
			return 0, fmt.Errorf("%q is not a duration (write it as Go does: 500ms, 5s, 1m30s, 24h)", v)
		case d <= 0:
			return 0, fmt.Errorf("%q is not positive", v)
		case d < time.Millisecond:
			// Klaxon's Redis scripts and keys count whole milliseconds: a
			// shorter KLAXON_DEDUP_TTL became 0 ms and turned
			// de-duplication off.
			return 0, fmt.Errorf("%q is below 1ms, the shortest Klaxon can use", v)
		}
		return d, nil
	}, showDuration)
}

// upTo is a duration from 0 to hi.
func upTo(p *time.Duration, def, hi time.Duration) value {
	return parsed(p, def, formatDuration(def), "0–"+formatDuration(hi), func(v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > hi {
			return 0, fmt.Errorf("%q is not a duration from 0 to %s (write it as Go does: 0, 500us, 2ms)", v, hi)
		}
		return d, nil
	}, showDuration)
}

// showDuration shows a duration as Go writes it: JSON logs would show
// nanoseconds.
func showDuration(d time.Duration) slog.Value { return slog.StringValue(d.String()) }

// formatDuration writes d as people write it, and as docs/configuration.md
// gives defaults: "10m" and "1h" rather than time's "10m0s" and "1h0m0s".
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// truth is true or false: 1, t, true, 0, f, false, in any case.
func truth(p *bool, def bool) value {
	return parsed(p, def, strconv.FormatBool(def), "", func(v string) (bool, error) {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, fmt.Errorf("%q is not true or false", v)
		}
		return b, nil
	}, slog.BoolValue)
}

// Error reports one variable that is set but invalid. Its message is one line
// and never contains a secret.
type Error struct {
	Var    string // the KLAXON_ name of the setting
	Via    string // the Hawk alias the value was read from, or ""
	Reason string // what is wrong, e.g. `"ssl" is not one of none, starttls, tls`
}

func (e *Error) Error() string {
	if e.Via != "" {
		return e.Via + " (alias of " + e.Var + "): " + e.Reason
	}
	return e.Var + ": " + e.Reason
}

// errorList is what Load returns when several variables are invalid: still
// one line, each problem separated by "; ".
type errorList []error

func (l errorList) Error() string {
	msgs := make([]string, len(l))
	for i, err := range l {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (l errorList) Unwrap() []error { return l }

// loader collects the problems of one Load call.
type loader struct {
	getenv  func(string) string
	secrets []string // strings that must never appear in a message
	errs    errorList
}

// setting is one variable's raw value and where it came from.
type setting struct {
	name  string // KLAXON_ name
	via   string // alias it was read from, or ""
	value string // raw value; "" when unset
}

func (s setting) set() bool { return s.value != "" }

// lookup reads a variable, falling back to its Hawk alias. The KLAXON_ name
// wins when both are set. Values are trimmed of surrounding white space
// (a trailing newline from a mounted secret is a classic) unless raw is set.
func (l *loader) lookup(name, alias string, raw bool) setting {
	trim := func(v string) string {
		if raw {
			return v
		}
		return strings.TrimSpace(v)
	}
	if v := trim(l.getenv(name)); v != "" {
		return setting{name: name, value: v}
	}
	if alias != "" {
		if v := trim(l.getenv(alias)); v != "" {
			return setting{name: name, via: alias, value: v}
		}
	}
	return setting{name: name}
}

// fail records that s is invalid. The reason is reduced to one line and
// scrubbed of every known secret, whatever a library put into it.
func (l *loader) fail(s setting, reason string) {
	reason = strings.Join(strings.Fields(reason), " ")
	for _, secret := range l.secrets {
		reason = strings.ReplaceAll(reason, secret, redacted)
	}
	l.errs = append(l.errs, &Error{Var: s.name, Via: s.via, Reason: reason})
}

// failEach records each problem err holds: one, or several joined.
func (l *loader) failEach(s setting, err error) {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			l.fail(s, e.Error())
		}
		return
	}
	l.fail(s, err.Error())
}
