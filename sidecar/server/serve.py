"""`shale serve`: run a `StorageNode` in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from shale.sidecar.log.log_dir import LogDirLockedError
from shale.sidecar.server.connection import tune_malloc
from shale.sidecar.server.node import ServeOptions, StorageNode, parse_host_port
from shale.sidecar.server.server_config import parse_overrides

logger = logging.getLogger(__name__)


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    return ServeOptions(data_dir=args.data_dir, topics=args.topics, listen=parse_host_port(args.listen),
                        http=parse_host_port(args.http), advertised_host=args.advertised_host,
                        node_id=args.node_id, overrides=parse_overrides(getattr(args, "override", None) or []))


def serve_forever(args: argparse.Namespace) -> int:
    tune_malloc()  # before the first large buffer: see its docstring (a third of the CPU per produced MB)
    try:
        node = StorageNode(options_from_args(args))
    except (LogDirLockedError, ValueError, OSError) as exc:  # OSError: e.g. the HTTP port is taken
        logger.error("cannot start: %s", exc)
        return 1

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, node.stop)  # graceful: flush, checkpoints, clean-shutdown marker
        await node.run()

    asyncio.run(main())
    return 0
