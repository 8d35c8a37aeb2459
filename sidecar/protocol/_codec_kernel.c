/*
 * The schema-driven codec's hot path in C: one interpreter of the programs that compiled_codec.py builds
 * from Kafka's JSON message definitions, so that no (API, version) is written here by hand.
 *
 * A struct program is the tuple
 *     (data_class, version, nullable, names, fields, tagged, single, base_slots)
 * and a field program the tuple
 *     (name, kind, sub, default, slot)
 * (see compiled_codec.py for what each member means). A slot is the offset of the field's __slots__ member in
 * instances of the data class (kafka-python's data classes keep their fields in slots), so a decoded value is
 * stored as the slot's descriptor would store it, without a generic attribute lookup per field; -1: set it
 * with setattr. The functions do exactly what generated_codec.py's
 * generated Python does for the same schema and version: the same data classes and values out of a
 * request frame, the same bytes out of a response dict. Anything the generated code would leave to the
 * reference codec - and anything unusual this file does not bother with (an integer-like object that is not
 * an int, a UUID given as a string, a memoryview of items wider than a byte) - raises, and the caller then
 * asks the generated Python (codec.py), which handles it or leaves it to the reference in turn.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define UNLIKELY(x) (x)
#endif

/* Field kinds: compiled_codec.py's KIND_* constants. */
enum {
    K_INT8 = 1, K_INT16, K_UINT16, K_INT32, K_INT64, K_FLOAT64, K_BOOL,
    K_BITFIELD, K_UUID, K_STRING, K_BYTES, K_ARRAY, K_STRUCTS, K_STRUCT
};

/* Tagged-field modes, as generated_codec's `tagged` argument: False, True, None. */
enum { TAGS_NONE = 0, TAGS_READ = 1, TAGS_EMPTY = 2 };

/* Struct program members. */
enum { S_CLASS, S_VERSION, S_NULLABLE, S_NAMES, S_FIELDS, S_TAGGED, S_SINGLE, S_BASE_SLOTS };
/* Field program members. */
enum { F_NAME, F_KIND, F_SUB, F_DEFAULT, F_SLOT };
/* A tagged field: (tag, uvarint of the tag, field program). */
enum { T_TAG, T_TAG_BYTES, T_FIELD };

static PyObject *Unhandled;      /* _codec_kernel.Unhandled, a ValueError: left to the generated codec */
static PyObject *REQUIRED;       /* a field without a schema default: a missing key is an error */
static PyObject *UUID_CLASS;     /* uuid.UUID, what UUID fields decode into */
static PyObject *str_version, *str_tags, *str_unknown_tags, *str_header, *str_bytes, *str_size, *str_empty;
static PyObject *kw_bytes;       /* ("bytes",) */

static int unhandled(const char *why) {
    PyErr_SetString(Unhandled, why);
    return -1;
}

/* obj.<name> = value (a new reference, consumed): straight into the slot at `slot`, else through setattr. */
static int store(PyObject *obj, PyObject *slot, PyObject *name, PyObject *value) {
    Py_ssize_t offset = PyLong_AsSsize_t(slot);
    if (offset < 0) {
        int rc = PyObject_SetAttr(obj, name, value);
        Py_DECREF(value);
        return rc;
    }
    PyObject **where = (PyObject **)((char *)obj + offset);
    Py_XSETREF(*where, value);
    return 0;
}

/* slot_offset(cls, name) -> the offset of a writable object slot of instances of cls, or -1. */
static PyObject *slot_offset(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyType_Check(args[0]) || !PyUnicode_Check(args[1]))
        return PyErr_Format(PyExc_TypeError, "slot_offset(cls, name)"), NULL;
    PyObject *descr = _PyType_Lookup((PyTypeObject *)args[0], args[1]);
    if (descr != NULL && Py_TYPE(descr) == &PyMemberDescr_Type) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type == T_OBJECT_EX && !(member->flags & READONLY)) return PyLong_FromSsize_t(member->offset);
    }
    return PyLong_FromLong(-1);
}

/* ---------------------------------------------------------------------------------------------------
 * Decoding: a reader over the frame's bytes.
 */

typedef struct {
    const uint8_t *data;
    Py_ssize_t len;
    Py_ssize_t pos;
    PyObject *source;   /* the frame object: bytes fields are sliced from it when `views` */
    int views;
} Reader;

static inline int need(Reader *r, Py_ssize_t n) {
    if (UNLIKELY(n < 0 || r->len - r->pos < n)) return unhandled("truncated frame");
    return 0;
}

static int read_uvarint(Reader *r, uint64_t *out) {
    uint64_t value = 0;
    int shift = 0;
    for (;;) {
        if (need(r, 1) < 0) return -1;
        uint8_t b = r->data[r->pos++];
        if (shift >= 63) return unhandled("varint too long"); /* Python's would be a big int: left to it */
        value |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) break;
        shift += 7;
    }
    *out = value;
    return 0;
}

static inline uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

/* A length: compact (unsigned varint of n + 1) or legacy (int16 for strings, int32 otherwise). */
static int read_length(Reader *r, int compact, int legacy_bytes, Py_ssize_t *out) {
    if (compact) {
        uint64_t v;
        if (read_uvarint(r, &v) < 0) return -1;
        if (v > (uint64_t)PY_SSIZE_T_MAX) return unhandled("length too large");
        *out = (Py_ssize_t)v - 1;
        return 0;
    }
    if (need(r, legacy_bytes) < 0) return -1;
    *out = legacy_bytes == 2 ? (int16_t)be16(r->data + r->pos) : (int32_t)be32(r->data + r->pos);
    r->pos += legacy_bytes;
    return 0;
}

static PyObject *decode_struct(PyObject *prog, Reader *r, int compact, int tagged, int top);

static PyObject *bits_from(uint32_t value) {
    if (value == 0x80000000u) Py_RETURN_NONE; /* the reference's "omitted" value {31} */
    PyObject *bits = PySet_New(NULL);
    if (bits == NULL) return NULL;
    for (int i = 0; i < 32; i++) {
        if (value >> i & 1) {
            PyObject *n = PyLong_FromLong(i);
            if (n == NULL || PySet_Add(bits, n) < 0) { Py_XDECREF(n); Py_DECREF(bits); return NULL; }
            Py_DECREF(n);
        }
    }
    return bits;
}

static PyObject *decode_simple(int kind, Reader *r, int compact) {
    const uint8_t *p;
    switch (kind) {
    case K_INT8: if (need(r, 1) < 0) return NULL; p = r->data + r->pos; r->pos += 1; return PyLong_FromLong((int8_t)p[0]);
    case K_BOOL: if (need(r, 1) < 0) return NULL; p = r->data + r->pos; r->pos += 1; return PyBool_FromLong(p[0] != 0);
    case K_INT16: if (need(r, 2) < 0) return NULL; p = r->data + r->pos; r->pos += 2; return PyLong_FromLong((int16_t)be16(p));
    case K_UINT16: if (need(r, 2) < 0) return NULL; p = r->data + r->pos; r->pos += 2; return PyLong_FromLong(be16(p));
    case K_INT32: if (need(r, 4) < 0) return NULL; p = r->data + r->pos; r->pos += 4; return PyLong_FromLong((int32_t)be32(p));
    case K_INT64: if (need(r, 8) < 0) return NULL; p = r->data + r->pos; r->pos += 8; return PyLong_FromLongLong((int64_t)be64(p));
    case K_FLOAT64: {
        if (need(r, 8) < 0) return NULL;
        double d = PyFloat_Unpack8((const char *)r->data + r->pos, 0);
        if (d == -1.0 && PyErr_Occurred()) return NULL;
        r->pos += 8;
        return PyFloat_FromDouble(d);
    }
    case K_BITFIELD: if (need(r, 4) < 0) return NULL; p = r->data + r->pos; r->pos += 4; return bits_from(be32(p));
    case K_UUID: {
        if (need(r, 16) < 0) return NULL;
        p = r->data + r->pos;
        r->pos += 16;
        int zero = 1;
        for (int i = 0; i < 16; i++) zero &= p[i] == 0;
        if (zero) Py_RETURN_NONE;
        PyObject *b = PyBytes_FromStringAndSize((const char *)p, 16);
        if (b == NULL) return NULL;
        PyObject *args[2] = {NULL, b};
        PyObject *u = PyObject_Vectorcall(UUID_CLASS, args + 1, 0 | PY_VECTORCALL_ARGUMENTS_OFFSET, kw_bytes);
        Py_DECREF(b);
        return u;
    }
    case K_STRING:
    case K_BYTES: {
        Py_ssize_t n;
        if (read_length(r, compact, kind == K_STRING ? 2 : 4, &n) < 0) return NULL;
        if (n < 0) Py_RETURN_NONE;
        if (need(r, n) < 0) return NULL;
        PyObject *v;
        if (kind == K_STRING) v = PyUnicode_DecodeUTF8((const char *)r->data + r->pos, n, NULL);
        else if (r->views) { /* a slice of the frame object itself: a view into the caller's buffer */
            PyObject *lo = PyLong_FromSsize_t(r->pos), *hi = PyLong_FromSsize_t(r->pos + n);
            PyObject *slice = lo == NULL || hi == NULL ? NULL : PySlice_New(lo, hi, NULL);
            v = slice == NULL ? NULL : PyObject_GetItem(r->source, slice);
            Py_XDECREF(slice); Py_XDECREF(lo); Py_XDECREF(hi);
        } else v = PyBytes_FromStringAndSize((const char *)r->data + r->pos, n);
        if (v == NULL) return NULL;
        r->pos += n;
        return v;
    }
    }
    unhandled("no decoder for this kind");
    return NULL;
}

static PyObject *decode_value(PyObject *field, Reader *r, int compact, int tagged) {
    int kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(field, F_KIND));
    PyObject *sub = PyTuple_GET_ITEM(field, F_SUB);
    if (kind == K_STRUCT) return decode_struct(sub, r, compact, tagged, 0);
    if (kind != K_ARRAY && kind != K_STRUCTS) return decode_simple(kind, r, compact);
    Py_ssize_t n;
    if (read_length(r, compact, 4, &n) < 0) return NULL;
    if (n == -1) Py_RETURN_NONE;
    if (n < 0) n = 0; /* as range(n) */
    if (n > r->len - r->pos) return unhandled("truncated frame"), NULL; /* every item takes a byte at least */
    PyObject *list = PyList_New(n);
    if (list == NULL) return NULL;
    int item_kind = kind == K_ARRAY ? (int)PyLong_AsLong(PyTuple_GET_ITEM(sub, F_KIND)) : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = kind == K_STRUCTS ? decode_struct(sub, r, compact, tagged, 0) : decode_simple(item_kind, r, compact);
        if (item == NULL) { Py_DECREF(list); return NULL; }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static int read_tags(PyObject *prog, Reader *r, PyObject *obj) {
    uint64_t count;
    if (read_uvarint(r, &count) < 0) return -1;
    PyObject *tagged = PyTuple_GET_ITEM(prog, S_TAGGED);
    Py_ssize_t ntagged = PyTuple_GET_SIZE(tagged);
    for (uint64_t k = 0; k < count; k++) {
        uint64_t tag, size;
        if (read_uvarint(r, &tag) < 0 || read_uvarint(r, &size) < 0) return -1;
        PyObject *known = NULL;
        for (Py_ssize_t i = 0; i < ntagged; i++) {
            PyObject *t = PyTuple_GET_ITEM(tagged, i);
            if ((uint64_t)PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, T_TAG)) == tag) { known = t; break; }
        }
        if (known != NULL) {
            PyObject *field = PyTuple_GET_ITEM(known, T_FIELD);
            PyObject *v = decode_value(field, r, 1, TAGS_EMPTY);
            if (v == NULL || store(obj, PyTuple_GET_ITEM(field, F_SLOT), PyTuple_GET_ITEM(field, F_NAME), v) < 0)
                return -1;
            PyObject *tags = PyObject_GetAttr(obj, str_tags);
            if (tags == NULL) return -1;
            if (tags == Py_None) {
                Py_DECREF(tags);
                if ((tags = PySet_New(NULL)) == NULL) return -1;
                if (PyObject_SetAttr(obj, str_tags, tags) < 0) { Py_DECREF(tags); return -1; }
            }
            int rc = PySet_Add(tags, PyTuple_GET_ITEM(field, F_NAME));
            Py_DECREF(tags);
            if (rc < 0) return -1;
        } else {
            if (size > (uint64_t)PY_SSIZE_T_MAX || need(r, (Py_ssize_t)size) < 0) return unhandled("truncated frame");
            PyObject *unknown = PyObject_GetAttr(obj, str_unknown_tags);
            if (unknown == NULL) return -1;
            if (unknown == Py_None) {
                Py_DECREF(unknown);
                if ((unknown = PyDict_New()) == NULL) return -1;
                if (PyObject_SetAttr(obj, str_unknown_tags, unknown) < 0) { Py_DECREF(unknown); return -1; }
            }
            PyObject *key = PyUnicode_FromFormat("_%llu", (unsigned long long)tag);
            PyObject *value = PyBytes_FromStringAndSize((const char *)r->data + r->pos, (Py_ssize_t)size);
            int rc = key == NULL || value == NULL ? -1 : PyDict_SetItem(unknown, key, value);
            Py_XDECREF(key); Py_XDECREF(value); Py_DECREF(unknown);
            if (rc < 0) return -1;
            r->pos += (Py_ssize_t)size;
        }
    }
    return 0;
}

static PyObject *decode_struct(PyObject *prog, Reader *r, int compact, int tagged, int top) {
    if (!top && PyTuple_GET_ITEM(prog, S_NULLABLE) == Py_True) { /* KIP-893 nullable struct: a 1-byte marker */
        if (need(r, 1) < 0) return NULL;
        if (r->data[r->pos++] == 0xff) Py_RETURN_NONE;
    }
    PyTypeObject *cls = (PyTypeObject *)PyTuple_GET_ITEM(prog, S_CLASS);
    PyObject *obj = cls->tp_alloc(cls, 0);
    if (obj == NULL) return NULL;
    PyObject *base = PyTuple_GET_ITEM(prog, S_BASE_SLOTS); /* slots of _version, tags, unknown_tags */
    if (store(obj, PyTuple_GET_ITEM(base, 0), str_version, Py_NewRef(PyTuple_GET_ITEM(prog, S_VERSION))) < 0 ||
        store(obj, PyTuple_GET_ITEM(base, 1), str_tags, Py_NewRef(Py_None)) < 0 ||
        store(obj, PyTuple_GET_ITEM(base, 2), str_unknown_tags, Py_NewRef(Py_None)) < 0)
        goto fail;
    PyObject *fields = PyTuple_GET_ITEM(prog, S_FIELDS);
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(fields); i < n; i++) {
        PyObject *field = PyTuple_GET_ITEM(fields, i);
        PyObject *v = decode_value(field, r, compact, tagged);
        if (v == NULL || store(obj, PyTuple_GET_ITEM(field, F_SLOT), PyTuple_GET_ITEM(field, F_NAME), v) < 0)
            goto fail;
    }
    if (tagged == TAGS_READ) {
        if (need(r, 1) < 0) goto fail;
        if (r->data[r->pos] == 0) r->pos++;
        else if (read_tags(prog, r, obj) < 0) goto fail;
    } else if (tagged == TAGS_EMPTY) {
        if (need(r, 1) < 0) goto fail;
        if (r->data[r->pos] != 0) { unhandled("tagged fields inside a tagged field"); goto fail; }
        r->pos++;
    }
    return obj;
fail:
    Py_DECREF(obj);
    return NULL;
}

/* decode_request(header_prog, body_prog, flexible, frame) -> (body, header); body._header is header. */
static PyObject *decode_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) return PyErr_Format(PyExc_TypeError, "decode_request takes 4 arguments"), NULL;
    int flexible = PyObject_IsTrue(args[2]);
    Py_buffer view;
    if (PyObject_GetBuffer(args[3], &view, PyBUF_SIMPLE) < 0) return NULL;
    Reader r = {view.buf, view.len, 0, args[3], 0};
    PyObject *header = decode_struct(args[0], &r, 0, flexible ? TAGS_READ : TAGS_NONE, 1);
    PyObject *body = header == NULL ? NULL : decode_struct(args[1], &r, flexible, flexible ? TAGS_READ : TAGS_NONE, 1);
    PyBuffer_Release(&view);
    if (body == NULL || PyObject_SetAttr(body, str_header, header) < 0) {
        Py_XDECREF(header); Py_XDECREF(body);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(2, body, header);
    Py_DECREF(body); Py_DECREF(header);
    return out;
}

/* decode_body(prog, flexible, views, frame, pos) -> (body, end): a response body (the client side). */
static PyObject *decode_body(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) return PyErr_Format(PyExc_TypeError, "decode_body takes 5 arguments"), NULL;
    int flexible = PyObject_IsTrue(args[1]), views = PyObject_IsTrue(args[2]);
    Py_ssize_t pos = PyLong_AsSsize_t(args[4]);
    if (pos == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[3], &view, PyBUF_SIMPLE) < 0) return NULL;
    Reader r = {view.buf, view.len, pos, args[3], views};
    PyObject *body = pos < 0 || pos > view.len ? (unhandled("truncated frame"), NULL)
                                               : decode_struct(args[0], &r, flexible, flexible ? TAGS_READ : TAGS_NONE, 1);
    PyBuffer_Release(&view);
    if (body == NULL) return NULL;
    PyObject *end = PyLong_FromSsize_t(r.pos);
    PyObject *out = end == NULL ? NULL : PyTuple_Pack(2, body, end);
    Py_DECREF(body); Py_XDECREF(end);
    return out;
}

/* ---------------------------------------------------------------------------------------------------
 * Encoding: a growing byte buffer, and the parts list for record sets that stay outside it (sendfile).
 */

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
    PyObject *parts;  /* NULL until an external record set is met: then [b"", chunk, external, chunk, ...] */
} Writer;

static int grow(Writer *w, Py_ssize_t n) {
    if (w->cap - w->len >= n) return 0;
    Py_ssize_t cap = w->cap ? w->cap : 256;
    while (cap - w->len < n) {
        if (cap > PY_SSIZE_T_MAX / 2) { PyErr_NoMemory(); return -1; }
        cap *= 2;
    }
    char *buf = PyMem_Realloc(w->buf, cap);
    if (buf == NULL) { PyErr_NoMemory(); return -1; }
    w->buf = buf;
    w->cap = cap;
    return 0;
}

static inline int put(Writer *w, const void *p, Py_ssize_t n) {
    if (grow(w, n) < 0) return -1;
    memcpy(w->buf + w->len, p, n);
    w->len += n;
    return 0;
}

static inline int put_byte(Writer *w, uint8_t b) { return put(w, &b, 1); }

static int put_be(Writer *w, uint64_t v, int n) {
    uint8_t b[8];
    for (int i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
    return put(w, b, n);
}

static int put_uvarint(Writer *w, uint64_t n) {
    uint8_t b[10];
    int k = 0;
    while (n & ~(uint64_t)0x7F) { b[k++] = (uint8_t)((n & 0x7F) | 0x80); n >>= 7; }
    b[k++] = (uint8_t)n;
    return put(w, b, k);
}

static int put_length(Writer *w, Py_ssize_t n, int compact, int legacy_bytes) {
    if (compact) return put_uvarint(w, (uint64_t)(n + 1));
    if (legacy_bytes == 2 && (n < -32768 || n > 32767)) return unhandled("string too long");
    if (legacy_bytes == 4 && (n < INT32_MIN || n > INT32_MAX)) return unhandled("value too long");
    return put_be(w, (uint64_t)n, legacy_bytes);
}

/* The bytes so far become a part, then `external` (its size already written). */
static int put_external(Writer *w, PyObject *external) {
    if (w->parts == NULL) {
        w->parts = PyList_New(0);
        if (w->parts == NULL || PyList_Append(w->parts, str_empty) < 0) return -1;
    }
    PyObject *chunk = PyBytes_FromStringAndSize(w->buf, w->len);
    if (chunk == NULL) return -1;
    int rc = PyList_Append(w->parts, chunk);
    Py_DECREF(chunk);
    if (rc < 0 || PyList_Append(w->parts, external) < 0) return -1;
    w->len = 0;
    return 0;
}

static int int_in(PyObject *v, long long lo, long long hi, long long *out) {
    if (!PyLong_Check(v)) return unhandled("not an int");
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (overflow || x < lo || x > hi) return unhandled("int out of range");
    *out = x;
    return 0;
}

static int encode_bits(Writer *w, PyObject *v) {
    uint32_t value = 0;
    if (v == Py_None) value = 0x80000000u;
    else {
        PyObject *it = PyObject_GetIter(v);
        if (it == NULL) return -1;
        PyObject *b;
        while ((b = PyIter_Next(it)) != NULL) {
            long long bit;
            int rc = int_in(b, 0, 31, &bit);
            Py_DECREF(b);
            if (rc < 0) { Py_DECREF(it); return -1; }
            value |= 1u << bit;
        }
        Py_DECREF(it);
        if (PyErr_Occurred()) return -1;
    }
    return put_be(w, value, 4);
}

static int encode_simple(Writer *w, int kind, PyObject *v, int compact) {
    long long x;
    switch (kind) {
    case K_INT8: if (int_in(v, -128, 127, &x) < 0) return -1; return put_be(w, (uint64_t)x, 1);
    case K_INT16: if (int_in(v, -32768, 32767, &x) < 0) return -1; return put_be(w, (uint64_t)x, 2);
    case K_UINT16: if (int_in(v, 0, 65535, &x) < 0) return -1; return put_be(w, (uint64_t)x, 2);
    case K_INT32: if (int_in(v, INT32_MIN, INT32_MAX, &x) < 0) return -1; return put_be(w, (uint64_t)x, 4);
    case K_INT64: if (int_in(v, INT64_MIN, INT64_MAX, &x) < 0) return -1; return put_be(w, (uint64_t)x, 8);
    case K_BOOL: {
        int t = PyObject_IsTrue(v);
        return t < 0 ? -1 : put_byte(w, (uint8_t)t);
    }
    case K_FLOAT64: {
        if (!PyFloat_Check(v) && !PyLong_Check(v)) return unhandled("not a number");
        double d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        char b[8];
        if (PyFloat_Pack8(d, b, 0) < 0) return -1;
        return put(w, b, 8);
    }
    case K_BITFIELD: return encode_bits(w, v);
    case K_UUID: {
        if (v == Py_None) {
            static const char zero[16];
            return put(w, zero, 16);
        }
        PyObject *b = PyObject_GetAttr(v, str_bytes);
        if (b == NULL) { PyErr_Clear(); return unhandled("uuid without bytes"); }
        int rc = PyBytes_Check(b) && PyBytes_GET_SIZE(b) == 16 ? put(w, PyBytes_AS_STRING(b), 16)
                                                                  : unhandled("uuid bytes not 16 bytes");
        Py_DECREF(b);
        return rc;
    }
    case K_STRING: {
        if (v == Py_None) return compact ? put_byte(w, 0) : put_be(w, 0xFFFF, 2);
        if (!PyUnicode_Check(v)) return unhandled("string field value not a str");
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(v, &n);
        if (s == NULL) return -1;
        if (put_length(w, n, compact, 2) < 0) return -1;
        return put(w, s, n);
    }
    case K_BYTES: {
        if (PyBytes_CheckExact(v)) {
            Py_ssize_t n = PyBytes_GET_SIZE(v);
            if (put_length(w, n, compact, 4) < 0) return -1;
            return put(w, PyBytes_AS_STRING(v), n);
        }
        if (v == Py_None) return compact ? put_byte(w, 0) : put_be(w, 0xFFFFFFFFu, 4);
        if (PyByteArray_Check(v) || PyMemoryView_Check(v)) {
            Py_buffer view;
            if (PyObject_GetBuffer(v, &view, PyBUF_SIMPLE) < 0) { PyErr_Clear(); return unhandled("not a byte buffer"); }
            Py_ssize_t items = PyObject_Size(v);
            int rc = items != view.len ? unhandled("buffer of items wider than a byte")
                     : put_length(w, view.len, compact, 4) < 0 ? -1 : put(w, view.buf, view.len);
            PyBuffer_Release(&view);
            return rc;
        }
        if (PyUnicode_Check(v)) return unhandled("bytes field value is a str");
        PyObject *size = PyObject_GetAttr(v, str_size);
        if (size == NULL) { PyErr_Clear(); return unhandled("bytes field value without a size"); }
        long long n;
        int rc = int_in(size, 0, INT32_MAX, &n);
        Py_DECREF(size);
        if (rc < 0 || put_length(w, (Py_ssize_t)n, compact, 4) < 0) return -1;
        return put_external(w, v);
    }
    }
    return unhandled("no encoder for this kind");
}

static int encode_struct(PyObject *prog, PyObject *d, Writer *w, int compact, int tagged, int top);

/* The value of a field in dict `d`: the schema default when the key is missing (a new reference). */
static PyObject *field_value(PyObject *field, PyObject *d) {
    PyObject *v = PyDict_GetItemWithError(d, PyTuple_GET_ITEM(field, F_NAME));
    if (v == NULL) {
        if (PyErr_Occurred()) return NULL;
        v = PyTuple_GET_ITEM(field, F_DEFAULT);
        if (v == REQUIRED) return unhandled("a required field is missing"), NULL;
    }
    Py_INCREF(v);
    return v;
}

static int check_names(PyObject *names, PyObject *d) {
    if (!PyDict_CheckExact(d)) return unhandled("struct value not a dict");
    Py_ssize_t i = 0;
    PyObject *key, *value;
    while (PyDict_Next(d, &i, &key, &value)) {
        int found = PySet_Contains(names, key);
        if (found < 0) return -1;
        if (!found) return unhandled("unknown field");
    }
    return 0;
}

static int encode_value(PyObject *field, PyObject *v, Writer *w, int compact, int tagged) {
    int kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(field, F_KIND));
    PyObject *sub = PyTuple_GET_ITEM(field, F_SUB);
    if (kind == K_STRUCT) return encode_struct(sub, v, w, compact, tagged, 0);
    if (kind != K_ARRAY && kind != K_STRUCTS) return encode_simple(w, kind, v, compact);
    if (v == Py_None) return compact ? put_byte(w, 0) : put_be(w, 0xFFFFFFFFu, 4);
    if (!PyList_Check(v) && !PyTuple_Check(v)) return unhandled("array value not a list or tuple");
    Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
    if (put_length(w, n, compact, 4) < 0) return -1;
    int item_kind = kind == K_ARRAY ? (int)PyLong_AsLong(PyTuple_GET_ITEM(sub, F_KIND)) : 0;
    PyObject *single = kind == K_STRUCTS ? PyTuple_GET_ITEM(sub, S_SINGLE) : Py_None;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PySequence_Fast_GET_SIZE(v) != n) return unhandled("array changed while encoded");
        PyObject *item = Py_NewRef(PySequence_Fast_GET_ITEM(v, i)); /* held: encoding it may run Python code */
        int rc;
        if (kind == K_ARRAY) rc = encode_simple(w, item_kind, item, compact);
        else if (single == Py_None) rc = encode_struct(sub, item, w, compact, tagged, 0);
        else {
            /* The reference encodes a one-field struct's items by that field alone, its tagged buffer empty. */
            PyObject *only = check_names(PyTuple_GET_ITEM(sub, S_NAMES), item) < 0 ? NULL : field_value(single, item);
            rc = only == NULL ? -1 : encode_value(single, only, w, compact, tagged);
            Py_XDECREF(only);
            if (rc == 0 && tagged != TAGS_NONE) rc = put_byte(w, 0);
        }
        Py_DECREF(item);
        if (rc < 0) return -1;
    }
    return 0;
}

/* The tagged-field buffer: each tagged field whose value is not its default, in schema order. */
static int encode_tags(PyObject *prog, PyObject *d, Writer *w) {
    PyObject *tagged = PyTuple_GET_ITEM(prog, S_TAGGED);
    Py_ssize_t n = PyTuple_GET_SIZE(tagged);
    if (n == 0) return put_byte(w, 0);
    Writer values = {NULL, 0, 0, NULL};
    Py_ssize_t found = 0, ends[64];
    int rc = -1;
    if (n > 64) { unhandled("too many tagged fields"); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *field = PyTuple_GET_ITEM(PyTuple_GET_ITEM(tagged, i), T_FIELD);
        PyObject *v = field_value(field, d);
        if (v == NULL) goto done;
        int differs = PyObject_RichCompareBool(v, PyTuple_GET_ITEM(field, F_DEFAULT), Py_NE);
        int bad = differs < 0 || (differs && encode_value(field, v, &values, 1, TAGS_EMPTY) < 0);
        Py_DECREF(v);
        if (bad) goto done;
        if (values.parts != NULL) { unhandled("a record set in a tagged field"); goto done; }
        ends[i] = differs ? values.len : -1;
        found += differs;
    }
    if (found == 0) { rc = put_byte(w, 0); goto done; }
    if (put_uvarint(w, (uint64_t)found) < 0) goto done;
    for (Py_ssize_t i = 0, start = 0; i < n; i++) {
        if (ends[i] < 0) continue;
        PyObject *tag = PyTuple_GET_ITEM(PyTuple_GET_ITEM(tagged, i), T_TAG_BYTES);
        if (put(w, PyBytes_AS_STRING(tag), PyBytes_GET_SIZE(tag)) < 0 || put_uvarint(w, (uint64_t)(ends[i] - start)) < 0 ||
            put(w, values.buf + start, ends[i] - start) < 0)
            goto done;
        start = ends[i];
    }
    rc = 0;
done:
    PyMem_Free(values.buf);
    Py_XDECREF(values.parts);
    return rc;
}

static int encode_struct(PyObject *prog, PyObject *d, Writer *w, int compact, int tagged, int top) {
    if (!top && PyTuple_GET_ITEM(prog, S_NULLABLE) == Py_True) {
        if (d == Py_None) return put_byte(w, 0xff);
        if (put_byte(w, 0x01) < 0) return -1;
    }
    if (check_names(PyTuple_GET_ITEM(prog, S_NAMES), d) < 0) return -1;
    PyObject *fields = PyTuple_GET_ITEM(prog, S_FIELDS);
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(fields); i < n; i++) {
        PyObject *field = PyTuple_GET_ITEM(fields, i);
        PyObject *v = field_value(field, d);
        if (v == NULL) return -1;
        int rc = encode_value(field, v, w, compact, tagged);
        Py_DECREF(v);
        if (rc < 0) return -1;
    }
    if (tagged == TAGS_READ) return encode_tags(prog, d, w);
    if (tagged == TAGS_EMPTY) return put_byte(w, 0);
    return 0;
}

/* encode(prog, flexible, head, body, framed) -> bytes, or parts when the body holds external record sets.
 *
 * `head` is the header's bytes (a response's correlation id and tagged buffer). Without an external record
 * set the answer is one bytes object, size-prefixed when `framed`; with one it is generated_codec's list:
 * [b"", bytes, external, bytes, ...] (the caller frames it).
 */
static PyObject *encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) return PyErr_Format(PyExc_TypeError, "encode takes 5 arguments"), NULL;
    int flexible = PyObject_IsTrue(args[1]), framed = PyObject_IsTrue(args[4]);
    if (!PyBytes_Check(args[2])) return PyErr_Format(PyExc_TypeError, "head must be bytes"), NULL;
    Writer w = {NULL, 0, 0, NULL};
    PyObject *out = NULL;
    if (grow(&w, 512) < 0) return NULL;
    w.len = 4; /* room for the size prefix */
    if (put(&w, PyBytes_AS_STRING(args[2]), PyBytes_GET_SIZE(args[2])) < 0 ||
        encode_struct(args[0], args[3], &w, flexible, flexible ? TAGS_READ : TAGS_NONE, 1) < 0)
        goto done;
    if (w.parts == NULL) {
        Py_ssize_t size = w.len - 4;
        if (size > INT32_MAX) { unhandled("response too large"); goto done; }
        for (int i = 0; i < 4; i++) w.buf[i] = (char)((uint32_t)size >> (8 * (3 - i)));
        out = framed ? PyBytes_FromStringAndSize(w.buf, w.len) : PyBytes_FromStringAndSize(w.buf + 4, size);
    } else {
        PyObject *chunk = PyBytes_FromStringAndSize(w.buf, w.len);
        if (chunk != NULL && PyList_Append(w.parts, chunk) == 0) {
            /* the first chunk carries the 4 bytes reserved for a prefix: the caller frames a parts list */
            PyObject *first = PyList_GET_ITEM(w.parts, 1);
            PyObject *cut = PyBytes_FromStringAndSize(PyBytes_AS_STRING(first) + 4, PyBytes_GET_SIZE(first) - 4);
            if (cut != NULL) {
                PyList_SetItem(w.parts, 1, cut);
                out = w.parts;
                w.parts = NULL;
            }
        }
        Py_XDECREF(chunk);
    }
done:
    PyMem_Free(w.buf);
    Py_XDECREF(w.parts);
    return out;
}

static PyMethodDef methods[] = {
    {"decode_request", (PyCFunction)(void (*)(void))decode_request, METH_FASTCALL,
     "decode_request(header_prog, body_prog, flexible, frame) -> (body, header)"},
    {"decode_body", (PyCFunction)(void (*)(void))decode_body, METH_FASTCALL,
     "decode_body(prog, flexible, views, frame, pos) -> (body, end)"},
    {"encode", (PyCFunction)(void (*)(void))encode, METH_FASTCALL,
     "encode(prog, flexible, head, body, framed) -> bytes or parts"},
    {"slot_offset", (PyCFunction)(void (*)(void))slot_offset, METH_FASTCALL,
     "slot_offset(cls, name) -> offset of a writable object slot of cls's instances, or -1"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_codec_kernel",
                                    "Interpreter of compiled_codec's schema programs.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__codec_kernel(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Unhandled = PyErr_NewException("_codec_kernel.Unhandled", PyExc_ValueError, NULL);
    REQUIRED = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    str_version = PyUnicode_InternFromString("_version");
    str_tags = PyUnicode_InternFromString("tags");
    str_unknown_tags = PyUnicode_InternFromString("unknown_tags");
    str_header = PyUnicode_InternFromString("_header");
    str_bytes = PyUnicode_InternFromString("bytes");
    str_size = PyUnicode_InternFromString("size");
    str_empty = PyBytes_FromStringAndSize(NULL, 0);
    kw_bytes = PyTuple_Pack(1, str_bytes);
    PyObject *uuid = PyImport_ImportModule("uuid");
    UUID_CLASS = uuid == NULL ? NULL : PyObject_GetAttrString(uuid, "UUID");
    Py_XDECREF(uuid);
    if (Unhandled == NULL || REQUIRED == NULL || str_empty == NULL || kw_bytes == NULL || UUID_CLASS == NULL ||
        PyModule_AddObjectRef(m, "Unhandled", Unhandled) < 0 || PyModule_AddObjectRef(m, "REQUIRED", REQUIRED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
