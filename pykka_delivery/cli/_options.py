"""Options several commands share: the token and TLS flags (the same as
`CoordinatorClientSettings` and `TlsSettings` take), the coordinator's address, ``--json``,
and the coordinator client they build."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click

from pykka_delivery.cli._app import apply_options
from pykka_delivery.cli._errors import TLS_HINT, CommandError, explain_coordinator
from pykka_delivery.coordinator.client import CoordinatorClient
from pykka_delivery.coordinator.service_settings import CoordinatorClientSettings
from pykka_delivery.transport.settings import TlsSettings

__all__ = [
    "DEFAULT_COORDINATOR",
    "CoordinatorOptions",
    "Security",
    "coordinator_client",
    "coordinator_options",
    "json_option",
    "security_options",
]

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_COORDINATOR = "127.0.0.1:7070"
"""Where the commands look for the coordinator, and where ``coordinator serve`` listens,
unless told otherwise."""

_GOODBYE_WAIT = 1.0  # seconds a command waits for its stream to attach before it closes

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@dataclass(frozen=True, slots=True)
class Security:
    """The token and TLS settings given on the command line (or in the environment)."""

    token: str | None = field(default=None, repr=False)
    tls: TlsSettings | None = None


@dataclass(frozen=True, slots=True)
class CoordinatorOptions:
    """Where the coordinator is and how to reach it."""

    address: str
    timeout: float
    security: Security


def _read_token(token: str | None, token_file: Path | None) -> str | None:
    if token is not None and token_file is not None:
        msg = "give the token once: --token or --token-file, not both"
        raise click.UsageError(msg)
    if token_file is None:
        return token or None
    value = token_file.read_text(encoding="utf-8").strip()
    if not value:
        msg = f"--token-file {token_file} is empty: put the shared secret in it"
        raise click.UsageError(msg)
    return value


def _tls(
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
    server_name: str | None,
    client_auth: bool = True,
) -> TlsSettings | None:
    given = [ca, cert, key]
    if all(path is None for path in given):
        if server_name is not None:
            msg = f"--tls-server-name needs TLS: give {TLS_HINT}"
            raise click.UsageError(msg)
        return None
    if any(path is None for path in given):
        msg = (
            f"TLS needs {TLS_HINT} together (the CA you trust, and this side's certificate "
            "and key); missing: "
            + ", ".join(
                name
                for name, path in zip(("--tls-ca", "--tls-cert", "--tls-key"), given, strict=True)
                if path is None
            )
        )
        raise click.UsageError(msg)
    assert ca is not None and cert is not None and key is not None
    return TlsSettings(
        cert_chain=cert,
        private_key=key,
        root_certificates=ca,
        require_client_auth=client_auth,
        server_name_override=server_name,
    )


def security_options(*, server: bool = False) -> Callable[[F], F]:
    """``--token``, ``--token-file``, ``--tls-ca``, ``--tls-cert``, ``--tls-key``,
    ``--tls-server-name`` (a client) or ``--no-client-auth`` (a server), each with an
    environment variable; the command gets ``security=Security(...)``."""
    tls_help = (
        "the CA whose signature this server requires on client certificates"
        if server
        else "the CA that signed the server's certificate"
    )
    options: list[Callable[[Any], Any]] = [
        click.option(
            "--token",
            envvar="PYKKA_DELIVERY_TOKEN",
            default=None,
            help="The shared secret (bearer token) [env: PYKKA_DELIVERY_TOKEN].",
        ),
        click.option(
            "--token-file",
            envvar="PYKKA_DELIVERY_TOKEN_FILE",
            type=_FILE,
            default=None,
            help="A file holding the shared secret [env: PYKKA_DELIVERY_TOKEN_FILE].",
        ),
        click.option(
            "--tls-ca",
            envvar="PYKKA_DELIVERY_TLS_CA",
            type=_FILE,
            default=None,
            help=f"PEM file: {tls_help} [env: PYKKA_DELIVERY_TLS_CA].",
        ),
        click.option(
            "--tls-cert",
            envvar="PYKKA_DELIVERY_TLS_CERT",
            type=_FILE,
            default=None,
            help="PEM file: this side's certificate (chain) [env: PYKKA_DELIVERY_TLS_CERT].",
        ),
        click.option(
            "--tls-key",
            envvar="PYKKA_DELIVERY_TLS_KEY",
            type=_FILE,
            default=None,
            help="PEM file: the key of --tls-cert [env: PYKKA_DELIVERY_TLS_KEY].",
        ),
    ]
    if server:
        options.append(
            click.option(
                "--no-client-auth",
                is_flag=True,
                help="With TLS, accept clients without a certificate (no mutual TLS).",
            )
        )
    else:
        options.append(
            click.option(
                "--tls-server-name",
                envvar="PYKKA_DELIVERY_TLS_SERVER_NAME",
                default=None,
                help="The name to check the server's certificate against, when it differs "
                "from the host dialled [env: PYKKA_DELIVERY_TLS_SERVER_NAME].",
            )
        )

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapper(
            *args: Any,
            token: str | None,
            token_file: Path | None,
            tls_ca: Path | None,
            tls_cert: Path | None,
            tls_key: Path | None,
            tls_server_name: str | None = None,
            no_client_auth: bool = False,
            **kwargs: Any,
        ) -> Any:
            security = Security(
                _read_token(token, token_file),
                _tls(tls_ca, tls_cert, tls_key, tls_server_name, not no_client_auth),
            )
            return command(*args, security=security, **kwargs)

        return apply_options(wrapper, options)  # type: ignore[no-any-return]

    return decorate


def coordinator_options(command: F) -> F:
    """``--address`` and ``--timeout`` with the `security_options`; the command gets
    ``coordinator=CoordinatorOptions(...)``."""

    @functools.wraps(command)
    def wrapper(*args: Any, address: str, timeout: float, security: Security, **kw: Any) -> Any:
        return command(*args, coordinator=CoordinatorOptions(address, timeout, security), **kw)

    options: list[Callable[[Any], Any]] = [
        click.option(
            "--address",
            "-a",
            envvar="PYKKA_DELIVERY_COORDINATOR",
            default=DEFAULT_COORDINATOR,
            show_default=True,
            help="The coordinator's host:port; with several coordinator replicas, every "
            "one's, separated by commas (the command follows the leader) "
            "[env: PYKKA_DELIVERY_COORDINATOR].",
        ),
        click.option(
            "--timeout",
            type=click.FloatRange(min=0, min_open=True),
            default=5.0,
            show_default=True,
            help="Seconds to wait for the coordinator's answer.",
        ),
    ]
    return apply_options(security_options()(wrapper), options)  # type: ignore[no-any-return]


def json_option(command: F) -> F:
    """``--json``: machine-readable output (plain JSON on stdout, no colours); the
    command gets ``as_json``."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")(
        command
    )


@contextlib.contextmanager
def coordinator_client(options: CoordinatorOptions) -> Iterator[CoordinatorClient]:
    """A `CoordinatorClient` for one command, closed at the end; its errors become one
    line naming the address and the fix."""
    settings = CoordinatorClientSettings(
        tls=options.security.tls,
        token=options.security.token,
        connect_timeout=options.timeout,
        request_timeout=options.timeout,
        # A command leaves at once: nothing to wait for at close.
        close_timeout=1.0,
    )
    client = CoordinatorClient(options.address, owner="pykka-delivery command", settings=settings)
    try:
        yield client
        # The client's stream opens beside the queries: once it is attached, close says
        # goodbye, and the coordinator logs a closed connection rather than a lost one.
        client.wait_connected(_GOODBYE_WAIT)
    except Exception as error:
        line = explain_coordinator(error, options.address, options.timeout)
        if line is None:
            raise
        raise CommandError(line) from error
    finally:
        client.close()
