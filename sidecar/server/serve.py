"""`shale serve`: run a `StorageNode` in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import signal
import socket
from contextlib import ExitStack

from ..log.log_dir import LogDirLockedError
from ..security.listeners import LISTENERS, ListenerConfig
from ..server_config import parse_overrides
from .network.connection import tune_malloc
from .network.listener_security import split_settings
from .node import ServeOptions, StorageNode, parse_host_port
from .ops.http_api import HttpSecurity

logger = logging.getLogger(__name__)


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    data_dir = ",".join(args.data_dir) if isinstance(args.data_dir, list) else args.data_dir  # --data-dir repeated
    return ServeOptions(data_dir=data_dir, topics=args.topics, listen=parse_host_port(args.listen),
                        http=parse_host_port(args.http), advertised_host=args.advertised_host,
                        advertised_port=args.advertised_port, node_id=args.node_id, cluster_id=args.cluster_id,
                        store=args.store, overrides=parse_overrides(getattr(args, "override", None) or []),
                        http_security=HttpSecurity(token_file=args.http_token_file, tls_cert=args.http_tls_cert,
                                                   tls_key=args.http_tls_key, tls_ca=args.http_tls_ca,
                                                   client_auth=args.http_tls_client_auth))


class ListenError(OSError):
    """An address `shale serve` is told to listen on cannot be bound (taken, not local, not permitted)."""


def check_listeners(options: ServeOptions) -> None:
    """Bind and listen on every address the node will serve, then let go of them all.

    Run before the node exists: a taken port is then reported before the data directory, the topics or any
    thread are created, so a failed start leaves the disk as it was. Every socket stays open until all are
    checked, so `--listen` and `--http` on the same port are refused too. Port 0 (any free port) always works.
    With Kafka's `listeners` (`--override`) those addresses are checked instead of `--listen`.
    """
    kafka = [("the Kafka listener", "--listen", options.listen, socket.AF_UNSPEC)]  # the broker resolves
    settings = split_settings(options.overrides)[0]
    if LISTENERS in settings:
        kafka = [(f"the Kafka listener {e.listener}", LISTENERS, (e.host or "0.0.0.0", e.port), socket.AF_UNSPEC)
                 for e in ListenerConfig.from_settings(settings).listeners]
    listeners = [*kafka, ("the HTTP endpoints", "--http", options.http, socket.AF_INET)]  # HTTPServer: IPv4 only
    with ExitStack() as held:
        for what, flag, (host, port), family in listeners:
            if port == 0:
                continue
            try:  # the address each server binds: the first one the host resolves to
                resolved, kind, proto, _, address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0]
                sock = held.enter_context(socket.socket(resolved, kind, proto))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as both servers do
                sock.bind(address)
                sock.listen(1)
            except OSError as exc:
                raise ListenError(f"{what} {host}:{port} ({flag}): {exc.strerror}") from None


def serve_forever(args: argparse.Namespace) -> int:
    # A crash in a C extension (SIGSEGV, SIGABRT) leaves every thread's Python stack in the node's log, not a bare
    # exit status.
    faulthandler.enable()
    tune_malloc()  # before the first large buffer: see its docstring (a third of the CPU per produced MB)
    try:
        options = options_from_args(args)
        check_listeners(options)  # exit 1, and nothing created, when a port is taken
        node = StorageNode(options)
    except (LogDirLockedError, ValueError, OSError) as exc:  # ListenError and others: one line, exit 1
        logger.error("cannot start: %s", exc)
        return 1

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, node.stop)  # graceful: flush, checkpoints, clean-shutdown marker
        await node.run()

    asyncio.run(main())
    return 0 if node.clean_shutdown else 1
