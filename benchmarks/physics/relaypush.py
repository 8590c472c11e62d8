# Fan-out physics without tensorferry (CuPy; see the doc at the top).
# Run: python3 benchmarks/physics/relaypush.py  (env O, R, SIZE_MB, ITERS)
# Fan-out physics on one host: an owner on GPU O lends S bytes; a holder
# on GPU R fetches them (pull: copy issued on R's stream, i.e. R's copy
# engine reads over NVLink; push: copy issued on a stream of O in the
# holder's process, O's engine writes over NVLink), in C chunks; N-1 more
# receivers on R get each chunk after it lands, either copying it
# themselves in their own processes (local=procs) or written by the holder
# into their buffers from its own context (local=holder).
import multiprocessing as mp, os, sys, time, statistics, json
import cupy as cp
rt = cp.cuda.runtime
MB = 1 << 20

def dev_alloc(dev, n):
    rt.setDevice(dev)
    return rt.malloc(n)

def owner(conn, O, S):
    rt.setDevice(O)
    p = rt.malloc(S)
    rt.memset(p, 7, S)
    rt.deviceSynchronize()
    conn.send(rt.ipcGetMemHandle(p))
    conn.recv()  # until done

def holder(conn, O, R, S, C, mode, local, rconns):
    h = conn.recv()
    if mode == "push":
        rt.setDevice(O)
        src = rt.ipcOpenMemHandle(h, 1)
        rt.deviceEnablePeerAccess(R)
        fs = rt.streamCreate()
        rt.setDevice(R)
    else:
        rt.setDevice(R)
        src = rt.ipcOpenMemHandle(h, 1)
        fs = rt.streamCreate()
    rt.setDevice(R)
    dst = rt.malloc(S)
    ls = rt.streamCreate()
    for rc in rconns:
        rc.send(rt.ipcGetMemHandle(dst))
    others = [rt.ipcOpenMemHandle(rc.recv(), 1) for rc in rconns] if local == "holder" else []
    ck = S // C
    evs = []
    for k in range(C):
        rt.setDevice(O if mode == "push" else R)
        evs.append(rt.eventCreateWithFlags(2))  # disable timing
    rt.setDevice(R)
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg == "stop":
            return
        for k in range(C):
            rt.setDevice(O if mode == "push" else R)
            rt.memcpyAsync(dst + k * ck, src + k * ck, ck, 4, fs)
            rt.eventRecord(evs[k], fs)
        rt.setDevice(R)
        for k in range(C):
            if local == "holder":
                rt.streamWaitEvent(ls, evs[k], 0)
                for o in others:
                    rt.memcpyAsync(o + k * ck, dst + k * ck, ck, 4, ls)
            else:
                rt.eventSynchronize(evs[k])
                for rc in rconns:
                    rc.send(k)
        if local == "holder":
            rt.streamSynchronize(ls)
        rt.eventSynchronize(evs[C - 1])
        conn.send(time.monotonic_ns())

def receiver(conn, hconn, R, S, C, local):
    rt.setDevice(R)
    hsrc = rt.ipcOpenMemHandle(hconn.recv(), 1)
    dst = rt.malloc(S)
    if local == "holder":
        hconn.send(rt.ipcGetMemHandle(dst))
    s = rt.streamCreate()
    ck = S // C
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg == "stop":
            return
        if local == "holder":
            conn.send(0)
            continue
        for _ in range(C):
            k = hconn.recv()
            rt.memcpyAsync(dst + k * ck, hsrc + k * ck, ck, 4, s)
        rt.streamSynchronize(s)
        conn.send(time.monotonic_ns())

def run(O, R, N, S, C, mode, local, iters):
    ctx = mp.get_context("spawn")
    oc, oc2 = ctx.Pipe()
    hc, hc2 = ctx.Pipe()
    rcs, rcs2, hrs, hrs2 = [], [], [], []
    for _ in range(N - 1):
        a, b = ctx.Pipe(); rcs.append(a); rcs2.append(b)
        a, b = ctx.Pipe(); hrs.append(a); hrs2.append(b)
    ps = [ctx.Process(target=owner, args=(oc2, O, S))]
    ps.append(ctx.Process(target=holder, args=(hc2, O, R, S, C, mode, local, hrs)))
    for i in range(N - 1):
        ps.append(ctx.Process(target=receiver, args=(rcs2[i], hrs2[i], R, S, C, local)))
    for p in ps:
        p.start()
    hc.send(oc.recv())
    hc.recv()
    for rc in rcs:
        rc.recv()
    ts = []
    for it in range(iters + 2):
        for rc in rcs:
            rc.send("go")
        t0 = time.monotonic_ns()
        hc.send("go")
        ends = [hc.recv()]
        for rc in rcs:
            v = rc.recv()
            if local != "holder":
                ends.append(v)
        if it >= 2:
            ts.append((max(ends) - t0) / 1000)
    hc.send("stop")
    for rc in rcs:
        rc.send("stop")
    oc.send("done")
    for p in ps:
        p.join()
    return statistics.median(ts), min(ts)

if __name__ == "__main__":
    O, R = int(os.environ.get("O", 0)), int(os.environ.get("R", 1))
    S = int(os.environ.get("SIZE_MB", 1024)) * MB
    iters = int(os.environ.get("ITERS", 10))
    print("O", O, "R", R, "size MiB", S // MB, flush=True)
    for N, mode, local, C in [(1, "pull", "procs", 1), (1, "push", "procs", 1), (1, "pull", "procs", 8), (1, "push", "procs", 8)] + \
            [(3, m, l, c) for l in ("procs", "holder") for m in ("pull", "push") for c in (1, 4, 8, 16)]:
        med, mn = run(O, R, N, S, C, mode, local, iters)
        print(f"N={N} fetch={mode:4s} local={local:6s} chunks={C:2d} median {med:8.0f} us  min {mn:8.0f} us", flush=True)
