"""What the command prints when something fails: one line naming the cause and the fix."""

from __future__ import annotations

import click

from pykka_delivery.coordinator.client_errors import (
    ConnectionRejected,
    CoordinatorRefused,
    CoordinatorUnavailable,
)
from pykka_delivery.errors import DeliveryError, DeliveryTimeout

__all__ = ["CommandError", "explain", "explain_coordinator"]

TOKEN_HINT = "--token or --token-file (or $PYKKA_DELIVERY_TOKEN)"
TLS_HINT = "--tls-ca, --tls-cert and --tls-key"


class CommandError(click.ClickException):
    """A failure the user can act on: printed as ``Error: <message>``, exit status 1."""


def explain(error: Exception) -> str:
    """The one line for an error no command translated itself."""
    if isinstance(error, DeliveryError | ValueError):
        return str(error)
    if isinstance(error, OSError):
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror or error}{where}"
    return f"{type(error).__name__}: {error} (unexpected: run again with --debug for the traceback)"


def explain_coordinator(error: Exception, address: str, timeout: float) -> str | None:
    """The one line for a coordinator client's error, naming ``address``; None for an
    error that is not the client's."""
    if isinstance(error, ConnectionRejected):
        if error.code == "UNAUTHENTICATED":
            return (
                f"the coordinator at {address} refused the token (UNAUTHENTICATED): give "
                f"its token with {TOKEN_HINT}"
            )
        if error.code == "UNIMPLEMENTED":
            fix = "the coordinator is older than this command: upgrade it"
        else:
            fix = "check that the address is a pykka-delivery coordinator"
        return (
            f"the coordinator at {address} refused the connection: {error.code}: "
            f"{error.details} ({fix})"
        )
    if isinstance(error, DeliveryTimeout):
        return (
            f"no answer from a coordinator at {address} within {timeout} s: check that it "
            f"runs there (--address or $PYKKA_DELIVERY_COORDINATOR), that TLS matches "
            f"({TLS_HINT}), or give it longer with --timeout"
        )
    if isinstance(error, CoordinatorUnavailable | CoordinatorRefused):
        return f"the coordinator at {address} could not answer: {error}"
    return None
