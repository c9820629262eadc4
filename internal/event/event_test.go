package event

import (
	"strings"
	"testing"
	"time"
)

func TestDecode(t *testing.T) {
	ok := `{"projectId":"5e3eef0679fa3700a0198a49","event":{"title":"TypeError: x","groupHash":"11da","isNew":true,"repetitionId":null}}`
	m, err := Decode([]byte(ok))
	if err != nil {
		t.Fatal(err)
	}
	if m.ProjectID != "5e3eef0679fa3700a0198a49" || m.Event.Title != "TypeError: x" || !m.Event.IsNew || m.Event.RepetitionID != nil {
		t.Errorf("decoded %+v", m)
	}
	if !m.Event.Time().IsZero() || m.Event.UserID() != "" {
		t.Errorf("time %v user %q, want none", m.Event.Time(), m.Event.UserID())
	}

	ext := `{"projectId":"5e3eef0679fa3700a0198a49","event":{"title":"t","groupHash":"g","timestamp":1700000000.25,"user":{"id":"u1"},"repetitionId":"abc"}}`
	m, err = Decode([]byte(ext))
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Unix(1700000000, 250_000_000); !m.Event.Time().Equal(want) {
		t.Errorf("time %v, want %v", m.Event.Time(), want)
	}
	if m.Event.UserID() != "u1" || *m.Event.RepetitionID != "abc" {
		t.Errorf("decoded %+v", m.Event)
	}
}

func TestDecodeRejects(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`not json`, "not a JSON object"},
		{`[1,2]`, "not a JSON object"},
		{`{"event":{"title":"t","groupHash":"g"}}`, "projectId is missing"},
		{`{"projectId":"nope","event":{"title":"t","groupHash":"g"}}`, `projectId "nope" is not a 24-hex ObjectId`},
		{`{"projectId":"5e3eef0679fa3700a0198a4z","event":{"title":"t","groupHash":"g"}}`, "not a 24-hex ObjectId"},
		{`{"projectId":"5e3eef0679fa3700a0198a49","event":{"title":"t"}}`, "event.groupHash is missing"},
		{`{"projectId":"5e3eef0679fa3700a0198a49","event":{"groupHash":"g"}}`, "event.title is missing"},
		{`{"projectId":"5e3eef0679fa3700a0198a49","event":{"title":"t","groupHash":"g","timestamp":-1}}`, "not Unix seconds"},
		{`{"projectId":"5e3eef0679fa3700a0198a49","event":{"title":"t","groupHash":"g","timestamp":"x"}}`, "not a JSON object"},
		{"{\"projectId\":\"5e3eef0679fa3700a0198a49\",\"event\":{\"title\":\"\xff\",\"groupHash\":\"g\"}}", "not valid UTF-8"},
		{`{"projectId":"5e3eef0679fa3700a0198a49","event":{"title":"` + strings.Repeat("x", MaxSize) + `","groupHash":"g"}}`, "over the"},
	} {
		_, err := Decode([]byte(tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Decode(%.60q) = %v, want an error containing %q", tc.body, err, tc.want)
		}
	}
}

func TestHugeTitleTruncated(t *testing.T) {
	title := strings.Repeat("é", MaxTitle)
	m, err := Decode([]byte(`{"projectId":"5e3eef0679fa3700a0198a49","event":{"title":"` + title + `","groupHash":"g"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Event.Title) > MaxTitle+len("…") || !strings.HasSuffix(m.Event.Title, "é…") {
		t.Errorf("title of %d bytes ends %q", len(m.Event.Title), m.Event.Title[len(m.Event.Title)-8:])
	}
}

// BenchmarkDecode decodes a typical Hawk notifier message.
//
//	go test -run '^$' -bench Decode -benchmem ./internal/event
func BenchmarkDecode(b *testing.B) {
	body := []byte(`{"projectId":"5e3eef0679fa3700a0198a49","event":{"title":"TypeError: Cannot read properties of undefined (reading 'id') [17]","groupHash":"9f2c1a0b7e5d4c3b2a190817263544536271809a0b1c2d3e4f5061728394a5b6","isNew":false,"repetitionId":"0000000100000000000004d2"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(body); err != nil {
			b.Fatal(err)
		}
	}
}
