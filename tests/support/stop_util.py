"""Freezing a process with SIGSTOP and knowing it is frozen.

kill(SIGSTOP) returns before the process stops: the group stop completes only when each thread next
passes through the kernel, and on a busy machine a thread of a multi-threaded server (etcd's Go runtime,
a node's event loop beside its maintenance threads) can still answer a request after the signal was sent.
A test that then expects silence must wait until every thread is seen stopped in /proc.
"""

from __future__ import annotations

import os
import signal
import time

STOPPED_STATES = ("T", "t")  # stopped by a signal, or stopped under a tracer


def thread_states(pid: int) -> list[str]:
    """The state letter of each thread of `pid` (field 3 of /proc/<pid>/task/<tid>/stat)."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                states.append(stat.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:
            continue  # the thread ended meanwhile
    return states


def sigstop(pid: int, timeout: float = 10.0) -> None:
    """Send SIGSTOP and return once every thread of `pid` is stopped; fail loudly if that does not happen."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not all(state in STOPPED_STATES for state in thread_states(pid)):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} was sent SIGSTOP but its threads are {thread_states(pid)} "
                                 f"after {timeout} s")
        time.sleep(0.001)
