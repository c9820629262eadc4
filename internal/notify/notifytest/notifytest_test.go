package notifytest

import (
	"bytes"
	"net/http"
	"net/smtp"
	"strings"
	"testing"
	"time"
)

func TestWaitForSeesRequestsThatArriveLater(t *testing.T) {
	sink := NewWebhookSink(t)
	go func() {
		for range 3 {
			resp, err := http.Post(sink.URL, "application/json", strings.NewReader("{}"))
			if err != nil {
				return
			}
			resp.Body.Close()
		}
	}()
	reqs, err := sink.WaitFor(3, 5*time.Second)
	if err != nil || len(reqs) < 3 {
		t.Fatalf("WaitFor = %d requests, %v", len(reqs), err)
	}
	if _, err := sink.WaitFor(4, 10*time.Millisecond); err == nil {
		t.Error("WaitFor(4) returned without a fourth request")
	}
}

func TestTelegramHTML(t *testing.T) {
	for _, tc := range []struct {
		text, visible string
		ok            bool
	}{
		{"<b>bold</b> &lt;x&gt; &amp; &quot;q&quot; &#33;", `bold <x> & "q" !`, true},
		{`<a href="https://x">link</a>`, "link", true},
		{"<b>unclosed", "", false},
		{"</b>", "", false},
		{"a < b", "", false},
		{"a > b", "", false},
		{"fish & chips", "", false},
		{"<div>x</div>", "", false},
	} {
		visible, err := telegramHTML(tc.text)
		if (err == nil) != tc.ok || visible != tc.visible {
			t.Errorf("telegramHTML(%q) = %q, %v; want %q, ok %t", tc.text, visible, err, tc.visible, tc.ok)
		}
	}
}

func TestTelegramAcceptsJSON(t *testing.T) {
	srv := NewTelegramServer(t, "1:tok")
	resp, err := http.Post(srv.URL+"/bot1:tok/sendMessage", "application/json",
		strings.NewReader(`{"chat_id": 42, "text": "<b>hi</b>", "parse_mode": "HTML"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	r := srv.Requests()[0]
	if resp.StatusCode != 200 || r.ChatID != "42" || r.Visible != "hi" {
		t.Errorf("status %d, request %+v", resp.StatusCode, r)
	}
}

func TestSMTPPartsOfASinglePartMessage(t *testing.T) {
	srv := NewSMTPServer(t, SMTPOptions{})
	msg := "Subject: hi\r\nContent-Type: text/plain; charset=UTF-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\nh=C3=A9llo\r\n"
	if err := smtp.SendMail(srv.Addr, nil, "a@example.com", []string{"b@example.com"}, []byte(msg)); err != nil {
		t.Fatal(err)
	}
	m := srv.Messages()[0]
	parts, err := m.Parts()
	if err != nil || parts["text/plain"] != "héllo\r\n" || m.From != "a@example.com" || !bytes.Contains(m.Data, []byte("Subject: hi")) {
		t.Errorf("parts %q (%v) of %+v", parts, err, m)
	}
}
