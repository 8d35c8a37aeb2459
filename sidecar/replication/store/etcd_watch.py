"""An etcd watch on a key prefix, kept open between waits and read by a thread of its own.

The controller waits for a store change in slices of `poll_ms` (100 ms), so that its own wake-ups are acted
on within one slice. A watch opened per slice cost every idle node ten HTTP connections a second and etcd ten
watch creations (an idle three-node cluster: 68 ms of etcd CPU per second, ~20 ms per node). A stream opened
once per revision stays open across slices until it delivers an event or ends, so an idle cluster holds one
watch per node and opens none. Opening is bounded like any etcd call (the caller learns StoreUnavailable);
once etcd has confirmed the watch, its silence is the expected answer for as long as nothing changes.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
from dataclasses import dataclass, field

from .watch_reader import stop_reader

logger = logging.getLogger(__name__)


class WatchNotOpened(Exception):
    """etcd did not confirm the watch: unreachable, refused, or too slow (the message says which)."""


@dataclass
class WatchStream:
    """One streamed `/v3/watch` request from `revision` + 1 on; `ended` is set by its first event (or a
    cancel: history compacted past the revision) and by the stream's end or failure — each means the caller
    must read a fresh view."""

    revision: str
    connection: http.client.HTTPConnection
    response: http.client.HTTPResponse
    ended: threading.Event = field(default_factory=threading.Event)
    _closed: bool = False

    @classmethod
    def open(cls, connection: http.client.HTTPConnection, prefix_b64: str, range_end_b64: str, revision: str,
             timeout_s: float) -> WatchStream | None:
        """Send the watch and wait (at most `timeout_s` per read) for etcd to confirm it; then a thread reads
        the rest. None when the store has changed after `revision` already (its events came with the
        confirmation): the caller reads a view at once."""
        body = json.dumps({"create_request": {"key": prefix_b64, "range_end": range_end_b64,
                                              "start_revision": int(revision) + 1}})
        confirmed, pending = False, b""
        try:
            connection.request("POST", "/v3/watch", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            if response.status != 200:
                raise WatchNotOpened(f"watch answered {response.status}: {response.read(200)!r}")
            while not confirmed:
                chunk = response.read1(65536)
                if not chunk:
                    raise WatchNotOpened("watch stream ended before etcd confirmed it")
                *lines, pending = (pending + chunk).split(b"\n")
                results = _results(lines)
                if any(_changed(result) for result in results):
                    return None
                confirmed = any(result.get("created") for result in results)
        except TimeoutError:
            raise WatchNotOpened(f"watch not confirmed within {timeout_s} s") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise WatchNotOpened(f"watch failed: {exc!r}") from None
        finally:
            if not confirmed:
                connection.close()
        connection.sock.settimeout(None)  # confirmed: silence now means nothing changed
        stream = cls(revision, connection, response)
        threading.Thread(target=stream._read, args=(pending,), daemon=True, name="shale-etcd-watch").start()
        return stream

    def close(self) -> None:
        """Stop the stream; its thread ends as the socket is shut down under its read."""
        self._closed = True
        stop_reader(self.connection.sock)
        self.ended.set()

    def _read(self, pending: bytes) -> None:
        try:
            while not self._closed:
                chunk = self.response.read1(65536)
                if not chunk:
                    if not self._closed:
                        logger.info("etcd watch from revision %s: the stream ended; the view is read again",
                                    self.revision)
                    return
                *lines, pending = (pending + chunk).split(b"\n")
                if any(_changed(result) for result in _results(lines)):
                    return
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if not self._closed:
                logger.info("etcd watch from revision %s failed (%r); the view is read again", self.revision, exc)
        finally:
            self.ended.set()
            self.connection.close()


def _results(lines: list[bytes]) -> list[dict]:
    return [json.loads(line).get("result", {}) for line in lines if line.strip()]


def _changed(result: dict) -> bool:
    """Events, or the watch cancelled (history compacted past the revision): a fresh view is due."""
    return bool(result.get("events") or result.get("canceled") or result.get("compact_revision"))
