"""Message envelopes and tensor tables, as wire.Message and transfer's table.

A Python message is a registered name and a dict of fields in the Go
struct's declared order: encode_body gives the bytes wire.EncodeMsgpack
writes for the Go struct of the same values. A torch.Tensor field becomes
the reference [1, id] to an entry of the message's tensor table, which
travels beside the body (inline bytes here; exports are the channels').
"""

import itertools

from .codec import BadBody, Struct, TensorRef, decode, encode

SER_MSGPACK = 1  # wire.SerMsgpack

# transfer's table entry kinds and bound.
ENTRY_INLINE, ENTRY_FETCH, ENTRY_REF = 1, 2, 3
MAX_TABLE_ENTRIES = 1024
MAX_DIMS = 8  # tensor.MaxDims

_wire_ids = itertools.count(1)

# tensor.DType numbering, by name (torch dtypes are mapped in tensors.py).
DTYPES = {"float32": 1, "float16": 2, "bfloat16": 3, "float64": 4, "int8": 5,
          "int16": 6, "int32": 7, "int64": 8, "uint8": 9, "bool": 10}
DTYPE_SIZE = {1: 4, 2: 2, 3: 2, 4: 8, 5: 1, 6: 2, 7: 4, 8: 8, 9: 1, 10: 1}


class BadTable(ValueError):
    """A tensor table that cannot be decoded or does not match its body."""


class InlineTensor:
    """A tensor's bytes, dtype (tensor.DType number) and shape."""

    __slots__ = ("dtype", "shape", "data")

    def __init__(self, dtype, shape, data):
        self.dtype, self.shape, self.data = dtype, tuple(shape), data

    def __eq__(self, o):
        return isinstance(o, InlineTensor) and (self.dtype, self.shape, bytes(self.data)) == \
            (o.dtype, o.shape, bytes(o.data))

    def __repr__(self):
        return "InlineTensor(%d, %r, %d bytes)" % (self.dtype, self.shape, len(self.data))


class RefEntry:
    """Base of what a "ref" entry of a table becomes once received or what
    is sent as one (node.Ref): decode_body and encode_body match Ref
    fields ([3, id]) with it."""

    __slots__ = ()


def new_wire_id():
    """A fresh id naming a tensor within this process."""
    return next(_wire_ids)


def encode_envelope(target="", sender_node="", sender_id="", type_name="", ser=0,
                    body=b"", header=None, request=0, tensors=b""):
    """The bytes of a wire.Message: zero fields omitted, header keys sorted."""
    m = Struct()
    for k, v in (("t", target), ("sn", sender_node), ("si", sender_id), ("ty", type_name),
                 ("s", ser), ("b", bytes(body)), ("h", header or {}), ("r", request),
                 ("x", bytes(tensors))):
        if v:
            m[k] = v
    return bytes(encode(m))


_ENVELOPE = {"t": ("target", str), "sn": ("sender_node", str), "si": ("sender_id", str),
             "ty": ("type_name", str), "s": ("ser", int), "b": ("body", bytes),
             "h": ("header", dict), "r": ("request", int), "x": ("tensors", bytes)}


def decode_envelope(b):
    """Decode a wire.Message into a dict of encode_envelope's names.

    Unknown keys are skipped, as the Go side does; a known key of the wrong
    type raises BadBody.
    """
    v = decode(b)
    if not isinstance(v, dict):
        raise BadBody("tensorferry: message is a %s, not a map" % type(v).__name__)
    out = {"target": "", "sender_node": "", "sender_id": "", "type_name": "", "ser": 0,
           "body": b"", "header": {}, "request": 0, "tensors": b""}
    for k, x in v.items():
        f = _ENVELOPE.get(k)
        if f is None:
            continue
        name, typ = f
        if not isinstance(x, typ) or isinstance(x, bool):
            raise BadBody("tensorferry: message field %s is a %s" % (k, type(x).__name__))
        if typ is int and not 0 <= x < (1 << (8 if k == "s" else 64)):
            raise BadBody("tensorferry: message field %s out of range: %d" % (k, x))
        if typ is dict and not all(isinstance(a, str) and isinstance(c, str) for a, c in x.items()):
            raise BadBody("tensorferry: message header holds a non-string")
        out[name] = x
    return out


def encode_table(entries):
    """The bytes of a tensor table of (id, InlineTensor) entries, as transfer writes them."""
    if len(entries) > MAX_TABLE_ENTRIES:
        raise ValueError("tensorferry: %d tensors in one message, at most %d"
                         % (len(entries), MAX_TABLE_ENTRIES))
    rows = []
    for wid, t in entries:
        if isinstance(t, tuple) and t[0] == "ref":  # a Ref's export: fetched when the receiver asks
            rows.append(Struct((("i", wid), ("k", ENTRY_REF), ("t", 0), ("s", None),
                                ("b", None), ("d", t[1]))))
        elif isinstance(t, InlineTensor):
            rows.append(Struct((("i", wid), ("k", ENTRY_INLINE), ("t", t.dtype),
                                ("s", list(t.shape)), ("b", bytes(t.data)), ("d", None))))
        else:  # the descriptor of an export, fetched before delivery
            rows.append(Struct((("i", wid), ("k", ENTRY_FETCH), ("t", 0), ("s", None),
                                ("b", None), ("d", t))))
    return bytes(encode(rows))


def decode_table(b):
    """Decode and check a tensor table: {id: InlineTensor or ("fetch"|"ref", descriptor)}.

    Each entry must be complete and consistent: a known kind, an inline size
    equal to shape × dtype size, distinct ids, at most MAX_TABLE_ENTRIES.
    """
    if not b:
        return {}
    try:
        rows = decode(b)
    except BadBody as e:
        raise BadTable("tensorferry: bad tensor table: %s" % e) from None
    if not isinstance(rows, list):
        raise BadTable("tensorferry: bad tensor table: not an array")
    if len(rows) > MAX_TABLE_ENTRIES:
        raise BadTable("tensorferry: bad tensor table: %d entries, at most %d"
                       % (len(rows), MAX_TABLE_ENTRIES))
    out = {}
    for row in rows:
        if not isinstance(row, dict):
            raise BadTable("tensorferry: bad tensor table: entry is not a map")
        wid, kind = row.get("i"), row.get("k")
        if type(wid) is not int or wid <= 0 or wid in out:
            raise BadTable("tensorferry: bad tensor table: id %r missing, zero or repeated" % (wid,))
        if kind == ENTRY_INLINE:
            dt, shape, data = row.get("t"), row.get("s"), row.get("b")
            if type(dt) is not int or dt not in DTYPE_SIZE:
                raise BadTable("tensorferry: bad tensor table: unknown dtype %r" % (dt,))
            if not isinstance(shape, list) or len(shape) > MAX_DIMS or \
                    not all(type(d) is int and d >= 0 for d in shape):
                raise BadTable("tensorferry: bad tensor table: bad shape %r" % (shape,))
            if data is None:
                data = b""
            if not isinstance(data, bytes):
                raise BadTable("tensorferry: bad tensor table: inline bytes are a %s"
                               % type(data).__name__)
            n = DTYPE_SIZE[dt]
            for d in shape:
                n *= d
                if n > len(data):
                    break
            if n != len(data):
                raise BadTable("tensorferry: bad tensor table: %d inline bytes for shape %r of dtype %d"
                               % (len(data), shape, dt))
            out[wid] = InlineTensor(dt, shape, data)
        elif kind in (ENTRY_FETCH, ENTRY_REF):
            d = row.get("d")
            if not isinstance(d, dict):
                raise BadTable("tensorferry: bad tensor table: entry %d has no descriptor" % wid)
            out[wid] = ("fetch" if kind == ENTRY_FETCH else "ref", d)
        else:
            raise BadTable("tensorferry: bad tensor table: unknown entry kind %r" % (kind,))
    return out


def encode_body(fields, tensor_of=None):
    """The body of a message with fields (a dict in the Go struct's order).

    tensor_of(value) returns an InlineTensor for a value that is a tensor
    (a torch.Tensor), else None; such fields become [1, id] references, and
    the function returns (body bytes, [(id, InlineTensor)]).
    """
    table = []
    body = encode(Struct((k, _tensors_in(x, tensor_of, table, 0)) for k, x in fields.items()))
    return bytes(body), table


# _tensors_in and _tensors_sub are module functions, not closures of
# encode_body and decode_body: a recursive closure refers to itself, and
# that cycle would keep a message's tensors (GPU memory) alive until
# Python's cycle collector ran (2xH200: 12 GiB held, a cudaMalloc per
# message of 4 MiB to 1 GiB).
def _tensors_in(v, tensor_of, table, depth):
    if depth > 32:
        raise ValueError("tensorferry: message nested deeper than 32")
    if isinstance(v, RefEntry):  # sent lazily: the caller exports it
        wid = new_wire_id()
        table.append((wid, v))
        return TensorRef(TensorRef.REF, wid)
    if isinstance(v, InlineTensor) or (tensor_of is not None and not isinstance(
            v, (int, float, str, bytes, bool, type(None), dict, list, tuple))):
        t = v if isinstance(v, InlineTensor) else tensor_of(v)
        if t is None:
            return v
        wid = new_wire_id()
        table.append((wid, t))
        return TensorRef(TensorRef.TENSOR, wid)
    if isinstance(v, Struct):
        return Struct((k, _tensors_in(x, tensor_of, table, depth + 1)) for k, x in v.items())
    if isinstance(v, dict):
        return {k: _tensors_in(x, tensor_of, table, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_tensors_in(x, tensor_of, table, depth + 1) for x in v]
    return v


def decode_body(body, table):
    """Decode a message body; [kind, id] fields naming entries of table
    (decode_table's dict) are replaced by those entries. Every entry must
    be referred to exactly once."""
    refs = []
    v = decode(body, refs)
    used = set()
    for r in refs:
        if r.id in table:
            if r.id in used:
                raise BadTable("tensorferry: bad tensor table: entry %d referred to twice" % r.id)
            # A Ref field ([3, id]) names a "ref" entry, a tensor field
            # ([1, id]) any other, as Go's import checks.
            x = table[r.id]
            if (r.kind == TensorRef.REF) != (isinstance(x, RefEntry) or isinstance(x, tuple) and x[0] == "ref"):
                raise BadTable("tensorferry: bad tensor table: field of kind %d refers to entry %d of "
                               "another kind" % (r.kind, r.id))
            used.add(r.id)
    if len(used) != len(table):
        raise BadTable("tensorferry: bad tensor table: %d entries, body refers to %d"
                       % (len(table), len(used)))

    return _tensors_sub(v, table) if used or refs else v


def _tensors_sub(x, table):
    if isinstance(x, TensorRef):
        return table[x.id] if x.id in table else [x.kind, x.id]
    if isinstance(x, dict):
        return {k: _tensors_sub(y, table) for k, y in x.items()}
    if isinstance(x, list):
        return [_tensors_sub(y, table) for y in x]
    return x
