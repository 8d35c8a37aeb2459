"""Small real filesystems that tests fill up: a tmpfs or a loop-mounted ext4 image, always unmounted after.

Both reproduce what a full disk does to a process: `write` fails with ENOSPC, and a store through a
shared memory map into a hole of a sparse file that the filesystem cannot fill raises SIGBUS. The tests
run as root (the CI and dev containers do); without the rights to mount they fail, loudly.
"""

from __future__ import annotations

import errno
import os
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

PAGE = os.sysconf("SC_PAGE_SIZE")


def _run(*args: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")


@contextmanager
def small_fs(where: Path, kind: str, size_kib: int) -> Iterator[Path]:
    """Mount a `kind` ("tmpfs" or "ext4") filesystem of about `size_kib` KiB at `where/mnt`; unmount after."""
    mnt = where / "mnt"
    mnt.mkdir(parents=True)
    if kind == "tmpfs":
        _run("mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(mnt))
    elif kind == "ext4":
        image = where / "ext4.img"
        with open(image, "wb") as f:
            f.truncate(size_kib * 1024)
        # -m 0: no blocks reserved for root, who runs the tests and would otherwise write on past "full".
        _run("mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", str(image))
        _run("mount", "-o", "loop", str(image), str(mnt))
    else:
        raise ValueError(f"unknown filesystem kind {kind!r}")
    try:
        yield mnt
    except BaseException:
        _run("umount", "-l", str(mnt))  # detached now, freed when the failed test's files are collected
        raise
    busy = subprocess.run(["umount", str(mnt)], capture_output=True, text=True)
    if busy.returncode != 0:  # detach it anyway, then say what the test left open
        _run("umount", "-l", str(mnt))
        raise AssertionError(f"umount {mnt}: {busy.stderr.strip()} (a file or map on it was left open)")


@dataclass
class Filler:
    """A file that takes every free block of its filesystem; `release` gives some back."""

    path: Path

    def release(self, nbytes: int | None = None) -> None:
        """Free the last `nbytes` (page-rounded) of the filler, or all of it."""
        size = self.path.stat().st_size
        keep = 0 if nbytes is None else max(0, size - -(-nbytes // PAGE) * PAGE)
        os.truncate(self.path, keep)


def fill(directory: Path, name: str = "filler") -> Filler:
    """Write page-sized chunks to `directory/name` until the filesystem refuses one with ENOSPC."""
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    chunk = b"\xff" * PAGE
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
        os.fsync(fd)
    finally:
        os.close(fd)
    os.truncate(path, path.stat().st_size // PAGE * PAGE)  # whole pages, so `release` frees exact pages
    return Filler(path)
