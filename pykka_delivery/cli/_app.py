"""The root of the ``pykka-delivery`` command: the group every subcommand hangs on, the
options each of them takes for logs and tracebacks, and the one place where an error
becomes a single line on stderr."""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import click

from pykka_delivery.cli._errors import CommandError, explain
from pykka_delivery.logs import FORMATS, configure_logging

__all__ = ["QUIET", "apply_options", "cli", "logging_options", "main"]

F = TypeVar("F", bound=Callable[..., Any])

_DEBUG = "pykka_delivery.debug"  # ctx.meta key: show tracebacks

QUIET = "CRITICAL"
"""The default log level of the commands that ask and answer: their failure is their one
``Error:`` line, which the library's own log record of it would only repeat."""


class _Root(click.Group):
    """Turns any error a subcommand raises into one ``Error: ...`` line (exit status 1);
    with ``--debug`` the traceback is printed first."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.Abort):
            raise
        except click.ClickException as error:
            if ctx.meta.get(_DEBUG) and error.__cause__ is not None:
                traceback.print_exception(error.__cause__)
            raise
        except Exception as error:
            if ctx.meta.get(_DEBUG):
                traceback.print_exception(error)
            raise CommandError(explain(error)) from error


@click.group(cls=_Root, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pykka-delivery", prog_name="pykka-delivery")
def cli() -> None:
    """Operate pykka-delivery: run a coordinator, see who is active and how far behind
    each group is, inspect durable queues, replay dead letters, check health.

    Every command takes --json for machine-readable output on stdout; logs and errors
    go to stderr. Exit status: 0 done, 1 failed (one line says why and what to do),
    2 a usage error.
    """


def logging_options(default_level: str) -> Callable[[F], F]:
    """``--log-format``, ``--log-level`` and ``--debug`` for a command; logging is
    configured (to stderr) before the command runs."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapper(
            *args: Any, debug: bool, log_format: str | None, log_level: str, **kwargs: Any
        ) -> Any:
            click.get_current_context().meta[_DEBUG] = debug
            configure_logging(log_format, "DEBUG" if debug else log_level)
            return command(*args, **kwargs)

        options = [
            click.option(
                "--log-format",
                type=click.Choice(FORMATS, case_sensitive=False),
                default=None,
                help="Log lines as text or JSON objects [default: $PYKKA_DELIVERY_LOG_FORMAT, "
                "else text].",
            ),
            click.option(
                "--log-level",
                type=click.Choice(
                    ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False
                ),
                default=default_level,
                show_default=True,
                envvar="PYKKA_DELIVERY_LOG_LEVEL",
                help="The least severe log records shown (on stderr).",
            ),
            click.option(
                "--debug",
                is_flag=True,
                envvar="PYKKA_DELIVERY_DEBUG",
                help="Show the traceback of an error, and log at DEBUG.",
            ),
        ]
        return apply_options(wrapper, options)  # type: ignore[no-any-return]

    return decorate


def apply_options(command: Callable[..., Any], options: list[Callable[[Any], Any]]) -> Any:
    """``command`` decorated with ``options``, the first of them outermost (as if
    written above it in that order)."""
    decorated: Any = command
    for option in reversed(options):
        decorated = option(decorated)
    return decorated


def main() -> None:
    """The console script ``pykka-delivery`` (the package imports every command first)."""
    cli(prog_name="pykka-delivery")
