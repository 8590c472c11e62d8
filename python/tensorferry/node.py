"""A Python process as a node of a tensorferry cluster (the config mesh).

The node joins the mesh as the Go nodes do (membership.py): it listens on
its address from the config and accepts the control connections its
peers dial, and dials every peer itself, redialing with backoff
(reconnect_min doubling up to reconnect_max), so that either end may
start first or restart, Go or Python; when both ends dial, both keep the
same connection by Go's rules. Each connection runs the mutual HMAC
handshake (as acceptor or initiator), the advert (capabilities) after it,
heartbeats answered and sent; silence beyond the failure timeout or a
lost connection is a NodeDown (on_down), the first advert of a
connection a NodeUp (on_up). It sends to and requests from Go actors' PIDs
and runs named Python handlers; a handler answers a request by returning
a value. Tensors ride inline in the tensor table (at most the inline
threshold each); larger ones go through staging: this node fetches Go's
exports (releasing each lease once fetched, within its receive budget and
fetch deadline) and serves its own on its data address, lent until the
fetcher releases them. CUDA tensors move over ipc (ipc.py: CUDA IPC
handles both ways, the Go channel's protocol) with Go nodes of this host
when both ends run it. A tensor.Ref field arrives as a Ref, fetched only
when its holder calls fetch (from any thread, on a data connection of its
own), else released (release, a with block, Node.stop, or its owner's
lease deadline); Ref(tensor) sends one.

With discovery (membership="mesh" and the config's discovery section,
{"etcd": {"endpoints": [...], "prefix", "lease_ttl", "dial_timeout"}}),
the node joins by etcd as the Go nodes do (discovery.py): start registers
it under {prefix}{cluster}/nodes/{name} with a lease kept alive, and the
nodes registered there become its peers (dialed, admitted); one whose
registration goes (it left, or its lease expired) is a NodeDown and is
no longer admitted; stop marks the registration leaving and revokes it.
peers may then be empty.

Gossip membership is not spoken, and cannot be with the standard library:
the Go nodes' gossip is encrypted with AES-GCM. The node joins a gossip
cluster (membership "gossip", or more than 16 nodes with membership left
out) as a mesh-only member: its entry in the config says mesh_only: true,
and Node() gets mesh_only=True; the Go nodes keep a mesh connection to it
(membership.py); with a discovery section it registers itself mesh_only
(under any membership: it never gossips), so that the Go nodes that find
it in etcd do the same. Node() raises
ValueError, saying so, for a gossip config without mesh_only=True
(membership "gossip", more than 16 nodes, or a discovery section with
membership left out, which Go resolves to gossip).

With tls (the cluster's tls block: cert_file, key_file, ca_file, data),
control connections run over TLS 1.3 under the HMAC handshake, and data
connections too with data, as the Go nodes do (config/tls.go): each end
presents its certificate and requires the other's to chain to ca_file
(for its use: client or server), and host names are not checked, the
HMAC handshake names the node. tls.py holds the TLS side.

Every byte from a peer is hostile: frame lengths are bounded before
anything is read for them, bodies are decoded by codec.decode, and a bad
frame costs only its connection.
"""

import hmac
import hashlib
import itertools
import os
import queue
import socket
import struct
import threading
import time
import weakref

from .codec import BadBody, Struct, decode, encode, split_array
from . import cuda as _cuda, ipc as _ipc, membership as _membership, staging, tls as _tls
from . import discovery as _discovery
from .message import (DTYPES, DTYPE_SIZE, MAX_DIMS, BadTable, InlineTensor, RefEntry, SER_MSGPACK,
                      decode_body, decode_envelope, decode_table, encode_body,
                      encode_envelope, encode_table)

PROTOCOL_VERSION = 2
NONCE_SIZE = 32
HEADER = struct.Struct(">IBBHI")
HANDSHAKE_MAX_FRAME = 4 << 10
MAX_NAME = 255
HANDSHAKE_TIMEOUT = 5.0  # seconds for a connection's TLS and HMAC handshakes, each
MAX_IDLE_DATA = 4  # idle data connections kept per peer for requesters' fetches
LABEL_I = b"tensorferry initiator v1"
LABEL_A = b"tensorferry acceptor v1"

F_HELLO, F_CHALLENGE, F_AUTH, F_WELCOME, F_MESSAGE, F_SYSTEM, F_PING, F_PONG, \
    F_GOAWAY, F_ERROR = range(1, 11)
F_RELEASE, F_CAPS, F_MESSAGES = 14, 15, 16
MAX_BATCH_MESSAGES = 1024  # wire.MaxBatchMessages
SYS_DEADLETTER = 6
CODE_PROTOCOL, CODE_AUTH, CODE_NOT_FOUND, CODE_SHUTDOWN = 1, 4, 7, 13  # wire.ErrCode

CTL_REQUEST, CTL_REPLY = "$tensorferry.ctl", "$tensorferry.ctlreply"  # transfer's control messages

REPLY_PREFIX = "future#"
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


class TensorferryError(Exception):
    """A failure of the Python node (connection, handshake, request)."""


class DeadLetter(TensorferryError):
    """The target of a request does not exist or could not be reached."""


class Message:
    """A registered message name and its fields, in the Go struct's order."""

    __slots__ = ("name", "fields", "sender")

    def __init__(self, name, fields=None, sender=None):
        self.name, self.fields, self.sender = name, dict(fields or {}), sender

    def __getitem__(self, k):
        return self.fields[k]

    def __repr__(self):
        return "Message(%r, %r)" % (self.name, self.fields)


def reply_id(key):
    s = ""
    while True:
        s = _DIGITS[key % 36] + s
        key //= 36
        if key == 0:
            return REPLY_PREFIX + s


def reply_key(ident):
    if not ident.startswith(REPLY_PREFIX):
        return None
    tail = ident[len(REPLY_PREFIX):].lstrip("0") or "0"
    if len(tail) > 13 or any(c not in _DIGITS for c in tail):
        return None
    k = int(tail, 36)
    return k if k < 1 << 64 else None


def _mac(secret, label, version, cluster, purpose, nonce_i, nonce_a, node_i, inc_i,
         node_a=None, inc_a=None):
    m = hmac.new(secret, digestmod=hashlib.sha256)

    def field(b):
        m.update(len(b).to_bytes(4, "big"))
        m.update(b)

    field(label)
    m.update(version.to_bytes(8, "big"))
    field(cluster.encode())
    field(purpose.encode())
    field(nonce_i)
    field(nonce_a)
    field(node_i.encode())
    m.update(inc_i.to_bytes(8, "big"))
    if node_a is not None:
        field(node_a.encode())
        m.update(inc_a.to_bytes(8, "big"))
    return m.digest()


def tensor_to_inline(t, copy=True):
    """The InlineTensor of a torch.Tensor (copied to host memory). With
    copy=False the bytes of a contiguous CPU tensor are a view of its
    memory, not a copy: the node lends them that way, as it lends a CUDA
    tensor over ipc."""
    import torch
    name = str(t.dtype).replace("torch.", "")
    if name not in DTYPES:
        raise TypeError("tensorferry: dtype %s has no tensorferry equivalent" % t.dtype)
    flat = t.detach().contiguous().cpu().reshape(-1)
    if not flat.numel():
        data = b""
    elif copy:
        data = flat.view(torch.uint8).numpy().tobytes()
    else:
        data = memoryview(flat.view(torch.uint8).numpy()).cast("B")
    return InlineTensor(DTYPES[name], tuple(t.shape), data)


_TORCH_OF = {}


def inline_to_tensor(x):
    """A torch.Tensor holding a copy of an InlineTensor's bytes."""
    import torch
    if not _TORCH_OF:
        for name, n in DTYPES.items():
            _TORCH_OF[n] = getattr(torch, name)
    dt = _TORCH_OF[x.dtype]
    if not x.data:
        return torch.empty(x.shape, dtype=dt)
    return torch.frombuffer(bytearray(x.data), dtype=torch.uint8).view(dt).reshape(x.shape)


class _DeviceTensor:
    """A CUDA tensor of an outgoing message that goes over ipc."""

    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


class _DeviceExport:
    """A CUDA tensor lent to a peer: its ipc offer, and its bytes in host
    memory, copied the first time a fetcher asks for them over staging."""

    __slots__ = ("t", "ipc_offer", "nbytes", "_host", "via")

    def __init__(self, t, offer, nbytes=None):
        self.t, self.ipc_offer, self._host, self.via = t, offer, None, None
        self.nbytes = t.numel() * t.element_size() if nbytes is None else nbytes

    def host(self):
        if self._host is None:
            import torch
            self._host = memoryview(self.t.reshape(-1).view(torch.uint8).cpu().numpy()).cast("B")
        return self._host


def _nbytes(x):
    return x.nbytes if isinstance(x, _DeviceExport) else len(x)


def _dev_to_tensor(buf, dtype, shape):
    """A torch tensor of a message from the uint8 CUDA buffer fetched for
    it (the buffer itself for a vector of bytes: no torch call)."""
    if dtype == _UINT8 and len(shape) == 1:
        return buf
    return buf.view(_torch_dtype(dtype)).reshape(shape)


class RefSpent(TensorferryError):
    """A Ref fetched or released already is fetched again."""


class Ref(RefEntry):
    """A lazily fetched tensor: a Go tensor.Ref field.

    A received message's tensor.Ref field arrives as a Ref that holds only
    the owner's descriptor: nothing moves until fetch, which copies the
    tensor once and gives the owner its lease back; release gives it back
    without fetching (again: nothing). Use it as a context manager to
    release on exit what was not fetched:

        with msg["W"] as w:
            if wanted:
                x = w.fetch("cuda:0")

    A Ref neither fetched nor released holds the owner's tensor until the
    owner's lease runs out (its flow.ref_ttl, 10 minutes by default) or
    this node stops (Node.stop releases it). Fetch it from any thread, also
    after the handler returned, but not from an inline handler (Node.handle):
    the fetch waits for answers its connection's reader must read.

    Ref(tensor) in a message's fields sends a torch.Tensor lazily: it is
    lent (exported, never inline) until the receiver fetches or releases
    it, as Go's tensor.NewRef. fetch on such a Ref returns a copy. A
    received Ref put into a message is forwarded: its receiver fetches
    from the owner, and this Ref is spent (unlike Go's Forward, which
    leaves it to be fetched too).
    """

    __slots__ = ("_node", "_desc", "_local", "_mu", "_spent", "__weakref__")

    def __init__(self, tensor):
        import torch
        if not isinstance(tensor, torch.Tensor):
            raise TypeError("tensorferry: Ref of a %s, not a torch.Tensor" % type(tensor).__name__)
        self._node, self._desc, self._local = None, None, tensor
        self._mu, self._spent = threading.Lock(), False

    @classmethod
    def _received(cls, node, desc):
        r = cls.__new__(cls)
        r._node, r._desc, r._local = node, desc, None
        r._mu, r._spent = threading.Lock(), False
        return r

    @property
    def owner(self):
        """The name of the node that owns the tensor (None: this one's)."""
        return None if self._desc is None else self._desc["o"]

    @property
    def nbytes(self):
        return self._local.numel() * self._local.element_size() if self._desc is None else self._desc["b"]

    @property
    def dtype(self):
        """The tensor's torch dtype."""
        return self._local.dtype if self._desc is None else _torch_dtype(self._desc["t"])

    @property
    def shape(self):
        import torch
        return self._local.shape if self._desc is None else torch.Size(self._desc["s"])

    @property
    def spent(self):
        """Whether the Ref was fetched or released."""
        return self._spent

    def fetch(self, device=None, timeout=None):
        """The tensor, copied from its owner once: over ipc when the owner
        offers it on this host and device is CUDA (None: as a message's
        tensor field arrives, on the node's device over ipc, else in host
        memory), else through staging into host memory, then moved to
        device when given. The lease goes back whether the fetch worked or
        not; a second fetch raises RefSpent. timeout (seconds, default the
        node's fetch_timeout) bounds the copy. A tensor above the node's
        receive budget is refused, as Go's Ref.Fetch does."""
        if self._desc is None:
            return self._local.detach().clone() if device is None else self._local.detach().to(device, copy=True)
        with self._mu:
            if self._spent:
                raise RefSpent("tensorferry: Ref %s already fetched or released" % self._name())
            self._spent = True
        try:
            return self._node._fetch_ref(self._desc, device, timeout)
        finally:
            self._node._release_ref(self)

    def _forward(self):
        """The descriptor to send this received Ref on with: the lease is
        the receiver's from then on, so this Ref is spent (not released
        here, nor on stop)."""
        with self._mu:
            if self._spent:
                raise RefSpent("tensorferry: Ref %s already fetched or released: cannot forward" % self._name())
            self._spent = True
        with self._node.mu:
            self._node.refs.discard(self)
        return self._desc

    def _unforward(self):
        """Undo _forward: the message that forwarded it was not sent."""
        with self._mu:
            self._spent = False
        with self._node.mu:
            self._node.refs.add(self)

    def release(self):
        """Give the owner its lease back without fetching; nothing once
        the Ref was fetched or released."""
        if self._desc is None:
            return
        with self._mu:
            if self._spent:
                return
            self._spent = True
        self._node._release_ref(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def _name(self):
        d = self._desc
        return "%s#%d/%d" % (d["o"], d["i"], d["e"]) if d is not None else "(local)"

    def __repr__(self):
        if self._desc is None:
            return "Ref(local %s%s)" % (self._local.dtype, list(self._local.shape))
        return "Ref(%s %s%s, %d bytes%s)" % (self._name(), self.dtype, self._desc["s"], self.nbytes,
                                           ", spent" if self._spent else "")


_NUMBER_OF = {}
_UINT8 = DTYPES["uint8"]


def _dtype_number(dtype):
    """The tensorferry dtype number of a torch dtype (TypeError for one
    with no equivalent)."""
    n = _NUMBER_OF.get(dtype)
    if n is None:
        name = str(dtype).replace("torch.", "")
        if name not in DTYPES:
            raise TypeError("tensorferry: dtype %s has no tensorferry equivalent" % dtype)
        n = _NUMBER_OF[dtype] = DTYPES[name]
    return n


def _torch_dtype(n):
    import torch
    if not _TORCH_OF:
        for name, k in DTYPES.items():
            _TORCH_OF[k] = getattr(torch, name)
    return _TORCH_OF[n]


class _Inbox:
    """A bounded FIFO between the connections' readers and the dispatch
    thread. A queue.SimpleQueue (its put and get are C, the get waits
    without the GIL) and a semaphore counting free places: a handoff costs
    a lock release and acquire, not queue.Queue's Python conditions."""

    def __init__(self, maxsize):
        self.q = queue.SimpleQueue()
        self.free = threading.BoundedSemaphore(maxsize)
        self.mu = threading.Lock()
        self.pending = 0  # put and not yet done, under mu

    def put(self, item, timeout=None):
        """Append item, waiting for a free place (raise queue.Full after
        timeout seconds when given)."""
        if not self.free.acquire(timeout=timeout):
            raise queue.Full
        with self.mu:
            self.pending += 1
        self.q.put(item)

    def done(self):
        """The dispatch thread is done with an item it got."""
        with self.mu:
            self.pending -= 1

    def idle(self):
        """Whether every item put was got and done."""
        with self.mu:
            return self.pending == 0

    def get(self):
        item = self.q.get()
        self.free.release()
        return item


class _Reply:
    """Where a request's answer lands: a lock held until it does (a C
    lock's release wakes the requester without Python conditions)."""

    __slots__ = ("lock", "value")

    def __init__(self):
        self.lock = threading.Lock()
        self.lock.acquire()
        self.value = None

    def set(self, v):
        """Hand v to the waiter; called once, by whoever popped it from
        Node.pending."""
        self.value = v
        self.lock.release()

    def wait(self, timeout):
        return self.lock.acquire(timeout=timeout)


class _FetchReply:
    """A reply whose tensors its requester fetches: (conn, envelope,
    table, fetches), handed over by the reader."""

    __slots__ = ("args",)

    def __init__(self, args):
        self.args = args


class _Conn:
    """One authenticated control connection to a Go node."""

    def __init__(self, node, sock, peer, inc, max_frame):
        self.node, self.sock, self.peer, self.inc = node, sock, peer, inc
        self.max_frame = max_frame
        self.wlock = threading.Lock()
        self.closed = False
        self.last_heard = time.monotonic()
        self.caps = None
        self.initiator = None  # the node that dialed it

    def send(self, ftype, body, stream=0):
        b = body if isinstance(body, (bytes, bytearray)) else bytes(encode(body))
        if len(b) > self.max_frame:
            raise TensorferryError("tensorferry: frame of %d bytes above the maximum %d"
                                   % (len(b), self.max_frame))
        frame = HEADER.pack(len(b), ftype, 0, 0, stream) + b
        corked = getattr(self.node._tl, "cork", None)
        if corked is not None:  # this thread's frames go out together (Node._run)
            corked.setdefault(self, []).append(frame)
            return
        self.write(frame)

    def write(self, frames):
        """Write whole frames (bytes) to the connection."""
        with self.wlock:
            if self.closed:
                raise TensorferryError("tensorferry: connection to %s closed" % self.peer)
            self.sock.sendall(frames)

    def close(self, why):
        with self.wlock:
            if self.closed:
                return
            self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.node._conn_closed(self, why)


def read_frame_byte(sock):
    b = sock.recv(1)
    if not b:
        raise TensorferryError("tensorferry: connection closed by the peer")
    return b[0]


def _read_exact(sock, n):
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise TensorferryError("tensorferry: connection closed by the peer")
        got += k
    return bytes(buf)


def read_frame(sock, max_frame):
    """Read one frame: (type, flags, stream, body). The length is checked
    against max_frame before the body is read."""
    n, ftype, flags, reserved, stream = HEADER.unpack(_read_exact(sock, HEADER.size))
    if reserved != 0:
        raise BadBody("tensorferry: frame header's reserved bits set")
    if n > max_frame:
        raise BadBody("tensorferry: frame of %d bytes above the maximum %d" % (n, max_frame))
    return ftype, flags, stream, _read_exact(sock, n) if n else b""


class FrameReader:
    """Frames of a connection read through a buffer: one recv brings a
    frame's header and body (often the frames behind it too), where
    read_frame takes a recv for each and copies the body once more. The
    same checks as read_frame: a length is checked against max_frame
    before anything is read for it; a body larger than the buffer is read
    into a bytearray of its checked length."""

    SIZE = 256 << 10

    def __init__(self, sock, max_frame):
        self.sock, self.max_frame = sock, max_frame
        self.buf = bytearray(self.SIZE)
        self.view = memoryview(self.buf)
        self.start = self.end = 0

    def _fill(self, want):
        """Read until want bytes past start are buffered (want <= SIZE)."""
        if self.start + want > self.SIZE:  # move what is left to the front
            n = self.end - self.start
            self.buf[:n] = self.view[self.start:self.end]
            self.start, self.end = 0, n
        while self.end - self.start < want:
            k = self.sock.recv_into(self.view[self.end:], self.SIZE - self.end)
            if k == 0:
                raise TensorferryError("tensorferry: connection closed by the peer")
            self.end += k

    def read(self):
        """The next frame: (type, flags, stream, body)."""
        if self.end - self.start < HEADER.size:
            self._fill(HEADER.size)
        n, ftype, flags, reserved, stream = HEADER.unpack_from(self.buf, self.start)
        if reserved != 0:
            raise BadBody("tensorferry: frame header's reserved bits set")
        if n > self.max_frame:
            raise BadBody("tensorferry: frame of %d bytes above the maximum %d" % (n, self.max_frame))
        self.start += HEADER.size
        if n <= self.SIZE:
            if self.end - self.start < n:
                self._fill(n)
            body = bytes(self.view[self.start:self.start + n])
            self.start += n
        else:
            have = self.end - self.start
            big = bytearray(n)
            big[:have] = self.view[self.start:self.end]
            self.start = self.end = 0
            view = memoryview(big)
            while have < n:
                k = self.sock.recv_into(view[have:], n - have)
                if k == 0:
                    raise TensorferryError("tensorferry: connection closed by the peer")
                have += k
            body = bytes(big)
        if self.start == self.end:
            self.start = self.end = 0
        return ftype, flags, stream, body


class Recent(list):
    """An append-only record that keeps only its last KEEP entries, so that
    a node that runs for days (or a peer that sends bad input forever) does
    not grow it without bound. len() counts every entry ever appended and
    a slice [n:] starts at entry n of that whole count, so that "len
    before, the entries since" keeps working; everything else (indexing
    from the end, iteration, equality, json) sees the entries kept."""

    KEEP = 4096

    def __init__(self, *args):
        super().__init__(*args)
        self.dropped = 0

    def append(self, x):
        super().append(x)
        if super().__len__() > 2 * self.KEEP:
            n = super().__len__() - self.KEEP
            del self[:n]
            self.dropped += n

    def __len__(self):
        return self.dropped + super().__len__()

    def __getitem__(self, k):
        if isinstance(k, slice) and k.step is None and k.stop is None and (k.start or 0) >= 0:
            return list.__getitem__(self, slice(max((k.start or 0) - self.dropped, 0), None))
        return list.__getitem__(self, k)

class Node:
    """A Python node of a cluster's config.

    cluster, secret (bytes), name and address (host:port) as in the config;
    peers maps the other nodes' names to addresses (only nodes in it are
    admitted). on_up(name, incarnation) and on_down(name, why) are called
    from the node's threads.

    ipc (default True) runs the ipc channel when torch sees a GPU and the
    CUDA driver loads: CUDA tensors then move to and from Go nodes of this
    host through CUDA IPC (ipc_status says why not otherwise). device is
    where tensors fetched over ipc land (default: torch's current CUDA
    device). inline_device (default False), like Go's
    transport.inline_device, sends CUDA tensors at most inline_threshold
    bytes inline rather than over ipc.

    ref_ttl (seconds, default 600 as Go's flow.ref_ttl) is how long a
    tensor sent in a Ref (tensorferry.Ref(tensor)) stays lent when the
    receiver neither fetches nor releases it.

    tls (default None: plain TCP) is the cluster's tls block, a dict or an
    object with cert_file, key_file and ca_file (PEM paths) and data
    (default False): control connections, and data connections with data,
    then run over TLS 1.3 with certificates on both ends, as the Go nodes'.

    dial_timeout (default 2.0), reconnect_min (0.1) and reconnect_max
    (5.0), in seconds, are the config's: how long one dial and handshake
    of a peer's control connection may take, and the backoff between
    redials. membership and discovery are the config's membership key and
    discovery section: the node runs the mesh (membership None, "" or
    "mesh" with at most 16 nodes, no discovery; or "mesh" with discovery)
    and raises ValueError, saying why, for a config that runs gossip
    (membership.py), unless mesh_only (default False) says this node's
    entry in the config is marked mesh_only: then it joins a gossip
    cluster, with or without discovery, as a mesh member of every node.

    discovery (default None) is the config's discovery section, a dict:
    {"etcd": {"endpoints": ["http://10.0.0.9:2379"], "prefix":
    "/tensorferry/", "lease_ttl": 10, "dial_timeout": 2}} (durations in
    seconds or as "10s"; Go's defaults). start then registers this node in
    etcd (its name, address, data_address and devices) and takes the nodes
    registered there as peers besides those of peers; a node whose
    registration goes is a NodeDown. Troubles with etcd and registrations
    skipped as invalid are recorded in errors; start raises EtcdError when
    etcd cannot register it (unreachable, or the name held by a live
    process). Give it a data_address: one left out is announced as the
    control port + 100 (Go's default), where nothing listens.

    """

    def __init__(self, cluster, secret, name, address, peers, incarnation=None,
                 heartbeat_interval=1.0, failure_timeout=5.0, inline_threshold=64 << 10,
                 max_frame_size=16 << 20, receive_budget=1 << 30, fetch_timeout=60.0,
                 data_address=None, inbox_messages=4096, on_up=None, on_down=None,
                 ipc=True, device=None, inline_device=False, shm_dir=None, ref_ttl=600.0, tls=None,
                 dial_timeout=2.0, reconnect_min=0.1, reconnect_max=5.0, membership=None, discovery=None,
                 mesh_only=False):
        _membership.check_membership(membership, discovery, len(peers) + (name not in peers), mesh_only)
        if isinstance(secret, str):
            secret = secret.encode()
        if len(secret) < 16:
            raise ValueError("tensorferry: secret must have at least 16 bytes")
        self.cluster, self.secret, self.name = cluster, secret, name
        self.address = address
        # peers: name → address, or name → {"address", "data_address"}.
        self.peers = {k: v if isinstance(v, dict) else {"address": v} for k, v in peers.items()}
        self.receive_budget, self.fetch_timeout = receive_budget, fetch_timeout
        self._leases = []  # random leases fetched ahead (_lease), under mu
        self.data_address = data_address
        self.tls_server, self.tls_client, self.tls_data = _tls.contexts(tls) if tls else (None, None, False)
        self.exports = {}  # export id → [lease, bytes, peer]: lent until released
        self.export_ids = itertools.count(1)
        self.data_conns = {}  # peer → (socket, stream counter): used by the dispatch thread only
        # peer → idle [socket, stream counter] of requesters' fetches
        # (at most MAX_IDLE_DATA each), under mu.
        self.idle_data = {}
        self.incarnation = incarnation or time.time_ns()
        self.heartbeat, self.failure_timeout = heartbeat_interval, failure_timeout
        self.inline_threshold, self.max_frame = inline_threshold, max_frame_size
        self.on_up, self.on_down = on_up, on_down
        self.handlers = {}
        self.inline = set()  # handler names that may run on a reader (handle)
        # Held while a handler's message is fetched and handled: by the
        # dispatch thread for each item, by a reader running an inline one.
        self.handler_mu = threading.Lock()
        self.conns = {}
        self.mu = threading.Lock()
        self.up_cv = threading.Condition(self.mu)
        self.pending = {}
        self.keys = itertools.count(1)
        self.stopped = threading.Event()
        # Bounded: a peer that sends faster than the handlers run is held
        # back by its connection (the reader waits), not by this
        # process's memory.
        self.inbox = _Inbox(inbox_messages)
        self.errors = Recent()  # bad input seen, for tests and logs
        self.transfers = Recent()  # (channel, peer, bytes) of every fetch
        self.served = Recent()  # (channel, peer, bytes) of every fetch of this node's exports
        # Received Refs not fetched nor released yet (released on stop),
        # weakly: one dropped unspent is the owner's until its lease ends.
        self.refs = weakref.WeakSet()
        self.ref_ttl = ref_ttl
        self.ref_deadlines = {}  # export id of a Ref sent → when its lease ends (monotonic), under mu
        self._tl = threading.local()  # .inline: running an inline handler on a reader
        self.served_cv = threading.Condition(self.mu)
        self.threads = []
        self.sock = None
        self.warnings = Recent()  # what was done another way than asked, and why
        self.ctl_ids = itertools.count(1)
        self.ctl_pending = {}  # control request id → (peer, event, [reply bytes or error])
        self.inline_device = inline_device
        self.host_id = _ipc.host_id()
        self.ipc_owner = self.ipc_fetcher = None
        self.devices, self.p2p = [], []
        self.device = None
        drv, why = _cuda.available() if ipc else (None, "disabled by the Python node's ipc=False")
        shm = shm_dir or _ipc.SHM_DIR
        if drv is not None and not os.path.isdir(shm):
            drv, why = None, "no shared memory directory %s for the same-host proof" % shm
        if drv is not None:
            try:
                self._gpu_caps(drv, device)
            except (_cuda.CudaError, RuntimeError) as e:
                drv, why = None, str(e)
        self.ipc_status = why
        self.mesh = _membership.Mesh(self, dial_timeout, reconnect_min, reconnect_max)
        self.discovery = _discovery.Etcd(discovery, cluster, self.errors) if discovery is not None else None
        if drv is not None:
            self.ipc_owner = _ipc.Owner(drv, self._lookup_export, self.incarnation, shm_dir=shm,
                                        served=self._ipc_served)
            self.ipc_fetcher = _ipc.Fetcher(drv, self.name, self._ctl_call, self._ctl_send, shm_dir=shm)

    # -- lifecycle ---------------------------------------------------------

    def handle(self, name, fn, inline=False):
        """Run fn(Message) for messages to the actor id name; its return
        value (a Message, or None) answers a request.

        Handlers run one at a time, in the order their messages arrived
        from each peer, on the node's dispatch thread. inline=True lets
        fn run on the connection's reader thread instead when nothing else
        is queued or running and each of the message's tensors is inline or
        comes over ipc under a direct offer (a device copy, no round trip):
        one thread hand-off less per message (the node's ipc device is the
        current CUDA device there). Such a handler must not wait
        for this node's messages (no request, no blocking on other
        handlers), since the reader that would read them is running it."""
        self.handlers[name] = fn
        if inline:
            self.inline.add(name)
        else:
            self.inline.discard(name)

    def start(self):
        host, port = self.address.rsplit(":", 1)
        self.sock = socket.create_server((host, int(port)))
        loops = [self._accept_loop, self._heartbeat_loop, self._dispatch_loop]
        if self.data_address:
            host, port = self.data_address.rsplit(":", 1)
            self.data_sock = socket.create_server((host, int(port)))
            loops.append(self._data_accept_loop)
        for fn in loops:
            t = threading.Thread(target=fn, daemon=True, name="tensorferry-" + fn.__name__)
            t.start()
            self.threads.append(t)
        self.mesh.start()
        if self.discovery is not None:
            devices = [d["d"] for d in self.devices] or ["cpu"]
            # Registered mesh_only, as a Python node never gossips: under
            # gossip the Go nodes keep a mesh connection to it; under the
            # mesh it changes nothing, and no gossip address is derived.
            me = {"name": self.name, "address": self.address, "data_address": self.data_address, "devices": devices,
                  "mesh_only": True}
            try:
                self.discovery.start(me, self._discovered)
            except BaseException:
                self.stop()
                raise
        return self

    def _discovered(self, kind, node, reason):
        """An event of the discovery: a node joined (a peer to dial and
        admit) or left (its connection closed: a NodeDown)."""
        if kind == "joined":
            self.mesh.add_peer(node["name"], {"address": node["address"], "data_address": node["data_address"]})
        elif reason != _discovery.REASON_CHANGED:  # else a joined with the new addresses follows
            self.mesh.remove_peer(node["name"], "discovery: " + reason)

    def stop(self):
        if self.discovery is not None:
            # First: the others see this node leave, not its lease expire.
            self.discovery.stop()
        with self.mu:
            self.stopped.set()
            self.up_cv.notify_all()  # the dialers stop
        for s in (self.sock, getattr(self, "data_sock", None)):
            if s is None:
                continue
            # A listener whose accept loop is blocked in accept stays
            # listening after close until that accept returns: shutdown
            # wakes it, so that the address is free once stop returns.
            for end in (lambda: s.shutdown(socket.SHUT_RDWR), s.close):
                try:
                    end()
                except OSError:
                    pass
        with self.mu:
            refs = list(self.refs)
        for r in refs:
            r.release()
        with self.mu:
            conns = list(self.conns.values())
        for c in conns:
            try:
                c.send(F_GOAWAY, Struct(c=CODE_SHUTDOWN, r="node %s shutting down" % self.name))
            except Exception:
                pass
            c.close("stopped")
        for side in (self.ipc_owner, self.ipc_fetcher):
            if side is not None:
                side.close()
        try:
            self.inbox.put(None, timeout=1.0)
        except queue.Full:
            pass
        # The node's threads end before stop returns (a dial in flight
        # within its dial timeout): one that ran torch code and ends while
        # the interpreter exits can abort the process.
        me = threading.current_thread()
        end = time.monotonic() + self.mesh.dial_timeout + 1.0
        for t in self.threads:
            if t is not me:
                t.join(max(0.0, end - time.monotonic()))

    def wait_peer(self, name, timeout=10.0):
        """Wait until the named node is up; raise TensorferryError if not in time."""
        end = time.monotonic() + timeout
        with self.mu:
            while name not in self.conns or self.conns[name].caps is None:
                left = end - time.monotonic()
                if left <= 0:
                    raise TensorferryError("tensorferry: node %s not up after %.1fs" % (name, timeout))
                self.up_cv.wait(left)

    # -- connections -------------------------------------------------------

    def _accept_loop(self):
        while not self.stopped.is_set():
            try:
                s, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _secure(self, s, data, server):
        """s wrapped in TLS when this node's tls asks for it on connections
        of this kind (data or control), as the accepting end (server) or the
        dialing one (Go's cluster.secure); else s. The caller closes what
        this returns, then _tls_handshake runs the handshake."""
        ctx = self.tls_server if server else self.tls_client
        if ctx is None or (data and not self.tls_data):
            return s
        return _tls.TLSSocket(s, ctx, server)

    @staticmethod
    def _tls_handshake(s):
        """The TLS handshake of s (from _secure) within HANDSHAKE_TIMEOUT;
        nothing for a plain socket."""
        if not isinstance(s, _tls.TLSSocket):
            return
        try:
            where = "%s:%s" % s.getpeername()[:2]
        except OSError:
            where = "a peer"
        try:
            s.handshake(HANDSHAKE_TIMEOUT)
        except OSError as e:  # ssl.SSLError among them
            raise TensorferryError("tensorferry: tls handshake with %s (TLS 1.3 with a certificate of "
                                   "the cluster's CA wanted): %s" % (where, e)) from e

    def _handshake(self, s, want_purpose="control"):
        s.settimeout(HANDSHAKE_TIMEOUT)
        ftype, _, stream, body = read_frame(s, HANDSHAKE_MAX_FRAME)
        if ftype != F_HELLO or stream != 0:
            raise BadBody("tensorferry: handshake: frame %d, want HELLO" % ftype)
        hello = decode(body)
        if not isinstance(hello, dict) or hello.get("v") != PROTOCOL_VERSION:
            raise TensorferryError("tensorferry: handshake: initiator speaks version %r, want %d"
                                   % (hello.get("v") if isinstance(hello, dict) else None,
                                      PROTOCOL_VERSION))
        purpose, nonce_i, cluster = hello.get("p"), hello.get("n"), hello.get("c", "")
        if purpose != want_purpose:
            raise TensorferryError("tensorferry: handshake: purpose %r not accepted" % (purpose,))
        if not isinstance(nonce_i, bytes) or len(nonce_i) != NONCE_SIZE:
            raise BadBody("tensorferry: handshake: bad hello nonce")
        nonce_a = os.urandom(NONCE_SIZE)
        s.sendall(self._frame(F_CHALLENGE, Struct(v=PROTOCOL_VERSION, n=nonce_a)))
        ftype, _, stream, body = read_frame(s, HANDSHAKE_MAX_FRAME)
        if ftype != F_AUTH or stream != 0:
            raise BadBody("tensorferry: handshake: frame %d, want AUTH" % ftype)
        auth = decode(body)
        if not isinstance(auth, dict):
            raise BadBody("tensorferry: handshake: auth is not a map")
        node, inc, mac = auth.get("n"), auth.get("i", 0), auth.get("m")
        if not isinstance(node, str) or not 0 < len(node.encode()) <= MAX_NAME or \
                type(inc) is not int or not 0 <= inc < 1 << 64 or not isinstance(mac, bytes):
            raise BadBody("tensorferry: handshake: auth names no valid node")
        want = _mac(self.secret, LABEL_I, PROTOCOL_VERSION, self.cluster, purpose, nonce_i,
                    nonce_a, node, inc)
        if not hmac.compare_digest(mac, want) or cluster != self.cluster:
            s.sendall(self._frame(F_GOAWAY, Struct(c=CODE_AUTH, r="authentication failed")))
            raise TensorferryError("tensorferry: handshake: initiator's proof is wrong")
        if node not in self.peers or node == self.name:
            if self.discovery is not None and node != self.name:
                # Maybe registered in etcd and not seen here yet: to retry.
                s.sendall(self._frame(F_GOAWAY, Struct(c=_membership.CODE_UNAVAILABLE,
                                                       r="node %r not announced at %s yet" % (node, self.name))))
                raise _membership.Refused("node %r is not in the config nor announced by discovery" % node)
            s.sendall(self._frame(F_GOAWAY, Struct(c=CODE_NOT_FOUND, r="node %r not in the config" % node)))
            raise TensorferryError("tensorferry: handshake: node %r is not in the config" % node)
        if want_purpose == "control":
            try:
                with self.mu:
                    if self.stopped.is_set():
                        raise _membership.Refused("node %s shutting down" % self.name)
                    self.mesh.admit(node, inc)
            except _membership.Refused as e:
                code = CODE_SHUTDOWN if self.stopped.is_set() else _membership.CODE_UNAVAILABLE
                s.sendall(self._frame(F_GOAWAY, Struct(c=code, r=str(e))))
                raise
        mac_a = _mac(self.secret, LABEL_A, PROTOCOL_VERSION, self.cluster, purpose, nonce_i,
                     nonce_a, node, inc, self.name, self.incarnation)
        try:
            s.sendall(self._frame(F_WELCOME, Struct(n=self.name, i=self.incarnation, m=mac_a)))
            s.settimeout(None)
        except BaseException:
            if want_purpose == "control":  # admitted: the set-up is over
                with self.mu:
                    self.mesh.done_accepting(node)
            raise
        return node, inc

    @staticmethod
    def _frame(ftype, body, stream=0):
        b = bytes(encode(body))
        return HEADER.pack(len(b), ftype, 0, 0, stream) + b

    def _gpu_caps(self, drv, device):
        """The GPUs this node advertises (every one torch sees), the pairs
        with peer access, and the device ipc fetches land on."""
        import torch
        n = torch.cuda.device_count()
        for i in range(n):
            u, bus = drv.identity(i)
            self.devices.append(Struct(d="cuda:%d" % i, u=u, p=bus))
        for i in range(n):
            for j in range(n):
                if i != j and drv.can_access_peer(i, j):
                    self.p2p.append([self.devices[i]["u"], self.devices[j]["u"]])
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        if dev.type != "cuda" or dev.index is None or not 0 <= dev.index < n:
            raise RuntimeError("tensorferry: device %s is not a CUDA device this process sees" % dev)
        self.device = dev

    def _advert(self):
        if self.ipc_owner is not None:
            caps = Struct(n=self.name, i=self.incarnation, h=self.host_id, g=self.devices, p=self.p2p,
                          c=["staging", "ipc"], x={})
        else:
            caps = Struct(n=self.name, i=self.incarnation, h=self.host_id, c=["staging"],
                          x={"ipc": self.ipc_status})
        return Struct(c=caps, w=0, wb=0)

    def _serve(self, s):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            s = self._secure(s, False, True)
            self._tls_handshake(s)
            peer, inc = self._handshake(s)
        except _membership.Refused as e:  # the mesh's rules: the dialer retries
            self.mesh.note(str(e))
            s.close()
            return
        except (TensorferryError, BadBody, OSError, socket.timeout) as e:
            self.errors.append(str(e))
            s.close()
            return
        except Exception as e:  # a bug, or input nothing above foresaw: this connection only
            self.errors.append("tensorferry: handshake: %r" % e)
            s.close()
            return
        self._run_conn(s, peer, inc, peer)

    def _run_conn(self, s, peer, inc, initiator):
        """Serve the control connection s to peer (incarnation inc),
        handshaken, dialed by initiator: placed as the peer's connection by
        the mesh's rules (membership.py), or closed as a duplicate; then its
        caps sent and its frames read until it closes."""
        self._own_thread_device()
        c = _Conn(self, s, peer, inc, self.max_frame)
        c.initiator = initiator
        try:
            if self.mesh.claims_live(c):
                placed, old = False, "%s: connection from incarnation %d refused: it claims a node whose " \
                    "connection is live" % (peer, inc)
            else:
                with self.mu:
                    placed, old = self.mesh.place(c, initiator)
        finally:
            if initiator == peer:
                with self.mu:
                    self.mesh.done_accepting(peer)
        if not placed:
            self.mesh.note(old)
            c.closed = True
            s.close()
            return
        if old is not None:
            old.close("replaced by a new connection")
        try:
            c.send(F_CAPS, Struct(b=bytes(encode(self._advert()))))
            frames = FrameReader(s, self.max_frame)
            while not c.closed:
                ftype, flags, stream, body = frames.read()
                c.last_heard = time.monotonic()
                self._frame_in(c, ftype, stream, body)
        except Exception as e:  # noqa: BLE001 - _conn_failed sorts them
            self._conn_failed(c, e)

    def _conn_failed(self, c, e):
        """A frame of c could not be read or handled: the connection goes,
        with the reason in errors (a goodbye naming it for bad input)."""
        if isinstance(e, (TensorferryError, BadBody, BadTable, OSError)):
            if not c.closed:
                self.errors.append("%s: %s" % (c.peer, e))
                if isinstance(e, (BadBody, BadTable)):
                    try:
                        c.send(F_GOAWAY, Struct(c=CODE_PROTOCOL, r=str(e)[:200]))
                    except Exception:
                        pass
            c.close(str(e))
        else:  # a bug, or input nothing above foresaw: this connection only
            self.errors.append("%s: frame not handled: %r" % (c.peer, e))
            c.close("frame not handled: %r" % e)

    def _frame_in(self, c, ftype, stream, body):
        if ftype == F_PING:
            p = decode(body) if body else {}
            if not isinstance(p, dict):
                raise BadBody("tensorferry: ping is not a map")
            c.send(F_PONG, Struct((k, p[k]) for k in ("s", "t") if k in p))
        elif ftype in (F_PONG, F_SYSTEM, F_RELEASE, F_ERROR):
            v = decode(body) if body else {}
            if ftype == F_RELEASE and isinstance(v, dict):
                self._released(c, v)
            if ftype == F_SYSTEM and isinstance(v, dict) and v.get("k") == SYS_DEADLETTER:
                self._dead_letter(v)
            if ftype == F_ERROR and isinstance(v, dict):
                self._ctl_error(c, v)
        elif ftype == F_CAPS:
            caps = decode(body)
            if not isinstance(caps, dict):
                raise BadBody("tensorferry: caps is not a map")
            with self.mu:
                first = c.caps is None
                c.caps = caps.get("b", b"")
                c.parsed_caps = None
                self.up_cv.notify_all()
            if first and self.on_up:
                self.on_up(c.peer, c.inc)
        elif ftype == F_MESSAGE:
            self._message_in(c, body)
        elif ftype == F_MESSAGES:
            # Each message's bytes, decoded once (by _message_in).
            for m in split_array(body, MAX_BATCH_MESSAGES):
                self._message_in(c, m)
        elif ftype == F_GOAWAY:
            v = decode(body) if body else {}
            raise TensorferryError("tensorferry: %s said goodbye: %s"
                                   % (c.peer, v.get("r", "") if isinstance(v, dict) else ""))
        elif F_HELLO <= ftype <= F_WELCOME:
            raise BadBody("tensorferry: handshake frame %d after the handshake" % ftype)
        # Unknown frame types are skipped, as the Go side reads them.

    def _message_in(self, c, body):
        env = decode_envelope(body)
        if env["type_name"] in (CTL_REQUEST, CTL_REPLY):
            self._control_in(c, env)
            return
        if env["ser"] != SER_MSGPACK:
            raise BadBody("tensorferry: serializer %d not spoken (msgpack only)" % env["ser"])
        table = decode_table(env["tensors"])
        fetches = [(k, v[1]) for k, v in table.items() if not isinstance(v, InlineTensor) and v[0] == "fetch"]
        refs = [(k, v[1]) for k, v in table.items() if not isinstance(v, InlineTensor) and v[0] == "ref"]
        if fetches or refs:
            total, why = 0, None
            for k, d in fetches + refs:
                oc = c
                if table[k][0] == "ref" and d.get("o") != c.peer:
                    # Forwarded by its sender: the owner must be a node up.
                    with self.mu:
                        oc = self.conns.get(d.get("o")) if isinstance(d.get("o"), str) else None
                    if oc is None or oc.caps is None:
                        why = why or "the owner %r of a forwarded Ref is not up" % (str(d.get("o"))[:64],)
                        continue
                try:
                    n = self._check_descriptor(oc, d)
                except BadTable as e:
                    why = why or str(e)
                    continue
                if table[k][0] == "fetch":
                    total += n  # a Ref's bytes count when it is fetched, as in Go
            if why is None and total > self.receive_budget:
                why = "tensors of %d bytes above the receive budget %d" % (total, self.receive_budget)
            if why is not None:
                # Refused: its leases go back, the connection stays.
                self.errors.append("%s: message %s refused: %s" % (c.peer, env["type_name"], why))
                self._release_all(c, [d for _, d in fetches])
                for _, d in refs:
                    self._release_desc(d)
                self._send_dead_letter(c, env, why)
                return
            if refs:
                with self.mu:
                    for k, d in refs:
                        table[k] = Ref._received(self, d)
                        self.refs.add(table[k])
        if fetches:
            key = env["request"] if env["request"] and not env["target"] else reply_key(env["target"])
            if key is not None:
                # A reply: its requester fetches it, on its own thread
                # (which waits for it anyway; it may be a handler holding
                # the dispatch thread), with no thread started for it.
                with self.mu:
                    w = self.pending.pop(key, None)
                if w is None:  # nobody waits for it (any more)
                    self._release_all(c, [d for _, d in fetches])
                    self._drop_refs(table)
                else:
                    w.set(_FetchReply((c, env, table, fetches)))
            elif refs or not self._inline(c, env, table, fetches):
                self.inbox.put(("fetch", (c, env, table, fetches)))
            return
        if env["request"] and not env["target"] or reply_key(env["target"]) is not None \
                or refs or not self._inline(c, env, table, []):
            self._deliver(c, env, table)

    def _inline(self, c, env, table, fetches):
        """Fetch and handle a message to an inline handler here, on the
        connection's reader (Node.handle), when the dispatch thread has
        nothing queued or running and every fetch is an ipc copy under a
        direct offer; False, with nothing delivered and every lease still
        held, otherwise (the caller queues it as usual). Never called for a
        message with Refs: its handler may fetch them."""
        if env["target"] not in self.inline or not self.handler_mu.acquire(blocking=False):
            return False
        try:
            if not self.inbox.idle():
                return False
            bufs = []
            for k, d in fetches:
                if not (d["b"] and self._ipc_from(c, d)):
                    return False
                import torch
                buf = torch.empty(d["b"], dtype=torch.uint8, device=self.device)
                try:
                    if not self.ipc_fetcher.fetch_direct(d, buf):
                        return False
                except (_ipc.IPCError, _cuda.CudaError, RuntimeError):
                    return False  # the dispatch thread fetches it again, and says why it fails
                bufs.append((k, d, buf))
            for k, d, buf in bufs:
                table[k] = _dev_to_tensor(buf, d["t"], d["s"])
            moved = {"ipc": sum(d["b"] for _, d, _ in bufs)} if bufs else {}
            self._tl.inline = True  # no Ref fetch on the reader (Ref.fetch)
            try:
                self._deliver_fetched(c, env, table, [d for _, d, _ in bufs], moved)
            finally:
                self._tl.inline = False
            return True
        finally:
            self.handler_mu.release()

    # -- channel control (transfer's "$tensorferry.ctl" messages) ----------

    def _control_in(self, c, env):
        """A control request of a peer's channel (answered here, on the
        connection's reader: the ipc owner never blocks on the peer), or
        the reply to one of this node's."""
        rid = env["request"]
        if env["type_name"] == CTL_REPLY:
            with self.mu:
                w = self.ctl_pending.get(rid)
            if w is not None and w[0] == c.peer and not w[1].is_set():
                w[2].append(env["body"])
                w[1].set()
            return
        if env["target"] != "ipc" or self.ipc_owner is None:
            c.send(F_ERROR, Struct(c=CODE_NOT_FOUND, s=rid & 0xFFFFFFFF,
                                   m="no channel %s takes control requests on %s" % (env["target"][:64], self.name)))
            return
        try:
            op = _ipc.decode_request(env["body"])["op"]
        except _ipc.IPCError as e:
            op, rep = None, _ipc.error_reply(e)
        if op == _ipc.OP_REVOKE:
            rep = self.ipc_fetcher.handle(c.peer, env["body"])
        elif op is not None:
            rep = self.ipc_owner.handle(c.peer, env["body"])
        c.send(F_MESSAGE, encode_envelope(type_name=CTL_REPLY, request=rid, body=rep))

    def _ctl_error(self, c, v):
        rid = v.get("s")
        with self.mu:
            w = self.ctl_pending.get(rid) if type(rid) is int else None
        if w is not None and w[0] == c.peer and not w[1].is_set():
            w[2].append(TensorferryError("tensorferry: control request refused by %s: code %r: %s"
                                         % (c.peer, v.get("c"), str(v.get("m", ""))[:512])))
            w[1].set()

    def _ctl_call(self, peer, body, timeout):
        """Send a control request to peer's ipc channel and wait for the reply."""
        rid = next(self.ctl_ids) & 0xFFFFFFFF  # error frames carry the id in 32 bits
        w = (peer, threading.Event(), [])
        with self.mu:
            self.ctl_pending[rid] = w
        try:
            self._conn(peer).send(F_MESSAGE, encode_envelope(target="ipc", type_name=CTL_REQUEST,
                                                             request=rid, body=body))
            if not w[1].wait(timeout):
                raise TimeoutError("tensorferry: no control reply from %s in %.1fs" % (peer, timeout))
        finally:
            with self.mu:
                self.ctl_pending.pop(rid, None)
        r = w[2][0]
        if isinstance(r, Exception):
            raise r
        return r

    def _ctl_send(self, peer, body):
        """Send a control request whose reply nobody waits for."""
        rid = next(self.ctl_ids) & 0xFFFFFFFF
        self._conn(peer).send(F_MESSAGE, encode_envelope(target="ipc", type_name=CTL_REQUEST,
                                                         request=rid, body=body))

    def _lookup_export(self, eid):
        with self.mu:
            x = self.exports.get(eid)
        return None if x is None else (x[0], x[1], x[2])

    def _peer_caps(self, c):
        """The peer's capabilities (rdma.Caps as a dict), {} if unreadable."""
        caps = getattr(c, "parsed_caps", None)
        if caps is None:
            try:
                adv = decode(c.caps if isinstance(c.caps, bytes) and c.caps else b"\x80")
                caps = adv.get("c") if isinstance(adv, dict) else None
            except BadBody:
                caps = None
            caps = caps if isinstance(caps, dict) else {}
            c.parsed_caps = caps
        return caps

    def _ipc_to(self, c):
        """Whether CUDA tensors can go over ipc between this node and c's."""
        if self.ipc_owner is None:
            return False
        caps = self._peer_caps(c)
        return caps.get("h") == self.host_id and isinstance(caps.get("c"), list) and "ipc" in caps["c"]

    def _ipc_from(self, c, d):
        """Whether to fetch descriptor d from c's node over ipc: an ipc
        offer of a tensor on a GPU whose UUID the owner advertised, that is
        this node's device or one it has peer access to."""
        if not self._ipc_to(c) or not isinstance(d.get("f"), dict) or "ipc" not in d["f"]:
            return False
        src = None
        for g in self._peer_caps(c).get("g") or []:
            if isinstance(g, dict) and g.get("d") == d.get("d"):
                src = g.get("u")
        mine = self.devices[self.device.index]["u"]
        return bool(src) and (src == mine or [src, mine] in self.p2p or [mine, src] in self.p2p)

    def _check_descriptor(self, c, d):
        """Check a descriptor from c's peer; return its byte size."""
        # Content ("c", tensor.Descriptor's omitempty): carried, not used here.
        for k in ("e", "l", "i", "c") if "c" in d else ("e", "l", "i"):
            v = d.get(k)
            if type(v) is not int or not 0 <= v < 1 << 64:
                raise BadTable("tensorferry: bad descriptor: field %s is %r" % (k, v))
        if d.get("o") != c.peer or d["i"] != c.inc:
            raise BadTable("tensorferry: bad descriptor: owner %r#%r is not the sender %s#%d"
                           % (d.get("o"), d.get("i"), c.peer, c.inc))
        dt, shape, n = d.get("t"), d.get("s"), d.get("b")
        if type(dt) is not int or dt not in DTYPE_SIZE or not isinstance(shape, list) or len(shape) > MAX_DIMS or \
                not all(type(x) is int and x >= 0 for x in shape) or type(n) is not int:
            raise BadTable("tensorferry: bad descriptor: dtype %r, shape %r, bytes %r" % (dt, shape, n))
        size = DTYPE_SIZE[dt]
        for x in shape:
            size *= x
            if size > n:
                break
        if size != n:
            raise BadTable("tensorferry: bad descriptor: %d bytes for shape %r of dtype %d" % (n, shape, dt))
        offers, dev, holder = d.get("f"), d.get("d", ""), d.get("h", "")
        if offers is not None and (not isinstance(offers, dict) or len(offers) > 16 or not all(
                isinstance(k, str) and isinstance(v, bytes) for k, v in offers.items())):
            raise BadTable("tensorferry: bad descriptor: offers %r" % (offers,))
        if not isinstance(dev, str) or len(dev) > 32 or not isinstance(holder, str):
            raise BadTable("tensorferry: bad descriptor: device %r, holder %r" % (dev, holder))
        return n

    def _release_all(self, c, descs):
        for d in descs:
            try:
                c.send(F_RELEASE, Struct(e=d.get("e", 0), l=d.get("l", 0), i=d.get("i", 0)))
            except (TensorferryError, OSError):
                return

    def _drop_refs(self, table):
        """Release the Refs of a message delivered to nobody."""
        for v in table.values():
            if isinstance(v, Ref):
                v.release()

    def _release_ref(self, r):
        with self.mu:
            self.refs.discard(r)
        self._release_desc(r._desc)

    def _release_desc(self, d):
        """Give a Ref's lease back to its owner."""
        with self.mu:
            c = self.conns.get(d.get("o")) if isinstance(d.get("o"), str) else None
        if c is not None and c.inc == d.get("i"):
            self._release_all(c, [d])
        # else its owner is down or restarted: the lease is gone with it.

    def _fetch_ref(self, d, device, timeout):
        """Ref.fetch of the checked descriptor d (its caller releases it)."""
        if getattr(self._tl, "inline", False):
            raise TensorferryError("tensorferry: a Ref cannot be fetched in an inline handler: it runs "
                                   "on the connection's reader, which the fetch waits for")
        if d["b"] > self.receive_budget:
            raise TensorferryError("tensorferry: a Ref of %d bytes, the node's receive budget is %d"
                                   % (d["b"], self.receive_budget))
        with self.mu:
            c = self.conns.get(d["o"])
        if c is None or c.caps is None or c.closed or c.inc != d["i"]:
            raise TensorferryError("tensorferry: owner %s#%d of the Ref is down (or restarted)" % (d["o"], d["i"]))
        import torch
        dev = torch.device(device) if device is not None else None
        timeout = self.fetch_timeout if timeout is None else timeout
        try:
            if d["b"] and (dev is None or dev.type == "cuda") and self._ipc_from(c, d):
                buf = torch.empty(d["b"], dtype=torch.uint8, device=self.device)
                self.ipc_fetcher.fetch(d, buf, timeout)
                via = "ipc"
            else:
                buf = torch.empty(d["b"], dtype=torch.uint8)
                self._fetch_one(c, d, memoryview(buf.numpy()).cast("B"), own_conn=True, timeout=timeout)
                via = "staging"
        except (staging.StagingError, BadBody, OSError, TensorferryError, socket.timeout,
                _ipc.IPCError, _cuda.CudaError, RuntimeError) as e:
            self.errors.append("%s: fetch of a Ref: %s" % (c.peer, e))
            raise TensorferryError("tensorferry: fetch of a Ref from %s failed: %s" % (c.peer, e)) from e
        self.transfers.append((via, c.peer, d["b"]))
        t = _dev_to_tensor(buf, d["t"], d["s"])
        return t if dev is None else t.to(dev)

    def _fetch(self, c, env, table, fetches, own_conn=False, waiter=None):
        """Fetch a message's exported tensors (dispatch thread) over ipc
        when the owner offers it on this host, else over staging, release
        their leases, and deliver it (a reply: to waiter, with the Message
        or the error)."""
        done, moved = [], {}
        try:
            for k, d in fetches:
                if d["b"] and self._ipc_from(c, d):
                    import torch
                    buf = torch.empty(d["b"], dtype=torch.uint8, device=self.device)
                    self.ipc_fetcher.fetch(d, buf, self.fetch_timeout)
                    table[k] = _dev_to_tensor(buf, d["t"], d["s"])
                    via = "ipc"
                else:
                    # Fetched straight into the tensor the handler gets.
                    import torch
                    buf = torch.empty(d["b"], dtype=torch.uint8)
                    self._fetch_one(c, d, memoryview(buf.numpy()).cast("B"), own_conn)
                    table[k] = _dev_to_tensor(buf, d["t"], d["s"])
                    via = "staging"
                del buf
                done.append(d)
                moved[via] = moved.get(via, 0) + d["b"]
        except (staging.StagingError, BadBody, OSError, TensorferryError, socket.timeout,
                _ipc.IPCError, _cuda.CudaError, RuntimeError) as e:
            if not own_conn:
                self._drop_data(c.peer)
            self.errors.append("%s: fetch for %s: %s" % (c.peer, env["type_name"], e))
            self._release_all(c, [d for _, d in fetches])
            self._drop_refs(table)
            self._send_dead_letter(c, env, "fetch failed: %s" % e)
            if waiter is not None:
                waiter.set(TensorferryError("tensorferry: fetch of the reply from %s failed: %s" % (c.peer, e)))
            return
        self._deliver_fetched(c, env, table, done, moved, waiter)

    def _deliver_fetched(self, c, env, table, done, moved, waiter=None):
        """Deliver a message whose tensors done were fetched (moved: bytes
        by channel), then give their leases back."""
        for via, n in moved.items():
            self.transfers.append((via, c.peer, n))
        # The leases go back once the message is delivered, as Go's
        # engine gives them back: after the handler's reply, off its path.
        released = []

        def release():
            if not released:
                released.append(True)
                self._release_all(c, done)
        try:
            self._deliver(c, env, table, now=True, after=release, waiter=waiter)
        except (BadBody, BadTable) as e:
            self.errors.append("%s: %s" % (c.peer, e))
            if waiter is not None and waiter.value is None:
                waiter.set(e)
        finally:
            release()

    def _fetch_one(self, c, d, dst, own_conn=False, timeout=None):
        if own_conn:
            # Off the dispatch thread (a requester's): a data connection
            # of its own, taken from the idle ones or dialed, and kept for
            # the next fetch when this one went well.
            with self.mu:
                idle = self.idle_data.get(c.peer)
                dc = idle.pop() if idle else None
            if dc is None:
                dc = [self._dial_data(c.peer), 0]
            try:
                dc[1] += 1
                dc[0].settimeout(self.fetch_timeout if timeout is None else timeout)
                staging.fetch(dc[0], dc[1], d, dst)
            except BaseException:
                dc[0].close()
                raise
            with self.mu:
                idle = self.idle_data.setdefault(c.peer, [])
                if len(idle) < MAX_IDLE_DATA and not self.stopped.is_set() and c.peer in self.conns:
                    idle.append(dc)
                    dc = None
            if dc is not None:
                dc[0].close()
            return
        dc = self.data_conns.get(c.peer)
        if dc is None:
            dc = [self._dial_data(c.peer), 0]
            self.data_conns[c.peer] = dc
        dc[1] += 1
        dc[0].settimeout(self.fetch_timeout)
        staging.fetch(dc[0], dc[1], d, dst)

    def _drop_data(self, peer):
        dc = self.data_conns.pop(peer, None)
        if dc is not None:
            dc[0].close()

    def _dial_data(self, peer):
        addr = self.peers[peer].get("data_address")
        if not addr:
            raise TensorferryError("tensorferry: no data address for %s" % peer)
        host, port = addr.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=HANDSHAKE_TIMEOUT)
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s = self._secure(s, True, False)
            self._tls_handshake(s)
            self._initiate(s, "data", peer)
            name = b"staging"
            s.sendall(bytes((len(name),)) + name)
        except BaseException:
            s.close()
            raise
        return s

    def _initiate(self, s, purpose, expect):
        """The handshake as initiator (the Go side's wire.Handshake)."""
        nonce_i = os.urandom(NONCE_SIZE)
        s.sendall(self._frame(F_HELLO, Struct(v=PROTOCOL_VERSION, c=self.cluster, n=nonce_i, p=purpose)))
        ftype, _, _, body = read_frame(s, HANDSHAKE_MAX_FRAME)
        ch = decode(body)
        if ftype != F_CHALLENGE or not isinstance(ch, dict):
            raise TensorferryError("tensorferry: handshake with %s: frame %d (%r), want CHALLENGE"
                                   % (expect, ftype, ch if ftype == F_GOAWAY else ""))
        nonce_a = ch.get("n")
        if ch.get("v") != PROTOCOL_VERSION or not isinstance(nonce_a, bytes) or len(nonce_a) != NONCE_SIZE:
            raise TensorferryError("tensorferry: handshake with %s: bad challenge" % expect)
        mac = _mac(self.secret, LABEL_I, PROTOCOL_VERSION, self.cluster, purpose, nonce_i, nonce_a,
                   self.name, self.incarnation)
        s.sendall(self._frame(F_AUTH, Struct(n=self.name, i=self.incarnation, m=mac)))
        ftype, _, _, body = read_frame(s, HANDSHAKE_MAX_FRAME)
        w = decode(body)
        if ftype != F_WELCOME or not isinstance(w, dict):
            raise TensorferryError("tensorferry: handshake with %s refused: %r" % (expect, w))
        node, inc = w.get("n"), w.get("i", 0)
        if not isinstance(node, str) or type(inc) is not int:
            raise BadBody("tensorferry: handshake: welcome names no valid node")
        want = _mac(self.secret, LABEL_A, PROTOCOL_VERSION, self.cluster, purpose, nonce_i, nonce_a,
                    self.name, self.incarnation, node, inc)
        if not hmac.compare_digest(w.get("m", b"") if isinstance(w.get("m"), bytes) else b"", want):
            raise TensorferryError("tensorferry: handshake: acceptor's proof is wrong")
        if node != expect:
            raise TensorferryError("tensorferry: handshake: reached %r, expected %r" % (node, expect))
        return inc

    def _deliver(self, c, env, table, now=False, after=None, waiter=None):
        """Complete a request or run a handler (now: on this thread, the
        dispatch thread, so that it keeps its place among the messages;
        after, when given, is called once the handler ran and its reply
        went out). The Refs of a message delivered to nobody are released."""
        try:
            fields = decode_body(env["body"], table)
            if not isinstance(fields, dict):
                raise BadBody("tensorferry: message body is not a map")
        except (BadBody, BadTable):
            self._drop_refs(table)
            raise
        for v in table.values():
            if type(v) is InlineTensor:  # else the fields hold none
                fields = _tensors_out(fields)
                break
        key = env["request"] if env["request"] and not env["target"] else reply_key(env["target"])
        msg = Message(env["type_name"], fields, (env["sender_node"] or c.peer, env["sender_id"]))
        if key is not None:
            if waiter is not None:  # a reply its requester fetched
                waiter.set(msg)
                return
            with self.mu:
                w = self.pending.pop(key, None)
            if w is not None:
                w.set(msg)
            else:
                self._drop_refs(table)
            return
        if env["target"] not in self.handlers:
            self._drop_refs(table)
            self._send_dead_letter(c, env, "no handler %r on %s" % (env["target"], self.name))
            return
        if now:
            self._run(env["target"], msg, after)
        else:
            self.inbox.put((env["target"], msg))

    def _send_dead_letter(self, c, env, why):
        if env["sender_id"]:
            try:
                c.send(F_SYSTEM, Struct(k=SYS_DEADLETTER, t=env["sender_id"], wn=self.name,
                                        wi=env["target"], d=why))
            except TensorferryError:
                pass

    def _dead_letter(self, v):
        key = reply_key(v.get("t", "")) if isinstance(v.get("t"), str) else None
        if key is None:
            return
        with self.mu:
            w = self.pending.pop(key, None)
        if w is not None:
            w.set(DeadLetter("tensorferry: dead letter: %s" % v.get("d", "")))

    def _conn_closed(self, c, why):
        with self.mu:
            if self.conns.get(c.peer) is not c:
                return
            del self.conns[c.peer]
            self.up_cv.notify_all()  # the dialer of c.peer redials
            # What it held is released: its node is down.
            for k in [k for k, x in self.exports.items() if x[2] == c.peer]:
                del self.exports[k]
            was_up = c.caps is not None
            waiting = [w for w in self.ctl_pending.values() if w[0] == c.peer]
            idle = self.idle_data.pop(c.peer, [])
        for dc in idle:
            dc[0].close()
        for w in waiting:
            w[2].append(TensorferryError("tensorferry: connection to %s closed: %s" % (c.peer, why)))
            w[1].set()
        for side in (self.ipc_owner, self.ipc_fetcher):
            if side is not None:
                side.peer_down(c.peer)
        if was_up and self.on_down:
            self.on_down(c.peer, why)

    def _released(self, c, v):
        e, lease, inc = v.get("e"), v.get("l"), v.get("i")
        with self.mu:
            x = self.exports.get(e)
            if x is not None and x[0] == lease and x[2] == c.peer and inc == self.incarnation:
                del self.exports[e]
                if isinstance(x[1], _DeviceExport) and x[1].via is None:
                    # Released without a begin or a staging request: its
                    # holder copied it under a direct offer.
                    self._served_locked("ipc", c.peer, x[1].nbytes)
                return
        self.errors.append("%s: release of unknown export %r" % (c.peer, e))

    def _served_locked(self, via, peer, n):
        self.served.append((via, peer, n))
        self.served_cv.notify_all()

    def _ipc_served(self, peer, x, n):
        with self.mu:
            if isinstance(x, _DeviceExport) and x.via is None:
                x.via = "ipc"
                self._served_locked("ipc", peer, n)

    def served_since(self, n, timeout=5.0):
        """The entries of served after its first n, waiting up to timeout
        seconds for one: a holder's release can arrive after its answer."""
        end = time.monotonic() + timeout
        with self.mu:
            while len(self.served) <= n:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self.served_cv.wait(left)
            return self.served[n:]

    def _data_accept_loop(self):
        while not self.stopped.is_set():
            try:
                s, _ = self.data_sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_data, args=(s,), daemon=True).start()

    def _serve_data(self, s):
        """Serve staging fetches of this node's exports on a data connection."""
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s = self._secure(s, True, True)
            self._tls_handshake(s)
            peer, _ = self._handshake(s, "data")
            s.settimeout(60.0)
            n = read_frame_byte(s)
            name = staging._read(s, n) if 0 < n <= 64 else b""
            if name != b"staging":
                raise BadBody("tensorferry: data connection for channel %r, not staging" % name)
            s.settimeout(None)
            while not self.stopped.is_set():
                t, stream, length = staging.read_header(s, staging.MAX_CHUNK)
                if t == staging.FR_CANCEL:
                    continue
                if t != staging.FR_REQUEST:
                    raise BadBody("tensorferry: staging: %d frame from a fetcher" % t)
                r = staging.REQUEST.unpack(staging._read(s, length))
                self._serve_request(s, peer, stream, *r)
        except (TensorferryError, BadBody, OSError, staging.StagingError) as e:
            if not self.stopped.is_set():
                self.errors.append("data connection: %s" % e)
        finally:
            s.close()

    def _serve_request(self, s, peer, stream, eid, lease, inc, off, n, chunk, window):
        with self.mu:
            x = self.exports.get(eid)
        code, why = 0, ""
        if inc != self.incarnation:
            code, why = 14, "export of incarnation %d, this is %d" % (inc, self.incarnation)
        elif x is None or x[2] != peer:
            code, why = 7, "no export %d" % eid
        elif x[0] != lease:
            code, why = 8, "lease not valid for export %d" % eid
        elif off > _nbytes(x[1]) or n > _nbytes(x[1]) - off:
            code, why = 9, "[%d, +%d) outside export %d of %d bytes" % (off, n, eid, _nbytes(x[1]))
        if code:
            b = code.to_bytes(4, "big") + why.encode()[:staging.MAX_MESSAGE]
            s.sendall(staging.HEADER.pack(staging.FR_ERROR, 0, 0, stream, len(b)) + b)
            return
        chunk = min(chunk or staging.DEFAULT_CHUNK, staging.MAX_CHUNK)
        data, end = x[1].host() if isinstance(x[1], _DeviceExport) else x[1], off + n
        while off < end:
            k = min(chunk, end - off)
            s.sendall(staging.HEADER.pack(staging.FR_DATA, 0, 0, stream, 8 + k) + off.to_bytes(8, "big"))
            s.sendall(data[off:off + k])
            off += k
        s.sendall(staging.HEADER.pack(staging.FR_END, 0, 0, stream, 4) + bytes(4))
        with self.mu:
            if isinstance(x[1], _DeviceExport):
                if x[1].via is not None:
                    return
                x[1].via = "staging"
            self._served_locked("staging", peer, n)

    def _export(self, peer, t):
        """Lend t's bytes to peer until it releases them: its descriptor."""
        eid = next(self.export_ids)
        lease = self._lease()
        with self.mu:
            self.exports[eid] = [lease, memoryview(t.data), peer]
        return Struct((("o", self.name), ("i", self.incarnation), ("e", eid), ("l", lease),
                       ("t", t.dtype), ("s", list(t.shape)), ("b", len(t.data)), ("d", "cpu")))

    def _expire_refs(self, now):
        """End the leases of Refs sent that their receiver kept past ref_ttl."""
        with self.mu:
            for eid, end in list(self.ref_deadlines.items()):
                if eid not in self.exports:
                    del self.ref_deadlines[eid]  # released
                elif end <= now:
                    del self.ref_deadlines[eid], self.exports[eid]
                    self.warnings.append("lease of Ref export %d ended after %.0fs unfetched"
                                         % (eid, self.ref_ttl))

    def _export_ref(self, peer, r):
        """Lend the tensor of a Ref sent to peer: its descriptor (a CUDA
        tensor over ipc when the peer is on this host, else its bytes over
        staging; never inline). A received Ref is forwarded: its
        descriptor goes, and the receiver fetches from the owner."""
        if r._local is None:
            return r._forward()
        t = r._local
        with self.mu:
            c = self.conns.get(peer)
        if t.is_cuda and t.numel() and c is not None and c.caps is not None and self._ipc_to(c):
            try:
                return self._export_device(peer, t)
            except (_ipc.Refused, _cuda.CudaError) as e:
                self.warnings.append(str(e))
        if not self.data_address:
            raise TensorferryError("tensorferry: a Ref is lent over staging and this node has no data "
                                   "address to serve it")
        return self._export(peer, tensor_to_inline(t, copy=False))

    def _export_device(self, peer, t):
        """Lend the CUDA tensor t to peer over ipc: its descriptor. Raises
        ipc.Refused for memory CUDA IPC cannot share."""
        dt = _dtype_number(t.dtype)
        if t.requires_grad:
            t = t.detach()
        t = t.contiguous()
        dev = t.get_device()
        # The fetcher copies on its own stream: what torch queued for t
        # must be done first (sync: in the driver entry that locates t).
        offer = self.ipc_owner.offer(t, peer, sync=True)
        if self.ipc_owner.revoked:
            self._push_revocations()
        eid = next(self.export_ids)
        x = _DeviceExport(t, offer, t.numel() * t.element_size())
        with self.mu:
            lease = self._lease_locked()
            self.exports[eid] = [lease, x, peer]
        return Struct((("o", self.name), ("i", self.incarnation), ("e", eid), ("l", lease),
                       ("t", dt), ("s", list(t.shape)), ("b", x.nbytes),
                       ("d", "cuda:%d" % dev), ("h", peer), ("f", {"ipc": offer})))

    def _lease(self):
        """A fresh lease: 8 random bytes from the kernel (never 0), taken
        from 64 fetched at once (one getrandom for 8 leases)."""
        with self.mu:
            return self._lease_locked()

    def _lease_locked(self):
        if not self._leases:
            b = os.urandom(64)
            self._leases = [int.from_bytes(b[i:i + 8], "big") or 1 for i in range(0, 64, 8)]
        return self._leases.pop()

    def _push_revocations(self):
        """Tell peers to close their mappings of allocations this process's
        allocator freed (found when a new one took their place)."""
        for peer in list(self.ipc_owner.revoked):
            ids = self.ipc_owner.take_revoked(peer)
            if ids:
                try:
                    self._ctl_send(peer, _ipc.encode_request(op=_ipc.OP_REVOKE, inc=self.incarnation,
                                                             revoked=ids))
                except (TensorferryError, OSError):
                    pass  # a peer that is down closed its mappings already

    def _heartbeat_loop(self):
        seq = itertools.count(1)
        while not self.stopped.wait(self.heartbeat):
            now = time.monotonic()
            self._expire_refs(now)
            with self.mu:
                conns = list(self.conns.values())
            for c in conns:
                if now - c.last_heard > self.failure_timeout:
                    c.close("silent for %.1fs" % (now - c.last_heard))
                    continue
                try:
                    c.send(F_PING, Struct(s=next(seq), t=time.time_ns()))
                except (TensorferryError, OSError) as e:
                    c.close(str(e))

    def _own_thread_device(self):
        """Make the ipc device current on one of the node's own threads
        (a reader, the dispatch thread): the fetch buffers torch allocates
        there and the driver calls of their copies then find its context
        current, where they would switch to it and back for every
        message (torch's device guard; cuda.Driver's push and pop)."""
        if self.device is not None:
            try:
                import torch
                torch.cuda.set_device(self.device)
            except Exception as e:  # noqa: BLE001 - only slower without it
                self.warnings.append("tensorferry: cannot make %s current on %s: %s"
                                     % (self.device, threading.current_thread().name, e))

    def _dispatch_loop(self):
        self._own_thread_device()
        while True:
            item = self.inbox.get()
            if item is None:
                return
            target, msg = item
            with self.handler_mu:
                try:
                    if target == "fetch":
                        self._fetch(*msg)
                    else:
                        self._run(target, msg)
                finally:
                    self.inbox.done()

    def _run(self, target, msg, after=None):
        corked = False
        try:
            try:
                out = self.handlers[target](msg)
            except Exception as e:  # a handler's failure is its own
                self.errors.append("handler %s: %r" % (target, e))
                return
            if out is not None and msg.sender[1]:
                if after is not None:
                    # The reply and what after sends (the leases given
                    # back) leave in one write: one send, one wake-up of
                    # the peer's reader, where there were two.
                    self._tl.cork, corked = {}, True
                try:
                    self.send(msg.sender, out, sender_id=target)
                except TensorferryError as e:
                    self.errors.append("reply from %s: %s" % (target, e))
        finally:
            try:
                if after is not None:
                    after()
            finally:
                if corked:
                    frames, self._tl.cork = self._tl.cork, None
                    for c, fs in frames.items():
                        try:
                            c.write(b"".join(fs))
                        except (TensorferryError, OSError) as e:
                            self.errors.append("reply from %s: %s" % (target, e))

    # -- sending -----------------------------------------------------------

    def _conn(self, node):
        with self.mu:
            c = self.conns.get(node)
        if c is None or c.caps is None:
            raise TensorferryError("tensorferry: node %s is not up" % node)
        return c

    def _envelope(self, target, msg, sender_id, forwarded):
        if not isinstance(msg, Message):
            raise TypeError("tensorferry: send a tensorferry.Message, not %s" % type(msg).__name__)
        node, ident = target
        over_ipc = None

        def tensor_of(v):
            nonlocal over_ipc
            try:
                import torch
            except ImportError:  # pragma: no cover
                return None
            if not isinstance(v, torch.Tensor):
                return None
            if v.is_cuda and v.numel():
                if over_ipc is None:
                    with self.mu:
                        c = self.conns.get(node)
                    over_ipc = c is not None and c.caps is not None and self._ipc_to(c)
                if over_ipc and (not self.inline_device or
                                 v.numel() * v.element_size() > self.inline_threshold):
                    return _DeviceTensor(v)
            return tensor_to_inline(v, copy=False)

        body, table = encode_body(msg.fields, tensor_of)
        for i, (wid, t) in enumerate(table):
            if isinstance(t, Ref):
                d = self._export_ref(node, t)
                if t._local is None:
                    forwarded.append(t)
                else:
                    with self.mu:
                        self.ref_deadlines[d["e"]] = time.monotonic() + self.ref_ttl
                table[i] = (wid, ("ref", d))
            elif isinstance(t, _DeviceTensor):
                try:
                    table[i] = (wid, self._export_device(node, t.t))
                except (_ipc.Refused, _cuda.CudaError) as e:
                    # Served through staging (or inline) from a host copy.
                    self.warnings.append(str(e))
                    table[i] = (wid, tensor_to_inline(t.t))
        big = [i for i, (_, t) in enumerate(table)
               if isinstance(t, InlineTensor) and len(t.data) > self.inline_threshold]
        if big and not self.data_address:
            raise TensorferryError(
                "tensorferry: tensor of %d bytes above the inline threshold %d and this node "
                "has no data address to serve it over staging"
                % (len(table[big[0]][1].data), self.inline_threshold))
        for i in big:
            table[i] = (table[i][0], self._export(node, table[i][1]))
        key = reply_key(ident)
        kw = dict(sender_node=self.name, sender_id=sender_id, type_name=msg.name,
                  ser=SER_MSGPACK, body=body, tensors=encode_table(table) if table else b"")
        if key:
            kw["request"] = key
        else:
            kw["target"] = ident
        return node, encode_envelope(**kw)

    def send(self, pid, msg, sender_id=""):
        """Send msg (a Message) to pid, a (node, actor id) pair.

        Tensors above the inline threshold are lent, not copied: a CPU
        tensor's memory over staging as a CUDA tensor's over ipc, until
        the receiver fetched it; change them only after that (a request's
        reply comes after it)."""
        before, forwarded = next(self.export_ids), []
        try:
            node, env = self._envelope(pid, msg, sender_id, forwarded)
            self._conn(node).send(F_MESSAGE, env)
        except BaseException:
            # Exports of a message that was not sent are nobody's; Refs
            # it forwarded are still this node's.
            with self.mu:
                for k in [k for k in self.exports if k > before]:
                    del self.exports[k]
            for r in forwarded:
                r._unforward()
            raise

    def request(self, pid, msg, timeout=10.0):
        """Send msg to pid and wait for the reply (a Message)."""
        key = next(self.keys)
        w = _Reply()
        with self.mu:
            self.pending[key] = w
        try:
            self.send(pid, msg, sender_id=reply_id(key))
            got = w.wait(timeout)
        except BaseException:
            with self.mu:
                self.pending.pop(key, None)
            raise
        if not got:
            with self.mu:
                mine = self.pending.pop(key, None)
            if mine is not None:
                raise TimeoutError("tensorferry: no reply from %s/%s in %.1fs" % (pid[0], pid[1], timeout))
            w.wait(None)  # taken by the reader just now: its answer follows
        r = w.value
        if isinstance(r, _FetchReply):
            w = _Reply()
            self._fetch(*r.args, own_conn=True, waiter=w)
            r = w.value
            if r is None:  # not a case _fetch leaves; never an answer of None
                raise TensorferryError("tensorferry: the reply from %s/%s was not delivered" % pid)
        if isinstance(r, Exception):
            raise r
        return r


def _tensors_out(v):
    if isinstance(v, InlineTensor):
        return inline_to_tensor(v)
    if isinstance(v, dict):
        return {k: _tensors_out(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_tensors_out(x) for x in v]
    return v
