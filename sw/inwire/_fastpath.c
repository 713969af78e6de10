/* The per-element work of the fast software aggregator (inwire.fastpath), compiled.

   accumulate(sums, payload, offset, count) -> bool
       Adds `count` big-endian int32 elements of `payload` (from byte `offset`) into `sums` (int64,
       writable, at least `count` long), each sum clipped at the int32 limits as it is made: the model
       saturates per contribution. Returns whether any sum clipped.
   encode_result(header, sums, status) -> bytes
       header + the sums as big-endian int32 + status: a result payload in one allocation.

   The Python fallback in fastpath.py does the same with numpy; tests/test_fastpath.py runs both against
   the golden model. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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

static PyMethodDef methods[] = {
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
