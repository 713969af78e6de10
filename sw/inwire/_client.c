/* The member's result lane: MemberSum.on_result (inwire.client) for a sum that CompiledMemberSum runs,
   the same steps over the same state. The Python method is the definition; tests/test_member_lane.py
   drives both with the same result streams and compares every payload and every piece of state.

   member_state(cls) -> None
       Binds the lane to the class of the sums (client.MemberSum), once, when it is defined: every attribute
       of a sum that the lane reads and writes is one of its slots, found here by name (a rename fails here).
   member_lane(layout, expected, sizes, timeouts, received, done, payloads, build) -> lane
       The sum's constants, once: `layout` the (offset, bytes) of the result fields read, in LaneField
       order; `expected` their values as unsigned field contents, None for those not compared with a
       constant; `sizes` (header bytes, trailer bytes, element bytes, overflow status bit, chunk, elements,
       window, fast retransmit, probe round trips); `timeouts` (timeout_s, min_timeout_s or None); `received` the sums' buffer
       and `done` the per-chunk flags (writable); `payloads` the sequence of contributions; `build` None,
       or (header template, wire, chunk field (offset, bytes), slot field (offset, bytes), slots) to make
       a full chunk's payload here rather than by payloads[index]: chunk i takes slots[i % len(slots)].
   member_result(lane, state, payload, now) -> list
       One datagram, as on_result: `state` is the MemberSum itself, its slots read and written in place (its
       dicts and sets too), so that its Python methods (due, next_deadline, ...) carry on from it.
   member_results(lane, state, buffer, sizes, slot_size, now) -> list
       member_result for datagram i of `sizes` at buffer[i * slot_size:], the payloads of all in order.

   Every datagram is untrusted: its length is checked against its count before any element is read, and
   every copy against the buffers' lengths. */

#include "_kernel.h"
#include <structmember.h>

enum LaneField { LF_MAGIC, LF_VERSION, LF_OPCODE, LF_FANIN, LF_EXPONENT, LF_CONTRIBUTORS, LF_JOB, LF_ROUND,
                 LF_CLIQUE, LF_CHUNK, LF_COUNT, LF_BITMAP, LF_TOKEN, LANE_FIELDS };

/* The MemberSum's attributes the lane reads and writes, as on_result names them: slots of the class
   member_state binds, read and written at the offsets it found there. */
enum LaneKey { LK_DEADLINE, LK_SENT_AT, LK_BACKOFF, LK_TRIES, LK_FAST_RESENT, LK_OVERFLOWED, LK_WRONG,
               LK_CHECKED, LK_REMAINING, LK_NEXT, LK_PROGRESS_AT, LK_PROBED, LK_RESULT_AT, LK_INTERVAL,
               LK_SRTT, LK_RTTVAR, LK_RTO, LK_RETRANSMITS, LK_REFUSED, LANE_KEYS };
static const char *lane_key_names[LANE_KEYS] = {
    "deadline", "sent_at", "backoff", "tries", "fast_resent", "overflowed_chunks", "wrong_chunks", "checked",
    "remaining", "next", "progress_at", "probed", "result_at", "interval", "srtt", "rttvar", "rto",
    "retransmits", "results_refused"};
static Py_ssize_t lane_offsets[LANE_KEYS];
static PyObject *lane_class; /* the class whose slots lane_offsets locate; NULL until member_state binds it */

/* member_state(cls): binds the lane to `cls` (client.MemberSum, once, at its import). Each attribute the lane
   reads must be a writable object slot of `cls`, not shadowed by a class attribute: a renamed or undeclared
   one fails here, naming it, rather than in a result's handling. */
static PyObject *member_state(PyObject *self, PyObject *cls)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "member_state(cls): cls must be a class");
        return NULL;
    }
    Py_ssize_t offsets[LANE_KEYS];
    for (int k = 0; k < LANE_KEYS; k++) {
        PyObject *descriptor = PyObject_GetAttrString(cls, lane_key_names[k]);
        if (descriptor == NULL) {
            PyErr_Format(PyExc_AttributeError, "member_state: %s has no attribute %s, which the compiled lane reads",
                         ((PyTypeObject *)cls)->tp_name, lane_key_names[k]);
            return NULL;
        }
        int slot = Py_IS_TYPE(descriptor, &PyMemberDescr_Type) &&
                   PyType_IsSubtype((PyTypeObject *)cls, PyDescr_TYPE(descriptor));
        PyMemberDef *member = slot ? ((PyMemberDescrObject *)descriptor)->d_member : NULL;
        Py_DECREF(descriptor);
        if (member == NULL || member->type != T_OBJECT_EX || (member->flags & READONLY)) {
            PyErr_Format(PyExc_TypeError, "member_state: %s.%s is not a writable slot, which the compiled lane needs",
                         ((PyTypeObject *)cls)->tp_name, lane_key_names[k]);
            return NULL;
        }
        offsets[k] = member->offset;
    }
    memcpy(lane_offsets, offsets, sizeof(offsets));
    Py_INCREF(cls);
    Py_XSETREF(lane_class, cls);
    Py_RETURN_NONE;
}

#define LANE_CAPSULE "inwire._kernel.member_lane"

typedef struct {
    Py_ssize_t at[LANE_FIELDS], width[LANE_FIELDS];
    uint64_t expected[LANE_FIELDS];
    int compared[LANE_FIELDS];
    Py_ssize_t header, trailer, element, chunk, elements, window, chunks, fast_retransmit, probe_srtts;
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
    if (!PyArg_ParseTuple(args[2], "nnnKnnnnn", &lane->header, &lane->trailer, &lane->element, &overflow_bit,
                          &lane->chunk, &lane->elements, &lane->window, &lane->fast_retransmit,
                          &lane->probe_srtts) ||
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

static inline PyObject **lane_slot(PyObject *state, int key)
{
    return (PyObject **)((char *)state + lane_offsets[key]);
}

/* An attribute of the MemberSum (borrowed). */
static PyObject *lane_get(PyObject *state, int key)
{
    PyObject *value = *lane_slot(state, key);
    if (value == NULL)
        PyErr_Format(PyExc_AttributeError, "MemberSum.%s is not set", lane_key_names[key]);
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

/* dict[key] = value, stealing the reference to `value` (NULL: an error already set). */
static int lane_set_item(PyObject *dict, PyObject *key, PyObject *value)
{
    if (value == NULL)
        return -1;
    int outcome = PyDict_SetItem(dict, key, value);
    Py_DECREF(value);
    return outcome;
}

/* The MemberSum's attribute set to `value`, stealing the reference (NULL: an error already set). */
static int lane_set(PyObject *state, int key, PyObject *value)
{
    if (value == NULL)
        return -1;
    Py_XSETREF(*lane_slot(state, key), value);
    return 0;
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

/* MemberSum._recovery_wait: min(rto, probe_srtts * max(srtt, interval or 0)), rto while nothing is measured. */
static int lane_recovery_wait(Lane *lane, PyObject *state, double rto, double *wait)
{
    double srtt, interval;
    int measured, smoothed;
    *wait = rto;
    if (lane_get_float(state, LK_SRTT, &srtt, &measured) < 0)
        return -1;
    if (!measured)
        return 0;
    if (lane_get_float(state, LK_INTERVAL, &interval, &smoothed) < 0)
        return -1;
    double other = smoothed ? interval : 0.0;
    double early = (double)lane->probe_srtts * (other > srtt ? other : srtt);
    if (early < rto)
        *wait = early;
    return 0;
}

/* MemberSum._measured: the round trip of chunk `key` folded into the timeout `*rto`, and every chunk in flight
   FAST_RETRANSMIT or more before it sent again once (appended to `sends`), each due again after
   lane_recovery_wait, from which its later waits double. */
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
    double wait;
    if (lane_discard(s->backoff, key) < 0 || lane_recovery_wait(lane, state, *rto, &wait) < 0)
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
        /* fast_resent.add(c); tries[c] += 1; retransmits += 1; sent_at.pop(c, None); deadline[c] = now + wait;
           backoff[c] = wait; the payload of c */
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
            lane_set_item(s->deadline, chunk_object, PyFloat_FromDouble(now + wait)) < 0 ||
            lane_set_item(s->backoff, chunk_object, PyFloat_FromDouble(wait)) < 0 ||
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
    /* The token last, and only where it is compared (a registered job's sum). */
    for (int f = 0; f < LF_TOKEN; f++)
        field[f] = read_be(data + lane->at[f], lane->width[f]);
    field[LF_TOKEN] = lane->compared[LF_TOKEN] ? read_be(data + lane->at[LF_TOKEN], lane->width[LF_TOKEN]) : 0;
    /* Not a result of this sum: another message, another version or token (a registered job's sum, whose
       token is compared, counts these as refused), a length that is not its count's, another owner. */
    if ((lane->compared[LF_MAGIC] && field[LF_MAGIC] != lane->expected[LF_MAGIC]) ||
        (lane->compared[LF_OPCODE] && field[LF_OPCODE] != lane->expected[LF_OPCODE]))
        return 0;
    if ((lane->compared[LF_VERSION] && field[LF_VERSION] != lane->expected[LF_VERSION]) ||
        (lane->compared[LF_TOKEN] && field[LF_TOKEN] != lane->expected[LF_TOKEN])) {
        Py_ssize_t refused;
        if (!lane->compared[LF_TOKEN])
            return 0;
        return lane_get_size(state, LK_REFUSED, &refused) < 0 ? -1 : lane_set_size(state, LK_REFUSED, refused + 1);
    }
    static const int owner[] = {LF_JOB, LF_ROUND, LF_CLIQUE};
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
    if (lane_class == NULL || !PyObject_TypeCheck(state, (PyTypeObject *)lane_class)) {
        PyErr_SetString(PyExc_TypeError, "member_result: state must be a MemberSum (of the class member_state bound)");
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

KERNEL_INTERNAL PyMethodDef lane_methods[] = {
    {"member_lane", (PyCFunction)(void (*)(void))member_lane, METH_FASTCALL,
     "member_lane(layout, expected, sizes, timeouts, received, done, payloads, build) -> lane: a sum's constants"},
    {"member_result", (PyCFunction)(void (*)(void))member_result, METH_FASTCALL,
     "member_result(lane, state, payload, now) -> list: MemberSum.on_result, compiled"},
    {"member_state", (PyCFunction)member_state, METH_O,
     "member_state(cls) -> None: the class whose slots hold a sum's state (client.MemberSum)"},
    {"member_results", (PyCFunction)(void (*)(void))member_results, METH_FASTCALL,
     "member_results(lane, state, buffer, sizes, slot_size, now) -> list: member_result of each datagram"},
    {NULL, NULL, 0, NULL},
};
