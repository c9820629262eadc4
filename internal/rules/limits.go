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

// Bounds on a channel's endpoint. An endpoint travels in every delivery
// job of its rule, so one of megabytes would make every firing a message
// of megabytes; real ones are a URL, a chat id or a few addresses.
const (
	// MaxURLEndpointBytes is the longest endpoint of telegram, slack,
	// loop and webhook: a URL or a chat id. 2 KiB is what browsers and
	// most HTTP servers take as a URL's length.
	MaxURLEndpointBytes = 2048
	// MaxAddressBytes is what an email endpoint may spend per address it
	// may name (RFC 5321's 254 bytes of address, and a display name): an
	// email endpoint may be EmailRecipients × MaxAddressBytes long.
	MaxAddressBytes = 320
)

// EndpointBytes is the longest endpoint channel may have.
func (l Limits) EndpointBytes(channel string) int {
	if channel == Email {
		return l.withDefaults().EmailRecipients * MaxAddressBytes
	}
	return MaxURLEndpointBytes
}

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

// checkEndpoint says why a channel's endpoint is over the limits, "" when
// it is within them. Addresses and URLs may be personal data or secrets:
// the reason says how many and how long, never what.
func (l Limits) checkEndpoint(channel, endpoint string) string {
	if channel == Email {
		if n := Recipients(endpoint); n > l.EmailRecipients {
			return fmt.Sprintf("channel email names %d addresses, over the limit of %d: left out", n, l.EmailRecipients)
		}
	}
	if n, most := len(strings.TrimSpace(endpoint)), l.EndpointBytes(channel); n > most {
		// Every delivery job of the rule carries the endpoint.
		return fmt.Sprintf("channel %s: endpoint is %d bytes long, over the limit of %d: left out", channel, n, most)
	}
	return ""
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
