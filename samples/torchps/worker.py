"""A PyTorch worker of samples/torchps: pulls the weights from the Go
shards, computes the gradient of a linear regression with autograd on its
own generated data (the solution w* is known), pushes it, and prints the
channel of every transfer. Its node's config comes in TF_WORKER (JSON).

With "cuda" in the config it computes on its GPU: the weights arrive on
the GPU and the gradients leave from it, over ipc (device to device with
the Go shards)."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

import torch  # noqa: E402

import tensorferry as tf  # noqa: E402


def main():
    cfg = json.loads(os.environ["TF_WORKER"])
    node = tf.Node(cfg["cluster"], cfg["secret"], cfg["name"], cfg["address"], cfg["peers"],
                   data_address=cfg["data_address"], inline_threshold=cfg["inline_threshold"],
                   heartbeat_interval=cfg["heartbeat"], failure_timeout=cfg["failure_timeout"])
    node.start()
    ps, shards, dim, steps = cfg["ps"], cfg["shards"], cfg["dim"], cfg["steps"]
    node.wait_peer(ps, timeout=30)
    device = "cpu"
    if cfg.get("cuda"):
        if node.ipc_owner is None:
            print("%s: no ipc: %s" % (node.name, node.ipc_status), flush=True)
            return 2
        device = node.device
    g = torch.Generator().manual_seed(1234)
    w_star = torch.randn(dim, generator=g)            # the known solution, shared
    g.manual_seed(cfg["seed"])
    x = (torch.randn(64, dim, generator=g) / dim ** 0.5).to(device)  # this worker's data
    y = x @ w_star.to(device)
    per = dim // shards

    def channel(log, before):
        # The channel that moved the tensor: the last fetch (pull) or the
        # last fetch of this node's export (push); none: it went inline.
        return log[-1][0] if len(log) > before else "inline"

    for step in range(steps):
        parts = []
        for s in range(shards):
            n0 = len(node.transfers)
            r = node.request((ps, "shard-%d" % s), tf.Message("torchps.Pull", {"Step": step}))
            w = r["W"]
            print("%s step %d pull shard-%d %d bytes via %s, on %s" % (
                node.name, step, s, w.numel() * 4, channel(node.transfers, n0), w.device), flush=True)
            parts.append(w)
        w = torch.cat(parts).to(device).requires_grad_(True)
        loss = 0.5 * ((x @ w - y) ** 2).mean()
        loss.backward()
        grad = w.grad.detach()
        for s in range(shards):
            gs = grad[s * per:(s + 1) * per].contiguous()
            n0 = len(node.served)
            node.request((ps, "shard-%d" % s), tf.Message("torchps.Push", {"Step": step, "G": gs}))
            # The shard fetched the gradient before its Ack; with ipc its
            # release says so, and may come just after the Ack.
            big = gs.is_cuda or gs.numel() * 4 > node.inline_threshold
            via = node.served_since(n0, 5.0 if big else 0)
            print("%s step %d push shard-%d %d bytes via %s, from %s" % (
                node.name, step, s, gs.numel() * 4, via[-1][0] if via else "inline", gs.device), flush=True)
        print("%s step %d loss %.3g" % (node.name, step, loss.item()), flush=True)

    print("%s final loss %.3g" % (node.name, loss.item()), flush=True)
    node.stop()
    return 0 if loss.item() < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
