"""The registry-free image (image.py) installs the same tree as the Dockerfile's recipe.

No Docker engine runs here, so the Dockerfile's own commands are run instead: its `pip wheel` and its
`pip install` lines, as they are written in it, in a fresh virtual environment on this machine. What they
install — every distribution and version, every file of each, and the bytes of every Python source — must be
what the image's /opt/shale holds, read from the image's archive; and the image must carry the Dockerfile's
user. The base differs by design (Debian's python3.11 instead of python.org's; image.py's docstring).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Iterator

from support import image

SITE = f"{image.VENV.strip('/')}/lib/python3.11/site-packages/"


def dockerfile_commands(text: str, program: str) -> list[list[str]]:
    """The argv of every `program` command in the Dockerfile's RUN lines (chains split at `&&`)."""
    found = []
    for line in image.logical_lines(text):
        if line.split(maxsplit=1)[0].upper() != "RUN":
            continue
        for command in line.split(maxsplit=1)[1].split("&&"):
            argv = shlex.split(command.split(">")[0])
            if argv and argv[0] == program:
                found.append(argv)
    return found


def _tree_of(records: dict[str, str]) -> dict[str, str]:
    """RECORD lines (path → hash) as compared: Python sources by hash, the rest by name (a compiled module
    built twice may differ in its embedded paths), scripts and byte code left out (their shebangs and
    timestamps name the environment)."""
    return {path: (digest if path.endswith(".py") else "") for path, digest in records.items()
            if not path.startswith("../") and "__pycache__" not in path}


def _records(lines: Iterator[tuple[str, str]]) -> dict[str, dict[str, str]]:
    """{dist-info directory: tree} from (dist-info directory, RECORD text) pairs."""
    return {dist: _tree_of({row.split(",")[0]: row.split(",")[1] for row in text.splitlines() if row})
            for dist, text in lines}


def image_records(archive: Path) -> tuple[dict[str, dict[str, str]], str]:
    """Every RECORD under /opt/shale's site-packages in the image's layers, and its /etc/passwd."""
    found, passwd = {}, ""
    with tarfile.open(archive) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))
        for layer in manifest[0]["Layers"]:
            with tarfile.open(fileobj=outer.extractfile(layer), mode="r|*") as inner:
                for member in inner:
                    name = member.name.lstrip("./")
                    if name == "etc/passwd":
                        passwd = inner.extractfile(member).read().decode()
                    elif name.startswith(SITE) and name.endswith(".dist-info/RECORD"):
                        found[name[len(SITE):].split("/")[0]] = inner.extractfile(member).read().decode()
    return _records(iter(found.items())), passwd


def dockerfile_records(python: Path, work: Path) -> dict[str, dict[str, str]]:
    """The Dockerfile's pip lines run in a fresh virtual environment: the RECORDs of what they installed."""
    text = image.DOCKERFILE.read_text()
    wheel, install = dockerfile_commands(text, "pip")
    assert wheel[:2] == ["pip", "wheel"] and install[:2] == ["pip", "install"], (wheel, install)
    subprocess.run([str(python), "-m", "venv", str(work / "venv")], check=True)
    pip = str(work / "venv" / "bin" / "pip")
    source = work / "source"
    shutil.copytree(image.ROOT, source, ignore=image.NOT_SOURCE)
    paths = {"/wheels": str(work / "wheels"), ".": str(source)}
    for argv in (wheel, install):
        subprocess.run([pip, *[paths.get(a, a) for a in argv[1:]]], check=True, cwd=source,
                       stdout=subprocess.DEVNULL)
    site = next((work / "venv" / "lib").glob("python3*/site-packages"))
    return _records((d.name, (d / "RECORD").read_text()) for d in site.glob("*.dist-info")
                    if d.name.split("-")[0].lower() not in ("pip", "setuptools"))


def test_the_image_installs_the_tree_the_dockerfiles_commands_install():
    images = image.images()
    if not images.built():
        image.build(Path(sys.executable), images)
    installed, passwd = image_records(images.shale_archive)
    with tempfile.TemporaryDirectory() as tmp:
        expected = dockerfile_records(Path(sys.executable), Path(tmp))
    installed = {d: tree for d, tree in installed.items() if d.split("-")[0].lower() not in ("pip", "setuptools")}
    assert sorted(installed) == sorted(expected)  # the same distributions at the same versions
    for dist, tree in expected.items():
        assert installed[dist] == tree, f"{dist}: {set(installed[dist].items()) ^ set(tree.items())}"
    assert any(line.startswith("shale:x:10001:10001:") for line in passwd.splitlines()), passwd


def test_dockerfile_commands_are_read_as_written():
    text = "FROM x AS b\nRUN apt-get update \\\n    && pip wheel --wheel-dir /wheels .\nRUN pip install a && rm -rf /w " \
           "&& shale --help >/dev/null\n"
    assert dockerfile_commands(text, "pip") == [["pip", "wheel", "--wheel-dir", "/wheels", "."], ["pip", "install", "a"]]
    assert dockerfile_commands(text, "shale") == [["shale", "--help"]]
