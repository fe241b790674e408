"""What a `CoordinatorClient` raises besides the package's own errors (`ClosedError`,
`DeliveryTimeout`, `LocalProtocolError`): a refused request, a refused connection, an
unreachable service. Importable from `pykka_delivery.coordinator.client` too."""

from __future__ import annotations

import grpc

from pykka_delivery.coordinator.commands import Refusal
from pykka_delivery.errors import DeliveryError

__all__ = ["REJECTIONS", "ConnectionRejected", "CoordinatorRefused", "CoordinatorUnavailable"]

# Refusals of the stream itself that retrying as is will not fix (a configuration error).
REJECTIONS = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


class CoordinatorRefused(DeliveryError):
    """The coordinator refused a request; nothing changed.

    Attributes:
        reason: a `Refusal` value (``"partition_index_conflict"``, ...) or
            ``"invalid_request"``.
        message: what is wrong and how to fix it.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message

    @property
    def refusal(self) -> Refusal | None:
        """The reason as a `Refusal`, or None for ``"invalid_request"``."""
        if self.reason == Refusal.INVALID_REQUEST.value:
            return None  # as before that member existed: callers test for None
        try:
            return Refusal(self.reason)
        except ValueError:
            return None


class ConnectionRejected(DeliveryError):
    """The coordinator service refused the connection itself (wrong token, protocol
    error). The client keeps retrying with backoff, and fails requests at once until a
    connection succeeds.

    Attributes:
        code: the gRPC status code's name (``"UNAUTHENTICATED"``, ...).
        details: the server's explanation.
    """

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"the coordinator refused the connection: {code}: {details}")
        self.code = code
        self.details = details


class CoordinatorUnavailable(DeliveryError):
    """A query could not reach the coordinator service, or it could not answer; or an
    answer to a step-down was dropped because the stream broke before it was answered
    (it is not re-sent; the coordinator re-sends the step-down if it is still pending)."""
