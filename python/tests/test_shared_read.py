"""Node(spin_us=...): the reader thread and requesters share a
connection's reading. A requester waiting for its reply reads the socket
itself, so the reply is handled on its thread with no hand-off; frames
behind the reply are handled, not left in the buffer; bad input the
requester reads costs the connection as it does on the reader."""

import os
import socket
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tensorferry.codec import Struct, encode  # noqa: E402
from tensorferry.message import SER_MSGPACK, decode_envelope, encode_envelope  # noqa: E402
from tensorferry.node import F_CAPS, F_MESSAGE, HEADER, Message, Node, read_frame  # noqa: E402

SECRET = b"0123456789abcdef0123"


def frame(ftype, body):
    return HEADER.pack(len(body), ftype, 0, 0, 0) + body


class SharedReadTest(unittest.TestCase):
    def setUp(self):
        # B (spin_us: shared reading) serves; the test plays the Go node A.
        self.b = Node("c", SECRET, "B", "127.0.0.1:0", {"A": "127.0.0.1:1"}, ipc=False, spin_us=2_000_000)
        self.b.start()
        self.addCleanup(self.b.stop)
        a = Node("c", SECRET, "A", "127.0.0.1:0", {}, ipc=False)
        s = socket.create_connection(("127.0.0.1", self.b.sock.getsockname()[1]), timeout=10)
        self.addCleanup(s.close)
        a._initiate(s, "control", "B")
        self.assertEqual(read_frame(s, 1 << 20)[0], F_CAPS)
        caps = Struct(c=Struct(n="A", i=a.incarnation, h="other-host", c=["staging"]), w=0, wb=0)
        s.sendall(frame(F_CAPS, bytes(encode(Struct(b=bytes(encode(caps)))))))
        self.b.wait_peer("A")
        self.s = s
        self.delivered_on = []
        deliver = self.b._deliver

        def watched(c, env, *a, **k):
            self.delivered_on.append((env["type_name"], threading.current_thread()))
            return deliver(c, env, *a, **k)
        self.b._deliver = watched

    def answer(self, extra=b""):
        """Read B's request and answer it (then extra, in the same write)."""
        while True:
            ftype, _, _, body = read_frame(self.s, 1 << 20)
            if ftype == F_MESSAGE:
                break
        env = decode_envelope(body)
        reply = encode_envelope(target=env["sender_id"], sender_node="A", type_name="t.Ack", ser=SER_MSGPACK,
                                body=bytes(encode(Struct(V=7))))
        self.s.sendall(frame(F_MESSAGE, reply) + extra)

    def test_reply_on_requester(self):
        notes = []
        done = threading.Semaphore(0)
        self.b.handle("h", lambda m: (notes.append(m["V"]), done.release()))
        for i in range(20):
            after = encode_envelope(target="h", sender_node="A", type_name="t.Note", ser=SER_MSGPACK,
                                    body=bytes(encode(Struct(V=i))))
            th = threading.Thread(target=self.answer, args=(frame(F_MESSAGE, after),))
            th.start()
            r = self.b.request(("A", "x"), Message("t.Q", {"V": 1}), timeout=10)
            th.join()
            self.assertEqual(r["V"], 7)
            # The message behind the reply in the same write is handled
            # too, whichever thread read them.
            self.assertTrue(done.acquire(timeout=10))
        self.assertEqual(notes, list(range(20)))
        # The peer here is a thread of this process, which needs the GIL
        # the polling requester holds, so the reader thread sometimes gets
        # to a reply first; without the shared reading it always would.
        on_requester = [t for n, t in self.delivered_on if n == "t.Ack" and t is threading.current_thread()]
        self.assertTrue(on_requester, self.delivered_on)

    def test_bad_frame_on_requester(self):
        bad = HEADER.pack(1, F_MESSAGE, 0, 1, 0) + b"x"  # reserved bits set
        th = threading.Thread(target=lambda: (read_frame(self.s, 1 << 20), self.s.sendall(bad)))
        th.start()
        with self.assertRaises(TimeoutError):  # as on the reader: no reply comes
            self.b.request(("A", "x"), Message("t.Q", {"V": 1}), timeout=1)
        th.join()
        self.assertTrue(any("reserved bits" in e for e in self.b.errors), list(self.b.errors))
        self.assertNotIn("A", self.b.conns)


if __name__ == "__main__":
    unittest.main()
