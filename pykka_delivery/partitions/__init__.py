"""Partitioned streams: a stream split into partitions, keyed routing, consumer groups.

`routing` places messages: a keyed message on the partition of its key's stable hash
(`partition_for_key`, the same in every process), an unkeyed one round robin
(`Spreader`); a `Router` does both for one producer. `config` declares streams, their
partition counts and the consumer groups that follow them, in a start-up TOML file
(`load_config`), and refuses a shrinking partition count (`check_growth`). See
docs/partitions.md.
"""

from pykka_delivery.partitions.config import (
    DEFAULT_MAX_PARTITIONS,
    ConfigError,
    ConfigProblem,
    GroupConfig,
    PartitionsConfig,
    PartitionsSettings,
    StreamConfig,
    StreamGrowth,
    check_growth,
    dump_config,
    load_config,
)
from pykka_delivery.partitions.routing import (
    Router,
    Spreader,
    kept_fraction,
    partition_for_key,
    stable_hash,
)

__all__ = [
    "DEFAULT_MAX_PARTITIONS",
    "ConfigError",
    "ConfigProblem",
    "GroupConfig",
    "PartitionsConfig",
    "PartitionsSettings",
    "Router",
    "Spreader",
    "StreamConfig",
    "StreamGrowth",
    "check_growth",
    "dump_config",
    "kept_fraction",
    "load_config",
    "partition_for_key",
    "stable_hash",
]
