"""ipc channel tests: messages equal to Go's bytes, hostile input refused,
and the protocol between an owner and a fetcher over a host-memory driver
double (tests/fakecuda.py)."""

import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402

from tensorferry import ipc  # noqa: E402
from tensorferry.codec import Struct, encode  # noqa: E402
from fakecuda import FakeDriver  # noqa: E402
from test_codec import golden  # noqa: E402

try:
    from hypothesis import given, settings, strategies as st
except ImportError:  # pragma: no cover
    given = None

MAC = bytes(range(32))
HANDLE = bytes(255 - i for i in range(64))


class GoldenTest(unittest.TestCase):
    """The values python/golden_test.go's ipcCases encodes."""

    def setUp(self):
        self.g = golden()

    def check(self, name, b, decoder):
        self.assertEqual(b, self.g[name], name)
        return decoder(self.g[name])

    def test_requests(self):
        self.check("ipc_request_challenge", ipc.encode_request(op=1), ipc.decode_request)
        r = self.check("ipc_request_prove", ipc.encode_request(op=2, challenge=12345678901, mac=MAC),
                       ipc.decode_request)
        self.assertEqual((r["challenge"], r["mac"]), (12345678901, MAC))
        r = self.check("ipc_request_begin", ipc.encode_request(
            op=3, inc=(1 << 40) + 5, export=7, lease=0xdeadbeefcafef00d, acq=99, alloc=3, offset=4096,
            bytes=1 << 20, want_handle=True), ipc.decode_request)
        self.assertEqual((r["inc"], r["lease"], r["want_handle"], r["bytes"]),
                         ((1 << 40) + 5, 0xdeadbeefcafef00d, True, 1 << 20))
        self.check("ipc_request_end", ipc.encode_request(op=4, acq=1), ipc.decode_request)
        r = self.check("ipc_request_revoke", ipc.encode_request(op=5, inc=9, revoked=[1, 1 << 33]),
                       ipc.decode_request)
        self.assertEqual(r["revoked"], [1, 1 << 33])

    def test_replies(self):
        self.check("ipc_reply_ok", ipc.encode_reply(code=0), ipc.decode_reply)
        r = self.check("ipc_reply_handle", ipc.encode_reply(
            code=0, handle=HANDLE, map_size=2 << 20, base=0x7f0000000000, device=1, revoked=[5]),
            ipc.decode_reply)
        self.assertEqual((r["handle"], r["map_size"], r["device"], r["revoked"]), (HANDLE, 2 << 20, 1, [5]))
        r = self.check("ipc_reply_challenge", ipc.encode_reply(
            code=0, challenge=77, path="/dev/shm/tensorferry-ipc-00ff"), ipc.decode_reply)
        self.assertEqual(r["path"], "/dev/shm/tensorferry-ipc-00ff")
        r = self.check("ipc_reply_error", ipc.encode_reply(
            code=4, msg="ipc: peer has not proven it runs on this host"), ipc.decode_reply)
        self.assertEqual(r["code"], 4)

    def test_offers(self):
        self.assertEqual(ipc.encode_offer(3, 4096, 1 << 20, 2 << 20), self.g["ipc_offer"])
        self.assertEqual(ipc.decode_offer(self.g["ipc_offer"]), (3, 4096, 1 << 20, 2 << 20, 0, 0))
        self.assertEqual(ipc.encode_offer(1 << 40, 0, 64, 1 << 21, 1, 123456789), self.g["ipc_offer_direct"])
        self.assertEqual(ipc.decode_offer(self.g["ipc_offer_direct"]), (1 << 40, 0, 64, 1 << 21, 1, 123456789))

    def test_host_id(self):
        # Go's memory.HostID: the env override, else a hash of the boot id.
        os.environ["TENSORFERRY_HOST_ID"] = "h1"
        try:
            self.assertEqual(ipc.host_id(), "h1")
        finally:
            del os.environ["TENSORFERRY_HOST_ID"]
        self.assertEqual(len(ipc.host_id()), 16)
        self.assertEqual(ipc._hash_id("hostname", "x"),
                         __import__("hashlib").sha256(b"tensorferry host\0hostname\0x").hexdigest()[:16])


class HostileTest(unittest.TestCase):
    def refused(self, fn, b, want):
        with self.assertRaises(ipc.IPCError) as cm:
            fn(b)
        self.assertIn(want, str(cm.exception))
        self.assertEqual(cm.exception.code, ipc.CODE_PROTOCOL)

    def test_requests(self):
        r = ipc.decode_request
        self.refused(r, bytes(ipc.MAX_CONTROL + 1), "request of 4097 bytes")
        self.refused(r, b"\xc1", "invalid msgpack")
        self.refused(r, bytes(encode([1, 2])), "not a map")
        self.refused(r, bytes(encode(Struct(o=9))), "unknown op 9")
        self.refused(r, bytes(encode(Struct(o=2, m=b"short"))), "MAC of 5 bytes")
        self.refused(r, bytes(encode(Struct(o=5))), "revoke of 0")
        self.refused(r, bytes(encode(Struct(o=5, r=list(range(65))))), "revoke of 65")
        self.refused(r, bytes(encode(Struct(o=3, f=1 << 51))), "range")
        self.refused(r, bytes(encode(Struct(o=3, l=-1))), "field l")
        self.refused(r, bytes(encode(Struct(o=3, l="x"))), "field l")
        self.refused(r, bytes(encode(Struct(o=3, w=1))), "field w")
        self.refused(r, bytes(encode(Struct(o=5, r=[-1]))), "field r")
        self.refused(r, bytes(encode(Struct(o=256))), "field o")
        # A count that claims more than the bytes there is refused unread.
        self.refused(r, b"\xdf\xff\xff\xff\xff", "map of")

    def test_replies(self):
        r = ipc.decode_reply
        self.refused(r, bytes(encode(Struct(c=0, h=b"x" * 63, n=1))), "IPC handle of 63 bytes")
        self.refused(r, bytes(encode(Struct(c=0, h=HANDLE))), "without a size")
        self.refused(r, bytes(encode(Struct(c=0, n=10, s=11))), "shift 11")
        self.refused(r, bytes(encode(Struct(c=0, n=1 << 51))), "mapping of")
        self.refused(r, bytes(encode(Struct(c=0, p=b"x"))), "process id")
        self.refused(r, bytes(encode(Struct(c=0, d=-1))), "device -1")
        self.refused(r, bytes(encode(Struct(c=0, r=list(range(65))))), "65 revoked")
        self.refused(r, bytes(encode(Struct(c=0, f="/" * 513))), "path of 513")
        self.refused(r, bytes(encode(Struct(c=1 << 32))), "field c")

    def test_offers(self):
        o = ipc.decode_offer
        self.refused(o, b"\x02" * 41, "offer of 41 bytes")
        self.refused(o, None, "offer of -1 bytes")
        self.refused(o, b"\x01" + bytes(41), "version 1")
        self.refused(o, ipc.encode_offer(1, 10, 11, 20), "outside")
        self.refused(o, ipc.encode_offer(1, 21, 0, 20), "outside")
        self.refused(o, ipc.encode_offer(1, 0, 0, 1 << 51), "outside")
        self.refused(o, ipc.encode_offer(1, 0, 1, 20, flags=2), "flags")

    def test_challenge_path(self):
        with self.assertRaises(ipc.IPCError):
            ipc.answer_challenge("/etc/passwd", "n")
        with self.assertRaises(ipc.IPCError):
            ipc.answer_challenge("/dev/shm/../etc/tensorferry-ipc-x", "n")
        with self.assertRaises(ipc.IPCError):
            ipc.answer_challenge("/dev/shm/other-file", "n")

    if given is not None:
        @settings(max_examples=400, deadline=None)
        @given(st.binary(max_size=200))
        def test_random_bytes(self, b):
            for fn in (ipc.decode_request, ipc.decode_reply, ipc.decode_offer):
                try:
                    fn(b)
                except ipc.IPCError:
                    pass

        @settings(max_examples=200, deadline=None)
        @given(st.fixed_dictionaries({
            "op": st.sampled_from([1, 3, 4]), "inc": st.integers(0, 2**64 - 1),
            "export": st.integers(0, 2**64 - 1), "lease": st.integers(0, 2**64 - 1),
            "acq": st.integers(0, 2**64 - 1), "alloc": st.integers(0, 2**64 - 1),
            "offset": st.integers(0, 1 << 50), "bytes": st.integers(0, 1 << 50),
            "want_handle": st.booleans()}))
        def test_request_round_trip(self, kw):
            r = ipc.decode_request(ipc.encode_request(**kw))
            for k, v in kw.items():
                self.assertEqual(r[k], v)


class ProtocolTest(unittest.TestCase):
    """An owner and a fetcher of one process over the driver double: the
    messages between them go through the encoders and decoders."""

    def setUp(self):
        self.shm = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.shm)
        self.drv = FakeDriver()
        self.exports = {}
        self.owner = ipc.Owner(self.drv, self.exports.get, 42, shm_dir=self.shm, max_acquisitions=4)
        self.sent = []

        def call(owner, body, timeout):
            self.assertEqual(owner, "go-1")
            return self.owner.handle(self.name, body)

        def send(owner, body):
            self.sent.append(body)
            self.owner.handle(self.name, body)

        self.name = "py-1"
        self.fetcher = ipc.Fetcher(self.drv, "py-1", call, send, shm_dir=self.shm)

    def lend(self, t, eid, holder="py-1", lease=7):
        class X:
            pass
        x = X()
        x.ipc_offer = self.owner.offer(t)
        self.exports[eid] = (lease, x, holder)
        n = t.numel() * t.element_size()
        return {"o": "go-1", "i": 42, "e": eid, "l": lease, "t": 9, "s": [n], "b": n,
                "d": "cuda:0", "h": holder, "f": {"ipc": x.ipc_offer}}

    def test_fetch_proves_maps_once_and_copies(self):
        a = self.drv.alloc(1 << 16)
        a.copy_(torch.arange(1 << 16) % 251)
        t = a[100:100 + 5000]
        d = self.lend(t, 1)
        dst = torch.empty(5000, dtype=torch.uint8)
        self.fetcher.fetch(d, dst, 5)
        self.assertTrue(torch.equal(dst, t))
        self.assertEqual(self.fetcher.stats["proofs"], 1)
        self.assertEqual(self.fetcher.stats["opens"], 1)
        self.assertEqual(os.listdir(self.shm), [], "challenge file left behind")
        # A second tensor of the same allocation: the mapping is reused.
        d2 = self.lend(a[0:10], 2)
        dst2 = torch.empty(10, dtype=torch.uint8)
        self.fetcher.fetch(d2, dst2, 5)
        self.assertTrue(torch.equal(dst2, a[0:10]))
        self.assertEqual((self.fetcher.stats["opens"], self.fetcher.stats["reuses"]), (1, 1))
        self.assertEqual(self.owner.acquisitions(), 0, "every begin was ended")
        self.assertEqual(self.owner.stats["handles"], 1)

    def test_refusals(self):
        a = self.drv.alloc(64)
        d = self.lend(a, 1)
        dst = torch.empty(64, dtype=torch.uint8)
        for change, code in (({"l": 8}, ipc.CODE_RELEASED), ({"e": 99}, ipc.CODE_NOT_FOUND),
                             ({"i": 41}, ipc.CODE_STALE)):
            with self.assertRaises(ipc.IPCError) as cm:
                self.fetcher.fetch(dict(d, **change), dst, 5)
            self.assertEqual(cm.exception.code, code, cm.exception)
        # Lent to another node: refused to this one.
        d = self.lend(a, 3, holder="go-2")
        with self.assertRaises(ipc.IPCError) as cm:
            self.fetcher.fetch(d, dst, 5)
        self.assertIn("lent to go-2", str(cm.exception))
        # An offer that does not match the export.
        d = self.lend(a[8:], 4)
        d["f"] = {"ipc": ipc.encode_offer(ipc.decode_offer(d["f"]["ipc"])[0], 0, 56, 64)}
        with self.assertRaises(ipc.IPCError) as cm:
            self.fetcher.fetch(d, torch.empty(56, dtype=torch.uint8), 5)
        self.assertIn("does not match", str(cm.exception))
        self.assertEqual(self.owner.acquisitions(), 0)
        self.assertEqual(self.drv.copies, 0)

    def test_wrong_proof(self):
        rep = ipc.decode_reply(self.owner.handle("py-1", ipc.encode_request(op=ipc.OP_CHALLENGE)))
        mac = ipc.answer_challenge(rep["path"], "someone-else", self.shm)
        rep = ipc.decode_reply(self.owner.handle("py-1", ipc.encode_request(
            op=ipc.OP_PROVE, challenge=rep["challenge"], mac=mac)))
        self.assertEqual(rep["code"], ipc.CODE_AUTH)
        self.assertIn("wrong answer", rep["msg"])
        self.assertEqual(os.listdir(self.shm), [])
        # Unproven: no handle.
        a = self.drv.alloc(64)
        d = self.lend(a, 1)
        rep = ipc.decode_reply(self.owner.handle("py-1", ipc.encode_request(
            op=ipc.OP_BEGIN, inc=42, export=1, lease=7, acq=1, alloc=ipc.decode_offer(d["f"]["ipc"])[0],
            bytes=64, want_handle=True)))
        self.assertEqual(rep["code"], ipc.CODE_AUTH)
        self.assertEqual(rep["handle"], b"")

    def test_bounds(self):
        a = self.drv.alloc(64)
        d = self.lend(a, 1)
        alloc = ipc.decode_offer(d["f"]["ipc"])[0]
        begin = dict(op=ipc.OP_BEGIN, inc=42, export=1, lease=7, alloc=alloc, bytes=64)
        for i in range(4):
            rep = ipc.decode_reply(self.owner.handle("py-1", ipc.encode_request(acq=i + 1, **begin)))
            self.assertEqual(rep["code"], 0, rep)
        rep = ipc.decode_reply(self.owner.handle("py-1", ipc.encode_request(acq=9, **begin)))
        self.assertEqual(rep["code"], ipc.CODE_UNAVAILABLE)
        rep = ipc.decode_reply(self.owner.handle("py-1", ipc.encode_request(acq=1, **begin)))
        self.assertIn("already in use", rep["msg"])
        self.owner.peer_down("py-1")
        self.assertEqual(self.owner.acquisitions(), 0)
        # Garbage is an error reply, never an exception.
        rep = ipc.decode_reply(self.owner.handle("py-1", b"\xff\x00"))
        self.assertEqual(rep["code"], ipc.CODE_PROTOCOL)

    def test_expandable_segments_refused(self):
        a = self.drv.alloc(64, legacy=False)
        with self.assertRaises(ipc.Refused) as cm:
            self.owner.offer(a)
        self.assertIn("expandable segments", str(cm.exception))

    def test_reused_address_revokes(self):
        a = self.drv.alloc(64)
        a.fill_(1)
        d = self.lend(a, 1)
        dst = torch.empty(64, dtype=torch.uint8)
        self.fetcher.fetch(d, dst, 5)
        old = ipc.decode_offer(d["f"]["ipc"])[0]
        # The allocation is freed and another takes its address: a new
        # allocation id, and the fetcher is told to close the old mapping.
        self.drv.free(a)
        self.drv.allocs[a.data_ptr()] = [a, 99, True]
        a.fill_(2)
        d2 = self.lend(a, 2)
        self.assertNotEqual(ipc.decode_offer(d2["f"]["ipc"])[0], old)
        self.assertEqual(self.owner.take_revoked("py-1"), [old])
        self.fetcher.revoke("go-1", 42, [old])
        self.assertEqual(self.fetcher.open_mappings(), 0)
        self.fetcher.fetch(d2, dst, 5)
        self.assertTrue(bool((dst == 2).all()))

    def test_revoke_from_owner(self):
        a = self.drv.alloc(64)
        d = self.lend(a, 1)
        self.fetcher.fetch(d, torch.empty(64, dtype=torch.uint8), 5)
        self.assertEqual(self.fetcher.open_mappings(), 1)
        alloc = ipc.decode_offer(d["f"]["ipc"])[0]
        rep = ipc.decode_reply(self.fetcher.handle("go-1", ipc.encode_request(
            op=ipc.OP_REVOKE, inc=42, revoked=[alloc])))
        self.assertEqual(rep["code"], 0)
        self.assertEqual(self.fetcher.open_mappings(), 0)
        self.assertEqual(self.drv.open, {})
        rep = ipc.decode_reply(self.fetcher.handle("go-1", ipc.encode_request(op=ipc.OP_BEGIN)))
        self.assertEqual(rep["code"], ipc.CODE_PROTOCOL)

    def test_owner_direct_offers(self):
        a = self.drv.alloc(256)
        a.fill_(5)
        self.assertEqual(ipc.decode_offer(self.owner.offer(a, "py-1"))[4], 0, "direct before any handle")
        self.fetcher.fetch(self.lend(a, 1), torch.empty(256, dtype=torch.uint8), 5)
        # The holder maps the allocation now: offers to it are direct, with
        # no deadline (the export lives until released); to others not.
        o = self.owner.offer(a[16:], "py-1")
        self.assertEqual(ipc.decode_offer(o)[4:], (ipc.FLAG_DIRECT, 0))
        self.assertEqual(ipc.decode_offer(self.owner.offer(a, "go-2"))[4], 0)
        d = self.lend(a[16:], 2)
        d["f"] = {"ipc": o}
        begins = self.owner.stats["begins"]
        dst = torch.empty(240, dtype=torch.uint8)
        self.fetcher.fetch(d, dst, 5)
        self.assertTrue(bool((dst == 5).all()))
        self.assertEqual((self.fetcher.stats["direct"], self.owner.stats["begins"]), (1, begins))
        off = ipc.Owner(self.drv, self.exports.get, 42, shm_dir=self.shm, direct=False)
        off.proven.add("py-1")
        off.offer(a)
        off.grants["py-1"] = set(off.by_id)
        self.assertEqual(ipc.decode_offer(off.offer(a, "py-1"))[4], 0)

    def test_direct_offer(self):
        a = self.drv.alloc(64)
        a.fill_(3)
        d = self.lend(a, 1)
        self.fetcher.fetch(d, torch.empty(64, dtype=torch.uint8), 5)
        alloc, off, n, size, _, _ = ipc.decode_offer(d["f"]["ipc"])
        begins = self.owner.stats["begins"]
        import time
        far = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 30 * 10**9
        d["f"] = {"ipc": ipc.encode_offer(alloc, off, n, size, ipc.FLAG_DIRECT, far)}
        dst = torch.empty(64, dtype=torch.uint8)
        self.fetcher.fetch(d, dst, 5)
        self.assertTrue(bool((dst == 3).all()))
        self.assertEqual((self.fetcher.stats["direct"], self.owner.stats["begins"]), (1, begins))
        # Too little of the lease left: begins instead.
        near = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 10**6
        d["f"] = {"ipc": ipc.encode_offer(alloc, off, n, size, ipc.FLAG_DIRECT, near)}
        self.fetcher.fetch(d, dst, 5)
        self.assertEqual((self.fetcher.stats["direct"], self.owner.stats["begins"]), (1, begins + 1))

    def test_fetch_direct(self):
        """fetch_direct copies under a direct offer of a mapped allocation
        and sends nothing; otherwise it does nothing and says so."""
        a = self.drv.alloc(64)
        a.fill_(4)
        d = self.lend(a, 1)
        dst = torch.empty(64, dtype=torch.uint8)
        self.assertFalse(self.fetcher.fetch_direct(d, dst), "not mapped, not direct")
        self.assertEqual(self.owner.stats["begins"], 0)
        self.fetcher.fetch(d, dst, 5)
        self.assertFalse(self.fetcher.fetch_direct(d, dst), "mapped, but not a direct offer")
        alloc, off, n, size, _, _ = ipc.decode_offer(d["f"]["ipc"])
        import time
        far = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 30 * 10**9
        begins = self.owner.stats["begins"]
        dd = dict(d, f={"ipc": ipc.encode_offer(alloc, off, n, size, ipc.FLAG_DIRECT, far)})
        self.assertFalse(self.fetcher.fetch_direct(dict(dd, h="other"), dst), "direct to another holder")
        self.assertFalse(self.fetcher.fetch_direct(dd, torch.empty(8, dtype=torch.uint8)), "too small")
        dst.zero_()
        self.assertTrue(self.fetcher.fetch_direct(dd, dst))
        self.assertTrue(bool((dst == 4).all()))
        self.assertEqual((self.fetcher.stats["direct"], self.owner.stats["begins"]), (1, begins))


if __name__ == "__main__":
    unittest.main()
