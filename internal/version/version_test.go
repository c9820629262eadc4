package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

// A build with VCS stamping says its version, commit and time.
func TestStringOfAStampedBuild(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.4.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "3f9c0a6e1b2d4c5e6f708192a3b4c5d6e7f80912"},
		{Key: "vcs.time", Value: "2026-03-01T10:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	got := fromBuildInfo(bi, Info{Version: "(devel)", Commit: "unknown", Time: "unknown"}).String()
	want := "v1.4.0 (commit 3f9c0a6e1b2d+modified, committed 2026-03-01T10:00:00Z, go1.26.8)"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// A build without VCS information (go build -buildvcs=false, a tarball)
// still answers, with "(devel)" and "unknown" rather than empty fields.
func TestStringOfABareBuild(t *testing.T) {
	got := fromBuildInfo(&debug.BuildInfo{Main: debug.Module{}}, Info{Version: "(devel)", Commit: "unknown", Time: "unknown", Go: "go1.26.8"}).String()
	if got != "(devel) (commit unknown, committed unknown, go1.26.8)" {
		t.Errorf("got %q", got)
	}
	if s := Read().String(); !strings.Contains(s, "commit ") {
		t.Errorf("Read of the test binary: %q", s)
	}
}
