"""Partitioned streams: a stream split into partitions, keyed routing, consumer groups.

`routing` places messages: a keyed message on the partition of its key's stable hash
(`partition_for_key`, the same in every process), an unkeyed one round robin
(`Spreader`); a `Router` does both for one producer. `config` declares streams, their
partition counts and the consumer groups that follow them, in a start-up TOML file
(`load_config`), and refuses a shrinking partition count (`check_growth`).

`producer` sends a stream's messages: a `PartitionedProducer` routes each by key and
hands it to one `Producer` per (group, partition), wrapped with its key (`envelope`).
`group` consumes them: a `GroupMember` registers every partition of the stream in the
coordinator as a partitioned single-active-consumer group, consumes the partitions it is
given and calls a handler with each `GroupDelivery`. Both name their partitions' groups
and producers, and read a stream's partition count from the coordinator, through
`catalog`; their settings and statistics are in `records`. A named producer registers
in the coordinator's stream catalog, where members find every producer of a stream
(`_discovery`); a `GroupConsumer` follows several streams, or name patterns, of a group.
See docs/partitions.md.
"""

from pykka_delivery.partitions.catalog import consumer_id, partition_stream, producer_id
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
from pykka_delivery.partitions.envelope import KEYED_MESSAGE_NAME, Key, KeyedMessage
from pykka_delivery.partitions.group import DEFAULT_NAMESPACE, GroupMember
from pykka_delivery.partitions.group_consumer import GroupConsumer
from pykka_delivery.partitions.producer import PartitionedProducer
from pykka_delivery.partitions.records import (
    GroupDelivery,
    GroupMemberSettings,
    GroupMemberStats,
    PartitionedProducerSettings,
    PartitionedProducerStats,
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
    "DEFAULT_NAMESPACE",
    "KEYED_MESSAGE_NAME",
    "ConfigError",
    "ConfigProblem",
    "GroupConfig",
    "GroupConsumer",
    "GroupDelivery",
    "GroupMember",
    "GroupMemberSettings",
    "GroupMemberStats",
    "Key",
    "KeyedMessage",
    "PartitionedProducer",
    "PartitionedProducerSettings",
    "PartitionedProducerStats",
    "PartitionsConfig",
    "PartitionsSettings",
    "Router",
    "Spreader",
    "StreamConfig",
    "StreamGrowth",
    "check_growth",
    "consumer_id",
    "dump_config",
    "kept_fraction",
    "load_config",
    "partition_for_key",
    "partition_stream",
    "producer_id",
    "stable_hash",
]
