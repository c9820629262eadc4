// Package email delivers notifications by SMTP: gopkg.in/gomail.v2 composes
// the message (text and HTML parts), and net/smtp carries it, so that each
// send is bound to its context and TLS is exactly what the operator chose.
package email

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/mail"
	"net/smtp"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/gomail.v2"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/rules"
	"github.com/klaxonhq/klaxon/internal/smtptls"
)

// Name is the channel's name in rules and errors.
const Name = rules.Email

// TLSMode is how the connection to the SMTP server is secured
// (KLAXON_SMTP_TLS).
type TLSMode = smtptls.Mode

// The TLS modes.
const (
	TLSNone     = smtptls.None     // plain SMTP, even when the server offers STARTTLS
	TLSStartTLS = smtptls.StartTLS // STARTTLS, and no send when the server does not offer it
	TLSImplicit = smtptls.Implicit // TLS from the first byte (port 465)
)

// DefaultTimeout bounds a send whose context has no earlier deadline.
const DefaultTimeout = 30 * time.Second

// Config is what the channel needs from the operator.
type Config struct {
	Addr     string // host:port of the SMTP server
	Username string // empty: no AUTH
	Password string
	From     string // "Klaxon <alerts@example.com>" or a bare address
	// TLS is the TLS mode; empty means TLSImplicit on port 465 and
	// TLSStartTLS on any other.
	TLS TLSMode
	// TLSConfig overrides the TLS settings (e.g. a private CA); nil uses the
	// system's roots. ServerName defaults to Addr's host.
	TLSConfig *tls.Config
	// LocalName is the name sent with EHLO; empty means "localhost".
	LocalName string
	// Timeout bounds each send when the context has no earlier deadline;
	// zero means DefaultTimeout.
	Timeout time.Duration
	// MaxRecipients is the most addresses an endpoint may name; a send to
	// more fails for good. Zero means DefaultMaxRecipients.
	MaxRecipients int
}

// DefaultMaxRecipients is Config.MaxRecipients' default, as
// rules.DefaultEmailRecipients.
const DefaultMaxRecipients = 10

// Notifier sends messages by SMTP.
type Notifier struct {
	cfg     Config
	host    string
	from    *mail.Address
	mode    TLSMode
	tls     *tls.Config
	page    *template.Template
	timeout time.Duration
}

var _ notify.Channel = (*Notifier)(nil)

// Host is the server every message goes through, whatever its recipients:
// the SMTP server, whose sends share one budget and one circuit.
func (n *Notifier) Host(string) string { return n.cfg.Addr }

// New checks cfg and returns a Notifier. It does not connect.
func New(cfg Config) (*Notifier, error) {
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil || host == "" {
		return nil, fmt.Errorf("email: address %q: want host:port", cfg.Addr)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return nil, fmt.Errorf("email: address %q: bad port", cfg.Addr)
	}
	from, err := mail.ParseAddress(cfg.From)
	if err != nil {
		return nil, fmt.Errorf("email: from %q: %w", cfg.From, err)
	}
	mode := cfg.TLS
	switch mode {
	case "":
		mode = TLSStartTLS
		if port == "465" {
			mode = TLSImplicit
		}
	case TLSNone, TLSStartTLS, TLSImplicit:
	default:
		return nil, fmt.Errorf("email: TLS mode %q: want %q, %q or %q", cfg.TLS, TLSNone, TLSStartTLS, TLSImplicit)
	}
	if mode == TLSNone && cfg.Username != "" && !smtptls.IsLocalhost(host) {
		// net/smtp refuses too; saying so now beats failing every send.
		return nil, fmt.Errorf("email: TLS mode %q would send the password in clear to %s: use %q or %q", TLSNone, host, TLSStartTLS, TLSImplicit)
	}
	tlsConfig := &tls.Config{}
	if cfg.TLSConfig != nil {
		tlsConfig = cfg.TLSConfig.Clone()
	}
	if tlsConfig.ServerName == "" {
		tlsConfig.ServerName = host
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if cfg.MaxRecipients <= 0 {
		cfg.MaxRecipients = DefaultMaxRecipients
	}
	page, err := template.New("email").Parse(pageHTML)
	if err != nil {
		return nil, fmt.Errorf("email: template: %w", err)
	}
	return &Notifier{cfg: cfg, host: host, from: from, mode: mode, tls: tlsConfig, page: page, timeout: timeout}, nil
}

// Notify emails m to the comma-separated addresses in endpoint, at most
// Config.MaxRecipients of them. They are blind recipients: the mail's To
// says "undisclosed-recipients", so nobody sees who else got it (an
// endpoint is written by a project's users, who are not trusted with
// anyone's addresses).
//
// SMTP 4xx replies and connection or TLS failures are worth retrying; 5xx
// replies are not. When the server refuses some recipients with 5xx and
// accepts others, the message goes to those it accepted and the error counts
// the rest, without retry: a retry would repeat the message to the others.
// So does a failure in a later transaction, when a server that takes only so
// many recipients per message had the list split. Addresses are personal
// data: errors name a recipient by its position in the endpoint, never by
// its address, and what the server says is redacted of them.
func (n *Notifier) Notify(ctx context.Context, endpoint string, m *notify.Message) (retry bool, err error) {
	if err := notify.CheckMessage(m); err != nil {
		return false, err
	}
	to, err := parseRecipients(endpoint)
	if err != nil {
		return false, err
	}
	if len(to) > n.cfg.MaxRecipients {
		return false, fmt.Errorf("email: the endpoint names %d addresses, over the limit of %d", len(to), n.cfg.MaxRecipients)
	}
	msg, err := n.compose(m)
	if err != nil {
		return false, err
	}
	return n.sendTo(ctx, to, msg)
}

// sendTo sends msg to the addresses to within the channel's timeout; its
// error names none of them.
func (n *Notifier) sendTo(ctx context.Context, to []*mail.Address, msg *gomail.Message) (retry bool, err error) {
	rcpts := make([]string, len(to))
	for i, a := range to {
		rcpts[i] = smtpPath(a)
	}
	ctx, cancel := context.WithTimeout(ctx, n.timeout)
	defer cancel()
	retry, err = n.send(ctx, rcpts, msg)
	return retry, notify.RedactError(err, addressSecrets(to)...)
}

// SendText emails a plain-text message to the comma-separated addresses
// of to, as blind recipients like Notify's: for Klaxon's messages about
// itself (the operator channel), which are no rule's notification.
func (n *Notifier) SendText(ctx context.Context, to, subject, body string) error {
	list, err := parseRecipients(to)
	if err != nil {
		return err
	}
	gm := gomail.NewMessage()
	gm.SetHeader("From", n.from.String())
	gm.SetHeader("To", undisclosed)
	gm.SetHeader("Subject", "[Klaxon] "+notify.OneLine(subject))
	gm.SetHeader("Auto-Submitted", "auto-generated")
	gm.SetBody("text/plain", body+"\n")
	_, err = n.sendTo(ctx, list, gm)
	return err
}

// undisclosed is the To header of every mail: RFC 5322's empty group, the
// usual form for a mail whose recipients are all blind.
const undisclosed = "undisclosed-recipients:;"

// addressSecrets lists the spellings of the recipients' addresses that an
// SMTP reply might repeat, for notify.RedactError.
func addressSecrets(to []*mail.Address) []string {
	var secrets []string
	for _, a := range to {
		secrets = append(secrets, smtpPath(a), a.Address)
	}
	return secrets
}

// parseRecipients reads "a@x.io, Bob <b@y.io>", tolerating stray commas.
// An address given twice (in any case) is kept once: a server that does not
// merge repeated RCPT TO would deliver the message once for each.
func parseRecipients(endpoint string) ([]*mail.Address, error) {
	list, err := mail.ParseAddressList(endpoint)
	if err != nil {
		list = nil
		for _, s := range strings.Split(endpoint, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			a, err := mail.ParseAddress(s)
			if err != nil {
				// Not repeated: an address is personal data.
				return nil, fmt.Errorf("email: recipient %d is not an address: %w", len(list)+1, err)
			}
			list = append(list, a)
		}
	}
	seen := make(map[string]bool, len(list))
	unique := list[:0]
	for _, a := range list {
		if key := strings.ToLower(a.Address); !seen[key] {
			seen[key] = true
			unique = append(unique, a)
		}
	}
	if len(unique) == 0 {
		return nil, errors.New("email: no recipient address")
	}
	return unique, nil
}

// smtpPath is a's address as MAIL FROM and RCPT TO want it: a local part
// such as "a b" keeps its quotes, which mail.Address.Address drops.
func smtpPath(a *mail.Address) string {
	s := (&mail.Address{Address: a.Address}).String()
	return strings.TrimSuffix(strings.TrimPrefix(s, "<"), ">")
}

// A digest's mail is bounded: a server refuses a message over its size
// limit (often 10–25 MB) for good, which would lose every firing in it.
const (
	maxDigestItems = 500
	maxLine        = 300 // a title or detail line, in bytes
)

func (n *Notifier) compose(m *notify.Message) (*gomail.Message, error) {
	v := notify.Render(m)
	if m.Digest || m.Grouped {
		v = bounded(v)
	}
	var html bytes.Buffer
	if err := n.page.Execute(&html, v); err != nil {
		return nil, fmt.Errorf("email: render HTML: %w", err)
	}
	gm := gomail.NewMessage()
	gm.SetHeader("From", n.from.String())
	gm.SetHeader("To", undisclosed)
	// Encoded, a CR or LF would still come back when the subject is
	// decoded: a rule id in a digest's subject is not made one line.
	gm.SetHeader("Subject", "[Klaxon] "+notify.OneLine(v.Subject))
	gm.SetHeader("X-Klaxon-Notification-Id", m.ID)
	// A Message-ID derived from the notification id lets mail systems
	// collapse the one repeat a crash may cause.
	if id := messageID(m.ID, n.from.Address); id != "" {
		gm.SetHeader("Message-ID", id)
	}
	// RFC 3834: keeps vacation responders from answering alerts.
	gm.SetHeader("Auto-Submitted", "auto-generated")
	gm.SetBody("text/plain", v.Text()+"\n")
	gm.AddAlternative("text/html", html.String())
	return gm, nil
}

// bounded shortens a digest's or grouped message's view to at most maxDigestItems firings of
// short lines; the view's More line says how many more there were.
func bounded(v notify.View) notify.View {
	v = v.Limit(maxDigestItems)
	items := make([]notify.Item, len(v.Items))
	for i, it := range v.Items {
		it.Title = notify.Truncate(it.Title, maxLine)
		it.Rule = notify.Truncate(it.Rule, maxLine)
		details := make([]string, len(it.Details))
		for j, d := range it.Details {
			details[j] = notify.Truncate(d, maxLine)
		}
		it.Details = details
		items[i] = it
	}
	v.Items = items
	v.Title = notify.Truncate(v.Title, maxLine)
	return v
}

func messageID(id, from string) string {
	local := strings.Map(func(r rune) rune {
		if r < 128 && (r == '.' || r == '-' || r == '_' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			return r
		}
		return -1
	}, id)
	_, domain, _ := strings.Cut(from, "@")
	if local == "" || domain == "" {
		return ""
	}
	return "<" + local + ".klaxon@" + domain + ">"
}

// send carries msg over one SMTP session. Everything it waits on ends with
// ctx: the connection is closed when ctx is done.
func (n *Notifier) send(ctx context.Context, to []string, msg *gomail.Message) (retry bool, err error) {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "tcp", n.cfg.Addr)
	if err != nil {
		return true, fmt.Errorf("email: connect: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	var sent []string // recipients that have the message
	defer func() {
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("email: %w: %w", ctx.Err(), err)
			// A retry would repeat the message to those that have it.
			retry = len(sent) == 0
		}
	}()
	if n.mode == TLSImplicit {
		tc := tls.Client(conn, n.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = conn.Close()
			return true, fmt.Errorf("email: TLS handshake: %w", err)
		}
		conn = tc
	}
	c, err := smtp.NewClient(conn, n.host)
	if err != nil {
		_ = conn.Close()
		return classify("greeting", err)
	}
	defer c.Close()
	// Said now, so that a refused EHLO is reported as such, not as a
	// missing extension by c.Extension, which hides the error.
	localName := n.cfg.LocalName
	if localName == "" {
		localName = "localhost"
	}
	if err := c.Hello(localName); err != nil {
		return classify("EHLO", err)
	}
	if n.mode == TLSStartTLS {
		if ok, _ := c.Extension("STARTTLS"); !ok {
			return true, errors.New("email: server does not offer STARTTLS (KLAXON_SMTP_TLS=starttls)")
		}
		if err := c.StartTLS(n.tls); err != nil {
			return classify("STARTTLS", err)
		}
	}
	if n.cfg.Username != "" {
		auth, err := n.auth(c)
		if err != nil {
			return true, err
		}
		if err := c.Auth(auth); err != nil {
			return classify("AUTH", err)
		}
	}
	// partial reports a failure once some recipients have the message: a
	// retry would repeat it to them, so the others are named, not retried.
	partial := func(retry bool, err error, unsent ...string) (bool, error) {
		if len(sent) == 0 {
			return retry, err
		}
		return false, fmt.Errorf("email: sent to %d of %d recipients, but not to %s: %w", len(sent), len(to), positions(to, unsent), err)
	}
	var refused []string
	// One transaction, unless the server takes fewer recipients per message:
	// then those it took get the message and the rest follow in the next
	// transaction (RFC 5321 §4.5.3.1.10).
	for rest := to; len(rest) > 0; {
		if err := c.Mail(smtpPath(n.from)); err != nil {
			retry, err := classify("MAIL FROM", err)
			return partial(retry, err, rest...)
		}
		var accepted []string
		for len(rest) > 0 {
			err := c.Rcpt(rest[0])
			if err != nil && len(accepted) > 0 && tooManyRecipients(err) {
				break
			}
			addr := rest[0]
			rest = rest[1:]
			if err == nil {
				accepted = append(accepted, addr)
				continue
			}
			if retry, err := classify("RCPT TO", err); retry {
				return partial(true, err, slices.Concat(accepted, []string{addr}, rest)...)
			}
			refused = append(refused, fmt.Sprintf("%s (%v)", positions(to, []string{addr}), err))
		}
		if len(accepted) == 0 {
			break // every one left was refused
		}
		if err := data(c, msg); err != nil {
			retry, err := classify("DATA", err)
			return partial(retry, err, slices.Concat(accepted, rest)...)
		}
		sent = append(sent, accepted...)
	}
	if len(sent) == 0 {
		return false, fmt.Errorf("email: every recipient refused: %s", strings.Join(refused, "; "))
	}
	// The server has the message: a failed QUIT changes nothing.
	_ = c.Quit()
	if len(refused) > 0 {
		return false, fmt.Errorf("email: sent, but some recipients refused: %s", strings.Join(refused, "; "))
	}
	return false, nil
}

// positions names the recipients of some by their positions in all, from
// 1: "recipients 2, 5" or "recipient 3".
func positions(all, some []string) string {
	var ns []string
	for _, a := range some {
		if i := slices.Index(all, a); i >= 0 {
			ns = append(ns, strconv.Itoa(i+1))
		}
	}
	if len(ns) == 1 {
		return "recipient " + ns[0]
	}
	return "recipients " + strings.Join(ns, ", ")
}

// data sends msg in the current transaction, and returns the server's
// answer to its end.
func data(c *smtp.Client, msg *gomail.Message) error {
	w, err := c.Data()
	if err != nil {
		return err
	}
	if _, err := msg.WriteTo(w); err != nil {
		_ = w.Close()
		return err
	}
	return w.Close()
}

// tooManyRecipients reports whether err is a refusal of one more RCPT TO
// in this transaction: 452, or 552 from servers that follow RFC 821, with
// enhanced status X.5.3 or saying so.
func tooManyRecipients(err error) bool {
	var reply *textproto.Error
	if !errors.As(err, &reply) || reply.Code != 452 && reply.Code != 552 {
		return false
	}
	return strings.HasPrefix(reply.Msg, "4.5.3") || strings.HasPrefix(reply.Msg, "5.5.3") ||
		strings.Contains(strings.ToLower(reply.Msg), "too many recipients")
}

// classify decides on an SMTP reply: 4xx is worth retrying, 5xx is not.
// Anything else (connection reset, TLS failure) is worth retrying.
func classify(stage string, err error) (bool, error) {
	var reply *textproto.Error
	if errors.As(err, &reply) {
		return reply.Code/100 == 4, fmt.Errorf("email: %s: %w", stage, err)
	}
	return true, fmt.Errorf("email: %s: %w", stage, err)
}

// auth picks a mechanism the server offers: PLAIN, else LOGIN, else
// CRAM-MD5.
func (n *Notifier) auth(c *smtp.Client) (smtp.Auth, error) {
	ok, mechs := c.Extension("AUTH")
	if !ok {
		return nil, errors.New("email: server does not offer AUTH, but a username is set")
	}
	offered := strings.Fields(strings.ToUpper(mechs))
	has := func(mech string) bool {
		for _, m := range offered {
			if m == mech {
				return true
			}
		}
		return false
	}
	switch {
	case has("PLAIN"):
		return smtp.PlainAuth("", n.cfg.Username, n.cfg.Password, n.host), nil
	case has("LOGIN"):
		return &loginAuth{username: n.cfg.Username, password: n.cfg.Password, host: n.host}, nil
	case has("CRAM-MD5"):
		return smtp.CRAMMD5Auth(n.cfg.Username, n.cfg.Password), nil
	}
	return nil, fmt.Errorf("email: server offers AUTH %s; Klaxon speaks PLAIN, LOGIN and CRAM-MD5", mechs)
}

// loginAuth is AUTH LOGIN, which net/smtp lacks and servers such as
// Office 365 require. Like smtp.PlainAuth, it refuses to send the password
// in clear except to localhost.
type loginAuth struct {
	username, password, host string
}

func (a *loginAuth) Start(server *smtp.ServerInfo) (string, []byte, error) {
	if !server.TLS && !smtptls.IsLocalhost(server.Name) {
		return "", nil, errors.New("unencrypted connection")
	}
	if server.Name != a.host {
		return "", nil, errors.New("wrong host name")
	}
	return "LOGIN", nil, nil
}

func (a *loginAuth) Next(fromServer []byte, more bool) ([]byte, error) {
	if !more {
		return nil, nil
	}
	switch strings.ToLower(strings.TrimSpace(string(fromServer))) {
	case "username:":
		return []byte(a.username), nil
	case "password:":
		return []byte(a.password), nil
	}
	return nil, fmt.Errorf("unexpected AUTH LOGIN challenge %q", fromServer)
}

// pageHTML is the HTML part; html/template escapes every value in it.
const pageHTML = `<!DOCTYPE html>
<html><body style="font-family: sans-serif; line-height: 1.4">
{{- if .Header}}
<h2>{{.Header}}</h2>
{{- end}}
{{- if .Grouped}}
<p><strong>{{.Title}}</strong>{{with .URL}} · <a href="{{.}}">View event</a>{{end}}</p>
{{- end}}
{{- range .Items}}
<h3 style="margin-bottom: 0">{{if $.Grouped}}{{.Rule}}{{else}}{{.Title}}{{end}}</h3>
<p style="margin-top: 4px"><strong>{{.Summary}}</strong>
{{- if not $.Grouped}}{{with .URL}} · <a href="{{.}}">View event</a>{{end}}{{end}}</p>
<ul style="color: #555">
{{- range .Details}}
<li>{{.}}</li>
{{- end}}
</ul>
{{- end}}
{{- with .More}}
<p><strong>{{.}}</strong></p>
{{- end}}
{{- if .Footer}}
<p style="color: #888">{{.Footer}}</p>
{{- end}}
</body></html>
`
