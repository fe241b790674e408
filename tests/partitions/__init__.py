"""Tests of partitioned streams: keyed routing and the stream/group config."""
