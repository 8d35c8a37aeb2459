/*
 * The log engine's per-record hot loops in C: the cleaner's two passes (see cleaner_kernel.py, which
 * dispatches here), the record-framing walk of produce validation (records.py), a leader's whole check and
 * offset assignment of a produced record set, and a single replica's whole append of one (log.py: Log.append,
 * Log.append_in_c).
 *
 * The cleaner's two functions work on the *uncompressed* records of one v2 batch (the bytes after
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
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SLOT_SIZE 24
#define INLINE_MAX 19
#define DIGEST_TAG 0x80
#define MAX_DELTA 4294967294LL /* 2**32 - 2, offset_map.MAX_DELTA */

#define ATTR_TIMESTAMP_TYPE 0x08
#define ATTR_CONTROL 0x20
#define ATTR_DELETE_HORIZON 0x40

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((p), 1, 3)
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define PREFETCH(p) ((void)(p))
#define LIKELY(x) (x)
#define UNLIKELY(x) (x)
#endif

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

static inline void put_be64(uint8_t *out, uint64_t v) {
    for (int i = 7; i >= 0; i--) {
        out[i] = (uint8_t)v;
        v >>= 8;
    }
}

static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline int64_t be64s(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return (int64_t)v;
}

static inline void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
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

typedef struct {
    uint64_t slot;   /* first probe */
    uint8_t img[20]; /* the slot's bytes 4..24: tag, then 19 bytes of key (zero padded) or digest */
} skey_t;

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
 * Varints and records (records.py: decode_records), strict: -1 = "let Python decide".
 */

/* Zigzag varint of at most `max_bytes` bytes (5: Kafka's varint, 10: varlong) within [*pp, end). */
static inline int read_varint(const uint8_t **pp, const uint8_t *end, int max_bytes, int64_t *out) {
    const uint8_t *p = *pp;
    uint64_t u = 0;
    int shift = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (UNLIKELY(p >= end))
            return -1;
        uint8_t b = *p++;
        if (UNLIKELY(i == 9 && (b & 0x7E)))
            return -1; /* more than 64 bits: Python would make a big integer */
        u |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)((u >> 1) ^ (~(u & 1) + 1));
            *pp = p;
            return 0;
        }
        shift += 7;
    }
    return -1;
}

/* A varint length then that many bytes (a key or value); a negative length is null. */
static inline int read_nullable(const uint8_t **pp, const uint8_t *end, const uint8_t **data, int64_t *len) {
    if (read_varint(pp, end, 5, len))
        return -1;
    *data = *pp;
    if (*len >= 0) {
        if (*len > end - *pp)
            return -1;
        *pp += *len;
    }
    return 0;
}

typedef struct {
    int64_t offset;   /* the delta as read, then the absolute offset */
    int64_t ts_delta; /* the delta as read */
    int64_t ts;       /* pass 2: the absolute timestamp */
    const uint8_t *key;
    int64_t klen; /* < 0: null */
    const uint8_t *value;
    int64_t vlen; /* < 0: null */
    const uint8_t *headers; /* first header, after the count */
    const uint8_t *end;     /* end of the record */
    int64_t nheaders;
    int nonascii_header_key;
    int keep;
    skey_t skey;
} rec_t;

/* Parse `count` records filling exactly [data, data+len); -1 if Python's decoder could disagree. */
static int parse_records(const uint8_t *data, Py_ssize_t len, Py_ssize_t count, rec_t *recs) {
    const uint8_t *p = data, *end = data + len;
    for (Py_ssize_t i = 0; i < count; i++) {
        rec_t *r = &recs[i];
        int64_t length, n;
        if (read_varint(&p, end, 5, &length) || length < 0 || length > end - p)
            return -1;
        const uint8_t *rend = p + length;
        if (p >= rend)
            return -1;
        p++; /* attributes, unused */
        if (read_varint(&p, rend, 10, &r->ts_delta) || read_varint(&p, rend, 5, &r->offset))
            return -1;
        if (read_nullable(&p, rend, &r->key, &r->klen) || read_nullable(&p, rend, &r->value, &r->vlen))
            return -1;
        if (read_varint(&p, rend, 5, &n) || n < 0)
            return -1;
        r->nheaders = n;
        r->headers = p;
        r->nonascii_header_key = 0;
        for (int64_t j = 0; j < r->nheaders; j++) {
            int64_t hk, hv;
            if (read_varint(&p, rend, 5, &hk) || hk < 0 || hk > rend - p)
                return -1;
            for (int64_t b = 0; b < hk; b++)
                r->nonascii_header_key |= p[b] & 0x80;
            p += hk;
            if (read_varint(&p, rend, 5, &hv))
                return -1;
            if (hv >= 0) {
                if (hv > rend - p)
                    return -1;
                p += hv;
            }
        }
        if (p != rend)
            return -1;
        r->end = rend;
    }
    return p == end ? 0 : -1;
}

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

#define STACK_RECORDS 32

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

#define BATCH_OVERHEAD 61
#define LOG_OVERHEAD 12
#define ATTR_COMPRESSION 0x07
#define ATTR_TRANSACTIONAL 0x10

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
 * The state it reads and changes stays in the Python objects (one source of truth); their attribute names are
 * listed here, so a renamed attribute fails the tests (an AttributeError) instead of going unnoticed.
 */

enum {
    N_LOCK, N_ACQUIRE, N_RELEASE, N_STORAGE_FAILURE, N_LEADER_EPOCH_CACHE, N_DIRTY, N_CLOCK, N_CONFIG,
    N_TIMESTAMP_TYPE, N_BEFORE_MAX_MS, N_AFTER_MAX_MS, N_SEGMENT_BYTES, N_MAX_MESSAGE_BYTES, N_CLEANUP_POLICY,
    N_MAX_COMPACTION_LAG_MS, N_SEGMENT_MS, N_FLUSH_MESSAGES, N_LOG_END_OFFSET, N_RECOVERY_POINT, N_SEGMENTS,
    N_SIZE, N_ROLLING_TS, N_CREATED_MS, N_ROLL_JITTER_MS, N_SINCE_INDEX_ENTRY, N_INDEX_INTERVAL_BYTES, N_MAX_TS,
    N_BASE_OFFSET, N_OFFSET_INDEX, N_TIME_INDEX, N_ENTRIES, N_MAX_ENTRIES, N_RESERVED, N_WRITABLE, N_MM, N_FILE,
    N_COMPACT, N_CREATE_TIME, N_NAMES
};
static const char *const name_text[N_NAMES] = {
    "lock", "acquire", "release", "storage_failure", "leader_epoch_cache", "dirty", "clock", "config",
    "message_timestamp_type", "message_timestamp_before_max_ms", "message_timestamp_after_max_ms", "segment_bytes",
    "max_message_bytes", "cleanup_policy", "max_compaction_lag_ms", "segment_ms", "flush_messages", "log_end_offset",
    "recovery_point", "segments", "size", "_rolling_ts", "created_ms", "roll_jitter_ms",
    "bytes_since_last_index_entry", "index_interval_bytes", "_max_ts", "base_offset", "offset_index", "time_index",
    "entries", "max_entries", "_reserved", "writable", "_mm", "_file", "compact", "CreateTime",
};
static PyObject *names[N_NAMES];

/* `obj.<name>` as an int64 into `*out`: 1, or 0 (decline) when it does not fit or is not an int, -1 on error. */
static int attr_i64(PyObject *obj, int name, int64_t *out) {
    PyObject *v = PyObject_GetAttr(obj, names[name]);
    if (v == NULL)
        return -1;
    if (!PyLong_Check(v)) {
        Py_DECREF(v);
        return 0;
    }
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    Py_DECREF(v);
    if (*out == -1 && PyErr_Occurred())
        return -1;
    return !overflow;
}

/* `obj.<name>` is truthy (1), falsy (0) or the lookup failed (-1). */
static int attr_true(PyObject *obj, int name) {
    PyObject *v = PyObject_GetAttr(obj, names[name]);
    if (v == NULL)
        return -1;
    const int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

static int set_i64(PyObject *obj, int name, int64_t value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    const int r = PyObject_SetAttr(obj, names[name], v);
    Py_DECREF(v);
    return r;
}

/* One of the active segment's indexes (index.py: MmapIndex): its counters, and its map while an entry is due. */
typedef struct {
    PyObject *obj;
    int64_t entries, max_entries, reserved;
    Py_buffer map; /* map.obj is NULL unless held */
} index_t;

/* Everything Log.append reads for a produced set, as ints; segment and index state of the active segment. */
typedef struct {
    int64_t ts_before, ts_after, segment_bytes, max_message_bytes, max_lag, segment_ms, flush_messages;
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

/* Reads the config's limits into `st`: 1, 0 to decline (LogAppendTime, a value beyond int64), -1 on error. */
static int read_config(PyObject *cfg, append_state_t *st) {
    PyObject *ts_type = PyObject_GetAttr(cfg, names[N_TIMESTAMP_TYPE]);
    if (ts_type == NULL)
        return -1;
    const int create_time = PyUnicode_Check(ts_type) && PyUnicode_Compare(ts_type, names[N_CREATE_TIME]) == 0;
    Py_DECREF(ts_type);
    if (!create_time) /* LogAppendTime rewrites every batch's timestamp and CRC: Python's */
        return PyErr_Occurred() ? -1 : 0;
    TRY(attr_i64(cfg, N_BEFORE_MAX_MS, &st->ts_before));
    TRY(attr_i64(cfg, N_AFTER_MAX_MS, &st->ts_after));
    TRY(attr_i64(cfg, N_SEGMENT_BYTES, &st->segment_bytes));
    TRY(attr_i64(cfg, N_MAX_MESSAGE_BYTES, &st->max_message_bytes));
    TRY(attr_i64(cfg, N_MAX_COMPACTION_LAG_MS, &st->max_lag));
    TRY(attr_i64(cfg, N_SEGMENT_MS, &st->segment_ms));
    TRY(attr_i64(cfg, N_FLUSH_MESSAGES, &st->flush_messages));
    PyObject *policy = PyObject_GetAttr(cfg, names[N_CLEANUP_POLICY]);
    if (policy == NULL)
        return -1;
    st->compact = PySequence_Contains(policy, names[N_COMPACT]);
    Py_DECREF(policy);
    return st->compact < 0 ? -1 : 1;
}

/* Reads one index's counters (`idx->obj` set by the caller). */
static int read_index(index_t *idx) {
    TRY(attr_i64(idx->obj, N_ENTRIES, &idx->entries));
    return attr_i64(idx->obj, N_MAX_ENTRIES, &idx->max_entries);
}

/* Takes the map of an index that gets an entry of `entry_size` bytes: 1, or 0 to decline when Python has more to
 * do first (allocate the entry's page, reopen a closed or read-only index). */
static int hold_map(index_t *idx, int64_t entry_size) {
    TRY(attr_i64(idx->obj, N_RESERVED, &idx->reserved));
    if ((idx->entries + 1) * entry_size > idx->reserved) /* MmapIndex.reserve: a page at a time, Python's */
        return 0;
    const int writable = attr_true(idx->obj, N_WRITABLE);
    if (writable <= 0)
        return writable;
    PyObject *mm = PyObject_GetAttr(idx->obj, names[N_MM]);
    if (mm == NULL)
        return -1;
    const int r = mm == Py_None ? 0 : PyObject_GetBuffer(mm, &idx->map, PyBUF_WRITABLE) < 0 ? -1 : 1;
    Py_DECREF(mm);
    if (r > 0 && idx->map.len < (idx->entries + 1) * entry_size) {
        PyBuffer_Release(&idx->map);
        return 0;
    }
    return r;
}

static void drop_index(index_t *idx) {
    if (idx->map.obj != NULL)
        PyBuffer_Release(&idx->map);
    Py_CLEAR(idx->obj);
}

/* Reads the active segment's write state into `st`: 1, 0 to decline (a state Python fills in lazily), -1. */
static int read_segment(PyObject *seg, append_state_t *st) {
    TRY(attr_i64(seg, N_SIZE, &st->size));
    TRY(attr_i64(seg, N_ROLLING_TS, &st->rolling_ts)); /* None until the first batch's timestamp is read */
    TRY(attr_i64(seg, N_CREATED_MS, &st->created_ms));
    TRY(attr_i64(seg, N_ROLL_JITTER_MS, &st->jitter));
    TRY(attr_i64(seg, N_SINCE_INDEX_ENTRY, &st->since_index));
    TRY(attr_i64(seg, N_INDEX_INTERVAL_BYTES, &st->index_interval));
    TRY(attr_i64(seg, N_BASE_OFFSET, &st->base_offset));
    PyObject *max_ts = PyObject_GetAttr(seg, names[N_MAX_TS]); /* (timestamp, offset), None until loaded */
    if (max_ts == NULL)
        return -1;
    int ok = PyTuple_Check(max_ts) && PyTuple_GET_SIZE(max_ts) == 2;
    if (ok) {
        int o1, o2;
        st->max_ts = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(max_ts, 0), &o1);
        st->max_ts_offset = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(max_ts, 1), &o2);
        ok = !o1 && !o2;
    }
    Py_DECREF(max_ts);
    if (PyErr_Occurred())
        return -1;
    if (!ok)
        return 0;
    if ((st->offsets.obj = PyObject_GetAttr(seg, names[N_OFFSET_INDEX])) == NULL ||
        (st->times.obj = PyObject_GetAttr(seg, names[N_TIME_INDEX])) == NULL)
        return -1;
    TRY(read_index(&st->offsets));
    return read_index(&st->times);
}

/* Reads what the append needs from the log; `*seg` gets the active segment (a new reference) on 1. */
static int read_log(PyObject *log, PyObject *wall_clock, append_state_t *st, PyObject **seg) {
    PyObject *failure = PyObject_GetAttr(log, names[N_STORAGE_FAILURE]);
    if (failure == NULL)
        return -1;
    const int failed = failure != Py_None;
    Py_DECREF(failure);
    if (failed) /* Python's path takes the next append and logs the recovery */
        return 0;
    PyObject *cache = PyObject_GetAttr(log, names[N_LEADER_EPOCH_CACHE]);
    if (cache == NULL)
        return -1;
    const int dirty = attr_true(cache, N_DIRTY); /* a failed checkpoint write, retried before the next append */
    Py_DECREF(cache);
    if (dirty != 0)
        return dirty < 0 ? -1 : 0;
    PyObject *cfg = PyObject_GetAttr(log, names[N_CONFIG]);
    if (cfg == NULL)
        return -1;
    const int r = read_config(cfg, st);
    Py_DECREF(cfg);
    if (r <= 0)
        return r;
    TRY(attr_i64(log, N_LOG_END_OFFSET, &st->log_end_offset));
    TRY(attr_i64(log, N_RECOVERY_POINT, &st->recovery_point));
    PyObject *clock = PyObject_GetAttr(log, names[N_CLOCK]);
    if (clock == NULL)
        return -1;
    if (clock == wall_clock) { /* log.now_ms, read here: time.time_ns() // 1_000_000 */
        Py_DECREF(clock);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        st->now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    } else {
        PyObject *now = PyObject_CallNoArgs(clock);
        Py_DECREF(clock);
        if (now == NULL)
            return -1;
        st->now = PyLong_AsLongLong(now);
        Py_DECREF(now);
        if (st->now == -1 && PyErr_Occurred())
            return -1;
    }
    PyObject *segments = PyObject_GetAttr(log, names[N_SEGMENTS]);
    if (segments == NULL)
        return -1;
    if (!PyList_Check(segments) || PyList_GET_SIZE(segments) == 0) {
        Py_DECREF(segments);
        return 0;
    }
    *seg = Py_NewRef(PyList_GET_ITEM(segments, PyList_GET_SIZE(segments) - 1));
    Py_DECREF(segments);
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
    const int64_t max_segment_ms = st.compact && st.max_lag > 0 && st.max_lag < st.segment_ms ? st.max_lag
                                                                                               : st.segment_ms;
    int64_t waited, roll_after;
    if (st.size > st.segment_bytes - n ||
        __builtin_sub_overflow(st.rolling_ts >= 0 ? p.max_ts : st.now, st.rolling_ts >= 0 ? st.rolling_ts
                                                                                            : st.created_ms, &waited) ||
        __builtin_sub_overflow(max_segment_ms, st.jitter, &roll_after) || waited > roll_after ||
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
    file = PyObject_GetAttr(seg, names[N_FILE]);
    if (file == NULL) {
        r = -1;
        goto done;
    }
    r = write_pinned(files, file, (const uint8_t *)PyByteArray_AS_STRING(buf), n, st.size);
    if (r <= 0)
        goto done;
    if (index_due) {
        index_entries(&st, p.last_offset, st.size, max_ts, max_ts_offset, 1);
        if (set_i64(st.offsets.obj, N_ENTRIES, st.offsets.entries) < 0 ||
            set_i64(st.times.obj, N_ENTRIES, st.times.entries) < 0) {
            r = -1;
            goto done;
        }
    }
    if (set_i64(seg, N_SIZE, st.size + n) < 0 ||
        set_i64(seg, N_SINCE_INDEX_ENTRY, (index_due ? 0 : st.since_index) + n) < 0) {
        r = -1;
        goto done;
    }
    if (grows) {
        PyObject *pair = Py_BuildValue("(LL)", (long long)max_ts, (long long)max_ts_offset);
        if (pair == NULL || PyObject_SetAttr(seg, names[N_MAX_TS], pair) < 0) {
            Py_XDECREF(pair);
            r = -1;
            goto done;
        }
        Py_DECREF(pair);
    }
    if (set_i64(log, N_LOG_END_OFFSET, p.last_offset + 1) < 0) {
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
    PyObject *lock = PyObject_GetAttr(log, names[N_LOCK]);
    if (lock == NULL)
        return NULL;
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

/* records_columns(data, count, base_offset, base_ts, log_append, max_ts) -> (offsets, timestamps, keys,
 * values, headers) lists, one entry per record (headers: None or a list of (str, bytes | None)), or None
 * when Python's decoder should decide (records.py: decode_columns). Readers that want columns (the
 * Spark data source's Arrow batches) skip a Record object per record. */
static PyObject *header_list(const rec_t *r) {
    PyObject *list = PyList_New(r->nheaders);
    if (list == NULL)
        return NULL;
    const uint8_t *p = r->headers;
    for (int64_t j = 0; j < r->nheaders; j++) {
        int64_t hk, hv;
        const uint8_t *kd, *vd;
        /* parse_records checked every length: these reads cannot fail */
        read_nullable(&p, r->end, &kd, &hk);
        read_nullable(&p, r->end, &vd, &hv);
        PyObject *k = PyUnicode_DecodeUTF8((const char *)kd, hk, "replace");
        PyObject *v = hv < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize((const char *)vd, hv);
        PyObject *pair = (k && v) ? PyTuple_Pack(2, k, v) : NULL;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (pair == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, j, pair);
    }
    return list;
}

static PyObject *nullable_bytes(const uint8_t *data, int64_t len) {
    return len < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize((const char *)data, len);
}

static PyObject *records_columns(PyObject *self, PyObject *args) {
    Py_buffer data;
    Py_ssize_t count;
    long long base_offset, base_ts, max_ts;
    int log_append;
    if (!PyArg_ParseTuple(args, "y*nLLpL", &data, &count, &base_offset, &base_ts, &log_append, &max_ts))
        return NULL;
    PyObject *result = NULL, *cols[5] = {NULL, NULL, NULL, NULL, NULL};
    rec_t stack_recs[STACK_RECORDS];
    rec_t *recs = stack_recs;
    if (count < 0 || count > data.len)
        goto fallback;
    if (count > STACK_RECORDS && !(recs = (rec_t *)PyMem_Malloc((size_t)count * sizeof(rec_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    if (parse_records((const uint8_t *)data.buf, data.len, count, recs))
        goto fallback;
    for (int c = 0; c < 5; c++)
        if (!(cols[c] = PyList_New(count)))
            goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        const rec_t *r = &recs[i];
        int64_t offset, ts = max_ts;
        if (__builtin_add_overflow((int64_t)base_offset, r->offset, &offset) ||
            (!log_append && __builtin_add_overflow((int64_t)base_ts, r->ts_delta, &ts)))
            goto fallback;
        PyObject *items[5] = {PyLong_FromLongLong(offset), PyLong_FromLongLong(ts), nullable_bytes(r->key, r->klen),
                              nullable_bytes(r->value, r->vlen),
                              r->nheaders ? header_list(r) : Py_NewRef(Py_None)};
        int failed = 0;
        for (int c = 0; c < 5; c++) {
            if (items[c] == NULL)
                failed = 1;
            else
                PyList_SET_ITEM(cols[c], i, items[c]);
        }
        if (failed)
            goto done; /* the lists own what was made; a NULL slot is fine for Py_DECREF of a list */
    }
    result = PyTuple_Pack(5, cols[0], cols[1], cols[2], cols[3], cols[4]);
    goto done;
fallback:
    result = Py_NewRef(Py_None);
done:
    for (int c = 0; c < 5; c++)
        Py_XDECREF(cols[c]);
    if (recs != stack_recs)
        PyMem_Free(recs);
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
    {"records_columns", records_columns, METH_VARARGS,
     "records_columns(data, count, base_offset, base_ts, log_append, max_ts) -> the records as five lists, or None."},
    {"records_check", records_check, METH_VARARGS,
     "records_check(data, count, require_key, base_ts, ts_lo, ts_hi) -> True if the records pass produce validation."},
    {"prepare_produce", prepare_produce, METH_VARARGS,
     "prepare_produce(buf, next_offset, epoch, max_set_bytes, max_batch_bytes, require_key, ts_lo, ts_hi, crc32c) -> "
     "(last_offset, max_timestamp, max_timestamp_offset, batches, producer_batches) with offsets and epochs written "
     "into buf, or None."},
    {"append_produced", (PyCFunction)(void (*)(void))append_produced, METH_FASTCALL,
     "append_produced(files, crc32c, wall_clock, log, data, one_batch) -> a leader's Log.append of a produced set in one call (the "
     "AppendInfo fields as a tuple), or None for Python's path."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cleaner_kernel",
    "The log cleaner's per-record loops in C; use it through shale.sidecar.log.cleaner_kernel.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cleaner_kernel(void) {
    for (int i = 0; i < N_NAMES; i++)
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(name_text[i])) == NULL)
            return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddStringConstant(m, "HASH_NAME", "xxh64x4") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
