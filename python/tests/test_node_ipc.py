"""The node's control messages ("$tensorferry.ctl") and its ipc plumbing,
over the host-memory driver double: requests answered or refused, replies
matched to their waiter and peer, hostile descriptors refused."""

import os
import shutil
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from tensorferry import ipc  # noqa: E402
from tensorferry.codec import decode  # noqa: E402
from tensorferry.message import BadTable, decode_envelope, encode_envelope  # noqa: E402
from tensorferry.node import (CTL_REPLY, CTL_REQUEST, F_ERROR, F_MESSAGE, Node,  # noqa: E402
                              TensorferryError)
from fakecuda import FakeDriver  # noqa: E402


class FakeConn:
    def __init__(self, peer):
        self.peer, self.inc, self.sent, self.caps = peer, 5, [], b"\x80"
        self.sent_event = threading.Event()

    def send(self, ftype, body, stream=0):
        self.sent.append((ftype, body))
        self.sent_event.set()


class NodeControlTest(unittest.TestCase):
    def setUp(self):
        self.shm = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.shm)
        self.node = Node("c", b"0123456789abcdef", "py", "127.0.0.1:0", {"go": "127.0.0.1:1"}, ipc=False)
        self.assertIn("disabled", self.node.ipc_status)
        drv = FakeDriver()
        self.node.ipc_owner = ipc.Owner(drv, self.node._lookup_export, self.node.incarnation, shm_dir=self.shm)
        self.node.ipc_fetcher = ipc.Fetcher(drv, "py", self.node._ctl_call, self.node._ctl_send, shm_dir=self.shm)
        self.conn = FakeConn("go")

    def request(self, target, body, rid=7):
        env = decode_envelope(encode_envelope(target=target, type_name=CTL_REQUEST, request=rid, body=body))
        self.node._control_in(self.conn, env)
        ftype, out = self.conn.sent.pop()
        return ftype, out

    def test_requests(self):
        ftype, out = self.request("ipc", ipc.encode_request(op=ipc.OP_CHALLENGE))
        self.assertEqual(ftype, F_MESSAGE)
        env = decode_envelope(out)
        self.assertEqual((env["type_name"], env["request"]), (CTL_REPLY, 7))
        rep = ipc.decode_reply(env["body"])
        self.assertEqual(rep["code"], 0)
        self.assertTrue(rep["path"].startswith(os.path.join(self.shm, ipc.CHALLENGE_PREFIX)))
        # Garbage and unknown ops: error replies, the connection stays.
        for body in (b"\xc1", b"", bytes(5000)):
            ftype, out = self.request("ipc", body)
            self.assertEqual(ipc.decode_reply(decode_envelope(out)["body"])["code"], ipc.CODE_PROTOCOL)
        # A revoke goes to the fetcher side.
        ftype, out = self.request("ipc", ipc.encode_request(op=ipc.OP_REVOKE, inc=1, revoked=[3]))
        self.assertEqual(ipc.decode_reply(decode_envelope(out)["body"])["code"], 0)
        # Another channel: an error frame carrying the request's id.
        ftype, out = self.request("verbs", b"", rid=(1 << 40) + 9)
        self.assertEqual(ftype, F_ERROR)
        self.assertEqual(dict(out)["s"], 9)

    def test_replies_matched(self):
        conns = {"go": self.conn}
        self.node.conns = conns
        self.conn.caps = b"\x80"
        got = []

        def call():
            try:
                got.append(self.node._ctl_call("go", b"req", 5))
            except TensorferryError as e:
                got.append(e)

        th = threading.Thread(target=call)
        th.start()
        self.assertTrue(self.conn.sent_event.wait(5))
        rid = decode_envelope(self.conn.sent[0][1])["request"]
        # A reply from another peer, or to another id, is not this one's.
        other = FakeConn("intruder")
        self.node._control_in(other, decode_envelope(encode_envelope(type_name=CTL_REPLY, request=rid, body=b"x")))
        self.node._control_in(self.conn, decode_envelope(encode_envelope(type_name=CTL_REPLY, request=rid + 1,
                                                                         body=b"y")))
        self.node._control_in(self.conn, decode_envelope(encode_envelope(type_name=CTL_REPLY, request=rid,
                                                                         body=b"ok")))
        th.join(5)
        self.assertEqual(got, [b"ok"])
        # An error frame answers a waiting request with an error.
        th = threading.Thread(target=call)
        self.conn.sent.clear()
        self.conn.sent_event.clear()
        th.start()
        self.assertTrue(self.conn.sent_event.wait(5))
        rid = decode_envelope(self.conn.sent[0][1])["request"]
        self.node._ctl_error(self.conn, {"c": 7, "s": rid, "m": "no channel"})
        th.join(5)
        self.assertIsInstance(got[-1], TensorferryError)
        self.assertIn("no channel", str(got[-1]))

    def test_descriptor_checked(self):
        base = {"o": "go", "i": 5, "e": 1, "l": 2, "t": 9, "s": [4], "b": 4, "d": "cuda:0"}
        self.assertEqual(self.node._check_descriptor(self.conn, dict(base, f={"ipc": b"x"})), 4)
        for bad in ({"f": {"ipc": 3}}, {"f": [1]}, {"f": {str(i): b"" for i in range(17)}},
                    {"d": 7}, {"h": 1}, {"d": "x" * 33}):
            with self.assertRaises(BadTable):
                self.node._check_descriptor(self.conn, dict(base, **bad))

    def test_export_device(self):
        # An export over ipc (a CPU tensor of the driver double stands in
        # for a CUDA one): the stream waited for, an offer, a lease, a
        # descriptor of the tensor's dtype, shape and bytes.
        import torch
        drv = self.node.ipc_owner.driver
        t = drv.alloc(64)[:48].view(torch.float32).reshape(3, 4).requires_grad_(False)
        d = self.node._export_device("go", t)
        self.assertEqual(drv.syncs, 1)
        self.assertEqual((d["t"], d["s"], d["b"], d["h"]), (1, [3, 4], 48, "go"))
        self.assertEqual(ipc.decode_offer(d["f"]["ipc"])[1:3], (0, 48))
        lease, x, peer = self.node.exports[d["e"]]
        self.assertEqual((lease, peer, x.nbytes), (d["l"], "go", 48))
        with self.assertRaises(TypeError):
            self.node._export_device("go", drv.alloc(16).view(torch.complex64))

    def test_leases(self):
        # Leases are random, never 0, and not repeated (fetched 8 at a
        # time from the kernel).
        got = [self.node._lease() for _ in range(200)]
        self.assertEqual(len(set(got)), 200)
        self.assertTrue(all(0 < x < 1 << 64 for x in got))

    def test_dtype_numbers(self):
        import torch
        from tensorferry.node import _dtype_number
        self.assertEqual(_dtype_number(torch.float32), 1)
        self.assertEqual(_dtype_number(torch.bool), 10)
        with self.assertRaises(TypeError):
            _dtype_number(torch.complex64)

    def test_peer_caps(self):
        c = FakeConn("go")
        for caps in (None, 3, b"\xc1", b"\x90"):
            c.caps, c.parsed_caps = caps, None
            self.assertEqual(self.node._peer_caps(c), {})
            self.assertFalse(self.node._ipc_to(c))
        adv = {"c": {"h": self.node.host_id, "c": ["ipc"]}}
        from tensorferry.codec import encode
        c.caps, c.parsed_caps = bytes(encode(adv)), None
        self.assertTrue(self.node._ipc_to(c))
        self.assertEqual(decode(c.caps)["c"]["h"], self.node.host_id)


class ReleaseOrderTest(unittest.TestCase):
    """A fetched message's leases go back after the handler's reply (off
    its path, as Go's engine releases once delivered), and also when the
    handler fails or the body is bad."""

    def setUp(self):
        from tensorferry.codec import Struct, TensorRef, encode
        self.node = Node("c", b"0123456789abcdef", "py", "127.0.0.1:0", {"go": "127.0.0.1:1"}, ipc=False)
        self.conn = FakeConn("go")
        self.node.conns["go"] = self.conn
        self.node._fetch_one = lambda c, d, dst, own_conn=False: dst.__setitem__(slice(None), b"\x01" * len(dst))
        self.d = {"o": "go", "i": 5, "e": 3, "l": 9, "t": 9, "s": [4], "b": 4}
        self.body = bytes(encode(Struct(T=TensorRef(1, 7))))

    def fetch(self, body):
        env = decode_envelope(encode_envelope(target="sink", sender_node="go", sender_id="asker",
                                              type_name="t.M", ser=1, body=body))
        self.node._fetch(self.conn, env, {7: ("fetch", self.d)}, [(7, self.d)])
        return [f for f, _ in self.conn.sent]

    def test_after_reply(self):
        from tensorferry.node import F_RELEASE, Message
        got = []
        self.node.handle("sink", lambda m: got.append(bytes(m["T"].numpy())) or Message("t.Ack", {}))
        self.assertEqual(self.fetch(self.body), [F_MESSAGE, F_RELEASE])
        self.assertEqual(got, [b"\x01" * 4])
        self.assertEqual(dict(self.conn.sent[1][1]), {"e": 3, "l": 9, "i": 5})

    def test_handler_fails(self):
        from tensorferry.node import F_RELEASE

        def fail(m):
            raise RuntimeError("boom")
        self.node.handle("sink", fail)
        self.assertEqual(self.fetch(self.body), [F_RELEASE])
        self.assertIn("boom", self.node.errors[-1])

    def test_bad_body(self):
        from tensorferry.node import F_RELEASE
        self.node.handle("sink", lambda m: None)
        self.assertEqual(self.fetch(b"\xc1"), [F_RELEASE])


class ReplyFetchTest(unittest.TestCase):
    """A reply carrying exported tensors is fetched by its requester's own
    thread (no thread started per reply); one nobody waits for any more
    is released unfetched."""

    def setUp(self):
        self.node = Node("c", b"0123456789abcdef", "py", "127.0.0.1:0", {"go": "127.0.0.1:1"}, ipc=False)
        self.conn = FakeConn("go")
        self.node.conns["go"] = self.conn
        self.fetched_on = []

        def fetch_one(c, d, dst, own_conn=False):
            self.fetched_on.append(threading.current_thread())
            dst[:] = b"\x02" * len(dst)
        self.node._fetch_one = fetch_one

    def reply(self, target):
        from tensorferry.codec import Struct, TensorRef, encode
        from tensorferry.message import encode_table
        d = Struct((("o", "go"), ("i", 5), ("e", 3), ("l", 9), ("t", 9), ("s", [4]), ("b", 4)))
        return encode_envelope(target=target, sender_node="go", sender_id="sink", type_name="t.A", ser=1,
                               body=bytes(encode(Struct(T=TensorRef(1, 7)))), tensors=encode_table([(7, d)]))

    def test_requester_fetches(self):
        from tensorferry.node import F_RELEASE, Message
        out = []
        t = threading.Thread(target=lambda: out.append(self.node.request(("go", "sink"), Message("t.Q"), 10)))
        t.start()
        self.assertTrue(self.conn.sent_event.wait(10))
        sid = decode_envelope(self.conn.sent[0][1])["sender_id"]
        self.node._message_in(self.conn, self.reply(sid))
        t.join(10)
        self.assertEqual(self.fetched_on, [t])
        self.assertEqual(bytes(out[0]["T"].numpy()), b"\x02" * 4)
        self.assertEqual([f for f, _ in self.conn.sent], [F_MESSAGE, F_RELEASE])

    def test_nobody_waits(self):
        from tensorferry.node import F_RELEASE
        self.node._message_in(self.conn, self.reply("future#77"))
        self.assertEqual(self.fetched_on, [])
        self.assertEqual([f for f, _ in self.conn.sent], [F_RELEASE])

    def test_fetch_fails(self):
        from tensorferry.node import Message

        def fail(c, d, dst, own_conn=False):
            raise TensorferryError("tensorferry: no data connection")
        self.node._fetch_one = fail
        errs = []

        def ask():
            try:
                self.node.request(("go", "sink"), Message("t.Q"), 10)
            except TensorferryError as e:
                errs.append(e)
        t = threading.Thread(target=ask)
        t.start()
        self.assertTrue(self.conn.sent_event.wait(10))
        sid = decode_envelope(self.conn.sent[0][1])["sender_id"]
        self.node._message_in(self.conn, self.reply(sid))
        t.join(10)
        self.assertEqual(len(errs), 1)
        self.assertIn("no data connection", str(errs[0]))


class RequesterDataConnTest(unittest.TestCase):
    """Requesters' staging fetches reuse an idle data connection instead
    of dialing (and shaking hands) for each; a failed one is closed, and
    the idle ones close with their peer's connection."""

    def setUp(self):
        from tensorferry import node as node_mod
        self.node = Node("c", b"0123456789abcdef", "py", "127.0.0.1:0", {"go": "127.0.0.1:1"}, ipc=False)
        self.node.conns["go"] = FakeConn("go")
        self.socks = []
        self.streams = []
        self.fail = False

        class Sock:
            closed = False

            def settimeout(self, t):
                pass

            def close(self):
                self.closed = True

        def dial(peer):
            self.socks.append(Sock())
            return self.socks[-1]

        def fetch(sock, stream, d, dst):
            self.streams.append((self.socks.index(sock), stream))
            if self.fail:
                raise OSError("reset")
        self.node._dial_data = dial
        orig = node_mod.staging.fetch
        node_mod.staging.fetch = fetch
        self.addCleanup(setattr, node_mod.staging, "fetch", orig)

    def test_reused(self):
        c, d = self.node.conns["go"], {"b": 0}
        for _ in range(3):
            self.node._fetch_one(c, d, memoryview(bytearray()), own_conn=True)
        self.assertEqual(self.streams, [(0, 1), (0, 2), (0, 3)])
        self.fail = True
        with self.assertRaises(OSError):
            self.node._fetch_one(c, d, memoryview(bytearray()), own_conn=True)
        self.assertTrue(self.socks[0].closed)
        self.fail = False
        self.node._fetch_one(c, d, memoryview(bytearray()), own_conn=True)
        self.assertEqual(len(self.socks), 2)
        self.assertFalse(self.socks[1].closed)
        self.node._conn_closed(c, "gone")
        self.assertTrue(self.socks[1].closed)


class NodeFetchTest(unittest.TestCase):
    """The node fetches a message's tensor over ipc (the owner here is an
    ipc.Owner over the driver double) and delivers a torch tensor."""

    def test_fetch_over_ipc(self):
        import torch
        from tensorferry.codec import Struct, TensorRef, encode
        from tensorferry.message import encode_table
        from tensorferry.node import F_RELEASE
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
                                        "g": [{"d": "cuda:3", "u": "GPU-9"}, {"d": "cuda:0", "u": "GPU-1"}]}}))
        got = []
        node.handle("h", lambda m: got.append(m))

        a = drv.alloc(4096)
        src = a[64:64 + 400].view(torch.float32)
        src.copy_(torch.arange(100, dtype=torch.float32) - 3.5)

        class X:
            ipc_offer = owner.offer(src)
        exports[11] = (77, X(), "py")
        d = {"o": "go", "i": 5, "e": 11, "l": 77, "t": 1, "s": [10, 10], "b": 400, "d": "cuda:0", "h": "py",
             "f": {"ipc": X.ipc_offer}}
        self.assertTrue(node._ipc_from(conn, d))
        self.assertFalse(node._ipc_from(conn, dict(d, d="cuda:3")), "a GPU without peer access")
        body = bytes(encode(Struct(X=TensorRef(1, 4))))
        env = decode_envelope(encode_envelope(target="h", sender_node="go", type_name="t.M", ser=1, body=body,
                                              tensors=encode_table([(4, d)])))
        from tensorferry.message import decode_table
        table = decode_table(env["tensors"])
        node._fetch(conn, env, table, [(4, table[4][1])])
        self.assertEqual(node.errors, [])
        self.assertEqual(len(got), 1)
        x = got[0]["X"]
        self.assertTrue(torch.equal(x, src.reshape(10, 10)))
        self.assertEqual(node.transfers, [("ipc", "go", 400)])
        rel = [b for f, b in conn.sent if f == F_RELEASE]
        self.assertEqual([(r["e"], r["l"]) for r in rel], [(11, 77)])
        self.assertEqual(owner.acquisitions(), 0)
        # A lease the owner refuses: the message is dropped with a dead
        # letter's reason in errors, its leases given back.
        table = decode_table(env["tensors"])
        table[4][1]["l"] = 78
        node._fetch(conn, env, table, [(4, table[4][1])])
        self.assertEqual(len(got), 1)
        self.assertIn("lease not valid", node.errors[-1])


class InlineHandlerTest(unittest.TestCase):
    """An inline handler runs on the reader's thread when the dispatch
    thread has nothing queued or running and every tensor is a direct ipc
    copy; otherwise its message is queued as any other, leases held."""

    def setUp(self):
        from tensorferry.node import Message
        self.node = Node("c", b"0123456789abcdef", "py", "127.0.0.1:0", {"go": "127.0.0.1:1"}, ipc=False)
        self.conn = FakeConn("go")
        self.node.conns["go"] = self.conn
        self.ran = []
        self.node.handle("sink", lambda m: self.ran.append((threading.current_thread(), m)) or Message("t.Ack", {}),
                         inline=True)
        self.direct = []  # what fetch_direct answers, in order

        class Fetcher:
            def fetch_direct(fd, d, dst):
                ok = self.direct.pop(0)
                if ok:
                    dst.fill_(6)
                return ok
        self.node.ipc_fetcher = Fetcher()
        self.node._ipc_from = lambda c, d: True
        import torch
        self.node.device = torch.device("cpu")

    def message(self, tensors=True, target="sink"):
        from tensorferry.codec import Struct, TensorRef, encode
        from tensorferry.message import encode_table
        table, body = [], Struct(N=1)
        if tensors:
            d = Struct((("o", "go"), ("i", 5), ("e", 3), ("l", 9), ("t", 9), ("s", [4]), ("b", 4), ("d", "cuda:0"),
                        ("h", "py"), ("f", {"ipc": b"x"})))
            table, body = [(7, d)], Struct(T=TensorRef(1, 7))
        return encode_envelope(target=target, sender_node="go", sender_id="asker", type_name="t.M", ser=1,
                               body=bytes(encode(body)), tensors=encode_table(table) if table else b"")

    def sent(self):
        return [f for f, _ in self.conn.sent]

    def test_runs_on_the_reader(self):
        from tensorferry.node import F_RELEASE
        self.direct = [True]
        self.node._message_in(self.conn, self.message())
        self.assertEqual(len(self.ran), 1)
        self.assertIs(self.ran[0][0], threading.current_thread())
        self.assertEqual(bytes(self.ran[0][1]["T"].numpy()), b"\x06" * 4)
        self.assertEqual(self.sent(), [F_MESSAGE, F_RELEASE])  # the reply, then the lease back
        self.assertEqual(self.node.transfers, [("ipc", "go", 4)])
        self.assertTrue(self.node.inbox.idle())
        # A message without exported tensors, too.
        self.node._message_in(self.conn, self.message(tensors=False))
        self.assertEqual(len(self.ran), 2)

    def test_tensor_freed_with_its_message(self):
        """A received tensor goes when its handler drops it, without the
        cycle collector: GPU memory held until a collection made the
        allocator cudaMalloc per message (2xH200, 4 MiB to 1 GiB)."""
        import gc
        import weakref
        from tensorferry.node import Message
        refs = []

        def h(m):
            refs.append(weakref.ref(m["T"]))
            return Message("t.Ack", {})
        self.node.handle("sink", h, inline=True)
        self.direct = [True]
        gc.disable()
        try:
            self.node._message_in(self.conn, self.message())
            self.assertEqual(len(refs), 1)
            self.assertIsNone(refs[0](), "the received tensor outlived its message")
        finally:
            gc.enable()

    def test_queued(self):
        from tensorferry.node import Message
        cases = {"not a direct copy": lambda: self.direct.append(False)}
        for why, arrange in cases.items():
            arrange()
            self.node._message_in(self.conn, self.message())
            self.assertEqual((self.ran, self.sent()), ([], []), why)
            self.assertFalse(self.node.inbox.idle(), why)
        # While one is queued, the next is queued behind it (order kept),
        # even though it could be copied directly.
        self.direct = [True]
        self.node._message_in(self.conn, self.message())
        self.assertEqual((self.ran, self.direct), ([], [True]))
        # The dispatch thread handles both, in order.
        self.node.handle("sink", lambda m: self.ran.append((threading.current_thread(), m)) or Message("t.Ack", {}))
        self.direct = []
        self.node.ipc_fetcher.fetch = lambda d, dst, timeout: dst.fill_(6)
        t = threading.Thread(target=self.node._dispatch_loop)
        t.start()
        self.node.inbox.put(None)
        t.join(10)
        self.assertEqual([th for th, _ in self.ran], [t, t])
        self.assertTrue(self.node.inbox.idle() is False)  # the stop sentinel stays counted

    def test_busy_or_not_inline(self):
        self.node.handler_mu.acquire()  # the dispatch thread is running a handler
        self.direct = [True]
        self.node._message_in(self.conn, self.message())
        self.node.handler_mu.release()
        self.assertEqual((self.ran, self.direct), ([], [True]))
        other = Node("c", b"0123456789abcdef", "py2", "127.0.0.1:0", {"go": "127.0.0.1:1"}, ipc=False)
        other.conns["go"] = self.conn
        other.handle("sink", lambda m: self.ran.append(m))
        other.ipc_fetcher, other._ipc_from, other.device = self.node.ipc_fetcher, self.node._ipc_from, self.node.device
        other._message_in(self.conn, self.message())
        self.assertEqual((self.ran, self.direct), ([], [True]), "a handler not inline")
        self.assertFalse(other.inbox.idle())


def tcp_pair():
    """Two ends of a loopback TCP connection (the reader sets TCP options)."""
    import socket
    with socket.create_server(("127.0.0.1", 0)) as srv:
        b = socket.create_connection(srv.getsockname())
        a, _ = srv.accept()
    return a, b


class ReaderFailureTest(unittest.TestCase):
    """An exception no handler foresaw, raised while a frame is handled,
    costs its connection (closed, the reason in errors), never leaves a
    connection open that nobody reads."""

    def test_unforeseen_exception_closes(self):
        import socket
        from tensorferry.node import HEADER, F_PING
        node = Node("c", b"0123456789abcdef", "py", "127.0.0.1:0", {"go": "127.0.0.1:1"}, ipc=False)
        node._secure = lambda s, *a: s
        node._tls_handshake = lambda s: None
        node._handshake = lambda s: ("go", 5)
        node._advert = lambda: {}

        def boom(c, ftype, stream, body):
            raise KeyError("unforeseen")
        node._frame_in = boom
        a, b = tcp_pair()
        self.addCleanup(b.close)
        t = threading.Thread(target=node._serve, args=(a,))
        t.start()
        b.sendall(HEADER.pack(0, F_PING, 0, 0, 0))
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertNotIn("go", node.conns)  # closed and forgotten
        self.assertIn("unforeseen", node.errors[-1])
        b.settimeout(10)
        while b.recv(4096):  # the advert, then the end of the connection
            pass

        # In the handshake too.
        node2 = Node("c", b"0123456789abcdef", "py", "127.0.0.1:0", {"go": "127.0.0.1:1"}, ipc=False)
        node2._secure = lambda s, *a: s
        node2._tls_handshake = lambda s: None

        def bad_handshake(s):
            raise TypeError("unforeseen handshake")
        node2._handshake = bad_handshake
        c, d = tcp_pair()
        self.addCleanup(d.close)
        node2._serve(c)
        self.assertIn("unforeseen handshake", node2.errors[-1])
        self.assertEqual(c.fileno(), -1)


if __name__ == "__main__":
    unittest.main()
