package rules

import (
	"fmt"
	"net/mail"
	"strings"
	"unicode/utf8"
)

// Limits bound what one project's rules may ask of a Klaxon that many
// projects share: the work an event costs to match and count, and how many
// people one notification reaches. Their defaults sit far above what a real
// Hawk rule uses (a handful of words, one or two windows, one address), so
// only an abusive or broken rule meets them.
//
// A zero field takes its default, so the zero Limits is the defaults.
type Limits struct {
	// RulesPerProject is how many enabled rules of a project are loaded,
	// in stored order; the store skips the rest [DefaultRulesPerProject].
	RulesPerProject int
	// WindowsPerRule is the most windows a rule may have, at most
	// MaxWindowsPerRule [MaxWindowsPerRule].
	WindowsPerRule int
	// FilterWords is the most words `including`, and `excluding`, may each
	// hold [DefaultFilterWords].
	FilterWords int
	// FilterWordBytes is the longest a filter word may be [DefaultFilterWordBytes].
	FilterWordBytes int
	// FilterBytes is the most bytes a rule's filter words may add up to,
	// including and excluding together [DefaultFilterBytes].
	FilterBytes int
	// MatchedTitleBytes is how much of an event's title the filters search:
	// matching costs words × title length, and a 256 KiB title searched for
	// thousands of words stalled every project's events
	// [DefaultMatchedTitleBytes].
	MatchedTitleBytes int
	// EmailRecipients is the most addresses an email endpoint may name
	// [DefaultEmailRecipients].
	EmailRecipients int
}

// Defaults of Limits.
const (
	DefaultRulesPerProject   = 100
	MaxWindowsPerRule        = 8
	DefaultFilterWords       = 50
	DefaultFilterWordBytes   = 200
	DefaultFilterBytes       = 4096
	DefaultMatchedTitleBytes = 8192
	DefaultEmailRecipients   = 10
)

// withDefaults returns l with every zero field set to its default.
func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.RulesPerProject, DefaultRulesPerProject)
	def(&l.WindowsPerRule, MaxWindowsPerRule)
	l.WindowsPerRule = min(l.WindowsPerRule, MaxWindowsPerRule)
	def(&l.FilterWords, DefaultFilterWords)
	def(&l.FilterWordBytes, DefaultFilterWordBytes)
	def(&l.FilterBytes, DefaultFilterBytes)
	def(&l.MatchedTitleBytes, DefaultMatchedTitleBytes)
	def(&l.EmailRecipients, DefaultEmailRecipients)
	return l
}

// MaxRules is RulesPerProject, or its default.
func (l Limits) MaxRules() int { return l.withDefaults().RulesPerProject }

// checkFilters checks the words of a rule's title filters (trimmed, empty
// ones dropped) against the limits.
func (l Limits) checkFilters(including, excluding []string) error {
	total := 0
	for _, list := range []struct {
		name  string
		words []string
	}{{"including", including}, {"excluding", excluding}} {
		if len(list.words) > l.FilterWords {
			return fmt.Errorf("%s has %d words: at most %d", list.name, len(list.words), l.FilterWords)
		}
		for i, w := range list.words {
			if len(w) > l.FilterWordBytes {
				return fmt.Errorf("%s[%d] is %d bytes long: at most %d", list.name, i, len(w), l.FilterWordBytes)
			}
			total += len(w)
		}
	}
	if total > l.FilterBytes {
		return fmt.Errorf("including and excluding words add up to %d bytes: at most %d", total, l.FilterBytes)
	}
	return nil
}

// Recipients counts the addresses of an email endpoint, as the email
// channel reads it: comma-separated, "Name <a@x.io>" allowed.
func Recipients(endpoint string) int {
	if list, err := mail.ParseAddressList(endpoint); err == nil {
		return len(list)
	}
	n := 0
	for s := range strings.SplitSeq(endpoint, ",") {
		if strings.TrimSpace(s) != "" {
			n++
		}
	}
	return n
}

// cutTitle cuts s to at most n bytes without splitting a character.
func cutTitle(s string, n int) string {
	if n <= 0 || len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
