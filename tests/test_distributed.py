"""torchrun sharding (lgip/evaluation.py): two gloo processes give the single process's metrics
and score files, and leave no thread of the process group running into their exit."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REFERENCE, ROOT, TINY_MODELS, eval_args, eval_settings, run_here


# The script as `python script.py` runs it, with a report, at the interpreter's exit, of the threads
# still running: the process group's gloo threads, alive past destroy_process_group, made a rank
# abort now and then at exit ("terminate called without an active exception").
AT_EXIT = r"""
import atexit, os, runpy, sys
def comm(t):
    try:
        return open(f"/proc/self/task/{t}/comm").read().strip()
    except OSError:  # (a thread that ended between the listing and the read: it is not left)
        return None
def threads_left():
    names = sorted(n for n in map(comm, os.listdir("/proc/self/task")) if n is not None)
    # (one write: the ranks share stderr)
    os.write(2, f"\nthreads at exit of rank {os.environ['RANK']}: {names}\n".encode())
atexit.register(threads_left)  # (the first registered: it runs last)
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc to list the threads")
@pytest.mark.parametrize(
    "script,jsonl,name",
    [
        ("run_lgip_multi.py", "fixture_with_perturb.jsonl", "fixture_with_perturb__LGIP_ALL.metrics.json"),
        (
            "rebuttal_enhanced_lgip_by_transformation.py",
            "rebuttal_enhanced_fixture_with_fliptypes.jsonl",
            "rebuttal_enhanced_fixture_with_fliptypes__ENHANCED_LGIP_analysis.json",
        ),
    ],
)
def test_torchrun_two_gloo_processes_give_single_process_metrics(tmp_path, script, jsonl, name):
    from test_evaluation import assert_matches

    single, multi = tmp_path / "single", tmp_path / "multi"
    for folder in (single, multi):
        folder.mkdir()
        shutil.copy(os.path.join(REFERENCE, jsonl), folder / jsonl)
    run_here(
        script, **eval_settings(single / jsonl, "reference", TINY_MODELS, CACHE_DIR=None)
    )  # (one process: this one)
    (tmp_path / "at_exit.py").write_text(AT_EXIT)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(tmp_path / "at_exit.py"),
        os.path.join(ROOT, script),
        *eval_args(multi / jsonl, "reference", TINY_MODELS, CACHE_DIR=None),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    left = dict(re.findall(r"threads at exit of rank (\d): (\[.*?\])", proc.stderr))
    assert sorted(left) == ["0", "1"] and not [r for r, names in left.items() if "gloo" in names], (
        left,
        proc.stderr[-4000:],
    )
    ours, ref = json.load(open(multi / name)), json.load(open(single / name))
    for a, b in zip(ours, ref):
        a.pop("run"), b.pop("run")
    assert_matches(ours, ref)
    assert json.load(open(multi / name))[0]["run"]["num_processes"] == 2
    a = open(multi / json.load(open(multi / name))[0]["scores_file"]).read().splitlines()
    b = open(single / json.load(open(single / name))[0]["scores_file"]).read().splitlines()
    assert len(a) == len(b) == 60
    if script == "run_lgip_multi.py":  # the controls' sum of the images and the hard positives over processes
        assert ours[0]["grounded_pos_rate"] is not None and ours[0]["robust_pos_rate"] is not None
        compared = [
            json.load(open(folder / "fixture_with_perturb__LGIP_comparisons.metrics.json"))
            for folder in (multi, single)
        ]
        for a, b in zip(*compared):
            a.pop("run"), b.pop("run")
        assert_matches(*compared)


def test_torchrun_gives_a_joint_scorers_single_process_metrics(tmp_path):
    """A model that scores a pair jointly (LGIP_SPEC.md 13) under torchrun: each process scores its own
    records' texts with the PRIOR_IMAGES images after them (some on the other process), and the relative
    invariance error's neighbours too; the metrics equal one process's, a dual encoder's beside it too."""
    from test_evaluation import assert_matches
    from tiny_vlm import tiny_blip_itm
    from conftest import OPENCLIP_TINY

    blip = {"name": "blip", "type": "itm", "model_id": str(tiny_blip_itm(tmp_path / "blip"))}
    jsonl, name = "fixture_with_perturb.jsonl", "fixture_with_perturb__LGIP_ALL.metrics.json"
    single, multi = tmp_path / "single", tmp_path / "multi"
    for folder in (single, multi):
        folder.mkdir()
        shutil.copy(os.path.join(REFERENCE, jsonl), folder / jsonl)
    models = [blip, OPENCLIP_TINY]
    run_here("run_lgip_multi.py", **eval_settings(single / jsonl, "corrected", models, CACHE_DIR=None, BOOTSTRAP=50))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        os.path.join(ROOT, "run_lgip_multi.py"),
        *eval_args(multi / jsonl, "corrected", models, CACHE_DIR=None, BOOTSTRAP=50),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours, ref = json.load(open(multi / name)), json.load(open(single / name))
    assert [m["run"]["num_processes"] for m in ours] == [2, 2]
    for a, b in zip(ours, ref):
        a.pop("run"), b.pop("run")
    assert_matches(ours, ref)
    assert ours[0]["invariance_error_rel"] is not None and ours[1]["invariance_error_rel"] is not None
    assert ours[0]["grounded_pos_rate"] is not None and ours[0]["prior_images"] == 3
