"""The kubelet's part in the tests: a ConfigMap's keys projected as files into a directory.

In a cluster every storage pod mounts the topics ConfigMap at /etc/shale/topics and the kubelet keeps
the files in step with the ConfigMap. Here a thread polls the ConfigMap through the API every 0.1 s
and mirrors its keys into the directory the real `shale serve` processes watch: changed keys are
replaced atomically (write, then rename — what the pods see of the kubelet's `..data` swap), removed
keys are deleted. It stands in for the projection only; the sidecars and the operator are real.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Iterator

import kubernetes
import urllib3


class ConfigMapProjection:
    def __init__(self, api: kubernetes.client.ApiClient, namespace: str, name: str, directory: Path) -> None:
        self.core = kubernetes.client.CoreV1Api(api)
        self.namespace, self.name, self.directory = namespace, name, directory
        self._stop = threading.Event()
        self._lock = threading.Lock()  # held by `held()`: no sync runs meanwhile
        self._thread = threading.Thread(target=self._run, name="configmap-projection", daemon=True)

    def start(self) -> "ConfigMapProjection":
        self.directory.mkdir(parents=True, exist_ok=True)
        self.sync()  # the directory starts as the ConfigMap is now (empty if it does not exist)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """No projection inside the block: a kubelet that has not synced the volume yet (it may take a minute)."""
        with self._lock:
            yield
            self.sync()  # under the lock: the thread's sync would race for the same `.tmp` file

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                try:
                    self.sync()
                except urllib3.exceptions.HTTPError:  # API server unreachable: the kubelet keeps the files, retries
                    pass
                except kubernetes.client.ApiException as exc:
                    if exc.status < 500:  # 5xx: the API server without its etcd for a moment; likewise
                        raise

    def sync(self) -> None:
        try:
            data = self.core.read_namespaced_config_map(self.name, self.namespace).data or {}
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
            data = {}
        present = {p.name for p in self.directory.iterdir() if not p.name.startswith(".")}
        for key, text in data.items():
            path = self.directory / key
            if key not in present or path.read_text() != text:
                tmp = self.directory / f".{key}.tmp"
                tmp.write_text(text)
                os.replace(tmp, path)
        for stale in present - set(data):
            (self.directory / stale).unlink()
