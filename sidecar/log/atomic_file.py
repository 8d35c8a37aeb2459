"""Crash-safe file replacement: write `<file>.tmp`, fsync it, rename over the file, fsync the directory."""

from __future__ import annotations

import os


def fsync_dir(directory: str) -> None:
    """Make a rename or create in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` by `data` so that a crash leaves either the old or the new content, never a mix.

    A failed write (a full disk) removes its `.tmp`: the blocks it took go back at once and the
    old file stays as it was. `mode` is the new file's permission bits (0o600 for secrets: the `.tmp` is
    never readable by others either).
    """
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # the write's own error is the one to report
        if isinstance(e, OSError) and e.filename is None:  # write/fsync errors name no file
            raise OSError(e.errno, e.strerror, tmp) from None
        raise
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def create_empty(path: str) -> None:
    """Durably create an empty `path`: it takes an inode and a directory entry, but no data block."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    fsync_dir(os.path.dirname(os.path.abspath(path)))
