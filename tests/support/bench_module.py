"""Loading a benchmark script from bench/ as a module, for its smoke test."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType
from typing import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(filename: str) -> Iterator[ModuleType]:
    """Yield bench/<filename> imported under a private name (a generator, for a pytest fixture)."""
    name = "bench_" + filename.removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", filename))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
