"""Driver of test_codec_kernel_asan.py, run in a process with AddressSanitizer preloaded: damaged request frames of
every API into the C decoder, and response bodies drawn from every schema into the C encoder.

    python asan_codec_driver.py KERNEL.so SEED EXAMPLES

A memory error aborts the process (ASan, UBSan with halt_on_error); otherwise it prints how many frames were
read and refused. Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import importlib.util
import random
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

path, seed, examples = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
spec = importlib.util.spec_from_file_location("shale.sidecar.protocol._codec_kernel", path)
kernel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernel)
sys.modules["shale.sidecar.protocol._codec_kernel"] = kernel  # compiled_codec imports this one

from schema_values import ALL_VERSIONS, struct_dicts, valid_frames  # noqa: E402

from shale.sidecar.protocol import codec, compiled_codec  # noqa: E402

assert compiled_codec._kernel is kernel, "compiled_codec did not load the sanitized kernel"
rng = random.Random(seed)
counts = {"read": 0, "refused": 0}
EXTREMES = [b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x80\x80\x80\x80\x80", b"\x00\x00", b"\xff" * 10]


def damaged(frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        op, at = rng.randrange(4), rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            del data[at:]
        elif op == 2:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            value = rng.choice(EXTREMES)
            data[at:at + len(value)] = value
    return bytes(data)


@settings(max_examples=examples, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def run(data) -> None:
    key, version, *_, frame = data.draw(valid_frames())
    decode = compiled_codec.request_decoder(codec.request_class(key), version)
    for _ in range(20):
        try:
            decode(damaged(frame))  # a bytes object: its buffer ends one NUL byte after the frame
            counts["read"] += 1
        except Exception:  # noqa: BLE001 - a refusal is fine; a memory error is not an exception
            counts["refused"] += 1
    api_key, api_version = data.draw(st.sampled_from(ALL_VERSIONS))
    body = data.draw(struct_dicts(codec.response_class(api_key), api_version))
    try:
        compiled_codec.response_encoder(codec.response_class(api_key), api_version)(body, 1, True)
    except Exception:  # noqa: BLE001
        pass


run()
print(counts)
