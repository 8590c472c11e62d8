"""Mesh membership between Python nodes (membership.py): both ends dial,
either may start first or restart, the two keep one connection; the
admission rules; and the memberships a Python node refuses (gossip,
unless marked mesh_only)."""

import os
import socket
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from tensorferry import membership, node as node_mod  # noqa: E402
from tensorferry.node import Message, Node  # noqa: E402

SECRET = b"0123456789abcdef0123"


def free_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1:%d" % s.getsockname()[1]


class Events:
    """on_up and on_down of a node, waited on."""

    def __init__(self):
        self.cv = threading.Condition()
        self.seen = []

    def up(self, name, inc):
        with self.cv:
            self.seen.append(("up", name, inc))
            self.cv.notify_all()

    def down(self, name, why):
        with self.cv:
            self.seen.append(("down", name, why))
            self.cv.notify_all()

    def wait(self, kind, name, n=1, timeout=10.0):
        with self.cv:
            ok = self.cv.wait_for(lambda: sum(1 for e in self.seen if e[:2] == (kind, name)) >= n, timeout)
        if not ok:
            raise AssertionError("no %d %s of %s in %.0fs: %r" % (n, kind, name, timeout, self.seen))


class MeshTest(unittest.TestCase):
    def node(self, name, address, peers, **kw):
        ev = Events()
        n = Node("c", SECRET, name, address, peers, ipc=False, reconnect_min=0.01, reconnect_max=0.2,
                 dial_timeout=1.0, heartbeat_interval=0.1, failure_timeout=2.0,
                 on_up=ev.up, on_down=ev.down, **kw)
        n.events = ev

        def double(m):
            return Message("py.Vec", {"Scale": m["Scale"], "X": m["X"] * 2, "Note": "from " + name})

        n.handle("double", double)
        return n

    def start(self, n):
        n.start()
        self.addCleanup(n.stop)
        return n

    def exchange(self, a, b):
        for x, y in ((a, b), (b, a)):
            t = torch.arange(5, dtype=torch.float32)
            r = x.request((y.name, "double"), Message("py.Vec", {"Scale": 1.0, "X": t, "Note": ""}), timeout=10)
            self.assertTrue(torch.equal(r["X"], t * 2))
            self.assertEqual(r["Note"], "from " + y.name)

    def test_both_dial(self):
        # Both ends dial each other from the start: they end up with one
        # connection, the same one at both ends, and talk over it.
        aa, ba = free_address(), free_address()
        a = self.start(self.node("A", aa, {"B": ba}))
        b = self.start(self.node("B", ba, {"A": aa}))
        a.wait_peer("B")
        b.wait_peer("A")
        self.exchange(a, b)
        with a.mu, b.mu:
            ca, cb = a.conns["B"], b.conns["A"]
            self.assertEqual(ca.initiator, cb.initiator)
            self.assertEqual((ca.inc, cb.inc), (b.incarnation, a.incarnation))
        self.assertEqual(a.errors + b.errors, [])

    def test_starts_later_and_restarts(self):
        # Only A can dial (B's config gives A an address where nothing
        # listens): A joins B when B starts after it, and rejoins the B that
        # restarts on the same address, a new incarnation.
        aa, ba = free_address(), free_address()
        a = self.start(self.node("A", aa, {"B": ba}))
        with a.mu:  # A dials, and fails, before B is there
            self.assertTrue(a.up_cv.wait_for(lambda: a.mesh.last_error.get("B"), 10))
        for run in range(2):
            b = self.start(self.node("B", ba, {"A": free_address()}))
            a.wait_peer("B")
            b.wait_peer("A")
            with a.mu:
                self.assertEqual((a.conns["B"].initiator, a.conns["B"].inc), ("A", b.incarnation))
            self.exchange(a, b)
            b.stop()
            a.events.wait("down", "B", n=run + 1)
        a.events.wait("up", "B", n=2)
        self.assertEqual(b.events.seen[0][:2], ("up", "A"))

    def test_staging(self):
        # Tensors above the inline threshold between Python nodes: each
        # fetches the other's export from its data address.
        aa, ba, ad, bd = (free_address() for _ in range(4))
        a = self.start(self.node("A", aa, {"B": {"address": ba, "data_address": bd}},
                                 data_address=ad, inline_threshold=1024))
        b = self.start(self.node("B", ba, {"A": {"address": aa, "data_address": ad}},
                                 data_address=bd, inline_threshold=1024))
        a.wait_peer("B")
        for x, y in ((a, b), (b, a)):
            t = torch.arange(10000, dtype=torch.float32)
            r = x.request((y.name, "double"), Message("py.Vec", {"Scale": 1.0, "X": t, "Note": ""}), timeout=10)
            self.assertTrue(torch.equal(r["X"], t * 2))
            self.assertEqual([v for v in y.transfers if v[0] == "staging"][-1], ("staging", x.name, 40000))
            self.assertEqual([v for v in x.transfers if v[0] == "staging"][-1], ("staging", y.name, 40000))
        self.assertEqual(a.errors + b.errors, [])

    def test_tls(self):
        # Only A dials, under TLS, as in test_starts_later_and_restarts.
        from tests.test_tls import make_pki
        import shutil
        import tempfile
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        tls = make_pki(d, "mesh")
        aa, ba = free_address(), free_address()
        b = self.start(self.node("B", ba, {"A": free_address()}, tls=tls))
        a = self.start(self.node("A", aa, {"B": ba}, tls=tls))
        a.wait_peer("B")
        b.wait_peer("A")
        with a.mu:
            self.assertEqual(a.conns["B"].initiator, "A")
            self.assertEqual(a.conns["B"].sock.version(), "TLSv1.3")
        self.exchange(a, b)

    def test_stop(self):
        # stop returns with the node's threads ended and its addresses
        # free: a node started again on them at once listens.
        aa, da = free_address(), free_address()
        a = self.start(self.node("A", aa, {"B": free_address()}, data_address=da))
        with a.mu:  # its dialer is running
            self.assertTrue(a.up_cv.wait_for(lambda: a.mesh.last_error.get("B"), 10))
        a.stop()
        self.assertEqual([t.name for t in a.threads if t.is_alive()], [])
        self.start(self.node("A", aa, {"B": free_address()}, data_address=da))

    def test_welcome_lost(self):
        # B's welcome to A's dial cannot be sent: that dial fails, and the
        # next one is served (no set-up left marked as in progress).
        aa, ba = free_address(), free_address()
        b = self.node("B", ba, {"A": free_address()})
        frame, lost = b._frame, []

        def failing(ftype, body, stream=0):
            if ftype == node_mod.F_WELCOME and not lost:
                lost.append(ftype)
                raise OSError("welcome lost")
            return frame(ftype, body, stream)

        b._frame = failing
        self.start(b)
        a = self.start(self.node("A", aa, {"B": ba}))
        a.wait_peer("B")
        b.wait_peer("A")
        self.assertEqual(lost, [node_mod.F_WELCOME])
        self.assertEqual(list(b.mesh.refused), [])

    def test_self_in_peers(self):
        # The config's whole node list, this node included: it dials the
        # others, not itself.
        aa, ba = free_address(), free_address()
        a = self.start(self.node("A", aa, {"A": aa, "B": ba}))
        self.start(self.node("B", ba, {"A": aa, "B": ba}))
        a.wait_peer("B")
        self.assertEqual(sorted(t.name for t in a.threads if t.name.startswith("tensorferry-dial")),
                         ["tensorferry-dial-B"])
        self.assertNotIn("A", a.conns)
        # A peer that claims A's own name is refused.
        import socket as so
        host, port = aa.rsplit(":", 1)
        s = so.create_connection((host, int(port)), timeout=10)
        self.addCleanup(s.close)
        with self.assertRaisesRegex(node_mod.TensorferryError, "refused.*'A' not in the config"):
            a._initiate(s, "control", "A")

    def test_impostor(self):
        # A node of another incarnation that claims B while B's connection
        # is live is refused; once B is gone, the new incarnation is let in.
        aa, ba = free_address(), free_address()
        a = self.start(self.node("A", aa, {"B": ba}))
        b = self.start(self.node("B", ba, {"A": aa}))
        a.wait_peer("B")
        x = self.start(self.node("B", free_address(), {"A": aa}))
        with a.mu:
            self.assertTrue(a.up_cv.wait_for(lambda: any("claims a node whose connection is live" in r
                                                         for r in a.mesh.refused), 10))
            self.assertEqual(a.conns["B"].inc, b.incarnation)
        b.stop()
        x.wait_peer("A")
        with a.mu:
            self.assertEqual(a.conns["B"].inc, x.incarnation)

    def test_refusals(self):
        n = self.node("B", free_address(), {"A": free_address(), "C": free_address()})
        m = n.mesh
        # Both ends dialing: the smaller name's dial wins.
        m.dialing.update(("A", "C"))
        m.admit("A", 5)  # B's own dial to A loses to A's
        m.accepting.clear()
        with self.assertRaisesRegex(membership.Refused, "both ends dialed; the connection dialed by B wins"):
            m.admit("C", 5)
        m.dialing.clear()
        # One inbound connection of a node at a time.
        m.admit("C", 5)
        with self.assertRaisesRegex(membership.Refused, "setting up another connection from C"):
            m.admit("C", 5)
        m.accepting.clear()
        # An older incarnation than one seen.
        m.highest["C"] = 9
        with self.assertRaisesRegex(membership.Refused, "knows incarnation 9 of C; 5 is older"):
            m.admit("C", 5)

        # Placing: an older incarnation, and a duplicate of an up
        # connection, are closed; a higher incarnation replaces.
        class C:
            def __init__(self, peer, inc, initiator):
                self.peer, self.inc, self.initiator, self.closed, self.caps = peer, inc, initiator, False, None

        with n.mu:
            self.assertEqual(m.place(C("C", 5, "C"), "C"),
                             (False, "C: connection from incarnation 5 closed: 9 is connected"))
            up = C("C", 9, "C")
            self.assertEqual(m.place(up, "C"), (True, None))
            up.caps = b""
            self.assertEqual(m.place(C("C", 9, "B"), "B"), (False, "C: duplicate connection dialed by B closed"))
            self.assertEqual(m.place(C("C", 10, "B"), "B"), (True, up))
            self.assertEqual((n.conns["C"].inc, m.highest["C"]), (10, 10))

    def test_keeps(self):
        class C:
            def __init__(self, peer, initiator, up=False, closed=False):
                self.peer, self.initiator, self.closed = peer, initiator, closed
                self.caps = b"" if up else None

        # Up: never gives way.
        self.assertTrue(membership.keeps("B", C("A", "B", up=True), "A"))
        # Closing: always does.
        self.assertFalse(membership.keeps("B", C("A", "A", up=True, closed=True), "A"))
        # Not up: the connection dialed by the smaller name wins.
        self.assertFalse(membership.keeps("B", C("A", "B"), "A"))
        self.assertTrue(membership.keeps("B", C("A", "A"), "B"))
        self.assertTrue(membership.keeps("A", C("B", "A"), "B"))
        self.assertFalse(membership.keeps("A", C("B", "B"), "A"))

    def test_gossip_refused(self):
        peers = {"n%d" % i: "127.0.0.1:%d" % (7000 + i) for i in range(16)}
        for kw, want in (
            ({"membership": "gossip"}, "membership 'gossip'.*cannot join gossip.*AES.*membership: mesh"),
            ({}, "17 nodes, more than 16.*cannot join gossip"),
            ({"discovery": {"etcd": {"endpoints": ["http://127.0.0.1:2379"]}}},
             "discovery section with membership left out means gossip.*cannot join gossip.*membership: mesh"),
            ({"membership": "gossip", "discovery": {"etcd": {"endpoints": ["http://127.0.0.1:2379"]}}},
             "membership 'gossip'.*cannot join gossip.*mesh_only: true"),
            # mesh + discovery runs; its section is checked.
            ({"membership": "mesh", "discovery": {"etcd": {}}}, "endpoints: at least one endpoint"),
            ({"membership": "swim"}, "membership 'swim'"),
        ):
            with self.subTest(kw=kw), self.assertRaisesRegex(ValueError, want):
                Node("c", SECRET, "py", "127.0.0.1:0", peers, ipc=False, **kw)
        # 16 nodes with membership left out run the mesh.
        del peers["n0"]
        Node("c", SECRET, "py", "127.0.0.1:0", peers, ipc=False)
        Node("c", SECRET, "py", "127.0.0.1:0", peers, ipc=False, membership="mesh")
        with self.assertRaisesRegex(ValueError, "reconnect_min"):
            Node("c", SECRET, "py", "127.0.0.1:0", peers, ipc=False, reconnect_min=1.0, reconnect_max=0.5)

    def test_gossip_mesh_only(self):
        # A node marked mesh_only joins a gossip cluster, with or without
        # discovery; an unmarked one is told to mark itself, with the key's
        # name.
        disc = {"etcd": {"endpoints": ["http://127.0.0.1:2379"]}}
        check = membership.check_membership
        for args in (("gossip", None, 3), (None, None, 17), ("", None, 40), ("mesh", None, 3), (None, None, 3),
                     ("mesh", disc, 3), ("gossip", disc, 3), (None, disc, 3)):
            with self.subTest(args=args):
                check(*args, mesh_only=True)
        for args, want in ((("gossip", None, 3), "membership 'gossip'"), ((None, None, 17), "17 nodes"),
                           (("gossip", disc, 3), "membership 'gossip'"),
                           ((None, disc, 3), "discovery section with membership left out means gossip")):
            with self.subTest(args=args), self.assertRaisesRegex(
                    ValueError, want + ".*cannot join gossip.*mark this node mesh_only: true.*mesh_only=True"):
                check(*args)
        with self.assertRaisesRegex(ValueError, "membership 'swim'"):
            check("swim", None, 3, mesh_only=True)
        # Node passes it on.
        peers = {"n%d" % i: "127.0.0.1:%d" % (7000 + i) for i in range(20)}
        Node("c", SECRET, "py", "127.0.0.1:0", peers, ipc=False, mesh_only=True)
        Node("c", SECRET, "py", "127.0.0.1:0", peers, ipc=False, membership="gossip", mesh_only=True)
        with self.assertRaisesRegex(ValueError, "21 nodes, more than 16.*mesh_only"):
            Node("c", SECRET, "py", "127.0.0.1:0", peers, ipc=False)


if __name__ == "__main__":
    unittest.main()

