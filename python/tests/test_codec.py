"""Codec tests: bytes equal to the Go side's, hostile bodies refused."""

import json
import math
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tensorferry import codec  # noqa: E402
from tensorferry import (BadBody, BadTable, F32, InlineTensor, Struct,  # noqa: E402
                         TensorRef, decode, decode_body, decode_envelope, decode_table,
                         encode, encode_envelope, encode_table)

try:
    from hypothesis import given, settings, strategies as st
except ImportError:  # pragma: no cover
    given = None

GOLDEN = os.path.join(os.path.dirname(__file__), "testdata", "golden.json")


def golden():
    with open(GOLDEN) as f:
        return {k: bytes.fromhex(v) for k, v in json.load(f).items()}


def sample(**kw):
    # The Go struct Sample of python/golden_test.go, fields in declared order.
    s = Struct((("Name", ""), ("Count", 0), ("Neg", 0), ("Big", 0), ("Ratio", 0.0),
                ("Small", F32(0)), ("Flag", False), ("Data", None), ("Tags", None),
                ("List", None), ("W", None)))
    s.update(kw)
    return s


class GoldenTest(unittest.TestCase):
    def setUp(self):
        self.g = golden()

    def test_sample_zero(self):
        self.assertEqual(bytes(encode(sample())), self.g["sample_zero"])

    def test_sample_full(self):
        v = sample(Name="héllo", Count=300, Neg=-40000, Big=2**64 - 1, Ratio=0.1,
                   Small=F32(1.5), Flag=True, Data=bytes(range(256)) + bytes(range(44)),
                   Tags={"b": "2", "a": "1", "c": "3"},
                   List=[0, -1, 127, 128, -33, 65536, -2147483649], W=TensorRef(1, 7))
        self.assertEqual(bytes(encode(v)), self.g["sample_full"])
        back = decode(self.g["sample_full"], [])
        self.assertEqual(back["W"], TensorRef(1, 7))
        self.assertEqual(back["Big"], 2**64 - 1)
        self.assertEqual(back["List"], [0, -1, 127, 128, -33, 65536, -2147483649])

    def test_sample_bigid(self):
        v = sample(Name="\0" * 40, W=TensorRef(1, 1 << 33))
        self.assertEqual(bytes(encode(v)), self.g["sample_bigid"])

    def test_tagged(self):
        self.assertEqual(bytes(encode(Struct(step=42, shard="s0"))), self.g["tagged"])
        v = Struct(step=1, loss=-2.5, shard="s1", meta={"k": "v"})
        self.assertEqual(bytes(encode(v)), self.g["tagged_full"])

    def test_envelope(self):
        b = encode_envelope(target="ps/shard-0", sender_node="py-1", sender_id="worker",
                            type_name="torchps.Push", ser=1, body=b"\x80",
                            header={"z": "1", "a": "2"}, request=1 << 40, tensors=b"\x90")
        self.assertEqual(b, self.g["envelope"])
        self.assertEqual(encode_envelope(), self.g["envelope_zero"])
        m = decode_envelope(self.g["envelope"])
        self.assertEqual(m["target"], "ps/shard-0")
        self.assertEqual(m["request"], 1 << 40)
        self.assertEqual(m["header"], {"a": "2", "z": "1"})


class HostileTest(unittest.TestCase):
    def refused(self, b, word):
        with self.assertRaises(BadBody) as cm:
            decode(b)
        self.assertIn(word, str(cm.exception))

    def test_counts_beyond_input(self):
        # A declared count of 2^32-1 items in a few bytes is refused before
        # anything is read or allocated for it.
        self.refused(b"\xdd\xff\xff\xff\xff", "array of 4294967295 items")
        self.refused(b"\xdf\xff\xff\xff\xff\x01", "map of")
        self.refused(b"\xc6\xff\xff\xff\xff", "bin of 4294967295 bytes")
        self.refused(b"\xdb\x7f\xff\xff\xff" + b"a" * 10, "str of")

    def test_truncated(self):
        for b in (b"", b"\xcd\x01", b"\x92\x01", b"\xa5ab", b"\xcb\x00"):
            with self.assertRaises(BadBody):
                decode(b)

    def test_trailing(self):
        self.refused(b"\x01\x02", "after the msgpack value")

    def test_depth(self):
        self.refused(b"\x91" * 100 + b"\x00", "nested deeper")

    def test_invalid_and_ext(self):
        self.refused(b"\xc1", "invalid msgpack byte 0xc1")
        self.refused(b"\xd4\x01\x02", "ext type")

    def test_bad_utf8(self):
        self.refused(b"\xa2\xff\xfe", "not UTF-8")

    @unittest.skipIf(codec._unpackb is None, "no msgpack package: the Python decoder alone")
    def test_fast_path(self):
        # An envelope goes through the C unpacker; what it cannot vouch
        # for (deep nesting, ext bytes anywhere) through the Python
        # decoder, which refuses it by name.
        env = bytes(encode(Struct(t="sink", ty="bench.Msg", s=1, b=b"\x81\xa1T\x92\x01\x01", r=7)))
        self.assertIsNot(codec._fast(env, None), codec._NOT_FAST)
        refs = []
        self.assertEqual(decode(b"\x81\xa1T\x92\x01\x05", refs), {"T": TensorRef(1, 5)})
        self.assertEqual(refs, [TensorRef(1, 5)])
        self.assertIs(codec._fast(b"\x91" * 33 + b"\x00", None), codec._NOT_FAST)
        self.assertIs(codec._fast(b"\xd6\xff" + bytes(4), None), codec._NOT_FAST)
        self.refused(b"\xd6\xff" + bytes(4), "ext type")  # a Timestamp to the C unpacker
        self.refused(b"\x91" * 32 + b"\x91\x00", "nested deeper")
        self.refused(b"\x82\x01\x02\x01\x03", "duplicate map key")
        self.refused(b"\x81\x92\x01\x01\x01", "map key of type")

    def test_encode_depth(self):
        # Structs (encode's fast encoders) nested as deep as the decoder
        # takes are written; one more level is refused, as _enc refuses it.
        for deep, ok in ((32, True), (33, False)):
            v = 7
            for _ in range(deep):
                v = Struct(n=v)
            if ok:
                self.assertEqual(decode(encode(v)) is not None, True)
            else:
                with self.assertRaises(ValueError):
                    encode(v)

    def test_map_keys(self):
        self.refused(b"\x82\xa1a\x01\xa1a\x02", "duplicate map key")
        self.refused(b"\x81\x90\x01", "map key of type list")

    def test_envelope_types(self):
        with self.assertRaises(BadBody):
            decode_envelope(bytes(encode({"t": 5})))
        with self.assertRaises(BadBody):
            decode_envelope(bytes(encode({"s": 300})))
        with self.assertRaises(BadBody):
            decode_envelope(b"\x91\x01")
        # Unknown keys are skipped, as the Go side does.
        self.assertEqual(decode_envelope(bytes(encode({"zz": 1, "t": "a"})))["target"], "a")

    def test_table(self):
        t = InlineTensor(1, (2, 3), bytes(24))
        b = encode_table([(5, t)])
        self.assertEqual(decode_table(b), {5: t})
        bad = [
            [Struct(i=5, k=1, t=1, s=[2, 3], b=bytes(23), d=None)],   # size
            [Struct(i=5, k=1, t=99, s=[1], b=bytes(1), d=None)],      # dtype
            [Struct(i=0, k=1, t=9, s=[1], b=bytes(1), d=None)],       # id 0
            [Struct(i=5, k=9, t=9, s=[1], b=bytes(1), d=None)],       # kind
            [Struct(i=5, k=2, d=None)],                               # no descriptor
            [Struct(i=5, k=1, t=9, s=[-1], b=b"", d=None)],           # shape
            [Struct(i=5, k=1, t=9, s=[1] * 9, b=bytes(1), d=None)],   # dims
            [Struct(i=5, k=1, t=9, s=[1], b=bytes(1), d=None)] * 2,   # repeated id
            # A shape whose product overflows any size is refused without
            # computing past the bytes that are there.
            [Struct(i=5, k=1, t=4, s=[2**62, 2**62, 0], b=b"", d=None)],
        ]
        for rows in bad:
            with self.assertRaises(BadTable, msg=rows):
                decode_table(bytes(encode(rows)))
        with self.assertRaises(BadTable):
            decode_table(b"\xdd\x00\x00\x04\x01" + b"\xc0" * 1025)

    def test_body_refs_match_table(self):
        t = InlineTensor(9, (1,), b"\x07")
        body = bytes(encode(Struct(W=TensorRef(1, 5))))
        self.assertEqual(decode_body(body, {5: t})["W"], t)
        with self.assertRaises(BadTable):
            decode_body(bytes(encode(Struct(W=None))), {5: t})   # entry unused
        with self.assertRaises(BadTable):
            decode_body(bytes(encode(Struct(A=TensorRef(1, 5), B=TensorRef(1, 5)))), {5: t})

    def test_bodies_keep_no_tensor_alive(self):
        """Neither codec keeps a message's tensors in a reference cycle:
        they go as soon as the message does, without Python's cycle
        collector (which ran every few messages and held GBs of GPU
        memory before)."""
        import gc
        import weakref

        from tensorferry.message import encode_body

        class Tensor:  # what tensor_of turns into an InlineTensor
            pass
        gc.disable()
        try:
            x = Tensor()
            ref = weakref.ref(x)
            # tensor_of's result holds the tensor, as the node's does.
            body, table = encode_body({"A": {"B": [x]}}, lambda v: [v] if isinstance(v, Tensor) else None)
            wid = table[0][0]
            del x, table
            self.assertIsNone(ref(), "encode_body keeps a sent tensor alive")
            t = Tensor()
            ref = weakref.ref(t)
            fields = decode_body(body, {wid: t})
            self.assertIs(fields["A"]["B"][0], t)
            del t, fields
            self.assertIsNone(ref(), "decode_body keeps a received tensor alive")
        finally:
            gc.enable()


class SplitArrayTest(unittest.TestCase):
    """codec.split_array: a message batch's items as their own bytes, by
    msgpack's unpacker and by the Python decoder alike."""

    def both(self, fn):
        fn()
        saved = codec._Unpacker
        codec._Unpacker = None
        try:
            fn()
        finally:
            codec._Unpacker = saved

    def test_items(self):
        items = [{"t": "a", "b": b"x" * 300}, [1, [2, {"k": None}]], "s", 7, 2**64 - 1]
        b = bytes(encode(items))

        def check():
            self.assertEqual(codec.split_array(b, 1024), [bytes(encode(v)) for v in items])
            self.assertEqual(codec.split_array(bytes(encode([])), 1024), [])
        self.both(check)

    def test_hostile(self):
        cases = {
            "not an array": bytes(encode({"a": 1})),
            "empty": b"",
            "more items than bytes": b"\xdd\xff\xff\xff\xff" + b"\xc0" * 8,
            "more items than allowed": bytes(encode([0] * 5)),
            "truncated item": bytes(encode(["abcdef"]))[:-2],
            "truncated header": b"\xdc\x00",
            "trailing bytes": bytes(encode([1])) + b"\xc0",
            "reserved byte": b"\x91\xc1",
            "deep item": b"\x91" + b"\x91" * 100000 + b"\xc0",
        }
        for what, b in cases.items():
            def check(b=b, what=what):
                with self.assertRaises(BadBody, msg=what):
                    codec.split_array(b, 4)
            self.both(check)


if given is not None:
    leaves = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
              | st.floats(allow_nan=False) | st.text(max_size=300) | st.binary(max_size=300))
    values = st.recursive(leaves, lambda c: st.lists(c, max_size=6)
                          | st.dictionaries(st.text(max_size=8), c, max_size=6), max_leaves=30)

    class PropertyTest(unittest.TestCase):
        @settings(max_examples=300, deadline=None)
        @given(values)
        def test_roundtrip(self, v):
            self.assertEqual(decode(encode(v)), v)

        @settings(max_examples=300, deadline=None)
        @given(values)
        def test_canonical(self, v):
            # Decoding and encoding again gives the same bytes: one
            # encoding per value, as the Go side's.
            b = bytes(encode(v))
            self.assertEqual(bytes(encode(decode(b))), b)

        @settings(max_examples=1000, deadline=None)
        @given(st.binary(max_size=64))
        def test_garbage(self, b):
            # Any bytes: a value or BadBody, nothing else.
            try:
                decode(b)
            except BadBody:
                pass

        @settings(max_examples=500, deadline=None)
        @given(st.binary(max_size=64))
        def test_garbage_table(self, b):
            try:
                decode_table(b)
            except BadTable:
                pass

        @settings(max_examples=300, deadline=None)
        @given(values, st.data())
        def test_truncations_refused(self, v, data):
            b = bytes(encode(v))
            cut = data.draw(st.integers(0, len(b) - 1))
            with self.assertRaises(BadBody):
                decode(b[:cut])

        @settings(max_examples=1000, deadline=None)
        @given(st.one_of(st.binary(max_size=64), values.map(lambda v: bytes(encode(v)))), st.data())
        def test_fast_path_agrees(self, b, data):
            # The C unpacker's path (codec._fast) and the Python decoder
            # accept the same bytes, with the same value and the same
            # tensor references, and refuse the same; a mutated encoding
            # too, and arrays that look like [kind, id].
            if data.draw(st.booleans()) and b:
                i = data.draw(st.integers(0, len(b) - 1))
                b = b[:i] + bytes((data.draw(st.integers(0, 255)),)) + b[i + 1:]
            for refs in (None, []):
                try:
                    want = codec._decode_python(b, [] if refs is not None else None)
                    want_refs = []
                    if refs is not None:
                        codec._decode_python(b, want_refs)
                except BadBody:
                    with self.assertRaises(BadBody):
                        decode(b, refs)
                    continue
                got = decode(b, refs)
                self.assertEqual(repr(got), repr(want))
                if refs is not None:
                    self.assertEqual(refs, want_refs)

        @settings(max_examples=300, deadline=None)
        @given(st.lists(values, max_size=5), st.data())
        def test_split_array(self, items, data):
            # A batch splits into its items' encodings, by either path; any
            # mutation of it splits the same way by both, or is refused by
            # both, or (the unpacker skips items without checking their
            # strings and depth) an item the unpacker let through is one
            # that decode refuses, as the node does next.
            b = bytes(encode(items))
            self.assertEqual(codec.split_array(b, 8), [bytes(encode(v)) for v in items])
            if b and data.draw(st.booleans()):
                i = data.draw(st.integers(0, len(b) - 1))
                b = b[:i] + bytes((data.draw(st.integers(0, 255)),)) + b[i + 1:]
            else:
                b = b[:data.draw(st.integers(0, len(b)))]
            try:
                got = codec.split_array(b, 8)
            except BadBody:
                got = BadBody
            saved = codec._Unpacker
            codec._Unpacker = None
            try:
                want = codec.split_array(b, 8)
            except BadBody:
                want = BadBody
            finally:
                codec._Unpacker = saved
            if got is not BadBody and want is BadBody:
                refused = 0
                for item in got:
                    try:
                        decode(item)
                    except BadBody:
                        refused += 1
                self.assertTrue(refused, "the unpacker's split of bytes the Python decoder refuses")
                return
            self.assertEqual(got, want)

        @settings(max_examples=500, deadline=None)
        @given(st.recursive(leaves, lambda c: st.lists(c, max_size=4)
                            | st.dictionaries(st.text(max_size=40), c, max_size=4).map(Struct), max_leaves=40))
        def test_fast_encoder_agrees(self, v):
            # encode's encoders by type (codec._FAST_ENC) write the bytes
            # of _enc's checks in order, and refuse the same depth.
            try:
                want = bytearray()
                codec._enc(want, v, 0)
            except ValueError:
                with self.assertRaises(ValueError):
                    encode(v)
                return
            self.assertEqual(bytes(encode(v)), bytes(want))

        def test_float_nan(self):
            self.assertTrue(math.isnan(decode(encode(float("nan")))))


if __name__ == "__main__":
    unittest.main()
