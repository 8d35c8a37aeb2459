"""The kopf handlers of `User` resources: the Secret, the SCRAM credential and the ACLs on every storage pod.

Reconciling is level-based, like a Topic's: create, update, resume and a timer every
`status_interval_seconds` run the same `reconcile_user`:

1. the spec as Kafka state (`user_spec.desired_user`; refused: Ready=False InvalidSpec, nothing written);
2. the Secret named like the User: created with a generated password (scram-sha-512) or a certificate
   signed by the clients CA (tls), owned by the User; a Secret of that name that is not the User's is
   left alone (Ready=False SecretConflict);
3. every storage pod (ordinals of the StatefulSet), over its Kafka admin APIs (`user_admin.NodeAdmin`):
   the salted credential is sent by AlterUserScramCredentials when the password is new to this operator
   process (a change, a regenerated Secret, a restart) or the pod holds none (a pod on a fresh volume);
   the principal's ACLs are made exactly the spec's: missing ones created, others deleted;
4. status: `username` (the principal), `secret`, Ready with the reason, observedGeneration.

Deletion removes the credential and every ACL of the principal from every pod before the finalizer
goes; the Secret goes with the User (owner reference). A pod that cannot be reached keeps the User
(kopf retries) unless the StatefulSet itself is gone.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import ssl
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import kopf
import kubernetes

from .conditions import READY, Condition, find, merge, rfc3339
from .crd import GROUP, VERSION
from .manifests import SpecError
from .settings import Settings
from .storage import Storage, StorageError, read_storage
from .timer_work import run_until_stopped
from .user_admin import AclsDisabled, NodeAdmin, NodeAdminError
from .user_crd import PLURAL
from .user_secret import (
    ClientsCA,
    NoClientsCA,
    SecretConflict,
    decoded,
    owned_by,
    scram_complete,
    scram_values,
    secret_body,
    tls_current,
    tls_values,
)
from .user_spec import DesiredUser, desired_user

RESOURCE = (GROUP, VERSION, PLURAL)


@dataclass
class UserContext:
    """What the User handlers share (memo.users)."""

    settings: Settings
    api: kubernetes.client.ApiClient
    locks: dict[str, asyncio.Lock] = field(default_factory=lambda: defaultdict(asyncio.Lock))
    # uid → digest of the password every pod was last sent by this process: a new one is sent everywhere.
    sent: dict[str, str] = field(default_factory=dict)

    def ssl_context(self) -> ssl.SSLContext | None:
        """TLS to the pods' admin listener, read afresh each pass (a renewed certificate applies)."""
        s = self.settings
        if s.admin_tls_ca_file is None:
            return None
        try:
            context = ssl.create_default_context(cafile=s.admin_tls_ca_file)
            if s.admin_tls_cert_file:
                context.load_cert_chain(s.admin_tls_cert_file, s.admin_tls_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise _NotApplied("AdminTLSUnreadable", f"the operator's TLS files ({s.admin_tls_ca_file}, "
                                                    f"{s.admin_tls_cert_file}): {exc}") from None
        return context


class _NotApplied(Exception):
    """The User cannot be applied now; `reason` is the Ready condition's."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


async def reconcile_user(ctx: UserContext, body: kopf.Body, patch: kopf.Patch, logger: Any) -> None:
    meta, status = body["metadata"], dict(body.get("status") or {})
    generation, now = meta.get("generation"), rfc3339(time.time())
    async with ctx.locks[meta["uid"]]:
        if meta.get("deletionTimestamp"):
            return
        try:
            user = desired_user(body)
            secret = await asyncio.to_thread(_ensure_secret, ctx, body, user)
            message = await _apply_on_pods(ctx, body, user, secret)
            cond = Condition(READY, True, "Reconciled", message)
        except (SpecError, _NotApplied, SecretConflict, NoClientsCA, StorageError) as exc:
            cond = Condition(READY, False, getattr(exc, "reason", "StorageNotReady"), str(exc))
        current = find(status.get("conditions"), READY)
        changed = current is None or (current.get("status"), current.get("reason"), current.get("message")) != (
            cond.status_text, cond.reason, cond.message)
        if changed:
            level = logging.INFO if cond.status else logging.WARNING
            logger.log(level, "User %s/%s: Ready=%s (%s): %s", meta["namespace"], meta["name"], cond.status_text,
                       cond.reason, cond.message)
            if not cond.status:
                kopf.warn(body, reason=cond.reason, message=cond.message)
        new = {"observedGeneration": generation, "secret": meta["name"],
               "username": desired_principal(body),
               "conditions": merge(status.get("conditions"), [cond], generation=generation, now=now)}
        for key, value in new.items():
            if status.get(key) != value:
                patch.status[key] = value


def desired_principal(body: kopf.Body) -> str | None:
    kind = ((body.get("spec") or {}).get("authentication") or {}).get("type")
    name = body["metadata"]["name"]
    return {"scram-sha-512": f"User:{name}", "tls": f"User:CN={name}"}.get(kind)


def _ensure_secret(ctx: UserContext, body: kopf.Body, user: DesiredUser) -> dict[str, str]:
    """The Secret's values, creating or completing it first (blocking)."""
    core = kubernetes.client.CoreV1Api(ctx.api)
    try:
        existing = ctx.api.sanitize_for_serialization(core.read_namespaced_secret(user.name, user.namespace))
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise _NotApplied("SecretNotReadable", f"Secret {user.ref}: {exc.status} {exc.reason}") from None
        existing = None
    if existing is not None and not owned_by(existing, body):
        raise SecretConflict(f"Secret {user.ref} exists and is not this User's: it is left alone; delete it or "
                             "rename the User")
    values = decoded(existing) if existing is not None else {}
    if user.authentication == "scram-sha-512":
        if scram_complete(values, user.name):
            return values
        values = scram_values(user.name, values.get("password") or None)
    else:
        ca = _clients_ca(ctx)
        if tls_current(values, user.name, ca):
            return values
        values = tls_values(user.name, ca)
    new = secret_body(body, values)
    try:
        if existing is None:
            core.create_namespaced_secret(user.namespace, new)
        else:  # completed in place, on the version read: a concurrent writer gets 409 and the next pass retries
            core.patch_namespaced_secret(user.name, user.namespace, {
                "metadata": {"resourceVersion": existing["metadata"]["resourceVersion"]}, "data": new["data"]})
    except kubernetes.client.ApiException as exc:
        raise _NotApplied("SecretNotWritten", f"Secret {user.ref}: {exc.status} {exc.reason}") from None
    return values


def _clients_ca(ctx: UserContext) -> ClientsCA:
    name, ns = ctx.settings.clients_ca_secret, ctx.settings.storage_namespace
    if not name:
        raise NoClientsCA("a tls User needs the clients CA: set clients_ca_secret (SHALE_CLIENTS_CA_SECRET; the "
                          "chart's security.clientsCA)")
    try:
        secret = kubernetes.client.CoreV1Api(ctx.api).read_namespaced_secret(name, ns)
    except kubernetes.client.ApiException as exc:
        raise NoClientsCA(f"clients CA Secret {ns}/{name}: {exc.status} {exc.reason}") from None
    data = secret.data or {}
    if not data.get("tls.crt") or not data.get("tls.key"):
        raise NoClientsCA(f"clients CA Secret {ns}/{name} needs the keys tls.crt and tls.key")
    return ClientsCA(base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"]))


async def _addresses(ctx: UserContext) -> tuple[Storage, list[str]]:
    storage = await asyncio.to_thread(read_storage, ctx.api, ctx.settings)
    template = ctx.settings.admin_address_template or ctx.settings.node_address_template
    ordinals = sorted(set(range(storage.replicas)) | set(storage.pods))
    return storage, [storage.render(template, ordinal) for ordinal in ordinals]


async def _apply_on_pods(ctx: UserContext, body: kopf.Body, user: DesiredUser, secret: dict[str, str]) -> str:
    _, addresses = await _addresses(ctx)
    context = ctx.ssl_context()
    uid = body["metadata"]["uid"]
    digest = hashlib.sha256(secret.get("password", "").encode()).hexdigest()
    new_password = user.authentication == "scram-sha-512" and ctx.sent.get(uid) != digest
    timeout = ctx.settings.http_timeout_seconds
    created = deleted = 0
    try:
        for address in addresses:
            async with await NodeAdmin.connect(address, context, timeout) as admin:
                if user.authentication == "scram-sha-512" and (new_password or not await admin.has_credential(user.name)):
                    await admin.upsert_credential(user.name, secret["password"])
                try:
                    current = await admin.acls_of(user.principal)
                except AclsDisabled:
                    if user.acls:
                        raise
                    continue
                await admin.create_acls(user.acls - current)
                await admin.delete_acls(current - user.acls, user.principal)
                created, deleted = created + len(user.acls - current), deleted + len(current - user.acls)
    except AclsDisabled as exc:
        raise _NotApplied("AuthorizerDisabled", str(exc)) from None
    except NodeAdminError as exc:
        raise _NotApplied("NodeRefused", str(exc)) from None
    if new_password:
        ctx.sent[uid] = digest
    what = "credential and " if user.authentication == "scram-sha-512" else ""
    return (f"{user.principal}: {what}{len(user.acls)} ACL(s) on {len(addresses)} storage pod(s)"
            + (f" ({created} created, {deleted} deleted now)" if created or deleted else ""))


async def remove_user(ctx: UserContext, body: kopf.Body, logger: Any) -> None:
    """Remove the credential and the principal's ACLs from every pod; the Secret goes with the User."""
    meta = body["metadata"]
    principal = desired_principal(body)
    async with ctx.locks[meta["uid"]]:
        try:
            _, addresses = await _addresses(ctx)
        except StorageError as exc:
            logger.info("User %s/%s deleted while the storage is gone (%s): nothing to remove", meta["namespace"],
                        meta["name"], exc)
            return
        try:
            context = ctx.ssl_context()
            for address in addresses:
                async with await NodeAdmin.connect(address, context, ctx.settings.http_timeout_seconds) as admin:
                    if principal == f"User:{meta['name']}":
                        await admin.delete_credential(meta["name"])
                    if principal is not None:
                        await admin.delete_acls(None, principal)
        except (NodeAdminError, _NotApplied) as exc:
            raise kopf.TemporaryError(f"User {meta['namespace']}/{meta['name']}: {exc}",
                                      delay=ctx.settings.status_interval_seconds) from None
    ctx.locks.pop(meta["uid"], None)
    ctx.sent.pop(meta["uid"], None)
    logger.info("User %s/%s: credential and ACLs of %s removed from %d storage pod(s)", meta["namespace"],
                meta["name"], principal, len(addresses))


def register(registry: kopf.OperatorRegistry, settings: Settings) -> None:
    """The User handlers, beside the Topic's (handlers.build_registry)."""

    @kopf.on.startup(id="users-start", registry=registry)
    def start(memo: kopf.Memo, **_: Any) -> None:
        memo.users = UserContext(settings, memo.ctx.api)

    @kopf.on.create(*RESOURCE, id="user-create", registry=registry)
    @kopf.on.update(*RESOURCE, id="user-update", registry=registry)
    @kopf.on.resume(*RESOURCE, id="user-resume", registry=registry)
    async def apply(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: Any, **_: Any) -> None:
        memo.users.sent.pop(body["metadata"]["uid"], None)  # a change or a restart: send the credential afresh
        await reconcile_user(memo.users, body, patch, logger)

    @kopf.timer(*RESOURCE, id="user-refresh", interval=settings.status_interval_seconds,
                initial_delay=settings.status_interval_seconds, registry=registry)
    async def refresh(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: Any,
                      stopped: kopf.DaemonStopped, **_: Any) -> None:
        await run_until_stopped(reconcile_user(memo.users, body, patch, logger), stopped)

    @kopf.on.delete(*RESOURCE, id="user-remove", registry=registry)
    async def delete(body: kopf.Body, memo: kopf.Memo, logger: Any, **_: Any) -> None:
        await remove_user(memo.users, body, logger)
