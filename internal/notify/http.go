package notify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/klaxonhq/klaxon/internal/netguard"
)

// UserAgent is sent with every HTTP request a channel makes.
const UserAgent = "Klaxon"

// HTTPError is a response outside 2xx. It names the channel and the status,
// never the URL: Slack and webhook URLs embed their tokens.
type HTTPError struct {
	Channel    string // "webhook", "slack", …
	StatusCode int
	// Reason is the start of the response body on one line, with the URL
	// redacted; providers put the why there ("no_service",
	// "channel_is_archived"). May be empty.
	Reason string
}

func (e *HTTPError) Error() string {
	s := fmt.Sprintf("%s: HTTP %d %s", e.Channel, e.StatusCode, http.StatusText(e.StatusCode))
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// RetryableStatus reports whether a request answered with this status is
// worth repeating unchanged: 5xx, 429 Too Many Requests and 408 Request
// Timeout. Any other 4xx means the request itself is wrong.
func RetryableStatus(code int) bool {
	return code >= 500 || code == http.StatusTooManyRequests || code == http.StatusRequestTimeout
}

// WithRetryAfter annotates err so that it implements RetryAfter, for errors
// from providers that said when to try again. A d <= 0 returns err as is.
func WithRetryAfter(err error, d time.Duration) error {
	if err == nil || d <= 0 {
		return err
	}
	return &retryAfterError{err: err, after: d}
}

type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %s)", e.err, e.after)
}
func (e *retryAfterError) Unwrap() error             { return e.err }
func (e *retryAfterError) RetryAfter() time.Duration { return e.after }

// ParseRetryAfter reads a Retry-After header value, either delay-seconds
// ("120") or an HTTP-date ("Wed, 21 Oct 2015 07:28:00 GMT", RFC 9110
// §10.2.3), relative to now. A date in the past gives 0 and true; an empty
// or malformed value gives false. Delays are capped at a day, so a confused
// server cannot park a message for years.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	const maxDelay = 24 * time.Hour
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return time.Duration(min(secs, int64(maxDelay/time.Second))) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return min(max(t.Sub(now), 0), maxDelay), true
}

// CheckURL reports whether endpoint is an absolute http or https URL. Its
// error does not repeat the URL, which may hold a token.
func CheckURL(channel, endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s: endpoint is not an absolute http(s) URL", channel)
	}
	return nil
}

// TransportError describes an error from an HTTP client without the URL: a
// *url.Error names it, and the URL may hold a token. Whatever the client
// returns is worth retrying (connection refused, reset, timeout), except a
// connection the netguard policy refused, which would be refused again.
func TransportError(channel string, err error) (retry bool, _ error) {
	var refused *netguard.Error
	if errors.As(err, &refused) {
		// Without the "dial tcp …:" around it: the reason says it all.
		return false, fmt.Errorf("%s: %w", channel, refused)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		// ue.Err says what failed ("dial tcp …: connection refused",
		// "context deadline exceeded") without the path or query.
		err = ue.Err
	}
	return true, fmt.Errorf("%s: request failed: %w", channel, err)
}

// PostJSON POSTs body, encoded as JSON, to endpoint with header added, and
// says whether a failure is worth retrying: network errors, timeouts, 5xx,
// 408 and 429 are; other 4xx, a 3xx (redirects are not followed), a
// malformed endpoint and one the client's netguard policy refuses are not.
// A retryable status with Retry-After (429, 503) yields an error
// implementing RetryAfter. Errors name the channel and status, never the
// endpoint.
func PostJSON(ctx context.Context, client *http.Client, channel, endpoint string, header http.Header, body any) (retry bool, err error) {
	data, err := json.Marshal(body)
	if err != nil {
		return false, fmt.Errorf("%s: encode body: %w", channel, err)
	}
	return post(ctx, client, channel, endpoint, header, "application/json", data)
}

// PostForm is PostJSON for a form body (application/x-www-form-urlencoded).
func PostForm(ctx context.Context, client *http.Client, channel, endpoint string, form url.Values) (retry bool, err error) {
	return post(ctx, client, channel, endpoint, nil, "application/x-www-form-urlencoded", []byte(form.Encode()))
}

func post(ctx context.Context, client *http.Client, channel, endpoint string, header http.Header, contentType string, data []byte) (retry bool, err error) {
	if err := CheckURL(channel, endpoint); err != nil {
		return false, err
	}
	if err := netguard.CheckEndpoint(endpoint, nil, ""); err != nil {
		return false, fmt.Errorf("%s: %w", channel, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(data))
	if err != nil {
		return false, fmt.Errorf("%s: build request: %w", channel, err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("User-Agent", UserAgent)
	for k, vs := range header {
		req.Header[http.CanonicalHeaderKey(k)] = vs
	}
	resp, err := NoRedirects(client).Do(req)
	if err != nil {
		return TransportError(channel, err)
	}
	return CheckResponse(channel, resp, URLSecrets(endpoint)...)
}

// NoRedirects returns a copy of client (sharing its transport) that follows
// no redirect: the 3xx is the answer, reported as a permanent failure. A
// 301-303 would turn the POST into a GET whose 2xx passes for a delivery; a
// 307 or 308 would repeat the POST wherever the endpoint points, inside
// Klaxon's network too, with the original URL in its Referer. A nil client
// stands for http.DefaultClient.
func NoRedirects(client *http.Client) *http.Client {
	if client == nil {
		client = http.DefaultClient
	}
	c := *client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &c
}

// RedirectReason is the reason of an HTTPError for a 3xx.
const RedirectReason = "the endpoint redirected, and Klaxon follows no redirect: put the final URL in the rule"

// CheckResponse classifies resp the way PostJSON does, and drains and closes
// its body so the connection can be reused. Secrets (the request URL and its
// parts) are redacted from the reason taken from the body.
func CheckResponse(channel string, resp *http.Response, secrets ...string) (retry bool, err error) {
	defer Drain(resp)
	if resp.StatusCode/100 == 2 {
		return false, nil
	}
	herr := &HTTPError{Channel: channel, StatusCode: resp.StatusCode}
	if resp.StatusCode/100 == 3 {
		// Not the body: a redirect page repeats where it points.
		herr.Reason = RedirectReason
	} else {
		herr.Reason = ReadReason(resp.Body, secrets...)
	}
	if !RetryableStatus(resp.StatusCode) {
		return false, herr
	}
	d, _ := ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	return true, WithRetryAfter(herr, d)
}

// Drain reads what is left of resp's body, up to a bound, and closes it:
// an unread body keeps the connection from being reused.
func Drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}

const maxReason = 256

// ReadReason returns the start of an error response's body as one line of
// valid UTF-8 with secrets replaced, for the reason of an HTTPError.
func ReadReason(r io.Reader, secrets ...string) string {
	b, _ := io.ReadAll(io.LimitReader(r, 4*maxReason))
	s := strings.ToValidUTF8(string(b), "")
	s = strings.Join(strings.Fields(s), " ")
	s = Redact(s, secrets...)
	if len(b) == 4*maxReason {
		// The body may go on: a secret cut by the limit escapes Redact,
		// and whitespace shrinking can bring its start into view.
		s = cutSecretStart(s, secrets...)
	}
	if len(s) > maxReason {
		cut := maxReason
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// cutSecretStart removes from the end of s the longest start of a secret
// it ends with, for a text cut at an arbitrary point.
func cutSecretStart(s string, secrets ...string) string {
	for _, secret := range secrets {
		for k := min(len(secret)-1, len(s)); k > 0; k-- {
			if strings.HasSuffix(s, secret[:k]) {
				s = s[:len(s)-k]
				break
			}
		}
	}
	return s
}

// Redact replaces every occurrence of each secret in s with "[redacted]".
// Empty secrets are ignored.
func Redact(s string, secrets ...string) string {
	for _, secret := range secrets {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "[redacted]")
		}
	}
	return s
}

// RedactError returns err unchanged when its message holds none of the
// secrets, and otherwise an error with the same message redacted. The
// redacted error deliberately does not wrap err, whose chain would still
// hold the secret: classify before redacting.
func RedactError(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := Redact(msg, secrets...); red != msg {
		return errors.New(red)
	}
	return err
}

// URLSecrets lists the parts of a URL that may hold its token and that a
// server might echo back (a 404 page saying "Cannot POST /hooks/<token>"),
// for Redact and RedactError.
func URLSecrets(endpoint string) []string {
	secrets := []string{endpoint}
	u, err := url.Parse(endpoint)
	if err != nil {
		return secrets
	}
	if len(u.EscapedPath()) > 1 {
		secrets = append(secrets, u.EscapedPath())
		if u.Path != u.EscapedPath() {
			secrets = append(secrets, u.Path)
		}
	}
	if u.RawQuery != "" {
		secrets = append(secrets, u.RawQuery)
	}
	if u.User != nil {
		secrets = append(secrets, u.User.String())
	}
	return secrets
}
