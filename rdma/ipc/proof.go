package ipc

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ErrUnproven is returned when a node asks for an IPC handle before proving
// that it runs on the owner's host. The fetcher proves itself and retries
// by itself; callers see it only when the proof fails.
var ErrUnproven = errors.New("ipc: peer has not proven it runs on this host")

// challengePrefix starts the name of every challenge file.
const challengePrefix = "tensorferry-ipc-"

const tokenLen = 32

// challenge is a same-host challenge the owner issued to one peer: a file
// only readable by processes of this host (and user) holding a random token.
type challenge struct {
	id      uint64
	path    string
	token   [tokenLen]byte
	expires time.Time
}

// proofMAC is what a peer must answer to a challenge: HMAC-SHA256 keyed by
// the token over the peer's node name, so an answer is worth nothing for
// another node name.
func proofMAC(token []byte, node string) []byte {
	m := hmac.New(sha256.New, token)
	m.Write([]byte(node))
	return m.Sum(nil)
}

func randomBytes(b []byte) {
	if _, err := rand.Read(b); err != nil {
		panic("ipc: crypto/rand failed: " + err.Error())
	}
}

// newChallenge writes a fresh token into a new file of dir (0600, exclusive
// create, random name) and returns the challenge.
func newChallenge(dir string, ttl time.Duration) (*challenge, error) {
	ch := &challenge{expires: time.Now().Add(ttl)}
	var idb [8]byte
	randomBytes(idb[:])
	ch.id = binary.LittleEndian.Uint64(idb[:])
	randomBytes(ch.token[:])
	var name [16]byte
	randomBytes(name[:])
	ch.path = filepath.Join(dir, challengePrefix+hex.EncodeToString(name[:]))
	f, err := os.OpenFile(ch.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ipc: same-host challenge: %w", err)
	}
	_, werr := f.Write(ch.token[:])
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(ch.path)
		return nil, fmt.Errorf("ipc: same-host challenge: %w", err)
	}
	return ch, nil
}

// remove deletes the challenge file.
func (ch *challenge) remove() { _ = os.Remove(ch.path) }

// verify checks a peer's answer.
func (ch *challenge) verify(node string, mac []byte, now time.Time) error {
	if now.After(ch.expires) {
		return fmt.Errorf("%w: challenge expired", ErrUnproven)
	}
	if !hmac.Equal(mac, proofMAC(ch.token[:], node)) {
		return fmt.Errorf("%w: wrong answer to the same-host challenge", ErrUnproven)
	}
	return nil
}

// answerChallenge reads the token the owner wrote at path and returns the
// proof for node. path must name a challenge file directly inside dir (this
// node's shared memory directory): an owner cannot make the fetcher read
// any other file.
func answerChallenge(dir, path, node string) ([]byte, error) {
	if filepath.Dir(path) != filepath.Clean(dir) || !strings.HasPrefix(filepath.Base(path), challengePrefix) {
		return nil, fmt.Errorf("%w: challenge file %q is not in %s", errBadMessage, path, dir)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot read the owner's challenge (not on the same host?): %w", ErrUnproven, err)
	}
	defer f.Close()
	var buf [tokenLen + 1]byte
	n, err := io.ReadFull(f, buf[:])
	if err != io.ErrUnexpectedEOF || n != tokenLen {
		return nil, fmt.Errorf("%w: challenge file %s holds %d bytes, want %d", errBadMessage, path, n, tokenLen)
	}
	return proofMAC(buf[:tokenLen], node), nil
}

// sweepStaleChallenges deletes challenge files in dir older than maxAge:
// left behind by owners killed between a challenge and its answer. Files of
// other users stay (the sticky bit of /dev/shm protects them).
func sweepStaleChallenges(dir string, maxAge time.Duration, now time.Time) int {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), challengePrefix) || !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if err != nil || now.Sub(fi.ModTime()) < maxAge {
			continue
		}
		if os.Remove(filepath.Join(dir, e.Name())) == nil {
			n++
		}
	}
	return n
}
