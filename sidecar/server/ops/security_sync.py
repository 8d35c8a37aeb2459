"""With `--store etcd://…`: one security state for the whole cluster, kept in etcd.

The ACLs and SCRAM credentials live in one etcd key, `/shale/<cluster>.security/state`, as the document
`shale-security.json` holds (never a password), outside the prefix the controller watches. Every node
follows it: a thread watches the key and hands each new version to the node's `SecurityStore` on the
event loop (memory, then the local file, which stays the node's copy for a start without etcd). An admin
API change (CreateAcls, DeleteAcls, AlterUserScramCredentials) is made on a scratch copy of the current
document and written back with a compare-and-swap on the key's version, retried from a fresh read when
another node wrote first, then applied on this node before it is answered: the answer means the whole
cluster has the change, and the other nodes apply it within a watch round trip. When etcd cannot be
reached the change is refused (UNKNOWN_SERVER_ERROR naming etcd) and nothing changes anywhere.

The first node to find no key writes its own file's state there; from then on etcd's copy wins, so a
node's local file never overrides the cluster's. On Kubernetes (`--store kubernetes`) the operator is the
writer of record instead (docs/security.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import TYPE_CHECKING, Callable, TypeVar

from ...replication.control_store import StoreUnavailable
from ...security.store import SecurityStore, SecurityStoreError

if TYPE_CHECKING:
    from ...replication.store.etcd_store import EtcdStore

logger = logging.getLogger(__name__)

KEY = "state"
WATCH_S = 10.0  # one watch round; a change ends it at once
RETRY_S = 1.0  # after etcd failed to answer
CAS_ATTEMPTS = 5  # writes lost to another node's before the change is refused

_T = TypeVar("_T")


class _Stopped(Exception):
    """The node stopped following while a call waited for its loop."""


class SharedSecurity:
    """The cluster's security state in etcd, followed by this node's `SecurityStore`."""

    @classmethod
    def on_etcd(cls, url: str, cluster_id: str, security: SecurityStore) -> SharedSecurity:
        """For `--store etcd://…`: two clients (follow, change) whose prefix, `/shale/<cluster>.security/`, is
        beside the controller's, not under it (its watch does not wake for security changes)."""
        from ...replication.store.etcd_store import EtcdStore, parse_endpoints

        endpoints = parse_endpoints(url)
        return cls(EtcdStore(endpoints, f"{cluster_id}.security"), EtcdStore(endpoints, f"{cluster_id}.security"),
                   security)

    def __init__(self, watcher: EtcdStore, writer: EtcdStore, security: SecurityStore) -> None:
        self.security = security
        self._watcher = watcher  # the follow thread's client
        self._writer = writer  # the admin changes' client (one thread at a time: `_writing`)
        self._writing = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._applied = -1  # the version of etcd's copy this node holds (read and written on the loop only)
        self.where = f"etcd key {writer.prefix}{KEY}"

    # --- following ------------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._follow, name="shale-security-sync", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop following: the thread (a daemon) ends at its watch's end, without touching the node again."""
        self._stopped.set()
        with self._writing:
            self._writer.close()

    def _follow(self) -> None:
        try:
            self._follow_until_stopped()
        except _Stopped:
            pass
        except RuntimeError:  # the loop closed under a call: the node is gone
            if not self._stopped.is_set():
                logger.exception("stopped following %s", self.where)
        finally:
            self._watcher.close()

    def _follow_until_stopped(self) -> None:
        version: str | None = None
        failing = False
        while not self._stopped.is_set():
            try:
                found = self._watcher.get_document(KEY)
                if found is None:  # the first node here: its own state becomes the cluster's
                    doc = self._on_loop(self.security.document)
                    if self._watcher.put_document(KEY, json.dumps(doc), None):
                        logger.info("security state of the cluster created in %s from this node's %s", self.where,
                                    self.security.path)
                    continue
                value, new_version = found
                if new_version != version:
                    self._apply(value, new_version)
                    version = new_version
                if failing:
                    logger.info("%s readable again", self.where)
                    failing = False
                self._watcher.wait_for_change(version, WATCH_S)
            except StoreUnavailable as e:
                if not failing:
                    logger.warning("cannot follow %s (ACLs and credentials stay as last read): %s", self.where, e)
                    failing = True
                self._stopped.wait(RETRY_S)

    def _apply(self, value: str, version: str) -> None:
        source = f"{self.where} (version {version})"
        try:
            doc = json.loads(value)
        except ValueError as e:
            logger.error("%s is not JSON (%s): ACLs and credentials stay as they were", source, e)
            return
        try:
            self._on_loop(lambda: self._take(doc, version))
        except SecurityStoreError as e:
            logger.error("%s: ACLs and credentials stay as they were", e)

    def _take(self, doc: dict, version: str) -> None:
        """On the loop: `doc` as the node's state unless a newer version is already held (a change this node
        made can be applied before the watch brings it, and an older read must not undo it)."""
        if int(version) <= self._applied:
            return
        self.security.replace(doc, f"{self.where} (version {version})")
        self._applied = int(version)

    def _on_loop(self, fn: Callable[[], _T]) -> _T:
        async def call() -> _T:
            if self._stopped.is_set():
                raise _Stopped()
            return fn()
        return asyncio.run_coroutine_threadsafe(call(), self._loop).result()

    # --- changing -------------------------------------------------------------------------------------

    async def change(self, fn: Callable[[SecurityStore], _T]) -> _T:
        """`fn` (a `SecurityStore` method's semantics) applied to the cluster's state; its outcomes carry the
        store's own errors when etcd refuses the write. Applied on this node before it returns."""
        result, written = await asyncio.to_thread(self._change, fn)
        if written is not None:
            try:
                self._take(*written)
            except SecurityStoreError as e:  # in etcd and in force here; only this node's copy on disk lags
                logger.error("%s", e)
        return result

    def _change(self, fn: Callable[[SecurityStore], _T]) -> tuple[_T, tuple[dict, str] | None]:
        with self._writing:
            for _ in range(CAS_ATTEMPTS):
                outcome: dict = {}
                expected: str | None = None
                try:
                    found = self._writer.get_document(KEY)
                    expected = None if found is None else found[1]
                    current = self._on_loop(self.security.document) if found is None else json.loads(found[0])
                except (StoreUnavailable, ValueError) as e:  # unreachable, or not JSON: refuse the change
                    outcome["unavailable"], current = e, self._on_loop(self.security.document)

                def persist(doc: dict) -> None:
                    try:
                        if "unavailable" in outcome:
                            raise StoreUnavailable(str(outcome["unavailable"]))
                        version = self._writer.put_document(KEY, json.dumps(doc), expected)
                    except StoreUnavailable as e:
                        logger.error("security change refused: cannot write %s: %s", self.where, e)
                        raise SecurityStoreError(f"cannot write {self.where}: {e}") from None
                    if version is None:
                        outcome["conflict"] = True
                        logger.info("%s changed meanwhile (another node's change): making this one again", self.where)
                        raise SecurityStoreError(f"{self.where} changed meanwhile")
                    outcome["written"] = (doc, version)

                try:
                    scratch = SecurityStore.from_document(current, self.where, persist)
                except SecurityStoreError as e:  # etcd's copy does not parse: refuse, as for unreachable
                    outcome["unavailable"] = e
                    scratch = SecurityStore.from_document(self._on_loop(self.security.document), self.where, persist)
                result = fn(scratch)
                if not outcome.get("conflict"):
                    return result, outcome.get("written")
            logger.error("%s kept changing: a security change was refused after %d attempts", self.where,
                         CAS_ATTEMPTS)
            return result, None
