package notifytest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"net/textproto"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// SMTPServer is a real SMTP server (github.com/emersion/go-smtp) on
// 127.0.0.1 that keeps the messages it accepts.
type SMTPServer struct {
	// Addr is host:port to connect to.
	Addr string

	opts      SMTPOptions
	clientTLS *tls.Config
	msgs      journal[SMTPMessage]
	fails     script[SMTPFailure]

	mu       sync.Mutex
	rejected map[string]SMTPFailure // by recipient address
}

// SMTPOptions configures an SMTPServer. The zero value is a plain server
// without authentication, STARTTLS or TLS.
type SMTPOptions struct {
	// Username and Password, when set, make the server require AUTH with
	// these credentials before MAIL FROM (530 otherwise, 535 for wrong
	// ones). AUTH is offered without TLS too, as on a local relay.
	Username, Password string
	// AuthMechanisms offered when Username is set: "PLAIN" (the default)
	// and/or "LOGIN".
	AuthMechanisms []string
	// StartTLS makes the server offer STARTTLS, with a self-signed
	// certificate for 127.0.0.1 that ClientTLSConfig trusts.
	StartTLS bool
	// ImplicitTLS makes the server speak TLS from the first byte, as on
	// port 465.
	ImplicitTLS bool
	// MaxRecipients, when positive, limits the RCPT TO commands of one
	// transaction; the next ones get "452 4.5.3" (RFC 5321 §4.5.3.1.10).
	MaxRecipients int
}

// SMTPMessage is one message the server accepted.
type SMTPMessage struct {
	From string   // MAIL FROM
	To   []string // RCPT TO, accepted ones only
	Data []byte   // the message as received: headers and body
	TLS  bool     // whether the session was encrypted
	User string   // the authenticated user; empty without AUTH
}

// SMTPFailure is a scripted SMTP error reply.
type SMTPFailure struct {
	Code    int    // e.g. 451 (try again later) or 550 (rejected)
	Message string // empty: a default for the code
}

// NewSMTPServer starts an SMTP server, closed when the test ends.
func NewSMTPServer(t testing.TB, opts SMTPOptions) *SMTPServer {
	t.Helper()
	if opts.Username != "" && len(opts.AuthMechanisms) == 0 {
		opts.AuthMechanisms = []string{sasl.Plain}
	}
	s := &SMTPServer{opts: opts, rejected: map[string]SMTPFailure{}}
	srv := smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		_, isTLS := c.TLSConnectionState()
		return &smtpSession{srv: s, tls: isTLS}, nil
	}))
	srv.Domain = "localhost"
	srv.AllowInsecureAuth = true
	srv.ReadTimeout = 10 * time.Second
	srv.WriteTimeout = 10 * time.Second
	srv.ErrorLog = log.New(io.Discard, "", 0)
	srv.MaxRecipients = opts.MaxRecipients

	listen := func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
	if opts.StartTLS || opts.ImplicitTLS {
		serverTLS, clientTLS, err := selfSigned()
		if err != nil {
			t.Fatalf("notifytest: SMTP certificate: %v", err)
		}
		s.clientTLS = clientTLS
		if opts.StartTLS {
			srv.TLSConfig = serverTLS
		}
		if opts.ImplicitTLS {
			listen = func() (net.Listener, error) { return tls.Listen("tcp", "127.0.0.1:0", serverTLS) }
		}
	}
	ln, err := listen()
	if err != nil {
		t.Fatalf("notifytest: SMTP listen: %v", err)
	}
	s.Addr = ln.Addr().String()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

// ClientTLSConfig returns a TLS configuration that trusts the server's
// certificate; nil unless StartTLS or ImplicitTLS is set.
func (s *SMTPServer) ClientTLSConfig() *tls.Config {
	if s.clientTLS == nil {
		return nil
	}
	return s.clientTLS.Clone()
}

// Fail makes the next messages be refused at the end of DATA, after their
// content was sent, one failure each.
func (s *SMTPServer) Fail(fs ...SMTPFailure) { s.fails.push(fs...) }

// FailNext makes the next n messages be refused with f.
func (s *SMTPServer) FailNext(n int, f SMTPFailure) { s.fails.push(repeat(n, f)...) }

// RejectRecipient makes RCPT TO addr fail with f from now on.
func (s *SMTPServer) RejectRecipient(addr string, f SMTPFailure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rejected[strings.ToLower(addr)] = f
}

// Messages returns the messages accepted so far.
func (s *SMTPServer) Messages() []SMTPMessage { return s.msgs.all() }

// WaitFor waits until at least n messages were accepted and returns them
// all; after timeout it returns those that were and an error.
func (s *SMTPServer) WaitFor(n int, timeout time.Duration) ([]SMTPMessage, error) {
	return s.msgs.waitFor(n, timeout)
}

func (s *SMTPServer) rejection(addr string) (SMTPFailure, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.rejected[strings.ToLower(addr)]
	return f, ok
}

func (f SMTPFailure) err() *smtp.SMTPError {
	msg := f.Message
	if msg == "" {
		msg = "Requested action not taken"
		if f.Code/100 == 4 {
			msg = "Try again later"
		}
	}
	return &smtp.SMTPError{Code: f.Code, EnhancedCode: smtp.EnhancedCode{f.Code / 100, 0, 0}, Message: msg}
}

type smtpSession struct {
	srv  *SMTPServer
	tls  bool
	user string
	from string
	to   []string
}

var errAuthFailed = &smtp.SMTPError{Code: 535, EnhancedCode: smtp.EnhancedCode{5, 7, 8}, Message: "Authentication credentials invalid"}

func (ss *smtpSession) AuthMechanisms() []string {
	if ss.srv.opts.Username == "" {
		return nil
	}
	return ss.srv.opts.AuthMechanisms
}

func (ss *smtpSession) Auth(mech string) (sasl.Server, error) {
	if !slices.Contains(ss.AuthMechanisms(), mech) {
		return nil, smtp.ErrAuthUnknownMechanism
	}
	check := func(username, password string) error {
		if username != ss.srv.opts.Username || password != ss.srv.opts.Password {
			return errAuthFailed
		}
		ss.user = username
		return nil
	}
	if mech == sasl.Login {
		return &loginServer{check: check}, nil
	}
	return sasl.NewPlainServer(func(_, username, password string) error { return check(username, password) }), nil
}

func (ss *smtpSession) Mail(from string, _ *smtp.MailOptions) error {
	if ss.srv.opts.Username != "" && ss.user == "" {
		return &smtp.SMTPError{Code: 530, EnhancedCode: smtp.EnhancedCode{5, 7, 0}, Message: "Authentication required"}
	}
	ss.from = from
	return nil
}

func (ss *smtpSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	if f, ok := ss.srv.rejection(to); ok {
		return f.err()
	}
	ss.to = append(ss.to, to)
	return nil
}

func (ss *smtpSession) Data(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if f, ok := ss.srv.fails.pop(); ok {
		return f.err()
	}
	ss.srv.msgs.add(SMTPMessage{From: ss.from, To: slices.Clone(ss.to), Data: data, TLS: ss.tls, User: ss.user})
	return nil
}

func (ss *smtpSession) Reset() { ss.from, ss.to = "", nil }

func (ss *smtpSession) Logout() error { return nil }

// loginServer is the server side of AUTH LOGIN, which go-sasl lacks: it asks
// for the username, then the password.
type loginServer struct {
	step     int
	username string
	check    func(username, password string) error
}

func (l *loginServer) Next(response []byte) ([]byte, bool, error) {
	l.step++
	switch l.step {
	case 1:
		if len(response) == 0 {
			return []byte("Username:"), false, nil
		}
		l.step++ // the username came as an initial response
		l.username = string(response)
		return []byte("Password:"), false, nil
	case 2:
		l.username = string(response)
		return []byte("Password:"), false, nil
	case 3:
		return nil, true, l.check(l.username, string(response))
	}
	return nil, false, errors.New("unexpected AUTH LOGIN response")
}

// Parse parses the message's headers and returns its body unread.
func (m SMTPMessage) Parse() (*mail.Message, error) {
	return mail.ReadMessage(bytes.NewReader(m.Data))
}

// Parts returns the message's text parts by media type ("text/plain",
// "text/html"), with transfer encodings undone, for a single-part message
// or a multipart one at any depth.
func (m SMTPMessage) Parts() (map[string]string, error) {
	msg, err := m.Parse()
	if err != nil {
		return nil, err
	}
	parts := map[string]string{}
	err = collectParts(msg.Header.Get("Content-Type"), msg.Header.Get("Content-Transfer-Encoding"), msg.Body, parts)
	return parts, err
}

func collectParts(contentType, encoding string, body io.Reader, into map[string]string) error {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return fmt.Errorf("content type %q: %w", contentType, err)
	}
	if strings.HasPrefix(mt, "multipart/") {
		mr := multipart.NewReader(body, params["boundary"])
		for {
			p, err := mr.NextPart() // undoes quoted-printable itself
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if err := collectParts(p.Header.Get("Content-Type"), p.Header.Get("Content-Transfer-Encoding"), p, into); err != nil {
				return err
			}
		}
	}
	switch strings.ToLower(encoding) {
	case "base64":
		body = base64.NewDecoder(base64.StdEncoding, body)
	case "quoted-printable":
		body = quotedprintable.NewReader(body)
	}
	b, err := io.ReadAll(body)
	if err != nil {
		return err
	}
	into[mt] = string(b)
	return nil
}

// selfSigned makes a certificate for 127.0.0.1 and localhost, and the
// server and client TLS configurations that use it.
func selfSigned() (server, client *tls.Config, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "notifytest SMTP"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}}}
	return server, &tls.Config{RootCAs: pool}, nil
}

// ScriptedSMTPServer is a bare SMTP server on 127.0.0.1 whose every reply can
// be scripted, for answers go-smtp will not give: a refused greeting, EHLO
// or DATA command, or a connection dropped in the middle of a message. It
// speaks plain SMTP only, without extensions.
type ScriptedSMTPServer struct {
	// Addr is host:port to connect to.
	Addr string

	replies map[string]string
	cmds    journal[string]
	msgs    journal[[]byte]
}

// Scripted replies that are not replies.
const (
	// Drop closes the connection instead of answering. For "." it closes
	// the connection after the first line of the message.
	Drop = "drop"
	// Stall never answers, and reads on until the client hangs up. For "."
	// it stalls after the end of the message.
	Stall = "stall"
)

// NewScriptedSMTPServer starts a ScriptedSMTPServer, closed when the test
// ends. replies maps "greeting", a command verb ("EHLO", "HELO", "MAIL",
// "RCPT", "DATA", "QUIT", …) or "." (the end of a message) to the reply,
// such as "451 4.3.0 Try again later", or to Drop. Those not in replies
// succeed.
func NewScriptedSMTPServer(t testing.TB, replies map[string]string) *ScriptedSMTPServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("notifytest: SMTP listen: %v", err)
	}
	s := &ScriptedSMTPServer{Addr: ln.Addr().String(), replies: replies}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				s.serve(c)
			}()
		}
	}()
	return s
}

// Commands returns the commands received so far, verb and arguments, in
// order.
func (s *ScriptedSMTPServer) Commands() []string { return s.cmds.all() }

// Messages returns the content of the messages accepted so far (those whose
// end was answered with 250).
func (s *ScriptedSMTPServer) Messages() [][]byte { return s.msgs.all() }

func (s *ScriptedSMTPServer) reply(key, def string) string {
	if r, ok := s.replies[key]; ok {
		return r
	}
	return def
}

func (s *ScriptedSMTPServer) serve(c net.Conn) {
	tc := textproto.NewConn(c)
	say := func(key, def string) bool {
		switch r := s.reply(key, def); r {
		case Drop:
			return false
		case Stall:
			_, _ = io.Copy(io.Discard, tc.R)
			return false
		default:
			return tc.PrintfLine("%s", r) == nil
		}
	}
	if !say("greeting", "220 localhost ESMTP notifytest") {
		return
	}
	for {
		line, err := tc.ReadLine()
		if err != nil {
			return
		}
		s.cmds.add(line)
		verb, _, _ := strings.Cut(line, " ")
		verb = strings.ToUpper(verb)
		switch verb {
		case "EHLO", "HELO":
			if !say(verb, "250 localhost") {
				return
			}
		case "QUIT":
			say(verb, "221 2.0.0 Bye")
			return
		case "DATA":
			if !say(verb, "354 Go ahead") {
				return
			}
			if !strings.HasPrefix(s.reply(verb, "354"), "354") {
				continue
			}
			if s.reply(".", "") == Drop {
				_, _ = tc.ReadLine()
				return
			}
			data, err := tc.ReadDotBytes()
			if err != nil {
				return
			}
			if r := s.reply(".", "250"); strings.HasPrefix(r, "250") {
				s.msgs.add(data)
			}
			if !say(".", "250 2.0.0 OK queued") {
				return
			}
		default:
			if !say(verb, "250 2.0.0 OK") {
				return
			}
		}
	}
}
