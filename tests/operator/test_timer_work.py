"""`run_until_stopped`, the refresh timers' race against kopf's stop flag (kopf's own FlagSetter and waiter, as a
timer receives them): a stop cancels the work and returns at once; work that ends first gives its result or its
error; a stop already set before the work starts still cancels it."""

from __future__ import annotations

import asyncio

import pytest
from kopf._cogs.aiokits.aioenums import FlagSetter
from kopf._core.intents.stoppers import DaemonStoppingReason

from shale.operator.timer_work import run_until_stopped


def test_a_stop_cancels_the_work_and_returns():
    async def run() -> list[str]:
        setter: FlagSetter[DaemonStoppingReason] = FlagSetter()
        events: list[str] = []

        async def work() -> None:
            try:
                await asyncio.Event().wait()  # a refresh waiting on a node that never answers
            except asyncio.CancelledError:
                events.append("cancelled")
                raise

        racer = asyncio.ensure_future(run_until_stopped(work(), setter.async_waiter))
        await asyncio.sleep(0)
        setter.set(DaemonStoppingReason.RESOURCE_DELETED)
        await racer
        await asyncio.sleep(0)  # let the cancelled work run its handler
        return events

    assert asyncio.run(run()) == ["cancelled"]


def test_work_that_ends_first_gives_its_result_or_its_error():
    async def run(fail: bool) -> list[str]:
        setter: FlagSetter[DaemonStoppingReason] = FlagSetter()
        done: list[str] = []

        async def work() -> None:
            if fail:
                raise RuntimeError("node 2 refused")
            done.append("refreshed")

        await run_until_stopped(work(), setter.async_waiter)
        return done

    assert asyncio.run(run(False)) == ["refreshed"]
    with pytest.raises(RuntimeError, match="node 2 refused"):
        asyncio.run(run(True))


def test_a_stop_set_before_the_work_starts_still_cancels_it():
    async def run() -> bool:
        setter: FlagSetter[DaemonStoppingReason] = FlagSetter()
        setter.set(DaemonStoppingReason.OPERATOR_EXITING)
        ran = False

        async def work() -> None:
            nonlocal ran
            await asyncio.sleep(3600)
            ran = True

        await run_until_stopped(work(), setter.async_waiter)
        return ran

    assert asyncio.run(run()) is False
