/*
 * A one-record Produce answered in one C call from the connection's read callback (native_produce.py says when,
 * docs/native-request-path.md why): decode the frame with the schema-compiled decoder, append with the log's C
 * append, encode the answer with the schema-compiled encoder. Nothing here knows a message's layout: the
 * decoder, encoder and append are the ones the Python path uses, called from here without the interpreter's
 * frames in between. Whatever this call does not take - another API, a decoding error, a transactional id,
 * several partitions, acks outside -1/0/1, no log here, an append the C append declines - it declines with
 * nothing done, and the frame takes the Python path, which answers or names the fault exactly as before.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

enum {
    N_WAITING, N_DECODERS, N_ENCODERS, N_ENCODE, N_LOCAL_LOG, N_APPEND, N_EVENTS, N_POKE,
    N_OBSERVE, N_TRANSACTIONAL_ID, N_ACKS, N_TOPIC_DATA, N_PARTITION_DATA, N_NAME, N_INDEX, N_RECORDS,
    N_LOG_START_OFFSET, N_RESPONSES, N_PARTITION_RESPONSES, N_ERROR_CODE, N_BASE_OFFSET, N_LOG_APPEND_TIME_MS,
    N_THROTTLE_TIME_MS, N_PRODUCE, N_ANSWERS, N_ENCODE_RESPONSE, N_NAMES
};
static const char *const name_text[N_NAMES] = {
    "waiting", "decoders", "encoders", "encode", "local_log", "append", "events", "poke",
    "observe", "transactional_id", "acks", "topic_data", "partition_data", "name", "index", "records",
    "log_start_offset", "responses", "partition_responses", "error_code", "base_offset", "log_append_time_ms",
    "throttle_time_ms", "Produce", "answers", "encode_response",
};
static PyObject *names[N_NAMES];
static PyObject *zero, *minus_one;
/* Appends made by this module, counted before the parked fetches are looked at: a Fetch that read the log and
 * parks from another thread than the I/O thread's compares it before and after parking (FetchPurgatory.park). */
static unsigned long long appends;

#define API_PRODUCE 0

static double monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.perf_counter's clock on Linux */
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* `obj.<name>`, a new reference (NULL with an exception). */
static inline PyObject *attr(PyObject *obj, int name) { return PyObject_GetAttr(obj, names[name]); }

/* The only item of `obj.<name>` when it is a list of one, else NULL without an exception (or with one). */
static PyObject *only_item(PyObject *obj, int name) {
    PyObject *list = attr(obj, name);
    if (list == NULL)
        return NULL;
    PyObject *item = PyList_Check(list) && PyList_GET_SIZE(list) == 1 ? Py_NewRef(PyList_GET_ITEM(list, 0)) : NULL;
    Py_DECREF(list);
    return item;
}

/* Produce's answer for one partition, as the handler builds it (partitions.py: PartitionApis._produce_partition). */
static PyObject *answer_body(PyObject *topic, PyObject *index, PyObject *base_offset, PyObject *log_start) {
    PyObject *part = Py_BuildValue("{OOOOOOOOOO}", names[N_INDEX], index, names[N_ERROR_CODE], zero,
                                   names[N_BASE_OFFSET], base_offset, names[N_LOG_APPEND_TIME_MS], minus_one,
                                   names[N_LOG_START_OFFSET], log_start);
    if (part == NULL)
        return NULL;
    return Py_BuildValue("{O[{OOO[N]}]OO}", names[N_RESPONSES], names[N_NAME], topic, names[N_PARTITION_RESPONSES],
                         part, names[N_THROTTLE_TIME_MS], zero);
}

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void put_be64(unsigned char *p, uint64_t v) {
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

/* The framed answer from the schema-compiled encoder (compiled_codec.response_program's program, flexible, tags). */
static PyObject *encode_answer(PyObject *path, int version, int32_t correlation_id, PyObject *name, PyObject *index,
                               long long base_offset, long long log_start) {
    PyObject *base = PyLong_FromLongLong(base_offset), *start = PyLong_FromLongLong(log_start);
    PyObject *body = base == NULL || start == NULL ? NULL : answer_body(name, index, base, start);
    Py_XDECREF(base);
    Py_XDECREF(start);
    if (body == NULL)
        return NULL;
    PyObject *result = NULL;
    PyObject *encoders = attr(path, N_ENCODERS), *encode = attr(path, N_ENCODE);
    PyObject *key = PyLong_FromLong(version);
    PyObject *found = key == NULL || encoders == NULL ? NULL : PyDict_GetItemWithError(encoders, key); /* borrowed */
    Py_XDECREF(key);
    if (found != NULL && encode != NULL && PyTuple_Check(found) && PyTuple_GET_SIZE(found) == 3) {
        PyObject *tags = PyTuple_GET_ITEM(found, 2);
        const Py_ssize_t ntags = PyBytes_Check(tags) ? PyBytes_GET_SIZE(tags) : 0;
        PyObject *head = PyBytes_FromStringAndSize(NULL, 4 + ntags);
        if (head != NULL) {
            put_be32((unsigned char *)PyBytes_AS_STRING(head), (uint32_t)correlation_id);
            if (ntags)
                memcpy(PyBytes_AS_STRING(head) + 4, PyBytes_AS_STRING(tags), ntags);
            result = PyObject_CallFunctionObjArgs(encode, PyTuple_GET_ITEM(found, 0), PyTuple_GET_ITEM(found, 1), head,
                                                  body, Py_True, NULL);
            Py_DECREF(head);
        }
    } else if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_RuntimeError, "no compiled encoder for Produce v%d", version);
    }
    Py_XDECREF(encoders);
    Py_XDECREF(encode);
    Py_DECREF(body);
    if (result != NULL && !PyBytes_Check(result)) {
        Py_DECREF(result);
        PyErr_Format(PyExc_RuntimeError, "the compiled encoder of Produce v%d gave no bytes", version);
        return NULL;
    }
    return result;
}

/* Where the 8 big-endian bytes of `value` stand in `data`, if exactly once; else -1. */
static Py_ssize_t only_place(const unsigned char *data, Py_ssize_t len, uint64_t value) {
    unsigned char needle[8];
    put_be64(needle, value);
    Py_ssize_t at = -1;
    for (Py_ssize_t i = 0; i + 8 <= len; i++)
        if (data[i] == needle[0] && memcmp(data + i, needle, 8) == 0) {
            if (at >= 0)
                return -1;
            at = i;
        }
    return at;
}

#define MAX_LAYOUTS 4096
/* Probe values for the two offsets: their bytes spell "SHALE" and cannot pass for anything else in an answer. */
#define PROBE_BASE 0x5348414c45424153ULL
#define PROBE_START 0x5348414c45535441ULL

/* The framed answer to a one-partition Produce. An answer of the same version, topic and partition differs from
 * the last one only in three fixed-width numbers (the correlation id, the base offset, the log start offset), so
 * the encoder's output for probe values is kept as a layout, `path.answers[(version, topic, partition)]` =
 * (bytes, base offset's position, log start offset's position or -1 before v5, which has none), found by where
 * the probe values came out; the next answers are that copy with the numbers written in. Encoding a dict cost more than the rest of the answer
 * path on a server woken for each request (issue 18). */
static PyObject *answer(PyObject *path, int version, int32_t correlation_id, PyObject *name, PyObject *index,
                        long long base_offset, long long log_start) {
    PyObject *answers = attr(path, N_ANSWERS);
    if (answers == NULL)
        return NULL;
    PyObject *result = NULL, *layout = NULL;
    PyObject *key = Py_BuildValue("(iOO)", version, name, index);
    if (key == NULL)
        goto done;
    if (!PyDict_Check(answers)) {
        PyErr_SetString(PyExc_TypeError, "NativeProduce.answers is not a dict");
        goto done;
    }
    layout = Py_XNewRef(PyDict_GetItemWithError(answers, key));
    if (layout == NULL && !PyErr_Occurred()) {
        PyObject *probe = encode_answer(path, version, 0, name, index, (long long)PROBE_BASE, (long long)PROBE_START);
        if (probe == NULL)
            goto done;
        const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(probe);
        const Py_ssize_t len = PyBytes_GET_SIZE(probe);
        const Py_ssize_t at_base = only_place(p, len, PROBE_BASE);
        Py_ssize_t at_start = only_place(p, len, PROBE_START);
        if (at_start < 0) { /* not in this version's answer (v3-4), if another value leaves the answer the same */
            PyObject *again = encode_answer(path, version, 0, name, index, (long long)PROBE_BASE,
                                            (long long)(PROBE_START ^ 0xff));
            if (again == NULL) {
                Py_DECREF(probe);
                goto done;
            }
            if (PyBytes_GET_SIZE(again) != len || memcmp(PyBytes_AS_STRING(again), p, len) != 0)
                at_start = -2; /* there, but not found once: no layout */
            Py_DECREF(again);
        }
        if (at_base >= 8 && at_start != -2 && (at_start < 0 || at_start >= 8) && PyDict_GET_SIZE(answers) < MAX_LAYOUTS) {
            layout = Py_BuildValue("(Onn)", probe, at_base, at_start);
            if (layout == NULL || PyDict_SetItem(answers, key, layout) < 0) {
                Py_DECREF(probe);
                goto done;
            }
        }
        Py_DECREF(probe);
        if (layout == NULL) /* no layout to keep: the encoder answers this one */
            result = encode_answer(path, version, correlation_id, name, index, base_offset, log_start);
    }
    if (layout != NULL) {
        PyObject *bytes = PyTuple_GET_ITEM(layout, 0);
        const Py_ssize_t at_base = PyLong_AsSsize_t(PyTuple_GET_ITEM(layout, 1));
        const Py_ssize_t at_start = PyLong_AsSsize_t(PyTuple_GET_ITEM(layout, 2));
        result = PyBytes_FromStringAndSize(PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes));
        if (result != NULL) {
            unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
            put_be32(out + 4, (uint32_t)correlation_id); /* after the size prefix: the response header's first field */
            put_be64(out + at_base, (uint64_t)base_offset);
            if (at_start >= 0)
                put_be64(out + at_start, (uint64_t)log_start);
        }
    }
done:
    Py_XDECREF(layout);
    Py_XDECREF(key);
    Py_DECREF(answers);
    return result;
}

/* The work of produce() once the frame decoded as a Produce: the answer, None to decline, NULL on error. */
static PyObject *take(PyObject *path, PyObject *body, int version, int32_t correlation_id, double started) {
    PyObject *result = NULL, *acks_obj = NULL, *topic = NULL, *part = NULL, *name = NULL, *index = NULL;
    PyObject *records = NULL, *log = NULL, *info = NULL, *tmp = NULL;
    int declined = 1;
    if ((tmp = attr(body, N_TRANSACTIONAL_ID)) == NULL || tmp != Py_None) /* verified by the coordinator: Python's */
        goto done;
    Py_CLEAR(tmp);
    if ((acks_obj = attr(body, N_ACKS)) == NULL)
        goto done;
    int overflow = 0;
    const long acks = PyLong_Check(acks_obj) ? PyLong_AsLongAndOverflow(acks_obj, &overflow) : 2;
    if (overflow) /* not an int16: the decoder never gives one, and the handler names what it is */
        goto done;
    if ((acks != -1 && acks != 0 && acks != 1) || (topic = only_item(body, N_TOPIC_DATA)) == NULL ||
        (part = only_item(topic, N_PARTITION_DATA)) == NULL || (name = attr(topic, N_NAME)) == NULL ||
        !PyUnicode_Check(name) || (index = attr(part, N_INDEX)) == NULL || (records = attr(part, N_RECORDS)) == NULL ||
        records == Py_None)
        goto done;
    if ((tmp = attr(path, N_LOCAL_LOG)) == NULL)
        goto done;
    log = PyObject_CallFunctionObjArgs(tmp, name, index, NULL);
    Py_CLEAR(tmp);
    if (log == NULL || log == Py_None)
        goto done;
    PyObject *append = attr(path, N_APPEND); /* log.APPEND_IN_C: (log, data, one_batch) */
    if (append != NULL)
        info = PyObject_CallFunctionObjArgs(append, log, records, Py_True, NULL);
    Py_XDECREF(append);
    if (info == NULL || info == Py_None)
        goto done;
    declined = 0; /* appended: from here on the request is answered, or the error propagates */
    appends++;
    PyObject *events = attr(path, N_EVENTS);
    if (events == NULL)
        goto done;
    const int watched = PyDict_Check(events) && PyDict_GET_SIZE(events) > 0;
    Py_DECREF(events);
    if (watched) { /* fetches wait on some partition: let Python wake those on this one */
        PyObject *poke = attr(path, N_POKE);
        PyObject *poked = poke == NULL ? NULL : PyObject_CallFunctionObjArgs(poke, name, index, NULL);
        Py_XDECREF(poke);
        if (poked == NULL)
            goto done;
        Py_DECREF(poked);
    }
    PyObject *observe = attr(path, N_OBSERVE);
    if (observe == NULL)
        goto done;
    if (observe != Py_None) {
        PyObject *seconds = PyFloat_FromDouble(monotonic() - started);
        PyObject *seen = seconds == NULL ? NULL : PyObject_CallFunctionObjArgs(observe, names[N_PRODUCE], seconds, NULL);
        Py_XDECREF(seconds);
        Py_DECREF(observe);
        if (seen == NULL)
            goto done;
        Py_DECREF(seen);
    } else {
        Py_DECREF(observe);
    }
    if (acks == 0) { /* no answer at all */
        result = PyBytes_FromStringAndSize(NULL, 0);
        goto done;
    }
    PyObject *log_start = attr(log, N_LOG_START_OFFSET);
    if (log_start == NULL)
        goto done;
    const long long base_offset = PyLong_AsLongLong(PyTuple_GET_ITEM(info, 0)), lso = PyLong_AsLongLong(log_start);
    Py_DECREF(log_start);
    if ((base_offset == -1 || lso == -1) && PyErr_Occurred())
        goto done;
    result = answer(path, version, correlation_id, name, index, base_offset, lso);
    if (result == NULL) {
        /* The record is in the log: it must be answered, not retried into a second copy. codec.encode_response
         * tries the compiled encoder, then the generated one, then the reference, as the handler's answer would. */
        PyErr_Clear();
        PyObject *fallback = attr(path, N_ENCODE_RESPONSE);
        PyObject *body = NULL, *base = PyLong_FromLongLong(base_offset), *start = PyLong_FromLongLong(lso);
        if (fallback != NULL && base != NULL && start != NULL && (body = answer_body(name, index, base, start)) != NULL)
            result = PyObject_CallFunction(fallback, "iiiO", API_PRODUCE, version, (int)correlation_id, body);
        Py_XDECREF(fallback);
        Py_XDECREF(body);
        Py_XDECREF(base);
        Py_XDECREF(start);
    }
done:
    if (declined) {
        PyErr_Clear(); /* whatever failed before the append, Python's path meets it again and names it */
        Py_CLEAR(result);
        result = Py_NewRef(Py_None);
    }
    Py_XDECREF(tmp);
    Py_XDECREF(acks_obj);
    Py_XDECREF(topic);
    Py_XDECREF(part);
    Py_XDECREF(name);
    Py_XDECREF(index);
    Py_XDECREF(records);
    Py_XDECREF(log);
    Py_XDECREF(info);
    return result;
}

/* produce(path, replies, buf, start, end) -> the framed answer (b"" for acks=0), or None to leave the frame to
 * Python.
 *
 * `path` (native_produce.NativeProduce) holds the decoders, encoders and calls to use; `replies` is the
 * connection's writer queue (socket_server.py: _Replies): with an answer waiting in it nothing is answered here, so
 * answers leave in request order; `buf[start:end]` is the request frame without its size prefix (the
 * connection's receive buffer, held unchanged for the call). */
static PyObject *produce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "produce(path, replies, buf, start, end) takes 5 arguments");
        return NULL;
    }
    PyObject *path = args[0], *replies = args[1];
    const Py_ssize_t start = PyLong_AsSsize_t(args[3]), end = PyLong_AsSsize_t(args[4]);
    if ((start == -1 || end == -1) && PyErr_Occurred())
        return NULL;
    PyObject *waiting = attr(replies, N_WAITING);
    if (waiting == NULL)
        return NULL;
    const int behind = PyObject_IsTrue(waiting);
    Py_DECREF(waiting);
    if (behind != 0)
        return behind < 0 ? NULL : Py_NewRef(Py_None);
    Py_buffer held;
    if (PyObject_GetBuffer(args[2], &held, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = NULL;
    if (start < 0 || end > held.len || end - start < 8) {
        PyErr_SetString(PyExc_ValueError, "produce: the frame's bounds lie outside the buffer");
        goto done;
    }
    const unsigned char *p = (const unsigned char *)held.buf + start;
    const int api_key = (int16_t)((p[0] << 8) | p[1]), version = (int16_t)((p[2] << 8) | p[3]);
    const int32_t correlation_id = (int32_t)(((uint32_t)p[4] << 24) | ((uint32_t)p[5] << 16) | ((uint32_t)p[6] << 8) |
                                             p[7]);
    if (api_key != API_PRODUCE) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    const double started = monotonic();
    PyObject *decoders = attr(path, N_DECODERS);
    if (decoders == NULL)
        goto done;
    PyObject *key = PyLong_FromLong(version);
    PyObject *decoder = key == NULL ? NULL : PyDict_GetItemWithError(decoders, key); /* borrowed */
    Py_XDECREF(key);
    PyObject *frame = decoder == NULL ? NULL : PyMemoryView_FromMemory((char *)p, end - start, PyBUF_READ);
    PyObject *decoded = frame == NULL ? NULL : PyObject_CallOneArg(decoder, frame);
    Py_XDECREF(frame);
    Py_DECREF(decoders);
    if (decoded == NULL || !PyTuple_Check(decoded) || PyTuple_GET_SIZE(decoded) != 2) {
        /* an unserved version, or a frame the compiled decoder does not read: Python's path decides and names it */
        Py_XDECREF(decoded);
        PyErr_Clear();
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = take(path, PyTuple_GET_ITEM(decoded, 0), version, correlation_id, started);
    Py_DECREF(decoded);
done:
    PyBuffer_Release(&held);
    return result;
}

/* observe(histograms, bounds, api, seconds): one answered request in metrics.RequestStats' histograms.
 *
 * `histograms` maps an API's name to a bytearray of doubles: the count, the sum of seconds, then one count per
 * bucket of `bounds` (a tuple of floats, ascending; a value equal to a bound belongs to it) and one for +Inf. One
 * C call, so a scrape thread copying a bytearray (under the GIL) sees a request counted whole or not at all, and
 * an answered request costs no Python frame for its metrics (issue 18). */
static PyObject *observe(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyDict_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "observe(histograms: dict, bounds: tuple, api, seconds)");
        return NULL;
    }
    const double seconds = PyFloat_AsDouble(args[3]);
    if (seconds == -1.0 && PyErr_Occurred())
        return NULL;
    const Py_ssize_t nbounds = PyTuple_GET_SIZE(args[1]), size = (3 + nbounds) * (Py_ssize_t)sizeof(double);
    PyObject *histogram = PyDict_GetItemWithError(args[0], args[2]); /* borrowed */
    if (histogram == NULL) {
        if (PyErr_Occurred() || (histogram = PyByteArray_FromStringAndSize(NULL, size)) == NULL)
            return NULL;
        memset(PyByteArray_AS_STRING(histogram), 0, size);
        const int stored = PyDict_SetItem(args[0], args[2], histogram);
        Py_DECREF(histogram); /* the dict holds it */
        if (stored < 0)
            return NULL;
    }
    if (!PyByteArray_Check(histogram) || PyByteArray_GET_SIZE(histogram) != size) {
        PyErr_SetString(PyExc_ValueError, "observe: a histogram is not a bytearray of the bounds' size");
        return NULL;
    }
    Py_ssize_t bucket = 0;
    while (bucket < nbounds && PyFloat_AsDouble(PyTuple_GET_ITEM(args[1], bucket)) < seconds)
        bucket++;
    if (PyErr_Occurred())
        return NULL;
    double *h = (double *)PyByteArray_AS_STRING(histogram);
    h[0] += 1;
    h[1] += seconds;
    h[2 + bucket] += 1;
    Py_RETURN_NONE;
}

static PyObject *appended(PyObject *self, PyObject *unused) { return PyLong_FromUnsignedLongLong(appends); }

static PyMethodDef methods[] = {
    {"appended", appended, METH_NOARGS, "appended() -> how many appends produce() has made in this process."},
    {"produce", (PyCFunction)(void (*)(void))produce, METH_FASTCALL,
     "produce(path, replies, buf, start, end) -> a one-partition Produce's framed answer (b\"\" for acks=0), or None for "
     "Python's path."},
    {"observe", (PyCFunction)(void (*)(void))observe, METH_FASTCALL,
     "observe(histograms, bounds, api, seconds): one answered request in RequestStats' histograms."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native_produce",
    "A one-record Produce answered in one C call; use it through shale.sidecar.server.network.native_produce.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native_produce(void) {
    for (int i = 0; i < N_NAMES; i++)
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(name_text[i])) == NULL)
            return NULL;
    if ((zero == NULL && (zero = PyLong_FromLong(0)) == NULL) ||
        (minus_one == NULL && (minus_one = PyLong_FromLong(-1)) == NULL))
        return NULL;
    return PyModule_Create(&module);
}
