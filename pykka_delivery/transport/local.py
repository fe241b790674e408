"""The in-process transport: refs are told directly; nothing else is needed.

`LossyRef`, the fault injector once defined here, lives in `pykka_delivery.testing`; it
is re-exported so that ``from pykka_delivery.transport.local import LossyRef`` (and
``pykka_delivery.LossyRef``, ``pykka_delivery.transport.LossyRef``) keep working. This is
the one place the library imports the testing package (see the layer contracts).
"""

from __future__ import annotations

from pykka_delivery.testing.lossy import LossyRef

__all__ = ["LossyRef"]
