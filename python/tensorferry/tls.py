"""TLS 1.3 under the handshake, as the Go nodes speak it (config/tls.go,
cluster/tls.go), with the standard library's ssl module.

A control connection is read by its reader thread while other threads
send on it. OpenSSL forbids two threads in one SSL object at once (a
blocking ssl.SSLSocket's recv and sendall from two threads is exactly
that: CPython issues 76714, 143756), so a connection's TLS state is an
ssl.SSLObject over memory BIOs, used under a lock only while it encrypts
or decrypts; the socket's own reads and writes run outside that lock.
"""

import socket
import ssl
import threading
import time

CHUNK = 256 << 10  # bytes read from the socket, or encrypted, at a time


def contexts(tls):
    """The server and client ssl contexts of a tls block (a dict or an
    object with cert_file, key_file, ca_file and data), as Go builds them:
    TLS 1.3 only, this node's certificate on both ends, the peer's
    required and verified against ca_file for its use (OpenSSL checks a
    client's for client auth, a server's for server auth, as Go's
    VerifyConnection does), host names unchecked: the HMAC handshake names
    the node. Returns (server, client, data)."""
    def get(k, default=None):
        return tls.get(k, default) if isinstance(tls, dict) else getattr(tls, k, default)

    cert, key, ca = get("cert_file"), get("key_file"), get("ca_file")
    for field, v in (("cert_file", cert), ("key_file", key), ("ca_file", ca)):
        if not v:
            raise ValueError("tensorferry: tls.%s required with tls" % field)
    out = []
    for proto in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        ctx = ssl.SSLContext(proto)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ValueError) as e:
            raise ValueError("tensorferry: tls.cert_file %s, tls.key_file %s: %s" % (cert, key, e)) from e
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ValueError) as e:
            raise ValueError("tensorferry: tls.ca_file %s: %s" % (ca, e)) from e
        if not ctx.get_ca_certs():
            raise ValueError("tensorferry: tls.ca_file %s: no PEM certificate" % ca)
        if proto == ssl.PROTOCOL_TLS_SERVER:
            ctx.num_tickets = 0  # no resumption
        out.append(ctx)
    return out[0], out[1], bool(get("data", False))


class TLSSocket:
    """A connected socket under TLS, with the socket methods node.py and
    staging.py use. One thread reads at a time; any may write (sendall
    calls do not interleave)."""

    def __init__(self, sock, ctx, server):
        self.sock = sock
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._obj = ctx.wrap_bio(self._in, self._out, server_side=server)
        self._mu = threading.Lock()  # the SSLObject and its BIOs
        self._wmu = threading.Lock()  # the socket's writes, in the records' order; before _mu

    def handshake(self, timeout):
        """The TLS handshake, within timeout seconds in all (a peer that
        trickles bytes gets no longer). Raises ssl.SSLError (refused: the
        alert is sent first) or OSError (socket.timeout when late). The
        socket's timeout is as before after it."""
        old = self.sock.gettimeout()
        try:
            self._handshake(time.monotonic() + timeout, timeout)
        finally:
            self.sock.settimeout(old)

    def _handshake(self, end, timeout):
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise socket.timeout("tls handshake timed out after %.1fs" % timeout)
            self.sock.settimeout(left)  # for the writes and the read of this round
            err, done = None, False
            with self._mu:
                try:
                    self._obj.do_handshake()
                    done = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError as e:
                    err = e
            try:
                self._flush()
                if err is None and not done:
                    self._fill()
            except socket.timeout:
                raise socket.timeout("tls handshake timed out after %.1fs" % timeout) from None
            except OSError:
                if err is None:
                    raise
            if err is not None:
                raise err
            if done:
                return

    def _fill(self):
        b = self.sock.recv(CHUNK)
        with self._mu:
            if b:
                self._in.write(b)
            else:
                self._in.write_eof()

    def _flush(self):
        with self._wmu:
            with self._mu:
                b = self._out.read()
            if b:
                self.sock.sendall(b)

    def sendall(self, data):
        view = memoryview(data).cast("B")
        with self._wmu:
            for i in range(0, len(view), CHUNK):
                with self._mu:
                    self._obj.write(view[i:i + CHUNK])
                    b = self._out.read()
                self.sock.sendall(b)

    def recv_into(self, buf, n=0):
        view = memoryview(buf).cast("B")
        n = n or len(view)
        if n == 0:
            return 0
        while True:
            with self._mu:
                try:
                    return self._obj.read(n, view[:n])
                except ssl.SSLWantReadError:
                    pending = self._out.pending  # e.g. a key update's answer
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    return 0  # closed; frames are length-prefixed, so a cut one is seen
            if pending:
                self._flush()
            self._fill()

    def recv(self, n):
        buf = bytearray(n)
        return bytes(buf[:self.recv_into(buf, n)])

    def version(self):
        return self._obj.version()

    def getpeercert(self, binary_form=False):
        return self._obj.getpeercert(binary_form)

    def settimeout(self, t):
        self.sock.settimeout(t)

    def setsockopt(self, *a):
        self.sock.setsockopt(*a)

    def getpeername(self):
        return self.sock.getpeername()

    def shutdown(self, how=socket.SHUT_RDWR):
        self.sock.shutdown(how)

    def close(self):
        self.sock.close()
