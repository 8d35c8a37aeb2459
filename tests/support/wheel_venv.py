"""A fresh virtual environment with Shale installed from its wheel, as a user's `pip install shale` leaves it.

The repository's `.venv` has an editable install, whose import finder hides what a wheel install shows:
which folders of the repository root Python picks up instead of the installed packages, and which
top-level packages (`pyspark_shale`) land in site-packages. The wheel is built from a copy of the
tree, so the build leaves nothing (`build/`, `*.egg-info`) in the work tree while other tests run;
its dependencies come from `.venv`'s site-packages (a `.pth` path, not a site dir: `.venv`'s own
editable finder is not loaded), so nothing is downloaded but the build backend, which pip caches.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "demo-data", "bench", "tests", "e2e", "*.egg-info",
                                     ".pytest_cache", ".hypothesis", "__pycache__", "*.so")


@dataclass(frozen=True)
class WheelVenv:
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        return Path(subprocess.check_output([self.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                            text=True).strip())

    def run(self, *args: str | Path, cwd: Path = ROOT, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
        """Run a program of this venv (`python`, `shale`, …) from `cwd`, the repository root by default."""
        exe = self.path / "bin" / str(args[0])
        return subprocess.run([exe, *map(str, args[1:])], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              **kw)


def build(tmp: Path) -> WheelVenv:
    source, wheels, venv = tmp / "source", tmp / "wheels", tmp / "venv"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--quiet", "--no-deps", "-w", wheels, source], check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    env = WheelVenv(venv)
    (env.site_packages / "shale-test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    wheel = next(wheels.glob("shale-*.whl"))
    subprocess.run([*pip, "--python", env.python, "install", "--quiet", "--no-deps", wheel], check=True,
                   capture_output=True)
    return env
