/*
 * The log cleaner's two per-record loops in C (see cleaner_kernel.py, which dispatches here), and the map hash
 * they share with offset_map.py.
 *
 * The two functions work on the *uncompressed* records of one v2 batch (the bytes after
 * recordsCount) and on the OffsetMap's bytearray, with exactly offset_map.py's slot layout:
 *
 *   slot (24 bytes, big-endian): offset delta + 1 (uint32, 0 = empty), tag (0-19: inline key
 *   length, 0x80: digest), 19 bytes of key (zero padded) or of digest; linear probing.
 *
 * The slot position and the digest of a long key come from `hash27`, four XXH64 hashes of the
 * key (seeds 0-3): a map is driven by this code only if its hash_fn *is* `hash27`, so a map
 * filled here and one filled by offset_map.py with hash_fn=hash27 hold the same bytes.
 *
 * Anything unusual - a record the pure-Python decoder would reject, an arithmetic overflow
 * where Python would use a big integer, a header key that is not ASCII (Python decodes and
 * re-encodes it) - makes the function return None *before* it changes anything, and the caller
 * runs the pure-Python path for that batch, which raises or handles it exactly as before.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define SLOT_SIZE 24
#define INLINE_MAX 19
#define DIGEST_TAG 0x80
#define MAX_DELTA 4294967294LL /* 2**32 - 2, offset_map.MAX_DELTA */

/* A key as a slot holds it (see the map below), kept per record. */
typedef struct {
    uint64_t slot;   /* first probe */
    uint8_t img[20]; /* the slot's bytes 4..24: tag, then 19 bytes of key (zero padded) or digest */
} skey_t;

/* The cleaner's per-record scratch beside what parse_records reads. */
#define REC_SCRATCH \
    int64_t ts; /* pass 2: the absolute timestamp */ \
    int keep;                                         \
    skey_t skey;
#include "_record_format.h"

/* ---------------------------------------------------------------------------------------------
 * XXH64 (Yann Collet's xxHash, 64-bit variant), byte-order independent.
 */

static const uint64_t P1 = 11400714785074694791ULL;
static const uint64_t P2 = 14029467366897019727ULL;
static const uint64_t P3 = 1609587929392839161ULL;
static const uint64_t P4 = 9650029242287828579ULL;
static const uint64_t P5 = 2870177450012600261ULL;

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t le32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t xxh_round(uint64_t acc, uint64_t input) {
    acc += input * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}

static inline uint64_t xxh_merge(uint64_t acc, uint64_t val) {
    acc ^= xxh_round(0, val);
    return acc * P1 + P4;
}

/* The part of XXH64 after the 32-byte stripes (all of it for keys under 32 bytes). */
static inline uint64_t xxh64_finish(const uint8_t *p, const uint8_t *end, uint64_t h) {
    while (p + 8 <= end) {
        h ^= xxh_round(0, le64(p));
        h = rotl64(h, 27) * P1 + P4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)le32(p) * P1;
        h = rotl64(h, 23) * P2 + P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * P5;
        h = rotl64(h, 11) * P1;
        p++;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

static uint64_t xxh64(const uint8_t *p, size_t len, uint64_t seed) {
    const uint8_t *end = p + len;
    uint64_t h;
    if (len < 32) /* ids, names, numbers: the common case, inlined where it is called */
        return xxh64_finish(p, end, seed + P5 + (uint64_t)len);
    {
        const uint8_t *limit = end - 32;
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        do {
            v1 = xxh_round(v1, le64(p));
            v2 = xxh_round(v2, le64(p + 8));
            v3 = xxh_round(v3, le64(p + 16));
            v4 = xxh_round(v4, le64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xxh_merge(h, v1);
        h = xxh_merge(h, v2);
        h = xxh_merge(h, v3);
        h = xxh_merge(h, v4);
    }
    return xxh64_finish(p, end, h + (uint64_t)len);
}

static inline uint64_t xxh64_key(const uint8_t *p, size_t len, uint64_t seed) {
    if (len < 32)
        return xxh64_finish(p, p + len, seed + P5 + (uint64_t)len);
    return xxh64(p, len, seed);
}

/* ---------------------------------------------------------------------------------------------
 * The map: what a key looks like in a slot, and where it is.
 */

/* h % d without a division (Lemire, Kaser, Kurz: "Faster Remainder by Direct Computation", the
 * 64-bit variant with a 128-bit constant); exact for every 64-bit h and d > 0. */
#ifdef __SIZEOF_INT128__
typedef struct {
    uint64_t d;
    __uint128_t m; /* ceil(2**128 / d) */
} fastmod_t;

static inline fastmod_t fastmod_init(uint64_t d) {
    fastmod_t f;
    f.d = d;
    f.m = ((__uint128_t)-1) / d + 1;
    return f;
}

static inline uint64_t fastmod(uint64_t h, const fastmod_t *f) {
    __uint128_t low = f->m * h;
    __uint128_t bottom = ((low & 0xFFFFFFFFFFFFFFFFULL) * f->d) >> 64;
    __uint128_t top = (low >> 64) * f->d;
    return (uint64_t)((bottom + top) >> 64);
}
#else
typedef struct {
    uint64_t d;
} fastmod_t;

static inline fastmod_t fastmod_init(uint64_t d) {
    fastmod_t f = {d};
    return f;
}

static inline uint64_t fastmod(uint64_t h, const fastmod_t *f) { return h % f->d; }
#endif


static inline void stored_key(const uint8_t *key, int64_t klen, const fastmod_t *slots, skey_t *out) {
    out->slot = fastmod(xxh64_key(key, (size_t)klen, 0), slots);
    if (klen <= INLINE_MAX) {
        uint8_t *img = out->img;
        memset(img, 0, sizeof out->img);
        img[0] = (uint8_t)klen;
        for (int64_t i = 0; i < klen; i++) /* short and fixed-bound: no library call */
            img[1 + i] = key[i];
    } else {
        uint8_t tmp[8];
        out->img[0] = DIGEST_TAG;
        put_be64(out->img + 1, xxh64(key, (size_t)klen, 1));
        put_be64(out->img + 9, xxh64(key, (size_t)klen, 2));
        put_be64(tmp, xxh64(key, (size_t)klen, 3));
        memcpy(out->img + 17, tmp, 3);
    }
}

/* The slot and the next cache line: at load 0.9 a lookup probes ~5 slots (linear probing). */
static inline void prefetch_slot(uint8_t *buf, uint64_t slot) {
    uint8_t *p = buf + slot * SLOT_SIZE;
    PREFETCH(p);
    PREFETCH(p + 64);
}

/* Tag and key/digest of a slot equal the key's (three fixed-size compares, inlined). */
static inline int slot_matches(const uint8_t *p, const skey_t *k) {
    uint64_t a0, b0, a1, b1;
    uint32_t a2, b2;
    memcpy(&a0, p + 4, 8);
    memcpy(&b0, k->img, 8);
    memcpy(&a1, p + 12, 8);
    memcpy(&b1, k->img + 8, 8);
    memcpy(&a2, p + 20, 4);
    memcpy(&b2, k->img + 16, 4);
    return ((a0 ^ b0) | (a1 ^ b1) | (uint64_t)(a2 ^ b2)) == 0;
}

/* The key's slot, or the empty slot where it would go; NULL if `limit` probes found neither. */
static inline uint8_t *find_slot(uint8_t *buf, uint64_t slots, const skey_t *k, uint32_t *delta1, uint64_t limit) {
    uint64_t s = k->slot;
    for (uint64_t n = 0; n < limit; n++) {
        uint8_t *p = buf + s * SLOT_SIZE;
        uint32_t d = be32(p);
        if (d == 0 || slot_matches(p, k)) {
            *delta1 = d;
            return p;
        }
        if (++s == slots)
            s = 0;
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Writing records (retain_batch): canonical varints, as records.encode_record writes them.
 */

static inline uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

static inline Py_ssize_t varint_size(int64_t v) {
    uint64_t u = zigzag(v);
    Py_ssize_t n = 1;
    while (u >= 0x80) {
        u >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *write_varint(uint8_t *out, int64_t v) {
    uint64_t u = zigzag(v);
    while (u >= 0x80) {
        *out++ = (uint8_t)((u & 0x7F) | 0x80);
        u >>= 7;
    }
    *out++ = (uint8_t)u;
    return out;
}

static inline Py_ssize_t field_size(int64_t n) { return n < 0 ? 1 : varint_size(n) + n; }

static inline uint8_t *write_field(uint8_t *out, const uint8_t *src, int64_t n) {
    if (n < 0)
        return write_varint(out, -1);
    out = write_varint(out, n);
    memcpy(out, src, (size_t)n);
    return out + n;
}

/* Bytes of a record's headers as records.encode_record writes them (canonical varints, -1 for null). */
static Py_ssize_t headers_size(const rec_t *r) {
    const uint8_t *p = r->headers, *end = r->end; /* already validated */
    Py_ssize_t size = varint_size(r->nheaders);
    for (int64_t j = 0; j < r->nheaders; j++) {
        int64_t hk = 0, hv = -1;
        read_varint(&p, end, 5, &hk);
        p += hk;
        size += field_size(hk);
        read_varint(&p, end, 5, &hv);
        if (hv >= 0)
            p += hv;
        size += field_size(hv);
    }
    return size;
}

static uint8_t *write_headers(uint8_t *out, const rec_t *r) {
    const uint8_t *p = r->headers, *end = r->end;
    out = write_varint(out, r->nheaders);
    for (int64_t j = 0; j < r->nheaders; j++) {
        int64_t hk = 0, hv = -1;
        read_varint(&p, end, 5, &hk);
        out = write_field(out, p, hk);
        p += hk;
        read_varint(&p, end, 5, &hv);
        out = write_field(out, p, hv);
        if (hv >= 0)
            p += hv;
    }
    return out;
}

/* ---------------------------------------------------------------------------------------------
 * Argument helpers.
 */

/* An int that must fit int64; 0 ok, 1 does not fit (fall back), -1 error set. */
static int as_int64(PyObject *o, int64_t *out) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow)
        return 1;
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)v;
    return 0;
}


/* ---------------------------------------------------------------------------------------------
 * hash27(key) -> 27 bytes: the OffsetMap hash_fn of maps this module may fill.
 */

static PyObject *hash27(PyObject *self, PyObject *arg) {
    Py_buffer key;
    uint8_t out[32];
    if (PyObject_GetBuffer(arg, &key, PyBUF_SIMPLE) < 0)
        return NULL;
    for (int i = 0; i < 4; i++)
        put_be64(out + 8 * i, xxh64((const uint8_t *)key.buf, (size_t)key.len, (uint64_t)i));
    PyBuffer_Release(&key);
    return PyBytes_FromStringAndSize((const char *)out, 27);
}

/* ---------------------------------------------------------------------------------------------
 * Pass 1.
 *
 * map_batch(buf, slots, max_entries, size, map_base, data, count, batch_base, start, next_offset)
 *   -> None (let Python do this batch) or (records read, map full, new size, last offset put or None)
 *
 * cleaner_kernel.map_records_py, record for record: every record is read; a keyed record with
 * start <= offset < next_offset is put, unless the map is full or cannot hold the offset, which
 * ends the pass (the record that found it full is counted as read).
 */

static PyObject *map_batch(PyObject *self, PyObject *args) {
    Py_buffer buf, data;
    Py_ssize_t slots_ss, max_entries, size, count;
    PyObject *o_map_base, *o_batch_base, *o_start, *o_next;
    if (!PyArg_ParseTuple(args, "w*nnny*nOOOO", &buf, &slots_ss, &max_entries, &size, &data, &count, &o_map_base,
                          &o_batch_base, &o_start, &o_next))
        return NULL;
    PyObject *result = NULL;
    rec_t stack_recs[STACK_RECORDS];
    rec_t *recs = stack_recs;
    int64_t map_base, batch_base, start, next_offset;
    int rc;
    if ((rc = as_int64(o_map_base, &map_base)) || (rc = as_int64(o_batch_base, &batch_base)) ||
        (rc = as_int64(o_start, &start)) || (rc = as_int64(o_next, &next_offset))) {
        if (rc > 0)
            goto fallback;
        goto done;
    }
    const uint64_t slots = (uint64_t)slots_ss;
    if (slots_ss <= 0 || buf.len != slots_ss * SLOT_SIZE || count > data.len)
        goto fallback;
    if (count < 0)
        count = 0; /* range(negative) reads nothing */
    if (count > STACK_RECORDS && !(recs = (rec_t *)PyMem_Malloc((size_t)count * sizeof(rec_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    if (parse_records((const uint8_t *)data.buf, data.len, count, recs))
        goto fallback;
    uint8_t *map = (uint8_t *)buf.buf;
    const fastmod_t mod = fastmod_init(slots);
    /* Offsets, and the slot of every key to put, before anything is written: prefetch them all. */
    for (Py_ssize_t i = 0; i < count; i++) {
        rec_t *r = &recs[i];
        if (__builtin_add_overflow(batch_base, r->offset, &r->offset))
            goto fallback;
        if (r->klen >= 0 && r->offset >= start && r->offset < next_offset) {
            stored_key(r->key, r->klen, &mod, &r->skey);
            prefetch_slot(map, r->skey.slot);
        }
    }
    Py_ssize_t read = 0;
    int full = 0, put_any = 0;
    int64_t last_put = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const rec_t *r = &recs[i];
        int64_t delta;
        read++;
        if (r->klen < 0 || r->offset < start || r->offset >= next_offset)
            continue;
        if (size >= max_entries || __builtin_sub_overflow(r->offset, map_base, &delta) || delta < 0 ||
            delta > MAX_DELTA) {
            full = 1;
            break;
        }
        uint32_t delta1;
        uint8_t *p = find_slot(map, slots, &r->skey, &delta1, slots);
        if (p == NULL || (delta1 == 0 && size >= slots_ss)) {
            PyErr_SetString(PyExc_OverflowError, "offset map has no free slot");
            goto done;
        }
        if (delta1 == 0) {
            memcpy(p + 4, r->skey.img, sizeof r->skey.img);
            size++;
        }
        put_be32(p, (uint32_t)(delta + 1));
        last_put = r->offset;
        put_any = 1;
    }
    if (put_any)
        result = Py_BuildValue("(nOnL)", read, full ? Py_True : Py_False, size, (long long)last_put);
    else
        result = Py_BuildValue("(nOnO)", read, full ? Py_True : Py_False, size, Py_None);
    goto done;
fallback:
    result = Py_NewRef(Py_None);
done:
    if (recs != stack_recs)
        PyMem_Free(recs);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&data);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * Pass 2.
 *
 * retain_batch(buf, slots, map_base, latest_offset, data, count, batch_base, base_timestamp,
 *              max_timestamp, attributes, now, key_at, discard, marker, delete_horizon)
 *   -> None (let Python do this batch) or the tuple of cleaner_kernel.Retained:
 *      (records, kept, invalid, tombstones, horizon, base_timestamp, max_timestamp, body)
 *
 * The decision per record is Cleaner's shouldRetainRecord (cleaner_kernel.retain_records_py);
 * `body` is the kept records re-encoded for a rebuilt batch, or None when nothing is kept or
 * everything is kept and no delete horizon has to be set (the original bytes are copied).
 */

static inline Py_ssize_t record_size(const rec_t *r, int64_t tsd, int64_t od) {
    return 1 + varint_size(tsd) + varint_size(od) + field_size(r->klen) + field_size(r->vlen) + headers_size(r);
}

static PyObject *retain_batch(PyObject *self, PyObject *args) {
    Py_buffer buf, data;
    Py_ssize_t slots_ss, count;
    int attributes, discard, marker;
    PyObject *o_map_base, *o_latest, *o_batch_base, *o_base_ts, *o_max_ts, *o_now, *o_horizon, *key_at;
    if (!PyArg_ParseTuple(args, "y*nOOy*nOOOiOOppO", &buf, &slots_ss, &o_map_base, &o_latest, &data, &count,
                          &o_batch_base, &o_base_ts, &o_max_ts, &attributes, &o_now, &key_at, &discard, &marker,
                          &o_horizon))
        return NULL;
    PyObject *result = NULL, *body = NULL;
    rec_t stack_recs[STACK_RECORDS];
    rec_t *recs = stack_recs;
    int64_t map_base, latest, batch_base, base_ts, max_ts, now, delete_horizon;
    int rc;
    if ((rc = as_int64(o_map_base, &map_base)) || (rc = as_int64(o_latest, &latest)) ||
        (rc = as_int64(o_batch_base, &batch_base)) || (rc = as_int64(o_base_ts, &base_ts)) ||
        (rc = as_int64(o_max_ts, &max_ts)) || (rc = as_int64(o_now, &now)) ||
        (rc = as_int64(o_horizon, &delete_horizon))) {
        if (rc > 0)
            goto fallback;
        goto done;
    }
    const uint64_t slots = (uint64_t)slots_ss;
    if (slots_ss <= 0 || buf.len != slots_ss * SLOT_SIZE || count > data.len)
        goto fallback;
    if (count < 0)
        count = 0;
    if (count > STACK_RECORDS && !(recs = (rec_t *)PyMem_Malloc((size_t)count * sizeof(rec_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    if (parse_records((const uint8_t *)data.buf, data.len, count, recs))
        goto fallback;
    const int log_append = attributes & ATTR_TIMESTAMP_TYPE;
    const int is_control = attributes & ATTR_CONTROL;
    const int has_horizon = attributes & ATTR_DELETE_HORIZON;
    uint8_t *map = (uint8_t *)buf.buf;
    const fastmod_t mod = fastmod_init(slots);
    /* Every reason to give up is found here, before key_at is called or anything is decided:
     * offsets and timestamps beyond int64 (Python would carry on with big integers), a header
     * key that is not ASCII (Python decodes and re-encodes it, with replacement characters). */
    int64_t min_ts = INT64_MAX, max_any_ts = INT64_MIN, scratch;
    if (map_base > INT64_MAX - (1LL << 32))
        goto fallback;
    for (Py_ssize_t i = 0; i < count; i++) {
        rec_t *r = &recs[i];
        if (__builtin_add_overflow(batch_base, r->offset, &r->offset) || r->nonascii_header_key)
            goto fallback;
        if (log_append)
            r->ts = max_ts;
        else if (__builtin_add_overflow(base_ts, r->ts_delta, &r->ts))
            goto fallback;
        if (r->ts < min_ts)
            min_ts = r->ts;
        if (r->ts > max_any_ts)
            max_any_ts = r->ts;
        if (!discard && !is_control && r->offset <= latest && r->klen >= 0) {
            /* this record needs a lookup: start loading its slot */
            stored_key(r->key, r->klen, &mod, &r->skey);
            prefetch_slot(map, r->skey.slot);
        }
    }
    if (count > 0 && (__builtin_sub_overflow(max_any_ts, min_ts, &scratch) ||
                      __builtin_sub_overflow(max_any_ts, delete_horizon, &scratch) ||
                      __builtin_sub_overflow(min_ts, delete_horizon, &scratch) ||
                      __builtin_sub_overflow(max_any_ts, base_ts, &scratch) ||
                      __builtin_sub_overflow(min_ts, base_ts, &scratch)))
        goto fallback; /* a timestamp delta of the rebuilt batch could overflow */
    Py_ssize_t kept = 0, invalid = 0;
    int tombstones = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        rec_t *r = &recs[i];
        int k;
        if (discard) {
            k = 0;
        } else if (is_control || r->offset > latest) {
            k = 1;
        } else if (r->klen < 0) {
            invalid++;
            k = 0;
        } else {
            uint32_t delta1 = 0;
            int64_t found = -1;
            int verified = 1;
            if (find_slot(map, slots, &r->skey, &delta1, slots) != NULL && delta1 != 0) {
                found = map_base + (int64_t)delta1 - 1; /* checked above: cannot overflow */
                verified = r->skey.img[0] != DIGEST_TAG;
            }
            if (r->offset < found && !verified) {
                /* Only a digest matched: ask for this key's own latest offset in the map's range
                 * (exact, -1 if none), so that another key with the same digest decides nothing. */
                PyObject *o_found = PyLong_FromLongLong(found);
                if (!o_found)
                    goto done;
                PyObject *mine = PyBytes_FromStringAndSize((const char *)r->key, (Py_ssize_t)r->klen);
                if (!mine) {
                    Py_DECREF(o_found);
                    goto done;
                }
                PyObject *own = PyObject_CallFunctionObjArgs(key_at, o_found, mine, NULL);
                Py_DECREF(o_found);
                Py_DECREF(mine);
                if (!own)
                    goto done;
                found = PyLong_AsLongLong(own);
                Py_DECREF(own);
                if (found == -1 && PyErr_Occurred())
                    goto done;
            }
            if (r->offset < found) {
                k = 0; /* a later record of this very key exists */
            } else if (r->vlen >= 0) {
                k = 1;
            } else {
                k = !has_horizon || now < base_ts; /* a tombstone within its delete horizon */
            }
        }
        r->keep = k;
        if (k) {
            kept++;
            if (r->vlen < 0 && !is_control)
                tombstones = 1;
        }
    }
    const int needs_horizon = (tombstones || marker) && !has_horizon;
    PyObject *o_horizon_out = needs_horizon ? o_horizon : (has_horizon ? o_base_ts : Py_None);
    if (kept == 0 || (kept == count && !needs_horizon)) {
        result = Py_BuildValue("(nnnOOOOO)", count, kept, invalid, tombstones ? Py_True : Py_False, o_horizon_out,
                               Py_None, Py_None, Py_None);
        goto done;
    }
    /* Rebuild: timestamps rebased on the horizon or the first kept record, canonical varints. */
    int64_t new_base = 0, new_max = log_append ? max_ts : INT64_MIN;
    int first = 1;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const rec_t *r = &recs[i];
        if (!r->keep)
            continue;
        if (first) {
            new_base = needs_horizon ? delete_horizon : (has_horizon ? base_ts : r->ts);
            first = 0;
        }
        int64_t tsd = r->ts - new_base; /* checked above: cannot overflow */
        if (!log_append && r->ts > new_max)
            new_max = r->ts;
        Py_ssize_t len = record_size(r, tsd, r->offset - batch_base);
        total += varint_size(len) + len;
    }
    body = PyBytes_FromStringAndSize(NULL, total);
    if (!body)
        goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(body);
    for (Py_ssize_t i = 0; i < count; i++) {
        const rec_t *r = &recs[i];
        if (!r->keep)
            continue;
        int64_t tsd = r->ts - new_base, od = r->offset - batch_base;
        out = write_varint(out, record_size(r, tsd, od));
        *out++ = 0;
        out = write_varint(out, tsd);
        out = write_varint(out, od);
        out = write_field(out, r->key, r->klen);
        out = write_field(out, r->value, r->vlen);
        out = write_headers(out, r);
    }
    if (out != (uint8_t *)PyBytes_AS_STRING(body) + total) {
        PyErr_SetString(PyExc_SystemError, "cleaner kernel: re-encoded size mismatch");
        goto done;
    }
    result = Py_BuildValue("(nnnOOLLO)", count, kept, invalid, tombstones ? Py_True : Py_False, o_horizon_out,
                           (long long)new_base, (long long)new_max, body);
    goto done;
fallback:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(body);
    if (recs != stack_recs)
        PyMem_Free(recs);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&data);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * Module.
 */

static PyMethodDef methods[] = {
    {"hash27", hash27, METH_O,
     "hash27(key) -> 27 bytes: XXH64 of the key with seeds 0-3, big-endian, truncated (the map hash of the C path)."},
    {"map_batch", map_batch, METH_VARARGS, "Pass 1 over the records of one batch (see cleaner_kernel.py)."},
    {"retain_batch", retain_batch, METH_VARARGS, "Pass 2 over the records of one batch (see cleaner_kernel.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cleaner_kernel",
    "The log cleaner's per-record loops in C; use it through shale.sidecar.log.cleaner_kernel.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cleaner_kernel(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddStringConstant(m, "HASH_NAME", "xxh64x4") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
