"""TLS under the handshake (Node(tls=...)): control and data connections
over TLS 1.3 with certificates on both ends, and what is refused: a
certificate of another CA, a plain connection, a peer that says nothing."""

import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tensorferry import node as node_mod  # noqa: E402
from tensorferry.codec import Struct  # noqa: E402
from tensorferry.tls import TLSSocket, contexts as tls_contexts  # noqa: E402
from tensorferry.node import (F_CAPS, F_HELLO, HANDSHAKE_MAX_FRAME, PROTOCOL_VERSION, Node,  # noqa: E402
                              Recent, TensorferryError, read_frame)

SECRET = b"0123456789abcdef0123"


def make_pki(dir, prefix):
    """A CA and a node certificate it signs (P-256, client and server
    auth), written with the openssl tool; returns the tls block."""
    p = lambda n: os.path.join(dir, prefix + n)  # noqa: E731
    with open(p("ext"), "w") as f:
        f.write("extendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature\n")
    for args in (
        ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", p("ca.key"), "-out", p("ca.crt"), "-subj", "/CN=" + prefix + "ca", "-days", "1",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=keyCertSign"],
        ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", p("node.key"), "-out", p("node.csr"), "-subj", "/CN=" + prefix + "node"],
        ["x509", "-req", "-in", p("node.csr"), "-CA", p("ca.crt"), "-CAkey", p("ca.key"),
         "-set_serial", "7", "-days", "1", "-extfile", p("ext"), "-out", p("node.crt")],
    ):
        subprocess.run(["openssl"] + args, check=True, capture_output=True)
    return {"cert_file": p("node.crt"), "key_file": p("node.key"), "ca_file": p("ca.crt"), "data": True}


class Watched(Recent):
    """node.errors that can be waited on."""

    def __init__(self):
        super().__init__()
        self.cv = threading.Condition()

    def append(self, x):
        with self.cv:
            super().append(x)
            self.cv.notify_all()

    def wait_for(self, *words, timeout=10.0):
        with self.cv:
            ok = self.cv.wait_for(lambda: any(all(w in e for w in words) for e in self), timeout)
        if not ok:
            raise AssertionError("no error with %r in %r" % (words, list(self)))


@unittest.skipIf(shutil.which("openssl") is None, "no openssl tool to make certificates")
class TLSTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.tls = make_pki(cls.dir, "")
        cls.other = make_pki(cls.dir, "other")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def setUp(self):
        # B serves; A and C dial it (A with B's CA, C with another's).
        self.b = Node("c", SECRET, "B", "127.0.0.1:0", {"A": "127.0.0.1:1", "C": "127.0.0.1:1"},
                      ipc=False, data_address="127.0.0.1:0", tls=self.tls)
        self.b.errors = Watched()
        self.b.start()
        self.addCleanup(self.b.stop)
        host = "127.0.0.1:%d"
        self.ctl = ("127.0.0.1", self.b.sock.getsockname()[1])
        peers = {"B": {"address": host % self.ctl[1], "data_address": host % self.b.data_sock.getsockname()[1]}}
        self.a = Node("c", SECRET, "A", "127.0.0.1:0", peers, ipc=False, tls=self.tls)
        other = dict(self.other, ca_file=self.tls["ca_file"])  # trusts B; B does not trust it
        self.c = Node("c", SECRET, "C", "127.0.0.1:0", peers, ipc=False, tls=other)

    def dial_control(self, n):
        s = socket.create_connection(self.ctl, timeout=10)
        s = n._secure(s, False, False)
        self.addCleanup(s.close)
        n._tls_handshake(s)
        n._initiate(s, "control", "B")
        return s

    def test_control(self):
        s = self.dial_control(self.a)
        self.assertEqual(s.version(), "TLSv1.3")
        self.assertIsNotNone(s.getpeercert())
        ftype, _, _, _ = read_frame(s, 1 << 20)
        self.assertEqual(ftype, F_CAPS)  # the connection is up: B's advert
        self.assertIn("A", self.b.conns)

    def test_data(self):
        s = self.a._dial_data("B")
        self.addCleanup(s.close)
        self.assertIsInstance(s, TLSSocket)
        self.assertEqual(s.version(), "TLSv1.3")
        # The handshake's deadline does not stay on the socket.
        self.assertEqual(s.sock.gettimeout(), node_mod.HANDSHAKE_TIMEOUT)
        # Without data, data connections stay plain: B refuses the dial.
        self.a.tls_data = False
        with self.assertRaises((TensorferryError, OSError)):
            self.a._dial_data("B").close()
        self.b.errors.wait_for("tls handshake")

    def test_other_ca(self):
        # C's certificate is not signed by B's CA: B refuses it, and goes
        # on serving A.
        with self.assertRaises((TensorferryError, OSError)):
            self.dial_control(self.c)
        self.b.errors.wait_for("tls handshake", "certificate")
        self.assertNotIn("C", self.b.conns)
        # A node that trusts another CA refuses B's certificate.
        d = Node("c", SECRET, "A", "127.0.0.1:0", self.a.peers, ipc=False, tls=self.other)
        with self.assertRaisesRegex(TensorferryError, "tls handshake.*certificate verify failed"):
            d._dial_data("B")
        self.assertEqual(read_frame(self.dial_control(self.a), 1 << 20)[0], F_CAPS)

    def test_plain(self):
        # A plain handshake to a TLS node: refused with an error that says
        # TLS was wanted, the connection closed.
        s = socket.create_connection(self.ctl, timeout=10)
        self.addCleanup(s.close)
        hello = bytes(node_mod.encode(Struct(v=PROTOCOL_VERSION, c="c", n=bytes(32), p="control")))
        s.sendall(node_mod.HEADER.pack(len(hello), F_HELLO, 0, 0, 0) + hello)
        self.b.errors.wait_for("tls handshake", "TLS 1.3")
        try:
            self.assertEqual(s.recv(HANDSHAKE_MAX_FRAME), b"")
        except ConnectionResetError:
            pass
        self.assertEqual(self.b.conns, {})

    def test_silent(self):
        # A peer that connects and says nothing costs its connection after
        # the handshake timeout, not a thread forever.
        old = node_mod.HANDSHAKE_TIMEOUT
        node_mod.HANDSHAKE_TIMEOUT = 0.2
        self.addCleanup(setattr, node_mod, "HANDSHAKE_TIMEOUT", old)
        s = socket.create_connection(self.ctl, timeout=10)
        self.addCleanup(s.close)
        self.b.errors.wait_for("tls handshake", "timed out")
        self.assertEqual(s.recv(1), b"")

    def test_full_duplex(self):
        # Both ends read on one thread while three threads write frames of
        # up to 600 KiB (above CHUNK) on each: every frame arrives whole.
        import hashlib
        import struct
        srv, cli, _ = tls_contexts(self.tls)
        a, b = socket.socketpair()
        ends = [TLSSocket(a, srv, True), TLSSocket(b, cli, False)]
        for e in ends:
            self.addCleanup(e.close)
        hs = threading.Thread(target=ends[0].handshake, args=(10,))
        hs.start()
        ends[1].handshake(10)
        hs.join()
        frames, writers, got = 30, 3, [[], []]

        def write(e, w):
            for i in range(frames):
                body = os.urandom((i * 7919 + w * 104729) % (600 << 10))
                e.sendall(struct.pack(">I", len(body)) + hashlib.sha256(body).digest() + body)

        def read(e, out):
            for _ in range(frames * writers):
                n = struct.unpack(">I", node_mod._read_exact(e, 4))[0]
                digest = node_mod._read_exact(e, 32)
                out.append(hashlib.sha256(node_mod._read_exact(e, n)).digest() == digest)

        ts = [threading.Thread(target=read, args=(e, got[k]), daemon=True) for k, e in enumerate(ends)]
        ts += [threading.Thread(target=write, args=(e, w), daemon=True) for e in ends for w in range(writers)]
        for t in ts:
            t.start()
        for t in ts[:2]:  # the readers: done, or dead of a bad record
            t.join(60)
        for e in ends:  # unblocks writers whose reader died
            e.shutdown(socket.SHUT_RDWR)
        for t in ts:
            t.join(60)
        self.assertEqual(got, [[True] * frames * writers] * 2)

    def test_trickle(self):
        # A peer that sends its hello a byte at a time gets the handshake
        # timeout in all, not per read.
        old = node_mod.HANDSHAKE_TIMEOUT
        node_mod.HANDSHAKE_TIMEOUT = 0.3
        self.addCleanup(setattr, node_mod, "HANDSHAKE_TIMEOUT", old)
        s = socket.create_connection(self.ctl, timeout=10)
        self.addCleanup(s.close)
        stop = threading.Event()
        self.addCleanup(stop.set)

        def trickle():
            s.sendall(b"\x16\x03\x01\x40\x00")  # a handshake record of 16 KiB
            while not stop.wait(0.05):  # paces the bytes sent, waits for nothing
                try:
                    s.sendall(b"\x00")
                except OSError:
                    return

        threading.Thread(target=trickle, daemon=True).start()
        self.b.errors.wait_for("tls handshake", "timed out after 0.3s", timeout=5)

    def test_config(self):
        with self.assertRaisesRegex(ValueError, "tls.ca_file required"):
            Node("c", SECRET, "X", "127.0.0.1:0", {}, ipc=False, tls={"cert_file": "a", "key_file": "b"})
        with self.assertRaisesRegex(ValueError, "tls.ca_file .*no (PEM )?certificate"):
            Node("c", SECRET, "X", "127.0.0.1:0", {}, ipc=False,
                 tls=dict(self.tls, ca_file=os.path.join(self.dir, "ext")))
        with self.assertRaisesRegex(ValueError, "tls.cert_file"):
            Node("c", SECRET, "X", "127.0.0.1:0", {}, ipc=False,
                 tls=dict(self.tls, key_file=self.other["key_file"]))


if __name__ == "__main__":
    unittest.main()
