"""A scraper process for the benchmarks' metrics-on routes, as Prometheus is one: it
scrapes ``http://ADDRESS/metrics`` at once, prints ``ready``, then scrapes every EVERY
seconds until its standard input is closed, and prints the number of scrapes.

    python bench/_scraper.py ADDRESS EVERY

It imports only the standard library, so that starting it costs the measured processes
little (and the benches wait for ``ready`` before they measure).
"""

from __future__ import annotations

import socket
import sys
import threading


def scrape_once(address: str) -> None:
    """One scrape of the metrics page at ``address`` (``host:port``): a bare HTTP/1.0 GET,
    the whole page read."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
        head = connection.recv(65536)
        if not head.startswith(b"HTTP/1.0 200"):
            raise RuntimeError(f"metrics scrape failed: {head[:100]!r}")
        while connection.recv(65536):
            pass


def main() -> None:
    address, every = sys.argv[1], float(sys.argv[2])
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    scrape_once(address)
    count = 1
    print("ready", flush=True)
    while not stop.wait(every):
        scrape_once(address)
        count += 1
    print(count, flush=True)


if __name__ == "__main__":
    main()
