/*
 * A leader's produced record set in C: the record-framing walk of produce validation (records.py), the whole
 * check and offset assignment of a set (Log.append's `prepare_produce`), and a single replica's whole append of
 * one to the active segment (Log.append_in_c). Python stays authoritative: each function declines (False or None,
 * nothing changed) whatever Python's path could decide otherwise or must name, and Python decides it.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "_record_format.h"

/* ---------------------------------------------------------------------------------------------
 * Produce validation (records.py: check_record_framing): the same varint walk, no map.
 */

/* True if exactly `count` well-formed records fill [p, end), each with a key if `require_key`, each timestamp
 * (base_ts + delta) in [ts_lo, ts_hi]. */
static int records_ok(const uint8_t *p, const uint8_t *end, Py_ssize_t count, int require_key, int64_t base_ts,
                      int64_t ts_lo, int64_t ts_hi) {
    if (count < 0)
        return 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t length, ts_delta, offset_delta, n, ts;
        const uint8_t *field;
        if (read_varint(&p, end, 5, &length) || length <= 0 || length > end - p)
            return 0;
        const uint8_t *rend = p + length;
        p++; /* attributes, unused */
        if (read_varint(&p, rend, 10, &ts_delta) || read_varint(&p, rend, 5, &offset_delta))
            return 0;
        if (__builtin_add_overflow(base_ts, ts_delta, &ts) || ts < ts_lo || ts > ts_hi)
            return 0;
        if (read_nullable(&p, rend, &field, &n) || (require_key && n < 0))
            return 0;
        if (read_nullable(&p, rend, &field, &n) || read_varint(&p, rend, 5, &n) || n < 0)
            return 0;
        for (int64_t h = 0; h < n; h++) {
            int64_t hk, hv;
            if (read_nullable(&p, rend, &field, &hk) || hk < 0 || read_nullable(&p, rend, &field, &hv))
                return 0;
        }
        if (p != rend)
            return 0;
    }
    return p == end;
}

/* records_check(data, count, require_key, base_ts, ts_lo, ts_hi) -> True if exactly `count` well-formed
 * records fill `data`, each with a key if `require_key`, each timestamp (base_ts + delta) in [ts_lo, ts_hi].
 * Produce validation (Kafka's LogValidator) without building a Record per record: False only means
 * "let Python decode and name the fault" (records.py: check_records), never a verdict of its own. */
static PyObject *records_check(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t count;
    int require_key;
    long long base_ts, ts_lo, ts_hi;
    if (!PyArg_ParseTuple(args, "y*npLLL", &buf, &count, &require_key, &base_ts, &ts_lo, &ts_hi))
        return NULL;
    const uint8_t *p = buf.buf;
    int ok = records_ok(p, p + buf.len, count, require_key, base_ts, ts_lo, ts_hi);
    PyBuffer_Release(&buf);
    return PyBool_FromLong(ok);
}

/* ---------------------------------------------------------------------------------------------
 * A leader's append of a produced record set (log.py: Log.append), the common case in one call.
 */

/* prepare_produce(buf, next_offset, epoch, max_set_bytes, max_batch_bytes, require_key, ts_lo, ts_hi, crc32c)
 *   -> (last_offset, max_timestamp, max_timestamp_offset, batches, producer_batches), or None.
 *
 * Checks a produced set of v2 batches as parse_batch_set and Log._validate do (framing, magic, CRC-32C through
 * the `crc32c` function given, the size limits, records count against offset range, every record's framing,
 * keys and CreateTime bounds) and, when every batch passes, gives them offsets from `next_offset` on and
 * stamps `epoch` as each batch's partition leader epoch, in `buf` (a bytearray: the log's own copy).
 * `producer_batches` is None when no batch has a producer id, else a list with, per such batch, the fields of
 * producer_state.ProducerBatch at the new offsets (producer id, epoch, base and last sequence, first and last
 * offset, max timestamp, transactional); producer state itself stays in Python. None, with `buf` untouched,
 * whenever Python's path could decide otherwise or has more to do: a fault (Python names it), a control,
 * compressed or LogAppendTime batch, a transactional one without a producer id, a batch without records, an
 * empty set. */
/* The fields of producer_state.ProducerBatch for the batch at `h`, given `first` .. `last` as its offsets. */
static PyObject *producer_batch(const uint8_t *h, int64_t first, int64_t last) {
    const int64_t base_seq = (int32_t)be32(h + 53);
    /* records.BatchHeader.last_sequence: Kafka's incrementSequence, wrapping past Int.MAX to 0 (Python's %) */
    int64_t last_seq = -1;
    if (base_seq != -1) {
        last_seq = (base_seq + (last - first)) % 2147483648LL;
        if (last_seq < 0)
            last_seq += 2147483648LL;
    }
    return Py_BuildValue("(LiLLLLLO)", (long long)be64s(h + 43), (int)(int16_t)((h[51] << 8) | h[52]),
                         (long long)base_seq, (long long)last_seq, (long long)first, (long long)last,
                         (long long)be64s(h + 35), (((h[21] << 8) | h[22]) & ATTR_TRANSACTIONAL) ? Py_True : Py_False);
}

/* What prepare() found: the set's last offset, largest timestamp and the last offset of its batch, batches. */
typedef struct {
    int64_t last_offset, max_ts, max_ts_offset;
    Py_ssize_t batches;
} prepared_t;

/* prepare_produce's work on `data[0:end]`: 1 when the set passed (offsets and epoch written, `*producers` a new
 * list or left NULL when no batch has a producer id), 0 to decline with `data` untouched, -1 with an exception. */
static int prepare(uint8_t *data, Py_ssize_t end, int64_t next_offset, int epoch, Py_ssize_t max_set,
                   Py_ssize_t max_batch, int require_key, int64_t ts_lo, int64_t ts_hi, PyObject *crc_fn,
                   PyObject **producers, prepared_t *out) {
    *producers = NULL;
    if (end == 0 || end > max_set)
        return 0;
    Py_ssize_t pos = 0, batches = 0;
    int64_t offset = next_offset;
    while (pos < end) { /* every check, and the producer batches, before any byte changes */
        if (end - pos < BATCH_OVERHEAD)
            goto decline;
        const uint8_t *h = data + pos;
        const Py_ssize_t size = LOG_OVERHEAD + (int32_t)be32(h + 8);
        const int attributes = (h[21] << 8) | h[22];
        const int64_t last_delta = (int32_t)be32(h + 23), count = (int32_t)be32(h + 57), producer_id = be64s(h + 43);
        if (size < BATCH_OVERHEAD || size > end - pos || size > max_batch || h[16] != 2 || count < 1 ||
            count != last_delta + 1 || (attributes & (ATTR_COMPRESSION | ATTR_TIMESTAMP_TYPE | ATTR_CONTROL)) ||
            ((attributes & ATTR_TRANSACTIONAL) && producer_id < 0))
            goto decline;
        if (!records_ok(h + BATCH_OVERHEAD, h + size, count, require_key, be64s(h + 27), ts_lo, ts_hi))
            goto decline;
        PyObject *view = PyMemoryView_FromMemory((char *)h + 21, size - 21, PyBUF_READ);
        if (view == NULL)
            goto fail;
        PyObject *crc = PyObject_CallOneArg(crc_fn, view);
        Py_DECREF(view);
        if (crc == NULL)
            goto fail;
        const unsigned long computed = PyLong_AsUnsignedLong(crc);
        Py_DECREF(crc);
        if (computed == (unsigned long)-1 && PyErr_Occurred())
            goto fail;
        if (computed != be32(h + 17))
            goto decline;
        if (producer_id >= 0) {
            PyObject *item = producer_batch(h, offset, offset + last_delta);
            if (item == NULL || (*producers == NULL && (*producers = PyList_New(0)) == NULL) ||
                PyList_Append(*producers, item) < 0) {
                Py_XDECREF(item);
                goto fail;
            }
            Py_DECREF(item);
        }
        offset += last_delta + 1;
        pos += size;
        batches++;
    }
    int64_t last = -1, max_ts = -1, max_ts_offset = -1;
    offset = next_offset;
    for (pos = 0; pos < end;) {
        uint8_t *h = data + pos;
        const int64_t batch_max_ts = be64s(h + 35);
        last = offset + (int32_t)be32(h + 23);
        put_be64(h, (uint64_t)offset);
        put_be32(h + 12, (uint32_t)epoch);
        if (batch_max_ts > max_ts) {
            max_ts = batch_max_ts;
            max_ts_offset = last;
        }
        offset = last + 1;
        pos += LOG_OVERHEAD + (int32_t)be32(h + 8);
    }
    *out = (prepared_t){last, max_ts, max_ts_offset, batches};
    return 1;
decline:
    Py_CLEAR(*producers);
    return 0;
fail:
    Py_CLEAR(*producers);
    return -1;
}

static PyObject *prepare_produce(PyObject *self, PyObject *args) {
    PyObject *o_buf, *crc_fn, *producers;
    long long next_offset, ts_lo, ts_hi;
    int epoch, require_key;
    Py_ssize_t max_set, max_batch;
    prepared_t found;
    if (!PyArg_ParseTuple(args, "YLinnpLLO", &o_buf, &next_offset, &epoch, &max_set, &max_batch, &require_key,
                          &ts_lo, &ts_hi, &crc_fn))
        return NULL;
    const int ok = prepare((uint8_t *)PyByteArray_AS_STRING(o_buf), PyByteArray_GET_SIZE(o_buf), next_offset, epoch,
                           max_set, max_batch, require_key, ts_lo, ts_hi, crc_fn, &producers, &found);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *result = Py_BuildValue("(LLLnO)", (long long)found.last_offset, (long long)found.max_ts,
                                     (long long)found.max_ts_offset, found.batches,
                                     producers != NULL ? producers : Py_None);
    Py_XDECREF(producers);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * A leader's whole append of a produced record set to the active segment (log.py: Log.append with
 * segment.py: LogSegment.append), when nothing but the segment's bytes and a few counters change.
 *
 * The state it reads and changes is declared in append_state.py, slots of the Python objects' base classes (one
 * source of truth), and read here at those slots' offsets: declare_state(), which log.py calls once with the
 * declared classes, finds every field named below among the slots of its class and fails (TypeError) when one is
 * missing, so a renamed field fails at import instead of going unnoticed. Before it, append_produced refuses.
 */

/* The declared classes, in declare_state's order. */
enum { T_LOG, T_SEGMENT, T_INDEX, T_EPOCHS, T_LIMITS, N_TYPES };
static const char *const type_text[N_TYPES] = {
    "LogAppendState", "SegmentAppendState", "IndexAppendState", "EpochCacheAppendState", "AppendLimits",
};
static PyTypeObject *types[N_TYPES];

/* The fields this code reads or writes, each of its declared class, and their slots' offsets. */
enum {
    DF_LOCK, DF_STORAGE_FAILURE, DF_LEADER_EPOCH_CACHE, DF_LIMITS, DF_CLOCK, DF_LOG_END_OFFSET, DF_RECOVERY_POINT, DF_SEGMENTS,
    DF_FILE, DF_BASE_OFFSET, DF_SIZE, DF_CREATED_MS, DF_ROLL_JITTER_MS, DF_INDEX_INTERVAL_BYTES, DF_SINCE_INDEX_ENTRY,
    DF_ROLLING_TS, DF_MAX_TS, DF_OFFSET_INDEX, DF_TIME_INDEX,
    DF_MM, DF_ENTRIES, DF_MAX_ENTRIES, DF_RESERVED, DF_WRITABLE,
    DF_DIRTY,
    DF_CREATE_TIME, DF_BEFORE_MAX_MS, DF_AFTER_MAX_MS, DF_SEGMENT_BYTES, DF_MAX_MESSAGE_BYTES, DF_COMPACT, DF_MAX_SEGMENT_MS,
    DF_FLUSH_MESSAGES, N_DECLARED
};
static const struct {
    int type;
    const char *name;
} declared[N_DECLARED] = {
    {T_LOG, "lock"}, {T_LOG, "storage_failure"}, {T_LOG, "leader_epoch_cache"}, {T_LOG, "limits"}, {T_LOG, "clock"},
    {T_LOG, "log_end_offset"}, {T_LOG, "recovery_point"}, {T_LOG, "segments"},
    {T_SEGMENT, "file"}, {T_SEGMENT, "base_offset"}, {T_SEGMENT, "size"}, {T_SEGMENT, "created_ms"},
    {T_SEGMENT, "roll_jitter_ms"}, {T_SEGMENT, "index_interval_bytes"}, {T_SEGMENT, "bytes_since_last_index_entry"},
    {T_SEGMENT, "rolling_ts"}, {T_SEGMENT, "max_ts"}, {T_SEGMENT, "offset_index"}, {T_SEGMENT, "time_index"},
    {T_INDEX, "mm"}, {T_INDEX, "entries"}, {T_INDEX, "max_entries"}, {T_INDEX, "reserved"}, {T_INDEX, "writable"},
    {T_EPOCHS, "dirty"},
    {T_LIMITS, "create_time"}, {T_LIMITS, "timestamp_before_max_ms"}, {T_LIMITS, "timestamp_after_max_ms"},
    {T_LIMITS, "segment_bytes"}, {T_LIMITS, "max_message_bytes"}, {T_LIMITS, "compact"}, {T_LIMITS, "max_segment_ms"},
    {T_LIMITS, "flush_messages"},
};
static Py_ssize_t offsets[N_DECLARED];

/* The names of the methods called: the lock's and open_files.SEGMENT_FILES'. */
enum { N_ACQUIRE, N_RELEASE, N_NAMES };
static const char *const name_text[N_NAMES] = {"acquire", "release"};
static PyObject *names[N_NAMES];

/* declare_state(LogAppendState, SegmentAppendState, IndexAppendState, EpochCacheAppendState, AppendLimits):
 * the offset of every field's slot. */
static PyObject *declare_state(PyObject *self, PyObject *args) {
    PyTypeObject *given[N_TYPES];
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!", &PyType_Type, &given[0], &PyType_Type, &given[1], &PyType_Type,
                          &given[2], &PyType_Type, &given[3], &PyType_Type, &given[4]))
        return NULL;
    for (int t = 0; t < N_TYPES; t++)
        if (strcmp(given[t]->tp_name, type_text[t]) != 0)
            return PyErr_Format(PyExc_TypeError, "declare_state: argument %d is %s, not %s", t + 1, given[t]->tp_name,
                                type_text[t]);
    Py_ssize_t found[N_DECLARED]; /* taken only when every field is found */
    for (int f = 0; f < N_DECLARED; f++) {
        PyObject *d = PyObject_GetAttrString((PyObject *)given[declared[f].type], declared[f].name);
        if (d == NULL)
            return NULL;
        const int slot = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                         ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
        if (slot)
            found[f] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!slot)
            return PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type_text[declared[f].type], declared[f].name);
    }
    memcpy(offsets, found, sizeof offsets);
    for (int t = 0; t < N_TYPES; t++)
        Py_XSETREF(types[t], (PyTypeObject *)Py_NewRef(given[t]));
    Py_RETURN_NONE;
}

/* 1 if `obj` is an instance of the declared class `t`, else -1 with a TypeError. */
static int is_declared(PyObject *obj, int t) {
    if (LIKELY(PyObject_TypeCheck(obj, types[t])))
        return 1;
    PyErr_Format(PyExc_TypeError, "the C append reads a %s, not a %s", type_text[t], Py_TYPE(obj)->tp_name);
    return -1;
}

/* The declared field `f` of `obj` (an instance of its class): a borrowed reference, or NULL with an
 * AttributeError when the slot is unset. */
static inline PyObject *field(PyObject *obj, int f) {
    PyObject *v = *(PyObject **)((char *)obj + offsets[f]);
    if (UNLIKELY(v == NULL))
        PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%s'", Py_TYPE(obj)->tp_name,
                     declared[f].name);
    return v;
}

/* Sets the declared field `f` of `obj` to `value`, a reference it takes (NULL: -1, the error set). */
static int set_field(PyObject *obj, int f, PyObject *value) {
    if (value == NULL)
        return -1;
    Py_XSETREF(*(PyObject **)((char *)obj + offsets[f]), value);
    return 0;
}

/* The field as an int64 into `*out`: 1, or 0 (decline) when it does not fit or is not an int, -1 on error. */
static int field_i64(PyObject *obj, int f, int64_t *out) {
    PyObject *v = field(obj, f);
    if (v == NULL)
        return -1;
    if (!PyLong_Check(v))
        return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (*out == -1 && PyErr_Occurred())
        return -1;
    return !overflow;
}

/* The field is truthy (1), falsy (0) or could not be read (-1). */
static int field_true(PyObject *obj, int f) {
    PyObject *v = field(obj, f);
    return v == NULL ? -1 : PyObject_IsTrue(v);
}

/* One of the active segment's indexes (index.py: MmapIndex): its counters, and its map while an entry is due. */
typedef struct {
    PyObject *obj;
    int64_t entries, max_entries, reserved;
    Py_buffer map; /* map.obj is NULL unless held */
} index_t;

/* Everything Log.append reads for a produced set, as ints; segment and index state of the active segment. */
typedef struct {
    int64_t ts_before, ts_after, segment_bytes, max_message_bytes, max_segment_ms, flush_messages;
    int64_t log_end_offset, recovery_point, now;
    int64_t size, rolling_ts, created_ms, jitter, since_index, index_interval, max_ts, max_ts_offset, base_offset;
    index_t offsets, times;
    int compact;
} append_state_t;

#define TRY(call)              \
    do {                       \
        const int r_ = (call); \
        if (r_ <= 0)           \
            return r_;         \
    } while (0)

/* Reads the topic's limits into `st`: 1, 0 to decline (LogAppendTime, a value beyond int64), -1 on error. */
static int read_limits(PyObject *limits, append_state_t *st) {
    TRY(is_declared(limits, T_LIMITS));
    TRY(field_true(limits, DF_CREATE_TIME)); /* LogAppendTime rewrites every batch's timestamp and CRC: Python's */
    TRY(field_i64(limits, DF_BEFORE_MAX_MS, &st->ts_before));
    TRY(field_i64(limits, DF_AFTER_MAX_MS, &st->ts_after));
    TRY(field_i64(limits, DF_SEGMENT_BYTES, &st->segment_bytes));
    TRY(field_i64(limits, DF_MAX_MESSAGE_BYTES, &st->max_message_bytes));
    TRY(field_i64(limits, DF_MAX_SEGMENT_MS, &st->max_segment_ms));
    TRY(field_i64(limits, DF_FLUSH_MESSAGES, &st->flush_messages));
    st->compact = field_true(limits, DF_COMPACT);
    return st->compact < 0 ? -1 : 1;
}

/* Reads one index's counters (`idx->obj` set by the caller). */
static int read_index(index_t *idx) {
    TRY(is_declared(idx->obj, T_INDEX));
    TRY(field_i64(idx->obj, DF_ENTRIES, &idx->entries));
    return field_i64(idx->obj, DF_MAX_ENTRIES, &idx->max_entries);
}

/* Takes the map of an index that gets an entry of `entry_size` bytes: 1, or 0 to decline when Python has more to
 * do first (allocate the entry's page, reopen a closed or read-only index). */
static int hold_map(index_t *idx, int64_t entry_size) {
    TRY(field_i64(idx->obj, DF_RESERVED, &idx->reserved));
    if ((idx->entries + 1) * entry_size > idx->reserved) /* MmapIndex.reserve: a page at a time, Python's */
        return 0;
    TRY(field_true(idx->obj, DF_WRITABLE));
    PyObject *mm = field(idx->obj, DF_MM);
    if (mm == NULL)
        return -1;
    if (mm == Py_None)
        return 0;
    if (PyObject_GetBuffer(mm, &idx->map, PyBUF_WRITABLE) < 0)
        return -1;
    if (idx->map.len < (idx->entries + 1) * entry_size) {
        PyBuffer_Release(&idx->map);
        return 0;
    }
    return 1;
}

static void drop_index(index_t *idx) {
    if (idx->map.obj != NULL)
        PyBuffer_Release(&idx->map);
    Py_CLEAR(idx->obj);
}

/* Reads the active segment's write state into `st`: 1, 0 to decline (a state Python fills in lazily), -1. */
static int read_segment(PyObject *seg, append_state_t *st) {
    TRY(is_declared(seg, T_SEGMENT));
    TRY(field_i64(seg, DF_SIZE, &st->size));
    TRY(field_i64(seg, DF_ROLLING_TS, &st->rolling_ts)); /* None until the first batch's timestamp is read */
    TRY(field_i64(seg, DF_CREATED_MS, &st->created_ms));
    TRY(field_i64(seg, DF_ROLL_JITTER_MS, &st->jitter));
    TRY(field_i64(seg, DF_SINCE_INDEX_ENTRY, &st->since_index));
    TRY(field_i64(seg, DF_INDEX_INTERVAL_BYTES, &st->index_interval));
    TRY(field_i64(seg, DF_BASE_OFFSET, &st->base_offset));
    PyObject *max_ts = field(seg, DF_MAX_TS); /* (timestamp, offset), None until loaded */
    if (max_ts == NULL)
        return -1;
    if (!PyTuple_Check(max_ts) || PyTuple_GET_SIZE(max_ts) != 2)
        return 0;
    int o1, o2;
    st->max_ts = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(max_ts, 0), &o1);
    st->max_ts_offset = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(max_ts, 1), &o2);
    if (PyErr_Occurred())
        return -1;
    if (o1 || o2)
        return 0;
    PyObject *offsets_obj = field(seg, DF_OFFSET_INDEX), *times_obj = field(seg, DF_TIME_INDEX);
    if (offsets_obj == NULL || times_obj == NULL)
        return -1;
    st->offsets.obj = Py_NewRef(offsets_obj);
    st->times.obj = Py_NewRef(times_obj);
    TRY(read_index(&st->offsets));
    return read_index(&st->times);
}

/* Reads what the append needs from the log; `*seg` gets the active segment (a new reference) on 1. */
static int read_log(PyObject *log, PyObject *wall_clock, append_state_t *st, PyObject **seg) {
    PyObject *failure = field(log, DF_STORAGE_FAILURE);
    if (failure == NULL)
        return -1;
    if (failure != Py_None) /* Python's path takes the next append and logs the recovery */
        return 0;
    PyObject *cache = field(log, DF_LEADER_EPOCH_CACHE);
    if (cache == NULL)
        return -1;
    TRY(is_declared(cache, T_EPOCHS));
    const int dirty = field_true(cache, DF_DIRTY); /* a failed checkpoint write, retried before the next append */
    if (dirty != 0)
        return dirty < 0 ? -1 : 0;
    PyObject *limits = field(log, DF_LIMITS);
    if (limits == NULL)
        return -1;
    TRY(read_limits(limits, st));
    TRY(field_i64(log, DF_LOG_END_OFFSET, &st->log_end_offset));
    TRY(field_i64(log, DF_RECOVERY_POINT, &st->recovery_point));
    PyObject *clock = field(log, DF_CLOCK);
    if (clock == NULL)
        return -1;
    if (clock == wall_clock) { /* log.now_ms, read here: time.time_ns() // 1_000_000 */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        st->now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    } else {
        Py_INCREF(clock); /* held while it runs: it may set log.clock */
        PyObject *now = PyObject_CallNoArgs(clock);
        Py_DECREF(clock);
        if (now == NULL)
            return -1;
        st->now = PyLong_AsLongLong(now);
        Py_DECREF(now);
        if (st->now == -1 && PyErr_Occurred())
            return -1;
    }
    PyObject *segments = field(log, DF_SEGMENTS);
    if (segments == NULL)
        return -1;
    if (!PyList_Check(segments) || PyList_GET_SIZE(segments) == 0)
        return 0;
    *seg = Py_NewRef(PyList_GET_ITEM(segments, PyList_GET_SIZE(segments) - 1));
    return read_segment(*seg, st);
}

/* pwrite all of `data` at `position` of the descriptor `files.acquire(file)` gives, pinned while it writes:
 * 1 when all of it is written, 0 when it is not (the caller declines; Python writes the same range again and
 * reports the error), -1 when releasing the descriptor failed. */
static int write_pinned(PyObject *files, PyObject *file, const uint8_t *data, Py_ssize_t n, int64_t position) {
    PyObject *fd_obj = PyObject_CallMethodOneArg(files, names[N_ACQUIRE], file);
    if (fd_obj == NULL) { /* closed for good, or no descriptor to be had: Python meets it and names it */
        PyErr_Clear();
        return 0;
    }
    const long fd = PyLong_AsLong(fd_obj);
    Py_DECREF(fd_obj);
    Py_ssize_t done = 0;
    if (!(fd == -1 && PyErr_Occurred())) {
        Py_BEGIN_ALLOW_THREADS /* as os.pwrite: other threads run while the kernel copies */
        while (done < n) {
            const ssize_t w = pwrite((int)fd, data + done, (size_t)(n - done), (off_t)(position + done));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                break;
            done += w;
        }
        Py_END_ALLOW_THREADS
    }
    PyErr_Clear();
    PyObject *released = PyObject_CallMethodOneArg(files, names[N_RELEASE], file);
    if (released == NULL)
        return -1;
    Py_DECREF(released);
    return done == n;
}

/* The sparse index entries an append at `position` writes (LogSegment._append): the offset index maps the set's
 * last offset to its position; the time index gets the segment's largest timestamp when it grew. 1, or 0 when
 * OffsetIndex.append or TimeIndex.maybe_append would refuse (Python raises and names it). Checked before the
 * write (`write` 0) and done after it (`write` 1), so a refused entry leaves the log unchanged. */
static int index_entries(append_state_t *st, int64_t last_offset, int64_t position, int64_t max_ts,
                         int64_t max_ts_offset, int write) {
    index_t *o = &st->offsets, *t = &st->times;
    const uint8_t *om = o->map.buf, *tm = t->map.buf;
    if (o->entries > 0 && last_offset <= st->base_offset + (int32_t)be32(om + (o->entries - 1) * 8))
        return 0;
    int64_t last_ts = -1, last_ts_offset = st->base_offset;
    if (t->entries > 0) {
        last_ts = be64s(tm + (t->entries - 1) * 12);
        last_ts_offset = st->base_offset + (int32_t)be32(tm + (t->entries - 1) * 12 + 8);
        if (max_ts_offset < last_ts_offset || max_ts < last_ts)
            return 0;
    }
    if (!write)
        return 1;
    put_be32((uint8_t *)om + o->entries * 8, (uint32_t)(last_offset - st->base_offset));
    put_be32((uint8_t *)om + o->entries * 8 + 4, (uint32_t)position);
    o->entries++;
    if (max_ts > last_ts) {
        put_be64((uint8_t *)tm + t->entries * 12, (uint64_t)max_ts);
        put_be32((uint8_t *)tm + t->entries * 12 + 8, (uint32_t)(max_ts_offset - st->base_offset));
        t->entries++;
    }
    return 1;
}

/* The append under the log's lock: the AppendInfo fields as a tuple, None to decline, NULL on error. */
static PyObject *locked_append(PyObject *log, PyObject *data, PyObject *files, PyObject *crc_fn, int one_batch,
                               PyObject *wall_clock) {
    append_state_t st;
    memset(&st, 0, sizeof st);
    PyObject *seg = NULL, *buf = NULL, *producers = NULL, *file = NULL, *result = NULL;
    int r = read_log(log, wall_clock, &st, &seg);
    if (r <= 0)
        goto done;
    if (st.size == 0) { /* Python's path (LogSegment.append) reads an empty segment's rolling timestamp */
        r = 0;
        goto done;
    }
    const int index_due = st.since_index > st.index_interval;
    if (index_due && ((r = hold_map(&st.offsets, 8)) <= 0 || (r = hold_map(&st.times, 12)) <= 0))
        goto done;
    int64_t ts_lo = INT64_MIN, ts_hi = INT64_MAX; /* Log._timestamp_range with records.timestamp_bounds */
    if ((st.ts_before < INT64_MAX || st.ts_after < INT64_MAX) &&
        (__builtin_sub_overflow(st.now, st.ts_before, &ts_lo) || __builtin_add_overflow(st.now, st.ts_after, &ts_hi))) {
        r = 0;
        goto done;
    }
    buf = PyByteArray_FromObject(data); /* the log's own copy: offsets and the epoch are written into it */
    if (buf == NULL) {
        r = -1;
        goto done;
    }
    prepared_t p;
    const Py_ssize_t n = PyByteArray_GET_SIZE(buf);
    r = prepare((uint8_t *)PyByteArray_AS_STRING(buf), n, st.log_end_offset, -1, st.segment_bytes,
                st.max_message_bytes, st.compact, ts_lo, ts_hi, crc_fn, &producers, &p);
    if (r <= 0 || producers != NULL || (one_batch && p.batches != 1)) { /* producer state is Python's */
        r = r < 0 ? -1 : 0;
        goto done;
    }
    /* LogSegment.should_roll: a roll is Python's */
    int64_t waited, roll_after;
    if (st.size > st.segment_bytes - n ||
        __builtin_sub_overflow(st.rolling_ts >= 0 ? p.max_ts : st.now, st.rolling_ts >= 0 ? st.rolling_ts
                                                                                            : st.created_ms, &waited) ||
        __builtin_sub_overflow(st.max_segment_ms, st.jitter, &roll_after) || waited > roll_after ||
        st.offsets.entries >= st.offsets.max_entries || st.times.entries >= st.times.max_entries - 1 ||
        p.last_offset - st.base_offset > INT32_MAX ||
        p.last_offset + 1 - st.recovery_point >= st.flush_messages) { /* flush.messages: Python flushes */
        r = 0;
        goto done;
    }
    const int grows = p.max_ts > st.max_ts; /* the segment's largest timestamp after the append */
    const int64_t max_ts = grows ? p.max_ts : st.max_ts, max_ts_offset = grows ? p.max_ts_offset : st.max_ts_offset;
    if (index_due && (r = index_entries(&st, p.last_offset, st.size, max_ts, max_ts_offset, 0)) <= 0)
        goto done;
    if ((file = field(seg, DF_FILE)) == NULL) {
        r = -1;
        goto done;
    }
    Py_INCREF(file);
    r = write_pinned(files, file, (const uint8_t *)PyByteArray_AS_STRING(buf), n, st.size);
    if (r <= 0)
        goto done;
    if (index_due) {
        index_entries(&st, p.last_offset, st.size, max_ts, max_ts_offset, 1);
        if (set_field(st.offsets.obj, DF_ENTRIES, PyLong_FromLongLong(st.offsets.entries)) < 0 ||
            set_field(st.times.obj, DF_ENTRIES, PyLong_FromLongLong(st.times.entries)) < 0) {
            r = -1;
            goto done;
        }
    }
    if (set_field(seg, DF_SIZE, PyLong_FromLongLong(st.size + n)) < 0 ||
        set_field(seg, DF_SINCE_INDEX_ENTRY, PyLong_FromLongLong((index_due ? 0 : st.since_index) + n)) < 0 ||
        (grows && set_field(seg, DF_MAX_TS, Py_BuildValue("(LL)", (long long)max_ts, (long long)max_ts_offset)) < 0) ||
        set_field(log, DF_LOG_END_OFFSET, PyLong_FromLongLong(p.last_offset + 1)) < 0) {
        r = -1;
        goto done;
    }
    result = Py_BuildValue("(LLLLinn)", (long long)st.log_end_offset, (long long)p.last_offset, (long long)p.max_ts,
                           (long long)p.max_ts_offset, -1, p.batches, n);
done:
    drop_index(&st.offsets);
    drop_index(&st.times);
    Py_XDECREF(seg);
    Py_XDECREF(buf);
    Py_XDECREF(producers);
    Py_XDECREF(file);
    if (result == NULL && r >= 0)
        result = Py_NewRef(Py_None);
    return result;
}

/* append_produced(files, crc32c, wall_clock, log, data, one_batch) -> (first_offset, last_offset, max_timestamp,
 * max_timestamp_offset, -1, batches, size), or None. The engine's three fixed arguments come first, so that
 * log.py binds them once (`functools.partial`) for every caller.
 *
 * Log.append(data) for a leader without a leader epoch (one replica), in one call: under the log's lock, if no
 * other thread holds it, checks and numbers the set as prepare_produce does, writes it at the end of the active
 * segment through the descriptor `files` (open_files.SEGMENT_FILES) pins, and moves the segment's size, index
 * interval count and largest timestamp and the log end offset. None, with nothing changed, whenever Python's
 * path has more to do or something to name: what prepare_produce declines, a producer id, LogAppendTime, a
 * roll, an index page to allocate, an empty segment, flush.messages reached, a storage failure, a failed write, or the
 * lock held elsewhere (Python's path waits for it); with `one_batch`, a set of more than one batch (a Produce
 * v3+ refuses it before the log sees it). A log whose clock is `wall_clock` (log.now_ms) has it read here, in C. */
static PyObject *append_produced(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "append_produced(files, crc32c, wall_clock, log, data, one_batch) takes 6 arguments");
        return NULL;
    }
    PyObject *files = args[0], *crc_fn = args[1], *wall_clock = args[2], *log = args[3], *data = args[4];
    const int one_batch = PyObject_IsTrue(args[5]);
    if (one_batch < 0)
        return NULL;
    if (types[T_LOG] == NULL)
        return PyErr_Format(PyExc_RuntimeError, "append_produced before declare_state");
    if (is_declared(log, T_LOG) < 0)
        return NULL;
    PyObject *lock = field(log, DF_LOCK);
    if (lock == NULL)
        return NULL;
    Py_INCREF(lock); /* held until released: the append may run Python (crc32c, a clock) */
    PyObject *got = PyObject_CallMethodOneArg(lock, names[N_ACQUIRE], Py_False);
    const int held = got == NULL ? -1 : PyObject_IsTrue(got);
    Py_XDECREF(got);
    if (held <= 0) {
        Py_DECREF(lock);
        return held < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *result = locked_append(log, data, files, crc_fn, one_batch, wall_clock);
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback); /* the lock is let go whatever happened */
    PyObject *released = PyObject_CallMethodNoArgs(lock, names[N_RELEASE]);
    Py_DECREF(lock);
    if (released == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        Py_XDECREF(result);
        return NULL;
    }
    Py_DECREF(released);
    PyErr_Restore(type, value, traceback);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * Module.
 */

static PyMethodDef methods[] = {
    {"records_check", records_check, METH_VARARGS,
     "records_check(data, count, require_key, base_ts, ts_lo, ts_hi) -> True if the records pass produce validation."},
    {"prepare_produce", prepare_produce, METH_VARARGS,
     "prepare_produce(buf, next_offset, epoch, max_set_bytes, max_batch_bytes, require_key, ts_lo, ts_hi, crc32c) -> "
     "(last_offset, max_timestamp, max_timestamp_offset, batches, producer_batches) with offsets and epochs written "
     "into buf, or None."},
    {"declare_state", declare_state, METH_VARARGS,
     "declare_state(LogAppendState, SegmentAppendState, IndexAppendState, EpochCacheAppendState, AppendLimits): the "
     "classes whose slots the C append reads and writes (append_state.py); once, before append_produced."},
    {"append_produced", (PyCFunction)(void (*)(void))append_produced, METH_FASTCALL,
     "append_produced(files, crc32c, wall_clock, log, data, one_batch) -> a leader's Log.append of a produced set in one call (the "
     "AppendInfo fields as a tuple), or None for Python's path."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_append_kernel",
    "A produced record set's check, offsets and append in C; use it through shale.sidecar.log.log.Log.append.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__append_kernel(void) {
    for (int i = 0; i < N_NAMES; i++)
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(name_text[i])) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
