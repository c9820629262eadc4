package store

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// countReads makes s count how often it reads its file.
func countReads(s *FileSource) *int {
	n := new(int)
	read := s.read
	s.read = func(path string, limit int64) ([]byte, error) {
		*n++
		return read(path, limit)
	}
	return n
}

const oneRule = "5e3eef0679fa3700a0198a49:\n  - {id: rule-1, isEnabled: true, whatToReceive: ONLY_NEW}\n"

// A big rules file reloaded every few seconds must not be read and hashed
// again while it is unchanged: a 122 MB file took the worker from 4.8 to
// 5.4 GB of memory in 25 s. Its size, times and inode say so without a
// read; a file changed in the last seconds is read anyway, since an edit
// within the file system's time granularity leaves them all as they were.
func TestUnchangedFileIsNotReadAgain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(oneRule), 0o600); err != nil {
		t.Fatal(err)
	}
	s := NewFileSource(path)
	reads := countReads(s)
	ctx := t.Context()
	load := func(want int) Specs {
		t.Helper()
		specs, err := s.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if *reads != want {
			t.Fatalf("%d reads, want %d", *reads, want)
		}
		return specs
	}
	// Just written: read at every load, however often.
	load(1)
	load(2)

	// Seen later than the granularity of any file system's clock: read
	// once more, then no more.
	s.now = func() time.Time { return time.Now().Add(time.Hour) }
	first := load(3)
	if again := load(3); again.Digest != first.Digest || len(again.Projects) != 1 {
		t.Errorf("an unread load gave %+v, want what the last read gave", again)
	}

	// An edit in place of the same size whose modification time is set
	// back, as cp -p or touch -d leave it, is still seen: its change time
	// moved.
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(oneRule, "rule-1", "rule-2", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, info.ModTime(), info.ModTime()); err != nil {
		t.Fatal(err)
	}
	if specs := load(4); specs.Projects["5e3eef0679fa3700a0198a49"][0].ID != "rule-2" {
		t.Errorf("after the edit: %+v, want rule-2", specs.Projects)
	}
}
