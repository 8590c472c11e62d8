"""Discovery through etcd (discovery.py) with a real etcd server: Python
nodes register, find each other and talk; a node that stops or whose
lease expires is a NodeDown; hostile registrations and oversized answers
are skipped with an error; and the decoders of etcd's answers and of a
registration take hostile bytes."""

import base64
import json
import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

from tensorferry import discovery as disc, membership  # noqa: E402
from tensorferry.node import Message, Node  # noqa: E402
from tests.etcdserver import Server, free_address  # noqa: E402
from tests.test_mesh import Events  # noqa: E402

SECRET = b"0123456789abcdef0123"


class Recorder(list):
    """errors of a discovery, waited on."""

    def __init__(self):
        super().__init__()
        self.cv = threading.Condition()

    def append(self, x):
        with self.cv:
            super().append(x)
            self.cv.notify_all()

    def wait(self, pred, what, timeout=15.0):
        with self.cv:
            if not self.cv.wait_for(lambda: pred(self), timeout):
                raise AssertionError("not in %.0fs: %s: %r" % (timeout, what, list(self)))


def wait_error(n, text, timeout=15.0):
    """Wait until node n recorded an error holding text."""
    n.errors.wait(lambda errs: any(text in e for e in errs), "an error with %r" % text, timeout)


class EtcdTest(unittest.TestCase):
    def setUp(self):
        self.etcd = Server()
        self.addCleanup(self.etcd.close)
        self.section = {"etcd": {"endpoints": [self.etcd.url], "lease_ttl": 2, "dial_timeout": 1}}

    def node(self, name, start=True, section=None, **kw):
        ev = Events()
        n = Node("c", SECRET, name, free_address(), {}, ipc=False, reconnect_min=0.01, reconnect_max=0.2,
                 dial_timeout=1.0, heartbeat_interval=0.1, failure_timeout=2.0, data_address=free_address(),
                 inline_threshold=1024, on_up=ev.up, on_down=ev.down, membership="mesh",
                 discovery=section or self.section, **kw)
        n.events = ev
        n.errors = n.discovery.errors = Recorder()  # waited on

        def double(m):
            return Message("py.Vec", {"Scale": m["Scale"], "X": m["X"] * 2, "Note": "from " + name})

        n.handle("double", double)
        if start:
            n.start()
            self.addCleanup(n.stop)
        return n

    def exchange(self, a, b):
        for x, y in ((a, b), (b, a)):
            for size in (5, 10000):  # inline, then staging (above inline_threshold)
                t = torch.arange(size, dtype=torch.float32)
                r = x.request((y.name, "double"), Message("py.Vec", {"Scale": 1.0, "X": t, "Note": ""}), timeout=10)
                self.assertTrue(torch.equal(r["X"], t * 2))
                self.assertEqual(r["Note"], "from " + y.name)
            self.assertEqual([v for v in x.transfers if v[0] == "staging"][-1], ("staging", y.name, 40000))

    def observer(self):
        """A bare discovery (no node) registered as "obs": its events, waited on."""
        seen = Recorder()
        d = disc.Etcd(self.section, "c", Recorder())
        d.start({"name": "obs", "address": free_address()}, lambda kind, n, why: seen.append((kind, n["name"], why)))
        self.addCleanup(d.stop)
        return seen

    def key(self, name):
        return "/tensorferry/c/nodes/" + name

    def test_find_and_exchange(self):
        # b's first endpoint does not answer: it goes on to the next.
        dead = {"etcd": dict(self.section["etcd"], endpoints=["http://" + free_address(), self.etcd.url])}
        a, b = self.node("a"), self.node("b", section=dead)
        a.wait_peer("b")
        b.wait_peer("a")
        self.exchange(a, b)
        reg = json.loads(self.etcd.get(self.key("a")))
        # Registered mesh_only (a Python node never gossips): no gossip address.
        self.assertEqual(reg, {"name": "a", "address": a.address, "data_address": a.data_address,
                               "devices": ["cpu"], "mesh_only": True})
        self.assertEqual(a.errors + b.errors, [])
        self.assertEqual(b.discovery.c.endpoint()[2], int(self.etcd.url.rsplit(":", 1)[1]))

    def test_stop_is_nodedown(self):
        a, b = self.node("a"), self.node("b")
        a.wait_peer("b")
        obs = self.observer()
        obs.wait(lambda e: ("joined", "b", "") in e, "b joined")
        b.stop()
        obs.wait(lambda e: ("left", "b", "left") in e, "b left")
        a.events.wait("down", "b")
        # The registration went, marked leaving: b is no longer a peer.
        with a.mu:
            self.assertTrue(a.up_cv.wait_for(lambda: "b" not in a.peers, 10))
        self.assertIsNone(self.etcd.get(self.key("b")))
        # b's discovery threads ended with it; a's dialer of b ends.
        self.assertEqual([t.name for t in b.discovery.threads if t.is_alive()], [])
        for t in [t for t in a.threads if t.name == "tensorferry-dial-b"]:
            t.join(10)
            self.assertFalse(t.is_alive())
        # A b that comes back is found again.
        b2 = self.node("b")
        a.events.wait("up", "b", n=2)
        b2.wait_peer("a")
        self.exchange(a, b2)

    def test_lease_expires(self):
        a, b = self.node("a"), self.node("b")
        a.wait_peer("b")
        obs = self.observer()
        b.discovery.keepalive_paused = True  # b looks dead to etcd
        obs.wait(lambda e: ("left", "b", "lease expired") in e, "b's lease expired")
        a.events.wait("down", "b")
        self.assertTrue(any(e[:2] == ("down", "b") and "lease expired" in e[2] for e in a.events.seen),
                        a.events.seen)
        with a.mu:
            self.assertTrue(a.up_cv.wait_for(lambda: "b" not in a.peers, 10))
        # b renews again: etcd says its lease is gone, b registers under a
        # new one, and a finds it again.
        b.discovery.keepalive_paused = False
        b.discovery.keepalive_now()
        a.events.wait("up", "b", n=2)
        self.assertGreaterEqual(b.discovery.registrations, 2)
        b.wait_peer("a")
        self.exchange(a, b)

    def test_hostile_values(self):
        big = json.dumps({"name": "big", "address": "127.0.0.1:1", "pad": "x" * (20 << 10)}).encode()
        hostile = {
            "big": big,  # beyond MAX_VALUE
            "badjson": b'{"name": "badjson", "address": ',
            "notobj": b'["badjson"]',
            "badname": json.dumps({"name": "bad name", "address": "127.0.0.1:1"}).encode(),
            "other": json.dumps({"name": "a", "address": "127.0.0.1:1"}).encode(),  # names another node
            "badaddr": json.dumps({"name": "badaddr", "address": "127.0.0.1"}).encode(),
            "baddev": json.dumps({"name": "baddev", "address": "127.0.0.1:1", "devices": ["tpu"]}).encode(),
            "x y": json.dumps({"name": "x y", "address": "127.0.0.1:1"}).encode(),  # a key no node may have
        }
        for k, v in hostile.items():
            self.etcd.put(self.key(k), v)  # read by the range
        a = self.node("a")
        for k, v in hostile.items():
            self.etcd.put(self.key(k + "2"), v)  # read by the watch
        b = self.node("b")
        a.wait_peer("b")
        self.exchange(a, b)
        for k in hostile:
            for n in (a, b):
                wait_error(n, "skipping an invalid registration %r" % self.key(k).encode())
        wait_error(a, "skipping an invalid registration %r" % self.key("big2").encode())
        self.assertTrue(any("value of %d bytes, at most 16384" % len(big) in e for e in a.errors), a.errors)
        self.assertTrue(any("value names node 'a'" in e for e in b.errors), b.errors)
        with a.mu:
            self.assertEqual(set(a.peers), {"b"})
        # A hostile value over a known node's registration is skipped, not
        # taken for a departure; the node puts its own back.
        self.etcd.put(self.key("b"), b"{")
        wait_error(b, "own registration was overwritten: put back")
        self.assertEqual(json.loads(self.etcd.get(self.key("b")))["name"], "b")
        self.assertEqual([e for e in a.events.seen if e[0] == "down"], [])

    def test_own_key_deleted(self):
        # An operator deletes b's key: a takes b for gone, b puts its
        # registration back under its lease, and a finds it again.
        a, b = self.node("a"), self.node("b")
        a.wait_peer("b")
        self.etcd.delete(self.key("b"))
        wait_error(b, "own registration was deleted: put back")
        a.events.wait("down", "b")
        a.events.wait("up", "b", n=2)
        self.assertEqual(json.loads(self.etcd.get(self.key("b")))["name"], "b")
        self.assertEqual(b.discovery.registrations, 1)  # the same lease
        b.wait_peer("a")
        self.exchange(a, b)

    def test_answer_too_large(self):
        # A value within MAX_VALUE but beyond what an answer may hold here.
        c = disc.Client([self.etcd.url], 1.0)
        c.max = c.max_line = 4096
        big = json.dumps({"name": "big", "address": "127.0.0.1:1", "pad": "x" * 8000}).encode()
        self.etcd.put(self.key("big"), big)
        with self.assertRaisesRegex(disc.TooLarge, "more than 4096 bytes"):
            c.unary("/v3/kv/range", {"key": base64.b64encode(self.key("big").encode()).decode()})
        seen = []
        c.range_prefix(b"/tensorferry/c/nodes/", seen.append)
        self.assertEqual([(kv["key"], kv["oversized"], kv["value"]) for kv in seen],
                         [(self.key("big").encode(), True, b"")])
        # A node with those bounds skips it, in the range and the watch,
        # and works on.
        a = self.node("a", start=False)
        a.discovery.c.max = a.discovery.c.max_line = 4096
        a.start()
        self.addCleanup(a.stop)
        wait_error(a, "value beyond the 4096 bytes an answer may hold")
        self.etcd.put(self.key("big2"), big)
        wait_error(a, "a line longer than 4096 bytes")  # the watch's batch: ranged again
        wait_error(a, "skipping an invalid registration %r" % self.key("big2").encode())
        b = self.node("b")
        a.wait_peer("b")
        self.exchange(a, b)

    def test_compacted(self):
        # Changes missed while the watch was down, whose history etcd
        # compacted: the watch reads the registrations again and reports
        # the difference.
        z = json.dumps({"name": "z", "address": free_address()}).encode()
        self.etcd.put(self.key("z"), z)
        a = self.node("a")
        with a.mu:
            self.assertIn("z", a.peers)
        self.assertTrue(a.discovery.watching.wait(10))
        gate = a.discovery.resync_gate = threading.Event()
        a.discovery._restart_watch()
        wait_error(a, "watch broken")
        self.etcd.delete(self.key("z"))
        r = self.etcd.put(self.key("y"), json.dumps({"name": "y", "address": free_address()}).encode())
        self.etcd.do("/v3/kv/compaction", {"revision": r["header"]["revision"], "physical": True})
        gate.set()
        wait_error(a, "reading the registrations again")
        with a.mu:
            self.assertTrue(a.up_cv.wait_for(lambda: set(a.peers) == {"y"}, 10), a.peers)

    def test_max_peers(self):
        # Registrations beyond max_peers are skipped with an error, in the
        # range and the watch.
        for k in ("p1", "p2"):
            self.etcd.put(self.key(k), json.dumps({"name": k, "address": free_address()}).encode())
        a = self.node("a", start=False)
        a.discovery.max_peers = 1
        a.start()
        self.addCleanup(a.stop)
        wait_error(a, "skipping the registration of p2: 1 nodes known, at most 1")
        self.etcd.put(self.key("p3"), json.dumps({"name": "p3", "address": free_address()}).encode())
        wait_error(a, "skipping the registration of p3")
        with a.mu:
            self.assertEqual(set(a.peers), {"p1"})

    def test_etcd_restarts(self):
        a, b = self.node("a"), self.node("b")
        a.wait_peer("b")
        self.etcd.kill()
        wait_error(a, "lease keepalive")
        self.etcd.restart()
        # The watch is back: a node that registers now is found.
        c = self.node("c")
        a.events.wait("up", "c")
        b.events.wait("up", "c")
        self.exchange(a, c)
        self.assertEqual([e for e in a.events.seen if e[0] == "down"], [])

    def test_etcd_unreachable(self):
        # No etcd answers: start fails with an EtcdError saying so, and the
        # node's listener is closed again.
        n = self.node("a", start=False, section={"etcd": {"endpoints": ["http://" + free_address()],
                                                          "dial_timeout": 0.5}})
        with self.assertRaisesRegex(disc.EtcdError, "lease/grant"):
            n.start()
        self.assertTrue(n.stopped.is_set())

    def test_name_taken(self):
        # A live node holds its key: another process of the same name is
        # refused once the previous registration does not expire.
        self.node("a")
        n = self.node("a", start=False)
        n.discovery.ttl = 2
        with self.assertRaisesRegex(disc.EtcdError, "registered by another process"):
            n.start()


class SettingsTest(unittest.TestCase):
    def test_settings(self):
        self.assertEqual(disc.etcd_settings({"etcd": {"endpoints": ["http://h:2379"]}}),
                         (["http://h:2379"], "/tensorferry/", 10, 2.0))
        self.assertEqual(disc.etcd_settings({"etcd": {"endpoints": ["http://h:2379"], "prefix": "/x/",
                                                      "lease_ttl": "3s", "dial_timeout": "500ms"}}),
                         (["http://h:2379"], "/x/", 3, 0.5))
        for e, want in (({"endpoints": []}, "at least one endpoint"),
                        ({"endpoints": ["h:1"], "lease_ttl": 1}, "lease_ttl"),
                        ({"endpoints": ["h:1"], "lease_ttl": 2.5}, "whole seconds"),
                        ({"endpoints": ["h:1"], "prefix": "a b"}, "prefix"),
                        ({"endpoints": ["h:1"], "ttl": 3}, "unknown keys")):
            with self.subTest(e=e), self.assertRaisesRegex(ValueError, want):
                disc.etcd_settings({"etcd": e})
        with self.assertRaisesRegex(ValueError, "endpoint 'h:1'"):
            disc.Client(["h:1"], 1.0)

    def test_membership(self):
        sec = {"etcd": {"endpoints": ["http://127.0.0.1:2379"]}}
        membership.check_membership("mesh", sec, 2)
        with self.assertRaisesRegex(ValueError, "means gossip.*mesh_only: true"):
            membership.check_membership(None, sec, 2)
        with self.assertRaisesRegex(ValueError, "membership 'gossip'.*mesh_only: true"):
            membership.check_membership("gossip", sec, 2)
        # A mesh_only node joins gossip with discovery (it registers the mark).
        membership.check_membership("gossip", sec, 2, mesh_only=True)
        membership.check_membership(None, sec, 2, mesh_only=True)


class SelfNodeTest(unittest.TestCase):
    def test_no_gossip_port_for_a_python_node(self):
        # A data port that happens to be the address's port + 200 (the
        # default gossip port) is fine for a node that does not gossip;
        # TestPythonEtcd failed so once with random ports.
        n = {"name": "py", "address": "127.0.0.1:34131", "data_address": "127.0.0.1:34331"}
        with self.assertRaises(disc.BadValue):
            disc.check_node(dict(n))
        got = disc.check_node(dict(n), gossips=False)
        self.assertNotIn("gossip_address", got)
        self.assertEqual(got["data_address"], "127.0.0.1:34331")
        self.assertNotIn(b"gossip", disc.encode_node(got))

    def test_mesh_only_mark(self):
        # The mark as discovery/value.go writes and reads it (the Go side's
        # golden value is the same string: discovery's TestDecodeNode).
        n = {"name": "py", "address": "127.0.0.1:7001", "data_address": "127.0.0.1:7201",
             "devices": ["cuda:1"], "mesh_only": True}
        b = disc.encode_node(n, leaving=True)
        self.assertEqual(b, b'{"name":"py","address":"127.0.0.1:7001","data_address":"127.0.0.1:7201",'
                            b'"devices":["cuda:1"],"mesh_only":true,"leaving":true}')
        got, leaving = disc.decode_node(b)
        self.assertEqual((got, leaving), (n, True))
        self.assertFalse(disc.same_node(got, dict(got, mesh_only=False)))
        for b, want in ((b'{"name":"a","address":"h:1","mesh_only":1}', "mesh_only: not a boolean"),
                        (b'{"name":"a","address":"h:1","gossip_address":"h:7","mesh_only":true}',
                         "gossip_address: set on a mesh_only node")):
            with self.subTest(b=b), self.assertRaisesRegex(disc.BadValue, want):
                disc.decode_node(b)
        # Absent or false: a gossiping node, with the default gossip port.
        got, _ = disc.decode_node(b'{"name":"a","address":"h:1","mesh_only":false}')
        self.assertEqual((got["gossip_address"], "mesh_only" in got), ("h:201", False))


class DecodeTest(unittest.TestCase):
    def test_node(self):
        n, leaving = disc.decode_node(b'{"NAME":"a","name":"b","address":"[::1]:80","devices":["cuda","host"],'
                                      b'"later":{"x":1},"leaving":true}')
        self.assertEqual(n, {"name": "b", "address": "[::1]:80", "data_address": "[::1]:180",
                             "gossip_address": "[::1]:280", "devices": ["cuda:0", "cpu"]})
        self.assertTrue(leaving)
        n, leaving = disc.decode_node(b'{"name":"a","addre\xc5\xbfs":"h:1","devices":["cuda:1"],"devices":null,'
                                      b'"name":null,"leaving":null}')
        self.assertEqual((n["name"], n["address"], n["devices"], leaving), ("a", "h:1", ["cpu"], False))
        for b, want in ((b"", "value"), (b"null", "name: required"), (b"{} {}", "value"),
                        (b'{"name":"a","address":"h:1","leaving":1}', "leaving"),
                        (b'{"name":"a","address":"h:1","devices":["cpu","host"]}', "duplicate"),
                        (b'{"name":"a","address":"h:65500"}', "default data port"),
                        (b'{"name":"a","address":"h:1","data_address":"h:1"}', "same as address"),
                        (b'{"name":"a","address":"h:1","x":NaN}', "not JSON"),
                        (b'{"name":"a","address":"h:1","devices":["cuda:1024"]}', "GPU ordinal"),
                        (b'{"name":"a","address":"h:0"}', "port must be"),
                        (b'{"name":"a","address":"h:1:2"}', "too many colons"),
                        (b'{"name":"\xff","address":"h:1"}', "value"),
                        (b"[" * 100000, "value"),
                        (b" " * (disc.MAX_VALUE + 1), "at most 16384")):
            with self.subTest(b=b[:40]), self.assertRaisesRegex(disc.BadValue, want):
                disc.decode_node(b)

    def test_answers(self):
        with self.assertRaises(disc.Compacted):
            disc.decode_watch(b'{"result":{"canceled":true,"compact_revision":"7"}}')
        with self.assertRaisesRegex(disc.EtcdError, "canceled: why"):
            disc.decode_watch(b'{"result":{"canceled":true,"cancel_reason":"why"}}')
        with self.assertRaisesRegex(disc.EtcdError, r"no leader \(code 14\)"):
            disc.decode_watch(b'{"error":{"grpc_code":14,"message":"no leader"}}')
        created, evs = disc.decode_watch(
            b'{"result":{"header":{"revision":"9"},"events":[{"type":"DELETE","kv":{"key":"YQ==",'
            b'"mod_revision":"9"}},{"kv":{"key":"Yg==","value":"e30=","mod_revision":"9","lease":"5"}}]}}')
        self.assertFalse(created)
        self.assertEqual([(t, kv["key"], kv["value"], kv["lease"]) for t, kv in evs],
                         [("DELETE", b"a", b"", 0), ("PUT", b"b", b"{}", 5)])
        for b in (b'{"result":{"events":[{"type":"EVIL","kv":{"mod_revision":"1"}}]}}',
                  b'{"result":{"events":[{"kv":{"mod_revision":"0"}}]}}',
                  b'{"result":{"events":[{"kv":{"key":"!!","mod_revision":"1"}}]}}',
                  b'{"result":{"events":[{"kv":{"mod_revision":"99999999999999999999999"}}]}}',
                  b'{"result":{"events":{}}}', b'{}', b'[]', b'{"result":', b"\xff"):
            with self.subTest(b=b), self.assertRaises(disc.EtcdError):
                disc.decode_watch(b)
        self.assertEqual(disc.decode_range(b'{"header":{"revision":"3"},"more":true}'), (3, [], True))
        for b in (b'{"header":{"revision":"0"}}', b'{"header":{"revision":"x"}}', b'{"header":{},"kvs":{}}'):
            with self.subTest(b=b), self.assertRaises(disc.EtcdError):
                disc.decode_range(b)
        self.assertEqual(disc.prefix_end(b"a/"), b"a0")
        self.assertEqual(disc.prefix_end(b"a\xff"), b"b")
        self.assertEqual(disc.prefix_end(b"\xff"), b"\x00")


_names = st.from_regex(r"[a-zA-Z0-9._-]{1,64}", fullmatch=True)
_hosts = st.sampled_from(["127.0.0.1", "10.0.0.9", "::1", "host.example", "h"])
_ports = st.integers(1, 65335)
_devices = st.lists(st.sampled_from(["cpu", "pinned"] + ["cuda:%d" % i for i in range(8)]), max_size=6, unique=True)


class PropertyTest(unittest.TestCase):
    @settings(max_examples=300, deadline=None)
    @given(_names, _hosts, _ports, _devices, st.booleans(), st.booleans())
    def test_round_trip(self, name, host, port, devices, leaving, mesh_only):
        n = {"name": name, "address": disc.join_host_port(host, port),
             "data_address": disc.join_host_port(host, port + 1 if port < 65335 else 1), "devices": devices}
        if mesh_only:
            n["mesh_only"] = True
        want = disc.check_node(dict(n), gossips=not mesh_only)
        got, lv = disc.decode_node(disc.encode_node(n, leaving))
        self.assertEqual(got, want)
        self.assertEqual(lv, leaving)

    @settings(max_examples=500, deadline=None)
    @given(st.one_of(st.binary(max_size=200),
                     st.dictionaries(st.sampled_from(list(disc._FIELDS) + ["Name", "ADDRESS", "x"]),
                                     st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                                                  lambda c: st.lists(c, max_size=3), max_leaves=8))
                     .map(lambda d: json.dumps(d).encode())))
    def test_hostile(self, b):
        # Any bytes: a checked node, or BadValue; nothing else.
        try:
            n, leaving = disc.decode_node(b)
        except disc.BadValue:
            return
        self.assertIsInstance(leaving, bool)
        self.assertEqual(disc.check_node(dict(n), gossips=not n.get("mesh_only")), n)
        disc.check_name(n["name"])

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=300))
    def test_answers_hostile(self, b):
        for f in (disc.decode_watch, disc.decode_range):
            try:
                f(b)
            except disc.EtcdError:
                pass
        self.assertTrue(disc.decode_error(b) is None or isinstance(disc.decode_error(b), disc.EtcdError))


if __name__ == "__main__":
    unittest.main()
