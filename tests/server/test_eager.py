"""`eager.start`: a handler that does not wait is finished in the caller; one that waits goes on in a task,
with its result, its exceptions and its cancellation exactly as if it had been a task from the start."""

from __future__ import annotations

import asyncio

import pytest

from shale.sidecar.server.network import eager


async def _no_wait(log: list) -> str:
    log.append("ran")
    return "answer"


async def _waits(log: list, gate: asyncio.Future) -> str:
    log.append("first step")
    try:
        value = await gate
    finally:
        log.append("finally")
    log.append(f"got {value}")
    return f"answer {value}"


def test_a_coroutine_that_does_not_wait_finishes_in_the_caller():
    log: list = []
    assert eager.start(_no_wait(log)) == (True, "answer")
    assert log == ["ran"]


def test_an_exception_raised_at_once_propagates():
    async def fails():
        raise ValueError("bad request")

    with pytest.raises(ValueError, match="bad request"):
        eager.start(fails())


def test_a_coroutine_that_waits_goes_on_in_a_task():
    async def main():
        log: list = []
        gate = asyncio.get_running_loop().create_future()
        done, rest = eager.start(_waits(log, gate))
        assert not done and log == ["first step"]  # the first step ran in the caller
        task = asyncio.get_running_loop().create_task(rest)
        await asyncio.sleep(0)
        assert not task.done()
        gate.set_result(7)
        assert await task == "answer 7"
        assert log == ["first step", "finally", "got 7"]

    asyncio.run(main())


def test_cancelling_the_task_cancels_the_coroutine_where_it_waits():
    async def main():
        log: list = []
        gate = asyncio.get_running_loop().create_future()
        _, rest = eager.start(_waits(log, gate))
        task = asyncio.get_running_loop().create_task(rest)
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert log == ["first step", "finally"]
        assert gate.cancelled()  # the task cancelled the future the coroutine waited on

    asyncio.run(main())


def test_an_exception_after_waiting_reaches_the_task():
    async def main():
        gate = asyncio.get_running_loop().create_future()
        _, rest = eager.start(_waits([], gate))
        task = asyncio.get_running_loop().create_task(rest)
        gate.set_exception(OSError("disk"))
        with pytest.raises(OSError, match="disk"):
            await task

    asyncio.run(main())


def test_several_suspensions_and_sleep_zero():
    async def chatty():
        total = 0
        for i in range(3):
            await asyncio.sleep(0)
            total += await asyncio.sleep(0, result=i)
        return total

    async def main():
        done, rest = eager.start(chatty())
        assert not done
        assert await asyncio.get_running_loop().create_task(rest) == 3

    asyncio.run(main())
