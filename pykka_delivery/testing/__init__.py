"""Fault injection for testing services built on pykka-delivery.

* `LossyRef`: in front of any ref in one process, drops, duplicates and reorders chosen
  messages at random (reproducibly, with a seed).
* `TcpProxy`: a loopback TCP proxy in front of a node (or any TCP server) that cuts,
  refuses, stalls and delays connections on command.

The library never imports this package: it is for tests (see docs/transport.md, "Testing
your own services").
"""

from pykka_delivery.testing.lossy import LossyRef
from pykka_delivery.testing.tcp_proxy import TcpProxy

__all__ = ["LossyRef", "TcpProxy"]
