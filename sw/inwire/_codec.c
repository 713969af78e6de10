/* The member codec's passes (inwire.codec's definitions, as codec_average.py calls them): part of the
   compiled kernel inwire._kernel.

   quantize(values, factor, out, big_endian) -> (peak, finite)
       A member's elements: every float32 of `values` times `factor` (a power of two, float32), rounded
       half to even, into `out` as int32 (big-endian or native); returns the largest magnitude among the
       values and whether all were finite. The caller keeps `out` only if the peak fits: beyond it the
       elements are clamped, not meaningful (codec_average.encode then takes its definition).
   dequantize(sums, scale, fanin, out, big_endian) -> None
       An average: every int32 of `sums` as float64, times `scale` (a power of two), divided by `fanin`,
       rounded to float32 into `out`, which may be the sums' own memory (codec_average.decode's float64
       steps, element by element). */

#include "_kernel.h"

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

KERNEL_INTERNAL PyMethodDef codec_methods[] = {
    {"quantize", (PyCFunction)(void (*)(void))quantize, METH_FASTCALL,
     "quantize(values, factor, out, big_endian) -> (peak, finite): float32 values as rounded int32 elements"},
    {"dequantize", (PyCFunction)(void (*)(void))dequantize, METH_FASTCALL,
     "dequantize(sums, scale, fanin, out, big_endian) -> None: int32 sums as a float32 average"},
    {NULL, NULL, 0, NULL},
};
