"""The two kinds of record the control store holds: a node's registration and a partition's state.

`PartitionRecord` is Kafka's PartitionRecord / LeaderAndIsr tuple (docs/replication.md, "What is stored
where"); both records travel as JSON so that etcd keys and Kubernetes annotations hold the same text, and a
person reading the store with `etcdctl get` or `kubectl get -o yaml` sees field names they know from Kafka.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..log.topic_partition import TopicPartition

NO_LEADER = -1
UNKNOWN_INCARNATION = ""  # an ISR entry written before entries carried one (or by an older node): never checked


class RecordError(ValueError):
    """A store value that is not a valid record; the message names the key it came from."""


@dataclass(frozen=True, slots=True, order=True)
class ListenerAddress:
    """One advertised listener of a node: its name (`CLIENT`, `REPLICATION`...) and where it is reached."""

    name: str
    host: str
    port: int

    @classmethod
    def parse(cls, name: Any, address: Any) -> "ListenerAddress":
        """`host:port` (an IPv6 host keeps its colons: the port is after the last one)."""
        host, sep, port = _str(address).rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"listener {name!r}: {address!r} is not host:port")
        return cls(_str(name), host, int(port))


@dataclass(frozen=True, slots=True)
class NodeRegistration:
    """A live node: its id, which process of it this is (`incarnation`), and where clients reach it.

    `unreplicated` lists the partitions whose local log held records without leader epochs when the process
    started — data written before replication (a single-node cluster that gained a store, or replicas). The
    creator of a missing partition record reads it to make the holder the leader instead of an empty replica
    (docs/replication.md, "Failures"); once a record exists the list no longer matters.

    `listeners` holds every advertised listener (Kafka's broker registration endpoints), so that a request is
    answered with the other nodes' addresses on the listener it came through; `host`/`port` stay the
    inter-broker listener's, which followers connect to. Empty: a node with one listener, or one registered
    before the field existed — its `host`/`port` serve every listener.
    """

    node_id: int
    incarnation: str  # fresh per process start: KIP-903's broker epoch
    host: str
    port: int
    rack: str | None = None
    unreplicated: tuple[TopicPartition, ...] = ()
    listeners: tuple[ListenerAddress, ...] = ()  # sorted by name

    def endpoint(self, listener: str) -> tuple[str, int] | None:
        """This node's host and port on `listener`; None if it does not have that listener."""
        for address in self.listeners:
            if address.name == listener:
                return address.host, address.port
        return None

    def to_json(self) -> str:
        raw = asdict(self)
        raw["unreplicated"] = [[tp.topic, tp.partition] for tp in self.unreplicated]
        if not self.unreplicated:
            del raw["unreplicated"]  # the common case: a registration as short as before
        raw["listeners"] = {a.name: f"{a.host}:{a.port}" for a in self.listeners}
        if not self.listeners:
            del raw["listeners"]
        return json.dumps(raw, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> "NodeRegistration":
        raw = load_object(text, where)
        try:
            rack = raw.get("rack")
            unreplicated = tuple(TopicPartition(_str(topic), _int(partition))
                                 for topic, partition in raw.get("unreplicated", ()))
            listeners = raw.get("listeners", {})
            if not isinstance(listeners, dict):
                raise ValueError(f"listeners {listeners!r} is not an object")
            return cls(_int(raw["node_id"]), str(raw["incarnation"]), str(raw["host"]), _int(raw["port"]),
                       None if rack is None else str(rack), unreplicated,
                       tuple(sorted(ListenerAddress.parse(name, address) for name, address in listeners.items())))
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"{where}: not a node registration ({exc!r}): {text!r}") from None


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """Who leads a partition, in which leader epoch, and which replicas are in sync.

    `partition_epoch` rises on every write (the version Kafka's AlterPartition compares); `leader_epoch`
    rises whenever `leader` changes, to -1 included. `leader_incarnation` names the process that was elected,
    so a node restarted under the same id does not inherit its previous process's leadership.
    `isr_incarnations` (parallel to `isr`) names the process each member was in sync as — KIP-903's
    NewIsrWithEpochs: a member whose node restarted since may have lost what it had not flushed, so it is no
    longer in sync whatever the ISR says (`UNKNOWN_INCARNATION`: a record written before this field).
    `adding_replicas` / `removing_replicas` are KIP-455's: while a reassignment runs, `replicas` is the target
    plus the replicas being removed, and the target is `replicas` without `removing_replicas`
    (reassignment.py has the transitions).
    """

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int = NO_LEADER
    leader_incarnation: str = ""
    leader_epoch: int = 0
    partition_epoch: int = 0
    recovering: bool = False  # elected uncleanly (KIP-704): the ISR stays {leader} until it has recovered
    isr_incarnations: tuple[str, ...] = ()  # () = every member's is unknown
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.isr_incarnations:
            object.__setattr__(self, "isr_incarnations", (UNKNOWN_INCARNATION,) * len(self.isr))
        if len(self.isr_incarnations) != len(self.isr):
            raise RecordError(f"isr {self.isr} has {len(self.isr_incarnations)} incarnations "
                              f"{self.isr_incarnations}, not one per member")
        if not self.replicas or len(set(self.replicas)) != len(self.replicas):
            raise RecordError(f"replicas must be distinct node ids, at least one: {self.replicas}")
        if not set(self.isr) <= set(self.replicas):
            raise RecordError(f"isr {self.isr} is not within replicas {self.replicas}")
        if self.leader != NO_LEADER and self.leader not in self.isr:
            raise RecordError(f"leader {self.leader} is not in the isr {self.isr}")
        if not set(self.adding_replicas) | set(self.removing_replicas) <= set(self.replicas) \
                or set(self.adding_replicas) & set(self.removing_replicas) \
                or len(self.removing_replicas) >= len(self.replicas):
            raise RecordError(f"adding {self.adding_replicas} and removing {self.removing_replicas} must be disjoint "
                              f"parts of replicas {self.replicas}, leaving at least one target replica")

    @property
    def target_replicas(self) -> tuple[int, ...]:
        """The replicas once the reassignment in progress completes (`replicas` when none runs)."""
        return tuple(r for r in self.replicas if r not in self.removing_replicas)

    @property
    def original_replicas(self) -> tuple[int, ...]:
        """The replicas before the reassignment in progress began: what a cancellation goes back to."""
        return tuple(r for r in self.replicas if r not in self.adding_replicas)

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    def isr_incarnation(self, member: int) -> str:
        """The process `member` was in sync as (UNKNOWN_INCARNATION if not recorded); KeyError if not a member."""
        try:
            return self.isr_incarnations[self.isr.index(member)]
        except ValueError:
            raise KeyError(f"node {member} is not in the isr {self.isr}") from None

    def changed(self, **fields: Any) -> "PartitionRecord":
        """This record with `fields` changed and the partition epoch (and, if the leader changed, the leader
        epoch) raised: the one way a record is rewritten, so no writer forgets an epoch. A new `isr` without
        `isr_incarnations` keeps the members' recorded incarnations (newcomers' unknown)."""
        if "isr" in fields and "isr_incarnations" not in fields:
            known = dict(zip(self.isr, self.isr_incarnations))
            fields["isr_incarnations"] = tuple(known.get(r, UNKNOWN_INCARNATION) for r in fields["isr"])
        new = replace(self, **fields, partition_epoch=self.partition_epoch + 1)
        if "leader" in fields or "leader_incarnation" in fields:
            new = replace(new, leader_epoch=self.leader_epoch + 1)
        return new

    def to_json(self) -> str:
        raw = asdict(self)
        for key in ("adding_replicas", "removing_replicas"):
            if not raw[key]:
                del raw[key]  # no reassignment: the record as short as before, and readable by older nodes
        return json.dumps(raw, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> "PartitionRecord":
        raw = load_object(text, where)
        try:
            return cls(tuple(_int(r) for r in raw["replicas"]), tuple(_int(r) for r in raw["isr"]),
                       _int(raw["leader"]), str(raw["leader_incarnation"]), _int(raw["leader_epoch"]),
                       _int(raw["partition_epoch"]), bool(raw.get("recovering", False)),
                       tuple(_str(i) for i in raw.get("isr_incarnations", ())),  # absent: an older record
                       tuple(_int(r) for r in raw.get("adding_replicas", ())),
                       tuple(_int(r) for r in raw.get("removing_replicas", ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"{where}: not a partition record ({exc}): {text!r}") from None


def load_object(text: str | bytes, where: str) -> dict[str, Any]:
    """A store value as a JSON object, or RecordError naming `where`."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise RecordError(f"{where}: not JSON ({exc}): {text!r}") from None
    if not isinstance(raw, dict):
        raise RecordError(f"{where}: a record is a JSON object, got {text!r}")
    return raw


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string")
    return value


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not an integer")
    return value
