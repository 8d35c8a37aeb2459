/*
 * A batch's records as columns, in C (records.py: decode_columns): readers that want columns (the Spark data
 * source's Arrow batches) skip a Record object per record.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_record_format.h"

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
        int64_t hk = 0, hv = -1;
        const uint8_t *kd = NULL, *vd = NULL;
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

static PyMethodDef methods[] = {
    {"records_columns", records_columns, METH_VARARGS,
     "records_columns(data, count, base_offset, base_ts, log_append, max_ts) -> the records as five lists, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_columns_kernel",
    "A batch's records as five lists in C; use it through shale.sidecar.log.records.decode_columns.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__columns_kernel(void) { return PyModule_Create(&module); }
