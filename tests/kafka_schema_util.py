"""Kafka's JSON message definitions as kafka-python message classes: the oracle for record codecs.

kafka-python generates its request/response classes from Kafka's definitions at import time; fed with the
definitions of coordinator records (`__consumer_offsets`, `__transaction_state`) it encodes them too, which is
an encoder independent of ours. kafka-python only builds "data" messages, so the schemas are given that type.
"""

from __future__ import annotations

import json
import sys
import tempfile
import uuid
from pathlib import Path

from kafka.protocol.api_data import ApiData


def message_classes(schemas: dict[str, dict]) -> dict[str, type]:
    """One class per schema name (written as a throwaway package for kafka-python to load from)."""
    root = Path(tempfile.mkdtemp())
    package = f"kafka_schemas_{uuid.uuid4().hex}"
    (root / package).mkdir()
    (root / package / "__init__.py").write_text("")
    for name, schema in schemas.items():
        (root / package / f"{name}.json").write_text(json.dumps(schema))
    sys.path.insert(0, str(root))
    try:
        return {name: type(name, (ApiData,), {}, load_json=package) for name in schemas}
    finally:
        sys.path.remove(str(root))
