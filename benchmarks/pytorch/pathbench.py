"""The Python node's per-message path on the CPU, for profiling where
there is no GPU: the GPU path's Python code (an export over ipc, a direct
ipc fetch, an inline handler and its reply) with the real cuda.Driver
over python/tests/fakelibcuda.c (built with cc) and CPU tensors standing
in for CUDA ones. The device copy is a memmove, sends go to a socketpair
drained on the same thread: what is timed is the node's Python work.

  python3 benchmarks/pytorch/pathbench.py [N]              # medians of each path, us
  python3 benchmarks/pytorch/pathbench.py N --profile go2py  # cProfile of one path
  TF_PYTHON=DIR python3 ... pathbench.py                   # the tensorferry package of DIR/python

Paths: go2py, a Go node's message (a 64 KiB tensor under a direct ipc
offer, its allocation mapped) through Node._frame_in to the inline
handler's reply and the lease given back; py2go, Node.send of a 64 KiB
"CUDA" tensor (exported over ipc) and the Go node's reply and release
handled; locate and sync, the driver calls of an export. "gc" is the
time in the garbage collector per message; "contend" is _export_device
while a reader thread, woken just before, wants the GIL for ~15 us of
Python (how often it ran inside the export, and the export's median).
"""

import ctypes
import gc
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.environ.get("TF_PYTHON") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

from tensorferry import cuda, ipc, node as N  # noqa: E402
from tensorferry.codec import Struct, TensorRef, encode  # noqa: E402
from tensorferry.message import encode_envelope, encode_table  # noqa: E402

SIZE = 64 << 10


def fake_driver():
    lib = os.environ.get("TF_FAKECUDA")
    if not lib:
        lib = os.path.join(tempfile.mkdtemp(), "libfakecuda.so")
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib,
                        os.path.join(ROOT, "python/tests/fakelibcuda.c")], check=True)
    fake = ctypes.CDLL(lib)
    fake.fake_register.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int]
    cuda.current_stream = lambda ordinal: 0x5eed  # the stand-in's stream
    drv = cuda.Driver(lib)
    drv.copy = lambda dst, src, n, stream=None: ctypes.memmove(dst.data_ptr(), src, n)
    return drv, fake


class T(torch.Tensor):
    """A CPU tensor that says it is on cuda:0."""
    __torch_function__ = torch._C._disabled_torch_function_impl
    is_cuda = True

    def get_device(self):
        return 0

    def contiguous(self):
        return self


class Bench:
    def __init__(self):
        drv, fake = fake_driver()
        shm = tempfile.mkdtemp()
        nd = N.Node("c", b"0123456789abcdef", "py", "127.0.0.1:0", {"go": "127.0.0.1:1"}, ipc=False)
        nd.ipc_owner = ipc.Owner(drv, nd._lookup_export, nd.incarnation, shm_dir=shm, served=nd._ipc_served)
        nd.ipc_fetcher = ipc.Fetcher(drv, "py", nd._ctl_call, nd._ctl_send, shm_dir=shm)
        nd.device, nd.devices = torch.device("cpu", 0), [Struct(d="cuda:0", u="GPU-1", p="")]
        self.a, self.b = socket.socketpair()
        self.b.setblocking(False)
        c = N._Conn(nd, self.a, "go", 5, 16 << 20)
        c.caps = bytes(encode({"c": {"h": nd.host_id, "c": ["staging", "ipc"], "g": [{"d": "cuda:0", "u": "GPU-1"}]}}))
        nd.conns["go"] = c
        nd.handle("sink", lambda m: N.Message("bench.Ack", {"Via": "ipc"}), inline=True)
        self.nd, self.c, self.drv = nd, c, drv
        self.mem = torch.zeros(SIZE, dtype=torch.uint8)
        fake.fake_register(self.mem.data_ptr(), SIZE, 1)
        self.t = self.mem.as_subclass(T)
        # The Go owner's allocation, mapped already, and its direct offer.
        self.gomem = torch.zeros(1 << 20, dtype=torch.uint8)
        fake.fake_register(self.gomem.data_ptr(), 1 << 20, 1)
        m = ipc._Mapping(self.gomem.data_ptr(), 1 << 20, 0, None)
        for dev in (None, 0):
            nd.ipc_fetcher.mappings[("go", 5, 99, dev)] = m
        offer = ipc.encode_offer(99, 4096, SIZE, 1 << 20, ipc.FLAG_DIRECT, 0)
        desc = Struct((("o", "go"), ("i", 5), ("e", 3), ("l", 9), ("t", 9), ("s", [SIZE]), ("b", SIZE),
                       ("d", "cuda:0"), ("h", "py"), ("f", {"ipc": offer})))
        self.go2py_env = encode_envelope(target="sink", sender_node="go", sender_id="future#12", type_name="bench.Msg",
                                         ser=1, body=bytes(encode(Struct(T=TensorRef(1, 7)))),
                                         tensors=encode_table([(7, desc)]))
        self.cases = {"go2py": self.go2py, "py2go": self.py2go, "locate": lambda: drv.locate(self.t),
                      "sync": lambda: drv.sync_current(0)}

    def drain(self):
        try:
            while self.b.recv(1 << 20):
                pass
        except BlockingIOError:
            pass

    def go2py(self):
        self.nd._frame_in(self.c, N.F_MESSAGE, 0, self.go2py_env)
        self.drain()

    def py2go(self):
        nd = self.nd
        key = next(nd.keys)
        w = N._Reply()
        with nd.mu:
            nd.pending[key] = w
        nd.send(("go", "sink"), N.Message("bench.Msg", {"T": self.t}), sender_id=N.reply_id(key))
        eid = max(nd.exports)
        reply = encode_envelope(target=N.reply_id(key), sender_node="go", sender_id="sink", type_name="bench.Ack",
                                ser=1, body=bytes(encode(Struct(Via="ipc"))))
        nd._frame_in(self.c, N.F_MESSAGE, 0, reply)
        nd._frame_in(self.c, N.F_RELEASE, 0, bytes(encode(Struct(e=eid, l=nd.exports[eid][0], i=nd.incarnation))))
        self.drain()
        assert w.wait(0) and w.value["Via"] == "ipc", w.value

    def contend(self, n):
        a, b = socket.socketpair()
        ran = []

        def reader():
            while b.recv(64):
                ran.append(time.perf_counter())
                x = 0
                for i in range(300):
                    x += i * i
        th = threading.Thread(target=reader, daemon=True)
        th.start()
        inside, ts = 0, []
        for i in range(n + 200):
            a.send(b"x")
            end = time.perf_counter() + 50e-6
            while time.perf_counter() < end:  # the reader is awake, wanting the GIL
                pass
            s = time.perf_counter()
            self.nd._export_device("go", self.t)
            e = time.perf_counter() - s
            if i >= 200:
                ts.append(e)
                inside += bool(ran and s <= ran[-1] <= s + e)
            with self.nd.mu:
                self.nd.exports.clear()
            time.sleep(0.0002)
        a.close()
        th.join()
        ts.sort()
        return inside, ts[len(ts) // 2] * 1e6


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 2000
    bench = Bench()
    if "--profile" in sys.argv:
        import cProfile
        import pstats
        fn = bench.cases[sys.argv[sys.argv.index("--profile") + 1]]
        for _ in range(200):
            fn()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(n):
            fn()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)
        return
    if "--idle" in sys.argv or "--busy" in sys.argv:
        busy = "--busy" in sys.argv
        idle = float(sys.argv[sys.argv.index("--busy" if busy else "--idle") + 1]) / 1e6
        for name, fn in bench.cases.items():
            for _ in range(200):
                fn()
            times = []
            for _ in range(n):
                if busy:
                    end = time.perf_counter() + idle
                    while time.perf_counter() < end:
                        pass
                else:
                    time.sleep(idle)
                s = time.perf_counter()
                fn()
                times.append(time.perf_counter() - s)
            times.sort()
            print("%-7s %7.1f us  (median of %d calls, each after %.0f us %s; p90 %.1f)"
                  % (name, times[n // 2] * 1e6, n, idle * 1e6, "spinning" if busy else "asleep",
                     times[n * 9 // 10] * 1e6))
        return
    in_gc = [0.0, 0.0]

    def watch(phase, info):
        if phase == "start":
            in_gc[1] = time.perf_counter()
        else:
            in_gc[0] += time.perf_counter() - in_gc[1]
    gc.callbacks.append(watch)
    for name, fn in bench.cases.items():
        for _ in range(200):
            fn()
        in_gc[0], times = 0.0, []
        for _ in range(5):
            s = time.perf_counter()
            for _ in range(n):
                fn()
            times.append((time.perf_counter() - s) / n * 1e6)
        print("%-7s %7.1f us  (best of 5 runs of %d; gc %.2f us)" % (name, min(times), n, in_gc[0] / (5 * n) * 1e6))
    inside, med = bench.contend(n)
    print("contend %7.1f us  (the reader ran inside the export %d times of %d)" % (med, inside, n))
    assert not bench.nd.errors, list(bench.nd.errors)


if __name__ == "__main__":
    main()
