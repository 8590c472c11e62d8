"""Lay out the Python peer's timeline (peer.py's TF_BENCH_TIMELINE file)
per message: for each call and frame of a message, on which thread and
how long after the message began, as medians over the messages.

  python3 benchmarks/pytorch/timeline.py FILE [--show K]

A Python -> Go message begins when Node.request is called (on the thread
that requests: "main"); a Go -> Python message when the reader ("reader",
the thread that waits in FrameReader._fill) takes its frame (type 5) and
no request is open. Each row: the event (">" entry, "<" exit, frameN a
frame of type N read), the thread, in how many messages it happened, and
the median, p10 and p90 of its first time after the message began, in
microseconds; the last reader wait before a Go -> Python message shows as
negative offsets (when it went to sleep, when its recv returned). --show K
prints the K messages nearest the median length, event by event.
"""

import argparse
import collections
import sys


def load(path):
    ev = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) == 3:
                ev.append((int(p[0]), int(p[1]), p[2]))
    ev.sort()
    return ev


def roles(ev):
    by = collections.defaultdict(set)
    for _, tid, e in ev:
        by[tid].add(e)
    names = {}
    for tid, es in by.items():
        if "request>" in es:
            names[tid] = "main"
        elif "_fill>" in es:
            names[tid] = "reader" if "reader" not in names.values() else "reader%d" % tid
        else:
            names[tid] = "t%d" % tid
    return names


def messages(ev, names):
    """(kind, start index, end index) of each message."""
    out, open_req, start, kind = [], False, None, None
    for i, (_, tid, e) in enumerate(ev):
        role = names[tid]
        if role == "main" and e == "request>":
            if start is not None:
                out.append((kind, start, i))
            start, kind, open_req = i, "py2go", True
        elif role == "main" and e == "request<":
            open_req = False
        elif e == "frame5" and role.startswith("reader") and not open_req:
            if start is not None:
                out.append((kind, start, i))
            start, kind = i, "go2py"
    if start is not None:
        out.append((kind, start, len(ev)))
    return out


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * q))]


def layout(ev, names, msgs, kind, show):
    offs = collections.defaultdict(list)
    lengths = []
    mine = [m for m in msgs if m[0] == kind]
    for _, a, b in mine:
        t0 = ev[a][0]
        seen = set()
        if kind == "go2py":
            # The reader's last wait before the frame: when it slept, when it woke.
            for j in range(a - 1, max(-1, a - 40), -1):
                if ev[j][2] in ("_fill>", "_fill<") and names[ev[j][1]] == names[ev[a][1]]:
                    key = ("before: " + ev[j][2], names[ev[j][1]])
                    if key not in seen:
                        seen.add(key)
                        offs[key].append((ev[j][0] - t0) / 1e3)
                    if ev[j][2] == "_fill>":
                        break
        for t, tid, e in ev[a:b]:
            key = (e, names[tid])
            if key not in seen:
                seen.add(key)
                offs[key].append((t - t0) / 1e3)
        lengths.append(((ev[b - 1][0] - t0) / 1e3, a, b))
    print("== %s: %d messages" % (kind, len(mine)))
    if not mine:
        return
    print("%-28s %-8s %6s %9s %9s %9s" % ("event", "thread", "n", "median", "p10", "p90"))
    rows = sorted(offs.items(), key=lambda kv: pct(kv[1], 0.5))
    for (e, role), v in rows:
        if len(v) < len(mine) // 10:
            continue
        print("%-28s %-8s %6d %9.1f %9.1f %9.1f" % (e, role, len(v), pct(v, 0.5), pct(v, 0.1), pct(v, 0.9)))
    lengths.sort()
    mid = len(lengths) // 2
    for length, a, b in lengths[max(0, mid - show // 2):mid - show // 2 + show]:
        print("-- one %s message, %.1f us" % (kind, length))
        t0 = ev[a][0]
        for t, tid, e in ev[a:b]:
            print("   %9.1f  %-8s %s" % ((t - t0) / 1e3, names[tid], e))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--show", type=int, default=1)
    a = ap.parse_args()
    ev = load(a.file)
    names = roles(ev)
    msgs = messages(ev, names)
    for kind in ("go2py", "py2go"):
        layout(ev, names, msgs, kind, a.show)
    return 0


if __name__ == "__main__":
    sys.exit(main())
