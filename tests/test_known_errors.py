"""Known errors: the texts that name a recipe's mistake (:data:`rankscope.collect.signatures.
KNOWN`), read by :func:`rankscope.collect.recognise` and put on the card by the crash rule.

The library texts are made here by the installed torch (and DeepSpeed and Accelerate where
installed), so a version that rewords one fails this file rather than the card going quiet; the
texts that must not match are near misses from the same libraries. The scenarios that end in
these texts are run by tests/test_scenarios.py and the notebooks."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time

import pandas as pd
import pytest

from rankscope.analyze.causes import CRASH_FIX, FAILURE_KINDS, Cause
from rankscope.analyze.rules.failures import crash_story
from rankscope.analyze.rules.finding import CAUSE_RECIPE
from rankscope.collect import recognise
from rankscope.collect.signatures import INT_FIELDS, KNOWN

_PRELUDE = """
import json, os, tempfile
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch
import torch.distributed as dist
texts = {}
def grab(name, fn):
    try:
        fn()
    except Exception as exc:
        texts[name] = f"{type(exc).__name__}: {exc}"
    else:
        texts[name] = None
dist.init_process_group(
    "gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1
)
"""

#: Each makes one library text on one process (a one-rank gloo group).
_TORCH = """
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
mesh = init_device_mesh("cpu", (1,))
def mixed():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4).to(torch.bfloat16))
    fully_shard(m, mesh=mesh)
    m(torch.randn(2, 4))
grab("fsdp_mixed_dtype", mixed)
grab("fsdp_container", lambda: fully_shard(torch.nn.ModuleList([torch.nn.Linear(2, 2)]), mesh=mesh))
grab("fsdp_mesh_dims", lambda: fully_shard(torch.nn.Linear(2, 2), mesh=init_device_mesh("cpu", (1, 1, 1))))
grab("syncbn_device", lambda: torch.nn.SyncBatchNorm(4)(torch.randn(3, 4)))
grab("batchnorm_one_sample", lambda: torch.nn.BatchNorm1d(4)(torch.randn(1, 4)))
def mix_load():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4))
    fully_shard(m, mesh=mesh)
    torch.nn.Sequential(torch.nn.Linear(4, 4)).load_state_dict(m.state_dict())
grab("state_dict_dtensor_mix", mix_load)
# near misses: a dtype clash outside FSDP, a DTensor mixed with a tensor outside a state dict
grab("no:mm_dtype", lambda: torch.nn.Linear(4, 4)(torch.randn(2, 4, dtype=torch.bfloat16)))
def mix_op():
    m = torch.nn.Linear(4, 4)
    fully_shard(m, mesh=mesh)
    m.weight + torch.ones(4, 4)
grab("no:dtensor_op", mix_op)
def twice():
    loss = (torch.ones(2, requires_grad=True) * 2).exp().sum()
    loss.backward()
    loss.backward()
grab("no:backward_twice", twice)
print(json.dumps(texts))
"""

_DEEPSPEED = """
from deepspeed.runtime.config import DeepSpeedConfig
from accelerate.utils import DeepSpeedPlugin
grab("deepspeed_batch_size", lambda: DeepSpeedConfig(
    {"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}
))
def plugin(config, **kwargs):
    p = DeepSpeedPlugin(hf_ds_config={**config, "zero_optimization": {"stage": 2}})
    p.deepspeed_config_process(must_match=True, **kwargs)
grab("deepspeed_config_mismatch", lambda: plugin(
    {"gradient_accumulation_steps": 4, "train_micro_batch_size_per_gpu": 2},
    gradient_accumulation_steps=1, train_micro_batch_size_per_gpu=2,
))
grab("deepspeed_auto_unfilled", lambda: plugin(
    {"gradient_clipping": "auto", "train_micro_batch_size_per_gpu": 2},
    train_micro_batch_size_per_gpu=2,
))
grab("no:ds_micro_zero", lambda: DeepSpeedConfig(
    {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 0}
))
print(json.dumps(texts))
"""


def _texts(body: str) -> dict[str, str | None]:
    out = subprocess.run(
        [sys.executable, "-c", _PRELUDE + body],
        capture_output=True,
        text=True,
        timeout=280,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _check(texts: dict[str, str | None]) -> None:
    for name, text in texts.items():
        assert text is not None, f"{name}: the library raised nothing"
        found = recognise(text)
        if name.startswith("no:"):
            assert found is None, f"{name} taken for {found.signature.kind}: {text}"
        else:
            assert found is not None, f"{name} not recognised: {text}"
            assert found.signature.kind == name, (found.signature.kind, text)
            assert "?" not in found.values, found.values  # every value read from the text


@pytest.mark.slow  # a process of its own: the texts of a one-rank process group
@pytest.mark.timeout(300)
def test_torch_texts_are_recognised():
    texts = _texts(_TORCH)
    _check(texts)
    dtypes = recognise(texts["fsdp_mixed_dtype"])
    assert dtypes is not None and "torch.bfloat16" in dtypes.values
    assert "torch.float32" in dtypes.values and dtypes.signature.recipe == "D14"
    container = recognise(texts["fsdp_container"])
    assert container is not None and container.values == "fully_shard(ModuleList)"
    loaded = recognise(texts["state_dict_dtensor_mix"])
    assert loaded is not None and loaded.fields["name"] == "0.weight"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_deepspeed_and_accelerate_texts_are_recognised():
    missing = [m for m in ("deepspeed", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (the deepspeed extra), not installed here")
    texts = _texts(_DEEPSPEED)
    _check(texts)
    batch = recognise(texts["deepspeed_batch_size"])
    assert batch is not None and batch.signature.recipe == "D17"
    # the values of the text, not of one script: 24 != 4 * 2 * 1 on this one-rank group
    assert batch.values == "train_batch_size 24 != micro 4 * accumulation 2 * world 1"
    assert "the world size here is 1" in batch.fix
    twice = recognise(texts["deepspeed_config_mismatch"])
    assert twice is not None
    assert twice.values == "gradient_accumulation_steps = 4 in the config, 1 in the kwargs"


def test_deepspeed_batch_assertion_as_the_scenario_prints_it():
    text = (
        "[rank1]: AssertionError: Check batch related parameters. train_batch_size is not equal "
        "to micro_batch_per_gpu * gradient_acc_step * world_size 32 != 4 * 1 * 2"
    )
    found = recognise(text)
    assert found is not None and found.signature.recipe == "D17"
    assert found.values == "train_batch_size 32 != micro 4 * accumulation 1 * world 2"
    assert found.fields == {
        "train_batch": "32",
        "micro_batch": "4",
        "grad_acc": "1",
        "world_size": "2",
    }


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "AssertionError",
        "RuntimeError: CUDA error: out of memory",
        # the family's words without its values
        "AssertionError: Check batch related parameters. train_batch_size is not equal to",
        "FSDP expects uniform original parameter dtype",
        "ValueError: Must flatten tensors with uniform dtype",
        "rank 0: 1.0 MiB of parameters gathered at once",
        # the same words about something else
        "torch.distributions.Uniform: uniform distribution",
        "NotImplementedError: The operator 'aten::foo' is not implemented for CPU",
        "RuntimeError: aten.add.Tensor: got mixed torch.Tensor and DTensor, need to convert",
        "RuntimeError: Trying to backward through the graph a second time; call .backward()",
        "ValueError: a zero stage was requested",
    ],
)
def test_texts_that_name_no_recipe(text):
    assert recognise(text) is None


def test_hostile_text_is_read_fast():
    """Long lines built to make the patterns backtrack: each is read in linear time."""
    texts = [
        "got mixed torch.Tensor and DTensor " + 'While copying the parameter named "a", ' * 20_000,
        "x" * 200_000 + " does not support containers",
        "x" * 200_000 + " expects a 1D or 2D DeviceMesh",
        "x" * 200_000 + " ends 1% of its own training the sharded weights are bf16",
        "9" * 200_000 + " MiB of parameters gathered at once: the whole model is one FSDP unit",
        "\x00\udcff" * 1000 + "train_batch_size is not equal to " * 10_000,
    ]
    for text in texts:
        start = time.perf_counter()
        assert recognise(text) is None
        assert time.perf_counter() - start < 5.0, text[:60]  # linear: far under, at any load


def test_every_known_error_is_a_crash_with_its_own_recipe():
    for sig in KNOWN:
        assert FAILURE_KINDS[sig.kind] == Cause.rank_crashed
        assert sig.role == "own" and sig.title and sig.doc and sig.recipe
        named = set(sig.regex.groupindex).union(*(p.groupindex for p in sig.more))
        # a group of these names becomes an int, which a value read as text would break
        assert not named & INT_FIELDS, (sig.kind, named & INT_FIELDS)


def test_crash_story_names_the_recipe_only_for_a_known_text():
    known = crash_story(
        Cause.rank_crashed,
        "ValueError: Expected more than 1 value per channel when training, got input size "
        "torch.Size([1, 16])",
    )
    assert known.recipe == "D10"
    assert known.facts["known"] == (
        ": BatchNorm on a per-rank batch of one sample (input size torch.Size([1, 16]))"
    )
    assert "drop_last=True" in known.facts["crash_fix"] and known.notes
    plain = crash_story(Cause.rank_crashed, "ValueError: bad sample 17")
    assert plain.recipe == CAUSE_RECIPE
    assert plain.facts == {"known": "", "crash_fix": CRASH_FIX} and not plain.notes
    # another cause keeps its own story, whatever the text
    other = crash_story(Cause.oom, "Expected more than 1 value per channel when training, got x")
    assert other.recipe == CAUSE_RECIPE and not other.facts


def test_crash_story_reads_the_ranks_own_error_lines_when_the_exception_says_nothing():
    """A rank whose exception the probe did not record (logs copied from elsewhere) still gets
    its recipe from its lines of the errors table; another rank's lines, or a line with no rank,
    do not lend it theirs."""
    line = "ValueError: fully_shard does not support containers that do not implement forward: "
    errors = pd.DataFrame(
        {
            "rank": pd.array([1, None, 0], dtype="Int64"),
            "kind": ["fsdp_container", "fsdp_container", "deepspeed_batch_size"],
            "message": [line + "ModuleDict(", line + "ModuleList(", "not a known text"],
        }
    )
    story = crash_story(Cause.rank_crashed, "exit code 1 and no exception", errors=errors, rank=1)
    assert story.recipe == "D12"
    assert story.facts["known"].endswith("(fully_shard(ModuleDict))")
    assert "inside the ModuleDict" in story.facts["crash_fix"]
    alone = crash_story(Cause.rank_crashed, "exit code 1", errors=errors, rank=0)
    assert alone.recipe == CAUSE_RECIPE and alone.facts["crash_fix"] == CRASH_FIX
