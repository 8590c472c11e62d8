"""FrameReader: frames read through its buffer are read_frame's frames,
however the bytes arrive; lengths are checked before anything is read."""

import os
import socket
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tensorferry.codec import BadBody  # noqa: E402
from tensorferry.node import HEADER, FrameReader, TensorferryError  # noqa: E402


def frame(ftype, body, stream=0, reserved=0):
    return HEADER.pack(len(body), ftype, 0, reserved, stream) + body


class FrameReaderTest(unittest.TestCase):
    def pair(self):
        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        return a, b

    def feed(self, sock, data, step):
        def run():
            for i in range(0, len(data), step):
                sock.sendall(data[i:i + step])
        th = threading.Thread(target=run)
        th.start()
        self.addCleanup(th.join)

    def test_frames_however_split(self):
        bodies = [b"", b"x", os.urandom(1000), os.urandom(FrameReader.SIZE - HEADER.size),
                  os.urandom(FrameReader.SIZE), os.urandom(3 * FrameReader.SIZE + 5), b"tail"]
        data = b"".join(frame(5 + i, body, stream=i) for i, body in enumerate(bodies))
        for step in (1, 7, 4096, 100000, len(data)):
            a, b = self.pair()
            self.feed(a, data, step)
            r = FrameReader(b, 4 * FrameReader.SIZE)
            for i, body in enumerate(bodies):
                self.assertEqual(r.read(), (5 + i, 0, i, body), "step %d frame %d" % (step, i))

    def test_length_checked_first(self):
        a, b = self.pair()
        a.sendall(HEADER.pack(1 << 30, 5, 0, 0, 0))  # no body follows: nothing may wait for it
        with self.assertRaises(BadBody) as cm:
            FrameReader(b, 16 << 20).read()
        self.assertIn("above the maximum", str(cm.exception))
        a.sendall(frame(5, b"x", reserved=1))
        with self.assertRaises(BadBody):
            FrameReader(b, 16 << 20).read()

    def test_closed_mid_frame(self):
        for cut in (3, HEADER.size + 2):
            a, b = self.pair()
            a.sendall(frame(5, b"hello")[:cut])
            a.close()
            with self.assertRaises(TensorferryError):
                FrameReader(b, 1 << 20).read()


if __name__ == "__main__":
    unittest.main()


class CorkTest(unittest.TestCase):
    """A handler's reply and the leases given back after it leave in one
    write (Node._run), in that order."""

    def test_reply_and_release_in_one_write(self):
        from tensorferry.node import F_MESSAGE, F_RELEASE, Message, Node, _Conn, read_frame
        from tensorferry.message import decode_envelope

        class Counting:
            def __init__(self, s):
                self.s, self.writes = s, 0

            def sendall(self, b):
                self.writes += 1
                self.s.sendall(b)

        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        node = Node("c", b"0123456789abcdef", "py", "127.0.0.1:0", {"go": "127.0.0.1:1"}, ipc=False)
        sock = Counting(a)
        c = _Conn(node, sock, "go", 5, 1 << 20)
        c.caps = b"\x80"
        node.conns["go"] = c
        node.handle("h", lambda m: Message("t.Ack", {"V": 1}))
        desc = {"e": 3, "l": 4, "i": 5}
        node._run("h", Message("t.Q", {}, ("go", "future#1")), after=lambda: node._release_all(c, [desc]))
        self.assertEqual(sock.writes, 1)
        ftype, _, _, body = read_frame(b, 1 << 20)
        self.assertEqual((ftype, decode_envelope(body)["type_name"]), (F_MESSAGE, "t.Ack"))
        self.assertEqual(read_frame(b, 1 << 20)[0], F_RELEASE)
        # Without a reply (or without anything after it) nothing waits.
        node.handle("h", lambda m: None)
        node._run("h", Message("t.Q", {}, ("go", "future#1")), after=lambda: node._release_all(c, [desc]))
        self.assertEqual(sock.writes, 2)
        self.assertEqual(read_frame(b, 1 << 20)[0], F_RELEASE)
        self.assertIsNone(getattr(node._tl, "cork", None))
