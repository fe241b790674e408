"""Transports: in-process refs and the gRPC node that links processes.

* `LossyRef`: a fault injector in front of any ref (tests, demos), from
  `pykka_delivery.testing`.
* `Node`: one per process; exposes actors and handles as ``host:port/name`` and carries
  their messages over one batched gRPC stream per pair of nodes.
"""

from pykka_delivery.transport.local import LossyRef
from pykka_delivery.transport.node import Node, NodeStats, RemoteRef
from pykka_delivery.transport.settings import NodeSettings, TlsSettings
from pykka_delivery.transport.stats import LinkStats

__all__ = [
    "LinkStats",
    "LossyRef",
    "Node",
    "NodeSettings",
    "NodeStats",
    "RemoteRef",
    "TlsSettings",
]
