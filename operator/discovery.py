"""Waiting at start until the API server's discovery lists the operator's custom resources.

kopf reads the API's discovery once when it starts, and again only when a CustomResourceDefinition
changes. A kube-apiserver that has just (re)started answers requests before its CRD controller has
published the custom groups in discovery, so an operator that starts in that window — a pod started
while the API server was down, which kopf's retries then carry just past the restart — finds no
Topics, and nothing makes it look again: it would serve nothing until restarted. Holding kopf's
startup until `shale.dev/v1alpha1` lists every resource the handlers need closes that window; kopf's
own scan, which runs right after the startup handlers, then finds them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Collection

import kubernetes

LOG_EVERY_S = 30.0  # how often a wait that goes on says so


async def wait_for_resources(list_resources: Callable[[], Awaitable[set[str]]], wanted: Collection[str],
                             what: str, logger: logging.Logger | logging.LoggerAdapter, *,
                             interval_s: float = 0.5) -> None:
    """Return once `list_resources()` names every resource in `wanted`; an error counts as none listed."""
    started, last_log = time.monotonic(), None
    while True:
        try:
            listed = await list_resources()
            problem = ""
        except Exception as exc:  # noqa: BLE001 - an API server that is down or starting: wait on
            listed, problem = set(), f": {exc.__class__.__name__}: {exc}"
        missing = sorted(set(wanted) - listed)
        if not missing:
            if time.monotonic() - started >= interval_s:
                logger.info("%s now lists %s after %.1f s", what, ", ".join(sorted(wanted)),
                            time.monotonic() - started)
            return
        if last_log is None or time.monotonic() - last_log >= LOG_EVERY_S:
            logger.warning("waiting for the API server's discovery of %s to list %s (is the CRD installed?)%s",
                           what, ", ".join(missing), problem)
            last_log = time.monotonic()
        await asyncio.sleep(interval_s)


def lister(api: kubernetes.client.ApiClient, group: str, version: str) -> Callable[[], Awaitable[set[str]]]:
    """The plural names `GET /apis/<group>/<version>` lists now (none while the group is not served: 404)."""
    objects = kubernetes.client.CustomObjectsApi(api)

    async def list_resources() -> set[str]:
        try:
            found = await asyncio.to_thread(objects.get_api_resources, group, version)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return set()
            raise
        return {resource.name for resource in found.resources or ()}

    return list_resources
