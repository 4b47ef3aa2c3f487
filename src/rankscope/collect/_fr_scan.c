/* A compiled reader of flight-recorder pickles: the dump's entries straight to columns.
 *
 * scan(data, int_fields, float_field, bool_fields, coded_fields, head_keys) runs the pickle's
 * opcodes on values of its own (numbers, spans of the input for strings, containers in a table):
 * no Python object is made for an entry. It knows only the opcodes that build plain containers
 * and scalars; anything else (a global, a call, a set, bytes, a protocol-0 text opcode), and
 * anything the restricted unpickler would refuse or that it is unsure of (an unbalanced stack, a
 * memo index out of bounds, bad UTF-8, a length past the end, an entry that is not a dict, a
 * number field that is not a number), makes it return None: the caller then reads the dump with
 * the restricted unpickler, which gives the same table or names the problem. Nothing is ever
 * imported or called.
 *
 * It returns (head, n, ints, masks, floats, bools, coded):
 *   head    the top-level values named in head_keys, as Python objects (a small part of a dump)
 *   ints    one bytes of n int64 per int field (0 where missing or None), masks one bytes of n
 *           flags (1: missing or None);
 *   floats  n float64 of float_field (NaN where missing or None);
 *   bools   one bytes of n int8 per bool field (1 True, 0 False, -1 anything else);
 *   coded   per coded field (distinct, at): the field's distinct values as Python objects, in
 *           order of first appearance (a value the pickle stores once is one object however
 *           many entries refer to it), and n int32 indices into them. *
 * With machinery (a tuple of texts) it also returns (paths, at, bad): each entry's call path from
 * its ``frames`` (innermost first, dicts of name, filename and line): the frames outermost first,
 * those whose file contains one of the texts left out, the innermost `depth` kept; `paths` the
 * distinct ones as tuples of (filename, name, line), `at` n int32 indices into them (-1: no
 * frames, or only the machinery's), `bad` how many entries' frames are malformed (no path).
 * A frame dict gets its id as it is made, and keeps no items (a heavy dump holds 20 times more
 * frame dicts than entries; one read at once by small_dict has no container at all); one found anywhere else than in the frames, or set again after it
 * was made, leaves the dump to the restricted unpickler. A file text is looked for in the
 * machinery once per distinct text, however many times the dump writes it.
 * _fr_parse.entry_paths is the same in Python.
 * With frames_max > 0 (and machinery) it also returns the entries' frames themselves, as
 * _fr_parse.parse_frames reads them: (frames, entry, depth, code), the distinct frames met as
 * (name, filename, line) in the order met, and for each dict among the first frames_max items
 * of an entry's frames list its entry, its place in the list and its frame (int32 bytes each).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* T_FRAME: a frame dict read by small_dict, its frame id in u.c and no box (made of nothing
 * else: a dict that is a frame when made is read as one, and can be set no more). */
enum {
    T_NONE = 0,
    T_TRUE,
    T_FALSE,
    T_INT,
    T_FLOAT,
    T_STR,
    T_LIST,
    T_TUPLE,
    T_DICT,
    T_FRAME,
    T_MARK_UNSET
};

/* A value: scalars inline; a string is a span of the input; a container an index in the table. */
typedef struct {
    uint8_t type;
    union {
        int64_t i;
        double f;
        struct {
            uint32_t off, len;
        } s;
        int32_t c;
    } u;
} Val;

typedef struct {
    uint8_t type; /* T_LIST, T_TUPLE or T_DICT (items as key, value pairs) */
    /* A frame dict (a dict made at once of "filename", "name" and "line", a text, a text and a
     * number, as every frame of an entry's stack is): its frame id + 3, as frame_id gives it,
     * and no items (a heavy dump holds 20 times more of them than entries); 0 for any other. */
    int32_t frame;
    /* A list read in one go (list_read): where its items were written, from its MARK to its
     * APPENDS (span_len 0: not known). Two such lists written alike are equal while no memo
     * entry was ever set twice (Scan.memo_reset): see by_span. */
    uint32_t span_off, span_len;
    Py_ssize_t len, cap;
    Val *items;
} Box;

typedef struct Paths Paths;

typedef struct {
    Val *v;
    Py_ssize_t len, cap;
} Vec;

typedef struct {
    const unsigned char *data;
    Py_ssize_t size, pos;
    Vec stack, memo;
    Py_ssize_t *marks;
    Py_ssize_t nmarks, capmarks, memo_set;
    int memo_reset; /* a memo entry was set again: equal writes may be unequal values */
    Box *boxes;
    Py_ssize_t nboxes, capboxes;
    /* Containers' items come from blocks of BLOCK_VALS values (a dump's 2000 entries are as
     * many small containers: a malloc and free each cost more than the rest of them); a longer
     * one gets its own allocation, in `big`. */
    Val **blocks, **big;
    Py_ssize_t nblocks, capblocks, used, nbig, capbig, block_left;
    Val *block_next;
    Paths *paths; /* where frame dicts get their ids as they are made; NULL: no paths asked */
} Scan;

/* The buffers of the last scan, kept for the next one (a fresh megabyte for each dump costs
 * more in page faults than the scan itself); only touched with the GIL held. */
static Scan spare;
static int spare_full;
/* Buffers kept for the next scan only up to these sizes, so that memory stays bounded. */
#define SPARE_BLOCKS 256
#define SPARE_VALS (1 << 16)

/* Memo indices past this are left to the restricted unpickler (no real dump comes near). */
#define MEMO_MAX (1 << 22)
/* Containers nested deeper than this are left to it too when made into Python objects. */
#define DEPTH_MAX 100

static int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap)
        return 0;
    Py_ssize_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, (size_t)n * item);
    if (!q)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

static inline int push(Vec *s, Val v) {
    if (s->len >= s->cap && grow((void **)&s->v, &s->cap, s->len + 1, sizeof(Val)))
        return -1;
    s->v[s->len++] = v;
    return 0;
}

static int new_box(Scan *S, uint8_t type, Val *out) {
    if (grow((void **)&S->boxes, &S->capboxes, S->nboxes + 1, sizeof(Box)))
        return -1;
    Box *b = &S->boxes[S->nboxes];
    b->type = type;
    b->frame = 0;
    b->span_len = 0;
    b->len = b->cap = 0;
    b->items = NULL;
    out->type = type;
    out->u.c = (int32_t)S->nboxes++;
    return 0;
}

#define BLOCK_VALS 4000 /* 64 KB: under malloc's threshold for a fresh mmap */

static Val *take(Scan *S, Py_ssize_t n) {
    if (n > S->block_left) {
        Val *block;
        if (n > BLOCK_VALS) {
            if (grow((void **)&S->big, &S->capbig, S->nbig + 1, sizeof(Val *)) ||
                !(block = malloc((size_t)n * sizeof(Val))))
                return NULL;
            S->big[S->nbig++] = block;
            return block;
        }
        if (S->used == S->nblocks) {
            if (grow((void **)&S->blocks, &S->capblocks, S->nblocks + 1, sizeof(Val *)) ||
                !(block = malloc(BLOCK_VALS * sizeof(Val))))
                return NULL;
            S->blocks[S->nblocks++] = block;
        }
        S->block_next = S->blocks[S->used++];
        S->block_left = BLOCK_VALS;
    }
    Val *out = S->block_next;
    S->block_next += n;
    S->block_left -= n;
    return out;
}

static int box_add(Scan *S, int32_t c, const Val *v, Py_ssize_t n) {
    Box *b = &S->boxes[c];
    if (b->len + n > b->cap) { /* a new place twice as large; the old one is left in its block */
        Py_ssize_t cap = b->cap ? b->cap : n > 4 ? n : 4; /* at first, the items given */
        while (cap < b->len + n)
            cap *= 2;
        Val *items = take(S, cap);
        if (!items)
            return -1;
        if (b->len)
            memcpy(items, b->items, (size_t)b->len * sizeof(Val));
        b->items = items;
        b->cap = cap;
    }
    memcpy(b->items + b->len, v, (size_t)n * sizeof(Val));
    b->len += n;
    return 0;
}

/* UTF-8 as Python's pickle decodes it ("surrogatepass": encoded surrogates are accepted). */
static int utf8_ok(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        uint64_t eight; /* plain ASCII (a world's member list is 100 kB of it), 8 at a time */
        if (i + 8 <= n && (memcpy(&eight, p + i, 8), !(eight & 0x8080808080808080ULL))) {
            i += 8;
            continue;
        }
        unsigned char c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int k;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            k = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            if (c == 0xE0)
                lo = 0xA0;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            if (c == 0xF0)
                lo = 0x90;
            if (c == 0xF4)
                hi = 0x8F;
        } else
            return 0;
        if (i + k >= n)
            return 0;
        if (p[i + 1] < lo || p[i + 1] > hi)
            return 0;
        for (int j = 2; j <= k; j++)
            if (p[i + j] < 0x80 || p[i + j] > 0xBF)
                return 0;
        i += k + 1;
    }
    return 1;
}

static int need(Scan *S, Py_ssize_t n) { return n >= 0 && S->size - S->pos >= n; }

static inline uint64_t le(const unsigned char *p, int n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    switch (n) { /* the widths of the opcodes' arguments, each read at once */
    case 1:
        return p[0];
    case 2: {
        uint16_t w;
        memcpy(&w, p, 2);
        return w;
    }
    case 4: {
        uint32_t w;
        memcpy(&w, p, 4);
        return w;
    }
    case 8: {
        uint64_t w;
        memcpy(&w, p, 8);
        return w;
    }
    }
#endif
    uint64_t x = 0;
    for (int i = n - 1; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

/* BININT1, BININT2, BININT (op K, M, J): the int whose argument starts at arg, with left bytes
 * of input from there; its width in bytes, 0 where the input ends first. */
static int bin_int(unsigned char op, const unsigned char *arg, Py_ssize_t left, Val *v) {
    int w = op == 'K' ? 1 : op == 'M' ? 2 : 4;
    if (left < w)
        return 0;
    uint64_t raw = le(arg, w);
    v->type = T_INT;
    v->u.i = op == 'J' ? (int64_t)(int32_t)(uint32_t)raw : (int64_t)raw;
    return w;
}

/* The scalar whose opcode is at d (None, a bool, BININT1, BININT2, BININT, LONG1 or LONG4 of at
 * most 8 bytes, BINFLOAT), with left bytes of input after the opcode: *v and the width of its
 * argument; -1 for another opcode, or where the input ends first. */
static int scalar(const unsigned char *d, Py_ssize_t left, Val *v) {
    const unsigned char op = d[0], *a = d + 1;
    switch (op) {
    case 'N':
        v->type = T_NONE;
        return 0;
    case 0x88:
    case 0x89:
        v->type = op == 0x88 ? T_TRUE : T_FALSE;
        return 0;
    case 'K':
    case 'M':
    case 'J': {
        int w = bin_int(op, a, left, v);
        return w ? w : -1;
    }
    case 0x8a:
    case 0x8b: { /* LONG1, LONG4: what fits in 64 bits */
        int w = op == 0x8a ? 1 : 4;
        if (left < w)
            return -1;
        uint64_t n = le(a, w);
        if (n > 8 || (uint64_t)(left - w) < n)
            return -1;
        v->type = T_INT;
        v->u.i = 0;
        if (n) {
            uint64_t x = le(a + w, (int)n);
            if (n < 8 && (a[w + n - 1] & 0x80))
                x |= ~(uint64_t)0 << (8 * n);
            v->u.i = (int64_t)x;
        }
        return w + (int)n;
    }
    case 'G': { /* BINFLOAT, big-endian */
        if (left < 8)
            return -1;
        uint64_t x = 0;
        for (int i = 0; i < 8; i++)
            x = (x << 8) | a[i];
        memcpy(&v->u.f, &x, 8);
        v->type = T_FLOAT;
        return 8;
    }
    }
    return -1;
}

/* The opcode's argument: an unsigned little-endian number of w bytes. */
static int arg(Scan *S, int w, uint64_t *out) {
    if (!need(S, w))
        return -1;
    *out = le(S->data + S->pos, w);
    S->pos += w;
    return 0;
}

static int pop_mark(Scan *S, Py_ssize_t *at) {
    if (!S->nmarks)
        return -1;
    *at = S->marks[--S->nmarks];
    return *at <= S->stack.len ? 0 : -1;
}

static Py_ssize_t fence(Scan *S) { return S->nmarks ? S->marks[S->nmarks - 1] : 0; }

static int memo_put(Scan *S, uint64_t idx) {
    if (S->stack.len <= fence(S) || idx >= MEMO_MAX)
        return -1;
    if (grow((void **)&S->memo.v, &S->memo.cap, (Py_ssize_t)idx + 1, sizeof(Val)))
        return -1;
    while (S->memo.len <= (Py_ssize_t)idx)
        S->memo.v[S->memo.len++].type = T_MARK_UNSET;
    if (S->memo.v[idx].type == T_MARK_UNSET)
        S->memo_set++;
    else
        S->memo_reset = 1;
    S->memo.v[idx] = S->stack.v[S->stack.len - 1];
    return 0;
}

static int memo_get(Scan *S, uint64_t idx) {
    if (idx >= (uint64_t)S->memo.len || S->memo.v[idx].type == T_MARK_UNSET)
        return -1;
    return push(&S->stack, S->memo.v[idx]);
}

static int is_container(uint8_t t) { return t >= T_LIST && t <= T_FRAME; }

static int tuple_of(Scan *S, Py_ssize_t from) {
    Val t;
    if (new_box(S, T_TUPLE, &t) || box_add(S, t.u.c, S->stack.v + from, S->stack.len - from))
        return -1;
    S->stack.len = from;
    return push(&S->stack, t);
}

static int frame_intern(Paths *P, Scan *S, int32_t c, const Val *kv);
static void frame_fields(Paths *P, const Scan *S, const Val *items, Py_ssize_t n,
                         const Val *out[3]);
static int32_t frame_of(Paths *P, const Scan *S, Val file, Val name, int64_t line);
static int well_formed(const Val *got[3]);

/* Set the n keys and values kv in dict box c. */
static int set_items(Scan *S, int32_t c, const Val *kv, Py_ssize_t n) {
    if (n % 2 || S->boxes[c].frame) /* a frame dict set again: left to the unpickler */
        return -1;
    for (Py_ssize_t i = 0; i < n; i += 2)
        if (is_container(kv[i].type)) /* possibly unhashable: left to Python */
            return -1;
    int interned = 0;
    if (n == 6 && S->paths && !S->boxes[c].len &&
        (interned = frame_intern(S->paths, S, c, kv)) < 0)
        return -1;
    if (!interned && box_add(S, c, kv, n))
        return -1;
    return 0;
}

static int dict_items(Scan *S, int32_t c, Py_ssize_t from) {
    if (set_items(S, c, S->stack.v + from, S->stack.len - from))
        return -1;
    S->stack.len = from;
    return 0;
}

/* The opcodes of a small dict of scalars, as Python's pickler writes every such dict (a dump
 * rewritten in Python has thousands of frame dicts): EMPTY_DICT, its MEMOIZE or BINPUT, MARK, at most SMALL_ITEMS
 * keys and values each a scalar, a memo reference to one, or a short text, then SETITEMS. Read
 * here in one go, with the same effects as opcode by opcode. S->pos is just past EMPTY_DICT.
 * 1: read; 0: not that shape (nothing was changed: the opcodes are run one by one); -1: left
 * to the unpickler. */
#define SMALL_ITEMS 16
static int small_dict(Scan *S) {
    const unsigned char *d = S->data;
    Py_ssize_t p = S->pos, end = S->size;
    int64_t put = -1; /* the memo index the dict goes to */
    if (p < end && d[p] == 0x94) {
        put = S->memo_set;
        p++;
    } else if (p + 1 < end && d[p] == 'q') {
        put = d[p + 1];
        p += 2;
    } else
        return 0;
    if (p >= end || d[p] != '(')
        return 0;
    p++;
    Val kv[SMALL_ITEMS];
    int n = 0;
    const Val *memo = S->memo.v;
    const Py_ssize_t nmemo = S->memo.len;
    for (;;) {
        if (p >= end)
            return 0;
        unsigned char op = d[p];
        if (op == 'u')
            break;
        if (n == SMALL_ITEMS)
            return 0;
        Val *v = &kv[n++];
        switch (op) {
        case 'h': /* BINGET of a scalar or a text (not of the dict itself) */
            if (p + 1 >= end || d[p + 1] >= nmemo || d[p + 1] == put)
                return 0;
            *v = memo[d[p + 1]];
            if (v->type >= T_LIST) /* a container, or unset */
                return 0;
            p += 2;
            break;
        default: {
            int w = scalar(d + p, end - p - 1, v);
            if (w < 0)
                return 0;
            p += 1 + w;
            break;
        }
        case 0x8c: /* SHORT_BINUNICODE, not memoized (a memoized one: opcode by opcode) */
        {
            if (p + 1 >= end)
                return 0;
            Py_ssize_t len = d[p + 1];
            if (len > end - p - 2 || !utf8_ok(d + p + 2, len))
                return 0;
            Py_ssize_t after = p + 2 + len;
            if (after < end && (d[after] == 0x94 || d[after] == 'q'))
                return 0;
            v->type = T_STR;
            v->u.s.off = (uint32_t)(p + 2);
            v->u.s.len = (uint32_t)len;
            p = after;
            break;
        }
        }
    }
    /* The shape matched: the dict, its memo entry, then its items, as the opcodes would; a frame
     * dict (as set_items would intern it) is its id alone. */
    Val dict;
    if (n == 6 && S->paths) {
        const Val *got[3];
        frame_fields(S->paths, S, kv, 6, got);
        if (well_formed(got)) {
            int32_t id = frame_of(S->paths, S, *got[0], *got[1], got[2]->u.i);
            if (id == -3)
                return -1;
            dict.type = T_FRAME;
            dict.u.c = id;
            if (push(&S->stack, dict) || memo_put(S, (uint64_t)put))
                return -1;
            S->pos = p + 1;
            return 1;
        }
    }
    if (new_box(S, T_DICT, &dict) || push(&S->stack, dict))
        return -1;
    if (memo_put(S, (uint64_t)put) || set_items(S, dict.u.c, kv, n))
        return -1;
    S->pos = p + 1;
    return 1;
}

/* --- containers as torch writes them, each read in one go --------------------------------- */
/* torch's pickler writes a dump's entries alike: every container within MARK .. APPENDS or
 * SETITEMS, its texts and frame dicts as memo references after their first time. Such a list or
 * dict is read here in one go, with the same effects as opcode by opcode (the same boxes, in the
 * same order); where its shape turns out otherwise, what was made is undone and the loop reads
 * it. */
#define LIST_ITEMS 256
#define LIST_DEPTH 2
#define DICT_ITEMS 64

/* How many boxes and items were made: what undo goes back to. */
typedef struct {
    Py_ssize_t nboxes, used, block_left;
    Val *block_next;
} Made;

static Made made(const Scan *S) {
    return (Made){S->nboxes, S->used, S->block_left, S->block_next};
}

static void undo(Scan *S, Made m) {
    S->nboxes = m.nboxes;
    S->used = m.used;
    S->block_left = m.block_left;
    S->block_next = m.block_next;
}

/* A memo reference (BINGET, LONG_BINGET: a dump of more than 256 texts and frames) or a scalar
 * at p (< S->size): where it ends, and *v; 0 for anything else. */
static inline Py_ssize_t item_at(const Scan *S, Py_ssize_t p, Val *v) {
    const unsigned char *d = S->data;
    if (d[p] == 'h' || d[p] == 'j') {
        int w = d[p] == 'h' ? 1 : 4;
        if (p + w >= S->size)
            return 0;
        uint64_t at = w == 1 ? d[p + 1] : le(d + p + 1, 4);
        if (at >= (uint64_t)S->memo.len || S->memo.v[at].type == T_MARK_UNSET)
            return 0;
        *v = S->memo.v[at];
        return p + 1 + w;
    }
    int w = scalar(d + p, S->size - p - 1, v);
    return w < 0 ? 0 : p + 1 + w;
}

/* A list (an entry's frames, sizes, dtypes) whose MARK is at p, into *out: items of item_at's
 * or such lists (LIST_DEPTH deep at most), LIST_ITEMS at most, then APPENDS. Where it ends; 0:
 * not that shape; -1: out of memory. */
static Py_ssize_t list_read(Scan *S, Py_ssize_t p, int depth, Val *out) {
    const unsigned char *d = S->data;
    const Py_ssize_t mark = p;
    Val items[LIST_ITEMS];
    int n = 0;
    if (p >= S->size || d[p] != '(' || new_box(S, T_LIST, out))
        return p >= S->size || d[p] != '(' ? 0 : -1;
    for (p++; p < S->size && d[p] != 'e'; n++) {
        if (n == LIST_ITEMS || (d[p] == ']' && depth == LIST_DEPTH))
            return 0;
        p = d[p] == ']' ? list_read(S, p + 1, depth + 1, &items[n]) : item_at(S, p, &items[n]);
        if (p <= 0)
            return p;
    }
    if (p >= S->size || p - mark > UINT32_MAX)
        return 0;
    S->boxes[out->u.c].span_off = (uint32_t)mark;
    S->boxes[out->u.c].span_len = (uint32_t)(p - mark);
    return box_add(S, out->u.c, items, n) ? -1 : p + 1;
}

/* A dict (an entry; a frame whose texts came before) after EMPTY_DICT and MARK: items of
 * item_at's, lists of list_read's and tuples of them (TUPLE1..3), DICT_ITEMS keys at most, then
 * SETITEMS. S->pos is just past EMPTY_DICT. 1: read; 0: not that shape; -1: left to the
 * unpickler (as set_items says) or out of memory. */
static int torch_dict(Scan *S) {
    const unsigned char *d = S->data;
    const Made was = made(S);
    Val kv[2 * DICT_ITEMS], dict, t;
    int n = 0;
    Py_ssize_t p = S->pos + 1;
    if (new_box(S, T_DICT, &dict))
        return -1;
    while (p > 0 && p < S->size && d[p] != 'u') {
        unsigned char op = d[p];
        int k = op - 0x84;
        if (n == 2 * DICT_ITEMS)
            p = 0;
        else if (op == ']')
            p = list_read(S, p + 1, 0, &kv[n++]);
        else if (k < 1 || k > 3)
            p = item_at(S, p, &kv[n++]);
        else if (n < k)
            p = 0;
        else { /* TUPLE1..3 of the last k */
            if (new_box(S, T_TUPLE, &t) || box_add(S, t.u.c, kv + n - k, k))
                return -1;
            n -= k;
            kv[n++] = t;
            p++;
        }
    }
    if (p < 0)
        return -1;
    if (!p || p >= S->size || n % 2) {
        undo(S, was);
        return 0;
    }
    if (set_items(S, dict.u.c, kv, n) || push(&S->stack, dict))
        return -1;
    S->pos = p + 1;
    return 1;
}

/* Run the opcodes; 0 with the result on the stack, -1 for anything left to the unpickler. */
static int run(Scan *S) {
    Val v;
    while (S->pos < S->size) {
        unsigned char op = S->data[S->pos++];
        Py_ssize_t at;
        uint64_t n;
        switch (op) {
        case 0x80: /* PROTO */
            if (!need(S, 1) || S->data[S->pos] > 5)
                return -1;
            S->pos++;
            break;
        case 0x95: /* FRAME: a length the rest must hold */
            if (!need(S, 8))
                return -1;
            n = le(S->data + S->pos, 8);
            S->pos += 8;
            if (n > (uint64_t)(S->size - S->pos))
                return -1;
            break;
        case '.': /* STOP */
            if (S->stack.len != 1 || S->nmarks)
                return -1;
            return 0;
        case '(':
            if (grow((void **)&S->marks, &S->capmarks, S->nmarks + 1, sizeof(Py_ssize_t)))
                return -1;
            S->marks[S->nmarks++] = S->stack.len;
            break;
        case '0': /* POP */
            if (S->stack.len <= fence(S))
                return -1;
            S->stack.len--;
            break;
        case '1': /* POP_MARK */
            if (pop_mark(S, &at))
                return -1;
            S->stack.len = at;
            break;
        case '2': /* DUP */
            if (S->stack.len <= fence(S) ||
                push(&S->stack, S->stack.v[S->stack.len - 1]))
                return -1;
            break;
        case 'N':
        case 0x88:
        case 0x89:
        case 'J':
        case 'K':
        case 'M':
        case 0x8a:
        case 0x8b:
        case 'G': {
            int w = scalar(S->data + S->pos - 1, S->size - S->pos, &v);
            if (w < 0 || push(&S->stack, v))
                return -1;
            S->pos += w;
            break;
        }
        case 0x8c:
        case 'X':
        case 0x8d: /* SHORT_BINUNICODE, BINUNICODE, BINUNICODE8 */
        {
            int w = op == 0x8c ? 1 : op == 'X' ? 4 : 8;
            if (!need(S, w))
                return -1;
            n = le(S->data + S->pos, w);
            S->pos += w;
            if (n > (uint64_t)(S->size - S->pos) || n > UINT32_MAX ||
                !utf8_ok(S->data + S->pos, (Py_ssize_t)n))
                return -1;
            v.type = T_STR;
            v.u.s.off = (uint32_t)S->pos;
            v.u.s.len = (uint32_t)n;
            S->pos += (Py_ssize_t)n;
            if (push(&S->stack, v))
                return -1;
            break;
        }
        case '}':
            if (S->pos + 3 < S->size) { /* a dump's dicts: its entries, their frames */
                int done = S->data[S->pos] == '(' ? torch_dict(S) : small_dict(S);
                if (done < 0)
                    return -1;
                if (done)
                    break;
            }
            /* fall through */
        case ']':
            if (op == ']') {
                const Made was = made(S);
                Py_ssize_t end = list_read(S, S->pos, 0, &v);
                if (end < 0 || (end && push(&S->stack, v)))
                    return -1;
                if (end) {
                    S->pos = end;
                    break;
                }
                undo(S, was);
            }
            /* fall through */
        case ')':
            if (new_box(S, op == ']' ? T_LIST : op == ')' ? T_TUPLE : T_DICT, &v) ||
                push(&S->stack, v))
                return -1;
            break;
        case 'l': /* LIST */
            if (pop_mark(S, &at) || new_box(S, T_LIST, &v) ||
                box_add(S, v.u.c, S->stack.v + at, S->stack.len - at))
                return -1;
            S->stack.len = at;
            if (push(&S->stack, v))
                return -1;
            break;
        case 't': /* TUPLE */
            if (pop_mark(S, &at) || tuple_of(S, at))
                return -1;
            break;
        case 0x85:
        case 0x86:
        case 0x87: /* TUPLE1..3 */
            n = op - 0x84;
            if (S->stack.len - fence(S) < (Py_ssize_t)n ||
                tuple_of(S, S->stack.len - (Py_ssize_t)n))
                return -1;
            break;
        case 'd': /* DICT */
            if (pop_mark(S, &at) || new_box(S, T_DICT, &v) || dict_items(S, v.u.c, at) ||
                push(&S->stack, v))
                return -1;
            break;
        case 'a': /* APPEND */
            if (S->stack.len - fence(S) < 2 ||
                S->stack.v[S->stack.len - 2].type != T_LIST)
                return -1;
            if (box_add(S, S->stack.v[S->stack.len - 2].u.c, S->stack.v + S->stack.len - 1, 1))
                return -1;
            S->stack.len--;
            break;
        case 'e': /* APPENDS */
            if (pop_mark(S, &at) || at < 1 || S->stack.v[at - 1].type != T_LIST ||
                (S->nmarks && S->marks[S->nmarks - 1] > at - 1))
                return -1;
            if (box_add(S, S->stack.v[at - 1].u.c, S->stack.v + at, S->stack.len - at))
                return -1;
            S->stack.len = at;
            break;
        case 's': /* SETITEM */
            if (S->stack.len - fence(S) < 3 ||
                S->stack.v[S->stack.len - 3].type != T_DICT ||
                dict_items(S, S->stack.v[S->stack.len - 3].u.c, S->stack.len - 2))
                return -1;
            break;
        case 'u': /* SETITEMS */
            if (pop_mark(S, &at) || at < 1 || S->stack.v[at - 1].type != T_DICT ||
                (S->nmarks && S->marks[S->nmarks - 1] > at - 1) ||
                dict_items(S, S->stack.v[at - 1].u.c, at))
                return -1;
            break;
        case 'q':
        case 'r': /* BINPUT, LONG_BINPUT */
            if (arg(S, op == 'q' ? 1 : 4, &n) || memo_put(S, n))
                return -1;
            break;
        case 0x94: /* MEMOIZE */
            if (memo_put(S, (uint64_t)S->memo_set))
                return -1;
            break;
        case 'h':
        case 'j': /* BINGET, LONG_BINGET */
            if (arg(S, op == 'h' ? 1 : 4, &n) || memo_get(S, n))
                return -1;
            break;
        default: /* globals, calls, sets, bytes, text opcodes, buffers: not here */
            return -1;
        }
    }
    return -1; /* no STOP */
}

/* --- Python objects of values ------------------------------------------------------------- */
static PyObject *to_py(Scan *S, Val v, int depth) {
    switch (v.type) {
    case T_NONE:
        Py_RETURN_NONE;
    case T_TRUE:
        Py_RETURN_TRUE;
    case T_FALSE:
        Py_RETURN_FALSE;
    case T_INT:
        return PyLong_FromLongLong(v.u.i);
    case T_FLOAT:
        return PyFloat_FromDouble(v.u.f);
    case T_STR:
        return PyUnicode_DecodeUTF8((const char *)S->data + v.u.s.off, v.u.s.len,
                                    "surrogatepass");
    }
    if (v.type == T_FRAME) {
        PyErr_SetString(PyExc_ValueError, "a frame dict outside the frames");
        return NULL;
    }
    if (depth > DEPTH_MAX) {
        PyErr_SetString(PyExc_RecursionError, "nested too deep");
        return NULL;
    }
    Box *b = &S->boxes[v.u.c];
    PyObject *out;
    if (b->frame) { /* its items are not kept: no real dump has one outside an entry's frames */
        PyErr_SetString(PyExc_ValueError, "a frame dict outside the frames");
        return NULL;
    }
    if (b->type == T_DICT) {
        out = PyDict_New();
        for (Py_ssize_t i = 0; out && i < b->len; i += 2) {
            PyObject *k = to_py(S, b->items[i], depth + 1);
            PyObject *x = k ? to_py(S, b->items[i + 1], depth + 1) : NULL;
            if (!x || PyDict_SetItem(out, k, x))
                Py_CLEAR(out);
            Py_XDECREF(k);
            Py_XDECREF(x);
        }
        return out;
    }
    out = b->type == T_LIST ? PyList_New(b->len) : PyTuple_New(b->len);
    for (Py_ssize_t i = 0; out && i < b->len; i++) {
        PyObject *x = to_py(S, b->items[i], depth + 1);
        if (!x) {
            Py_CLEAR(out);
            break;
        }
        if (b->type == T_LIST)
            PyList_SET_ITEM(out, i, x);
        else
            PyTuple_SET_ITEM(out, i, x);
    }
    return out;
}

/* --- distinct values of a coded field ------------------------------------------------------ */
/* A value's identity: a string by its text (torch writes each entry's profiling name, state and
 * thread as a string of its own, so 2000 entries are 2000 writes of a handful of texts), a tuple
 * or list of strings and scalars (nested, FLAT_DEPTH deep) by its items (an entry's process_group,
 * sizes and dtypes, containers of their own in every entry), another container by its index, a
 * scalar by its value. Equal identities are equal values; equal
 * containers may differ in identity (two writes of one list), which the caller's coding by
 * value then merges. */
typedef struct {
    uint64_t key;
    int32_t index;
} Slot;

typedef struct {
    Slot *slots;
    Py_ssize_t cap, count, nvals, capvals;
    Val *vals; /* the distinct values, in order of first appearance */
    Val last_val; /* the value last looked up, as written (a string: where) */
    int32_t last;
} Distinct;

/* Tuples and lists are compared by their items down to this depth (an entry's process_group,
 * sizes and dtypes: containers that torch writes anew for every entry); deeper, and dicts, by
 * their write. A list that holds itself is too deep. */
#define FLAT_DEPTH 4

/* A text's hash, 8 bytes at a time (a frame's file is a path of 60 to 100). */
static uint64_t span_hash(const Scan *S, Val v, uint64_t h) {
    const unsigned char *p = S->data + v.u.s.off;
    uint32_t n = v.u.s.len, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    return (h ^ n) * 0x9E3779B97F4A7C15ULL;
}

/* A list compared by how its items were written (see Box.span_off): its span as a text; NULL
 * where it is compared by its items. */
static const Box *by_span(const Scan *S, Val v) {
    const Box *b = v.type == T_LIST ? &S->boxes[v.u.c] : NULL;
    return b && b->span_len && !S->memo_reset ? b : NULL;
}

static Val span_of(const Box *b) {
    return (Val){.type = T_STR, .u.s = {b->span_off, b->span_len}};
}

static uint64_t ident_at(const Scan *S, Val v, int depth) {
    const Box *spanned = by_span(S, v);
    if (spanned)
        return span_hash(S, span_of(spanned), 0x84222325cbf29ce4ULL) ^ ((uint64_t)v.type << 58);
    uint64_t payload;
    switch (v.type) {
    case T_INT:
        payload = (uint64_t)v.u.i;
        break;
    case T_FLOAT:
        memcpy(&payload, &v.u.f, 8);
        break;
    case T_STR: /* of the text, 8 bytes at a time */
        payload = span_hash(S, v, 0xcbf29ce484222325ULL);
        break;
    case T_LIST:
    case T_TUPLE:
        if (depth < FLAT_DEPTH) { /* of its items */
            const Box *b = &S->boxes[v.u.c];
            payload = (uint64_t)b->len;
            for (Py_ssize_t i = 0; i < b->len; i++)
                payload = payload * 0x100000001b3ULL ^ ident_at(S, b->items[i], depth + 1);
            break;
        }
        /* fall through */
    case T_DICT:
    case T_FRAME:
        payload = (uint64_t)(uint32_t)v.u.c;
        break;
    default:
        payload = 0;
    }
    return payload * 0x9E3779B97F4A7C15ULL ^ ((uint64_t)v.type << 58) ^ v.type;
}

/* The same write of a value: what the pickle stored once. */
static int same_write(Val a, Val b) {
    if (a.type != b.type)
        return 0;
    switch (a.type) {
    case T_INT:
        return a.u.i == b.u.i;
    case T_FLOAT:
        return memcmp(&a.u.f, &b.u.f, 8) == 0;
    case T_STR:
        return a.u.s.off == b.u.s.off && a.u.s.len == b.u.s.len;
    case T_LIST:
    case T_TUPLE:
    case T_DICT:
    case T_FRAME:
        return a.u.c == b.u.c;
    }
    return 1;
}

/* The same value: the same write, or the same content (a text; a tuple or list of the same
 * items, down to FLAT_DEPTH, as ident_at looks at them). */
static int same_at(const Scan *S, Val a, Val b, int depth) {
    if (same_write(a, b))
        return 1;
    if (a.type != b.type)
        return 0;
    if (a.type == T_STR)
        return a.u.s.len == b.u.s.len &&
               memcmp(S->data + a.u.s.off, S->data + b.u.s.off, a.u.s.len) == 0;
    if ((a.type != T_LIST && a.type != T_TUPLE) || depth >= FLAT_DEPTH)
        return 0;
    const Box *x = by_span(S, a), *y = by_span(S, b);
    if (x && y) /* written alike: equal (a list written otherwise may still be equal: merged later) */
        return x->span_len == y->span_len &&
               memcmp(S->data + x->span_off, S->data + y->span_off, x->span_len) == 0;
    x = &S->boxes[a.u.c];
    y = &S->boxes[b.u.c];
    if (x->len != y->len)
        return 0;
    for (Py_ssize_t i = 0; i < x->len; i++)
        if (!same_at(S, x->items[i], y->items[i], depth + 1))
            return 0;
    return 1;
}

static int32_t distinct_index(Distinct *d, const Scan *S, Val v) {
    /* Most entries repeat the value before them, as written once: no text is looked at. */
    if (d->last >= 0 && same_write(d->last_val, v))
        return d->last;
    uint64_t key = ident_at(S, v, 0);
    if (d->count * 2 >= d->cap) { /* rehash */
        Py_ssize_t cap = d->cap ? d->cap * 2 : 16;
        Slot *slots = malloc((size_t)cap * sizeof(Slot));
        if (!slots)
            return -1;
        for (Py_ssize_t i = 0; i < cap; i++)
            slots[i].index = -1;
        for (Py_ssize_t i = 0; i < d->cap; i++)
            if (d->slots[i].index >= 0) {
                Py_ssize_t j = (Py_ssize_t)(d->slots[i].key & (uint64_t)(cap - 1));
                while (slots[j].index >= 0)
                    j = (j + 1) & (cap - 1);
                slots[j] = d->slots[i];
            }
        free(d->slots);
        d->slots = slots;
        d->cap = cap;
    }
    Py_ssize_t j = (Py_ssize_t)(key & (uint64_t)(d->cap - 1));
    while (d->slots[j].index >= 0) {
        if (d->slots[j].key == key && same_at(S, d->vals[d->slots[j].index], v, 0))
            goto found;
        j = (j + 1) & (d->cap - 1);
    }
    if (grow((void **)&d->vals, &d->capvals, d->nvals + 1, sizeof(Val)))
        return -1;
    d->vals[d->nvals] = v;
    d->slots[j].key = key;
    d->slots[j].index = (int32_t)d->nvals++;
    d->count++;
found:
    d->last_val = v;
    d->last = d->slots[j].index;
    return d->last;
}

/* --- call paths of the entries' frames ----------------------------------------------------- */
/* An entry's ``frames`` (innermost first: dicts of name, filename and line) as a path: the frames
 * outermost first, those of the machinery (files that contain one of the given texts) left out,
 * the innermost `depth` kept. Each distinct frame (by content) gets an id, each distinct path (a
 * sequence of ids) an index; a frame dict or a frames list is looked at once, however many
 * entries refer to it. An entry whose frames are not a list of such dicts has no path (-1) and
 * is counted as malformed; one without frames (none, or no key) has no path. */
typedef struct {
    Val file, name;
    int64_t line;
    uint64_t key;
    int mach; /* a frame of the machinery's: in no path */
} PFrame;

/* A frame as written: where its file and name texts are in the input, and its line. torch's
 * pickler stores each text once and refers to it after, so the frames of a dump that are the
 * same are the same as written, and are recognised without reading a text again. */
typedef struct {
    uint32_t foff, flen, noff, nlen;
    int64_t line;
    int32_t id; /* its id; -4: an empty slot */
} Written;

struct Paths {
    const char **mach;
    Py_ssize_t *machlen, nmach, depth;
    int32_t *seen; /* per box: 0 not looked at; a frame dict: id + 3, 1 malformed;
                      a frames list: path index + 3, 1 no path, 2 malformed */
    PFrame *frames;
    Py_ssize_t nframes, capframes;
    Slot *fslots;
    Py_ssize_t fcap;
    int32_t *pool; /* the paths' frame ids, one after another */
    Py_ssize_t npool, cappool;
    Py_ssize_t *start; /* per path: its first id in pool, and its length */
    int32_t *len;
    Py_ssize_t npaths, cappaths, capstart;
    Slot *pslots;
    Py_ssize_t pcap;
    /* Frames lists written alike (by_span) have one path: looked up by how they were written,
     * without their frames being looked at (an entry's frames are a new list each time). */
    Slot *spslots;
    Py_ssize_t spcap, nspans, capspans;
    struct {
        uint32_t off, len;
        int32_t out;
    } *spans;
    int32_t *tmp;
    Py_ssize_t captmp;
    Py_ssize_t bad;
    Written *written;
    Py_ssize_t wcap, nwritten;
    uint32_t keyoff[3]; /* where the keys "filename", "name", "line" were last found, + 1 */
    Slot *fileslots; /* the distinct file texts, by their hash */
    Py_ssize_t filescap, nfiles, capfiles;
    struct {
        Val text;
        int machinery;
    } *files;
};

static int span_eq(const Scan *S, Val a, Val b) {
    return a.u.s.len == b.u.s.len &&
           memcmp(S->data + a.u.s.off, S->data + b.u.s.off, a.u.s.len) == 0;
}

/* Open addressing on a power-of-two table of slots, grown at half full. */
static int slots_grow(Slot **slots, Py_ssize_t *cap, Py_ssize_t count) {
    if (count * 2 < *cap)
        return 0;
    Py_ssize_t n = *cap ? *cap * 2 : 64;
    Slot *t = malloc((size_t)n * sizeof(Slot));
    if (!t)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++)
        t[i].index = -1;
    for (Py_ssize_t i = 0; i < *cap; i++)
        if ((*slots)[i].index >= 0) {
            Py_ssize_t j = (Py_ssize_t)((*slots)[i].key & (uint64_t)(n - 1));
            while (t[j].index >= 0)
                j = (j + 1) & (n - 1);
            t[j] = (*slots)[i];
        }
    free(*slots);
    *slots = t;
    *cap = n;
    return 0;
}

/* A frame dict's filename, name and line values (NULL where missing; a key set twice: the last),
 * in one pass over its items (n: keys and values). A key written once is matched by where its
 * text is (`keyoff`), else by its text. */
static void frame_fields(Paths *P, const Scan *S, const Val *items, Py_ssize_t n,
                         const Val *out[3]) {
    static const char *names[3] = {"filename", "name", "line"};
    static const uint32_t lens[3] = {8, 4, 4};
    out[0] = out[1] = out[2] = NULL;
    for (Py_ssize_t i = n - 2; i >= 0; i -= 2) {
        Val k = items[i];
        if (k.type != T_STR)
            continue;
        uint32_t at = k.u.s.off + 1;
        int f = 0;
        while (f < 3 && (at != P->keyoff[f] || k.u.s.len != lens[f]))
            f++;
        if (f == 3) { /* not where a key was found before: by its text */
            for (f = 0; f < 3; f++)
                if (k.u.s.len == lens[f] && memcmp(S->data + k.u.s.off, names[f], lens[f]) == 0)
                    break;
            if (f == 3)
                continue;
            P->keyoff[f] = at;
        }
        if (!out[f])
            out[f] = &items[i + 1];
    }
}

static uint64_t mix(uint64_t x) { /* splitmix64's finaliser */
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static uint64_t written_key(Val file, Val name, int64_t line) {
    return mix(((uint64_t)file.u.s.off << 32 | file.u.s.len) * 0x9E3779B97F4A7C15ULL ^
               ((uint64_t)name.u.s.off << 32 | name.u.s.len) * 0xC2B2AE3D27D4EB4FULL ^
               (uint64_t)line);
}

/* The slot of a frame as written: its own, or the empty one where it goes. */
static Written *written_slot(Paths *P, Val file, Val name, int64_t line) {
    Py_ssize_t j = (Py_ssize_t)(written_key(file, name, line) & (uint64_t)(P->wcap - 1));
    for (;; j = (j + 1) & (P->wcap - 1)) {
        Written *w = &P->written[j];
        if (w->id == -4 || (w->foff == file.u.s.off && w->flen == file.u.s.len &&
                            w->noff == name.u.s.off && w->nlen == name.u.s.len && w->line == line))
            return w;
    }
}

static int written_grow(Paths *P) {
    if (P->nwritten * 2 < P->wcap)
        return 0;
    Py_ssize_t old = P->wcap;
    Written *was = P->written;
    P->wcap = old ? old * 2 : 256;
    if (!(P->written = malloc((size_t)P->wcap * sizeof(Written)))) {
        P->written = was;
        P->wcap = old;
        return -1;
    }
    for (Py_ssize_t i = 0; i < P->wcap; i++)
        P->written[i].id = -4;
    for (Py_ssize_t i = 0; i < old; i++)
        if (was[i].id != -4) {
            Val f = {.type = T_STR, .u.s = {was[i].foff, was[i].flen}};
            Val n = {.type = T_STR, .u.s = {was[i].noff, was[i].nlen}};
            *written_slot(P, f, n, was[i].line) = was[i];
        }
    free(was);
    return 0;
}

/* Whether a file text (hash h) is the machinery's: looked for once per distinct text (a dump
 * may write one text anew for every entry). -3: out of memory. */
static int machinery(Paths *P, const Scan *S, Val file, uint64_t h) {
    if (slots_grow(&P->fileslots, &P->filescap, P->nfiles))
        return -3;
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(P->filescap - 1));
    for (; P->fileslots[j].index >= 0; j = (j + 1) & (P->filescap - 1))
        if (P->fileslots[j].key == h && span_eq(S, P->files[P->fileslots[j].index].text, file))
            return P->files[P->fileslots[j].index].machinery;
    int found = 0;
    for (Py_ssize_t m = 0; m < P->nmach && !found; m++) {
        Py_ssize_t n = P->machlen[m];
        const unsigned char *f = S->data + file.u.s.off;
        for (Py_ssize_t i = 0; i + n <= (Py_ssize_t)file.u.s.len && !found; i++)
            found = f[i] == (unsigned char)P->mach[m][0] && memcmp(f + i, P->mach[m], n) == 0;
    }
    if (grow((void **)&P->files, &P->capfiles, P->nfiles + 1, sizeof *P->files))
        return -3;
    P->files[P->nfiles].text = file;
    P->files[P->nfiles].machinery = found;
    P->fileslots[j].key = h;
    P->fileslots[j].index = (int32_t)P->nfiles++;
    return found;
}

/* The id of the frame (file, name, line) (the machinery's too, marked so); -3 out of memory. */
static int32_t frame_of(Paths *P, const Scan *S, Val file, Val name, int64_t line) {
    if (written_grow(P))
        return -3;
    Written *w = written_slot(P, file, name, line);
    if (w->id != -4) /* this frame as written before: no text is read */
        return w->id;
    int32_t id;
    uint64_t h = span_hash(S, file, 0xcbf29ce484222325ULL);
    int mach = machinery(P, S, file, h);
    if (mach < 0)
        return -3;
    uint64_t key = span_hash(S, name, h);
    key = (key ^ (uint64_t)line) * 0x9E3779B97F4A7C15ULL;
    if (slots_grow(&P->fslots, &P->fcap, P->nframes))
        return -3;
    Py_ssize_t j = (Py_ssize_t)(key & (uint64_t)(P->fcap - 1));
    for (; P->fslots[j].index >= 0; j = (j + 1) & (P->fcap - 1)) {
        const PFrame *o = &P->frames[P->fslots[j].index];
        if (o->key == key && o->line == line && span_eq(S, o->file, file) &&
            span_eq(S, o->name, name)) {
            id = P->fslots[j].index;
            goto done;
        }
    }
    if (grow((void **)&P->frames, &P->capframes, P->nframes + 1, sizeof(PFrame)))
        return -3;
    P->frames[P->nframes] =
        (PFrame){.file = file, .name = name, .line = line, .key = key, .mach = mach};
    P->fslots[j].key = key;
    id = P->fslots[j].index = (int32_t)P->nframes++;
done:
    *w = (Written){.foff = file.u.s.off, .flen = file.u.s.len, .noff = name.u.s.off,
                   .nlen = name.u.s.len, .line = line, .id = id};
    P->nwritten++;
    return id;
}

/* A frame's (file, name, line) of its fields, or NULL where one is missing or of a wrong type. */
static int well_formed(const Val *got[3]) {
    return got[0] && got[1] && got[2] && got[0]->type == T_STR && got[1]->type == T_STR &&
           got[2]->type == T_INT;
}

/* As a dict is made of the keys and values kv (3 pairs, on an empty dict c): a frame dict gets
 * its id now, while its items are at hand, and keeps no items. 1 done, 0 not a frame dict (it
 * is made as any dict), -1 out of memory. */
static int frame_intern(Paths *P, Scan *S, int32_t c, const Val *kv) {
    const Val *got[3];
    frame_fields(P, S, kv, 6, got);
    if (!well_formed(got)) /* a key missing (or one twice), or a value of a wrong type */
        return 0;
    int32_t id = frame_of(P, S, *got[0], *got[1], got[2]->u.i);
    if (id == -3)
        return -1;
    S->boxes[c].frame = id + 3;
    return 1;
}

/* A frame dict's id; -2 malformed, -3 out of memory. */
static int32_t frame_id(Paths *P, const Scan *S, Val v) {
    if (v.type == T_FRAME)
        return v.u.c;
    if (v.type != T_DICT)
        return -2;
    const Box *b = &S->boxes[v.u.c];
    if (b->frame)
        return b->frame - 3;
    int32_t known = P->seen[v.u.c];
    if (known)
        return known - 3;
    const Val *got[3];
    frame_fields(P, S, b->items, b->len, got);
    int32_t id = well_formed(got) ? frame_of(P, S, *got[0], *got[1], got[2]->u.i) : -2;
    if (id == -3)
        return -3;
    P->seen[v.u.c] = id + 3;
    return id;
}

/* The path index of a frames list (box c) from its frames; -1 no path, -2 malformed, -3 out of
 * memory. */
static int32_t path_of(Paths *P, const Scan *S, int32_t c) {
    const Box *b = &S->boxes[c];
    if (grow((void **)&P->tmp, &P->captmp, P->depth + 1, sizeof(int32_t)))
        return -3;
    Py_ssize_t n = 0;
    int32_t out;
    /* innermost first in the list: the first `depth` kept ones are the innermost */
    for (Py_ssize_t i = 0; i < b->len; i++) {
        int32_t id = frame_id(P, S, b->items[i]);
        if (id == -3)
            return -3;
        if (id == -2) {
            out = -2;
            goto done;
        }
        if (!P->frames[id].mach && n < P->depth)
            P->tmp[n++] = id;
    }
    if (!n) {
        out = -1; /* only machinery: no path of the user's */
        goto done;
    }
    for (Py_ssize_t i = 0; i < n / 2; i++) { /* outermost first */
        int32_t t = P->tmp[i];
        P->tmp[i] = P->tmp[n - 1 - i];
        P->tmp[n - 1 - i] = t;
    }
    uint64_t key = (uint64_t)n;
    for (Py_ssize_t i = 0; i < n; i++)
        key = (key ^ (uint64_t)(uint32_t)P->tmp[i]) * 0x100000001b3ULL;
    if (slots_grow(&P->pslots, &P->pcap, P->npaths))
        return -3;
    Py_ssize_t j = (Py_ssize_t)(key & (uint64_t)(P->pcap - 1));
    for (; P->pslots[j].index >= 0; j = (j + 1) & (P->pcap - 1)) {
        int32_t k = P->pslots[j].index;
        if (P->pslots[j].key == key && P->len[k] == n &&
            memcmp(P->pool + P->start[k], P->tmp, (size_t)n * sizeof(int32_t)) == 0) {
            out = k;
            goto done;
        }
    }
    if (grow((void **)&P->pool, &P->cappool, P->npool + n, sizeof(int32_t)) ||
        grow((void **)&P->start, &P->capstart, P->npaths + 1, sizeof(Py_ssize_t)) ||
        grow((void **)&P->len, &P->cappaths, P->npaths + 1, sizeof(int32_t)))
        return -3;
    memcpy(P->pool + P->npool, P->tmp, (size_t)n * sizeof(int32_t));
    P->start[P->npaths] = P->npool;
    P->len[P->npaths] = (int32_t)n;
    P->npool += n;
    P->pslots[j].key = key;
    out = P->pslots[j].index = (int32_t)P->npaths++;
done:
    P->seen[c] = out + 3;
    return out;
}

/* The path index of a frames list (box c), as path_of gives it; once per box, and once per way
 * of writing a list (by_span). */
static int32_t path_index(Paths *P, const Scan *S, int32_t c) {
    int32_t known = P->seen[c];
    if (known)
        return known - 3;
    const Box *b = by_span(S, (Val){.type = T_LIST, .u.c = c});
    if (!b)
        return path_of(P, S, c);
    uint64_t key = span_hash(S, span_of(b), 0xcbf29ce484222325ULL);
    if (slots_grow(&P->spslots, &P->spcap, P->nspans))
        return -3;
    Py_ssize_t j = (Py_ssize_t)(key & (uint64_t)(P->spcap - 1));
    for (; P->spslots[j].index >= 0; j = (j + 1) & (P->spcap - 1)) {
        __typeof__(P->spans[0]) *o = &P->spans[P->spslots[j].index];
        if (P->spslots[j].key == key && o->len == b->span_len &&
            memcmp(S->data + o->off, S->data + b->span_off, b->span_len) == 0) {
            P->seen[c] = o->out + 3;
            return o->out;
        }
    }
    int32_t out = path_of(P, S, c);
    if (out == -3 || grow((void **)&P->spans, &P->capspans, P->nspans + 1, sizeof *P->spans))
        return -3;
    P->spans[P->nspans] = (__typeof__(P->spans[0])){b->span_off, b->span_len, out};
    P->spslots[j].key = key;
    P->spslots[j].index = (int32_t)P->nspans++;
    return out;
}

/* An entry's path index from its frames value (NULL: no key). */
static int32_t entry_path(Paths *P, const Scan *S, const Val *v) {
    if (!v || v->type == T_NONE)
        return -1;
    int32_t at = v->type == T_LIST ? path_index(P, S, v->u.c) : -2;
    if (at == -2) {
        P->bad++;
        return -1;
    }
    return at;
}

/* The distinct paths as tuples of (filename, name, line) tuples, outermost first. */
static PyObject *paths_to_py(Paths *P, const Scan *S) {
    PyObject *frames = PyList_New(P->nframes), *out = NULL;
    if (!frames)
        return NULL;
    for (Py_ssize_t i = 0; i < P->nframes; i++) {
        const PFrame *f = &P->frames[i];
        PyObject *file = to_py((Scan *)S, f->file, 0);
        PyObject *name = file ? to_py((Scan *)S, f->name, 0) : NULL;
        PyObject *t = name ? Py_BuildValue("(OOL)", file, name, (long long)f->line) : NULL;
        Py_XDECREF(file);
        Py_XDECREF(name);
        if (!t)
            goto fail;
        PyList_SET_ITEM(frames, i, t);
    }
    out = PyList_New(P->npaths);
    for (Py_ssize_t k = 0; out && k < P->npaths; k++) {
        PyObject *t = PyTuple_New(P->len[k]);
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        for (int32_t i = 0; i < P->len[k]; i++) {
            PyObject *f = PyList_GET_ITEM(frames, P->pool[P->start[k] + i]);
            Py_INCREF(f);
            PyTuple_SET_ITEM(t, i, f);
        }
        PyList_SET_ITEM(out, k, t);
    }
fail:
    Py_DECREF(frames);
    return out;
}

static void paths_free(Paths *P) {
    free(P->mach);
    free(P->machlen);
    free(P->seen);
    free(P->frames);
    free(P->fslots);
    free(P->pool);
    free(P->start);
    free(P->len);
    free(P->pslots);
    free(P->spslots);
    free(P->spans);
    free(P->tmp);
    free(P->written);
    free(P->fileslots);
    free(P->files);
}

/* --- every frame of every entry, for read_fr_frames ------------------------------------------- */
/* Rows of (entry, depth, frame) for the frames of the entries, the first `frames_max` items of
 * each entry's frames list (an item that is not a dict has no row; one that is a dict but not
 * a well-formed frame leaves the dump to the Python reader, which says what it can of it). The
 * frames are numbered in the order the rows first meet them (`local`), the machinery's too. */
typedef struct {
    int32_t *entry, *depth, *code;
    Py_ssize_t n, cap, capent, capdep;
    int32_t *local; /* per frame id: its number in the rows + 1, 0 not met yet */
    Py_ssize_t caplocal;
    int32_t *order; /* per number: the frame id */
    Py_ssize_t norder, caporder;
} Rows;

/* 0 done, -1 left to the Python reader or out of memory. */
static int entry_frames(Rows *R, Paths *P, const Scan *S, const Val *v, Py_ssize_t e,
                        Py_ssize_t frames_max) {
    if (!v || v->type != T_LIST) /* no frames, or not a list: no rows, as in Python */
        return 0;
    const Box *b = &S->boxes[v->u.c];
    Py_ssize_t m = b->len < frames_max ? b->len : frames_max;
    if (grow((void **)&R->entry, &R->capent, R->n + m, sizeof(int32_t)) ||
        grow((void **)&R->depth, &R->capdep, R->n + m, sizeof(int32_t)) ||
        grow((void **)&R->code, &R->cap, R->n + m, sizeof(int32_t)))
        return -1;
    for (Py_ssize_t i = 0; i < m; i++) {
        if (b->items[i].type != T_DICT && b->items[i].type != T_FRAME)
            continue;
        int32_t id = frame_id(P, S, b->items[i]);
        if (id < 0) /* malformed (-2) or out of memory (-3) */
            return -1;
        if (id >= R->caplocal) {
            Py_ssize_t was = R->caplocal;
            if (grow((void **)&R->local, &R->caplocal, (Py_ssize_t)id + 1, sizeof(int32_t)))
                return -1;
            memset(R->local + was, 0, (size_t)(R->caplocal - was) * sizeof(int32_t));
        }
        if (!R->local[id]) {
            if (grow((void **)&R->order, &R->caporder, R->norder + 1, sizeof(int32_t)))
                return -1;
            R->order[R->norder] = id;
            R->local[id] = (int32_t)++R->norder;
        }
        R->entry[R->n] = (int32_t)e;
        R->depth[R->n] = (int32_t)i;
        R->code[R->n++] = R->local[id] - 1;
    }
    return 0;
}

/* (frames, entry, depth, code): the frames met as (name, filename, line) tuples, in the order
 * met, and the rows' three columns as int32 bytes. */
static PyObject *rows_to_py(Rows *R, Paths *P, const Scan *S) {
    PyObject *frames = PyList_New(R->norder);
    for (Py_ssize_t i = 0; frames && i < R->norder; i++) {
        const PFrame *f = &P->frames[R->order[i]];
        PyObject *file = to_py((Scan *)S, f->file, 0);
        PyObject *name = file ? to_py((Scan *)S, f->name, 0) : NULL;
        PyObject *t = name ? Py_BuildValue("(OOL)", name, file, (long long)f->line) : NULL;
        Py_XDECREF(file);
        Py_XDECREF(name);
        if (!t) {
            Py_CLEAR(frames);
            break;
        }
        PyList_SET_ITEM(frames, i, t);
    }
    if (!frames)
        return NULL;
    Py_ssize_t size = R->n * (Py_ssize_t)sizeof(int32_t);
    const char *none = ""; /* y# makes None of NULL: no rows are empty bytes */
    return Py_BuildValue("(Ny#y#y#)", frames, R->n ? (const char *)R->entry : none, size,
                         R->n ? (const char *)R->depth : none, size,
                         R->n ? (const char *)R->code : none, size);
}

static void rows_free(Rows *R) {
    free(R->entry);
    free(R->depth);
    free(R->code);
    free(R->local);
    free(R->order);
}

/* --- the walk over the entries ------------------------------------------------------------- */
static int str_is(Scan *S, Val v, PyObject *name) {
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(name, &len);
    return s && v.type == T_STR && (Py_ssize_t)v.u.s.len == len &&
           memcmp(S->data + v.u.s.off, s, (size_t)len) == 0;
}

/* The value of `name` in dict box c (the last one set, as a dict keeps), or NULL. */
static const Val *lookup(Scan *S, int32_t c, PyObject *name) {
    Box *b = &S->boxes[c];
    for (Py_ssize_t i = b->len - 2; i >= 0; i -= 2)
        if (str_is(S, b->items[i], name))
            return &b->items[i + 1];
    return NULL;
}

/* A scan with the spare buffers, if any, emptied. */
static void start_scan(Scan *S) {
    memset(S, 0, sizeof *S);
    if (spare_full) {
        *S = spare;
        spare_full = 0;
        S->stack.len = S->memo.len = S->nmarks = S->memo_set = S->nboxes = 0;
        S->memo_reset = 0;
        S->used = S->nbig = S->block_left = S->pos = 0;
    }
}

/* Keep the buffers for the next scan where they are not too large, else free them. */
static void end_scan(Scan *S) {
    for (Py_ssize_t i = 0; i < S->nbig; i++)
        free(S->big[i]);
    S->nbig = 0;
    if (!spare_full && S->nblocks <= SPARE_BLOCKS && S->memo.cap <= SPARE_VALS &&
        S->stack.cap <= SPARE_VALS && S->capboxes <= SPARE_VALS) {
        spare = *S;
        spare_full = 1;
        return;
    }
    for (Py_ssize_t i = 0; i < S->nblocks; i++)
        free(S->blocks[i]);
    free(S->blocks);
    free(S->big);
    free(S->boxes);
    free(S->stack.v);
    free(S->memo.v);
    free(S->marks);
}

#define FAIL goto done

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer buf;
    PyObject *int_f, *float_f, *bool_f, *coded_f, *head_f, *mach_f = Py_None;
    Py_ssize_t depth = 64, frames_max = 0;
    if (!PyArg_ParseTuple(args, "y*O!UO!O!O!|Onn", &buf, &PyTuple_Type, &int_f, &float_f,
                          &PyTuple_Type, &bool_f, &PyTuple_Type, &coded_f, &PyTuple_Type,
                          &head_f, &mach_f, &depth, &frames_max))
        return NULL;
    if ((mach_f != Py_None && (!PyTuple_Check(mach_f) || depth < 1)) || frames_max < 0 ||
        (frames_max && mach_f == Py_None)) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_TypeError,
                        "machinery: a tuple of str or None; depth >= 1; frames_max >= 0, "
                        "and only with machinery");
        return NULL;
    }
    Scan S;
    start_scan(&S);
    Paths P = {0};
    S.data = buf.buf;
    S.size = buf.len;
    Py_ssize_t ni = PyTuple_GET_SIZE(int_f), nb = PyTuple_GET_SIZE(bool_f);
    Py_ssize_t nc = PyTuple_GET_SIZE(coded_f), nf = ni + 1 + nb + nc;
    PyObject *result = NULL, *head = NULL, *ints = NULL, *masks = NULL, *bools = NULL;
    PyObject *coded = NULL, *floats = NULL, *paths = NULL, *path_at = NULL;
    int32_t *pcol = NULL;
    Rows R = {0};
    PyObject *fr = NULL;
    const int want_paths = mach_f != Py_None;
    const Py_ssize_t frames_f = want_paths ? ni + 1 + nb + nc : -1; /* its field, past the rest */
    struct {
        uint32_t off;
        signed char f;
    } *keymap = NULL; /* per item position: the key last seen there, and its field */
    Py_ssize_t capkeys = 0;
    const Val **fields = NULL;
    Distinct *dist = NULL;
    int64_t **icol = NULL;
    char **mcol = NULL, **bcol = NULL;
    int32_t **ccol = NULL;
    double *fcol = NULL;
    int ok = 0;
    if (nf > 120)
        FAIL;
    if (want_paths) {
        P.depth = depth;
        P.nmach = PyTuple_GET_SIZE(mach_f);
        P.mach = calloc((size_t)P.nmach + 1, sizeof *P.mach);
        P.machlen = calloc((size_t)P.nmach + 1, sizeof *P.machlen);
        if (!P.mach || !P.machlen)
            FAIL;
        for (Py_ssize_t m = 0; m < P.nmach; m++) {
            PyObject *t = PyTuple_GET_ITEM(mach_f, m);
            if (!PyUnicode_Check(t) || !(P.mach[m] = PyUnicode_AsUTF8AndSize(t, &P.machlen[m])) ||
                !P.machlen[m])
                FAIL;
        }
    }
    S.paths = want_paths ? &P : NULL;
    if (run(&S)) /* with the GIL held: the spare buffers are this call's alone */
        FAIL;
    /* After STOP only whitespace, as the restricted loader asks. */
    for (Py_ssize_t i = S.pos; i < S.size; i++)
        if (!strchr(" \t\n\r\x0b\x0c", S.data[i]) || !S.data[i])
            FAIL;
    Val root = S.stack.v[0];
    if (root.type != T_DICT)
        FAIL;
    head = PyDict_New();
    if (!head)
        FAIL;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(head_f); k++) {
        PyObject *name = PyTuple_GET_ITEM(head_f, k);
        if (!PyUnicode_Check(name))
            FAIL;
        const Val *v = lookup(&S, root.u.c, name);
        if (!v)
            continue;
        PyObject *x = to_py(&S, *v, 0);
        if (!x || PyDict_SetItem(head, name, x)) {
            Py_XDECREF(x);
            FAIL;
        }
        Py_DECREF(x);
    }
    PyObject *entries_name = PyUnicode_FromString("entries");
    if (!entries_name)
        FAIL;
    const Val *ev = lookup(&S, root.u.c, entries_name);
    Py_DECREF(entries_name);
    Py_ssize_t n = 0;
    Box *eb = NULL;
    if (ev) {
        if (ev->type != T_LIST)
            FAIL;
        eb = &S.boxes[ev->u.c];
        n = eb->len;
    }
    /* Column buffers */
    ints = PyList_New(ni);
    masks = PyList_New(ni);
    bools = PyList_New(nb);
    coded = PyList_New(nc);
    floats = PyBytes_FromStringAndSize(NULL, n * 8);
    icol = calloc((size_t)ni + 1, sizeof *icol);
    mcol = calloc((size_t)ni + 1, sizeof *mcol);
    bcol = calloc((size_t)nb + 1, sizeof *bcol);
    ccol = calloc((size_t)nc + 1, sizeof *ccol);
    dist = calloc((size_t)nc + 1, sizeof *dist);
    fields = calloc((size_t)nf + 1, sizeof *fields);
    if (want_paths && (!(P.seen = calloc((size_t)S.nboxes + 1, sizeof *P.seen)) ||
                       !(pcol = malloc((size_t)(n ? n : 1) * sizeof *pcol))))
        FAIL;
    if (!ints || !masks || !bools || !coded || !floats || !icol || !mcol || !bcol || !ccol ||
        !dist || !fields)
        FAIL;
    fcol = (double *)PyBytes_AS_STRING(floats);
    for (Py_ssize_t k = 0; k < ni; k++) {
        PyObject *a = PyBytes_FromStringAndSize(NULL, n * 8);
        PyObject *m = PyBytes_FromStringAndSize(NULL, n);
        if (!a || !m) {
            Py_XDECREF(a);
            Py_XDECREF(m);
            FAIL;
        }
        PyList_SET_ITEM(ints, k, a);
        PyList_SET_ITEM(masks, k, m);
        icol[k] = (int64_t *)PyBytes_AS_STRING(a);
        mcol[k] = PyBytes_AS_STRING(m);
    }
    for (Py_ssize_t k = 0; k < nb; k++) {
        PyObject *a = PyBytes_FromStringAndSize(NULL, n);
        if (!a)
            FAIL;
        PyList_SET_ITEM(bools, k, a);
        bcol[k] = PyBytes_AS_STRING(a);
    }
    for (Py_ssize_t k = 0; k < nc; k++) {
        ccol[k] = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
        dist[k].last = -1;
        if (!ccol[k])
            FAIL;
    }
    /* Field k of an entry: ints [0, ni), the float ni, bools, then coded. */
    for (Py_ssize_t e = 0; e < n; e++) {
        Val ent = eb->items[e];
        if (ent.type != T_DICT && ent.type != T_FRAME)
            FAIL;
        memset(fields, 0, (size_t)(nf + 1) * sizeof *fields);
        /* an entry that is a frame dict has none of an entry's fields */
        static const Box no_items = {.type = T_DICT};
        const Box *d = ent.type == T_DICT ? &S.boxes[ent.u.c] : &no_items;
        for (Py_ssize_t i = 0; i < d->len; i += 2) {
            Val key = d->items[i];
            if (key.type != T_STR)
                continue;
            Py_ssize_t slot = i / 2;
            if (slot >= capkeys) {
                Py_ssize_t was = capkeys;
                if (grow((void **)&keymap, &capkeys, slot + 1, sizeof *keymap))
                    FAIL;
                for (Py_ssize_t j = was; j < capkeys; j++)
                    keymap[j].f = 0;
            }
            signed char f = keymap[slot].f;
            if (!f || keymap[slot].off != key.u.s.off) {
                /* a key not seen at this place before (entries of a dump share their keys'
                 * order, so this is once per key): which field is it? */
                f = -1;
                for (Py_ssize_t k = 0; k < nf && f < 0; k++) {
                    PyObject *name = k < ni        ? PyTuple_GET_ITEM(int_f, k)
                                     : k == ni     ? float_f
                                     : k <= ni + nb ? PyTuple_GET_ITEM(bool_f, k - ni - 1)
                                                    : PyTuple_GET_ITEM(coded_f, k - ni - 1 - nb);
                    if (str_is(&S, key, name))
                        f = (signed char)(k + 1);
                }
                if (PyErr_Occurred())
                    FAIL;
                if (f < 0 && want_paths && key.u.s.len == 6 &&
                    memcmp(S.data + key.u.s.off, "frames", 6) == 0)
                    f = (signed char)(frames_f + 1);
                keymap[slot].off = key.u.s.off;
                keymap[slot].f = f;
            }
            if (f > 0)
                fields[f - 1] = &d->items[i + 1]; /* a later one wins, as in a dict */
        }
        for (Py_ssize_t k = 0; k < ni; k++) {
            const Val *v = fields[k];
            if (!v || v->type == T_NONE) {
                icol[k][e] = 0;
                mcol[k][e] = 1;
            } else if (v->type == T_INT) {
                icol[k][e] = v->u.i;
                mcol[k][e] = 0;
            } else
                FAIL; /* a bool, float or text where an int belongs: the slow path says */
        }
        const Val *fv = fields[ni];
        if (!fv || fv->type == T_NONE)
            fcol[e] = NAN;
        else if (fv->type == T_FLOAT)
            fcol[e] = fv->u.f;
        else if (fv->type == T_INT)
            fcol[e] = (double)fv->u.i;
        else
            FAIL;
        for (Py_ssize_t k = 0; k < nb; k++) {
            const Val *v = fields[ni + 1 + k];
            bcol[k][e] = !v ? -1 : v->type == T_TRUE ? 1 : v->type == T_FALSE ? 0 : -1;
        }
        for (Py_ssize_t k = 0; k < nc; k++) {
            const Val *v = fields[ni + 1 + nb + k];
            Val none = {.type = T_NONE};
            int32_t at = distinct_index(&dist[k], &S, v ? *v : none);
            if (at < 0)
                FAIL;
            ccol[k][e] = at;
        }
        if (want_paths && (pcol[e] = entry_path(&P, &S, fields[frames_f])) == -3)
            FAIL;
        if (frames_max && entry_frames(&R, &P, &S, fields[frames_f], e, frames_max))
            FAIL;
    }
    for (Py_ssize_t k = 0; k < nc; k++) {
        PyObject *objs = PyList_New(dist[k].nvals);
        PyObject *at = PyBytes_FromStringAndSize((const char *)ccol[k], n * 4);
        PyObject *pair = objs && at ? PyTuple_Pack(2, objs, at) : NULL;
        Py_XDECREF(at);
        if (!pair) {
            Py_XDECREF(objs);
            FAIL;
        }
        PyList_SET_ITEM(coded, k, pair);
        for (Py_ssize_t i = 0; i < dist[k].nvals; i++) {
            PyObject *x = to_py(&S, dist[k].vals[i], 0);
            if (!x) {
                Py_DECREF(objs);
                FAIL;
            }
            PyList_SET_ITEM(objs, i, x);
        }
        Py_DECREF(objs);
    }
    if (want_paths) {
        paths = paths_to_py(&P, &S);
        path_at = PyBytes_FromStringAndSize((const char *)pcol, n * 4);
        if (!paths || !path_at)
            FAIL;
        if (frames_max) {
            if (!(fr = rows_to_py(&R, &P, &S)))
                FAIL;
            result = Py_BuildValue("(OnOOOOO(OOn)O)", head, n, ints, masks, floats, bools, coded,
                                   paths, path_at, P.bad, fr);
        } else
            result = Py_BuildValue("(OnOOOOO(OOn))", head, n, ints, masks, floats, bools,
                                   coded, paths, path_at, P.bad);
    } else
        result = Py_BuildValue("(OnOOOOO)", head, n, ints, masks, floats, bools, coded);
    ok = result != NULL;
done:
    if (!ok) {
        Py_CLEAR(result);
        PyErr_Clear(); /* anything unusual: the restricted unpickler reads this dump */
        result = Py_None;
        Py_INCREF(result);
    }
    for (Py_ssize_t k = 0; k < nc && ccol; k++)
        free(ccol[k]);
    for (Py_ssize_t k = 0; k < nc && dist; k++) {
        free(dist[k].slots);
        free(dist[k].vals);
    }
    free(ccol);
    free(dist);
    free(icol);
    free(mcol);
    free(bcol);
    free(fields);
    free(keymap);
    Py_XDECREF(head);
    Py_XDECREF(ints);
    Py_XDECREF(masks);
    Py_XDECREF(bools);
    Py_XDECREF(coded);
    Py_XDECREF(floats);
    Py_XDECREF(paths);
    Py_XDECREF(path_at);
    Py_XDECREF(fr);
    rows_free(&R);
    free(pcol);
    paths_free(&P);
    end_scan(&S);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(data, int_fields, float_field, bool_fields, coded_fields, head_keys, machinery=None, "
     "depth=64, frames_max=0) -> tuple | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fr_scan",
                                    "Flight-recorder pickles to columns, in C.", -1, methods};

PyMODINIT_FUNC PyInit__fr_scan(void) { return PyModule_Create(&module); }
