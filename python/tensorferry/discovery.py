"""Discovery through etcd for a Python node, as the Go nodes run it
(package discovery): the node registers its name, addresses and devices
under {prefix}{cluster}/nodes/{name} with a lease of lease_ttl, kept
alive every third of it, and learns the others with a range over the
prefix and then a watch from the range's revision + 1.

etcd is spoken through the HTTP/JSON gateway every etcd server runs on
its client port (/v3/lease/grant, /v3/kv/txn, /v3/kv/range, /v3/watch,
...), with the standard library only (http.client, json, base64,
threading), as the Go side does with net/http.

Every answer of etcd is bounded before it is parsed (MAX_RESPONSE a
unary answer, MAX_WATCH_LINE one object of the watch stream,
MAX_KEEPALIVE_LINE a keepalive's), and the values under the prefix are
hostile input: at most MAX_VALUE bytes, checked as Go's config.CheckNode
checks them; an invalid one is recorded in errors and skipped, never
taken for a departure.

A registration deleted after its node marked it leaving is a Left
"left"; one deleted otherwise is a Left "lease expired". A broken watch
reconnects with backoff from the last revision applied; when etcd has
compacted that history it ranges again and reports the difference. A
node whose own lease expired (cut off from etcd for a TTL, or etcd
restarted without its data) registers again under a new lease; its own
key deleted or overwritten is put back.
"""

import base64
import http.client
import json
import random
import re
import threading
import time
import urllib.parse

# Bounds on what etcd's answers may make this module hold
# (discovery/etcdclient.go).
MAX_RESPONSE = 16 << 20  # a unary answer (a page of a range included)
MAX_WATCH_LINE = 16 << 20  # one object of the watch stream: one batch of events
MAX_KEEPALIVE_LINE = 64 << 10  # the answer to a keepalive, or an error's body
MAX_VALUE = 16 << 10  # the value of one registration
RANGE_PAGE = 512  # keys one range request asks for
MAX_NODES = 1 << 16  # registrations read under the prefix
MAX_NODE_DEVICES = 256  # config.MaxNodeDevices
# Nodes a Python node takes from etcd, at most (the watch included): each
# is a mesh peer with a dialing thread. The mesh suits a few nodes.
MAX_PEERS = 1024

RETRY_MIN, RETRY_MAX = 0.1, 5.0  # backoff of reconnections to etcd

CODE_UNAVAILABLE = 14  # gRPC's Unavailable
LEASE_NOT_FOUND = "etcdserver: requested lease not found"

REASON_LEFT = "left"
REASON_LEASE_EXPIRED = "lease expired"
REASON_MISSED = "deregistered while the watch was down"
REASON_CHANGED = "registered again with other addresses"

DATA_PORT_OFFSET, GOSSIP_PORT_OFFSET = 100, 200  # config's defaults


class EtcdError(Exception):
    """An error answered by etcd (a gRPC status carried by the gateway), or
    an answer this module refuses."""

    def __init__(self, message, code=0):
        super().__init__("tensorferry: discovery: etcd: %s (code %d)" % (message, code) if code
                         else "tensorferry: discovery: etcd: %s" % message)
        self.code, self.message = code, message


class TooLarge(EtcdError):
    """An answer beyond the bound of its kind."""


class Compacted(EtcdError):
    """A watch asked for revisions etcd no longer keeps."""


class BadValue(ValueError):
    """A registration that is not valid."""


# -- the registration --------------------------------------------------------

_NAME = re.compile(r"[a-zA-Z0-9._-]{1,64}\Z")
_PORT = re.compile(r"[+-]?[0-9]+\Z")


def check_name(s):
    """config.CheckName: 1 to 64 characters from [a-zA-Z0-9._-]."""
    if not isinstance(s, str) or not s:
        raise BadValue("required")
    if not _NAME.match(s):
        raise BadValue("%.80r: want 1 to 64 characters from [a-zA-Z0-9._-]" % (s,))
    return s


def split_addr(s):
    """config's splitAddr (net.SplitHostPort, a port in 1..65535): (host, port)."""
    if not isinstance(s, str):
        raise BadValue("want host:port")
    if s.startswith("["):
        end = s.find("]")
        if end < 0 or s[end + 1:end + 2] != ":" or "[" in s[1:end] or "]" in s[end + 1:]:
            raise BadValue("%.80r: want host:port" % s)
        host, ps = s[1:end], s[end + 2:]
    else:
        i = s.rfind(":")
        if i < 0:
            raise BadValue("%.80r: want host:port: missing port" % s)
        host, ps = s[:i], s[i + 1:]
        if ":" in host:
            raise BadValue("%.80r: want host:port: too many colons" % s)
        if "[" in s or "]" in s:
            raise BadValue("%.80r: want host:port" % s)
    if host == "":
        raise BadValue("%.80r: host is empty" % s)
    if not _PORT.match(ps) or len(ps) > 16 or not 1 <= int(ps) <= 65535:
        raise BadValue("%.80r: port must be a number in 1..65535" % s)
    return host, int(ps)


def join_host_port(host, port):
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


def parse_device(s):
    """memory.ParseDevice, written back as Go's Device.String does."""
    if s in ("cpu", "host"):
        return "cpu"
    if s == "pinned":
        return "pinned"
    if s == "cuda":
        return "cuda:0"
    if isinstance(s, str) and s.startswith("cuda:"):
        rest = s[5:]
        if _PORT.match(rest) and len(rest) <= 8 and 0 <= int(rest) <= 1023:
            return "cuda:%d" % int(rest)
        raise BadValue("bad device %.40r: want cuda:N with N a GPU ordinal" % (s,))
    raise BadValue("unknown device %.40r: want cpu, pinned or cuda:N" % (s,))


def _side_address(n, key, host, port, offset, what, hint):
    """n[key] checked and written as host:port, or by default the control
    address's host with its port + offset (BadValue when that passes
    65535)."""
    if not n.get(key):
        if port + offset > 65535:
            raise BadValue("address: port %d leaves no room for the default %s (+%d)%s" % (port, what, offset, hint))
        return join_host_port(host, port + offset)
    try:
        return join_host_port(*split_addr(n[key]))
    except BadValue as e:
        raise BadValue("%s: %s" % (key, e)) from None


def check_node(n, gossips=True):
    """config.CheckNode on n, a dict of name, address, data_address,
    gossip_address and devices: checks and completes it (default data port
    +100, gossip port +200, devices [cpu]; addresses written host:port).
    Raises BadValue naming the field. gossips False: the node does not
    gossip (this Python node): no gossip address is defaulted or checked,
    so none can collide with its other ports."""
    try:
        check_name(n["name"])
    except BadValue as e:
        raise BadValue("name: %s" % e) from None
    try:
        host, port = split_addr(n["address"])
    except BadValue as e:
        raise BadValue("address: %s" % e) from None
    n["address"] = join_host_port(host, port)
    n["data_address"] = _side_address(n, "data_address", host, port, DATA_PORT_OFFSET, "data port", "")
    if n["data_address"] == n["address"]:
        raise BadValue("data_address: same as address (%.80r)" % n["address"])
    if not gossips:
        n.pop("gossip_address", None)
    else:
        n["gossip_address"] = _side_address(n, "gossip_address", host, port, GOSSIP_PORT_OFFSET, "gossip port",
                                            ": set gossip_address")
        if n["gossip_address"] in (n["address"], n["data_address"]):
            raise BadValue("gossip_address: same as address or data_address (%.80r)" % n["gossip_address"])
    devs = n.get("devices") or ["cpu"]
    if len(devs) > MAX_NODE_DEVICES:
        raise BadValue("devices: %d devices, at most %d" % (len(devs), MAX_NODE_DEVICES))
    out = []
    for k, d in enumerate(devs):
        try:
            d = parse_device(d)
        except BadValue as e:
            raise BadValue("devices[%d]: %s" % (k, e)) from None
        if d in out:
            raise BadValue("devices[%d]: duplicate of devices[%d] (%s)" % (k, out.index(d), d))
        out.append(d)
    n["devices"] = out
    return n


def encode_node(n, leaving=False):
    """The registration of n (name, address, data_address, devices and the
    mesh_only mark; as discovery/value.go's encodeNode writes it): JSON
    bytes."""
    r = {"name": n["name"], "address": n["address"], "data_address": n.get("data_address") or ""}
    if n.get("gossip_address"):
        r["gossip_address"] = n["gossip_address"]
    r["devices"] = list(n.get("devices") or []) or None
    if n.get("mesh_only"):
        r["mesh_only"] = True
    if leaving:
        r["leaving"] = True
    b = json.dumps(r, separators=(",", ":")).encode()
    if len(b) > MAX_VALUE:
        raise ValueError("tensorferry: discovery: the registration of %r is %d bytes, at most %d"
                         % (n["name"], len(b), MAX_VALUE))
    return b


_FIELDS = ("name", "address", "data_address", "gossip_address", "devices", "mesh_only", "leaving")


def _bad_constant(s):
    raise BadValue("value: %s is not JSON" % s)


def decode_node(b):
    """Read a registration, as hostile input (discovery/value.go's
    decodeNode): at most MAX_VALUE bytes, one JSON object whose known keys
    (matched case-insensitively, the last of duplicates winning, null
    emptying devices and leaving the others, as Go's encoding/json does;
    one difference: invalid UTF-8, which Go replaces, is refused) have the right types, checked with check_node.
    Returns (node dict, leaving); raises BadValue."""
    if not isinstance(b, (bytes, bytearray)):
        raise BadValue("value: not bytes")
    if len(b) > MAX_VALUE:
        raise BadValue("value of %d bytes, at most %d" % (len(b), MAX_VALUE))
    try:
        v = json.loads(bytes(b).decode("utf-8"), object_pairs_hook=list, parse_constant=_bad_constant)
    except BadValue:
        raise
    except (ValueError, RecursionError) as e:
        raise BadValue("value: %s" % str(e)[:200]) from None
    if v is None:
        v = []
    if not isinstance(v, list) or any(not isinstance(p, tuple) for p in v):
        raise BadValue("value: not a JSON object")
    r = {}
    for k, x in v:
        f = k if k in _FIELDS else next((f for f in _FIELDS if f == k.casefold()), None)
        if f is None:
            continue  # a field of a later version
        if x is None:
            if f == "devices":
                r.pop(f, None)  # null empties a list, as in Go
            continue  # and leaves the other fields as they are
        if f in ("leaving", "mesh_only"):
            if not isinstance(x, bool):
                raise BadValue("value: %s: not a boolean" % f)
        elif f == "devices":
            if not isinstance(x, list) or not all(isinstance(d, str) for d in x):
                raise BadValue("value: devices: not a list of strings")
            if len(x) > MAX_NODE_DEVICES:
                raise BadValue("devices: %d devices, at most %d" % (len(x), MAX_NODE_DEVICES))
        elif not isinstance(x, str):
            raise BadValue("value: %s: not a string" % f)
        r[f] = x
    leaving = r.pop("leaving", False)
    n = {f: r.get(f, "") for f in ("name", "address", "data_address", "gossip_address")}
    n["devices"] = r.get("devices") or []
    for i, d in enumerate(n["devices"]):
        try:
            parse_device(d)
        except BadValue as e:
            raise BadValue("devices[%d]: %s" % (i, e)) from None
    if r.get("mesh_only"):
        # A node that does not gossip (config's mesh_only) has no gossip address.
        if n["gossip_address"]:
            raise BadValue("gossip_address: set on a mesh_only node, which does not gossip")
        n["mesh_only"] = True
        return check_node(n, gossips=False), leaving
    return check_node(n), leaving


def same_node(a, b):
    return all(a.get(f) == b.get(f) for f in ("name", "address", "data_address", "gossip_address", "devices",
                                              "mesh_only"))


# -- etcd's JSON gateway -----------------------------------------------------

def _i64(v, what):
    """An int64 as the gateway writes it (a string "42"), or a number."""
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise EtcdError("%s: bad integer" % what)
    if isinstance(v, str):
        if not _PORT.match(v) or len(v) > 20:
            raise EtcdError("%s: bad integer %.32r" % (what, v))
        v = int(v)
    if not -(1 << 63) <= v < 1 << 63:
        raise EtcdError("%s: integer out of range" % what)
    return v


def _b64(v, what):
    if v is None:
        return b""
    if not isinstance(v, str):
        raise EtcdError("%s: not base64" % what)
    try:
        return base64.b64decode(v, validate=True)
    except ValueError:
        raise EtcdError("%s: not base64" % what) from None


def _enc(b):
    return base64.b64encode(b).decode()


def _loads(b, what):
    try:
        v = json.loads(b.decode("utf-8"), parse_constant=lambda s: None)
    except (ValueError, RecursionError) as e:
        raise EtcdError("%s: %s" % (what, str(e)[:200])) from None
    if not isinstance(v, dict):
        raise EtcdError("%s: not a JSON object" % what)
    return v


def _kv(d, what):
    """A mvccpb.KeyValue: dict key, value (bytes), mod_revision, lease."""
    if not isinstance(d, dict):
        raise EtcdError("%s: key-value is not an object" % what)
    return {"key": _b64(d.get("key"), what + ": key"), "value": _b64(d.get("value"), what + ": value"),
            "mod_revision": _i64(d.get("mod_revision"), what + ": mod_revision"),
            "lease": _i64(d.get("lease"), what + ": lease"), "oversized": False}


def _stream_error(e):
    if not isinstance(e, dict):
        return EtcdError("stream error")
    msg = e.get("message")
    msg = msg[:512] if isinstance(msg, str) else ""
    code = e.get("grpc_code")
    return EtcdError(msg, code if type(code) is int else 0)


def decode_error(b):
    """The body of a failed request: an EtcdError, or None."""
    try:
        v = json.loads(b.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(v, dict):
        return None
    msg = v.get("message") or v.get("error")
    if not isinstance(msg, str) or not msg:
        return None
    code = v.get("code")
    return EtcdError(msg[:512], code if type(code) is int else 0)


def decode_range(b):
    """The answer to kv/range: (revision, [kv], more)."""
    v = _loads(b, "range")
    rev = _i64((v.get("header") or {}).get("revision") if isinstance(v.get("header"), dict) else None,
               "range: revision")
    if rev <= 0:
        raise EtcdError("range: bad revision %d" % rev)
    kvs = v.get("kvs")
    kvs = [] if kvs is None else kvs
    if not isinstance(kvs, list):
        raise EtcdError("range: kvs is not a list")
    return rev, [_kv(x, "range") for x in kvs], v.get("more") is True


def decode_watch(b):
    """One object of the watch stream: (created, [(type, kv)]). Raises
    Compacted, or EtcdError for a cancelled watch or an error."""
    v = _loads(b, "watch")
    if v.get("error") is not None:
        raise _stream_error(v["error"])
    r = v.get("result")
    if not isinstance(r, dict):
        raise EtcdError("watch: no result")
    if r.get("canceled") is True:
        compact = _i64(r.get("compact_revision"), "watch: compact_revision")
        if compact > 0:
            raise Compacted("watch: revisions up to %d were compacted" % compact)
        why = r.get("cancel_reason")
        raise EtcdError("watch canceled: %s" % (why[:512] if isinstance(why, str) else ""))
    evs = r.get("events")
    evs = [] if evs is None else evs
    if not isinstance(evs, list):
        raise EtcdError("watch: events is not a list")
    out = []
    for ev in evs:
        if not isinstance(ev, dict):
            raise EtcdError("watch: event is not an object")
        t = ev.get("type") or "PUT"
        if t not in ("PUT", "DELETE"):
            raise EtcdError("watch: unknown event type %.32r" % (t,))
        kv = _kv(ev.get("kv"), "watch")
        if kv["mod_revision"] <= 0:
            raise EtcdError("watch: event with bad revision %d" % kv["mod_revision"])
        out.append((t, kv))
    return r.get("created") is True, out


def prefix_end(p):
    """The range_end that selects every key starting with p."""
    end = bytearray(p)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xff:
            end[i] += 1
            return bytes(end[:i + 1])
    return b"\x00"


def read_line(resp, limit):
    """The next non-empty line of resp (a streaming answer), at most limit
    bytes; raise TooLarge past it, EOFError at the stream's end."""
    while True:
        line = resp.readline(limit + 1)
        if len(line) > limit:
            raise TooLarge("a line longer than %d bytes" % limit)
        if not line:
            raise EOFError("stream ended")
        if line.strip():
            return line


class Client:
    """etcd's v3 API through its JSON gateway. Endpoints are tried in
    turn: one that cannot be reached, or answers Unavailable, makes the
    next one current."""

    def __init__(self, endpoints, timeout):
        self.endpoints = []
        for ep in endpoints:
            u = urllib.parse.urlsplit(ep)
            if u.scheme not in ("http", "https") or not u.hostname or u.path not in ("", "/") or \
                    u.query or u.fragment or u.username:
                raise ValueError("tensorferry: discovery: endpoint %r: want http://host:port or https://host:port"
                                 % (ep,))
            self.endpoints.append((u.scheme, u.hostname, u.port or (443 if u.scheme == "https" else 80)))
        if not self.endpoints:
            raise ValueError("tensorferry: discovery: etcd.endpoints is empty")
        self.cur = 0
        self.timeout = timeout
        self.page = RANGE_PAGE
        self.max = MAX_RESPONSE  # tests lower these
        self.max_line = MAX_WATCH_LINE
        self.mu = threading.Lock()

    def endpoint(self):
        with self.mu:
            return self.endpoints[self.cur % len(self.endpoints)]

    def failed(self, ep):
        with self.mu:
            if self.endpoints[self.cur % len(self.endpoints)] == ep:
                self.cur += 1

    def _conn(self, ep, timeout):
        scheme, host, port = ep
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=timeout)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def post(self, path, req, timeout=None):
        """Send the JSON of req to path; return (connection, response) with
        status 200, or raise EtcdError (etcd's own for other statuses)."""
        ep = self.endpoint()
        body = json.dumps(req).encode()
        conn = self._conn(ep, self.timeout if timeout is None else timeout)
        try:
            # etcd's require-leader flag: a member cut off from its leader
            # refuses, or ends the watch, instead of serving what it has.
            conn.request("POST", path, body, {"Content-Type": "application/json",
                                              "Grpc-Metadata-hasleader": "true"})
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            self.failed(ep)
            raise EtcdError("%s://%s:%d%s: %s" % (ep + (path, e))) from None
        if resp.status != 200:
            try:
                b = resp.read(MAX_KEEPALIVE_LINE + 1)
            except (OSError, http.client.HTTPException):
                b = b""
            finally:
                conn.close()
            e = decode_error(b) if len(b) <= MAX_KEEPALIVE_LINE else None
            if e is None:
                raise EtcdError("%s://%s:%d%s: HTTP %d" % (ep + (path, resp.status)))
            if e.code == CODE_UNAVAILABLE:
                self.failed(ep)
            raise e
        return conn, resp

    def unary(self, path, req):
        """Post req and return the whole answer, at most self.max bytes,
        parsed as a JSON object. An endpoint that cannot be reached is
        followed by the next one, each tried once."""
        return _loads(self.unary_bytes(path, req), path)

    def unary_bytes(self, path, req):
        """unary's answer, unparsed."""
        err = None
        for _ in self.endpoints:
            try:
                conn, resp = self.post(path, req)
            except EtcdError as e:
                if e.code not in (0, CODE_UNAVAILABLE):
                    raise
                err = e
                continue
            try:
                b = resp.read(self.max + 1)
            except (OSError, http.client.HTTPException) as e:
                err = EtcdError("%s: %s" % (path, e))
                continue
            finally:
                conn.close()
            if len(b) > self.max:
                raise TooLarge("%s: answer of more than %d bytes" % (path, self.max))
            return b
        raise err

    def grant(self, ttl):
        v = self.unary("/v3/lease/grant", {"TTL": str(ttl)})
        if v.get("error"):
            raise EtcdError("lease grant: %.512s" % v["error"])
        lid, got = _i64(v.get("ID"), "lease grant: ID"), _i64(v.get("TTL"), "lease grant: TTL")
        if lid == 0 or got <= 0:
            raise EtcdError("lease grant: no lease in the answer (ID %d, TTL %d)" % (lid, got))
        return lid, got

    def keepalive(self, lease):
        """Renew lease once; its TTL in seconds, 0 when it is gone."""
        conn, resp = self.post("/v3/lease/keepalive", {"ID": str(lease)})
        try:
            line = read_line(resp, MAX_KEEPALIVE_LINE)
        except (OSError, http.client.HTTPException, EOFError) as e:
            raise EtcdError("lease keepalive: %s" % e) from None
        finally:
            conn.close()
        v = _loads(line, "lease keepalive")
        if v.get("error") is not None:
            raise _stream_error(v["error"])
        r = v.get("result")
        if not isinstance(r, dict):
            raise EtcdError("lease keepalive: no result")
        if _i64(r.get("ID"), "lease keepalive: ID") != lease:
            raise EtcdError("lease keepalive: answer for another lease")
        return max(0, _i64(r.get("TTL"), "lease keepalive: TTL"))

    def revoke(self, lease):
        self.unary("/v3/lease/revoke", {"ID": str(lease)})

    def range_prefix(self, prefix, each):
        """Call each(kv) for every key under prefix, in pages all at the
        first page's revision, which it returns. A page beyond self.max is
        asked again with half the keys, down to one; a key whose value
        alone is beyond it is reported oversized (its value unread)."""
        req = {"key": _enc(prefix), "range_end": _enc(prefix_end(prefix)), "limit": str(self.page)}
        limit, rev, n = self.page, 0, 0
        while True:
            req["limit"] = str(limit)
            try:
                b = self.unary_bytes("/v3/kv/range", req)
            except TooLarge:
                if limit > 1:
                    limit //= 2
                    continue
                kr = dict(req, keys_only=True)
                r, kvs, more = decode_range(self.unary_bytes("/v3/kv/range", kr))
                rev = rev or r
                req["revision"] = str(rev)
                if not kvs:
                    return rev
                n += 1
                if n > MAX_NODES:
                    raise EtcdError("more than %d keys under %r" % (MAX_NODES, prefix))
                kv = kvs[0]
                kv["oversized"] = True
                each(kv)
                if not more:
                    return rev
                req["key"] = _enc(kv["key"] + b"\x00")
                continue
            limit = min(2 * limit, self.page)
            r, kvs, more = decode_range(b)
            rev = rev or r
            req["revision"] = str(rev)
            n += len(kvs)
            if n > MAX_NODES:
                raise EtcdError("more than %d keys under %r" % (MAX_NODES, prefix))
            start = base64.b64decode(req["key"])
            for kv in kvs:
                if kv["key"] < start:
                    raise EtcdError("range: keys out of order")
                each(kv)
            if not more or not kvs:
                return rev
            req["key"] = _enc(kvs[-1]["key"] + b"\x00")

    def _txn(self, compare, success, failure=()):
        v = self.unary("/v3/kv/txn", {"compare": compare, "success": success, "failure": list(failure)})
        h = v.get("header")
        if not isinstance(h, dict) or _i64(h.get("revision"), "txn: revision") <= 0:
            raise EtcdError("txn: bad revision")
        kvs = []
        for op in v.get("responses") or []:
            if isinstance(op, dict) and isinstance(op.get("response_range"), dict):
                got = op["response_range"].get("kvs")
                got = [] if got is None else got
                if not isinstance(got, list):
                    raise EtcdError("txn: kvs is not a list")
                kvs = [_kv(x, "txn") for x in got]
                break
        return v.get("succeeded") is True, kvs

    def create(self, key, value, lease):
        """Put key = value under lease if key does not exist; else (False, [kv as it is])."""
        k = _enc(key)
        return self._txn([{"key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
                         [{"request_put": {"key": k, "value": _enc(value), "lease": str(lease)}}],
                         [{"request_range": {"key": k}}])

    def put_if_lease(self, key, value, lease):
        k = _enc(key)
        return self._txn([{"key": k, "target": "LEASE", "result": "EQUAL", "lease": str(lease)}],
                         [{"request_put": {"key": k, "value": _enc(value), "lease": str(lease)}}])[0]

    def replace(self, key, value, lease, mod_rev):
        k = _enc(key)
        return self._txn([{"key": k, "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_rev)}],
                         [{"request_put": {"key": k, "value": _enc(value), "lease": str(lease)}}])[0]

    def watch(self, prefix, start):
        """Open a watch of the keys under prefix from revision start:
        (connection, response, endpoint), read with read_line. No read
        timeout: it ends when closed (the connection's socket shut down)."""
        ep = self.endpoint()
        conn, resp = self.post("/v3/watch", {"create_request": {
            "key": _enc(prefix), "range_end": _enc(prefix_end(prefix)), "start_revision": str(start)}})
        if conn.sock is not None:
            conn.sock.settimeout(None)
        return conn, resp, ep


# -- the discovery -----------------------------------------------------------

def _seconds(v, what, default):
    if v is None:
        return default
    if isinstance(v, str):
        m = re.fullmatch(r"([0-9.]+)(ms|s|m|h)", v.strip())
        if not m:
            raise ValueError("tensorferry: discovery: %s %r: want seconds or a duration (10s)" % (what, v))
        v = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ValueError("tensorferry: discovery: %s %r: want a positive number of seconds" % (what, v))
    return float(v)


def etcd_settings(section):
    """The config's discovery section (a dict {"etcd": {endpoints, prefix,
    lease_ttl, dial_timeout}}, or its etcd part) checked and completed with
    Go's defaults: (endpoints, prefix, lease TTL in whole seconds, dial
    timeout in seconds)."""
    if not isinstance(section, dict):
        raise ValueError("tensorferry: discovery: want a dict like {'etcd': {'endpoints': [...]}}")
    e = section.get("etcd", section) if "etcd" in section else section
    if not isinstance(e, dict):
        raise ValueError("tensorferry: discovery.etcd: want a dict")
    unknown = set(e) - {"endpoints", "prefix", "lease_ttl", "dial_timeout"}
    if unknown:
        raise ValueError("tensorferry: discovery.etcd: unknown keys %s" % sorted(unknown))
    eps = e.get("endpoints")
    if isinstance(eps, str):
        eps = [eps]
    if not eps or not all(isinstance(x, str) for x in eps):
        raise ValueError("tensorferry: discovery.etcd.endpoints: at least one endpoint is required (http://host:2379)")
    prefix = e.get("prefix") or "/tensorferry/"
    if not isinstance(prefix, str) or len(prefix) > 256 or any(not " " < c <= "~" for c in prefix):
        raise ValueError("tensorferry: discovery.etcd.prefix %r: want printable ASCII without spaces, "
                         "at most 256 bytes" % (prefix,))
    ttl = _seconds(e.get("lease_ttl"), "lease_ttl", 10.0)
    if not 2 <= ttl <= 3600 or ttl != int(ttl):
        raise ValueError("tensorferry: discovery.etcd.lease_ttl %r: want whole seconds in 2..3600" % (ttl,))
    timeout = _seconds(e.get("dial_timeout"), "dial_timeout", 2.0)
    if timeout < 0.01:
        raise ValueError("tensorferry: discovery.etcd.dial_timeout %r: at least 10ms" % (timeout,))
    return list(eps), prefix, int(ttl), timeout


class Etcd:
    """Discovery through etcd. fn(kind, node, reason) receives ("joined",
    node dict, "") and ("left", node dict, reason), in order, from one
    thread at a time: the Joined of every node known at start from start
    itself, then changes from the watch thread. errors (a Recent-like list)
    receives the registrations skipped and the troubles with etcd."""

    def __init__(self, section, cluster, errors):
        eps, prefix, self.ttl, self.timeout = etcd_settings(section)
        check_name(cluster)
        self.endpoints = eps
        self.dir = (prefix + cluster + "/nodes/").encode()
        self.interval = self.ttl / 3.0
        self.c = Client(eps, self.timeout)
        self.errors = errors
        self.mu = threading.Lock()
        self.lease = 0
        self.known = {}  # name → (node, leaving): the watch thread's
        self.rev = 0
        self.stopped = threading.Event()
        # wakes the keepalive thread: reassert_due (the watch saw this
        # node's key changed under it), keepalive_due, or stop
        self.wake = threading.Event()
        self.reassert_due = self.keepalive_due = False
        self.watch_conn = None  # the watch's connection, shut down to restart it
        self.threads = []
        self.keepalive_paused = False  # tests: the node looks dead to etcd
        self.registrations = 0  # leases registered under (tests)
        # Nodes this one takes from etcd, at most: each is a mesh peer
        # with a dialing thread here.
        self.max_peers = MAX_PEERS
        # Tests: when set, an Event the watch waits for before each
        # reconnection.
        self.resync_gate = None
        self.watching = threading.Event()  # set while a watch stream is created and read (tests)

    def __str__(self):
        return "etcd(%s)" % ",".join(self.endpoints)

    def _err(self, msg):
        self.errors.append("discovery %s: %s" % (self, msg))

    def start(self, self_node, fn, timeout=None):
        """Register self_node (name, address, data_address, devices) and
        deliver the cluster's other nodes to fn. timeout (default lease
        TTL + dial timeout) bounds the wait for a previous registration of
        this name to expire."""
        self.self = check_node(dict(self_node), gossips=False)  # a Python node does not gossip
        self.key = self.dir + self.self["name"].encode()
        self.value = encode_node(self.self)
        self.fn = fn
        self.lease = self._register(True, timeout)
        t = threading.Thread(target=self._keepalives, daemon=True, name="tensorferry-etcd-keepalive")
        t.start()
        self.threads.append(t)
        try:
            cur, self.rev = self._read()
        except BaseException:
            self.stop()
            raise
        self._resync(cur, None)
        t = threading.Thread(target=self._watch, daemon=True, name="tensorferry-etcd-watch")
        t.start()
        self.threads.append(t)

    def _register(self, wait, timeout=None):
        lease, _ = self.c.grant(self.ttl)
        end = time.monotonic() + (self.ttl + self.timeout if timeout is None else timeout)
        delay = RETRY_MIN
        while True:
            try:
                ok, cur = self.c.create(self.key, self.value, lease)
            except EtcdError:
                self._revoke(lease)
                raise
            if ok:
                self.registrations += 1
                return lease
            holder = cur[0]["lease"] if cur else 0
            err = EtcdError("%r is registered by another process (lease %x); is a node of that name still "
                            "running?" % (self.self["name"], holder))
            if wait and time.monotonic() < end and not self.stopped.wait(delay):
                delay = min(2 * delay, 1.0)
                continue
            self._revoke(lease)
            raise err

    def _revoke(self, lease):
        try:
            self.c.revoke(lease)
        except EtcdError as e:
            if e.message != LEASE_NOT_FOUND:
                self._err("revoke lease %x: %s" % (lease, e))

    def stop(self):
        """Mark the registration leaving, revoke its lease (which deletes
        it) and wait for the threads."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        self.wake.set()
        self._restart_watch()
        me = threading.current_thread()
        for t in self.threads:
            if t is not me:
                t.join(self.timeout + 1.0)
        with self.mu:
            lease = self.lease
        if not lease:
            return
        try:
            # Only while the key is still this lease's: never overwrite
            # another process's registration.
            self.c.put_if_lease(self.key, encode_node(self.self, leaving=True), lease)
        except EtcdError as e:
            self._err("mark leaving: %s" % e)
        self._revoke(lease)

    def _restart_watch(self):
        with self.mu:
            conn = self.watch_conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(2)
            except OSError:
                pass

    def _keepalives(self):
        """Renew the lease every third of its TTL; when etcd says it is
        gone, register again under a new one. A failed keepalive restarts
        the watch too: a stream on a dead connection may never notice by
        itself. Between keepalives, put the registration back when the
        watch saw it changed (reassert)."""
        delay = RETRY_MIN
        due = time.monotonic() + self.interval
        while True:
            self.wake.wait(max(0.0, due - time.monotonic()))
            if self.stopped.is_set():
                return
            self.wake.clear()
            if self.reassert_due:
                self.reassert_due = False
                self._reassert()
            if time.monotonic() < due and not self.keepalive_due:
                continue
            self.keepalive_due = False
            due = time.monotonic() + self.interval
            if self.keepalive_paused:
                continue
            with self.mu:
                lease = self.lease
            try:
                ttl = self.c.keepalive(lease)
                if ttl == 0:
                    self._err("lease %x expired: registering again" % lease)
                    lease = self._register(False)
                    with self.mu:
                        self.lease = lease
            except Exception as e:  # EtcdError, or a bug: this keepalive only
                if self.stopped.is_set():
                    return
                self._err("lease keepalive: %s (retry in %.1fs)" % (e, delay))
                self._restart_watch()
                due, delay = time.monotonic() + delay, min(2 * delay, self.interval)
                continue
            delay = RETRY_MIN

    def keepalive_now(self):
        """Run a keepalive at once (tests: after keepalive_paused is
        cleared)."""
        self.keepalive_due = True
        self.wake.set()

    def _reassert(self):
        """Put the registration back when its key no longer holds it under
        this node's lease (deleted, or overwritten), unless a valid
        registration of this name under another live lease holds it."""
        with self.mu:
            lease = self.lease
        try:
            ok, cur = self.c.create(self.key, self.value, lease)
            if ok:
                self._err("own registration was deleted: put back")
                return
            if len(cur) != 1:
                return
            kv = cur[0]
            if kv["value"] == self.value and kv["lease"] == lease:
                return
            try:
                n, _ = decode_node(kv["value"])
                if kv["lease"] not in (0, lease) and n["name"] == self.self["name"]:
                    self._err("own name registered under another lease %x: is another process running as "
                              "this node?" % kv["lease"])
                    return
            except BadValue:
                pass
            if self.c.replace(self.key, self.value, lease, kv["mod_revision"]):
                self._err("own registration was overwritten: put back")
        except Exception as e:  # EtcdError, or a bug: this check only
            self._err("check own registration: %s" % e)

    def _watch(self):
        """Follow the registrations from the revision after the range. A
        broken stream reconnects with backoff from the last revision
        applied; a compacted history, or a batch beyond max_line, is read
        again with a range and the difference reported."""
        delay = RETRY_MIN
        first = True
        while not self.stopped.is_set():
            if not first:
                gate = self.resync_gate
                if gate is not None:
                    while not gate.wait(0.1):
                        if self.stopped.is_set():
                            return
                if self.stopped.wait(delay / 2 + random.uniform(0, delay / 2)):
                    return
                delay = min(2 * delay, RETRY_MAX)
            first = False
            try:
                try:
                    delay = self._follow(delay)
                except (Compacted, TooLarge) as e:
                    self._err("watch: reading the registrations again from %d: %s" % (self.rev + 1, e))
                    cur, rev = self._read()
                    self._resync(cur, lambda m: REASON_LEFT if m[1] else REASON_MISSED)
                    self.rev = rev
                    delay = RETRY_MIN
                    first = True
            except Exception as e:  # EtcdError, OSError, EOFError, ..., or a callback's failure
                if not self.stopped.is_set():
                    self._err("watch broken: reconnecting: %s" % (e if isinstance(e, EtcdError) else repr(e)))

    def _follow(self, delay):
        conn, resp, ep = self.c.watch(self.dir, self.rev + 1)
        with self.mu:
            self.watch_conn = conn
        try:
            if self.stopped.is_set():
                return delay
            while True:
                line = read_line(resp, self.c.max_line)
                try:
                    created, events = decode_watch(line)
                except EtcdError as e:
                    if e.code == CODE_UNAVAILABLE:
                        self.c.failed(ep)  # this member lost its leader
                    raise
                if created:
                    delay = RETRY_MIN
                    self.watching.set()
                for t, kv in events:
                    self._apply(t, kv)
                    self.rev = max(self.rev, kv["mod_revision"])
        finally:
            self.watching.clear()
            with self.mu:
                self.watch_conn = None
            conn.close()

    def _name_of(self, key):
        if not key.startswith(self.dir):
            raise BadValue("key outside %r" % self.dir)
        try:
            return check_name(key[len(self.dir):].decode("ascii"))
        except (UnicodeDecodeError, BadValue) as e:
            raise BadValue("key: %s" % e) from None

    def _parse(self, kv):
        """(name, node, leaving) of a registration; raise BadValue."""
        name = self._name_of(kv["key"])
        if kv["oversized"]:
            raise BadValue("%s: value beyond the %d bytes an answer may hold" % (name, self.c.max))
        n, leaving = decode_node(kv["value"])
        if n["name"] != name:
            raise BadValue("%s: value names node %r" % (name, n["name"]))
        return name, n, leaving

    def _skip(self, kv, e):
        self._err("skipping an invalid registration %r (%d bytes): %s"
                  % (kv["key"][:512], len(kv["value"]), e))

    def _apply(self, t, kv):
        if kv["key"] == self.key:
            with self.mu:
                lease = self.lease
            if t == "DELETE" or kv["value"] != self.value or kv["lease"] != lease:
                self.reassert_due = True
                self.wake.set()
            return
        if t == "DELETE":
            try:
                name = self._name_of(kv["key"])
            except BadValue:
                return
            m = self.known.pop(name, None)
            if m is not None:
                self.fn("left", m[0], REASON_LEFT if m[1] else REASON_LEASE_EXPIRED)
            return
        try:
            name, n, leaving = self._parse(kv)
        except BadValue as e:
            # Skipped, not taken for a departure: a node known from a
            # valid registration stays known until its key is deleted.
            self._skip(kv, e)
            return
        if name == self.self["name"]:
            return
        self._update(name, (n, leaving))

    def _update(self, name, m):
        old = self.known.get(name)
        if old is None and len(self.known) >= self.max_peers:
            self._err("skipping the registration of %s: %d nodes known, at most %d"
                      % (name, len(self.known), self.max_peers))
            return
        self.known[name] = m
        if old is None:
            self.fn("joined", m[0], "")
        elif not same_node(old[0], m[0]):
            self.fn("left", old[0], REASON_CHANGED)
            self.fn("joined", m[0], "")

    def _read(self):
        cur = {}

        def each(kv):
            try:
                name, n, leaving = self._parse(kv)
            except BadValue as e:
                if kv["key"] != self.key:
                    self._skip(kv, e)
                return
            if name != self.self["name"]:
                cur[name] = (n, leaving)
        rev = self.c.range_prefix(self.dir, each)
        return cur, rev

    def _resync(self, cur, gone):
        for name in sorted(set(self.known) - set(cur)):
            m = self.known.pop(name)
            self.fn("left", m[0], gone(m) if gone else REASON_MISSED)
        for name in sorted(cur):
            self._update(name, cur[name])
