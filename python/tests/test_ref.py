"""Lazy tensor.Ref fields (tensorferry.Ref): delivered unfetched, fetched
once from any thread, released once, refused when hostile, released when
delivered to nobody or when the node stops; sent as "ref" entries."""

import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from tensorferry.codec import Struct, TensorRef, decode, encode  # noqa: E402
from tensorferry.message import (ENTRY_REF, BadTable, decode_envelope, decode_table,  # noqa: E402
                                 encode_envelope)
from tensorferry.node import (F_MESSAGE, F_RELEASE, F_SYSTEM, Message, Node, Ref, RefSpent,  # noqa: E402
                              TensorferryError)


class FakeConn:
    def __init__(self, peer, inc=5):
        self.peer, self.inc, self.sent, self.caps, self.closed = peer, inc, [], b"\x80", False

    def send(self, ftype, body, stream=0):
        self.sent.append((ftype, body))

    def close(self, why):
        self.closed = True


def desc(**kw):
    d = Struct((("o", "go"), ("i", 5), ("e", 3), ("l", 9), ("t", 1), ("s", [2]), ("b", 8)))
    d.update(kw)
    return d


class RefTest(unittest.TestCase):
    def setUp(self):
        self.node = Node("c", b"0123456789abcdef", "py", "127.0.0.1:0", {"go": "127.0.0.1:1"}, ipc=False)
        self.conn = FakeConn("go")
        self.node.conns["go"] = self.conn
        self.fetches = []  # (thread, own_conn, timeout)

        def fetch_one(c, d, dst, own_conn=False, timeout=None):
            self.fetches.append((threading.current_thread(), own_conn, timeout))
            dst[:] = torch.tensor([1.5, -2.0]).view(torch.uint8).numpy().tobytes()
        self.node._fetch_one = fetch_one
        self.node.handle("sink", lambda m: None)

    def send_in(self, d, kind=TensorRef.REF, target="sink", entry=ENTRY_REF, extra=None):
        """A message with a Ref field R (and extra table rows) into the node."""
        rows = [Struct((("i", 7), ("k", entry), ("t", 0), ("s", None), ("b", None), ("d", d)))]
        fields = Struct(R=TensorRef(kind, 7), N=1)
        for wid, row in (extra or []):
            rows.append(row)
            fields["X%d" % wid] = TensorRef(TensorRef.TENSOR, wid)
        env = encode_envelope(target=target, sender_node="go", sender_id="asker", type_name="t.M", ser=1,
                              body=bytes(encode(fields)), tensors=bytes(encode(rows)))
        self.node._message_in(self.conn, env)

    def delivered(self):
        self.assertFalse(self.node.inbox.q.empty(), "nothing delivered; errors %r" % (self.node.errors,))
        target, msg = self.node.inbox.get()
        self.node.inbox.done()
        return msg

    def releases(self):
        return [dict(b) for f, b in self.conn.sent if f == F_RELEASE]

    def test_fetch_once(self):
        self.send_in(desc())
        r = self.delivered()["R"]
        self.assertIsInstance(r, Ref)
        self.assertEqual((self.fetches, self.conn.sent), ([], []))  # lazy: nothing moved yet
        self.assertEqual((r.nbytes, r.dtype, tuple(r.shape), r.owner, r.spent), (8, torch.float32, (2,), "go", False))
        out = []
        t = threading.Thread(target=lambda: out.append(r.fetch(timeout=3.0)))
        t.start()
        t.join(10)
        self.assertTrue(torch.equal(out[0], torch.tensor([1.5, -2.0])))
        # On the fetching thread, over a data connection of its own.
        self.assertEqual(self.fetches, [(t, True, 3.0)])
        self.assertEqual(self.releases(), [{"e": 3, "l": 9, "i": 5}])
        self.assertEqual(self.node.transfers[-1], ("staging", "go", 8))
        with self.assertRaises(RefSpent):
            r.fetch()
        r.release()  # nothing: spent
        self.assertEqual(len(self.fetches), 1)
        self.assertEqual(len(self.releases()), 1)
        self.assertEqual(len(self.node.refs), 0)

    def test_fetch_to_device(self):
        self.send_in(desc())
        x = self.delivered()["R"].fetch("cpu")
        self.assertEqual((x.device.type, x.dtype, x.tolist()), ("cpu", torch.float32, [1.5, -2.0]))

    def test_release_idempotent(self):
        self.send_in(desc())
        r = self.delivered()["R"]
        r.release()
        r.release()
        self.assertEqual(self.releases(), [{"e": 3, "l": 9, "i": 5}])
        with self.assertRaises(RefSpent):
            r.fetch()
        self.assertEqual(self.fetches, [])

    def test_context_manager(self):
        self.send_in(desc())
        with self.delivered()["R"] as r:
            pass
        self.assertTrue(r.spent)
        self.assertEqual(len(self.releases()), 1)
        self.send_in(desc(e=4))
        with self.delivered()["R"] as r:
            r.fetch()
        self.assertEqual([x["e"] for x in self.releases()], [3, 4])

    def test_hostile_refused(self):
        bad = [desc(o="other"), desc(i=6), desc(b=9), desc(t=99), desc(t=[1]), desc(t={}), desc(t=True),
               desc(s=[1] * 9), desc(s=[-1]),
               desc(e=-1), desc(l="x"), desc(f=[1]), desc(d=7)]
        for d in bad:
            self.conn.sent.clear()
            self.send_in(d)
            self.assertTrue(self.node.inbox.q.empty(), d)
            self.assertIn("refused", self.node.errors[-1])
            # Its lease goes back to its owner, when that is a node up.
            want = [F_SYSTEM] if d["o"] == "other" or d["i"] == 6 else [F_RELEASE, F_SYSTEM]
            self.assertEqual([f for f, _ in self.conn.sent], want, d)
        self.assertEqual(len(self.node.refs), 0)
        # A Ref field naming a tensor entry, a tensor field naming a Ref
        # entry: bad tables (the connection goes), nothing held.
        for kind, entry in ((TensorRef.REF, 1), (TensorRef.TENSOR, ENTRY_REF)):
            d = desc()
            with self.assertRaises(BadTable):
                if entry == 1:
                    row = Struct((("i", 7), ("k", 1), ("t", 9), ("s", [1]), ("b", b"x"), ("d", None)))
                    env = encode_envelope(target="sink", sender_node="go", type_name="t.M", ser=1,
                                          body=bytes(encode(Struct(R=TensorRef(kind, 7)))),
                                          tensors=bytes(encode([row])))
                    self.node._message_in(self.conn, env)
                else:
                    self.send_in(d, kind=kind)
        self.assertEqual(len(self.node.refs), 0)

    def test_forwarded_to_this_node(self):
        # A Ref whose owner is another node than its sender: fetched from
        # and released to the owner, if it is up.
        owner = self.node.conns["go2"] = FakeConn("go2", inc=8)
        self.send_in(desc(o="go2", i=8))
        r = self.delivered()["R"]
        self.assertEqual(r.owner, "go2")
        self.fetches.clear()
        seen = []
        self.node._fetch_one = lambda c, d, dst, own_conn=False, timeout=None: seen.append(c)
        r.fetch()
        self.assertEqual(seen, [owner])
        self.assertEqual(([f for f, _ in owner.sent], self.releases()), ([F_RELEASE], []))
        # An owner that is not up, or of another incarnation: refused.
        for d in (desc(o="go3"), desc(o="go2", i=9), desc(o=7)):
            self.conn.sent.clear()
            self.send_in(d)
            self.assertTrue(self.node.inbox.q.empty(), d)
            self.assertIn("refused", self.node.errors[-1])
            self.assertEqual([f for f, _ in self.conn.sent], [F_SYSTEM])
        self.assertEqual(len(owner.sent), 1)

    def test_unhashable_dtype(self):
        # A dtype that is a list or a map: refused with BadTable, in a
        # descriptor to fetch as in an inline entry (it was a TypeError
        # that killed the connection's reader).
        self.send_in(desc(t=[1]), entry=2, kind=TensorRef.TENSOR)
        self.assertIn("refused", self.node.errors[-1])
        for t in ([1], {}, True):
            with self.assertRaises(BadTable):
                decode_table(bytes(encode([Struct(i=1, k=1, t=t, s=[1], b=b"x", d=None)])))

    def test_budget_counts_fetched_only(self):
        self.node.receive_budget = 6
        self.send_in(desc())  # 8 bytes: delivered, not counted
        r = self.delivered()["R"]
        with self.assertRaisesRegex(TensorferryError, "receive budget"):
            r.fetch()
        self.assertEqual(self.fetches, [])
        self.assertEqual(len(self.releases()), 1)  # the lease goes back, as Go's Ref.Fetch
        self.assertTrue(r.spent)

    def test_owner_down(self):
        self.send_in(desc())
        self.send_in(desc(e=4))
        r, r2 = self.delivered()["R"], self.delivered()["R"]
        self.node.conns.pop("go")
        with self.assertRaisesRegex(TensorferryError, "down"):
            r.fetch()
        self.assertEqual((self.fetches, self.releases()), ([], []))  # the lease went with the owner's node
        # Restarted owner (another incarnation): the same, and nothing
        # is released to the new one.
        self.conn = self.node.conns["go"] = FakeConn("go", inc=6)
        with self.assertRaisesRegex(TensorferryError, "down"):
            r2.fetch()
        r2.release()
        self.assertEqual((self.fetches, self.conn.sent), ([], []))

    def test_fetch_fails(self):
        self.send_in(desc())
        r = self.delivered()["R"]

        def fail(c, d, dst, own_conn=False, timeout=None):
            raise OSError("connection refused")
        self.node._fetch_one = fail
        with self.assertRaisesRegex(TensorferryError, "connection refused"):
            r.fetch()
        self.assertEqual(len(self.releases()), 1)
        with self.assertRaises(RefSpent):
            r.fetch()

    def test_not_inline(self):
        # A message with a Ref never runs on the reader; a fetch there is refused.
        ran = []
        self.node.handle("sink", lambda m: ran.append(m), inline=True)
        self.send_in(desc())
        self.assertEqual(ran, [])
        r = self.delivered()["R"]
        self.node._tl.inline = True
        with self.assertRaisesRegex(TensorferryError, "inline handler"):
            r.fetch()

    def test_delivered_to_nobody(self):
        self.send_in(desc(), target="nobody")
        self.assertEqual(len(self.releases()), 1)
        self.send_in(desc(e=4), target="future#77")  # a reply nobody waits for
        self.assertEqual([x["e"] for x in self.releases()], [3, 4])
        self.assertEqual(len(self.node.refs), 0)

    def test_with_fetched_tensor(self):
        # A Ref beside a tensor to fetch: the tensor is fetched before the
        # handler runs, the Ref is not.
        row = Struct((("i", 8), ("k", 2), ("t", 0), ("s", None), ("b", None), ("d", desc(e=11))))
        self.node.handle("sink", lambda m: None, inline=True)
        inlined = []
        self.node._inline = lambda *a: inlined.append(a)
        self.send_in(desc(), extra=[(8, row)])
        self.assertEqual(inlined, [])  # never on the reader: its handler may fetch the Ref
        target, (c, env, table, fetches) = self.node.inbox.get()
        self.node.inbox.done()
        self.assertEqual(target, "fetch")
        got = []
        self.node._run = lambda target, msg, after=None: (got.append(msg), after and after())
        self.node._fetch(c, env, table, fetches)
        self.assertEqual(len(self.fetches), 1)
        self.assertIsInstance(got[0]["R"], Ref)
        self.assertEqual([x["e"] for x in self.releases()], [11])
        got[0]["R"].release()

    def test_stop_releases(self):
        self.send_in(desc())
        self.send_in(desc(e=4))
        self.delivered()["R"].fetch()
        self.node.stop()
        self.assertEqual(sorted(x["e"] for x in self.releases()), [3, 4])


try:
    from hypothesis import given, settings, strategies as st
except ImportError:  # pragma: no cover
    given = None

if given is not None:
    field = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.text(max_size=40)
             | st.binary(max_size=8) | st.lists(st.integers(-2, 2**40), max_size=10)
             | st.dictionaries(st.text(max_size=4), st.binary(max_size=4) | st.integers(-9, 2**40), max_size=3))
    # A valid descriptor with a few fields changed, or anything.
    descriptors = st.builds(lambda m: dict(desc(), **m), st.dictionaries(
        st.sampled_from(list("oieltsbdhfc")), field | st.sampled_from([0, 4, 8, 1 << 30, "go", "cuda:0"]),
        max_size=2)) | st.dictionaries(st.sampled_from(list("oieltsbdhfc")), field)

    class RefPropertyTest(unittest.TestCase):
        @settings(max_examples=400, deadline=None)
        @given(descriptors, st.sampled_from([TensorRef.REF, TensorRef.TENSOR]))
        def test_any_descriptor(self, d, kind):
            # Any descriptor: a Ref delivered (checked: its size within
            # the budget when fetched) or the message refused, its lease
            # back to the owner; never another exception, nothing held.
            t = RefTest("test_fetch_once")
            t.setUp()
            t.node.receive_budget = 1 << 20
            t.node._fetch_one = lambda c, d, dst, own_conn=False, timeout=None: None
            try:
                t.send_in(d, kind=kind)
            except BadTable:
                self.assertEqual(len(t.node.refs), 0)
                return
            if t.node.inbox.q.empty():
                self.assertIn("refused", t.node.errors[-1])
                self.assertEqual(len(t.node.refs), 0)
                return
            r = t.delivered()["R"]
            try:
                x = r.fetch()
                self.assertEqual(x.numel() * x.element_size(), r.nbytes)
            except TensorferryError as e:
                self.assertIn("budget", str(e))
            self.assertEqual((len(t.releases()), len(t.node.refs)), (1, 0))


class RefIPCTest(unittest.TestCase):
    """A Ref fetched over ipc (the owner an ipc.Owner over the driver
    double) when the owner offers it on this host and the device asked is
    CUDA or none; through staging into host memory when it is "cpu"."""

    def test_ipc(self):
        import shutil
        import tempfile
        from tensorferry import ipc
        sys.path.insert(0, os.path.dirname(__file__))
        from fakecuda import FakeDriver
        shm = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, shm)
        drv = FakeDriver()
        exports = {}
        owner = ipc.Owner(drv, exports.get, 5, shm_dir=shm)
        node = Node("c", b"0123456789abcdef", "py", "127.0.0.1:0", {"go": "127.0.0.1:1"}, ipc=False)
        node.ipc_owner = ipc.Owner(drv, node._lookup_export, node.incarnation, shm_dir=shm)
        node.ipc_fetcher = ipc.Fetcher(drv, "py", lambda o, body, t: owner.handle("py", body),
                                       lambda o, body: owner.handle("py", body), shm_dir=shm)
        node.device, node.devices = torch.device("cpu", 0), [Struct(d="cuda:0", u="GPU-1", p="")]
        conn = FakeConn("go")
        conn.caps = bytes(encode({"c": {"h": node.host_id, "c": ["staging", "ipc"],
                                        "g": [{"d": "cuda:0", "u": "GPU-1"}]}}))
        node.conns["go"] = conn
        staged = []
        node._fetch_one = lambda c, d, dst, own_conn=False, timeout=None: staged.append(d["e"])
        a = drv.alloc(4096)
        src = a[64:64 + 400].view(torch.float32)
        src.copy_(torch.arange(100, dtype=torch.float32) - 3.5)

        class X:
            ipc_offer = owner.offer(src)
        refs = []
        for e in (11, 12):
            exports[e] = (77, X(), "py")
            d = desc(e=e, l=77, s=[10, 10], b=400, d="cuda:0", h="py", f={"ipc": X.ipc_offer})
            refs.append(Ref._received(node, d))
        x = refs[0].fetch()
        self.assertTrue(torch.equal(x, src.reshape(10, 10)))
        self.assertEqual((node.transfers[-1], staged), (("ipc", "go", 400), []))
        self.assertEqual(owner.acquisitions(), 0)
        refs[1].fetch("cpu")
        self.assertEqual(staged, [12])
        self.assertEqual([dict(b)["e"] for f, b in conn.sent if f == F_RELEASE], [11, 12])


class RefSendTest(unittest.TestCase):
    def setUp(self):
        self.node = Node("c", b"0123456789abcdef", "py", "127.0.0.1:0", {"go": "127.0.0.1:1"}, ipc=False,
                         data_address="127.0.0.1:0")
        self.conn = FakeConn("go")
        self.node.conns["go"] = self.conn

    def test_sent_as_ref_entry(self):
        x = torch.arange(3, dtype=torch.int32)  # small, yet lent: a Ref is never inline
        self.node.send(("go", "sink"), Message("t.M", {"R": Ref(x), "N": 2}))
        env = decode_envelope(self.conn.sent[-1][1])
        self.assertEqual(self.conn.sent[-1][0], F_MESSAGE)
        refs = []
        decode(env["body"], refs)
        (row,) = decode(env["tensors"])
        self.assertEqual((refs, row["k"]), ([TensorRef(TensorRef.REF, row["i"])], ENTRY_REF))
        d = row["d"]
        self.assertEqual((d["o"], d["t"], d["s"], d["b"]), ("py", 7, [3], 12))
        self.assertEqual(bytes(self.node.exports[d["e"]][1]), x.numpy().tobytes())
        # A failed send lends nothing.
        with self.assertRaises(TensorferryError):
            self.node.send(("nowhere", "sink"), Message("t.M", {"R": Ref(x)}))
        self.assertEqual(len(self.node.exports), 1)
        with self.assertRaises(TypeError):
            Ref([1, 2])

    def test_forward(self):
        # A received Ref sent on: its descriptor goes, the lease is the
        # receiver's (this Ref spent, not released, not even on stop).
        r = Ref._received(self.node, desc())
        self.node.refs.add(r)
        # Not sent (no such node): still this node's.
        with self.assertRaises(TensorferryError):
            self.node.send(("nowhere", "sink"), Message("t.M", {"L": [{"R": r}]}))
        self.assertEqual((r.spent, len(self.node.refs)), (False, 1))
        self.node.send(("go", "sink"), Message("t.M", {"L": [{"R": r}]}))
        (row,) = decode(decode_envelope(self.conn.sent[-1][1])["tensors"])
        self.assertEqual((row["k"], dict(row["d"])), (ENTRY_REF, dict(desc())))
        self.assertEqual((r.spent, len(self.node.refs), self.node.exports, self.node.ref_deadlines),
                         (True, 0, {}, {}))
        with self.assertRaises(RefSpent):
            r.fetch()
        with self.assertRaises(RefSpent):
            self.node.send(("go", "sink"), Message("t.M", {"R": r}))
        self.node.stop()
        self.assertEqual([f for f, _ in self.conn.sent].count(F_RELEASE), 0)

    def test_lease_ends(self):
        import time
        self.node.ref_ttl = 30.0
        self.node.send(("go", "sink"), Message("t.M", {"R": Ref(torch.ones(4)), "N": 0}))
        self.node.send(("go", "sink"), Message("t.M", {"R": Ref(torch.ones(4)), "N": 1}))
        (e1, e2) = sorted(self.node.exports)
        del self.node.exports[e1]  # released by the receiver
        now = time.monotonic()
        self.node._expire_refs(now)
        self.assertEqual((list(self.node.exports), list(self.node.ref_deadlines)), ([e2], [e2]))
        self.node._expire_refs(now + 31.0)
        self.assertEqual((self.node.exports, self.node.ref_deadlines), ({}, {}))
        self.assertIn("unfetched", self.node.warnings[-1])

    def test_local_fetch_copies(self):
        x = torch.ones(2)
        r = Ref(x)
        y = r.fetch()
        y += 1
        self.assertEqual(x.tolist(), [1.0, 1.0])


if __name__ == "__main__":
    unittest.main()
