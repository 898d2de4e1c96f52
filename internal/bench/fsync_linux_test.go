package bench

import (
	"os"
	"syscall"
)

// fdatasync is what bbolt calls on Linux after writing a transaction's pages and its meta page.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
