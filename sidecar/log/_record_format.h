/*
 * Kafka's v2 record batches read in C, shared by the log engine's C modules (_cleaner_kernel.c,
 * _append_kernel.c, _columns_kernel.c): the batch header's attribute bits and sizes, big-endian fields,
 * zigzag varints and the records of one batch. Strict: a reader's -1 means "let Python's decoder decide",
 * never a verdict of its own. Included after <Python.h> (Py_ssize_t).
 *
 * A module that keeps its own per-record scratch beside what parse_records reads (the cleaner's map key)
 * defines REC_SCRATCH, the extra members of rec_t, before it includes this header.
 */

#ifndef SHALE_RECORD_FORMAT_H
#define SHALE_RECORD_FORMAT_H

#include <stdint.h>
#include <string.h>

#define BATCH_OVERHEAD 61 /* records.BATCH_OVERHEAD: the batch header up to and with recordsCount */
#define LOG_OVERHEAD 12   /* base offset and length */
#define ATTR_COMPRESSION 0x07
#define ATTR_TIMESTAMP_TYPE 0x08
#define ATTR_TRANSACTIONAL 0x10
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

/* Records parsed on the stack up to this many; more take the heap. */
#define STACK_RECORDS 32

/* ---------------------------------------------------------------------------------------------
 * Big-endian fields.
 */

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

#ifndef REC_SCRATCH
#define REC_SCRATCH
#endif

typedef struct {
    int64_t offset;   /* the delta as read, then the absolute offset */
    int64_t ts_delta; /* the delta as read */
    const uint8_t *key;
    int64_t klen; /* < 0: null */
    const uint8_t *value;
    int64_t vlen; /* < 0: null */
    const uint8_t *headers; /* first header, after the count */
    const uint8_t *end;     /* end of the record */
    int64_t nheaders;
    int nonascii_header_key;
    REC_SCRATCH
} rec_t;

/* Parse `count` records filling exactly [data, data+len); -1 if Python's decoder could disagree. */
static inline int parse_records(const uint8_t *data, Py_ssize_t len, Py_ssize_t count, rec_t *recs) {
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

#endif
