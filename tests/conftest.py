"""Fixtures shared by tests in several folders."""

from __future__ import annotations

import pytest

from wheel_venv import WheelVenv, build


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory) -> WheelVenv:
    """Shale installed from its wheel into a fresh venv (tests/wheel_venv.py says why and how)."""
    return build(tmp_path_factory.mktemp("wheel-venv"))
