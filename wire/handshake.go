package wire

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"
)

// ProtocolVersion is the version of the protocol this package speaks, and
// of the rdma channels' protocols on connections it authenticates. Version
// 2: frame types 11 to 13 reserved (no FETCH, DATA, FETCH_END), and the
// channels' control replies and staging statuses carry ErrCode.
const ProtocolVersion uint16 = 2

// NonceSize is the size of the handshake nonces.
const NonceSize = 32

// Connection purposes.
const (
	PurposeControl = "control" // actor messages, system messages, fetch control
	PurposeData    = "data"    // bulk Data frames
)

// DefaultHandshakeTimeout bounds a handshake when HandshakeConfig.Timeout is
// zero.
const DefaultHandshakeTimeout = 5 * time.Second

// HandshakeMaxFrameSize is the largest frame payload accepted during the
// handshake.
const HandshakeMaxFrameSize = 4 << 10

// maxNameLen bounds cluster and node names.
const maxNameLen = 255

const (
	labelInitiator = "tensorferry initiator v1"
	labelAcceptor  = "tensorferry acceptor v1"
)

// HandshakeConfig configures one side of a handshake.
type HandshakeConfig struct {
	// Cluster is the cluster name; both sides must agree.
	Cluster string
	// Node is this node's name, sent only after the peer proved it knows
	// Secret.
	Node string
	// Incarnation identifies this life of the node; it changes on restart.
	Incarnation uint64
	// Secret is the shared cluster secret (at least 16 bytes; 32 random
	// bytes recommended).
	Secret []byte
	// Purpose is PurposeControl (default) or PurposeData. The initiator
	// sends it; an acceptor with a non-empty Purpose refuses other purposes.
	Purpose string
	// Timeout bounds the whole handshake (default DefaultHandshakeTimeout;
	// a node sets the config's dial_timeout, config.Config.DialTimeout).
	Timeout time.Duration
	// Expect, on the initiator, is the node name it means to reach; "" means
	// any. Ignored by the acceptor.
	Expect string
	// Admit, on the acceptor, decides whether to serve an initiator that has
	// proved it holds Secret; it runs before the acceptor sends its own
	// proof. A non-nil error refuses the initiator with a GoAway that carries
	// the error's text as its reason and, when the error is a *ConnError, its
	// Code (else CodeUnavailable); Handshake then returns an error wrapping
	// it. Nil admits every authenticated initiator. Ignored by the initiator.
	Admit func(Remote) error
	// SharedMemory, on the initiator, offers the shared-memory upgrade
	// (package shm) in Hello; on the acceptor, takes up such an offer in
	// Welcome. Remote.SharedMemory reports whether both ends did: then both
	// must call shm.Upgrade on the connection before anything else.
	SharedMemory bool
}

// Remote is the authenticated other end of a connection, as the handshake
// found it (cluster.Peer is the node behind it).
type Remote struct {
	Node        string
	Incarnation uint64
	Purpose     string
	// SharedMemory: both ends agreed to run shm.Upgrade next (see
	// HandshakeConfig.SharedMemory).
	SharedMemory bool
}

func (c *HandshakeConfig) validate(initiator bool) error {
	switch {
	case c.Cluster == "" || len(c.Cluster) > maxNameLen:
		return fmt.Errorf("wire: handshake config: cluster name must have 1 to %d bytes", maxNameLen)
	case c.Node == "" || len(c.Node) > maxNameLen:
		return fmt.Errorf("wire: handshake config: node name must have 1 to %d bytes", maxNameLen)
	case len(c.Secret) < 16:
		return errors.New("wire: handshake config: secret must have at least 16 bytes")
	}
	p := c.Purpose
	if initiator && p == "" {
		p = PurposeControl
	}
	if p != "" && p != PurposeControl && p != PurposeData {
		return fmt.Errorf("wire: handshake config: unknown purpose %q", c.Purpose)
	}
	return nil
}

// Handshake authenticates nc as the initiator (the side that dialed) or the
// acceptor and returns the other end (Remote). Both sides prove knowledge of
// the shared secret with an HMAC-SHA256 over a transcript of both fresh
// nonces, so a recorded handshake cannot be replayed. The acceptor sends nothing but its
// version and nonce until the initiator has proved itself, so a dialer
// without the secret learns nothing. The initiator names itself in Auth to
// whoever it dialed; an impostor acceptor learns that name and a MAC it
// could attack offline, which is why Secret must be random and long.
//
// The cluster name is checked only through the MACs: an acceptor answers a
// wrong cluster name exactly as it answers a wrong secret (a GoAway with
// CodeAuth after the challenge), so a prober without the secret cannot test
// guesses of the name. The initiator's error then wraps ErrAuthFailed; the
// acceptor's wraps ErrClusterMismatch as well, for its logs. A GoAway from
// the acceptor's Admit, sent only to an initiator that proved the secret,
// carries a reason that the initiator's error quotes.
//
// The whole handshake is bounded by cfg.Timeout and ctx; the deadline on nc
// is cleared on success. Nothing but handshake frames is accepted. On
// failure nc is closed and the error wraps one of ErrVersion,
// ErrClusterMismatch, ErrAuthFailed, ErrUnexpectedPeer, a *ConnError for a
// malformed frame or a refusal by the peer's Admit, the error of this
// side's Admit, ctx.Err() or the I/O error (os.ErrDeadlineExceeded on
// timeout).
func Handshake(ctx context.Context, nc net.Conn, cfg HandshakeConfig, initiator bool) (Remote, error) {
	if err := cfg.validate(initiator); err != nil {
		nc.Close()
		return Remote{}, err
	}
	if initiator && cfg.Purpose == "" {
		cfg.Purpose = PurposeControl
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultHandshakeTimeout
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := nc.SetDeadline(deadline); err != nil {
		nc.Close()
		return Remote{}, fmt.Errorf("wire: handshake: set deadline: %w", err)
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		nc.SetDeadline(time.Unix(1, 0)) // unblock reads and writes now
	})

	hs := &handshake{cfg: cfg, nc: nc, deadline: deadline, fr: NewFramer(nc, nc)}
	hs.fr.SetMaxReadFrameSize(HandshakeMaxFrameSize)
	hs.fr.SetMaxWriteFrameSize(HandshakeMaxFrameSize)
	var peer Remote
	var err error
	if initiator {
		peer, err = hs.initiate()
	} else {
		peer, err = hs.accept()
	}
	if !stop() {
		<-fired
		if err == nil {
			err = fmt.Errorf("wire: handshake: %w", ctx.Err())
		} else {
			err = fmt.Errorf("wire: handshake: %w (%w)", ctx.Err(), err)
		}
	}
	if err == nil {
		if derr := nc.SetDeadline(time.Time{}); derr != nil {
			err = fmt.Errorf("wire: handshake: clear deadline: %w", derr)
		}
	}
	if err != nil {
		nc.Close()
		return Remote{}, err
	}
	return peer, nil
}

type handshake struct {
	cfg      HandshakeConfig
	nc       net.Conn
	deadline time.Time
	fr       *Framer
}

// refuseTimeout bounds the best-effort GoAway sent when refusing a peer.
const refuseTimeout = 100 * time.Millisecond

func (hs *handshake) initiate() (Remote, error) {
	nonceI := make([]byte, NonceSize)
	if _, err := rand.Read(nonceI); err != nil {
		return Remote{}, fmt.Errorf("wire: handshake: nonce: %w", err)
	}
	hello := Hello{Version: ProtocolVersion, Cluster: hs.cfg.Cluster, Nonce: nonceI, Purpose: hs.cfg.Purpose, SharedMemory: hs.cfg.SharedMemory}
	if err := hs.fr.WriteHello(&hello); err != nil {
		return Remote{}, fmt.Errorf("wire: handshake: send hello: %w", err)
	}
	f, err := hs.read(FrameChallenge)
	if err != nil {
		return Remote{}, err
	}
	ch := f.(*ChallengeFrame).Challenge
	if ch.Version != ProtocolVersion {
		return Remote{}, fmt.Errorf("wire: handshake: acceptor speaks version %d, want %d: %w", ch.Version, ProtocolVersion, ErrVersion)
	}
	if len(ch.Nonce) != NonceSize {
		return Remote{}, connErr(CodeProtocol, nil, "handshake: challenge nonce of %d bytes", len(ch.Nonce))
	}
	t := transcript{version: ProtocolVersion, cluster: hs.cfg.Cluster, purpose: hs.cfg.Purpose,
		nonceI: nonceI, nonceA: ch.Nonce, nodeI: hs.cfg.Node, incI: hs.cfg.Incarnation}
	auth := Auth{Node: hs.cfg.Node, Incarnation: hs.cfg.Incarnation, MAC: t.mac(hs.cfg.Secret, labelInitiator, false)}
	if err := hs.fr.WriteAuth(&auth); err != nil {
		return Remote{}, fmt.Errorf("wire: handshake: send auth: %w", err)
	}
	f, err = hs.read(FrameWelcome)
	if err != nil {
		return Remote{}, err
	}
	w := f.(*WelcomeFrame).Welcome
	if w.Node == "" || len(w.Node) > maxNameLen {
		return Remote{}, connErr(CodeProtocol, nil, "handshake: welcome names no valid node")
	}
	t.nodeA, t.incA = w.Node, w.Incarnation
	if !hmac.Equal(w.MAC, t.mac(hs.cfg.Secret, labelAcceptor, true)) {
		hs.refuse(CodeAuth)
		return Remote{}, fmt.Errorf("wire: handshake: acceptor's proof is wrong: %w", ErrAuthFailed)
	}
	if hs.cfg.Expect != "" && w.Node != hs.cfg.Expect {
		hs.refuse(CodeAuth)
		return Remote{}, fmt.Errorf("wire: handshake: reached node %q, expected %q: %w", w.Node, hs.cfg.Expect, ErrUnexpectedPeer)
	}
	return Remote{Node: w.Node, Incarnation: w.Incarnation, Purpose: hs.cfg.Purpose, SharedMemory: hs.cfg.SharedMemory && w.SharedMemory}, nil
}

func (hs *handshake) accept() (Remote, error) {
	f, err := hs.read(FrameHello)
	if err != nil {
		return Remote{}, err
	}
	hello := f.(*HelloFrame).Hello
	if hello.Version != ProtocolVersion {
		hs.refuse(CodeVersion)
		return Remote{}, fmt.Errorf("wire: handshake: initiator speaks version %d, want %d: %w", hello.Version, ProtocolVersion, ErrVersion)
	}
	if hello.Purpose != PurposeControl && hello.Purpose != PurposeData ||
		hs.cfg.Purpose != "" && hello.Purpose != hs.cfg.Purpose {
		hs.refuse(CodeProtocol)
		return Remote{}, connErr(CodeProtocol, nil, "handshake: purpose %q not accepted", hello.Purpose)
	}
	if len(hello.Nonce) != NonceSize {
		hs.refuse(CodeProtocol)
		return Remote{}, connErr(CodeProtocol, nil, "handshake: hello nonce of %d bytes", len(hello.Nonce))
	}
	nonceA := make([]byte, NonceSize)
	if _, err := rand.Read(nonceA); err != nil {
		return Remote{}, fmt.Errorf("wire: handshake: nonce: %w", err)
	}
	if err := hs.fr.WriteChallenge(&Challenge{Version: ProtocolVersion, Nonce: nonceA}); err != nil {
		return Remote{}, fmt.Errorf("wire: handshake: send challenge: %w", err)
	}
	f, err = hs.read(FrameAuth)
	if err != nil {
		return Remote{}, err
	}
	auth := f.(*AuthFrame).Auth
	if auth.Node == "" || len(auth.Node) > maxNameLen {
		hs.refuse(CodeProtocol)
		return Remote{}, connErr(CodeProtocol, nil, "handshake: auth names no valid node")
	}
	// The MAC binds this node's cluster name, so an initiator of another
	// cluster fails here, refused exactly like one with a wrong secret.
	t := transcript{version: ProtocolVersion, cluster: hs.cfg.Cluster, purpose: hello.Purpose,
		nonceI: hello.Nonce, nonceA: nonceA, nodeI: auth.Node, incI: auth.Incarnation}
	if !hmac.Equal(auth.MAC, t.mac(hs.cfg.Secret, labelInitiator, false)) {
		hs.refuse(CodeAuth)
		if hello.Cluster != hs.cfg.Cluster {
			return Remote{}, fmt.Errorf("wire: handshake: initiator is in cluster %q: %w (%w)", hello.Cluster, ErrClusterMismatch, ErrAuthFailed)
		}
		return Remote{}, fmt.Errorf("wire: handshake: initiator's proof is wrong: %w", ErrAuthFailed)
	}
	if hello.Cluster != hs.cfg.Cluster {
		// Only an initiator that MACs another name than it sent gets here.
		hs.refuse(CodeCluster)
		return Remote{}, fmt.Errorf("wire: handshake: initiator is in cluster %q: %w", hello.Cluster, ErrClusterMismatch)
	}
	peer := Remote{Node: auth.Node, Incarnation: auth.Incarnation, Purpose: hello.Purpose}
	if hs.cfg.Admit != nil {
		if err := hs.cfg.Admit(peer); err != nil {
			code := CodeUnavailable
			var ce *ConnError
			if errors.As(err, &ce) {
				code = ce.Code
			}
			hs.refuseWith(code, err.Error())
			return Remote{}, fmt.Errorf("wire: handshake: %s refused: %w", auth.Node, err)
		}
	}
	t.nodeA, t.incA = hs.cfg.Node, hs.cfg.Incarnation
	peer.SharedMemory = hello.SharedMemory && hs.cfg.SharedMemory
	welcome := Welcome{Node: hs.cfg.Node, Incarnation: hs.cfg.Incarnation, MAC: t.mac(hs.cfg.Secret, labelAcceptor, true), SharedMemory: peer.SharedMemory}
	if err := hs.fr.WriteWelcome(&welcome); err != nil {
		return Remote{}, fmt.Errorf("wire: handshake: send welcome: %w", err)
	}
	return peer, nil
}

// read reads the next frame and requires type want. A GoAway from the peer
// becomes the error its code names.
func (hs *handshake) read(want FrameType) (Frame, error) {
	f, err := hs.fr.ReadFrame()
	if err != nil {
		return nil, fmt.Errorf("wire: handshake: read %s: %w", want, err)
	}
	h := f.Header()
	if h.Type == want && h.Stream == 0 {
		return f, nil
	}
	if g, ok := f.(*GoAwayFrame); ok {
		var sentinel error
		switch g.GoAway.Code {
		case CodeVersion:
			sentinel = ErrVersion
		case CodeCluster:
			sentinel = ErrClusterMismatch
		case CodeAuth:
			sentinel = ErrAuthFailed
		default:
			reason := "refused by peer"
			if g.GoAway.Reason != "" {
				reason = fmt.Sprintf("refused by peer: %q", g.GoAway.Reason)
			}
			sentinel = &ConnError{Code: g.GoAway.Code, Reason: reason}
		}
		return nil, fmt.Errorf("wire: handshake: peer refused with %s: %w", g.GoAway.Code, sentinel)
	}
	hs.refuse(CodeProtocol)
	return nil, connErr(CodeProtocol, nil, "handshake: got %s while waiting for %s", h, want)
}

// refuse sends a GoAway carrying only code, best effort and briefly.
func (hs *handshake) refuse(code ErrCode) { hs.refuseWith(code, "") }

// refuseWith sends a GoAway with code and reason, best effort and briefly.
// A reason goes only to an initiator that proved the secret.
func (hs *handshake) refuseWith(code ErrCode, reason string) {
	if d := time.Now().Add(refuseTimeout); d.Before(hs.deadline) {
		hs.nc.SetWriteDeadline(d)
	}
	if limit := HandshakeMaxFrameSize / 2; len(reason) > limit {
		reason = reason[:limit]
	}
	hs.fr.WriteGoAway(&GoAway{Code: code, Reason: reason})
}

// transcript is what the handshake MACs bind: every field is length
// prefixed, so no two different transcripts encode alike.
type transcript struct {
	version        uint16
	cluster        string
	purpose        string
	nonceI, nonceA []byte
	nodeI          string
	incI           uint64
	nodeA          string
	incA           uint64
}

func (t *transcript) mac(secret []byte, label string, withAcceptor bool) []byte {
	m := hmac.New(sha256.New, secret)
	var num [8]byte
	field := func(b []byte) {
		binary.BigEndian.PutUint32(num[:4], uint32(len(b)))
		m.Write(num[:4])
		m.Write(b)
	}
	u64 := func(v uint64) {
		binary.BigEndian.PutUint64(num[:], v)
		m.Write(num[:])
	}
	field([]byte(label))
	u64(uint64(t.version))
	field([]byte(t.cluster))
	field([]byte(t.purpose))
	field(t.nonceI)
	field(t.nonceA)
	field([]byte(t.nodeI))
	u64(t.incI)
	if withAcceptor {
		field([]byte(t.nodeA))
		u64(t.incA)
	}
	return m.Sum(nil)
}
