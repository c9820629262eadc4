package config

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"
)

// mongoURL is a MongoDB URL, going into url, and the database its path
// names, into db: defDB when it names none. The default URL, when there is
// one, names defDB.
func mongoURL(url, db *string, def, defDB string) value {
	return value{
		def: def,
		read: func(l *loader, s setting) {
			*url, *db = def, ""
			if def != "" {
				*db = defDB
			}
			if !s.set() {
				return
			}
			name, err := parseMongoURL(s.value)
			if err != nil {
				l.fail(s, err.Error())
			}
			if name == "" {
				name = defDB
			}
			*url, *db = s.value, name
		},
		show: func() slog.Value { return slog.StringValue(*url) },
	}
}

// parseMongoURL checks the parts of a MongoDB connection string Klaxon relies
// on and returns the database its path names, "" when it names none. The
// driver validates the options when it connects; it is not called here
// because a mongodb+srv URL would make it look up DNS.
func parseMongoURL(raw string) (string, error) {
	u, err := splitURL(raw)
	if err != nil {
		return "", err
	}
	switch u.scheme {
	case "mongodb":
		for _, h := range u.hosts {
			if err := checkHostPort(h, false); err != nil {
				return "", err
			}
		}
	case "mongodb+srv":
		if len(u.hosts) != 1 || strings.Contains(u.hosts[0], ":") {
			return "", errors.New("a mongodb+srv URL names exactly one host name, without a port")
		}
		if err := checkHostPort(u.hosts[0], false); err != nil {
			return "", err
		}
	default:
		return "", fmt.Errorf("scheme %q is not one of mongodb, mongodb+srv", u.scheme)
	}
	if u.rest != "" && !strings.HasPrefix(u.rest, "/") {
		return "", errors.New(`needs a "/" between the hosts and the options, as in mongodb://host:27017/hawk?replicaSet=rs0`)
	}
	path, _, _ := strings.Cut(u.rest, "?")
	db, err := urlUnescape(strings.TrimPrefix(path, "/"))
	if err != nil {
		return "", fmt.Errorf("database name in the path: %w", err)
	}
	if db != "" && (strings.ContainsAny(db, "/\\. \"$*<>:|?") || len(db) >= 64) {
		return "", fmt.Errorf("database name %q is not valid in MongoDB (no /\\. \"$*<>:|? and under 64 bytes)", db)
	}
	if err := checkMongoOptions(raw, u); err != nil {
		return "", err
	}
	return db, nil
}

// checkMongoOptions has the driver's own parser check the options, as it
// would when the worker builds its client: otherwise a bad option stops the
// worker after it started, in an error naming no variable. The parser looks
// up a mongodb+srv URL's DNS records, which must not decide whether a
// configuration is valid; that form is checked as the mongodb:// URL of the
// same host, without the options only SRV allows.
func checkMongoOptions(raw string, u urlParts) error {
	if u.scheme == "mongodb+srv" {
		_, after, _ := strings.Cut(raw, "://")
		base, query, hasQuery := strings.Cut(after, "?")
		raw = "mongodb://" + base
		if hasQuery {
			var kept []string
			for pair := range strings.SplitSeq(query, "&") {
				k, _, _ := strings.Cut(pair, "=")
				if k := strings.ToLower(k); k != "srvmaxhosts" && k != "srvservicename" {
					kept = append(kept, pair)
				}
			}
			raw += "?" + strings.Join(kept, "&")
		}
	}
	if _, err := connstring.ParseAndValidate(raw); err != nil {
		msg := err.Error()
		for _, prefix := range []string{"error parsing uri: ", "error validating uri: "} {
			msg = strings.TrimPrefix(msg, prefix)
		}
		return errors.New(msg)
	}
	return nil
}
