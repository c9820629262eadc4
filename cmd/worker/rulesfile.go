package main

import (
	"context"
	"os"

	"github.com/klaxonhq/klaxon/internal/store"
)

// rulesFile is the rules file source, whose YAML syntax errors name the
// line they are on: yaml.v3 names the line of the enclosing block, and an
// indentation slip on line 40 read "line 1" in the log.
type rulesFile struct{ *store.FileSource }

func (f rulesFile) Load(ctx context.Context) (store.Specs, error) {
	specs, err := f.FileSource.Load(ctx)
	if err == nil {
		return specs, nil
	}
	data, rerr := os.ReadFile(f.Path())
	if rerr != nil {
		return specs, err
	}
	if msg := store.CorrectYAMLLine(err.Error(), data); msg != err.Error() {
		return specs, &lineError{msg: msg, err: err}
	}
	return specs, err
}

// lineError is err with its text corrected.
type lineError struct {
	msg string
	err error
}

func (e *lineError) Error() string { return e.msg }
func (e *lineError) Unwrap() error { return e.err }
