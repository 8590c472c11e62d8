package ipc

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/rdma"
)

func TestChallengeFile(t *testing.T) {
	dir := t.TempDir()
	ch, err := newChallenge(dir, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(ch.path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Size() != tokenLen {
		t.Fatalf("challenge file: mode %v, %d bytes", fi.Mode(), fi.Size())
	}
	other, err := newChallenge(dir, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if other.path == ch.path || other.token == ch.token || other.id == ch.id {
		t.Fatal("two challenges share a name, token or id")
	}
	mac, err := answerChallenge(dir, ch.path, fetcherNode)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.verify(fetcherNode, mac, time.Now()); err != nil {
		t.Fatalf("right answer: %v", err)
	}
	if err := ch.verify("mallory", mac, time.Now()); !errors.Is(err, ErrUnproven) {
		t.Fatalf("answer for another node name: %v, want ErrUnproven", err)
	}
	if err := other.verify(fetcherNode, mac, time.Now()); !errors.Is(err, ErrUnproven) {
		t.Fatalf("answer to another challenge: %v, want ErrUnproven", err)
	}
	if err := ch.verify(fetcherNode, mac, time.Now().Add(2*time.Minute)); !errors.Is(err, ErrUnproven) {
		t.Fatalf("late answer: %v, want ErrUnproven", err)
	}
	ch.remove()
	other.remove()
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("files left: %v", left)
	}
}

func TestAnswerChallengeRefusesOtherFiles(t *testing.T) {
	dir := t.TempDir()
	elsewhere := t.TempDir()
	secret := filepath.Join(elsewhere, challengePrefix+"x")
	if err := os.WriteFile(secret, bytes.Repeat([]byte{7}, tokenLen), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, challengePrefix+"link")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	wrongName := filepath.Join(dir, "passwd")
	if err := os.WriteFile(wrongName, bytes.Repeat([]byte{7}, tokenLen), 0o600); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, challengePrefix+"short")
	if err := os.WriteFile(short, []byte{1, 2, 3}, 0o600); err != nil {
		t.Fatal(err)
	}
	long := filepath.Join(dir, challengePrefix+"long")
	if err := os.WriteFile(long, make([]byte, tokenLen+1), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{secret, link, wrongName, short, long, dir + "/../" + filepath.Base(elsewhere) + "/" + challengePrefix + "x", filepath.Join(dir, challengePrefix+"missing")} {
		if _, err := answerChallenge(dir, path, fetcherNode); err == nil {
			t.Errorf("answered a challenge from %s", path)
		}
	}
}

// TestSameHostProof runs the proof between two channels: the handle is
// asked for only after the proof, the proof is made once per peer, and
// forgotten on PeerDown.
func TestSameHostProof(t *testing.T) {
	dir := t.TempDir()
	p := newFakePair(t, Config{ShmDir: dir})
	ctx := context.Background()
	mac := func() uint64 {
		p.fetcher.fmu.Lock()
		defer p.fetcher.fmu.Unlock()
		return p.fetcher.proofGen[ownerNode]
	}
	if err := p.fetcher.prove(ctx, ownerNode, mac()); err != nil {
		t.Fatalf("proof: %v", err)
	}
	if st := p.owner.Stats(); st.ProvenPeers != 1 {
		t.Fatalf("owner knows %d proven peers, want 1", st.ProvenPeers)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("challenge files left after the proof: %v", left)
	}
	// A proof with a stale generation is skipped: another fetch made it.
	before := p.count(opChallenge)
	if err := p.fetcher.prove(ctx, ownerNode, mac()-1); err != nil || p.count(opChallenge) != before {
		t.Fatalf("stale proof: %v, %d challenges (was %d)", err, p.count(opChallenge), before)
	}
	p.owner.PeerDown(fetcherNode)
	if st := p.owner.Stats(); st.ProvenPeers != 0 {
		t.Fatalf("proof survived PeerDown")
	}
}

func TestSameHostProofFailures(t *testing.T) {
	ctx := context.Background()
	t.Run("other-host", func(t *testing.T) {
		// The fetcher looks into its own shared memory directory, which
		// does not hold the owner's file: as on another host.
		ownerDir, fetchDir := t.TempDir(), t.TempDir()
		p := newFakePair(t, Config{ShmDir: ownerDir})
		p.fetcher.cfg.ShmDir = fetchDir
		err := p.fetcher.prove(ctx, ownerNode, 0)
		if err == nil {
			t.Fatal("proved from another host")
		}
		if p.owner.Stats().ProvenPeers != 0 {
			t.Fatal("owner trusts the peer")
		}
		// The unanswered challenge file goes with PeerDown.
		p.owner.PeerDown(fetcherNode)
		if left, _ := os.ReadDir(ownerDir); len(left) != 0 {
			t.Fatalf("challenge files left: %v", left)
		}
	})
	t.Run("wrong-mac", func(t *testing.T) {
		dir := t.TempDir()
		p := newFakePair(t, Config{ShmDir: dir})
		p.tamper = func(_ string, req []byte) []byte {
			r, err := decodeRequest(req)
			if err != nil || r.Op != opProve {
				return req
			}
			r.MAC[0] ^= 1
			b, _ := encode(r)
			return b
		}
		if err := p.fetcher.prove(ctx, ownerNode, 0); !errors.Is(err, ErrUnproven) {
			t.Fatalf("tampered proof: %v, want ErrUnproven", err)
		}
		if p.owner.Stats().ProvenPeers != 0 {
			t.Fatal("owner trusts the peer")
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Fatalf("challenge files left: %v", left)
		}
	})
	t.Run("answer-for-another-node", func(t *testing.T) {
		// mallory relays the fetcher's challenge answer as its own.
		dir := t.TempDir()
		p := newFakePair(t, Config{ShmDir: dir})
		rb, err := p.owner.HandleControl(ctx, fetcherNode, mustEncode(t, request{Op: opChallenge}))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := decodeReply(rb)
		if err != nil || rep.Code != rdma.CodeOK {
			t.Fatalf("challenge: %+v %v", rep, err)
		}
		mac, err := answerChallenge(dir, rep.Path, fetcherNode)
		if err != nil {
			t.Fatal(err)
		}
		rb, _ = p.owner.HandleControl(ctx, "mallory", mustEncode(t, request{Op: opProve, Challenge: rep.Challenge, MAC: mac}))
		if rep, _ := decodeReply(rb); rep == nil || rep.Code != codeUnproven {
			t.Fatalf("mallory's relayed proof: %+v, want codeUnproven", rep)
		}
		// mallory's attempt did not consume the fetcher's challenge.
		rb, _ = p.owner.HandleControl(ctx, fetcherNode, mustEncode(t, request{Op: opProve, Challenge: rep.Challenge, MAC: mac}))
		if rep, _ := decodeReply(rb); rep == nil || rep.Code != rdma.CodeOK {
			t.Fatalf("fetcher's proof: %+v", rep)
		}
	})
	t.Run("expired", func(t *testing.T) {
		dir := t.TempDir()
		p := newFakePair(t, Config{ShmDir: dir, ChallengeTTL: time.Nanosecond})
		if err := p.fetcher.prove(ctx, ownerNode, 0); !errors.Is(err, ErrUnproven) {
			t.Fatalf("late proof: %v, want ErrUnproven", err)
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Fatalf("challenge files left: %v", left)
		}
	})
}

func mustEncode(t *testing.T, r request) []byte {
	t.Helper()
	b, err := encode(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSweepStaleChallenges(t *testing.T) {
	dir := t.TempDir()
	old, err := newChallenge(dir, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := newChallenge(dir, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "unrelated")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour)
	for _, p := range []string{old.path, other} {
		if err := os.Chtimes(p, past, past); err != nil {
			t.Fatal(err)
		}
	}
	if n := sweepStaleChallenges(dir, 10*time.Minute, time.Now()); n != 1 {
		t.Fatalf("swept %d files, want 1", n)
	}
	for p, want := range map[string]bool{old.path: false, fresh.path: true, other: true} {
		if _, err := os.Stat(p); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", p, err == nil, want)
		}
	}
}
