"""Starting a coroutine at once, in the caller: finished without waiting, its result is there with no task and
no event-loop iteration; suspended, a task continues it from where it stopped.

Why: most Kafka requests (Produce with acks 0 or 1, or acks=all on one replica, Metadata, ApiVersions,
ListOffsets, Heartbeat...) never wait, yet a task per request cost the server an event-loop iteration and a
few futures each (Python 3.12's eager task factory does the same for every task; this project runs 3.11).
The part before the first suspension runs outside any task: code there must not need `current_task()`.
"""

from __future__ import annotations

import types
from typing import Any, Awaitable, Generator


def start(awaitable: Awaitable) -> tuple[bool, Any]:
    """Run `awaitable` up to its first suspension: (True, its result) if it finished, else (False, an awaitable
    that finishes it, for a task). Its exception, if it raised at once, propagates."""
    steps = awaitable.__await__()
    try:
        yielded = steps.send(None)
    except StopIteration as stop:
        return True, stop.value
    return False, _resume(steps, yielded)


@types.coroutine
def _resume(steps, yielded: Any) -> Generator[Any, Any, Any]:
    """Hand what the coroutine first yielded (the future it waits on) to the task, then relay every step."""
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            steps.close()
            raise
        except BaseException as exc:  # noqa: BLE001 - cancellation and errors go into the coroutine
            try:
                yielded = steps.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = steps.send(sent)
            except StopIteration as stop:
                return stop.value
