"""The one pass over a chunk of an NCCL log that finds its NCCL lines, compiled with Numba.

A 500 MB log is millions of lines; NumPy needs several full passes over the bytes (line ends, the
keyword, the level, the headers) and Python cannot touch each line at all. This kernel does one:
line ends with ``memchr``, the ``NCCL <LEVEL>`` keyword by a short scan from the line start, the
line header (``host:pid:tid [dev] ...``) numbered through a small hash table (hashed eight bytes
at a step), and the message copied out with ``memcpy`` into one contiguous buffer that Arrow uses
as is. It releases the GIL, so chunks run on threads. The compiled code is cached on disk
(Numba's ``cache=True``).

Only the *distinct* headers go back to Python to be parsed (a few per process); :func:`fill`
then writes every line's header fields (pid, tid, device, ...) from per-header tables, also in one
pass.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

from rankscope.collect._common import pooled_empty

# libc's, found by symbol name when the code is linked; addresses are passed as plain integers.
_memchr = types.ExternalFunction("memchr", types.uintp(types.uintp, types.intc, types.size_t))
_memcpy = types.ExternalFunction("memcpy", types.uintp(types.uintp, types.uintp, types.size_t))
_memcmp = types.ExternalFunction("memcmp", types.intc(types.uintp, types.uintp, types.size_t))

#: The words after ``NCCL``, in the order of ``nccl.LEVELS`` (zero-padded rows, and widths).
_WORDS = (b"INFO", b"WARN", b"TRACE", b"CALL", b"ABORT", b"version")
_WORD_BYTES = np.array([list(w.ljust(8, b"\0")) for w in _WORDS], dtype=np.uint8)
_WORD_WIDTHS = np.array([len(w) for w in _WORDS], dtype=np.int64)
#: How messages that may announce a communicator begin (init.cc): "comm 0x...",
#: "ncclCommInitRank comm ...", "ncclCommSplit comm ...", newest "[Rank 3] ncclCommInit...".
_COMM_STARTS = np.array([list(w) for w in (b"comm", b"nccl", b"[Ran")], dtype=np.uint8)
#: ``flags`` bit: the message may announce a communicator (worth a regex).
MAY_ANNOUNCE = 1

_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))


@njit(nogil=True, cache=True)
def _level(a, w, e):
    """Index in _WORDS of the word at ``a[w:]`` that ends at a space, CR or the line end ``e``."""
    for k in range(len(_WORD_WIDTHS)):
        width = _WORD_WIDTHS[k]
        end = w + width
        if end > e:
            continue
        same = True
        for i in range(width):
            if a[w + i] != _WORD_BYTES[k, i]:
                same = False
                break
        if same and (end == e or a[end] == 32 or a[end] == 13):
            return k, width
    return -1, 0


@njit(nogil=True, cache=True)
def _word(a, at):
    """The 8 bytes at ``a[at:]`` as an integer (one load, once compiled)."""
    w = np.uint64(0)
    for i in range(8):
        w |= np.uint64(a[at + i]) << np.uint64(8 * i)
    return w


@njit(nogil=True, cache=True)
def _head_hash(a, hs, he):
    """A hash of the header ``a[hs:he]``, eight bytes at a step (the last step overlapping the
    one before); a header shorter than eight bytes byte by byte. Equal hashes are confirmed by
    comparing the bytes."""
    h = _FNV_OFFSET ^ np.uint64(he - hs)
    if he - hs < 8:
        for k in range(hs, he):
            h = (h ^ np.uint64(a[k])) * _FNV_PRIME
        return h
    k = hs
    while k + 8 <= he:
        h = (h ^ _word(a, k)) * _MIX[0]
        k += 8
    if k < he:
        h = (h ^ _word(a, he - 8)) * _MIX[0]
    h = (h ^ (h >> np.uint64(33))) * _MIX[1]
    return h ^ (h >> np.uint64(29))


@njit(nogil=True, cache=True)
def _keyword(a, s, e):
    """Position of ``NCCL `` in the line ``a[s:e]`` where a word starts (the line start, or after
    a space, a prefix's ``:`` or a stamp's ``]``); -1 if none."""
    j = s
    while j + 5 <= e:
        word = a[j] == 78 and a[j + 1] == 67 and a[j + 2] == 67 and a[j + 3] == 76
        if word and a[j + 4] == 32 and (j == s or a[j - 1] in (32, 58, 93)):
            return j
        j += 1
    return -1


def scan(a: np.ndarray) -> tuple[np.ndarray, ...]:
    """The NCCL lines of ``a`` (bytes of whole lines, the last ending with a newline).

    Returns ``(rows, levels, heads, flags, offsets, messages, head_start, head_len, n_lines,
    not_ascii)``: per NCCL line its line index in the chunk, level (index in _WORDS), header number,
    flags; ``offsets``/``messages`` as an Arrow string array's buffers; per header number where
    its first occurrence lies in ``a``; the chunk's line count; whether some message is not
    ASCII (then it may not be UTF-8 either).

    The outputs come from Arrow's memory pool (:func:`pooled_empty`): the messages become an
    Arrow array as they are, and memory freed by an earlier read is reused, not faulted in anew.
    """
    n = len(a)
    cap = n // 10 + 2  # the shortest NCCL line, "NCCL CALL\n", has 10 bytes
    rows = pooled_empty(cap, np.int64)
    levels = pooled_empty(cap, np.int8)
    heads = pooled_empty(cap, np.int32)
    flags = pooled_empty(cap, np.int8)
    offsets = pooled_empty(cap + 1, np.int64)
    messages = pooled_empty(max(n, 1), np.uint8)
    # The header table: small (a log has a few headers per process), kept at most half full; a
    # chunk with more distinct headers than that is scanned again with a table 16 times larger.
    slots = 1 << 12
    while True:
        table = np.zeros(slots, np.int64)  # header number + 1; 0: empty
        hashes = np.zeros(slots, np.uint64)
        head_start = np.empty(slots // 2, np.int64)
        head_len = np.empty(slots // 2, np.int64)
        nrow, size, nheads, n_lines, not_ascii = _scan(
            a, rows, levels, heads, flags, offsets, messages, table, hashes, head_start, head_len
        )
        if nrow >= 0:
            break
        slots *= 16
    return (
        rows[:nrow],
        levels[:nrow],
        heads[:nrow],
        flags[:nrow],
        offsets[: nrow + 1],
        messages[:size],
        head_start[:nheads],
        head_len[:nheads],
        n_lines,
        not_ascii,
    )


@njit(nogil=True, cache=True)
def _scan(a, rows, levels, heads, flags, offsets, messages, table, hashes, head_start, head_len):
    n = len(a)
    mask = np.uint64(len(table) - 1)
    base = a.ctypes.data
    out = messages.ctypes.data
    offsets[0] = 0
    nrow = 0
    nheads = 0
    pos = 0
    line = 0
    i = 0
    while i < n:
        s = i
        p = _memchr(base + i, 10, n - i)
        e = n if p == 0 else np.int64(p - base)
        i = e + 1
        line += 1
        key = _keyword(a, s, e)
        if key < 0:
            continue
        lv, width = _level(a, key + 5, e)
        if lv < 0:
            continue
        # The header: everything before the space in front of the keyword.
        hs = s
        he = key - 1 if key > s else s
        h = _head_hash(a, hs, he)
        slot = np.int64(h & mask)
        while True:
            got = table[slot]
            if got == 0:
                if nheads == len(head_start):
                    return -1, 0, 0, 0, False  # the table is full: the caller grows it
                head_start[nheads] = hs
                head_len[nheads] = he - hs
                nheads += 1
                table[slot] = nheads
                hashes[slot] = h
                hid = nheads - 1
                break
            hid = got - 1
            if (
                hashes[slot] == h
                and head_len[hid] == he - hs
                and _memcmp(base + head_start[hid], base + hs, he - hs) == 0
            ):
                break
            slot = np.int64(np.uint64(slot + 1) & mask)
        # The message: after the level word and one space, without a CR before the newline.
        m0 = min(key + 5 + width + 1, e)
        me = e - 1 if e > m0 and a[e - 1] == 13 else e
        size = me - m0
        _memcpy(out + pos, base + m0, size)
        flag = 0
        if size >= 4:
            for c in range(len(_COMM_STARTS)):
                if _same_word(a, m0, _COMM_STARTS[c]):
                    flag = MAY_ANNOUNCE
                    break
        flags[nrow] = flag
        pos += size
        rows[nrow] = line - 1
        levels[nrow] = lv
        heads[nrow] = hid
        nrow += 1
        offsets[nrow] = pos
    return nrow, pos, nheads, line, _not_ascii(messages[:pos])


@njit(nogil=True, cache=True)
def _not_ascii(m):
    """Whether some byte has its high bit set, eight bytes at a time."""
    n8 = len(m) // 8
    words = m[: n8 * 8].view(np.uint64)
    acc = np.uint64(0)
    for k in range(n8):
        acc |= words[k]
    for k in range(n8 * 8, len(m)):
        acc |= np.uint64(m[k])
    return (acc & np.uint64(0x8080808080808080)) != 0


@njit(nogil=True, cache=True)
def _same_word(a, at, word):
    for i in range(len(word)):  # noqa: SIM110  (Numba compiles loops, not generators)
        if a[at + i] != word[i]:
            return False
    return True


@njit(nogil=True, cache=True)
def fill(
    header,
    ints,
    stamps,
    hosts,
    files,
    out_ints,
    out_missing,
    out_t,
    out_t_missing,
    out_host,
    out_file,
):
    """Per-line columns from per-header tables, in one pass over ``header`` (ids; -1 picks the
    tables' last row, the "no header" row).

    ``ints`` has one column per array of ``out_ints`` (-1: none, also set in ``out_missing``);
    ``stamps`` fills ``out_t`` (NaN: none), ``hosts``/``files`` the category codes.
    """
    for r in range(len(header)):
        h = header[r]
        for c in range(len(out_ints)):
            v = ints[h, c]
            out_ints[c][r] = v
            out_missing[c][r] = v < 0
        t = stamps[h]
        out_t[r] = t
        out_t_missing[r] = np.isnan(t)
        out_host[r] = hosts[h]
        out_file[r] = files[h]
