// Package seal keeps endpoints (Slack webhook URLs are secrets, email
// addresses personal data) out of the queues and Redis in clear: the
// evaluator seals each endpoint it puts in a delivery job, and the
// deliverer opens it just before the send. Everything the job passes
// through (the delivery and retry queues, <prefix>.failed, a digest's
// pending firings in Redis) then holds only the sealed form.
//
// A sealed endpoint is "sealed:v1:<key id>:<base64url(nonce | ciphertext)>",
// AES-256-GCM with a random 96-bit nonce, bound to the job's project and
// channel (additional data), so a sealed value copied into another
// project's or channel's job does not open. The key id is the first 4 bytes
// of the key's SHA-256, in hex: it names the key without revealing it, so
// that a value sealed with a key no longer configured fails with a reason
// saying which.
//
// A Keys holds one or more keys: the first seals, every one opens, so a key
// is rotated by putting the new one first and dropping the old one once
// no job sealed with it remains (the longest retry, about 17 minutes, plus
// a minPeriod and a snooze's summary wait). A nil *Keys seals nothing and
// opens only clear values: the behaviour without KLAXON_ENDPOINT_KEY.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Prefix starts every sealed value; the version in it names the format.
const Prefix = "sealed:v1:"

// KeySize is the size of a key: AES-256.
const KeySize = 32

// ErrUnknownKey is why a value sealed with a key that is not configured
// does not open.
var ErrUnknownKey = errors.New("sealed with a key that KLAXON_ENDPOINT_KEY does not hold")

// Keys are the keys endpoints are sealed and opened with.
type Keys struct {
	keys []key // keys[0] seals
}

type key struct {
	id   string
	aead cipher.AEAD
	tag  []byte // HMAC key of Tag, derived from the key
}

// Parse reads a comma-separated list of base64 keys of 32 bytes each (the
// standard or URL alphabet, padded or not). An empty list gives nil: no
// sealing. Errors say which key is wrong, never what it holds.
func Parse(list string) (*Keys, error) {
	var ks Keys
	seen := map[string]bool{}
	for i, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		raw, err := decodeKey(f)
		if err != nil {
			return nil, fmt.Errorf("key %d is not base64", i+1)
		}
		if len(raw) != KeySize {
			return nil, fmt.Errorf("key %d is %d bytes, want %d (e.g. openssl rand -base64 32)", i+1, len(raw), KeySize)
		}
		k, err := newKey(raw)
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", i+1, err)
		}
		if seen[k.id] {
			return nil, fmt.Errorf("key %d is listed twice", i+1)
		}
		seen[k.id] = true
		ks.keys = append(ks.keys, k)
	}
	if len(ks.keys) == 0 {
		return nil, nil
	}
	return &ks, nil
}

func decodeKey(s string) ([]byte, error) {
	var err error
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		var b []byte
		if b, err = enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	return nil, err
}

func newKey(raw []byte) (key, error) {
	block, err := aes.NewCipher(raw)
	if err != nil {
		return key{}, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return key{}, err
	}
	sum := sha256.Sum256(raw)
	tag := sha256.Sum256(append([]byte("klaxon endpoint tag\x00"), raw...))
	return key{id: hex.EncodeToString(sum[:4]), aead: aead, tag: tag[:]}, nil
}

// Tag is a digest of endpoint that tells endpoints apart without showing
// them, for names kept in Redis (a destination's pace): HMAC-SHA-256 under
// a key derived from the sealing key, since a plain hash of an email
// address or a chat id is undone by guessing. Without keys it is SHA-256.
// A new sealing key changes every tag: what is keyed by them (a pace)
// starts afresh.
func (ks *Keys) Tag(endpoint string) []byte {
	if ks == nil {
		sum := sha256.Sum256([]byte(endpoint))
		return sum[:]
	}
	m := hmac.New(sha256.New, ks.keys[0].tag)
	m.Write([]byte(endpoint))
	return m.Sum(nil)
}

// Sealed reports whether s is a sealed value.
func Sealed(s string) bool { return strings.HasPrefix(s, Prefix) }

// Seal seals endpoint for a job of project on channel with the first key.
// Without keys it returns endpoint as it is.
func (ks *Keys) Seal(endpoint, project, channel string) string {
	if ks == nil || endpoint == "" {
		return endpoint
	}
	k := ks.keys[0]
	nonce := make([]byte, k.aead.NonceSize(), k.aead.NonceSize()+len(endpoint)+k.aead.Overhead())
	_, _ = rand.Read(nonce) // never fails (crypto/rand)
	sealed := k.aead.Seal(nonce, nonce, []byte(endpoint), aad(project, channel))
	return Prefix + k.id + ":" + base64.RawURLEncoding.EncodeToString(sealed)
}

// Open returns the endpoint s holds for a job of project on channel: s
// itself when it is not sealed (a job from before the key was set), else
// what it was sealed from. The error says what is wrong without the value.
func (ks *Keys) Open(s, project, channel string) (string, error) {
	rest, ok := strings.CutPrefix(s, Prefix)
	if !ok {
		return s, nil
	}
	id, data, ok := strings.Cut(rest, ":")
	if !ok {
		return "", errors.New("sealed endpoint is malformed")
	}
	var k *key
	if ks != nil {
		for i := range ks.keys {
			if ks.keys[i].id == id {
				k = &ks.keys[i]
			}
		}
	}
	if k == nil {
		return "", fmt.Errorf("endpoint %w (key id %.8s)", ErrUnknownKey, id)
	}
	raw, err := base64.RawURLEncoding.DecodeString(data)
	if err != nil || len(raw) < k.aead.NonceSize() {
		return "", errors.New("sealed endpoint is malformed")
	}
	n := k.aead.NonceSize()
	plain, err := k.aead.Open(nil, raw[:n], raw[n:], aad(project, channel))
	if err != nil {
		return "", fmt.Errorf("sealed endpoint does not open with key %s: altered, or sealed for another project or channel", id)
	}
	return string(plain), nil
}

// aad binds a sealed endpoint to its job's project and channel.
func aad(project, channel string) []byte {
	return []byte("klaxon endpoint\x00" + project + "\x00" + channel)
}
