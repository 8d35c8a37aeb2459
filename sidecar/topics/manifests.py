"""`Topic` manifests (the objects users `kubectl apply`) read from a file or directory, and watched.

`ManifestSource.reload()` turns the YAML under PATH into `TopicSpec`s, and decides which topics the
manifests no longer declare may be deleted. Only an explicit act deletes a topic; everything else is
refused or held, and the topic keeps its last good spec and its data:

- *Refused* (logged at ERROR with file and reason, in `/status` `errors.manifests`, counted by
  `shale_manifest_refusals_total`): a file that cannot be read, does not parse, is emptied (no
  document left where topics were declared), or is its last applied content cut short (truncated: a
  strict prefix of it); a document that is not a `Topic` of this `apiVersion`, or fails validation.
  A refused document keeps its topic's last good
  spec; a file with any refusal (a duplicate declaration too) deletes none of the topics it declared
  before. Its valid documents still apply, and a new file's refused documents declare nothing.
- *Deleted* (Kafka's way, by `TopicRegistry.remove`): a topic whose manifest file was removed, or
  whose document was removed from a file that still reads cleanly, when the reload saw PATH whole.
- *Held* (in `/status` `manifests.held`; deletes nothing): a removal while `delete.topic.enable` is
  false (logged at WARN), or a mass disappearance (logged at ERROR, `shale_manifests_missing` 1, the
  alert ShaleManifestsMissing): PATH missing or not fully listable, no manifest file left under it, or
  none of the files read before left (a directory swapped for another) — an unmounted or emptied
  ConfigMap volume, a wrong `--topics`, a directory swapped out. A held topic stays held,
  served at its last good spec, until a manifest declares it again or it is deleted through
  `TopicRegistry.remove` (DeleteTopics); after a restart it is a stray log (kept, unserved, like any
  log no topic claims). So the last manifest file cannot delete its topics by disappearing: that looks
  exactly like an unmounted volume. A file that declares nothing and never did (e.g. only a comment)
  is no refusal: kept beside the manifests as a placeholder, it makes removing the last one explicit.

A kubelet ConfigMap update swaps the `..data` symlink in one rename, so every key's file reads either
its old or its new content, never missing. `watch()` calls back (debounced) whenever anything under
PATH changes, and again when PATH itself is replaced or mounted over.

Manifest layout (`apiVersion: shale.dev/v1alpha1`, `kind: Topic`; several per file with `---`):

    metadata: {name: latest-product-price, uid: ...}   # uid (set by Kubernetes) becomes the topic id
    spec:
      topicName: optional name when metadata.name cannot hold it (e.g. underscores)
      partitions: 1
      config: {cleanup.policy: compact, ...}          # Kafka topic config names and values
      replicas: 3                                     # optional: the replication factor (needs --store)
      assignment:                                     # optional: partitions spread over several nodes
        partitions: [0, 1]                            # node id of each partition, or its replicas:
                                                      #   [[0, 1, 2], [1, 2, 0]] (preferred leader first)
        nodes: {"0": "shale-0.shale:9092", "1": "shale-1.shale:9092"}   # optional with --store

With a control store, `spec.replicas` alone lets the first replica to create each partition's record choose
its replicas from the live nodes, and the nodes' addresses come from their sessions. A changed
`spec.assignment` moves the partitions whose replicas changed (a reassignment, docs/moves.md); partitions may
then name different numbers of replicas.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from ..plural import plural
from ..topic_config import InvalidConfigError, TopicConfig
from .registry import TopicSpec

logger = logging.getLogger(__name__)

API_VERSION = "shale.dev/v1alpha1"
KIND = "Topic"
ORIGIN_PREFIX = "manifest:"
_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
RESERVED = frozenset({"__consumer_offsets", "__transaction_state"})

HELD_MISSING = "manifests-missing"  # the reasons a removal is held (`ManifestSource.held`, /status, metrics)
HELD_DELETION_DISABLED = "deletion-disabled"
HELD_REASONS = (HELD_MISSING, HELD_DELETION_DISABLED)


class ManifestError(ValueError):
    """One manifest that cannot be applied; the message names the file and, when known, the topic."""


def require_path(path: str) -> None:
    """`--topics` must exist when the node starts: a typo must not start a node that declares nothing."""
    if not os.path.exists(path):
        raise ManifestError(f"--topics {path}: no such file or directory (create it, even empty, or fix the path)")


@dataclass(frozen=True)
class Held:
    """A topic the manifests no longer declare, kept with its last good spec because its removal was not explicit."""

    spec: TopicSpec
    reason: str  # one of HELD_REASONS
    message: str


@dataclass
class _File:
    """One manifest file as read now: the topics its valid documents declare, its refusals, its bytes."""

    specs: dict[str, TopicSpec]
    errors: dict[str, str]  # "file" or "file: topic" -> message
    content: bytes | None  # None when the file is refused as a whole (the last good content stays)


@dataclass
class ManifestSource:
    """The Topic manifests under one path, with the last good spec of every topic they declare."""

    path: str
    delete_topic_enable: bool = True  # the broker's delete.topic.enable
    errors: dict[str, str] = field(default_factory=dict)  # "file" or "file: topic" -> message
    held: dict[str, Held] = field(default_factory=dict)  # topic -> why its removal is held
    refusals: int = 0  # refusals logged since the start (each new message once): shale_manifest_refusals_total
    files_found: int = 0  # manifest files at the last reload
    _unlisted: str | None = None  # why the last reload could not list PATH (missing, unreadable), or None
    _stray_problem: str | None = None  # no manifest at all, but logs of undeclared topics on disk
    _good: dict[str, dict[str, TopicSpec]] = field(default_factory=dict)  # file -> topic -> spec
    _content: dict[str, bytes] = field(default_factory=dict)  # file -> its last applied bytes

    @property
    def missing(self) -> str | None:
        """Why the manifests look missing (shale_manifests_missing, the alert), or None."""
        if self._unlisted:
            return self._unlisted
        held = sorted(name for name, h in self.held.items() if h.reason == HELD_MISSING)
        if held:
            return self.held[held[0]].message
        return self._stray_problem

    def files(self) -> tuple[list[str], str | None]:
        """The manifest files under PATH, and why the listing is incomplete (None when it is whole)."""
        if os.path.isfile(self.path):
            return [self.path], None
        if not os.path.isdir(self.path):
            return [], (f"{self.path} does not exist" if not os.path.lexists(self.path)
                        else f"{self.path} is neither a readable file nor a directory")
        problems: list[str] = []
        found = []
        for root, dirs, names in os.walk(self.path, onerror=lambda exc: problems.append(
                f"cannot list {exc.filename}: {exc.strerror}")):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # skips ConfigMap's ..data links
            found += [os.path.join(root, n) for n in sorted(names)
                      if n.endswith((".yaml", ".yml")) and not n.startswith(".")]
        return found, problems[0] if problems else None

    def reload(self) -> list[TopicSpec]:
        """Every topic the manifests declare now, plus the refused and held ones at their last good spec."""
        paths, unlisted = self.files()
        read = {path: self._read(path) for path in paths}
        self._refuse_duplicates(read)
        claimed = {name for f in read.values() for name in f.specs}
        for path, f in read.items():
            if f.errors:  # a refused file or document deletes nothing its file declared before
                f.specs.update((n, s) for n, s in self._good.get(path, {}).items() if n not in claimed)
        good = {path: f.specs for path, f in read.items()}
        declared = {name for specs in good.values() for name in specs}
        previous = {name: (path, spec) for path, specs in self._good.items() for name, spec in specs.items()}
        vanished = {name: ps for name, ps in previous.items() if name not in declared and name not in self.held}
        problem = unlisted
        if problem is None and vanished and not paths:
            problem = f"no manifest file left under {self.path}"
        elif problem is None and vanished and not set(self._good) & set(paths):
            problem = (f"none of the {plural(len(self._good), 'manifest file')} read before is left under "
                       f"{self.path} (replaced?)")
        held = {name: h for name, h in self.held.items() if name not in declared}
        for name in set(self.held) - set(held):
            logger.info("topic %s is declared by a manifest again: no longer held", name)
        for name, (path, spec) in sorted(vanished.items()):
            if problem is not None:
                held[name] = Held(spec, HELD_MISSING, problem)
            elif not self.delete_topic_enable:
                held[name] = Held(spec, HELD_DELETION_DISABLED,
                                  f"topic {name}: its manifest was removed from {path}, but delete.topic.enable is "
                                  "false: the topic and its data are kept")
                logger.warning("%s", held[name].message)
            else:
                logger.info("topic %s: its manifest was removed from %s: deleting the topic", name, path)
        if problem is not None and (problem != self._unlisted or set(vanished) & set(held)):
            logger.error("manifests missing: %s; deleting nothing (%s held: %s)", problem,
                         plural(len([h for h in held.values() if h.reason == HELD_MISSING]), "topic"),
                         ", ".join(sorted(n for n, h in held.items() if h.reason == HELD_MISSING)) or "none")
        errors = {key: message for f in read.values() for key, message in f.errors.items()}
        for key, message in errors.items():
            if self.errors.get(key) != message:
                self.refusals += 1
                logger.error("refused manifest: %s (what it declared before keeps its last good spec and its data)",
                             message)
        self.errors, self.held, self._good, self._unlisted = errors, held, good, unlisted
        self.files_found = len(paths)
        self._content = {path: f.content if f.content is not None else self._content[path]
                         for path, f in read.items() if f.content is not None or path in self._content}
        return [spec for specs in good.values() for spec in specs.values()] + [h.spec for h in held.values()]

    def check_strays(self, topics: set[str]) -> None:
        """After a reload: no manifest file at all while the data dir holds logs no topic claims is a wrong
        or unmounted `--topics` too (after a restart nothing is held: those logs are the only trace)."""
        problem = None
        if self.files_found == 0 and topics:
            problem = (f"no manifest file under {self.path}, but the data directory holds logs of "
                       f"{plural(len(topics), 'topic')} no manifest declares ({', '.join(sorted(topics))}): "
                       "kept, not served")
        if problem is not None and problem != self._stray_problem:
            logger.error("manifests missing: %s", problem)
        self._stray_problem = problem

    def forget(self, name: str) -> None:
        """The topic was deleted another way (DeleteTopics): its last good spec must not bring it back."""
        self.held.pop(name, None)
        for specs in self._good.values():
            specs.pop(name, None)

    def _read(self, path: str) -> _File:
        """One file: its valid documents and its refusals."""
        before = self._good.get(path, {})

        def refused(reason: str) -> _File:
            return _File({}, {path: f"{path}: {reason}"}, None)

        try:
            with open(path, "rb") as f:
                content = f.read()
        except OSError as exc:
            return refused(f"not readable: {exc.strerror}")
        last = self._content.get(path, b"")
        truncated = None
        if 0 < len(content) < len(last) and last.startswith(content):  # what an interrupted write leaves
            truncated = (f"truncated: the file is the first {len(content)} of the {len(last)} bytes it held when "
                         "last applied (to shorten it on purpose, change it in another way too)")
        try:
            documents = [d for d in yaml.safe_load_all(content.decode("utf-8")) if d is not None]
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            return refused(truncated or f"not readable as YAML: {exc}")
        if not documents:  # refused if it declared topics: emptied or cut to nothing; else a placeholder
            return refused("the file is empty: it declares no Topic (remove the file to delete its topics)") \
                if before else _File({}, {}, content)
        specs: dict[str, TopicSpec] = {}
        errors: dict[str, str] = {}
        for number, doc in enumerate(documents, 1):
            name = _name_of(doc) if isinstance(doc, dict) else None
            try:
                if not isinstance(doc, dict):
                    raise ManifestError(f"document {number} is a YAML {type(doc).__name__}, not a {KIND}")
                if doc.get("kind") != KIND:
                    raise ManifestError(f"document {number}: kind must be {KIND}, got {doc.get('kind')!r} (every "
                                        "YAML document under --topics must be a Topic)")
                spec = parse_topic(doc, origin=ORIGIN_PREFIX + path)
            except ManifestError as exc:
                errors[f"{path}: {name}" if name else f"{path}: document {number}"] = f"{path}: {exc}"
                continue
            specs[spec.name] = spec
        if truncated and (errors or specs != before):
            return refused(truncated)
        return _File(specs, errors, content)

    def _refuse_duplicates(self, read: dict[str, _File]) -> None:
        """A topic declared twice stays with the file that declared it before, so that adding a duplicate (in a
        file that sorts first) never takes a topic over; new names go to the first file in order."""
        owners = {name: path for path, specs in self._good.items() for name in specs
                  if path in read and name in read[path].specs}
        for path, f in read.items():
            for name in list(f.specs):
                owner = owners.setdefault(name, path)
                if owner != path:
                    f.errors[f"{path}: {name}"] = (f"{path}: topic {name} is already declared in {owner}; "
                                                   "this declaration is ignored")
                    del f.specs[name]


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _name_of(doc: dict) -> str | None:
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    name = spec.get("topicName") or meta.get("name")
    return name if isinstance(name, str) else None


def parse_topic(doc: dict[str, Any], origin: str) -> TopicSpec:
    """One Topic object → TopicSpec, or ManifestError saying which field is wrong and why."""
    if doc.get("apiVersion") != API_VERSION:
        raise ManifestError(f"apiVersion must be {API_VERSION}, got {doc.get('apiVersion')!r}")
    meta = doc.get("metadata") or {}
    spec = doc.get("spec") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        raise ManifestError("metadata and spec must be mappings")
    name = _name_of(doc)
    if not name:
        raise ManifestError("a Topic needs metadata.name (or spec.topicName)")
    if not _LEGAL_NAME.fullmatch(name) or name in (".", ".."):
        raise ManifestError(f"topic {name!r}: a topic name is 1-249 characters of a-z, A-Z, 0-9, '.', '_', '-'")
    if name in RESERVED:
        raise ManifestError(f"topic {name}: the name is reserved for an internal topic")
    partitions = spec.get("partitions", 1)
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise ManifestError(f"topic {name}: spec.partitions must be an integer >= 1, got {partitions!r}")
    raw_config = spec.get("config") or {}
    if not isinstance(raw_config, dict):
        raise ManifestError(f"topic {name}: spec.config must be a mapping of Kafka config names to values")
    try:
        config = TopicConfig.from_mapping(raw_config)
    except InvalidConfigError as exc:
        raise ManifestError(f"topic {name}: invalid config: {exc}") from None
    assignment, nodes = _parse_assignment(name, spec.get("assignment"), partitions)
    replicas = spec.get("replicas")
    if replicas is not None:
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise ManifestError(f"topic {name}: spec.replicas must be an integer >= 1, got {replicas!r}")
        wrong = [p for p, r in enumerate(assignment or ()) if len(r) != replicas]
        if wrong:
            raise ManifestError(f"topic {name}: spec.replicas is {replicas}, but spec.assignment.partitions names "
                                f"{len(assignment[wrong[0]])} replicas per partition")
    uid = meta.get("uid")
    topic_id = None
    if uid is not None:
        try:
            topic_id = base64.urlsafe_b64encode(uuid.UUID(str(uid)).bytes).rstrip(b"=").decode("ascii")
        except ValueError:
            raise ManifestError(f"topic {name}: metadata.uid {uid!r} is not a UUID") from None
    return TopicSpec(name, partitions, config, origin=origin, topic_id=topic_id, assignment=assignment,
                     nodes=nodes, replication_factor=replicas)


def _parse_assignment(name: str, raw: Any, partitions: int
                      ) -> tuple[tuple[tuple[int, ...], ...] | None, dict[int, tuple[str, int]]]:
    if raw is None:
        return None, {}
    if not isinstance(raw, dict):
        raise ManifestError(f"topic {name}: spec.assignment must be a mapping with 'partitions' and 'nodes'")
    nodes: dict[int, tuple[str, int]] = {}
    for key, address in (raw.get("nodes") or {}).items():
        host, _, port = str(address).rpartition(":")
        try:
            nodes[int(key)] = (host, int(port))
        except ValueError:
            raise ManifestError(f"topic {name}: spec.assignment.nodes[{key}] must map a node id to "
                                f"'host:port', got {address!r}") from None
        if not host:
            raise ManifestError(f"topic {name}: spec.assignment.nodes[{key}] has no host: {address!r}")
    owners = raw.get("partitions")
    if not isinstance(owners, list) or len(owners) != partitions:
        raise ManifestError(f"topic {name}: spec.assignment.partitions must list one node id (or a list of "
                            f"replicas) for each of the {partitions} partitions")
    assignment = tuple(_replicas(name, p, entry) for p, entry in enumerate(owners))
    # Partitions may name different numbers of replicas (unlike CreateTopics): a replication factor changed by
    # reassignment moves one partition at a time (docs/moves.md).
    for p, replicas in enumerate(assignment):
        for node in replicas:  # no addresses at all is fine: with a store they come from the nodes' sessions
            if nodes and node not in nodes:
                raise ManifestError(f"topic {name}: partition {p} is assigned to node {node!r}, "
                                    "which spec.assignment.nodes does not name")
    return assignment, nodes


def _replicas(name: str, partition: int, entry: Any) -> tuple[int, ...]:
    """One entry of spec.assignment.partitions: a node id, or a list of distinct node ids (leader first)."""
    replicas = entry if isinstance(entry, list) else [entry]
    if not replicas or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in replicas) \
            or len(set(replicas)) != len(replicas):
        raise ManifestError(f"topic {name}: spec.assignment.partitions[{partition}] must be a node id or a list "
                            f"of distinct node ids, got {entry!r}")
    return tuple(replicas)


def watch(path: str, on_change: Callable[[], None], debounce_s: float = 0.2,
          resync_s: float = 2.0) -> Callable[[], None]:
    """Call `on_change` (from a watchdog thread) shortly after anything under `path` changes; returns stop.

    inotify watches inodes: once `path` is renamed, replaced or mounted over, a watch on it sees nothing
    more. So the parent directory is watched for `path` itself, and every `resync_s` the identity of `path`
    (device, inode; a mount changes the device) is checked: when it changed, or the parent saw `path`
    replaced (a new directory may get the old inode number), the watch moves to the directory now there
    and `on_change` runs. It also runs when the identity differs from the one `path` had when `on_change`
    last ran: a volume mounted and unmounted again between two looks leaves the watched identity as it
    was, but the last reload read the files of the mount, which are gone.
    """
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    timer: list[threading.Timer] = []
    lock = threading.Lock()
    stopped = threading.Event()
    path = os.path.abspath(path)
    parent, name = os.path.split(path)

    def relevant(event) -> bool:
        if event.event_type in ("opened", "closed_no_write"):
            return False
        touched = [p for p in (event.src_path, getattr(event, "dest_path", "")) if p]
        if any(p == path or p.startswith(path + os.sep) for p in touched):
            return True
        # Beside a single file (editors and ConfigMaps replace files by rename) only the `..data` link a
        # ConfigMap swaps counts: the neighbours may be busy, e.g. the data directory.
        return not os.path.isdir(path) and any(os.path.dirname(p) == parent and os.path.basename(p).startswith("..")
                                               for p in touched)

    read_identity = [_identity(path)]  # of `path` when `on_change` last ran (the caller has just read it)

    def reload() -> None:
        read_identity[0] = _identity(path)  # before reading: a change after this is seen at the next look
        on_change()

    def trigger() -> None:
        with lock:  # editors write in bursts; reload once the burst is over
            if timer:
                timer[0].cancel()
            timer[:] = [threading.Timer(debounce_s, reload)]
            timer[0].daemon = True
            timer[0].start()

    class _Handler(FileSystemEventHandler):
        def on_any_event(self, event) -> None:
            # Only these replace `path`; opening and reading it (every reload does) must not, or each look
            # would reload again while nothing changed.
            if event.event_type in ("created", "deleted", "moved") \
                    and path in (event.src_path, getattr(event, "dest_path", "")):
                watched[0] = ("replaced",)  # a new directory may reuse the old inode: follow it at the next look
            if relevant(event):
                trigger()

    watched: list = [None, None]  # [identity, watch] of `path` as a directory
    handler = _Handler()
    observer = Observer()
    observer.schedule(handler, parent, recursive=False)

    def follow() -> bool:
        """Watch the directory now at `path`; True if it is not the one watched before."""
        identity = _identity(path) if os.path.isdir(path) else None
        if identity == watched[0]:
            return False
        if watched[1] is not None:
            try:
                observer.unschedule(watched[1])
            except (KeyError, OSError):  # already gone with its directory
                pass
        watched[:] = [identity, None]
        if identity is not None:
            try:
                watched[1] = observer.schedule(handler, path, recursive=True)
            except OSError as exc:  # replaced again meanwhile, or unreadable: the next look retries
                if watched[0] != ("unwatched", exc.errno):
                    logger.warning("cannot watch %s: %s", path, exc)
                watched[0] = ("unwatched", exc.errno)
        return True

    def resync() -> None:
        while not stopped.wait(resync_s):
            if follow() or _identity(path) != read_identity[0]:
                trigger()

    follow()
    observer.daemon = True
    observer.start()
    resyncer = threading.Thread(target=resync, name="shale-manifest-resync", daemon=True)
    resyncer.start()

    def stop() -> None:
        stopped.set()
        resyncer.join(5)
        observer.stop()
        observer.join(5)
        with lock:
            if timer:
                timer[0].cancel()

    return stop
