"""docs/architecture.md is the map of the code, and the code keeps to it.

The page's layer block lists the layers top to bottom; a module may import only from its own layer or one below.
Every module has its line on the page, and the page names no module that is gone. Imports inside a component
(`sidecar/`, `operator/`, `pipeline/`) are relative, across components absolute, so the layers can be read
from the code itself."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
COMPONENTS = {"sidecar": "shale.sidecar", "operator": "shale.operator", "pipeline": "shale.pipeline"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing file, relative to the root
    line: int
    target: str  # the dotted module (or package) imported from
    relative: bool


def _modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for folder in COMPONENTS for p in (ROOT / folder).rglob("*.py")
                  if "pyspark_shale" not in p.parts)


def _dotted(path: str) -> str:
    parts = Path(path).with_suffix("").parts
    return ".".join([COMPONENTS[parts[0]], *parts[1:]])


def _imports(path: str) -> list[Import]:
    package = _dotted(path).split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                found.append(Import(path, node.lineno, ".".join(base + ([node.module] if node.module else [])), True))
            elif node.module and node.module.split(".")[0] == "shale":
                found.append(Import(path, node.lineno, node.module, False))
        elif isinstance(node, ast.Import):
            found += [Import(path, node.lineno, a.name, False) for a in node.names if a.name.split(".")[0] == "shale"]
    return found


def _file_of(dotted: str) -> str | None:
    """The module file (or package folder, with a trailing slash) a dotted name stands for."""
    for folder, package in COMPONENTS.items():
        if dotted == package or dotted.startswith(package + "."):
            rest = dotted[len(package):].lstrip(".").replace(".", "/")
            base = f"{folder}/{rest}".rstrip("/")
            return f"{base}.py" if (ROOT / f"{base}.py").exists() else f"{base}/"
    return None


def layers() -> list[list[str]]:
    """The page's layer block, top layer first: each line is a layer of path prefixes (folders end in `/`)."""
    block = re.search(r"```layers\n(.*?)```", PAGE.read_text(), re.S)
    assert block, "docs/architecture.md has no ```layers block"
    return [line.split("#")[0].split() for line in block.group(1).splitlines() if line.split("#")[0].strip()]


def layer_of(path: str) -> int:
    """The index of the layer the most specific prefix of `path` is in (0 is the top)."""
    best = max(((len(prefix), index) for index, layer in enumerate(layers()) for prefix in layer
                if path == prefix or (prefix.endswith("/") and path.startswith(prefix))), default=None)
    assert best is not None, f"{path} is in no layer of docs/architecture.md"
    return best[1]


def test_every_module_has_its_line_on_the_map_and_the_map_names_no_module_that_is_gone():
    named = set(re.findall(r"^- `([\w/]+\.py)`", PAGE.read_text(), re.M))
    modules = set(_modules())
    assert sorted(modules - named) == [], "modules without a line in docs/architecture.md"
    assert sorted(named - modules) == [], "docs/architecture.md names modules that do not exist"


def test_every_module_is_in_exactly_one_layer():
    prefixes = [prefix for layer in layers() for prefix in layer]
    assert len(prefixes) == len(set(prefixes)), "a prefix in two layers"
    for prefix in prefixes:
        assert (ROOT / prefix).exists(), f"the layer block names {prefix}, which does not exist"
    for module in _modules():
        layer_of(module)


@pytest.mark.parametrize("module", _modules())
def test_imports_point_down_the_layers_relative_inside_a_component_absolute_across(module: str):
    component = module.split("/")[0]
    for found in _imports(module):
        target = _file_of(found.target)
        assert target is not None, f"{module}:{found.line} imports {found.target}, which is not Shale's"
        if target.split("/")[0] == component:
            assert found.relative, f"{module}:{found.line}: `{found.target}` is in the same component: import it relatively"
        else:
            assert not found.relative, f"{module}:{found.line}: `{found.target}` is in another component: import it absolutely"
        assert layer_of(target) >= layer_of(module), (
            f"{module}:{found.line} imports {target}, a layer above it (docs/architecture.md, Layers)")
