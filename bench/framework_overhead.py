"""Probe overhead under the frameworks' own loops: Lightning's Trainer (DDP strategy) and the
Hugging Face Trainer, 2 ranks, gloo, CPU (requirement: step time at most 3 % longer).

One job per framework under rankscope's bootstrap (see _framework_loop.py): a tiny model, one
sample per step, so that the step is mostly the framework's own work and its collectives (the
probe's share is as large as it gets). The probe is switched off and on in blocks of steps,
the order swapped every pair, and every step is timed. The ratio is the total time of the "on"
steps over that of the "off" steps, with a 95 % interval from the spread of the block pairs
(probe_overhead.ratio_ci). It is printed as timed, then with each step counted at most 5 times
the median "off" step: a shared machine holds up a few steps in either arm for many
milliseconds, and those few make most of the spread.

    python bench/framework_overhead.py [--blocks 50] [--block 20] [--framework lightning trainer]

A framework that is not installed is skipped, saying so (``pip install -e ".[frameworks]"``).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
from pathlib import Path

from probe_overhead import launch, ratio_ci

WORKER = Path(__file__).parent / "_framework_loop.py"
NEEDS = {"lightning": "lightning", "trainer": "transformers"}
NAMES = {"lightning": "Lightning Trainer (DDP)", "trainer": "Hugging Face Trainer"}
CAP = 5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=50, help="pairs of off/on blocks")
    ap.add_argument("--block", type=int, default=20, help="steps per block")
    ap.add_argument("--warmup", type=int, default=20, help="steps before the first block")
    ap.add_argument("--framework", nargs="+", choices=tuple(NEEDS), default=list(NEEDS))
    args = ap.parse_args()
    print(f"gloo, 2 ranks; {args.blocks} pairs of {args.block}-step blocks, the probe off / on")
    with tempfile.TemporaryDirectory() as tmp:
        for fw in args.framework:
            if importlib.util.find_spec(NEEDS[fw]) is None:
                print(f"{NAMES[fw]}: skipped, needs {NEEDS[fw]} (pip install -e '.[frameworks]')")
                continue
            res = launch(
                probe=True,
                run_dir=Path(tmp) / fw,
                worker=WORKER,
                args=[
                    f"--framework={fw}",
                    f"--blocks={args.blocks}",
                    f"--block={args.block}",
                    f"--warmup={args.warmup}",
                ],
            )
            steps = {mode: [t for block in res[mode] for t in block] for mode in ("off", "on")}
            cap = CAP * statistics.median(steps["off"])
            print(f"{NAMES[fw]}:")
            for label, limit in (("every step as timed", None), ("host hiccups capped", cap)):
                off, on = (
                    [sum(t if limit is None else min(t, limit) for t in b) for b in res[mode]]
                    for mode in ("off", "on")
                )
                ratio, half = ratio_ci(off, on)
                n_off, n_on = len(steps["off"]), len(steps["on"])
                print(
                    f"  {label:20s} off {sum(off) / n_off / 1e6:6.2f} ms/step  on"
                    f" {sum(on) / n_on / 1e6:6.2f} ms/step  ratio {ratio:.3f} +- {half:.3f} (95 %)"
                )
            print(
                f"  steps over the cap ({cap / 1e6:.1f} ms, {CAP}x the median off step):"
                f" off {sum(t > cap for t in steps['off'])},"
                f" on {sum(t > cap for t in steps['on'])} of {len(steps['off'])} each"
            )
    print("requirement: ratio <= 1.03")


if __name__ == "__main__":
    main()
