/* The trace reader's packet walk in C: optional, [Note: the compiled reader] in profiler/trace/reader.py.
 *
 * read(files, decode_track_uuid, data_oneof, schema) walks the packets of rrfp trace files that protobuf's
 * own parser has already accepted whole, and returns the reader's frames as columns (Python lists), or
 * None when a file holds anything outside the subset this walk decodes exactly as the Python reader does
 * (a string that is not UTF-8, a nested annotation value, an unknown event type, a field with an unexpected
 * wire type, an event that shares its packet with another of TracePacket's `data` members, ...): the
 * caller then reads the whole trace in Python. Every rule below mirrors a line of _Reader in reader.py;
 * tests/unit/test_trace_fastread.py holds the two to the same frames.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define BAIL (-2) /* outside the subset: the caller reads in Python */
#define ERR (-1)  /* a Python exception is set */
#define TRY(x) do { int rc_ = (x); if (rc_ < 0) return rc_; } while (0)

typedef struct { const uint8_t *p, *end; } Cur;

static int rd_varint(Cur *c, uint64_t *out) {
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (c->p >= c->end) return BAIL;
        uint8_t b = *c->p++;
        if (shift == 63 && b > 1) return BAIL;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (b < 0x80) { *out = r; return 0; }
    }
    return BAIL;
}

static int rd_fixed64(Cur *c, uint64_t *out) {
    if (c->end - c->p < 8) return BAIL;
    uint64_t r = 0;
    for (int i = 7; i >= 0; i--) r = (r << 8) | c->p[i];
    c->p += 8;
    *out = r;
    return 0;
}

static int rd_tag(Cur *c, uint32_t *field, int *wire) {
    uint64_t tag;
    TRY(rd_varint(c, &tag));
    if ((tag >> 3) == 0 || (tag >> 3) > 0x1FFFFFFF) return BAIL;
    *field = (uint32_t)(tag >> 3);
    *wire = (int)(tag & 7);
    return 0;
}

static int rd_len(Cur *c, Cur *body) {
    uint64_t n;
    TRY(rd_varint(c, &n));
    if (n > (uint64_t)(c->end - c->p)) return BAIL;
    body->p = c->p;
    body->end = c->p + n;
    c->p += n;
    return 0;
}

static int skip(Cur *c, int wire) {
    uint64_t v;
    Cur body;
    switch (wire) {
    case 0: return rd_varint(c, &v);
    case 1: if (c->end - c->p < 8) return BAIL; c->p += 8; return 0;
    case 2: return rd_len(c, &body);
    case 5: if (c->end - c->p < 4) return BAIL; c->p += 4; return 0;
    default: return BAIL; /* groups: not in these protos */
    }
}

/* ---- small helpers --------------------------------------------------------------------------------- */

static int append_new(PyObject *list, PyObject *item) { /* steals item */
    if (item == NULL) return ERR;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc < 0 ? ERR : 0;
}

static int append(PyObject *list, PyObject *item) { /* borrowed item */
    return PyList_Append(list, item) < 0 ? ERR : 0;
}

/* A str from UTF-8 bytes; BAIL (no exception) where protobuf would hand the Python reader bytes. */
static int utf8(const uint8_t *s, Py_ssize_t n, PyObject **out) {
    *out = PyUnicode_DecodeUTF8((const char *)s, n, NULL);
    if (*out) return 0;
    if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) { PyErr_Clear(); return BAIL; }
    return ERR;
}

/* ---- short strings seen again and again (kinds, task names' parts): one object each ---------------- */

#define SCACHE 512
#define SMAX 24
typedef struct { Py_ssize_t n; uint8_t b[SMAX]; PyObject *s; } SEntry;

static int cached_str(SEntry *cache, const uint8_t *s, Py_ssize_t n, PyObject **out) {
    if (n > SMAX) return utf8(s, n, out);
    uint32_t h = 2166136261u;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    SEntry *e = &cache[(h ^ (uint32_t)n) % SCACHE];
    if (e->s && e->n == n && memcmp(e->b, s, n) == 0) { Py_INCREF(e->s); *out = e->s; return 0; }
    TRY(utf8(s, n, out));
    Py_XDECREF(e->s);
    e->n = n;
    memcpy(e->b, s, n);
    e->s = *out;
    Py_INCREF(e->s);
    return 0;
}

/* ---- tracks: uuid -> decoded track, handler, stack of begun slices --------------------------------- */

enum { K_NONE = -1, K_COMPUTE, K_DECISIONS, K_ITERATIONS, K_STEP, K_SEND, K_RECV, K_RENDEZVOUS, N_KINDS };
static const char *KIND_NAMES[N_KINDS] = {"compute", "decisions", "iterations", "step", "send", "recv", "rendezvous"};

typedef struct { uint64_t start; uint32_t seq; const uint8_t *ev, *ev_end; } Begun;

typedef struct {
    uint64_t uuid;
    int used;
    PyObject *track;  /* (rank, kind, peer), or NULL for "not an rrfp track" (None) */
    int kind;         /* handler, K_NONE when its kind has none */
    Begun *stack;
    Py_ssize_t depth, cap;
} Track;

typedef struct { Track *slots; Py_ssize_t cap, used; } Tracks;

static Track *track_slot(Tracks *t, uint64_t uuid) {
    uint64_t h = uuid * 0x9E3779B97F4A7C15ull;
    for (Py_ssize_t i = (Py_ssize_t)(h >> 40) % t->cap;; i = (i + 1) % t->cap) {
        Track *s = &t->slots[i];
        if (!s->used || s->uuid == uuid) return s;
    }
}

static int tracks_grow(Tracks *t) {
    Tracks bigger = {PyMem_Calloc(t->cap * 2, sizeof(Track)), t->cap * 2, t->used};
    if (!bigger.slots) { PyErr_NoMemory(); return ERR; }
    for (Py_ssize_t i = 0; i < t->cap; i++)
        if (t->slots[i].used) *track_slot(&bigger, t->slots[i].uuid) = t->slots[i];
    PyMem_Free(t->slots);
    *t = bigger;
    return 0;
}

/* ---- the walk's state --------------------------------------------------------------------------------- */

/* annotation names a row reads; every other name is decoded only into the metadata's dict */
enum { S_ITERATION, S_STAGE, S_KIND, S_MICROBATCH, S_CHUNK, S_UNITS, S_TOKENS, S_IMAGES, S_WAIT_NS, S_HINT_RANK,
       S_SKIPPED, S_READY, S_HELD_BACK, S_DEFERRED, S_IN_FLIGHT, S_INDEX, S_LEADER_NS, S_DECISION_ARRIVED_NS,
       S_ANNOUNCE_NS, S_HINT, S_RULE, S_AUTO, S_BARRIER_NS, S_MESSAGES, S_SEQUENCE, S_BYTES, S_QUEUED_NS, N_SLOTS };
static const char *SLOT_NAMES[N_SLOTS] = {
    "iteration", "stage", "kind", "microbatch", "chunk", "units", "tokens", "images", "wait_ns", "hint_rank",
    "skipped", "ready", "held_back", "deferred", "in_flight", "index", "leader_ns", "decision_arrived_ns",
    "announce_ns", "hint", "rule", "auto", "barrier_ns", "messages", "sequence", "bytes", "queued_ns"};

enum { V_NONE, V_BOOL, V_INT, V_UINT, V_DOUBLE, V_STR };  /* what a DebugAnnotation's `value` holds */

typedef struct { int cls; uint64_t raw; double d; const uint8_t *s; Py_ssize_t n; } Val;

typedef struct { int which; uint64_t iid; const uint8_t *name; Py_ssize_t name_n; Val v; } Ann;

#define KEYCACHE 64
#define KEYIIDS 256
#define NO_SLOT (-1)      /* an annotation name no row reads */
#define UNKNOWN_SLOT (-2) /* a key cache entry not looked up yet */
typedef struct { uint32_t seq; uint64_t gen; int16_t slot[KEYIIDS]; } KeyCache;

typedef struct {
    PyObject *decode, *schema, *data_oneof; /* data_oneof: bytes, one per field number, 1 for `data`'s members */
    PyObject *names, *keys;                 /* sequence -> {iid: str}, as the reader's */
    PyObject *slot_of;                      /* annotation name -> slot index */
    PyObject *kind_of;                      /* track kind -> handler index */
    PyObject *meta, *sends, *recvs;         /* rank -> dict; flow -> send tuple; flow -> index of a receive */
    PyObject *cols[N_KINDS + 2][16];        /* the frames' columns; [N_KINDS] counters, [N_KINDS + 1] transfers */
    Tracks tracks;
    Begun *recv_list; Track **recv_track; uint64_t *recv_end; Py_ssize_t n_recv, cap_recv;
    long long packets, malformed;
    uint64_t keys_gen;
    KeyCache keycache[KEYCACHE];
    SEntry strs[SCACHE];
    Val vals[N_SLOTS];
    int touched[N_SLOTS]; int n_touched; /* the slots this slice set, each once */
} St;

enum { C_COUNTERS = N_KINDS, C_TRANSFERS = N_KINDS + 1 };
static const int NCOLS[N_KINDS + 2] = {13, 15, 7, 5, 0, 0, 5, 4, 11};

/* ---- packets and events --------------------------------------------------------------------------------- */

#define MAXINTERN 8
typedef struct {
    uint64_t timestamp; uint32_t seq, flags;
    const uint8_t *ev, *ev_end;
    int n_intern; Cur intern[MAXINTERN];
} Packet;

static int parse_packet(St *st, Cur c, Packet *pk) {
    memset(pk, 0, sizeof *pk);
    const uint8_t *oneof = (const uint8_t *)PyBytes_AS_STRING(st->data_oneof);
    Py_ssize_t n_oneof = PyBytes_GET_SIZE(st->data_oneof);
    int other_data = 0;
    while (c.p < c.end) {
        uint32_t f; int w; uint64_t v; Cur body;
        TRY(rd_tag(&c, &f, &w));
        switch (f) {
        case 8: if (w != 0) return BAIL; TRY(rd_varint(&c, &pk->timestamp)); break;
        case 10: if (w != 0) return BAIL; TRY(rd_varint(&c, &v)); pk->seq = (uint32_t)v; break;
        case 13: if (w != 0) return BAIL; TRY(rd_varint(&c, &v)); pk->flags = (uint32_t)v; break;
        case 11:
            if (w != 2 || pk->ev) return BAIL; /* twice: protobuf merges the two */
            TRY(rd_len(&c, &body));
            pk->ev = body.p; pk->ev_end = body.end;
            break;
        case 12:
            if (w != 2 || pk->n_intern == MAXINTERN) return BAIL;
            TRY(rd_len(&c, &pk->intern[pk->n_intern]));
            pk->n_intern++;
            break;
        default:
            if ((Py_ssize_t)f < n_oneof && oneof[f]) other_data = 1;
            TRY(skip(&c, w));
        }
    }
    if (other_data && pk->ev) return BAIL; /* whichever comes last clears the other */
    return 0;
}

typedef struct {
    int type; uint64_t uuid;
    int name_which; uint64_t name_iid; const uint8_t *name; Py_ssize_t name_n;
    int counter_which; uint64_t counter; double dcounter;
} Event;

static int parse_event(const uint8_t *p, const uint8_t *end, Event *ev) {
    memset(ev, 0, sizeof *ev);
    Cur c = {p, end};
    while (c.p < c.end) {
        uint32_t f; int w; uint64_t v; Cur body;
        TRY(rd_tag(&c, &f, &w));
        switch (f) {
        case 9:
            if (w != 0) return BAIL;
            TRY(rd_varint(&c, &v));
            if (v > 5) return BAIL; /* a closed enum: protobuf keeps an unknown value aside */
            ev->type = (int)v;
            break;
        case 11: if (w != 0) return BAIL; TRY(rd_varint(&c, &ev->uuid)); break;
        case 10: if (w != 0) return BAIL; TRY(rd_varint(&c, &ev->name_iid)); ev->name_which = 1; break;
        case 23:
            if (w != 2) return BAIL;
            TRY(rd_len(&c, &body));
            ev->name = body.p; ev->name_n = body.end - body.p; ev->name_which = 2;
            break;
        case 30: if (w != 0) return BAIL; TRY(rd_varint(&c, &ev->counter)); ev->counter_which = 1; break;
        case 44: {
            if (w != 1) return BAIL;
            uint64_t bits;
            TRY(rd_fixed64(&c, &bits));
            memcpy(&ev->dcounter, &bits, 8);
            ev->counter_which = 2;
            break;
        }
        default: TRY(skip(&c, w));
        }
    }
    if (ev->name_which != 1) ev->name_iid = 0;
    if (ev->name_which != 2) ev->name_n = 0;
    return 0;
}

static int parse_annotation(Cur c, Ann *a) {
    memset(a, 0, sizeof *a);
    while (c.p < c.end) {
        uint32_t f; int w; uint64_t v; Cur body;
        TRY(rd_tag(&c, &f, &w));
        switch (f) {
        case 1: if (w != 0) return BAIL; TRY(rd_varint(&c, &a->iid)); a->which = 1; break;
        case 10:
            if (w != 2) return BAIL;
            TRY(rd_len(&c, &body));
            a->name = body.p; a->name_n = body.end - body.p; a->which = 2;
            break;
        case 2: if (w != 0) return BAIL; TRY(rd_varint(&c, &v)); a->v.cls = V_BOOL; a->v.raw = v != 0; break;
        case 3: case 7: case 17:
            if (w != 0) return BAIL;
            TRY(rd_varint(&c, &a->v.raw)); a->v.cls = V_UINT;
            break;
        case 4: if (w != 0) return BAIL; TRY(rd_varint(&c, &a->v.raw)); a->v.cls = V_INT; break;
        case 5:
            if (w != 1) return BAIL;
            TRY(rd_fixed64(&c, &v)); memcpy(&a->v.d, &v, 8); a->v.cls = V_DOUBLE;
            break;
        case 6: case 9:
            if (w != 2) return BAIL;
            TRY(rd_len(&c, &body));
            a->v.s = body.p; a->v.n = body.end - body.p; a->v.cls = V_STR;
            break;
        case 8: return BAIL; /* nested_value */
        default: TRY(skip(&c, w));
        }
    }
    if (a->which != 1) a->iid = 0;
    if (a->which != 2) a->name_n = 0;
    return 0;
}

/* The Python value of an annotation (new reference). */
static int val_object(St *st, const Val *v, PyObject **out) {
    switch (v->cls) {
    case V_NONE: Py_INCREF(Py_None); *out = Py_None; return 0;
    case V_BOOL: *out = PyBool_FromLong((long)v->raw); return 0;
    case V_INT: *out = PyLong_FromLongLong((long long)v->raw); return *out ? 0 : ERR;
    case V_UINT: *out = PyLong_FromUnsignedLongLong(v->raw); return *out ? 0 : ERR;
    case V_DOUBLE: *out = PyFloat_FromDouble(v->d); return *out ? 0 : ERR;
    default: return cached_str(st->strs, v->s, v->n, out);
    }
}

static PyObject *table_of(PyObject *tables, uint32_t seq) { /* borrowed; NULL when the sequence has none */
    PyObject *key = PyLong_FromUnsignedLong(seq);
    if (!key) return NULL;
    PyObject *t = PyDict_GetItemWithError(tables, key);
    Py_DECREF(key);
    return t;
}

static int dict_get_iid(PyObject *table, uint64_t iid, PyObject **out) { /* borrowed or NULL */
    *out = NULL;
    if (!table) return 0;
    PyObject *key = PyLong_FromUnsignedLongLong(iid);
    if (!key) return ERR;
    *out = PyDict_GetItemWithError(table, key);
    Py_DECREF(key);
    return (*out == NULL && PyErr_Occurred()) ? ERR : 0;
}

/* The sequence's interned annotation names (borrowed), or NULL where it has none: `keys.get(sequence) or _NO_KEYS` */
static int keys_of(St *st, uint32_t seq, PyObject **keys) {
    *keys = table_of(st->keys, seq);
    if (!*keys && PyErr_Occurred()) return ERR;
    if (*keys && PyDict_GET_SIZE(*keys) == 0) *keys = NULL;
    return 0;
}

/* `key_of(annotation.name_iid) or annotation.name or "#"` (new reference) */
static int ann_key(St *st, const Ann *a, PyObject *keys, PyObject **out) {
    PyObject *k;
    TRY(dict_get_iid(keys, a->iid, &k));
    if (k && PyUnicode_Check(k) && PyUnicode_GET_LENGTH(k) > 0) { Py_INCREF(k); *out = k; return 0; }
    if (a->name_n > 0) return utf8(a->name, a->name_n, out);
    *out = PyUnicode_FromString("#");
    return *out ? 0 : ERR;
}

/* An annotation name's slot in *slot (NO_SLOT for a name no row reads). */
static int slot_of_key(St *st, PyObject *key, int *slot) {
    PyObject *index = PyDict_GetItemWithError(st->slot_of, key);
    if (!index && PyErr_Occurred()) return ERR;
    *slot = index ? (int)PyLong_AsLong(index) : NO_SLOT;
    return 0;
}

/* An annotation's slot (or NO_SLOT), through a cache per sequence and key table. */
static int ann_slot(St *st, const Ann *a, PyObject *keys, uint32_t seq, int *slot) {
    KeyCache *kc = NULL;
    if (a->which != 2 && a->iid < KEYIIDS) {
        kc = &st->keycache[seq % KEYCACHE];
        if (kc->seq != seq || kc->gen != st->keys_gen) {
            kc->seq = seq; kc->gen = st->keys_gen;
            for (int i = 0; i < KEYIIDS; i++) kc->slot[i] = UNKNOWN_SLOT;
        }
        if (kc->slot[a->iid] != UNKNOWN_SLOT) { *slot = kc->slot[a->iid]; return 0; }
    }
    PyObject *key;
    TRY(ann_key(st, a, keys, &key));
    int rc = slot_of_key(st, key, slot);
    Py_DECREF(key);
    if (rc < 0) return rc;
    if (kc) kc->slot[a->iid] = (int16_t)*slot;
    return 0;
}

/* Decode an event's annotations into the row slots (the last one of a name wins, as in the reader's dict). */
static int slice_values(St *st, const uint8_t *p, const uint8_t *end, uint32_t seq) {
    for (int i = 0; i < st->n_touched; i++) st->vals[st->touched[i]].cls = -1;
    st->n_touched = 0;
    PyObject *keys;
    TRY(keys_of(st, seq, &keys));
    Cur c = {p, end};
    while (c.p < c.end) {
        uint32_t f; int w; Cur body;
        TRY(rd_tag(&c, &f, &w));
        if (f != 4) { TRY(skip(&c, w)); continue; }
        if (w != 2) return BAIL;
        TRY(rd_len(&c, &body));
        Ann a; int slot;
        TRY(parse_annotation(body, &a));
        TRY(ann_slot(st, &a, keys, seq, &slot));
        if (slot == NO_SLOT) continue;
        if (st->vals[slot].cls == -1) st->touched[st->n_touched++] = slot;
        st->vals[slot] = a.v;
        if (a.v.cls == V_STR) { /* validated here: the reader would see bytes and drop the value */
            PyObject *s;
            TRY(cached_str(st->strs, a.v.s, a.v.n, &s));
            Py_DECREF(s);
        }
    }
    return 0;
}

/* An event's annotations as the reader's dict (new reference): the metadata, and lone receives. */
static int values_dict(St *st, const uint8_t *p, const uint8_t *end, uint32_t seq, PyObject **out) {
    PyObject *keys;
    TRY(keys_of(st, seq, &keys));
    PyObject *d = PyDict_New();
    if (!d) return ERR;
    Cur c = {p, end};
    int rc = 0;
    while (c.p < c.end && rc == 0) {
        uint32_t f; int w; Cur body;
        if ((rc = rd_tag(&c, &f, &w)) < 0) break;
        if (f != 4) { rc = skip(&c, w); continue; }
        if (w != 2) { rc = BAIL; break; }
        if ((rc = rd_len(&c, &body)) < 0) break;
        Ann a; PyObject *key, *value;
        if ((rc = parse_annotation(body, &a)) < 0) break;
        if ((rc = ann_key(st, &a, keys, &key)) < 0) break;
        if ((rc = val_object(st, &a.v, &value)) < 0) { Py_DECREF(key); break; }
        if (PyDict_SetItem(d, key, value) < 0) rc = ERR;
        Py_DECREF(key);
        Py_DECREF(value);
    }
    if (rc < 0) { Py_DECREF(d); return rc; }
    *out = d;
    return 0;
}

/* The event's name as the reader reads it (new reference): interned by iid when it has one, else inline. */
static int event_name(St *st, const Event *ev, uint32_t seq, PyObject **out) {
    if (ev->name_iid) {
        PyObject *names = table_of(st->names, seq), *n;
        if (!names && PyErr_Occurred()) return ERR;
        TRY(dict_get_iid(names, ev->name_iid, &n));
        if (!n) n = PyUnicode_FromString(""); else Py_INCREF(n);
        *out = n;
        return n ? 0 : ERR;
    }
    return utf8(ev->name, ev->name_n, out);
}

/* ---- rows ------------------------------------------------------------------------------------------------ */

static int is_int(const Val *v) { return v->cls == V_INT || v->cls == V_UINT; }

static PyObject *int_object(const Val *v) {
    return v->cls == V_INT ? PyLong_FromLongLong((long long)v->raw) : PyLong_FromUnsignedLongLong(v->raw);
}

static int put_int(PyObject *col, const Val *v) { return append_new(col, int_object(v)); }

static int put_whole(PyObject *col, const Val *v) { return is_int(v) ? put_int(col, v) : append(col, Py_None); }

static int put_str(St *st, PyObject *col, const Val *v) {
    PyObject *s;
    TRY(cached_str(st->strs, v->s, v->n, &s));
    return append_new(col, s);
}

static int put_text(St *st, PyObject *col, const Val *v) {
    return v->cls == V_STR ? put_str(st, col, v) : append(col, Py_None);
}

static int put_u64(PyObject *col, uint64_t x) { return append_new(col, PyLong_FromUnsignedLongLong(x)); }

static const Val NOVAL = {V_NONE, 0, 0, NULL, 0};

static const Val *slot(St *st, int s) { return st->vals[s].cls == -1 ? &NOVAL : &st->vals[s]; }

static int required(St *st, int kind) {
    static const int INTS[N_KINDS][5] = {
        {S_ITERATION, S_STAGE, S_MICROBATCH, S_CHUNK, -1}, {S_ITERATION, S_HINT_RANK, S_IN_FLIGHT, -1},
        {S_ITERATION, -1}, {S_ITERATION, S_BARRIER_NS, -1}, {S_ITERATION, S_SEQUENCE, S_BYTES, -1},
        {S_ITERATION, S_SEQUENCE, S_BYTES, -1}, {S_ITERATION, -1}};
    static const int STRS[N_KINDS][2] = {{S_KIND, -1}, {-1}, {S_HINT, -1}, {-1}, {-1}, {-1}, {S_MESSAGES, -1}};
    for (int i = 0; INTS[kind][i] >= 0; i++) if (!is_int(slot(st, INTS[kind][i]))) return 0;
    for (int i = 0; STRS[kind][i] >= 0; i++) if (slot(st, STRS[kind][i])->cls != V_STR) return 0;
    return 1;
}

static int fmt_int(char *buf, size_t n, const Val *v) {
    return v->cls == V_INT ? snprintf(buf, n, "%lld", (long long)v->raw)
                           : snprintf(buf, n, "%llu", (unsigned long long)v->raw);
}

/* a compute slice is named by its task's text: f"{stage}{kind}{microbatch}" */
static int task_name_matches(PyObject *name, const Val *stage, const Val *kind, const Val *mb) {
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(name, &n);
    if (!s) return ERR;
    char a[24], b[24];
    int na = fmt_int(a, sizeof a, stage), nb = fmt_int(b, sizeof b, mb);
    return n == na + kind->n + nb && memcmp(s, a, na) == 0 && (!kind->n || memcmp(s + na, kind->s, kind->n) == 0) &&
           memcmp(s + na + kind->n, b, nb) == 0;
}

static int compute_row(St *st, PyObject **c, PyObject *rank, PyObject *name, uint64_t start, uint64_t end) {
    const Val *stage = slot(st, S_STAGE), *kind = slot(st, S_KIND), *mb = slot(st, S_MICROBATCH);
    int match = task_name_matches(name, stage, kind, mb);
    if (match < 0) return ERR;
    if (!match) { st->malformed++; return 0; }
    TRY(append(c[0], rank)); TRY(put_int(c[1], slot(st, S_ITERATION))); TRY(append(c[2], name));
    TRY(put_int(c[3], stage)); TRY(put_str(st, c[4], kind)); TRY(put_int(c[5], mb));
    TRY(put_int(c[6], slot(st, S_CHUNK))); TRY(put_u64(c[7], start)); TRY(put_u64(c[8], end));
    TRY(put_whole(c[9], slot(st, S_UNITS))); TRY(put_whole(c[10], slot(st, S_TOKENS)));
    TRY(put_whole(c[11], slot(st, S_IMAGES))); return put_whole(c[12], slot(st, S_WAIT_NS));
}

static int decision_row(St *st, PyObject **c, PyObject *rank, PyObject *name, uint64_t start, uint64_t end) {
    TRY(append(c[0], rank)); TRY(put_int(c[1], slot(st, S_ITERATION))); TRY(put_u64(c[2], start));
    TRY(put_u64(c[3], end)); TRY(append(c[4], name)); TRY(put_int(c[5], slot(st, S_HINT_RANK)));
    TRY(put_text(st, c[6], slot(st, S_SKIPPED)));
    const Val *ready = slot(st, S_READY);
    if (ready->cls == V_STR) TRY(put_str(st, c[7], ready));
    else TRY(append_new(c[7], PyUnicode_FromString("")));
    TRY(put_text(st, c[8], slot(st, S_HELD_BACK))); TRY(put_text(st, c[9], slot(st, S_DEFERRED)));
    TRY(put_int(c[10], slot(st, S_IN_FLIGHT))); TRY(put_whole(c[11], slot(st, S_INDEX)));
    TRY(put_whole(c[12], slot(st, S_LEADER_NS))); TRY(put_whole(c[13], slot(st, S_DECISION_ARRIVED_NS)));
    return put_whole(c[14], slot(st, S_ANNOUNCE_NS));
}

static int step_row(St *st, PyObject **c, PyObject *rank, uint64_t start, uint64_t end) {
    const Val *barrier = slot(st, S_BARRIER_NS);
    int negative = barrier->cls == V_INT && (int64_t)barrier->raw < 0;
    uint64_t at = negative || barrier->raw < start ? start : barrier->raw; /* min(max(barrier, start), end) */
    if (at > end) at = end;
    TRY(append(c[0], rank)); TRY(put_int(c[1], slot(st, S_ITERATION))); TRY(put_u64(c[2], start));
    TRY(put_u64(c[3], at)); return put_u64(c[4], end);
}

static int flows(St *st, const uint8_t *p, const uint8_t *end, uint32_t field, PyObject *table, PyObject *item) {
    Cur c = {p, end};
    while (c.p < c.end) {
        uint32_t f; int w; Cur body; uint64_t id = 0;
        TRY(rd_tag(&c, &f, &w));
        if (f != field) { TRY(skip(&c, w)); continue; }
        if (w == 1) { TRY(rd_fixed64(&c, &id)); body.p = body.end = NULL; }
        else if (w == 2) { TRY(rd_len(&c, &body)); if ((body.end - body.p) % 8) return BAIL; }
        else return BAIL;
        do {
            if (body.p) { if (body.p == body.end) break; TRY(rd_fixed64(&body, &id)); }
            PyObject *key = PyLong_FromUnsignedLongLong(id);
            if (!key) return ERR;
            int rc = PyDict_SetItem(table, key, item);
            Py_DECREF(key);
            if (rc < 0) return ERR;
        } while (body.p);
    }
    return 0;
}

/* A slice ended: `_SLICE_HANDLERS[kind]` over it, decoded with the names in force now. */
static int slice_ended(St *st, Track *t, const Begun *b, uint64_t end) {
    int kind = t->kind;
    if (kind == K_RECV) { /* kept raw: decoded only without its send ([Note: reading fast]) */
        if (end < b->start) { st->malformed++; return 0; }
        if (st->n_recv == st->cap_recv) {
            Py_ssize_t cap = st->cap_recv ? st->cap_recv * 2 : 1024;
            Begun *l = PyMem_Realloc(st->recv_list, cap * sizeof(Begun));
            if (l) st->recv_list = l;
            Track **tr = PyMem_Realloc(st->recv_track, cap * sizeof(Track *));
            if (tr) st->recv_track = tr;
            uint64_t *e = PyMem_Realloc(st->recv_end, cap * sizeof(uint64_t));
            if (e) st->recv_end = e;
            if (!l || !tr || !e) { PyErr_NoMemory(); return ERR; }
            st->cap_recv = cap;
        }
        st->recv_list[st->n_recv] = *b;
        st->recv_track[st->n_recv] = t;
        st->recv_end[st->n_recv] = end;
        PyObject *index = PyLong_FromSsize_t(st->n_recv++);
        if (!index) return ERR;
        int rc = flows(st, b->ev, b->ev_end, 48, st->recvs, index);
        Py_DECREF(index);
        return rc;
    }
    if (end < b->start) { st->malformed++; return 0; }
    TRY(slice_values(st, b->ev, b->ev_end, b->seq));
    if (!required(st, kind)) { st->malformed++; return 0; }
    PyObject *rank = PyTuple_GET_ITEM(t->track, 0), **c = st->cols[kind];
    if (kind == K_COMPUTE || kind == K_DECISIONS || kind == K_SEND) {
        Event ev; PyObject *name;
        TRY(parse_event(b->ev, b->ev_end, &ev));
        TRY(event_name(st, &ev, b->seq, &name));
        int rc;
        if (kind == K_COMPUTE) rc = compute_row(st, c, rank, name, b->start, end);
        else if (kind == K_DECISIONS) rc = decision_row(st, c, rank, name, b->start, end);
        else {
            const Val *queued = slot(st, S_QUEUED_NS);
            PyObject *send = Py_BuildValue("(OONNONNNN)", rank, PyTuple_GET_ITEM(t->track, 2),
                                           int_object(slot(st, S_SEQUENCE)), int_object(slot(st, S_ITERATION)),
                                           name, int_object(slot(st, S_BYTES)),
                                           is_int(queued) ? int_object(queued) : Py_NewRef(Py_None),
                                           PyLong_FromUnsignedLongLong(b->start), PyLong_FromUnsignedLongLong(end));
            rc = send ? flows(st, b->ev, b->ev_end, 47, st->sends, send) : ERR;
            Py_XDECREF(send);
        }
        Py_DECREF(name);
        return rc;
    }
    if (kind == K_ITERATIONS) {
        const Val *rule = slot(st, S_RULE), *why = slot(st, S_AUTO);
        TRY(append(c[0], rank)); TRY(put_int(c[1], slot(st, S_ITERATION))); TRY(put_u64(c[2], b->start));
        TRY(put_u64(c[3], end)); TRY(put_str(st, c[4], slot(st, S_HINT)));
        TRY(put_text(st, c[5], rule)); return put_text(st, c[6], why);
    }
    if (kind == K_STEP) return step_row(st, c, rank, b->start, end);
    /* K_RENDEZVOUS */
    TRY(append(c[0], rank)); TRY(put_int(c[1], slot(st, S_ITERATION))); TRY(put_u64(c[2], b->start));
    TRY(put_u64(c[3], end)); return put_str(st, c[4], slot(st, S_MESSAGES));
}

/* ---- the packet loop (`_consume`) ----------------------------------------------------------------------- */

static int track_of(St *st, uint64_t uuid, Track **out) {
    if ((st->tracks.used + 1) * 2 > st->tracks.cap) TRY(tracks_grow(&st->tracks));
    Track *t = track_slot(&st->tracks, uuid);
    if (!t->used) {
        memset(t, 0, sizeof *t);
        t->used = 1; t->uuid = uuid; t->kind = K_NONE;
        st->tracks.used++;
        PyObject *arg = PyLong_FromUnsignedLongLong(uuid);
        if (!arg) return ERR;
        PyObject *decoded = PyObject_CallOneArg(st->decode, arg);
        Py_DECREF(arg);
        if (!decoded) return ERR;
        if (decoded == Py_None) Py_DECREF(decoded);
        else {
            if (!PyTuple_Check(decoded) || PyTuple_GET_SIZE(decoded) != 3) {
                Py_DECREF(decoded);
                return BAIL;
            }
            t->track = decoded;
            PyObject *kind = PyDict_GetItemWithError(st->kind_of, PyTuple_GET_ITEM(decoded, 1));
            if (kind) t->kind = (int)PyLong_AsLong(kind);
            else if (PyErr_Occurred()) return ERR;
        }
    }
    *out = t;
    return 0;
}

static int intern(St *st, const Packet *pk) {
    PyObject *seq = PyLong_FromUnsignedLong(pk->seq);
    if (!seq) return ERR;
    PyObject *tables[2] = {st->names, st->keys}, *table[2];
    for (int i = 0; i < 2; i++) {
        table[i] = PyDict_GetItemWithError(tables[i], seq);
        if (!table[i]) {
            if (PyErr_Occurred() || !(table[i] = PyDict_New())) { Py_DECREF(seq); return ERR; }
            int rc = PyDict_SetItem(tables[i], seq, table[i]);
            Py_DECREF(table[i]);
            if (rc < 0) { Py_DECREF(seq); return ERR; }
        }
    }
    Py_DECREF(seq);
    for (int k = 0; k < pk->n_intern; k++) {
        Cur c = pk->intern[k];
        while (c.p < c.end) {
            uint32_t f; int w; Cur body;
            TRY(rd_tag(&c, &f, &w));
            if (f != 2 && f != 3) { TRY(skip(&c, w)); continue; }
            if (w != 2) return BAIL;
            TRY(rd_len(&c, &body));
            uint64_t iid = 0; Cur name = {NULL, NULL};
            while (body.p < body.end) {
                uint32_t g; int x;
                TRY(rd_tag(&body, &g, &x));
                if (g == 1) { if (x != 0) return BAIL; TRY(rd_varint(&body, &iid)); }
                else if (g == 2) { if (x != 2) return BAIL; TRY(rd_len(&body, &name)); }
                else TRY(skip(&body, x));
            }
            PyObject *key = PyLong_FromUnsignedLongLong(iid), *value;
            if (!key) return ERR;
            int rc = utf8(name.p ? name.p : (const uint8_t *)"", name.p ? name.end - name.p : 0, &value);
            if (rc < 0) { Py_DECREF(key); return rc; }
            rc = PyDict_SetItem(table[f - 2], key, value);
            Py_DECREF(key); Py_DECREF(value);
            if (rc < 0) return ERR;
            if (f == 3) st->keys_gen++;
        }
    }
    return 0;
}

static int clear_state(St *st, uint32_t seq) {
    PyObject *key = PyLong_FromUnsignedLong(seq);
    if (!key) return ERR;
    for (int i = 0; i < 2; i++) {
        PyObject *empty = PyDict_New();
        int rc = empty ? PyDict_SetItem(i ? st->keys : st->names, key, empty) : ERR;
        Py_XDECREF(empty);
        if (rc < 0) { Py_DECREF(key); return ERR; }
    }
    Py_DECREF(key);
    st->keys_gen++;
    return 0;
}

static int counter_row(St *st, Track *t, uint64_t timestamp, const Event *ev) {
    PyObject **c = st->cols[C_COUNTERS], *value;
    if (ev->counter_which == 1 && ev->counter) value = PyLong_FromLongLong((long long)ev->counter);
    else value = PyFloat_FromDouble(ev->counter_which == 2 ? ev->dcounter : 0.0);
    TRY(append(c[0], PyTuple_GET_ITEM(t->track, 0))); TRY(append(c[1], PyTuple_GET_ITEM(t->track, 1)));
    TRY(put_u64(c[2], timestamp)); return append_new(c[3], value);
}

static int consume(St *st, Cur c) {
    Packet pk; Event ev; Track *t;
    TRY(parse_packet(st, c, &pk));
    st->packets++;
    if (pk.ev) TRY(parse_event(pk.ev, pk.ev_end, &ev));
    else memset(&ev, 0, sizeof ev);
    if (ev.type == 2) { /* SLICE_END: never first, never interning (the recorder): stacks are rrfp tracks' */
        if (st->tracks.used == 0) return 0;
        t = track_slot(&st->tracks, ev.uuid);
        if (t->used && t->depth) {
            Begun b = t->stack[--t->depth];
            if (t->kind != K_NONE) return slice_ended(st, t, &b, pk.timestamp);
        }
        return 0;
    }
    if (ev.type == 4) { /* COUNTER: likewise */
        TRY(track_of(st, ev.uuid, &t));
        return t->track ? counter_row(st, t, pk.timestamp, &ev) : 0;
    }
    if (pk.flags & 1) TRY(clear_state(st, pk.seq)); /* SEQ_INCREMENTAL_STATE_CLEARED */
    if (pk.n_intern) TRY(intern(st, &pk));
    if (!ev.type) return 0;
    TRY(track_of(st, ev.uuid, &t));
    if (!t->track) return 0;
    if (ev.type == 1) { /* SLICE_BEGIN: decoded once ended */
        if (t->depth == t->cap) {
            Py_ssize_t cap = t->cap ? t->cap * 2 : 4;
            Begun *s = PyMem_Realloc(t->stack, cap * sizeof(Begun));
            if (!s) { PyErr_NoMemory(); return ERR; }
            t->stack = s; t->cap = cap;
        }
        t->stack[t->depth++] = (Begun){pk.timestamp, pk.seq, pk.ev, pk.ev_end};
    } else if (ev.type == 3) { /* INSTANT: the metadata */
        PyObject *name, *values;
        TRY(event_name(st, &ev, pk.seq, &name));
        int is_schema = PyUnicode_Compare(name, st->schema) == 0;
        Py_DECREF(name);
        if (is_schema) {
            TRY(values_dict(st, pk.ev, pk.ev_end, pk.seq, &values));
            int rc = PyDict_SetItem(st->meta, PyTuple_GET_ITEM(t->track, 0), values);
            Py_DECREF(values);
            if (rc < 0) return ERR;
        }
    }
    return 0;
}

static int walk_file(St *st, PyObject *data) {
    Cur c = {(const uint8_t *)PyBytes_AS_STRING(data), (const uint8_t *)PyBytes_AS_STRING(data) + PyBytes_GET_SIZE(data)};
    long long before = st->packets;
    while (c.p < c.end) {
        uint32_t f; int w; Cur body;
        TRY(rd_tag(&c, &f, &w));
        if (f != 1 || w != 2) return BAIL; /* Trace has no other field */
        TRY(rd_len(&c, &body));
        TRY(consume(st, body));
    }
    return st->packets == before ? BAIL : 0; /* no packet: the reader walks it by hand */
}

/* ---- transfers (`_transfers`) --------------------------------------------------------------------------- */

static int transfer_row(St *st, PyObject *send, Py_ssize_t recv) {
    PyObject **c = st->cols[C_TRANSFERS];
    for (int i = 0; i < 9; i++) TRY(append(c[i], PyTuple_GET_ITEM(send, i))); /* src .. send's end */
    if (recv < 0) { TRY(append(c[9], Py_None)); return append(c[10], Py_None); }
    TRY(put_u64(c[9], st->recv_list[recv].start));
    return put_u64(c[10], st->recv_end[recv]);
}

/* A receive without its send (`_lone_recv`): decoded with the names in force at the end. */
static int lone_recv(St *st, Py_ssize_t i) {
    const Begun *b = &st->recv_list[i];
    Track *t = st->recv_track[i];
    TRY(slice_values(st, b->ev, b->ev_end, b->seq));
    if (!required(st, K_RECV)) { st->malformed++; return 0; }
    Event ev; PyObject *name;
    TRY(parse_event(b->ev, b->ev_end, &ev));
    TRY(event_name(st, &ev, b->seq, &name));
    PyObject *send = Py_BuildValue("(OONNNNOOO)", PyTuple_GET_ITEM(t->track, 2), PyTuple_GET_ITEM(t->track, 0),
                                   int_object(slot(st, S_SEQUENCE)), int_object(slot(st, S_ITERATION)), name,
                                   int_object(slot(st, S_BYTES)), Py_None, Py_None, Py_None);
    if (!send) return ERR;
    int rc = transfer_row(st, send, i);
    Py_DECREF(send);
    return rc;
}

static int transfers(St *st) {
    Py_ssize_t pos = 0;
    PyObject *flow, *send;
    while (PyDict_Next(st->sends, &pos, &flow, &send)) {
        PyObject *recv = PyDict_GetItemWithError(st->recvs, flow);
        if (!recv && PyErr_Occurred()) return ERR;
        TRY(transfer_row(st, send, recv ? PyLong_AsSsize_t(recv) : -1));
    }
    pos = 0;
    PyObject *recv;
    while (PyDict_Next(st->recvs, &pos, &flow, &recv)) {
        int has = PyDict_Contains(st->sends, flow);
        if (has < 0) return ERR;
        if (!has) TRY(lone_recv(st, PyLong_AsSsize_t(recv)));
    }
    return 0;
}

/* ---- the module ---------------------------------------------------------------------------------------- */

static void st_free(St *st) {
    Py_XDECREF(st->names); Py_XDECREF(st->keys); Py_XDECREF(st->slot_of); Py_XDECREF(st->kind_of);
    Py_XDECREF(st->meta); Py_XDECREF(st->sends); Py_XDECREF(st->recvs);
    for (int k = 0; k < N_KINDS + 2; k++)
        for (int i = 0; i < 16; i++) Py_XDECREF(st->cols[k][i]);
    for (Py_ssize_t i = 0; i < st->tracks.cap; i++) {
        Py_XDECREF(st->tracks.slots[i].track);
        PyMem_Free(st->tracks.slots[i].stack);
    }
    PyMem_Free(st->tracks.slots);
    PyMem_Free(st->recv_list); PyMem_Free(st->recv_track); PyMem_Free(st->recv_end);
    for (int i = 0; i < SCACHE; i++) Py_XDECREF(st->strs[i].s);
    PyMem_Free(st);
}

static int st_init(St *st) {
    if (!(st->names = PyDict_New()) || !(st->keys = PyDict_New()) || !(st->slot_of = PyDict_New()) ||
        !(st->kind_of = PyDict_New()) || !(st->meta = PyDict_New()) || !(st->sends = PyDict_New()) ||
        !(st->recvs = PyDict_New()))
        return ERR;
    for (int i = 0; i < N_SLOTS; i++) {
        PyObject *index = PyLong_FromLong(i);
        int rc = index ? PyDict_SetItemString(st->slot_of, SLOT_NAMES[i], index) : ERR;
        Py_XDECREF(index);
        if (rc < 0) return ERR;
        st->vals[i].cls = -1;
    }
    for (int i = 0; i < N_KINDS; i++) {
        PyObject *index = PyLong_FromLong(i);
        int rc = index ? PyDict_SetItemString(st->kind_of, KIND_NAMES[i], index) : ERR;
        Py_XDECREF(index);
        if (rc < 0) return ERR;
    }
    for (int k = 0; k < N_KINDS + 2; k++)
        for (int i = 0; i < NCOLS[k]; i++)
            if (!(st->cols[k][i] = PyList_New(0))) return ERR;
    st->tracks.cap = 64;
    if (!(st->tracks.slots = PyMem_Calloc(64, sizeof(Track)))) { PyErr_NoMemory(); return ERR; }
    for (int i = 0; i < KEYCACHE; i++) st->keycache[i].gen = (uint64_t)-1;
    return 0;
}

static PyObject *columns(St *st, int k) {
    PyObject *list = PyList_New(NCOLS[k]);
    if (!list) return NULL;
    for (int i = 0; i < NCOLS[k]; i++) { Py_INCREF(st->cols[k][i]); PyList_SET_ITEM(list, i, st->cols[k][i]); }
    return list;
}

static PyObject *result(St *st) {
    long long unfinished = 0;
    for (Py_ssize_t i = 0; i < st->tracks.cap; i++) unfinished += st->tracks.slots[i].depth;
    PyObject *out = Py_BuildValue("{s:L,s:L,s:L,s:O}", "packets", st->packets, "malformed", st->malformed,
                                  "unfinished", unfinished, "meta", st->meta);
    if (!out) return NULL;
    static const char *FRAMES[N_KINDS + 2] = {"compute", "decisions", "iterations", "step", NULL, NULL,
                                              "rendezvous", "counters", "transfers"};
    for (int k = 0; k < N_KINDS + 2; k++) {
        if (!FRAMES[k]) continue;
        PyObject *cols = columns(st, k);
        if (!cols || PyDict_SetItemString(out, FRAMES[k], cols) < 0) { Py_XDECREF(cols); Py_DECREF(out); return NULL; }
        Py_DECREF(cols);
    }
    return out;
}

static PyObject *fastread_read(PyObject *self, PyObject *args) {
    PyObject *files, *decode, *data_oneof, *schema;
    if (!PyArg_ParseTuple(args, "O!OSU:read", &PyList_Type, &files, &decode, &data_oneof, &schema)) return NULL;
    St *st = PyMem_Calloc(1, sizeof(St));
    if (!st) return PyErr_NoMemory();
    st->decode = decode; st->data_oneof = data_oneof; st->schema = schema;
    int rc = st_init(st);
    for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(files); i++) {
        PyObject *data = PyList_GET_ITEM(files, i);
        if (!PyBytes_Check(data)) { PyErr_SetString(PyExc_TypeError, "read: files must be bytes"); rc = ERR; }
        else rc = walk_file(st, data);
    }
    if (rc == 0) rc = transfers(st);
    PyObject *out = rc == 0 ? result(st) : NULL;
    st_free(st);
    if (rc == BAIL) Py_RETURN_NONE;
    return out;
}

static PyMethodDef METHODS[] = {
    {"read", fastread_read, METH_VARARGS,
     "read(files, decode_track_uuid, data_oneof, schema) -> the frames' columns, or None (read it in Python)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_fastread",
                                    "The trace reader's packet walk in C ([Note: the compiled reader]).", -1,
                                    METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastread(void) { return PyModule_Create(&MODULE); }
