"""The ``pykka-delivery`` command (click): operate a deployment from a shell.

Subcommands (``pykka-delivery COMMAND --help`` for each; docs/cli.md for all):

* ``coordinator serve``: a coordinator service in the foreground;
* ``groups``: who is active in each group and partition, who waits, the last hand-over;
* ``streams``: the stream catalog with the producers and groups of each stream;
* ``lag``: per group, partition and producer, how far behind the consumers are;
* ``dead-letters list|show|replay|purge``: the messages consumers gave up on;
* ``queue inspect``: what a SQLite durable producer queue holds;
* ``health``: the gRPC health of a node or coordinator.

This package is the top layer: it may import everything, and nothing imports it.
"""

from pykka_delivery.cli import coordinator, dead_letters, groups, health, lag, queue, streams
from pykka_delivery.cli._app import cli, main

__all__ = [
    "cli",
    "coordinator",
    "dead_letters",
    "groups",
    "health",
    "lag",
    "main",
    "queue",
    "streams",
]
