"""A Python node that the Go test python/python_test.go runs as a cluster peer.

The config comes as JSON in TF_PEER_CONFIG (with "membership": "mesh"
and "discovery": {"etcd": {...}}, peers may be empty: the node joins by
etcd). It answers requests on its actor "double" (the tensor X times two), and runs the commands Go writes
on stdin, one a line, printing one result line each:

  request <size>   request the Go actor "scale" with a float32 tensor of size elements
  hostile          send Go a message whose tensor table lies about its bytes
  big              try to send a tensor above the inline threshold
  ipc              say whether the ipc channel runs ("ipc running" or why not)
  gpurequest <n>   request the Go actor "gpuscale" with a CUDA float32 tensor of n elements
  conn             say which node dialed the control connection to the Go node, and its incarnation
  warnings         print what the node did another way than asked
  fetchkept        fetch, on this (main) thread, the Ref the actor "refkeep" kept
  refrequest <n>   request the Go actor "refsum" with a Ref to a float32 tensor of n elements
  quit             stop

Its actor "refsum" answers a py.RefVec (a tensor.Ref field R) with the
sum of R's tensor, fetched (Note "release": released unfetched, Scale -1);
"refkeep" keeps R and answers at once, its fetch comes later (fetchkept);
"refforward" sends R on to the Go actor "refsum" and answers its answer.

On a GPU, its actor "gpudouble" answers a CUDA tensor with the tensor
times two, on its GPU.
"""

import json
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

import tensorferry as tf  # noqa: E402
from tensorferry.codec import Struct, TensorRef  # noqa: E402
from tensorferry.message import encode_envelope, SER_MSGPACK  # noqa: E402
from tensorferry.node import F_MESSAGE, reply_id  # noqa: E402


_out = threading.Lock()


def say(*a):
    # One whole line at a time: the node's threads say "up" and "down".
    with _out:
        sys.stdout.write(" ".join(str(x) for x in a) + "\n")
        sys.stdout.flush()


def main():
    cfg = json.loads(os.environ["TF_PEER_CONFIG"])
    ups = []
    node = tf.Node(cfg["cluster"], cfg["secret"], cfg["name"], cfg["address"], cfg["peers"],
                   heartbeat_interval=cfg.get("heartbeat", 0.1),
                   failure_timeout=cfg.get("failure_timeout", 2.0),
                   inline_threshold=cfg["inline_threshold"], data_address=cfg["data_address"],
                   on_up=lambda n, i: (ups.append(n), say("up", n)),
                   on_down=lambda n, why: say("down", n, why), tls=cfg.get("tls"),
                   dial_timeout=cfg.get("dial_timeout", 2.0), reconnect_min=cfg.get("reconnect_min", 0.1),
                   reconnect_max=cfg.get("reconnect_max", 5.0), membership=cfg.get("membership"),
                   discovery=cfg.get("discovery"), mesh_only=cfg.get("mesh_only", False))

    def double(m):
        x = m["X"]
        return tf.Message("py.Vec", {"Scale": m["Scale"], "X": x * 2, "Note": "doubled by python"})

    node.handle("double", double)

    def gpudouble(m):
        x = m["X"]
        where = str(x.device) if x.is_cuda else "host memory"
        return tf.Message("py.Vec", {"Scale": m["Scale"], "X": x * 2, "Note": "doubled on " + where})

    node.handle("gpudouble", gpudouble)

    def total(m):
        x = m["X"]
        return tf.Message("py.Vec", {"Scale": float(x.numel()), "X": x.sum().reshape(1),
                                     "Note": "summed by python"})

    node.handle("sum", total)

    def relay(m):
        # A handler that requests a reply above the inline threshold.
        n = node.inline_threshold // 4 * 4 + 1
        x = torch.ones(n)
        r = node.request((gonode, "scale"), tf.Message("py.Vec", {"Scale": 2.0, "X": x, "Note": ""}))
        return tf.Message("py.Vec", {"Scale": float(r["X"].sum()), "X": None, "Note": "relayed"})

    node.handle("relay", relay)

    def refsum(m):
        with m["R"] as r:
            if m["Note"] == "release":
                return tf.Message("py.RefVec", {"Scale": -1.0, "R": None, "Note": "released"})
            x = r.fetch("cpu")
            if r.nbytes != x.numel() * 4 or r.dtype != torch.float32:
                raise ValueError("ref of %d bytes, %s: fetched %r" % (r.nbytes, r.dtype, x))
            return tf.Message("py.RefVec", {"Scale": float(x.sum()), "R": None, "Note": "fetched"})

    node.handle("refsum", refsum)
    kept = []

    def refkeep(m):
        kept.append(m["R"])
        return tf.Message("py.RefVec", {"Scale": float(m["R"].nbytes), "R": None, "Note": "kept"})

    node.handle("refkeep", refkeep)

    def refforward(m):
        # Sends the Ref on to the Go actor "refsum", which fetches it from its owner.
        r = node.request((gonode, "refsum"), tf.Message("py.RefVec", {"Scale": 0.0, "R": m["R"], "Note": ""}))
        return tf.Message("py.RefVec", {"Scale": r["Scale"], "R": None, "Note": "forwarded, " + r["Note"]})

    node.handle("refforward", refforward)
    node.start()
    say("listening")
    gonode = cfg["go"]
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        try:
            if cmd[0] == "wait":
                node.wait_peer(gonode)
                say("ok wait")
            elif cmd[0] == "request":
                n = int(cmd[1])
                x = torch.arange(n, dtype=torch.float32)
                r = node.request((gonode, "scale"), tf.Message(
                    "py.Vec", {"Scale": 3.0, "X": x, "Note": "from python"}), timeout=10)
                ok = r.name == "py.Vec" and torch.equal(r["X"], x * 3) and r["Note"] == "scaled by go"
                say("ok request" if ok else "bad request %r" % (r,))
            elif cmd[0] == "hostile":
                body = bytes(tf.encode(Struct(Scale=1.0, X=TensorRef(1, 9), Note="")))
                # 5 float32s (20 bytes) claimed, 3 bytes sent.
                table = bytes(tf.encode([Struct(i=9, k=1, t=1, s=[5], b=b"abc", d=None)]))
                env = encode_envelope(target="scale", sender_node=node.name,
                                      sender_id=reply_id(10 ** 9), type_name="py.Vec",
                                      ser=SER_MSGPACK, body=body, tensors=table)
                node._conn(gonode).send(F_MESSAGE, env)
                say("ok hostile")
            elif cmd[0] == "big":
                # Above the inline threshold both ways: the Go node fetches
                # this node's export over staging, and this node fetches the
                # reply's; every lease is released.
                n = node.inline_threshold // 4 * 8 + 5
                x = torch.arange(n, dtype=torch.float32) % 11
                r = node.request((gonode, "scale"), tf.Message(
                    "py.Vec", {"Scale": -2.0, "X": x, "Note": ""}), timeout=20)
                ok = torch.equal(r["X"], x * -2) and r["Note"] == "scaled by go"
                say("ok big" if ok and not node.exports else "bad big: equal %s, exports %r"
                    % (ok, node.exports))
            elif cmd[0] == "nodata":
                node.data_address = None
                try:
                    node.send((gonode, "scale"), tf.Message(
                        "py.Vec", {"Scale": 1.0, "X": torch.zeros(node.inline_threshold), "Note": ""}))
                    say("bad nodata: sent")
                except tf.TensorferryError as e:
                    say("ok nodata:", e)
            elif cmd[0] == "ipc":
                say("ipc running on %s" % node.device if node.ipc_owner else "ipc not running: %s"
                    % node.ipc_status)
            elif cmd[0] == "gpurequest":
                n = int(cmd[1])
                x = (torch.arange(n, dtype=torch.float32, device=node.device) % 1000) - 7.25
                r = node.request((gonode, "gpuscale"), tf.Message(
                    "py.Vec", {"Scale": 3.0, "X": x, "Note": ""}), timeout=60)
                y = r["X"]
                ok = y.is_cuda and torch.equal(y, x * 3) and r["Note"] == "scaled on cuda:0"
                say("ok gpurequest" if ok else "bad gpurequest: on %s, equal %s, note %r"
                    % (y.device, torch.equal(y.cpu(), (x * 3).cpu()), r["Note"]))
            elif cmd[0] == "fetchkept":
                x = kept.pop().fetch()
                say("ok fetchkept", float(x.sum()), x.numel())
            elif cmd[0] == "refrequest":
                n = int(cmd[1])
                x = torch.arange(n, dtype=torch.float32) % 5
                r = node.request((gonode, "refsum"), tf.Message(
                    "py.RefVec", {"Scale": 0.0, "R": tf.Ref(x), "Note": ""}), timeout=20)
                ok = r["Scale"] == float(x.sum()) and r["Note"] == "fetched by go"
                say("ok refrequest" if ok and not node.exports else "bad refrequest: %r, exports %r"
                    % (r, node.exports))
            elif cmd[0] == "conn":
                c = node._conn(gonode)
                say("conn dialed by", c.initiator, "incarnation", c.inc)
            elif cmd[0] == "warnings":
                say("warnings", json.dumps(node.warnings))
            elif cmd[0] == "transfers":
                say("transfers", json.dumps(node.transfers))
            elif cmd[0] == "errors":
                say("errors", json.dumps(node.errors))
            elif cmd[0] == "quit":
                break
        except Exception as e:
            say("bad %s: %r" % (cmd[0], e))
    node.stop()
    say("stopped")


if __name__ == "__main__":
    threading.current_thread().name = "peer-main"
    main()
