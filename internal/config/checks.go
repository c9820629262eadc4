package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/mail"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/wire"
)

func checkAMQPURL(raw string) error {
	u, err := splitURL(raw)
	if err != nil {
		return err
	}
	if u.scheme != "amqp" && u.scheme != "amqps" {
		return fmt.Errorf("scheme %q is not one of amqp, amqps", u.scheme)
	}
	if len(u.hosts) != 1 {
		return errors.New("names several hosts; an AMQP URL names one")
	}
	if err := checkHostPort(u.hosts[0], false); err != nil {
		return err
	}
	uri, err := amqp.ParseURI(raw)
	if err != nil {
		return fmt.Errorf("not a valid AMQP URL: %s", innerURLError(err))
	}
	// amqp091 reads these only when it dials, and fails every dial on a bad
	// one: the worker would retry forever, never ready, instead of stopping.
	for _, m := range uri.AuthMechanism {
		switch strings.ToUpper(m) {
		case "PLAIN", "AMQPLAIN", "EXTERNAL":
		default:
			return fmt.Errorf("auth_mechanism %q is not one of PLAIN, AMQPLAIN, EXTERNAL", m)
		}
	}
	if uri.Scheme == "amqps" {
		// amqp091 sends no client certificate, without a word, unless it
		// has both halves.
		if (uri.CertFile == "") != (uri.KeyFile == "") {
			return errors.New("certfile and keyfile go together: set both for a client certificate, or neither")
		}
		for _, f := range []struct{ param, path string }{
			{"cacertfile", uri.CACertFile}, {"certfile", uri.CertFile}, {"keyfile", uri.KeyFile},
		} {
			if f.path == "" {
				continue
			}
			if _, err := os.ReadFile(f.path); err != nil {
				return fmt.Errorf("%s: %w", f.param, err)
			}
		}
	}
	return nil
}

func checkQueue(q string) error {
	switch {
	case strings.HasPrefix(q, "amq."):
		return fmt.Errorf("%q starts with amq., which RabbitMQ reserves", q)
	case len(q)+len(".dead") > 255:
		return fmt.Errorf("is %d bytes long; the limit is 250 so that %q fits RabbitMQ's 255", len(q), "<queue>.dead")
	case strings.IndexFunc(q, unicode.IsControl) >= 0:
		return fmt.Errorf("%q contains a control character", q)
	}
	return nil
}

// parseQueues reads KLAXON_QUEUES: names among base and its hashed queues,
// each once.
func parseQueues(v, base string, shards int) (string, error) {
	known := incomingQueues(base, shards)
	var names []string
	for name := range strings.SplitSeq(v, ",") {
		name = strings.TrimSpace(name)
		switch {
		case name == "":
			continue
		case slices.Contains(names, name):
			return "", fmt.Errorf("names %q twice", name)
		case !slices.Contains(known, name):
			return "", fmt.Errorf("%q is not one of the incoming queues: %s (%s=%q, %s=%d)",
				name, describeQueues(known), EnvQueue, base, EnvQueueShards, shards)
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		return "", errors.New("names no queue")
	}
	return strings.Join(names, ","), nil
}

// incomingQueues are base and its hashed queues, in that order.
func incomingQueues(base string, shards int) []string {
	out := []string{base}
	for i := range shards {
		out = append(out, wire.HashedQueue(base, i))
	}
	return out
}

// describeQueues lists queues for an error: the first two, an ellipsis and
// the last when there are many.
func describeQueues(qs []string) string {
	if len(qs) > 4 {
		return strings.Join(qs[:2], ", ") + " … " + qs[len(qs)-1]
	}
	return strings.Join(qs, ", ")
}

func checkPrefix(p string) error {
	switch {
	case strings.ContainsAny(p, "{}"):
		return fmt.Errorf("%q contains { or }, which would make a Redis Cluster hash tag", p)
	case hasSpace(p):
		return fmt.Errorf("%q contains white space", p)
	case p == "amq" || strings.HasPrefix(p, "amq."):
		return fmt.Errorf("%q would name queues amq.*, which RabbitMQ reserves", p)
	case len(p) > 64:
		return fmt.Errorf("is %d bytes long; the limit is 64", len(p))
	}
	return nil
}

// longestChannel is the longest rule channel name, which a Hawk sender
// queue's name ends with.
const longestChannel = len(rules.Telegram)

func checkHawkSenderQueues(p string) error {
	switch {
	case strings.HasPrefix(p, "amq."):
		return fmt.Errorf("%q would name queues amq.*, which RabbitMQ reserves", p)
	case hasSpace(p):
		return fmt.Errorf("%q contains white space", p)
	case len(p)+longestChannel > 255:
		return fmt.Errorf("is %d bytes long; the limit is %d so that <prefix>telegram fits RabbitMQ's 255", len(p), 255-longestChannel)
	}
	return nil
}

func hasSpace(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0
}

// checkListenAddr checks a host:port to listen on; the host may be empty
// (all interfaces) and the port 0 (any free port).
func checkListenAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		err = checkPort(port, 0)
	}
	if err == nil && strings.ContainsAny(host, " /@") {
		err = fmt.Errorf("host %q is not valid", host)
	}
	if err != nil {
		return fmt.Errorf("%q is not host:port (for example 0.0.0.0:9464): %v", addr, err)
	}
	return nil
}

// checkHostPort checks "host", "host:port", "[v6]" or "[v6]:port"; with
// needPort the port must be present.
func checkHostPort(hp string, needPort bool) error {
	if hp == "" {
		return errors.New("a host is empty")
	}
	host, port := hp, ""
	if h, p, err := net.SplitHostPort(hp); err == nil {
		host, port = h, p
	} else if strings.HasPrefix(hp, "[") && strings.HasSuffix(hp, "]") {
		host = hp[1 : len(hp)-1]
	} else if strings.Contains(hp, ":") {
		return fmt.Errorf("%q is not host:port", hp)
	}
	if host == "" {
		return fmt.Errorf("%q has no host", hp)
	}
	if strings.IndexFunc(host, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || strings.ContainsRune("/@?#[]", r)
	}) >= 0 {
		return fmt.Errorf("host %q is not valid", host)
	}
	if port == "" {
		if needPort {
			return fmt.Errorf("%q has no port", hp)
		}
		return nil
	}
	return checkPort(port, 1)
}

func checkPort(port string, lowest int) error {
	n, err := strconv.Atoi(port)
	if err != nil || n < lowest || n > 65535 {
		return fmt.Errorf("port %q is not a number from %d to 65535", port, lowest)
	}
	return nil
}

// checkWait checks KLAXON_REDIS_WAIT_REPLICAS against KLAXON_REDIS_URL. A
// WAIT covers the writes of one connection, so it needs a client that
// writes a batch on one node: a single node or Sentinel. On Cluster, or a
// Sentinel client that routes reads to replicas (itself a cluster client in
// go-redis), it could not be kept: refused rather than ignored.
func checkWait(c *Config) error {
	if c.WaitReplicas == 0 {
		return nil
	}
	if o, err := parseRedisURL(c.RedisURL); err == nil && (o.Cluster != nil || o.routesToReplicas()) {
		return errors.New("needs a single node or a Sentinel URL without route_by_latency or route_randomly: on Cluster a WAIT cannot follow a batch's writes")
	}
	return nil
}

func checkTelegramToken(token string) error {
	if strings.IndexFunc(token, func(r rune) bool {
		return strings.ContainsRune("/?#%", r) || unicode.IsSpace(r) || unicode.IsControl(r)
	}) >= 0 {
		return errors.New("contains white space or one of / ? # %; a bot token looks like 123456789:AAE...")
	}
	return nil
}

func checkHTTPURL(raw string) error {
	u, err := splitURL(raw)
	if err != nil {
		return err
	}
	if u.scheme != "http" && u.scheme != "https" {
		return fmt.Errorf("scheme %q is not one of http, https", u.scheme)
	}
	if len(u.hosts) != 1 || u.hosts[0] == "" {
		return errors.New("needs exactly one host, as in https://api.telegram.org")
	}
	if err := checkHostPort(u.hosts[0], false); err != nil {
		return err
	}
	if strings.ContainsAny(u.rest, "?#") {
		return errors.New("must not have a query or a fragment")
	}
	if _, err := url.Parse(raw); err != nil {
		return errors.New("is not a valid URL: check its percent-encoding")
	}
	return nil
}

// canonicalChats reads the Telegram allowlist: chat ids (-1001234567) and
// channel usernames (@name), comma-separated.
func canonicalChats(v string) (string, error) {
	var chats []string
	for c := range strings.SplitSeq(v, ",") {
		c = strings.TrimSpace(c)
		if c == "" {
			continue
		}
		if _, err := strconv.ParseInt(c, 10, 64); err != nil && !validUsername(c) {
			return "", fmt.Errorf("%q is neither a chat id (-1001234567) nor a channel username (@name)", c)
		}
		chats = append(chats, c)
	}
	return strings.Join(chats, ","), nil
}

// validUsername reports whether s is "@" and a Telegram username: letters,
// digits and underscores.
func validUsername(s string) bool {
	name, ok := strings.CutPrefix(s, "@")
	if !ok || name == "" {
		return false
	}
	return strings.IndexFunc(name, func(r rune) bool {
		return !(r == '_' || '0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z')
	}) < 0
}

// eventURL reads KLAXON_EVENT_URL: an absolute http(s) URL once its
// placeholders are filled in, or "none".
func eventURL(p *string) value {
	return canonical(p, defaultEventURL, func(v string) (string, error) {
		if strings.EqualFold(v, noEventURL) {
			return "", nil
		}
		return v, checkLink(v, "{projectId}, {groupHash} and {eventId}")
	})
}

// eventURLFallback reads KLAXON_EVENT_URL_FALLBACK, which stands in for an
// unknown {eventId}, so it may not have one. Its default goes with the
// default of KLAXON_EVENT_URL, read before it: Garage's project page is no
// fallback for an installation of one's own, whose link is left out.
func eventURLFallback(p, eventURL *string) value {
	parse := func(v string) (string, error) {
		switch {
		case strings.EqualFold(v, noEventURL):
			return "", nil
		case strings.Contains(v, "{eventId}"):
			return "", fmt.Errorf("%q has {eventId}, which is what is unknown when the fallback is used; use {projectId} and {groupHash}, or none", v)
		}
		return v, checkLink(v, "{projectId} and {groupHash}")
	}
	return value{
		def: defaultEventURLFallback,
		read: func(l *loader, s setting) {
			def := ""
			if *eventURL == defaultEventURL {
				def = defaultEventURLFallback
			}
			canonical(p, def, parse).read(l, s)
		},
		show: func() slog.Value { return slog.StringValue(*p) },
	}
}

// checkLink checks that v is an absolute http(s) URL once its
// placeholders are filled in.
func checkLink(v, placeholders string) error {
	filled := strings.NewReplacer("{projectId}", "5e3eef0679fa3700a0198a49", "{groupHash}", "0", "{eventId}", "65f0c0ffee0000000000beef").Replace(v)
	if u, err := url.Parse(filled); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an absolute http(s) URL (with %s), or none", v, placeholders)
	}
	return nil
}

// checkOperatorWebhook checks KLAXON_OPERATOR_WEBHOOK. The URL may hold a
// token: the error says what is wrong, not the value.
func checkOperatorWebhook(v string) error {
	u, err := url.Parse(v)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return errors.New("is not an absolute http(s) URL")
	case u.User != nil:
		return errors.New("holds a user name or password (user:pass@), which is not sent; put a token in the path or query instead")
	}
	return nil
}

// checkOperatorEmail checks KLAXON_OPERATOR_EMAIL, sent through smtpAddr.
// Addresses are personal data: an error says which, by position.
func checkOperatorEmail(v, smtpAddr string) error {
	var errs []error
	for i, a := range strings.Split(v, ",") {
		if _, err := mail.ParseAddress(strings.TrimSpace(a)); err != nil {
			errs = append(errs, fmt.Errorf("address %d is not an email address", i+1))
		}
	}
	if smtpAddr == "" {
		errs = append(errs, errors.New("is set but "+EnvSMTPAddr+" is not: the alerts are sent through it"))
	}
	return errors.Join(errs...)
}

// checkMaxGroups refuses a bound so low that a project's first burst
// would overflow it (KLAXON_MAX_GROUPS_PER_PROJECT).
func checkMaxGroups(v string) error {
	if n, _ := strconv.Atoi(v); n > 0 && n < 1000 {
		return fmt.Errorf("%d is below 1000: a project's groups would overflow at its first burst; 0 sets no bound", n)
	}
	return nil
}
