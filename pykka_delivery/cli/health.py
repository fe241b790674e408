"""``pykka-delivery health ADDRESS``: the standard gRPC health check (grpc.health.v1) of a
transport node or a coordinator. Both answer it without a token; TLS is needed if the
endpoint uses it."""

from __future__ import annotations

import asyncio

import click
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pykka_delivery.cli._app import QUIET, cli, logging_options
from pykka_delivery.cli._errors import TLS_HINT, CommandError
from pykka_delivery.cli._options import Security, json_option, security_options
from pykka_delivery.cli._output import print_json
from pykka_delivery.transport.grpc_setup import open_channel
from pykka_delivery.transport.settings import TlsSettings

__all__ = ["health"]


async def check(address: str, service: str, tls: TlsSettings | None, timeout: float) -> str:
    """The status name ``address`` reports for ``service`` (``"SERVING"``, ...).

    Raises:
        grpc.aio.AioRpcError: the call failed (nothing listening, TLS mismatch, ...).
    """
    async with open_channel(address, tls, []) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def _unreachable(address: str, error: grpc.aio.AioRpcError, timeout: float) -> str:
    code = error.code()
    if code is grpc.StatusCode.NOT_FOUND:
        return f"{address} does not know that service: {error.details()}"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        fix = f"check the address, or give it longer with --timeout (was {timeout} s)"
    elif code is grpc.StatusCode.UNAVAILABLE:
        fix = f"is it running there? does it use TLS ({TLS_HINT})?"
    else:
        fix = "check the address and the TLS flags"
    return f"cannot check the health of {address}: {code.name}: {error.details()} ({fix})"


@cli.command()
@click.argument("address")
@click.option(
    "--service",
    default="",
    help='The service to ask about; "" (the default) for the process as a whole, '
    "pykka_delivery.coordinator.v1.Coordinator or pykka_delivery.transport.v1.Node "
    "for one of them.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds to wait for the answer.",
)
@json_option
@security_options()
@logging_options(QUIET)
def health(
    *, address: str, service: str, timeout: float, as_json: bool, security: Security
) -> None:
    """Check the gRPC health of the node or coordinator at ADDRESS (host:port).

    Prints its status; exit status 0 when SERVING, 1 otherwise (NOT_SERVING, UNKNOWN,
    or nothing answered: a line on stderr says why).
    """
    try:
        status = asyncio.run(check(address, service, security.tls, timeout))
    except grpc.aio.AioRpcError as error:
        raise CommandError(_unreachable(address, error, timeout)) from error
    if as_json:
        print_json({"address": address, "service": service, "status": status})
    else:
        click.echo(status)
    if status != "SERVING":
        raise click.exceptions.Exit(1)
