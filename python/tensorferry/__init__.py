"""tensorferry for Python: a PyTorch process as a peer of a Go cluster.

codec: msgpack bytes equal to the Go side's (wire.EncodeMsgpack) for the
same values, decoded as hostile input. message: wire.Message envelopes and
tensor tables. node: a Node of the config mesh (handshake, heartbeats,
send/request/handlers, tensors inline, through staging, and over ipc with
Go nodes of the same host; Ref: lazy tensor.Ref fields, fetched on
demand). ipc: rdma/ipc's protocol (offers, control
requests, the same-host proof), owner and fetcher. cuda: the CUDA driver
calls ipc needs, through ctypes. discovery: joining by etcd (its v3 JSON
gateway, standard library only), as the Go nodes' package discovery.
"""

from .codec import BadBody, F32, Struct, TensorRef, decode, encode  # noqa: F401
from .message import (BadTable, InlineTensor, RefEntry, decode_body, decode_envelope,  # noqa: F401
                      decode_table, encode_body, encode_envelope, encode_table)
from .ipc import IPCError, Refused  # noqa: F401
from .discovery import EtcdError  # noqa: F401
from .node import (DeadLetter, Message, Node, Ref, RefSpent, TensorferryError,  # noqa: F401
                   inline_to_tensor, tensor_to_inline)
