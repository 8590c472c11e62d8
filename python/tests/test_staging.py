"""Staging client tests: frames from a hostile owner are refused."""

import os
import socket
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tensorferry import staging  # noqa: E402
from tensorferry.codec import BadBody  # noqa: E402

H = staging.HEADER.pack


def data(stream, off, b):
    return H(staging.FR_DATA, 0, 0, stream, 8 + len(b)) + off.to_bytes(8, "big") + b


def end(stream, code=0, msg=b""):
    return H(staging.FR_END if code == 0 else staging.FR_ERROR, 0, 0, stream, 4 + len(msg)) + \
        code.to_bytes(4, "big") + msg


class FetchTest(unittest.TestCase):
    D = {"e": 1, "l": 2, "i": 3, "o": "go"}

    def run_owner(self, reply, n=8, chunk=staging.DEFAULT_CHUNK):
        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        got = {}

        def owner():
            got["req"] = b.recv(staging.HEADER.size + staging.REQUEST.size)
            b.sendall(reply)
            b.shutdown(socket.SHUT_WR)

        t = threading.Thread(target=owner)
        t.start()
        dst = bytearray(n)
        try:
            staging.fetch(a, 1, self.D, memoryview(dst), chunk)
        finally:
            t.join()
        return bytes(dst), got["req"]

    def test_ok(self):
        out, req = self.run_owner(data(1, 0, b"abcd") + data(1, 4, b"efgh") + end(1))
        self.assertEqual(out, b"abcdefgh")
        self.assertEqual(staging.REQUEST.unpack(req[staging.HEADER.size:])[:5], (1, 2, 3, 0, 8))

    def test_refused(self):
        cases = [
            data(1, 4, b"abcd"),                       # out of order
            data(1, 0, b"abcdefghi"),                  # past the end
            data(2, 0, b"abcd"),                       # another stream
            data(1, 0, b"abcd") + end(1),              # END before all bytes
            H(9, 0, 0, 1, 0),                          # unknown type
            H(staging.FR_DATA, 1, 0, 1, 8),            # flags
            H(staging.FR_DATA, 0, 0, 1, 1 << 40),      # above the chunk limit: nothing read for it
            H(staging.FR_END, 0, 0, 1, 5000),          # status too long
            data(1, 0, b""),                           # empty DATA
        ]
        for c in cases:
            with self.assertRaises(BadBody, msg=c):
                self.run_owner(c)

    def test_owner_error(self):
        with self.assertRaises(staging.StagingError) as cm:
            self.run_owner(end(1, 8, b"lease not valid"))
        self.assertIn("lease not valid", str(cm.exception))

    def test_truncated(self):
        with self.assertRaises(staging.StagingError):
            self.run_owner(data(1, 0, b"abcd")[:-2])


if __name__ == "__main__":
    unittest.main()
