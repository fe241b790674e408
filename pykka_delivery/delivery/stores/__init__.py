"""What survives a process: the durable producer queue, the consumer's deduplication store
and dead letters, each an interface with its memory and SQLite implementations."""
