"""The repository root is a safe working directory for every Python entry point.

The top-level folders (`operator/`, `sidecar/`, `pipeline/`) hold the import packages `shale.*`; were
they regular packages, a Python started in the root would import `operator/` as the standard library's
`operator` (and die: `cannot import name 'eq'`), and `sidecar/`, `pipeline/` as second copies of the
code. Each entry point runs here from the root, in a fresh venv with Shale installed from its wheel,
where no editable finder or preloaded module hides the problem.
"""

from __future__ import annotations

import subprocess
import sys

import yaml

from support.wheel_venv import ROOT

TOP_LEVEL = ("operator", "sidecar", "pipeline")


def test_no_top_level_folder_is_a_regular_package():
    assert [d for d in TOP_LEVEL if (ROOT / d / "__init__.py").exists()] == []


def test_stdlib_operator_without_site_from_the_root():
    """The original report: `python3 -S -c "import operator; operator.eq"` in the root."""
    run = subprocess.run([sys.executable, "-S", "-c", "import operator; print(operator.__file__, operator.eq(1, 1))"],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert not run.stdout.startswith(str(ROOT)) and run.stdout.strip().endswith("True")


def test_root_folders_load_no_code_from_the_root(wheel_venv):
    """`import sidecar` / `import pipeline` in the root find empty namespace portions, not the code."""
    probe = ("import operator, sidecar, pipeline, sys;"
             "print(operator.eq(1, 1), sidecar.__file__, pipeline.__file__, "
             "sorted(m for m in sys.modules if m.startswith(('sidecar.', 'pipeline.', 'shale'))))")
    run = wheel_venv.run("python", "-c", probe)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "None", "None", "[]"]


def test_installed_packages_come_from_site_packages(wheel_venv):
    run = wheel_venv.run("python", "-c", "import shale.sidecar.server.node as n, shale.operator.crd as c, "
                         "shale.pipeline.latest as p, shale.sidecar.log._cleaner_kernel as k, "
                         "shale.sidecar.protocol._codec_kernel as ck, "
                         "shale.sidecar.security.sasl as s; print(n.__file__, c.__file__, p.__file__, k.__file__, "
                         "ck.__file__, s.__file__)")
    assert run.returncode == 0, run.stderr
    files = run.stdout.split()
    assert len(files) == 6 and all(f.startswith(str(wheel_venv.site_packages)) for f in files), files


def test_shale_commands_from_the_root(wheel_venv, tmp_path):
    assert wheel_venv.run("shale", "--help").returncode == 0
    crd = wheel_venv.run("shale", "crd")
    assert crd.returncode == 0, crd.stderr
    assert yaml.safe_load(crd.stdout)["spec"]["names"]["kind"] == "Topic"
    # dump-log over a segment written by the installed engine, all in the fresh venv
    write = ("import sys; from shale.sidecar.log.log_dir import LogDir; from shale.sidecar.log.checkpoint import "
             "TopicPartition; from shale.sidecar.log.records import Record, encode_batch; from shale.sidecar."
             "topic_config import TopicConfig; d = LogDir(sys.argv[1], lambda t: TopicConfig.from_mapping({})); "
             "d.get_or_create(TopicPartition('t', 0)).append(encode_batch([Record(0, 1, b'k', b'v')])); d.close()")
    assert wheel_venv.run("python", "-c", write, tmp_path).returncode == 0
    dump = wheel_venv.run("shale", "dump-log", "--print-data-log", tmp_path / "t-0" / "00000000000000000000.log")
    assert dump.returncode == 0, dump.stderr
    assert "key: k payload: v" in dump.stdout


def test_module_entry_points_from_the_root(wheel_venv):
    for module in ("shale.sidecar.cli", "shale.operator.topic_check", "shale.pipeline.follower_counts"):
        run = wheel_venv.run("python", "-m", module, "--help")
        assert run.returncode == 0 and "usage:" in run.stdout, (module, run.stderr[-2000:])
