package email_test

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klaxonhq/klaxon/internal/notify"
	"github.com/klaxonhq/klaxon/internal/notify/email"
	"github.com/klaxonhq/klaxon/internal/notify/notifytest"
)

const nastyTitle = notifytest.NastyTitle

var firedAt = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func threshold(id, title string) notify.Notification { return notifytest.Threshold(id, title, firedAt) }

func single(n notify.Notification) *notify.Message { return notifytest.Single(n) }

func newNotifier(t *testing.T, cfg email.Config) *email.Notifier {
	t.Helper()
	if cfg.From == "" {
		cfg.From = "Klaxon <klaxon@example.com>"
	}
	n, err := email.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func onlyMessage(t *testing.T, srv *notifytest.SMTPServer) notifytest.SMTPMessage {
	t.Helper()
	msgs := srv.Messages()
	if len(msgs) != 1 {
		t.Fatalf("server accepted %d messages, want 1", len(msgs))
	}
	return msgs[0]
}

func TestMessageFormat(t *testing.T) {
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{})
	n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone})
	if retry, err := n.Notify(context.Background(), "dev@example.com, Ops Team <ops@example.org>", single(threshold("n-1", nastyTitle))); err != nil {
		t.Fatalf("Notify = %t, %v", retry, err)
	}
	m := onlyMessage(t, srv)
	if m.From != "klaxon@example.com" || !slices.Equal(m.To, []string{"dev@example.com", "ops@example.org"}) {
		t.Errorf("envelope from %q to %q", m.From, m.To)
	}
	msg, err := m.Parse()
	if err != nil {
		t.Fatal(err)
	}
	subject, err := new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
	if err != nil || !strings.Contains(subject, nastyTitle) || !strings.Contains(subject, "150 events in the last 1 minute") {
		t.Errorf("Subject = %q (%v), want the title and the count", subject, err)
	}
	if got := msg.Header.Get("X-Klaxon-Notification-Id"); got != "n-1" {
		t.Errorf("X-Klaxon-Notification-Id = %q", got)
	}
	if to := msg.Header.Get("To"); to != "undisclosed-recipients:;" {
		t.Errorf("To = %q, want the recipients blind", to)
	}
	if ct := msg.Header.Get("Content-Type"); !strings.HasPrefix(ct, "multipart/alternative") {
		t.Errorf("Content-Type = %q, want multipart/alternative", ct)
	}
	parts, err := m.Parts()
	if err != nil {
		t.Fatal(err)
	}
	text, html := parts["text/plain"], parts["text/html"]
	for _, want := range []string{nastyTitle, "150 events in the last 1 minute (threshold 100)", "resets at 2025-01-02T03:05:05Z", "Notification id n-1"} {
		if !strings.Contains(text, want) {
			t.Errorf("text part lacks %q:\n%s", want, text)
		}
	}
	if !strings.Contains(html, "&lt;b&gt;&amp;*_[x]") || strings.Contains(html, nastyTitle) {
		t.Errorf("HTML part does not escape the title:\n%s", html)
	}
	if !strings.Contains(html, "150 events in the last 1 minute (threshold 100)") {
		t.Errorf("HTML part lacks the summary:\n%s", html)
	}
}

func TestDigest(t *testing.T) {
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{})
	m := &notify.Message{ID: "d-1", ProjectID: "p", RuleID: "r", Digest: true}
	for i := range 3 {
		m.Notifications = append(m.Notifications, threshold(fmt.Sprint("n-", i), fmt.Sprint("Error ", i)))
	}
	if _, err := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone}).Notify(context.Background(), "dev@example.com", m); err != nil {
		t.Fatal(err)
	}
	got := onlyMessage(t, srv)
	msg, _ := got.Parse()
	if s := msg.Header.Get("Subject"); !strings.Contains(s, "3 notifications for rule r: Error 0 and 2 more") {
		t.Errorf("Subject = %q", s)
	}
	if id := msg.Header.Get("X-Klaxon-Notification-Id"); id != "d-1" {
		t.Errorf("X-Klaxon-Notification-Id = %q, want the digest id", id)
	}
	parts, _ := got.Parts()
	if n := strings.Count(parts["text/plain"], "\n• Error "); n != 3 {
		t.Errorf("text part lists %d firings, want 3:\n%s", n, parts["text/plain"])
	}
}

// A huge digest stays a mail a server takes: at most 500 firings of short
// lines, and the count of the rest, with those the deliverer left out.
func TestHugeDigestIsBounded(t *testing.T) {
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{})
	m := &notify.Message{ID: "d-big", ProjectID: "p", RuleID: "r", Digest: true, Omitted: 100}
	for i := range 20_000 {
		m.Notifications = append(m.Notifications, threshold(fmt.Sprint("n-", i), fmt.Sprint("Error ", i, " ", strings.Repeat("x", 500))))
	}
	if _, err := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone}).Notify(context.Background(), "dev@example.com", m); err != nil {
		t.Fatal(err)
	}
	got := onlyMessage(t, srv)
	if len(got.Data) > 2<<20 {
		t.Errorf("digest mail of %d bytes, want at most 2 MiB", len(got.Data))
	}
	parts, _ := got.Parts()
	text := parts["text/plain"]
	if n := strings.Count(text, "\n• Error "); n != 500 {
		t.Errorf("text part lists %d firings, want 500", n)
	}
	if !strings.Contains(text, "and 19600 more not shown here") || !strings.Contains(parts["text/html"], "and 19600 more not shown here") {
		t.Errorf("text or HTML part does not say how many more:\n%.300s", text[len(text)-300:])
	}
	msg, err := got.Parse()
	if err != nil {
		t.Fatal(err)
	}
	if subject, err := new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject")); err != nil || !strings.HasPrefix(subject, "[Klaxon] 20100 notifications") {
		t.Errorf("subject %.60q (%v) does not count every firing", subject, err)
	}
}

func TestNoneIsReallyPlain(t *testing.T) {
	// The server offers STARTTLS; TLS mode none must not take it.
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{StartTLS: true})
	n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone})
	if _, err := n.Notify(context.Background(), "dev@example.com", single(threshold("n-1", "A"))); err != nil {
		t.Fatal(err)
	}
	if onlyMessage(t, srv).TLS {
		t.Error("TLS mode none used STARTTLS")
	}
}

func TestStartTLSWithAuth(t *testing.T) {
	for _, mech := range []string{"PLAIN", "LOGIN"} {
		srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{StartTLS: true, Username: "klaxon", Password: "pw", AuthMechanisms: []string{mech}})
		n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSStartTLS, TLSConfig: srv.ClientTLSConfig(), Username: "klaxon", Password: "pw"})
		if retry, err := n.Notify(context.Background(), "dev@example.com", single(threshold("n-1", "A"))); err != nil {
			t.Fatalf("%s: Notify = %t, %v", mech, retry, err)
		}
		if m := onlyMessage(t, srv); !m.TLS || m.User != "klaxon" {
			t.Errorf("%s: TLS %t, user %q; want an encrypted, authenticated session", mech, m.TLS, m.User)
		}
	}
}

func TestStartTLSRequired(t *testing.T) {
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{})
	n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSStartTLS})
	retry, err := n.Notify(context.Background(), "dev@example.com", single(threshold("n-1", "A")))
	if err == nil || !retry || !strings.Contains(err.Error(), "STARTTLS") {
		t.Errorf("Notify = %t, %v; want a retryable error about STARTTLS", retry, err)
	}
	if len(srv.Messages()) != 0 {
		t.Error("sent in clear although STARTTLS was required")
	}
}

func TestImplicitTLS(t *testing.T) {
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{ImplicitTLS: true})
	n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSImplicit, TLSConfig: srv.ClientTLSConfig()})
	if _, err := n.Notify(context.Background(), "dev@example.com", single(threshold("n-1", "A"))); err != nil {
		t.Fatal(err)
	}
	if !onlyMessage(t, srv).TLS {
		t.Error("session was not encrypted")
	}
}

func TestWrongPasswordIsPermanent(t *testing.T) {
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{StartTLS: true, Username: "klaxon", Password: "pw"})
	n := newNotifier(t, email.Config{Addr: srv.Addr, TLSConfig: srv.ClientTLSConfig(), Username: "klaxon", Password: "wrong"})
	retry, err := n.Notify(context.Background(), "dev@example.com", single(threshold("n-1", "A")))
	if err == nil || retry || !strings.Contains(err.Error(), "535") || strings.Contains(err.Error(), "wrong") {
		t.Errorf("Notify = %t, %v; want a permanent 535 without the password", retry, err)
	}
}

func TestRetryClassification(t *testing.T) {
	for _, tc := range []struct {
		code  int
		retry bool
	}{{451, true}, {452, true}, {550, false}, {554, false}} {
		srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{})
		srv.Fail(notifytest.SMTPFailure{Code: tc.code})
		n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone})
		retry, err := n.Notify(context.Background(), "dev@example.com", single(threshold("n-1", "A")))
		if err == nil || retry != tc.retry || !strings.Contains(err.Error(), fmt.Sprint(tc.code)) {
			t.Errorf("SMTP %d: Notify = %t, %v; want retry %t", tc.code, retry, err, tc.retry)
		}
		// The failure was for one message only.
		if _, err := n.Notify(context.Background(), "dev@example.com", single(threshold("n-1", "A"))); err != nil {
			t.Errorf("SMTP %d, then: %v", tc.code, err)
		}
	}
}

func TestSomeRecipientsRefused(t *testing.T) {
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{})
	srv.RejectRecipient("gone@example.com", notifytest.SMTPFailure{Code: 550, Message: "No such user"})
	n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone})
	retry, err := n.Notify(context.Background(), "dev@example.com,gone@example.com", single(threshold("n-1", "A")))
	if err == nil || retry || !strings.Contains(err.Error(), "recipient 2 (550") || strings.Contains(err.Error(), "gone@example.com") {
		t.Errorf("Notify = %t, %v; want a permanent error naming the refused recipient by position, not address", retry, err)
	}
	if m := onlyMessage(t, srv); !slices.Equal(m.To, []string{"dev@example.com"}) {
		t.Errorf("delivered to %q, want the accepted recipient", m.To)
	}

	retry, err = n.Notify(context.Background(), "gone@example.com", single(threshold("n-2", "A")))
	if err == nil || retry {
		t.Errorf("only recipient refused: Notify = %t, %v; want a permanent error", retry, err)
	}
	srv.RejectRecipient("later@example.com", notifytest.SMTPFailure{Code: 450})
	retry, err = n.Notify(context.Background(), "dev@example.com, later@example.com", single(threshold("n-3", "A")))
	if err == nil || !retry || len(srv.Messages()) != 1 {
		t.Errorf("recipient deferred: Notify = %t, %v; want a retryable error and nothing sent", retry, err)
	}
}

func TestConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	n := newNotifier(t, email.Config{Addr: addr, TLS: email.TLSNone})
	if retry, err := n.Notify(context.Background(), "dev@example.com", single(threshold("n-1", "A"))); err == nil || !retry {
		t.Errorf("Notify = %t, %v; want a retryable error", retry, err)
	}
}

func TestTimeout(t *testing.T) {
	// A server that accepts and never greets.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	n := newNotifier(t, email.Config{Addr: ln.Addr().String(), TLS: email.TLSNone})
	retry, err := n.Notify(ctx, "dev@example.com", single(threshold("n-1", "A")))
	if err == nil || !retry || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Notify = %t, %v; want a retryable deadline error", retry, err)
	}
}

func TestBadRecipientIsPermanent(t *testing.T) {
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{})
	n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone})
	for _, to := range []string{"", "not an address", " , "} {
		if retry, err := n.Notify(context.Background(), to, single(threshold("n-1", "A"))); err == nil || retry {
			t.Errorf("Notify(%q) = %t, %v; want a permanent error", to, retry, err)
		}
	}
}

func TestNewChecksConfig(t *testing.T) {
	for _, cfg := range []email.Config{
		{Addr: "smtp.example.com", From: "a@example.com"},
		{Addr: "smtp.example.com:x", From: "a@example.com"},
		{Addr: "smtp.example.com:587", From: "not an address"},
		{Addr: "smtp.example.com:587", From: "a@example.com", TLS: "ssl"},
		{Addr: "smtp.example.com:25", From: "a@example.com", TLS: email.TLSNone, Username: "u", Password: "p"},
	} {
		if _, err := email.New(cfg); err == nil {
			t.Errorf("New(%+v) = nil error", cfg)
		}
	}
	if _, err := email.New(email.Config{Addr: "127.0.0.1:25", From: "a@example.com", TLS: email.TLSNone, Username: "u", Password: "p"}); err != nil {
		t.Errorf("plain AUTH to localhost: %v", err)
	}
}

func TestSMTPStages(t *testing.T) {
	// Each reply at each stage, and connections dropped: 4xx and a lost
	// connection are retried, 5xx are not, and nothing counts as sent.
	for _, tc := range []struct {
		script map[string]string
		retry  bool
		want   string
	}{
		{map[string]string{"greeting": "421 4.3.2 Busy"}, true, "421"},
		{map[string]string{"greeting": "554 5.7.1 No service"}, false, "554"},
		{map[string]string{"EHLO": "421 4.3.2 Busy", "HELO": "421 4.3.2 Busy"}, true, "421"},
		{map[string]string{"EHLO": "550 5.7.1 Bad HELO", "HELO": "550 5.7.1 Bad HELO"}, false, "550"},
		{map[string]string{"MAIL": "451 4.3.0 Later"}, true, "451"},
		{map[string]string{"MAIL": "553 5.1.8 Bad sender"}, false, "553"},
		{map[string]string{"RCPT": "450 4.2.1 Busy"}, true, "450"},
		{map[string]string{"RCPT": "550 5.1.1 No such user"}, false, "550"},
		{map[string]string{"DATA": "451 4.3.0 Later"}, true, "451"},
		{map[string]string{"DATA": "554 5.5.1 No valid recipients"}, false, "554"},
		{map[string]string{".": "452 4.3.1 Storage"}, true, "452"},
		{map[string]string{".": "552 5.3.4 Too big"}, false, "552"},
		{map[string]string{"RCPT": notifytest.Drop}, true, "RCPT"},
		{map[string]string{"DATA": notifytest.Drop}, true, "DATA"},
		{map[string]string{".": notifytest.Drop}, true, "DATA"},
	} {
		for _, cfg := range []email.Config{
			{TLS: email.TLSNone},
			// The plain server offers neither STARTTLS nor AUTH: a refused
			// EHLO must not be reported as a missing extension.
			{TLS: email.TLSStartTLS},
			{TLS: email.TLSNone, Username: "klaxon", Password: "pw"},
		} {
			if cfg.TLS == email.TLSStartTLS || cfg.Username != "" {
				if _, ehlo := tc.script["EHLO"]; !ehlo {
					continue // they stop at the missing extension
				}
			}
			srv := notifytest.NewScriptedSMTPServer(t, tc.script)
			cfg.Addr = srv.Addr
			n := newNotifier(t, cfg)
			retry, err := n.Notify(context.Background(), "dev@example.com", single(threshold("n-1", "A")))
			if err == nil || retry != tc.retry || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, TLS %s, user %q: Notify = %t, %v; want retry %t and an error with %q", tc.script, cfg.TLS, cfg.Username, retry, err, tc.retry, tc.want)
			}
			if len(srv.Messages()) != 0 {
				t.Errorf("%v: the server accepted the message", tc.script)
			}
		}
	}
}

func TestSendTimeout(t *testing.T) {
	// KLAXON_SEND_TIMEOUT bounds the session even when the caller's context
	// has no deadline, whichever reply the server holds back.
	for _, stage := range []string{"greeting", "EHLO", "RCPT", "DATA", "."} {
		srv := notifytest.NewScriptedSMTPServer(t, map[string]string{stage: notifytest.Stall})
		n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone, Timeout: 100 * time.Millisecond})
		start := time.Now()
		retry, err := n.Notify(context.Background(), "dev@example.com", single(threshold("n-1", "A")))
		if err == nil || !retry || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s held back: Notify = %t, %v; want a retryable deadline error", stage, retry, err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("%s held back: Notify took %s with a 100ms timeout", stage, took)
		}
	}
}

func TestRecipientLimit(t *testing.T) {
	// A server that takes 3 recipients per message answers the 4th RCPT
	// with 452 4.5.3: the message goes to those 3, and the rest follow in
	// further transactions, rather than retrying for ever.
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{MaxRecipients: 3})
	var to []string
	for i := range 7 {
		to = append(to, fmt.Sprintf("u%d@example.com", i))
	}
	n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone})
	if retry, err := n.Notify(context.Background(), strings.Join(to, ", "), single(threshold("n-1", "A"))); err != nil {
		t.Fatalf("Notify = %t, %v", retry, err)
	}
	var got []string
	for _, m := range srv.Messages() {
		got = append(got, m.To...)
		msg, err := m.Parse()
		if err != nil {
			t.Fatal(err)
		}
		if id := msg.Header.Get("X-Klaxon-Notification-Id"); id != "n-1" {
			t.Errorf("X-Klaxon-Notification-Id = %q", id)
		}
	}
	if !slices.Equal(got, to) {
		t.Errorf("delivered to %q, want each of %q once", got, to)
	}

	// Once some have it, a deferred recipient in a later transaction is
	// reported, not retried: a retry would repeat the message to the others.
	srv = notifytest.NewSMTPServer(t, notifytest.SMTPOptions{MaxRecipients: 2})
	srv.RejectRecipient("later@example.com", notifytest.SMTPFailure{Code: 450})
	n = newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone})
	retry, err := n.Notify(context.Background(), "a@example.com, b@example.com, later@example.com", single(threshold("n-2", "A")))
	if err == nil || retry || !strings.Contains(err.Error(), "not to recipient 3:") || strings.Contains(err.Error(), "@example.com") {
		t.Errorf("Notify = %t, %v; want a permanent error naming only the deferred recipient, by position", retry, err)
	}
	if m := onlyMessage(t, srv); !slices.Equal(m.To, []string{"a@example.com", "b@example.com"}) {
		t.Errorf("delivered to %q", m.To)
	}
}

func TestDuplicateRecipients(t *testing.T) {
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{})
	n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone})
	if _, err := n.Notify(context.Background(), "dev@example.com, b@example.com, DEV@Example.com, Dev <dev@example.com>", single(threshold("n-1", "A"))); err != nil {
		t.Fatal(err)
	}
	m := onlyMessage(t, srv)
	if !slices.Equal(m.To, []string{"dev@example.com", "b@example.com"}) {
		t.Errorf("RCPT TO %q, want each address once", m.To)
	}
}

func TestQuotedLocalPart(t *testing.T) {
	// "a b"@example.com is a valid address; RCPT TO:<a b@example.com> is not.
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{})
	n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone})
	if retry, err := n.Notify(context.Background(), `"a b"@example.com`, single(threshold("n-1", "A"))); err != nil {
		t.Fatalf("Notify = %t, %v", retry, err)
	}
	if m := onlyMessage(t, srv); len(m.To) != 1 || !strings.Contains(m.To[0], "a b") {
		t.Errorf("RCPT TO %q", m.To)
	}
}

func TestSubjectIsOneLine(t *testing.T) {
	// Encoded-words keep a CR LF out of the raw header, but a decoded
	// subject must not carry one either (a rule id is not made one line).
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{})
	m := &notify.Message{ID: "d-1", ProjectID: "p", RuleID: "r\r\nBcc: evil@example.com", Digest: true,
		Notifications: []notify.Notification{threshold("n-1", "Érror\r\nX-Evil: 1")}}
	if _, err := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone}).Notify(context.Background(), "dev@example.com", m); err != nil {
		t.Fatal(err)
	}
	msg, err := onlyMessage(t, srv).Parse()
	if err != nil {
		t.Fatal(err)
	}
	subject, err := new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
	if err != nil || strings.ContainsAny(subject, "\r\n") || !strings.Contains(subject, "Érror") {
		t.Errorf("Subject = %q (%v), want the title on one line", subject, err)
	}
	if msg.Header.Get("Bcc") != "" || msg.Header.Get("X-Evil") != "" {
		t.Errorf("injected header: %v", msg.Header)
	}
}

func TestIDsStableAcrossRetries(t *testing.T) {
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{})
	srv.Fail(notifytest.SMTPFailure{Code: 451})
	n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone})
	m := single(threshold("0123abcd", "A"))
	if retry, err := n.Notify(context.Background(), "dev@example.com", m); err == nil || !retry {
		t.Fatalf("Notify = %t, %v; want a retryable error", retry, err)
	}
	for range 2 {
		if _, err := n.Notify(context.Background(), "dev@example.com", m); err != nil {
			t.Fatal(err)
		}
	}
	msgs := srv.Messages()
	var ids []string
	for _, got := range msgs {
		msg, _ := got.Parse()
		ids = append(ids, msg.Header.Get("X-Klaxon-Notification-Id")+" "+msg.Header.Get("Message-ID"))
	}
	if len(ids) != 2 || ids[0] != ids[1] || ids[0] != "0123abcd <0123abcd.klaxon@example.com>" {
		t.Errorf("ids = %q, want the same notification id and Message-ID each time", ids)
	}
}

// An endpoint is written by a project's users: 2,000 addresses made one
// mail with all of them in To, its subject set by an event title. The
// channel takes at most MaxRecipients, as blind recipients, and no address
// reaches an error (errors go to logs and to the failed queue's
// x-klaxon-error), even when the server repeats it.
func TestRecipientsAreBlindBoundedAndNeverInErrors(t *testing.T) {
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{})
	n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone, MaxRecipients: 3})
	var many []string
	for i := range 2000 {
		many = append(many, fmt.Sprintf("victim%d@example.com", i))
	}
	retry, err := n.Notify(context.Background(), strings.Join(many, ", "), single(threshold("n-1", "Buy now")))
	if err == nil || retry || !strings.Contains(err.Error(), "names 2000 addresses, over the limit of 3") {
		t.Errorf("2,000 addresses: Notify = %t, %v; want a permanent error saying the limit", retry, err)
	}
	if len(srv.Messages()) != 0 {
		t.Errorf("%d mails sent to an endpoint over the limit", len(srv.Messages()))
	}

	srv.RejectRecipient("gone@example.com", notifytest.SMTPFailure{Code: 550, Message: "5.1.1 <gone@example.com>: Recipient address rejected"})
	to := "a@example.com, Bea <b@example.org>, gone@example.com"
	retry, err = n.Notify(context.Background(), to, single(threshold("n-2", "A")))
	if err == nil || retry || !strings.Contains(err.Error(), "recipient 3") {
		t.Fatalf("Notify = %t, %v; want a permanent error about recipient 3", retry, err)
	}
	if strings.Contains(err.Error(), "@example") || !strings.Contains(err.Error(), "[redacted]") {
		t.Errorf("error %q shows an address", err)
	}
	m := onlyMessage(t, srv)
	if !slices.Equal(m.To, []string{"a@example.com", "b@example.org"}) {
		t.Errorf("RCPT TO %q", m.To)
	}
	header, _, _ := strings.Cut(string(m.Data), "\r\n\r\n")
	if strings.Contains(header, "@example.org") || strings.Contains(strings.ReplaceAll(header, "klaxon@example.com", ""), "@example.com") {
		t.Errorf("a recipient's address is in the headers every recipient sees:\n%s", header)
	}
	if msg, _ := m.Parse(); msg.Header.Get("X-Klaxon-Notification-Id") != "n-2" {
		t.Errorf("X-Klaxon-Notification-Id = %q", msg.Header.Get("X-Klaxon-Notification-Id"))
	}

	if _, err := n.Notify(context.Background(), "ok@example.com, not an address", single(threshold("n-3", "A"))); err == nil ||
		!strings.Contains(err.Error(), "recipient 2 is not an address") || strings.Contains(err.Error(), "not an address,") {
		t.Errorf("a malformed recipient: %v", err)
	}
}

// A grouped message names every rule with what it saw, in both parts.
func TestGroupedNamesEveryRule(t *testing.T) {
	srv := notifytest.NewSMTPServer(t, notifytest.SMTPOptions{})
	n := newNotifier(t, email.Config{Addr: srv.Addr, TLS: email.TLSNone})
	if _, err := n.Notify(context.Background(), "dev@example.com", notifytest.Grouped(nastyTitle, firedAt)); err != nil {
		t.Fatal(err)
	}
	m := onlyMessage(t, srv)
	msg, err := m.Parse()
	if err != nil {
		t.Fatal(err)
	}
	subject, _ := new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
	if want := "[Klaxon] [Shop] " + nastyTitle + " — 3 rules fired"; subject != want || msg.Header.Get("X-Klaxon-Notification-Id") != "group-1" {
		t.Errorf("Subject %q, id %q; want %q, group-1", subject, msg.Header.Get("X-Klaxon-Notification-Id"), want)
	}
	parts, err := m.Parts()
	if err != nil {
		t.Fatal(err)
	}
	for part, wants := range map[string][]string{
		"text/plain": {"• 100 events in 1 minute — 150 events", "• new errors — New event", "• Rule 64ab00000000000000000003 — ", "Message id group-1"},
		"text/html":  {"<h3 style=\"margin-bottom: 0\">100 events in 1 minute</h3>", ">new errors</h3>", ">Rule 64ab00000000000000000003</h3>", "&lt;b&gt;&amp;*_[x]"},
	} {
		for _, want := range wants {
			if !strings.Contains(parts[part], want) {
				t.Errorf("%s lacks %q:\n%s", part, want, parts[part])
			}
		}
	}
}
