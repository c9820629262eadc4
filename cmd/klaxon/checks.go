package main

import (
	"fmt"
	"net/netip"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/netguard"
	"github.com/klaxonhq/klaxon/internal/notify/telegram"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/store"
	"github.com/klaxonhq/klaxon/internal/suggest"
)

// What rules check adds to the loader's problems: what a send of the rule
// would meet on this worker's settings (test-send finds it out by sending),
// found here without sending anything or resolving a name.

// deliveryProblems are the channels of the snapshot's rules that this
// worker's settings would never deliver: an endpoint the endpoint guard
// refuses, or a channel the worker does not have configured. Each is an
// error: every firing of the rule on that channel would fail.
func deliveryProblems(cfg config.Config, snap *store.Snapshot, specs store.Specs) []checkProblem {
	var out []checkProblem
	for projectID := range specs.Projects {
		for _, r := range snap.Rules(projectID) {
			for _, c := range r.Channels {
				if reason := channelProblem(cfg, c); reason != "" {
					out = append(out, checkProblem{Severity: "error", Project: r.ProjectID, Rule: r.ID,
						Line: ruleLine(specs, r.ProjectID, r.ID), Reason: "channel " + c.Name + ": " + reason})
				}
			}
		}
	}
	return out
}

// channelProblem says why the worker would never deliver on c, "" when it
// may. The reason never holds the endpoint.
func channelProblem(cfg config.Config, c rules.Channel) string {
	if cfg.Output == config.OutputHawkSenders {
		// Hawk's senders deliver, with their own settings: the worker
		// reaches no provider.
		return ""
	}
	switch c.Name {
	case rules.Email:
		if !cfg.EmailEnabled() {
			return fmt.Sprintf("email is not configured on the worker: set %s (and the other KLAXON_SMTP_ settings)", config.EnvSMTPAddr)
		}
		return ""
	case rules.Telegram:
		if telegram.IsHook(strings.TrimSpace(c.Endpoint)) {
			return urlProblem(cfg, c.Endpoint, cfg.TelegramHookPatterns(), config.EnvTelegramHookHosts)
		}
		if !cfg.TelegramEnabled() {
			return fmt.Sprintf("the endpoint is a chat, which the Bot API sends to, but %s is not set (only hook URLs are sent without it)", config.EnvTelegramToken)
		}
		if chats := cfg.TelegramChats(); len(chats) > 0 && !slices.ContainsFunc(chats, func(ch string) bool { return sameChat(ch, c.Endpoint) }) {
			return fmt.Sprintf("the chat is not one this deployment allows (%s)", config.EnvTelegramAllowedChats)
		}
		return ""
	case rules.Slack:
		return urlProblem(cfg, c.Endpoint, cfg.SlackPatterns(), config.EnvSlackHosts)
	case rules.Loop:
		return urlProblem(cfg, c.Endpoint, cfg.LoopPatterns(), config.EnvLoopHosts)
	case rules.Webhook:
		return urlProblem(cfg, c.Endpoint, nil, "")
	}
	return ""
}

// urlProblem is the endpoint guard's answer to an endpoint URL, as far as
// it can be known without resolving a name: the URL's form and host
// patterns (netguard.CheckEndpoint, as each channel checks it), then the
// address policy for a literal address or localhost, and for a name the
// port, when no private network is allowed to make any port fine.
func urlProblem(cfg config.Config, raw string, hosts []netguard.Pattern, setting string) string {
	if err := netguard.CheckEndpoint(raw, hosts, setting); err != nil {
		return refusal(err)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "" // CheckEndpoint parsed it
	}
	port := uint16(80)
	if u.Scheme == "https" {
		port = 443
	}
	if p := u.Port(); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil {
			return "the URL's port is not a number from 0 to 65535"
		}
		port = uint16(n)
	}
	policy := cfg.EndpointPolicy()
	var addrs []netip.Addr
	host := u.Hostname()
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		addrs = []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	}
	for _, a := range addrs {
		if err := policy.Check(netip.AddrPortFrom(a, port)); err != nil {
			return refusal(err)
		}
	}
	if len(addrs) == 0 && len(policy.Allow) == 0 {
		// Whatever the name resolves to, a private address is refused and
		// a public one must be on an allowed port.
		if err := policy.Check(netip.AddrPortFrom(anyPublic, port)); err != nil {
			return refusal(err)
		}
	}
	return ""
}

// anyPublic stands for whatever public address a name resolves to.
var anyPublic = netip.MustParseAddr("8.8.8.8")

// refusal words a refusal of the endpoint guard as the worker would log it.
func refusal(err error) string {
	return "the worker's endpoint guard would refuse it: " + strings.TrimPrefix(err.Error(), "endpoint refused: ")
}

// sameChat reports whether two Telegram chats, ids or @usernames, are one.
func sameChat(a, b string) bool {
	a, b = strings.TrimSpace(a), strings.TrimSpace(b)
	x, errA := strconv.ParseInt(a, 10, 64)
	y, errB := strconv.ParseInt(b, 10, 64)
	if errA == nil && errB == nil {
		return x == y
	}
	return strings.EqualFold(a, b)
}

// windowProblems are the rules that give both threshold/thresholdPeriod
// and windows: the windows are counted, and the threshold is not, which
// nobody writing both meant. A warning: the rule works.
func windowProblems(specs store.Specs) []checkProblem {
	var out []checkProblem
	for projectID, list := range specs.Projects {
		for i, s := range list {
			if !s.IsEnabled || len(s.Windows) == 0 || s.Threshold == 0 && s.ThresholdPeriod == 0 {
				continue
			}
			p := checkProblem{Severity: "warning", Project: projectID, Rule: s.ID,
				Reason: "windows replace threshold and thresholdPeriod, which are ignored: give one or the other"}
			if lines := specs.Lines[projectID]; i < len(lines) {
				p.Line = lines[i]
			}
			out = append(out, p)
		}
	}
	return out
}

// ruleLine is the line of a rule in a rules file, 0 when unknown.
func ruleLine(specs store.Specs, projectID, ruleID string) int {
	for i, s := range specs.Projects[projectID] {
		if s.ID == ruleID && i < len(specs.Lines[projectID]) {
			return specs.Lines[projectID][i]
		}
	}
	return 0
}

var (
	unknownChannel = regexp.MustCompile(`^channel "([^"]*)" is not supported: ignored$`)
	unknownField   = regexp.MustCompile(`^unknown field "([^"]*)" ignored$`)
)

// hawkPush are the channels of Hawk's rules that Hawk's notifier hands to
// no sender worker (its web and desktop push): an enabled one notifies
// nobody behind Hawk either, so it is a warning, not a misspelling.
var hawkPush = []string{"webPush", "desktopPush"}

// withSuggestion adds "did you mean" to the loader's problems of an
// unknown channel or field. An unknown channel is an error here: the
// worker ignores it, so a misspelt "slak" never notifies anyone.
func withSuggestion(p checkProblem) checkProblem {
	if m := unknownChannel.FindStringSubmatch(p.Reason); m != nil && slices.Contains(hawkPush, m[1]) {
		p.Reason = fmt.Sprintf("channel %q is Hawk's push channel, which Klaxon does not send (nor do Hawk's sender workers): ignored", m[1])
		return p
	}
	if m := unknownChannel.FindStringSubmatch(p.Reason); m != nil {
		p.Severity = "error"
		p.Reason = fmt.Sprintf("channel %q is not one of %s: its notifications would never be sent", m[1], strings.Join(rules.ChannelNames[:], ", "))
		if s := suggest.Closest(m[1], rules.ChannelNames[:]); s != "" {
			p.Reason += fmt.Sprintf(" (did you mean %q?)", s)
		}
		return p
	}
	if m := unknownField.FindStringSubmatch(p.Reason); m != nil {
		if s := closestField(m[1], p.Rule == ""); s != "" {
			p.Reason += fmt.Sprintf(" (did you mean %q?)", s)
		}
	}
	return p
}

// closestField is the field of a rule (or, for a project's own field, of
// a project) most like the unknown one at path, "" when none is.
func closestField(path string, ofProject bool) string {
	parent, name := "", path
	if i := strings.LastIndex(path, "."); i >= 0 {
		parent, name = path[:i+1], path[i+1:]
	}
	var t reflect.Type
	switch {
	case ofProject:
		return suggest.Closest(name, []string{"name", "notifications"})
	case strings.HasPrefix(parent, "channels."):
		t = reflect.TypeFor[rules.ChannelSpec]()
	case strings.HasPrefix(parent, "windows"):
		t = reflect.TypeFor[rules.WindowSpec]()
	default:
		t = reflect.TypeFor[rules.Spec]()
	}
	var fields []string
	for f := range t.Fields() {
		if n, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); n != "" && n != "-" {
			fields = append(fields, n)
		}
	}
	if s := suggest.Closest(name, fields); s != "" {
		return parent + s
	}
	return ""
}
