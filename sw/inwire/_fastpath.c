/* The per-element work of the fast software aggregator (inwire.fastpath), compiled.

   accumulate(sums, payload, offset, count) -> bool
       Adds `count` big-endian int32 elements of `payload` (from byte `offset`) into `sums` (int64,
       writable, at least `count` long), each sum clipped at the int32 limits as it is made: the model
       saturates per contribution. Returns whether any sum clipped.
   encode_result(header, sums, status) -> bytes
       header + the sums as big-endian int32 + status: a result payload in one allocation.

   recv_batch(fd, buffer, slot_size, addresses) -> list
       Reads up to len(buffer) // slot_size datagrams with one recvmmsg (non-blocking), datagram i into
       buffer[i * slot_size:]; returns their sizes, or (size, (host, port)) pairs with `addresses`; an
       empty list when none is waiting.
   send_batch(fd, messages, start) -> (next, errors)
       Sends (payload, (host, port)) messages from index `start` with sendmmsg; stops at a full send
       buffer and returns the index of the first message not sent (len(messages) when all went) and the
       number of messages the kernel refused (skipped).

   One system call per batch instead of one per datagram: the way past Python's per-datagram loop.
   The Python fallback in fastpath.py does the same with numpy; tests/test_fastpath.py runs both against
   the golden model. */

#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

static int get_buffer(PyObject *object, Py_buffer *view, int writable, const char *what)
{
    if (PyObject_GetBuffer(object, view, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous%s buffer", what, writable ? " writable" : "");
        return -1;
    }
    return 0;
}

static PyObject *accumulate(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "accumulate(sums, payload, offset, count)");
        return NULL;
    }
    Py_ssize_t offset = PyLong_AsSsize_t(args[2]), count = PyLong_AsSsize_t(args[3]);
    if ((offset == -1 || count == -1) && PyErr_Occurred())
        return NULL;
    Py_buffer sums, payload;
    if (get_buffer(args[0], &sums, 1, "sums") < 0)
        return NULL;
    if (get_buffer(args[1], &payload, 0, "payload") < 0) {
        PyBuffer_Release(&sums);
        return NULL;
    }
    int saturated = 0;
    if (offset < 0 || count < 0 || sums.len < count * 8 || payload.len < offset + count * 4) {
        PyErr_SetString(PyExc_ValueError, "accumulate: sums or payload shorter than count elements");
        saturated = -1;
    } else {
        int64_t *sum = (int64_t *)sums.buf;
        const uint8_t *element = (const uint8_t *)payload.buf + offset;
        for (Py_ssize_t i = 0; i < count; i++, element += 4) {
            int32_t value = (int32_t)((uint32_t)element[0] << 24 | (uint32_t)element[1] << 16 |
                                      (uint32_t)element[2] << 8 | (uint32_t)element[3]);
            int64_t total = sum[i] + value;
            if (total > INT32_MAX) {
                total = INT32_MAX;
                saturated = 1;
            } else if (total < INT32_MIN) {
                total = INT32_MIN;
                saturated = 1;
            }
            sum[i] = total;
        }
    }
    PyBuffer_Release(&sums);
    PyBuffer_Release(&payload);
    if (saturated < 0)
        return NULL;
    return PyBool_FromLong(saturated);
}

static PyObject *encode_result(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode_result(header, sums, status)");
        return NULL;
    }
    Py_buffer header, sums, status;
    if (get_buffer(args[0], &header, 0, "header") < 0)
        return NULL;
    if (get_buffer(args[1], &sums, 0, "sums") < 0) {
        PyBuffer_Release(&header);
        return NULL;
    }
    if (get_buffer(args[2], &status, 0, "status") < 0) {
        PyBuffer_Release(&header);
        PyBuffer_Release(&sums);
        return NULL;
    }
    Py_ssize_t count = sums.len / 8;
    PyObject *result = PyBytes_FromStringAndSize(NULL, header.len + 4 * count + status.len);
    if (result != NULL) {
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
        memcpy(out, header.buf, header.len);
        out += header.len;
        const int64_t *sum = (const int64_t *)sums.buf;
        for (Py_ssize_t i = 0; i < count; i++, out += 4) {
            /* The sums were clipped as they were made: each fits int32. */
            uint32_t value = (uint32_t)(int32_t)sum[i];
            out[0] = value >> 24;
            out[1] = value >> 16;
            out[2] = value >> 8;
            out[3] = value;
        }
        memcpy(out, status.buf, status.len);
    }
    PyBuffer_Release(&header);
    PyBuffer_Release(&sums);
    PyBuffer_Release(&status);
    return result;
}

#define BATCH 64

static PyObject *recv_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "recv_batch(fd, buffer, slot_size, addresses)");
        return NULL;
    }
    int fd = PyLong_AsLong(args[0]);
    Py_ssize_t slot_size = PyLong_AsSsize_t(args[2]);
    int addresses = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer buffer;
    if (get_buffer(args[1], &buffer, 1, "buffer") < 0)
        return NULL;
    Py_ssize_t count = slot_size > 0 ? buffer.len / slot_size : 0;
    if (count > BATCH)
        count = BATCH;
    struct mmsghdr messages[BATCH];
    struct iovec vectors[BATCH];
    struct sockaddr_in peers[BATCH];
    memset(messages, 0, sizeof(messages[0]) * count);
    for (Py_ssize_t i = 0; i < count; i++) {
        vectors[i].iov_base = (char *)buffer.buf + i * slot_size;
        vectors[i].iov_len = slot_size;
        messages[i].msg_hdr.msg_iov = &vectors[i];
        messages[i].msg_hdr.msg_iovlen = 1;
        messages[i].msg_hdr.msg_name = &peers[i];
        messages[i].msg_hdr.msg_namelen = sizeof(peers[i]);
    }
    int received;
    Py_BEGIN_ALLOW_THREADS
    received = recvmmsg(fd, messages, count, MSG_DONTWAIT, NULL);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buffer);
    if (received < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return PyList_New(0);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *list = PyList_New(received);
    if (list == NULL)
        return NULL;
    for (int i = 0; i < received; i++) {
        PyObject *item;
        if (addresses) {
            char host[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &peers[i].sin_addr, host, sizeof(host));
            item = Py_BuildValue("(n(si))", (Py_ssize_t)messages[i].msg_len, host, ntohs(peers[i].sin_port));
        } else {
            item = PyLong_FromSsize_t(messages[i].msg_len);
        }
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static PyObject *send_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "send_batch(fd, messages: list, start)");
        return NULL;
    }
    int fd = PyLong_AsLong(args[0]);
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *list = args[1];
    Py_ssize_t total = PyList_GET_SIZE(list), errors = 0;
    struct mmsghdr messages[BATCH];
    struct iovec vectors[BATCH];
    struct sockaddr_in peers[BATCH];
    while (start < total) {
        Py_ssize_t count = total - start < BATCH ? total - start : BATCH;
        memset(messages, 0, sizeof(messages[0]) * count);
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *payload, *host_object;
            int port;
            PyObject *message = PyList_GET_ITEM(list, start + i);
            if (!PyArg_ParseTuple(message, "O(Ui)", &payload, &host_object, &port))
                return NULL;
            if (!PyBytes_Check(payload)) {
                PyErr_SetString(PyExc_TypeError, "send_batch: payloads must be bytes");
                return NULL;
            }
            const char *host = PyUnicode_AsUTF8(host_object);
            if (host == NULL)
                return NULL;
            memset(&peers[i], 0, sizeof(peers[i]));
            peers[i].sin_family = AF_INET;
            peers[i].sin_port = htons(port);
            if (inet_pton(AF_INET, host, &peers[i].sin_addr) != 1) {
                PyErr_Format(PyExc_ValueError, "send_batch: %s is not an IPv4 address", host);
                return NULL;
            }
            vectors[i].iov_base = PyBytes_AS_STRING(payload);
            vectors[i].iov_len = PyBytes_GET_SIZE(payload);
            messages[i].msg_hdr.msg_iov = &vectors[i];
            messages[i].msg_hdr.msg_iovlen = 1;
            messages[i].msg_hdr.msg_name = &peers[i];
            messages[i].msg_hdr.msg_namelen = sizeof(peers[i]);
        }
        /* The list holds the payloads, so their bytes stay put while the GIL is released. */
        int sent;
        Py_BEGIN_ALLOW_THREADS
        sent = sendmmsg(fd, messages, count, MSG_DONTWAIT);
        Py_END_ALLOW_THREADS
        if (sent > 0) {
            start += sent;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            break;
        } else {
            /* The first message was refused (e.g. an unreachable address): skip it, count it. */
            errors++;
            start++;
        }
    }
    return Py_BuildValue("(nn)", start, errors);
}

static PyMethodDef methods[] = {
    {"recv_batch", (PyCFunction)(void (*)(void))recv_batch, METH_FASTCALL,
     "recv_batch(fd, buffer, slot_size, addresses) -> list: datagrams read with one recvmmsg"},
    {"send_batch", (PyCFunction)(void (*)(void))send_batch, METH_FASTCALL,
     "send_batch(fd, messages, start) -> (next, errors): datagrams sent with sendmmsg"},
    {"accumulate", (PyCFunction)(void (*)(void))accumulate, METH_FASTCALL,
     "accumulate(sums, payload, offset, count) -> bool: saturating sum of big-endian int32 elements"},
    {"encode_result", (PyCFunction)(void (*)(void))encode_result, METH_FASTCALL,
     "encode_result(header, sums, status) -> bytes: a result payload"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath", "Compiled kernel of inwire.fastpath.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__fastpath(void)
{
    return PyModule_Create(&module);
}
