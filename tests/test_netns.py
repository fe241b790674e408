"""The hosts-in-namespaces helper (tests/netns.py): reachability, cut, drop, loss, cleanup.

Each test builds its hosts with the `netns` fixture (skipped unless root with ``ip`` and
``iptables``). The traffic is a tiny TCP echo server in one host (``python -c``) and
connection attempts from another, with short bounded timeouts: no external tools.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.netns import Host, Hosts, namespaces, remove_leftovers, unavailable

pytestmark = pytest.mark.slow

PORT = 7000
# Echoes one message per connection, a thread each (a half-dead connection left by loss
# blocks no other), forever; prints "ready" once listening.
ECHO_SERVER = """
import socket, sys, threading
def echo(conn):
    with conn:
        conn.settimeout(10)
        try:
            conn.sendall(conn.recv(100))
        except OSError:
            pass
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
"""
# Tries ``count`` connections, each with ``timeout``; prints how many got their echo.
CLIENT = """
import socket, sys
host, port, count, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
ok = 0
for _ in range(count):
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(b"ping")
            ok += conn.recv(100) == b"ping"
    except OSError:
        pass
print(ok)
"""

Build = Callable[..., Hosts]


def serve(host: Host) -> None:
    """An echo server on ``host``'s address, killed with the hosts."""
    popen = host.popen(
        [sys.executable, "-c", ECHO_SERVER, host.address, str(PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert popen.stdout is not None
    assert popen.stdout.readline().strip() == "ready", "the echo server did not start"


def echoes(client: Host, server: Host, count: int = 1, timeout: float = 2.0) -> int:
    """How many of ``count`` connections from ``client`` to ``server`` got their echo."""
    argv = (sys.executable, "-c", CLIENT, server.address, str(PORT), str(count), str(timeout))
    done = client.run(*argv, timeout=10.0 + 2 * count * timeout)
    return int(done.stdout)


def test_two_hosts_reach_each_other_over_tcp(netns: Build) -> None:
    hosts = netns("A", "B")
    serve(hosts["A"])
    assert echoes(hosts["B"], hosts["A"]) == 1


def test_hosts_have_documentation_range_addresses_only_on_their_own_interfaces(
    netns: Build,
) -> None:
    hosts = netns("A", "B")
    listed = hosts["A"].run("ip", "-o", "-4", "addr", "show").stdout
    assert f"{hosts['A'].address}/24" in listed
    assert hosts["A"].address.startswith("198.51.100.")
    root = subprocess.run(
        ["ip", "-o", "link", "show"], check=True, capture_output=True, text=True
    ).stdout
    assert hosts.run_id not in root and "198.51.100." not in root


def test_a_cut_host_is_unreachable_until_healed(netns: Build) -> None:
    hosts = netns("A", "B")
    serve(hosts["A"])
    hosts.cut(hosts["A"])
    assert echoes(hosts["B"], hosts["A"], timeout=0.5) == 0
    hosts.heal(hosts["A"])
    assert echoes(hosts["B"], hosts["A"], timeout=5.0) == 1


def test_drop_between_silences_only_that_pair(netns: Build) -> None:
    hosts = netns("A", "B", "C")
    for host in hosts:
        serve(host)
    a, b, c = hosts["A"], hosts["B"], hosts["C"]
    hosts.drop_between(a, b)
    assert echoes(a, b, timeout=0.5) == 0
    assert echoes(b, a, timeout=0.5) == 0
    assert echoes(a, c) == 1
    assert echoes(c, a) == 1
    assert echoes(b, c) == 1
    hosts.undrop_between(a, b)
    assert echoes(a, b) == 1
    assert echoes(b, a) == 1


def test_loss_drops_some_connections_and_no_loss_ends_it(netns: Build) -> None:
    hosts = netns("A", "B")
    serve(hosts["A"])
    hosts.loss(hosts["A"], 0.5)
    # Half of A's packets dropped: a connection with a short timeout often fails (a lost
    # SYN is retried after 1 s), yet some get through: loose bounds, over 30 tries.
    lossy = echoes(hosts["B"], hosts["A"], count=30, timeout=0.25)
    assert 0 < lossy < 30, f"{lossy} of 30 connections got their echo under 50% loss"
    assert hosts.dropped(hosts["A"]) > 0
    hosts.no_loss(hosts["A"])
    assert echoes(hosts["B"], hosts["A"], count=10, timeout=2.0) == 10


def test_nothing_of_the_run_remains_after_the_hosts_are_closed() -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with Hosts("A", "B") as hosts:
        serve(hosts["A"])
        server = hosts.started[0]
        assert len(hosts.leftovers()) == 3, "two hosts and the switch"
    assert hosts.leftovers() == []
    assert server.poll() is not None, "the server in the host was killed"


def test_leftovers_of_a_run_whose_process_is_gone_are_removed(netns: Build) -> None:
    hosts = netns("A")
    orphan = f"pdn-{_exited_pid()}-abcdef-x"
    subprocess.run(["ip", "netns", "add", orphan], check=True)
    try:
        remove_leftovers()
        assert orphan not in namespaces(), "the dead run's namespace is gone"
        assert hosts.leftovers() != [], "a live run's namespaces are kept"
    finally:
        subprocess.run(["ip", "netns", "del", orphan], check=False, capture_output=True)


def _exited_pid() -> int:
    popen = subprocess.Popen(["true"])
    popen.wait()
    return popen.pid


def test_hosts_are_unavailable_with_the_reason_when_not_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    reason = unavailable()
    assert reason is not None and "root" in reason


def test_hosts_are_unavailable_naming_the_package_when_a_tool_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr(
        "shutil.which", lambda name, path=None: None if name == "iptables" else "/x"
    )
    reason = unavailable()
    assert reason is not None and "apt-get install iptables" in reason
