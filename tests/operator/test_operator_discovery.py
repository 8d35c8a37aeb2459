"""operator/discovery.py: the start waits, through errors and partial lists, until every resource is listed."""

from __future__ import annotations

import asyncio
import logging

from shale.operator.discovery import wait_for_resources


def test_the_wait_goes_on_through_errors_and_partial_lists_and_ends_when_all_are_listed(caplog):
    answers = [ConnectionRefusedError("connection refused"), set(), {"topics"}, {"topics", "users", "other"}]
    calls = []

    async def list_resources() -> set[str]:
        calls.append(1)
        answer = answers[len(calls) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    with caplog.at_level(logging.INFO):
        asyncio.run(wait_for_resources(list_resources, ("topics", "users"), "shale.dev/v1alpha1",
                                       logging.getLogger("test"), interval_s=0.01))
    assert len(calls) == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["waiting for the API server's discovery of shale.dev/v1alpha1 to list topics, users "
                        "(is the CRD installed?): ConnectionRefusedError: connection refused"]
    assert any("now lists topics, users" in r.getMessage() for r in caplog.records)


def test_resources_already_listed_end_the_wait_at_once_and_quietly(caplog):
    async def list_resources() -> set[str]:
        return {"topics", "users"}

    with caplog.at_level(logging.INFO):
        asyncio.run(wait_for_resources(list_resources, ("topics", "users"), "g/v", logging.getLogger("test")))
    assert caplog.records == []
