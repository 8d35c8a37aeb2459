"""A Kubernetes API for the operator tests: kmock's in-memory API server, run in its own thread.

kmock's `KubernetesEmulator` stores objects, serves list/watch/get/create/patch/delete and honours
finalizers, but leaves the bookkeeping a real API server does to the client (docs: "merge the dicts,
overwrite the keys"). `ApiServer` adds the parts the operator and kopf rely on: every write gets a
new `metadata.resourceVersion` (and a create a uid, generation 1, creationTimestamp, and a name from
`generateName`), a change of `spec` bumps `metadata.generation`, a create is answered 201, and a
merge patch that names a resourceVersion other than the stored one is refused with 409 Conflict —
the precondition the operator's ConfigMap writes use — while a JSON patch whose `test` op fails
(kopf guards its finalizer patches so) gets 422, both as kube-apiserver answers them. Tests can also
make it refuse an action on a resource to the operator (`refuse`/`allow`, as RBAC would; the tests'
own client, an administrator, is never refused) and read every request it served (`requests`).
Everything else is kmock's.

The server runs on its own event loop in a background thread, so tests stay synchronous and talk to
it over HTTP with the `kubernetes` client, as a user with kubectl would.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import threading
import uuid
from pathlib import Path
from typing import Any, Iterator

import attrs
import jsonpatch
import kmock
import kubernetes
import yaml
from kmock._internal import dicts, enums  # the emulator's own merge-patch code and action names

_WRITES = (enums.action.CREATE, enums.action.UPDATE)
TEST_USER_AGENT = "shale-tests"


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator plus resourceVersion/uid/generation stamping and resourceVersion preconditions."""

    _stamp_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    _versions: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    # (action, plural) → HTTP status to answer instead, e.g. ("UPDATE", "configmaps"): 403, as RBAC would.
    refusals: dict[tuple[str, str], int] = attrs.field(factory=dict, init=False)

    async def _handle(self, request: kmock.Request) -> Any:
        known = request.resource is not None and request.action is not None \
            and request.headers.get("User-Agent") != TEST_USER_AGENT
        refused = self.refusals.get((request.action.value, request.resource.plural)) if known else None
        if refused is not None:
            return await self._render_error(kmock.KubernetesError(
                status=refused, reason="Forbidden", message=f"{request.action.value} {request.resource.plural} is "
                                                            "refused by the test"))
        if request.resource is None or request.action not in _WRITES:
            return await super()._handle(request)
        async with self._stamp_lock:  # the check and the write happen as one step
            try:
                self._stamp(request)
            except kmock.KubernetesError as exc:
                return await self._render_error(exc)
            response = await super()._handle(request)
            if request.action == enums.action.CREATE and response.status == 200 and not response.prepared:
                response.set_status(201)  # as the API server answers a create (clients map only 201)
            return response

    def _stamp(self, request: kmock.Request) -> None:
        version = str(next(self._versions))
        if request.action == enums.action.CREATE:
            meta = request.data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):  # kopf's Events: a unique name per Event
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("generation", 1)
            meta.setdefault("creationTimestamp", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            if request.namespace:
                meta.setdefault("namespace", request.namespace)
            meta["resourceVersion"] = version
            return
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return  # kmock answers 404
        current = copy.deepcopy(self.objects[key].raw)
        meta = current.get("metadata", {})
        if isinstance(request.data, dict):
            wanted = (request.data.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != meta.get("resourceVersion"):
                raise kmock.KubernetesError(
                    status=409, reason="Conflict",
                    message=f'Operation cannot be fulfilled on {request.resource.plural} "{request.name}": the '
                            "object has been modified; please apply your changes to the latest version and try again")
            after = dicts.merge_patch_dict(current, request.data)
        else:
            try:
                after = jsonpatch.apply_patch(current, request.data)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                # A failed `test` op (kopf's resourceVersion guard) or a bad path: 422, as the API server
                # answers; kopf then retries on its next cycle with a fresh body.
                raise kmock.KubernetesError(status=422, reason="Invalid", message=f"the JSON patch failed: {exc}")
        changes = {"resourceVersion": version}
        if request.subresource is None and after.get("spec") != current.get("spec"):
            changes["generation"] = int(meta.get("generation") or 1) + 1
        if isinstance(request.data, dict):
            request.data.setdefault("metadata", {}).update(changes)
        else:
            request.data.extend({"op": "add", "path": f"/metadata/{k}", "value": v} for k, v in changes.items())


def declare_resources(server: ApiServer) -> None:
    """The API resources of the test cluster (kmock serves discovery from these)."""
    info = kmock.ResourceInfo
    every = {"get", "list", "watch", "create", "patch", "delete"}
    server.resources["shale.dev/v1alpha1/topics"] = info(kind="Topic", namespaced=True, verbs=every,
                                                         subresources={"status"})
    server.resources["shale.dev/v1alpha1/users"] = info(kind="User", namespaced=True, verbs=every,
                                                        subresources={"status"})
    server.resources["v1/namespaces"] = info(kind="Namespace", namespaced=False, verbs={"list", "watch"})
    server.resources["v1/secrets"] = info(kind="Secret", namespaced=True, verbs=every | {"update"})
    server.resources["v1/events"] = info(kind="Event", namespaced=True, verbs={"create", "list"})
    server.resources["v1/configmaps"] = info(kind="ConfigMap", namespaced=True, verbs=every)
    server.resources["v1/pods"] = info(kind="Pod", namespaced=True, verbs=every)
    server.resources["apps/v1/statefulsets"] = info(kind="StatefulSet", namespaced=True, verbs=every)


class ApiServerThread:
    """An `ApiServer` on 127.0.0.1 (a random port), on its own event loop in a daemon thread."""

    def __init__(self) -> None:
        self.url = ""
        self.server: ApiServer | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kmock-api", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            async with ApiServer() as server, kmock.Server(server):
                declare_resources(server)
                self.server = server
                self.url = str(server.url).rstrip("/")
                self._ready.set()
                await self._stop.wait()
        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self._error = exc
            self._ready.set()

    def start(self) -> "ApiServerThread":
        self._thread.start()
        assert self._ready.wait(15), "the API server did not start"
        if self._error:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)

    def refuse(self, action: str, plural: str, status: int = 403) -> None:
        """Answer the operator's `action` (LIST, FETCH, CREATE, UPDATE, DELETE) on `plural` with `status` from now."""
        assert self.server is not None
        self.server.refusals[(action, plural)] = status  # one dict store: safe from the test thread

    def allow(self, action: str, plural: str) -> None:
        """Undo `refuse`."""
        assert self.server is not None
        self.server.refusals.pop((action, plural), None)

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig for this server, as `kubectl config` would write it."""
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "not-checked"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "tester"}}],
        }))
        return path

    def client(self) -> kubernetes.client.ApiClient:
        """The tests' own client; its User-Agent tells its calls apart from the operator's (`requests`)."""
        configuration = kubernetes.client.Configuration()
        configuration.host = self.url
        api = kubernetes.client.ApiClient(configuration)
        api.user_agent = TEST_USER_AGENT
        return api

    def requests(self) -> list[kmock.Request]:
        """Every request served so far, in order (kmock keeps them for assertions)."""
        assert self.server is not None
        return list(self.server._requests)
