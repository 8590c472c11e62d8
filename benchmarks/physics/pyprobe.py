"""pyprobe: what the Python node's primitives cost on this host (issue 33).

    python3 benchmarks/physics/pyprobe.py          # any host; CUDA parts when torch sees a GPU

Prints one line per primitive: the median and p90 of many runs, in
microseconds. It answers where a Python node's per-message time can go
that a Go node does not pay: a wake-up of a thread blocked in a lock or
in recv (a core leaving its idle state), the GIL handed between two
threads, a ctypes call into libcuda beside the torch call that does the
same, a device copy and its wait (cuStreamSynchronize against polling an
event). Self-contained: only the standard library and torch.
"""

import ctypes
import os
import socket
import statistics
import sys
import threading
import time

clock = time.perf_counter_ns


def report(name, xs):
    xs = sorted(xs)
    print("%-58s median %8.2f  p90 %8.2f  us  (n %d)" % (name, xs[len(xs) // 2] / 1e3, xs[len(xs) * 9 // 10] / 1e3,
                                                        len(xs)), flush=True)


def each(fn, n=2000, warm=50):
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t = clock()
        fn()
        out.append(clock() - t)
    return out


def lock_pingpong(n=2000, work_us=0):
    """Round trip of two threads handing a lock to each other (two
    wake-ups), optionally with work_us of Python work before each hand-off."""
    a, b = threading.Lock(), threading.Lock()
    a.acquire()
    b.acquire()
    stop = [False]

    def busy(us):
        if us:
            end = clock() + us * 1000
            while clock() < end:
                pass

    def other():
        while True:
            a.acquire()
            if stop[0]:
                return
            b.release()
            busy(work_us)

    th = threading.Thread(target=other, daemon=True)
    th.start()
    out = []
    for i in range(n + 50):
        t = clock()
        a.release()
        b.acquire()
        if i >= 50:
            out.append(clock() - t)
    stop[0] = True
    a.release()
    th.join()
    return out


def _echo_server(sock, spin):
    c, _ = sock.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        b = _recv(c, spin)
        if not b:
            return
        c.sendall(b)


def _recv(s, spin):
    if spin:
        end = clock() + spin * 1000
        while clock() < end:
            try:
                return s.recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
    return s.recv(4096)


def tcp_pingpong(spin_server, spin_client, n=2000, proc=True):
    """Round trip of 64 bytes over loopback TCP to an echo server in a
    child process (proc) or a thread; spin_*: microseconds of polling a
    non-blocking recv before blocking."""
    ls = socket.create_server(("127.0.0.1", 0))
    port = ls.getsockname()[1]
    pid = None
    if proc:
        pid = os.fork()
        if pid == 0:
            try:
                _echo_server(ls, spin_server)
            finally:
                os._exit(0)
    else:
        threading.Thread(target=_echo_server, args=(ls, spin_server), daemon=True).start()
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = []
    msg = bytes(64)
    for i in range(n + 50):
        t = clock()
        s.sendall(msg)
        got = 0
        while got < 64:
            got += len(_recv(s, spin_client))
        if i >= 50:
            out.append(clock() - t)
    s.close()
    ls.close()
    if pid:
        os.waitpid(pid, 0)
    return out


def cuda_probes():
    import torch
    if not torch.cuda.is_available():
        print("no CUDA: CUDA probes skipped")
        return
    lib = ctypes.CDLL("libcuda.so.1")
    dev = torch.device("cuda", 0)
    x = torch.zeros(4096, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    cur = ctypes.c_void_p()
    report("ctypes cuCtxGetCurrent (byref each call)", each(lambda: lib.cuCtxGetCurrent(ctypes.byref(cur))))
    f = lib.cuCtxGetCurrent
    f.argtypes, f.restype = [ctypes.c_void_p], ctypes.c_int
    pcur = ctypes.addressof(cur)
    report("ctypes cuCtxGetCurrent (argtypes, address cached)", each(lambda: f(pcur)))
    v = ctypes.c_uint64()
    ptr = x.data_ptr()
    report("ctypes cuPointerGetAttribute(BUFFER_ID)",
           each(lambda: lib.cuPointerGetAttribute(ctypes.byref(v), ctypes.c_int(7), ctypes.c_uint64(ptr))))
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    report("ctypes cuMemGetAddressRange_v2",
           each(lambda: lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))))
    report("torch.cuda.current_stream(dev).cuda_stream", each(lambda: torch.cuda.current_stream(dev).cuda_stream))
    if hasattr(torch._C, "_cuda_getCurrentRawStream"):
        report("torch._C._cuda_getCurrentRawStream(0)", each(lambda: torch._C._cuda_getCurrentRawStream(0)))
    report("torch.cuda.current_stream(dev).synchronize() (idle)",
           each(lambda: torch.cuda.current_stream(dev).synchronize()))
    report("torch.empty(4096, uint8, cuda)", each(lambda: torch.empty(4096, dtype=torch.uint8, device=dev)))
    report("torch.empty(16 MiB, uint8, cuda)", each(lambda: torch.empty(16 << 20, dtype=torch.uint8, device=dev)))
    s = torch.cuda.current_stream(dev).cuda_stream
    for n in (4096, 1 << 20, 16 << 20):
        a = torch.zeros(n, dtype=torch.uint8, device=dev)
        b = torch.empty(n, dtype=torch.uint8, device=dev)
        torch.cuda.synchronize()

        def cp_sync():
            lib.cuMemcpyDtoDAsync_v2(ctypes.c_uint64(b.data_ptr()), ctypes.c_uint64(a.data_ptr()),
                                     ctypes.c_size_t(n), ctypes.c_void_p(s))
            lib.cuStreamSynchronize(ctypes.c_void_p(s))
        report("cuMemcpyDtoDAsync+cuStreamSynchronize %d B same GPU" % n, each(cp_sync, 500))
        ev = ctypes.c_void_p()
        lib.cuEventCreate(ctypes.byref(ev), ctypes.c_uint(2))  # CU_EVENT_DISABLE_TIMING

        def cp_poll():
            lib.cuMemcpyDtoDAsync_v2(ctypes.c_uint64(b.data_ptr()), ctypes.c_uint64(a.data_ptr()),
                                     ctypes.c_size_t(n), ctypes.c_void_p(s))
            lib.cuEventRecord(ev, ctypes.c_void_p(s))
            while lib.cuEventQuery(ev) != 0:
                pass
        report("cuMemcpyDtoDAsync+event poll %d B same GPU" % n, each(cp_poll, 500))
        report("torch b.copy_(a) + stream sync %d B same GPU" % n,
               each(lambda: (b.copy_(a), torch.cuda.current_stream(dev).synchronize()), 500))
    if torch.cuda.device_count() > 1:
        d1 = torch.device("cuda", 1)
        for n in (4096, 1 << 20, 16 << 20, 256 << 20):
            a = torch.zeros(n, dtype=torch.uint8, device=dev)
            b = torch.empty(n, dtype=torch.uint8, device=d1)
            torch.cuda.synchronize(dev)
            torch.cuda.synchronize(d1)
            s1 = torch.cuda.current_stream(d1).cuda_stream
            with torch.cuda.device(1):
                def cp():
                    lib.cuMemcpyDtoDAsync_v2(ctypes.c_uint64(b.data_ptr()), ctypes.c_uint64(a.data_ptr()),
                                             ctypes.c_size_t(n), ctypes.c_void_p(s1))
                    lib.cuStreamSynchronize(ctypes.c_void_p(s1))
                r = each(cp, 200 if n < 64 << 20 else 30, 5)
            report("cuMemcpyDtoDAsync+sync %d B cuda:0 -> cuda:1 (%.0f GB/s)" % (n, n / (statistics.median(r))), r)


def main():
    print("python", sys.version.split()[0], "cpus", os.cpu_count(), flush=True)
    try:
        import msgpack
        print("msgpack", msgpack.version, "C extension:", not getattr(msgpack, "_cmsgpack", None) is None
              if hasattr(msgpack, "_cmsgpack") else "unknown")
    except ImportError as e:
        print("no msgpack:", e)
    try:
        import torch
        print("torch", torch.__version__, flush=True)
    except ImportError:
        torch = None
    report("lock ping-pong round trip (2 hand-offs)", lock_pingpong())
    report("lock ping-pong round trip, 20 us work per side", lock_pingpong(work_us=20))
    report("tcp 64 B round trip, blocking both, echo in a process", tcp_pingpong(0, 0))
    report("tcp 64 B round trip, both spin 200 us then block", tcp_pingpong(200, 200))
    report("tcp 64 B round trip, echo spins 200 us", tcp_pingpong(200, 0))
    report("tcp 64 B round trip, blocking, echo in a thread", tcp_pingpong(0, 0, proc=False))
    if torch is not None:
        cuda_probes()


if __name__ == "__main__":
    main()
