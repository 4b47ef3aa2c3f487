/* The probe's wrapper around a torch.distributed call, in C.
 *
 * The Python wrapper in _core.py does the same thing. Right after a collective returns, the
 * rank's caches are cold and every Python step costs several times what it costs in a warm
 * loop; this type takes the common case (one tensor argument: all_reduce, broadcast, send,
 * ...) in a few dozen C steps and hands every other call to the probe's Python ``_enter``.
 *
 * What it shares with the Probe object (looked up once, when the wrapper is made): the probe's
 * State (below: the queue, the call in flight, the count of calls done), the group cache and
 * ``_describe_group``, the per-group sequence counters, the call-site cache and ``_call_site``,
 * and the call-id counter. A recorded call is a ``_Call`` tuple; its exit record is
 * ``(call, t_end, ok, error)``.
 *
 * Every step here is paid right after a collective returns, and on a busy machine a rank's
 * microsecond delays its peers by several: a call touches few objects (the State's fields are
 * plain C, not entries of the probe's __dict__; a call site's shapes are reused while they
 * repeat) and allocates little.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <math.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

/* A call made while a recorded call is running on the same thread (a collective that calls
 * another, a hook) is passed straight through, as in the Python wrapper. */
static _Thread_local int busy;

static PyObject *one;
static PyObject *s_group, *s_tensor, *s_async_op, *s_shape, *s_dtype;

/* What the wrappers and the probe thread share: Probe._state. */
typedef struct {
    PyObject_HEAD
    PyObject *queue;   /* a list of records; the probe's flush swaps in an empty one */
    PyObject *current; /* the call in flight (the last one entered); None or NULL: none */
    Py_ssize_t done;   /* calls completed */
} State;

static PyTypeObject StateType;

#define SITE_SLOTS 8

/* A call site seen lately, and the (shape,) and (dtype,) tuples of its last call. */
typedef struct {
    PyObject *code, *site, *shapes, *dtypes;
    long lasti;
} SiteSlot;

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
    int always_async, one_tensor;
    PyObject *enter;
    State *state;
    PyObject *pg_cache, *describe_group, *seqs, *sites, *call_site, *ids;
    PyObject *tensor_type, *call_type, *count_type;
    PyObject *before, *after;  /* hooks: before(args, kwargs) and after(), or NULL */
    PyObject *dict;            /* __wrapped__, __name__, __rankscope__, ... */
    Getter shape, dtype;       /* torch.Tensor's getters of .shape and .dtype */
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

/* kwargs[key], else args[at], else NULL (borrowed; None counts as absent). */
static PyObject *
argument(PyObject *args, PyObject *kwargs, PyObject *key, Py_ssize_t at)
{
    PyObject *v = NULL;
    if (kwargs != NULL && key != NULL) {
        v = PyDict_GetItemWithError(kwargs, key);
        if (v == NULL && PyErr_Occurred())
            return NULL;
    }
    if ((v == NULL || v == Py_None) && at >= 0 && at < PyTuple_GET_SIZE(args))
        v = PyTuple_GET_ITEM(args, at);
    return v == Py_None ? NULL : v;
}

/* The one-tensor case of Probe._enter: a new _Call, or NULL with an exception set. */
static PyObject *
fast_enter(Wrapper *w, PyObject *args, PyObject *kwargs, PyFrameObject *frame)
{
    PyObject *group, *peer, *tensor, *info, *counter, *seq = NULL, *shapes = NULL, *dtypes = NULL;
    PyObject *site = NULL, *key = NULL, *code = NULL, *lasti = NULL, *cid = NULL, *t = NULL;
    PyObject *call = NULL, *pg, *shape = NULL, *dtype = NULL;
    SiteSlot *slot = NULL;
    long at = -1;
    int async_op;

    group = argument(args, kwargs, s_group, w->group_at);
    if (group == NULL && PyErr_Occurred())
        return NULL;
    peer = w->peer != NULL ? argument(args, kwargs, w->peer, w->peer_at) : NULL;
    if (peer == NULL && PyErr_Occurred())
        return NULL;
    tensor = argument(args, kwargs, s_tensor, 0);
    if (tensor == NULL && PyErr_Occurred())
        return NULL;

    /* The call site's slot: a few per wrapper, compared by identity (hashing a code object
     * hashes its constants and names). */
    if (frame != NULL) {
        code = (PyObject *)PyFrame_GetCode(frame);
        at = frame_lasti(frame);
        if (at == -1 && PyErr_Occurred())
            goto done;
        slot = &w->sites_seen[(((uintptr_t)code >> 4) ^ (uintptr_t)at) % SITE_SLOTS];
        if (slot->code == code && slot->lasti == at)
            site = Py_NewRef(slot->site);
    }

    /* Records live until the probe thread's next flush, long enough to leave the collector's
     * youngest generation; in a process holding torch's hundreds of thousands of objects, five
     * more survivors per call bring a full collection every few thousand calls (several
     * microseconds per call). Records are untracked: they hold ints, strings, torch.Size and
     * the probe's own cached values, and no cycle can run through them. */
    if (tensor != NULL && PyObject_TypeCheck(tensor, (PyTypeObject *)w->tensor_type)) {
        if (Py_TYPE(tensor) == (PyTypeObject *)w->tensor_type && w->shape.get != NULL) {
            /* torch.Tensor itself: its getters, without the attribute lookup */
            shape = w->shape.get(tensor, w->shape.closure);
            dtype = shape ? w->dtype.get(tensor, w->dtype.closure) : NULL;
        }
        else {
            shape = PyObject_GetAttr(tensor, s_shape);
            dtype = shape ? PyObject_GetAttr(tensor, s_dtype) : NULL;
        }
        if (dtype == NULL)
            goto done;
        if (site != NULL && slot->dtypes != NULL && PyTuple_GET_ITEM(slot->dtypes, 0) == dtype) {
            /* the site's last shapes, if this call's are the same */
            int same = PyObject_RichCompareBool(shape, PyTuple_GET_ITEM(slot->shapes, 0), Py_EQ);
            if (same < 0)
                goto done;
            if (same) {
                shapes = Py_NewRef(slot->shapes);
                dtypes = Py_NewRef(slot->dtypes);
            }
        }
        if (shapes == NULL) {
            if (PyTuple_Check(shape))
                PyObject_GC_UnTrack(shape);
            if ((shapes = PyTuple_Pack(1, shape)) == NULL ||
                (dtypes = PyTuple_Pack(1, dtype)) == NULL)
                goto done;
            PyObject_GC_UnTrack(shapes);
            PyObject_GC_UnTrack(dtypes);
        }
    }
    else {
        shapes = PyTuple_New(0);
        dtypes = PyTuple_New(0);
        if (shapes == NULL || dtypes == NULL)
            goto done;
    }

    /* (name, desc, ranks) of the group: cached per group object, None for the default one. */
    info = PyDict_GetItemWithError(w->pg_cache, group ? group : Py_None);
    if (info != NULL)
        Py_INCREF(info);
    else if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError))
        goto done;
    else {
        PyErr_Clear();
        info = PyObject_CallOneArg(w->describe_group, group ? group : Py_None);
        if (info == NULL)
            goto done;
    }
    if (!PyTuple_Check(info) || PyTuple_GET_SIZE(info) != 3) {
        PyErr_SetString(PyExc_TypeError, "group description is not a 3-tuple");
        Py_DECREF(info);
        goto done;
    }
    pg = PyTuple_GET_ITEM(info, 0);
    counter = PyDict_GetItemWithError(w->seqs, pg);
    if (counter == NULL) {
        if (PyErr_Occurred())
            goto done_info;
        counter = PyObject_CallOneArg(w->count_type, one);
        if (counter == NULL || PyDict_SetItem(w->seqs, pg, counter)) {
            Py_XDECREF(counter);
            goto done_info;
        }
        Py_DECREF(counter);
    }
    seq = PyIter_Next(counter);
    if (seq == NULL)
        goto done_info;

    if (w->always_async)
        async_op = 1;
    else {
        PyObject *a = argument(args, kwargs, s_async_op, w->async_at);
        if (a == NULL && PyErr_Occurred())
            goto done_info;
        async_op = a != NULL && PyObject_IsTrue(a) == 1;
    }

    /* A site not in its slot: in the probe's dict, else worked out by _call_site. */
    if (frame == NULL) {
        if ((site = PyTuple_Pack(3, Py_None, Py_None, Py_None)) == NULL)
            goto done_info;
    }
    else if (site == NULL) {
        lasti = PyLong_FromLong(at);
        if (lasti == NULL || (key = PyTuple_Pack(2, code, lasti)) == NULL)
            goto done_info;
        site = PyDict_GetItemWithError(w->sites, key);
        if (site != NULL)
            Py_INCREF(site);
        else if (PyErr_Occurred())
            goto done_info;
        else if ((site = PyObject_CallOneArg(w->call_site, (PyObject *)frame)) == NULL)
            goto done_info;
        Py_XSETREF(slot->code, Py_NewRef(code));
        Py_XSETREF(slot->site, Py_NewRef(site));
        slot->lasti = at;
    }
    if (slot != NULL && PyTuple_GET_SIZE(shapes) == 1 && slot->shapes != shapes) {
        Py_XSETREF(slot->shapes, Py_NewRef(shapes));
        Py_XSETREF(slot->dtypes, Py_NewRef(dtypes));
    }

    cid = PyIter_Next(w->ids);
    if (cid == NULL || (t = PyFloat_FromDouble(now())) == NULL)
        goto done_info;
    call = ((PyTypeObject *)w->call_type)->tp_alloc((PyTypeObject *)w->call_type, 12);
    if (call == NULL)
        goto done_info;
    PyObject *items[12] = {
        cid, w->name, pg, PyTuple_GET_ITEM(info, 1), PyTuple_GET_ITEM(info, 2), seq,
        peer ? peer : Py_None, shapes, dtypes, async_op ? Py_True : Py_False, site, t,
    };
    for (int i = 0; i < 12; i++) {
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(call, i, items[i]);
    }
    PyObject_GC_UnTrack(call);
    Py_XSETREF(w->state->current, Py_NewRef(call));

done_info:
    Py_DECREF(info);
done:
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(shapes);
    Py_XDECREF(dtypes);
    Py_XDECREF(seq);
    Py_XDECREF(site);
    Py_XDECREF(key);
    Py_XDECREF(code);
    Py_XDECREF(lasti);
    Py_XDECREF(cid);
    Py_XDECREF(t);
    return call;
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

/* Queue the exit record (call, t_end, ok, error) and clear the probe's current call. */
static int
record_exit(Wrapper *w, PyObject *call, PyObject *error)
{
    State *st = w->state;
    Py_XSETREF(st->current, Py_NewRef(Py_None));
    st->done++;
    PyObject *t = PyFloat_FromDouble(now());
    if (t == NULL)
        return -1;
    PyObject *item = PyTuple_Pack(4, call, t, error ? Py_False : Py_True, error ? error : Py_None);
    Py_DECREF(t);
    if (item == NULL)
        return -1;
    PyObject_GC_UnTrack(item); /* see fast_enter */
    int bad = PyList_Append(st->queue, item);
    Py_DECREF(item);
    return bad;
}

static PyObject *
wrapper_call(Wrapper *w, PyObject *args, PyObject *kwargs)
{
    if (busy)
        return PyObject_Call(w->fn, args, kwargs);
    busy = 1;
    PyObject *result = NULL, *call = NULL, *owned_kwargs = NULL;
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
    if (w->one_tensor)
        call = fast_enter(w, args, kwargs, frame);
    else
        call = PyObject_CallFunctionObjArgs(
            w->enter, w->spec, args, kwargs ? kwargs : Py_None,
            frame ? (PyObject *)frame : Py_None, NULL);
    if (call == NULL && PyErr_Occurred()) {
        /* The probe must never break the user's collective; only an Exception is swallowed. */
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            goto out;
        PyErr_Clear();
    }

    result = PyObject_Call(w->fn, args, kwargs);
    PyObject *error = result == NULL ? error_text() : NULL;
    /* The hook and the exit record run with the user's exception (if any) set aside, and
     * their own failures are dropped: the call's outcome is the user's. */
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    if (w->after != NULL)
        Py_XDECREF(PyObject_CallNoArgs(w->after));
    if (call != NULL)
        record_exit(w, call, error);
    PyErr_Clear();
    PyErr_Restore(exc_type, exc_value, exc_tb);
    Py_XDECREF(error);

out:
    Py_XDECREF(call);
    Py_XDECREF(owned_kwargs);
    busy = 0;
    return result;
}

/* --- lines: the probe thread's formatting of queued records ------------------------------ */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buffer;

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
put_int(Buffer *b, PyObject *v)
{
    char tmp[24], *end = tmp + sizeof tmp;
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    char *p = digits(end, x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x, 1);
    if (x < 0)
        *--p = '-';
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

/* The enter line of a completed call, as Probe._enter_line writes it, from its cached fragment.
 * The key is the one _enter_line caches the fragment under; a miss goes to _enter_line. */
static int
enter_line(Buffer *b, PyObject *call, PyObject *statics, PyObject *slow, PyObject *rank)
{
    PyObject *peer = PyTuple_GET_ITEM(call, 6), *fragment = NULL;
    if (peer == Py_None || PyLong_CheckExact(peer) || PyUnicode_CheckExact(peer)) {
        PyObject *key = PyTuple_Pack(7, PyTuple_GET_ITEM(call, 1), PyTuple_GET_ITEM(call, 2),
                                     PyTuple_GET_ITEM(call, 10), PyTuple_GET_ITEM(call, 7),
                                     PyTuple_GET_ITEM(call, 8), PyTuple_GET_ITEM(call, 9), peer);
        if (key == NULL)
            return -1;
        fragment = PyDict_GetItemWithError(statics, key);
        Py_DECREF(key);
        if (fragment == NULL && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) /* unhashable: the slow way */
                return -1;
            PyErr_Clear();
        }
    }
    if (fragment == NULL || !PyUnicode_Check(fragment))
        return put_call(b, PyObject_CallOneArg(slow, call));
    if (PUT(b, "{\"id\":") || put_int(b, PyTuple_GET_ITEM(call, 0)) || PUT(b, ",\"seq\":") ||
        put_int(b, PyTuple_GET_ITEM(call, 5)) || PUT(b, ",") || put_str(b, fragment) ||
        PUT(b, ",\"ev\":\"enter\",\"t\":") ||
        put_seconds(b, PyFloat_AsDouble(PyTuple_GET_ITEM(call, 11))) || PUT(b, ",\"rank\":") ||
        put_int(b, rank) || PUT(b, "}\n"))
        return -1;
    return 0;
}

/* The exit line, as Probe._exit_line writes it; an error text or a cache miss goes there. */
static int
exit_line(Buffer *b, PyObject *item, PyObject *statics, PyObject *slow, PyObject *rank)
{
    PyObject *call = PyTuple_GET_ITEM(item, 0), *t_end = PyTuple_GET_ITEM(item, 1);
    PyObject *fragment = NULL;
    if (PyTuple_GET_ITEM(item, 3) == Py_None && PyFloat_Check(t_end)) {
        PyObject *key = PyTuple_Pack(2, PyTuple_GET_ITEM(call, 1), PyTuple_GET_ITEM(call, 2));
        if (key == NULL)
            return -1;
        fragment = PyDict_GetItemWithError(statics, key);
        Py_DECREF(key);
        if (fragment == NULL && PyErr_Occurred())
            return -1;
    }
    if (fragment == NULL || !PyUnicode_Check(fragment))
        return put_call(b, PyObject_Vectorcall(slow, &PyTuple_GET_ITEM(item, 0), 4, NULL));
    double t = PyFloat_AS_DOUBLE(t_end);
    if (PUT(b, "{\"id\":") || put_int(b, PyTuple_GET_ITEM(call, 0)) || PUT(b, ",") ||
        put_str(b, fragment) || PUT(b, ",\"seq\":") || put_int(b, PyTuple_GET_ITEM(call, 5)) ||
        PUT(b, ",\"dur_s\":") || put_seconds(b, t - PyFloat_AsDouble(PyTuple_GET_ITEM(call, 11))) ||
        (PyTuple_GET_ITEM(item, 2) == Py_True ? PUT(b, ",\"ok\":true") : PUT(b, ",\"ok\":false")) ||
        PUT(b, ",\"error\":null,\"ev\":\"exit\",\"t\":") || put_seconds(b, t) ||
        PUT(b, ",\"rank\":") || put_int(b, rank) || PUT(b, "}\n"))
        return -1;
    return 0;
}

static int
is_call(PyObject *call)
{
    return PyTuple_Check(call) && PyTuple_GET_SIZE(call) == 12 &&
           PyFloat_Check(PyTuple_GET_ITEM(call, 11));
}

static PyObject *
lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "lines(records, entered, statics, enter_line, exit_line, event_line, rank)");
        return NULL;
    }
    PyObject *records = args[0], *entered = args[1], *statics = args[2], *slow_enter = args[3];
    PyObject *slow_exit = args[4], *event_line = args[5], *rank = args[6];
    if (!PyList_Check(records) || !PySet_Check(entered) || !PyDict_Check(statics)) {
        PyErr_SetString(PyExc_TypeError,
                        "lines: records must be a list, entered a set and statics a dict");
        return NULL;
    }
    Buffer b = {NULL, 0, 0};
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *item = Py_NewRef(PyList_GET_ITEM(records, i));
        Py_ssize_t mark = b.len;
        int bad;
        if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 1)
            bad = put_call(&b, PyObject_CallOneArg(event_line, PyTuple_GET_ITEM(item, 0)));
        else if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 4 &&
                 is_call(PyTuple_GET_ITEM(item, 0))) {
            PyObject *call = PyTuple_GET_ITEM(item, 0);
            int seen = PySet_Discard(entered, PyTuple_GET_ITEM(call, 0));
            bad = seen < 0 || (seen == 0 && enter_line(&b, call, statics, slow_enter, rank)) ||
                  exit_line(&b, item, statics, slow_exit, rank);
        }
        else {
            PyErr_SetString(PyExc_TypeError, "lines: a queued record of an unknown shape");
            bad = 1;
        }
        Py_DECREF(item);
        if (bad) {
            /* A record that cannot be written is dropped; the others are not. */
            if (PyErr_ExceptionMatches(PyExc_MemoryError))
                goto fail;
            PyErr_Clear();
            b.len = mark;
        }
    }
    out = PyBytes_FromStringAndSize(b.data, b.len);
fail:
    PyMem_Free(b.data);
    return out;
}

/* Every object each type holds (a wrapper's site slots too): its traverse and clear, made by
 * GC_METHODS, walk this one list. */
#define WRAPPER_REFS(X)                                                                        \
    X(fn) X(spec) X(name) X(peer) X(state) X(enter) X(pg_cache) X(describe_group) X(seqs)      \
    X(sites) X(call_site) X(ids) X(tensor_type) X(call_type) X(count_type) X(before) X(after)  \
    X(dict)                                                                                    \
    for (int i = 0; i < SITE_SLOTS; i++) {                                                     \
        X(sites_seen[i].code) X(sites_seen[i].site) X(sites_seen[i].shapes)                    \
        X(sites_seen[i].dtypes)                                                                \
    }
#define STATE_REFS(X) X(queue) X(current)

#define VISIT(field) Py_VISIT(o->field);
#define CLEAR(field) Py_CLEAR(o->field);
#define GC_METHODS(prefix, Type, REFS)                                                         \
    static int prefix##_traverse(Type *o, visitproc visit, void *arg)                         \
    {                                                                                          \
        REFS(VISIT) return 0;                                                                  \
    }                                                                                          \
    static int prefix##_clear(Type *o)                                                         \
    {                                                                                          \
        REFS(CLEAR) return 0;                                                                  \
    }
GC_METHODS(wrapper, Wrapper, WRAPPER_REFS)
GC_METHODS(state, State, STATE_REFS)
#undef VISIT
#undef CLEAR

/* Both types' dealloc: untrack, drop what the object holds, free. */
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
    static char *kwlist[] = {"fn", "spec", "probe", "before", "after", "tensor_type",
                             "call_type", "count_type", NULL};
    PyObject *fn, *spec, *probe, *before, *after, *tensor_type, *call_type, *count_type;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OOOOOO:Wrapper", kwlist, &fn, &PyTuple_Type,
                                     &spec, &probe, &before, &after, &tensor_type, &call_type,
                                     &count_type))
        return NULL;
    if (PyTuple_GET_SIZE(spec) != 7 || !PyType_Check(tensor_type) || !PyType_Check(call_type)) {
        PyErr_SetString(PyExc_TypeError, "Wrapper: a 7-field spec and two types are needed");
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
    w->peer_at = index_of(spec, 3);
    w->async_at = index_of(spec, 4);
    w->always_async = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 5)) == 1;
    w->one_tensor = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 6)) == 1;
    w->before = before == Py_None ? NULL : Py_NewRef(before);
    w->after = after == Py_None ? NULL : Py_NewRef(after);
    w->tensor_type = Py_NewRef(tensor_type);
    w->call_type = Py_NewRef(call_type);
    w->count_type = Py_NewRef(count_type);
    w->shape = find_getter(tensor_type, s_shape);
    w->dtype = find_getter(tensor_type, s_dtype);
    if (w->dtype.get == NULL)
        w->shape.get = NULL;
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
        {&w->ids, "_ids"},
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

static PyGetSetDef wrapper_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {NULL},
};

static PyTypeObject WrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rankscope.probe._fast.Wrapper",
    .tp_doc = "Wrapper(fn, spec, probe, before, after, tensor_type, call_type, count_type)\n\n"
              "Records each call of fn with the probe; see rankscope/probe/_core.py.",
    .tp_basicsize = sizeof(Wrapper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = wrapper_new,
    .tp_call = (ternaryfunc)wrapper_call,
    .tp_traverse = (traverseproc)wrapper_traverse,
    .tp_clear = (inquiry)wrapper_clear,
    .tp_dealloc = gc_dealloc,
    .tp_repr = (reprfunc)wrapper_repr,
    .tp_dictoffset = offsetof(Wrapper, dict),
    .tp_getset = wrapper_getset,
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
};

/* --- State --------------------------------------------------------------------------------- */

static PyObject *
state_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "State() takes no arguments");
        return NULL;
    }
    State *st = (State *)type->tp_alloc(type, 0);
    if (st == NULL)
        return NULL;
    st->current = Py_NewRef(Py_None);
    if ((st->queue = PyList_New(0)) == NULL) {
        Py_DECREF(st);
        return NULL;
    }
    return (PyObject *)st;
}

static PyObject *
state_get_queue(State *st, void *closure)
{
    return Py_NewRef(st->queue);
}

static int
state_set_queue(State *st, PyObject *value, void *closure)
{
    if (value == NULL || !PyList_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "State.queue must be a list");
        return -1;
    }
    Py_SETREF(st->queue, Py_NewRef(value));
    return 0;
}

static PyMemberDef state_members[] = {
    {"current", T_OBJECT, offsetof(State, current), 0, "the call in flight, or None"},
    {"done", T_PYSSIZET, offsetof(State, done), 0, "calls completed"},
    {NULL},
};

static PyGetSetDef state_getset[] = {
    {"queue", (getter)state_get_queue, (setter)state_set_queue,
     "records not yet written (a list; the flush takes it and puts an empty one)"},
    {NULL},
};

static PyTypeObject StateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rankscope.probe._fast.State",
    .tp_doc = "State()\n\nWhat the probe's wrappers and its thread share: queue, current, done.",
    .tp_basicsize = sizeof(State),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = state_new,
    .tp_traverse = (traverseproc)state_traverse,
    .tp_clear = (inquiry)state_clear,
    .tp_dealloc = gc_dealloc,
    .tp_getset = state_getset,
    .tp_members = state_members,
};

static PyMethodDef methods[] = {
    {"lines", (PyCFunction)(void (*)(void))lines, METH_FASTCALL,
     "lines(records, entered, statics, enter_line, exit_line, event_line, rank) -> bytes\n\n"
     "The records' JSON lines, as Probe.flush writes them."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_methods = methods,
    .m_name = "rankscope.probe._fast",
    .m_doc = "The probe's wrapper in C (optional: _core.py falls back to Python without it).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__fast(void)
{
    if (PyType_Ready(&WrapperType) < 0 || PyType_Ready(&StateType) < 0)
        return NULL;
#define INTERN(var, text)                                                                      \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                      \
        return NULL;
    INTERN(s_group, "group");
    INTERN(s_tensor, "tensor");
    INTERN(s_async_op, "async_op");
    INTERN(s_shape, "shape");
    INTERN(s_dtype, "dtype");
    if ((one = PyLong_FromLong(1)) == NULL)
        return NULL;
#undef INTERN
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Wrapper", (PyObject *)&WrapperType) < 0 ||
        PyModule_AddObjectRef(m, "State", (PyObject *)&StateType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
