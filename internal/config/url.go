package config

import (
	"errors"
	"net/url"
	"strings"
	"unicode"
)

// redacted replaces a secret wherever Klaxon prints configuration, as
// net/url's URL.Redacted does.
const redacted = "xxxxx"

// urlParts is a URL split by hand, because the standard parser takes only one
// host and Redis and MongoDB URLs may list several.
type urlParts struct {
	scheme   string   // lower case
	userinfo string   // as written (still percent-encoded); "" when there is none
	hasUser  bool     // the URL has user info (maybe empty, as in "redis://@host")
	hosts    []string // the authority after the user info, split at commas
	rest     string   // everything after the authority: path, query and fragment
}

// splitURL splits scheme://[userinfo@]host[,host...][/path][?query][#fragment].
// Its errors never quote the input: the user info may hold a password, and a
// password with an unescaped reserved character moves it elsewhere.
func splitURL(raw string) (urlParts, error) {
	scheme, after, ok := strings.Cut(raw, "://")
	if !ok || scheme == "" || strings.IndexFunc(scheme, func(r rune) bool {
		return !(r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r) || r == '+' || r == '-' || r == '.'))
	}) >= 0 {
		return urlParts{}, errors.New("is not a URL of the form scheme://host/...")
	}
	if strings.IndexFunc(raw, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return urlParts{}, errors.New("contains white space; percent-encode it (%20)")
	}
	p := urlParts{scheme: strings.ToLower(scheme)}

	end := strings.IndexAny(after, "/?#")
	if end < 0 {
		end = len(after)
	}
	authority := after[:end]
	p.rest = after[end:]
	if strings.Contains(p.rest, "@") {
		return urlParts{}, errors.New("has an @ after the host: percent-encode @ : / ? # in the user name and password (%40 %3A %2F %3F %23)")
	}
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		p.userinfo, p.hasUser = authority[:i], true
		authority = authority[i+1:]
		if _, _, err := userPassword(p.userinfo); err != nil {
			return urlParts{}, err
		}
	}
	p.hosts = strings.Split(authority, ",")
	return p, nil
}

// userPassword decodes user info the way net/url does.
func userPassword(userinfo string) (user, password string, err error) {
	u, err := url.Parse("x://" + userinfo + "@h")
	if err != nil || u.User == nil {
		return "", "", errors.New("the user name or password is not valid: percent-encode reserved characters such as @ : / ? # % (%40 %3A %2F %3F %23 %25)")
	}
	password, _ = u.User.Password()
	return u.User.Username(), password, nil
}

// urlUnescape is url.PathUnescape with an error that does not quote its input.
func urlUnescape(s string) (string, error) {
	v, err := url.PathUnescape(s)
	if err != nil {
		return "", errors.New("invalid percent-encoding")
	}
	return v, nil
}

// innerURLError drops the URL that *url.Error quotes in full, credentials
// and all.
func innerURLError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// sensitiveParam reports whether a query parameter carries a credential
// (Redis sentinel_password, MongoDB authMechanismProperties, ...).
func sensitiveParam(key string) bool {
	k := strings.ToLower(key)
	for _, s := range []string{"password", "secret", "token", "authmechanismproperties"} {
		if strings.Contains(k, s) {
			return true
		}
	}
	return false
}

// redactURL returns raw with its user info and credential parameters
// replaced by xxxxx. A value that is not a URL is replaced whole.
func redactURL(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := splitURL(raw)
	if err != nil {
		return redacted
	}
	var b strings.Builder
	b.WriteString(u.scheme)
	b.WriteString("://")
	if u.hasUser {
		b.WriteString(redacted + "@")
	}
	b.WriteString(strings.Join(u.hosts, ","))

	rest, fragment, hasFragment := strings.Cut(u.rest, "#")
	path, query, hasQuery := strings.Cut(rest, "?")
	b.WriteString(path)
	if hasQuery {
		b.WriteByte('?')
		pairs := strings.Split(query, "&")
		for i, pair := range pairs {
			k, _, _ := strings.Cut(pair, "=")
			if key, err := url.QueryUnescape(k); err != nil || sensitiveParam(key) {
				pairs[i] = k + "=" + redacted
			}
		}
		b.WriteString(strings.Join(pairs, "&"))
	}
	if hasFragment {
		b.WriteByte('#')
		b.WriteString(fragment)
	}
	return b.String()
}

// secretParts returns the substrings of a secret-bearing value that must never
// be printed: for a URL, all text before its last @ (whatever delimiters a
// careless password put in it) and credential parameters; for anything else,
// the whole value. Very short strings are left out, since scrubbing them
// would garble messages without protecting anything.
func secretParts(raw string) []string {
	var out []string
	add := func(s string) {
		if len(s) < 3 {
			return
		}
		out = append(out, s)
		for _, unescape := range []func(string) (string, error){url.PathUnescape, url.QueryUnescape} {
			if v, err := unescape(s); err == nil && v != s && len(v) >= 3 {
				out = append(out, v)
			}
		}
	}
	_, after, isURL := strings.Cut(raw, "://")
	if !isURL {
		add(raw)
		return out
	}
	if i := strings.LastIndex(after, "@"); i >= 0 {
		info := after[:i]
		add(info)
		if _, pass, ok := strings.Cut(info, ":"); ok {
			add(pass)
		}
	}
	if _, query, ok := strings.Cut(after, "?"); ok {
		query, _, _ = strings.Cut(query, "#")
		for pair := range strings.SplitSeq(query, "&") {
			k, v, _ := strings.Cut(pair, "=")
			if key, err := url.QueryUnescape(k); err != nil || sensitiveParam(key) {
				add(v)
			}
		}
	}
	return out
}
