"""How many more partitions this process can hold, so that a topic that would not fit is refused whole.

Segment files are opened on demand and the least recently used closed (`open_files`), so descriptors no
longer grow with the number of partitions. What still does: the active segment of every partition maps its
two index files, preallocated to `segment.index.bytes` each. That is two memory maps per partition against
the kernel's `vm.max_map_count`, and twice `segment.index.bytes` of address space against RLIMIT_AS when
the process runs under one. Running out of either fails a partition's creation half-way (mmap: ENOMEM), so
the registry asks here first, and refuses with this module's reason.
"""

from __future__ import annotations

import resource

MAPS_PER_PARTITION = 2  # the active segment's .index and .timeindex
MAP_RESERVE = 1024  # maps kept for the rest of the process: threads, malloc arenas, later segment rolls
ADDRESS_RESERVE = 256 << 20  # address space kept for the rest of the process (heap growth, threads)

MAX_MAP_COUNT = "/proc/sys/vm/max_map_count"
SELF_MAPS = "/proc/self/maps"
SELF_STATUS = "/proc/self/status"


def partitions_refusal(count: int, index_bytes: int) -> str | None:
    """Why `count` more partitions with indexes of `index_bytes` do not fit in this process; None if they do."""
    limit = _read_int(MAX_MAP_COUNT)
    if limit is not None:
        used = _line_count(SELF_MAPS)
        room = max(0, (limit - MAP_RESERVE - used) // MAPS_PER_PARTITION)
        if count > room:
            return (f"{count} new partitions need {count * MAPS_PER_PARTITION} memory maps, this node has room "
                    f"for {room} more partitions (vm.max_map_count {limit}, {used} maps in use)")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        used = _vm_size()
        per_partition = MAPS_PER_PARTITION * index_bytes
        room = max(0, (soft - ADDRESS_RESERVE - used) // per_partition)
        if count > room:
            return (f"{count} new partitions map {per_partition} bytes of index each (segment.index.bytes "
                    f"{index_bytes}), this node has room for {room} more partitions (address space limit "
                    f"{soft} bytes, {used} in use)")
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None  # not Linux, or not readable here: no limit known


def _line_count(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def _vm_size() -> int:
    with open(SELF_STATUS, encoding="ascii") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0
