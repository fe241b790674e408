"""`TcpProxy`: a loopback TCP proxy for fault tests; it can cut, refuse, stall and delay
connections.

    from pykka_delivery.testing import TcpProxy

    with TcpProxy(("127.0.0.1", server_port)) as proxy:
        host, port = proxy.address
        channel = grpc.insecure_channel(f"{host}:{port}")
        ...
        proxy.cut()            # every current connection is reset, on both sides
        proxy.refuse(True)     # new connections are accepted and closed at once
        proxy.stall(True)      # bytes are held in both directions (not dropped)
        proxy.set_delay(0.05)  # each chunk is forwarded 50 ms after it was read

One thread runs a `selectors` loop over every socket; there are no busy loops (the loop
sleeps in `select` until a socket is ready, a delayed chunk falls due or a command
arrives). The control methods are safe to call from any thread and are synchronous:
when `cut()` returns, the connections it cut are closed; when `stall(True)` returns, no
further byte will be forwarded until `stall(False)`.

Semantics worth knowing:

* `cut()` closes both sockets of each connection with SO_LINGER 0, so both the client
  and the upstream get a TCP RST (ECONNRESET), not an orderly FIN. Bytes the proxy was
  holding (stalled or delayed) are discarded. New connections are accepted afterwards.
* `refuse(True)` affects only new connections: they are accepted (and counted in
  `connections_accepted`) and reset at once, without connecting upstream. Established
  connections carry on. An unreachable upstream behaves the same way.
* `stall(True)` holds bytes in the proxy, up to `_HIGH_WATER` bytes per direction and
  connection; beyond that the proxy stops reading, so TCP flow control holds the rest in
  the kernel. Nothing is dropped, and on `stall(False)` everything is forwarded in order.
  A peer's FIN (half-close) is held in order with the bytes; a peer's RST is not held:
  it resets the whole connection at once.
* `set_delay(s)` stamps each chunk with "read time + s" and forwards it when due, in
  order (a later chunk never overtakes an earlier one, even if the delay is lowered).
  Chunks are what one `recv` returned, up to 64 KiB.
* `stop()` resets every connection, closes every socket and joins the thread (bounded;
  it raises `RuntimeError` if the thread does not finish within `join_timeout`).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import queue
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

__all__ = ["TcpProxy"]

_T = TypeVar("_T")

_CHUNK = 64 * 1024
# Bytes held per direction and connection before the proxy stops reading that side.
_HIGH_WATER = 1024 * 1024
_COMMAND_TIMEOUT = 5.0

_LINGER_ZERO = struct.pack("ii", 1, 0)


def _reset_and_close(sock: socket.socket) -> None:
    """Close `sock` so that the peer gets an RST (SO_LINGER 0), not a FIN."""
    with contextlib.suppress(OSError):  # e.g. already reset by the peer
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
    sock.close()


class _Direction:
    """Bytes read from `source`, waiting to be written to `sink`."""

    __slots__ = ("eof_read", "eof_sent", "pending", "queued_bytes", "sink", "source")

    def __init__(self, source: socket.socket, sink: socket.socket) -> None:
        self.source = source
        self.sink = sink
        # (due time, data); b"" is the end-of-stream marker (the source sent FIN).
        self.pending: collections.deque[tuple[float, bytes]] = collections.deque()
        self.queued_bytes = 0
        self.eof_read = False
        self.eof_sent = False


class _Connection:
    __slots__ = ("client", "connecting", "directions", "interest", "upstream")

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.connecting = True
        self.directions = (_Direction(client, upstream), _Direction(upstream, client))
        self.interest: dict[socket.socket, int] = {client: 0, upstream: 0}


class TcpProxy:
    """Forwards TCP connections from 127.0.0.1:``listen_port`` to ``upstream``.

    Args:
        upstream: ``(host, port)`` connections are forwarded to.
        listen_port: where the proxy listens on 127.0.0.1; 0 (the default) picks a free
            port (see `address`).
        join_timeout: how long `stop` waits for the proxy's thread, in seconds. Default 5.

    Start it with `start` (or ``with TcpProxy(...) as proxy:``), then steer it from any
    thread with `cut`, `refuse`, `stall` and `set_delay` (see the module docstring).
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        listen_port: int = 0,
        join_timeout: float = 5.0,
    ) -> None:
        self._upstream = upstream
        self._listen_port = listen_port
        self._join_timeout = join_timeout
        self._address: tuple[str, int] | None = None

        self._stalled = False
        self._refusing = False
        self._delay = 0.0

        self._conns: dict[socket.socket, _Connection] = {}  # by each of its two sockets
        self._open: set[_Connection] = set()
        self._selector: selectors.BaseSelector | None = None
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], _Reply]] = queue.SimpleQueue()
        self._state_lock = threading.Lock()
        self._running = False

        #: Connections accepted so far (refused ones included).
        self.connections_accepted = 0
        #: Bytes written to either side so far.
        self.bytes_forwarded = 0
        #: Bytes read but not yet forwarded (held by a stall or a delay).
        self.pending_bytes = 0
        #: Wake-ups of the event loop (diagnostic: an idle proxy must not spin).
        self.loop_iterations = 0

    # ------------------------------------------------------------------ public API

    @property
    def address(self) -> tuple[str, int]:
        """Where clients connect: ("127.0.0.1", port). Known once started."""
        if self._address is None:
            raise RuntimeError("TcpProxy not started")
        return self._address

    @property
    def active_connections(self) -> int:
        """Connections currently open through the proxy."""
        return len(self._open)

    def start(self) -> TcpProxy:
        """Listen on 127.0.0.1 and forward from a thread of the proxy's own; returns it.

        Raises:
            RuntimeError: it was started already.
        """
        if self._thread is not None:
            raise RuntimeError("TcpProxy already started")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self._listen_port))
            listener.listen(128)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._address = ("127.0.0.1", listener.getsockname()[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._stopping = False
        self._running = True
        self._thread = threading.Thread(
            target=self._run, name=f"TcpProxy-{self._address[1]}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Reset every connection, close every socket and join the thread. Idempotent."""
        thread = self._thread
        if thread is None:
            return
        if thread.is_alive():
            self._call(self._request_stop)
        thread.join(self._join_timeout)
        if thread.is_alive():
            raise RuntimeError(f"{thread.name} did not stop within {self._join_timeout} s")
        self._thread = None
        if self._wake_w is not None:
            self._wake_w.close()
            self._wake_w = None

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def cut(self) -> None:
        """Reset every current connection (RST to both sides); later ones are accepted."""
        self._call(self._cut_all)

    def refuse(self, refusing: bool) -> None:
        """While True, accept new connections and reset them at once."""

        def apply() -> None:
            self._refusing = refusing

        self._call(apply)

    def stall(self, stalled: bool) -> None:
        """While True, hold bytes in both directions; forward them in order when False."""

        def apply() -> None:
            self._stalled = stalled
            if not stalled:
                self._flush_all()

        self._call(apply)

    def set_delay(self, seconds: float) -> None:
        """Forward each chunk `seconds` after it was read (0 = at once), order kept."""
        if seconds < 0:
            raise ValueError("delay must be >= 0")

        def apply() -> None:
            self._delay = float(seconds)
            self._flush_all()

        self._call(apply)

    # ------------------------------------------------------------ command plumbing

    def _call(self, fn: Callable[[], _T]) -> _T:
        """Run `fn` on the loop thread (or here, if the loop is not running)."""
        if threading.current_thread() is self._thread:
            return fn()
        reply = _Reply()
        with self._state_lock:
            if not self._running:
                return fn()
            self._commands.put((fn, reply))
            assert self._wake_w is not None
            # If the wake-up socket is full, the loop has wake-ups pending anyway.
            with contextlib.suppress(BlockingIOError, InterruptedError):
                self._wake_w.send(b"\0")
        if not reply.done.wait(_COMMAND_TIMEOUT):
            raise TimeoutError("TcpProxy loop did not answer")
        if reply.error is not None:
            raise reply.error
        return reply.value  # type: ignore[no-any-return]

    def _run_commands(self) -> None:
        while True:
            try:
                fn, reply = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                reply.value = fn()
            except BaseException as e:  # handed back to the caller
                reply.error = e
            reply.done.set()

    def _request_stop(self) -> None:
        self._stopping = True

    # ------------------------------------------------------------------ event loop

    def _run(self) -> None:
        selector = self._selector
        assert selector is not None
        try:
            while not self._stopping:
                events = selector.select(self._next_timeout())
                self.loop_iterations += 1
                for key, mask in events:
                    sock = key.fileobj
                    if sock is self._listener:
                        self._accept()
                    elif sock is self._wake_r:
                        self._drain_wake()
                        self._run_commands()
                    else:
                        assert isinstance(sock, socket.socket)
                        conn = self._conns.get(sock)
                        if conn is not None:  # None: closed earlier in this batch
                            self._on_ready(conn, sock, mask)
                self._flush_all()
        finally:
            with self._state_lock:
                self._running = False
            self._cut_all()
            self._run_commands()  # answer anyone who raced with the stop
            selector.close()
            for own in (self._listener, self._wake_r):
                if own is not None:
                    own.close()
            self._listener = None
            self._wake_r = None

    def _drain_wake(self) -> None:
        assert self._wake_r is not None
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _next_timeout(self) -> float | None:
        """Seconds until the earliest held chunk falls due; None to wait for I/O only."""
        if self._stalled:
            return None
        earliest: float | None = None
        for conn in self._open:
            if conn.connecting:
                continue
            for d in conn.directions:
                if d.pending:
                    due = d.pending[0][0]
                    if earliest is None or due < earliest:
                        earliest = due
        if earliest is None:
            return None
        return max(0.0, earliest - time.monotonic())

    def _accept(self) -> None:
        assert self._listener is not None and self._selector is not None
        for _ in range(64):  # bounded: let other sockets have a turn
            try:
                client, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. ECONNABORTED: the client gave up before we accepted
            self.connections_accepted += 1
            if self._refusing:
                _reset_and_close(client)
                continue
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            upstream.setblocking(False)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            err = upstream.connect_ex(self._upstream)
            if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
                _reset_and_close(client)
                upstream.close()
                continue
            conn = _Connection(client, upstream)
            self._conns[client] = conn
            self._conns[upstream] = conn
            self._open.add(conn)
            self._set_interest(conn)

    def _on_ready(self, conn: _Connection, sock: socket.socket, mask: int) -> None:
        if conn.connecting:
            # Only the upstream socket is registered while connecting (for writability).
            err = conn.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err != 0:
                self._abort(conn)
                return
            conn.connecting = False
            self._set_interest(conn)
            return
        if mask & selectors.EVENT_READ:
            direction = conn.directions[0] if sock is conn.client else conn.directions[1]
            if not self._read(conn, direction):
                return
        # Writability is handled by _flush_all, which runs after every batch of events.
        self._set_interest(conn)

    def _read(self, conn: _Connection, d: _Direction) -> bool:
        """Read one chunk from `d.source`; False if the connection was closed."""
        try:
            data = d.source.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            self._abort(conn)  # RST from this side: pass it on to the other side
            return False
        due = time.monotonic() + self._delay
        if not data:
            d.eof_read = True
            d.pending.append((due, b""))
        else:
            d.pending.append((due, data))
            d.queued_bytes += len(data)
            self.pending_bytes += len(data)
        return True

    def _flush_all(self) -> None:
        for conn in list(self._open):
            if conn in self._open:  # not closed meanwhile
                self._flush(conn)

    def _flush(self, conn: _Connection) -> None:
        """Write every due chunk that the sinks accept; close when both sides are done."""
        if conn.connecting:
            return
        if not self._stalled:
            now = time.monotonic()
            for d in conn.directions:
                while d.pending and d.pending[0][0] <= now:
                    _due, data = d.pending[0]
                    if not data:  # end of stream: pass the FIN on
                        d.pending.popleft()
                        d.eof_sent = True
                        try:
                            d.sink.shutdown(socket.SHUT_WR)
                        except OSError:
                            self._abort(conn)
                            return
                        break
                    try:
                        sent = d.sink.send(data)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        self._abort(conn)
                        return
                    self.bytes_forwarded += sent
                    self.pending_bytes -= sent
                    d.queued_bytes -= sent
                    if sent == len(data):
                        d.pending.popleft()
                    else:
                        d.pending[0] = (_due, data[sent:])
                        break
        if conn.directions[0].eof_sent and conn.directions[1].eof_sent:
            self._close(conn, reset=False)
            return
        self._set_interest(conn)

    def _set_interest(self, conn: _Connection) -> None:
        assert self._selector is not None
        if conn.connecting:
            wanted = {conn.client: 0, conn.upstream: selectors.EVENT_WRITE}
        else:
            now = time.monotonic()
            wanted = {}
            to_upstream, to_client = conn.directions
            for d, other in ((to_upstream, to_client), (to_client, to_upstream)):
                mask = 0
                if not d.eof_read and d.queued_bytes < _HIGH_WATER:
                    mask |= selectors.EVENT_READ
                # Wait for writability only when a due chunk could not be written.
                if not self._stalled and other.pending and other.pending[0][0] <= now:
                    mask |= selectors.EVENT_WRITE
                wanted[d.source] = mask
        for sock, mask in wanted.items():
            old = conn.interest[sock]
            if mask == old:
                continue
            if old == 0:
                self._selector.register(sock, mask)
            elif mask == 0:
                self._selector.unregister(sock)
            else:
                self._selector.modify(sock, mask)
            conn.interest[sock] = mask

    def _abort(self, conn: _Connection) -> None:
        self._close(conn, reset=True)

    def _close(self, conn: _Connection, *, reset: bool) -> None:
        assert self._selector is not None
        if conn not in self._open:
            return  # already closed
        self._open.discard(conn)
        for sock in (conn.client, conn.upstream):
            del self._conns[sock]
            if conn.interest[sock]:
                self._selector.unregister(sock)
                conn.interest[sock] = 0
            if reset:
                _reset_and_close(sock)
            else:
                sock.close()
        for d in conn.directions:
            self.pending_bytes -= d.queued_bytes
            d.queued_bytes = 0
            d.pending.clear()

    def _cut_all(self) -> None:
        for conn in list(self._open):
            self._abort(conn)


class _Reply:
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
