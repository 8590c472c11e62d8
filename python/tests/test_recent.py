"""Recent: a node's records of transfers, served exports, errors and
warnings keep their last entries only, and "len before, entries since"
still works across the trimming."""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tensorferry.node import Recent  # noqa: E402


class RecentTest(unittest.TestCase):
    def test_bounded(self):
        r = Recent()
        for i in range(10 * Recent.KEEP):
            r.append(i)
        self.assertEqual(len(r), 10 * Recent.KEEP)
        self.assertLessEqual(list.__len__(r), 2 * Recent.KEEP)
        self.assertEqual(r[-1], 10 * Recent.KEEP - 1)

    def test_since(self):
        r = Recent()
        for i in range(3 * Recent.KEEP):
            r.append(i)
        n = len(r)
        r.append("a")
        r.append("b")
        self.assertEqual(r[n:], ["a", "b"])
        self.assertEqual(r[len(r):], [])
        # Entries since a position already dropped: those kept.
        self.assertEqual(r[0:][-1], "b")

    def test_small_is_a_list(self):
        r = Recent()
        r.append(("ipc", "go", 400))
        self.assertEqual(r, [("ipc", "go", 400)])
        self.assertEqual(json.dumps(r), '[["ipc", "go", 400]]')
        self.assertEqual(r[0:], [("ipc", "go", 400)])


if __name__ == "__main__":
    unittest.main()
