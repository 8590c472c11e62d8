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


_KEYS = {}  # a Struct's field name -> its encoding (names repeat: fields of a few types)


def _enc_struct(out, v, depth):
    if depth > MAX_DEPTH:
        raise ValueError("tensorferry: value nested deeper than %d" % MAX_DEPTH)
    n = len(v)
    if n and depth >= MAX_DEPTH:  # its fields would be deeper: _enc's check on each
        raise ValueError("tensorferry: value nested deeper than %d" % MAX_DEPTH)
    if n <= 15:
        out.append(0x80 | n)
    else:
        _len(out, n, 0x80, 15, None, 0xDE, 0xDF)
    depth += 1
    for k, x in v.items():
        kb = _KEYS.get(k)
        if kb is None:
            kb = bytearray()
            _str(kb, k)
            kb = bytes(kb)
            if len(_KEYS) < 4096:
                _KEYS[k] = kb
        out += kb
        f = _FAST_ENC.get(type(x))
        if f is not None:
            f(out, x, depth)
        else:
            _enc(out, x, depth)


def _enc_str(out, v, depth):
    b = v.encode("utf-8")
    if len(b) <= 31:
        out.append(0xA0 | len(b))
        out += b
    else:
        _len(out, len(b), 0xA0, 31, 0xD9, 0xDA, 0xDB)
        out += b


def _enc_int(out, v, depth):
    if 0 <= v < 0x80:
        out.append(v)
    else:
        _int(out, v)


def _enc_bytes(out, v, depth):
    _len(out, len(v), None, 0, 0xC4, 0xC5, 0xC6)
    out += v


# Encoders by exact type for the common values (a Struct's fields); any
# other type, subclasses included, goes through _enc's checks in order.
_FAST_ENC = {Struct: _enc_struct, str: _enc_str, int: _enc_int, bytes: _enc_bytes}


def encode(v, out=None):
    """Return (or append to the bytearray out) the msgpack encoding of v."""
    if out is None:
        out = bytearray()
    f = _FAST_ENC.get(type(v))
    if f is not None:
        f(out, v, 0)
    else:
        _enc(out, v, 0)
    return out


_unpack_f32 = struct.Struct(">f").unpack_from
_unpack_f64 = struct.Struct(">d").unpack_from
_from_bytes = int.from_bytes


def _short(what, k, left):
    return BadBody("tensorferry: %s of %d bytes, %d left" % (what, k, left))


def _dec(b, i, n, depth, refs):
    """Decode the value at b[i:] (b: bytes of length n); (value, next i).

    One function with the common forms first and every length checked
    against what is left before it is used: the per-message path decodes
    envelopes, tables and bodies through here.
    """
    if i >= n:
        raise BadBody("tensorferry: truncated before a value")
    c = b[i]
    i += 1
    if c <= 0x7F:
        return c, i
    if c >= 0xE0:
        return c - 0x100, i
    if c >= 0xA0:
        if c <= 0xBF:
            k = c & 0x1F
            if k > n - i:
                raise _short("str", k, n - i)
            return _utf8(b[i:i + k]), i + k
    elif c >= 0x90:
        return _array(b, i, n, c & 0x0F, depth, refs)
    elif c >= 0x80:
        return _map(b, i, n, c & 0x0F, depth, refs)
    if c == 0xC0:
        return None, i
    if c == 0xC2:
        return False, i
    if c == 0xC3:
        return True, i
    if 0xCC <= c <= 0xCF:
        k = 1 << (c - 0xCC)
        if k > n - i:
            raise _short("uint", k, n - i)
        return _from_bytes(b[i:i + k], "big"), i + k
    if 0xD0 <= c <= 0xD3:
        k = 1 << (c - 0xD0)
        if k > n - i:
            raise _short("int", k, n - i)
        return _from_bytes(b[i:i + k], "big", signed=True), i + k
    if c == 0xCA:
        if 4 > n - i:
            raise _short("float32", 4, n - i)
        return _unpack_f32(b, i)[0], i + 4
    if c == 0xCB:
        if 8 > n - i:
            raise _short("float64", 8, n - i)
        return _unpack_f64(b, i)[0], i + 8
    if c in (0xD9, 0xDA, 0xDB, 0xC4, 0xC5, 0xC6):
        is_str = c >= 0xD9
        what = "str" if is_str else "bin"
        w = 1 << (c - (0xD9 if is_str else 0xC4))
        if w > n - i:
            raise _short(what + " length", w, n - i)
        k = _from_bytes(b[i:i + w], "big")
        i += w
        if k > n - i:
            raise _short(what, k, n - i)
        return (_utf8(b[i:i + k]) if is_str else b[i:i + k]), i + k
    if c in (0xDC, 0xDD, 0xDE, 0xDF):
        w = 2 if c in (0xDC, 0xDE) else 4
        what = "array length" if c <= 0xDD else "map length"
        if w > n - i:
            raise _short(what, w, n - i)
        k = _from_bytes(b[i:i + w], "big")
        if c <= 0xDD:
            return _array(b, i + w, n, k, depth, refs)
        return _map(b, i + w, n, k, depth, refs)
    if c in (0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xC7, 0xC8, 0xC9):
        raise BadBody("tensorferry: msgpack ext type 0x%02x not accepted" % c)
    raise BadBody("tensorferry: invalid msgpack byte 0x%02x" % c)


def _utf8(m):
    try:
        return str(m, "utf-8")
    except UnicodeDecodeError as e:
        raise BadBody("tensorferry: str is not UTF-8: %s" % e) from None


def _array(b, i, n, k, depth, refs):
    # Each item takes at least one byte: a count beyond the bytes left
    # is refused before anything is read or allocated for it.
    if k > n - i:
        raise BadBody("tensorferry: array of %d items, %d bytes left" % (k, n - i))
    depth += 1
    if k and depth > MAX_DEPTH:
        raise BadBody("tensorferry: msgpack nested deeper than %d" % MAX_DEPTH)
    out = []
    for _ in range(k):
        v, i = _dec(b, i, n, depth, refs)
        out.append(v)
    if refs is not None and k == 2 and type(out[0]) is int and out[0] in (1, 3) \
            and type(out[1]) is int and out[1] >= 0:
        t = TensorRef(out[0], out[1])
        refs.append(t)
        return t, i
    return out, i


_KEY_TYPES = (str, int, bool, float, bytes)


def _map(b, i, n, k, depth, refs):
    if 2 * k > n - i:
        raise BadBody("tensorferry: map of %d items, %d bytes left" % (2 * k, n - i))
    depth += 1
    if k and depth > MAX_DEPTH:
        raise BadBody("tensorferry: msgpack nested deeper than %d" % MAX_DEPTH)
    out = {}
    for _ in range(k):
        key, i = _dec(b, i, n, depth, refs)
        if key is not None and not isinstance(key, _KEY_TYPES):
            raise BadBody("tensorferry: map key of type %s" % type(key).__name__)
        if key in out:
            raise BadBody("tensorferry: duplicate map key %r" % (key,))
        out[key], i = _dec(b, i, n, depth, refs)
    return out, i


def decode(b, refs=None):
    """Decode exactly one msgpack value from b; raise BadBody if b is not one.

    With refs (a list), arrays [1, id] and [3, id] decode as TensorRef and
    are appended to refs: the body of a message with a tensor table.

    Bytes _fast can vouch for go through msgpack's C unpacker (when the
    msgpack package is there), with the same result; anything else, and
    anything it refuses, through the Python decoder, which says what is
    wrong.
    """
    if type(b) is not bytes:
        b = bytes(b)
    if _unpackb is not None and len(b) <= _FAST_MAX:
        sub = [] if refs is not None else None
        try:
            v = _fast(b, sub)
        except Exception:  # noqa: BLE001 - the Python decoder names what is wrong
            pass
        else:
            if v is not _NOT_FAST:
                if sub:
                    refs.extend(sub)
                return v
    return _decode_python(b, refs)


def split_array(b, max_items):
    """The encoded bytes of each item of the msgpack array b (a message
    batch: each item is then decoded on its own), without decoding them
    twice: msgpack's C unpacker skips over each item where it is there,
    else the Python decoder reads it. Raises BadBody when b is not one
    array of at most max_items well-formed items."""
    if type(b) is not bytes:
        b = bytes(b)
    n = len(b)
    if _Unpacker is None:  # pragma: no cover - the Python decoder alone
        return _split_python(b, n, max_items)
    u = _Unpacker(max_buffer_size=max(n, 1))
    u.feed(b)
    try:
        k = u.read_array_header()
        if k > max_items or k > n:
            raise BadBody("tensorferry: array of %d items in %d bytes (at most %d)" % (k, n, max_items))
        out, start = [], u.tell()
        for _ in range(k):
            u.skip()
            end = u.tell()
            out.append(b[start:end])
            start = end
    except BadBody:
        raise
    except Exception as e:  # noqa: BLE001 - the unpacker's errors are several types
        raise BadBody("tensorferry: bad msgpack array: %s" % (str(e)[:200] or type(e).__name__)) from None
    if start != n:
        raise BadBody("tensorferry: %d bytes after the msgpack array" % (n - start))
    return out


def _split_python(b, n, max_items):
    """split_array by the Python decoder (it decodes each item to find
    its end)."""
    if not n:
        raise BadBody("tensorferry: empty msgpack array")
    c, i = b[0], 1
    if 0x90 <= c <= 0x9F:
        k = c & 0x0F
    elif c in (0xDC, 0xDD):
        w = 2 if c == 0xDC else 4
        if n < 1 + w:
            raise BadBody("tensorferry: truncated array header")
        k, i = int.from_bytes(b[1:1 + w], "big"), 1 + w
    else:
        raise BadBody("tensorferry: not a msgpack array (byte %#x)" % c)
    if k > max_items or k > n - i:
        raise BadBody("tensorferry: array of %d items in %d bytes (at most %d)" % (k, n, max_items))
    out = []
    for _ in range(k):
        _, j = _dec(b, i, n, 1, None)
        out.append(b[i:j])
        i = j
    if i != n:
        raise BadBody("tensorferry: %d bytes after the msgpack array" % (n - i))
    return out


def _decode_python(b, refs=None):
    """decode by the Python decoder alone (b: bytes)."""
    n = len(b)
    v, i = _dec(b, 0, n, 0, refs)
    if i != n:
        raise BadBody("tensorferry: %d bytes after the msgpack value" % (n - i))
    return v


# The fast path: msgpack's C unpacker (about ten times the Python
# decoder's speed on a message's envelope, table and body) for bytes that
# cannot hold what only the Python decoder checks. A container nested
# deeper than MAX_DEPTH needs more than MAX_DEPTH array or map headers, so
# bytes with at most MAX_DEPTH bytes that could start one are shallow
# enough; bytes with no byte that could start an ext value hold none (the
# C unpacker would turn ext -1 into a Timestamp). Both counts see payload
# bytes too, so they overcount: what they let through is safe, what they
# stop takes the Python decoder. Duplicate map keys and key types are
# checked by the pairs hook; bad UTF-8, truncation, counts beyond the
# input, reserved bytes and trailing bytes make the C unpacker raise.
try:
    from msgpack import Unpacker as _Unpacker, unpackb as _unpackb
except ImportError:  # pragma: no cover - the Python decoder alone
    _Unpacker = _unpackb = None

# Larger bytes are mostly payload (an inline tensor's bin), which the
# Python decoder slices at once, while the two counts below read every
# byte (64 KiB: tens of microseconds).
_FAST_MAX = 4096
_NOT_FAST = object()
_CONTAINER = bytes(range(0x80, 0xA0)) + bytes((0xDC, 0xDD, 0xDE, 0xDF))
_EXT = bytes((0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8))
_KEEP_CONTAINER = bytes(c for c in range(256) if c not in _CONTAINER)
_KEEP_EXT = bytes(c for c in range(256) if c not in _EXT)


def _pairs(pairs):
    out = {}
    for k, x in pairs:
        if k is not None and not isinstance(k, _KEY_TYPES):
            raise BadBody("map key")  # the Python decoder names it
        out[k] = x
    if len(out) != len(pairs):
        raise BadBody("duplicate map key")
    return out


def _fast(b, refs):
    """b decoded by the C unpacker, or _NOT_FAST when b may hold what it
    does not check; raises on anything the Python decoder refuses."""
    if len(b.translate(None, _KEEP_CONTAINER)) > MAX_DEPTH or b.translate(None, _KEEP_EXT):
        return _NOT_FAST
    if refs is None:
        return _unpackb(b, raw=False, strict_map_key=False, use_list=True, object_pairs_hook=_pairs)

    def lists(x):
        if len(x) == 2 and type(x[0]) is int and x[0] in (1, 3) and type(x[1]) is int and x[1] >= 0:
            t = TensorRef(x[0], x[1])
            refs.append(t)
            return t
        return x
    return _unpackb(b, raw=False, strict_map_key=False, use_list=True, object_pairs_hook=_pairs,
                    list_hook=lists)
