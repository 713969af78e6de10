/* What the compiled kernel's parts share (inwire._kernel: _codec.c, _transport.c, _fastpath.c, _client.c,
   each beside the module it speeds up, and _kernel.c, the module): buffers, big-endian fields, and each part's
   entry points into the module. */

#ifndef INWIRE_KERNEL_H
#define INWIRE_KERNEL_H

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

/* Names shared between the parts, kept out of the module's exported symbols. */
#define KERNEL_INTERNAL __attribute__((visibility("hidden")))

static inline int get_buffer(PyObject *object, Py_buffer *view, int writable, const char *what)
{
    if (PyObject_GetBuffer(object, view, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous%s buffer", what, writable ? " writable" : "");
        return -1;
    }
    return 0;
}

static inline uint64_t read_be(const uint8_t *p, Py_ssize_t width)
{
    uint64_t value = 0;
    for (Py_ssize_t i = 0; i < width; i++)
        value = value << 8 | p[i];
    return value;
}

static inline void write_be(uint8_t *p, Py_ssize_t width, uint64_t value)
{
    for (Py_ssize_t i = width - 1; i >= 0; i--, value >>= 8)
        p[i] = (uint8_t)value;
}

/* Each part's functions, added to the module by _kernel.c; a part with types adds them itself (-1: an error
   set). */
KERNEL_INTERNAL extern PyMethodDef codec_methods[];
KERNEL_INTERNAL extern PyMethodDef transport_methods[];
KERNEL_INTERNAL extern PyMethodDef lane_methods[];
KERNEL_INTERNAL int fastpath_add_types(PyObject *module);

#endif
