package store

import (
	"os"
	"syscall"
)

// sysStamp is a file's change time, device and inode number: an edit
// moves the change time even when it keeps the size and sets the
// modification time back (cp -p, touch -d), and a rename over the file
// changes the inode. The change time is in Unix nanoseconds.
func sysStamp(info os.FileInfo) (ctime int64, dev, ino uint64) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, 0
	}
	return st.Ctim.Nano(), st.Dev, st.Ino
}
