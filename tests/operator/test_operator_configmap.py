"""The topics ConfigMap's read-modify-write against an API server: create, conflicts, foreign keys, removal."""

from __future__ import annotations

import kubernetes
import pytest

from shale.operator.configmap import ConflictError, TopicsConfigMap
from support.k8s_util import ApiServerThread


@pytest.fixture
def server():
    server = ApiServerThread().start()
    yield server
    server.stop()


def test_the_first_write_creates_the_configmap_and_a_removal_from_none_is_a_no_op(server):
    cm = TopicsConfigMap(server.client(), "data", "topics")
    assert cm.update(lambda current: {"a.yaml": None}).resource_version is None  # nothing to remove
    written = cm.update(lambda current: {"a.yaml": "A"})
    assert written.data == {"a.yaml": "A"} and written.resource_version is not None
    stored = kubernetes.client.CoreV1Api(server.client()).read_namespaced_config_map("topics", "data")
    assert stored.metadata.labels == {"app.kubernetes.io/managed-by": "shale-operator"}


def test_a_concurrent_write_is_detected_and_the_change_recomputed_from_fresh_data(server):
    other = kubernetes.client.CoreV1Api(server.client())
    other.create_namespaced_config_map("data", {"metadata": {"name": "topics"}, "data": {"x.yaml": "X"}})
    cm = TopicsConfigMap(server.client(), "data", "topics")
    seen = []

    def compute(current):
        seen.append(dict(current.data))
        if len(seen) == 1:  # someone else writes between our read and our patch
            other.patch_namespaced_config_map("topics", "data", {"data": {"y.yaml": "Y"}},
                                              _content_type="application/merge-patch+json")
        return {"a.yaml": "A", "x.yaml": None}

    written = cm.update(compute)
    assert seen == [{"x.yaml": "X"}, {"x.yaml": "X", "y.yaml": "Y"}]  # recomputed after the 409
    assert written.data == {"y.yaml": "Y", "a.yaml": "A"}  # the other writer's key survived
    assert cm.read().data == written.data


def test_a_configmap_that_keeps_changing_gives_up_with_an_error(server):
    other = kubernetes.client.CoreV1Api(server.client())
    other.create_namespaced_config_map("data", {"metadata": {"name": "topics"}, "data": {}})
    cm = TopicsConfigMap(server.client(), "data", "topics", attempts=3)
    calls = []

    def compute(current):
        calls.append(1)
        other.patch_namespaced_config_map("topics", "data", {"data": {f"n{len(calls)}": "x"}},
                                          _content_type="application/merge-patch+json")
        return {"a.yaml": "A"}

    with pytest.raises(ConflictError, match="ConfigMap data/topics: still changing after 3 attempts"):
        cm.update(compute)
    assert len(calls) == 3 and "a.yaml" not in cm.read().data
