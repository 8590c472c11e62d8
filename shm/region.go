//go:build linux

package shm

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"

	"golang.org/x/sys/unix"
)

var bellSuffixes = [4]string{".b0", ".b1", ".b2", ".b3"}

// region is the shared memory of one connection and its doorbells, mapped
// or opened by one end.
type region struct {
	mem      []byte
	ringSize uint32
	bells    [4]*bell // ring 0 data, ring 0 space, ring 1 data, ring 1 space
	paths    []string // the files to unlink
}

// checkName reports whether name is one that createRegion makes: no
// directory, no dot-dot, nothing but the prefix and hex digits.
func checkName(name string) error {
	hexPart, ok := strings.CutPrefix(name, namePrefix)
	if !ok || len(hexPart) != 32 {
		return fmt.Errorf("shm: region name %q is not %s and 32 hex digits", name, namePrefix)
	}
	if _, err := hex.DecodeString(hexPart); err != nil || strings.ToLower(hexPart) != hexPart {
		return fmt.Errorf("shm: region name %q is not %s and 32 hex digits", name, namePrefix)
	}
	return nil
}

// createRegion makes the files of a new region in dir, readable and
// writable by this user only, maps the memory and writes its header.
func createRegion(dir string, ringSize uint32, nonce [nonceSize]byte) (*region, string, error) {
	if err := checkRingSize(uint64(ringSize)); err != nil {
		return nil, "", err
	}
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return nil, "", fmt.Errorf("shm: random name: %w", err)
	}
	name := namePrefix + hex.EncodeToString(tok[:])
	base := filepath.Join(dir, name)
	r := &region{ringSize: ringSize}
	fail := func(err error) (*region, string, error) {
		r.unlink()
		r.closeBells()
		r.unmap()
		return nil, "", err
	}
	fd, err := unix.Open(base+".mem", unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fail(fmt.Errorf("shm: create %s.mem: %w", base, err))
	}
	r.paths = append(r.paths, base+".mem")
	size := regionSize(ringSize)
	// Allocated, not only sized: a full tmpfs (a container's small
	// /dev/shm) refuses here, and the connection stays on its socket,
	// instead of faulting on the first write to a page it cannot back.
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		unix.Close(fd)
		return fail(fmt.Errorf("shm: allocate %d bytes for %s.mem: %w", size, base, err))
	}
	r.mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	if err != nil {
		return fail(fmt.Errorf("shm: map %s.mem: %w", base, err))
	}
	for i, sfx := range bellSuffixes {
		if err := unix.Mkfifo(base+sfx, 0o600); err != nil {
			return fail(fmt.Errorf("shm: create %s%s: %w", base, sfx, err))
		}
		r.paths = append(r.paths, base+sfx)
		if r.bells[i], err = openBell(base + sfx); err != nil {
			return fail(err)
		}
	}
	// The file is in dir until the initiator unlinks it: a process of
	// this user may truncate it already.
	if err := guard("write the header of "+name, func() { writeHeader(r.mem, header{ringSize: ringSize, nonce: nonce}) }); err != nil {
		return fail(err)
	}
	return r, name, nil
}

// openRegion opens and maps the region named name in dir that the peer
// created, checks that it is a file of this user that nobody else may open,
// of the size that rings of ringSize bytes need, with the header the peer
// announced (its nonce), and unlinks its files: nobody else can open them
// from now on.
func openRegion(dir, name string, ringSize uint32, nonce [nonceSize]byte) (*region, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := checkRingSize(uint64(ringSize)); err != nil {
		return nil, err
	}
	base := filepath.Join(dir, name)
	r := &region{ringSize: ringSize, paths: []string{base + ".mem"}}
	for _, sfx := range bellSuffixes {
		r.paths = append(r.paths, base+sfx)
	}
	defer r.unlink()
	fail := func(err error) (*region, error) {
		r.closeBells()
		r.unmap()
		return nil, err
	}
	size := regionSize(ringSize)
	fd, err := unix.Open(base+".mem", unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("shm: open %s.mem: %w", base, err))
	}
	if err := checkOwned(fd, unix.S_IFREG, int64(size)); err != nil {
		unix.Close(fd)
		return fail(fmt.Errorf("shm: %s.mem: %w", base, err))
	}
	r.mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	if err != nil {
		return fail(fmt.Errorf("shm: map %s.mem: %w", base, err))
	}
	if testHookMapped != nil {
		testHookMapped(base + ".mem")
	}
	var h header
	if gerr := guard("read the header of "+name, func() { h, err = parseHeader(r.mem[:pageSize]) }); gerr != nil {
		return fail(gerr)
	}
	if err != nil {
		return fail(err)
	}
	if h.ringSize != ringSize || h.nonce != nonce {
		return fail(errors.New("shm: the region's header is not the one the peer announced"))
	}
	for i, sfx := range bellSuffixes {
		if r.bells[i], err = openBell(base + sfx); err != nil {
			return fail(err)
		}
	}
	return r, nil
}

// testHookMapped, when a test sets it, runs in openRegion right after the
// region's file is mapped, with its path: the moment a peer's shrinking
// file would make the first access fault.
var testHookMapped func(path string)

// testHookChecked, when a test sets it, runs in the initiator after the
// region's header checked out, before it writes its proof.
var testHookChecked func(path string)

// guard runs f, which touches a mapping whose file a peer (or any process
// of this user) may shrink, turning a fault on it (SIGBUS past the file's
// end) into an error instead of a crash of the process. Every access to a
// region outside Conn.Read and Conn.Write (which guard themselves) goes
// through it.
func guard(what string, f func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = faultError(what, r)
		}
	}()
	f()
	return nil
}

// faultError describes r, recovered from a fault on a region's mapping
// while doing what; it panics again with r if r is not such a fault.
func faultError(what string, r any) error {
	af, ok := r.(interface{ Addr() uintptr })
	if !ok {
		panic(r)
	}
	return fmt.Errorf("shm: %s: the shared region faulted at %#x (was its file truncated?): %v", what, af.Addr(), r)
}

// openBell opens a doorbell FIFO read-write and non-blocking (Go's poller
// then waits on it), after checking that it is a FIFO of this user only.
func openBell(path string) (*bell, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: open %s: %w", path, err)
	}
	if err := checkOwned(fd, unix.S_IFIFO, -1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: %s: %w", path, err)
	}
	b, err := newBell(os.NewFile(uintptr(fd), path))
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: %s: %w", path, err)
	}
	return b, nil
}

// checkOwned checks that fd is of the given type, owned by this process's
// effective user, with no permission for group or others, and of size
// bytes (size < 0: any).
func checkOwned(fd int, typ uint32, size int64) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	switch {
	case st.Mode&unix.S_IFMT != typ:
		return fmt.Errorf("file type %#o, want %#o", st.Mode&unix.S_IFMT, typ)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("owned by uid %d, not %d", st.Uid, os.Geteuid())
	case st.Mode&0o077 != 0:
		return fmt.Errorf("mode %#o lets others in", st.Mode&0o777)
	case size >= 0 && st.Size != size:
		return fmt.Errorf("%d bytes, want %d", st.Size, size)
	}
	return nil
}

// unlink removes the region's files; the mapping and open doorbells stay.
func (r *region) unlink() {
	for _, p := range r.paths {
		_ = unix.Unlink(p)
	}
	r.paths = nil
}

func (r *region) closeBells() {
	for _, b := range r.bells {
		if b != nil {
			b.f.Close()
		}
	}
}

func (r *region) unmap() {
	if r.mem != nil {
		_ = unix.Munmap(r.mem)
		r.mem = nil
	}
}

// viable reports why regions cannot be made in dir, or nil.
func viable(dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("shm: %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("shm: %s is not a directory", dir)
	}
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("shm: %s is not writable: %w", dir, err)
	}
	return nil
}
