"""`python -m shale.operator.topic_check NAME`: wait until a Topic is Ready for its current spec, print its status.

The one-shot reader for scripts and people outside the cluster; the e2e journey (e2e/journey.sh) waits
with it. Ready counts only when the condition was computed for the Topic's current `metadata.generation`
(a Ready=True left over from before a `kubectl apply` proves nothing), and `--min-end-offsets N` also
waits until the partitions' end offsets add up to N (records produced are in the status).

It talks to the API with pykube-ng, the light client, where the operator uses the `kubernetes`
package (operator/kube.py says why), because what rules pykube-ng out there does not apply here:
- it runs for seconds and exits, so pykube-ng reading the service-account token only once cannot
  make it fail with 401s after the token rotates, as it would a long-running operator;
- it only reads one custom resource, which pykube-ng does through a three-line class, as a plain
  dict, without the `kubernetes` package's generated API classes: importing pykube takes 0.2 s and
  31 MB where `kubernetes` takes 0.5 s and 48 MB (measured on the project's 2-core machine), which
  counts for a command that scripts run again and again;
- it needs nothing of the operator's: no 409 handling for optimistic concurrency, no configuration
  to share with kopf.
It reads the kubeconfig as kubectl does (`--kubeconfig`, else the first file of `$KUBECONFIG`, else
~/.kube/config; the pod's service account when none exists), exec plugins and client certificates
included.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pykube

from .crd import GROUP, KIND, PLURAL, VERSION


class Topic(pykube.objects.NamespacedAPIObject):
    """topics.shale.dev as pykube-ng reads it (no discovery call: the CRD's names are ours)."""

    version = f"{GROUP}/{VERSION}"
    endpoint = PLURAL
    kind = KIND


# Ready=False reasons that only a change of the spec can clear (docs/operator.md): no use waiting for them.
NEEDS_SPEC_CHANGE = ("InvalidConfig", "InvalidSpec", "NotSupported")


class TopicNotReady(RuntimeError):
    """The Topic did not become Ready in time; the message names it and says what it reported last."""


@dataclass(frozen=True)
class TopicView:
    """A Topic as read: its generation and the status the operator wrote."""

    namespace: str
    name: str
    generation: int | None
    status: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> "TopicView":
        meta = obj.get("metadata") or {}
        return cls(meta.get("namespace") or "", meta.get("name") or "", meta.get("generation"),
                   obj.get("status") or {})

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def condition(self, kind: str) -> Mapping[str, Any]:
        return next((c for c in self.status.get("conditions") or () if c.get("type") == kind), {})

    @property
    def partitions(self) -> list[Mapping[str, Any]]:
        return list(self.status.get("partitions") or ())

    @property
    def end_offsets(self) -> int:
        """Sum of the partitions' log end offsets: records ever written (compaction does not lower it). A
        replicated partition has one entry per replica: only its leader's counts (a follower's trails it)."""
        return sum(int(p.get("logEndOffset") or 0) for p in self.partitions if p.get("role", "leader") == "leader")

    def not_ready_because(self, min_end_offsets: int = 0) -> str | None:
        """Why the Topic does not count as Ready yet, or None if it does."""
        ready = self.condition("Ready")
        if not ready:
            return "the operator has not reported a Ready condition yet"
        if ready.get("status") != "True":
            return f"Ready={ready.get('status')} ({ready.get('reason')}): {ready.get('message')}"
        seen = ready.get("observedGeneration", self.status.get("observedGeneration"))
        if seen != self.generation:
            return f"Ready=True is for generation {seen}, the spec is at generation {self.generation}"
        if self.end_offsets < min_end_offsets:
            return f"the partitions' end offsets add up to {self.end_offsets}, waiting for {min_end_offsets}"
        return None

    @property
    def refused(self) -> bool:
        """The operator refused the current spec for a reason that waiting cannot cure."""
        ready = self.condition("Ready")
        return (ready.get("status") == "False" and ready.get("reason") in NEEDS_SPEC_CHANGE
                and ready.get("observedGeneration", self.status.get("observedGeneration")) == self.generation)

    def summary(self) -> str:
        """What `kubectl describe` would say of the status, as a few lines and a table of partitions."""
        head = f"Topic {self.ref} (generation {self.generation}, observed {self.status.get('observedGeneration')})"
        if self.status.get("topicName"):
            head += f": Kafka topic {self.status['topicName']}, {self.status.get('diskUsageBytes', 0)} bytes"
        lines = [head]
        for kind in ("Ready", "CleaningStuck", "ReconciliationPaused", "Unmanaged"):
            cond = self.condition(kind)
            if cond:
                lines.append(f"  {kind}={cond.get('status')} ({cond.get('reason')}): {cond.get('message')}")
        columns = ("partition", "pod", "logStartOffset", "logEndOffset", "sizeBytes", "cleaningState", "dirtyRatio")
        rows = [columns] + [tuple(str(p.get(c, "-")) for c in columns) for p in self.partitions]
        widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        return "\n".join(lines)


def kube_config(path: str | None = None) -> pykube.KubeConfig:
    """The kubeconfig kubectl would use, else the pod's service account."""
    path = path or (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or "~/.kube/config"
    if Path(path).expanduser().is_file():
        return pykube.KubeConfig.from_file(str(Path(path).expanduser()))
    try:
        return pykube.KubeConfig.from_service_account()
    except FileNotFoundError:
        raise pykube.exceptions.PyKubeError(f"no kubeconfig at {path} and no in-cluster service account") from None


def read(api: pykube.HTTPClient, namespace: str, name: str) -> TopicView | None:
    """The Topic, or None if it does not exist."""
    found = Topic.objects(api, namespace=namespace).get_or_none(name=name)
    return None if found is None else TopicView.of(found.obj)


def wait(api: pykube.HTTPClient, namespace: str, name: str, *, timeout: float, min_end_offsets: int = 0,
         interval: float = 1.0) -> TopicView:
    """Poll until the Topic is Ready for its current generation (and has the end offsets); TopicNotReady if not.

    timeout 0 reads once. Errors that waiting may cure (the API server restarting) are retried; a spec
    the operator refused (InvalidConfig, InvalidSpec, NotSupported) fails at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            view = read(api, namespace, name)
            why = "it does not exist" if view is None else view.not_ready_because(min_end_offsets)
        except pykube.exceptions.HTTPError as exc:
            if exc.code in (401, 403):  # a login or RBAC problem does not go away by waiting
                raise
            view, why = None, f"the API server answered {exc.code}: {exc}"
        except OSError as exc:  # requests' errors are OSErrors: connection refused, timeouts
            view, why = None, f"the API server is unreachable: {exc}"
        if why is None and view is not None:
            return view
        if view is not None and view.refused:
            raise TopicNotReady(f"Topic {namespace}/{name} cannot become Ready until its spec changes: {why}")
        if time.monotonic() >= deadline:
            raise TopicNotReady(f"Topic {namespace}/{name} not Ready after {timeout:g} s: {why}")
        time.sleep(interval)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shale.operator.topic_check",
        description="Wait until a Topic is Ready for its current spec, then print its status; exit 1 if it is not.")
    parser.add_argument("name", help="the Topic's metadata.name")
    parser.add_argument("-n", "--namespace", help="default: the kubeconfig context's namespace")
    parser.add_argument("--kubeconfig", help="default: the first file of $KUBECONFIG, else ~/.kube/config")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait (default 120)")
    parser.add_argument("--min-end-offsets", type=int, default=0,
                        help="also wait until the partitions' log end offsets add up to this")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between reads (default 1)")
    args = parser.parse_args(argv)
    config = kube_config(args.kubeconfig)
    api = pykube.HTTPClient(config)
    namespace = args.namespace or config.namespace
    try:
        view = wait(api, namespace, args.name, timeout=args.timeout, min_end_offsets=args.min_end_offsets,
                    interval=args.interval)
    except TopicNotReady as exc:
        print(exc, file=sys.stderr)
        try:
            last = read(api, namespace, args.name)
        except (pykube.exceptions.PyKubeError, OSError):
            last = None
        if last is not None:
            print(last.summary(), file=sys.stderr)
        return 1
    print(view.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
