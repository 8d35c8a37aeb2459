"""Stopping a watch's reader thread: both stores' watches (etcd_watch.py, kube_watch.py) are read by a thread
blocked in a socket read, and the one way to end that read from another thread is to shut the socket down."""

from __future__ import annotations

import socket


def stop_reader(sock: socket.socket | None) -> None:
    """Shut `sock` down, so the read blocked on it returns; nothing if the reader closed it already."""
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed already by the reader
