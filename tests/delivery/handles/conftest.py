"""The `flavour` fixture (flavours.py) for the handle tests written once for both flavours."""

from tests.delivery.handles.flavours import flavour

__all__ = ["flavour"]
