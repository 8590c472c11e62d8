"""The ipc channel between a Python node and Go nodes of one host.

It speaks rdma/ipc's protocol (rdma/ipc/doc.go) byte for byte: the offer a
descriptor carries (where the tensor lies in its CUDA allocation, 42 bytes),
and the control requests that travel between the two ends' channels as
"$tensorferry.ctl" messages: challenge and prove (the same-host proof
through a file of /dev/shm), begin (the export is acquired for one copy
and, for a proven holder, the allocation's CUDA IPC handle is given), end,
and revoke. Both roles are here:

- Owner (Go fetches a tensor this node lent): Owner.offer describes a CUDA
  tensor's place in its driver allocation; Owner.handle answers the Go
  fetcher's control requests. Once a peer proved itself and got an
  allocation's handle, later offers of tensors in that allocation to it
  are direct, with no deadline: the node keeps an export (and so its
  memory) until the holder releases it, so the holder copies under the
  lease alone, without begin and end. A tensor in memory without a legacy
  IPC handle (PyTorch's expandable segments) gets no offer: Refused says
  why, and the node serves it through staging instead.
- Fetcher (this node fetches a tensor a Go node lent): Fetcher.fetch
  begins (proving this node first when the owner asks), maps the owner's
  allocation once per (owner, incarnation, allocation, device), copies
  into a torch tensor and ends; a direct offer for a mapping already open
  copies under the lease alone, before its deadline.

Every byte from the peer is hostile: control messages are bounded
(MAX_CONTROL) and checked field by field like rdma/ipc's decodeRequest and
decodeReply; offers are checked against their allocation; a challenge file
is read only inside SHM_DIR. Nothing from the peer sizes an allocation:
the destination tensor's size comes from the descriptor the node checked
against its receive budget, and the mapping's size is checked against
the driver's.
"""

import hashlib
import hmac
import itertools
import os
import struct
import threading
import time

from .codec import BadBody, Struct, U8, U32, U64, decode, encode

OP_CHALLENGE, OP_PROVE, OP_BEGIN, OP_END, OP_REVOKE = 1, 2, 3, 4, 5

OFFER = struct.Struct("<BQQQQBQ")  # version, alloc, offset, bytes, alloc size, flags, deadline
OFFER_VERSION = 2
FLAG_DIRECT = 1
MAX_ALLOC_SIZE = 1 << 50

MAX_CONTROL = 4096
MAX_REVOKED = 64
MAC_LEN = 32
PROCESS_ID_LEN = 16
MAX_PATH = 512
TOKEN_LEN = 32
CHALLENGE_PREFIX = "tensorferry-ipc-"
SHM_DIR = "/dev/shm"

# wire.ErrCode values the ipc channel's replies carry.
CODE_OK, CODE_PROTOCOL, CODE_INTERNAL, CODE_AUTH = 0, 1, 2, 4
CODE_NOT_FOUND, CODE_RELEASED, CODE_OUT_OF_RANGE = 7, 8, 9
CODE_UNAVAILABLE, CODE_SHUTDOWN, CODE_STALE, CODE_CLOSED = 12, 13, 14, 15

# A copy under a direct offer must be over this long before the deadline
# (rdma/ipc's directSlack), and starts only with DIRECT_MARGIN left.
DIRECT_SLACK_NS = 1_000_000
DIRECT_MARGIN_NS = 1_000_000_000


class IPCError(Exception):
    """A failed ipc transfer or a bad control message; code is the
    wire.ErrCode an owner answers with (or received from one)."""

    def __init__(self, msg, code=CODE_INTERNAL):
        super().__init__(msg)
        self.code = code


class Refused(IPCError):
    """A tensor the ipc channel cannot lend (no legacy CUDA IPC handle)."""


def _bad(msg):
    return IPCError("tensorferry: ipc: bad control message: " + msg, CODE_PROTOCOL)


# -- offers -----------------------------------------------------------------

def encode_offer(alloc, offset, nbytes, alloc_size, flags=0, deadline=0):
    """The offer rdma/ipc's decodeOffer reads."""
    return OFFER.pack(OFFER_VERSION, alloc, offset, nbytes, alloc_size, flags, deadline)


def decode_offer(b):
    """(alloc, offset, bytes, alloc size, flags, deadline) of an offer,
    checked like rdma/ipc's decodeOffer."""
    if not isinstance(b, bytes) or len(b) != OFFER.size:
        raise _bad("offer of %d bytes, want %d" % (len(b) if isinstance(b, bytes) else -1, OFFER.size))
    v, alloc, off, n, size, flags, deadline = OFFER.unpack(b)
    if v != OFFER_VERSION:
        raise _bad("offer version %d" % v)
    if size > MAX_ALLOC_SIZE or off > size or n > size - off:
        raise _bad("offer [%d, +%d) outside an allocation of %d bytes" % (off, n, size))
    if flags & ~FLAG_DIRECT:
        raise _bad("offer flags %#x" % flags)
    return alloc, off, n, size, flags, deadline


# -- control messages ---------------------------------------------------------

_REQUEST = (("o", "op", U8), ("i", "inc", U64), ("x", "export", U64), ("l", "lease", U64),
            ("q", "acq", U64), ("a", "alloc", U64), ("f", "offset", U64), ("b", "bytes", U64),
            ("w", "want_handle", bool), ("c", "challenge", U64), ("m", "mac", bytes),
            ("r", "revoked", list))
_REPLY = (("c", "code", U32), ("m", "msg", str), ("h", "handle", bytes), ("n", "map_size", U64),
          ("s", "shift", U64), ("b", "base", U64), ("d", "device", int), ("p", "process", bytes),
          ("r", "revoked", list), ("k", "challenge", U64), ("f", "path", str))


def _encode(fields, always, kw):
    unknown = set(kw) - {f[1] for f in fields}
    if unknown:
        raise TypeError("tensorferry: ipc: unknown fields %s" % sorted(unknown))
    s = Struct()
    for key, name, typ in fields:
        v = kw.get(name)
        if not v and key != always:
            continue  # omitempty
        if typ is list:
            s[key] = [U64(x) for x in v]
        elif typ in (bool, bytes, str):
            s[key] = typ(v) if v is not None else typ()
        elif typ is int:  # a Go int: vmihailenco writes it compact
            s[key] = int(v or 0)
        else:
            s[key] = typ(v or 0)
    return bytes(encode(s))


def encode_request(**kw):
    """The bytes rdma/ipc's request encodes to (msgpack.Marshal, fields in
    declared order, zero fields omitted but the op)."""
    return _encode(_REQUEST, "o", kw)


def encode_reply(**kw):
    """The bytes rdma/ipc's reply encodes to (the code always present)."""
    return _encode(_REPLY, "c", kw)


def _decode(b, fields, what):
    if not isinstance(b, (bytes, bytearray)):
        raise _bad("%s is a %s" % (what, type(b).__name__))
    if len(b) > MAX_CONTROL:
        raise _bad("%s of %d bytes" % (what, len(b)))
    try:
        v = decode(bytes(b))
    except BadBody as e:
        raise _bad("%s: %s" % (what, e)) from None
    if not isinstance(v, dict):
        raise _bad("%s is not a map" % what)
    out = {}
    for key, name, typ in fields:
        x = v.get(key)
        if x is None:
            out[name] = [] if typ is list else typ()
            continue
        if typ is bool:
            if type(x) is not bool:
                raise _bad("%s field %s is %r" % (what, key, x))
        elif typ in (bytes, str):
            if not isinstance(x, typ):
                raise _bad("%s field %s is a %s" % (what, key, type(x).__name__))
        elif typ is list:
            if not isinstance(x, list) or not all(type(y) is int and 0 <= y < 1 << 64 for y in x):
                raise _bad("%s field %s is not a list of uint64" % (what, key))
        else:
            lo, hi = typ.range if typ is not int else (-(1 << 63), (1 << 63) - 1)
            if type(x) is not int or not lo <= x <= hi:
                raise _bad("%s field %s is %r" % (what, key, x))
        out[name] = x
    return out


def decode_request(b):
    """A fetcher's control request, checked like rdma/ipc's decodeRequest."""
    r = _decode(b, _REQUEST, "request")
    op = r["op"]
    if op in (OP_CHALLENGE, OP_BEGIN, OP_END):
        pass
    elif op == OP_REVOKE:
        if not 0 < len(r["revoked"]) <= MAX_REVOKED:
            raise _bad("revoke of %d allocations" % len(r["revoked"]))
    elif op == OP_PROVE:
        if len(r["mac"]) != MAC_LEN:
            raise _bad("MAC of %d bytes" % len(r["mac"]))
    else:
        raise _bad("unknown op %d" % op)
    if op == OP_BEGIN and (r["offset"] > MAX_ALLOC_SIZE or r["bytes"] > MAX_ALLOC_SIZE):
        raise _bad("range [%d, +%d)" % (r["offset"], r["bytes"]))
    return r


def decode_reply(b):
    """An owner's reply, checked like rdma/ipc's decodeReply."""
    r = _decode(b, _REPLY, "reply")
    if r["handle"] and len(r["handle"]) != 64:
        raise _bad("IPC handle of %d bytes" % len(r["handle"]))
    if r["process"] and len(r["process"]) != PROCESS_ID_LEN:
        raise _bad("process id of %d bytes" % len(r["process"]))
    if r["map_size"] > MAX_ALLOC_SIZE or r["shift"] > r["map_size"]:
        raise _bad("mapping of %d bytes at shift %d" % (r["map_size"], r["shift"]))
    if r["handle"] and r["map_size"] == 0:
        raise _bad("IPC handle without a size")
    if not 0 <= r["device"] <= 1 << 16:
        raise _bad("device %d" % r["device"])
    if len(r["revoked"]) > MAX_REVOKED:
        raise _bad("%d revoked allocations" % len(r["revoked"]))
    if len(r["path"]) > MAX_PATH:
        raise _bad("challenge path of %d bytes" % len(r["path"]))
    return r


def error_reply(e):
    code = e.code if isinstance(e, IPCError) else CODE_INTERNAL
    return encode_reply(code=code, msg=str(e)[:1024])


# -- the same-host proof ------------------------------------------------------

def proof_mac(token, node):
    """HMAC-SHA256(token, node name): the answer to a challenge."""
    return hmac.new(token, node.encode(), hashlib.sha256).digest()


def answer_challenge(path, node, shm_dir=SHM_DIR):
    """Read the owner's token at path (a challenge file directly inside
    shm_dir, nothing else) and return the proof for node."""
    if os.path.dirname(path) != os.path.normpath(shm_dir) or \
            not os.path.basename(path).startswith(CHALLENGE_PREFIX):
        raise _bad("challenge file %r is not in %s" % (path, shm_dir))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise IPCError("tensorferry: ipc: cannot read the owner's challenge (not on the same host?): %s"
                       % e, CODE_AUTH) from None
    try:
        token = os.read(fd, TOKEN_LEN + 1)
    finally:
        os.close(fd)
    if len(token) != TOKEN_LEN:
        raise _bad("challenge file %s holds %d bytes, want %d" % (path, len(token), TOKEN_LEN))
    return proof_mac(token, node)


class _Challenge:
    def __init__(self, shm_dir, ttl):
        self.id = int.from_bytes(os.urandom(8), "little")
        self.token = os.urandom(TOKEN_LEN)
        self.expires = time.monotonic() + ttl
        self.path = os.path.join(shm_dir, CHALLENGE_PREFIX + os.urandom(16).hex())
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, self.token)
        except OSError:
            os.close(fd)
            self.remove()
            raise
        os.close(fd)

    def remove(self):
        try:
            os.remove(self.path)
        except OSError:
            pass


# -- host identity ------------------------------------------------------------

def host_id():
    """This host's id exactly as Go's memory.HostID computes it."""
    v = os.environ.get("TENSORFERRY_HOST_ID")
    if v:
        return v
    for f in ("/proc/sys/kernel/random/boot_id", "/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(f, "rb") as fh:
                s = fh.read(4096).decode("utf-8", "replace").strip()
        except OSError:
            continue
        if s:
            return _hash_id(f, s)
    import socket
    return _hash_id("hostname", socket.gethostname() or "unknown")


def _hash_id(kind, v):
    return hashlib.sha256(("tensorferry host\0" + kind + "\0" + v).encode()).hexdigest()[:16]


# -- owner ----------------------------------------------------------------------

class _Alloc:
    __slots__ = ("id", "device", "base", "size", "buffer_id", "handle")

    def __init__(self, aid, a):
        self.id, self.device, self.base, self.size = aid, a.device, a.base, a.size
        self.buffer_id, self.handle = a.buffer_id, None


class Owner:
    """The owner side: offers for this node's CUDA exports and the answers
    to Go fetchers' control requests.

    lookup(export id) returns (lease, tensor, holder, incarnation) of a
    lent export, or None; served(peer, export, bytes), when given, is
    called for each copy begun (export: what lookup returned second). max_acquisitions bounds the copies one peer may
    have in flight (rdma/ipc's MaxAcquisitions); challenge_ttl (seconds)
    how long a challenge waits for its answer; direct=False never makes
    direct offers (rdma/ipc's NoDirect).
    """

    def __init__(self, driver, lookup, incarnation, shm_dir=SHM_DIR, challenge_ttl=10.0,
                 max_acquisitions=1024, max_allocs=4096, served=None, direct=True):
        self.driver, self.lookup, self.incarnation = driver, lookup, incarnation
        self.served, self.direct = served, direct
        self.shm_dir, self.ttl = shm_dir, challenge_ttl
        self.max_acqs, self.max_allocs = max_acquisitions, max_allocs
        self.mu = threading.Lock()
        self.proven = set()
        self.challenges = {}
        self.allocs = {}      # (device, buffer id) -> _Alloc
        self.by_id = {}       # alloc id -> _Alloc
        self.by_base = {}     # (device, base) -> _Alloc
        self.grants = {}      # peer -> alloc ids whose handle it got
        self.revoked = {}     # peer -> alloc ids to tell it
        self.acqs = {}        # peer -> {acq id: tensor}
        # Allocation ids start at random: a restarted owner does not
        # reuse the ids a fetcher has mappings of (they are per
        # incarnation too).
        self.ids = itertools.count(int.from_bytes(os.urandom(4), "little") + 1)
        self.stats = {"handles": 0, "begins": 0, "ends": 0, "proofs": 0, "direct_offers": 0}

    def offer(self, t, holder=None, sync=False):
        """The ipc offer of t, a contiguous CUDA tensor whose kernels are
        done (with sync: after waiting for torch's current stream of its
        device, in the same driver entry as locating it), lent to holder:
        direct when holder proved it shares this host and got the
        allocation's handle already (and direct offers are on). Raises
        Refused for memory without a legacy IPC handle."""
        a = self.driver.locate(t, sync=sync)
        if not a.legacy_ipc:
            raise Refused("tensorferry: ipc: the tensor's memory (%#x on cuda:%d) has no legacy CUDA IPC "
                          "handle: PyTorch's expandable segments (PYTORCH_CUDA_ALLOC_CONF="
                          "expandable_segments:True) map memory that CUDA IPC cannot share"
                          % (a.ptr, a.device))
        n = t.numel() * t.element_size()
        if a.size > MAX_ALLOC_SIZE or not a.base <= a.ptr or a.ptr - a.base + n > a.size:
            raise IPCError("tensorferry: ipc: tensor %#x+%d outside its allocation %#x+%d"
                           % (a.ptr, n, a.base, a.size))
        with self.mu:
            x = self.allocs.get((a.device, a.buffer_id))
            if x is None:
                x = self._new_alloc_locked(a)
            flags = 0
            if self.direct and holder in self.proven and x.id in self.grants.get(holder, ()):
                flags = FLAG_DIRECT
                self.stats["direct_offers"] += 1
        # No deadline: the export stays until its holder releases it.
        return encode_offer(x.id, a.ptr - x.base, n, x.size, flags, 0)

    def _new_alloc_locked(self, a):
        old = self.by_base.pop((a.device, a.base), None)
        if old is not None:
            # The allocator freed the old allocation and the driver gave
            # its address to a new one: fetchers close their mappings.
            self._forget_locked(old)
        for o in [o for o in self.by_base.values() if o.base < a.base + a.size and a.base < o.base + o.size]:
            self._forget_locked(o)  # freed: its range is another's now
        while len(self.allocs) >= self.max_allocs:
            self._forget_locked(next(iter(self.allocs.values())))
        x = _Alloc(next(self.ids), a)
        self.allocs[(a.device, a.buffer_id)] = x
        self.by_id[x.id] = x
        self.by_base[(a.device, a.base)] = x
        return x

    def _forget_locked(self, x):
        self.allocs.pop((x.device, x.buffer_id), None)
        self.by_id.pop(x.id, None)
        if self.by_base.get((x.device, x.base)) is x:
            del self.by_base[(x.device, x.base)]
        for peer, g in self.grants.items():
            if x.id in g:
                g.discard(x.id)
                self.revoked.setdefault(peer, []).append(x.id)

    def take_revoked(self, peer):
        """Allocation ids to revoke on peer (at most MAX_REVOKED), for an
        opRevoke request the node sends in the background."""
        with self.mu:
            r = self.revoked.get(peer, [])
            out, rest = r[:MAX_REVOKED], r[MAX_REVOKED:]
            if rest:
                self.revoked[peer] = rest
            else:
                self.revoked.pop(peer, None)
            return out

    def handle(self, peer, body):
        """Answer one control request of peer's ipc channel (reply bytes);
        a bad request is an error reply, never an exception."""
        try:
            r = decode_request(body)
            op = r["op"]
            if op == OP_CHALLENGE:
                return self._challenge(peer)
            if op == OP_PROVE:
                return self._prove(peer, r)
            if op == OP_BEGIN:
                return self._begin(peer, r)
            if op == OP_END:
                with self.mu:
                    if self.acqs.get(peer, {}).pop(r["acq"], None) is not None:
                        self.stats["ends"] += 1
                return encode_reply(code=CODE_OK)
            # OP_REVOKE goes to the fetcher side; the node routes it there.
            raise _bad("revoke sent to an owner")
        except IPCError as e:
            return error_reply(e)
        except Exception as e:  # an owner's own failure: an answer, not a crash
            return error_reply(IPCError("tensorferry: ipc: %s" % e))

    def _challenge(self, peer):
        with self.mu:
            old = self.challenges.pop(peer, None)
            now = time.monotonic()
            expired = [p for p, c in self.challenges.items() if c.expires < now]
            gone = [self.challenges.pop(p) for p in expired]
        for c in ([old] if old else []) + gone:
            c.remove()
        try:
            ch = _Challenge(self.shm_dir, self.ttl)
        except OSError as e:
            raise IPCError("tensorferry: ipc: same-host challenge: %s" % e) from None
        with self.mu:
            if peer in self.challenges:
                ch.remove()
                raise IPCError("tensorferry: ipc: challenge for %s superseded" % peer)
            self.challenges[peer] = ch
        return encode_reply(code=CODE_OK, challenge=ch.id, path=ch.path)

    def _prove(self, peer, r):
        with self.mu:
            ch = self.challenges.get(peer)
            if ch is None or ch.id != r["challenge"]:
                raise IPCError("tensorferry: ipc: peer has not proven it runs on this host: no pending "
                               "challenge %d for %s" % (r["challenge"], peer), CODE_AUTH)
            del self.challenges[peer]
        ch.remove()
        if time.monotonic() > ch.expires:
            raise IPCError("tensorferry: ipc: peer has not proven it runs on this host: challenge expired",
                           CODE_AUTH)
        if not hmac.compare_digest(r["mac"], proof_mac(ch.token, peer)):
            raise IPCError("tensorferry: ipc: peer has not proven it runs on this host: wrong answer "
                           "to the same-host challenge", CODE_AUTH)
        with self.mu:
            self.proven.add(peer)
            self.stats["proofs"] += 1
        return encode_reply(code=CODE_OK)

    def _begin(self, peer, r):
        if r["inc"] != self.incarnation:
            raise IPCError("tensorferry: ipc: export of incarnation %d, this is %d"
                           % (r["inc"], self.incarnation), CODE_STALE)
        x = self.lookup(r["export"])
        if x is None:
            raise IPCError("tensorferry: ipc: no export %d" % r["export"], CODE_NOT_FOUND)
        lease, t, holder = x[0], x[1], x[2]
        if lease != r["lease"]:
            raise IPCError("tensorferry: ipc: lease not valid for export %d" % r["export"], CODE_RELEASED)
        if holder != peer:
            raise IPCError("tensorferry: ipc: export %d was lent to %s, not %s" % (r["export"], holder, peer),
                           CODE_RELEASED)
        if getattr(t, "ipc_offer", None) is None:
            raise _bad("export %d is not in CUDA memory" % r["export"])
        alloc, off, n, _, _, _ = decode_offer(t.ipc_offer)
        if (alloc, off, n) != (r["alloc"], r["offset"], r["bytes"]):
            raise _bad("request (allocation %d, [%d, +%d)) does not match export %d (allocation %d, [%d, +%d))"
                       % (r["alloc"], r["offset"], r["bytes"], r["export"], alloc, off, n))
        with self.mu:
            acqs = self.acqs.setdefault(peer, {})
            if r["acq"] in acqs:
                raise _bad("acquisition %d already in use" % r["acq"])
            if len(acqs) >= self.max_acqs:
                raise IPCError("tensorferry: ipc: too many transfers in flight from this peer: %d"
                               % self.max_acqs, CODE_UNAVAILABLE)
            proven = peer in self.proven
            a = self.by_id.get(alloc)
        kw = {"code": CODE_OK}
        if r["want_handle"] and n:
            if not proven:
                raise IPCError("tensorferry: ipc: peer has not proven it runs on this host: %s" % peer, CODE_AUTH)
            if a is None:
                raise IPCError("tensorferry: ipc: allocation %d of export %d was freed" % (alloc, r["export"]),
                               CODE_NOT_FOUND)
            if a.handle is None:
                a.handle = self.driver.ipc_handle(a.device, a.base)
                self.stats["handles"] += 1
            kw.update(handle=a.handle, map_size=a.size, shift=0, base=a.base, device=a.device)
        with self.mu:
            acqs = self.acqs.setdefault(peer, {})
            if r["acq"] in acqs:
                raise _bad("acquisition %d already in use" % r["acq"])
            # The acquisition keeps the tensor alive until end, released
            # or not.
            acqs[r["acq"]] = t
            self.stats["begins"] += 1
            if "handle" in kw:
                self.grants.setdefault(peer, set()).add(alloc)
            rv = self.revoked.get(peer)
            if rv:
                kw["revoked"] = rv[:MAX_REVOKED]
                rest = rv[MAX_REVOKED:]
                if rest:
                    self.revoked[peer] = rest
                else:
                    del self.revoked[peer]
        if self.served is not None:
            self.served(peer, t, n)
        return encode_reply(**kw)

    def peer_down(self, peer):
        with self.mu:
            self.proven.discard(peer)
            ch = self.challenges.pop(peer, None)
            self.acqs.pop(peer, None)
            self.grants.pop(peer, None)
            self.revoked.pop(peer, None)
        if ch:
            ch.remove()

    def acquisitions(self):
        with self.mu:
            return sum(len(a) for a in self.acqs.values())

    def close(self):
        with self.mu:
            chs = list(self.challenges.values())
            self.challenges.clear()
            self.acqs.clear()
        for c in chs:
            c.remove()


# -- fetcher --------------------------------------------------------------------

class _Mapping:
    __slots__ = ("ptr", "size", "shift", "device", "users", "dropped", "last")

    def __init__(self, ptr, size, shift, device):
        self.ptr, self.size, self.shift, self.device = ptr, size, shift, device
        self.users, self.dropped, self.last = 0, False, 0.0


class Fetcher:
    """The fetcher side: copies Go exports into torch tensors.

    call(owner, body, timeout) sends a control request to the owner's ipc
    channel and returns the reply bytes (raising on a dead connection);
    send(owner, body) sends one without waiting (end). node is this node's
    name (what the same-host proof is bound to).
    """

    def __init__(self, driver, node, call, send, shm_dir=SHM_DIR, max_mappings=256):
        self.driver, self.node, self.call, self.send = driver, node, call, send
        self.shm_dir, self.max_mappings = shm_dir, max_mappings
        self.mu = threading.Lock()
        self.proof_mu = threading.Lock()
        self.open_mu = threading.Lock()
        self.mappings = {}  # (owner, inc, alloc, device) -> _Mapping
        self.acq_ids = itertools.count(int.from_bytes(os.urandom(8), "little") >> 1)
        self.stats = {"opens": 0, "reuses": 0, "direct": 0, "closes": 0, "proofs": 0}
        self.close_errors = []

    def fetch(self, d, dst, timeout):
        """Copy the export d (a descriptor from its owner, already checked)
        into dst, a contiguous CUDA tensor of d's bytes."""
        alloc, off, n, _, flags, deadline = decode_offer((d.get("f") or {}).get("ipc"))
        if n != d["b"]:
            raise _bad("offer of %d bytes for a descriptor of %d" % (n, d["b"]))
        if dst.numel() * dst.element_size() < n:
            raise IPCError("tensorferry: ipc: destination of %d bytes for %d"
                           % (dst.numel() * dst.element_size(), n))
        owner, inc = d["o"], d["i"]
        key = (owner, inc, alloc, dst.device.index)
        if n and flags & FLAG_DIRECT and d.get("h", "") == self.node and self._direct(key, off, n, deadline, dst):
            return
        req = dict(op=OP_BEGIN, inc=inc, export=d["e"], lease=d["l"], alloc=alloc, offset=off, bytes=n)
        if n == 0:
            self._begin(owner, req, timeout)
            self._end(owner, req["acq"])
            return
        m = self._claim(key)
        if m is not None:
            self._fetch(owner, inc, key, m, req, off, n, dst, timeout)
            return
        # One opener at a time: the driver maps a handle once per process
        # and device, so two fetches must not both open it.
        with self.open_mu:
            m = self._claim(key)
            self._fetch(owner, inc, key, m, req, off, n, dst, timeout)

    def fetch_direct(self, d, dst):
        """fetch, when d's offer is direct to this node and its allocation
        is mapped already: a device copy, nothing sent (True); False, with
        nothing done, otherwise."""
        alloc, off, n, _, flags, deadline = decode_offer((d.get("f") or {}).get("ipc"))
        if n != d["b"] or not n or dst.numel() * dst.element_size() < n:
            return False
        if not flags & FLAG_DIRECT or d.get("h", "") != self.node:
            return False
        return self._direct((d["o"], d["i"], alloc, dst.device.index), off, n, deadline, dst)

    def _claim(self, key):
        with self.mu:
            m = self.mappings.get(key)
            if m is not None:
                m.users += 1
                self.stats["reuses"] += 1
            return m

    def _fetch(self, owner, inc, key, m, req, off, n, dst, timeout):
        req["want_handle"] = m is None
        try:
            rep = self._begin(owner, req, timeout)
        except BaseException as e:
            if m is not None:
                self._unuse(key, m)
            if not isinstance(e, IPCError):
                # No answer (timeout, connection lost): the begin may have
                # reached the owner; end it, in case.
                self._end(owner, req["acq"])
            raise
        try:
            self.revoke(owner, inc, rep["revoked"])
            if m is None:
                m = self._open(key, rep)
            self._copy(m, off, n, dst)
            if m.dropped:
                raise IPCError("tensorferry: ipc: copy from %s: the mapping was closed during the copy "
                               "(allocation freed by its owner, or the owner went down)" % owner)
        finally:
            if m is not None:
                self._unuse(key, m)
            self._end(owner, req["acq"])

    def _direct(self, key, off, n, deadline, dst):
        with self.mu:
            m = self.mappings.get(key)
            if m is None or m.dropped:
                return False
            now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            if deadline and now + DIRECT_MARGIN_NS > deadline:
                return False
            m.users += 1
        try:
            self._copy(m, off, n, dst)
            if deadline and time.clock_gettime_ns(time.CLOCK_MONOTONIC) + DIRECT_SLACK_NS > deadline:
                raise IPCError("tensorferry: ipc: the copy outlived the lease's deadline")
        finally:
            self._unuse(key, m)
        with self.mu:
            self.stats["direct"] += 1
        return True

    def _call(self, owner, req, timeout):
        rb = self.call(owner, encode_request(**req), timeout)
        rep = decode_reply(rb)
        if rep["code"] != CODE_OK:
            raise IPCError("tensorferry: ipc: owner %s: %s" % (owner, rep["msg"][:512]), rep["code"])
        return rep

    def _begin(self, owner, req, timeout):
        for attempt in (0, 1):
            req["acq"] = next(self.acq_ids) & ((1 << 64) - 1)
            try:
                return self._call(owner, req, timeout)
            except IPCError as e:
                if e.code != CODE_AUTH or attempt:
                    raise
            self._prove(owner, timeout)

    def _prove(self, owner, timeout):
        with self.proof_mu:
            rep = self._call(owner, dict(op=OP_CHALLENGE), timeout)
            mac = answer_challenge(rep["path"], self.node, self.shm_dir)
            self._call(owner, dict(op=OP_PROVE, challenge=rep["challenge"], mac=mac), timeout)
            self.stats["proofs"] += 1

    def _end(self, owner, acq):
        try:
            self.send(owner, encode_request(op=OP_END, acq=acq))
        except Exception:
            pass  # the owner drops what it holds with the connection

    def _open(self, key, rep):
        if len(rep["handle"]) != 64:
            raise _bad("begin reply without an IPC handle")
        ptr = self.driver.ipc_open(key[3], rep["handle"], rep["map_size"])
        m = _Mapping(ptr, rep["map_size"], rep["shift"], key[3])
        m.users = 1
        with self.mu:
            old = self.mappings.get(key)
            self.mappings[key] = m
            self.stats["opens"] += 1
        if old is not None:  # a concurrent fetch opened it too: keep one
            self._drop(key, old)
        self._evict()
        return m

    def _copy(self, m, off, n, dst):
        if m.shift + off > m.size or n > m.size - m.shift - off:
            raise _bad("[%d, +%d) outside the owner's allocation of %d bytes" % (m.shift + off, n, m.size))
        self.driver.copy(dst, m.ptr + m.shift + off, n)

    def _unuse(self, key, m):
        with self.mu:
            m.users -= 1
            m.last = time.monotonic()
            close = m.dropped and m.users == 0
        if close:
            self._close(m)

    def _drop(self, key, m):
        with self.mu:
            if self.mappings.get(key) is m:
                del self.mappings[key]
            if m.dropped:
                return
            m.dropped = True
            close = m.users == 0
        if close:
            self._close(m)

    def _close(self, m):
        try:
            self.driver.ipc_close(m.device, m.ptr)
        except Exception as e:  # the mapping is gone from the table either way
            self.close_errors.append(str(e))
        with self.mu:
            self.stats["closes"] += 1

    def _evict(self):
        with self.mu:
            idle = sorted(((m.last, k, m) for k, m in self.mappings.items() if m.users == 0),
                          key=lambda x: x[0])
            excess = len(self.mappings) - self.max_mappings
        for _, k, m in idle[:max(0, excess)]:
            self._drop(k, m)

    def revoke(self, owner, inc, ids):
        """Close the mappings of allocations their owner freed."""
        if not ids:
            return
        with self.mu:
            keys = [(k, m) for k, m in self.mappings.items() if k[0] == owner and k[1] == inc and k[2] in ids]
        for k, m in keys:
            self._drop(k, m)

    def handle(self, owner, body):
        """Answer an owner's control request (its revocations)."""
        try:
            r = decode_request(body)
            if r["op"] != OP_REVOKE:
                raise _bad("op %d sent to a fetcher" % r["op"])
            self.revoke(owner, r["inc"], r["revoked"])
            return encode_reply(code=CODE_OK)
        except IPCError as e:
            return error_reply(e)

    def peer_down(self, owner):
        with self.mu:
            keys = [(k, m) for k, m in self.mappings.items() if k[0] == owner]
        for k, m in keys:
            self._drop(k, m)

    def open_mappings(self):
        with self.mu:
            return len(self.mappings)

    def close(self):
        with self.mu:
            keys = list(self.mappings.items())
        for k, m in keys:
            self._drop(k, m)
