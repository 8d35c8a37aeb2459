"""`shale operator`: run the kopf operator with the settings from the environment and the flags.

`run` is what the command calls and what the tests run in a thread (kopf's own KopfRunner does the
same: the operator in a background thread with its own event loop); it returns when `stop_flag` is set
or on SIGTERM/SIGINT in the main thread. Standalone (no kopf peering): the chart runs one replica
with the Recreate strategy, as kopf's deployment guide says.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import kopf

from . import settings as settings_module
from .handlers import Context, build_registry, kopf_settings
from .kube import api_client
from .settings import Settings

logger = logging.getLogger(__name__)


def run(settings: Settings, *, stop_flag: Any = None, ready_flag: Any = None) -> None:
    """Run until stopped. The flags are threading/asyncio events or futures, as kopf.run takes them."""
    context = Context.create(settings, api_client())
    logger.info("managing Topics in %s; storage: StatefulSet %s/%s, %s",
                ", ".join(settings.watch_namespaces) or "all namespaces", settings.storage_namespace,
                settings.statefulset, context.configmap.ref)
    kopf.run(registry=build_registry(settings), settings=kopf_settings(), memo=kopf.Memo(ctx=context),
             standalone=True, clusterwide=not settings.watch_namespaces, namespaces=settings.watch_namespaces,
             liveness_endpoint=settings.liveness_endpoint, stop_flag=stop_flag, ready_flag=ready_flag)


class _ObjectFormatter(logging.Formatter):
    """Prefix kopf's per-object lines with [namespace/name] (kopf's own formatter does this for `kopf run`)."""

    def format(self, record: logging.LogRecord) -> str:
        ref = getattr(record, "k8s_ref", None)
        if ref:
            record = logging.makeLogRecord(record.__dict__)
            where = f"{ref.get('namespace')}/{ref.get('name')}" if ref.get("namespace") else ref.get("name")
            record.msg = f"[{where}] {record.msg}"
        return super().format(record)


_ROUTINE = frozenset({"Timer 'refresh' succeeded.", "Activity 'topics' succeeded."})


def _quiet_routine(record: logging.LogRecord) -> bool:
    """Drop the INFO lines of each status refresh (per Topic per interval) and each liveness probe."""
    return not (record.levelno == logging.INFO and record.getMessage() in _ROUTINE)


def configure_logging() -> None:
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_ObjectFormatter(handler.formatter._fmt if handler.formatter else None))
        handler.addFilter(_quiet_routine)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # every probe and scrape otherwise


def main(args: argparse.Namespace) -> int:
    configure_logging()
    try:
        settings = settings_module.from_args(args)
    except ValueError as exc:
        logger.error("bad setting: %s", exc)
        return 2
    run(settings)
    return 0
