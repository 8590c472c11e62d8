"""The Python node of benchmarks/pytorch: node1 of its cluster.

Its config comes as JSON in TF_BENCH_PEER. Its actor "sink" answers a
bench.Msg with a bench.Ack naming the channel that brought the tensor.
Commands on stdin, one answer line each ("ok ..." or "bad ..."):

  wait             wait for the Go node
  send <n> <k>     send the Go node's sink k messages of an n-byte tensor,
                   one at a time; answers "ok <seconds of the last> <channel>"
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch  # noqa: E402

import tensorferry as tf  # noqa: E402


def main():
    cfg = json.loads(os.environ["TF_BENCH_PEER"])
    node = tf.Node(cfg["cluster"], cfg["secret"], cfg["name"], cfg["address"], cfg["peers"],
                   data_address=cfg["data_address"], inline_threshold=cfg["inline_threshold"],
                   heartbeat_interval=cfg["heartbeat"], failure_timeout=cfg["failure_timeout"],
                   receive_budget=2 << 30)
    seen = [0]

    def via():
        n, seen[0] = seen[0], len(node.transfers)
        return node.transfers[-1][0] if len(node.transfers) > n else "inline"

    node.handle("sink", lambda m: tf.Message("bench.Ack", {"Via": via()}))
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
