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
	if to := msg.Header.Get("To"); !strings.Contains(to, "dev@example.com") || !strings.Contains(to, "ops@example.org") {
		t.Errorf("To = %q", to)
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
	if err == nil || retry || !strings.Contains(err.Error(), "gone@example.com") {
		t.Errorf("Notify = %t, %v; want a permanent error naming the refused address", retry, err)
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
