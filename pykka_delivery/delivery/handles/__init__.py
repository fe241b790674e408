"""Handles for code that is not an actor: the blocking flavour (a lock and a condition)
and the asyncio flavour (futures on the loop), each a thin layer over a session."""

from pykka_delivery.delivery.handles.merged import MergedConsumer, ProducerSet

__all__ = ["MergedConsumer", "ProducerSet"]
