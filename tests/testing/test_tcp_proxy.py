"""Tests of `pykka_delivery.testing.TcpProxy`: raw TCP behaviour first, then gRPC (HTTP/2)
through it."""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pykka_delivery.testing import TcpProxy
from pykka_delivery.testing.tcp_proxy import _CHUNK as CHUNK
from pykka_delivery.testing.tcp_proxy import _HIGH_WATER as HIGH_WATER
from tests.harness import wait_until

WAIT = 5.0  # bound on every wait for something that should happen promptly
SERVING = health_pb2.HealthCheckResponse.SERVING


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    sock.settimeout(WAIT)
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(min(n - len(data), 1024 * 1024))
        if not chunk:
            raise AssertionError(f"EOF after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


def assert_closed_by_peer(address: tuple[str, int]) -> None:
    """Connect to `address` and expect the peer to close or reset the connection at once."""
    try:
        with socket.create_connection(address, timeout=WAIT) as sock:
            assert sock.recv(1) == b""
    except ConnectionResetError:
        pass  # the RST can arrive while connect() still checks its outcome


def target(proxy: TcpProxy) -> str:
    host, port = proxy.address
    return f"{host}:{port}"


def readable_now(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def socket_inodes() -> set[str]:
    fd_dir = Path("/proc/self/fd")
    inodes = set()
    for entry in fd_dir.iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue  # closed while we looked
        if target.startswith("socket:"):
            inodes.add(target)
    return inodes


# ----------------------------------------------------------------------------- raw TCP


class Upstream:
    """A listening socket; the test accepts the proxy's connections itself."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self.listener.getsockname()
        self.accepted: list[socket.socket] = []

    def accept(self) -> socket.socket:
        self.listener.settimeout(WAIT)
        sock, _ = self.listener.accept()
        self.accepted.append(sock)
        return sock

    def close(self) -> None:
        for sock in [*self.accepted, self.listener]:
            sock.close()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    yield up
    up.close()


@pytest.fixture
def proxy(upstream: Upstream) -> Iterator[TcpProxy]:
    with TcpProxy(upstream.address) as p:
        yield p


@dataclass
class Pair:
    client: socket.socket
    server: socket.socket  # the upstream's end of the proxied connection


@pytest.fixture
def connect(proxy: TcpProxy, upstream: Upstream) -> Iterator[Callable[[], Pair]]:
    opened: list[socket.socket] = []

    def open_pair() -> Pair:
        client = socket.create_connection(proxy.address, timeout=WAIT)
        opened.append(client)
        return Pair(client, upstream.accept())

    yield open_pair
    for sock in opened:
        sock.close()


def test_bytes_are_forwarded_both_ways_and_counted(
    proxy: TcpProxy, connect: Callable[[], Pair]
) -> None:
    pair = connect()
    pair.client.sendall(b"ping")
    assert recv_exactly(pair.server, 4) == b"ping"
    pair.server.sendall(b"pong!")
    assert recv_exactly(pair.client, 5) == b"pong!"
    assert proxy.connections_accepted == 1
    wait_until(lambda: proxy.bytes_forwarded == 9)


def test_a_large_transfer_in_both_directions_arrives_intact(
    connect: Callable[[], Pair],
) -> None:
    pair = connect()
    size = 8 * 1024 * 1024  # well above the proxy's per-direction high-water mark
    up_data = os.urandom(size)
    down_data = os.urandom(size)
    senders = [
        threading.Thread(target=pair.client.sendall, args=(up_data,)),
        threading.Thread(target=pair.server.sendall, args=(down_data,)),
    ]
    for t in senders:
        t.start()
    received: dict[str, bytes] = {}
    readers = [
        threading.Thread(
            target=lambda: received.__setitem__("up", recv_exactly(pair.server, size))
        ),
        threading.Thread(
            target=lambda: received.__setitem__("down", recv_exactly(pair.client, size))
        ),
    ]
    for t in readers:
        t.start()
    for t in senders + readers:
        t.join(WAIT * 2)
        assert not t.is_alive()
    assert received["up"] == up_data
    assert received["down"] == down_data


def test_a_half_close_is_passed_on_and_the_reply_still_arrives(
    connect: Callable[[], Pair],
) -> None:
    pair = connect()
    pair.client.sendall(b"request")
    pair.client.shutdown(socket.SHUT_WR)
    assert recv_exactly(pair.server, 7) == b"request"
    assert pair.server.recv(1) == b""  # the client's FIN reached the upstream
    pair.server.sendall(b"reply")
    pair.server.shutdown(socket.SHUT_WR)
    assert recv_exactly(pair.client, 5) == b"reply"
    assert pair.client.recv(1) == b""


def test_cut_resets_both_the_client_and_the_upstream_side(
    proxy: TcpProxy, connect: Callable[[], Pair]
) -> None:
    pair = connect()
    pair.client.sendall(b"x")
    assert recv_exactly(pair.server, 1) == b"x"
    proxy.cut()
    assert proxy.active_connections == 0
    for sock in (pair.client, pair.server):
        sock.settimeout(WAIT)
        with pytest.raises(ConnectionResetError):
            sock.recv(1)


def test_new_connections_are_accepted_after_a_cut(
    proxy: TcpProxy, connect: Callable[[], Pair]
) -> None:
    connect()
    proxy.cut()
    pair = connect()
    pair.client.sendall(b"again")
    assert recv_exactly(pair.server, 5) == b"again"
    assert proxy.connections_accepted == 2


def test_refusing_closes_new_connections_without_reaching_the_upstream(
    proxy: TcpProxy, upstream: Upstream
) -> None:
    proxy.refuse(True)
    assert_closed_by_peer(proxy.address)
    assert proxy.connections_accepted == 1
    upstream.listener.setblocking(False)
    with pytest.raises(BlockingIOError):
        upstream.listener.accept()  # the proxy never connected upstream


def test_refusing_leaves_established_connections_alone(
    proxy: TcpProxy, connect: Callable[[], Pair]
) -> None:
    pair = connect()
    proxy.refuse(True)
    pair.client.sendall(b"still here")
    assert recv_exactly(pair.server, 10) == b"still here"


def test_connections_are_accepted_again_when_refusing_ends(
    proxy: TcpProxy, connect: Callable[[], Pair]
) -> None:
    proxy.refuse(True)
    proxy.refuse(False)
    pair = connect()
    pair.client.sendall(b"ok")
    assert recv_exactly(pair.server, 2) == b"ok"


def test_an_unreachable_upstream_closes_the_client_connection() -> None:
    placeholder = socket.create_server(("127.0.0.1", 0))
    dead_address = placeholder.getsockname()
    placeholder.close()  # nothing listens there now
    with TcpProxy(dead_address) as proxy:
        assert_closed_by_peer(proxy.address)
        wait_until(lambda: proxy.active_connections == 0)


def test_stall_holds_bytes_in_both_directions_and_releases_them_in_order(
    proxy: TcpProxy, connect: Callable[[], Pair]
) -> None:
    pair = connect()
    proxy.stall(True)
    for chunk in (b"one ", b"two ", b"three"):
        pair.client.sendall(chunk)
    pair.server.sendall(b"back")
    wait_until(lambda: proxy.pending_bytes == 17)  # read by the proxy, held
    assert not readable_now(pair.server)
    assert not readable_now(pair.client)
    proxy.stall(False)
    assert recv_exactly(pair.server, 13) == b"one two three"
    assert recv_exactly(pair.client, 4) == b"back"
    assert proxy.pending_bytes == 0


def test_a_stall_holds_a_bounded_amount_and_leaves_the_rest_to_tcp_flow_control(
    proxy: TcpProxy, connect: Callable[[], Pair]
) -> None:
    pair = connect()
    proxy.stall(True)
    data = os.urandom(16 * 1024 * 1024)
    sender = threading.Thread(target=pair.client.sendall, args=(data,))
    sender.start()
    wait_until(lambda: proxy.pending_bytes >= HIGH_WATER)
    time.sleep(0.2)  # the behaviour under test is that the proxy stops reading over time
    assert proxy.pending_bytes < HIGH_WATER + CHUNK
    assert sender.is_alive()  # blocked by flow control, nothing dropped
    proxy.stall(False)
    assert recv_exactly(pair.server, len(data)) == data
    sender.join(WAIT)
    assert not sender.is_alive()


def test_a_stalled_proxy_with_held_bytes_does_not_spin(
    proxy: TcpProxy, connect: Callable[[], Pair]
) -> None:
    pair = connect()
    proxy.stall(True)
    pair.client.sendall(b"held")
    wait_until(lambda: proxy.pending_bytes == 4)
    before = proxy.loop_iterations
    time.sleep(0.2)  # the behaviour under test is what the loop does over time
    assert proxy.loop_iterations - before <= 2


def test_an_idle_proxy_does_not_spin(proxy: TcpProxy, connect: Callable[[], Pair]) -> None:
    pair = connect()
    pair.client.sendall(b"x")
    recv_exactly(pair.server, 1)
    before = proxy.loop_iterations
    time.sleep(0.2)  # the behaviour under test is what the loop does over time
    assert proxy.loop_iterations - before <= 2


def test_delay_holds_each_chunk_for_the_delay_and_keeps_order(
    proxy: TcpProxy, connect: Callable[[], Pair]
) -> None:
    pair = connect()
    proxy.set_delay(0.05)
    start = time.monotonic()
    for i in range(5):
        pair.client.sendall(b"%d" % i)
    assert recv_exactly(pair.server, 5) == b"01234"
    assert time.monotonic() - start >= 0.05


def test_lowering_the_delay_does_not_let_a_later_chunk_overtake(
    proxy: TcpProxy, connect: Callable[[], Pair]
) -> None:
    pair = connect()
    proxy.set_delay(0.3)
    pair.client.sendall(b"first ")
    wait_until(lambda: proxy.pending_bytes == 6)
    proxy.set_delay(0)
    pair.client.sendall(b"second")
    assert recv_exactly(pair.server, 12) == b"first second"


def test_stop_closes_every_socket_and_ends_the_thread(upstream: Upstream) -> None:
    threads_before = set(threading.enumerate())
    sockets_before = socket_inodes()
    proxy = TcpProxy(upstream.address).start()
    clients = [socket.create_connection(proxy.address, timeout=WAIT) for _ in range(3)]
    servers = [upstream.accept() for _ in clients]
    clients[0].sendall(b"x")
    recv_exactly(servers[0], 1)
    proxy.stall(True)
    clients[1].sendall(b"held")
    wait_until(lambda: proxy.pending_bytes == 4)
    assert proxy.active_connections == 3

    proxy.stop()

    assert set(threading.enumerate()) <= threads_before
    for sock in clients + servers:
        sock.settimeout(WAIT)
        with pytest.raises(ConnectionResetError):
            sock.recv(1)
        sock.close()
    for sock in upstream.accepted:
        sock.close()
    upstream.accepted.clear()
    assert socket_inodes() - sockets_before == set()
    proxy.stop()  # idempotent


def test_control_methods_work_before_start_and_after_stop(upstream: Upstream) -> None:
    proxy = TcpProxy(upstream.address)
    proxy.stall(True)
    proxy.set_delay(0.01)
    proxy.cut()
    proxy.start()
    proxy.stop()
    proxy.refuse(True)
    proxy.cut()
    with pytest.raises(ValueError):
        proxy.set_delay(-1)


# --------------------------------------------------------------------------- gRPC


@pytest.fixture(scope="module")
def health_server() -> Iterator[int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(grace=None).wait(WAIT)


@pytest.fixture
def grpc_proxy(health_server: int) -> Iterator[TcpProxy]:
    with TcpProxy(("127.0.0.1", health_server)) as p:
        yield p


# Reconnect quickly after a refused connection, so tests need not wait out the 1 s default.
FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 200),
]


@pytest.fixture
def channel(grpc_proxy: TcpProxy) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(target(grpc_proxy), options=FAST_RECONNECT)
    yield ch
    ch.close()


@pytest.fixture
def stub(channel: grpc.Channel) -> health_pb2_grpc.HealthStub:
    return health_pb2_grpc.HealthStub(channel)


class ConnectivityWatch:
    """Records a channel's connectivity states, so a test can wait for one."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._channel = channel
        self._states: list[grpc.ChannelConnectivity] = []
        self._changed = threading.Condition()
        channel.subscribe(self._on_state)

    def _on_state(self, state: grpc.ChannelConnectivity) -> None:
        with self._changed:
            self._states.append(state)
            self._changed.notify_all()

    def wait_for_state_other_than(self, state: grpc.ChannelConnectivity) -> None:
        with self._changed:
            ok = self._changed.wait_for(
                lambda: bool(self._states) and self._states[-1] != state, WAIT
            )
        assert ok, f"channel still {state} after {WAIT} s"

    def close(self) -> None:
        self._channel.unsubscribe(self._on_state)


def check(stub: health_pb2_grpc.HealthStub, **kwargs: object) -> int:
    kwargs.setdefault("timeout", WAIT)
    return stub.Check(health_pb2.HealthCheckRequest(), **kwargs).status  # type: ignore[no-any-return]


def test_grpc_health_check_succeeds_through_the_proxy(
    grpc_proxy: TcpProxy, stub: health_pb2_grpc.HealthStub
) -> None:
    assert check(stub) == SERVING
    assert grpc_proxy.connections_accepted == 1
    assert grpc_proxy.bytes_forwarded > 0


def test_grpc_call_in_flight_fails_with_unavailable_on_cut(
    grpc_proxy: TcpProxy, stub: health_pb2_grpc.HealthStub
) -> None:
    watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=WAIT)
    try:
        assert next(watch).status == SERVING  # the stream is open and waiting
        grpc_proxy.cut()
        with pytest.raises(grpc.RpcError) as info:
            next(watch)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        watch.cancel()


def test_grpc_new_call_succeeds_after_a_cut(
    grpc_proxy: TcpProxy, channel: grpc.Channel, stub: health_pb2_grpc.HealthStub
) -> None:
    assert check(stub) == SERVING
    watch = ConnectivityWatch(channel)
    try:
        watch.wait_for_state_other_than(grpc.ChannelConnectivity.IDLE)  # READY
        grpc_proxy.cut()
        # A call issued before gRPC has noticed the reset can fail with UNAVAILABLE
        # ("sendmsg: Connection reset by peer"): wait until the channel has left READY.
        watch.wait_for_state_other_than(grpc.ChannelConnectivity.READY)
    finally:
        watch.close()
    assert check(stub, wait_for_ready=True) == SERVING
    assert grpc_proxy.connections_accepted == 2  # over a new connection


def test_grpc_calls_fail_fast_while_refusing(
    grpc_proxy: TcpProxy, stub: health_pb2_grpc.HealthStub
) -> None:
    grpc_proxy.refuse(True)
    with pytest.raises(grpc.RpcError) as info:
        check(stub, timeout=WAIT)
    # UNAVAILABLE, not DEADLINE_EXCEEDED: the call did not wait for the 5 s deadline.
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert grpc_proxy.connections_accepted >= 1


def test_grpc_calls_succeed_once_refusing_ends(
    grpc_proxy: TcpProxy, stub: health_pb2_grpc.HealthStub
) -> None:
    grpc_proxy.refuse(True)
    with pytest.raises(grpc.RpcError):
        check(stub)
    grpc_proxy.refuse(False)
    assert check(stub, wait_for_ready=True) == SERVING


def test_grpc_call_hits_its_deadline_while_stalled_and_calls_succeed_after(
    grpc_proxy: TcpProxy, stub: health_pb2_grpc.HealthStub
) -> None:
    assert check(stub) == SERVING
    grpc_proxy.stall(True)
    with pytest.raises(grpc.RpcError) as info:
        check(stub, timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    grpc_proxy.stall(False)
    assert check(stub) == SERVING
    assert grpc_proxy.connections_accepted == 1  # the stall did not break the connection


def test_grpc_call_made_while_stalled_completes_once_released(
    grpc_proxy: TcpProxy, stub: health_pb2_grpc.HealthStub
) -> None:
    assert check(stub) == SERVING
    grpc_proxy.stall(True)
    call = stub.Check.future(health_pb2.HealthCheckRequest(), timeout=WAIT)
    wait_until(lambda: grpc_proxy.pending_bytes > 0)  # the request is held in the proxy
    assert not call.done()
    grpc_proxy.stall(False)
    assert call.result(timeout=WAIT).status == SERVING


def test_grpc_round_trip_takes_at_least_the_delay(
    grpc_proxy: TcpProxy, stub: health_pb2_grpc.HealthStub
) -> None:
    assert check(stub) == SERVING  # connect first, so only the round trip is timed
    grpc_proxy.set_delay(0.05)
    start = time.monotonic()
    assert check(stub) == SERVING
    assert time.monotonic() - start >= 0.05


def test_grpc_keepalive_with_a_ping_timeout_detects_a_stalled_connection(
    health_server: int,
) -> None:
    # In grpcio 1.85 an unanswered keepalive ping is timed by grpc.http2.ping_timeout_ms
    # (default 60 s); grpc.keepalive_timeout_ms alone did not close a stalled transport.
    with TcpProxy(("127.0.0.1", health_server)) as proxy:
        channel = grpc.insecure_channel(
            target(proxy),
            options=[("grpc.keepalive_time_ms", 200), ("grpc.http2.ping_timeout_ms", 500)],
        )
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(), timeout=WAIT
        )
        try:
            assert next(watch).status == SERVING
            proxy.stall(True)
            with pytest.raises(grpc.RpcError) as info:
                next(watch)
            # Not DEADLINE_EXCEEDED: the unanswered keepalive ping closed the transport.
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "ping timeout" in (info.value.details() or "")
        finally:
            watch.cancel()
            channel.close()
