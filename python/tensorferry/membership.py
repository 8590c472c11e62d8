"""How a Python node joins its cluster: the mesh, as the Go nodes run it
(cluster/membership.go), also as a mesh-only member of a gossip cluster.

Mesh membership: every node dials every other node of the config and
accepts their dials, so either end may start first or restart. A node
that has a control connection to a peer does not dial it; a lost
connection is redialed at once, then with backoff from reconnect_min,
doubling up to reconnect_max, each wait drawn from its upper half. When
both ends dial at once, the two nodes keep the same connection by the
same rules as Go:

  - an acceptor whose own dial to the initiator is in flight refuses the
    initiator in the handshake when its name is the smaller one: the
    connection dialed by the node with the smaller name wins;
  - a connection to the incarnation already connected is refused (or
    closed) unless the current one is closing, or is not up yet (its
    caps not received) and the new one is the preferred one (dialed by
    the smaller name);
  - a connection from an incarnation lower than the highest one seen of
    that node is refused: a restarted node always comes back higher.

Refusals are GOAWAY frames with code Unavailable and the reason, as Go's
Admit sends them; the refused dialer retries after its backoff.

Gossip membership (SWIM, hashicorp/memberlist) is encrypted with
AES-GCM under a key derived from the cluster's secret; Python's standard
library has no AES, and this package adds no compiled dependency, so a
Python node cannot take part in gossip. It joins a gossip cluster
(membership: gossip, or more than AutoMeshNodes nodes with membership
left out) as a mesh-only member: its entry in the cluster's config says
mesh_only: true (and has no gossip_address), and the node is made with
mesh_only=True. Every Go node then keeps a control connection to it by
the mesh's rules (dialed and accepted, heartbeats, failure_timeout,
never closed for idleness), and it dials every node it is given, as
above; the Go nodes gossip among themselves. check_membership refuses a
gossip cluster without mesh_only=True, saying so, and a discovery
section under gossip membership (membership: gossip, or left out with
discovery), which the Go config refuses for mesh_only nodes too: run
such a cluster with membership: mesh.

With discovery (membership: mesh and an etcd discovery section,
discovery.py), the peers are the nodes registered in etcd besides those
given: add_peer starts dialing a node that registered, remove_peer stops
dialing one whose registration went (left, or its lease expired) and
closes its connection, which is a NodeDown.
"""

import collections
import random
import socket
import threading
import time

AUTO_MESH_NODES = 16  # config.AutoMeshNodes
CODE_UNAVAILABLE = 12  # wire.CodeUnavailable

_GOSSIP_WHY = ("the Go nodes' gossip (hashicorp/memberlist) is encrypted with AES-GCM under a key "
               "derived from the secret, and Python's standard library has no AES")


_MESH_ONLY = ("mark this node mesh_only: true in the cluster's config (its entry under nodes, without a "
              "gossip_address) and pass mesh_only=True here: the Go nodes then keep a control connection "
              "with heartbeats to it, and it dials every node")


def check_membership(membership, discovery, nodes, mesh_only=False):
    """Raise ValueError unless a Python node can run the membership that
    the config's membership key (None or "" for auto, "mesh", "gossip")
    and discovery section (None, or the section) give for a cluster of
    nodes nodes (this one included), as config.MembershipMode resolves
    it: the mesh, with or without discovery; or gossip, with or without
    discovery, when this node's entry in the config is marked mesh_only
    (mesh_only True), so that the Go nodes keep a mesh connection to it
    (with discovery, the node registers the mark)."""
    if membership not in (None, "", "mesh", "gossip"):
        raise ValueError("tensorferry: membership %r: use 'mesh' or 'gossip' (or leave it out)" % (membership,))
    if discovery is not None:
        mode = membership or "gossip"  # a discovery section makes membership left out gossip
    else:
        mode = membership or ("mesh" if nodes <= AUTO_MESH_NODES else "gossip")
    if mode == "gossip" and not mesh_only:
        if membership:
            why = "membership 'gossip'"
        elif discovery is not None:
            why = "a discovery section with membership left out means gossip (as the Go config resolves it)"
        else:
            why = "%d nodes, more than %d, make membership left out gossip" % (nodes, AUTO_MESH_NODES)
        raise ValueError("tensorferry: %s, and a Python node cannot join gossip: %s. Either %s; or run the "
                         "cluster with membership: mesh" % (why, _GOSSIP_WHY, _MESH_ONLY))


class Refused(Exception):
    """An initiator refused in the handshake by the mesh's rules (not bad
    input: its dialer retries)."""


def keeps(self_name, old, initiator):
    """Whether old, the current connection to its peer, stays when another
    one to the same incarnation, dialed by initiator, comes (Go's
    Membership.keeps): one that is up never gives way, one not yet up
    gives way to the connection dialed by the smaller name, and one that
    is closing always does."""
    if old.closed:
        return False
    preferred = min(self_name, old.peer)
    return old.caps is not None or (old.initiator == preferred and initiator != preferred)


class Mesh:
    """The dialing side of a node's mesh membership: one thread per peer
    that keeps a control connection to it (dials when there is none,
    redials with backoff), and the admission rules for inbound ones.

    The node's mu guards dialing, accepting, highest and last_error; its
    up_cv (on mu) is notified when a connection is placed or closed."""

    def __init__(self, node, dial_timeout=2.0, reconnect_min=0.1, reconnect_max=5.0):
        if not 0 < reconnect_min <= reconnect_max:
            raise ValueError("tensorferry: reconnect_min %r, reconnect_max %r: want 0 < min <= max"
                             % (reconnect_min, reconnect_max))
        if not dial_timeout > 0:
            raise ValueError("tensorferry: dial_timeout %r: want a positive number of seconds" % (dial_timeout,))
        self.node = node
        self.dial_timeout = dial_timeout
        self.rmin, self.rmax = reconnect_min, reconnect_max
        self.dialing = set()  # peers a dial to is in flight
        self.accepting = set()  # peers an inbound connection of is being set up
        self.highest = {}  # peer → the highest incarnation connected
        self.last_error = {}  # peer → why its last dial failed (None after a success)
        # Why connections were refused or closed by the rules above, the latest.
        self.refused = collections.deque(maxlen=64)
        self.dials = 0  # dials that reached the peer and were placed (tests)
        self.loops = set()  # peers a dialing thread runs for, under mu
        self.started = False

    def start(self):
        """Start a dialing thread for every peer with an address; returns
        the threads."""
        n = self.node
        with n.mu:
            self.started = True
            return [self._spawn(peer) for peer in list(n.peers)
                    if peer != n.name and n.peers[peer].get("address") and peer not in self.loops]

    def _spawn(self, peer):
        """Under the node's mu: the dialing thread of peer, started."""
        self.loops.add(peer)
        n = self.node
        n.threads[:] = [t for t in n.threads if t.is_alive()]  # peers come and go
        t = threading.Thread(target=self._loop, args=(peer,), daemon=True, name="tensorferry-dial-" + peer)
        t.start()
        self.node.threads.append(t)
        return t

    # -- discovered peers ----------------------------------------------------

    def add_peer(self, peer, info):
        """Make peer (a node discovery announced; info: address and
        data_address) a member: admitted when it dials, dialed until
        connected. A known peer's addresses are updated; its connection, if
        any, stays."""
        n = self.node
        if peer == n.name:
            return
        with n.mu:
            n.peers[peer] = dict(info)
            if self.started and not n.stopped.is_set() and peer not in self.loops:
                self._spawn(peer)
            n.up_cv.notify_all()

    def remove_peer(self, peer, why):
        """Stop admitting and dialing peer, a node discovery says is gone,
        and close its connection (a NodeDown when it was up)."""
        n = self.node
        with n.mu:
            n.peers.pop(peer, None)
            c = n.conns.get(peer)
            n.up_cv.notify_all()
        if c is not None:
            c.close(why)

    # -- accepting -----------------------------------------------------------

    def admit(self, peer, inc):
        """Decide, under the node's mu, whether to serve an authenticated
        initiator (Go's Admit in cluster.accept); raise Refused saying why
        not. On success peer is marked accepting until placed (done)."""
        n = self.node
        if peer in self.dialing and n.name < peer:
            raise Refused("both ends dialed; the connection dialed by %s wins" % n.name)
        if inc < self.highest.get(peer, 0):
            raise Refused("%s knows incarnation %d of %s; %d is older" % (n.name, self.highest[peer], peer, inc))
        cur = n.conns.get(peer)
        if cur is not None and cur.inc == inc and keeps(n.name, cur, peer):
            raise Refused("%s already has a connection from this incarnation of %s" % (n.name, peer))
        if peer in self.accepting:
            raise Refused("%s is setting up another connection from %s" % (n.name, peer))
        self.accepting.add(peer)

    def place(self, c, initiator):
        """Under the node's mu: make c the connection to its peer (Go's
        placeLink). Returns (True, the connection it replaces or None), or
        (False, why) when c is refused: the current one keeps its place, or
        c is from an older incarnation."""
        n = self.node
        if initiator == c.peer:
            self.accepting.discard(c.peer)
        else:
            self.dialing.discard(c.peer)
        if c.peer not in n.peers:
            # Discovery took it out while this connection was set up.
            return False, "%s: connection closed: no longer a member (discovery)" % c.peer
        if c.inc < self.highest.get(c.peer, 0):
            return False, "%s: connection from incarnation %d closed: %d is connected" % (
                c.peer, c.inc, self.highest[c.peer])
        cur = n.conns.get(c.peer)
        if cur is not None and cur.inc == c.inc and keeps(n.name, cur, initiator):
            return False, "%s: duplicate connection dialed by %s closed" % (c.peer, initiator)
        n.conns[c.peer] = c
        self.highest[c.peer] = max(self.highest.get(c.peer, 0), c.inc)
        n.up_cv.notify_all()
        return True, cur

    def claims_live(self, c):
        """Whether c, a new connection, claims a node whose current
        connection is up, from another incarnation, and live (Go's
        placeLink and answers): a restarted node's old process is dead
        and its connection silent, while a live one sends heartbeats. So
        a holder of the secret cannot take a live node's name, and with it
        raise the incarnation the real node is held to. Waits up to two
        heartbeat intervals for a frame on the current connection; call
        without the node's mu."""
        n = self.node
        with n.mu:
            cur = n.conns.get(c.peer)
        if cur is None or cur.inc == c.inc or cur.caps is None:
            return False
        heard = cur.last_heard
        end = time.monotonic() + 2 * n.heartbeat
        while not cur.closed:
            if cur.last_heard != heard:
                return True
            left = end - time.monotonic()
            if left <= 0 or n.stopped.wait(min(left, n.heartbeat / 16)):
                return False
        return False

    def note(self, why):
        """Record why a connection was refused or closed by these rules."""
        with self.node.mu:
            self.refused.append(why)
            self.node.up_cv.notify_all()

    def done_accepting(self, peer):
        """Under the node's mu: an inbound connection of peer that admit
        passed failed before it was placed."""
        self.accepting.discard(peer)
        self.node.up_cv.notify_all()

    # -- dialing -------------------------------------------------------------

    def _loop(self, peer):
        n = self.node
        backoff = self.rmin
        while True:
            with n.mu:
                while not n.stopped.is_set() and peer in n.peers and (peer in n.conns or peer in self.accepting):
                    n.up_cv.wait()
                    backoff = self.rmin
                if n.stopped.is_set() or peer not in n.peers:
                    self.loops.discard(peer)
                    return
                self.dialing.add(peer)
            try:
                s, inc = self._dial(peer)
            except Exception as e:  # OSError, a refusal, a bad peer: the dial failed
                with n.mu:
                    self.dialing.discard(peer)
                    self.last_error[peer] = "%s: %s" % (type(e).__name__, e)
                    n.up_cv.notify_all()
                    wait = backoff / 2 + random.uniform(0, backoff / 2)
                    backoff = min(2 * backoff, self.rmax)
                    n.up_cv.wait_for(lambda: n.stopped.is_set() or peer in n.conns or peer not in n.peers, wait)
                continue
            with n.mu:
                self.last_error[peer] = None
            # This thread reads the connection until it closes.
            n._run_conn(s, peer, inc, n.name)

    def _dial(self, peer):
        """A control connection to peer, handshaken as initiator: (socket, incarnation)."""
        n = self.node
        host, port = n.peers[peer]["address"].rsplit(":", 1)
        s = socket.create_connection((host.strip("[]"), int(port)), timeout=self.dial_timeout)
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s = n._secure(s, False, False)
            n._tls_handshake(s)
            s.settimeout(self.dial_timeout)
            inc = n._initiate(s, "control", peer)
            s.settimeout(None)
        except BaseException:
            s.close()
            raise
        return s, inc
