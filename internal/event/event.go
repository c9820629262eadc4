// Package event decodes the messages Hawk's grouper puts on the notifier
// queue, and says exactly what is wrong with one that cannot be used.
package event

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// MaxSize is the largest message accepted; a larger one is dead-lettered
// rather than parsed.
const MaxSize = 256 << 10

// MaxTitle is how much of a title notifications carry (ShortTitle): a huge
// title must not reach every channel. Rules match the whole title.
const MaxTitle = 1000

// Message is one incoming message: a Hawk event of a project.
type Message struct {
	ProjectID string `json:"projectId"`
	Event     Event  `json:"event"`
}

// Event is what Hawk says about one occurrence of an error.
type Event struct {
	Title        string  `json:"title"`
	GroupHash    string  `json:"groupHash"`
	IsNew        bool    `json:"isNew"`
	RepetitionID *string `json:"repetitionId"`
	// Timestamp is Unix seconds, possibly fractional (Klaxon's extension).
	Timestamp *float64 `json:"timestamp,omitempty"`
	User      *User    `json:"user,omitempty"`
}

// User is the affected user (Klaxon's extension).
type User struct {
	ID string `json:"id"`
}

// Time is when the event happened, or zero when it does not say.
func (e *Event) Time() time.Time {
	if e.Timestamp == nil {
		return time.Time{}
	}
	sec, frac := math.Modf(*e.Timestamp)
	// A float64 of today's Unix seconds holds a fraction only to about
	// 0.2 µs, and .123 is stored as .12299990…: rounding to the microsecond
	// gives back the digits the producer wrote, where cutting to nanoseconds
	// would count half of all millisecond timestamps 1 ms early.
	// time.Unix carries a rounded-up 1e6 µs into the next second.
	return time.Unix(int64(sec), int64(math.Round(frac*1e6))*1e3)
}

// Fill gives the event the time and user it lacks, where known: at (zero
// for unknown) as its timestamp, userID ("" for unknown) as its user. What
// the event says itself is kept.
func (e *Event) Fill(at time.Time, userID string) {
	if e.Timestamp == nil && !at.IsZero() {
		// Hawk's times are whole seconds, or milliseconds at most: Time
		// gives them back exactly.
		ts := float64(at.UnixMilli()) / 1000
		e.Timestamp = &ts
	}
	if e.UserID() == "" && userID != "" {
		e.User = &User{ID: userID}
	}
}

// ShortTitle is the title cut to MaxTitle bytes, for notifications.
func (e *Event) ShortTitle() string {
	return truncate(e.Title, MaxTitle)
}

// maxUserID is the longest user id kept as it is. Rules that count users
// keep one sorted-set member per user, up to their threshold: a longer id
// is replaced by its hash, so a member costs tens of bytes, not kilobytes.
const maxUserID = 128

// maxRepetitionID is the longest repetitionId notifications carry as it
// is. Hawk's are ObjectIds (24 bytes); the field has no limit of its own,
// and a 200 KB one was copied into every channel's message.
const maxRepetitionID = 128

// ShortRepetitionID is the repetitionId for notifications: nil when there
// is none, as it is up to 128 bytes, else "sha256:" and the hex of its
// SHA-256, so that distinct ids stay distinct and a receiver can still
// recognise one it has.
func (e *Event) ShortRepetitionID() *string {
	id := e.RepetitionID
	if id == nil || len(*id) <= maxRepetitionID {
		return id
	}
	sum := sha256.Sum256([]byte(*id))
	short := "sha256:" + hex.EncodeToString(sum[:])
	return &short
}

// UserID is the affected user's id, or "".
func (e *Event) UserID() string {
	if e.User == nil {
		return ""
	}
	if id := e.User.ID; len(id) > maxUserID {
		sum := sha256.Sum256([]byte(id))
		return "sha256:" + hex.EncodeToString(sum[:16])
	}
	return e.User.ID
}

// Decode parses and validates a message. The error says what is wrong in
// words fit for the x-klaxon-error header of a dead letter.
func Decode(body []byte) (Message, error) {
	var m Message
	if len(body) > MaxSize {
		return m, fmt.Errorf("message of %d bytes is over the %d byte limit", len(body), MaxSize)
	}
	if !utf8.Valid(body) {
		return m, errors.New("message is not valid UTF-8")
	}
	// Read as the producer's JavaScript reads it (JSON.parse): names
	// exactly, and the last of a name given twice. Refusing such a
	// message would lose an event to a producer's quirk.
	if err := json.Unmarshal(body, &m, jsontext.AllowDuplicateNames(true)); err != nil {
		return m, fmt.Errorf("message is not a JSON object of Hawk's format: %w", err)
	}
	switch {
	case m.ProjectID == "":
		return m, errors.New("projectId is missing")
	case !IsObjectID(m.ProjectID):
		return m, fmt.Errorf("projectId %q is not a 24-hex ObjectId", truncate(m.ProjectID, 40))
	case m.Event.GroupHash == "":
		return m, errors.New("event.groupHash is missing")
	case len(m.Event.GroupHash) > 200:
		return m, fmt.Errorf("event.groupHash is %d bytes long, over 200", len(m.Event.GroupHash))
	case m.Event.Title == "":
		return m, errors.New("event.title is missing")
	}
	if ts := m.Event.Timestamp; ts != nil && (math.IsNaN(*ts) || *ts <= 0 || *ts > 1e11) {
		return m, fmt.Errorf("event.timestamp %v is not Unix seconds", *ts)
	}
	// Counter keys and firing ids are built from the project id: an
	// upper-case spelling of a project must count with the lower-case one
	// (the form Hawk writes and the rule store keys by), not apart from it.
	m.ProjectID = strings.ToLower(m.ProjectID)
	return m, nil
}

// IsObjectID reports whether s is a MongoDB ObjectId in hex.
func IsObjectID(s string) bool {
	if len(s) != 24 {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// truncate cuts s to at most n bytes without splitting a character.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
