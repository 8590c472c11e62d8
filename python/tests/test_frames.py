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
        for spin in (0, 30):
            for step in (1, 7, 4096, 100000, len(data)):
                a, b = self.pair()
                self.feed(a, data, step)
                r = FrameReader(b, 4 * FrameReader.SIZE, spin_us=spin)
                self.assertEqual(r.spin_ns, spin * 1000)
                for i, body in enumerate(bodies):
                    r.spin = i % 2 == 0  # polling, then blocking, in turn
                    self.assertEqual(r.read(), (5 + i, 0, i, body), "spin %d step %d frame %d" % (spin, step, i))

    def test_spin_then_block(self):
        # A spinning read with nothing to read blocks once its spin is
        # over, and returns the frame that comes later.
        a, b = self.pair()
        r = FrameReader(b, 1 << 20, spin_us=200)
        th = threading.Timer(0.05, lambda: a.sendall(frame(9, b"late")))
        th.start()
        self.addCleanup(th.join)
        self.assertEqual(r.read(), (9, 0, 0, b"late"))

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
