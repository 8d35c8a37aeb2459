"""A Kubernetes watch on the cluster's Leases, kept open between waits and read by a thread of its own.

`KubeStore.wait_for_change` used to poll: a list of every Lease of the cluster twice per 100 ms wait slice of
the controller, ~20 lists a second per node while nothing changed, each as large as the cluster has
partitions. A watch from the view's resourceVersion instead tells the waiter about each change as it happens;
the waiter's `wakes` rule decides which events can change a view (a live session's renewal cannot), so an
idle node holds one watch, lists nothing, and the API server sends it only the renewals of the other nodes.

The stream is opened by the reader thread, so the caller never blocks on it; a refusal (RBAC without the
`watch` verb), a failure, the server's `timeoutSeconds`, an `ERROR` event (410 Gone: history compacted past
the resourceVersion) and the first event that wakes all end it, and each means the caller reads a fresh view.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from .watch_reader import stop_reader

logger = logging.getLogger(__name__)


@dataclass
class LeaseWatch:
    """One watch stream, opened for the view whose revision is `revision`; `ended` is set when the caller must
    read a fresh view. `failure` holds what ended it, if that was an error (the opening's ApiException too)."""

    revision: str
    ended: threading.Event = field(default_factory=threading.Event)
    failure: Exception | None = None
    _response: Any = None
    _closed: bool = False

    @classmethod
    def start(cls, revision: str, open_stream: Callable[[], Any], wakes: Callable[[dict], bool]) -> LeaseWatch:
        """A watch whose thread calls `open_stream()` (a streaming urllib3 response of `?watch=true`) and reads
        its events until one for which `wakes(event)` is true."""
        watch = cls(revision)
        threading.Thread(target=watch._read, args=(open_stream, wakes), daemon=True,
                         name="shale-kube-watch").start()
        return watch

    def close(self) -> None:
        """Stop the stream: its thread ends as the socket is shut down under its read."""
        self._closed = True
        connection = getattr(self._response, "connection", None)  # None once the thread released it
        stop_reader(getattr(connection, "sock", None))
        self.ended.set()

    def _read(self, open_stream: Callable[[], Any], wakes: Callable[[dict], bool]) -> None:
        response = None
        try:
            response = self._response = open_stream()
            if self._closed:
                return
            pending = b""
            for chunk in response.stream(None, decode_content=False):  # a watch is chunked: each as it comes
                *lines, pending = (pending + chunk).split(b"\n")
                if any(wakes(json.loads(line)) for line in lines if line.strip()):
                    return
            if not self._closed:
                logger.info("Kubernetes: the Lease watch for view %s ended; the view is read again", self.revision[:12])
        except Exception as exc:  # noqa: BLE001 - refused, unreachable, cut: the caller reads a view and learns
            self.failure = exc
            if not self._closed:
                logger.info("Kubernetes: the Lease watch for view %s failed (%s); the view is read again",
                            self.revision[:12], str(exc).splitlines()[0] if str(exc) else repr(exc))
        finally:
            self.ended.set()
            if response is not None:
                response.close()  # a stream read part-way must not go back to the pool open
                response.release_conn()
