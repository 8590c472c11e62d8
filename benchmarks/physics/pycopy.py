"""pycopy: why a Python node fetches big tensors slower than a Go node (issue 33).

    python3 benchmarks/physics/pycopy.py [--src 0] [--dst 1]

An owner process allocates tensors on GPU src with torch and sends their
CUDA IPC handles to this process, which maps them on GPU dst through
tensorferry's ctypes driver and copies them the ways a fetcher can:

  legacy     one cuMemcpyDtoDAsync on torch's current stream, then
             cuStreamSynchronize (what python/tensorferry/cuda.py does)
  stream     the same on a stream of its own (non-blocking)
  chunks     64 MiB pieces on a stream of its own (what Go's ipc channel does)
  +empty     "legacy" into a fresh torch.empty of the size each time
             (what the node does per message), with the allocator's
             cudaMalloc count before and after

Prints the median of each in microseconds and GB/s. Self-contained but
for python/tensorferry (its cuda module); needs two GPUs for src != dst.
"""

import argparse
import ctypes
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

SIZES = [16 << 20, 64 << 20, 256 << 20, 1 << 30]


def owner(dev):
    import torch
    from tensorferry import cuda
    d = cuda.Driver.load()
    keep = []
    for n in SIZES:
        t = torch.ones(n, dtype=torch.uint8, device="cuda:%d" % dev)
        torch.cuda.synchronize(dev)
        a = d.locate(t)
        keep.append(t)
        print("%d %d %d %s" % (n, a.size, a.ptr - a.base, d.ipc_handle(dev, a.base).hex()), flush=True)
    sys.stdin.read()  # until the fetcher is done


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", type=int, default=0)
    ap.add_argument("--dst", type=int, default=1)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--owner", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.owner:
        return owner(a.src)
    import torch
    from tensorferry import cuda
    d = cuda.Driver.load()
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--owner", "--src", str(a.src)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    dev = "cuda:%d" % a.dst
    torch.zeros(1, device=dev)
    own = torch.cuda.Stream(device=dev)
    for _ in SIZES:
        n, size, shift, h = p.stdout.readline().split()
        n, size, shift = int(n), int(size), int(shift)
        base = d.ipc_open(a.dst, bytes.fromhex(h), size)
        src = base + shift
        dst = torch.empty(n, dtype=torch.uint8, device=dev)
        res = {}

        def legacy():
            d.copy(dst, src, n)

        def stream():
            d.copy(dst, src, n, stream=own.cuda_stream)

        def chunks():
            piece = 64 << 20

            def op():
                for off in range(0, n, piece):
                    m = min(piece, n - off)
                    d._call("cuMemcpyDtoDAsync_v2", ctypes.c_uint64(dst.data_ptr() + off),
                            ctypes.c_uint64(src + off), ctypes.c_size_t(m), ctypes.c_void_p(own.cuda_stream))
                d._call("cuStreamSynchronize", ctypes.c_void_p(own.cuda_stream))
            d._in(a.dst, op)

        def fresh():
            t = torch.empty(n, dtype=torch.uint8, device=dev)
            d.copy(t, src, n)

        for name, fn in (("legacy", legacy), ("stream", stream), ("chunks", chunks), ("+empty", fresh)):
            fn()
            before = torch.cuda.memory_stats(dev).get("num_device_alloc", -1)
            xs = []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                fn()
                xs.append(time.perf_counter() - t0)
            after = torch.cuda.memory_stats(dev).get("num_device_alloc", -1)
            res[name] = (median(xs), after - before)
        ok = bool((dst[:1024] == 1).all()) and bool((dst[-1024:] == 1).all())
        for name, (s, allocs) in res.items():
            print("%-8s %6d MiB  %9.1f us  %6.1f GB/s  cudaMallocs %d%s" % (
                name, n >> 20, s * 1e6, n / s / 1e9, allocs, "" if ok else "  BAD BYTES"), flush=True)
        del dst
        d.ipc_close(a.dst, base)
    p.stdin.close()
    p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
