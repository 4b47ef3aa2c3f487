"""Writing a :class:`~rankscope.replay._plan.Plan` out as a plain torch script.

The script imports only the standard library and torch. Ranks that make the same calls share one
function (a *role*), even when each uses its own group of the same kind (its tensor-parallel
group, say: the group is then a parameter of the role); repeated runs of calls become loops;
every call carries its original group and sequence number (and call site, when known) in a
comment; the module docstring is the header that says what was kept, dropped, remapped and
scaled.
"""

from __future__ import annotations

import keyword
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rankscope.analyze.diagnosis import compact_ranks
from rankscope.replay._plan import WORLD, End, Plan, Step, Tensor

#: Longest run of calls that is looked for as the body of a loop.
MAX_PERIOD = 16
DEFAULT_TIMEOUT_S = 120
WIDTH = 100
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_TRAILING_NUMBER = re.compile(r"[\W_]*\d+$")
#: Names a role's group parameter must not take (the script's own globals and modules).
_RESERVED = {"dist", "torch", "t", "ts", "os", "sys", "time", "datetime", "partial", "stay", "G"}


@dataclass
class Role:
    """Ranks that replay the same calls and end the same way."""

    name: str
    ranks: list[int]
    """Original ranks."""
    steps: list[Step]
    """The calls of its first rank (the others' differ only in which group a label stands for)."""
    labels: list[str | None]
    """Per step, the label of its group in the role (``None`` for the world group)."""
    sites: list[str | None]
    """Per step, the call site all the role's ranks agree on."""
    end: End
    bindings: dict[int, dict[str, str]] = field(default_factory=dict)
    """Per original rank, label -> the original group it stands for."""
    params: dict[str, str] = field(default_factory=dict)
    """Label -> parameter name, for labels that stand for different groups on different ranks."""

    def group(self, label: str | None) -> str:
        """The original group a label stands for on the role's first rank."""
        return WORLD if label is None else self.bindings[self.ranks[0]][label]


def clean(text: Any, limit: int = 300) -> str:
    """Text from the evidence made safe for a comment: one line, no control characters."""
    text = _CONTROL.sub(" ", str(text)).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _who(ranks: Sequence[int], noun: str = "rank") -> str:
    ranks = sorted(ranks)
    return f"{noun}{'' if len(ranks) == 1 else 's'} {compact_ranks(ranks)}"


def _with_comment(code: str, comment: str, indent: str) -> list[str]:
    """``code  # comment``, or the comment on the lines above when that would be too long."""
    if not comment:
        return [code]
    line = f"{code}  # {comment}"
    if len(line) <= WIDTH:
        return [line]
    wrapped = textwrap.wrap(comment, WIDTH - len(indent) - 2, break_on_hyphens=False)
    return [*(f"{indent}# {w}" for w in wrapped), code]


class Writer:
    """Builds the script text of one plan."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.new = plan.new_rank
        self.culprits = set(plan.diagnosis.culprit_ranks)
        c = plan.diagnosis.collective
        self.divergence = (c.pg, c.seq) if c is not None and c.seq is not None else None
        self.roles = self._roles()

    # --- roles -------------------------------------------------------------------------------
    def _labels(self, rank: int) -> tuple[list[str | None], dict[str, str]]:
        """Each step's group as a label (``g1``, ``g2``, ... by first use; the world: None)."""
        labels: list[str | None] = []
        binding: dict[str, str] = {}
        of: dict[str, str] = {}
        for s in self.plan.steps[rank]:
            if s.pg == WORLD:
                labels.append(None)
                continue
            if s.pg not in of:
                of[s.pg] = f"g{len(of) + 1}"
                binding[of[s.pg]] = s.pg
            labels.append(of[s.pg])
        return labels, binding

    def _step_key(self, s: Step, label: str | None) -> tuple[Any, ...]:
        return (
            s.spec.call,
            s.op,
            label,
            self.group_size(s.pg),
            s.seq,
            s.p2p_seq,
            s.tensors,
            self._root_key(s),
            tuple((k, self.new.get(p), t) for k, p, t in s.batch),
            s.async_op,
            s.note,
            s.completed,
            s.failed,
        )

    def _roles(self) -> list[Role]:
        plan = self.plan
        by_key: dict[Any, list[int]] = {}
        labelled = {}
        for rank in plan.kept:
            labels, binding = self._labels(rank)
            labelled[rank] = (labels, binding)
            steps = plan.steps[rank]
            key = (
                tuple(self._step_key(s, lab) for s, lab in zip(steps, labels, strict=True)),
                plan.ends[rank],
            )
            by_key.setdefault(key, []).append(rank)
        roles = []
        for i, ranks in enumerate(sorted(by_key.values(), key=lambda r: r[0]), start=1):
            steps = plan.steps[ranks[0]]
            sites = []
            for pos in range(len(steps)):
                # Sites may be known for a sample of the ranks only: the known ones must agree.
                seen = {plan.steps[r][pos].site for r in ranks} - {None}
                sites.append(seen.pop() if len(seen) == 1 else None)
            role = Role(
                name=f"role_{i}",
                ranks=ranks,
                steps=steps,
                labels=labelled[ranks[0]][0],
                sites=sites,
                end=plan.ends[ranks[0]],
                bindings={r: labelled[r][1] for r in ranks},
            )
            role.params = self._params(role)
            roles.append(role)
        return roles

    def _params(self, role: Role) -> dict[str, str]:
        """Parameter names for the labels that stand for different groups on different ranks:
        from the groups' descriptions (``tp3`` -> ``tp_group``) when they agree."""
        out: dict[str, str] = {}
        first = role.bindings[role.ranks[0]]
        for i, label in enumerate(first, start=1):
            groups = {role.bindings[r][label] for r in role.ranks}
            if len(groups) == 1:
                continue
            bases = {
                _TRAILING_NUMBER.sub("", self.plan.groups[g].desc or "").lower() for g in groups
            }
            base = re.sub(r"\W+", "_", bases.pop()).strip("_") if len(bases) == 1 else ""
            name = f"{base}_group" if base and not base[0].isdigit() else f"group_{i}"
            if keyword.iskeyword(name) or name in _RESERVED or name in out.values():
                name = f"group_{i}"
            out[label] = name
        return out

    # --- groups, ranks and roots -------------------------------------------------------------
    def group_size(self, pg: str) -> int:
        if pg == WORLD:
            return len(self.plan.kept)
        return max(1, len(self.plan.groups[pg].kept))

    def _root(self, s: Step) -> int | None:
        """The replay rank of a rooted call's root or a p2p call's peer."""
        if s.spec.root is None or s.spec.family == "batch":
            return None
        if s.peer is not None and s.peer in self.new:
            return self.new[s.peer]
        if s.spec.p2p and s.spec.family != "object":
            return None  # a recv from any rank
        group = self.plan.groups.get(s.pg)
        kept = group.kept if group is not None and s.pg != WORLD else tuple(range(len(self.new)))
        return kept[0] if kept else 0

    def _root_key(self, s: Step) -> Any:
        """The root as the role sees it: a global rank, or its place in a group parameter."""
        root = self._root(s)
        if root is None or s.pg == WORLD or s.spec.p2p:
            return root
        kept = self.plan.groups[s.pg].kept
        return ("in group", kept.index(root) if root in kept else 0)

    def _group_expr(self, role: Role, label: str | None) -> str | None:
        if label is None:
            return None
        if label in role.params:
            return f"G[{role.params[label]}]"
        return f"G[{role.group(label)!r}]"

    def _root_expr(self, role: Role, s: Step, label: str | None) -> str | None:
        key = self._root_key(s)
        if isinstance(key, tuple):
            if label in role.params:
                return f"dist.get_global_rank({self._group_expr(role, label)}, {key[1]})"
            return str(self._root(s))
        return None if key is None else str(key)

    def _group_text(self, role: Role, label: str | None) -> str:
        if label is None:
            return f"group {WORLD}"
        if label in role.params:
            return role.params[label]
        return f"group {clean(role.group(label), 40)}"

    # --- calls -------------------------------------------------------------------------------
    def tensor(self, t: Tensor, n: int | None = None, *, first: int | None = None) -> str:
        shape = list(t.shape)
        if first is not None:
            shape = [first * (shape[0] if shape else 1), *shape[1:]]
        dims = ", ".join(str(d) for d in shape)
        dtype = "" if t.dtype == "float32" else f"dtype=torch.{t.dtype}"
        if n is None:
            return f"t({', '.join(p for p in (dims, dtype) if p)})"
        return f"ts({', '.join(p for p in (str(n), dims, dtype) if p)})"

    def call(self, role: Role, pos: int) -> str:
        """The code that replays step ``pos`` of ``role``."""
        s, label = role.steps[pos], role.labels[pos]
        spec, n = s.spec, self.group_size(s.pg)
        root = self._root_expr(role, s, label)
        group = self._group_expr(role, label)
        g = f"group={group}" if group else ""
        ts = s.tensors
        first = ts[0] if ts else Tensor((1,), "float32")
        call = spec.call
        args: list[str]
        if spec.family == "batch":
            ops = ", ".join(
                f"dist.P2POp(dist.{k}, {self.tensor(t)}, {self.new[p]}"
                + (f", {g}" if g else "")
                + ")"
                for k, p, t in s.batch
            )
            return f"PENDING.extend(dist.batch_isend_irecv([{ops}]))"
        if spec.family == "none":
            args = []
        elif spec.family == "object":
            args = self._object_args(call, n, root)
        elif spec.family == "one":
            args = [self.tensor(first)]
        elif spec.family == "many":
            args = ["[" + ", ".join(self.tensor(x) for x in ts) + "]"]
        elif call == "all_gather":
            args = [self.tensor(first, n), self.tensor(first)]
        elif call == "all_gather_into_tensor":
            args = [self.tensor(first, first=n), self.tensor(first)]
        elif call in ("gather", "scatter"):
            args = [self.tensor(first), f"{self.tensor(first, n)} if RANK == {root} else None"]
        elif call == "reduce_scatter":
            args = [self.tensor(first), self.tensor(first, n)]
        elif call == "reduce_scatter_tensor":
            args = [self.tensor(first), self.tensor(first, first=n)]
        elif call == "all_to_all":
            args = [self.tensor(first, n), self.tensor(first, n)]
        elif call == "all_to_all_single":
            args = [self.tensor(first, first=n), self.tensor(first, first=n)]
        else:  # not a family the replay knows: an all_reduce of the first tensor
            call, args = "all_reduce", [self.tensor(first)]
        if spec.root is not None and spec.family != "object" and root is not None:
            args.append(f"{spec.root}={root}")
        if g:
            args.append(g)
        text = f"dist.{call}({', '.join(args)})"
        if s.async_op and spec.family != "object":
            if call not in ("isend", "irecv"):
                text = text[:-1] + (", " if args else "") + "async_op=True)"
            return f"PENDING.append({text})"
        return text

    def _object_args(self, call: str, n: int, root: str | None) -> list[str]:
        if call == "broadcast_object_list":
            return ["[RANK]", f"src={root}"]
        if call == "all_gather_object":
            return [f"[None] * {n}", "RANK"]
        if call == "gather_object":
            return ["RANK", f"[None] * {n} if RANK == {root} else None", f"dst={root}"]
        if call == "scatter_object_list":
            return ["[None]", f"list(range({n})) if RANK == {root} else None", f"src={root}"]
        if call == "send_object_list":
            return ["[RANK]", f"dst={root}"]
        return ["[None]", f"src={root}"]  # recv_object_list

    def where(self, role: Role, pos: int, *, loop: bool = False) -> str:
        """The comment of one call: its group and number in the original, and its site."""
        s, site = role.steps[pos], role.sites[pos]
        parts = []
        group = self._group_text(role, role.labels[pos])
        if s.seq is not None:
            if not loop:
                parts.append(f"{group} #{s.seq}")
        else:
            peer = f" original rank {s.peer}" if s.peer is not None else ""
            to = "from" if "recv" in s.spec.call else "to"
            parts.append(f"{s.op} {to}{peer}" if peer else s.op)
            if s.pg != WORLD:
                parts.append(group)
        if s.op != s.spec.call:
            parts.append(f"recorded as {clean(s.op, 60)}")
        if site:
            parts.append(clean(site, 80))
        return ", ".join(parts)

    # --- role functions ----------------------------------------------------------------------
    def _is_divergence(self, role: Role, pos: int) -> list[int]:
        """The role's ranks for which step ``pos`` is where the ranks part."""
        if self.divergence is None:
            return []
        s, label = role.steps[pos], role.labels[pos]
        return [
            r
            for r in role.ranks
            if (WORLD if label is None else role.bindings[r][label], s.seq) == self.divergence
        ]

    def role_function(self, role: Role) -> list[str]:
        params = ", ".join(f"{p}: str" for p in role.params.values())
        lines = [f"def {role.name}({params}) -> None:"]
        doc = textwrap.wrap(self._role_doc(role), WIDTH - 11, break_on_hyphens=False)
        if len(doc) == 1:
            lines.append(f'    """{doc[0]}"""')
        else:
            lines += [f'    """{doc[0]}', *(f"    {d}" for d in doc[1:]), '    """']
        steps = role.steps
        special = {len(steps) - 1} if steps else set()
        special |= {p for p in range(len(steps)) if self._is_divergence(role, p)}
        shown: set[str] = set()
        pos = 0
        while pos < len(steps):
            nxt = min([p for p in special if p >= pos], default=len(steps))
            if nxt > pos:
                lines += self._segment(role, pos, nxt, shown)
                pos = nxt
                continue
            lines += self._single(role, pos, shown, last=pos == len(steps) - 1)
            pos += 1
        if any(s.async_op for s in steps) and role.end.kind not in ("blocked", "failed"):
            lines.append("    for work in PENDING:  # asynchronous work, waited for at the end")
            lines.append("        work.wait()")
        lines += self._end(role)
        return lines

    def _role_doc(self, role: Role) -> str:
        new = [self.new[r] for r in role.ranks]
        who = f"Original {_who(role.ranks)} (replay {_who(new)})"
        if set(role.ranks) <= self.culprits:
            who += ", the culprit" + ("s" if len(role.ranks) > 1 else "")
        calls = f"{len(role.steps)} call{'' if len(role.steps) == 1 else 's'}"
        text = f"{who}: {calls}; {self.end_text(role)}."
        if role.params:
            text += (
                " "
                + "; ".join(
                    f"{p}: the name of the rank's own {self._param_kind(role, lab)}"
                    for lab, p in role.params.items()
                )
                + "."
            )
        return text

    def _param_kind(self, role: Role, label: str) -> str:
        descs = {self.plan.groups[role.bindings[r][label]].desc for r in role.ranks}
        shown = ", ".join(f"{d}" for d in sorted(d for d in descs if d)[:3])
        return f"group ({shown}, ...)" if shown else "group"

    def end_text(self, role: Role) -> str:
        end, steps = role.end, role.steps
        at = ""
        if steps:
            last = steps[-1]
            group = self._group_text(role, role.labels[-1])
            at = f"{last.op} ({group} #{last.seq})" if last.seq is not None else last.op
        texts = {
            "blocked": f"never returned from {at}",
            "failed": f"{at} failed",
            "exit": "then exited 0",
            "raise": "then raised",
            "exit_code": f"then exited with code {end.code}",
            "signal": f"then a signal ({end.code}) ended it",
            "linger": "then stayed alive outside any collective",
        }
        return texts[end.kind]

    def _segment(self, role: Role, start: int, stop: int, shown: set[str]) -> list[str]:
        """Calls ``start..stop-1``, runs of repeated calls as loops."""
        keys = [self._loop_key(role, i) for i in range(start, stop)]
        out = []
        i = 0
        while i < len(keys):
            best_p, best_k = 1, 1
            for p in range(1, min(MAX_PERIOD, (len(keys) - i) // 2) + 1):
                k = 1
                while (
                    i + (k + 1) * p <= len(keys)
                    and keys[i + k * p : i + (k + 1) * p] == keys[i : i + p]
                ):
                    k += 1
                if k >= 2 and k * p > best_k * best_p:
                    best_p, best_k = p, k
            if best_k == 1:
                out += self._single(role, start + i, shown)
                i += 1
                continue
            block = range(start + i, start + i + best_p * best_k)
            rounds = f"{best_k} rounds of {best_p} calls" if best_p > 1 else f"{best_k} calls"
            out.append(f"    for _ in range({best_k}):  # {self._span(role, block)}: {rounds}")
            for j in range(best_p):
                out += self._single(role, start + i + j, shown, loop=True, indent="        ")
            i += best_p * best_k
        return out

    def _loop_key(self, role: Role, pos: int) -> tuple[Any, ...]:
        s = role.steps[pos]
        return (
            s.spec.call,
            s.op,
            role.labels[pos],
            s.seq is None,
            s.tensors,
            self._root_key(s),
            s.batch,
            s.async_op,
            s.note,
            role.sites[pos],
        )

    def _span(self, role: Role, block: range) -> str:
        groups: dict[str, list[int]] = {}
        p2p = 0
        for pos in block:
            s = role.steps[pos]
            if s.seq is None:
                p2p += 1
            else:
                groups.setdefault(self._group_text(role, role.labels[pos]), []).append(s.seq)
        parts = [f"{g} #{min(v)}-#{max(v)}" for g, v in groups.items()]
        if p2p:
            parts.append(f"{p2p} point-to-point calls")
        return ", ".join(parts)

    def _single(
        self,
        role: Role,
        pos: int,
        shown: set[str],
        *,
        last: bool = False,
        loop: bool = False,
        indent: str = "    ",
    ) -> list[str]:
        s = role.steps[pos]
        out = []
        if s.note and s.note not in shown:  # each note once per role, at its first call
            shown.add(s.note)
            wrapped = textwrap.wrap(clean(s.note), WIDTH - len(indent) - 2, break_on_hyphens=False)
            out += [f"{indent}# {w}" for w in wrapped]
        parted = [] if loop else self._is_divergence(role, pos)
        if parted:
            out += [f"{indent}# {w}" for w in self._divergence_text(role, parted)]
        comment = self.where(role, pos, loop=loop)
        if last and role.end.kind == "blocked":
            comment += ": it never returned in the original"
        out += _with_comment(f"{indent}{self.call(role, pos)}", comment, indent)
        return out

    def _divergence_text(self, role: Role, parted: list[int]) -> list[str]:
        c = self.plan.diagnosis.collective
        assert c is not None
        calls: dict[str, list[int]] = {}
        for r, op in sorted(c.op_by_rank.items()):
            calls.setdefault(op or "", []).append(r)
        parts = [
            f"original {_who(ranks)} {'called ' + op if op else 'never called it'}"
            for op, ranks in calls.items()
        ]
        whose = "" if len(parted) == len(role.ranks) else f" (for original {_who(parted)})"
        text = f">>> where the ranks part{whose}, group {c.pg} #{c.seq}: " + "; ".join(parts)
        return textwrap.wrap(clean(text, 600), WIDTH - 6, break_on_hyphens=False)

    def _end(self, role: Role) -> list[str]:
        end = role.end
        who = f"original {_who(role.ranks)}"
        if end.kind == "blocked":
            why = "the call above returned, but it never did in the original"
            return [f"    stay({why!r})"]
        if end.kind == "failed":
            first = str(end.detail or "").strip().split("\n", 1)[0]
            msg = clean(f"replayed failure: the call above failed in the original: {first}", 240)
            return [
                f"    # in {who} the call above raised (a symptom: it waited for the others)",
                f"    raise RuntimeError({msg!r})",
            ]
        if end.kind == "exit":
            return [f"    # {who} exited 0 here, leaving the others waiting"]
        if end.kind == "raise":
            msg = clean(f"replayed failure: {end.detail}", 500)
            return [f"    # {who} raised here", f"    raise RuntimeError({msg!r})"]
        if end.kind == "exit_code":
            return [f"    # {who} exited here with code {end.code}", f"    sys.exit({end.code})"]
        if end.kind == "signal":
            return [
                f"    # a signal ({end.code}) ended {who} here",
                f"    os.kill(os.getpid(), {end.code})",
            ]
        why = clean(
            f"made no further call ({end.detail})" if end.detail else "made no further call"
        )
        return [f"    # {who} {why}", f"    stay({why!r})"]

    # --- the whole script --------------------------------------------------------------------
    def _dispatch(self) -> list[str]:
        lines = ["#: Replay rank -> the role it runs.", "ROLES = {"]
        entries = sorted(
            ((self.new[r], role, r) for role in self.roles for r in role.ranks),
            key=lambda x: x[0],
        )
        for new, rl, r in entries:
            if rl.params:
                binds = ", ".join(f"{p}={rl.bindings[r][lab]!r}" for lab, p in rl.params.items())
                target = f"partial({rl.name}, {binds})"
                descs = [self.plan.groups[rl.bindings[r][lab]].desc for lab in rl.params]
                extra = ", ".join(clean(d, 30) for d in descs if d)
                comment = f"original rank {r}" + (f" ({extra})" if extra else "")
            else:
                target, comment = rl.name, f"original rank {r}"
            lines += _with_comment(f"    {new}: {target},", comment, "    ")
        lines.append("}")
        return lines

    def script(self, header: str) -> str:
        plan = self.plan
        roles = [line for role in self.roles for line in [*self.role_function(role), "", ""]]
        partial = any(role.params for role in self.roles)
        doc = header.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
        body = [
            f'"""{doc}"""',
            "",
            "import datetime",
            "import os",
            "import sys",
            "import time",
            *(["from functools import partial"] if partial else []),
            "",
            "import torch",
            "import torch.distributed as dist",
            "",
            f"WORLD_SIZE = {len(plan.kept)}",
            "#: The collective timeout. rankscope's stall watchdog catches the hang within seconds;",
            "#: this only ends a replay started with bare torchrun.",
            f'TIMEOUT_S = float(os.environ.get("REPLAY_TIMEOUT_S", "{DEFAULT_TIMEOUT_S}"))',
            "RANK = -1",
            "#: Process groups, by their name in the original job.",
            "G: dict = {}",
            "#: Asynchronous work (isend, irecv, async_op=True), waited for at the end of a role.",
            "PENDING: list = []",
            "",
            "",
            "def t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:",
            '    """A tensor of a recorded shape and dtype (its values play no part in a hang)."""',
            "    return torch.ones(shape, dtype=dtype)",
            "",
            "",
            "def ts(n: int, *shape: int, dtype: torch.dtype = torch.float32) -> list:",
            '    """``n`` such tensors: the list of a gather, a scatter or an all_to_all."""',
            "    return [t(*shape, dtype=dtype) for _ in range(n)]",
            "",
            "",
            "def stay(why: str) -> None:",
            '    """Stay alive outside any collective, as the original rank did."""',
            '    print(f"replay rank {RANK}: {why}; staying here", file=sys.stderr, flush=True)',
            "    deadline = time.monotonic() + TIMEOUT_S",
            "    while time.monotonic() < deadline:",
            "        time.sleep(0.2)",
            '    raise TimeoutError(f"replay rank {RANK}: gave up after {TIMEOUT_S:.0f} s: {why}")',
            "",
            "",
            "def make_groups() -> None:",
            '    """The original\'s process groups that a kept rank uses, created by every rank in',
            '    the same order, as torch requires."""',
            *self._make_groups(),
            "",
            "",
            *roles,
            *self._dispatch(),
            "",
            "",
            "def main() -> None:",
            "    global RANK",
            '    world = int(os.environ.get("WORLD_SIZE", "1"))',
            "    if world != WORLD_SIZE:",
            "        raise SystemExit(",
            '            f"this replay runs on {WORLD_SIZE} ranks, not {world}: "',
            '            f"torchrun --nproc-per-node {WORLD_SIZE} {os.path.basename(sys.argv[0])}"',
            "        )",
            '    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))',
            "    RANK = dist.get_rank()",
            "    make_groups()",
            "    ROLES[RANK]()",
            "    dist.destroy_process_group()",
            "",
            "",
            'if __name__ == "__main__":',
            "    main()",
            "",
        ]
        return "\n".join(body)

    def _make_groups(self) -> list[str]:
        lines = []
        for g in self.plan.groups.values():
            if g.name == WORLD or g.replay_name is None:
                continue
            desc = f", group_desc={clean(g.desc, 80)!r}" if g.desc else ""
            was = f"original group {clean(g.name, 40)}" + (
                f" ({clean(g.desc, 60)})" if g.desc else ""
            )
            lines += _with_comment(
                f"    G[{g.name!r}] = dist.new_group({list(g.kept)}{desc})",
                f"{was}: {_who(g.members)}",
                "    ",
            )
        return lines or ["    pass  # the replay uses the world group only"]
