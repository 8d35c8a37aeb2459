"""The chart's RBAC against what the operator really does: every API call it makes is granted, and no more.

The operator runs a Topic's whole life against kmock (create, grow, a scale-in held, a refused spec with its Event,
the topics ConfigMap deleted and written back, delete; the storage pods scheduled on a zoned node) and
every request it sent — kopf's and its own, told apart from the tests' by User-Agent — is checked
against the rules of the Roles and ClusterRoles the chart binds to its service account
(helm/shale/templates/rbac.yaml).
"""

from __future__ import annotations

import kmock
import kubernetes
import pytest
from user_util import GROUP, PLURAL, READ_ORDERS, VERSION, create_clients_ca, create_user, secret, user, wait_ready

from support.chart_util import by_kind, objects, one, render
from support.cluster_util import CLIENTS_CA_SECRET, CONFIGMAP, STORAGE_NS, Cluster
from support.k8s_util import TEST_USER_AGENT
from support.node_util import wait_for

# kmock's actions as RBAC verbs (a PATCH is `patch`, a PUT `update`).
_VERBS = {"LIST": "list", "WATCH": "watch", "FETCH": "get", "CREATE": "create", "DELETE": "delete"}


def chart_rules() -> tuple[list[dict], dict[str, str]]:
    """The rules of the chart's (Cluster)Roles bound to the operator's service account, and the chart's names of
    the objects the test cluster names otherwise."""
    rendered = objects(render())
    names = {CONFIGMAP: one(rendered, "ConfigMap")["metadata"]["name"],
             "shale": one(rendered, "StatefulSet")["metadata"]["name"],
             CLIENTS_CA_SECRET: env_value(one(rendered, "Deployment"), "SHALE_CLIENTS_CA_SECRET")}
    account = one(rendered, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    bound = {b["roleRef"]["name"] for b in by_kind(rendered, "RoleBinding") + by_kind(rendered, "ClusterRoleBinding")
             if any(s["name"] == account for s in b["subjects"])}
    roles = by_kind(rendered, "Role") + by_kind(rendered, "ClusterRole")
    return [rule for role in roles if role["metadata"]["name"] in bound for rule in role["rules"]], names


def env_value(deployment: dict, name: str) -> str:
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return next(e["value"] for e in container["env"] if e["name"] == name)


def allowed(rules: list[dict], group: str, resource: str, verb: str, name: str | None) -> bool:
    """RBAC's rule matching; a rule with resourceNames grants only requests that name one of them."""
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
               and (not r.get("resourceNames") or name in r["resourceNames"]) for r in rules)


@pytest.mark.parametrize("storage_nodes", [["authorizer.class.name=shale", "super.users=User:ANONYMOUS"]],
                         indirect=True)  # the pods keep the Users' ACLs
def test_every_call_the_operator_makes_is_granted_by_the_charts_roles(cluster: Cluster):
    cluster.core.create_namespaced_config_map(STORAGE_NS, {"metadata": {"name": CONFIGMAP}})  # as the chart does
    # The pods run on a node labelled with its zone, which the operator reads to spread replicas.
    cluster.apiserver.server.resources["v1/nodes"] = kmock.ResourceInfo(kind="Node", namespaced=False,
                                                                        verbs={"get", "create"})
    cluster.core.create_node({"metadata": {"name": "worker-a", "labels": {"topology.kubernetes.io/zone": "a"}}})
    for n in range(len(cluster.storage.nodes)):
        cluster.core.patch_namespaced_pod(f"shale-{n}", STORAGE_NS, {"spec": {"nodeName": "worker-a"}})
    cluster.create_topic("orders", 1, {"cleanup.policy": "compact"})
    cluster.wait_condition("orders", "Ready", "True")
    cluster.patch_topic("orders", {"spec": {"partitions": 2}})
    wait_for(lambda: cluster.condition("orders", "Ready").get("observedGeneration") == 2, what="the second generation")
    # A scale-in below pod 1, which holds a partition: put back and held (docs/moves.md), then cancelled.
    apps = kubernetes.client.AppsV1Api(cluster.api)
    apps.patch_namespaced_stateful_set("shale", STORAGE_NS, {"spec": {"replicas": 1}})
    wait_for(lambda: (sts := apps.read_namespaced_stateful_set("shale", STORAGE_NS)).spec.replicas == 2
             and (sts.metadata.annotations or {}).get("shale.dev/scale-in-to") == "1", what="the scale-in held")
    cluster.wait_condition("orders", "ScaleInBlocked", "True", "ScaleInRefused")
    apps.patch_namespaced_stateful_set("shale", STORAGE_NS, {"metadata": {"annotations": {"shale.dev/scale-in-to": None}}})
    wait_for(lambda: cluster.condition("orders", "ScaleInBlocked") == {}, what="the scale-in cancelled")
    cluster.create_topic("bad", 1, {"segment.bytes": "1"})
    wait_for(lambda: cluster.events("bad"), what="the InvalidConfig Event")
    manifests = cluster.configmap_data()
    cluster.core.delete_namespaced_config_map(CONFIGMAP, STORAGE_NS)  # someone deletes it: written back
    wait_for(lambda: cluster.configmap_data() == manifests, 20, what="the ConfigMap recreated from the Topics")
    cluster.delete_topic("orders")
    wait_for(lambda: cluster.topic("orders") is None, what="the finalizer removed")
    # Users: a scram User whose Secret someone truncates (completed in place), a tls User, a deletion.
    create_clients_ca(cluster)
    create_user(cluster, "alice", acls=[READ_ORDERS])
    wait_ready(cluster, "alice", reason="Reconciled")
    password = secret(cluster, "alice")[1]["password"]
    cluster.core.patch_namespaced_secret("alice", cluster.namespace, {"data": {"sasl.jaas.config": None}})
    wait_for(lambda: "sasl.jaas.config" in secret(cluster, "alice")[1], 20, what="the Secret completed")
    assert secret(cluster, "alice")[1]["password"] == password
    create_user(cluster, "erin", "tls")
    wait_ready(cluster, "erin", reason="Reconciled")
    cluster.objects.delete_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "alice")
    wait_for(lambda: user(cluster, "alice") is None, 20, what="the User's finalizer removed")

    rules, names = chart_rules()
    calls = set()
    for request in cluster.apiserver.requests():
        if request.headers.get("User-Agent") == TEST_USER_AGENT or request.resource is None \
                or request.resource.plural is None:
            continue  # the tests' own calls; discovery (/api, /apis/<group>: granted to every user)
        verb = {"PATCH": "patch", "PUT": "update"}[request.method.value] if request.action.value == "UPDATE" \
            else _VERBS[request.action.value]
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        calls.add((request.resource.group, resource, verb, names.get(request.name, request.name)))
    denied = sorted(c for c in calls if not allowed(rules, *c))
    assert denied == [], f"calls the chart's RBAC would refuse: {denied}"
    # ...and nothing is granted that it does not use: least privilege, from both sides.
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    used = {(g, r, v) for g, r, v, _ in calls}
    assert granted == used == {
        ("shale.dev", "topics", "list"), ("shale.dev", "topics", "watch"),  # kopf's watch
        ("shale.dev", "topics", "patch"),  # finalizer, kopf's annotations
        ("shale.dev", "topics/status", "patch"),  # the status
        ("", "events", "create"),  # the InvalidConfig Warning
        ("", "configmaps", "get"), ("", "configmaps", "patch"),  # the manifests
        ("", "configmaps", "create"),  # the ConfigMap recreated after it was deleted
        ("apps", "statefulsets", "get"), ("", "pods", "list"),  # the storage pods
        ("apps", "statefulsets", "patch"),  # a scale-in held until the pods going are drained
        ("", "nodes", "get"),  # the zone of each pod's node (rbac.nodeZones' ClusterRole)
        ("shale.dev", "users", "list"), ("shale.dev", "users", "watch"), ("shale.dev", "users", "patch"),
        ("shale.dev", "users/status", "patch"),
        ("", "secrets", "get"), ("", "secrets", "create"), ("", "secrets", "patch"),  # Users' Secrets, the clients CA
    }
