"""bench_step_start: run_all's steps started as new Python processes (STEP_START "fresh": each evaluation and
the report imports torch, torchvision, open_clip and transformers again) against each step's run() in run_all's
own process (STEP_START "process": imported once), side by side on the same machine.

Each repeat runs run_all on a fresh copy of the demo's inputs in one folder (so both modes write the same
paths; the folder is emptied between runs, its cache too: every step computes everything), alternating the
modes. Prints each step's seconds in each mode, run_all's total, the ratio, and whether the two modes'
outputs are the same but for their times (benchmarks/compare_outputs.py).
  python benchmarks/bench_step_start.py                       # the demo model, every step, 2 repeats
  python benchmarks/bench_step_start.py --MODELS="['demo', 'demo']" --REPEATS=3
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

_ROOT = os.path.dirname(os.path.abspath(os.path.dirname(__file__)))
sys.path.insert(1, _ROOT)
import common  # noqa: E402

MODES = ["fresh", "process"]  # two of "fresh", "process" (and "fork" on a checkout before 2026-11-28: its step helper)
MODELS = ["demo"]  # list of model specs or names, as run_all's MODELS
REPEATS = 2  # int >= 1: runs of each mode (alternating; each step's figure is its fastest)
STEPS = None  # None = every demo step; or a list of run_all step names
CONFIG = common.configure(globals())


def run(folder, mode):
    """run_all on `folder` (emptied and given the demo's inputs) in `mode`: ({step: seconds}, total s)."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    shutil.copy(os.path.join(_ROOT, "demo", "lgip_demo.jsonl"), folder)
    shutil.copytree(os.path.join(_ROOT, "demo", "images"), os.path.join(folder, "images"))
    args = [
        sys.executable,
        os.path.join(_ROOT, "run_all.py"),
        f"--DEMO_JSONL={os.path.join(folder, 'lgip_demo.jsonl')}",
        "--DATA=demo",
        f"--MODELS={MODELS!r}",
        "--DEVICE=cpu",
        f"--STEP_START={mode}",
    ]
    if STEPS is not None:
        args.append(f"--STEPS={STEPS!r}")
    proc = subprocess.run(args, capture_output=True, text=True, cwd=_ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"run_all ({mode}) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    steps = {
        m.group(1): float(m.group(2)) for m in re.finditer(r"^\[\d+/\d+\] (\w+)  done in ([\d.]+) s", proc.stdout, re.M)
    }
    total = float(re.search(r"^run_all: ran \d+ of \d+ steps .* in ([\d.]+) s", proc.stdout, re.M).group(1))
    return steps, total


def main():
    work = tempfile.mkdtemp(prefix="lgip-step-start-")
    folder = os.path.join(work, "demo")
    a, b = MODES
    best = {a: ({}, None), b: ({}, None)}
    for r in range(REPEATS):
        for mode in MODES:
            steps, total = run(folder, mode)
            old_steps, old_total = best[mode]
            best[mode] = (
                {k: min(v, old_steps.get(k, v)) for k, v in steps.items()},
                total if old_total is None else min(total, old_total),
            )
            print(f"repeat {r + 1} {mode}: run_all {total:.1f} s", flush=True)
            if mode == a and r == REPEATS - 1:
                shutil.copytree(folder, os.path.join(work, a))
    same = subprocess.run(
        [sys.executable, os.path.join(_ROOT, "benchmarks", "compare_outputs.py"), os.path.join(work, a), folder],
        capture_output=True,
        text=True,
    )
    print(f"\n{'step':<30}{a + ' s':>10}{b + ' s':>10}")
    for name, seconds in best[a][0].items():
        print(f"{name:<30}{seconds:>10.1f}{best[b][0].get(name, float('nan')):>10.1f}")
    ta, tb = best[a][1], best[b][1]
    print(f"{'run_all total':<30}{ta:>10.1f}{tb:>10.1f}   ({ta / tb:.2f}x)")
    print(
        f"outputs: {same.stdout.strip().splitlines()[-1]} (benchmarks/compare_outputs.py, last {a} run vs last {b} run)"
    )
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(same.returncode)


if __name__ == "__main__":
    main()
