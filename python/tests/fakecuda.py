"""A host-memory double of cuda.Driver, for the ipc protocol's tests where
there is no GPU: "device memory" is CPU torch tensors of this process,
a handle names an allocation of the registry, and, like the driver, a
handle is mapped at most once per process and device."""

import ctypes
import os

from tensorferry.cuda import Allocation, CudaError


class FakeDriver:
    def __init__(self):
        self.allocs = {}   # base -> [tensor, buffer id, legacy]
        self.handles = {}  # handle -> base
        self.open = {}     # (device, base) -> opens
        self.ids = 1
        self.copies = 0

    def alloc(self, nbytes, legacy=True):
        """A fresh allocation of nbytes: a uint8 tensor."""
        import torch
        t = torch.zeros(nbytes, dtype=torch.uint8)
        self.allocs[t.data_ptr()] = [t, self.ids, legacy]
        self.ids += 1
        return t

    def free(self, t):
        self.allocs.pop(t.data_ptr(), None)

    def locate(self, t, sync=False):
        if sync:
            self.sync_current(t.get_device())
        p = t.data_ptr()
        for base, (a, bid, legacy) in self.allocs.items():
            if base <= p < base + a.numel():
                return Allocation(0, p, base, a.numel(), bid, legacy)
        raise CudaError("tensorferry: cuda: cuPointerGetAttribute: CUDA_ERROR_INVALID_VALUE")

    def ipc_handle(self, ordinal, base):
        if base not in self.allocs or not self.allocs[base][2]:
            raise CudaError("tensorferry: cuda: cuIpcGetMemHandle: CUDA_ERROR_INVALID_VALUE")
        h = base.to_bytes(8, "little") + os.urandom(56)
        self.handles[h] = base
        return h

    def ipc_open(self, ordinal, handle, size):
        base = self.handles.get(bytes(handle))
        if base is None or base not in self.allocs:
            raise CudaError("tensorferry: cuda: cuIpcOpenMemHandle: CUDA_ERROR_INVALID_VALUE")
        if self.allocs[base][0].numel() < size:
            raise CudaError("tensorferry: cuda: the owner says its allocation holds %d bytes" % size)
        k = (ordinal, base)
        if self.open.get(k):
            raise CudaError("tensorferry: cuda: cuIpcOpenMemHandle: CUDA_ERROR_ALREADY_MAPPED")
        self.open[k] = 1
        return base

    def ipc_close(self, ordinal, ptr):
        if not self.open.pop((ordinal, ptr), None):
            raise CudaError("tensorferry: cuda: cuIpcCloseMemHandle: CUDA_ERROR_INVALID_VALUE")

    def sync_current(self, ordinal):
        self.syncs = getattr(self, "syncs", 0) + 1

    def copy(self, dst, src_ptr, n):
        for base, (a, _, _) in self.allocs.items():
            if base <= src_ptr and src_ptr + n <= base + a.numel():
                break
        else:
            raise CudaError("tensorferry: cuda: cuMemcpyDtoDAsync: CUDA_ERROR_INVALID_VALUE")
        ctypes.memmove(dst.data_ptr(), src_ptr, n)
        self.copies += 1
