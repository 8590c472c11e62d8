"""Descriptor checks: main's Content field "c" is accepted when a uint64, refused otherwise."""

import os
import sys
import types
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tensorferry.message import BadTable  # noqa: E402
from tensorferry.node import Node  # noqa: E402


class DescriptorTest(unittest.TestCase):
    peer = types.SimpleNamespace(peer="go-1", inc=7)

    def desc(self, **kw):
        d = {"o": "go-1", "i": 7, "e": 3, "l": 9, "t": 1, "s": [2, 2], "b": 16}
        d.update(kw)
        return d

    def test_content_accepted(self):
        self.assertEqual(Node._check_descriptor(None, self.peer, self.desc()), 16)
        self.assertEqual(Node._check_descriptor(None, self.peer, self.desc(c=1 << 40)), 16)

    def test_bad_content_refused(self):
        for c in (-1, 1 << 64, "x", None, 1.5):
            with self.assertRaises(BadTable):
                Node._check_descriptor(None, self.peer, self.desc(c=c))


if __name__ == "__main__":
    unittest.main()
