package seal

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

func newKeyText(t *testing.T) string {
	t.Helper()
	b := make([]byte, KeySize)
	rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

const slackURL = "https://hooks.slack.com/services/T000/B000/XXXXsecretXXXX"

func TestSealOpens(t *testing.T) {
	ks, err := Parse(newKeyText(t))
	if err != nil {
		t.Fatal(err)
	}
	a, b := ks.Seal(slackURL, "p1", "slack"), ks.Seal(slackURL, "p1", "slack")
	if !Sealed(a) || strings.Contains(a, "secret") || a == b {
		t.Fatalf("sealed %q and %q: want two different sealed values without the URL", a, b)
	}
	if got, err := ks.Open(a, "p1", "slack"); err != nil || got != slackURL {
		t.Fatalf("Open = %q, %v", got, err)
	}
	// Bound to its project and channel: copied into another job, it fails.
	for _, pc := range [][2]string{{"p2", "slack"}, {"p1", "webhook"}} {
		if _, err := ks.Open(a, pc[0], pc[1]); err == nil || strings.Contains(err.Error(), "secret") {
			t.Errorf("Open for %v = %v, want a failure that does not show the endpoint", pc, err)
		}
	}
	// A clear value (a job from before the key was set) is used as it is.
	if got, err := ks.Open("ops@example.com", "p1", "email"); err != nil || got != "ops@example.com" {
		t.Errorf("Open(clear) = %q, %v", got, err)
	}
}

// The first key seals, every key opens: rotation puts the new key first
// and keeps the old one until no job sealed with it is left.
func TestRotation(t *testing.T) {
	old, next := newKeyText(t), newKeyText(t)
	before, _ := Parse(old)
	during, err := Parse(next + ", " + old)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := Parse(next)
	sealedOld := before.Seal(slackURL, "p", "slack")
	sealedNew := during.Seal(slackURL, "p", "slack")
	if got, err := during.Open(sealedOld, "p", "slack"); err != nil || got != slackURL {
		t.Errorf("old value during rotation: %q, %v", got, err)
	}
	if got, err := after.Open(sealedNew, "p", "slack"); err != nil || got != slackURL {
		t.Errorf("new value after rotation: %q, %v", got, err)
	}
	_, err = after.Open(sealedOld, "p", "slack")
	if !errors.Is(err, ErrUnknownKey) || !strings.Contains(err.Error(), "key id") {
		t.Errorf("old value after its key went: %v, want ErrUnknownKey naming the key id", err)
	}
	var none *Keys
	if _, err := none.Open(sealedOld, "p", "slack"); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("sealed value without keys: %v, want ErrUnknownKey", err)
	}
	if got := none.Seal(slackURL, "p", "slack"); got != slackURL {
		t.Errorf("Seal without keys = %q, want the endpoint as it is", got)
	}
}

func TestParseRefusesBadKeys(t *testing.T) {
	short := base64.StdEncoding.EncodeToString(make([]byte, 16))
	k := newKeyText(t)
	for list, want := range map[string]string{
		"not base64!":   "key 1 is not base64",
		k + "," + short: "key 2 is 16 bytes, want 32",
		k + "," + k:     "key 2 is listed twice",
	} {
		_, err := Parse(list)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%.12s…) = %v, want %q", list, err, want)
		}
		if err != nil && strings.Contains(err.Error(), k) {
			t.Errorf("the error shows a key: %v", err)
		}
	}
	if ks, err := Parse(" "); ks != nil || err != nil {
		t.Errorf("Parse(empty) = %v, %v; want no keys", ks, err)
	}
}

func TestOpenRefusesMalformed(t *testing.T) {
	ks, _ := Parse(newKeyText(t))
	s := ks.Seal(slackURL, "p", "slack")
	id := strings.Split(s, ":")[2]
	for _, bad := range []string{Prefix + "nokey", Prefix + id + ":!!", Prefix + id + ":AAAA", s[:len(s)-2] + "AA"} {
		if _, err := ks.Open(bad, "p", "slack"); err == nil {
			t.Errorf("Open(%q) opened", bad)
		}
	}
}

// A tag names an endpoint in Redis: without keys the plain SHA-256 of
// before; with one, a keyed digest that guessing an address cannot match.
func TestTag(t *testing.T) {
	var none *Keys
	plain := sha256.Sum256([]byte("ops@example.com"))
	if !bytes.Equal(none.Tag("ops@example.com"), plain[:]) {
		t.Error("without keys the tag is not the endpoint's SHA-256")
	}
	a, err := Parse(newKeyText(t))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse(newKeyText(t))
	if err != nil {
		t.Fatal(err)
	}
	ta := a.Tag("ops@example.com")
	switch {
	case bytes.Equal(ta, plain[:]):
		t.Error("with a key the tag is the plain SHA-256: a guess would match it")
	case !bytes.Equal(ta, a.Tag("ops@example.com")):
		t.Error("one key gives two tags for one endpoint")
	case bytes.Equal(ta, a.Tag("dev@example.com")):
		t.Error("two endpoints share a tag")
	case bytes.Equal(ta, b.Tag("ops@example.com")):
		t.Error("two keys give one tag")
	}
}
