/* Batch socket I/O (inwire.transport, client.py's UdpMember and serve.py use it): part of the compiled
   kernel inwire._kernel.

   recv_batch(fd, buffer, slot_size, addresses[, destinations]) -> list
       Reads up to len(buffer) // slot_size datagrams with one recvmmsg (non-blocking), datagram i into
       buffer[i * slot_size:]; returns their sizes, or (size, (host, port)) pairs with `addresses`; an
       empty list when none is waiting. With a list `destinations` (the socket has IP_PKTINFO on), each
       datagram's IPv4 destination address, the one it arrived on, is appended to it as an int (0 when
       the kernel gave none). `addresses` a (IPv4 address as an int, port) pair: only datagrams from that
       peer count, and the call returns (sizes, refused): a datagram from anywhere else has size 0 (its
       bytes are not to be read) and is counted in `refused`.
   send_batch(fd, messages, start) -> (next, errors)
       Sends (payload, (host, port)) messages from index `start` with sendmmsg, runs of equal-sized
       payloads to one peer as one UDP GSO message; stops at a full send buffer and returns the index of
       the first message not sent (len(messages) when all went) and the number the kernel refused
       (skipped).

   One system call per batch instead of one per datagram: the way past Python's per-datagram loop. */

#include "_kernel.h"

#define BATCH 64

/* Appends the IPv4 destination address (an int) that the IP_PKTINFO of a received message names, 0 without
   one; -1 on error. */
static int append_destination(PyObject *list, struct msghdr *message)
{
    unsigned long address = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(message); c != NULL; c = CMSG_NXTHDR(message, c)) {
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
            struct in_pktinfo info;
            memcpy(&info, CMSG_DATA(c), sizeof(info));
            address = ntohl(info.ipi_addr.s_addr);
        }
    }
    PyObject *value = PyLong_FromUnsignedLong(address);
    int appended = value != NULL ? PyList_Append(list, value) : -1;
    Py_XDECREF(value);
    return appended;
}

static PyObject *recv_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 4 && nargs != 5) || (nargs == 5 && !PyList_Check(args[4]))) {
        PyErr_SetString(PyExc_TypeError, "recv_batch(fd, buffer, slot_size, addresses[, destinations: list])");
        return NULL;
    }
    int fd = PyLong_AsLong(args[0]);
    Py_ssize_t slot_size = PyLong_AsSsize_t(args[2]);
    int only = PyTuple_Check(args[3]);
    unsigned long only_address = 0;
    int only_port = 0;
    if (only && !PyArg_ParseTuple(args[3], "ki", &only_address, &only_port))
        return NULL;
    int addresses = !only && PyObject_IsTrue(args[3]);
    PyObject *destinations = nargs == 5 ? args[4] : NULL;
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
    union {
        char buffer[CMSG_SPACE(sizeof(struct in_pktinfo))];
        struct cmsghdr align;
    } controls[BATCH];
    memset(messages, 0, sizeof(messages[0]) * count);
    for (Py_ssize_t i = 0; i < count; i++) {
        vectors[i].iov_base = (char *)buffer.buf + i * slot_size;
        vectors[i].iov_len = slot_size;
        messages[i].msg_hdr.msg_iov = &vectors[i];
        messages[i].msg_hdr.msg_iovlen = 1;
        messages[i].msg_hdr.msg_name = &peers[i];
        messages[i].msg_hdr.msg_namelen = sizeof(peers[i]);
        if (destinations != NULL) {
            messages[i].msg_hdr.msg_control = controls[i].buffer;
            messages[i].msg_hdr.msg_controllen = sizeof(controls[i].buffer);
        }
    }
    int received;
    Py_BEGIN_ALLOW_THREADS
    received = recvmmsg(fd, messages, count, MSG_DONTWAIT, NULL);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buffer);
    if (received < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return PyErr_SetFromErrno(PyExc_OSError);
        received = 0;
    }
    if (only) {
        PyObject *sizes = PyList_New(received);
        Py_ssize_t refused = 0;
        if (sizes == NULL)
            return NULL;
        for (int i = 0; i < received; i++) {
            int from = ntohl(peers[i].sin_addr.s_addr) == only_address && ntohs(peers[i].sin_port) == only_port;
            refused += !from;
            PyObject *size = PyLong_FromSsize_t(from ? (Py_ssize_t)messages[i].msg_len : 0);
            if (size == NULL) {
                Py_DECREF(sizes);
                return NULL;
            }
            PyList_SET_ITEM(sizes, i, size);
        }
        return Py_BuildValue("(Nn)", sizes, refused);
    }
    if (received == 0)
        return PyList_New(0);
    PyObject *list = PyList_New(received), *peer = NULL;
    if (list == NULL)
        return NULL;
    for (int i = 0; i < received; i++) {
        PyObject *item, *size = PyLong_FromSsize_t(messages[i].msg_len);
        if (addresses && size != NULL) {
            /* A batch mostly holds runs from few peers: one (host, port) object per run, not per datagram
               (formatting every address took about 6 % of the service's time). */
            if (peer == NULL || peers[i].sin_addr.s_addr != peers[i - 1].sin_addr.s_addr ||
                peers[i].sin_port != peers[i - 1].sin_port) {
                char host[INET_ADDRSTRLEN];
                inet_ntop(AF_INET, &peers[i].sin_addr, host, sizeof(host));
                Py_XDECREF(peer);
                peer = Py_BuildValue("(si)", host, ntohs(peers[i].sin_port));
            }
            item = peer ? PyTuple_Pack(2, size, peer) : NULL;
            Py_DECREF(size);
        } else {
            item = size;
        }
        if (item == NULL) {
            Py_XDECREF(peer);
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
        if (destinations != NULL && append_destination(destinations, &messages[i].msg_hdr) < 0) {
            Py_XDECREF(peer);
            Py_DECREF(list);
            return NULL;
        }
    }
    Py_XDECREF(peer);
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

KERNEL_INTERNAL PyMethodDef transport_methods[] = {
    {"recv_batch", (PyCFunction)(void (*)(void))recv_batch, METH_FASTCALL,
     "recv_batch(fd, buffer, slot_size, addresses[, destinations]) -> list: datagrams read with one recvmmsg"},
    {"send_batch", (PyCFunction)(void (*)(void))send_batch, METH_FASTCALL,
     "send_batch(fd, messages, start) -> (next, errors): datagrams sent with sendmmsg"},
    {NULL, NULL, 0, NULL},
};
