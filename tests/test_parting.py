"""The parting line, case by case: two sides' stacks over a real source file, and the
decision that separates them (``rankscope.analyze.parting``)."""

from __future__ import annotations

import json
import textwrap

import pandas as pd
import pytest

from rankscope.analyze.parting import (
    Parting,
    argument_origin,
    catcher,
    env_origin,
    find_parting,
    loop_around,
    runs_alike,
)


def _script(tmp_path, text: str):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text).lstrip())
    lines = path.read_text().splitlines()

    def at(tag: str) -> int:
        return next(n for n, line in enumerate(lines, 1) if f"# {tag}" in line)

    return str(path), at


def _sides(culprits: dict[int, list], others: dict[int, list]):
    """find_parting's first three arguments from each side's paths."""
    return sorted(culprits), sorted(others), {**culprits, **others}


def test_a_barrier_under_an_if_in_the_loop_is_the_branch_not_running_out(tmp_path):
    f, at = _script(
        tmp_path,
        """
        import torch.distributed as dist
        for step in range(6):
            dist.all_reduce(grads)  # reduce
            if step == 2 and rank == 0:  # decide
                dist.barrier()  # barrier
        dist.destroy_process_group()
        """,
    )
    values = pd.DataFrame(
        {
            "rank": [0, 0, 1, 1, 2, 2],
            "capture": [0] * 6,
            "file": [f] * 6,
            "func": ["<module>"] * 6,
            "name": ["step", "rank"] * 3,
            "value": [2, 0, 3, 1, 3, 2],
        }
    )
    p, why = find_parting(
        *_sides(
            {0: [(f, "<module>", at("barrier"))]},
            {1: [(f, "<module>", at("reduce"))], 2: [(f, "<module>", at("reduce"))]},
        ),
        values,
    )
    assert p is not None, why
    assert (p.kind, p.site, p.source) == (
        "if",
        f"train.py:{at('decide')}",
        "if step == 2 and rank == 0:",
    )
    assert (p.ranks_in, p.ranks_out, p.left_loop) == ([0], [1, 2], False)
    assert p.values == {"step": {0: 2, 1: 3, 2: 3}, "rank": {0: 0, 1: 1, 2: 2}}
    assert p.text().startswith(
        f'rank 0 took the branch at train.py:{at("decide")} "if step == 2 and rank == 0:" '
        f"into barrier (train.py:{at('barrier')}); ranks 1-2 did not"
    )
    assert "step = 2 on rank 0, 3 on ranks 1-2" in p.text()


def test_a_helper_s_barrier_under_a_local_rank_condition(tmp_path):
    f, at = _script(
        tmp_path,
        """
        import os
        import torch.distributed as dist
        local_rank = int(os.environ["LOCAL_RANK"])
        is_main = local_rank == 0

        def save_checkpoint(w):
            if is_main:  # decide
                torch.save(w, "ckpt.pt")
                dist.barrier()  # barrier

        for step in range(4):
            dist.all_reduce(w)  # reduce
            save_checkpoint(w)  # save
        """,
    )
    culprit = [(f, "<module>", at("save")), (f, "save_checkpoint", at("barrier"))]
    other = [(f, "<module>", at("reduce"))]
    p, why = find_parting(*_sides({0: culprit, 2: culprit}, {1: other, 3: other}))
    assert p is not None, why
    assert (p.kind, p.site, p.source) == ("if", f"train.py:{at('decide')}", "if is_main:")
    assert (p.ranks_in, p.ranks_out) == ([0, 2], [1, 3])
    assert p.into == f"barrier (train.py:{at('barrier')})"
    assert p.env == {"is_main": "LOCAL_RANK"} and p.recipe == "D3"
    assert env_origin(f, "step") is None


def test_a_branch_in_the_loop_into_a_helper(tmp_path):
    f, at = _script(
        tmp_path,
        """
        import os
        import torch.distributed as dist
        is_main = os.environ.get("LOCAL_RANK") == "0"

        def save_checkpoint(w):
            torch.save(w, "ckpt.pt")
            dist.barrier()  # barrier

        for step in range(4):
            dist.all_reduce(w)  # reduce
            if is_main:  # decide
                save_checkpoint(w)  # save
        """,
    )
    culprit = [(f, "<module>", at("save")), (f, "save_checkpoint", at("barrier"))]
    p, why = find_parting(*_sides({0: culprit}, {1: [(f, "<module>", at("reduce"))]}))
    assert p is not None, why
    assert (p.site, p.source, p.ranks_in) == (f"train.py:{at('decide')}", "if is_main:", [0])
    assert p.into == f"save_checkpoint → barrier (train.py:{at('barrier')})"
    assert p.env == {"is_main": "LOCAL_RANK"}


def test_a_rank_that_left_the_loop_of_a_function_the_others_are_still_in(tmp_path):
    f, at = _script(
        tmp_path,
        """
        import torch.distributed as dist
        shard = load_shard(rank)

        def train():
            for x in shard:  # loop
                model(x).sum().backward()  # backward
                opt.step()

        if args.fix:
            with Join([model]):
                train()
        else:
            train()  # call
        dist.barrier()  # barrier
        """,
    )
    p, why = find_parting(
        *_sides(
            {1: [(f, "<module>", at("barrier"))]},
            {0: [(f, "<module>", at("call")), (f, "train", at("backward"))]},
        )
    )
    assert p is not None, why
    assert (p.kind, p.source, p.ranks_in, p.ranks_out) == ("for", "for x in shard:", [0], [1])
    assert p.left_loop
    assert p.text().startswith(
        f'rank 0 stayed in the loop at train.py:{at("loop")} "for x in shard:"'
    )


def test_a_loop_left_by_its_break_names_the_break(tmp_path):
    f, at = _script(
        tmp_path,
        """
        import torch.distributed as dist
        for epoch in range(100):
            local_val_loss = evaluate()
            if local_val_loss < 0.1:  # decide
                break
            dist.all_reduce(w)  # reduce
        dist.barrier()  # barrier
        """,
    )
    p, why = find_parting(
        *_sides({3: [(f, "<module>", at("barrier"))]}, {0: [(f, "<module>", at("reduce"))]}),
        pd.DataFrame(
            {
                "rank": [0],
                "capture": [1],
                "file": [f],
                "func": ["<module>"],
                "name": ["local_val_loss"],
                "value": [0.12],
            }
        ),
    )
    assert p is not None, why
    assert (p.kind, p.site, p.source) == (
        "break",
        f"train.py:{at('decide')}",
        "if local_val_loss < 0.1: break",
    )
    assert (p.ranks_in, p.ranks_out, p.left_loop) == ([3], [0], True)
    assert p.values == {"local_val_loss": {0: 0.12}}


def test_a_rank_spinning_in_a_while_loop_the_others_left(tmp_path):
    f, at = _script(
        tmp_path,
        """
        import torch.distributed as dist
        err = 1.0
        while err > tol:  # loop
            err = refine(err)  # spin
        dist.all_reduce(w)  # reduce
        """,
    )
    p, why = find_parting(
        *_sides({2: [(f, "<module>", at("spin"))]}, {0: [(f, "<module>", at("reduce"))]})
    )
    assert p is not None, why
    assert (p.kind, p.source, p.ranks_in, p.ranks_out) == ("while", "while err > tol:", [2], [0])


def test_the_branch_that_set_the_peer_a_shared_line_names(tmp_path):
    """Every rank sends from one line; rank 1's peer was set, before it, in a branch the
    others did not take: that branch parted them (an ``elif`` the one that assigned it), its
    assignment where it went. Set again plainly after the branch, or never in one: none."""
    f, at = _script(
        tmp_path,
        """
        import torch.distributed as dist
        def step(rank, load, block):
            nxt = rank + 1
            if load < 1:
                pass
            elif load > 8:  # elif
                nxt = rank + 2  # assign
            dist.send(block, dst=nxt)  # send
            dist.recv(block, (rank - 1) % 4)  # recv
            peer = rank + 1
            if load > 8:
                peer = rank + 2
            peer = rank + 3
            dist.send(block, peer)  # reset
        """,
    )
    p = argument_origin(f, "step", at("send"), "send", [1], [0, 2])
    assert p is not None and (p.site, p.kind) == (f"train.py:{at('elif')}", "elif")
    assert (p.source, p.ranks_in, p.ranks_out) == ("elif load > 8:", [1], [0, 2])
    assert p.into == f"nxt = rank + 2 (train.py:{at('assign')})"
    assert p.text().startswith(f'rank 1 took the branch at train.py:{at("elif")} "elif load > 8:"')
    assert argument_origin(f, "step", at("recv"), "recv", [1], [0]) is None
    assert argument_origin(f, "step", at("reset"), "send", [1], [0]) is None
    assert argument_origin(f, "step", at("send"), "all_reduce", [1], [0]) is None  # no peer


def test_a_peer_passed_to_a_helper_is_followed_to_the_branch_of_its_caller(tmp_path):
    """The send is a helper's, which decides nothing: the peer it names is its parameter, and
    the branch that set it is its caller's, positionally, by keyword, or through a method's
    object. A helper that sets the parameter itself, or a call that leaves it to its default,
    ends the search."""
    f, at = _script(
        tmp_path,
        """
        import torch.distributed as dist
        def hand_off(block, dst, src):
            dist.send(block, dst)  # send
        def relay(block, dst=1):
            dst = dst % world
            dist.send(block, dst)  # relay
        class Stage:
            def pass_on(self, block, dst):
                dist.send(block, dst=dst)  # method
        for step in range(5):
            nxt = (rank + 1) % world
            if lag > LIMIT:  # branch
                nxt = (rank + 2) % world  # assign
            hand_off(block, nxt, prv)  # call
            hand_off(block, src=prv, dst=nxt)  # keywords
            Stage().pass_on(block, nxt)  # on-object
            relay(block, nxt)  # via-relay
            relay(block)  # default
        """,
    )

    def caller(tag: str) -> list:
        return [(f, "<module>", at(tag))]

    for tag in ("call", "keywords", "on-object"):
        site = at("method") if tag == "on-object" else at("send")
        func = "pass_on" if tag == "on-object" else "hand_off"
        p = argument_origin(f, func, site, "send", [1], [0, 2], callers=caller(tag))
        assert p is not None, tag
        assert (p.site, p.source) == (f"train.py:{at('branch')}", "if lag > LIMIT:")
        assert p.into == f"nxt = (rank + 2) % world (train.py:{at('assign')})"
    assert argument_origin(f, "hand_off", at("send"), "send", [1], [0]) is None  # no caller
    assert (
        argument_origin(f, "relay", at("relay"), "send", [1], [0], callers=caller("via-relay"))
        is None
    )
    assert (
        argument_origin(f, "relay", at("relay"), "send", [1], [0], callers=caller("default"))
        is None
    )


def test_a_callback_that_one_side_registered_in_a_branch(tmp_path):
    """Rank 0's all_reduce runs in a hook that autograd calls from ``backward`` (its caller's
    line does not call it by name); the others are past that line. No branch on either stack
    parts them: the ``if`` around the line that registered the hook does, in a function of its
    own. A function its caller's line calls by name is no callback."""
    f, at = _script(
        tmp_path,
        """
        import torch.distributed as dist
        def sync(grad):
            dist.all_reduce(grad)  # hook
            return grad
        def setup(model, rank):
            if rank == 0:  # branch
                model.weight.register_hook(sync)  # register
        for step in range(3):
            loss.backward()  # backward
            dist.all_reduce(w)  # reduce
            sync(w)  # direct
        """,
    )
    torch = "/usr/lib/python3/site-packages/torch/autograd/graph.py"
    hooked = [
        (f, "<module>", at("backward")),
        (torch, "_engine_run_backward", 9),
        (f, "sync", at("hook")),
    ]
    for path in (hooked, [hooked[0], hooked[2]]):  # every frame, or the user's alone
        p, why = find_parting(
            *_sides({0: path}, {1: [(f, "<module>", at("reduce"))]}), diverged=True
        )
        assert p is not None, why
        assert (p.site, p.kind, p.ranks_in, p.ranks_out) == (
            f"train.py:{at('branch')}",
            "if",
            [0],
            [1],
        )
        assert p.into == f"model.weight.register_hook(sync) (train.py:{at('register')})"
    direct = [(f, "<module>", at("direct")), (f, "sync", at("hook"))]
    p, why = find_parting(*_sides({0: direct}, {1: [(f, "<module>", at("reduce"))]}), diverged=True)
    assert p is None or p.site != f"train.py:{at('branch')}"
    p, why = find_parting(*_sides({0: hooked}, {1: direct}), diverged=True)  # both run it
    assert p is None or p.site != f"train.py:{at('branch')}"
    # a method a framework calls back: the branch that made its class's object
    (tmp_path / "fw").mkdir()
    g, on = _script(
        tmp_path / "fw",
        """
        import os
        class NormLogger(Callback):
            def on_step(self, trainer):
                trainer.strategy.reduce(norm)  # reduce
        callbacks = []
        if int(os.environ["LOCAL_RANK"]) == 0:  # zero
            callbacks.append(NormLogger())  # made
        trainer.fit(model)  # fit
        """,
    )
    lib = "/usr/lib/python3/site-packages/lightning/loops/loop.py"
    p, why = find_parting(
        *_sides(
            {0: [(g, "<module>", on("fit")), (lib, "run", 5), (g, "on_step", on("reduce"))]},
            {1: [(g, "<module>", on("fit")), (lib, "run", 9)]},
        ),
        diverged=True,
    )
    assert p is not None, why
    assert (p.site, p.ranks_in) == (f"train.py:{on('zero')}", [0])
    assert p.into == f"callbacks.append(NormLogger()) (train.py:{on('made')})"


def test_two_arms_of_one_if(tmp_path):
    f, at = _script(
        tmp_path,
        """
        import torch.distributed as dist
        if rank == 0:  # decide
            dist.barrier()  # barrier
        else:
            while not os.path.exists(marker):
                time.sleep(0.2)  # poll
        """,
    )
    p, why = find_parting(
        *_sides({1: [(f, "<module>", at("poll"))]}, {0: [(f, "<module>", at("barrier"))]})
    )
    assert p is not None, why
    assert (p.kind, p.site, p.ranks_in, p.ranks_out) == (
        "else",
        f"train.py:{at('decide')}",
        [1],
        [0],
    )


@pytest.mark.parametrize(
    ("culprit", "other", "why"),
    [
        ("reduce", "reduce", "same line"),
        ("a", "b", "no branch or loop"),
    ],
)
def test_no_parting_is_said_with_its_reason(tmp_path, culprit, other, why):
    f, at = _script(
        tmp_path,
        """
        import torch.distributed as dist
        dist.all_reduce(w)  # reduce
        dist.all_reduce(w)  # a
        dist.barrier()  # b
        """,
    )
    p, reason = find_parting(
        *_sides({1: [(f, "<module>", at(culprit))]}, {0: [(f, "<module>", at(other))]})
    )
    assert p is None and why in reason


def test_an_unreadable_source_gives_no_parting(tmp_path):
    p, reason = find_parting(
        *_sides(
            {1: [("/nowhere/train.py", "<module>", 3)]}, {0: [("/nowhere/train.py", "<module>", 5)]}
        )
    )
    assert p is None and "could not be read" in reason


@pytest.mark.parametrize("file", ["<string>", "<eval_with_key>.3"])
def test_generated_code_gives_no_parting_and_says_so(tmp_path, file):
    """Frames of exec'd text or of torch's generated graph code have no source to read: the
    reason names the file it could not read."""
    f, at = _script(tmp_path, "step()  # call\n")
    p, reason = find_parting(
        *_sides(
            {1: [(f, "<module>", at("call")), (file, "step", 2)]},
            {0: [(f, "<module>", at("call")), (file, "step", 3)]},
        )
    )
    assert p is None and f"the source of {file} could not be read" in reason


def test_the_probe_captures_only_simple_values_its_conditions_read():
    """A thread waits inside a function whose conditions read a bool, an int, a str, a float
    and a list: the capture holds the four simple values and nothing of the list."""
    import threading

    from rankscope.probe import _values

    entered, release = threading.Event(), threading.Event()

    def worker() -> None:
        is_main, step, mode, loss, shard = True, 7, "train" * 40, 0.25, [1, 2, 3]
        unused = "read by no condition"
        if is_main and step > 3 and mode and loss < 1.0 and shard:
            entered.set()
            release.wait(10 + 0 * len(unused))

    t = threading.Thread(target=worker, name="worker")
    t.start()
    try:
        assert entered.wait(10)
        record = json.loads(_values.capture_line(7, "request", own=set()))
    finally:
        release.set()
        t.join()
    assert (record["id"], record["reason"]) == (7, "request")
    frames = [f for th in record["threads"] for f in th["frames"] if f[1] == "worker"]
    assert len(frames) == 1
    values = frames[0][3]
    assert values == {"is_main": True, "step": 7, "mode": ("train" * 40)[:80], "loss": 0.25}


def test_hostile_values_files_are_skipped_and_reported(tmp_path):
    from rankscope.collect import Problems, Source, read_values

    path = tmp_path / "values.jsonl"
    good = {
        "id": 1,
        "t": 1.0,
        "reason": "stall",
        "threads": [
            {"thread": "0x1", "frames": [["/u/train.py", "<module>", 9, {"step": 2, "ok": None}]]}
        ],
    }
    bad_value = {
        "id": 2,
        "threads": [{"thread": "0x1", "frames": [["f", "g", 1, {"x": {"a": 1}}]]}],
    }
    path.write_text(
        "\n".join([json.dumps(good), "not json", json.dumps(bad_value), "[1, 2]", '{"threads": 3}'])
        + "\n"
    )
    problems = Problems()
    table = read_values([Source(path, "ranks/0/values.jsonl", rank=0)], problems=problems)
    assert table[["rank", "line", "name"]].values.tolist() == [[0, 9, "step"], [0, 9, "ok"]]
    assert table["value"].tolist() == [2, None]
    assert problems.rows == [
        ("ranks/0/values.jsonl", "values", "4 line(s) are not a capture of values; skipped")
    ]


def test_outside_any_loop_the_earlier_side_took_the_branch(tmp_path):
    """No loop around: rank 0, at the earlier statement, took its branch (a barrier only it
    makes); ranks 1 and 2 went past it to the else of a later if, not into a branch of their
    own."""
    f, at = _script(
        tmp_path,
        """
        import torch.distributed as dist
        if how == "barrier" and rank == 0:  # decide
            dist.barrier()  # barrier
        if how == "op" and odd:
            dist.all_gather(out, x)
        else:
            dist.all_reduce(x)  # reduce
        """,
    )
    p, why = find_parting(
        *_sides({1: [(f, "<module>", at("reduce"))]}, {0: [(f, "<module>", at("barrier"))]})
    )
    assert p is not None, why
    assert (p.kind, p.site, p.ranks_in, p.ranks_out) == ("if", f"train.py:{at('decide')}", [0], [1])


def _framework(tmp_path):
    """A user's script and the framework it calls, installed as a package (site-packages): the
    framework's loop calls the user's hook, and makes collectives of its own."""
    lib = tmp_path / "site-packages" / "fwlib"
    lib.mkdir(parents=True)
    loop = lib / "loop.py"
    loop.write_text(
        textwrap.dedent(
            """
            def fit(module, dist, world):
                for epoch in range(3):
                    module.on_epoch_end()  # hook
                    if dist.is_initialized() and world > 1:  # lib-decide
                        dist.broadcast(stop)  # lib-broadcast
            """
        ).lstrip()
    )
    f, at = _script(
        tmp_path,
        """
        class Model:
            def on_epoch_end(self):
                if self.is_global_zero:  # decide
                    self.all_gather(preds)  # gather
        fit(Model(), dist, 3)  # fit
        """,
    )
    lines = loop.read_text().splitlines()

    def lib_at(tag: str) -> int:
        return next(n for n, line in enumerate(lines, 1) if f"# {tag}" in line)

    return f, at, str(loop), lib_at


def test_the_user_s_branch_into_a_hook_not_the_framework_s_own_decision(tmp_path):
    """Rank 0 went into the user's hook's ``if`` and gathers there; ranks 1-2 left the hook and
    are in the framework's own broadcast, under its own ``if``: the user's frames of the two
    sides do not stand at the same line, so the user's branch is the parting line."""
    f, at, loop, lib_at = _framework(tmp_path)
    fit = (f, "<module>", at("fit"))
    p, why = find_parting(
        *_sides(
            {0: [fit, (loop, "fit", lib_at("hook")), (f, "on_epoch_end", at("gather"))]},
            {r: [fit, (loop, "fit", lib_at("lib-broadcast"))] for r in (1, 2)},
        ),
        diverged=True,
    )
    assert p is not None, why
    assert (p.site, p.source) == (f"train.py:{at('decide')}", "if self.is_global_zero:")
    assert (p.ranks_in, p.ranks_out) == ([0], [1, 2])


def test_the_framework_s_decision_where_the_user_s_frames_stand_at_the_same_line(tmp_path):
    """Both sides entered the framework from the same user line and part inside it: the
    framework's own branch is the decision."""
    f, at, loop, lib_at = _framework(tmp_path)
    fit = (f, "<module>", at("fit"))
    p, why = find_parting(
        *_sides(
            {0: [fit, (loop, "fit", lib_at("lib-broadcast"))]},
            {1: [fit, (loop, "fit", lib_at("hook"))]},
        ),
    )
    assert p is not None, why
    assert p.site == f"loop.py:{lib_at('lib-decide')}"


def test_a_rank_that_ran_out_of_a_framework_s_loop_is_parted_at_that_loop(tmp_path):
    """The ranks' calls came from the same line of a framework's batch loop, the culprit's fewer
    times (it ran out of batches and returned): the parting line is the loop that holds the
    call, the framework's, under the user's line that leads into it."""
    lib = tmp_path / "site-packages" / "fw"
    lib.mkdir(parents=True)
    loop = lib / "loop.py"
    loop.write_text(
        textwrap.dedent(
            """
            def run(self):
                while not self.done:  # loop
                    self.advance()  # advance
            """
        ).lstrip()
    )
    f, at = _script(tmp_path, "trainer.fit(model, data)  # fit\n")
    lines = loop.read_text().splitlines()
    line = {
        t: next(n for n, s in enumerate(lines, 1) if f"# {t}" in s) for t in ("loop", "advance")
    }
    path = [(f, "<module>", at("fit")), (str(loop), "run", line["advance"])]
    p = loop_around(path, [2], [0, 1])
    assert p is not None
    assert (p.site, p.kind, p.left_loop) == (f"loop.py:{line['loop']}", "while", True)
    assert (p.ranks_in, p.ranks_out) == ([0, 1], [2])
    assert f"under train.py:{at('fit')} (fit)" in p.into
    assert "ranks 0-1 stayed in the loop" in p.text() and "rank 2 left it" in p.text()
    assert not runs_alike(p)


def test_a_loop_of_constant_count_is_not_one_a_rank_ran_out_of(tmp_path):
    """``for step in range(3):`` runs as often on every rank: a rank that made its call fewer
    times skipped one by a branch the paths do not show, and no loop is named."""
    f, at = _script(
        tmp_path,
        """
        for step in range(3):  # loop
            loss.backward()  # call
        """,
    )
    assert loop_around([(f, "<module>", at("call"))], [2], [0, 1]) is None
    counted = Parting(
        site="x",
        source="for step in range(3):",
        kind="for",
        ranks_in=[0],
        ranks_out=[1],
        into="",
        left_loop=True,
    )
    assert runs_alike(counted)


def test_the_handler_that_caught_a_collective_s_error_is_the_innermost_that_catches_it(tmp_path):
    """Of a call's path, the innermost frame in a ``try`` body whose handler catches what a
    collective raises (a RuntimeError): a handler of another error is passed by, as Python
    passes it; a line in a handler, not its body, is not guarded by it; a library's frame says
    its package."""
    lib = tmp_path / "site-packages" / "quietmetrics" / "__init__.py"
    lib.parent.mkdir(parents=True)
    lib.write_text(
        textwrap.dedent(
            """\
            import torch.distributed as dist

            def sync(x):
                try:
                    try:
                        dist.all_reduce(x)
                    except ValueError:
                        return x
                except (OSError, dist.DistBackendError) as err:
                    return x

            def report(x):
                try:
                    pass
                except Exception:
                    dist.all_reduce(x)
            """
        )
    )
    user = tmp_path / "train.py"
    user.write_text("try:\n    sync(x)\nexcept:\n    pass\n")
    caught = catcher([(str(user), "<module>", 2), (str(lib), "sync", 6)])
    assert caught is not None
    assert (caught.site, caught.source, caught.library) == (
        "__init__.py:9",
        "except (OSError, dist.DistBackendError) as err:",
        "quietmetrics",
    )
    assert caught.frame == (str(lib), "sync", 6)
    # the library's handler guards nothing here: the user's bare except does
    mine = catcher([(str(user), "<module>", 2), (str(lib), "report", 16)])
    assert mine is not None and (mine.site, mine.source, mine.library) == (
        "train.py:3",
        "except:",
        None,
    )
    assert catcher([(str(tmp_path / "gone.py"), "f", 3), (str(lib), "report", 16)]) is None
