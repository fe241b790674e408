"""What survives a process: the durable producer queue, the consumer's deduplication store
and dead letters, each an interface with its memory, SQLite and PostgreSQL implementations
(the PostgreSQL ones, ``*_postgres.py``, need the ``[postgres]`` extra and are imported
from their modules); backends.py tells an object, a path and a ``postgresql://`` URL apart."""
