"""The LRU of open segment files: descriptors stay within the capacity whatever the number of segments, a
descriptor in use is never closed (nor its number reused) under its user, and every segment stays readable
and writable after its file was closed for others."""

from __future__ import annotations

import errno
import os
import random
import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shale.sidecar.log.open_files import SEGMENT_FILES, OpenFile, OpenFiles
from shale.sidecar.log.records import Record, decode_batch, encode_batch
from shale.sidecar.log.segment import DELETED_SUFFIX, LogSegment


@pytest.fixture
def small_lru():
    """The process's segment-file LRU held to 4 descriptors for the test."""
    before = SEGMENT_FILES._capacity
    SEGMENT_FILES.capacity = 4
    yield SEGMENT_FILES
    SEGMENT_FILES.capacity = before


def _segment(directory, base: int = 0) -> LogSegment:
    os.makedirs(directory, exist_ok=True)
    return LogSegment(str(directory), base, index_interval_bytes=0, max_index_size=4096, now_ms=lambda: 0)


def _batch(offset: int, value: bytes) -> bytes:
    return encode_batch([Record(offset, 1000 + offset, None, value)])


def _append(seg: LogSegment, offset: int, value: bytes) -> None:
    seg.append(offset, 1000 + offset, offset, _batch(offset, value))


def _values(seg: LogSegment) -> list[bytes]:
    return [r.value for b in seg.batches() for r in decode_batch(seg.read_bytes(b.position, b.size)).records]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_more_segments_than_descriptors_all_readable_and_writable(tmp_path, small_lru):
    """40 segments through an LRU of 4: every append and read lands in its own file, and the process holds
    no more descriptors for 40 segments than for 4."""
    fds_before = _open_fds()
    segments = [_segment(tmp_path / f"t-{i}") for i in range(40)]
    assert small_lru.open_count <= 4
    assert _open_fds() - fds_before <= 4
    for round_ in range(3):  # round-robin: every use of a segment finds its file closed by the others
        for i, seg in enumerate(segments):
            _append(seg, round_, b"p%d-r%d" % (i, round_))
            assert small_lru.open_count <= 4
    for i, seg in enumerate(segments):
        assert _values(seg) == [b"p%d-r%d" % (i, r) for r in range(3)]
        assert seg.read(1, 1 << 20).read() == _batch(1, b"p%d-r1" % i) + _batch(2, b"p%d-r2" % i)
    assert _open_fds() - fds_before <= 4
    evictions = small_lru.evictions
    for seg in segments:
        seg.flush()  # fsync reopens a closed file too
    assert small_lru.evictions > evictions
    for seg in segments:
        seg.close()
    assert _open_fds() <= fds_before


def test_a_walk_holds_its_descriptor_while_others_are_opened(tmp_path, small_lru):
    """A batch walk in progress keeps its file open while more segments than the capacity are used."""
    walked = _segment(tmp_path / "walked")
    for o in range(3):
        _append(walked, o, b"w%d" % o)
    others = [_segment(tmp_path / f"other-{i}") for i in range(8)]
    walk = walked.batches()
    first = next(walk)
    for i, seg in enumerate(others):  # opening 8 files would evict `walked` if the walk did not hold it
        _append(seg, 0, b"o%d" % i)
    rest = list(walk)
    assert [b.header.base_offset for b in [first, *rest]] == [0, 1, 2]
    assert [_values(s) for s in others] == [[b"o%d" % i] for i in range(8)]


def test_renamed_while_closed_reopens_by_its_new_name(tmp_path, small_lru):
    seg = _segment(tmp_path / "renamed", 5)
    _append(seg, 5, b"kept")
    for i in range(6):  # push its descriptor out
        _append(_segment(tmp_path / f"push-{i}"), 0, b"x")
    seg.change_suffix("", DELETED_SUFFIX)
    assert seg.log_path.endswith(".log" + DELETED_SUFFIX) and os.path.exists(seg.log_path)
    assert _values(seg) == [b"kept"]


def test_closed_segment_file_is_not_reopened(tmp_path):
    seg = _segment(tmp_path / "closed")
    _append(seg, 0, b"v")
    seg.close()
    with pytest.raises(OSError) as info:
        seg.read_bytes(0, 10)
    assert info.value.errno == errno.EBADF


def test_threads_reading_through_a_tiny_lru_always_read_their_own_file(tmp_path):
    """Four threads read 12 files through an LRU of 2: evictions by one thread never close, or reuse the
    number of, a descriptor another thread is reading (each read is checked against its file's bytes)."""
    lru = OpenFiles(capacity=2)
    files = []
    for i in range(12):
        path = tmp_path / f"f{i}"
        path.write_bytes(bytes([i]) * 4096)
        files.append(OpenFile(str(path)))
    errors: list[str] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(400):
            i = rng.randrange(len(files))
            with lru.use(files[i]) as fd:
                for _ in range(3):
                    data = os.pread(fd, 4096, 0)
                    if data != bytes([i]) * 4096:
                        errors.append(f"file {i} read {data[:4]!r}")
                        return

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert lru.open_count <= 2 and lru.evictions > 0


class LruMachine(RuleBasedStateMachine):
    """Acquire, release and use files in any order: the open descriptors never exceed the capacity (or the
    files held, when more are held), a held descriptor always reads its own file, a released one may go."""

    @initialize(capacity=st.integers(1, 4))
    def setup(self, capacity: int) -> None:
        import tempfile
        self.dir = tempfile.TemporaryDirectory()
        self.lru = OpenFiles(capacity=capacity)
        self.files = []
        for i in range(6):
            path = os.path.join(self.dir.name, f"f{i}")
            with open(path, "wb") as f:
                f.write(b"%d" % i)
            self.files.append(OpenFile(path))
        self.held: dict[int, int] = {}  # file -> times held

    @rule(i=st.integers(0, 5))
    def acquire(self, i: int) -> None:
        fd = self.lru.acquire(self.files[i])
        assert os.pread(fd, 8, 0) == b"%d" % i
        self.held[i] = self.held.get(i, 0) + 1

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data) -> None:
        i = data.draw(st.sampled_from(sorted(self.held)))
        self.lru.release(self.files[i])
        self.held[i] -= 1
        if not self.held[i]:
            del self.held[i]

    @rule(i=st.integers(0, 5))
    def use(self, i: int) -> None:
        with self.lru.use(self.files[i]) as fd:
            assert os.pread(fd, 8, 0) == b"%d" % i

    @invariant()
    def bounded_and_held_files_open(self) -> None:
        if not hasattr(self, "lru"):
            return
        assert self.lru.open_count <= max(self.lru.capacity, len(self.held))
        for i in self.held:
            assert os.pread(self.files[i].fd, 8, 0) == b"%d" % i

    def teardown(self) -> None:
        if hasattr(self, "lru"):
            for f in self.files:
                self.lru.close(f)
            self.dir.cleanup()


TestLruMachine = LruMachine.TestCase
TestLruMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_index_maps_keep_no_descriptor(tmp_path):
    """A map made by map_file works after its file's descriptor is closed and holds none of its own."""
    import mmap as mmap_module

    from shale.sidecar.log.open_files import map_file

    path = tmp_path / "index"
    path.write_bytes(bytes(8192))
    fds_before = set(os.listdir("/proc/self/fd"))
    fd = os.open(path, os.O_RDWR)
    m = map_file(fd, 8192)
    os.close(fd)
    assert set(os.listdir("/proc/self/fd")) == fds_before
    m[100:104] = b"abcd"
    m.flush()
    assert path.read_bytes()[100:104] == b"abcd"
    m.close()
    with pytest.raises(ValueError):
        m[0]
    with open(path, "rb") as f:
        ro = map_file(f.fileno(), 8192, access=mmap_module.ACCESS_READ)
    assert ro[100:104] == b"abcd" and set(os.listdir("/proc/self/fd")) == fds_before
    ro.close()


def test_a_file_closed_while_in_use_keeps_its_descriptor_until_let_go(tmp_path):
    """Closing a segment while another thread reads it: the reader's descriptor stays valid (its number is
    not reused by the next open), new users get EBADF, and the descriptor goes when the reader lets go."""
    lru = OpenFiles(capacity=4)
    path = tmp_path / "held"
    path.write_bytes(b"held bytes")
    f = OpenFile(str(path))
    fd = lru.acquire(f)
    lru.close(f)
    other = tmp_path / "other"
    other.write_bytes(b"other")
    g = OpenFile(str(other))
    assert lru.acquire(g) != fd
    assert os.pread(fd, 10, 0) == b"held bytes"
    with pytest.raises(OSError) as info:
        lru.acquire(f)
    assert info.value.errno == errno.EBADF
    lru.release(f)
    assert f.fd == -1 and lru.open_count == 1  # closed by the release; g stays open
