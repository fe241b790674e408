"""The single-active-consumer coordinator: registrations per second and fail-over time.

Measured in the same run:

* ``registrations``: ``--connections`` `CoordinatorClient`s register
  ``--registrations`` consumers in all, concurrently (one thread per connection, each
  waiting for its reply before the next request), spread over ``--client-processes``
  child processes (default 4, as many application instances would be; 0: all in this
  process, as the figures before 2026-11-26 were: one process's clients, sharing its
  GIL, were the limit), through the real gRPC service: a
  `CoordinatorServer` + `CoordinatorActor` in a child process, with a `SqliteCommandLog`
  in a temporary directory (``registrations_per_s_sqlite``), a `MemoryCommandLog`, and a
  `PostgresCommandLog` on a throwaway PostgreSQL cluster (tests/postgres.py's: a unix
  socket, fsync off; ``registrations_per_s_postgres``, left out when the server binaries
  are missing): ``--runs`` runs of each, interleaved, each figure the median run. The
  actor stores the commands of requests arriving together with one append (group
  commit). Each connection registers one consumer in each of
  ``registrations / connections`` simple groups, so every group ends with one consumer per
  connection (the first one active), as when every instance of an application consumes
  the same streams. ``registrations_per_s_sqlite_pipelined``: the same on SQLite with
  ``PIPELINED_THREADS`` threads per connection, each registering its share of the groups
  (a client with many subscriptions registering at once: a partitioned group's member,
  a reconnect), whose requests the server carries out together (``stream_pipeline``).
  ``coordinator_us_per_registration`` / ``clients_us_per_registration``: the CPU the
  coordinator's process / the clients' processes used per registration (less noisy
  than the rate on a shared machine).
* ceiling ``machine``: the same commands through the pure `apply`, in memory, in this
  process (no actor, no log, no I/O); and, in between, the same commands told to a
  `CoordinatorActor` in this process all at once (with a ``reply_to``, as the service
  tells them: group commits; no gRPC), with each log.
* ``failover``: a coordinator process, a producer process (a `Producer` handle on a
  transport `Node`, sending numbered 100-byte messages at ``--rate`` msgs/s) and three
  consumer processes, each a `CoordinatedConsumer` in one simple group. ``--rounds``
  times: SIGKILL the active consumer's process, and measure from the kill
  (CLOCK_MONOTONIC in this process right before ``os.kill``) to the first delivery
  received by the next active consumer (CLOCK_MONOTONIC in that process; the processes
  share the clock). A fresh consumer process is started after each take-over, so there
  are always two standbys. Detection timeouts are low: the coordinator's
  ``disconnected_timeout`` and both sides' gRPC keepalive (see the printed settings). A
  SIGKILLed process's TCP connections are closed by the kernel at once, so the
  coordinator sees the stream end within milliseconds and then waits the
  ``disconnected_timeout`` (``detection_floor_ms``) before it presumes the consumer down.
  Each round also gives the time to the coordinator's ``Detach`` (stream end seen) and to
  the new consumer's activation (its `Consumer` created). These consumers name their
  node by its address only (no liveness probe), so the figure is that of the timeout.
* ``failover_default``: the same rounds with every setting at its default (the
  coordinator's ``disconnected_timeout`` and keepalive, the clients'), the consumers'
  clients built with ``node=`` their transport `Node`: the coordinator's liveness probe
  finds a killed process's port refused and hands its group over at once
  (``failover_ms_default_p50`` / ``_max``).
* ``leader_failover``: three `CoordinatorReplica` processes on a throwaway PostgreSQL
  database (bench/_leader_failover.py; lease ttl 2 s, acquire interval 0.2 s) and a
  client given the three addresses. ``min(--rounds, 5)`` times: SIGKILL the leader and
  measure from the kill to the client's ``list_groups`` answered by the new leader
  (``leader_failover_ms_p50`` / ``_max``; left out without PostgreSQL).

The last line printed is one JSON object with the figures.

Defaults: 2 000 registrations over 20 connections, 10 fail-over rounds of each kind (about 60 s);
``--quick``: 400 registrations, 2 rounds (about 10 s).

Usage: python bench/coordinator.py [--registrations N] [--connections C] [--rounds K]
[--rate R] [--runs N] [--client-processes P] [--part all|registrations|failover_default]
[--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pykka

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pykka_delivery import ConsumerControllerSettings, Producer  # noqa: E402
from pykka_delivery.coordinator import (  # noqa: E402
    SIMPLE,
    CoordinatedConsumer,
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
    Execute,
    GroupId,
    MemoryCommandLog,
    RegisterConsumer,
    Registered,
    SqliteCommandLog,
    apply,
    initial_state,
)
from pykka_delivery.transport import Node  # noqa: E402

PAYLOAD = b"x" * 100
GROUP = ("bench", "orders", "billing")
WAIT = 30.0  # bound on every single wait of the parent
CLIENT_PROCESSES = 4  # the registrations' clients are spread over this many processes
PIPELINED_THREADS = 10  # registering threads per connection in the pipelined variant

# Fail-over settings (seconds): low detection timeouts, printed with the figures.
DISCONNECTED_TIMEOUT = 0.5
KEEPALIVE_TIME = 0.2
KEEPALIVE_TIMEOUT = 0.2
MIN_PING_INTERVAL = 0.1  # the server accepts the clients' 0.2 s pings


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


# --- child processes ---------------------------------------------------------------------


class _DetachReporter(logging.Handler):
    """Prints a JSON line, with CLOCK_MONOTONIC, when the coordinator actor applies the
    end of a connection's stream (its INFO log line ``Connection %r detached (%s)``)."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "Connection %r detached (%s)" and isinstance(record.args, tuple):
            connection, how = record.args
            _emit(detached=time.monotonic(), connection=connection, how=how)


def child_coordinator(
    log: str, disconnected_timeout: float, keepalive_time: float, keepalive_timeout: float
) -> None:
    """``disconnected_timeout`` 0: the coordinator's default settings."""
    settings = None
    if disconnected_timeout:
        settings = CoordinatorSettings(
            disconnected_timeout=disconnected_timeout, recovery_min_delay=disconnected_timeout
        )
    logger = logging.getLogger("pykka_delivery.coordinator")
    logger.setLevel(logging.INFO)
    logger.addHandler(_DetachReporter())
    logger.propagate = False
    actor = CoordinatorActor.start(command_log_of(log), settings)
    server_settings = CoordinatorServerSettings(
        keepalive_time=keepalive_time,
        keepalive_timeout=keepalive_timeout,
        min_ping_interval=min(1.0, MIN_PING_INTERVAL if keepalive_time < 1 else 1.0),
    )
    with CoordinatorServer(actor, server_settings) as server:
        _emit(ready=True, address=server.address, pid=os.getpid())
        threading.Event().wait()  # until killed


def child_register(address: str, first: int, count: int, groups: int, threads: int = 1) -> None:
    """Connections ``first .. first + count - 1`` of a registrations run: each registers
    one consumer in each of ``groups`` groups, ``threads`` threads per connection (each
    a share of the groups, one registration at a time), once SIGUSR1 arrives; prints the
    CLOCK_MONOTONIC start and end and the CPU this process used."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # every thread inherits it
    clients = [CoordinatorClient(address, owner=f"bench-{c}") for c in range(first, first + count)]
    if not all(client.wait_connected(WAIT) for client in clients):
        raise RuntimeError("a client did not connect")
    go = threading.Event()
    failures: list[BaseException] = []

    def register_all(client: CoordinatorClient, share: list[GroupId]) -> None:
        go.wait()
        try:
            for gid in share:
                client.register(gid, client.next_subscription_id(), lambda _: None, timeout=WAIT)
        except BaseException as error:
            failures.append(error)

    every = _groups(groups)
    workers = [
        threading.Thread(target=register_all, args=(c, every[t::threads]))
        for c in clients
        for t in range(threads)
    ]
    for thread in workers:
        thread.start()
    _emit(ready=True)
    signal.sigwait({signal.SIGUSR1})
    cpu, started = _own_cpu_seconds(), time.monotonic()
    go.set()
    for thread in workers:
        thread.join(WAIT * 4)
    ended, cpu = time.monotonic(), _own_cpu_seconds() - cpu
    if failures:
        raise failures[0]
    _emit(started=started, ended=ended, cpu=cpu)
    for client in clients:
        client.close(goodbye=False)


def child_producer(rate: float) -> None:
    with Node() as node:
        producer = Producer("orders", self_ref_factory=node.expose("orders"))
        _emit(ready=True, address=f"{node.address}/orders")
        period = 0.001
        per_tick = max(1, round(rate * period))
        number = 0
        next_tick = time.monotonic()
        while True:  # until killed
            for _ in range(per_tick):
                number += 1
                producer.send(number.to_bytes(8, "big") + PAYLOAD[8:])
            next_tick += period
            pause = next_tick - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            elif pause < -0.1:  # stalled (no consumer): go on at the rate, no burst
                next_tick = time.monotonic()


def child_consume(coordinator: str, producer: str, name: str, defaults: bool) -> None:
    """``defaults``: every setting at its default, and the client given the `Node` (the
    coordinator probes it); otherwise the low timeouts, and the node's address only."""
    client_settings = CoordinatorClientSettings(
        keepalive_time=KEEPALIVE_TIME,
        keepalive_timeout=KEEPALIVE_TIMEOUT,
        reconnect_backoff_min=0.05,
        reconnect_backoff_max=0.5,
    )
    consumer_settings = ConsumerControllerSettings(
        flow_control_window=100, resend_interval_min=0.2, resend_interval_max=2.0
    )
    if defaults:
        client_settings, consumer_settings = CoordinatorClientSettings(), None
    with Node() as node:
        client = CoordinatorClient(
            coordinator,
            node=node if defaults else node.address,
            owner=name,
            settings=client_settings,
        )
        consumer = CoordinatedConsumer(
            client, *GROUP, node.ref(producer), settings=consumer_settings, node=node
        )
        _emit(ready=True, active=consumer.registered.active, connection=client.connection_id)
        activations = 0
        for delivery in consumer:  # until killed
            intervals = consumer.intervals()
            if len(intervals) > activations:
                now = time.monotonic()
                activations = len(intervals)
                number = int.from_bytes(delivery.message[:8], "big")
                _emit(first=now, start=intervals[-1].start, number=number)
            delivery.confirm()


# --- the parent's side ---------------------------------------------------------------------

_LINES = threading.Condition()  # notified on every line read from any child
_CHILDREN: list[Proc] = []  # every child started, killed when the bench ends


class Proc:
    """A child process (``--child role args``) whose stdout JSON lines are collected by a
    thread; its stderr goes to a file, shown when something fails."""

    def __init__(self, name: str, role: str, args: list[str], log_dir: Path) -> None:
        self.name = name
        self.connection = ""  # a consumer's coordinator connection id
        self.lines: list[dict[str, Any]] = []
        self.stderr_path = log_dir / f"{name}.stderr"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        with open(self.stderr_path, "w") as stderr:
            self.popen = subprocess.Popen(
                [sys.executable, __file__, "--child", role, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=env,
                cwd=ROOT,
            )
        _CHILDREN.append(self)
        assert self.popen.stdout is not None
        threading.Thread(target=self._read, args=(self.popen.stdout,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            try:
                parsed = json.loads(line)
            except ValueError:
                continue
            with _LINES:
                self.lines.append(parsed)
                _LINES.notify_all()
        with _LINES:
            _LINES.notify_all()  # it exited

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def failure(self, what: str) -> RuntimeError:
        tail = self.stderr_path.read_text()[-3000:] if self.stderr_path.exists() else ""
        return RuntimeError(f"{self.name}: {what}\n--- stderr (tail) ---\n{tail}")

    def expect(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first line (from the start) satisfying ``predicate``, waiting for it."""
        return wait_for(lambda: next((x for x in self.lines if predicate(x)), None), [self])

    def kill(self) -> None:
        if self.alive():
            self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)


def wait_for(find: Callable[[], Any], procs: list[Proc], timeout: float = WAIT) -> Any:
    """Wait until ``find()`` (called with the lines lock held) gives something else than
    None; fails if one of ``procs`` exits or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    with _LINES:
        while True:
            found = find()
            if found is not None:
                return found
            for proc in procs:
                if not proc.alive():
                    raise proc.failure("exited early")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise procs[0].failure(f"nothing expected within {timeout} s")
            _LINES.wait(min(remaining, 0.1))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _groups(per_connection: int) -> list[GroupId]:
    return [GroupId("bench", f"stream-{g:04d}", "app") for g in range(per_connection)]


def registration_commands(total: int, connections: int) -> list[RegisterConsumer]:
    """The service run's registrations, in the order they roughly arrive (every
    connection registers in group 0, then in group 1, ...)."""
    per = total // connections
    ids = [f"{n:032x}" for n in range(connections)]  # as long as a client's uuid4 hex
    return [
        RegisterConsumer(gid.namespace, gid.stream, gid.name, ids[c], g + 1, f"host:{c}", SIMPLE)
        for g, gid in enumerate(_groups(per))
        for c in range(connections)
    ]


def machine_rate(commands: list[RegisterConsumer]) -> dict[str, float]:
    """Registrations/s through `apply`; also the mean cost of one registration over the
    first and the last tenth of the commands (it grows with the consumers registered)."""
    state = initial_state()
    for command in commands[: len(commands) // 10]:  # warm-up
        state = apply(state, command).state
    state = initial_state()
    stamps = [time.perf_counter()]
    for command in commands:
        state = apply(state, command).state
        stamps.append(time.perf_counter())
    assert sum(len(g.consumers) for g in state.groups.values()) == len(commands)
    tenth = max(1, len(commands) // 10)
    return {
        "per_s": len(commands) / (stamps[-1] - stamps[0]),
        "first_us": (stamps[tenth] - stamps[0]) / tenth * 1e6,
        "last_us": (stamps[-1] - stamps[-1 - tenth]) / tenth * 1e6,
    }


def actor_rate(commands: list[RegisterConsumer], log: str) -> float:
    """Registrations/s told to the actor all at once with a ``reply_to``, as the service
    tells them (so they are stored in group commits)."""
    actor = CoordinatorActor.start(command_log_of(log))
    replies: list[Any] = []
    done = threading.Event()

    def reply_to(reply: Any) -> None:  # in the actor's thread
        replies.append(reply)
        if len(replies) == len(commands):
            done.set()

    try:
        started = time.perf_counter()
        for command in commands:
            actor.tell(Execute(command, reply_to))
        if not done.wait(WAIT):
            raise RuntimeError(f"{len(replies)} of {len(commands)} registrations answered")
        seconds = time.perf_counter() - started
    finally:
        actor.stop()
    assert all(isinstance(reply, Registered) for reply in replies)
    return len(commands) / seconds


def service_rate(
    total: int,
    connections: int,
    log: str,
    log_dir: Path,
    processes: int = 0,
    *,
    threads: int = 1,
) -> dict[str, float]:
    """Registrations through the gRPC service; also the CPU each side used meanwhile, as
    a share of one core. ``processes``: the clients run in that many child processes (0:
    in this one)."""
    coordinator = Proc(
        f"coordinator-{Path(log).name}", "coordinator", [log, "0", "10", "5"], log_dir
    )
    clients: list[CoordinatorClient] = []
    try:
        address = coordinator.expect(lambda line: bool(line.get("ready")))["address"]
        if processes:
            return _service_rate_from_processes(
                total, connections, processes, address, coordinator, threads=threads
            )
        clients = [CoordinatorClient(address, owner=f"bench-{c}") for c in range(connections)]
        for client in clients:
            if not client.wait_connected(WAIT):
                raise coordinator.failure("a client did not connect")
        groups = _groups(total // connections)
        barrier = threading.Barrier(connections + 1)
        failures: list[BaseException] = []

        def register_all(client: CoordinatorClient) -> None:
            try:
                barrier.wait(WAIT)
                for gid in groups:
                    client.register(
                        gid, client.next_subscription_id(), lambda _: None, timeout=WAIT
                    )
            except BaseException as error:
                failures.append(error)

        threads = [threading.Thread(target=register_all, args=(c,)) for c in clients]
        for thread in threads:
            thread.start()
        barrier.wait(WAIT)
        cpu_coordinator, cpu_self = _cpu_seconds(coordinator.pid), _own_cpu_seconds()
        started = time.perf_counter()
        for thread in threads:
            thread.join(WAIT * 4)
        seconds = time.perf_counter() - started
        cpu_coordinator = _cpu_seconds(coordinator.pid) - cpu_coordinator
        cpu_self = _own_cpu_seconds() - cpu_self
        if failures:
            raise failures[0]
        registered = sum(len(g.consumers) for g in clients[0].list_groups("bench"))
        if registered != len(groups) * connections:
            raise coordinator.failure(f"{registered} consumers registered, expected more")
    finally:
        for client in clients:
            client.close(goodbye=False)
        coordinator.kill()
    return {
        "per_s": registered / seconds,
        "coordinator_cpu": cpu_coordinator / seconds,
        "clients_cpu": cpu_self / seconds,
        "coordinator_us": cpu_coordinator / registered * 1e6,
        "clients_us": cpu_self / registered * 1e6,
    }


def _service_rate_from_processes(
    total: int,
    connections: int,
    processes: int,
    address: str,
    coordinator: Proc,
    *,
    threads: int,
) -> dict[str, float]:
    """`service_rate` with the connections spread over ``processes`` child processes,
    ``threads`` registering threads per connection."""
    groups = total // connections
    shares = [connections // processes + (p < connections % processes) for p in range(processes)]
    firsts = [sum(shares[:p]) for p in range(processes)]
    log_dir = coordinator.stderr_path.parent
    procs = [
        Proc(
            f"clients-{p}",
            "register",
            [address, str(firsts[p]), str(shares[p]), str(groups), str(threads)],
            log_dir,
        )
        for p in range(processes)
        if shares[p]
    ]
    try:
        for proc in procs:
            proc.expect(lambda line: bool(line.get("ready")))
        cpu_coordinator = _cpu_seconds(coordinator.pid)
        for proc in procs:
            os.kill(proc.pid, signal.SIGUSR1)
        done = [proc.expect(lambda line: "ended" in line) for proc in procs]
        cpu_coordinator = _cpu_seconds(coordinator.pid) - cpu_coordinator
        seconds = max(d["ended"] for d in done) - min(d["started"] for d in done)
        with contextlib.closing(CoordinatorClient(address, owner="bench-check")) as client:
            registered = sum(len(g.consumers) for g in client.list_groups("bench"))
        if registered != groups * connections:
            raise coordinator.failure(f"{registered} consumers registered, expected more")
    finally:
        for proc in procs:
            proc.kill()
    return {
        "per_s": registered / seconds,
        "coordinator_cpu": cpu_coordinator / seconds,
        "clients_cpu": sum(d["cpu"] for d in done) / seconds,
        "coordinator_us": cpu_coordinator / registered * 1e6,
        "clients_us": sum(d["cpu"] for d in done) / registered * 1e6,
    }


# --- registrations: group commit on SQLite and PostgreSQL ----------------------------------


def command_log_of(spec: str) -> Any:
    """The coordinator's log for ``spec``: "memory", a ``postgresql://`` URL (a
    `PostgresCommandLog`) or a SQLite file path."""
    if spec == "memory":
        return MemoryCommandLog()
    if spec.startswith("postgresql://"):
        # Only with the [postgres] extra installed.
        from pykka_delivery.coordinator.store_postgres import (  # noqa: PLC0415
            PostgresCommandLog,
        )

        return PostgresCommandLog(spec)
    return SqliteCommandLog(spec)


@contextlib.contextmanager
def postgres_server() -> Iterator[Any]:
    """A throwaway PostgreSQL cluster (tests/postgres.py's `PostgresServer`: a unix socket
    in a temporary directory, fsync off), stopped and removed on exit; None when the
    server binaries or the PostgreSQL command log are missing."""
    try:
        from pykka_delivery.coordinator import store_postgres  # noqa: F401, PLC0415
        from tests.postgres import find_binaries, running_server  # noqa: PLC0415
    except ImportError as error:
        print(f"  no PostgreSQL figures: {error}")
        yield None
        return
    binaries = find_binaries()
    if binaries is None:
        print("  no PostgreSQL figures: initdb and pg_ctl not found (apt-get install postgresql)")
        yield None
        return
    with running_server(binaries) as server:
        yield server


def _median_run(results: list[dict[str, float]]) -> dict[str, float]:
    return sorted(results, key=lambda r: r["per_s"])[len(results) // 2]


def measure_registrations(
    total: int, connections: int, runs: int, log_dir: Path, processes: int = CLIENT_PROCESSES
) -> dict[str, float]:
    """Registrations through gRPC, ``runs`` runs on each log interleaved (each with a
    fresh log), each figure the median run; and the ceilings of the same commands."""
    commands = registration_commands(total, connections)
    where = f"in {processes} client processes" if processes else "in this process"
    print(
        f"registrations: {total} over {connections} connections ({where}) into "
        f"{total // connections} simple groups ({connections} consumers each), "
        f"median of {runs} runs"
    )
    machine = machine_rate(commands)
    figures: dict[str, float] = {"machine_registrations_per_s": machine["per_s"]}
    figures["actor_sqlite_registrations_per_s"] = actor_rate(
        commands, str(log_dir / "actor.sqlite")
    )
    figures["actor_memory_registrations_per_s"] = actor_rate(commands, "memory")
    results: dict[str, list[dict[str, float]]] = {
        "sqlite": [],
        "memory": [],
        "postgres": [],
        "sqlite_pipelined": [],
    }
    with postgres_server() as postgres:
        for run in range(runs):
            sqlite_path = str(log_dir / f"service-{run}.sqlite")
            for name, log in (("sqlite", sqlite_path), ("memory", "memory")):
                results[name].append(service_rate(total, connections, log, log_dir, processes))
            if processes:
                pipelined = str(log_dir / f"pipelined-{run}.sqlite")
                results["sqlite_pipelined"].append(
                    service_rate(
                        total, connections, pipelined, log_dir, processes, threads=PIPELINED_THREADS
                    )
                )
            if postgres is not None:
                url = postgres.create_database()
                results["postgres"].append(
                    service_rate(total, connections, url, log_dir, processes)
                )
    sqlite, memory = _median_run(results["sqlite"]), _median_run(results["memory"])
    figures["registrations_per_s_sqlite"] = sqlite["per_s"]
    figures["registrations_per_s"] = sqlite["per_s"]  # the name of the figures before
    figures["registrations_memory_per_s"] = memory["per_s"]
    if results["postgres"]:
        postgres_run = _median_run(results["postgres"])
        figures["registrations_per_s_postgres"] = postgres_run["per_s"]
        figures["coordinator_us_per_registration_postgres"] = postgres_run["coordinator_us"]
        figures["clients_us_per_registration_postgres"] = postgres_run["clients_us"]
    if results["sqlite_pipelined"]:
        pipelined_run = _median_run(results["sqlite_pipelined"])
        figures["registrations_per_s_sqlite_pipelined"] = pipelined_run["per_s"]
        figures["coordinator_us_per_registration_pipelined"] = pipelined_run["coordinator_us"]
        figures["clients_us_per_registration_pipelined"] = pipelined_run["clients_us"]
    figures["registrations_vs_machine"] = sqlite["per_s"] / machine["per_s"]
    figures["client_processes"] = processes
    figures["coordinator_cpu_share"] = sqlite["coordinator_cpu"]
    figures["clients_cpu_share"] = sqlite["clients_cpu"]
    figures["coordinator_us_per_registration"] = sqlite["coordinator_us"]
    figures["clients_us_per_registration"] = sqlite["clients_us"]
    figures["machine_us_first_tenth"] = machine["first_us"]
    figures["machine_us_last_tenth"] = machine["last_us"]
    for key, value in figures.items():
        shown = f"{value:>10.3f}" if value < 10 else f"{value:>10,.0f}"
        print(f"  {key:<42}{shown}")
    for name, rows in results.items():
        if rows:
            print(f"  {name} runs: " + ", ".join(f"{r['per_s']:,.0f}/s" for r in rows))
    return figures


class Failover:
    """The coordinator, the producer and the consumer processes of the fail-over runs;
    ``defaults``: every setting at its default and the consumers probed (see the module
    docstring), otherwise the low detection timeouts."""

    def __init__(self, log_dir: Path, rate: float, *, defaults: bool = False) -> None:
        self.log_dir = log_dir
        self.defaults = defaults
        self.procs: list[Proc] = []
        self.consumers: list[Proc] = []  # alive, in registration order
        server = CoordinatorServerSettings()
        self.coordinator = self._spawn(
            "coordinator",
            "coordinator",
            str(log_dir / ("failover-default.sqlite" if defaults else "failover.sqlite")),
            "0" if defaults else str(DISCONNECTED_TIMEOUT),
            str(server.keepalive_time if defaults else KEEPALIVE_TIME),
            str(server.keepalive_timeout if defaults else KEEPALIVE_TIMEOUT),
        )
        self.address = self.coordinator.expect(lambda line: bool(line.get("ready")))["address"]
        producer = self._spawn("producer", "producer", str(rate))
        self.producer_address = producer.expect(lambda line: bool(line.get("ready")))["address"]
        self.spawned = 0

    def _spawn(self, name: str, role: str, *args: str) -> Proc:
        proc = Proc(name, role, list(args), self.log_dir)
        self.procs.append(proc)
        return proc

    def add_consumer(self) -> Proc:
        name = f"consumer-{self.spawned}"
        self.spawned += 1
        mode = "defaults" if self.defaults else "fast"
        proc = self._spawn(name, "consume", self.address, self.producer_address, name, mode)
        ready = proc.expect(lambda line: bool(line.get("ready")))
        proc.connection = ready["connection"]
        self.consumers.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            proc.kill()

    def round(self, active: Proc, settle: float) -> tuple[Proc, dict[str, float]]:
        """Let ``active`` consume for ``settle`` seconds, kill it, and time the take-over;
        returns the new active consumer and the times."""
        time.sleep(settle)
        others = [c for c in self.consumers if c is not active]
        seen = {id(c): len(c.lines) for c in others}
        killed_at = time.monotonic()
        os.kill(active.pid, signal.SIGKILL)
        active.popen.wait(10)
        self.consumers.remove(active)

        def first_of_next() -> tuple[Proc, dict[str, Any]] | None:
            for proc in others:
                for line in proc.lines[seen[id(proc)] :]:
                    if "first" in line:
                        return proc, line
            return None

        successor, first = wait_for(first_of_next, others)
        detached = self.coordinator.expect(
            lambda line: (
                line.get("connection") == active.connection and line["detached"] > killed_at
            )
        )
        return successor, {
            "failover_ms": (first["first"] - killed_at) * 1000,
            "activation_ms": (first["start"] - killed_at) * 1000,
            "detach_ms": (detached["detached"] - killed_at) * 1000,
        }

    def detaches(self) -> int:
        """Streams the coordinator saw end (one per kill; any more: keepalive misses)."""
        return sum(1 for line in self.coordinator.lines if "detached" in line)


def run_failover(
    rounds: int, rate: float, log_dir: Path, *, defaults: bool = False
) -> dict[str, Any]:
    setup = Failover(log_dir, rate, defaults=defaults)
    try:
        first = setup.add_consumer()
        if not first.lines[0]["active"]:
            raise first.failure("the first consumer registered is not active")
        first.expect(lambda line: "first" in line)
        for _ in range(2):
            setup.add_consumer()
        active, results = first, []
        for _ in range(rounds):
            active, result = setup.round(active, settle=0.5)
            results.append(result)
            print(
                f"  round {len(results)}: fail-over {result['failover_ms']:7.1f} ms "
                f"(stream end seen {result['detach_ms']:5.1f} ms, "
                f"activated {result['activation_ms']:7.1f} ms)"
            )
            setup.add_consumer()  # two standbys again
        spurious = setup.detaches() - rounds
        activations = sum(1 for c in setup.procs for line in c.lines if "first" in line)
    finally:
        setup.kill_all()
    return {
        "rounds": results,
        "spurious_detaches": spurious,
        "extra_activations": activations - (rounds + 1),  # one per round and the first
    }


def measure_failover_default(rounds: int, rate: float, log_dir: Path) -> dict[str, Any]:
    """The fail-over with every setting at its default, the consumers probed."""
    print(
        f"fail-over with the default settings: {rounds} rounds, 3 consumer processes "
        f"probed, producer {rate:,.0f} msgs/s; disconnected_timeout "
        f"{CoordinatorSettings().disconnected_timeout} s, probe_timeout "
        f"{CoordinatorServerSettings().probe_timeout} s"
    )
    outcome = run_failover(rounds, rate, log_dir, defaults=True)
    failover = sorted(r["failover_ms"] for r in outcome["rounds"])
    figures: dict[str, Any] = {
        "failover_ms_default_p50": statistics.median(failover),
        "failover_ms_default_max": failover[-1],
    }
    for key, value in figures.items():
        print(f"  {key:<36}{value:>10.1f}")
    figures["failover_default_extra_activations"] = outcome["extra_activations"]
    return figures


def measure_leader_failover(rounds: int, log_dir: Path) -> dict[str, float]:
    """Leader fail-over among three coordinator replicas on PostgreSQL (see the module
    docstring); no figures without a PostgreSQL server."""
    import _leader_failover  # noqa: PLC0415 (next to this file; needs the postgres extra)

    print(
        f"leader fail-over: {rounds} rounds, 3 replicas, lease ttl {_leader_failover.TTL} s, "
        f"acquire interval {_leader_failover.ACQUIRE_INTERVAL} s"
    )
    with postgres_server() as postgres:
        if postgres is None:
            return {}
        times = _leader_failover.run(rounds, postgres.create_database(), log_dir)
    figures = {
        "leader_failover_ms_p50": statistics.median(times),
        "leader_failover_ms_max": max(times),
        "leader_failover_ttl_ms": _leader_failover.TTL * 1000,
    }
    for key, value in figures.items():
        print(f"  {key:<36}{value:>10.1f}")
    return figures


def measure(
    total: int, connections: int, rounds: int, rate: float, runs: int, *, processes: int
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pykka-delivery-bench-") as tmp:
        log_dir = Path(tmp)
        figures.update(measure_registrations(total, connections, runs, log_dir, processes))
        print(
            f"fail-over: {rounds} rounds, 3 consumer processes, producer {rate:,.0f} msgs/s; "
            f"disconnected_timeout {DISCONNECTED_TIMEOUT} s, keepalive_time {KEEPALIVE_TIME} s "
            f"and keepalive_timeout {KEEPALIVE_TIMEOUT} s (clients and server), "
            f"server min_ping_interval {MIN_PING_INTERVAL} s"
        )
        outcome = run_failover(rounds, rate, log_dir)
        failover_default = measure_failover_default(rounds, rate, log_dir)
        leader_failover = measure_leader_failover(min(rounds, 5), log_dir)
    failover = sorted(r["failover_ms"] for r in outcome["rounds"])
    figures["failover_ms_p50"] = statistics.median(failover)
    figures["failover_ms_max"] = failover[-1]
    figures["failover_ms_min"] = failover[0]
    figures["activation_ms_p50"] = statistics.median(r["activation_ms"] for r in outcome["rounds"])
    figures["detach_ms_p50"] = statistics.median(r["detach_ms"] for r in outcome["rounds"])
    figures["detection_floor_ms"] = DISCONNECTED_TIMEOUT * 1000
    for key in list(figures)[-6:]:
        print(f"  {key:<36}{figures[key]:>10.1f}")
    figures["failover_rounds"] = len(failover)
    figures["spurious_detaches"] = outcome["spurious_detaches"]
    figures["extra_activations"] = outcome["extra_activations"]
    for key in ("spurious_detaches", "extra_activations"):
        print(f"  {key:<36}{figures[key]:>10}")
    figures["keepalive_ms"] = KEEPALIVE_TIME * 1000
    figures["keepalive_timeout_ms"] = KEEPALIVE_TIMEOUT * 1000
    figures.update(failover_default)
    figures.update(leader_failover)
    return figures


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        role, *args = sys.argv[2:]
        if role == "coordinator":
            child_coordinator(args[0], float(args[1]), float(args[2]), float(args[3]))
        elif role == "register":
            child_register(args[0], int(args[1]), int(args[2]), int(args[3]), int(args[4]))
        elif role == "producer":
            child_producer(float(args[0]))
        else:
            child_consume(args[0], args[1], args[2], args[3] == "defaults")
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registrations", type=int, default=2_000)
    parser.add_argument("--connections", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10, help="fail-over rounds")
    parser.add_argument("--rate", type=float, default=2_000, help="producer msgs/s")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument(
        "--part",
        choices=("all", "registrations", "failover_default"),
        default="all",
        help="registrations: only the registrations (SQLite, memory, PostgreSQL); "
        "failover_default: only the fail-over with the default settings",
    )
    parser.add_argument("--runs", type=int, default=3, help="registration runs per log")
    parser.add_argument(
        "--client-processes",
        type=int,
        default=CLIENT_PROCESSES,
        help="registrations: the clients' processes (0: the clients in this process)",
    )
    args = parser.parse_args()
    total = 400 if args.quick else args.registrations
    total -= total % args.connections
    rounds = 2 if args.quick else args.rounds
    # grpc.aio's poller calls back into the event loops of clients already closed, and
    # asyncio logs that (and their pending tasks) at ERROR when the clients close: noise.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    try:
        if args.part == "failover_default":
            with tempfile.TemporaryDirectory(prefix="pykka-delivery-bench-") as tmp:
                figures = measure_failover_default(rounds, args.rate, Path(tmp))
        elif args.part == "registrations":
            with tempfile.TemporaryDirectory(prefix="pykka-delivery-bench-") as tmp:
                figures = measure_registrations(
                    total, args.connections, args.runs, Path(tmp), args.client_processes
                )
        else:
            figures = measure(
                total,
                args.connections,
                rounds,
                args.rate,
                args.runs,
                processes=args.client_processes,
            )
    finally:
        for child in _CHILDREN:
            child.kill()
        pykka.ActorRegistry.stop_all()
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}))


if __name__ == "__main__":
    main()
