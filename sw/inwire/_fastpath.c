/* The per-element work of the fast software aggregator (inwire.fastpath), compiled.

   accumulate(sums, payload, offset, count) -> bool
       Adds `count` big-endian int32 elements of `payload` (from byte `offset`) into `sums` (int64,
       writable, at least `count` long), each sum clipped at the int32 limits as it is made: the model
       saturates per contribution. Returns whether any sum clipped.
   encode_result(header, sums, status) -> bytes
       header + the sums as big-endian int32 + status: a result or partial payload (they share a layout)
       in one allocation.

   recv_batch(fd, buffer, slot_size, addresses) -> list
       Reads up to len(buffer) // slot_size datagrams with one recvmmsg (non-blocking), datagram i into
       buffer[i * slot_size:]; returns their sizes, or (size, (host, port)) pairs with `addresses`; an
       empty list when none is waiting.
   send_batch(fd, messages, start) -> (next, errors)
       Sends (payload, (host, port)) messages from index `start` with sendmmsg, runs of equal-sized
       payloads to one peer as one UDP GSO message; stops at a full send buffer and returns the index of
       the first message not sent (len(messages) when all went) and the number the kernel refused
       (skipped).

   quantize(values, factor, out, big_endian) -> (peak, finite)
       A member's elements: every float32 of `values` times `factor` (a power of two, float32), rounded
       half to even, into `out` as int32 (big-endian or native); returns the largest magnitude among the
       values and whether all were finite. The caller keeps `out` only if the peak fits: beyond it the
       elements are clamped, not meaningful (codec_average.encode then takes its definition).
   dequantize(sums, scale, fanin, out, big_endian) -> None
       An average: every int32 of `sums` as float64, times `scale` (a power of two), divided by `fanin`,
       rounded to float32 into `out`, which may be the sums' own memory (codec_average.decode's float64
       steps, element by element).

   One system call per batch instead of one per datagram: the way past Python's per-datagram loop.
   The Python fallback in fastpath.py does the same with numpy; tests/test_fastpath.py runs both against
   the golden model. */

#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/udp.h>
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

__attribute__((target_clones("avx2", "default")))
static int accumulate_elements(int64_t *restrict sum, const uint8_t *restrict element, Py_ssize_t count)
{
    /* Branch-free, so that it vectorizes: each sum clipped at the int32 limits, a flag of whether any was. */
    int saturated = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint32_t wire;
        memcpy(&wire, element + 4 * i, 4);
        int64_t total = sum[i] + (int32_t)__builtin_bswap32(wire);
        int64_t clipped = total > INT32_MAX ? INT32_MAX : total;
        clipped = clipped < INT32_MIN ? INT32_MIN : clipped;
        saturated |= clipped != total;
        sum[i] = clipped;
    }
    return saturated;
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
        saturated = accumulate_elements((int64_t *)sums.buf, (const uint8_t *)payload.buf + offset, count);
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

/* The codec's loops run at memory speed: one pass each, vectorized where the CPU allows (AVX2 where present,
   chosen at load time), with float semantics untouched (no fast-math, no contraction). */
#define CODEC_BLOCK 4096
#define ROUND_MAGIC 8388608.0f /* 2**23: float32 values at least this large are integers already */

__attribute__((target_clones("avx2", "default")))
static void quantize_block(const float *restrict values, Py_ssize_t count, float factor, int32_t *restrict out,
                           uint32_t *peak_io)
{
    /* The peak as the largest magnitude's bits: for floats that are not NaN the order of the bits is the order
       of the magnitudes, and infinity and NaN lie above every finite float's: an integer maximum that
       vectorizes and also tells whether all were finite. */
    uint32_t peak = *peak_io;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint32_t bits;
        memcpy(&bits, &values[i], 4);
        bits &= 0x7fffffffu;
        peak = bits > peak ? bits : peak;
        float scaled = values[i] * factor;
        /* Rounds half to even as rint does under the default rounding mode, in float32 adds that vectorize:
           adding and subtracting 2**23 (with the value's sign) leaves no fraction bits. */
        float magic = copysignf(ROUND_MAGIC, scaled);
        float shifted = (scaled + magic) - magic;
        float rounded = fabsf(scaled) < ROUND_MAGIC ? shifted : scaled;
        /* A defined conversion beyond the limit and for NaN, whose elements the caller does not keep. */
        rounded = rounded >= -2147483648.0f ? rounded : -2147483648.0f;
        rounded = rounded <= 2147483520.0f ? rounded : 2147483520.0f;
        out[i] = (int32_t)rounded;
    }
    *peak_io = peak;
}

__attribute__((target_clones("avx2", "default")))
static void swap_block(int32_t *restrict block, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++)
        block[i] = (int32_t)__builtin_bswap32((uint32_t)block[i]);
}

/* The input and the writable output of a codec call, of the same number of 4-byte elements; -1 with an error
   set (and neither held) otherwise. */
static Py_ssize_t get_elements(PyObject *in_object, Py_buffer *in, PyObject *out_object, Py_buffer *out,
                               const char *what)
{
    if (get_buffer(in_object, in, 0, what) < 0)
        return -1;
    if (get_buffer(out_object, out, 1, "out") < 0) {
        PyBuffer_Release(in);
        return -1;
    }
    if (in->len % 4 || out->len != in->len) {
        PyErr_Format(PyExc_ValueError, "%s and out must hold the same number of 4-byte elements", what);
        PyBuffer_Release(in);
        PyBuffer_Release(out);
        return -1;
    }
    return in->len / 4;
}

static PyObject *quantize(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "quantize(values, factor, out, big_endian)");
        return NULL;
    }
    float factor = (float)PyFloat_AsDouble(args[1]);
    int big_endian = PyObject_IsTrue(args[3]);
    if ((factor == -1.0f && PyErr_Occurred()) || big_endian < 0)
        return NULL;
    Py_buffer values, out;
    Py_ssize_t count = get_elements(args[0], &values, args[2], &out, "values");
    if (count < 0)
        return NULL;
    uint32_t peak = 0;
    const float *value = (const float *)values.buf;
    int32_t *element = (int32_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t first = 0; first < count; first += CODEC_BLOCK) {
        Py_ssize_t length = count - first < CODEC_BLOCK ? count - first : CODEC_BLOCK;
        quantize_block(value + first, length, factor, element + first, &peak);
        if (big_endian)
            swap_block(element + first, length); /* while the block is still in cache */
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&values);
    PyBuffer_Release(&out);
    float largest;
    memcpy(&largest, &peak, 4);
    return Py_BuildValue("(dO)", (double)largest, peak < 0x7f800000u ? Py_True : Py_False);
}

__attribute__((target_clones("avx2", "default")))
static void dequantize_block(const int32_t *restrict sums, Py_ssize_t count, double scale, double fanin,
                             float *restrict out)
{
    for (Py_ssize_t i = 0; i < count; i++)
        out[i] = (float)(((double)sums[i] * scale) / fanin);
}

static PyObject *dequantize(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "dequantize(sums, scale, fanin, out, big_endian)");
        return NULL;
    }
    double scale = PyFloat_AsDouble(args[1]);
    long fanin = PyLong_AsLong(args[2]);
    int big_endian = PyObject_IsTrue(args[4]);
    if ((scale == -1.0 || fanin == -1) && PyErr_Occurred())
        return NULL;
    if (big_endian < 0)
        return NULL;
    if (fanin < 1) {
        PyErr_SetString(PyExc_ValueError, "dequantize: fanin must be positive");
        return NULL;
    }
    Py_buffer sums, out;
    Py_ssize_t count = get_elements(args[0], &sums, args[3], &out, "sums");
    if (count < 0)
        return NULL;
    const int32_t *sum = (const int32_t *)sums.buf;
    float *average = (float *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    {
        /* Each block is copied out first: `out` may be the sums' own memory. */
        int32_t block[CODEC_BLOCK];
        for (Py_ssize_t first = 0; first < count; first += CODEC_BLOCK) {
            Py_ssize_t length = count - first < CODEC_BLOCK ? count - first : CODEC_BLOCK;
            memcpy(block, sum + first, 4 * length);
            if (big_endian)
                swap_block(block, length);
            dequantize_block(block, length, scale, (double)fanin, average + first);
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&sums);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
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

/* UDP generic segmentation offload: a run of datagrams of one size to one destination goes down the stack
   as one buffer and is cut into datagrams at the end (on loopback: at the receiving socket), so the
   per-datagram cost of routing and the IP layer is paid once per run. Linux caps a run at 64 segments
   and 64 KiB. A device without checksum offload refuses it (EIO): then runs are sent one by one. */
#define GSO_SEGMENTS 64
#define GSO_BYTES 65000
static int gso_refused = 0;

struct message {
    struct iovec vectors[GSO_SEGMENTS];
    struct sockaddr_in peer;
    union {
        char buffer[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } control;
    Py_ssize_t first, count; /* payloads list[first:first + count] */
};

static int parse_message(PyObject *item, const char **data, Py_ssize_t *size, struct sockaddr_in *peer)
{
    PyObject *payload, *host_object;
    int port;
    if (!PyArg_ParseTuple(item, "O(Ui)", &payload, &host_object, &port))
        return -1;
    if (!PyBytes_Check(payload)) {
        PyErr_SetString(PyExc_TypeError, "send_batch: payloads must be bytes");
        return -1;
    }
    const char *host = PyUnicode_AsUTF8(host_object);
    if (host == NULL)
        return -1;
    memset(peer, 0, sizeof(*peer));
    peer->sin_family = AF_INET;
    peer->sin_port = htons(port);
    if (inet_pton(AF_INET, host, &peer->sin_addr) != 1) {
        PyErr_Format(PyExc_ValueError, "send_batch: %s is not an IPv4 address", host);
        return -1;
    }
    *data = PyBytes_AS_STRING(payload);
    *size = PyBytes_GET_SIZE(payload);
    return 0;
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
    /* Per call, not static: another thread may be in here while this one has released the GIL. */
    struct message *messages = PyMem_Malloc(sizeof(struct message) * BATCH);
    struct mmsghdr *headers = PyMem_Malloc(sizeof(struct mmsghdr) * BATCH);
    if (messages == NULL || headers == NULL) {
        PyMem_Free(messages);
        PyMem_Free(headers);
        return PyErr_NoMemory();
    }
    PyObject *outcome = NULL;
    while (start < total) {
        /* Up to BATCH messages, each a run of equal-sized datagrams to one peer (a run of one without GSO). */
        int used = 0;
        Py_ssize_t next = start;
        while (next < total && used < BATCH) {
            struct message *m = &messages[used];
            const char *data;
            Py_ssize_t size;
            if (parse_message(PyList_GET_ITEM(list, next), &data, &size, &m->peer) < 0)
                goto done;
            m->first = next;
            m->count = 1;
            m->vectors[0].iov_base = (void *)data;
            m->vectors[0].iov_len = size;
            next++;
            /* Not to a multicast group: hosts that read raw frames off the link (captures, in-line devices,
               a veth's far end) would see one unsegmented super-frame where a kernel receiver sees the runs. */
            int coalesce = !gso_refused && !IN_MULTICAST(ntohl(m->peer.sin_addr.s_addr));
            while (coalesce && next < total && m->count < GSO_SEGMENTS && (m->count + 1) * size <= GSO_BYTES) {
                struct sockaddr_in peer;
                const char *more;
                Py_ssize_t more_size;
                if (parse_message(PyList_GET_ITEM(list, next), &more, &more_size, &peer) < 0)
                    goto done;
                if (more_size != size || peer.sin_addr.s_addr != m->peer.sin_addr.s_addr ||
                    peer.sin_port != m->peer.sin_port)
                    break;
                m->vectors[m->count].iov_base = (void *)more;
                m->vectors[m->count].iov_len = more_size;
                m->count++;
                next++;
            }
            struct msghdr *h = &headers[used].msg_hdr;
            memset(&headers[used], 0, sizeof(headers[used]));
            h->msg_iov = m->vectors;
            h->msg_iovlen = m->count;
            h->msg_name = &m->peer;
            h->msg_namelen = sizeof(m->peer);
            if (m->count > 1) {
                h->msg_control = m->control.buffer;
                h->msg_controllen = sizeof(m->control.buffer);
                struct cmsghdr *c = CMSG_FIRSTHDR(h);
                c->cmsg_level = SOL_UDP;
                c->cmsg_type = UDP_SEGMENT;
                c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
                uint16_t segment = (uint16_t)size;
                memcpy(CMSG_DATA(c), &segment, sizeof(segment));
            }
            used++;
        }
        /* The list holds the payloads, so their bytes stay put while the GIL is released. */
        int sent;
        Py_BEGIN_ALLOW_THREADS
        sent = sendmmsg(fd, headers, used, MSG_DONTWAIT);
        Py_END_ALLOW_THREADS
        if (sent > 0) {
            start = sent < used ? messages[sent].first : next;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            break;
        } else if (errno == EIO && messages[0].count > 1 && !gso_refused) {
            gso_refused = 1; /* no checksum offload on this path: send datagram by datagram from now on */
        } else {
            /* The first datagram was refused (e.g. an unreachable address): skip it, count it. */
            errors++;
            start++;
        }
    }
    outcome = Py_BuildValue("(nn)", start, errors);
done:
    PyMem_Free(messages);
    PyMem_Free(headers);
    return outcome;
}

static PyMethodDef methods[] = {
    {"recv_batch", (PyCFunction)(void (*)(void))recv_batch, METH_FASTCALL,
     "recv_batch(fd, buffer, slot_size, addresses) -> list: datagrams read with one recvmmsg"},
    {"send_batch", (PyCFunction)(void (*)(void))send_batch, METH_FASTCALL,
     "send_batch(fd, messages, start) -> (next, errors): datagrams sent with sendmmsg"},
    {"accumulate", (PyCFunction)(void (*)(void))accumulate, METH_FASTCALL,
     "accumulate(sums, payload, offset, count) -> bool: saturating sum of big-endian int32 elements"},
    {"encode_result", (PyCFunction)(void (*)(void))encode_result, METH_FASTCALL,
     "encode_result(header, sums, status) -> bytes: a result or partial payload"},
    {"quantize", (PyCFunction)(void (*)(void))quantize, METH_FASTCALL,
     "quantize(values, factor, out, big_endian) -> (peak, finite): float32 values as rounded int32 elements"},
    {"dequantize", (PyCFunction)(void (*)(void))dequantize, METH_FASTCALL,
     "dequantize(sums, scale, fanin, out, big_endian) -> None: int32 sums as a float32 average"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath", "Compiled kernel of inwire.fastpath.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__fastpath(void)
{
    return PyModule_Create(&module);
}
