"""msgpack codec speaking the bytes tensorferry's Go side writes.

Encoding is deterministic and matches vmihailenco/msgpack with compact
integers and sorted map keys (wire.EncodeMsgpack): integers in their
smallest form, float64 as 0xcb (float32 through F32), str as fixstr/str8/
str16/str32, bytes as bin8/bin16/bin32, plain dicts (Go maps) with sorted
keys, Struct (a Go struct) with its fields in declared order.

Decoding treats every byte as hostile: each declared length is checked
against the bytes that are there before anything is read, no declared count
sizes an allocation (items are appended one by one, each consuming at least
one byte), nesting is bounded, and every failure raises BadBody with what
was wrong.
"""

import struct

MAX_DEPTH = 32  # as wire.MaxMsgpackDepth


class BadBody(ValueError):
    """A msgpack body that cannot be decoded."""


class F32(float):
    """A float encoded as msgpack float32 (a Go float32 field)."""


class Struct(dict):
    """A Go struct: a map whose keys keep their (declared) order."""


class Fixed(int):
    """An integer encoded at a fixed width, as vmihailenco/msgpack writes
    a Go field of that type without compact integers (msgpack.Marshal):
    U8 0xcc, U32 0xce, U64 0xcf (a Go int is written compact: a plain int)."""

    code = 0

    def __new__(cls, v=0):
        v = int(v)
        lo, hi = cls.range
        if not lo <= v <= hi:
            raise OverflowError("tensorferry: %d does not fit in %s" % (v, cls.__name__))
        return int.__new__(cls, v)


class U8(Fixed):
    code, size, range = 0xCC, 1, (0, 0xFF)


class U32(Fixed):
    code, size, range = 0xCE, 4, (0, 0xFFFFFFFF)


class U64(Fixed):
    code, size, range = 0xCF, 8, (0, 0xFFFFFFFFFFFFFFFF)


class TensorRef:
    """A tensor field's reference [kind, id] to an entry of the tensor table."""

    __slots__ = ("kind", "id")

    TENSOR = 1
    REF = 3

    def __init__(self, kind, id):
        self.kind, self.id = kind, id

    def __eq__(self, o):
        return isinstance(o, TensorRef) and (self.kind, self.id) == (o.kind, o.id)

    def __repr__(self):
        return "TensorRef(%d, %d)" % (self.kind, self.id)


_pack_f32 = struct.Struct(">f").pack
_pack_f64 = struct.Struct(">d").pack


def _uint(out, n):
    if n < 0x80:
        out.append(n)
    elif n <= 0xFF:
        out += b"\xcc" + n.to_bytes(1, "big")
    elif n <= 0xFFFF:
        out += b"\xcd" + n.to_bytes(2, "big")
    elif n <= 0xFFFFFFFF:
        out += b"\xce" + n.to_bytes(4, "big")
    elif n <= 0xFFFFFFFFFFFFFFFF:
        out += b"\xcf" + n.to_bytes(8, "big")
    else:
        raise OverflowError("tensorferry: integer %d does not fit in uint64" % n)


def _int(out, n):
    if n >= 0:
        _uint(out, n)
    elif n >= -32:
        out.append(n & 0xFF)
    elif n >= -0x80:
        out += b"\xd0" + n.to_bytes(1, "big", signed=True)
    elif n >= -0x8000:
        out += b"\xd1" + n.to_bytes(2, "big", signed=True)
    elif n >= -0x80000000:
        out += b"\xd2" + n.to_bytes(4, "big", signed=True)
    elif n >= -0x8000000000000000:
        out += b"\xd3" + n.to_bytes(8, "big", signed=True)
    else:
        raise OverflowError("tensorferry: integer %d does not fit in int64" % n)


def _len(out, n, fix, fixmax, c8, c16, c32):
    if fix is not None and n <= fixmax:
        out.append(fix | n)
    elif c8 is not None and n <= 0xFF:
        out += bytes((c8, n))
    elif n <= 0xFFFF:
        out += bytes((c16,)) + n.to_bytes(2, "big")
    elif n <= 0xFFFFFFFF:
        out += bytes((c32,)) + n.to_bytes(4, "big")
    else:
        raise OverflowError("tensorferry: length %d does not fit in msgpack" % n)


def _str(out, s):
    b = s.encode("utf-8")
    _len(out, len(b), 0xA0, 31, 0xD9, 0xDA, 0xDB)
    out += b


def _enc(out, v, depth):
    if depth > MAX_DEPTH:
        raise ValueError("tensorferry: value nested deeper than %d" % MAX_DEPTH)
    if v is None:
        out.append(0xC0)
    elif v is True:
        out.append(0xC3)
    elif v is False:
        out.append(0xC2)
    elif isinstance(v, Fixed):
        out.append(v.code)
        out += int(v).to_bytes(v.size, "big", signed=v.range[0] < 0)
    elif isinstance(v, int):
        _int(out, v)
    elif isinstance(v, F32):
        out += b"\xca" + _pack_f32(v)
    elif isinstance(v, float):
        out += b"\xcb" + _pack_f64(v)
    elif isinstance(v, str):
        _str(out, v)
    elif isinstance(v, (bytes, bytearray, memoryview)):
        b = memoryview(v).cast("B")
        _len(out, len(b), None, 0, 0xC4, 0xC5, 0xC6)
        out += b
    elif isinstance(v, TensorRef):
        out.append(0x92)
        _uint(out, v.kind)
        _uint(out, v.id)
    elif isinstance(v, Struct):
        _len(out, len(v), 0x80, 15, None, 0xDE, 0xDF)
        for k, x in v.items():
            _str(out, k)
            _enc(out, x, depth + 1)
    elif isinstance(v, dict):
        _len(out, len(v), 0x80, 15, None, 0xDE, 0xDF)
        for k in sorted(v):
            _enc(out, k, depth + 1)
            _enc(out, v[k], depth + 1)
    elif isinstance(v, (list, tuple)):
        _len(out, len(v), 0x90, 15, None, 0xDC, 0xDD)
        for x in v:
            _enc(out, x, depth + 1)
    else:
        raise TypeError("tensorferry: cannot encode %s" % type(v).__name__)


def encode(v, out=None):
    """Return (or append to the bytearray out) the msgpack encoding of v."""
    if out is None:
        out = bytearray()
    _enc(out, v, 0)
    return out


class _Reader:
    __slots__ = ("b", "i", "n")

    def __init__(self, b):
        self.b = memoryview(b).cast("B")
        self.i = 0
        self.n = len(self.b)

    def take(self, k, what):
        if k > self.n - self.i:
            raise BadBody("tensorferry: %s of %d bytes, %d left" % (what, k, self.n - self.i))
        s = self.b[self.i:self.i + k]
        self.i += k
        return s

    def byte(self, what):
        if self.i >= self.n:
            raise BadBody("tensorferry: truncated before %s" % what)
        c = self.b[self.i]
        self.i += 1
        return c

    def uint(self, size, what):
        return int.from_bytes(self.take(size, what), "big")

    def count(self, n, what):
        # Each item takes at least one byte: a count beyond the bytes left
        # is refused before anything is read or allocated for it.
        if n > self.n - self.i:
            raise BadBody("tensorferry: %s of %d items, %d bytes left" % (what, n, self.n - self.i))
        return n


def _dec(r, depth, refs):
    if depth > MAX_DEPTH:
        raise BadBody("tensorferry: msgpack nested deeper than %d" % MAX_DEPTH)
    c = r.byte("a value")
    if c <= 0x7F:
        return c
    if c >= 0xE0:
        return c - 0x100
    if 0xA0 <= c <= 0xBF:
        return _utf8(r.take(c & 0x1F, "str"))
    if 0x90 <= c <= 0x9F:
        return _array(r, c & 0x0F, depth, refs)
    if 0x80 <= c <= 0x8F:
        return _map(r, c & 0x0F, depth, refs)
    if c == 0xC0:
        return None
    if c == 0xC2:
        return False
    if c == 0xC3:
        return True
    if c in (0xCC, 0xCD, 0xCE, 0xCF):
        return r.uint(1 << (c - 0xCC), "uint")
    if c in (0xD0, 0xD1, 0xD2, 0xD3):
        return int.from_bytes(r.take(1 << (c - 0xD0), "int"), "big", signed=True)
    if c == 0xCA:
        return struct.unpack(">f", r.take(4, "float32"))[0]
    if c == 0xCB:
        return struct.unpack(">d", r.take(8, "float64"))[0]
    if c in (0xD9, 0xDA, 0xDB):
        return _utf8(r.take(r.uint(1 << (c - 0xD9), "str length"), "str"))
    if c in (0xC4, 0xC5, 0xC6):
        return bytes(r.take(r.uint(1 << (c - 0xC4), "bin length"), "bin"))
    if c in (0xDC, 0xDD):
        return _array(r, r.uint(2 if c == 0xDC else 4, "array length"), depth, refs)
    if c in (0xDE, 0xDF):
        return _map(r, r.uint(2 if c == 0xDE else 4, "map length"), depth, refs)
    if c in (0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xC7, 0xC8, 0xC9):
        raise BadBody("tensorferry: msgpack ext type 0x%02x not accepted" % c)
    raise BadBody("tensorferry: invalid msgpack byte 0x%02x" % c)


def _utf8(m):
    try:
        return str(m, "utf-8")
    except UnicodeDecodeError as e:
        raise BadBody("tensorferry: str is not UTF-8: %s" % e) from None


def _array(r, n, depth, refs):
    r.count(n, "array")
    out = []
    for _ in range(n):
        out.append(_dec(r, depth + 1, refs))
    if refs is not None and n == 2 and type(out[0]) is int and out[0] in (1, 3) \
            and type(out[1]) is int and out[1] >= 0:
        t = TensorRef(out[0], out[1])
        refs.append(t)
        return t
    return out


def _map(r, n, depth, refs):
    r.count(n * 2, "map")
    out = {}
    for _ in range(n):
        k = _dec(r, depth + 1, refs)
        if not isinstance(k, (str, int, bool, float, bytes)) and k is not None:
            raise BadBody("tensorferry: map key of type %s" % type(k).__name__)
        if k in out:
            raise BadBody("tensorferry: duplicate map key %r" % (k,))
        out[k] = _dec(r, depth + 1, refs)
    return out


def decode(b, refs=None):
    """Decode exactly one msgpack value from b; raise BadBody if b is not one.

    With refs (a list), arrays [1, id] and [3, id] decode as TensorRef and
    are appended to refs: the body of a message with a tensor table.
    """
    r = _Reader(b)
    v = _dec(r, 0, refs)
    if r.i != r.n:
        raise BadBody("tensorferry: %d bytes after the msgpack value" % (r.n - r.i))
    return v
