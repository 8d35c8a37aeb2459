"""Broker-level settings of `shale serve`: Kafka's names, types, defaults and validators, in one table.

`SERVER_CONFIG_KEYS` plays the part `CONFIG_KEYS` plays for topics (and reuses its types and
validators, so a value is read exactly as `ConfigDef` reads it). Values come from
`shale serve --override key=value`, repeated, as `kafka-server-start.sh --override` takes them.

One deliberate difference: Kafka only warns about a key it does not know ("was supplied but isn't
a known config"); here an unknown key is refused, because the keys Shale does not implement
(listeners, ...) would silently do nothing and a typo in a pod spec would go unnoticed.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping

from .log.free_space import FreeFloor
from .log.log_cleaner import CleanerConfig
from .security.principal import parse_super_users
from .topic_config import (
    BOOLEAN,
    DOUBLE,
    INT,
    LONG,
    LONG_MAX,
    STRING,
    ConfigKey,
    InvalidConfigError,
    OneOf,
    Range,
)

# `authorizer.class.name` values that turn Shale's ACL authorizer on: Kafka's (KRaft's and ZooKeeper's) and a short alias.
AUTHORIZER_CLASS_NAMES = ("org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                          "kafka.security.authorizer.AclAuthorizer", "shale")
DOUBLE_MAX = 1.7976931348623157e308  # Java's Double.MAX_VALUE, Kafka's "no limit" for the cleaner's I/O rate

SERVER_CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("log.retention.check.interval.ms", LONG, 300000, Range(1),
              "How often retention (retention.ms, retention.bytes, the log start offset) runs on logs whose "
              "policy is delete only; compacted logs get retention from the cleaner threads every pass."),
    ConfigKey("log.flush.scheduler.interval.ms", LONG, LONG_MAX, None,
              "How often the flusher looks for logs whose flush.ms has passed; the default runs it once, "
              "after log.initial.task.delay.ms."),
    ConfigKey("log.flush.offset.checkpoint.interval.ms", INT, 60000, Range(0),
              "How often recovery-point-offset-checkpoint is written (0: once); a restart after a crash "
              "recovers the segments above these offsets."),
    ConfigKey("log.flush.start.offset.checkpoint.interval.ms", INT, 60000, Range(0),
              "How often log-start-offset-checkpoint is written (0: once)."),
    ConfigKey("log.initial.task.delay.ms", LONG, 30000, Range(0),
              "Delay before the first run of every scheduled log task (Kafka's internal setting)."),
    ConfigKey("log.cleaner.enable", BOOLEAN, True, None,
              "Whether the cleaner threads run. Without them compacted topics are neither compacted nor "
              "trimmed by retention, as in Kafka."),
    ConfigKey("log.cleaner.threads", INT, 1, Range(0), "Number of cleaner threads."),
    ConfigKey("log.cleaner.dedupe.buffer.size", LONG, 134217728, None,
              "Memory of the cleaners' key-to-offset maps, split between the threads."),
    ConfigKey("log.cleaner.io.buffer.load.factor", DOUBLE, 0.9, None,
              "How full a cleaner's offset map may get, in (0, 1]."),
    ConfigKey("log.cleaner.io.max.bytes.per.second", DOUBLE, DOUBLE_MAX, None,
              "Read plus write rate all cleaner threads together stay under."),
    ConfigKey("log.dirs", STRING, "", None,
              "The log dirs, comma-separated, each its own volume (JBOD): new partitions go to the dir with the "
              "fewest, AlterReplicaLogDirs moves them between dirs (docs/moves.md). Empty: the --data-dir "
              "options (repeated or comma-separated). Node files live in the first dir."),
    ConfigKey("log.dir.min.free.bytes", LONG, 0, Range(0),
              "Free bytes each log dir keeps for the cleaner and retention: under the floor (the larger of this and "
              "log.dir.min.free.ratio) clients' Produce is refused with KAFKA_STORAGE_ERROR, which they retry, while "
              "cleaning, retention, checkpoints, transaction markers and coordinator writes go on. Not in Kafka."),
    ConfigKey("log.dir.min.free.ratio", DOUBLE, 0.05, Range(0, 0.9),
              "The floor as a share of each log dir's filesystem (the larger of this and log.dir.min.free.bytes "
              "wins); 0 with log.dir.min.free.bytes 0 turns the floor off, as in Kafka."),
    ConfigKey("replica.alter.log.dirs.io.max.bytes.per.second", LONG, LONG_MAX, Range(1),
              "Bytes per second all log-dir moves together copy at most, so that a move does not starve "
              "producers."),
    ConfigKey("log.cleaner.backoff.ms", LONG, 15000, Range(0),
              "How long a cleaner thread sleeps when no log needs cleaning; a topic config change wakes it."),
    ConfigKey("producer.id.expiration.ms", INT, 86400000, Range(1),
              "How long a producer id is remembered after its last write (and kept by the cleaner)."),
    ConfigKey("producer.id.expiration.check.interval.ms", INT, 600000, Range(1),
              "How often expired producer ids are removed."),
    ConfigKey("group.initial.rebalance.delay.ms", INT, 3000, Range(0),
              "How long the group coordinator waits for more members before the first rebalance of an "
              "empty group."),
    ConfigKey("offsets.topic.num.partitions", INT, 50, Range(1),
              "Partitions of __consumer_offsets when it is created."),
    ConfigKey("transaction.state.log.num.partitions", INT, 50, Range(1),
              "Partitions of __transaction_state when it is created."),
    ConfigKey("transaction.max.timeout.ms", INT, 900000, Range(1),
              "The longest transaction.timeout.ms a producer may ask for (INVALID_TRANSACTION_TIMEOUT above)."),
    ConfigKey("transaction.abort.timed.out.transaction.cleanup.interval.ms", INT, 10000, Range(1),
              "How often the transaction coordinator aborts transactions past their timeout."),
    ConfigKey("transactional.id.expiration.ms", INT, 604800000, Range(1),
              "How long a transactional id with no transaction open is kept without use."),
    ConfigKey("delete.topic.enable", BOOLEAN, True, None,
              "Whether topics can be deleted: by removing their manifest (or their key in the operator's "
              "ConfigMap) or through DeleteTopics. When false a removed manifest's topic keeps its data "
              "and DeleteTopics answers TOPIC_DELETION_DISABLED, as Kafka's broker does."),
    ConfigKey("socket.request.max.bytes", INT, 104857600, Range(1),
              "The largest request frame a connection may announce; a larger one closes the connection "
              "before any of it is buffered."),
    ConfigKey("queued.max.request.bytes", LONG, -1, None,
              "Bytes of requests received and not yet handled, over all connections, before the node stops "
              "reading from sockets (back-pressure); counted as they arrive, never as announced. -1 (Kafka's "
              "default; any value <= 0) bounds it by socket.request.max.bytes instead of leaving it unbounded."),
    # Replication (docs/replication.md); without --store none of these has any effect.
    ConfigKey("broker.session.timeout.ms", INT, 2000, Range(1),
              "How long a node's session in the control store lives without renewal. A leader stops "
              "acknowledging writes broker.heartbeat.interval.ms before it ends, and the others elect a new "
              "leader once it has. Kafka's default is 9000; 2000 here keeps a failover near two seconds."),
    ConfigKey("broker.heartbeat.interval.ms", INT, 500, Range(1),
              "How often a node renews its session; at most a third of broker.session.timeout.ms."),
    ConfigKey("replica.lag.time.max.ms", LONG, 30000, Range(1),
              "How long a follower may go without catching up to the leader's log end before the leader "
              "removes it from the ISR."),
    ConfigKey("auto.leader.rebalance.enable", BOOLEAN, True, None,
              "Hand a partition's leadership back to its preferred replica (the first of its assignment) once "
              "it is in the ISR again, when its node leads too few of the partitions it prefers (Kafka's "
              "auto leader rebalance; docs/replication.md, \"Preferred leaders\")."),
    ConfigKey("leader.imbalance.check.interval.seconds", LONG, 300, Range(1),
              "How often a leader checks whether to hand partitions to their preferred replicas."),
    ConfigKey("leader.imbalance.per.broker.percentage", INT, 10, Range(0),
              "The share (percent) of the partitions a node prefers but does not lead above which their "
              "leadership is handed back to it."),
    ConfigKey("unclean.leader.election.enable", BOOLEAN, False, None,
              "The default of the topic config of the same name: whether a replica outside the ISR may lead "
              "when no ISR member is live, losing what it lacks."),
    ConfigKey("default.replication.factor", INT, 1, Range(1),
              "Replication factor of topics created without one (CreateTopics with -1, manifests without "
              "replicas)."),
    ConfigKey("offsets.topic.replication.factor", INT, 3, Range(1),
              "Replication factor of __consumer_offsets. As in Kafka, it is not lowered to the live nodes: "
              "its partitions are created once that many nodes are live, and until then groups have no "
              "coordinator. Set 1 for a one-node cluster with a store."),
    ConfigKey("transaction.state.log.replication.factor", INT, 3, Range(1),
              "Replication factor of __transaction_state (with a store). As offsets.topic.replication.factor, not "
              "lowered to the live nodes: its partitions are created once that many nodes are live, and until "
              "then transactional producers find no coordinator. Set 1 for a one-node cluster with a store."),
    ConfigKey("transaction.state.log.min.isr", INT, 2, Range(1),
              "min.insync.replicas of __transaction_state: a coordinator's write is answered only once that many "
              "replicas have it (at most the replication factor)."),
    ConfigKey("max.incremental.fetch.session.cache.slots", INT, 1000, Range(0),
              "Incremental fetch sessions (KIP-227) a node keeps for the followers and consumers fetching from it; "
              "a fetch that finds no slot is answered without one and fetches every partition each time "
              "(docs/fetch-sessions.md)."),
    ConfigKey("replica.fetch.wait.max.ms", INT, 500, Range(0),
              "How long a follower's fetch waits at the leader for new data (the long poll)."),
    ConfigKey("replica.fetch.min.bytes", INT, 1, Range(1),
              "Bytes a follower's fetch waits for at the leader before it is answered."),
    ConfigKey("replica.fetch.max.bytes", INT, 1048576, Range(0),
              "Bytes a follower fetches per partition at a time (a larger first batch still comes whole); "
              "also the largest piece appended to the follower's log at once."),
    ConfigKey("replica.fetch.response.max.bytes", INT, 10485760, Range(0),
              "Bytes a follower's fetch takes from one leader over all its partitions."),
    ConfigKey("replica.fetch.backoff.ms", INT, 100, Range(0),
              "How long a follower waits before fetching a partition again after an error, or reconnecting to "
              "a leader it lost; a new leader or epoch from the store ends the wait at once. Kafka's default "
              "is 1000: right after an election a follower may ask the new leader before that leader has "
              "seen its own election (UNKNOWN_LEADER_EPOCH), and a second's wait there would take half of the two "
              "seconds a failover is meant to take."),
    ConfigKey("leader.replication.throttled.rate", LONG, LONG_MAX, Range(0),
              "Bytes per second this node sends as leader to throttled replicas (out of the ISR and named by "
              "their topic's leader.replication.throttled.replicas) at most; a move then does not starve "
              "producers (docs/moves.md). Also changed live per node, as Kafka's dynamic broker config "
              "(IncrementalAlterConfigs on the node's BROKER resource; kept in memory until a restart)."),
    ConfigKey("follower.replication.throttled.rate", LONG, LONG_MAX, Range(0),
              "Bytes per second this node fetches as follower for throttled replicas (out of the ISR and named "
              "by their topic's follower.replication.throttled.replicas) at most; changed live as the leader's."),
    ConfigKey("replication.quota.window.num", INT, 11, Range(1),
              "Windows over which the replication throttles measure their rates."),
    ConfigKey("replication.quota.window.size.seconds", INT, 1, Range(1),
              "Length of one window of the replication throttles."),
    ConfigKey("replica.socket.timeout.ms", INT, 30000, Range(1),
              "How long a follower waits to connect to a leader, and for an answer beyond "
              "replica.fetch.wait.max.ms, before it reconnects."),
    # Authorization (docs/security.md)
    ConfigKey("authorizer.class.name", STRING, "", OneOf(("", *AUTHORIZER_CLASS_NAMES)),
              "Turns ACL checks on for every API: Kafka's StandardAuthorizer or AclAuthorizer class names, or "
              "`shale`, all meaning Shale's ACL authorizer over the ACLs in shale-security.json. Empty: no "
              "authorizer, everything is allowed and the ACL APIs answer SECURITY_DISABLED."),
    ConfigKey("super.users", STRING, "", None,
              "Principals every check allows, `;`-separated (User:admin;User:CN=node,O=shale)."),
    ConfigKey("allow.everyone.if.no.acl.found", BOOLEAN, False, None,
              "With an authorizer: whether a resource no ACL names is open to everyone (Kafka's default, "
              "false, refuses it)."),
)  # fmt: skip

SERVER_CONFIG_KEYS_BY_NAME: Mapping[str, ConfigKey] = MappingProxyType({k.name: k for k in SERVER_CONFIG_KEYS})


class ServerConfigError(InvalidConfigError):
    """An override Shale refuses; the message names the key and the value."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The broker settings, parsed and validated; attributes are the Kafka names with dots as underscores."""

    log_retention_check_interval_ms: int
    log_flush_scheduler_interval_ms: int
    log_flush_offset_checkpoint_interval_ms: int
    log_flush_start_offset_checkpoint_interval_ms: int
    log_initial_task_delay_ms: int
    log_cleaner_enable: bool
    log_cleaner_threads: int
    log_cleaner_dedupe_buffer_size: int
    log_cleaner_io_buffer_load_factor: float
    log_cleaner_io_max_bytes_per_second: float
    log_cleaner_backoff_ms: int
    log_dirs: str
    log_dir_min_free_bytes: int
    log_dir_min_free_ratio: float
    replica_alter_log_dirs_io_max_bytes_per_second: int
    producer_id_expiration_ms: int
    producer_id_expiration_check_interval_ms: int
    group_initial_rebalance_delay_ms: int
    offsets_topic_num_partitions: int
    transaction_state_log_num_partitions: int
    transaction_max_timeout_ms: int
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int
    transactional_id_expiration_ms: int
    delete_topic_enable: bool
    socket_request_max_bytes: int
    queued_max_request_bytes: int
    broker_session_timeout_ms: int
    broker_heartbeat_interval_ms: int
    replica_lag_time_max_ms: int
    auto_leader_rebalance_enable: bool
    leader_imbalance_check_interval_seconds: int
    leader_imbalance_per_broker_percentage: int
    unclean_leader_election_enable: bool
    default_replication_factor: int
    offsets_topic_replication_factor: int
    transaction_state_log_replication_factor: int
    transaction_state_log_min_isr: int
    max_incremental_fetch_session_cache_slots: int
    replica_fetch_wait_max_ms: int
    replica_fetch_min_bytes: int
    replica_fetch_max_bytes: int
    replica_fetch_response_max_bytes: int
    replica_fetch_backoff_ms: int
    leader_replication_throttled_rate: int
    follower_replication_throttled_rate: int
    replication_quota_window_num: int
    replication_quota_window_size_seconds: int
    replica_socket_timeout_ms: int
    authorizer_class_name: str
    super_users: str
    allow_everyone_if_no_acl_found: bool

    def __post_init__(self) -> None:
        for key in SERVER_CONFIG_KEYS:
            try:
                object.__setattr__(self, key.attr, key.parse(getattr(self, key.attr)))
            except ServerConfigError:
                raise
            except InvalidConfigError as e:  # one error type for callers: every broker config problem
                raise ServerConfigError(e.key, e.value, e.rule, str(e)) from None
        factor = self.log_cleaner_io_buffer_load_factor
        if not 0 < factor <= 1:  # CleanerConfig's rule, checked here so the message is a config error
            raise ServerConfigError("log.cleaner.io.buffer.load.factor", factor, "Value must be in (0, 1]")
        session, heartbeat = self.broker_session_timeout_ms, self.broker_heartbeat_interval_ms
        if 3 * heartbeat > session:  # the controller's rule: a leader stops one heartbeat before its session ends
            raise ServerConfigError("broker.heartbeat.interval.ms", heartbeat,
                                    f"Value must be at most a third of broker.session.timeout.ms ({session})")
        try:
            parse_super_users(self.super_users)
        except ValueError as e:
            raise ServerConfigError("super.users", self.super_users, str(e)) from None

    @classmethod
    def from_mapping(cls, overrides: Mapping[str, object]) -> ServerConfig:
        """Kafka's defaults overlaid with `overrides` (Kafka names, string values)."""
        for name, raw in overrides.items():
            if name not in SERVER_CONFIG_KEYS_BY_NAME:
                known = ", ".join(sorted(SERVER_CONFIG_KEYS_BY_NAME))
                raise ServerConfigError(str(name), raw, "Unknown broker config name",
                                        f"Unknown broker config name: {name} (known: {known})")
        return cls(**{k.attr: overrides.get(k.name, k.default) for k in SERVER_CONFIG_KEYS})

    def value_of(self, name: str) -> object:
        return getattr(self, SERVER_CONFIG_KEYS_BY_NAME[name].attr)

    def overrides(self) -> dict[str, str]:
        """The keys that differ from Kafka's defaults, as Kafka strings (logged at startup)."""
        return {k.name: k.to_string(self.value_of(k.name)) for k in SERVER_CONFIG_KEYS
                if self.value_of(k.name) != k.default}

    def free_floor(self) -> FreeFloor:
        return FreeFloor(self.log_dir_min_free_bytes, self.log_dir_min_free_ratio)

    def cleaner_config(self) -> CleanerConfig:
        return CleanerConfig(
            enable=self.log_cleaner_enable,
            threads=self.log_cleaner_threads,
            dedupe_buffer_size=self.log_cleaner_dedupe_buffer_size,
            io_buffer_load_factor=self.log_cleaner_io_buffer_load_factor,
            io_max_bytes_per_second=self.log_cleaner_io_max_bytes_per_second,
            backoff_ms=self.log_cleaner_backoff_ms,
            producer_id_expiration_ms=self.producer_id_expiration_ms,
        )


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    """`key=value` strings (from repeated `--override`) as a mapping; the last of a repeated key wins."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ServerConfigError(item, item, "expected key=value",
                                    f"Invalid --override {item!r}: expected key=value, e.g. log.cleaner.threads=2")
        out[key.strip()] = value
    return out
