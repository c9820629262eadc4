package config

import (
	"regexp"
	"slices"
	"strings"

	"github.com/klaxonhq/klaxon/internal/suggest"
)

// UnknownVariable is a variable of the environment that looks like one of
// Klaxon's (KLAXON_…) but is none: most often a misspelling, which would
// otherwise leave its setting at the default without a word.
type UnknownVariable struct {
	Name string
	// Suggestion is the known variable closest to Name, "" when none is
	// close enough to be a likely misspelling.
	Suggestion string
}

// otherPrefixes start KLAXON_ variables that are read by something other
// than Load: the test suite's and the development MongoDB's.
var otherPrefixes = [...]string{"KLAXON_TEST_", "KLAXON_DEVMONGO_"}

// Unknown lists the variables of environ (os.Environ's "NAME=value" form)
// that start with KLAXON_ and that Load does not read, each with the
// closest variable it does read (names and Hawk aliases). Values are never
// looked at.
func Unknown(environ []string) []UnknownVariable {
	known := map[string]bool{}
	var names []string
	for _, v := range Variables() {
		for _, n := range []string{v.Name, v.Alias} {
			if n != "" {
				known[n] = true
				names = append(names, n)
			}
		}
	}
	var out []UnknownVariable
	seen := map[string]bool{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "KLAXON_") || known[name] || seen[name] || hasOtherPrefix(name) || serviceLink.MatchString(name) {
			continue
		}
		seen[name] = true
		out = append(out, UnknownVariable{Name: name, Suggestion: closest(name, names)})
	}
	return out
}

// serviceLink matches the variables Kubernetes gives every container for
// each Service of its namespace (enableServiceLinks): a Service named
// klaxon-metrics makes KLAXON_METRICS_SERVICE_HOST, KLAXON_METRICS_PORT,
// KLAXON_METRICS_PORT_9464_TCP_ADDR, …, none of them a setting.
var serviceLink = regexp.MustCompile(`_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?)$`)

func hasOtherPrefix(name string) bool {
	for _, p := range otherPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// closest is the known name closest to name, judged on what follows
// KLAXON_, which every candidate shares.
func closest(name string, names []string) string {
	var tails []string
	for _, n := range names {
		tails = append(tails, strings.TrimPrefix(n, "KLAXON_"))
	}
	c := suggest.Closest(strings.TrimPrefix(name, "KLAXON_"), tails)
	if c == "" {
		return ""
	}
	return names[slices.Index(tails, c)]
}

// String says what is wrong in words, e.g. `KLAXON_RULE_FILE is not a
// Klaxon variable (did you mean KLAXON_RULES_FILE?)`.
func (u UnknownVariable) String() string {
	s := u.Name + " is not a Klaxon variable and is ignored"
	if u.Suggestion != "" {
		s += " (did you mean " + u.Suggestion + "?)"
	}
	return s
}
