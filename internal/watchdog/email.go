package watchdog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// TextMailer sends a plain-text mail; email.Notifier's SendText.
type TextMailer interface {
	SendText(ctx context.Context, to, subject, body string) error
}

// Email sends alerts to the addresses To (KLAXON_OPERATOR_EMAIL) through
// the worker's SMTP server.
type Email struct {
	To     string
	Mailer TextMailer
}

// Notify mails a: its summary as the subject, its facts as the body.
func (e *Email) Notify(ctx context.Context, a Alert) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s.\n\n", a.Summary)
	for _, r := range a.Reasons {
		fmt.Fprintf(&b, "- %s\n", r)
	}
	fmt.Fprintf(&b, "\nIncident: %s (%s)\nSince: %s\nAt: %s\nWorker: %s\n", a.Incident, a.State,
		a.Since.UTC().Format(time.RFC3339), a.At.UTC().Format(time.RFC3339), a.Worker)
	return e.Mailer.SendText(ctx, e.To, a.Summary, b.String())
}

// Each sends an alert through every one of its notifiers. When some fail
// and others sent it, the error is a *PartialError: the alert counts as
// sent, since a retry for one destination's sake would repeat it on the
// others.
type Each []Notifier

// PartialError is Each's error when not all of its notifiers failed.
type PartialError struct{ Err error }

func (e *PartialError) Error() string { return "sent, but not everywhere: " + e.Err.Error() }
func (e *PartialError) Unwrap() error { return e.Err }

func (ns Each) Notify(ctx context.Context, a Alert) error {
	var errs []error
	for _, n := range ns {
		if err := n.Notify(ctx, a); err != nil {
			errs = append(errs, err)
		}
	}
	switch len(errs) {
	case 0:
		return nil
	case len(ns):
		return errors.Join(errs...)
	}
	return &PartialError{errors.Join(errs...)}
}
