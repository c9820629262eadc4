// Command devmongo runs a local MongoDB stand-in for development: FerretDB
// (the embeddable github.com/FerretDB/FerretDB/ferretdb package) over SQLite
// files in a directory. The official MongoDB drivers, mongosh and the Klaxon
// worker talk to it unchanged.
//
//	go run ./tools/devmongo                      # 127.0.0.1:27017, data in ./.data/ferretdb
//	go run ./tools/devmongo -listen 127.0.0.1:27018 -dir /tmp/klaxon-mongo
//
// Settings: -listen [127.0.0.1:27017] (env KLAXON_DEVMONGO_LISTEN) and
// -dir [./.data/ferretdb] (env KLAXON_DEVMONGO_DIR); a flag wins over its
// variable. It logs one JSON line with the MongoDB URI when it accepts
// connections and runs until SIGINT or SIGTERM. FerretDB's own logging is
// limited to warnings and errors.
//
// It is a development tool: no authentication, no TLS. Use a real MongoDB
// (docker-compose.yml) for anything else.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "devmongo:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("devmongo failed", "err", err)
		stop()
		os.Exit(1)
	}
}

type config struct {
	listen string // host:port
	dir    string // SQLite data directory
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("devmongo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := config{
		listen: or(getenv("KLAXON_DEVMONGO_LISTEN"), "127.0.0.1:27017"),
		dir:    or(getenv("KLAXON_DEVMONGO_DIR"), filepath.Join(".data", "ferretdb")),
	}
	fs.StringVar(&cfg.listen, "listen", cfg.listen, "TCP address to listen on (env KLAXON_DEVMONGO_LISTEN)")
	fs.StringVar(&cfg.dir, "dir", cfg.dir, "directory of the SQLite data files, created if missing (env KLAXON_DEVMONGO_DIR)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if strings.TrimSpace(cfg.listen) == "" {
		return config{}, errors.New("-listen (KLAXON_DEVMONGO_LISTEN) is empty")
	}
	if strings.TrimSpace(cfg.dir) == "" {
		return config{}, errors.New("-dir (KLAXON_DEVMONGO_DIR) is empty")
	}
	return cfg, nil
}

// serve runs FerretDB until ctx is done.
func serve(ctx context.Context, cfg config, log *slog.Logger) error {
	dir, err := filepath.Abs(cfg.dir)
	if err != nil {
		return fmt.Errorf("data directory %s: %w", cfg.dir, err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: cfg.listen},
		Logger:    ferretLogger(log),
		Handler:   "sqlite",
		SQLiteURL: sqliteURL(dir),
	})
	if err != nil {
		return fmt.Errorf("start FerretDB on %s: %w", cfg.listen, err)
	}
	// New has bound the listener already, so the URI is known and
	// connections are accepted (queued by the kernel until Run serves them).
	log.Info("devmongo ready", "uri", f.MongoDBURI(), "dir", dir)
	if err := f.Run(ctx); err != nil {
		return fmt.Errorf("run FerretDB: %w", err)
	}
	log.Info("devmongo stopped")
	return nil
}

// sqliteURL is FerretDB's SQLite handler URI for the directory dir (an
// absolute path): "file:" + dir + "/", escaped.
func sqliteURL(dir string) string {
	u := url.URL{Scheme: "file", Path: strings.TrimSuffix(filepath.ToSlash(dir), "/") + "/"}
	return u.String()
}

// ferretLogger is the logger FerretDB gets: the handler of log, keeping only
// warnings and errors, tagged with the component.
func ferretLogger(log *slog.Logger) *slog.Logger {
	return slog.New(minLevel{Handler: log.Handler(), min: slog.LevelWarn}).With("component", "ferretdb")
}

// minLevel drops records below min before they reach Handler.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{Handler: h.Handler.WithAttrs(attrs), min: h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{Handler: h.Handler.WithGroup(name), min: h.min}
}

func or(s, fallback string) string {
	if s != "" {
		return s
	}
	return fallback
}
