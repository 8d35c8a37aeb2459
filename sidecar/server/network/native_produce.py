"""A one-record Produce answered by one C call from the connection's read callback (`_native_produce.c`): when a
connection may use it, and the decoders, encoders and calls it is given.

Why (issue 18, docs/native-request-path.md): a one-record Produce on the Python path makes ~100 Python calls
(decode, the handler's checks, the append, the encoding, the metrics), and each costs about twice as much on a
server woken for one request as in a loop. The C call makes the same decode, append and encoding with the same
schema-compiled codec and the log's own C append, and only a few calls back into Python (the partition's log,
the metrics, a parked fetch to wake). Whatever it does not take is declined before anything is done, and the
frame goes the Python way: the answers are the handler's, byte for byte (tests/server/test_native_produce.py).

A connection uses it only where the handler would run no check the C call skips: no replica manager (one
replica per partition, nothing to replicate or fence), no authorizer (its wrapper is the Produce handler), and
no SASL session (which re-checks each request's session lifetime).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from ...log.log import Log, append_in_c_call
from ...protocol import codec, compiled_codec
from .handler import API_PRODUCE

try:
    from ._native_produce import appended
    from ._native_produce import produce as _produce
except ImportError:  # pragma: no cover - a checkout without the compiled extension
    _produce = None

    def appended() -> int:
        """The native appends made in this process (none without the extension)."""
        return 0

FIRST_BATCH_VERSION = 3  # Produce v3+ carries v2 record batches; v0-2 are refused (by the handler, as ever)


@dataclass(slots=True)
class NativeProduce:
    """What the C call reads (by these names): per served version, the compiled request decoder and the response's
    (program, flexible, header tags); the encoder; the calls back into the broker and the log engine."""

    decoders: dict[int, Callable[[Any], tuple]]
    encoders: dict[int, tuple[tuple, bool, bytes]]
    encode: Callable
    local_log: Callable[[str, int], Log | None]
    append: Callable  # log.append_in_c_call(): (log, data, one_batch) -> AppendInfo's fields or None
    events: dict  # the broker's parked fetches by partition: poked only when some fetch waits
    poke: Callable[[str, int], None]
    observe: Callable[[str, float], None] | None
    # (api key, version, correlation id, body) -> the framed answer through the whole codec (compiled, generated,
    # reference): what answers an appended record when the compiled encoder could not
    encode_response: Callable[[int, int, int, dict], bytes] = functools.partial(codec.encode_response, framed=True)
    # (version, topic, partition) -> (the encoder's answer for probe values, where the base offset and the log start
    # offset stand in it): filled by the C call, which writes the next answers into copies of it
    answers: dict[tuple[int, str, int], tuple[bytes, int, int]] = field(default_factory=dict)


def native_produce(versions: tuple[int, int], *, local_log: Callable[[str, int], Log | None], events: dict,
                   poke: Callable[[str, int], None],
                   observe: Callable[[str, float], None] | None) -> NativeProduce | None:
    """A native Produce for the served `versions` (lo, hi) that calls back into the broker's `local_log`, parked
    fetches (`events`, `poke`) and request figures (`observe`); None without the compiled extensions."""
    append = append_in_c_call()
    if _produce is None or append is None or not compiled_codec.available:
        return None
    request, response = codec.request_class(API_PRODUCE), codec.response_class(API_PRODUCE)
    served = range(max(versions[0], FIRST_BATCH_VERSION), versions[1] + 1)
    return NativeProduce(
        decoders={v: compiled_codec.request_decoder(request, v) for v in served},
        encoders={v: compiled_codec.response_program(response, v) for v in served},
        encode=compiled_codec.encode, local_log=local_log, append=append, events=events, poke=poke, observe=observe)


def answerer(path: NativeProduce, replies: Any) -> Callable[[bytearray, int, int], bytes | None]:
    """`(buf, start, end) -> answer | None` for one connection whose writer queue is `replies` (nothing is answered
    while an answer waits in it), the frame being `buf[start:end]`."""
    return functools.partial(_produce, path, replies)
