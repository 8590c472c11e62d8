"""The staging channel's client side: fetch an export from its owner over TCP.

The same framing as rdma/staging (frame.go): a 16-byte header (type u8,
flags u8, reserved u16, stream u32, length u64, big endian); REQUEST is 48
bytes (export id, lease, incarnation, offset, length u64; chunk size,
window u32); DATA is an 8-byte absolute offset and the bytes, in order;
END and ERROR a 4-byte wire.ErrCode and a message of at most 1024 bytes.
The data connection is dialed to the owner's data address, authenticated
with the handshake (purpose "data"), and names its channel in one
length-prefixed byte string.
"""

import struct

from .codec import BadBody

HEADER = struct.Struct(">BBHIQ")
REQUEST = struct.Struct(">QQQQQII")
FR_REQUEST, FR_DATA, FR_END, FR_ERROR, FR_CANCEL = 1, 2, 3, 4, 5
MAX_MESSAGE = 1024
DEFAULT_CHUNK = 4 << 20
DEFAULT_WINDOW = 4
MAX_CHUNK = 64 << 20


class StagingError(Exception):
    """A fetch over staging that failed (the owner's error, or bad frames)."""


def _read_into(sock, view):
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise StagingError("tensorferry: staging: connection closed by the owner")
        got += k


def _read(sock, n):
    b = bytearray(n)
    _read_into(sock, memoryview(b))
    return bytes(b)


def read_header(sock, max_chunk):
    """Read and check one frame header, as staging's Framer.ReadHeader."""
    t, flags, reserved, stream, length = HEADER.unpack(_read(sock, HEADER.size))
    if flags or reserved:
        raise BadBody("tensorferry: staging: flags %#x or reserved bits %#x set" % (flags, reserved))
    if t == FR_REQUEST and length != REQUEST.size:
        raise BadBody("tensorferry: staging: REQUEST of %d bytes, want %d" % (length, REQUEST.size))
    if t == FR_DATA and (length < 8 or length - 8 > max_chunk):
        raise BadBody("tensorferry: staging: DATA of %d bytes (chunk limit %d)" % (length, max_chunk))
    if t in (FR_END, FR_ERROR) and not 4 <= length <= 4 + MAX_MESSAGE:
        raise BadBody("tensorferry: staging: status of %d bytes" % length)
    if t == FR_CANCEL and length:
        raise BadBody("tensorferry: staging: CANCEL with a %d-byte body" % length)
    if t not in (FR_REQUEST, FR_DATA, FR_END, FR_ERROR, FR_CANCEL):
        raise BadBody("tensorferry: staging: unknown frame type %d" % t)
    return t, stream, length


def write_request(sock, stream, export_id, lease, incarnation, offset, length,
                  chunk=DEFAULT_CHUNK, window=DEFAULT_WINDOW):
    sock.sendall(HEADER.pack(FR_REQUEST, 0, 0, stream, REQUEST.size) +
                 REQUEST.pack(export_id, lease, incarnation, offset, length, chunk, window))


def fetch(sock, stream, d, dst, chunk=DEFAULT_CHUNK):
    """Fetch all of descriptor d's bytes into dst (a writable memoryview of
    exactly d's size) on the open data connection sock."""
    length = len(dst)
    write_request(sock, stream, d["e"], d["l"], d["i"], 0, length, chunk)
    nxt = 0
    while True:
        t, s, n = read_header(sock, chunk)
        if s != stream:
            raise BadBody("tensorferry: staging: frame for stream %d during stream %d" % (s, stream))
        if t == FR_DATA:
            off = int.from_bytes(_read(sock, 8), "big")
            n -= 8
            if off != nxt or n > length - nxt or (n == 0 and length > 0):
                raise BadBody("tensorferry: staging: DATA [%d, +%d) out of order or range "
                              "(expected offset %d of %d)" % (off, n, nxt, length))
            _read_into(sock, dst[off:off + n])
            nxt += n
        elif t in (FR_END, FR_ERROR):
            b = _read(sock, n)
            code = int.from_bytes(b[:4], "big")
            if t == FR_END and code == 0:
                if nxt != length:
                    raise BadBody("tensorferry: staging: END after %d of %d bytes" % (nxt, length))
                return
            raise StagingError("tensorferry: staging: owner %s refused: code %d: %s"
                               % (d.get("o"), code, b[4:].decode("utf-8", "replace")))
        else:
            raise BadBody("tensorferry: staging: unexpected frame type %d from the owner" % t)
