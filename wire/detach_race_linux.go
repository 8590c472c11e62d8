//go:build linux && race

package wire

import "golang.org/x/sys/unix"

// rawRead and rawWrite: see detach_raw_linux.go. The race detector's
// build keeps x/sys/unix's calls, whose annotations tell it that what was
// written before a write to a socket happens before what is read after
// the read of it.
func rawRead(fd int, p []byte) (int, error) { return unix.Read(fd, p) }

func rawWrite(fd int, p []byte) (int, error) { return unix.Write(fd, p) }
