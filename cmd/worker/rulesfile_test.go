package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/klaxonhq/klaxon/internal/store"
)

// The worker's rules file errors name the line the YAML breaks on, as
// klaxon rules check does: yaml.v3 said "line 1" for a slip on line 4.
func TestRulesFileErrorNamesTheLine(t *testing.T) {
	path := t.TempDir() + "/rules.yml"
	doc := "5e3eef0679fa3700a0198a49:\n  - id: a\n    isEnabled: true\n   whatToReceive: ONLY_NEW\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := rulesFile{store.NewFileSource(path)}.Load(context.Background())
	if err == nil || !strings.Contains(err.Error(), "yaml: line 4: ") {
		t.Errorf("load: %v, want the error on line 4", err)
	}
	if err := os.WriteFile(path, []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (rulesFile{store.NewFileSource(path)}).Load(context.Background()); err != nil {
		t.Errorf("a good file: %v", err)
	}
}
