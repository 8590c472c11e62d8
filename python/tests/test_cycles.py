"""A message's path makes no reference cycles: a tensor it carries is
freed when the last holder drops it, not when the garbage collector next
runs (until then a fetched CUDA buffer stays allocated and the allocator
cannot reuse it), and the collector has nothing to do per message."""

import gc
import os
import sys
import unittest
import weakref

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tensorferry.codec import Struct, encode  # noqa: E402
from tensorferry.message import decode_body, decode_table, encode_body, encode_envelope, encode_table  # noqa: E402
from tensorferry.node import F_MESSAGE, Message, Node, tensor_to_inline  # noqa: E402


class FakeConn:
    def __init__(self, peer):
        self.peer, self.inc, self.sent, self.caps, self.closed = peer, 5, [], b"\x80", False

    def send(self, ftype, body, stream=0):
        self.sent.append((ftype, body))


class NoCyclesTest(unittest.TestCase):
    def setUp(self):
        gc.collect()
        self.addCleanup(gc.set_debug, 0)
        self.addCleanup(gc.garbage.clear)

    def cyclic(self, fn, n=3):
        """The objects fn leaves to the garbage collector, over n calls."""
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.garbage.clear()
        for _ in range(n):
            fn()
        gc.collect()
        gc.set_debug(0)
        out = list(gc.garbage)
        gc.garbage.clear()
        return out

    def test_codec(self):
        import torch
        fields = Struct(A=[1, {"x": torch.ones(3)}, (torch.zeros(2),)], B=Struct(C=torch.ones(1)), D="s")

        def round_trip():
            body, table = encode_body(fields, lambda v: tensor_to_inline(v) if isinstance(v, torch.Tensor) else None)
            got = decode_body(body, decode_table(encode_table(table)))
            self.assertEqual(len(got["A"]), 3)
        self.assertEqual(self.cyclic(round_trip), [])

    def test_message_in_and_reply(self):
        import torch
        node = Node("c", b"0123456789abcdef", "py", "127.0.0.1:0", {"go": "127.0.0.1:1"}, ipc=False)
        conn = FakeConn("go")
        node.conns["go"] = conn
        held = []

        def sink(m):
            held.append(weakref.ref(m["T"][0]))
            return Message("t.Ack", {"T": m["T"][0] + 1})
        node.handle("sink", sink)
        x = tensor_to_inline(torch.arange(4, dtype=torch.float32))
        body, table = encode_body(Struct(T=[x]))
        env = encode_envelope(target="sink", sender_node="go", sender_id="future#3", type_name="t.M", ser=1,
                              body=body, tensors=encode_table(table))

        def one():
            node._message_in(conn, env)
            node._dispatch_one()
        node.inbox.put = lambda item, timeout=None: node._pending_item.append(item)
        node._pending_item = []

        def dispatch_one():
            target, msg = node._pending_item.pop()
            node._run(target, msg)
        node._dispatch_one = dispatch_one
        gc.disable()
        self.addCleanup(gc.enable)
        self.assertEqual(self.cyclic(one), [])
        # The received tensor went when the handler was done with it.
        self.assertEqual([r() for r in held], [None] * len(held))
        self.assertEqual([f for f, _ in conn.sent], [F_MESSAGE] * 3)
        self.assertEqual(node.errors, [])


if __name__ == "__main__":
    unittest.main()
