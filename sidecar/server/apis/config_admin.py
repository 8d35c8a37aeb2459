"""The config admin APIs: DescribeConfigs, AlterConfigs and IncrementalAlterConfigs, of topics and of this node
(the BROKER resource), answered the way a KRaft broker and controller answer them (error codes and messages of
ConfigurationControlManager, ConfigAdminManager, ConfigHelper).

Topic configs are read and validated with the one config table (`TopicConfig.from_mapping`), so a
value refused here is refused in a manifest too, with the same message. A topic stores its config as
the keys that differ from Kafka's defaults (`TopicConfig.overrides()`): a key set to its default value
is therefore described as DEFAULT_CONFIG, not as DYNAMIC_TOPIC_CONFIG as Kafka would. Only a topic the API owns
is altered (`admin_errors.check_api_owned`).

A node's settings come from its command line and are read-only, but for its dynamic broker configs (here the
replication throttles), which it changes live and keeps across restarts (`ops/dynamic_broker_configs.py`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from typing import Any, Callable, Mapping

from ...protocol import codec
from ...protocol.error_codes import (
    INVALID_CONFIG,
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    KAFKA_STORAGE_ERROR,
    NONE,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ...replication.control_store import StoreView
from ...replication.topic_record import TopicRecord
from ...server_config import SERVER_CONFIG_KEYS, SERVER_CONFIG_KEYS_BY_NAME, ServerConfig
from ...topic_config import CONFIG_KEYS, CONFIG_KEYS_BY_NAME, InvalidConfigError, TopicConfig
from ...topics.registry import TopicRegistry, TopicSpec
from ..network.handler import ConnectionInfo, Handler
from ..ops.dynamic_broker_configs import DynamicBrokerConfigs
from .admin_errors import (
    DEFAULT_TIMEOUT_MS,
    AdminError,
    check_api_owned,
    client,
    parse_config,
    put,
    stored,
    topic_name_error,
)
from .listener_addresses import ListenerAddresses
from .store_topics import StoreTopics

logger = logging.getLogger(__name__)

API_DESCRIBE_CONFIGS, API_ALTER_CONFIGS, API_INCREMENTAL_ALTER_CONFIGS = 32, 33, 44

# ConfigResource.Type ids.
RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER = 2, 4, 8

# DescribeConfigsResponse.ConfigSource ids.
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 2, 4, 5

# DescribeConfigsResponse.ConfigType ids, by ConfigDef type name.
CONFIG_TYPE_IDS = {"boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6, "list": 7}

# IncrementalAlterConfigs operations (AlterConfigOp.OpType).
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {OP_SET: "SET", OP_DELETE: "DELETE", OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}

DEFAULT_NUM_PARTITIONS = 1  # Kafka's num.partitions: the BROKER resource's, and a new topic's without a count

# The broker config holding each topic config's default, as Kafka's ServerTopicConfigSynonyms names it, and
# the factor from the topic's unit to the broker's (retention.ms defaults through log.retention.hours).
# Topic configs missing here have no broker default (Kafka's CONFIGS_WITH_NO_SERVER_DEFAULTS).
_BROKER_SYNONYMS: Mapping[str, tuple[str, int]] = {
    "cleanup.policy": ("log.cleanup.policy", 1),
    "retention.ms": ("log.retention.hours", 3600000),
    "retention.bytes": ("log.retention.bytes", 1),
    "segment.bytes": ("log.segment.bytes", 1),
    "segment.ms": ("log.roll.hours", 3600000),
    "segment.jitter.ms": ("log.roll.jitter.hours", 3600000),
    "segment.index.bytes": ("log.index.size.max.bytes", 1),
    "index.interval.bytes": ("log.index.interval.bytes", 1),
    "flush.messages": ("log.flush.interval.messages", 1),
    "flush.ms": ("log.flush.scheduler.interval.ms", 1),
    "min.cleanable.dirty.ratio": ("log.cleaner.min.cleanable.ratio", 1),
    "min.compaction.lag.ms": ("log.cleaner.min.compaction.lag.ms", 1),
    "max.compaction.lag.ms": ("log.cleaner.max.compaction.lag.ms", 1),
    "delete.retention.ms": ("log.cleaner.delete.retention.ms", 1),
    "file.delete.delay.ms": ("log.segment.delete.delay.ms", 1),
    "max.message.bytes": ("message.max.bytes", 1),
    "message.timestamp.type": ("log.message.timestamp.type", 1),
    "message.timestamp.before.max.ms": ("log.message.timestamp.before.max.ms", 1),
    "message.timestamp.after.max.ms": ("log.message.timestamp.after.max.ms", 1),
    "message.timestamp.difference.max.ms": ("log.message.timestamp.difference.max.ms", 1),
    "message.format.version": ("log.message.format.version", 1),
    "message.downconversion.enable": ("log.message.downconversion.enable", 1),
    "compression.type": ("compression.type", 1),
    "compression.gzip.level": ("compression.gzip.level", 1),
    "compression.lz4.level": ("compression.lz4.level", 1),
    "compression.zstd.level": ("compression.zstd.level", 1),
    "preallocate": ("log.preallocate", 1),
    "min.insync.replicas": ("min.insync.replicas", 1),
    "unclean.leader.election.enable": ("unclean.leader.election.enable", 1),
    "local.retention.ms": ("log.local.retention.ms", 1),
    "local.retention.bytes": ("log.local.retention.bytes", 1),
}

# How a request's configs become the new overrides of a topic (or this node's dynamic configs), from the current
# ones (Kafka names -> string values).
NewOverrides = Callable[[Mapping[str, str], list], dict[str, str]]


@dataclasses.dataclass(frozen=True)
class BrokerSetting:
    """One entry of the BROKER resource: read-only, since a node's settings come from its command line (but for
    the few it changes live, `ConfigAdmin.dynamic_broker`)."""

    name: str
    value: str
    type: str = "string"
    source: int = STATIC_BROKER_CONFIG


def _broker_default(topic_key: str) -> tuple[str, str] | None:
    """The broker synonym of a topic config and Kafka's default for it, in the broker's unit."""
    synonym = _BROKER_SYNONYMS.get(topic_key)
    if synonym is None:
        return None
    name, factor = synonym
    key = CONFIG_KEYS_BY_NAME[topic_key]
    value = key.default // factor if factor != 1 else key.default
    return name, key.to_string(value)


def topic_entries(config: TopicConfig, wanted: set[str] | None) -> list[tuple[str, str, int]]:
    """(name, value, source) of every key of the config table, those set on the topic as DYNAMIC_TOPIC_CONFIG."""
    overrides = config.overrides()
    return [(name, value, DYNAMIC_TOPIC_CONFIG if name in overrides else DEFAULT_CONFIG)
            for name, value in sorted(config.as_kafka_strings().items()) if wanted is None or name in wanted]


class ConfigAdmin:
    """The config handlers; a topic's config changes through `registry.put`, or with a control store through its
    topic record."""

    def __init__(self, registry: TopicRegistry, server_config: ServerConfig | None, store_topics: StoreTopics | None,
                 addresses: ListenerAddresses, dynamic_broker: Mapping[str, Callable[[Any], None]],
                 dynamic_file: DynamicBrokerConfigs | None) -> None:
        self.registry = registry
        self.server_config = server_config
        self.store_topics = store_topics
        self.addresses = addresses  # the BROKER resource's advertised.listeners
        # The broker configs this node changes live (Kafka's per-broker dynamic configs; here the replication
        # throttles): name -> apply(parsed value, or None for the command line's). Set ones, as strings, kept
        # across restarts in `dynamic_file`:
        self.dynamic_broker = dict(dynamic_broker)
        self.dynamic_values: dict[str, str] = {}
        self.dynamic_file = dynamic_file
        if dynamic_file is not None:
            self._restore_dynamic(dynamic_file.load())

    def handlers(self) -> dict[int, Handler]:
        return {
            API_DESCRIBE_CONFIGS: self._describe_configs,
            API_ALTER_CONFIGS: self._alter_configs,
            API_INCREMENTAL_ALTER_CONFIGS: self._incremental_alter_configs,
        }

    # -- DescribeConfigs -------------------------------------------------------------------------

    async def _describe_configs(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        body = request.body
        synonyms = bool(getattr(body, "include_synonyms", False))
        docs = bool(getattr(body, "include_documentation", False))
        results = []
        for res in body.resources:
            out: dict[str, Any] = {"error_code": NONE, "error_message": None, "resource_type": res.resource_type,
                                   "resource_name": res.resource_name, "configs": []}
            wanted = set(res.configuration_keys) if res.configuration_keys else None
            try:
                if res.resource_type == RESOURCE_TOPIC:
                    out["configs"] = self._describe_topic(res.resource_name, wanted, synonyms, docs)
                elif res.resource_type == RESOURCE_BROKER:
                    out["configs"] = self._describe_broker(res.resource_name, wanted, synonyms)
                else:
                    raise AdminError(INVALID_REQUEST, f"Unsupported resource type: {res.resource_type} "
                                                      f"(resource {res.resource_name!r})")
            except AdminError as exc:
                logger.info("DescribeConfigs from %s refused for resource %d %r: %s", client(conn),
                            res.resource_type, res.resource_name, exc.message)
                out.update(error_code=exc.code, error_message=exc.message, configs=[])
            results.append(out)
        return {"throttle_time_ms": 0, "results": results}

    def _existing_topic(self, name: str) -> TopicSpec:
        """The topic a config resource names, or Kafka's error for a bad or unknown name."""
        problem = topic_name_error(name)
        if problem is not None:
            raise AdminError(INVALID_TOPIC_EXCEPTION, problem)
        spec = self.registry.topics.get(name)
        if spec is None:
            raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
        return spec

    def _describe_topic(self, name: str, wanted: set[str] | None, synonyms: bool, docs: bool) -> list[dict]:
        spec = self._existing_topic(name)
        entries = []
        for key_name, value, source in topic_entries(spec.config, wanted):
            key = CONFIG_KEYS_BY_NAME[key_name]
            chain = []
            if source == DYNAMIC_TOPIC_CONFIG:
                chain.append({"name": key_name, "value": value, "source": DYNAMIC_TOPIC_CONFIG})
            default = _broker_default(key_name)
            if default is not None:
                chain.append({"name": default[0], "value": default[1], "source": DEFAULT_CONFIG})
            entries.append({"name": key_name, "value": value, "read_only": False, "config_source": source,
                            "is_sensitive": False, "synonyms": chain if synonyms else [],
                            "config_type": CONFIG_TYPE_IDS[key.type.name], "documentation": key.doc if docs else None})
        return entries

    def _broker_settings(self) -> list[BrokerSetting]:
        """What this node can tell about itself: its identity, where it keeps data, and its topic defaults."""
        node = self.registry.node
        settings = [
            BrokerSetting("node.id", str(node.node_id), "int"),
            BrokerSetting("broker.id", str(node.node_id), "int"),
            BrokerSetting("log.dirs", ",".join(self.registry.log_dir.paths)),
            BrokerSetting("advertised.listeners", ",".join(
                f"{name}://{host}:{port}" for name, (host, port) in self.addresses.own.items())
                or f"PLAINTEXT://{node.host}:{node.port}", "list"),
            BrokerSetting("num.partitions", str(DEFAULT_NUM_PARTITIONS), "int", DEFAULT_CONFIG),
            BrokerSetting("auto.create.topics.enable", "false", "boolean"),  # topics come from manifests or the API
        ]
        if self.server_config is not None:  # `--override`s are STATIC_BROKER_CONFIG, the rest Kafka's defaults
            overridden = self.server_config.overrides()
            for key in SERVER_CONFIG_KEYS:
                if key.name == "log.dirs":
                    continue  # the dirs in use, above (the setting is empty when --data-dir names them)
                if key.name in self.dynamic_values:
                    settings.append(BrokerSetting(key.name, self.dynamic_values[key.name], key.type.name,
                                                  DYNAMIC_BROKER_CONFIG))
                    continue
                value = key.to_string(self.server_config.value_of(key.name))
                settings.append(BrokerSetting(key.name, value, key.type.name,
                                              STATIC_BROKER_CONFIG if key.name in overridden else DEFAULT_CONFIG))
        for key in CONFIG_KEYS:
            default = _broker_default(key.name)
            if default is not None and default[0] not in {s.name for s in settings}:
                unit_changed = _BROKER_SYNONYMS[key.name][1] != 1  # log.retention.hours and the like are ints
                settings.append(BrokerSetting(default[0], default[1], "int" if unit_changed else key.type.name,
                                              DEFAULT_CONFIG))
        return settings

    def _describe_broker(self, name: str, wanted: set[str] | None, synonyms: bool) -> list[dict]:
        if name == "":
            return []  # the cluster-wide dynamic defaults: a node has none
        self._check_broker_name(name)
        return [{"name": s.name, "value": s.value, "read_only": s.name not in self.dynamic_broker,
                 "config_source": s.source,
                 "is_sensitive": False, "config_type": CONFIG_TYPE_IDS[s.type], "documentation": None,
                 "synonyms": [{"name": s.name, "value": s.value, "source": s.source}] if synonyms else []}
                for s in self._broker_settings() if wanted is None or s.name in wanted]

    def _check_broker_name(self, name: str) -> None:
        node_id = self.registry.node.node_id
        try:
            asked = int(name)
        except ValueError:
            raise AdminError(INVALID_REQUEST, f"Broker id must be an integer, but it is: {name}") from None
        if asked != node_id:
            raise AdminError(INVALID_REQUEST,
                             f"Unexpected broker id, expected {node_id} or empty string, but received {name}")

    # -- AlterConfigs and IncrementalAlterConfigs ------------------------------------------------

    async def _alter_configs(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """Legacy AlterConfigs: the given configs become the topic's whole override set."""
        return await self._alter(request, conn, _replace_all)

    async def _incremental_alter_configs(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """SET/DELETE/APPEND/SUBTRACT applied to the topic's current overrides."""
        return await self._alter(request, conn, _apply_ops)

    async def _alter(self, request: codec.Request, conn: ConnectionInfo, compute: NewOverrides) -> dict:
        body = request.body
        counts = Counter((r.resource_type, r.resource_name) for r in body.resources)
        responses = []
        for res in body.resources:
            out = {"error_code": NONE, "error_message": None, "resource_type": res.resource_type,
                   "resource_name": res.resource_name}
            try:
                if counts[(res.resource_type, res.resource_name)] > 1:
                    raise AdminError(INVALID_REQUEST, "Each resource must appear at most once.")
                if len({c.name for c in res.configs}) != len(res.configs):
                    raise AdminError(INVALID_REQUEST, "Error due to duplicate config keys")
                if res.resource_type == RESOURCE_TOPIC:
                    await self._alter_topic(res.resource_name, res.configs, compute, bool(body.validate_only), conn)
                elif res.resource_type == RESOURCE_BROKER:
                    if res.resource_name != "":  # a legacy AlterConfigs with no configs removes them all, as Kafka's
                        self._check_broker_name(res.resource_name)
                        self._alter_broker(res.resource_name, res.configs, compute, bool(body.validate_only))
                    elif res.configs:  # refused: the cluster-wide default is not served
                        self._alter_broker(res.resource_name, res.configs, compute, bool(body.validate_only))
                else:
                    raise AdminError(INVALID_REQUEST, f"Unknown resource type {res.resource_type}")
            except AdminError as exc:
                logger.info("%s from %s refused for resource %d %r: %s", request.api_name, client(conn),
                            res.resource_type, res.resource_name, exc.message)
                out.update(error_code=exc.code, error_message=exc.message)
            responses.append(out)
        return {"throttle_time_ms": 0, "responses": responses}

    def _restore_dynamic(self, saved: dict[str, str]) -> None:
        """Apply the dynamic configs a previous run of this node set (`dynamic_file`); what no longer applies
        here is logged and left out."""
        for key, value in saved.items():
            if key not in self.dynamic_broker:
                logger.warning("node %d: dynamic broker config %s=%s in %s is not dynamic on this node; ignored",
                               self.registry.node.node_id, key, value, self.dynamic_file.path)
                continue
            try:
                parsed = SERVER_CONFIG_KEYS_BY_NAME[key].parse(value)
            except InvalidConfigError as exc:
                logger.error("node %d: dynamic broker config %s=%s in %s is invalid (%s); ignored",
                             self.registry.node.node_id, key, value, self.dynamic_file.path, exc)
                continue
            self.dynamic_broker[key](parsed)
            self.dynamic_values[key] = value
        if self.dynamic_values:
            logger.info("node %d: dynamic broker configs restored from %s: %s", self.registry.node.node_id,
                        self.dynamic_file.path, self.dynamic_values)

    def _alter_broker(self, name: str, configs: list, compute: NewOverrides, validate_only: bool) -> None:
        """This node's dynamic configs (`dynamic_broker`), as Kafka's per-broker ones: kafka-reassign-partitions
        sets the replication throttles this way. Written to `dynamic_file` before they apply, so a restart comes
        back with them (Kafka keeps them in its metadata); the cluster-wide default (an empty name) is not
        served."""
        fixed = [c.name for c in configs if c.name not in self.dynamic_broker or name == ""]
        if fixed:
            raise AdminError(INVALID_REQUEST, f"Cannot update these configs dynamically: {', '.join(fixed)} (a "
                                              "node's settings come from its command line; per node only: "
                                              f"{', '.join(sorted(self.dynamic_broker)) or 'none here'})")
        new = compute(self.dynamic_values, list(configs))
        parsed = {}
        for key, value in new.items():
            try:
                parsed[key] = SERVER_CONFIG_KEYS_BY_NAME[key].parse(value)
            except InvalidConfigError as exc:
                raise AdminError(INVALID_CONFIG, str(exc)) from None
        if validate_only:
            return
        if self.dynamic_file is not None:
            try:
                self.dynamic_file.save(new)
            except OSError as exc:
                raise AdminError(KAFKA_STORAGE_ERROR, f"Cannot keep the dynamic broker configs in "
                                                      f"{self.dynamic_file.path}: {exc}") from None
        for key, apply in self.dynamic_broker.items():
            apply(parsed.get(key))
        self.dynamic_values = new
        logger.info("node %d: dynamic broker configs now %s", self.registry.node.node_id, new or "none")

    async def _alter_topic(self, name: str, configs: list, compute: NewOverrides, validate_only: bool,
                           conn: ConnectionInfo) -> None:
        if name == "":
            raise AdminError(INVALID_REQUEST, "Default topic resources are not allowed.")
        spec = self._existing_topic(name)
        check_api_owned(spec, "edit the manifest (kubectl apply) to change its config; changes made through the "
                              "Kafka API would be reverted by the manifest",
                        "its config is set by the node")
        config = parse_config(compute(spec.config.overrides(), list(configs)))
        if validate_only or config == spec.config:
            return
        if self.store_topics is None:
            put(self.registry, dataclasses.replace(spec, config=config))
        else:  # computed again on the record as written: an incremental change applies to the latest overrides
            def altered(record: TopicRecord | None, _view: StoreView) -> TopicRecord:
                if record is None:
                    raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
                new = parse_config(compute(record.spec().config.overrides(), list(configs)))
                return dataclasses.replace(record, config=new.overrides())
            config = (await stored(
                self.store_topics.change(name, altered, DEFAULT_TIMEOUT_MS / 1000))).spec().config
        logger.info("topic %s config altered by %s: overrides now %s", name, client(conn), config.overrides())

def _replace_all(current: Mapping[str, str], configs: list) -> dict[str, str]:
    """Legacy AlterConfigs: exactly the given configs, every other key back to its default."""
    nulls = [c.name for c in configs if c.value is None]
    if nulls:
        raise AdminError(INVALID_REQUEST, "Null value not supported for : " + ", ".join(nulls))
    return {c.name: c.value for c in configs}


def _apply_ops(current: Mapping[str, str], configs: list) -> dict[str, str]:
    """Kafka's incrementalAlterConfigResource on the current overrides (strings, as stored)."""
    nulls = [c.name for c in configs if c.config_operation != OP_DELETE and c.value is None]
    if nulls:
        raise AdminError(INVALID_REQUEST, "Null value not supported for : " + ", ".join(nulls))
    overrides = dict(current)
    for c in configs:
        op = c.config_operation
        if op == OP_SET:
            overrides[c.name] = c.value
        elif op == OP_DELETE:
            overrides.pop(c.name, None)
        elif op in (OP_APPEND, OP_SUBTRACT):
            key = CONFIG_KEYS_BY_NAME.get(c.name)
            if key is None or key.type.name != "list":
                raise AdminError(INVALID_CONFIG, f"Can't {_OP_NAMES[op]} to key {c.name} because its type is not LIST.")
            current = overrides.get(c.name, key.to_string(key.default))
            parts = [p for p in current.split(",") if p]
            for item in c.value.split(","):
                if op == OP_APPEND and item not in parts:
                    parts.append(item)
                elif op == OP_SUBTRACT and item in parts:
                    parts.remove(item)
            overrides[c.name] = ",".join(parts)
        else:
            raise AdminError(INVALID_REQUEST, f"Unknown operation type {op} for config {c.name}")
    return overrides
