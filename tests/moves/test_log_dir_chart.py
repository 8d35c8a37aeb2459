"""The chart's JBOD value: `storage.persistence.extraLogDirs` adds one volume claim, mount and `--data-dir` per
extra log dir (docs/moves.md), rendered by Helm's own engine."""

from __future__ import annotations

from support.chart_util import objects, one, render


def storage(values: dict) -> dict:
    return one(objects(render(values)), "StatefulSet")


def test_extra_log_dirs_are_volumes_mounts_and_data_dirs():
    plain = storage({})
    assert [c["metadata"]["name"] for c in plain["spec"]["volumeClaimTemplates"]] == ["data"]
    assert plain["spec"]["template"]["spec"]["containers"][0]["args"][0].count("--data-dir") == 1

    jbod = storage({"storage": {"persistence": {"extraLogDirs": 2, "size": "5Gi"}}})
    claims = jbod["spec"]["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["data", "data-1", "data-2"]
    assert {c["spec"]["resources"]["requests"]["storage"] for c in claims} == {"5Gi"}
    container = jbod["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert (mounts["data"], mounts["data-1"], mounts["data-2"]) == ("/var/lib/shale", "/var/lib/shale-1",
                                                                     "/var/lib/shale-2")
    args = container["args"][0].split()
    dirs = [args[i + 1] for i, a in enumerate(args) if a == "--data-dir"]
    assert dirs == ["/var/lib/shale/data", "/var/lib/shale-1/data", "/var/lib/shale-2/data"]
