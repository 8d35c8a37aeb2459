/*
 * The node's I/O thread: a C thread with its own epoll that serves the plain connections the event loop lends it
 * (io_thread.py says when, docs/native-request-path.md why). For each read that is one whole frame it calls the
 * connection's native Produce (`native(buf, 4, n)`, _native_produce.c) and sends the answer; anything else - a
 * frame it declines, a partial frame or several, the end of the stream, an answer the socket cannot take whole,
 * an error - hands the socket back to the event loop with the bytes read and not yet sent, through
 * `handback(conn, received, declined, unsent, error)`, and the connection goes on there as if it had read them.
 *
 * Locking: the thread holds the GIL for everything but `epoll_wait`, so the slots table is guarded by the GIL.
 * A slot keeps its own duplicate of the socket's descriptor, so a descriptor closed by the loop is never
 * reused under the thread's feet. The native call may let the GIL go (the append's `pwrite`); a slot reclaimed
 * meanwhile is marked, and freed by the thread when the call returns.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define READ_BYTES (64 * 1024) /* one read: a one-record Produce is far smaller; a larger read goes back to the loop */
#define MIN_FRAME 12           /* size prefix, api key, version, correlation id */
#define WAKE_KEY UINT64_MAX    /* the eventfd's epoll key: stop() was called */

typedef struct {
    int fd;           /* this slot's duplicate of the socket, -1 when the slot is free */
    uint32_t gen;     /* bumped when the slot is freed: a ticket or event of an earlier lending is stale */
    int busy;         /* the thread is inside the native call for this slot (the GIL may be let go) */
    int reclaimed;    /* reclaimed while busy: the thread frees it after the call, without a hand-back */
    PyObject *conn;   /* handed back to `handback` */
    PyObject *native; /* native(buf, start, end) -> answer bytes (b"" for acks=0) | None */
} slot_t;

typedef struct {
    PyObject_HEAD
    int epfd, wakefd;
    pthread_t thread;
    int started, stopping;
    slot_t *slots;
    Py_ssize_t nslots;
    PyObject *handback;
    PyObject *buf;   /* bytearray of READ_BYTES: one read at a time, handed to `native` */
    PyObject *four;  /* the frame's start in `buf`, after its size prefix */
    unsigned long long answered, returned;
} IoThread;

static uint64_t key_of(Py_ssize_t index, uint32_t gen) { return ((uint64_t)gen << 32) | (uint64_t)index; }

/* The slot a ticket or epoll key names, if it is still that lending's; else NULL. */
static slot_t *slot_of(IoThread *self, uint64_t key) {
    const Py_ssize_t index = (Py_ssize_t)(key & 0xffffffffu);
    if (index >= self->nslots)
        return NULL;
    slot_t *s = &self->slots[index];
    return s->fd >= 0 && s->gen == (uint32_t)(key >> 32) ? s : NULL;
}

/* Take the slot's descriptor out of the epoll set (closing it would not: the loop's descriptor still refers to the
 * same socket), close it, free the slot and drop its references. */
static void free_slot(IoThread *self, slot_t *s) {
    epoll_ctl(self->epfd, EPOLL_CTL_DEL, s->fd, NULL);
    close(s->fd);
    s->fd = -1;
    s->gen++;
    s->busy = s->reclaimed = 0;
    Py_CLEAR(s->conn);
    Py_CLEAR(s->native);
}

/* Give the socket back to the loop: `handback(conn, received, declined, unsent, error)`, with the GIL held. */
static void give_back(IoThread *self, slot_t *s, const char *received, Py_ssize_t nreceived, int declined,
                      const char *unsent, Py_ssize_t nunsent, PyObject *error) {
    PyObject *conn = Py_NewRef(s->conn);
    free_slot(self, s);
    self->returned++;
    PyObject *got = PyBytes_FromStringAndSize(received, nreceived);
    PyObject *left = PyBytes_FromStringAndSize(unsent, nunsent);
    PyObject *done = got == NULL || left == NULL ? NULL
        : PyObject_CallFunctionObjArgs(self->handback, conn, got, declined ? Py_True : Py_False, left,
                                       error != NULL ? error : Py_None, NULL);
    if (done == NULL) /* the loop is gone (shutting down): nothing is left to serve the connection */
        PyErr_WriteUnraisable(self->handback);
    Py_XDECREF(done);
    Py_XDECREF(got);
    Py_XDECREF(left);
    Py_DECREF(conn);
}

/* The raised exception, normalized and with its traceback, as a new reference. */
static PyObject *raised(void) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (value == NULL)
        value = Py_NewRef(Py_None);
    else if (traceback != NULL)
        PyException_SetTraceback(value, traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    return value;
}

/* Write all of `data` to the socket without blocking; how much went. */
static Py_ssize_t send_all(int fd, const char *data, Py_ssize_t n) {
    Py_ssize_t sent = 0;
    while (sent < n) {
        const ssize_t w = send(fd, data + sent, (size_t)(n - sent), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        sent += w;
    }
    return sent;
}

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* One readable lent socket, with the GIL held. */
static void serve(IoThread *self, uint64_t key) {
    slot_t *s = slot_of(self, key);
    if (s == NULL || s->busy) /* reclaimed since epoll_wait returned */
        return;
    char *b = PyByteArray_AS_STRING(self->buf);
    const ssize_t n = recv(s->fd, b, READ_BYTES, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) { /* the end of the stream or an error: the loop reads it again and ends the connection */
        give_back(self, s, NULL, 0, 0, NULL, 0, NULL);
        return;
    }
    if (n < MIN_FRAME || be32((const unsigned char *)b) != (uint32_t)(n - 4)) { /* not one whole frame */
        give_back(self, s, b, n, 0, NULL, 0, NULL);
        return;
    }
    const Py_ssize_t index = s - self->slots; /* the table may grow (move) while the GIL is let go */
    s->busy = 1;
    PyObject *end = PyLong_FromSsize_t(n);
    PyObject *args[3] = {self->buf, self->four, end};
    PyObject *answer = end == NULL ? NULL : PyObject_Vectorcall(s->native, args, 3, NULL);
    Py_XDECREF(end);
    s = &self->slots[index];
    s->busy = 0;
    if (answer != NULL && answer != Py_None && !PyBytes_Check(answer)) {
        Py_SETREF(answer, NULL);
        PyErr_SetString(PyExc_TypeError, "the native Produce gave neither bytes nor None");
    }
    if (answer == NULL) { /* failed after the append (before it, the call declines): the loop logs and closes */
        PyObject *error = raised();
        if (s->reclaimed) /* the loop closes the connection anyway */
            free_slot(self, s);
        else
            give_back(self, s, NULL, 0, 0, NULL, 0, error);
        Py_DECREF(error);
        return;
    }
    if (answer == Py_None) {
        Py_DECREF(answer);
        if (s->reclaimed)
            free_slot(self, s);
        else
            give_back(self, s, b, n, 1, NULL, 0, NULL);
        return;
    }
    /* Appended: the answer goes out even if the loop reclaimed the socket meanwhile (it is still open here). */
    const Py_ssize_t len = PyBytes_GET_SIZE(answer);
    const Py_ssize_t sent = send_all(s->fd, PyBytes_AS_STRING(answer), len);
    self->answered++;
    if (s->reclaimed)
        free_slot(self, s);
    else if (sent < len) /* the socket's buffer is full (or it failed): the loop's transport writes the rest */
        give_back(self, s, NULL, 0, 0, PyBytes_AS_STRING(answer) + sent, len - sent, NULL);
    Py_DECREF(answer);
}

static void *run(void *arg) {
    IoThread *self = arg;
    /* The process's signals are the main thread's (Python runs their handlers there): none interrupts this one. */
    sigset_t outside;
    sigemptyset(&outside);
    const int async_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD, SIGALRM, SIGWINCH, SIGPIPE};
    for (size_t i = 0; i < sizeof async_signals / sizeof async_signals[0]; i++)
        sigaddset(&outside, async_signals[i]);
    pthread_sigmask(SIG_BLOCK, &outside, NULL);
    PyGILState_STATE gil = PyGILState_Ensure();
    struct epoll_event events[64];
    while (!self->stopping) {
        int n;
        Py_BEGIN_ALLOW_THREADS
        n = epoll_wait(self->epfd, events, 64, -1);
        Py_END_ALLOW_THREADS
        if (n < 0 && errno != EINTR) {
            PyErr_SetFromErrno(PyExc_OSError);
            PyErr_WriteUnraisable((PyObject *)self); /* cannot happen with a valid epoll descriptor */
            break;
        }
        for (int i = 0; i < n && !self->stopping; i++)
            if (events[i].data.u64 != WAKE_KEY)
                serve(self, events[i].data.u64);
    }
    PyGILState_Release(gil);
    return NULL;
}

/* lend(fd, conn, native) -> ticket: serve the socket `fd` from the thread until it is handed back or reclaimed. */
static PyObject *io_lend(IoThread *self, PyObject *args) {
    int fd;
    PyObject *conn, *native;
    if (!PyArg_ParseTuple(args, "iOO", &fd, &conn, &native))
        return NULL;
    if (self->stopping) {
        PyErr_SetString(PyExc_RuntimeError, "the I/O thread is stopped");
        return NULL;
    }
    Py_ssize_t index = 0;
    while (index < self->nslots && (self->slots[index].fd >= 0 || self->slots[index].busy))
        index++;
    if (index == self->nslots) {
        const Py_ssize_t grown = self->nslots ? 2 * self->nslots : 16;
        slot_t *slots = PyMem_Realloc(self->slots, grown * sizeof(slot_t));
        if (slots == NULL)
            return PyErr_NoMemory();
        for (Py_ssize_t i = self->nslots; i < grown; i++)
            slots[i] = (slot_t){.fd = -1};
        self->slots = slots;
        self->nslots = grown;
    }
    slot_t *s = &self->slots[index];
    const int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = key_of(index, s->gen)};
    if (epoll_ctl(self->epfd, EPOLL_CTL_ADD, dup, &ev) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        close(dup);
        return NULL;
    }
    if (!self->started) {
        const int err = pthread_create(&self->thread, NULL, run, self);
        if (err != 0) {
            epoll_ctl(self->epfd, EPOLL_CTL_DEL, dup, NULL);
            close(dup);
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        self->started = 1;
    }
    s->fd = dup;
    s->conn = Py_NewRef(conn);
    s->native = Py_NewRef(native);
    return PyLong_FromUnsignedLongLong(key_of(index, s->gen));
}

/* reclaim(ticket) -> True if the socket was still lent: the thread no longer serves it (the loop closes it). */
static PyObject *io_reclaim(IoThread *self, PyObject *arg) {
    const unsigned long long key = PyLong_AsUnsignedLongLong(arg);
    if (key == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    slot_t *s = slot_of(self, key);
    if (s == NULL)
        Py_RETURN_FALSE;
    if (s->busy) { /* inside the native call, the GIL let go: the thread frees it when the call returns */
        s->reclaimed = 1;
        Py_RETURN_TRUE;
    }
    free_slot(self, s);
    Py_RETURN_TRUE;
}

/* Stop the thread and give every lent socket back (with nothing read), so each connection ends on the loop. */
static void stop(IoThread *self) {
    if (self->started && !self->stopping) {
        self->stopping = 1;
        const uint64_t one = 1;
        const ssize_t woken = write(self->wakefd, &one, sizeof one); /* fails only on a counter overflow */
        (void)woken;
        Py_BEGIN_ALLOW_THREADS
        pthread_join(self->thread, NULL);
        Py_END_ALLOW_THREADS
    }
    self->stopping = 1;
    for (Py_ssize_t i = 0; i < self->nslots; i++)
        if (self->slots[i].fd >= 0)
            give_back(self, &self->slots[i], NULL, 0, 0, NULL, 0, NULL);
}

static PyObject *io_stop(IoThread *self, PyObject *unused) {
    stop(self);
    Py_RETURN_NONE;
}

static PyObject *io_lent(IoThread *self, void *unused) {
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < self->nslots; i++)
        n += self->slots[i].fd >= 0;
    return PyLong_FromSsize_t(n);
}

static PyObject *io_answered(IoThread *self, void *unused) { return PyLong_FromUnsignedLongLong(self->answered); }
static PyObject *io_returned(IoThread *self, void *unused) { return PyLong_FromUnsignedLongLong(self->returned); }

static int io_init(IoThread *self, PyObject *args, PyObject *kwds) {
    PyObject *handback;
    if (!PyArg_ParseTuple(args, "O", &handback))
        return -1;
    if (self->epfd > 0) {
        PyErr_SetString(PyExc_RuntimeError, "IoThread is initialized once");
        return -1;
    }
    self->handback = Py_NewRef(handback);
    if ((self->buf = PyByteArray_FromStringAndSize(NULL, READ_BYTES)) == NULL ||
        (self->four = PyLong_FromLong(4)) == NULL)
        return -1;
    if ((self->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 || (self->wakefd = eventfd(0, EFD_CLOEXEC)) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = WAKE_KEY};
    if (epoll_ctl(self->epfd, EPOLL_CTL_ADD, self->wakefd, &ev) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

static void io_dealloc(IoThread *self) {
    if (self->epfd > 0) {
        stop(self);
        close(self->epfd);
        close(self->wakefd);
    }
    PyMem_Free(self->slots);
    Py_XDECREF(self->handback);
    Py_XDECREF(self->buf);
    Py_XDECREF(self->four);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef io_methods[] = {
    {"lend", (PyCFunction)io_lend, METH_VARARGS,
     "lend(fd, conn, native) -> ticket: serve the socket from the thread until it is handed back or reclaimed."},
    {"reclaim", (PyCFunction)io_reclaim, METH_O,
     "reclaim(ticket) -> True if it was still lent: the thread no longer serves the socket."},
    {"stop", (PyCFunction)io_stop, METH_NOARGS, "stop(): end the thread and hand every lent socket back."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef io_getset[] = {
    {"lent", (getter)io_lent, NULL, "sockets lent now", NULL},
    {"answered", (getter)io_answered, NULL, "requests answered by the thread", NULL},
    {"returned", (getter)io_returned, NULL, "sockets handed back to the loop", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject IoThreadType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shale.sidecar.server.network._io_thread.IoThread",
    .tp_basicsize = sizeof(IoThread),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "IoThread(handback): a C thread serving lent sockets' one-record Produce (io_thread.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)io_init,
    .tp_dealloc = (destructor)io_dealloc,
    .tp_methods = io_methods,
    .tp_getset = io_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_io_thread",
    "The node's I/O thread; use it through shale.sidecar.server.network.io_thread.", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__io_thread(void) {
    if (PyType_Ready(&IoThreadType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "IoThread", (PyObject *)&IoThreadType) < 0 ||
        PyModule_AddIntConstant(m, "READ_BYTES", READ_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
