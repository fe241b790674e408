"""Prometheus metrics (the ``[metrics]`` extra): what this process's nodes, producer and
consumer handles and coordinator servers have counted, served over HTTP.

* `serve`: one HTTP endpoint per process (off until called), ``/metrics`` in the
  Prometheus text format; `serve_from_env` does the same when
  ``PYKKA_DELIVERY_METRICS_PORT`` is set.
* `register`: adds the `DeliveryCollector` to a prometheus-client registry, for a process
  that serves its own metrics already.

Nothing is counted for metrics on the message paths: the collector reads the statistics
the objects keep anyway, at scrape time. docs/metrics.md lists every metric.
"""

from __future__ import annotations

try:
    import prometheus_client
except ImportError as error:  # pragma: no cover - checked by a test in a subprocess
    msg = (
        "pykka_delivery.metrics needs prometheus-client, which is not installed: "
        "pip install 'pykka-delivery[metrics]'"
    )
    raise ImportError(msg) from error

import logging
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Final

from prometheus_client.registry import CollectorRegistry

from pykka_delivery.metrics._collector import DeliveryCollector

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "HOST_ENV",
    "PORT_ENV",
    "DeliveryCollector",
    "MetricsServer",
    "register",
    "serve",
    "serve_from_env",
]

logger = logging.getLogger("pykka_delivery.metrics")

DEFAULT_PORT: Final = 9464
"""The port `serve` listens on unless told otherwise."""

DEFAULT_HOST: Final = "127.0.0.1"
"""The interface `serve` listens on unless told otherwise: this machine only."""

PORT_ENV: Final = "PYKKA_DELIVERY_METRICS_PORT"
"""The environment variable `serve_from_env` reads the port from (unset: no endpoint)."""

HOST_ENV: Final = "PYKKA_DELIVERY_METRICS_HOST"
"""The environment variable `serve_from_env` reads the interface from (unset:
`DEFAULT_HOST`)."""

_collectors: weakref.WeakKeyDictionary[CollectorRegistry, DeliveryCollector] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def register(
    registry: CollectorRegistry | None = None, *, read_timeout: float = 1.0
) -> DeliveryCollector:
    """Add the `DeliveryCollector` to ``registry`` (default: prometheus-client's global
    ``REGISTRY``), once: a second call returns the collector registered first, with its
    ``read_timeout`` set to this call's.

    Args:
        registry: where the collector goes.
        read_timeout: see `DeliveryCollector`.
    """
    registry = prometheus_client.REGISTRY if registry is None else registry
    with _lock:
        collector = _collectors.get(registry)
        if collector is None:
            collector = DeliveryCollector(read_timeout)
            registry.register(collector)
            _collectors[registry] = collector
        else:
            collector.read_timeout = read_timeout
    return collector


class MetricsServer:
    """A running metrics endpoint (see `serve`): `close` it, or use it as a context
    manager.

    Attributes:
        address: ``host:port`` it listens on (the bound port when asked for port 0).
        url: the metrics page, ``http://<address>/metrics``.
    """

    def __init__(self, httpd: object, thread: threading.Thread, host: str, port: int) -> None:
        self._httpd = httpd
        self._thread = thread
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.url = f"http://{self.address}/metrics"

    def __repr__(self) -> str:
        return f"MetricsServer({self.url})"

    def close(self) -> None:
        """Stop serving and release the port (a second call does nothing)."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()  # type: ignore[attr-defined]
        httpd.server_close()  # type: ignore[attr-defined]
        self._thread.join(timeout=10)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def serve(
    port: int = DEFAULT_PORT,
    host: str = DEFAULT_HOST,
    *,
    registry: CollectorRegistry | None = None,
    read_timeout: float = 1.0,
) -> MetricsServer:
    """Serve ``registry`` (default: prometheus-client's global ``REGISTRY``, which also
    holds its process and Python collectors) at ``http://host:port/metrics``, on a daemon
    thread, with the `DeliveryCollector` registered in it (`register`). One endpoint per
    process shows every node, handle and coordinator server of the process.

    Args:
        port: the TCP port; 0 picks a free one (read it from ``address``).
        host: the interface; ``"0.0.0.0"`` (or ``"::"``) lets other machines scrape it.
        registry: what to serve.
        read_timeout: see `DeliveryCollector`.

    Raises:
        ValueError: ``port`` is not a number from 0 to 65535, or ``host`` is empty.
        OSError: the port cannot be bound (in use, say).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        msg = f"port must be an int from 0 to 65535 (0: any free port), got {port!r}"
        raise ValueError(msg)
    if not isinstance(host, str) or not host:
        msg = f"host must be an interface's name or address, e.g. {DEFAULT_HOST!r}, got {host!r}"
        raise ValueError(msg)
    registry = prometheus_client.REGISTRY if registry is None else registry
    register(registry, read_timeout=read_timeout)
    try:
        httpd, thread = prometheus_client.start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        msg = (
            f"cannot serve metrics on {host}:{port}: {error}: choose another port "
            f"(serve(port=...) or {PORT_ENV}), or 0 for any free one"
        )
        raise OSError(error.errno, msg) from error
    server = MetricsServer(httpd, thread, host, int(httpd.server_address[1]))
    logger.info("Metrics served at %s", server.url)
    return server


def serve_from_env(environ: Mapping[str, str] | None = None) -> MetricsServer | None:
    """`serve` on the port in ``PYKKA_DELIVERY_METRICS_PORT`` and the interface in
    ``PYKKA_DELIVERY_METRICS_HOST`` (default `DEFAULT_HOST`); None, serving nothing,
    when the port variable is unset or empty (metrics are off by default).

    Args:
        environ: where to read the variables; default ``os.environ``.

    Raises:
        ValueError: the port variable is not a number from 0 to 65535.
        OSError: the port cannot be bound.
    """
    environ = os.environ if environ is None else environ
    text = environ.get(PORT_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) > 65535:
        msg = f"{PORT_ENV}={text!r} is not a port: set it to a number from 0 to 65535, or unset it"
        raise ValueError(msg)
    return serve(int(text), environ.get(HOST_ENV, "").strip() or DEFAULT_HOST)
