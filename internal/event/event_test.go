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
		{`{"projectId":"5e3eef0679fa3700a0198a49","event":{"title":"t","groupHash":"g","isNew":"yes"}}`, `within "/event/isNew"`},
		// Read as JavaScript reads it: exact names.
		{`{"ProjectId":"5e3eef0679fa3700a0198a49","event":{"title":"t","groupHash":"g"}}`, "projectId is missing"},
		{"{\"projectId\":\"5e3eef0679fa3700a0198a49\",\"event\":{\"title\":\"\xff\",\"groupHash\":\"g\"}}", "not valid UTF-8"},
		{`{"projectId":"5e3eef0679fa3700a0198a49","event":{"title":"` + strings.Repeat("x", MaxSize) + `","groupHash":"g"}}`, "over the"},
	} {
		_, err := Decode([]byte(tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Decode(%.60q) = %v, want an error containing %q", tc.body, err, tc.want)
		}
	}
}

// A name given twice counts with its last value, as JSON.parse reads it.
func TestDecodeTakesTheLastOfANameGivenTwice(t *testing.T) {
	m, err := Decode([]byte(`{"projectId":"5e3eef0679fa3700a0198a49","event":{"title":"t","groupHash":"g",` +
		`"repetitionId":null,"groupHash":"h","repetitionId":"r"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.Event.GroupHash != "h" || m.Event.RepetitionID == nil || *m.Event.RepetitionID != "r" {
		t.Errorf("groupHash %q, repetitionId %v: want the last values, h and r", m.Event.GroupHash, m.Event.RepetitionID)
	}
}

func TestHugeTitleTruncated(t *testing.T) {
	title := strings.Repeat("é", MaxTitle)
	m, err := Decode([]byte(`{"projectId":"5e3eef0679fa3700a0198a49","event":{"title":"` + title + `","groupHash":"g"}}`))
	if err != nil {
		t.Fatal(err)
	}
	short := m.Event.ShortTitle()
	if len(short) > MaxTitle+len("…") || !strings.HasSuffix(short, "é…") {
		t.Errorf("title of %d bytes ends %q", len(short), short[len(short)-8:])
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

// One project has one spelling: the counter's keys and the firing ids are
// built from the project id, so an upper-case id must not count apart from
// the lower-case one.
func TestDecodeLowerCasesProjectID(t *testing.T) {
	m, err := Decode([]byte(`{"projectId":"5E3EEF0679FA3700A0198A49","event":{"title":"t","groupHash":"g","isNew":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.ProjectID != "5e3eef0679fa3700a0198a49" {
		t.Errorf("projectId %q, want it lower-case", m.ProjectID)
	}
}

// A timestamp with milliseconds counts at that millisecond: float64 cannot
// hold .123 exactly, and cutting the fraction's nanoseconds made it .122.
func TestTimestampMilliseconds(t *testing.T) {
	for ms := int64(1_700_000_000_000); ms < 1_700_000_001_000; ms++ {
		ts := float64(ms) / 1000
		e := Event{Timestamp: &ts}
		if got := e.Time().UnixMilli(); got != ms {
			t.Fatalf("timestamp %v counts at %d ms, want %d", ts, got, ms)
		}
	}
	ts := 1_700_000_000.999_999_9 // rounds up to the next second
	e := Event{Timestamp: &ts}
	if want := time.Unix(1_700_000_001, 0); !e.Time().Equal(want) {
		t.Errorf("timestamp %v is %v, want %v", ts, e.Time(), want)
	}
}

// Rules match the whole title: a word past MaxTitle still includes or
// excludes. Only what channels show is cut.
func TestLongTitleKeptForMatching(t *testing.T) {
	title := strings.Repeat("x", MaxTitle) + " staging"
	m, err := Decode([]byte(`{"projectId":"5e3eef0679fa3700a0198a49","event":{"title":"` + title + `","groupHash":"g"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.Event.Title != title {
		t.Errorf("title of %d bytes decoded to %d bytes, want all of it", len(title), len(m.Event.Title))
	}
	if short := m.Event.ShortTitle(); len(short) > MaxTitle+len("…") || strings.Contains(short, "staging") {
		t.Errorf("ShortTitle of %d bytes ends %q", len(short), short[len(short)-10:])
	}
}

// A user id is stored per user by rules that count users: a huge one is kept
// as a short hash, distinct ids stay distinct, and ordinary ids stay as sent.
func TestLongUserIDIsHashed(t *testing.T) {
	user := func(id string) string {
		e := Event{User: &User{ID: id}}
		return e.UserID()
	}
	if got := user("u-42"); got != "u-42" {
		t.Errorf("short id became %q", got)
	}
	a, b := user(strings.Repeat("a", 200_000)), user(strings.Repeat("a", 199_999)+"b")
	if len(a) > maxUserID || len(b) > maxUserID || a == b || !strings.HasPrefix(a, "sha256:") {
		t.Errorf("long ids became %q and %q: want short, distinct hashes", a, b)
	}
	if a != user(strings.Repeat("a", 200_000)) {
		t.Error("the same long id hashed two ways")
	}
	if got := (&Event{}).UserID(); got != "" {
		t.Errorf("no user gave %q", got)
	}
}

// Project ids are ObjectIds in either case, in messages and in the rules
// file alike (the store uses this check too).
func TestIsObjectID(t *testing.T) {
	if !IsObjectID("5E3EEF0679FA3700A0198A49") || IsObjectID("5e3eef0679fa3700a0198a4") {
		t.Error("IsObjectID")
	}
}

// Fill gives an event what it lacks and keeps what it says: a time of
// Hawk's milliseconds comes back exactly from Time.
func TestFillKeepsWhatTheEventSays(t *testing.T) {
	at := time.UnixMilli(1700000000123)
	var e Event
	e.Fill(at, "alice")
	if !e.Time().Equal(at) || e.UserID() != "alice" {
		t.Errorf("filled: at %v by %q, want %v by alice", e.Time(), e.UserID(), at)
	}
	e.Fill(at.Add(time.Hour), "bob")
	if !e.Time().Equal(at) || e.UserID() != "alice" {
		t.Errorf("filled again: at %v by %q, want what it had", e.Time(), e.UserID())
	}
	var none Event
	none.Fill(time.Time{}, "")
	if none.Timestamp != nil || none.User != nil {
		t.Errorf("filled with nothing: %+v", none)
	}
}
