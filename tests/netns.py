"""Several hosts on one machine for tests: network namespaces, a private switch, faults.

    with Hosts("C", "P", "A") as hosts:
        server = hosts["P"].popen([sys.executable, "-m", "http.server", "--bind",
                                   hosts["P"].address])
        hosts.cut(hosts["A"])                   # A's link down: A is cut from everything
        hosts.heal(hosts["A"])
        hosts.drop_between(hosts["A"], hosts["C"])  # only A <-> C is silent
        hosts.loss(hosts["A"], 0.3)             # 30% of what A receives is dropped

What it builds (as root, with ``ip`` from iproute2 and ``iptables``):

* a namespace per host and one more, the *switch*, holding a bridge ``br0``; per host a
  veth pair ``v<n>`` (in the switch, on the bridge) / ``eth0`` (in the host), the host's
  address ``198.51.100.<10+n>/24`` (a documentation range) on ``eth0``, ``lo`` up. Every
  interface is created inside our namespaces (``ip -n``): nothing is added to the root
  namespace, so no packet of the tests can reach the machine's real network.
* Namespace names are ``pdn-<pid>-<token>-<host>`` (``-sw`` for the switch): unique per
  run, and a later run removes the leftovers of a run whose process is gone (crashed or
  killed), matching only that prefix.
* Faults: `cut` / `heal` set the host's switch port down / up (its TCP peers get no RST:
  a silent partition); `drop_between` / `undrop_between` add / remove iptables DROP rules
  on INPUT in both hosts for the other's address (INPUT only, so a sender is not told
  EPERM at once as an OUTPUT drop would: the packets vanish, as in a real partition);
  `loss` / `no_loss` drop a random share of what a host receives on ``eth0`` (the
  ``statistic`` match; ``lo`` is spared; with ``source``, only what comes from that
  host); `dropped` counts what those rules dropped. This kernel has no ``netem``: for
  delay, run the project's `TcpProxy` inside a host (``python -m tests.netns proxy``,
  below; a transport node reached through it must advertise the proxy's address, so
  that the refs the other side answers to lead through it too).
* Processes: `Host.popen` runs a command inside the host (``ip netns exec``) in a session
  of its own; `Host.proc` starts a Python service as a `tests.transport.procs.Proc`.
  At cleanup every process in our namespaces is SIGKILLed (its process group, then any
  other pid ``ip netns pids`` still lists) and reaped, then the namespaces are deleted
  (which removes their interfaces). Cleanup runs on exit of the ``with`` block, and at
  interpreter exit (atexit) if that block never finished.

`unavailable` says why the machine cannot do this (not root, a tool missing, namespaces
refused): the `netns` fixture skips with that reason.

``python -m tests.netns proxy --upstream HOST:PORT [--delay S]`` runs a `TcpProxy` (on
127.0.0.1 of the namespace it runs in), prints ``{"ready": true, "address": ...}`` and
forwards with that delay until SIGUSR1 (then without), until it is killed.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any

import pytest

from pykka_delivery.testing import TcpProxy
from tests.transport.procs import Proc

PREFIX = "pdn"
SUBNET = "198.51.100."
_FIRST = 10  # host n gets 198.51.100.<_FIRST + n>
_TIMEOUT = 10.0  # seconds for one ip / iptables command
_LEFTOVER = re.compile(rf"^{PREFIX}-(\d+)-[0-9a-f]+-")
# Runs a command in place of the interpreter `Proc` starts: same pid, same pipes.
_EXEC_SHIM = ("-c", "import os, sys; os.execvp(sys.argv[1], sys.argv[1:])")


class NetnsError(RuntimeError):
    """A command that builds or changes the hosts failed (its output is in the message)."""


def _tool(name: str) -> str:
    """The full path of a command, looked up in the system directories too (a root shell's
    PATH may lack them)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return shutil.which(name, path=path) or name


def _run(
    argv: Sequence[str], check: bool = True, timeout: float = _TIMEOUT
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [_tool(argv[0]), *argv[1:]],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if check and done.returncode != 0:
        msg = f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}"
        raise NetnsError(msg)
    return done


def unavailable() -> str | None:
    """Why hosts cannot be built on this machine, or None when they can (this checks the
    user and the tools; a refused namespace is found when `Hosts` starts)."""
    if os.geteuid() != 0:
        return "network namespaces need root: run the tests as root (CI runs them as root)"
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables")):
        if _tool(tool) == tool:
            return f"`{tool}` is missing: apt-get install {package} (.ci/run does)"
    return None


def namespaces() -> list[str]:
    """The names of the network namespaces that exist now."""
    listed = _run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def _kill_namespace_processes(namespace: str) -> None:
    pids = _run(["ip", "netns", "pids", namespace], check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone (their processes
    killed first); returns their names. Only names with our prefix are touched."""
    removed = []
    for namespace in namespaces():
        match = _LEFTOVER.match(namespace)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        _kill_namespace_processes(namespace)
        _run(["ip", "netns", "del", namespace], check=False)
        removed.append(namespace)
    return removed


class Host:
    """One host: its namespace, its switch port and its address.

    Attributes:
        name: as given to `Hosts`.
        namespace: the network namespace's name.
        port: its veth on the switch's bridge (in the switch namespace).
        address: its IPv4 address, in 198.51.100.0/24.
    """

    def __init__(self, hosts: Hosts, name: str, index: int) -> None:
        self._hosts = hosts
        self.name = name
        self.namespace = f"{hosts.run_id}-{name.lower()}"
        self.port = f"v{index}"
        self.address = f"{SUBNET}{_FIRST + index}"

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.address})"

    def run(
        self, *argv: str, check: bool = True, timeout: float = _TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        """Run a short command inside the host and wait for it, at most ``timeout`` s."""
        inside = ["ip", "netns", "exec", self.namespace, _tool(argv[0]), *argv[1:]]
        return _run(inside, check, timeout)

    def popen(self, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the host, in a session of its own (killed at cleanup)."""
        kw.setdefault("start_new_session", True)
        popen = subprocess.Popen([_tool("ip"), "netns", "exec", self.namespace, *argv], **kw)
        self._hosts.started.append(popen)
        return popen

    def proc(self, name: str, *argv: str) -> Proc:
        """Start ``python argv...`` inside the host as a `Proc` (JSON lines read, killed at
        cleanup); ``argv`` as for `Proc` (``-m module ...`` or a script)."""
        shim = [_tool("ip"), "netns", "exec", self.namespace, sys.executable]
        proc = Proc(name, [*_EXEC_SHIM, *shim, *argv])
        self._hosts.started.append(proc.popen)
        return proc


class Hosts:
    """Hosts on a private switch, each in a network namespace; a context manager.

    Args:
        names: one host per name (``hosts["A"]``); at most 200.
    """

    def __init__(self, *names: str) -> None:
        if not names or len(set(names)) != len(names) or len(names) > 200:
            msg = f"Hosts: give 1..200 distinct host names, got {names!r}"
            raise ValueError(msg)
        self.run_id = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{self.run_id}-sw"
        self.hosts = {name: Host(self, name, n) for n, name in enumerate(names)}
        self.started: list[subprocess.Popen[Any]] = []
        self._rules: set[tuple[str, tuple[str, ...]]] = set()  # (namespace, rule) added
        self._made: list[str] = []  # namespaces created, removed at cleanup
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts.values())

    # --- building and removing -----------------------------------------------------------

    def __enter__(self) -> Hosts:
        atexit.register(self.close)
        try:
            remove_leftovers()
            self._add_namespace(self.switch)
            sw = ["ip", "-n", self.switch]
            _run([*sw, "link", "add", "br0", "type", "bridge"])
            _run([*sw, "link", "set", "br0", "up"])
            for host in self:
                self._add_namespace(host.namespace)
                _run([*sw, "link", "add", host.port, "type", "veth", "peer", "name", "eth0",
                      "netns", host.namespace])  # fmt: skip
                _run([*sw, "link", "set", host.port, "master", "br0", "up"])
                inside = ["ip", "-n", host.namespace]
                _run([*inside, "addr", "add", f"{host.address}/24", "dev", "eth0"])
                _run([*inside, "link", "set", "eth0", "up"])
                _run([*inside, "link", "set", "lo", "up"])
            next(iter(self)).run("iptables", "-S")  # the firewall works inside a namespace
        except BaseException:
            self.close()
            raise
        return self

    def _add_namespace(self, namespace: str) -> None:
        _run(["ip", "netns", "add", namespace])
        self._made.append(namespace)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process in our namespaces, then delete them (idempotent)."""
        with self._lock:
            atexit.unregister(self.close)
            for popen in self.started:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(popen.pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    popen.kill()
            for namespace in self._made:
                _kill_namespace_processes(namespace)
            for popen in self.started:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(_TIMEOUT)
            self.started.clear()
            for namespace in reversed(self._made):
                _run(["ip", "netns", "del", namespace], check=False)
            self._made.clear()
            self._rules.clear()

    def leftovers(self) -> list[str]:
        """The namespaces with this run's names that exist now (none after `close`)."""
        return [ns for ns in namespaces() if ns.startswith(f"{self.run_id}-")]

    # --- faults --------------------------------------------------------------------------

    def cut(self, host: Host) -> None:
        """Take the host's switch port down: it can reach no other host (silently)."""
        _run(["ip", "-n", self.switch, "link", "set", host.port, "down"])

    def heal(self, host: Host) -> None:
        """Bring the host's switch port up again."""
        _run(["ip", "-n", self.switch, "link", "set", host.port, "up"])

    def drop_between(self, a: Host, b: Host) -> None:
        """``a`` and ``b`` can no longer talk (each drops what comes from the other); each
        still talks to every other host."""
        self._rule(a, ("INPUT", "-s", b.address, "-j", "DROP"), add=True)
        self._rule(b, ("INPUT", "-s", a.address, "-j", "DROP"), add=True)

    def undrop_between(self, a: Host, b: Host) -> None:
        """Undo `drop_between`."""
        self._rule(a, ("INPUT", "-s", b.address, "-j", "DROP"), add=False)
        self._rule(b, ("INPUT", "-s", a.address, "-j", "DROP"), add=False)

    def loss(self, host: Host, probability: float, source: Host | None = None) -> None:
        """Drop each packet the host receives on its link with ``probability`` (only those
        from ``source``, if given)."""
        if not 0.0 < probability <= 1.0:
            msg = f"loss: probability must be in (0, 1], got {probability}"
            raise ValueError(msg)
        self.no_loss(host)
        self._rule(host, _loss_rule(probability, source), add=True)

    def no_loss(self, host: Host) -> None:
        """Undo `loss` (a no-op without one)."""
        for namespace, rule in list(self._rules):
            if namespace == host.namespace and "statistic" in rule:
                self._rule(host, rule, add=False)

    def dropped(self, host: Host) -> int:
        """Packets the host's DROP rules (`drop_between`, `loss`) have dropped so far."""
        listed = host.run("iptables", "-L", "INPUT", "-v", "-x", "-n").stdout.splitlines()
        return sum(int(line.split()[0]) for line in listed[2:] if line.split()[2:3] == ["DROP"])

    def _rule(self, host: Host, rule: tuple[str, ...], *, add: bool) -> None:
        key = (host.namespace, rule)
        if add == (key in self._rules):
            return  # already there / already gone
        host.run("iptables", "-A" if add else "-D", *rule)
        (self._rules.add if add else self._rules.discard)(key)


def _loss_rule(probability: float, source: Host | None) -> tuple[str, ...]:
    only = ("-s", source.address) if source else ()
    return ("INPUT", "-i", "eth0", *only, "-m", "statistic", "--mode", "random",
            "--probability", f"{probability:.4f}", "-j", "DROP")  # fmt: skip


@pytest.fixture
def netns() -> Iterator[Callable[..., Hosts]]:
    """A factory: ``netns("C", "P", "A")`` builds those hosts, removed when the test ends
    (even when it fails). Skips with the reason when the machine cannot build them."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    built: list[Hosts] = []

    def build(*names: str) -> Hosts:
        try:
            hosts = Hosts(*names).__enter__()
        except NetnsError as error:
            pytest.skip(f"cannot build network namespaces: {error} (needs root and a kernel "
                        "with network namespaces, veth and bridge)")  # fmt: skip
        built.append(hosts)
        return hosts

    try:
        yield build
    finally:
        for hosts in built:
            hosts.close()


# --- a delaying proxy inside a host --------------------------------------------------------


def _proxy(args: argparse.Namespace) -> None:
    host, port = args.upstream.rsplit(":", 1)
    undelay = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: undelay.set())
    with TcpProxy((host, int(port))) as proxy:
        proxy.set_delay(args.delay)
        listen_host, listen_port = proxy.address
        print(json.dumps({"ready": True, "address": f"{listen_host}:{listen_port}"}), flush=True)
        while not undelay.wait(0.1):  # short waits: the main thread runs the handler
            pass
        proxy.set_delay(0.0)
        print(json.dumps({"delay": 0.0}), flush=True)
        threading.Event().wait()  # until killed


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="helpers run inside a test host")
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("proxy", help="a delaying TcpProxy on 127.0.0.1")
    sub.add_argument("--upstream", required=True, help="host:port to forward to")
    sub.add_argument("--delay", type=float, default=0.0, help="seconds added to each chunk")
    sub.set_defaults(run=_proxy)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
