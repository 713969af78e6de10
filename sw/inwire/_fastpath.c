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

/* The member's result lane: MemberSum.on_result (inwire.client) for a sum that CompiledMemberSum runs,
   the same steps over the same state. The Python method is the definition; tests/test_member_lane.py
   drives both with the same result streams and compares every payload and every piece of state.

   member_lane(layout, expected, sizes, timeouts, received, done, payloads, build) -> lane
       The sum's constants, once: `layout` the (offset, bytes) of the result fields read, in LaneField
       order; `expected` their values as unsigned field contents, None for those not compared with a
       constant; `sizes` (header bytes, trailer bytes, element bytes, overflow status bit, chunk, elements,
       window, fast retransmit); `timeouts` (timeout_s, min_timeout_s or None); `received` the sums' buffer
       and `done` the per-chunk flags (writable); `payloads` the sequence of contributions; `build` None,
       or (header template, wire, chunk field (offset, bytes), slot field (offset, bytes), slots) to make
       a full chunk's payload here rather than by payloads[index]: chunk i takes slots[i % len(slots)].
   member_result(lane, state, payload, now) -> list
       One datagram, as on_result: `state` is the MemberSum's __dict__, read and written in place (its
       dicts and sets too), so that its Python methods (due, next_deadline, ...) carry on from it.
   member_results(lane, state, buffer, sizes, slot_size, now) -> list
       member_result for datagram i of `sizes` at buffer[i * slot_size:], the payloads of all in order.

   Every datagram is untrusted: its length is checked against its count before any element is read, and
   every copy against the buffers' lengths. */

enum LaneField { LF_MAGIC, LF_VERSION, LF_OPCODE, LF_FANIN, LF_EXPONENT, LF_CONTRIBUTORS, LF_JOB, LF_ROUND,
                 LF_CLIQUE, LF_CHUNK, LF_COUNT, LF_BITMAP, LANE_FIELDS };

/* Keys of MemberSum's attributes, as on_result names them. */
enum LaneKey { LK_DEADLINE, LK_SENT_AT, LK_BACKOFF, LK_TRIES, LK_FAST_RESENT, LK_OVERFLOWED, LK_WRONG,
               LK_CHECKED, LK_REMAINING, LK_NEXT, LK_PROGRESS_AT, LK_PROBED, LK_RESULT_AT, LK_INTERVAL,
               LK_SRTT, LK_RTTVAR, LK_RTO, LK_RETRANSMITS, LANE_KEYS };
static const char *lane_key_names[LANE_KEYS] = {
    "deadline", "sent_at", "backoff", "tries", "fast_resent", "overflowed_chunks", "wrong_chunks", "checked",
    "remaining", "next", "progress_at", "probed", "result_at", "interval", "srtt", "rttvar", "rto",
    "retransmits"};
static PyObject *lane_keys[LANE_KEYS];

#define LANE_CAPSULE "inwire._fastpath.member_lane"

typedef struct {
    Py_ssize_t at[LANE_FIELDS], width[LANE_FIELDS];
    uint64_t expected[LANE_FIELDS];
    int compared[LANE_FIELDS];
    Py_ssize_t header, trailer, element, chunk, elements, window, chunks, fast_retransmit;
    uint64_t overflow_bit;
    double timeout_s, min_timeout_s;
    int adaptive, build;
    Py_buffer received, done, template, wire;
    Py_ssize_t chunk_at, chunk_width, slot_at, slot_width, slot_count;
    uint64_t *slots;
    PyObject *payloads;
} Lane;

static void lane_free(PyObject *capsule)
{
    Lane *lane = PyCapsule_GetPointer(capsule, LANE_CAPSULE);
    if (lane == NULL)
        return;
    if (lane->received.obj != NULL)
        PyBuffer_Release(&lane->received);
    if (lane->done.obj != NULL)
        PyBuffer_Release(&lane->done);
    if (lane->template.obj != NULL)
        PyBuffer_Release(&lane->template);
    if (lane->wire.obj != NULL)
        PyBuffer_Release(&lane->wire);
    PyMem_Free(lane->slots);
    Py_XDECREF(lane->payloads);
    PyMem_Free(lane);
}

/* Results come back mostly in the order their chunks went out, so the next call copies the next chunk's sums
   and elements: asked for now, they come from memory while Python runs between calls (a third off the
   member's time per result in `inwire.train.bench.where_the_time_goes`, where they are not in cache). The
   hint takes constant arguments, hence the two calls. */
static void lane_prefetch(const uint8_t *p, Py_ssize_t bytes, int write)
{
    for (Py_ssize_t i = 0; i < bytes; i += 64) {
        if (write)
            __builtin_prefetch(p + i, 1, 0);
        else
            __builtin_prefetch(p + i, 0, 0);
    }
}

static uint64_t read_be(const uint8_t *p, Py_ssize_t width)
{
    uint64_t value = 0;
    for (Py_ssize_t i = 0; i < width; i++)
        value = value << 8 | p[i];
    return value;
}

static void write_be(uint8_t *p, Py_ssize_t width, uint64_t value)
{
    for (Py_ssize_t i = width - 1; i >= 0; i--, value >>= 8)
        p[i] = (uint8_t)value;
}

/* A field of a header `header` bytes long: (offset, bytes) inside it, at most 8 bytes. */
static int lane_field(PyObject *pair, Py_ssize_t header, Py_ssize_t *at, Py_ssize_t *width)
{
    if (!PyArg_ParseTuple(pair, "nn", at, width))
        return -1;
    if (*at < 0 || *width < 1 || *width > 8 || *at + *width > header) {
        PyErr_SetString(PyExc_ValueError, "member_lane: a field lies outside the header");
        return -1;
    }
    return 0;
}

static PyObject *member_lane(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != LANE_FIELDS ||
        !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != LANE_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "member_lane(layout, expected, sizes, timeouts, received, done, payloads, "
                                         "build)");
        return NULL;
    }
    for (int k = 0; k < LANE_KEYS; k++)
        if (lane_keys[k] == NULL && (lane_keys[k] = PyUnicode_InternFromString(lane_key_names[k])) == NULL)
            return NULL;
    Lane *lane = PyMem_Calloc(1, sizeof(Lane));
    if (lane == NULL)
        return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(lane, LANE_CAPSULE, lane_free);
    if (capsule == NULL) {
        PyMem_Free(lane);
        return NULL;
    }
    PyObject *min_timeout;
    unsigned long long overflow_bit;
    if (!PyArg_ParseTuple(args[2], "nnnKnnnn", &lane->header, &lane->trailer, &lane->element, &overflow_bit,
                          &lane->chunk, &lane->elements, &lane->window, &lane->fast_retransmit) ||
        !PyArg_ParseTuple(args[3], "dO", &lane->timeout_s, &min_timeout))
        goto fail;
    lane->overflow_bit = overflow_bit;
    lane->adaptive = min_timeout != Py_None;
    if (lane->adaptive && (lane->min_timeout_s = PyFloat_AsDouble(min_timeout)) == -1.0 && PyErr_Occurred())
        goto fail;
    if (lane->header < 0 || lane->trailer < 1 || lane->trailer > 8 || lane->element < 1 || lane->chunk < 1 ||
        lane->elements < 0 || lane->window < 1) {
        PyErr_SetString(PyExc_ValueError, "member_lane: sizes out of range");
        goto fail;
    }
    lane->chunks = lane->elements / lane->chunk + (lane->elements % lane->chunk != 0);
    for (int f = 0; f < LANE_FIELDS; f++) {
        if (lane_field(PyTuple_GET_ITEM(args[0], f), lane->header, &lane->at[f], &lane->width[f]) < 0)
            goto fail;
        PyObject *want = PyTuple_GET_ITEM(args[1], f);
        lane->compared[f] = want != Py_None;
        if (lane->compared[f]) {
            lane->expected[f] = PyLong_AsUnsignedLongLong(want);
            if (PyErr_Occurred())
                goto fail;
        }
    }
    if (get_buffer(args[4], &lane->received, 1, "received") < 0)
        goto fail;
    if (get_buffer(args[5], &lane->done, 1, "done") < 0)
        goto fail;
    if (lane->received.len / lane->element < lane->elements || lane->done.len < lane->chunks) {
        PyErr_SetString(PyExc_ValueError, "member_lane: received or done is too short for the sum");
        goto fail;
    }
    Py_INCREF(args[6]);
    lane->payloads = args[6];
    if (args[7] != Py_None) {
        PyObject *template, *wire, *chunk_field, *slot_field, *slots;
        if (!PyArg_ParseTuple(args[7], "OOOOO", &template, &wire, &chunk_field, &slot_field, &slots))
            goto fail;
        if (get_buffer(template, &lane->template, 0, "template") < 0 || get_buffer(wire, &lane->wire, 0, "wire") < 0)
            goto fail;
        if (lane_field(chunk_field, lane->header, &lane->chunk_at, &lane->chunk_width) < 0 ||
            lane_field(slot_field, lane->header, &lane->slot_at, &lane->slot_width) < 0)
            goto fail;
        if (lane->template.len != lane->header || lane->wire.len / lane->element < lane->elements ||
            !PyTuple_Check(slots) || PyTuple_GET_SIZE(slots) < 1) {
            PyErr_SetString(PyExc_ValueError, "member_lane: the template, wire or slots do not fit the sum");
            goto fail;
        }
        lane->slot_count = PyTuple_GET_SIZE(slots);
        if ((lane->slots = PyMem_Calloc(lane->slot_count, sizeof(uint64_t))) == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t i = 0; i < lane->slot_count; i++) {
            lane->slots[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(slots, i));
            if (PyErr_Occurred())
                goto fail;
        }
        lane->build = 1;
    }
    return capsule;
fail:
    Py_DECREF(capsule);
    return NULL;
}

/* The payload of chunk `index`: a full chunk made from the template and the wire, else payloads[index]. */
static PyObject *lane_payload(Lane *lane, Py_ssize_t index)
{
    Py_ssize_t first = index * lane->chunk;
    if (!lane->build || lane->elements - first < lane->chunk)
        return PySequence_GetItem(lane->payloads, index);
    Py_ssize_t bytes = lane->element * lane->chunk;
    PyObject *payload = PyBytes_FromStringAndSize(NULL, lane->header + bytes);
    if (payload == NULL)
        return NULL;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(payload);
    memcpy(out, lane->template.buf, lane->header);
    write_be(out + lane->chunk_at, lane->chunk_width, (uint64_t)first);
    write_be(out + lane->slot_at, lane->slot_width, lane->slots[index % lane->slot_count]);
    memcpy(out + lane->header, (const uint8_t *)lane->wire.buf + lane->element * first, bytes);
    if (lane->element * (first + 2 * lane->chunk) <= lane->wire.len)
        lane_prefetch((const uint8_t *)lane->wire.buf + lane->element * (first + lane->chunk), bytes, 0);
    return payload;
}

/* A dict or set attribute of the MemberSum (borrowed). */
static PyObject *lane_get(PyObject *state, int key)
{
    PyObject *value = PyDict_GetItemWithError(state, lane_keys[key]);
    if (value == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_AttributeError, "MemberSum has no %s", lane_key_names[key]);
    return value;
}

static int lane_get_size(PyObject *state, int key, Py_ssize_t *out)
{
    PyObject *value = lane_get(state, key);
    if (value == NULL)
        return -1;
    *out = PyLong_AsSsize_t(value);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* A float attribute that may be None (`*present` 0). */
static int lane_get_float(PyObject *state, int key, double *out, int *present)
{
    PyObject *value = lane_get(state, key);
    if (value == NULL)
        return -1;
    *present = value != Py_None;
    if (!*present)
        return 0;
    *out = PyFloat_AsDouble(value);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* dict[key] = value, stealing the reference to `value` (NULL: an error already set). */
/* A float attribute that must be a number (as Python's arithmetic on it needs). */
static int lane_get_number(PyObject *state, int key, double *out)
{
    int present;
    if (lane_get_float(state, key, out, &present) < 0)
        return -1;
    if (!present)
        PyErr_Format(PyExc_TypeError, "MemberSum.%s is None", lane_key_names[key]);
    return present ? 0 : -1;
}

static int lane_set_item(PyObject *dict, PyObject *key, PyObject *value)
{
    if (value == NULL)
        return -1;
    int outcome = PyDict_SetItem(dict, key, value);
    Py_DECREF(value);
    return outcome;
}

static int lane_set(PyObject *state, int key, PyObject *value)
{
    return lane_set_item(state, lane_keys[key], value);
}

static int lane_set_size(PyObject *state, int key, Py_ssize_t value)
{
    return lane_set(state, key, PyLong_FromSsize_t(value));
}

static int lane_set_float(PyObject *state, int key, double value)
{
    return lane_set(state, key, PyFloat_FromDouble(value));
}

/* dict.pop(key, None), the value dropped. */
static int lane_discard(PyObject *dict, PyObject *key)
{
    int present = PyDict_Contains(dict, key);
    return present == 1 ? PyDict_DelItem(dict, key) : present;
}

/* The MemberSum's dicts and sets a result touches, held for the call: making a payload may run Python code
   (payloads[index]), which could rebind them. */
#define LANE_STATE 7
static const int lane_state_keys[LANE_STATE] = {LK_DEADLINE, LK_SENT_AT, LK_BACKOFF, LK_TRIES, LK_FAST_RESENT,
                                                LK_OVERFLOWED, LK_WRONG};
typedef struct {
    PyObject *deadline, *sent_at, *backoff, *tries, *fast_resent, *overflowed, *wrong;
} LaneState;

static void lane_state_fields(LaneState *s, PyObject **fields[LANE_STATE])
{
    fields[0] = &s->deadline, fields[1] = &s->sent_at, fields[2] = &s->backoff, fields[3] = &s->tries;
    fields[4] = &s->fast_resent, fields[5] = &s->overflowed, fields[6] = &s->wrong;
}

static int lane_state(PyObject *state, LaneState *s)
{
    PyObject **fields[LANE_STATE];
    lane_state_fields(s, fields);
    for (int i = 0; i < LANE_STATE; i++)
        *fields[i] = NULL;
    for (int i = 0; i < LANE_STATE; i++) {
        if ((*fields[i] = lane_get(state, lane_state_keys[i])) == NULL)
            return -1;
        Py_INCREF(*fields[i]);
    }
    return 0;
}

static void lane_state_release(LaneState *s)
{
    PyObject **fields[LANE_STATE];
    lane_state_fields(s, fields);
    for (int i = 0; i < LANE_STATE; i++)
        Py_XDECREF(*fields[i]);
}

/* The window's refill (MemberSum._refill) under timeout `rto`: every chunk the results let out, appended to
   `sends`. */
static int lane_refill(Lane *lane, PyObject *state, LaneState *s, PyObject *now_object, double now, double rto,
                       PyObject *sends)
{
    Py_ssize_t chunk, end = lane->chunks;
    const uint8_t *done = lane->done.buf;
    if (lane_get_size(state, LK_NEXT, &chunk) < 0)
        return -1;
    if (!(chunk >= 0 && chunk < end && (chunk < lane->window || done[chunk - lane->window])))
        return 0;
    PyObject *deadline = PyFloat_FromDouble(now + rto), *zero = PyLong_FromLong(0);
    int outcome = deadline == NULL || zero == NULL ? -1 : 0;
    while (outcome == 0 && chunk < end && (chunk < lane->window || done[chunk - lane->window])) {
        PyObject *key = PyLong_FromSsize_t(chunk), *payload = NULL;
        outcome = key == NULL || PyDict_SetItem(s->tries, key, zero) < 0 ||
                          PyDict_SetItem(s->deadline, key, deadline) < 0 ||
                          (lane->adaptive && PyDict_SetItem(s->sent_at, key, now_object) < 0) ||
                          (payload = lane_payload(lane, chunk)) == NULL || PyList_Append(sends, payload) < 0
                      ? -1
                      : 0;
        Py_XDECREF(payload);
        Py_XDECREF(key);
        chunk++;
    }
    Py_XDECREF(deadline);
    Py_XDECREF(zero);
    return outcome < 0 ? -1 : lane_set_size(state, LK_NEXT, chunk);
}

/* MemberSum._measured: the round trip of chunk `key` folded into the timeout `*rto`, and every chunk in flight
   FAST_RETRANSMIT or more before it sent again once (appended to `sends`). */
static int lane_measured(Lane *lane, PyObject *state, LaneState *s, PyObject *key, Py_ssize_t index, double now,
                         double *rto, PyObject *sends)
{
    PyObject *sent_object = PyDict_GetItemWithError(s->sent_at, key);
    if (sent_object == NULL && PyErr_Occurred())
        return -1;
    if (sent_object != NULL && sent_object != Py_None) {
        double sent = PyFloat_AsDouble(sent_object), srtt, rttvar;
        int present;
        if ((sent == -1.0 && PyErr_Occurred()) || PyDict_DelItem(s->sent_at, key) < 0 ||
            lane_get_float(state, LK_SRTT, &srtt, &present) < 0)
            return -1;
        double sample = now - sent;
        if (!present) {
            srtt = sample;
            rttvar = sample / 2;
        } else {
            if (lane_get_number(state, LK_RTTVAR, &rttvar) < 0)
                return -1;
            rttvar = 0.75 * rttvar + 0.25 * fabs(srtt - sample);
            srtt = 0.875 * srtt + 0.125 * sample;
        }
        /* min(max(srtt + 4 rttvar, min_timeout_s), timeout_s), as Python's min and max pick */
        double bounded = srtt + 4 * rttvar;
        bounded = lane->min_timeout_s > bounded ? lane->min_timeout_s : bounded;
        *rto = lane->timeout_s < bounded ? lane->timeout_s : bounded;
        if (lane_set_float(state, LK_SRTT, srtt) < 0 || lane_set_float(state, LK_RTTVAR, rttvar) < 0 ||
            lane_set_float(state, LK_RTO, *rto) < 0)
            return -1;
    } else if (sent_object != NULL && PyDict_DelItem(s->sent_at, key) < 0) {
        return -1;
    }
    if (lane_discard(s->backoff, key) < 0)
        return -1;
    /* Every chunk in flight FAST_RETRANSMIT or more before `index` and not sent again yet, in send order:
       collected first, then each sent again (the loop below updates the dict it would walk). */
    PyObject *lost = PyList_New(0);
    if (lost == NULL)
        return -1;
    Py_ssize_t position = 0;
    PyObject *earlier, *value;
    int outcome = -1;
    while (PyDict_Next(s->deadline, &position, &earlier, &value)) {
        Py_ssize_t chunk = PyLong_AsSsize_t(earlier);
        if (chunk == -1 && PyErr_Occurred())
            goto out;
        if (index - chunk < lane->fast_retransmit)
            break;
        int resent = PySet_Contains(s->fast_resent, earlier);
        if (resent < 0 || (!resent && PyList_Append(lost, earlier) < 0))
            goto out;
    }
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(lost); k++) {
        /* fast_resent.add(c); tries[c] += 1; retransmits += 1; sent_at.pop(c, None); deadline[c] = now + rto;
           the payload of c */
        PyObject *chunk_object = PyList_GET_ITEM(lost, k), *payload = NULL;
        Py_ssize_t chunk = PyLong_AsSsize_t(chunk_object), tried, retransmits;
        PyObject *tried_object = PyDict_GetItemWithError(s->tries, chunk_object);
        if (tried_object == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, chunk_object);
            goto out;
        }
        if ((tried = PyLong_AsSsize_t(tried_object)) == -1 && PyErr_Occurred())
            goto out;
        if (PySet_Add(s->fast_resent, chunk_object) < 0 ||
            lane_set_item(s->tries, chunk_object, PyLong_FromSsize_t(tried + 1)) < 0 ||
            lane_get_size(state, LK_RETRANSMITS, &retransmits) < 0 ||
            lane_set_size(state, LK_RETRANSMITS, retransmits + 1) < 0 || lane_discard(s->sent_at, chunk_object) < 0 ||
            lane_set_item(s->deadline, chunk_object, PyFloat_FromDouble(now + *rto)) < 0 ||
            (payload = lane_payload(lane, chunk)) == NULL || PyList_Append(sends, payload) < 0) {
            Py_XDECREF(payload);
            goto out;
        }
        Py_DECREF(payload);
    }
    outcome = 0;
out:
    Py_DECREF(lost);
    return outcome;
}

/* MemberSum.on_result on one datagram of `size` bytes at `data`; the payloads it lets out appended to `sends`. */
static int lane_result(Lane *lane, PyObject *state, const uint8_t *data, Py_ssize_t size, PyObject *now_object,
                       double now, PyObject *sends)
{
    if (size < lane->header + lane->trailer)
        return 0;
    uint64_t field[LANE_FIELDS];
    for (int f = 0; f < LANE_FIELDS; f++)
        field[f] = read_be(data + lane->at[f], lane->width[f]);
    /* Not a result of this sum: another message, a length that is not its count's, another owner. */
    static const int owner[] = {LF_MAGIC, LF_VERSION, LF_OPCODE, LF_JOB, LF_ROUND, LF_CLIQUE};
    for (size_t i = 0; i < sizeof(owner) / sizeof(owner[0]); i++)
        if (lane->compared[owner[i]] && field[owner[i]] != lane->expected[owner[i]])
            return 0;
    Py_ssize_t rest = size - lane->header - lane->trailer;
    if (rest % lane->element || (uint64_t)(rest / lane->element) != field[LF_COUNT])
        return 0;
    uint64_t offset = field[LF_CHUNK];
    if (offset % (uint64_t)lane->chunk || offset / (uint64_t)lane->chunk >= (uint64_t)lane->chunks)
        return 0;
    Py_ssize_t index = (Py_ssize_t)(offset / (uint64_t)lane->chunk);
    LaneState s;
    PyObject *key = NULL;
    int outcome = -1, in_flight;
    if (lane_state(state, &s) < 0 || (key = PyLong_FromSsize_t(index)) == NULL)
        goto out;
    in_flight = PyDict_Contains(s.deadline, key);
    if (in_flight <= 0) {
        outcome = in_flight;
        goto out;
    }
    Py_ssize_t want = lane->elements - (Py_ssize_t)offset, checked, remaining;
    want = want < lane->chunk ? want : lane->chunk;
    if (lane_get_size(state, LK_CHECKED, &checked) < 0 ||
        lane_set_size(state, LK_CHECKED, checked + 1) < 0)
        goto out;
    if ((read_be(data + size - lane->trailer, lane->trailer) & lane->overflow_bit) && PySet_Add(s.overflowed, key) < 0)
        goto out;
    static const int expected[] = {LF_EXPONENT, LF_FANIN, LF_BITMAP, LF_CONTRIBUTORS};
    int is_wrong = field[LF_COUNT] != (uint64_t)want;
    for (size_t i = 0; i < sizeof(expected) / sizeof(expected[0]); i++)
        is_wrong |= lane->compared[expected[i]] && field[expected[i]] != lane->expected[expected[i]];
    if (is_wrong && PySet_Add(s.wrong, key) < 0)
        goto out;
    Py_ssize_t got = (Py_ssize_t)field[LF_COUNT] < want ? (Py_ssize_t)field[LF_COUNT] : want;
    Py_ssize_t start = lane->element * (Py_ssize_t)offset, bytes = lane->element * got;
    if (start + bytes > lane->received.len || lane->header + bytes > size || index >= lane->done.len) {
        PyErr_SetString(PyExc_SystemError, "member_result: a result outside the sum's buffers");
        goto out;
    }
    memcpy((uint8_t *)lane->received.buf + start, data + lane->header, bytes);
    if (start + bytes + lane->element * lane->chunk <= lane->received.len)
        lane_prefetch((uint8_t *)lane->received.buf + start + bytes, lane->element * lane->chunk, 1);
    if (PyDict_DelItem(s.deadline, key) < 0)
        goto out;
    ((uint8_t *)lane->done.buf)[index] = 1;
    Py_INCREF(now_object);
    double rto;
    if (lane_get_size(state, LK_REMAINING, &remaining) < 0 || lane_set_size(state, LK_REMAINING, remaining - 1) < 0 ||
        lane_set(state, LK_PROGRESS_AT, now_object) < 0 || lane_get_number(state, LK_RTO, &rto) < 0)
        goto out;
    if (lane->adaptive) {
        double result_at, interval;
        int heard, smoothed;
        Py_INCREF(Py_False);
        if (lane_set(state, LK_PROBED, Py_False) < 0 || lane_get_float(state, LK_RESULT_AT, &result_at, &heard) < 0)
            goto out;
        if (heard && now > result_at) {
            double gap = now - result_at;
            if (lane_get_float(state, LK_INTERVAL, &interval, &smoothed) < 0 ||
                lane_set_float(state, LK_INTERVAL, smoothed ? 0.875 * interval + 0.125 * gap : gap) < 0)
                goto out;
        }
        Py_INCREF(now_object);
        if (lane_set(state, LK_RESULT_AT, now_object) < 0 ||
            lane_measured(lane, state, &s, key, index, now, &rto, sends) < 0)
            goto out;
    }
    outcome = lane_refill(lane, state, &s, now_object, now, rto, sends);
out:
    Py_XDECREF(key);
    lane_state_release(&s);
    return outcome;
}

static Lane *lane_of(PyObject *capsule, PyObject *state)
{
    if (!PyDict_Check(state)) {
        PyErr_SetString(PyExc_TypeError, "member_result: state must be the MemberSum's __dict__");
        return NULL;
    }
    return PyCapsule_GetPointer(capsule, LANE_CAPSULE);
}

static PyObject *member_result(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "member_result(lane, state, payload, now)");
        return NULL;
    }
    Lane *lane = lane_of(args[0], args[1]);
    double now = PyFloat_AsDouble(args[3]);
    if (lane == NULL || (now == -1.0 && PyErr_Occurred()))
        return NULL;
    Py_buffer payload;
    if (get_buffer(args[2], &payload, 0, "payload") < 0)
        return NULL;
    PyObject *sends = PyList_New(0);
    if (sends != NULL && lane_result(lane, args[1], payload.buf, payload.len, args[3], now, sends) < 0)
        Py_CLEAR(sends);
    PyBuffer_Release(&payload);
    return sends;
}

static PyObject *member_results(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "member_results(lane, state, buffer, sizes: list, slot_size, now)");
        return NULL;
    }
    Lane *lane = lane_of(args[0], args[1]);
    Py_ssize_t slot_size = PyLong_AsSsize_t(args[4]);
    double now = PyFloat_AsDouble(args[5]);
    if (lane == NULL || PyErr_Occurred())
        return NULL;
    Py_buffer buffer;
    if (get_buffer(args[2], &buffer, 0, "buffer") < 0)
        return NULL;
    PyObject *sends = PyList_New(0);
    Py_ssize_t count = PyList_GET_SIZE(args[3]);
    for (Py_ssize_t i = 0; sends != NULL && i < count; i++) {
        Py_ssize_t size = PyLong_AsSsize_t(PyList_GET_ITEM(args[3], i));
        if (size == -1 && PyErr_Occurred()) {
            Py_CLEAR(sends);
        } else if (slot_size < 1 || size < 0 || size > slot_size || size > buffer.len ||
                   i > (buffer.len - size) / slot_size) {
            PyErr_SetString(PyExc_ValueError, "member_results: a datagram outside the buffer");
            Py_CLEAR(sends);
        } else if (lane_result(lane, args[1], (const uint8_t *)buffer.buf + i * slot_size, size, args[5], now,
                               sends) < 0) {
            Py_CLEAR(sends);
        }
    }
    PyBuffer_Release(&buffer);
    return sends;
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
    {"member_lane", (PyCFunction)(void (*)(void))member_lane, METH_FASTCALL,
     "member_lane(layout, expected, sizes, timeouts, received, done, payloads, build) -> lane: a sum's constants"},
    {"member_result", (PyCFunction)(void (*)(void))member_result, METH_FASTCALL,
     "member_result(lane, state, payload, now) -> list: MemberSum.on_result, compiled"},
    {"member_results", (PyCFunction)(void (*)(void))member_results, METH_FASTCALL,
     "member_results(lane, state, buffer, sizes, slot_size, now) -> list: member_result of each datagram"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath", "Compiled kernel of inwire.fastpath.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__fastpath(void)
{
    return PyModule_Create(&module);
}
