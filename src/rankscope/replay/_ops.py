"""What each recorded call becomes in the replay: the torch.distributed function, which recorded
tensors it needs, and the gloo stand-ins for what gloo (CPU) cannot run.

A call is recorded either by the probe (the function's name and the shapes of the tensors among
its arguments, in argument order, at most 8) or by torch's flight recorder (the backend's name
for it, ``input_sizes`` and ``output_sizes``). Both are reduced here to *base* tensors, the ones
the replay builds; the others (all_gather's outputs, reduce_scatter's inputs) follow from them
and from the group's size in the replay, so a group that shrinks still gets consistent calls.
"""

from __future__ import annotations

from dataclasses import dataclass

#: How a family of calls uses its base tensors.
#: ``one``: one tensor (all_reduce, broadcast, send ...); ``many``: a list of tensors;
#: ``gather_in``: the per-rank input (all_gather*, gather); ``scatter_out``: the per-rank output
#: (reduce_scatter*, scatter); ``a2a``: one chunk per peer; ``none``: no tensor (barrier);
#: ``object``: the *_object calls (placeholder objects); ``batch``: batch_isend_irecv.
FAMILIES = ("one", "many", "gather_in", "scatter_out", "a2a", "none", "object", "batch")


@dataclass(frozen=True)
class OpSpec:
    """How to replay one recorded op."""

    call: str
    """The torch.distributed function the replay calls."""
    family: str
    root: str | None = None
    """The keyword that names the root of a rooted call (``src``/``dst``)."""
    note: str | None = None
    """Why the replay calls something else than the record says (shown in a comment)."""

    @property
    def p2p(self) -> bool:
        return self.call in P2P_CALLS


P2P_CALLS = frozenset(
    {"send", "recv", "isend", "irecv", "send_object_list", "recv_object_list", "batch_isend_irecv"}
)

_GLOO_RS = (
    "gloo runs reduce_scatter as an all_reduce of the whole input (its flight recorder says "
    "all_reduce); every member must join, so it blocks like the original"
)

#: Recorded op name -> how to replay it. Probe names are torch.distributed function names;
#: flight-recorder names are the backend's (``nccl:all_gather`` -> ``all_gather``).
OPS: dict[str, OpSpec] = {
    "all_reduce": OpSpec("all_reduce", "one"),
    "all_reduce_coalesced": OpSpec("all_reduce_coalesced", "many"),
    "broadcast": OpSpec("broadcast", "one", root="src"),
    "reduce": OpSpec("reduce", "one", root="dst"),
    "all_gather": OpSpec("all_gather", "gather_in"),
    "all_gather_into_tensor": OpSpec("all_gather_into_tensor", "gather_in"),
    "_allgather_base": OpSpec(
        "all_gather_into_tensor",
        "gather_in",
        note="_allgather_base is torch's internal name for all_gather_into_tensor",
    ),
    "allgather_into_tensor_coalesced": OpSpec(
        "all_gather_into_tensor",
        "gather_in",
        note="a coalesced all_gather_into_tensor (NCCL) is replayed as one all_gather_into_tensor "
        "of its first tensor: every member must join it, as they had to join the group",
    ),
    "all_gather_coalesced": OpSpec(
        "all_gather",
        "gather_in",
        note="all_gather_coalesced is replayed as one all_gather of its first tensor (gloo needs "
        "equal lists); every member must join it, as they had to join the original",
    ),
    "reduce_scatter": OpSpec("reduce_scatter", "scatter_out", note=_GLOO_RS),
    "reduce_scatter_tensor": OpSpec("reduce_scatter_tensor", "scatter_out", note=_GLOO_RS),
    "_reduce_scatter_base": OpSpec(
        "reduce_scatter_tensor",
        "scatter_out",
        note="_reduce_scatter_base is torch's internal name for reduce_scatter_tensor; " + _GLOO_RS,
    ),
    "reduce_scatter_tensor_coalesced": OpSpec(
        "reduce_scatter_tensor",
        "scatter_out",
        note="a coalesced reduce_scatter_tensor (NCCL) is replayed as one reduce_scatter_tensor "
        "of its first tensor; " + _GLOO_RS,
    ),
    "all_to_all": OpSpec("all_to_all", "a2a"),
    "all_to_all_single": OpSpec("all_to_all_single", "a2a"),
    "barrier": OpSpec("barrier", "none"),
    "all_reduce_barrier": OpSpec(
        "barrier",
        "none",
        note="NCCL records its barrier as an all_reduce of one element (all_reduce_barrier)",
    ),
    "monitored_barrier": OpSpec("monitored_barrier", "none"),
    "gather": OpSpec("gather", "gather_in", root="dst"),
    "scatter": OpSpec("scatter", "scatter_out", root="src"),
    "send": OpSpec("send", "one", root="dst"),
    "recv": OpSpec("recv", "one", root="src"),
    "isend": OpSpec("isend", "one", root="dst"),
    "irecv": OpSpec("irecv", "one", root="src"),
    "batch_isend_irecv": OpSpec("batch_isend_irecv", "batch"),
    "broadcast_object_list": OpSpec("broadcast_object_list", "object", root="src"),
    "all_gather_object": OpSpec("all_gather_object", "object"),
    "gather_object": OpSpec("gather_object", "object", root="dst"),
    "scatter_object_list": OpSpec("scatter_object_list", "object", root="src"),
    "send_object_list": OpSpec("send_object_list", "object", root="dst"),
    "recv_object_list": OpSpec("recv_object_list", "object", root="src"),
}


def op_spec(op: str) -> OpSpec:
    """How to replay ``op``; an op rankscope does not know becomes an all_reduce on its group."""
    spec = OPS.get(op)
    if spec is not None:
        return spec
    return OpSpec(
        "all_reduce",
        "one",
        note=f"{op!r} is not a call rankscope knows how to replay: it is replayed as an "
        "all_reduce on the same group, which every member must join, so it blocks the same way",
    )


#: The flight recorder's dtype names (c10 ScalarType) -> torch dtype attribute names.
FR_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
    "ComplexHalf": "complex32",
    "UInt16": "uint16",
    "UInt32": "uint32",
    "UInt64": "uint64",
    "Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2": "float8_e5m2",
    "Float8_e4m3fnuz": "float8_e4m3fnuz",
    "Float8_e5m2fnuz": "float8_e5m2fnuz",
}
#: dtypes gloo (torch 2.13, CPU) cannot communicate -> one it can, with as many bytes per element.
GLOO_DTYPES = {
    "int16": "float16",
    "uint16": "float16",
    "uint32": "int32",
    "uint64": "int64",
    "complex32": "float32",
    "float8_e4m3fn": "uint8",
    "float8_e5m2": "uint8",
    "float8_e4m3fnuz": "uint8",
    "float8_e5m2fnuz": "uint8",
}
#: Every dtype name the replay may write (``torch.<name>``).
KNOWN_DTYPES = frozenset(
    {
        "float32",
        "float64",
        "float16",
        "bfloat16",
        "int64",
        "int32",
        "int8",
        "uint8",
        "bool",
        "complex64",
        "complex128",
        *GLOO_DTYPES,
    }
)


def dtype_name(recorded: str | None) -> str:
    """A recorded dtype (probe ``float32`` or recorder ``Float``) as a torch dtype name; an
    unknown one is ``float32``."""
    if not recorded:
        return "float32"
    name = FR_DTYPES.get(recorded, recorded).removeprefix("torch.")
    return name if name in KNOWN_DTYPES else "float32"
