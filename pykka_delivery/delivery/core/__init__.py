"""The pure state machines of reliable delivery: producer, consumer and work pulling.

Messages in, effects out: no threads, clocks, sockets, sqlite or pykka here (a contract in
``pyproject.toml`` checks it). The sessions (``delivery.session``) carry out the effects.
"""
