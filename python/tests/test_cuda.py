"""cuda.Driver against a stand-in libcuda (tests/fakelibcuda.c, built with
the C compiler when there is one) that has the driver API's signatures:
every call passes its arguments as the driver takes them, runs with a
context pushed and popped, and errors name the call."""

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tensorferry.cuda import CudaError, Driver  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def build():
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler"
    d = tempfile.mkdtemp()
    out = os.path.join(d, "libfakecuda.so")
    r = subprocess.run([cc, "-shared", "-fPIC", "-o", out, os.path.join(HERE, "fakelibcuda.c")],
                       capture_output=True, text=True)
    if r.returncode:
        return None, "cc failed: " + r.stderr
    return out, ""


class Dev:
    def __init__(self, index):
        self.index = index


class Buf:
    """A stand-in tensor: host memory at a device address."""

    def __init__(self, n, device=0):
        self.mem = (ctypes.c_ubyte * n)()
        self.device = Dev(device)

    def data_ptr(self):
        return ctypes.addressof(self.mem)

    def get_device(self):
        return self.device.index


class DriverTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.path, why = build()
        if cls.path is None:
            raise unittest.SkipTest(why)
        cls.d = Driver(cls.path)
        cls.fake = ctypes.CDLL(cls.path)
        cls.fake.fake_register.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int]

    def test_devices(self):
        self.assertEqual(self.d.device_count(), 2)
        uuid, bus = self.d.identity(1)
        self.assertEqual(uuid, "GPU-01112131-4151-6171-8191-a1b1c1d1e1f1")
        self.assertEqual(bus, "0000:19:00.0")
        self.assertTrue(self.d.can_access_peer(0, 1))
        self.assertFalse(self.d.can_access_peer(1, 1))
        with self.assertRaises(CudaError):
            self.d.identity(7)

    def test_ipc_round_trip(self):
        a = Buf(4096)
        self.fake.fake_register(a.data_ptr(), 4096, 1)
        for i in range(4096):
            a.mem[i] = i % 251
        view = Buf(0)
        view.data_ptr = lambda: a.data_ptr() + 100
        loc = self.d.locate(view)
        self.assertEqual((loc.base, loc.size, loc.ptr - loc.base, loc.legacy_ipc), (a.data_ptr(), 4096, 100, True))
        self.assertGreaterEqual(loc.buffer_id, 1000)
        h = self.d.ipc_handle(0, loc.base)
        self.assertEqual(len(h), 64)
        p = self.d.ipc_open(1, h, 4096)
        self.assertEqual(p, a.data_ptr())
        with self.assertRaises(CudaError) as cm:
            self.d.ipc_open(1, h, 4096)
        self.assertIn("cuIpcOpenMemHandle: CUDA_ERROR_ALREADY_MAPPED", str(cm.exception))
        dst = Buf(300, device=1)
        self.d.copy(dst, p + 100, 300, stream=0x5eed)
        self.assertEqual(bytes(dst.mem), bytes(a.mem)[100:400])
        self.d.ipc_close(1, p)
        # An owner that claims more than the allocation holds is refused,
        # and the mapping closed again.
        with self.assertRaises(CudaError) as cm:
            self.d.ipc_open(0, h, 4097)
        self.assertIn("holds 4097 bytes", str(cm.exception))
        self.d.ipc_close(0, self.d.ipc_open(0, h, 4096))
        with self.assertRaises(CudaError):
            self.d.ipc_open(0, b"short", 1)
        self.assertEqual(self.fake.fake_depth(), 0, "a context left pushed")

    def test_not_legacy(self):
        b = Buf(64)
        self.fake.fake_register(b.data_ptr(), 64, 0)
        loc = self.d.locate(b)
        self.assertFalse(loc.legacy_ipc)
        with self.assertRaises(CudaError) as cm:
            self.d.ipc_handle(0, b.data_ptr())
        self.assertIn("cuIpcGetMemHandle: CUDA_ERROR_INVALID_VALUE", str(cm.exception))
        self.assertEqual(self.fake.fake_depth(), 0)

    def test_current_context_kept(self):
        # On a thread where the device's primary context is current (as
        # torch leaves it), calls run in it: nothing pushed or popped.
        a = Buf(256)
        self.fake.fake_register(a.data_ptr(), 256, 1)
        pushes = ctypes.c_int.in_dll(self.fake, "fake_pushes")
        ctx = self.d._primary(0)
        self.assertEqual(self.fake.cuCtxPushCurrent_v2(ctx), 0)
        try:
            before = pushes.value
            self.d.locate(a)
            dst = Buf(16)
            self.d.copy(dst, a.data_ptr(), 16, stream=0x5eed)
            self.assertEqual(pushes.value, before)
            self.assertEqual(self.fake.fake_depth(), 1)
            # Another device's context is pushed for the call and popped.
            self.d.copy(Buf(16, device=1), a.data_ptr(), 16, stream=0x5eed)
            self.assertEqual(pushes.value, before + 1)
            self.assertEqual(self.fake.fake_depth(), 1)
        finally:
            self.fake.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        self.assertEqual(self.fake.fake_depth(), 0)

    def test_sync_current(self):
        # The current stream's raw handle (torch's, here a stand-in) is
        # synchronized in the device's context, which is left as it was.
        from tensorferry import cuda as cuda_mod
        old = cuda_mod.current_stream
        self.addCleanup(setattr, cuda_mod, "current_stream", old)
        cuda_mod.current_stream = lambda ordinal: 0x5eed
        self.d.sync_current(0)
        self.assertEqual(self.fake.fake_depth(), 0)
        cuda_mod.current_stream = lambda ordinal: 0x5eee
        with self.assertRaises(CudaError) as cm:
            self.d.sync_current(1)
        self.assertIn("cuStreamSynchronize", str(cm.exception))
        self.assertEqual(self.fake.fake_depth(), 0)

    def test_locate_synced(self):
        # locate(sync=True) waits for the current stream first, in the
        # same entry into the device's context (one push for both when
        # it is not current), and leaves the context as it was.
        from tensorferry import cuda as cuda_mod
        old = cuda_mod.current_stream
        self.addCleanup(setattr, cuda_mod, "current_stream", old)
        a = Buf(256, device=1)
        self.fake.fake_register(a.data_ptr(), 256, 1)
        pushes = ctypes.c_int.in_dll(self.fake, "fake_pushes")
        cuda_mod.current_stream = lambda ordinal: 0x5eed
        before = pushes.value
        loc = self.d.locate(a, sync=True)
        self.assertEqual((loc.ptr, loc.base, loc.size, loc.legacy_ipc), (a.data_ptr(), a.data_ptr(), 256, True))
        self.assertEqual((pushes.value, self.fake.fake_depth()), (before + 1, 0))
        cuda_mod.current_stream = lambda ordinal: 0x5eee
        with self.assertRaises(CudaError) as cm:
            self.d.locate(a, sync=True)
        self.assertIn("cuStreamSynchronize", str(cm.exception))
        self.assertEqual(self.fake.fake_depth(), 0)

    def test_locate_cached(self):
        # A tensor of an allocation located before costs one query (its
        # buffer id); the answer is the same.
        a = Buf(512)
        self.fake.fake_register(a.data_ptr(), 512, 1)
        queries = ctypes.c_uint64.in_dll(self.fake, "fake_attr_queries")
        first = self.d.locate(a)
        view = Buf(0)
        view.data_ptr = lambda: a.data_ptr() + 64
        before = queries.value
        loc = self.d.locate(view)
        self.assertEqual(queries.value, before + 1)
        self.assertEqual((loc.ptr, loc.base, loc.size, loc.buffer_id, loc.legacy_ipc),
                         (a.data_ptr() + 64, first.base, first.size, first.buffer_id, True))
        b = Buf(64)
        self.fake.fake_register(b.data_ptr(), 64, 0)
        self.d.locate(b)
        before = queries.value
        loc = self.d.locate(b)
        self.assertEqual(queries.value, before + 1)
        self.assertEqual((loc.ptr, loc.base, loc.size, loc.legacy_ipc), (b.data_ptr(), b.data_ptr(), 0, False))

    def test_no_driver(self):
        with self.assertRaises(CudaError) as cm:
            Driver("/nonexistent/libcuda.so.1")
        self.assertIn("no driver", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
