"""Kafka's JSON message definitions as kafka-python message classes: the oracle for record codecs.

kafka-python generates its request/response classes from Kafka's definitions at import time; fed with the
definitions of coordinator records (`__consumer_offsets`, `__transaction_state`) it encodes them too, which is
an encoder independent of ours. kafka-python only builds "data" messages, so the schemas are given that type.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import uuid
from pathlib import Path

from kafka.protocol.api_data import ApiData


def message_classes(schemas: dict[str, dict]) -> dict[str, type]:
    """One class per schema name (written as a throwaway package for kafka-python to load from, put straight into
    `sys.modules`: kafka-python finds it by name, and no import path has to reach its folder)."""
    directory = Path(tempfile.mkdtemp()) / f"kafka_schemas_{uuid.uuid4().hex}"
    directory.mkdir()
    (directory / "__init__.py").write_text("")
    for name, schema in schemas.items():
        (directory / f"{name}.json").write_text(json.dumps(schema))
    spec = importlib.util.spec_from_file_location(directory.name, directory / "__init__.py",
                                                  submodule_search_locations=[str(directory)])
    sys.modules[directory.name] = importlib.util.module_from_spec(spec)
    return {name: type(name, (ApiData,), {}, load_json=directory.name) for name in schemas}
