"""The Python node of benchmarks/pytorch: node1 of its cluster.

Its config comes as JSON in TF_BENCH_PEER. Its actor "sink" answers a
bench.Msg with a bench.Ack naming the channel that brought the tensor.
Commands on stdin, one answer line each ("ok ..." or "bad ..."):

  wait             wait for the Go node
  send <n> <k>     send the Go node's sink k messages of an n-byte tensor,
                   one at a time; answers "ok <seconds of the last> <channel>"

With TF_BENCH_STAGES=FILE in its environment it also times the node's
per-message stages (decoding on the reader, the handoffs between
threads, the ipc fetch and export, encoding, sends) and appends their
medians to FILE when it exits: where the Python side's time goes.
With TF_BENCH_TIMELINE=FILE it writes every call of those stages, on
every thread, to FILE when it exits: one line "ns thread event" each
(the entry and exit of each, the waits for a socket, the frames read
by type), for benchmarks/pytorch/timeline.py to lay out per message.
"""

import atexit
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch  # noqa: E402

import tensorferry as tf  # noqa: E402


def time_stages(path, nodes):
    """Wrap the node's per-message methods with timers; their medians go
    to path at exit, with the ipc owner's and fetcher's counters of the
    nodes (a list main fills). Messages go one at a time here, so the last
    frame's arrival on the reader dates the handoffs that follow it."""
    from tensorferry import cuda, ipc, node
    times = collections.defaultdict(list)
    clock = time.perf_counter
    last = [0.0]

    def wrap(cls, name, since_frame=None):
        fn = getattr(cls, name)

        def timed(*a, **k):
            start = clock()
            if since_frame:
                times[since_frame].append(start - last[0])
            try:
                return fn(*a, **k)
            finally:
                times["%s.%s" % (cls.__name__, name)].append(clock() - start)
        setattr(cls, name, timed)

    for cls, names in ((node.Node, ("_message_in", "_deliver", "_release_all", "_envelope",
                                    "_export_device", "request", "_ctl_call", "_control_in",
                                    "_inline", "_deliver_fetched")),
                       (node._Conn, ("send",)), (ipc.Owner, ("offer",)),
                       (ipc.Fetcher, ("fetch", "fetch_direct")), (cuda.Driver, ("locate", "copy"))):
        for name in names:
            wrap(cls, name)
    wrap(node.Node, "_fetch", "reader frame -> _fetch starts (handoff)")
    wrap(node.Node, "_run", "reader frame -> handler starts")
    frame_in = node.Node._frame_in
    last_msg, sent = [0.0], [0.0]

    def arrival(self, c, ftype, stream, body):
        last[0] = clock()
        if ftype in (node.F_MESSAGE, node.F_MESSAGES):
            last_msg[0] = last[0]
        return frame_in(self, c, ftype, stream, body)
    node.Node._frame_in = arrival
    run = node.Node._run

    def timed_run(self, *a, **k):
        # The handler's reply went out: Python's share of a go-python
        # message, from its frame's arrival (inline: all on the reader).
        try:
            return run(self, *a, **k)
        finally:
            times["message frame -> handler and reply done"].append(clock() - last_msg[0])
    node.Node._run = timed_run
    send = node.Node.send

    def timed_send(self, *a, **k):
        try:
            return send(self, *a, **k)
        finally:
            sent[0] = clock()
    node.Node.send = timed_send
    request = node.Node.request

    def timed_request(self, *a, **k):
        start = clock()
        r = request(self, *a, **k)
        end = clock()
        times["request -> its send returns"].append(sent[0] - start)
        times["send returns -> reply frame (Go and the wire)"].append(last_msg[0] - sent[0])
        times["reply frame -> request returns"].append(end - last_msg[0])
        return r
    node.Node.request = timed_request

    def dump():
        with open(path, "a") as f:
            f.write("%-42s %6s %9s %9s %9s\n" % ("stage (us)", "n", "median", "p10", "p90"))
            for k in sorted(times):
                v = sorted(times[k])
                f.write("%-42s %6d %9.1f %9.1f %9.1f\n" % (k, len(v), v[len(v) // 2] * 1e6,
                                                         v[len(v) // 10] * 1e6, v[len(v) * 9 // 10] * 1e6))
            if torch.cuda.is_available():
                for d in range(torch.cuda.device_count()):
                    st = torch.cuda.memory_stats(d)
                    f.write("cuda:%d allocator: %d cudaMalloc, %d cudaFree, peak %d MiB\n" % (
                        d, st.get("num_device_alloc", -1), st.get("num_device_free", -1),
                        st.get("allocated_bytes.all.peak", 0) >> 20))
            for n in nodes:
                for side in ("ipc_owner", "ipc_fetcher"):
                    if getattr(n, side, None) is not None:
                        f.write("%s stats: %s\n" % (side, getattr(n, side).stats))
    atexit.register(dump)


def trace_timeline(path):
    """Record the entry and exit of the node's per-message calls, on every
    thread, and write them to path at exit (see the module's doc)."""
    import threading
    from tensorferry import cuda, ipc, node
    events = []
    clock = time.perf_counter_ns
    ident = threading.get_ident

    def wrap(cls, name, label=None):
        fn = getattr(cls, name)
        label = label or name

        def traced(*a, **k):
            events.append((clock(), ident(), label + ">"))
            try:
                return fn(*a, **k)
            finally:
                events.append((clock(), ident(), label + "<"))
        setattr(cls, name, traced)

    for cls, names in ((node.Node, ("request", "_message_in", "_deliver", "_release_all", "_envelope",
                                    "_export_device", "_inline", "_run", "_fetch", "_released")),
                       (node._Conn, ("write",)), (node.FrameReader, ("_fill",)),
                       (node._Reply, ("set", "wait")), (ipc.Owner, ("offer",)),
                       (ipc.Fetcher, ("fetch_direct",)), (cuda.Driver, ("locate", "copy"))):
        for name in names:
            wrap(cls, name)
    frame_in = node.Node._frame_in

    def arrival(self, c, ftype, stream, body):
        events.append((clock(), ident(), "frame%d" % ftype))
        return frame_in(self, c, ftype, stream, body)
    node.Node._frame_in = arrival

    def dump():
        names = {}
        with open(path, "w") as f:
            for t, tid, ev in events:
                f.write("%d %d %s\n" % (t, names.setdefault(tid, len(names)), ev))
    atexit.register(dump)


def main():
    nodes = []
    if os.environ.get("TF_BENCH_TIMELINE"):
        trace_timeline(os.environ["TF_BENCH_TIMELINE"])
    if os.environ.get("TF_BENCH_STAGES"):
        time_stages(os.environ["TF_BENCH_STAGES"], nodes)
    cfg = json.loads(os.environ["TF_BENCH_PEER"])
    node = tf.Node(cfg["cluster"], cfg["secret"], cfg["name"], cfg["address"], cfg["peers"],
                   data_address=cfg["data_address"], inline_threshold=cfg["inline_threshold"],
                   heartbeat_interval=cfg["heartbeat"], failure_timeout=cfg["failure_timeout"],
                   receive_budget=2 << 30, device=cfg.get("device") if cfg.get("cuda") else None)
    nodes.append(node)
    seen = [0]

    def via():
        n, seen[0] = seen[0], len(node.transfers)
        return node.transfers[-1][0] if len(node.transfers) > n else "inline"

    node.handle("sink", lambda m: tf.Message("bench.Ack", {"Via": via()}), inline=bool(cfg.get("inline")))
    node.start()
    gonode = cfg["go"]
    device = "cpu"
    if cfg.get("cuda"):
        if node.ipc_owner is None:
            print("bad: no ipc in the Python node: %s" % node.ipc_status, flush=True)
            return 1
        device = node.device
    tensors = {}
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        try:
            if cmd[0] == "wait":
                node.wait_peer(gonode, timeout=60)
                print("ok", flush=True)
            elif cmd[0] == "send":
                n, k = int(cmd[1]), int(cmd[2])
                t = tensors.get(n)
                if t is None:
                    tensors.clear()
                    t = tensors[n] = torch.zeros(n, dtype=torch.uint8, device=device)
                for _ in range(k):
                    start = time.perf_counter()
                    r = node.request((gonode, "sink"), tf.Message("bench.Msg", {"T": t}), timeout=120)
                    d = time.perf_counter() - start
                    # Each send is an export of its own: the tensor may be
                    # lent again while the last lease's release is on its way.
                print("ok %.9f %s" % (d, r["Via"]), flush=True)
            else:
                print("bad command %r" % cmd[0], flush=True)
        except Exception as e:
            print("bad %s: %r" % (cmd[0], e), flush=True)
    node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
