// Package version says which build of Klaxon a binary is, from what the Go
// toolchain records in it (runtime/debug.ReadBuildInfo): the module
// version, the VCS commit and its time. Nothing is stamped in by hand, so a
// binary built any way (go build, go install, the image) answers the same.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Info is what a binary knows of its build.
type Info struct {
	Version  string // the module version, "(devel)" for a build from a checkout
	Commit   string // the VCS commit, "unknown" when not recorded
	Time     string // the commit's time (vcs.time), "unknown" when not recorded
	Modified bool   // the work tree had changes not committed
	Go       string // the Go toolchain's version
}

// Read reads the build information of the running binary.
func Read() Info {
	info := Info{Version: "(devel)", Commit: "unknown", Time: "unknown", Go: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	return fromBuildInfo(bi, info)
}

func fromBuildInfo(bi *debug.BuildInfo, info Info) Info {
	if v := bi.Main.Version; v != "" {
		info.Version = v
	}
	if bi.GoVersion != "" {
		info.Go = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if s.Value != "" {
				info.Commit = s.Value
			}
		case "vcs.time":
			if s.Value != "" {
				info.Time = s.Value
			}
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// String is the line --version prints after the binary's name, e.g.
// "v1.4.0 (commit 3f9c0a6e1b2d, built from a commit of 2026-03-01T10:00:00Z, go1.26.8)".
func (i Info) String() string {
	commit := i.Commit
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if i.Modified {
		commit += "+modified"
	}
	return fmt.Sprintf("%s (commit %s, committed %s, %s)", i.Version, commit, i.Time, i.Go)
}
