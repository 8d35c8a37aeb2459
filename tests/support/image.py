"""Shale's image without a registry or a Docker engine: what `make image` and the real-cluster tests run.

No Docker engine runs here and `python:3.11-slim` cannot be pulled, so the image is assembled from parts
this machine has (../shared/spec/kubernetes.md §7.1): a Debian bookworm root filesystem by mmdebstrap with
Debian's python3.11, the project's wheels built on this machine by the virtual environment's pip, and an
OCI image packed by umoci and written by skopeo as a docker-archive that `ctr images import` takes.

The Dockerfile stays the recipe for machines with Docker. What the two must share is read from it, not
restated: the final stage's USER, ENV, ENTRYPOINT, CMD, EXPOSE and WORKDIR become this image's config
(`dockerfile_config`), and both install the same wheels with `pip install --no-index --find-links`. Where
they differ, and why (tests/cluster/test_image_tree.py runs the Dockerfile's own pip lines and checks that the
image installs the same tree):
- the base is Debian's python3.11 (3.11.2) with the project in a virtual environment at /opt/shale
  (its bin first on PATH), not python.org's 3.11 in /usr/local: no python image is reachable here;
- the user 10001 is created by the same `useradd` line as the Dockerfile's.

A second image, the client of the test pods, is the Shale image plus confluent-kafka (librdkafka) in the
same environment: the tests' idempotent `acks=all` loads run in pods, where the nodes' DNS names resolve.

Both images are cached outside the work tree (`~/.cache/shale/images/<key>/`), keyed by a hash of
everything that goes into them: the package's tracked sources, the Dockerfile and this file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from support.kube_apiserver import cache_dir
from support.wheel_venv import NOT_SOURCE, ROOT

DOCKERFILE = ROOT / "Dockerfile"
# What goes into the wheel (pyproject.toml's package-dir and README as the long description).
PACKAGE_SOURCES = ("pyproject.toml", "setup.py", "README.md", "sidecar", "operator", "pipeline")
REPOSITORY = "shale.local/shale"  # resolves nowhere: an accidental pull fails at once (spec §7.1)
CLIENT_REPOSITORY = "shale.local/shale-client"
VENV = "/opt/shale"
SUITE = "bookworm"
# Debian's packages of the image: python3.11 with venv (ensurepip's pip installs the wheels), passwd (useradd).
DEBIAN_PACKAGES = ("python3", "python3-venv", "passwd")
CLIENT_PACKAGES = ("confluent-kafka",)
START = time.monotonic()


def cache_root() -> Path:
    return cache_dir() / "images"


def progress(message: str) -> None:
    """To fd 9 when the Makefile's `step` opened it on the terminal, else to stderr."""
    line = f"  image [{time.monotonic() - START:.0f}s]: {message}\n"
    try:
        os.write(9, line.encode())
    except OSError:
        sys.stderr.write(line)


# --- the Dockerfile's final stage, read (pure) -----------------------------------------------------------


@dataclass
class ImageConfig:
    """What the Dockerfile's final stage declares about the running container."""

    user: str = ""
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    exposed_ports: list[str] = field(default_factory=list)
    workdir: str = ""
    useradd: str = ""  # the RUN line's `useradd …` command, run in the Debian root file system as well


def logical_lines(text: str) -> list[str]:
    """Instructions with their continuation lines joined and comments dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def _exec_form(value: str) -> list[str]:
    value = value.strip()
    return json.loads(value) if value.startswith("[") else ["/bin/sh", "-c", value]


def dockerfile_config(text: str) -> ImageConfig:
    """The final stage's runtime settings. Only the instructions the Dockerfile uses are understood; any
    other instruction in the final stage is refused, so a new one cannot be silently left out here."""
    stages: list[list[tuple[str, str]]] = []
    for line in logical_lines(text):
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            stages.append([])
        elif instruction != "ARG":
            stages[-1].append((instruction, rest.strip()))
    config = ImageConfig()
    for instruction, rest in stages[-1]:
        if instruction == "USER":
            config.user = rest
        elif instruction == "ENV":
            for word in shlex.split(rest):
                key, _, value = word.partition("=")
                config.env[key] = value
        elif instruction == "ENTRYPOINT":
            config.entrypoint = _exec_form(rest)
        elif instruction == "CMD":
            config.cmd = _exec_form(rest)
        elif instruction == "EXPOSE":
            config.exposed_ports += [p if "/" in p else f"{p}/tcp" for p in rest.split()]
        elif instruction == "WORKDIR":
            config.workdir = rest
        elif instruction == "RUN":
            for command in rest.split("&&"):
                if command.strip().startswith("useradd "):
                    config.useradd = command.strip()
        elif instruction != "COPY":
            raise ValueError(f"Dockerfile: {instruction} in the final stage is not carried into the "
                             f"registry-free image (tests/support/image.py)")
    if not config.useradd:
        raise ValueError("Dockerfile: the final stage creates no user with useradd")
    return config


# --- the cache key ---------------------------------------------------------------------------------------


def source_key() -> str:
    """A hash of the tracked files that make the images (their contents as they are in the work tree)."""
    listed = subprocess.run(["git", "ls-files", "-z", *PACKAGE_SOURCES], cwd=ROOT, check=True,
                            capture_output=True).stdout.split(b"\0")
    digest = hashlib.sha256()
    for name in sorted(n for n in listed if n) + [b"Dockerfile", b"tests/support/image.py"]:
        path = ROOT / name.decode()
        if path.is_file():  # a deleted but still tracked file has no content
            digest.update(name + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Images:
    """The two images of one key: docker-archive files and the references they carry."""

    directory: Path
    key: str

    @property
    def shale(self) -> str:
        return f"{REPOSITORY}:{self.key}"

    @property
    def client(self) -> str:
        return f"{CLIENT_REPOSITORY}:{self.key}"

    @property
    def shale_archive(self) -> Path:
        return self.directory / "shale.tar"

    @property
    def client_archive(self) -> Path:
        return self.directory / "client.tar"

    def built(self) -> bool:
        return (self.directory / "done").exists()


def images(key: str | None = None) -> Images:
    key = key or source_key()
    return Images(cache_root() / key, key)


# --- the build ---------------------------------------------------------------------------------------------


def _run(*args: str, **kwargs) -> None:
    subprocess.run(args, check=True, **kwargs)


def _chroot(root: Path, *args: str, **kwargs) -> None:
    """A command inside the root file system, with none of this machine's pip or Python settings."""
    env = {"PATH": f"{VENV}/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PIP_NO_CACHE_DIR": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "LANG": "C.UTF-8"}
    _run("chroot", str(root), *args, env=env, **kwargs)


def build_wheels(python: Path, wheels: Path, *requirements: str) -> None:
    """The project's wheel and its pinned dependencies' (or `requirements`'), by this machine's pip. The
    project's is built from a copy of its sources, so the build leaves nothing in the work tree."""
    with tempfile.TemporaryDirectory() as tmp:
        if not requirements:
            shutil.copytree(ROOT, Path(tmp) / "source", ignore=NOT_SOURCE)
        _run(str(python), "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels),
             *(requirements or [str(Path(tmp) / "source")]), stdout=subprocess.DEVNULL)


def build_rootfs(root: Path, wheels: Path, config: ImageConfig) -> None:
    """Debian minbase with python3.11, the project installed from `wheels` into /opt/shale, user 10001."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    sources = sources if sources.exists() else Path("/etc/apt/sources.list")
    excluded = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale", "info")]
    with sources.open() as stdin:  # the machine's own Debian mirror, as its apt uses it
        _run("mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}",
             "--aptopt=Acquire::Check-Valid-Until \"false\"", *excluded, SUITE, str(root), "-", stdin=stdin)
    shutil.copytree(wheels, root / "tmp/wheels")
    _chroot(root, "python3", "-m", "venv", VENV)
    _chroot(root, f"{VENV}/bin/pip", "install", "--quiet", "--no-index", "--find-links", "/tmp/wheels", "shale")
    _chroot(root, "/bin/sh", "-c", config.useradd)
    shutil.rmtree(root / "tmp/wheels")
    _chroot(root, "shale", "--help", stdout=subprocess.DEVNULL)


def _config_args(config: ImageConfig) -> list[str]:
    env = {"PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **config.env}
    args = [f"--config.user={config.user}", *(f"--config.env={k}={v}" for k, v in env.items()),
            *(f"--config.entrypoint={a}" for a in config.entrypoint), *(f"--config.cmd={a}" for a in config.cmd),
            *(f"--config.exposedports={p}" for p in config.exposed_ports)]
    return args + ([f"--config.workingdir={config.workdir}"] if config.workdir else [])


def build(python: Path, target: Images) -> Images:
    """Both images of `target.key` into `target.directory` (no-op when built), under a lock."""
    target.directory.parent.mkdir(parents=True, exist_ok=True)
    with open(target.directory.parent / ".lock", "w") as lock:
        import fcntl
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.built():
            progress(f"{target.shale} cached in {target.directory} (warm, not rebuilt)")
            return target
        config = dockerfile_config(DOCKERFILE.read_text())
        with tempfile.TemporaryDirectory(dir=target.directory.parent) as tmp:
            work = Path(tmp)
            progress("building the project's wheel and its dependencies' with pip")
            build_wheels(python, work / "wheels")
            progress(f"Debian {SUITE} root file system with {', '.join(DEBIAN_PACKAGES)} (mmdebstrap, ~1 min)")
            build_rootfs(work / "rootfs", work / "wheels", config)
            progress("packing the OCI images (umoci) and writing docker-archives (skopeo)")
            layout = work / "oci"
            _run("umoci", "init", "--layout", str(layout))
            _run("umoci", "new", "--image", f"{layout}:shale")
            _run("umoci", "insert", "--image", f"{layout}:shale", str(work / "rootfs"), "/")
            _run("umoci", "config", "--image", f"{layout}:shale", *_config_args(config))
            # The client: the same image plus confluent-kafka in the same environment, one layer more.
            build_wheels(python, work / "client-wheels", *CLIENT_PACKAGES)
            site = work / "client" / f"{VENV.strip('/')}/lib/python3.11/site-packages"
            _run(str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--find-links",
                 str(work / "client-wheels"), "--target", str(site), *CLIENT_PACKAGES)
            shutil.rmtree(site / "bin", ignore_errors=True)
            _run("umoci", "tag", "--image", f"{layout}:shale", "client")
            _run("umoci", "insert", "--image", f"{layout}:client", str(work / "client" / "opt"), "/opt")
            out = work / "out"
            out.mkdir()
            for tag, archive, reference in (("shale", "shale.tar", target.shale),
                                            ("client", "client.tar", target.client)):
                _run("skopeo", "copy", "--quiet", f"oci:{layout}:{tag}", f"docker-archive:{out / archive}:{reference}")
            (out / "done").write_text(json.dumps({"shale": target.shale, "client": target.client}) + "\n")
            shutil.rmtree(target.directory, ignore_errors=True)
            out.rename(target.directory)
        prune(keep=target.directory)
        size = sum(p.stat().st_size for p in target.directory.iterdir()) >> 20
        progress(f"built {target.shale} and {target.client} into {target.directory} ({size} MB)")
        return target


def prune(keep: Path, newest: int = 2) -> None:
    """Drop all but the `newest` built keys (`keep` among them): each is ~850 MB, and every change of the
    package's sources makes a new one."""
    built = sorted((d for d in keep.parent.iterdir() if (d / "done").exists() and d != keep),
                   key=lambda d: (d / "done").stat().st_mtime, reverse=True)
    for old in built[newest - 1:]:
        shutil.rmtree(old, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "key"])
    parser.add_argument("--python", type=Path, default=Path(sys.executable),
                        help="the Python whose pip builds the wheels (default: this one)")
    args = parser.parse_args()
    if args.command == "key":
        print(images().shale)
        return
    build(args.python, images())


if __name__ == "__main__":
    main()
