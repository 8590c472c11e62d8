"""The CUDA driver calls the ipc channel needs, through ctypes (libcuda.so.1).

The driver library is the one every CUDA process of the host uses, torch
included; each call runs with the device's primary context current (the
context torch's runtime uses): when it already is (a thread where torch
ran CUDA work), the call runs as is, else the context is pushed for the
call and popped after it, so torch's own state is left as it was.
Errors name the call: ``tensorferry: cuda: cuIpcOpenMemHandle:
CUDA_ERROR_INVALID_VALUE``.

Driver is the real driver; ipc.py also runs over a host-memory double of
the same methods (tests/fakecuda.py) where there is no GPU.
"""

import ctypes
import threading

IPC_HANDLE_SIZE = 64

# CUpointer_attribute values.
_ATTR_BUFFER_ID = 7
_ATTR_LEGACY_IPC = 10

_LAZY_ENABLE_PEER_ACCESS = 1

MAX_CACHED_ALLOCS = 4096


class CudaError(Exception):
    """A CUDA driver call failed, or there is no driver."""


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * IPC_HANDLE_SIZE)]


class Allocation:
    """Where a tensor's memory lies: its device, the driver allocation that
    holds it (base, size, the driver's unique buffer id) and whether that
    allocation has a legacy CUDA IPC handle (not PyTorch's expandable
    segments, which map memory with cuMemMap)."""

    __slots__ = ("device", "ptr", "base", "size", "buffer_id", "legacy_ipc")

    def __init__(self, device, ptr, base, size, buffer_id, legacy_ipc):
        self.device, self.ptr, self.base, self.size = device, ptr, base, size
        self.buffer_id, self.legacy_ipc = buffer_id, legacy_ipc


class Driver:
    """libcuda.so.1 through ctypes; load() returns the process's one."""

    _one = None
    _once = threading.Lock()

    @classmethod
    def load(cls):
        with cls._once:
            if cls._one is None:
                cls._one = cls()
            return cls._one

    def __init__(self, path="libcuda.so.1"):
        try:
            self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            raise CudaError("tensorferry: cuda: no driver (%s): %s" % (path, e)) from None
        self._ctx = {}
        self._mu = threading.Lock()
        # (device, buffer id) -> Allocation of a driver allocation seen
        # before: the driver's buffer ids are unique for the process's
        # lifetime, so a tensor in it is located with one query.
        self._allocs = {}
        self._call("cuInit", ctypes.c_uint(0))

    def _fn(self, name):
        try:
            return getattr(self.lib, name)
        except AttributeError:
            raise CudaError("tensorferry: cuda: the driver has no %s" % name) from None

    def _call(self, name, *args):
        rc = self._fn(name)(*args)
        if rc != 0:
            s = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(s))
            raise CudaError("tensorferry: cuda: %s: %s" % (name.split("_v")[0],
                            s.value.decode() if s.value else "error %d" % rc))

    def device_count(self):
        n = ctypes.c_int()
        self._call("cuDeviceGetCount", ctypes.byref(n))
        return n.value

    def _dev(self, ordinal):
        d = ctypes.c_int()
        self._call("cuDeviceGet", ctypes.byref(d), ctypes.c_int(ordinal))
        return d

    def identity(self, ordinal):
        """The device's UUID ("GPU-…", as Go's caps write it) and PCI bus id."""
        d = self._dev(ordinal)
        u = (ctypes.c_ubyte * 16)()
        self._call("cuDeviceGetUuid", u, d)
        h = bytes(u).hex()
        uuid = "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])
        bus = ctypes.create_string_buffer(64)
        self._call("cuDeviceGetPCIBusId", bus, ctypes.c_int(64), d)
        return uuid, bus.value.decode()

    def can_access_peer(self, a, b):
        ok = ctypes.c_int()
        self._call("cuDeviceCanAccessPeer", ctypes.byref(ok), self._dev(a), self._dev(b))
        return bool(ok.value)

    def _primary(self, ordinal):
        ctx = self._ctx.get(ordinal)
        if ctx is None:
            with self._mu:
                ctx = self._ctx.get(ordinal)
                if ctx is None:
                    ctx = ctypes.c_void_p()
                    self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), self._dev(ordinal))
                    self._ctx[ordinal] = ctx
        return ctx

    def _in(self, ordinal, fn, *args):
        """fn(*args) with the device's primary context current on this
        thread (the arguments passed: no closure built for each call)."""
        ctx = self._primary(ordinal)
        cur = ctypes.c_void_p()
        self._call("cuCtxGetCurrent", ctypes.byref(cur))
        if cur.value == ctx.value:
            return fn(*args)
        self._call("cuCtxPushCurrent_v2", ctx)
        try:
            return fn(*args)
        finally:
            self._call("cuCtxPopCurrent_v2", ctypes.byref(cur))

    def _attr(self, attr, ptr, ctype):
        v = ctype()
        self._call("cuPointerGetAttribute", ctypes.byref(v), ctypes.c_int(attr), ctypes.c_uint64(ptr))
        return v.value

    def _range(self, ptr):
        """The driver allocation holding ptr: (base, size)."""
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._call("cuMemGetAddressRange_v2", ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
        return base.value, size.value

    def locate(self, t, sync=False):
        """The Allocation of a CUDA tensor's memory. With sync, first wait
        for what torch queued on its current stream of t's device (as
        sync_current), under the same entry into the device's context."""
        ordinal = t.get_device()
        return self._in(ordinal, self._locate, ordinal, t.data_ptr(), current_stream(ordinal) if sync else None)

    def _locate(self, ordinal, ptr, stream):
        if stream is not None:
            self._call("cuStreamSynchronize", ctypes.c_void_p(stream))
        # The buffer id on every call: the driver's ids are unique for the
        # process's lifetime, so an address freed and reused by another
        # allocation is never taken for the old one.
        bid = self._attr(_ATTR_BUFFER_ID, ptr, ctypes.c_uint64)
        a = self._allocs.get((ordinal, bid))
        if a is None:
            legacy = self._attr(_ATTR_LEGACY_IPC, ptr, ctypes.c_int)
            if not legacy:  # cuMemMap'd memory: the rest does not matter
                a = Allocation(ordinal, 0, 0, 0, bid, False)
            else:
                base, size = self._range(ptr)
                a = Allocation(ordinal, 0, base, size, bid, True)
            if len(self._allocs) >= MAX_CACHED_ALLOCS:
                self._allocs.clear()
            self._allocs[(ordinal, bid)] = a
        if not a.legacy_ipc:
            return Allocation(ordinal, ptr, ptr, 0, 0, False)
        return Allocation(ordinal, ptr, a.base, a.size, bid, True)

    def ipc_handle(self, ordinal, base):
        """The cuIpcMemHandle (64 bytes) of the allocation at base."""
        h = _IpcHandle()
        self._in(ordinal, lambda: self._call("cuIpcGetMemHandle", ctypes.byref(h), ctypes.c_uint64(base)))
        return bytes(h.reserved)

    def ipc_open(self, ordinal, handle, size):
        """Map another process's allocation (handle) into device ordinal; its
        device pointer. size is what the owner says the allocation holds."""
        if len(handle) != IPC_HANDLE_SIZE:
            raise CudaError("tensorferry: cuda: IPC handle of %d bytes" % len(handle))
        h = _IpcHandle()
        ctypes.memmove(h.reserved, handle, IPC_HANDLE_SIZE)
        p = ctypes.c_uint64()
        name = "cuIpcOpenMemHandle_v2" if hasattr(self.lib, "cuIpcOpenMemHandle_v2") else "cuIpcOpenMemHandle"

        def op():
            self._call(name, ctypes.byref(p), h, ctypes.c_uint(_LAZY_ENABLE_PEER_ACCESS))
            # The mapping must hold what the owner says it does.
            _, mapped = self._range(p.value)
            if mapped < size:
                self._call("cuIpcCloseMemHandle", ctypes.c_uint64(p.value))
                raise CudaError("tensorferry: cuda: the owner says its allocation holds %d bytes, "
                                "the mapping holds %d" % (size, mapped))
        self._in(ordinal, op)
        return p.value

    def ipc_close(self, ordinal, ptr):
        self._in(ordinal, lambda: self._call("cuIpcCloseMemHandle", ctypes.c_uint64(ptr)))

    def copy(self, dst, src_ptr, n, stream=None):
        """Copy n bytes from device address src_ptr into the CUDA tensor dst
        on stream (default: torch's current stream of dst's device), and
        wait for the copy."""
        ordinal = dst.device.index
        if stream is None:
            stream = current_stream(ordinal)

        def op():
            self._call("cuMemcpyDtoDAsync_v2", ctypes.c_uint64(dst.data_ptr()), ctypes.c_uint64(src_ptr),
                       ctypes.c_size_t(n), ctypes.c_void_p(stream))
            self._call("cuStreamSynchronize", ctypes.c_void_p(stream))
        self._in(ordinal, op)

    def sync_current(self, ordinal):
        """Wait for what torch queued on its current stream of device
        ordinal: torch.cuda.current_stream(d).synchronize() without the
        torch.cuda.Stream built for it (5.4 us against about 1.5 on an
        H200 host)."""
        self._in(ordinal, self._call, "cuStreamSynchronize", ctypes.c_void_p(current_stream(ordinal)))


def current_stream(ordinal):
    """The raw handle of torch's current stream on device ordinal: torch's
    C call where it has one (a few microseconds less than building a
    torch.cuda.Stream for its cuda_stream)."""
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(ordinal)
    return torch.cuda.current_stream(ordinal).cuda_stream


def available():
    """The driver and its device count, or (None, why) without CUDA: torch
    must see a GPU and the driver must load."""
    try:
        import torch
    except ImportError as e:
        return None, "no torch: %s" % e
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    try:
        d = Driver.load()
        if d.device_count() == 0:
            return None, "no CUDA device"
        return d, ""
    except CudaError as e:
        return None, str(e)
