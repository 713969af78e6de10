/* The fast aggregator's decider (inwire.fastpath) with inwire serve's learning table and a result's unicast
   copies: part of the compiled kernel inwire._kernel.

   Decider(fields, constants, config)
       The fast aggregator's decisions on UDP payloads with its slot table and the registered jobs' tables
       (install_job, remove_job; version 3), and inwire serve's learning table (below).

   The golden model (inwire.model) is its definition: tests/test_fastpath.py runs both on the same streams
   and compares every answer, destination and counter; where this kernel is not built, inwire serve runs the
   model itself. */

#include "_kernel.h"

__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
static int accumulate_elements(uint8_t *restrict sum, const uint8_t *restrict element, Py_ssize_t count)
{
    /* Big-endian int32 sums, updated in place: each clipped at the int32 limits as it is made (the model
       saturates per contribution), so each fits int32 and the sum of two overflows exactly when int64's would
       pass a limit: the wrapped sum's sign then differs from both addends', and the limit is the addends'
       sign's. Branch-free, so that it vectorizes; returns whether any sum clipped. */
    int saturated = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint32_t a, b;
        memcpy(&a, sum + 4 * i, 4);
        memcpy(&b, element + 4 * i, 4);
        int32_t x = (int32_t)__builtin_bswap32(a), y = (int32_t)__builtin_bswap32(b);
        int32_t total = (int32_t)((uint32_t)x + (uint32_t)y);
        int over = ((x ^ total) & (y ^ total)) < 0;
        int32_t limit = (x >> 31) ^ INT32_MAX;
        saturated |= over;
        uint32_t wire = __builtin_bswap32((uint32_t)(over ? limit : total));
        memcpy(sum + 4 * i, &wire, 4);
    }
    return saturated;
}

/* The decider: `FastAggregator`'s whole decision on one UDP payload (the golden model's, taken on the payload
   rather than its frame), with the slot table it decides on and, for `inwire serve`, who sent
   each slot's accepted contributions and partials (serve.py's learning table).

   No protocol number is written here. Decider(fields, constants, config) takes them from the protocol tables:
   `fields` maps each aggregation header field's name to (offset within the payload, width in bytes);
   `constants` maps the names in CONSTANT_NAMES to numbers (sizes, magic, versions, opcodes, dispositions,
   counter indexes, multicast prefix, status flag, time mask); `config` the names in CONFIG_NAMES
   (fastpath.decider_parameters builds all three). Every number is checked against the others when it comes
   in (each field within the header, each counter index within the counters, ...), so that no datagram can
   make the decider read or write outside its payload, its slots or its counters. */

enum {
    F_MAGIC, F_VERSION, F_OPCODE, F_SENDER, F_FANIN, F_EXPONENT, F_CONTRIBUTORS, F_JOB, F_ROUND, F_CLIQUE, F_SLOT,
    F_CHUNK, F_COUNT, F_GROUP, F_BITMAP, F_EXPECT, F_HOP1, F_HOP1_EXPECT, F_HOP2, F_HOP2_EXPECT, F_RESERVED, F_TOKEN,
    N_FIELDS
};
static const char *const FIELD_NAMES[N_FIELDS] = {
    "magic", "version", "opcode", "sender", "fanin", "exponent", "contributors", "job", "round", "clique", "slot",
    "chunk", "count", "group", "bitmap", "expect", "hop1", "hop1_expect", "hop2", "hop2_expect", "reserved", "token"};

enum {
    K_HEADER, K_ELEMENT, K_TRAILER, K_RUNT, K_MAX_PAYLOAD, K_MAX_MEMBERS, K_MAGIC, K_VERSION, K_VERSION_1,
    K_VERSION_JOB, K_CONTRIBUTION, K_PARTIAL, K_RESULT, K_RESULT_REQUEST, K_STATS_REQUEST, K_STATS_REPLY,
    K_MULTICAST_MASK, K_MULTICAST_PREFIX, K_STATUS_OVERFLOW, K_TIME_MASK,
    K_ACCUMULATED, K_ANSWERED, K_DROP_RUNT, K_DROP_LENGTH, K_DROP_VERSION, K_DROP_OPCODE, K_DROP_FANIN,
    K_DROP_SENDER, K_DROP_COUNT, K_DROP_GROUP, K_DROP_SLOT, K_DROP_DUPLICATE, K_DROP_MISMATCH, K_DROP_COLLISION,
    K_DROP_NO_RESULT, K_DROP_ROUTE, K_DROP_STALE, K_DROP_JOB, K_DROP_TOKEN, K_DROP_MEMBER, K_RELAYED,
    K_FRAMES_IN, K_RESULTS_EMITTED, K_SLOTS_RECLAIMED, K_SATURATIONS, K_LEASES_EXPIRED, K_PARTIALS_EMITTED,
    K_COUNTERS, N_CONSTANTS
};
static const char *const CONSTANT_NAMES[N_CONSTANTS] = {
    "header_bytes", "element_bytes", "trailer_bytes", "runt_payload", "max_payload", "max_members", "magic",
    "version", "version_1", "version_job", "contribution", "partial", "result", "result_request", "stats_request",
    "stats_reply",
    "multicast_mask", "multicast_prefix", "status_overflow", "time_mask",
    "accumulated", "answered", "drop_runt", "drop_length", "drop_version", "drop_opcode", "drop_fanin",
    "drop_sender", "drop_count", "drop_group", "drop_slot", "drop_duplicate", "drop_mismatch", "drop_collision",
    "drop_no_result", "drop_route", "drop_stale", "drop_job", "drop_token", "drop_member", "relayed",
    "frames_in", "results_emitted", "slots_reclaimed", "saturations", "leases_expired", "partials_emitted",
    "counters"};

enum {
    C_SLOTS, C_MAX_FANIN, C_MAX_ELEMENTS, C_LEASE, C_IP, C_PORT, C_UPSTREAM_NETWORK, C_UPSTREAM_MASK, C_REGISTERED,
    C_UNREGISTERED, C_UNICAST_RESULTS, N_CONFIG
};
static const char *const CONFIG_NAMES[N_CONFIG] = {
    "slots", "max_fanin", "max_elements", "lease", "ip", "port", "upstream_network", "upstream_mask", "registered",
    "unregistered", "unicast_results"};

typedef struct {
    uint64_t job, round, clique, chunk;
} owner_t;

typedef struct {
    uint64_t fanin, group, count, exponent, level;
} shape_t;

typedef struct {
    int owned;            /* has an owner (key) */
    int held;             /* in a registered job's range: no version 1 or 2 frame may name it (beside `owned`, in
                             the cache line every datagram reads) */
    owner_t key;
    shape_t shape;        /* the owner's, level resolved as the model's */
    uint64_t bitmap;      /* members summed */
    int overflow;
    /* The slot's output (bytes, owned here alone until it completes): its elements are the running sums, as
       big-endian int32, so that completing it writes only the header and status. */
    PyObject *output;
    int done;             /* completed: the output is as first sent */
    uint64_t stamp;       /* arrival time of the last accepted contribution */
    /* serve.py's learning: the members (by sender index) and children (a set of peers) of `learned_key`. */
    int learned;
    owner_t learned_key;
    PyObject **members;   /* max_members entries, NULL where none was learned */
    PyObject *children;   /* a set, NULL until a partial is learned */
    /* Version 3 (registered jobs). */
    int final;            /* below the root: the clique's result came down from the parent and replaced the sums */
    uint64_t sourced;     /* bit i: member i's contribution came from source[i] */
    /* Below the root, before the result came down: those whose retransmission sent the partial up again (the
       model's Slot.asked and asked_children), members by index, children by their place in `child`. */
    uint64_t asked, asked_children;
    Py_ssize_t n_children;
    uint64_t *source;     /* max_members endpoints each, made when a version 3 frame first claims the slot */
    uint64_t *child;      /* the child aggregators whose partials the slot holds, ascending */
} slot_t;

/* A registered job as the control interface installed it (FastAggregator.install, from jobs.JobTable). An
   endpoint is an IPv4 address and UDP port as ip << 16 | port: never 0 (both are nonzero in a table), and in
   the order of the model's (ip, port) tuples. */
typedef struct {
    uint64_t endpoint, members;
} child_t;

typedef struct {
    uint64_t clique, level, parent; /* level 0: the whole clique; parent 0: rooted here */
    Py_ssize_t n_children;
    child_t *child;                 /* ascending endpoints */
} route_t;

typedef struct {
    uint64_t job, token, base, slots, group;
    Py_ssize_t n_members, n_routes;
    uint64_t *member;               /* ascending endpoints */
    route_t *route;                 /* ascending cliques; a clique not here is flat and rooted here */
} job_t;

static const route_t FLAT_ROUTE = {0, 0, 0, 0, NULL};

#define MAX_HEADER 256 /* bytes of a version 3 output's header, made on the stack first */

typedef struct {
    PyObject_HEAD
    Py_ssize_t at[N_FIELDS], width[N_FIELDS];
    uint64_t k[N_CONSTANTS];
    uint64_t config[N_CONFIG];
    Py_ssize_t slots;
    slot_t *slot;
    uint64_t *counts;
    uint64_t now;
    uint64_t round_mask, round_half; /* serial-number arithmetic on the round field's width */
    Py_ssize_t n_jobs;
    job_t *jobs;                     /* ascending job ids */
} Decider;

/* Whether the decider was made (its __init__ ran): a bare Decider.__new__ has no slots to decide on. */
static int ready(const Decider *d)
{
    if (d->slot != NULL)
        return 1;
    PyErr_SetString(PyExc_RuntimeError, "Decider: not made (call Decider(fields, constants, config))");
    return 0;
}

#define FIELD(d, p, f) read_be((p) + (d)->at[f], (d)->width[f])
#define PUT(d, p, f, value) write_be((p) + (d)->at[f], (d)->width[f], (value))

static inline int same_owner(const owner_t *a, const owner_t *b)
{
    return a->job == b->job && a->round == b->round && a->clique == b->clique && a->chunk == b->chunk;
}

static inline int same_shape(const shape_t *a, const shape_t *b)
{
    return a->fanin == b->fanin && a->group == b->group && a->count == b->count && a->exponent == b->exponent &&
           a->level == b->level;
}

/* `a` is after `b` in serial-number order on the round field: 0 < (a - b) mod 2**bits < 2**(bits - 1). */
static inline int newer(const Decider *d, uint64_t a, uint64_t b)
{
    uint64_t distance = (a - b) & d->round_mask;
    return 0 < distance && distance < d->round_half;
}

static inline int lease_over(const Decider *d, const slot_t *s)
{
    uint64_t lease = d->config[C_LEASE];
    return lease && ((d->now - s->stamp) & d->k[K_TIME_MASK]) >= lease;
}

static inline uint64_t clique_bits(uint64_t fanin)
{
    /* fanin <= max_fanin <= max_members <= 64 (a uint64_t's bits), checked when they came in */
    return fanin >= 64 ? UINT64_MAX : ((uint64_t)1 << fanin) - 1;
}

/* The IPv4 address of `source` (a dotted string, an int, or a (host, port) pair of either and a port) into *from;
   *far when it is an int beyond long long. -1 with an error set when it is none of them. */
static int source_address(PyObject *source, long long *from, int *far)
{
    *far = 0;
    if (PyTuple_Check(source) && PyTuple_GET_SIZE(source) == 2)
        source = PyTuple_GET_ITEM(source, 0);
    if (PyUnicode_Check(source)) {
        const char *text = PyUnicode_AsUTF8(source);
        struct in_addr address;
        if (text == NULL)
            return -1;
        if (inet_pton(AF_INET, text, &address) != 1) {
            PyErr_Format(PyExc_ValueError, "%s is not an IPv4 address", text);
            return -1;
        }
        *from = ntohl(address.s_addr);
    } else if (PyLong_Check(source)) {
        *from = PyLong_AsLongLongAndOverflow(source, far);
        if (*from == -1 && PyErr_Occurred())
            return -1;
    } else {
        PyErr_SetString(PyExc_TypeError, "source must be an IPv4 address as a string or an int, or (address, port)");
        return -1;
    }
    return 0;
}

/* Whether a datagram from `source` (source_address's) may send a partial to hop1 (not 0) and hop2: the model's
   route rule. -1 with an error set when `source` is no address. */
static int route_allowed(const Decider *d, uint64_t hop1, uint64_t hop2, PyObject *source)
{
    long long from;
    int far;
    if (source_address(source, &from, &far) < 0)
        return -1;
    const uint64_t *c = d->config;
    return hop1 != c[C_IP] && (far || (long long)hop1 != from) && (hop1 & c[C_UPSTREAM_MASK]) == c[C_UPSTREAM_NETWORK]
           && hop2 != hop1 && hop2 != c[C_IP];
}

/* The output a datagram causes is a partial (up to its hop1) when it is below the root: version 2 with hop1
   set; else the result. */
static inline int causes_partial(const Decider *d, const uint8_t *p, uint64_t version)
{
    return version != d->k[K_VERSION_1] && FIELD(d, p, F_HOP1) != 0;
}

/* An output's route (`expect` up to `reserved`): a partial's is its asker's from hop1_expect on, moved up one
   level (fastpath._route), the result's is all zero. */
static void write_route(const Decider *d, uint8_t *out, const uint8_t *p, int partial)
{
    Py_ssize_t at = d->at[F_EXPECT], end = d->at[F_RESERVED], moved = end - d->at[F_HOP1_EXPECT];
    memset(out + at, 0, end - at);
    if (partial)
        memcpy(out + at, p + d->at[F_HOP1_EXPECT], moved);
}

static int route_matches(const Decider *d, const uint8_t *out, const uint8_t *p, int partial)
{
    Py_ssize_t at = d->at[F_EXPECT], end = d->at[F_RESERVED], moved = end - d->at[F_HOP1_EXPECT];
    Py_ssize_t from = at;
    if (partial) {
        if (memcmp(out + at, p + d->at[F_HOP1_EXPECT], moved) != 0)
            return 0;
        from += moved;
    }
    for (Py_ssize_t i = from; i < end; i++)
        if (out[i])
            return 0;
    return 1;
}

static inline void count_output(Decider *d, int partial)
{
    d->counts[partial ? d->k[K_PARTIALS_EMITTED] : d->k[K_RESULTS_EMITTED]]++;
}

/* A completed slot's stored output as sent to the datagram `p` that asked for it (fastpath._answer): its
   version, sender index and route; the stored bytes themselves when they already say so. */
static PyObject *answer(Decider *d, slot_t *s, const uint8_t *p, uint64_t version, uint64_t sender)
{
    int partial = causes_partial(d, p, version);
    uint64_t opcode = partial ? d->k[K_PARTIAL] : d->k[K_RESULT];
    count_output(d, partial);
    const uint8_t *out = (const uint8_t *)PyBytes_AS_STRING(s->output);
    if (FIELD(d, out, F_SENDER) == sender && FIELD(d, out, F_OPCODE) == opcode && FIELD(d, out, F_VERSION) == version
        && route_matches(d, out, p, partial)) {
        Py_INCREF(s->output);
        return s->output;
    }
    PyObject *patched = PyBytes_FromStringAndSize((const char *)out, PyBytes_GET_SIZE(s->output));
    if (patched == NULL)
        return NULL;
    uint8_t *bytes = (uint8_t *)PyBytes_AS_STRING(patched);
    PUT(d, bytes, F_VERSION, version);
    PUT(d, bytes, F_OPCODE, opcode);
    PUT(d, bytes, F_SENDER, sender);
    write_route(d, bytes, p, partial);
    return patched;
}

/* The header every output of slot `s` carries, zeroed first (the model's build_frames call): `opcode` in `version`,
   for a frame of `sender` naming `slot`, to `group`. */
static inline void put_slot_header(Decider *d, uint8_t *out, const slot_t *s, uint64_t version, uint64_t opcode,
                                   uint64_t sender, uint64_t slot, uint64_t group)
{
    const uint64_t *k = d->k;
    memset(out, 0, k[K_HEADER]);
    PUT(d, out, F_MAGIC, k[K_MAGIC]);
    PUT(d, out, F_VERSION, version);
    PUT(d, out, F_OPCODE, opcode);
    PUT(d, out, F_SENDER, sender);
    PUT(d, out, F_FANIN, s->shape.fanin);
    PUT(d, out, F_EXPONENT, s->shape.exponent);
    PUT(d, out, F_CONTRIBUTORS, (uint64_t)__builtin_popcountll(s->bitmap));
    PUT(d, out, F_JOB, s->key.job);
    PUT(d, out, F_ROUND, s->key.round);
    PUT(d, out, F_CLIQUE, s->key.clique);
    PUT(d, out, F_SLOT, slot);
    PUT(d, out, F_CHUNK, s->key.chunk);
    PUT(d, out, F_COUNT, s->shape.count);
    PUT(d, out, F_GROUP, group);
    PUT(d, out, F_BITMAP, s->bitmap);
}

/* The slot's output for the datagram that completed it, its header and status written once (fastpath._complete);
   its elements are the sums already. */
static PyObject *complete(Decider *d, slot_t *s, uint64_t slot, const uint8_t *p, uint64_t version, uint64_t sender)
{
    const uint64_t *k = d->k;
    int partial = causes_partial(d, p, version);
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(s->output);
    put_slot_header(d, out, s, version, partial ? k[K_PARTIAL] : k[K_RESULT], sender, slot, s->shape.group);
    write_route(d, out, p, partial);
    write_be(out + k[K_HEADER] + k[K_ELEMENT] * s->shape.count, (Py_ssize_t)k[K_TRAILER],
             s->overflow ? k[K_STATUS_OVERFLOW] : 0);
    count_output(d, partial);
    s->done = 1;
    Py_INCREF(s->output);
    return s->output;
}

/* Counters before this request, one element each (their low bits); every other field zero (fastpath._stats_reply). */
static PyObject *stats_reply(Decider *d, uint64_t version, uint64_t sender, uint64_t job)
{
    const uint64_t *k = d->k;
    Py_ssize_t header = (Py_ssize_t)k[K_HEADER], element = (Py_ssize_t)k[K_ELEMENT];
    PyObject *reply = PyBytes_FromStringAndSize(NULL, header + element * (Py_ssize_t)k[K_COUNTERS]);
    if (reply == NULL)
        return NULL;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(reply);
    memset(out, 0, header);
    PUT(d, out, F_MAGIC, k[K_MAGIC]);
    PUT(d, out, F_VERSION, version);
    PUT(d, out, F_OPCODE, k[K_STATS_REPLY]);
    PUT(d, out, F_SENDER, sender);
    PUT(d, out, F_JOB, job);
    PUT(d, out, F_COUNT, k[K_COUNTERS]);
    for (uint64_t i = 0; i < k[K_COUNTERS]; i++)
        write_be(out + header + element * (Py_ssize_t)i, element, d->counts[i]);
    return reply;
}

/* A new owner for the slot: no members, no sums yet (its first contribution's elements are copied in). An
   unfinished slot's output was never sent, so it is reused when its size fits; a completed one's belongs to
   whoever it was sent to: a new one is made. */
static int claim(Decider *d, slot_t *s, const owner_t *key, const shape_t *shape)
{
    const uint64_t *k = d->k;
    Py_ssize_t size = (Py_ssize_t)(k[K_HEADER] + k[K_ELEMENT] * shape->count + k[K_TRAILER]);
    if (s->output == NULL || s->done || PyBytes_GET_SIZE(s->output) != size) {
        PyObject *output = PyBytes_FromStringAndSize(NULL, size);
        if (output == NULL)
            return -1;
        Py_XSETREF(s->output, output);
    }
    s->owned = 1;
    s->done = 0;
    s->key = *key;
    s->shape = *shape;
    s->bitmap = 0;
    s->overflow = 0;
    s->final = 0;
    s->sourced = 0;
    s->asked = s->asked_children = 0;
    s->n_children = 0;
    return 0;
}

enum { ADMITTED = -2, ANSWER_DUE = -3 };

/* Whether a contribution or partial of owner `key` and `shape` holding `members` may be summed into slot `s`
   (the model's SLOT_CHECKS for it): ADMITTED (claiming the slot when that is due), ANSWER_DUE (its owner's
   completed slot: the stored output again), a drop, or -1 with an error set. */
static inline __attribute__((always_inline)) long long admit(Decider *d, slot_t *s, const owner_t *key, const shape_t *shape, uint64_t members)
{
    const uint64_t *k = d->k;
    if (s->owned && same_owner(&s->key, key)) {
        if (!same_shape(&s->shape, shape))
            return k[K_DROP_MISMATCH];
        if (s->done)
            return ANSWER_DUE;
        if (s->bitmap & members)
            return k[K_DROP_DUPLICATE];
        return ADMITTED;
    }
    if (!s->owned)
        return claim(d, s, key, shape) < 0 ? -1 : ADMITTED;
    if (key->job == s->key.job
        && (key->round != s->key.round ? newer(d, s->key.round, key->round)
                                       : key->clique == s->key.clique && key->chunk < s->key.chunk)
        && !lease_over(d, s))
        /* An older frame of the owner's job (a delayed copy) never evicts the slot while its lease runs. */
        return k[K_DROP_STALE];
    if (s->done)
        return claim(d, s, key, shape) < 0 ? -1 : ADMITTED;
    if (key->job == s->key.job && newer(d, key->round, s->key.round)) {
        if (claim(d, s, key, shape) < 0)
            return -1;
        d->counts[k[K_SLOTS_RECLAIMED]]++;
        return ADMITTED;
    }
    if (lease_over(d, s)) {
        if (claim(d, s, key, shape) < 0)
            return -1;
        d->counts[k[K_LEASES_EXPIRED]]++;
        return ADMITTED;
    }
    return k[K_DROP_COLLISION];
}

/* Sums an admitted contribution or partial of `count` elements (its length checked against the count, and the
   slot's output made for it: the elements lie within both). The first members' elements are the sums (0 + x
   saturates nowhere). */
static inline __attribute__((always_inline)) void add(Decider *d, slot_t *s, const uint8_t *p, Py_ssize_t length, uint64_t opcode, uint64_t count,
                       uint64_t members)
{
    const uint64_t *k = d->k;
    uint8_t *sums = (uint8_t *)PyBytes_AS_STRING(s->output) + k[K_HEADER];
    if (s->bitmap == 0)
        memcpy(sums, p + k[K_HEADER], k[K_ELEMENT] * count);
    else if (accumulate_elements(sums, p + k[K_HEADER], (Py_ssize_t)count)) {
        d->counts[k[K_SATURATIONS]]++;
        s->overflow = 1;
    }
    if (opcode == k[K_PARTIAL] && (p[length - 1] & k[K_STATUS_OVERFLOW]))
        s->overflow = 1; /* saturated at a level below: carried into this slot's status, not counted here */
    s->bitmap |= members;
    s->stamp = d->now;
}

static long long decide_job(Decider *d, const uint8_t *p, Py_ssize_t length, uint64_t opcode, uint64_t count,
                            PyObject *source, PyObject **reply);

/* The disposition of one payload of `length` bytes, and its answer (a new reference, or NULL) in *reply: the
   model's FRAME_CHECKS and SLOT_CHECKS in its order. The answer is a payload for serve to send where it goes
   (versions 1 and 2, and their stats replies, which go to the asker), or, for version 3, the list of (payload,
   (host, port)) the job's tables send it to (a stats reply: to the member that asked). -1 with an error set on failure (no memory, a source that is no address). */
static long long decide(Decider *d, const uint8_t *p, Py_ssize_t length, PyObject *source, PyObject **reply)
{
    const uint64_t *k = d->k, *c = d->config;
    *reply = NULL;
    if ((uint64_t)length < k[K_RUNT])
        return k[K_DROP_RUNT];
    if ((uint64_t)length < k[K_HEADER])
        return k[K_DROP_LENGTH];
    /* From here the whole header is there: every field lies within it (checked at construction). */
    uint64_t version = FIELD(d, p, F_VERSION), opcode = FIELD(d, p, F_OPCODE);
    int job_frame = version == k[K_VERSION_JOB];
    if (FIELD(d, p, F_MAGIC) != k[K_MAGIC] ||
        !(job_frame ? c[C_REGISTERED] : (version == k[K_VERSION] || version == k[K_VERSION_1]) && c[C_UNREGISTERED]))
        return k[K_DROP_VERSION];
    uint64_t count = FIELD(d, p, F_COUNT), expected;
    /* A count beyond the longest payload cannot match the length (and its product must not wrap). */
    if (opcode == k[K_CONTRIBUTION])
        expected = count > k[K_MAX_PAYLOAD] ? UINT64_MAX : k[K_HEADER] + k[K_ELEMENT] * count;
    else if (opcode == k[K_PARTIAL] || (opcode == k[K_RESULT] && job_frame))
        expected = count > k[K_MAX_PAYLOAD] ? UINT64_MAX : k[K_HEADER] + k[K_ELEMENT] * count + k[K_TRAILER];
    else if (opcode == k[K_RESULT_REQUEST] || opcode == k[K_STATS_REQUEST])
        expected = k[K_HEADER];
    else
        return k[K_DROP_OPCODE];
    if ((uint64_t)length != expected || (uint64_t)length > k[K_MAX_PAYLOAD])
        return k[K_DROP_LENGTH];
    uint64_t sender = FIELD(d, p, F_SENDER), job = FIELD(d, p, F_JOB);
    if (job_frame)
        return decide_job(d, p, length, opcode, count, source, reply);
    if (opcode == k[K_STATS_REQUEST]) {
        *reply = stats_reply(d, version, sender, job);
        return *reply ? (long long)k[K_ANSWERED] : -1;
    }
    uint64_t fanin = FIELD(d, p, F_FANIN);
    if (fanin < 1 || fanin > c[C_MAX_FANIN])
        return k[K_DROP_FANIN];
    if (sender >= fanin)
        return k[K_DROP_SENDER];
    uint64_t whole = clique_bits(fanin), members, level;
    if (version == k[K_VERSION_1]) {
        /* Whatever its tree bytes hold: one member, the whole clique, the root. */
        members = (uint64_t)1 << sender;
        level = whole;
    } else {
        uint64_t bitmap = FIELD(d, p, F_BITMAP), expect = FIELD(d, p, F_EXPECT);
        members = bitmap ? bitmap : (uint64_t)1 << sender;
        level = expect ? expect : whole;
        if ((members | level) != level || level > whole)
            return k[K_DROP_SENDER];
    }
    if (count < 1 || count > c[C_MAX_ELEMENTS])
        return k[K_DROP_COUNT];
    uint64_t group = FIELD(d, p, F_GROUP);
    if ((group & k[K_MULTICAST_MASK]) != k[K_MULTICAST_PREFIX])
        return k[K_DROP_GROUP];
    uint64_t slot = FIELD(d, p, F_SLOT);
    if (slot >= (uint64_t)d->slots || d->slot[slot].held)
        return k[K_DROP_SLOT];
    if (version != k[K_VERSION_1]) {
        uint64_t hop1 = FIELD(d, p, F_HOP1), hop2 = FIELD(d, p, F_HOP2);
        if (hop1) {
            int allowed = route_allowed(d, hop1, hop2, source);
            if (allowed < 0)
                return -1;
            if (!allowed)
                return k[K_DROP_ROUTE];
        } else if (hop2) {
            return k[K_DROP_ROUTE];
        }
    }
    owner_t key = {job, FIELD(d, p, F_ROUND), FIELD(d, p, F_CLIQUE), FIELD(d, p, F_CHUNK)};
    slot_t *s = &d->slot[slot];
    if (opcode == k[K_RESULT_REQUEST]) {
        if (s->owned && same_owner(&s->key, &key) && s->done) {
            *reply = answer(d, s, p, version, sender);
            return *reply ? (long long)k[K_ANSWERED] : -1;
        }
        return k[K_DROP_NO_RESULT];
    }
    shape_t shape = {fanin, group, count, FIELD(d, p, F_EXPONENT), level};
    long long admitted = admit(d, s, &key, &shape, members);
    if (admitted == ANSWER_DUE) {
        *reply = answer(d, s, p, version, sender);
        return *reply ? (long long)k[K_ANSWERED] : -1;
    }
    if (admitted != ADMITTED)
        return admitted;
    add(d, s, p, length, opcode, count, members);
    if (s->bitmap != level)
        return k[K_ACCUMULATED];
    *reply = complete(d, s, slot, p, version, sender);
    return *reply ? (long long)k[K_ACCUMULATED] : -1;
}

/* Version 3: registered jobs (the model's install/remove, source_allowed, _contribution, _result_request,
   _relay, _answer, _down and _v3_frame). */

static const job_t *find_job(const Decider *d, uint64_t job)
{
    Py_ssize_t low = 0, high = d->n_jobs;
    while (low < high) {
        Py_ssize_t middle = low + (high - low) / 2;
        if (d->jobs[middle].job < job)
            low = middle + 1;
        else
            high = middle;
    }
    return low < d->n_jobs && d->jobs[low].job == job ? &d->jobs[low] : NULL;
}

static const route_t *find_route(const job_t *j, uint64_t clique)
{
    Py_ssize_t low = 0, high = j->n_routes;
    while (low < high) {
        Py_ssize_t middle = low + (high - low) / 2;
        if (j->route[middle].clique < clique)
            low = middle + 1;
        else
            high = middle;
    }
    return low < j->n_routes && j->route[low].clique == clique ? &j->route[low] : &FLAT_ROUTE;
}

static int has_member(const job_t *j, uint64_t endpoint)
{
    Py_ssize_t low = 0, high = j->n_members;
    while (low < high) {
        Py_ssize_t middle = low + (high - low) / 2;
        if (j->member[middle] < endpoint)
            low = middle + 1;
        else
            high = middle;
    }
    return low < j->n_members && j->member[low] == endpoint;
}

static const child_t *find_child(const route_t *r, uint64_t endpoint)
{
    for (Py_ssize_t i = 0; i < r->n_children; i++)
        if (r->child[i].endpoint == endpoint)
            return &r->child[i];
    return NULL;
}

/* The endpoint (ip << 16 | port) a datagram came from: `source` as (host, port); 0 (no table's endpoint) when it
   names no port or an impossible one. -1 with an error set when its host is no address. */
static int source_endpoint(PyObject *source, uint64_t *endpoint)
{
    long long from;
    int far;
    *endpoint = 0;
    if (source_address(source, &from, &far) < 0)
        return -1;
    if (!PyTuple_Check(source) || PyTuple_GET_SIZE(source) != 2)
        return 0;
    unsigned long long port = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(source, 1));
    if (port == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (!far && from > 0 && from <= 0xFFFFFFFF && port > 0 && port <= 0xFFFF)
        *endpoint = (uint64_t)from << 16 | port;
    return 0;
}

/* The slot's version 3 output as `opcode` (partial or result), asked for by a frame of `sender` naming the job's
   relative slot `slot` (the model's _v3_frame): the slot's output itself when the slot just completed (written in
   place) or when it says so already, else a copy that does. */
static PyObject *job_output(Decider *d, slot_t *s, const job_t *j, uint64_t opcode, uint64_t sender, uint64_t slot,
                            int fresh)
{
    const uint64_t *k = d->k;
    Py_ssize_t header = (Py_ssize_t)k[K_HEADER], at = header + (Py_ssize_t)(k[K_ELEMENT] * s->shape.count);
    uint8_t head[MAX_HEADER];
    put_slot_header(d, head, s, k[K_VERSION_JOB], opcode, sender, slot, j->group);
    PUT(d, head, F_TOKEN, j->token);
    uint64_t status = s->overflow ? k[K_STATUS_OVERFLOW] : 0;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(s->output);
    if (!fresh) {
        if (memcmp(out, head, header) == 0 && read_be(out + at, (Py_ssize_t)k[K_TRAILER]) == status)
            return Py_NewRef(s->output);
        PyObject *copy = PyBytes_FromStringAndSize((const char *)out, PyBytes_GET_SIZE(s->output));
        if (copy == NULL)
            return NULL;
        out = (uint8_t *)PyBytes_AS_STRING(copy);
        memcpy(out, head, header);
        write_be(out + at, (Py_ssize_t)k[K_TRAILER], status);
        return copy;
    }
    memcpy(out, head, header);
    write_be(out + at, (Py_ssize_t)k[K_TRAILER], status);
    return Py_NewRef(s->output);
}

/* Appends (body, (dotted address, port)) for `endpoint` to `sends`, counted as a partial or result sent. */
static int send_to(Decider *d, PyObject *sends, PyObject *body, uint64_t endpoint, int partial)
{
    char text[INET_ADDRSTRLEN];
    struct in_addr address = {htonl((uint32_t)(endpoint >> 16))};
    if (inet_ntop(AF_INET, &address, text, sizeof(text)) == NULL) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    PyObject *send = Py_BuildValue("(O(sK))", body, text, (unsigned long long)(endpoint & 0xFFFF));
    if (send == NULL)
        return -1;
    int failed = PyList_Append(sends, send);
    Py_DECREF(send);
    if (failed)
        return -1;
    count_output(d, partial);
    return 0;
}

/* [(body, endpoint)] as a new list, or NULL with an error set. */
static PyObject *send_one(Decider *d, PyObject *body, uint64_t endpoint, int partial)
{
    PyObject *sends = body ? PyList_New(0) : NULL;
    if (sends != NULL && send_to(d, sends, body, endpoint, partial) < 0)
        Py_CLEAR(sends);
    Py_XDECREF(body);
    return sends;
}

/* Whether a copy of the result went to `endpoint` already: from a member index of `members` below `index` (64:
   any), or a child of `children` (bits by place) before `child`. */
static int sent_already(const slot_t *s, uint64_t members, uint64_t children, uint64_t endpoint, unsigned index,
                        Py_ssize_t child)
{
    uint64_t below = index >= 64 ? ~0ULL : (1ULL << index) - 1;
    for (uint64_t bits = members & below; bits; bits &= bits - 1)
        if (s->source[__builtin_ctzll(bits)] == endpoint)
            return 1;
    for (Py_ssize_t i = 0; i < child; i++)
        if (children >> i & 1 && s->child[i] == endpoint)
            return 1;
    return 0;
}

/* The result sent down from here (the model's _down): from the root, to the job's group; else a copy to each
   address a contribution the slot took here came from (by member index, once an address) and to each child
   aggregator whose partial it took. A result `relayed` from the parent of a job with a group answers
   retransmissions (the root sent it to the group): only those that asked (`asked`, `asked_children`) get it,
   unless this aggregator sends no copies (config unicast_results 0, as the gateware): then the group again. */
static PyObject *send_down(Decider *d, slot_t *s, const job_t *j, uint64_t sender, uint64_t slot, int fresh,
                           int relayed)
{
    PyObject *body = job_output(d, s, j, d->k[K_RESULT], sender, slot, fresh);
    if (body == NULL)
        return NULL;
    if (j->group && (!relayed || !d->config[C_UNICAST_RESULTS]))
        return send_one(d, body, j->group << 16 | d->config[C_PORT], 0);
    uint64_t members = j->group ? s->sourced & s->asked : s->sourced;
    uint64_t children = j->group ? s->asked_children : ~0ULL;
    PyObject *sends = PyList_New(0);
    if (sends == NULL)
        goto failed;
    for (uint64_t bits = members; bits; bits &= bits - 1) {
        unsigned index = (unsigned)__builtin_ctzll(bits);
        if (!sent_already(s, members, children, s->source[index], index, 0)
            && send_to(d, sends, body, s->source[index], 0) < 0)
            goto failed;
    }
    for (Py_ssize_t i = 0; i < s->n_children; i++)
        if (children >> i & 1 && !sent_already(s, members, children, s->child[i], 64, i)
            && send_to(d, sends, body, s->child[i], 0) < 0)
            goto failed;
    Py_DECREF(body);
    return sends;
failed:
    Py_XDECREF(sends);
    Py_DECREF(body);
    return NULL;
}

/* Notes where an accepted version 3 contribution (a member, by its index) or partial (a child aggregator, in
   ascending order, once) came from: the addresses its result goes to. */
static int note_source(Decider *d, slot_t *s, uint64_t opcode, uint64_t sender, uint64_t from)
{
    Py_ssize_t most = (Py_ssize_t)d->k[K_MAX_MEMBERS];
    if (s->source == NULL) {
        /* Each accepted frame adds a member, so a slot takes at most max_members partials. */
        s->source = PyMem_Calloc(2 * most, sizeof(uint64_t));
        if (s->source == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->child = s->source + most;
    }
    if (opcode != d->k[K_PARTIAL]) {
        s->source[sender] = from;
        s->sourced |= (uint64_t)1 << sender;
        return 0;
    }
    Py_ssize_t at = 0;
    while (at < s->n_children && s->child[at] < from)
        at++;
    if (at < s->n_children && s->child[at] == from)
        return 0;
    if (s->n_children >= most) {
        PyErr_SetString(PyExc_RuntimeError, "Decider: more children in a slot than members");
        return -1;
    }
    memmove(s->child + at + 1, s->child + at, (s->n_children - at) * sizeof(uint64_t));
    s->child[at] = from;
    s->n_children++;
    return 0;
}

/* A version 3 datagram whose header is whole and whose length agrees with its count and opcode: the model's
   checks from DROP_JOB on and its actions, in its order. */
static long long decide_job(Decider *d, const uint8_t *p, Py_ssize_t length, uint64_t opcode, uint64_t count,
                            PyObject *source, PyObject **reply)
{
    const uint64_t *k = d->k, *c = d->config;
    const job_t *j = find_job(d, FIELD(d, p, F_JOB));
    if (j == NULL)
        return k[K_DROP_JOB];
    if (FIELD(d, p, F_TOKEN) != j->token)
        return k[K_DROP_TOKEN];
    uint64_t from, sender = FIELD(d, p, F_SENDER), bitmap = FIELD(d, p, F_BITMAP);
    if (source_endpoint(source, &from) < 0)
        return -1;
    owner_t key = {FIELD(d, p, F_JOB), FIELD(d, p, F_ROUND), FIELD(d, p, F_CLIQUE), FIELD(d, p, F_CHUNK)};
    const route_t *route = find_route(j, key.clique);
    /* The members it holds: its bitmap, or its sender alone; a sender past the bitmap's bits is no member any
       table holds (and past the fan-in, checked next). */
    int beyond = !bitmap && sender >= 64;
    uint64_t members = bitmap ? bitmap : beyond ? 0 : (uint64_t)1 << sender;
    int allowed;
    if (opcode == k[K_PARTIAL]) {
        const child_t *child = from ? find_child(route, from) : NULL;
        allowed = child != NULL && !beyond && (members & ~child->members) == 0;
    } else if (opcode == k[K_RESULT]) {
        allowed = route->parent != 0 && route->parent == from;
    } else {
        allowed = from != 0 && has_member(j, from);
    }
    if (!allowed)
        return k[K_DROP_MEMBER];
    /* Answered only now: a member of the job asked, so no one else can have the larger reply sent anywhere. It
       goes back to the asker, [(reply, source)] as every version 3 answer, and counts as no output. */
    if (opcode == k[K_STATS_REQUEST]) {
        PyObject *body = stats_reply(d, k[K_VERSION_JOB], sender, key.job);
        if (body == NULL)
            return -1;
        *reply = Py_BuildValue("[(OO)]", body, source);
        Py_DECREF(body);
        return *reply ? (long long)k[K_ANSWERED] : -1;
    }
    uint64_t fanin = FIELD(d, p, F_FANIN);
    if (fanin < 1 || fanin > c[C_MAX_FANIN])
        return k[K_DROP_FANIN];
    if (sender >= fanin)
        return k[K_DROP_SENDER];
    uint64_t whole = clique_bits(fanin), level = route->level ? route->level : whole;
    if (opcode == k[K_RESULT] ? (members & ~whole) != 0 : (members & ~level) != 0 || (level & ~whole) != 0)
        return k[K_DROP_SENDER];
    if (count < 1 || count > c[C_MAX_ELEMENTS])
        return k[K_DROP_COUNT];
    uint64_t group = FIELD(d, p, F_GROUP);
    if (group != j->group)
        return k[K_DROP_GROUP];
    uint64_t slot = FIELD(d, p, F_SLOT);
    if (slot >= j->slots)
        return k[K_DROP_SLOT];
    if (FIELD(d, p, F_EXPECT) || FIELD(d, p, F_HOP1) || FIELD(d, p, F_HOP1_EXPECT) || FIELD(d, p, F_HOP2) ||
        FIELD(d, p, F_HOP2_EXPECT))
        return k[K_DROP_ROUTE];
    slot_t *s = &d->slot[j->base + slot];
    int same = s->owned && same_owner(&s->key, &key);
    if (opcode == k[K_RESULT_REQUEST]) {
        if (same && s->done && (route->parent == 0 || s->final)) {
            *reply = send_one(d, job_output(d, s, j, k[K_RESULT], sender, slot, 0), from, 0);
            return *reply ? (long long)k[K_ANSWERED] : -1;
        }
        return k[K_DROP_NO_RESULT];
    }
    uint64_t exponent = FIELD(d, p, F_EXPONENT);
    if (opcode == k[K_RESULT]) {
        if (!same || !s->done)
            return k[K_DROP_NO_RESULT];
        if (s->shape.fanin != fanin || s->shape.count != count || s->shape.exponent != exponent)
            return k[K_DROP_MISMATCH];
        if (s->final)
            return k[K_DROP_DUPLICATE];
        /* The parent's sums replace the slot's; its output was sent, so they go into a new one. */
        PyObject *output = PyBytes_FromStringAndSize(NULL, PyBytes_GET_SIZE(s->output));
        if (output == NULL)
            return -1;
        memcpy(PyBytes_AS_STRING(output) + k[K_HEADER], p + k[K_HEADER], k[K_ELEMENT] * count);
        Py_SETREF(s->output, output);
        s->bitmap = members;
        s->overflow = (p[length - 1] & k[K_STATUS_OVERFLOW]) != 0;
        s->final = 1;
        *reply = send_down(d, s, j, sender, slot, 1, 1);
        return *reply ? (long long)k[K_RELAYED] : -1;
    }
    shape_t shape = {fanin, group, count, exponent, level};
    long long admitted = admit(d, s, &key, &shape, members);
    if (admitted == ANSWER_DUE) {
        /* To the frame's source alone: below the root the partial again until the result came down, noting who
           asked (the result that comes down answers them). */
        if (route->parent != 0 && !s->final) {
            if (opcode != k[K_PARTIAL])
                s->asked |= s->sourced & (uint64_t)1 << sender;
            else
                for (Py_ssize_t i = 0; i < s->n_children; i++)
                    if (s->child[i] == from)
                        s->asked_children |= (uint64_t)1 << i;
            *reply = send_one(d, job_output(d, s, j, k[K_PARTIAL], sender, slot, 0), route->parent, 1);
        } else
            *reply = send_one(d, job_output(d, s, j, k[K_RESULT], sender, slot, 0), from, 0);
        return *reply ? (long long)k[K_ANSWERED] : -1;
    }
    if (admitted != ADMITTED)
        return admitted;
    if (note_source(d, s, opcode, sender, from) < 0)
        return -1;
    add(d, s, p, length, opcode, count, members);
    if (s->bitmap != level)
        return k[K_ACCUMULATED];
    s->done = 1;
    if (route->parent != 0)
        *reply = send_one(d, job_output(d, s, j, k[K_PARTIAL], sender, slot, 1), route->parent, 1);
    else
        *reply = send_down(d, s, j, sender, slot, 1, 0);
    return *reply ? (long long)k[K_ACCUMULATED] : -1;
}

static void forget(Decider *d, slot_t *s)
{
    if (s->members != NULL)
        for (uint64_t i = 0; i < d->k[K_MAX_MEMBERS]; i++)
            Py_CLEAR(s->members[i]);
    Py_CLEAR(s->children);
}

/* serve.py's learning of an accepted or answered contribution or partial (whose header is whole) from `peer`:
   a member by its index, a child aggregator by its address, per slot, for the slot's current owner. */
static int learn(Decider *d, const uint8_t *p, PyObject *peer)
{
    uint64_t slot = FIELD(d, p, F_SLOT), sender = FIELD(d, p, F_SENDER);
    if (slot >= (uint64_t)d->slots || sender >= d->k[K_MAX_MEMBERS])
        return 0; /* not for an accepted datagram: its slot and sender were checked */
    slot_t *s = &d->slot[slot];
    owner_t key = {FIELD(d, p, F_JOB), FIELD(d, p, F_ROUND), FIELD(d, p, F_CLIQUE), FIELD(d, p, F_CHUNK)};
    if (!s->learned || !same_owner(&s->learned_key, &key)) {
        forget(d, s);
        s->learned = 1;
        s->learned_key = key;
    }
    if (FIELD(d, p, F_OPCODE) == d->k[K_PARTIAL]) {
        if (s->children == NULL && (s->children = PySet_New(NULL)) == NULL)
            return -1;
        return PySet_Add(s->children, peer);
    }
    if (s->members == NULL && (s->members = PyMem_Calloc(d->k[K_MAX_MEMBERS], sizeof(PyObject *))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_INCREF(peer);
    Py_XSETREF(s->members[sender], peer);
    return 0;
}

/* A payload's bytes: a bytes object's or a memoryview's directly (the GIL is held throughout, so neither can
   change or be released meanwhile), any other buffer's through the buffer protocol. */
typedef struct {
    const uint8_t *p;
    Py_ssize_t length;
    Py_buffer view;
    int held;
} payload_t;

static int open_payload(PyObject *object, payload_t *payload)
{
    payload->held = 0;
    if (PyBytes_CheckExact(object)) {
        payload->p = (const uint8_t *)PyBytes_AS_STRING(object);
        payload->length = PyBytes_GET_SIZE(object);
#ifdef _Py_MEMORYVIEW_RELEASED
    } else if (PyMemoryView_Check(object) && !(((PyMemoryViewObject *)object)->flags & _Py_MEMORYVIEW_RELEASED) &&
               PyBuffer_IsContiguous(PyMemoryView_GET_BUFFER(object), 'C')) {
        payload->p = (const uint8_t *)PyMemoryView_GET_BUFFER(object)->buf;
        payload->length = PyMemoryView_GET_BUFFER(object)->len;
#endif
    } else {
        if (get_buffer(object, &payload->view, 0, "payload") < 0)
            return -1;
        payload->p = (const uint8_t *)payload->view.buf;
        payload->length = payload->view.len;
        payload->held = 1;
    }
    return 0;
}

static void close_payload(payload_t *payload)
{
    if (payload->held)
        PyBuffer_Release(&payload->view);
}

/* The arrival time of the datagrams from now on: `now` (lease ticks, any int) modulo the timer; None: no time
   passed. */
static int set_now(Decider *d, PyObject *now)
{
    if (now == Py_None)
        return 0;
    unsigned long long ticks = PyLong_AsUnsignedLongLongMask(now);
    if (ticks == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    d->now = ticks & d->k[K_TIME_MASK];
    return 0;
}

/* decide, then count the disposition and, with a peer, learn an accepted or answered contribution or partial. */
static long long decide_counted(Decider *d, const uint8_t *p, Py_ssize_t length, PyObject *source, PyObject *peer,
                                PyObject **reply)
{
    long long disposition = decide(d, p, length, source, reply);
    if (disposition < 0)
        return -1;
    d->counts[disposition]++;
    d->counts[d->k[K_FRAMES_IN]]++;
    if (peer != Py_None && (disposition == (long long)d->k[K_ACCUMULATED] || disposition == (long long)d->k[K_ANSWERED])) {
        /* A version 3 answer goes where the job's tables say: serve learns nothing from it. */
        uint64_t opcode = FIELD(d, p, F_OPCODE);
        if ((opcode == d->k[K_CONTRIBUTION] || opcode == d->k[K_PARTIAL]) && FIELD(d, p, F_VERSION) != d->k[K_VERSION_JOB]
            && learn(d, p, peer) < 0) {
            Py_CLEAR(*reply);
            return -1;
        }
    }
    return disposition;
}

/* (disposition, reply or None), taking the reference to reply. */
static PyObject *outcome(long long disposition, PyObject *reply)
{
    PyObject *number = PyLong_FromLongLong(disposition);
    PyObject *pair = number ? PyTuple_Pack(2, number, reply ? reply : Py_None) : NULL;
    Py_XDECREF(number);
    Py_XDECREF(reply);
    return pair;
}

/* handle(payload, now=None, source=0, peer=None) -> (disposition, answer or None): one datagram that arrived at
   `now` (lease ticks; None: no time passed) from `source` (its address, or (address, port): read when it names a
   next hop, and for version 3, whose sources the job's tables check, with its port), counted; with `peer` (any
   hashable, serve's (host, port)), an accepted or answered version 1 or 2 contribution or partial is learned.
   A version 3 answer is the list of (payload, (host, port)) to send. */
static PyObject *Decider_handle(Decider *d, PyObject *const *args, Py_ssize_t nargs)
{
    if (!ready(d))
        return NULL;
    if (nargs < 1 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "handle(payload, now=None, source=0, peer=None)");
        return NULL;
    }
    static PyObject *zero = NULL;
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    PyObject *source = nargs > 2 ? args[2] : zero, *peer = nargs > 3 ? args[3] : Py_None, *reply = NULL;
    payload_t payload;
    if (set_now(d, nargs > 1 ? args[1] : Py_None) < 0 || open_payload(args[0], &payload) < 0)
        return NULL;
    long long disposition = decide_counted(d, payload.p, payload.length, source, peer, &reply);
    close_payload(&payload);
    return disposition < 0 ? NULL : outcome(disposition, reply);
}

static PyObject *make_copies(Decider *d, PyObject *body, PyObject *parent, PyObject *own, Py_ssize_t *refused);

/* serve_batch(buffer, batch, slot_size, start, now, own, sends) -> (next, decided, refused, copies): inwire serve's
   handling of each datagram of a recv_batch `batch` from index `start` on (batch[i] is its (size, peer), its bytes
   at i * slot_size in `buffer`), all arrived at `now`, up to where its answer goes, for the common case: a
   result that completed its slot has its copies for the members and children learned appended to `sends`
   (without those to `own`, the service's address, given in unicast mode where no wildcard address makes other
   addresses the service's too). It stops at the first datagram whose answer serve.py sends itself: `next` is
   its index (len(batch): none), `decided` None when its opcode is one the service looks at before the
   aggregator (a result, a stats request: nothing was decided), else (disposition, answer) (for version 3, a list
   of (payload, (host, port)) to send as it is); `refused` and `copies` count the copies to `own` left out and
   those appended. One call per batch instead of one per datagram. */
static PyObject *Decider_serve_batch(Decider *d, PyObject *const *args, Py_ssize_t nargs)
{
    if (!ready(d))
        return NULL;
    if (nargs != 7 || !PyList_CheckExact(args[1]) || !PyList_CheckExact(args[6])) {
        PyErr_SetString(PyExc_TypeError, "serve_batch(buffer, batch: list, slot_size, start, now, own, sends: list)");
        return NULL;
    }
    PyObject *batch = args[1], *own = args[5], *sends = args[6], *decided = NULL;
    Py_ssize_t slot_size = PyLong_AsSsize_t(args[2]), index = PyLong_AsSsize_t(args[3]), refused = 0, copies = 0;
    if ((slot_size == -1 || index == -1) && PyErr_Occurred())
        return NULL;
    if (slot_size < 1 || index < 0) {
        PyErr_SetString(PyExc_ValueError, "serve_batch: slot_size must be positive and start not negative");
        return NULL;
    }
    Py_buffer buffer;
    if (get_buffer(args[0], &buffer, 0, "buffer") < 0)
        return NULL;
    if (set_now(d, args[4]) < 0)
        goto failed;
    for (; index < PyList_GET_SIZE(batch); index++) {
        PyObject *item = PyList_GET_ITEM(batch, index), *peer, *reply = NULL;
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2 || !PyTuple_CheckExact(peer = PyTuple_GET_ITEM(item, 1)) ||
            PyTuple_GET_SIZE(peer) != 2) {
            PyErr_SetString(PyExc_TypeError, "serve_batch: each datagram is (size, (host, port))");
            goto failed;
        }
        Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
        if (size == -1 && PyErr_Occurred())
            goto failed;
        if (size < 0 || size > slot_size || size > buffer.len || index > (buffer.len - size) / slot_size) {
            PyErr_SetString(PyExc_ValueError, "serve_batch: a datagram lies outside the buffer");
            goto failed;
        }
        const uint8_t *p = (const uint8_t *)buffer.buf + index * slot_size;
        if (size >= d->at[F_OPCODE] + d->width[F_OPCODE]) {
            uint64_t opcode = FIELD(d, p, F_OPCODE);
            if (opcode == d->k[K_RESULT] || opcode == d->k[K_STATS_REQUEST]) {
                decided = Py_NewRef(Py_None);
                break;
            }
        }
        long long disposition = decide_counted(d, p, size, peer, peer, &reply);
        if (disposition < 0)
            goto failed;
        if (reply == NULL)
            continue;
        if (own == Py_None || disposition == (long long)d->k[K_ANSWERED] || PyList_CheckExact(reply) ||
            FIELD(d, (const uint8_t *)PyBytes_AS_STRING(reply), F_OPCODE) != d->k[K_RESULT]) {
            if ((decided = outcome(disposition, reply)) == NULL)
                goto failed;
            break;
        }
        PyObject *list = make_copies(d, reply, Py_None, own, &refused);
        Py_DECREF(reply);
        if (list == NULL)
            goto failed;
        copies += PyList_GET_SIZE(list);
        Py_ssize_t end = PyList_GET_SIZE(sends);
        int appended = PyList_SetSlice(sends, end, end, list);
        Py_DECREF(list);
        if (appended < 0)
            goto failed;
    }
    PyBuffer_Release(&buffer);
    return Py_BuildValue("(nNnn)", index, decided ? decided : Py_NewRef(Py_None), refused, copies);
failed:
    Py_XDECREF(decided);
    PyBuffer_Release(&buffer);
    return NULL;
}

/* Appends (body, address) to `list` unless the address is `parent` or `own` (counted in *refused); -1 on error. */
static int append_copy(PyObject *list, PyObject *body, PyObject *address, PyObject *parent, PyObject *own,
                       Py_ssize_t *refused)
{
    if (parent != Py_None) {
        int other = PyObject_RichCompareBool(address, parent, Py_NE);
        if (other <= 0)
            return other;
    }
    if (own != Py_None) {
        /* serve.py's `_is_own` without a wildcard address: the address as a tuple equals the service's. */
        PyObject *as_tuple = PySequence_Tuple(address);
        int mine = as_tuple ? PyObject_RichCompareBool(as_tuple, own, Py_EQ) : -1;
        Py_XDECREF(as_tuple);
        if (mine < 0)
            return -1;
        if (mine) {
            (*refused)++;
            return 0;
        }
    }
    PyObject *copy = PyTuple_Pack(2, body, address);
    if (copy == NULL)
        return -1;
    int failed = PyList_Append(list, copy);
    Py_DECREF(copy);
    return failed;
}

/* serve.py's `_copies`: the members learned for the result's slot and owner whose bits its bitmap holds (by
   index), then the children (sorted), except `parent` and, when given, `own`. */
static PyObject *make_copies(Decider *d, PyObject *body, PyObject *parent, PyObject *own, Py_ssize_t *refused)
{
    Py_buffer view;
    if (get_buffer(body, &view, 0, "body") < 0)
        return NULL;
    PyObject *list = PyList_New(0);
    if (list == NULL || view.len < (Py_ssize_t)d->k[K_HEADER]) {
        PyBuffer_Release(&view);
        return list;
    }
    const uint8_t *p = (const uint8_t *)view.buf;
    uint64_t slot = FIELD(d, p, F_SLOT), bitmap = FIELD(d, p, F_BITMAP);
    owner_t key = {FIELD(d, p, F_JOB), FIELD(d, p, F_ROUND), FIELD(d, p, F_CLIQUE), FIELD(d, p, F_CHUNK)};
    PyBuffer_Release(&view);
    if (slot >= (uint64_t)d->slots)
        return list;
    slot_t *s = &d->slot[slot];
    if (!s->learned || !same_owner(&s->learned_key, &key))
        return list;
    if (s->members != NULL)
        for (uint64_t i = 0; i < d->k[K_MAX_MEMBERS]; i++)
            if (s->members[i] != NULL && (bitmap >> i & 1) &&
                append_copy(list, body, s->members[i], parent, own, refused) < 0)
                goto failed;
    if (s->children != NULL) {
        PyObject *children = PySequence_List(s->children);
        if (children == NULL || PyList_Sort(children) < 0) {
            Py_XDECREF(children);
            goto failed;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(children); i++)
            if (append_copy(list, body, PyList_GET_ITEM(children, i), parent, own, refused) < 0) {
                Py_DECREF(children);
                goto failed;
            }
        Py_DECREF(children);
    }
    return list;
failed:
    Py_DECREF(list);
    return NULL;
}

/* copies(body, parent=None) -> [(body, address)]: serve.py's `_copies` before its own-address filter. */
static PyObject *Decider_copies(Decider *d, PyObject *const *args, Py_ssize_t nargs)
{
    if (!ready(d))
        return NULL;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "copies(body, parent=None)");
        return NULL;
    }
    Py_ssize_t refused = 0;
    return make_copies(d, args[0], nargs > 1 ? args[1] : Py_None, Py_None, &refused);
}

/* One slot's entry of serve.py's learning table: ((job, round, clique, chunk), {sender: peer}, {peers}). */
static PyObject *learned_entry(Decider *d, slot_t *s)
{
    PyObject *members = PyDict_New(), *entry = NULL;
    PyObject *children = s->children ? PySet_New(s->children) : PySet_New(NULL);
    if (members == NULL || children == NULL)
        goto done;
    for (uint64_t i = 0; s->members != NULL && i < d->k[K_MAX_MEMBERS]; i++) {
        if (s->members[i] == NULL)
            continue;
        PyObject *index = PyLong_FromUnsignedLongLong(i);
        int failed = index == NULL || PyDict_SetItem(members, index, s->members[i]) < 0;
        Py_XDECREF(index);
        if (failed)
            goto done;
    }
    entry = Py_BuildValue("((KKKK)OO)", s->learned_key.job, s->learned_key.round, s->learned_key.clique,
                          s->learned_key.chunk, members, children);
done:
    Py_XDECREF(members);
    Py_XDECREF(children);
    return entry;
}

/* learned() -> {slot: entry}: serve.py's learning table, for the slots that learned something. */
static PyObject *Decider_learned(Decider *d, PyObject *unused)
{
    if (!ready(d))
        return NULL;
    PyObject *table = PyDict_New();
    for (Py_ssize_t slot = 0; table != NULL && slot < d->slots; slot++) {
        if (!d->slot[slot].learned)
            continue;
        PyObject *entry = learned_entry(d, &d->slot[slot]), *index = PyLong_FromSsize_t(slot);
        if (entry == NULL || index == NULL || PyDict_SetItem(table, index, entry) < 0)
            Py_CLEAR(table);
        Py_XDECREF(entry);
        Py_XDECREF(index);
    }
    return table;
}

static PyObject *Decider_slot_key(Decider *d, PyObject *argument)
{
    if (!ready(d))
        return NULL;
    Py_ssize_t slot = PyLong_AsSsize_t(argument);
    if (slot == -1 && PyErr_Occurred())
        return NULL;
    if (slot < 0 || slot >= d->slots) {
        PyErr_SetString(PyExc_IndexError, "slot out of range");
        return NULL;
    }
    slot_t *s = &d->slot[slot];
    if (!s->owned)
        Py_RETURN_NONE;
    return Py_BuildValue("(KKKK)", s->key.job, s->key.round, s->key.clique, s->key.chunk);
}

static PyObject *Decider_counts(Decider *d, PyObject *unused)
{
    if (!ready(d))
        return NULL;
    PyObject *list = PyList_New((Py_ssize_t)d->k[K_COUNTERS]);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < (Py_ssize_t)d->k[K_COUNTERS]; i++) {
        PyObject *value = PyLong_FromUnsignedLongLong(d->counts[i]);
        if (value == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, value);
    }
    return list;
}

/* Each of `names` from dict `table` as a non-negative integer below 2**64 into `values`. */
static int read_numbers(PyObject *table, const char *const *names, int count, uint64_t *values, const char *what)
{
    if (!PyDict_Check(table)) {
        PyErr_Format(PyExc_TypeError, "Decider: %s must be a dict", what);
        return -1;
    }
    for (int i = 0; i < count; i++) {
        PyObject *value = PyDict_GetItemString(table, names[i]);
        if (value == NULL) {
            PyErr_Format(PyExc_KeyError, "Decider: %s lacks %s", what, names[i]);
            return -1;
        }
        values[i] = PyLong_AsUnsignedLongLong(value);
        if (values[i] == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

static int refuse(const char *why)
{
    PyErr_Format(PyExc_ValueError, "Decider: %s", why);
    return -1;
}

/* configure(config): new limits, addresses and lease; the number of slots stays. */
static int set_config(Decider *d, PyObject *table, int first)
{
    uint64_t config[N_CONFIG];
    if (read_numbers(table, CONFIG_NAMES, N_CONFIG, config, "config") < 0)
        return -1;
    if (!first && (Py_ssize_t)config[C_SLOTS] != d->slots)
        return refuse("the number of slots is fixed when the decider is made");
    if (config[C_SLOTS] < 1 || config[C_SLOTS] > (uint64_t)PY_SSIZE_T_MAX / sizeof(slot_t))
        return refuse("slots out of range");
    if (config[C_MAX_FANIN] > d->k[K_MAX_MEMBERS])
        return refuse("max_fanin above the members a bitmap holds");
    if (config[C_PORT] < 1 || config[C_PORT] > 0xFFFF || config[C_IP] > 0xFFFFFFFF)
        return refuse("ip or port out of range");
    memcpy(d->config, config, sizeof(config));
    return 0;
}

static void free_job(job_t *j)
{
    for (Py_ssize_t i = 0; i < j->n_routes; i++)
        PyMem_Free(j->route[i].child);
    PyMem_Free(j->route);
    PyMem_Free(j->member);
    memset(j, 0, sizeof(*j));
}

static int ascending(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* An endpoint (ip, port) of ints into ip << 16 | port; -1 with an error set unless both are nonzero and fit. */
static int read_endpoint(PyObject *pair, uint64_t *endpoint)
{
    unsigned long long ip, port;
    if (!PyArg_ParseTuple(pair, "KK", &ip, &port))
        return -1;
    if (ip < 1 || ip > 0xFFFFFFFF || port < 1 || port > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "Decider: an endpoint is a nonzero IPv4 address and port, as ints");
        return -1;
    }
    *endpoint = ip << 16 | port;
    return 0;
}

/* The job's members (a sequence of endpoints) and routes (a sequence of (clique, level, parent endpoint or
   None, [(child endpoint, members)])) into `j`, sorted; -1 with an error set. */
static int read_tables(job_t *j, PyObject *members, PyObject *routes)
{
    PyObject *list = PySequence_Fast(members, "Decider: members must be a sequence");
    if (list == NULL)
        return -1;
    j->n_members = PySequence_Fast_GET_SIZE(list);
    j->member = PyMem_Calloc(j->n_members + 1, sizeof(uint64_t));
    for (Py_ssize_t i = 0; j->member != NULL && i < j->n_members; i++)
        if (read_endpoint(PySequence_Fast_GET_ITEM(list, i), &j->member[i]) < 0) {
            Py_DECREF(list);
            return -1;
        }
    Py_DECREF(list);
    if (j->member == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    qsort(j->member, j->n_members, sizeof(uint64_t), ascending);
    if ((list = PySequence_Fast(routes, "Decider: routes must be a sequence")) == NULL)
        return -1;
    Py_ssize_t n_routes = PySequence_Fast_GET_SIZE(list);
    if ((j->route = PyMem_Calloc(n_routes + 1, sizeof(route_t))) == NULL) {
        Py_DECREF(list);
        PyErr_NoMemory();
        return -1;
    }
    for (; j->n_routes < n_routes; j->n_routes++) {
        route_t *r = &j->route[j->n_routes];
        unsigned long long clique, level;
        PyObject *parent, *children, *items = NULL;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(list, j->n_routes), "KKOO", &clique, &level, &parent, &children)
            || (parent != Py_None && read_endpoint(parent, &r->parent) < 0)
            || (items = PySequence_Fast(children, "Decider: children must be a sequence")) == NULL)
            goto failed;
        r->clique = clique;
        r->level = level;
        Py_ssize_t n_children = PySequence_Fast_GET_SIZE(items);
        if ((r->child = PyMem_Calloc(n_children + 1, sizeof(child_t))) == NULL) {
            Py_DECREF(items);
            PyErr_NoMemory();
            goto failed;
        }
        for (; r->n_children < n_children; r->n_children++) {
            child_t *child = &r->child[r->n_children];
            PyObject *endpoint;
            unsigned long long held;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(items, r->n_children), "OK", &endpoint, &held) ||
                read_endpoint(endpoint, &child->endpoint) < 0) {
                Py_DECREF(items);
                goto failed;
            }
            child->members = held;
        }
        Py_DECREF(items);
    }
    Py_DECREF(list);
    /* cliques ascending (route_t starts with its clique) */
    qsort(j->route, j->n_routes, sizeof(route_t), ascending);
    return 0;
failed:
    Py_DECREF(list);
    return -1;
}

/* A slot as it was never used (the model's Slot()): a removed job's slots forget their owner and sums. */
static void reset_slot(Decider *d, slot_t *s)
{
    forget(d, s);
    s->learned = 0;
    Py_CLEAR(s->output);
    s->owned = s->done = s->overflow = s->final = 0;
    s->bitmap = s->stamp = s->sourced = 0;
    s->asked = s->asked_children = 0;
    s->n_children = 0;
}

/* install_job(job, token, base, slots, group, members, routes): the tables of a job (jobs.JobTable, which
   allocated its range and merged its members, is the allocator), replacing the job's own; a new job's slots
   start empty (the model's install). */
static PyObject *Decider_install_job(Decider *d, PyObject *const *args, Py_ssize_t nargs)
{
    if (!ready(d))
        return NULL;
    job_t j = {0};
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "install_job(job, token, base, slots, group, members, routes)");
        return NULL;
    }
    uint64_t *numbers[] = {&j.job, &j.token, &j.base, &j.slots, &j.group};
    for (int i = 0; i < 5; i++) {
        *numbers[i] = PyLong_AsUnsignedLongLong(args[i]);
        if (*numbers[i] == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
    }
    if (j.slots < 1 || j.base >= (uint64_t)d->slots || j.slots > (uint64_t)d->slots - j.base) {
        PyErr_SetString(PyExc_ValueError, "Decider: a job's slots lie outside the aggregator's");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < d->n_jobs; i++) {
        const job_t *other = &d->jobs[i];
        if (other->job != j.job && j.base < other->base + other->slots && other->base < j.base + j.slots) {
            PyErr_SetString(PyExc_ValueError, "Decider: a job's slots overlap another job's");
            return NULL;
        }
    }
    if (read_tables(&j, args[5], args[6]) < 0) {
        free_job(&j);
        return NULL;
    }
    Py_ssize_t at = 0;
    while (at < d->n_jobs && d->jobs[at].job < j.job)
        at++;
    if (at < d->n_jobs && d->jobs[at].job == j.job) {
        const job_t *held = &d->jobs[at];
        if (held->base != j.base || held->slots != j.slots) {
            free_job(&j);
            PyErr_SetString(PyExc_ValueError, "Decider: a job installed again keeps its range");
            return NULL;
        }
        free_job(&d->jobs[at]);
    } else {
        job_t *jobs = PyMem_Realloc(d->jobs, (d->n_jobs + 1) * sizeof(job_t));
        if (jobs == NULL) {
            free_job(&j);
            return PyErr_NoMemory();
        }
        d->jobs = jobs;
        memmove(&d->jobs[at + 1], &d->jobs[at], (d->n_jobs - at) * sizeof(job_t));
        d->n_jobs++;
        /* Versions 1 and 2 may use a range while it is free: a new job must not find slots someone prepared for
           it. Renewing or merging members keeps them. */
        for (uint64_t i = j.base; i < j.base + j.slots; i++)
            reset_slot(d, &d->slot[i]);
    }
    d->jobs[at] = j;
    for (uint64_t i = j.base; i < j.base + j.slots; i++)
        d->slot[i].held = 1;
    Py_RETURN_NONE;
}

static PyObject *Decider_remove_job(Decider *d, PyObject *argument)
{
    if (!ready(d))
        return NULL;
    unsigned long long job = PyLong_AsUnsignedLongLong(argument);
    if (job == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    const job_t *found = find_job(d, job);
    if (found == NULL)
        Py_RETURN_FALSE;
    Py_ssize_t at = found - d->jobs;
    for (uint64_t i = found->base; i < found->base + found->slots; i++) {
        reset_slot(d, &d->slot[i]);
        d->slot[i].held = 0;
    }
    free_job(&d->jobs[at]);
    memmove(&d->jobs[at], &d->jobs[at + 1], (d->n_jobs - at - 1) * sizeof(job_t));
    d->n_jobs--;
    Py_RETURN_TRUE;
}

static PyObject *Decider_configure(Decider *d, PyObject *table)
{
    if (!ready(d))
        return NULL;
    if (set_config(d, table, 0) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int Decider_init(Decider *d, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"fields", "constants", "config", NULL};
    PyObject *fields, *constants, *config;
    if (d->slot != NULL)
        return refuse("already made");
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!", keywords, &PyDict_Type, &fields, &PyDict_Type,
                                     &constants, &PyDict_Type, &config))
        return -1;
    if (read_numbers(constants, CONSTANT_NAMES, N_CONSTANTS, d->k, "constants") < 0)
        return -1;
    const uint64_t *k = d->k;
    for (int f = 0; f < N_FIELDS; f++) {
        PyObject *place = PyDict_GetItemString(fields, FIELD_NAMES[f]);
        if (place == NULL) {
            PyErr_Format(PyExc_KeyError, "Decider: fields lacks %s", FIELD_NAMES[f]);
            return -1;
        }
        if (!PyArg_ParseTuple(place, "nn", &d->at[f], &d->width[f]))
            return -1;
        /* Every field read lies within the header that is checked to be there first; the reserved field
           only marks where the route ends. */
        if (d->at[f] < 0 || d->width[f] < 1 || (f != F_RESERVED && d->width[f] > 8) ||
            (uint64_t)(d->at[f] + d->width[f]) > k[K_HEADER])
            return refuse("a field lies outside the header or is wider than 8 bytes");
    }
    /* A slot's output is made only for a datagram whose length matched its count, at most the longest payload:
       that bounds every output's size. */
    if (k[K_HEADER] > (uint64_t)k[K_MAX_PAYLOAD] || k[K_MAX_PAYLOAD] > INT32_MAX || k[K_HEADER] > MAX_HEADER)
        return refuse("header or longest payload out of range");
    if (k[K_ELEMENT] != 4)
        return refuse("elements must be int32: the saturating sum is int32's");
    if (k[K_TRAILER] < 1 || k[K_TRAILER] > 8 || k[K_STATUS_OVERFLOW] > 0xFF)
        return refuse("the status trailer must be 1 to 8 bytes, the overflow flag in its last byte");
    if (k[K_MAX_MEMBERS] < 1 || (uint64_t)d->width[F_BITMAP] * 8 < k[K_MAX_MEMBERS] || k[K_MAX_MEMBERS] > 64)
        return refuse("members must fit the bitmap field (at most 64)");
    if (k[K_TIME_MASK] & (k[K_TIME_MASK] + 1))
        return refuse("the time mask must be all ones below a power of two");
    if (d->at[F_HOP1_EXPECT] > d->at[F_RESERVED] || d->at[F_EXPECT] > d->at[F_HOP1_EXPECT])
        return refuse("the route's fields are out of order");
    if (k[K_COUNTERS] < 1 || k[K_COUNTERS] > (k[K_MAX_PAYLOAD] - k[K_HEADER]) / k[K_ELEMENT])
        return refuse("a stats reply of the counters must fit a payload");
    for (int i = K_ACCUMULATED; i < K_COUNTERS; i++)
        if (k[i] >= k[K_COUNTERS])
            return refuse("a disposition or counter index lies beyond the counters");
    int round_bits = 8 * (int)d->width[F_ROUND];
    d->round_mask = round_bits >= 64 ? UINT64_MAX : ((uint64_t)1 << round_bits) - 1;
    d->round_half = (uint64_t)1 << (round_bits - 1);
    if (set_config(d, config, 1) < 0)
        return -1;
    d->slots = (Py_ssize_t)d->config[C_SLOTS];
    d->counts = PyMem_Calloc(k[K_COUNTERS], sizeof(uint64_t));
    d->slot = PyMem_Calloc(d->slots, sizeof(slot_t));
    if (d->counts == NULL || d->slot == NULL) {
        PyMem_Free(d->counts);
        PyMem_Free(d->slot);
        d->counts = NULL;
        d->slot = NULL;
        PyErr_NoMemory();
        return -1;
    }
    d->now = 0;
    return 0;
}

static void Decider_dealloc(Decider *d)
{
    if (d->slot != NULL)
        for (Py_ssize_t i = 0; i < d->slots; i++) {
            slot_t *s = &d->slot[i];
            forget(d, s);
            PyMem_Free(s->members);
            PyMem_Free(s->source);
            Py_CLEAR(s->output);
        }
    for (Py_ssize_t i = 0; i < d->n_jobs; i++)
        free_job(&d->jobs[i]);
    PyMem_Free(d->jobs);
    PyMem_Free(d->slot);
    PyMem_Free(d->counts);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyMethodDef Decider_methods[] = {
    {"handle", (PyCFunction)(void (*)(void))Decider_handle, METH_FASTCALL,
     "handle(payload, now=None, source=0, peer=None) -> (disposition, answer or None)"},
    {"serve_batch", (PyCFunction)(void (*)(void))Decider_serve_batch, METH_FASTCALL,
     "serve_batch(buffer, batch, slot_size, start, now, own, sends) -> (next, decided, refused, copies)"},
    {"copies", (PyCFunction)(void (*)(void))Decider_copies, METH_FASTCALL,
     "copies(body, parent=None) -> [(body, address)]: a result for each learned member and child"},
    {"learned", (PyCFunction)Decider_learned, METH_NOARGS, "learned() -> serve's learning table, as a dict"},
    {"slot_key", (PyCFunction)Decider_slot_key, METH_O, "slot_key(slot) -> (job, round, clique, chunk) or None"},
    {"counts", (PyCFunction)Decider_counts, METH_NOARGS, "counts() -> the counters, as a list"},
    {"configure", (PyCFunction)Decider_configure, METH_O, "configure(config): new limits, addresses, lease"},
    {"install_job", (PyCFunction)(void (*)(void))Decider_install_job, METH_FASTCALL,
     "install_job(job, token, base, slots, group, members, routes): a registered job's tables, replacing its own"},
    {"remove_job", (PyCFunction)Decider_remove_job, METH_O,
     "remove_job(job) -> whether it was installed; its slots are free and forget their sums"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DeciderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "inwire._kernel.Decider",
    .tp_doc = "Decider(fields, constants, config): the fast aggregator's decisions and slot table",
    .tp_basicsize = sizeof(Decider),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Decider_init,
    .tp_dealloc = (destructor)Decider_dealloc,
    .tp_methods = Decider_methods,
};

KERNEL_INTERNAL int fastpath_add_types(PyObject *module)
{
    if (PyType_Ready(&DeciderType) < 0)
        return -1;
    Py_INCREF(&DeciderType);
    if (PyModule_AddObject(module, "Decider", (PyObject *)&DeciderType) < 0) {
        Py_DECREF(&DeciderType);
        return -1;
    }
    return 0;
}
