package config

import (
	"os/exec"
	"strings"
	"testing"
)

// config is read by every layer: it may import no notification channel, or
// a channel's imports become the whole program's and the layers a cycle
// away. What a channel and config share (smtptls) lives below both.
func TestConfigImportsNoChannel(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the imports with")
	}
	out, err := exec.Command(gobin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		if strings.HasPrefix(dep, "github.com/klaxonhq/klaxon/internal/notify/") {
			t.Errorf("internal/config imports %s, a channel's package", dep)
		}
	}
}
