"""`Topic` manifests (the objects users `kubectl apply`) read from a file or directory, and watched.

`ManifestSource.reload()` turns the YAML under PATH into `TopicSpec`s. A file that does not parse,
or a Topic in it that is invalid, is refused with a message naming the file and topic; the topics
that file declared before keep their last good spec, so a typo never deletes a topic or reverts its
config. `watch()` calls back (debounced) whenever anything under PATH changes.

Manifest layout (`apiVersion: shale.dev/v1alpha1`, `kind: Topic`; several per file with `---`):

    metadata: {name: latest-product-price, uid: ...}   # uid (set by Kubernetes) becomes the topic id
    spec:
      topicName: optional name when metadata.name cannot hold it (e.g. underscores)
      partitions: 1
      config: {cleanup.policy: compact, ...}          # Kafka topic config names and values
      assignment:                                     # optional: partitions spread over several nodes
        partitions: [0, 1]                            # node id of each partition
        nodes: {"0": "shale-0.shale:9092", "1": "shale-1.shale:9092"}
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

from shale.sidecar.server.topics import TopicSpec
from shale.sidecar.topic_config import InvalidConfigError, TopicConfig

logger = logging.getLogger(__name__)

API_VERSION = "shale.dev/v1alpha1"
KIND = "Topic"
ORIGIN_PREFIX = "manifest:"
_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
RESERVED = frozenset({"__consumer_offsets", "__transaction_state"})


class ManifestError(ValueError):
    """One manifest that cannot be applied; the message names the file and, when known, the topic."""


@dataclass
class ManifestSource:
    """The Topic manifests under one path, with the last good spec of every topic they declare."""

    path: str
    errors: dict[str, str] = field(default_factory=dict)  # "file" or "file: topic" -> message
    _good: dict[str, dict[str, TopicSpec]] = field(default_factory=dict)  # file -> topic -> spec

    def files(self) -> list[str]:
        if os.path.isfile(self.path):
            return [self.path]
        found = []
        for root, dirs, names in os.walk(self.path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # skips ConfigMap's ..data links
            found += [os.path.join(root, n) for n in sorted(names)
                      if n.endswith((".yaml", ".yml")) and not n.startswith(".")]
        return found

    def reload(self) -> list[TopicSpec]:
        """Every topic the manifests declare now (refused ones at their last good spec)."""
        errors: dict[str, str] = {}
        good: dict[str, dict[str, TopicSpec]] = {}
        for path in self.files():
            try:
                with open(path, encoding="utf-8") as f:
                    documents = [d for d in yaml.safe_load_all(f) if d is not None]
            except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
                errors[path] = f"{path}: not readable as YAML: {exc}"
                good[path] = dict(self._good.get(path, {}))  # keep what it declared before
                continue
            specs: dict[str, TopicSpec] = {}
            for doc in documents:
                if not (isinstance(doc, dict) and doc.get("kind") == KIND):
                    continue  # other objects may share a ConfigMap
                try:
                    spec = parse_topic(doc, origin=ORIGIN_PREFIX + path)
                except ManifestError as exc:
                    name = _name_of(doc)
                    errors[f"{path}: {name}" if name else path] = f"{path}: {exc}"
                    previous = self._good.get(path, {}).get(name or "")
                    if previous is not None:
                        specs[previous.name] = previous
                    continue
                specs[spec.name] = spec
            good[path] = specs
        # A topic declared twice stays with the file that declared it before, so that adding a duplicate
        # (in a file that sorts first) never takes a topic over; new names go to the first file in order.
        seen = {name: path for path, specs in self._good.items() for name in specs if name in good.get(path, {})}
        for path, specs in good.items():
            for name in list(specs):
                owner = seen.setdefault(name, path)
                if owner != path:
                    errors[f"{path}: {name}"] = (f"{path}: topic {name} is already declared in {owner}; "
                                                 "this declaration is ignored")
                    del specs[name]
        for key, message in errors.items():
            if self.errors.get(key) != message:
                logger.error("refused manifest: %s (the topic keeps its last good config)", message)
        self.errors, self._good = errors, good
        return [spec for specs in good.values() for spec in specs.values()]


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
    uid = meta.get("uid")
    topic_id = None
    if uid is not None:
        try:
            topic_id = base64.urlsafe_b64encode(uuid.UUID(str(uid)).bytes).rstrip(b"=").decode("ascii")
        except ValueError:
            raise ManifestError(f"topic {name}: metadata.uid {uid!r} is not a UUID") from None
    return TopicSpec(name, partitions, config, origin=origin, topic_id=topic_id, assignment=assignment,
                     nodes=nodes)


def _parse_assignment(name: str, raw: Any, partitions: int) -> tuple[tuple[int, ...] | None, dict[int, tuple[str, int]]]:
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
        raise ManifestError(f"topic {name}: spec.assignment.partitions must list one node id for each of "
                            f"the {partitions} partitions")
    for p, node in enumerate(owners):
        if node not in nodes:
            raise ManifestError(f"topic {name}: partition {p} is assigned to node {node!r}, "
                                "which spec.assignment.nodes does not name")
    return tuple(owners), nodes


def watch(path: str, on_change: Callable[[], None], debounce_s: float = 0.2) -> Callable[[], None]:
    """Call `on_change` (from a watchdog thread) shortly after anything under `path` changes; returns stop."""
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    timer: list[threading.Timer] = []
    lock = threading.Lock()

    single_file = not os.path.isdir(path)
    name = os.path.basename(path)

    def relevant(event) -> bool:
        if event.event_type in ("opened", "closed_no_write"):
            return False
        if not single_file:
            return True
        # A single file is watched through its directory (editors and ConfigMaps replace files by rename),
        # which may hold busy neighbours, e.g. the data directory: only the file itself, or the `..data`
        # link a ConfigMap swaps, counts.
        touched = [os.path.basename(p) for p in (event.src_path, getattr(event, "dest_path", "")) if p]
        return any(t == name or t.startswith("..") for t in touched)

    class _Handler(FileSystemEventHandler):
        def on_any_event(self, event) -> None:
            if not relevant(event):
                return
            with lock:  # editors write in bursts; reload once the burst is over
                if timer:
                    timer[0].cancel()
                timer[:] = [threading.Timer(debounce_s, on_change)]
                timer[0].daemon = True
                timer[0].start()

    observer = Observer()
    if single_file:
        observer.schedule(_Handler(), os.path.dirname(os.path.abspath(path)), recursive=False)
    else:
        observer.schedule(_Handler(), path, recursive=True)
    observer.daemon = True
    observer.start()

    def stop() -> None:
        observer.stop()
        observer.join(5)
        with lock:
            if timer:
                timer[0].cancel()

    return stop
