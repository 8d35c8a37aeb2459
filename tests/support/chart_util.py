"""Helpers of the CRD, chart and alert tests: what a kube-apiserver would check, done offline.

These checks run without an API server (tests/apiserver/ repeats the essentials on a real 1.20 one,
which predates CEL and the newest fields), with the tools that implement the same rules: jsonschema
for OpenAPI validation, cel-python for CEL, RE2 for patterns, and the structural-schema and pruning
rules of apiextensions-apiserver written out below.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import celpy
import helm_python as helm
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "shale"
CRD_FILES = (ROOT / "crds" / "topics.shale.dev.yaml", CHART / "crds" / "topics.shale.dev.yaml")
RELEASE, NAMESPACE = "demo", "kafka"
FULL_VALUES = {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}}

# Keywords a structural schema may not set inside allOf/anyOf/oneOf/not (apiextensions' structural rules).
_JUNCTOR_FORBIDDEN = {"type", "description", "default", "additionalProperties", "nullable",
                      "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string"}
_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def topic_schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def as_json_schema(schema: Any) -> Any:
    """OpenAPI's schema object as plain JSON Schema: `nullable: true` becomes a "null" type."""
    if isinstance(schema, list):
        return [as_json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {key: as_json_schema(value) for key, value in schema.items() if key != "nullable"}
    if schema.get("nullable") and "type" in schema:
        converted["type"] = [schema["type"], "null"]
    return converted


def subschemas(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node that describes a value (root, properties, items, additionalProperties)."""
    yield path or "<root>", schema
    for name, prop in schema.get("properties", {}).items():
        yield from subschemas(prop, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from subschemas(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from subschemas(schema["additionalProperties"], f"{path}.*")


def structural_violations(schema: dict[str, Any]) -> list[str]:
    """Why the API server would refuse this openAPIV3Schema as non-structural (empty if it would not)."""
    problems = []
    for path, node in subschemas(schema):
        free = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        if not node.get("type") and not free:
            problems.append(f"{path}: must have a type")
        if node.get("x-kubernetes-int-or-string") and "type" in node:
            problems.append(f"{path}: x-kubernetes-int-or-string with a type")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{path}: properties and additionalProperties are mutually exclusive")
        for junctor in ("allOf", "anyOf", "oneOf"):
            branches = node.get(junctor, [])
            if node.get("x-kubernetes-int-or-string") and junctor == "anyOf" and branches == _INT_OR_STRING:
                continue
            for branch in branches:
                problems += [f"{path}.{junctor}: sets {k}" for k in _JUNCTOR_FORBIDDEN & set(branch)]
        if "not" in node:
            problems += [f"{path}.not: sets {k}" for k in _JUNCTOR_FORBIDDEN & set(node["not"])]
        if path == ".metadata" and set(node) - {"type"}:
            problems.append(f"{path}: only name and generateName of metadata may be constrained")
        for key in node.get("x-kubernetes-list-map-keys", []):
            item = node["items"]
            if key not in item.get("required", []) or item["properties"][key].get("type") not in ("string", "integer"):
                problems.append(f"{path}: list map key {key} must be a required scalar")
    return problems


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the API server prunes, and refuses under strict field validation (kubectl's default).

    Written as the apiserver words them: `unknown field "spec.config.x"`. metadata is the apiserver's own.
    """
    if not isinstance(obj, dict) or schema.get("x-kubernetes-preserve-unknown-fields") or path == "metadata":
        return []
    found = []
    properties = schema.get("properties")
    for key, value in obj.items():
        child = f"{path}.{key}" if path else key
        if properties is not None and key in properties:
            found += unknown_fields(value, properties[key], child)
        elif isinstance(schema.get("additionalProperties"), dict):
            found += unknown_fields(value, schema["additionalProperties"], child)
        elif properties is not None:
            found.append(f'unknown field "{child}"')
    return found


def cel(expression: str, **variables: Any) -> Any:
    """Evaluate a CEL expression as a CRD validation rule would, with self/oldSelf bound to JSON values."""
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    result = program.evaluate({name: celpy.json_to_cel(value) for name, value in variables.items()})
    if isinstance(result, celpy.celtypes.BoolType):
        return bool(result)
    return str(result) if isinstance(result, celpy.celtypes.StringType) else result


def render(values: dict[str, Any] | None = None, namespace: str = NAMESPACE, release: str = RELEASE) -> dict[str, str]:
    """The chart rendered by Helm's own engine (helm-python-sdk), template path -> text."""
    with helm.Chart.load(str(CHART)) as chart:
        return chart.render(values or {}, name=release, namespace=namespace)


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """The Kubernetes objects of a render, NOTES.txt left out."""
    found = []
    for path, text in rendered.items():
        if path.endswith(".yaml"):
            found += [doc for doc in yaml.safe_load_all(text) if doc]
    return found


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in by_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in matches]}"
    return matches[0]


def promtool() -> str:
    """promtool, of Debian's prometheus package (`make test` installs it); missing is a failure, not a skip."""
    found = shutil.which("promtool")
    if not found:
        pytest.fail("promtool not found: run `make test`, which installs Debian's prometheus package")
    return found


def rules_of(values: dict) -> dict:
    return one(objects(render(values)), "PrometheusRule")["spec"]


def write_rules(directory: Path, values: dict) -> Path:
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(rules_of(values), sort_keys=False))
    return path


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
