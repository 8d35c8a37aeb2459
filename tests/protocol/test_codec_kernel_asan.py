"""The C codec (`_codec_kernel.c`) under AddressSanitizer and UndefinedBehaviorSanitizer: it reads frames from the
network, so a read past a buffer or a bad reference count would be a hole, not a wrong answer. The module is
compiled again with the sanitizers and driven by `asan_codec_driver.py` in a process that preloads their
runtimes; any memory error aborts it (checked by hand: a planted read 8 bytes past a frame's end is reported as a
heap-buffer-overflow). Needs the machine's C compiler (`pip install -e .` needs it too)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "sidecar" / "protocol" / "_codec_kernel.c"
DRIVER = Path(__file__).with_name("asan_codec_driver.py")


def runtime(name: str) -> str:
    found = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.isabs(found), f"gcc has no {name}: install the compiler's sanitizer runtimes (libasan, libubsan)"
    return found


@pytest.mark.timeout(600)
def test_damaged_frames_and_odd_bodies_cause_no_memory_error(tmp_path):
    kernel = tmp_path / "_codec_kernel.so"
    subprocess.run(["gcc", "-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-std=c11",
                    "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(SOURCE), "-o", str(kernel)],
                   check=True, capture_output=True)
    # PYTHONMALLOC=malloc: every Python buffer its own malloc block, which ASan guards (pymalloc's pools are not)
    env = dict(os.environ, LD_PRELOAD=f"{runtime('libasan.so')}:{runtime('libubsan.so')}", PYTHONMALLOC="malloc",
               ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    run = subprocess.run([sys.executable, str(DRIVER), str(kernel), "7", "400"], env=env, capture_output=True,
                         text=True, timeout=540, cwd=ROOT)
    assert run.returncode == 0 and "Sanitizer" not in run.stderr, run.stderr[-4000:]
    counts = eval(run.stdout.strip().splitlines()[-1])  # noqa: S307 - the driver's own dict of two ints
    assert counts["read"] > 0 and counts["refused"] > 0, counts  # both paths ran: frames read and refused
