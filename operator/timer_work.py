"""A timer's work given up as soon as kopf stops the timer.

kopf never cancels a running timer: it waits for it before the delete handler runs (or the operator
exits), and polls it only every `cancellation_polling` (60 s) once the timer missed its instant exit.
The Topic and User refresh timers both race their work against `stopped` so a delete or a shutdown is
not held up by a refresh that waits on a node.
"""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine

import kopf


async def run_until_stopped(work: Coroutine[Any, Any, None], stopped: kopf.DaemonStopped) -> None:
    """Run `work` to its end (raising what it raises), or cancel it once `stopped` is set."""
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(stopped.wait())
    await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    stop.cancel()
    if not task.done():
        task.cancel()
        return
    task.result()
