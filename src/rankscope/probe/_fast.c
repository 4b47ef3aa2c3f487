/* The probe's wrapper around a torch.distributed call, and the records it keeps, in C.
 *
 * The Python wrapper in _core.py does the same thing. Right after a collective returns, the
 * rank's caches are cold and every step costs several times what it costs in a warm loop; on a
 * busy machine a rank's microsecond there delays its peers by several. So a recorded call here
 * makes no Python object of its own: its record is a plain C struct (ids and times as C numbers)
 * holding one reference to the call's "facts", a tuple of everything that repeats from call to
 * call at a call site (op, group, peer, shapes, dtypes, async_op, site). A call site keeps its
 * last facts and reuses them while the next call's match.
 *
 * The one-tensor calls (all_reduce, broadcast, send, ...) take that path, through vectorcall:
 * their arguments are read where the caller put them, with no tuple or dict made. Every other
 * call goes to the probe's Python ``_enter``, whose ``_Call`` becomes the same kind of record.
 * A tensor's sizes and dtype come from _meta.cpp's reader where it is built for the torch
 * running (``tensor_meta``): compared with what the call site saw last, they make no object.
 * Otherwise torch's .shape and .dtype getters make them at every call, which right after a
 * collective costs about as much as the rest of the wrapper together.
 *
 * What a wrapper shares with the Probe object (looked up once, when the wrapper is made): the
 * probe's State (below: the records, the call in flight, the count of calls done, the ring,
 * the calls that returned a Work for the thread to follow, which Work.wait as the probe
 * installs it, WaitHook, lets go once done),
 * the group cache and ``_describe_group``, the per-group sequence counters, the call-site cache
 * and ``_call_site``, ``_facts_id`` and the call-id counter. The probe thread turns the records
 * into JSON lines and writes them with State.write, also here: into a buffer the State keeps
 * from flush to flush, then to the events file with the GIL released.
 *
 * Every call is also written into the State's ring as it is entered and as it returns: a slot
 * of plain numbers in a file mapped shared (layout: rankscope.rundir.RING_SLOT), which the
 * kernel keeps however the process dies.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <math.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <stdint.h>
#include <unistd.h>
#include <pythread.h>

#include "_tensor_meta.h"

/* CPython 3.11's frames, read where they lie: a call's path is compared with the last one seen
 * by walking the interpreter's own frame chain, without making a frame object for a frame that
 * has none (PyFrame_GetBack would). Other versions, or a build with RANKSCOPE_PUBLIC_FRAMES
 * defined (to try them on 3.11), use the public calls. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && !defined(RANKSCOPE_PUBLIC_FRAMES)
#define RAW_FRAMES 1
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE 1
#define RANKSCOPE_UNDEF_BUILD_CORE
#endif
#include "internal/pycore_frame.h"
#ifdef RANKSCOPE_UNDEF_BUILD_CORE
#undef Py_BUILD_CORE
#endif
#else
#define RAW_FRAMES 0
#endif

/* A call made while a recorded call is running on the same thread (a collective that calls
 * another, a hook) is passed straight through, as in the Python wrapper. */
#if defined(__GNUC__)
/* initial-exec: read at a fixed offset from the thread pointer, not through __tls_get_addr */
static _Thread_local int busy __attribute__((tls_model("initial-exec")));
#else
static _Thread_local int busy;
#endif

static PyObject *s_group, *s_tensor, *s_async_op, *s_shape, *s_dtype, *s_is_completed;

/* --- Counter: call ids and sequence numbers --------------------------------------------------- */

/* next(c) gives start, start + 1, ... as itertools.count does; the wrappers read and bump the
 * C number without making an int. */
typedef struct {
    PyObject_HEAD
    long long next;
} Counter;

static PyTypeObject CounterType;

/* The next number of a Counter (or of any iterator of ints); -1 with an exception set. */
static long long
count_next(PyObject *counter)
{
    if (Py_IS_TYPE(counter, &CounterType))
        return ((Counter *)counter)->next++;
    PyObject *v = PyIter_Next(counter);
    if (v == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "a probe counter ran out");
        return -1;
    }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return x;
}

/* --- Records and the State ------------------------------------------------------------------- */

/* The facts of a call: what repeats from call to call at a call site, and their id
 * (Probe._facts_id). A _Call is (cid, seq, t, tid, *facts). */
enum {
    F_OP, F_PG, F_DESC, F_RANKS, F_PEER, F_SHAPES, F_DTYPES, F_ASYNC, F_SITE, F_PATH, F_FID,
    N_FACTS
};
#define FACT(facts, i) PyTuple_GET_ITEM(facts, i)
#define CALL_HEAD 4

/* A completed call, the call in flight, or an event. Owns what and error. */
typedef struct {
    PyObject *what;   /* a call's facts tuple, or an event's fields (cid 0) */
    PyObject *error;  /* a call's "Type: message" when it raised, else NULL */
    long long cid, seq;
    unsigned long long tid; /* the calling thread (threading.get_ident()) */
    double t, t_end;  /* time.time() at enter and exit */
    int ok;
    int on_cpu;       /* a call of CPU tensors (read where _meta.cpp is built; else 0) */
} Record;

/* A slot of the ring file, as rankscope.rundir.RING_SLOT lays it out. */
typedef struct {
    uint64_t cid; /* 0 while being written */
    int64_t seq;
    double t, t_end;
    uint32_t fid, state; /* state: 0 in flight, 1 returned, 2 raised; written after t_end */
    uint64_t tid;
    char pad[16];
} RingSlot;
_Static_assert(sizeof(RingSlot) == 64, "RING_SLOT is 64 bytes");
#define RING_HEADER_SIZE 64

/* Bytes being formatted. */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buffer;

/* A State keeps its write buffer between flushes up to this size: a buffer made anew at every
 * flush would fault its pages in anew, and on a virtual machine a first touch of a page costs
 * microseconds. */
#define KEEP_BUFFER (8 << 20)

/* Call paths: a frame of the chain from a call's caller outwards, as the cache compares it
 * (its code object and instruction). */
typedef struct {
    const void *code, *at;
} RawFrame;

typedef RawFrame code_and_at_t;

/* Raw frames a path's key holds; a deeper chain asks Probe._path_id at every call. */
#define PATH_KEY_MAX 256
/* Paths kept: PATH_WAYS for each of PATH_SETS sets, a set chosen by the caller's code and
 * instruction (a helper called from a few places keeps each of its paths). */
#define PATH_SETS 16
#define PATH_WAYS 4
#define PATH_SLOTS (PATH_SETS * PATH_WAYS)

/* A call path seen lately: its raw frames (the code objects held, so that none is freed and its
 * address taken by another while the entry names it) and its id from Probe._path_id, valid
 * while the State's facts_epoch is the entry's (the probe forgets paths with its facts). */
typedef struct {
    RawFrame *key; /* n raw frames, innermost first (PyMem) */
    Py_ssize_t n;
    PyObject *id;
    long long facts_epoch;
} PathEntry;

/* A call that returned something (a Work, a list of them) or was async, for the probe thread
 * (State.take_returned). */
typedef struct {
    long long cid;
    PyObject *result; /* owned; NULL once its caller waited on it and it completed (WaitHook) */
    int how;          /* RET_* */
} Returned;

enum {
    RET_BLOCKING,  /* a blocking call that returned something: nothing to follow */
    RET_ASYNC,     /* an async call: its Work followed until the backend completes it */
    RET_CPU_ASYNC, /* an async call of CPU tensors: done when a wait on its Work returns */
};

/* What the wrappers and the probe thread share: Probe._state. */
typedef struct {
    PyObject_HEAD
    Record *records;    /* completed calls and events in order, not yet written */
    Py_ssize_t len, cap;
    Record *spare;      /* an empty array of spare_cap records, for lines to swap in */
    Py_ssize_t spare_cap;
    Record *current;    /* the call in flight (the last one entered): its wrapper's, on that
                         * thread's C stack, or NULL. Cleared by that wrapper before it returns. */
    Py_ssize_t done;    /* calls completed */
    double t_done;      /* when the last of them completed (time.time()) */
    long long epoch;    /* bumped when process groups are created or destroyed */
    long long facts_epoch; /* bumped when the probe forgets its facts ids (Probe._facts_id) */
    PyObject *call_type; /* _Call: how `current` and the formatters' slow path see a call */
    PyObject *lines;    /* the probe's line writer (_core._Lines): what write() formats with */
    Buffer out;         /* State.write's lines; in use while writing is set */
    int writing;
    Py_buffer ring;     /* the ring file's map (ring.obj NULL: none) */
    RingSlot *slots;
    uint64_t nslots;
    PathEntry paths[PATH_SLOTS]; /* see path_of */
    unsigned path_victim;        /* which way of a full set a new path takes */
    Returned *returned;          /* calls returned since the thread's last take, in order */
    Py_ssize_t ret_len, ret_cap;
} State;

static PyTypeObject StateType;

static void
record_clear(Record *r)
{
    Py_CLEAR(r->what);
    Py_CLEAR(r->error);
}

static void
records_clear(Record *records, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        record_clear(&records[i]);
}

/* Move *r (its references too) to the end of the State's records. */
static int
push(State *st, Record *r)
{
    if (st->len == st->cap) {
        Py_ssize_t cap = st->cap ? st->cap * 2 : 256;
        Record *records = PyMem_Realloc(st->records, cap * sizeof(Record));
        if (records == NULL) {
            record_clear(r);
            PyErr_NoMemory();
            return -1;
        }
        st->records = records;
        st->cap = cap;
    }
    st->records[st->len++] = *r;
    r->what = r->error = NULL;
    return 0;
}

/* Fill r from a _Call tuple (cid, seq, t, tid, *facts); 0, or -1 with an exception set. */
static int
record_of_call(PyObject *call, Record *r)
{
    if (!PyTuple_Check(call) || PyTuple_GET_SIZE(call) != CALL_HEAD + N_FACTS) {
        PyErr_SetString(PyExc_TypeError, "a call record must be a 15-field _Call");
        return -1;
    }
    r->cid = PyLong_AsLongLong(PyTuple_GET_ITEM(call, 0));
    r->seq = PyLong_AsLongLong(PyTuple_GET_ITEM(call, 1));
    r->t = PyFloat_AsDouble(PyTuple_GET_ITEM(call, 2));
    r->tid = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(call, 3));
    if (PyErr_Occurred())
        return -1;
    if (r->cid <= 0) {
        PyErr_SetString(PyExc_ValueError, "a call's id must be positive (0 marks an event)");
        return -1;
    }
    if (!PyLong_Check(PyTuple_GET_ITEM(call, CALL_HEAD + F_FID))) {
        PyErr_SetString(PyExc_TypeError, "a call's facts id must be an int");
        return -1;
    }
    if ((r->what = PyTuple_GetSlice(call, CALL_HEAD, CALL_HEAD + N_FACTS)) == NULL)
        return -1;
    PyObject_GC_UnTrack(r->what); /* see new_facts */
    return 0;
}

/* The record as a _Call, for Python. */
static PyObject *
call_of_record(State *st, Record *r)
{
    PyTypeObject *type = (PyTypeObject *)st->call_type;
    PyObject *call = type->tp_alloc(type, CALL_HEAD + N_FACTS);
    if (call == NULL)
        return NULL;
    PyObject *items[CALL_HEAD] = {PyLong_FromLongLong(r->cid), PyLong_FromLongLong(r->seq),
                                  PyFloat_FromDouble(r->t), PyLong_FromUnsignedLongLong(r->tid)};
    for (int i = 0; i < CALL_HEAD; i++) {
        if (items[i] == NULL) {
            for (int j = 0; j < CALL_HEAD; j++)
                Py_XDECREF(items[j]);
            Py_DECREF(call);
            return NULL;
        }
        PyTuple_SET_ITEM(call, i, items[i]);
    }
    for (int i = 0; i < N_FACTS; i++)
        PyTuple_SET_ITEM(call, CALL_HEAD + i, Py_NewRef(FACT(r->what, i)));
    return call;
}

/* --- The wrapper ------------------------------------------------------------------------------ */

#define SITE_SLOTS 8

/* A call site seen lately: its code object and instruction, the group of its last call (the
 * group argument, its description and sequence counter), and that call's facts.
 *
 * The group argument is not owned: it is compared by identity only while the State's epoch is
 * the slot's and the description came from the probe's group cache, which owns the group
 * until the epoch changes. */
typedef struct {
    PyObject *code, *info, *counter, *facts;
    PyObject *group;
    long long epoch; /* -1: the group is not to be compared */
    long long facts_epoch; /* the State's when the facts were made: their id is current */
    const void *at;  /* the code's instruction (see caller_at) */
    int has_meta;    /* meta holds the sizes and scalar type of the facts' one tensor */
    TensorMeta meta;
} SiteSlot;

/* The keywords a one-tensor call's arguments are read by (Wrapper.kw_at). */
enum { KW_GROUP, KW_PEER, KW_TENSOR, KW_ASYNC, N_KW };

typedef struct {
    getter get;
    void *closure;
} Getter;

typedef struct {
    PyObject_HEAD
    PyObject *fn;
    PyObject *spec;            /* the Python _Spec, passed to the probe's _enter */
    PyObject *name;            /* spec.name */
    PyObject *peer;            /* spec.peer: the keyword naming the peer, or NULL */
    Py_ssize_t group_at, peer_at, async_at; /* positional indexes, -1 when absent */
    int always_async;
    int p2p; /* counted among the group's point-to-point calls: its counter is seqs[(pg, "p2p")] */
    PyObject *enter;
    State *state;
    PyObject *pg_cache, *describe_group, *seqs, *sites, *call_site, *facts_id, *ids;
    PyObject *path_id;         /* Probe._path_id */
    PyObject *tensor_type;
    PyObject *before, *after;  /* hooks: before(args, kwargs) and after(), or NULL */
    PyObject *failed;          /* Probe._call_failed: a call raised, its frames still there */
    PyObject *dict;            /* __wrapped__, __name__, __rankscope__, ... */
    vectorcallfunc vectorcall; /* wrapper_vectorcall for the one-tensor calls, else NULL */
    PyObject *kw_seen;         /* the last call's keyword names (held: the address stays its) */
    Py_ssize_t kw_at[N_KW];    /* where group, peer, tensor and async_op are among them, or -1 */
    Getter shape, dtype;       /* torch.Tensor's getters of .shape and .dtype */
    tensor_meta_fn meta;       /* _meta.cpp's reader, or NULL: the getters only */
    SiteSlot sites_seen[SITE_SLOTS];
} Wrapper;

static long
frame_lasti(PyFrameObject *frame)
{
#if PY_VERSION_HEX >= 0x030B0000
    return PyFrame_GetLasti(frame);
#else
    PyObject *v = PyObject_GetAttrString((PyObject *)frame, "f_lasti");
    long at = v ? PyLong_AsLong(v) : -1;
    Py_XDECREF(v);
    return at;
#endif
}

/* The caller's code object (borrowed: its running frame holds it) and instruction: on 3.11 the
 * raw instruction pointer, as path keys hold it (no index worked out, the code object left
 * untouched); elsewhere its index. Compared only with what the same code gave before.
 * 0, or -1 with an exception set. */
static int
caller_at(PyFrameObject *frame, PyObject **code, const void **at)
{
#if RAW_FRAMES
    *code = (PyObject *)frame->f_frame->f_code;
    *at = frame->f_frame->prev_instr;
    return 0;
#else
    PyCodeObject *c = PyFrame_GetCode(frame);
    Py_DECREF(c);
    long lasti = frame_lasti(frame);
    if (lasti == -1 && PyErr_Occurred())
        return -1;
    *code = (PyObject *)c;
    *at = (const void *)(intptr_t)lasti;
    return 0;
#endif
}

/* --- Call paths -------------------------------------------------------------------------------- */

/* The chain of frames from a call's caller outwards, one raw frame at a time, making no object:
 * on 3.11 the interpreter's frames are read as they lie (every frame of a running chain has
 * started: it holds the caller's); elsewhere the public calls, which may make a frame object
 * for a frame that has none. */
typedef struct {
#if RAW_FRAMES
    _PyInterpreterFrame *f;
#else
    PyFrameObject *f; /* owned */
#endif
} FrameWalk;

static void
walk_start(FrameWalk *walk, PyFrameObject *frame)
{
#if RAW_FRAMES
    walk->f = frame->f_frame;
#else
    walk->f = (PyFrameObject *)Py_NewRef(frame);
#endif
}

/* The next raw frame into *raw: 1, 0 at the end of the chain, or -1 with an exception set. */
static inline int
walk_next(FrameWalk *walk, RawFrame *raw)
{
#if RAW_FRAMES
    _PyInterpreterFrame *f = walk->f;
    if (f == NULL)
        return 0;
    raw->code = f->f_code;
    raw->at = f->prev_instr;
    walk->f = f->previous;
    return 1;
#else
    PyFrameObject *f = walk->f;
    if (f == NULL)
        return 0;
    PyCodeObject *code = PyFrame_GetCode(f);
    Py_DECREF(code); /* the running frame holds it */
    long at = frame_lasti(f);
    if (at == -1 && PyErr_Occurred())
        return -1;
    raw->code = code;
    raw->at = (const void *)(intptr_t)at;
    walk->f = PyFrame_GetBack(f);
    Py_DECREF(f);
    return 1;
#endif
}

static void
walk_end(FrameWalk *walk)
{
#if !RAW_FRAMES
    Py_CLEAR(walk->f);
#endif
    walk->f = NULL;
}

/* Does the chain from frame outwards have the entry's raw frames? 1, 0, or -1 with an exception
 * set. One pass, stopping at the first frame that differs. */
static int
entry_matches(PathEntry *e, PyFrameObject *frame)
{
    FrameWalk walk;
    RawFrame raw;
    Py_ssize_t i = 0;
    int more;
    walk_start(&walk, frame);
    while ((more = walk_next(&walk, &raw)) == 1) {
        if (i == e->n || e->key[i].code != raw.code || e->key[i].at != raw.at)
            break;
        i++;
    }
    walk_end(&walk);
    return more < 0 ? -1 : more == 0 && i == e->n;
}

static void
path_entry_clear(PathEntry *e)
{
    for (Py_ssize_t i = 0; i < e->n; i++)
        Py_DECREF((PyObject *)e->key[i].code);
    PyMem_Free(e->key);
    e->key = NULL;
    e->n = 0;
    Py_CLEAR(e->id);
}

/* Keep the raw frames from frame outwards, and id, in e; nothing where the chain is deeper
 * than PATH_KEY_MAX (asked again at every call). 0, or -1 with an exception set. */
static int
path_entry_fill(State *st, PathEntry *e, PyFrameObject *frame, PyObject *id)
{
    RawFrame raw[PATH_KEY_MAX];
    FrameWalk walk;
    Py_ssize_t n = 0;
    int more;
    walk_start(&walk, frame);
    while (n <= PATH_KEY_MAX && (more = walk_next(&walk, &raw[n < PATH_KEY_MAX ? n : 0])) == 1)
        n++;
    walk_end(&walk);
    if (more < 0)
        return -1;
    if (n > PATH_KEY_MAX)
        return 0;
    RawFrame *key = PyMem_Malloc((n ? n : 1) * sizeof(RawFrame));
    if (key == NULL) /* not kept: asked again next time */
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        Py_INCREF((PyObject *)raw[i].code);
    path_entry_clear(e);
    memcpy(key, raw, n * sizeof(RawFrame));
    e->key = key;
    e->n = n;
    e->id = Py_NewRef(id);
    e->facts_epoch = st->facts_epoch;
    return 0;
}

/* The id of the call path that leads to frame (a new reference; None without a frame), and in
 * *entry the State's entry that holds it (NULL: none). The entries of the set of the caller's
 * code and instruction are compared with the chain, frame by frame: where one has the same raw
 * frames, its id, with no object made; else Probe._path_id works it out (writing the path's
 * line if it is new) and an entry of the set keeps it. NULL with an exception set. */
static PathEntry *
path_set(State *st, code_and_at_t where)
{
    uint64_t h = ((uint64_t)(uintptr_t)where.code >> 4) * 0x9E3779B97F4A7C15ULL ^
                 (uint64_t)(uintptr_t)where.at;
    return &st->paths[(h >> 32) % PATH_SETS * PATH_WAYS];
}

/* The id of the call path that leads to frame where the State's entries have it (borrowed, and
 * its entry in *entry), else NULL (with an exception set where reading the frames failed). */
static PyObject *
path_find(State *st, PyFrameObject *frame, code_and_at_t where, PathEntry **entry)
{
    PathEntry *set = path_set(st, where);
    *entry = NULL;
    for (int i = 0; i < PATH_WAYS; i++) {
        PathEntry *e = &set[i];
        if (e->id == NULL || e->facts_epoch != st->facts_epoch)
            continue;
        int m = entry_matches(e, frame);
        if (m < 0)
            return NULL;
        if (m) {
            *entry = e;
            return e->id;
        }
    }
    return NULL;
}

static PyObject *
path_of(Wrapper *w, PyFrameObject *frame, code_and_at_t where, PathEntry **entry)
{
    State *st = w->state;
    *entry = NULL;
    if (frame == NULL)
        Py_RETURN_NONE;
    PyObject *found = path_find(st, frame, where, entry);
    if (found != NULL || PyErr_Occurred())
        return Py_XNewRef(found);
    PathEntry *set = path_set(st, where);
    PyObject *id = PyObject_CallOneArg(w->path_id, (PyObject *)frame);
    if (id == NULL)
        return NULL;
    PathEntry *e = &set[st->path_victim++ % PATH_WAYS];
    for (int i = 0; i < PATH_WAYS; i++) {
        if (set[i].id == NULL || set[i].facts_epoch != st->facts_epoch) {
            e = &set[i];
            break;
        }
    }
    if (path_entry_fill(st, e, frame, id) < 0) {
        Py_DECREF(id);
        return NULL;
    }
    if (e->id == id)
        *entry = e;
    return id;
}

/* The C getter behind type.name, when it is a plain getset descriptor. */
static Getter
find_getter(PyObject *type, PyObject *name)
{
    Getter g = {NULL, NULL};
    PyObject *d = PyObject_GetAttr(type, name);
    if (d != NULL && PyObject_TypeCheck(d, &PyGetSetDescr_Type)) {
        PyGetSetDef *def = ((PyGetSetDescrObject *)d)->d_getset;
        g.get = def->get;
        g.closure = def->closure;
    }
    Py_XDECREF(d);
    PyErr_Clear();
    return g;
}

static double
now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static Py_ssize_t
index_of(PyObject *spec, Py_ssize_t i)
{
    PyObject *v = PyTuple_GET_ITEM(spec, i);
    return v == Py_None ? -1 : PyLong_AsSsize_t(v);
}

/* A call's arguments as the vectorcall protocol passes them: positional ones, then the values
 * of the keywords named in kwnames (a tuple, or NULL). */
typedef struct {
    PyObject *const *args;
    Py_ssize_t nargs;
    PyObject *kwnames;
} Args;

/* Where key is among a call's keyword names, or -1: compared by identity (names in calls that
 * Python code makes are interned, as key is), then by text (a name built at run time is not). */
static Py_ssize_t
keyword_at(PyObject *kwnames, PyObject *key)
{
    Py_ssize_t n = PyTuple_GET_SIZE(kwnames);
    if (key == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyTuple_GET_ITEM(kwnames, i) == key)
            return i;
    for (Py_ssize_t i = 0; i < n; i++) {
        int cmp = PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, i), key);
        if (cmp == -1 && PyErr_Occurred())
            PyErr_Clear();
        else if (cmp == 0)
            return i;
    }
    return -1;
}

/* The argument whose keyword is at kw among the call's keyword names (-1: none), else the
 * positional one at index at, else NULL (borrowed; None counts as absent). */
static PyObject *
argument(Args *a, Py_ssize_t kw, Py_ssize_t at)
{
    PyObject *v = kw >= 0 ? a->args[a->nargs + kw] : NULL;
    if ((v == NULL || v == Py_None) && at >= 0 && at < a->nargs)
        v = a->args[at];
    return v == Py_None ? NULL : v;
}

/* a == b, as objects that may be NULL; an error in __eq__ counts as "not equal". */
static int
same(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    if (a == NULL || b == NULL)
        return 0;
    int r = PyObject_RichCompareBool(a, b, Py_EQ);
    if (r < 0)
        PyErr_Clear();
    return r == 1;
}

/* same() for two shapes: sizes below 257 are the same int objects, so a shape that repeats is
 * told without comparing ints. */
static int
same_shape(PyObject *a, PyObject *b)
{
    if (PyTuple_Check(a) && PyTuple_Check(b) && Py_TYPE(a) == Py_TYPE(b) &&
        PyTuple_GET_SIZE(a) == PyTuple_GET_SIZE(b)) {
        Py_ssize_t i = 0;
        while (i < PyTuple_GET_SIZE(a) && PyTuple_GET_ITEM(a, i) == PyTuple_GET_ITEM(b, i))
            i++;
        if (i == PyTuple_GET_SIZE(a))
            return 1;
    }
    return same(a, b);
}

static int
same_meta(const TensorMeta *a, const TensorMeta *b)
{
    if (a->ndim != b->ndim || a->scalar_type != b->scalar_type)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->sizes[i] != b->sizes[i])
            return 0;
    return 1;
}

/* (name, desc, ranks) of the group (None: the default one): the slot's, while its epoch holds,
 * else cached per group object by the probe. *cached says whether the probe's cache has it. */
static PyObject *
group_info(Wrapper *w, SiteSlot *slot, PyObject *group, int *cached)
{
    *cached = 1;
    if (slot != NULL && slot->group == group && slot->epoch == w->state->epoch)
        return Py_NewRef(slot->info);
    PyObject *info = PyDict_GetItemWithError(w->pg_cache, group);
    if (info != NULL)
        Py_INCREF(info);
    else if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError))
        return NULL;
    else {
        /* described now, and cached unless unhashable: described again next time */
        PyErr_Clear();
        *cached = 0;
        if ((info = PyObject_CallOneArg(w->describe_group, group)) == NULL)
            return NULL;
    }
    if (!PyTuple_Check(info) || PyTuple_GET_SIZE(info) != 3) {
        PyErr_SetString(PyExc_TypeError, "group description is not a 3-tuple");
        Py_DECREF(info);
        return NULL;
    }
    return info;
}

/* Does the slot's last call have these facts, under an id the probe still has? (The op is the
 * wrapper's own.) */
static int
slot_matches(State *st, SiteSlot *slot, PyObject *code, const void *at, PyObject *info,
             PyObject *path, PyObject *peer, int sized, PyObject *shape, PyObject *dtype,
             int async_op)
{
    if (slot == NULL || slot->facts == NULL || slot->code != code || slot->at != at ||
        slot->info != info || slot->facts_epoch != st->facts_epoch)
        return 0;
    PyObject *facts = slot->facts;
    if ((FACT(facts, F_ASYNC) == Py_True) != async_op || !same(path, FACT(facts, F_PATH)) ||
        !same(peer ? peer : Py_None, FACT(facts, F_PEER)))
        return 0;
    if (sized) /* the tensor's sizes and dtype are known to be the slot's (fast_enter) */
        return 1;
    PyObject *shapes = FACT(facts, F_SHAPES), *dtypes = FACT(facts, F_DTYPES);
    if (dtype == NULL)
        return PyTuple_GET_SIZE(dtypes) == 0;
    return PyTuple_GET_SIZE(dtypes) == 1 && PyTuple_GET_ITEM(dtypes, 0) == dtype &&
           same_shape(shape, PyTuple_GET_ITEM(shapes, 0));
}

/* New facts for a call the slot does not match (slot may be NULL: no frame), remembered in the
 * slot; the group's sequence counter in *counter. New references, or NULL with an exception.
 *
 * Facts live as long as records hold them, beyond the collector's youngest generation; in a
 * process holding torch's hundreds of thousands of objects, survivors made per call bring full
 * collections. They are untracked: they hold ints, strings, torch.Size, dtypes and the probe's
 * cached values, and no cycle can run through them. */
static PyObject *
new_facts(Wrapper *w, SiteSlot *slot, PyFrameObject *frame, PyObject *code, const void *at,
          PyObject *info, PyObject *path, PyObject *peer, PyObject *shape, PyObject *dtype,
          int async_op, PyObject **counter)
{
    PyObject *site = NULL, *shapes = NULL, *dtypes = NULL, *facts = NULL;
    PyObject *pg = PyTuple_GET_ITEM(info, 0);
    *counter = NULL;

    /* The site: the slot's, else the probe's dict, else worked out by _call_site. */
    if (frame == NULL)
        site = PyTuple_Pack(3, Py_None, Py_None, Py_None);
    else if (slot->facts != NULL && slot->code == code && slot->at == at)
        site = Py_NewRef(FACT(slot->facts, F_SITE));
    else {
        /* the probe's dict is keyed as Python sees a frame: (f_code, f_lasti) */
        long at_index = frame_lasti(frame);
        PyObject *lasti = NULL, *key = NULL;
        if ((at_index != -1 || !PyErr_Occurred()) && (lasti = PyLong_FromLong(at_index)) != NULL &&
            (key = PyTuple_Pack(2, code, lasti)) != NULL) {
            site = PyDict_GetItemWithError(w->sites, key);
            if (site != NULL)
                Py_INCREF(site);
            else if (!PyErr_Occurred())
                site = PyObject_CallOneArg(w->call_site, (PyObject *)frame);
        }
        Py_XDECREF(lasti);
        Py_XDECREF(key);
    }
    if (site == NULL)
        goto fail;

    /* The group's counter: the slot's when the group is, else from the probe's dict, under
     * the group's name (collectives) or (name, "p2p") (point-to-point calls), as _enter. */
    if (slot != NULL && slot->info == info && slot->counter != NULL)
        *counter = Py_NewRef(slot->counter);
    else {
        PyObject *key = w->p2p ? Py_BuildValue("(Os)", pg, "p2p") : Py_NewRef(pg);
        if (key == NULL)
            goto fail;
        *counter = PyDict_GetItemWithError(w->seqs, key);
        if (*counter != NULL)
            Py_INCREF(*counter);
        else if (!PyErr_Occurred()) {
            Counter *c = PyObject_New(Counter, &CounterType);
            if (c != NULL) {
                c->next = 1;
                *counter = (PyObject *)c;
                if (PyDict_SetItem(w->seqs, key, *counter))
                    Py_CLEAR(*counter);
            }
        }
        Py_DECREF(key);
        if (*counter == NULL)
            goto fail;
    }

    if (dtype != NULL) {
        if (PyTuple_Check(shape))
            PyObject_GC_UnTrack(shape);
        shapes = PyTuple_Pack(1, shape);
        dtypes = PyTuple_Pack(1, dtype);
    }
    else {
        shapes = PyTuple_New(0);
        dtypes = PyTuple_New(0);
    }
    if (shapes == NULL || dtypes == NULL)
        goto fail;
    PyObject_GC_UnTrack(shapes);
    PyObject_GC_UnTrack(dtypes);
    PyObject *args[] = {w->name, pg, PyTuple_GET_ITEM(info, 1), PyTuple_GET_ITEM(info, 2),
                        peer ? peer : Py_None, shapes, dtypes, async_op ? Py_True : Py_False,
                        site, path};
    /* the facts' id, and their facts line written, before this call goes on */
    PyObject *fid = PyObject_Vectorcall(w->facts_id, args, F_FID, NULL);
    if (fid == NULL)
        goto fail;
    if (!PyLong_Check(fid)) {
        Py_DECREF(fid);
        PyErr_SetString(PyExc_TypeError, "_facts_id must return an int");
        goto fail;
    }
    facts = PyTuple_Pack(N_FACTS, args[0], args[1], args[2], args[3], args[4], args[5], args[6],
                         args[7], args[8], args[9], fid);
    Py_DECREF(fid);
    if (facts == NULL)
        goto fail;
    PyObject_GC_UnTrack(facts);
    if (slot != NULL) {
        slot->facts_epoch = w->state->facts_epoch; /* read after _facts_id, which may bump it */
        Py_XSETREF(slot->code, Py_NewRef(code));
        Py_XSETREF(slot->info, Py_NewRef(info));
        Py_XSETREF(slot->counter, Py_NewRef(*counter));
        Py_XSETREF(slot->facts, Py_NewRef(facts));
        slot->at = at;
    }
    goto done;
fail:
    Py_CLEAR(*counter);
done:
    Py_XDECREF(site);
    Py_XDECREF(shapes);
    Py_XDECREF(dtypes);
    return facts;
}

/* The call's id, its group's sequence number, thread and time, into *r (which holds its facts):
 * 0, or -1 with an exception set and the facts let go. Counters only go up under the GIL: ids
 * and sequence numbers stay unique across threads. */
static int
stamp(Wrapper *w, Record *r, PyObject *counter, int on_cpu)
{
    if ((r->cid = count_next(w->ids)) == -1 || (r->seq = count_next(counter)) == -1) {
        Py_CLEAR(r->what);
        return -1;
    }
    r->tid = PyThread_get_thread_ident();
    r->t = now();
    r->on_cpu = on_cpu;
    return 0;
}

/* What fast_enter read of a call: its arguments, its caller, its tensor's sizes. */
typedef struct {
    PyObject *group, *peer, *tensor, *code;
    const void *at; /* the caller's instruction (see caller_at) */
    int async_op;
    int exact;      /* tensor is a torch.Tensor itself */
    int has_meta;   /* meta holds its sizes and scalar type, read with _meta.cpp */
    TensorMeta meta;
} Read;

/* The call site's slot: a few per wrapper, compared by identity (hashing a code object hashes
 * its constants and names), chosen by the call's path too (its entry, NULL where none keeps
 * it): a helper's line called from two places keeps the facts of both. */
static SiteSlot *
site_slot(Wrapper *w, PyObject *code, const void *at, PathEntry *path_entry)
{
    uintptr_t h = (((uintptr_t)code >> 4) ^ (uintptr_t)at) +
                  (path_entry ? (uintptr_t)(path_entry - w->state->paths) : 0);
    return &w->sites_seen[h % SITE_SLOTS];
}

/* The rest of fast_enter, where the call is not its site's last call again: its path, group,
 * sizes and facts worked out (Python may run), and kept in its site's slot. */
static int
enter_site(Wrapper *w, Read *c, PyFrameObject *frame, Record *r)
{
    PyObject *info = NULL, *shape = NULL, *dtype = NULL, *counter = NULL, *path = NULL;
    PathEntry *path_entry = NULL;
    SiteSlot *slot = NULL;
    int bad = -1, cached, sized = 0;

    if ((path = path_of(w, frame, (code_and_at_t){c->code, c->at}, &path_entry)) == NULL)
        goto done;
    if (frame != NULL)
        slot = site_slot(w, c->code, c->at, path_entry);
    if ((info = group_info(w, slot, c->group, &cached)) == NULL)
        goto done;
    int has_meta = c->has_meta && slot != NULL; /* kept where a slot compares the next call */
    if (c->tensor != NULL && PyObject_TypeCheck(c->tensor, (PyTypeObject *)w->tensor_type)) {
        /* Sized as the slot's last tensor: its facts' shape and dtype, left untouched unless
         * new facts are made (every object touched right after a collective is a cache miss). */
        sized = has_meta && slot->facts != NULL && slot->has_meta &&
                same_meta(&c->meta, &slot->meta);
        if (!sized) {
            if (c->exact && w->shape.get != NULL) {
                /* torch.Tensor itself: its getters, without the attribute lookup */
                shape = w->shape.get(c->tensor, w->shape.closure);
                dtype = shape ? w->dtype.get(c->tensor, w->dtype.closure) : NULL;
            }
            else {
                shape = PyObject_GetAttr(c->tensor, s_shape);
                dtype = shape ? PyObject_GetAttr(c->tensor, s_dtype) : NULL;
            }
            if (dtype == NULL)
                goto done;
        }
    }

    if (slot_matches(w->state, slot, c->code, c->at, info, path, c->peer, sized, shape, dtype,
                     c->async_op)) {
        r->what = Py_NewRef(slot->facts);
        counter = Py_NewRef(slot->counter);
    }
    else {
        if (sized) { /* another site's or group's facts in the slot, of this tensor's sizes */
            shape = Py_NewRef(PyTuple_GET_ITEM(FACT(slot->facts, F_SHAPES), 0));
            dtype = Py_NewRef(PyTuple_GET_ITEM(FACT(slot->facts, F_DTYPES), 0));
        }
        if ((r->what = new_facts(w, slot, frame, c->code, c->at, info, path, c->peer, shape,
                                 dtype, c->async_op, &counter)) == NULL)
            goto done;
    }
    if (slot != NULL) {
        slot->group = c->group;
        slot->epoch = cached ? w->state->epoch : -1;
        if ((slot->has_meta = has_meta))
            slot->meta = c->meta;
    }
    bad = stamp(w, r, counter, c->has_meta && c->meta.on_cpu);
done:
    Py_XDECREF(info);
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(counter);
    Py_XDECREF(path);
    return bad;
}

/* The one-tensor case of Probe._enter, into *r: 0, or -1 with an exception set.
 *
 * Most calls are their site's last call again: the same path, group, sizes and keywords. That
 * is told first, from the site's slot, taking no reference but the record's and running no
 * Python (so that nothing it borrows can go): every object touched right after a collective
 * returns is a cache miss, and on a busy machine a rank's microsecond there delays its peers
 * by about as much again. Any other call goes through enter_site. */
static int
fast_enter(Wrapper *w, Args *args, PyFrameObject *frame, Record *r)
{
    Read c = {.async_op = 1};

    /* Where the keywords are: worked out again only when the call's names are not the last
     * call's (a call site passes the same tuple, a constant of its code, every time). */
    if (args->kwnames != w->kw_seen) {
        PyObject *keys[N_KW] = {s_group, w->peer, s_tensor, s_async_op};
        for (int k = 0; k < N_KW; k++)
            w->kw_at[k] = args->kwnames ? keyword_at(args->kwnames, keys[k]) : -1;
        Py_XSETREF(w->kw_seen, Py_XNewRef(args->kwnames));
    }
    if ((c.group = argument(args, w->kw_at[KW_GROUP], w->group_at)) == NULL)
        c.group = Py_None;
    c.peer = w->peer != NULL ? argument(args, w->kw_at[KW_PEER], w->peer_at) : NULL;
    c.tensor = argument(args, w->kw_at[KW_TENSOR], 0);
    if (!w->always_async) {
        PyObject *a = argument(args, w->kw_at[KW_ASYNC], w->async_at);
        if ((c.async_op = a == NULL ? 0 : PyObject_IsTrue(a)) < 0)
            return -1;
    }
    c.exact = c.tensor != NULL && Py_TYPE(c.tensor) == (PyTypeObject *)w->tensor_type;
    c.has_meta = c.exact && w->meta != NULL && w->meta(c.tensor, &c.meta) == 0;
    if (frame == NULL)
        return enter_site(w, &c, frame, r);
    if (caller_at(frame, &c.code, &c.at) < 0)
        return -1;

    /* The site's last call again? */
    PathEntry *path_entry;
    PyObject *path = path_find(w->state, frame, (code_and_at_t){c.code, c.at}, &path_entry);
    if (path != NULL && path_entry != NULL && c.has_meta) {
        SiteSlot *slot = site_slot(w, c.code, c.at, path_entry);
        if (slot->facts != NULL && slot->group == c.group && slot->epoch == w->state->epoch &&
            slot->has_meta && same_meta(&c.meta, &slot->meta) &&
            slot_matches(w->state, slot, c.code, c.at, slot->info, path, c.peer, 1, NULL, NULL,
                         c.async_op)) {
            r->what = Py_NewRef(slot->facts);
            return stamp(w, r, slot->counter, c.meta.on_cpu);
        }
    }
    return enter_site(w, &c, frame, r);
}

/* Any other call: the probe's Python _enter makes its _Call, kept as a record in *r. */
static int
python_enter(Wrapper *w, PyObject *args, PyObject *kwargs, PyFrameObject *frame, Record *r)
{
    PyObject *call = PyObject_CallFunctionObjArgs(w->enter, w->spec, args,
                                                  kwargs ? kwargs : Py_None,
                                                  frame ? (PyObject *)frame : Py_None, NULL);
    if (call == NULL)
        return -1;
    int bad = record_of_call(call, r);
    Py_DECREF(call);
    return bad;
}

/* "Type: message" of the exception being raised, which stays set. */
static PyObject *
error_text(void)
{
    PyObject *type, *value, *tb, *name, *text, *out = NULL;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    name = type ? PyObject_GetAttrString(type, "__name__") : NULL;
    text = value ? PyObject_Str(value) : NULL;
    if (name != NULL && text != NULL)
        out = PyUnicode_FromFormat("%U: %U", name, text);
    if (out == NULL)
        out = PyUnicode_FromString("unknown error");
    Py_XDECREF(name);
    Py_XDECREF(text);
    PyErr_Clear(); /* from the lines above, if any; the user's exception is restored next */
    PyErr_Restore(type, value, tb);
    return out;
}

/* The call's slot in the ring: its numbers, then its id, last (a reader that finds the id
 * finds the rest). */
static void
ring_enter(State *st, Record *r)
{
    if (st->slots == NULL)
        return;
    RingSlot *s = &st->slots[(uint64_t)r->cid % st->nslots];
    __atomic_store_n(&s->cid, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    s->seq = r->seq;
    s->t = r->t;
    s->t_end = 0.0;
    s->fid = (uint32_t)PyLong_AsUnsignedLongMask(FACT(r->what, F_FID));
    s->state = 0;
    s->tid = r->tid;
    __atomic_store_n(&s->cid, (uint64_t)r->cid, __ATOMIC_RELEASE);
}

/* The call's end in its slot, unless a later call has taken the slot since. */
static void
ring_exit(State *st, Record *r)
{
    if (st->slots == NULL)
        return;
    RingSlot *s = &st->slots[(uint64_t)r->cid % st->nslots];
    if (__atomic_load_n(&s->cid, __ATOMIC_RELAXED) != (uint64_t)r->cid)
        return;
    s->t_end = r->t_end;
    __atomic_store_n(&s->state, r->ok ? 1u : 2u, __ATOMIC_RELEASE);
}

/* Before the call: 0 to go on, with *r the call in flight, or -1 to return with the exception
 * set. The probe must never break the user's collective: an Exception of its own is dropped
 * (the call goes on unrecorded); only KeyboardInterrupt and the like go up. */
static int
entered(State *st, Record *r, int bad)
{
    if (!bad) {
        ring_enter(st, r); /* in the file before anything can see the call in flight */
        st->current = r;
        return 0;
    }
    record_clear(r);
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyErr_Clear();
    return 0;
}

/* After the call (result NULL: it raised): the after-hook, and the exit record. Both run with
 * the user's exception (if any) set aside, and their own failures are dropped: the call's
 * outcome is the user's. */
static void
finish(Wrapper *w, Record *r, PyObject *result)
{
    State *st = w->state;
    if (r->what != NULL) {
        if (result == NULL)
            r->error = error_text();
        r->ok = result != NULL;
        r->t_end = now();
        ring_exit(st, r);
        if (st->current == r)
            st->current = NULL;
        st->done++;
        st->t_done = r->t_end;
    }
    PyObject *exc_type = NULL, *exc_value = NULL, *exc_tb = NULL;
    if (result == NULL) /* the user's exception, set aside (a call that returned has none) */
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    /* A call that raised an error: the values its caller's frames read, while they are on the
     * stack (the user's code may catch the error and go on). */
    if (result == NULL && r->what != NULL && exc_type != NULL &&
        PyErr_GivenExceptionMatches(exc_type, PyExc_Exception)) {
        Py_XDECREF(PyObject_CallNoArgs(w->failed));
        PyErr_Clear();
    }
    if (r->what != NULL && result != NULL &&
        (result != Py_None || FACT(r->what, F_ASYNC) == Py_True)) {
        /* An async call (async_op=True, isend, batch_isend_irecv) returned its Work: the probe
         * follows it until the backend completes it (one that returned None, a rank outside
         * the group, is done at once). Blocking calls return None: no cost. Kept as C numbers
         * and the result's reference: the thread makes the Python objects (take_returned). */
        if (st->ret_len == st->ret_cap) {
            Py_ssize_t cap = st->ret_cap ? 2 * st->ret_cap : 256;
            Returned *grown = PyMem_Realloc(st->returned, cap * sizeof(Returned));
            if (grown != NULL) {
                st->returned = grown;
                st->ret_cap = cap;
            }
        }
        if (st->ret_len < st->ret_cap) /* else, out of memory: the call is not followed */
            st->returned[st->ret_len++] = (Returned){
                r->cid, Py_NewRef(result),
                FACT(r->what, F_ASYNC) != Py_True ? RET_BLOCKING
                : r->on_cpu                       ? RET_CPU_ASYNC
                                                  : RET_ASYNC};
    }
    if (r->what != NULL)
        push(st, r);
    /* after the exit record: the hook of init/destroy_process_group writes it out at once */
    if (w->after != NULL)
        Py_XDECREF(PyObject_CallNoArgs(w->after));
    PyErr_Clear();
    if (result == NULL)
        PyErr_Restore(exc_type, exc_value, exc_tb);
}

/* A call through tp_call (args a tuple, kwargs a dict or NULL). The one-tensor calls without
 * hooks go to wrapper_vectorcall; the others are the probe's Python _enter's to record. */
static PyObject *
wrapper_call(Wrapper *w, PyObject *args, PyObject *kwargs)
{
    if (w->vectorcall != NULL)
        return PyVectorcall_Call((PyObject *)w, args, kwargs);
    if (busy)
        return PyObject_Call(w->fn, args, kwargs);
    busy = 1;
    Record rec = {NULL};
    PyObject *result = NULL, *owned_kwargs = NULL;
    if (w->before != NULL) {
        owned_kwargs = kwargs ? PyDict_Copy(kwargs) : PyDict_New();
        if (owned_kwargs == NULL)
            goto out;
        PyObject *r = PyObject_CallFunctionObjArgs(w->before, args, owned_kwargs, NULL);
        if (r == NULL)
            goto out;
        Py_DECREF(r);
        kwargs = owned_kwargs;
    }
    PyFrameObject *frame = PyEval_GetFrame(); /* the caller: this wrapper has no frame */
    if (entered(w->state, &rec, python_enter(w, args, kwargs, frame, &rec)) == 0) {
        result = PyObject_Call(w->fn, args, kwargs);
        finish(w, &rec, result);
    }
out:
    Py_XDECREF(owned_kwargs);
    busy = 0;
    return result;
}

/* A one-tensor call without hooks (all_reduce, broadcast, send, ...), as Python makes it: its
 * arguments are read where they lie and passed on as they came. */
static PyObject *
wrapper_vectorcall(Wrapper *w, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (busy)
        return PyObject_Vectorcall(w->fn, args, nargsf, kwnames);
    busy = 1;
    Record rec = {NULL};
    Args a = {args, PyVectorcall_NARGS(nargsf), kwnames};
    PyObject *result = NULL;
    PyFrameObject *frame = PyEval_GetFrame(); /* the caller: this wrapper has no frame */
    if (entered(w->state, &rec, fast_enter(w, &a, frame, &rec)) == 0) {
        result = PyObject_Vectorcall(w->fn, args, nargsf, kwnames);
        finish(w, &rec, result);
    }
    busy = 0;
    return result;
}

/* --- WaitHook: Work.wait as the probe installs it --------------------------------------------- */

/* Where the Work waited on is the last async call's, still among the State's calls returned
 * for the thread, and the backend completed it, the hook lets the Work go at once: the thread's
 * next look takes the call's id alone and counts it done. A Work kept until that look is
 * freed long after its call, out of the cache. Its Python twin is _twins.waited_hook; in Python,
 * right after a wait returns, the hook's few steps cost more than the wrapper's whole call
 * (``bench/probe_overhead.py --async-op``). A method descriptor, so that ``work.wait()`` makes
 * no bound method.
 *
 * Completed: a wait on a collective of CPU tensors returns once it is done (torch's contract
 * for Work.wait; gloo's and MPI's waits block until then), so a call the wrapper marked so
 * (RET_CPU_ASYNC) is done when its wait returns. Any other is asked (``is_completed()``, about
 * 2 us right after a wait on 2 cores, as much as the wrapper's whole call): nccl's wait
 * returns once the GPU stream waits, and its Work stays followed until the GPU is done. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *wait; /* torch's own Work.wait */
    State *state;   /* the probe's: its calls returned (Returned) */
    PyObject *dict; /* functools.wraps's __wrapped__, __doc__, ... */
} WaitHook;

static PyObject *
wait_hook_vectorcall(WaitHook *h, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *out = PyObject_Vectorcall(h->wait, args, nargsf, kwnames);
    State *st = h->state;
    if (out == NULL || PyVectorcall_NARGS(nargsf) < 1 || st->ret_len == 0)
        return out;
    /* the thread takes the calls under the GIL; the last one stays where it is meanwhile */
    Returned *last = &st->returned[st->ret_len - 1];
    PyObject *work = args[0];
    if (last->result != work)
        return out;
    PyObject *done = last->how == RET_CPU_ASYNC
                         ? Py_NewRef(Py_True)
                         : PyObject_VectorcallMethod(s_is_completed, &work,
                                                     1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (done == NULL) /* a Work torn down with its group: the thread's look says so */
        PyErr_Clear();
    else if (done == Py_True && st->ret_len > 0 && last == &st->returned[st->ret_len - 1] &&
             last->result == work) { /* still there after is_completed(), which may switch */
        last->result = NULL;
        Py_DECREF(work);
    }
    Py_XDECREF(done);
    return out;
}

static PyObject *
wait_hook_get(PyObject *self, PyObject *obj, PyObject *type)
{
    return obj == NULL || obj == Py_None ? Py_NewRef(self) : PyMethod_New(self, obj);
}

static int
wait_hook_traverse(WaitHook *h, visitproc visit, void *arg)
{
    Py_VISIT(h->wait);
    Py_VISIT(h->state);
    Py_VISIT(h->dict);
    return 0;
}

static int
wait_hook_clear(WaitHook *h)
{
    Py_CLEAR(h->wait);
    Py_CLEAR(h->state);
    Py_CLEAR(h->dict);
    return 0;
}

static void gc_dealloc(PyObject *self);

static PyObject *
wait_hook_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"wait", "state", NULL};
    PyObject *wait, *state;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!:WaitHook", kwlist, &wait, &StateType,
                                     &state))
        return NULL;
    WaitHook *h = (WaitHook *)type->tp_alloc(type, 0);
    if (h == NULL)
        return NULL;
    h->wait = Py_NewRef(wait);
    h->state = (State *)Py_NewRef(state);
    h->vectorcall = (vectorcallfunc)wait_hook_vectorcall;
    return (PyObject *)h;
}

/* The __dict__ of the wrappers and the hook (functools.wraps's attributes, __rankscope__). */
static PyGetSetDef dict_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {NULL},
};

static PyTypeObject WaitHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rankscope.probe._fast.WaitHook",
    .tp_doc = "WaitHook(wait, state)\n\n"
              "Work.wait as the probe installs it: lets a completed Work go at its wait; see "
              "rankscope/probe/_twins.py's waited_hook.",
    .tp_basicsize = sizeof(WaitHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = wait_hook_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(WaitHook, vectorcall),
    .tp_descr_get = wait_hook_get,
    .tp_traverse = (traverseproc)wait_hook_traverse,
    .tp_clear = (inquiry)wait_hook_clear,
    .tp_dealloc = gc_dealloc,
    .tp_dictoffset = offsetof(WaitHook, dict),
    .tp_getset = dict_getset,
};

/* --- State.write: the probe thread's formatting and writing of the records ------------------ */

static int
put(Buffer *b, const char *s, Py_ssize_t n)
{
    if (b->len + n > b->cap) {
        Py_ssize_t cap = (b->len + n) * 2 + 4096;
        char *data = PyMem_Realloc(b->data, cap);
        if (data == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

static int
put_str(Buffer *b, PyObject *text) /* a str of JSON (ASCII) */
{
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(text, &n);
    return s == NULL ? -1 : put(b, s, n);
}

/* Decimal digits of v, right-aligned to end at end (at least width of them); the first one. */
static char *
digits(char *end, unsigned long long v, int width)
{
    char *p = end;
    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v || end - p < width);
    return p;
}

static int
put_int(Buffer *b, long long x)
{
    char tmp[24], *end = tmp + sizeof tmp;
    char *p = digits(end, x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x, 1);
    if (x < 0)
        *--p = '-';
    return put(b, p, end - p);
}

static int
put_uint(Buffer *b, unsigned long long x)
{
    char tmp[24], *end = tmp + sizeof tmp;
    char *p = digits(end, x, 1);
    return put(b, p, end - p);
}

/* Seconds to the microsecond, as _core._seconds writes them: the nearest whole number of
 * microseconds (ties to even, as Python's round()), then "[-]S.UUUUUU". */
static int
put_seconds(Buffer *b, double x)
{
    char tmp[32], *end = tmp + sizeof tmp;
    double us = x * 1e6;
    if (!(fabs(us) < 9e18)) /* NaN too */
        return put(b, "null", 4);
    long long v = (long long)nearbyint(us);
    unsigned long long a = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    char *p = digits(end, a % 1000000, 6);
    *--p = '.';
    p = digits(p, a / 1000000, 1);
    if (v < 0)
        *--p = '-';
    return put(b, p, end - p);
}

#define PUT(b, lit) put(b, lit, (Py_ssize_t)sizeof(lit) - 1)

/* A str from a Python formatter (a miss of the cache or a rare case), appended. */
static int
put_call(Buffer *b, PyObject *line)
{
    if (line == NULL)
        return -1;
    int r = put_str(b, line);
    Py_DECREF(line);
    return r;
}

/* The exit fragment of the last facts formatted: consecutive calls from one site share it. */
typedef struct {
    PyObject *facts, *exit;
} Memo;

static void
memo_for(Memo *m, PyObject *facts)
{
    if (m->facts != facts) {
        Py_XSETREF(m->facts, Py_NewRef(facts));
        Py_CLEAR(m->exit);
    }
}

/* statics[key] if it is a str (a new reference), else NULL; an error only if not a TypeError
 * (an unhashable key: the slow way). */
static PyObject *
fragment(PyObject *statics, PyObject *key)
{
    if (key == NULL)
        return NULL;
    PyObject *f = PyDict_GetItemWithError(statics, key);
    Py_DECREF(key);
    if (f == NULL && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_TypeError))
        PyErr_Clear();
    return f != NULL && PyUnicode_Check(f) ? Py_NewRef(f) : NULL;
}

/* Python's formatter of an exit line (_exit_line), for a miss of the cached fragment or an
 * error text. */
static int
put_slow_exit(Buffer *b, State *st, Record *r, PyObject *slow)
{
    PyObject *call = call_of_record(st, r), *line = NULL;
    if (call == NULL)
        return -1;
    PyObject *t_end = PyFloat_FromDouble(r->t_end);
    if (t_end != NULL)
        line = PyObject_CallFunctionObjArgs(slow, call, t_end, r->ok ? Py_True : Py_False,
                                            r->error ? r->error : Py_None, NULL);
    Py_XDECREF(t_end);
    Py_DECREF(call);
    return put_call(b, line);
}

/* The fields a call's enter and call lines begin with: {"id":I,"seq":S,"tid":T,"facts":F */
static int
put_call_head(Buffer *b, Record *r)
{
    long long fid = PyLong_AsLongLong(FACT(r->what, F_FID));
    if (fid == -1 && PyErr_Occurred())
        return -1;
    return PUT(b, "{\"id\":") || put_int(b, r->cid) || PUT(b, ",\"seq\":") ||
           put_int(b, r->seq) || PUT(b, ",\"tid\":") || put_uint(b, r->tid) ||
           PUT(b, ",\"facts\":") || put_int(b, fid);
}

/* The enter line of a call, as _twins._enter_line writes it: its facts by id. */
static int
enter_line(Buffer *b, Record *r, long long rank)
{
    if (put_call_head(b, r) || PUT(b, ",\"ev\":\"enter\",\"t\":") || put_seconds(b, r->t) ||
        PUT(b, ",\"rank\":") || put_int(b, rank) || PUT(b, "}\n"))
        return -1;
    return 0;
}

/* The one line of a call that returned before its enter line was written, as
 * _twins._call_line writes it. */
static int
call_line(Buffer *b, Record *r, long long rank)
{
    if (put_call_head(b, r) || PUT(b, ",\"dur_s\":") || put_seconds(b, r->t_end - r->t) ||
        PUT(b, ",\"ok\":true,\"ev\":\"call\",\"t\":") || put_seconds(b, r->t) ||
        PUT(b, ",\"rank\":") || put_int(b, rank) || PUT(b, "}\n"))
        return -1;
    return 0;
}

/* The exit line, as Probe._exit_line writes it; an error text or a cache miss goes there. */
static int
exit_line(Buffer *b, State *st, Record *r, Memo *m, PyObject *statics, PyObject *slow,
          long long rank)
{
    PyObject *facts = r->what;
    memo_for(m, facts);
    if (m->exit == NULL && r->error == NULL) {
        m->exit = fragment(statics, PyTuple_Pack(2, FACT(facts, F_OP), FACT(facts, F_PG)));
        if (m->exit == NULL && PyErr_Occurred())
            return -1;
    }
    if (m->exit == NULL || r->error != NULL)
        return put_slow_exit(b, st, r, slow);
    if (PUT(b, "{\"id\":") || put_int(b, r->cid) || PUT(b, ",") || put_str(b, m->exit) ||
        PUT(b, ",\"seq\":") || put_int(b, r->seq) || PUT(b, ",\"dur_s\":") ||
        put_seconds(b, r->t_end - r->t) ||
        (r->ok ? PUT(b, ",\"ok\":true") : PUT(b, ",\"ok\":false")) ||
        PUT(b, ",\"error\":null,\"ev\":\"exit\",\"t\":") || put_seconds(b, r->t_end) ||
        PUT(b, ",\"rank\":") || put_int(b, rank) || PUT(b, "}\n"))
        return -1;
    return 0;
}

/* Has the probe written this call's enter line already (a call in flight at a flush)? Then
 * forget it: its exit is being written. 1, 0, or -1 with an exception set. */
static int
entered_before(PyObject *entered, long long cid)
{
    if (PySet_GET_SIZE(entered) == 0)
        return 0;
    PyObject *key = PyLong_FromLongLong(cid);
    if (key == NULL)
        return -1;
    int seen = PySet_Discard(entered, key);
    Py_DECREF(key);
    return seen;
}

/* Take every record queued and append their JSON lines to b; 0, or -1 with a MemoryError set
 * (what was formatted stays in b). A record that cannot be formatted otherwise is dropped.
 * A call whose enter line a flush wrote gets its exit line; one that returned since, its call
 * line; one that raised, an enter line and an exit line (with its error). */
static int
format_records(State *st, Buffer *b, PyObject *entered, PyObject *statics, PyObject *slow_exit,
               PyObject *event_line, long long rank)
{
    /* Taken first: the Python formatters may let another thread run, and its calls' records
     * go to the spare array, for the next flush. The taken one is the next spare: an array
     * that grows anew at every flush would fault its pages in anew. */
    Record *records = st->records;
    Py_ssize_t n = st->len, cap = st->cap, i;
    st->records = st->spare;
    st->cap = st->spare_cap;
    st->len = 0;
    st->spare = NULL;
    st->spare_cap = 0;

    Memo m = {NULL, NULL};
    for (i = 0; i < n; i++) {
        Record *r = &records[i];
        Py_ssize_t mark = b->len;
        int bad, seen;
        if (r->cid == 0)
            bad = put_call(b, PyObject_CallOneArg(event_line, r->what));
        else if ((seen = entered_before(entered, r->cid)) < 0)
            bad = 1;
        else if (seen == 0 && r->ok && r->error == NULL)
            bad = call_line(b, r, rank);
        else
            bad = (seen == 0 && enter_line(b, r, rank)) ||
                  exit_line(b, st, r, &m, statics, slow_exit, rank);
        if (bad) {
            b->len = mark;
            if (PyErr_ExceptionMatches(PyExc_MemoryError))
                break;
            PyErr_Clear();
        }
    }
    records_clear(records, n);
    if (st->spare == NULL) {
        st->spare = records;
        st->spare_cap = cap;
    }
    else
        PyMem_Free(records);
    Py_XDECREF(m.facts);
    Py_XDECREF(m.exit);
    return i == n ? 0 : -1;
}

/* All of data to fd, as os.write would in a loop; 0, or -1 with errno set. Called without the
 * GIL. */
static int
write_all(int fd, const char *data, Py_ssize_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, data, (size_t)n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        data += k;
        n -= k;
    }
    return 0;
}

static PyObject *state_write_lines(State *st, int fd, PyObject *entered, PyObject *statics,
                                   PyObject *exit_line, PyObject *event_line, long long rank,
                                   PyObject *in_flight);

/* The line writer's attributes that write() formats with, in the order of LINES. */
static const char *const LINES[] = {"entered",    "statics", "exit_line",
                                    "event_line", "rank",    "in_flight"};
enum { L_ENTERED, L_STATICS, L_EXIT, L_EVENT, L_RANK, L_IN_FLIGHT, N_LINES };

static PyObject *
state_write(State *st, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "write(fd)");
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    PyObject *lw[N_LINES] = {NULL};
    PyObject *result = NULL;
    for (int i = 0; i < N_LINES; i++) {
        if ((lw[i] = PyObject_GetAttrString(st->lines, LINES[i])) == NULL)
            goto done;
    }
    PyObject *entered = lw[L_ENTERED], *statics = lw[L_STATICS], *in_flight = lw[L_IN_FLIGHT];
    long long rank = PyLong_AsLongLong(lw[L_RANK]);
    if (rank == -1 && PyErr_Occurred())
        goto done;
    if (fd < 0 || fd > INT_MAX || !PySet_Check(entered) || !PyDict_Check(statics)) {
        PyErr_SetString(PyExc_TypeError, "write: fd must be a file descriptor, the line "
                                         "writer's entered a set and its statics a dict");
        goto done;
    }
    result = state_write_lines(st, (int)fd, entered, statics, lw[L_EXIT], lw[L_EVENT], rank,
                               in_flight);
done:
    for (int i = 0; i < N_LINES; i++)
        Py_XDECREF(lw[i]);
    return result;
}

static PyObject *
state_write_lines(State *st, int fd, PyObject *entered, PyObject *statics, PyObject *exit_line,
                  PyObject *event_line, long long rank, PyObject *in_flight)
{
    if (st->writing) { /* Probe.flush holds its lock: only a caller of its own gets here */
        PyErr_SetString(PyExc_RuntimeError, "State.write is already running on another thread");
        return NULL;
    }
    st->writing = 1;
    Buffer *b = &st->out; /* empty: every write leaves it so */
    /* The in-flight call's enter line goes last: a call that ends meanwhile has its record in
     * the array the next write takes. */
    int bad = format_records(st, b, entered, statics, exit_line, event_line, rank);
    if (!bad) {
        PyObject *line = PyObject_CallNoArgs(in_flight);
        bad = line == NULL || (line != Py_None && put_str(b, line));
        Py_XDECREF(line);
    }
    /* What was formatted is written even when something failed; the failure is raised after. */
    PyObject *exc_type = NULL, *exc_value = NULL, *exc_tb = NULL;
    if (bad)
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    int err = 0;
    if (b->len) {
        Py_BEGIN_ALLOW_THREADS
        if (write_all((int)fd, b->data, b->len))
            err = errno;
        Py_END_ALLOW_THREADS
    }
    b->len = 0;
    if (b->cap > KEEP_BUFFER) { /* after a burst: the next flush starts small again */
        PyMem_Free(b->data);
        b->data = NULL;
        b->cap = 0;
    }
    st->writing = 0;
    if (bad) {
        PyErr_Restore(exc_type, exc_value, exc_tb);
        return NULL;
    }
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* --- State ----------------------------------------------------------------------------------- */

/* State.append(record): (fields,) for an event, (call, t_end, ok, error) for a completed call
 * (the Python wrapper's records, which the tests also feed to both formatters). */
static PyObject *
state_append(State *st, PyObject *item)
{
    Record r = {NULL};
    if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 1)
        r.what = Py_NewRef(PyTuple_GET_ITEM(item, 0));
    else if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 4) {
        PyObject *error = PyTuple_GET_ITEM(item, 3);
        if (record_of_call(PyTuple_GET_ITEM(item, 0), &r))
            goto fail;
        r.t_end = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 1));
        if ((r.ok = PyObject_IsTrue(PyTuple_GET_ITEM(item, 2))) < 0 ||
            (r.t_end == -1.0 && PyErr_Occurred()))
            goto fail;
        if (error != Py_None) {
            if (!PyUnicode_Check(error)) {
                PyErr_SetString(PyExc_TypeError, "a call's error must be a str or None");
                goto fail;
            }
            r.error = Py_NewRef(error);
        }
    }
    else {
        PyErr_SetString(PyExc_TypeError, "append: a record is (fields,) or (call, t_end, ok, error)");
        return NULL;
    }
    if (push(st, &r))
        return NULL;
    Py_RETURN_NONE;
fail:
    record_clear(&r);
    return NULL;
}

static PyObject *
state_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"call_type", "ring", "lines", NULL};
    PyObject *call_type, *ring = Py_None, *lines = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!|OO:State", kwlist, &PyType_Type, &call_type,
                                     &ring, &lines))
        return NULL;
    State *st = (State *)type->tp_alloc(type, 0);
    if (st == NULL)
        return NULL;
    st->call_type = Py_NewRef(call_type);
    st->lines = Py_NewRef(lines);
    if (ring != Py_None) {
        if (PyObject_GetBuffer(ring, &st->ring, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            Py_DECREF(st);
            return NULL;
        }
        const char *head = st->ring.buf;
        uint32_t version, slot_size, nslots;
        if (st->ring.len >= RING_HEADER_SIZE) {
            memcpy(&version, head + 8, 4);
            memcpy(&slot_size, head + 12, 4);
            memcpy(&nslots, head + 16, 4);
        }
        if (st->ring.len < RING_HEADER_SIZE || memcmp(head, "RSRING01", 8) || version != 1 ||
            slot_size != sizeof(RingSlot) || nslots == 0 ||
            st->ring.len < RING_HEADER_SIZE + (Py_ssize_t)nslots * (Py_ssize_t)sizeof(RingSlot)) {
            PyErr_SetString(PyExc_ValueError, "State: ring is not a ring file's map (rundir.RING_*)");
            Py_DECREF(st);
            return NULL;
        }
        st->slots = (RingSlot *)((char *)st->ring.buf + RING_HEADER_SIZE);
        st->nslots = nslots;
    }
    return (PyObject *)st;
}

static int
state_traverse(State *st, visitproc visit, void *arg)
{
    Py_VISIT(st->call_type);
    Py_VISIT(st->lines);
    for (int i = 0; i < PATH_SLOTS; i++)
        Py_VISIT(st->paths[i].id);
    for (Py_ssize_t i = 0; i < st->len; i++) {
        Py_VISIT(st->records[i].what);
        Py_VISIT(st->records[i].error);
    }
    for (Py_ssize_t i = 0; i < st->ret_len; i++)
        Py_VISIT(st->returned[i].result);
    return 0;
}

static int
state_clear(State *st)
{
    Record *records = st->records;
    Py_ssize_t n = st->len;
    st->records = NULL;
    st->len = st->cap = 0;
    records_clear(records, n);
    PyMem_Free(records);
    PyMem_Free(st->spare);
    st->spare = NULL;
    st->spare_cap = 0;
    PyMem_Free(st->out.data);
    st->out.data = NULL;
    st->out.len = st->out.cap = 0;
    Py_CLEAR(st->call_type);
    Py_CLEAR(st->lines);
    for (int i = 0; i < PATH_SLOTS; i++)
        path_entry_clear(&st->paths[i]);
    Returned *returned = st->returned;
    n = st->ret_len;
    st->returned = NULL;
    st->ret_len = st->ret_cap = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        Py_XDECREF(returned[i].result);
    PyMem_Free(returned);
    st->slots = NULL;
    if (st->ring.obj != NULL)
        PyBuffer_Release(&st->ring);
    return 0;
}

static PyObject *
state_get_current(State *st, void *closure)
{
    if (st->current == NULL || st->call_type == NULL) /* none, or a State torn down */
        Py_RETURN_NONE;
    return call_of_record(st, st->current);
}

static PyMemberDef state_members[] = {
    {"done", T_PYSSIZET, offsetof(State, done), 0, "calls completed"},
    {"t_done", T_DOUBLE, offsetof(State, t_done), 0, "when the last of them completed"},
    {"epoch", T_LONGLONG, offsetof(State, epoch), 0,
     "bumped when process groups are created or destroyed (Probe._groups_changed)"},
    {"facts_epoch", T_LONGLONG, offsetof(State, facts_epoch), 0,
     "bumped when the probe forgets its facts ids (Probe._facts_id): call sites ask anew"},
    {NULL},
};

/* The calls returned since the last take, as _twins._State.take_returned gives them. */
static PyObject *
state_take_returned(State *st, PyObject *noargs)
{
    Py_ssize_t n = st->ret_len;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Returned *e = &st->returned[i];
        PyObject *cid = PyLong_FromLongLong(e->cid), *item = cid;
        if (cid != NULL && e->result != NULL) {
            item = PyTuple_Pack(3, cid, e->result, e->how == RET_BLOCKING ? Py_False : Py_True);
            Py_DECREF(cid);
        }
        if (item == NULL) { /* nothing taken: the next take tries again */
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
    }
    st->ret_len = 0;
    for (Py_ssize_t i = 0; i < n; i++) /* the list holds them now */
        Py_XDECREF(st->returned[i].result);
    return out;
}

static PyObject *
state_get_returned(State *st, void *closure)
{
    return PyLong_FromSsize_t(st->ret_len);
}

static PyGetSetDef state_getset[] = {
    {"current", (getter)state_get_current, NULL, "the call in flight, as a _Call, or None"},
    {"returned", (getter)state_get_returned, NULL,
     "how many calls returned since the last take_returned()"},
    {NULL},
};

static PyMethodDef state_methods[] = {
    {"append", (PyCFunction)state_append, METH_O,
     "append(record)\n\nQueue (fields,), an event, or (call, t_end, ok, error), a completed call."},
    {"take_returned", (PyCFunction)state_take_returned, METH_NOARGS,
     "take_returned()\n\n"
     "The calls that returned a Work (or a list of them), or were async, since the last take,\n"
     "in order: (call id, what it returned, async_op), or the call id alone once its caller\n"
     "waited on its Work and the backend completed it (Work.wait as the probe installs it)."},
    {"write", (PyCFunction)(void (*)(void))state_write, METH_FASTCALL,
     "write(fd)\n\n"
     "Take every record queued and write their JSON lines to fd, formatted with the line\n"
     "writer the State was made with, then its in_flight()'s line (a str, or None for none);\n"
     "the GIL is released while writing."},
    {NULL},
};

/* --- The types --------------------------------------------------------------------------------- */

/* Every object a wrapper holds (its site slots too): its traverse and clear walk this list. */
#define WRAPPER_REFS(X)                                                                        \
    X(fn) X(spec) X(name) X(peer) X(state) X(enter) X(pg_cache) X(describe_group) X(seqs)      \
    X(sites) X(call_site) X(facts_id) X(ids) X(path_id) X(tensor_type) X(before) X(after)     \
    X(failed)                                                                                  \
    X(dict) X(kw_seen)                                                                         \
    for (int i = 0; i < SITE_SLOTS; i++) {                                                     \
        X(sites_seen[i].code) X(sites_seen[i].info) X(sites_seen[i].counter)                   \
        X(sites_seen[i].facts)                                                                 \
    }
#define VISIT(field) Py_VISIT(o->field);
#define CLEAR(field) Py_CLEAR(o->field);
static int
wrapper_traverse(Wrapper *o, visitproc visit, void *arg)
{
    WRAPPER_REFS(VISIT)
    return 0;
}

static int
wrapper_clear(Wrapper *o)
{
    WRAPPER_REFS(CLEAR)
    return 0;
}
#undef VISIT
#undef CLEAR

/* Both GC types' dealloc: untrack, drop what the object holds, free. */
static void
gc_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    Py_TYPE(self)->tp_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *
wrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"fn",   "spec",        "probe",       "before",
                             "after", "tensor_type", "tensor_meta", NULL};
    PyObject *fn, *spec, *probe, *before, *after, *tensor_type, *meta = Py_None;
    tensor_meta_fn read = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OOOO!|O:Wrapper", kwlist, &fn, &PyTuple_Type,
                                     &spec, &probe, &before, &after, &PyType_Type, &tensor_type,
                                     &meta))
        return NULL;
    if (meta != Py_None &&
        (read = (tensor_meta_fn)PyCapsule_GetPointer(meta, TENSOR_META_CAPSULE)) == NULL)
        return NULL;
    if (PyTuple_GET_SIZE(spec) != 8) {
        PyErr_SetString(PyExc_TypeError, "Wrapper: the spec must be an 8-field _Spec");
        return NULL;
    }
    Wrapper *w = (Wrapper *)type->tp_alloc(type, 0);
    if (w == NULL)
        return NULL;
    w->fn = Py_NewRef(fn);
    w->spec = Py_NewRef(spec);
    w->name = Py_NewRef(PyTuple_GET_ITEM(spec, 0));
    w->group_at = index_of(spec, 1);
    PyObject *peer = PyTuple_GET_ITEM(spec, 2);
    w->peer = peer == Py_None ? NULL : Py_NewRef(peer);
    for (int k = 0; k < N_KW; k++) /* no keywords seen yet (kw_seen NULL: none passed) */
        w->kw_at[k] = -1;
    w->peer_at = index_of(spec, 3);
    w->async_at = index_of(spec, 4);
    w->always_async = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 5)) == 1;
    w->p2p = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 7)) == 1;
    w->before = before == Py_None ? NULL : Py_NewRef(before);
    w->after = after == Py_None ? NULL : Py_NewRef(after);
    w->tensor_type = Py_NewRef(tensor_type);
    /* spec.one_tensor */
    if (PyObject_IsTrue(PyTuple_GET_ITEM(spec, 6)) == 1 && w->before == NULL && w->after == NULL)
        w->vectorcall = (vectorcallfunc)wrapper_vectorcall;
    w->shape = find_getter(tensor_type, s_shape);
    w->dtype = find_getter(tensor_type, s_dtype);
    if (w->dtype.get == NULL)
        w->shape.get = NULL;
    w->meta = read;
    /* What it shares with the probe. */
    struct {
        PyObject **slot;
        const char *name;
    } shared[] = {
        {(PyObject **)&w->state, "_state"},
        {&w->enter, "_enter"},
        {&w->pg_cache, "_pg_cache"},
        {&w->describe_group, "_describe_group"},
        {&w->seqs, "_seqs"},
        {&w->sites, "_sites"},
        {&w->call_site, "_call_site"},
        {&w->facts_id, "_facts_id"},
        {&w->path_id, "_path_id"},
        {&w->ids, "_ids"},
        {&w->failed, "_call_failed"},
    };
    for (size_t i = 0; i < sizeof shared / sizeof *shared; i++) {
        if ((*shared[i].slot = PyObject_GetAttrString(probe, shared[i].name)) == NULL) {
            Py_DECREF(w);
            return NULL;
        }
    }
    if (!PyObject_TypeCheck(w->state, &StateType) || !PyDict_Check(w->pg_cache) ||
        !PyDict_Check(w->seqs) || !PyDict_Check(w->sites) || !PyIter_Check(w->ids)) {
        PyErr_SetString(PyExc_TypeError,
                        "Wrapper: the probe's state must be a State and its caches dicts");
        Py_DECREF(w);
        return NULL;
    }
    return (PyObject *)w;
}

static PyObject *
wrapper_repr(Wrapper *w)
{
    return PyUnicode_FromFormat("<rankscope probe wrapper of %R>", w->fn);
}

static PyTypeObject WrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rankscope.probe._fast.Wrapper",
    .tp_doc = "Wrapper(fn, spec, probe, before, after, tensor_type)\n\n"
              "Records each call of fn with the probe; see rankscope/probe/_core.py.",
    .tp_basicsize = sizeof(Wrapper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = wrapper_new,
    .tp_call = (ternaryfunc)wrapper_call,
    .tp_vectorcall_offset = offsetof(Wrapper, vectorcall),
    .tp_traverse = (traverseproc)wrapper_traverse,
    .tp_clear = (inquiry)wrapper_clear,
    .tp_dealloc = gc_dealloc,
    .tp_repr = (reprfunc)wrapper_repr,
    .tp_dictoffset = offsetof(Wrapper, dict),
    .tp_getset = dict_getset,
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
};

static PyTypeObject StateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rankscope.probe._fast.State",
    .tp_doc = "State(call_type, ring=None)\n\n"
              "What the probe's wrappers and its thread share: the records not yet written, the "
              "call in flight, the count of calls done, and the ring file's map, where each call "
              "is written as it is entered and as it returns.",
    .tp_basicsize = sizeof(State),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = state_new,
    .tp_traverse = (traverseproc)state_traverse,
    .tp_clear = (inquiry)state_clear,
    .tp_dealloc = gc_dealloc,
    .tp_methods = state_methods,
    .tp_getset = state_getset,
    .tp_members = state_members,
};

static PyObject *
counter_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"start", NULL};
    long long start = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|L:Counter", kwlist, &start))
        return NULL;
    Counter *c = (Counter *)type->tp_alloc(type, 0);
    if (c != NULL)
        c->next = start;
    return (PyObject *)c;
}

static PyObject *
counter_next(Counter *c)
{
    return PyLong_FromLongLong(c->next++);
}

static PyObject *
counter_repr(Counter *c)
{
    return PyUnicode_FromFormat("Counter(%lld)", c->next);
}

static PyTypeObject CounterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rankscope.probe._fast.Counter",
    .tp_doc = "Counter(start=0)\n\nnext() gives start, start + 1, ... (as itertools.count).",
    .tp_basicsize = sizeof(Counter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = counter_new,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)counter_next,
    .tp_repr = (reprfunc)counter_repr,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rankscope.probe._fast",
    .m_doc = "The probe's wrapper and records in C (optional: _core.py falls back to Python).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__fast(void)
{
    if (PyType_Ready(&WrapperType) < 0 || PyType_Ready(&StateType) < 0 ||
        PyType_Ready(&CounterType) < 0 || PyType_Ready(&WaitHookType) < 0)
        return NULL;
#define INTERN(var, text)                                                                      \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                      \
        return NULL;
    INTERN(s_group, "group");
    INTERN(s_tensor, "tensor");
    INTERN(s_async_op, "async_op");
    INTERN(s_shape, "shape");
    INTERN(s_dtype, "dtype");
    INTERN(s_is_completed, "is_completed");
#undef INTERN
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    /* The field layouts this module reads by position: the Python side uses the module only
     * where its _Call and _Spec have these fields in this order. */
    PyObject *call_fields = Py_BuildValue("(sssssssssssssss)", "cid", "seq", "t", "tid", "op",
                                          "pg", "pg_desc", "pg_ranks", "peer", "shapes", "dtypes",
                                          "async_op", "site", "path", "fid");
    PyObject *spec_fields = Py_BuildValue("(ssssssss)", "name", "group_at", "peer", "peer_at",
                                          "async_at", "always_async", "one_tensor", "p2p");
    int added = call_fields != NULL && spec_fields != NULL &&
                PyModule_AddObjectRef(m, "CALL_FIELDS", call_fields) == 0 &&
                PyModule_AddObjectRef(m, "SPEC_FIELDS", spec_fields) == 0;
    Py_XDECREF(call_fields);
    Py_XDECREF(spec_fields);
    if (!added) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddStringConstant(m, "TENSOR_META", TENSOR_META_CAPSULE) < 0 ||
        PyModule_AddObjectRef(m, "Wrapper", (PyObject *)&WrapperType) < 0 ||
        PyModule_AddObjectRef(m, "State", (PyObject *)&StateType) < 0 ||
        PyModule_AddObjectRef(m, "Counter", (PyObject *)&CounterType) < 0 ||
        PyModule_AddObjectRef(m, "WaitHook", (PyObject *)&WaitHookType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
