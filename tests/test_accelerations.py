"""The plain path stays alive: each evaluation run with every acceleration of lgip/accelerations.py
off gives every output number of the run with all of them on (metrics and score files, to 1e-6).

Three models in one run, so what is shared between models is exercised too: an open_clip model,
its twin (the same tokenization and pixels: shared token table, prefix plan, remembered pixels,
calls and score-file layout) and the SigLIP whose words split unevenly."""

import glob
import json
import math
import os
import shutil

import pytest

from conftest import CASES, OPENCLIP_TINY, REFERENCE, SIGLIP_PIECES, eval_args, eval_settings, run_here, run_script
from lgip import accelerations

MODELS = [OPENCLIP_TINY, dict(OPENCLIP_TINY, name="tiny_openclip_twin"), SIGLIP_PIECES]
TOL = 1e-6


def assert_same_numbers(a, b, path="$", tol=TOL):
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            if k not in ("run", "model_card"):  # (what made the row, and what the model is: not its numbers)
                assert_same_numbers(a[k], b[k], f"{path}.{k}", tol)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: lengths"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_numbers(x, y, f"{path}[{i}]", tol)
    elif isinstance(a, float) and not isinstance(b, bool):
        assert isinstance(b, (int, float)) and (
            math.isclose(a, b, rel_tol=0, abs_tol=tol) or (math.isnan(a) and math.isnan(b))
        ), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def run(tmp_path, script, jsonl, protocol, off):
    folder = tmp_path / ("plain" if off else "fast")
    folder.mkdir()
    shutil.copy(os.path.join(REFERENCE, jsonl), folder / jsonl)
    # one decoding worker: the lookahead (a worker pool) runs in the fast path
    run_here(
        script, **eval_settings(folder / jsonl, protocol, MODELS, NUM_WORKERS=1, CACHE_DIR=None, ACCELERATIONS_OFF=off)
    )
    return folder


@pytest.mark.parametrize(
    "script,jsonl,outputs,protocol", [(*case, "reference") for case in CASES] + [(*CASES[0], "corrected")]
)
def test_every_acceleration_off_gives_the_same_numbers(tmp_path, script, jsonl, outputs, protocol):
    fast, plain = (run(tmp_path, script, jsonl, protocol, off) for off in ([], "all"))
    for name in outputs:
        if "tiny_siglip." in name:
            name = name.replace("tiny_siglip", "tiny_siglip_pieces")
        a, b = (json.load(open(folder / name)) for folder in (fast, plain))
        assert_same_numbers(a, b)
    scores = sorted(os.path.basename(p) for p in glob.glob(str(fast / "*.scores.jsonl")))
    assert len(scores) == 3 and scores == sorted(os.path.basename(p) for p in glob.glob(str(plain / "*.scores.jsonl")))
    for name in scores:
        lines = [[json.loads(line) for line in open(folder / name, encoding="utf-8")] for folder in (fast, plain)]
        assert_same_numbers(*lines, tol=TOL + 1e-9)  # (similarities are rounded to 6 decimals)

    main = outputs[0]  # (all models)
    fast_runs, plain_runs = ([m["run"] for m in json.load(open(folder / main))] for folder in (fast, plain))
    # every switch on ran, but for the model-specific ones a model's towers do not admit, each said with why
    for r in fast_runs:
        assert all(on or name in r["accelerations_not_applied"] for name, on in r["accelerations"].items())
        assert set(r["accelerations_not_applied"]) <= set(accelerations.PER_MODEL)
    assert all(not any(r["accelerations"].values()) and not r["accelerations_not_applied"] for r in plain_runs)
    assert set(fast_runs[0]["accelerations"]) == set(accelerations.NAMES)
    clip_fast, _, siglip_fast = fast_runs
    assert clip_fast["accelerations_not_applied"] == {
        "BUILD_ON_DEVICE": "the model runs on the CPU",
        **{
            n: "for a model that scores a pair jointly (types generative and itm, LGIP_SPEC.md 13)"
            for n in accelerations.JOINT_ONLY
        },
    }
    assert siglip_fast["accelerations"]["POOLED_LAST_BLOCK"] and not siglip_fast["accelerations"]["PREFIX_PACKS"]
    assert set(siglip_fast["accelerations_not_applied"]) == {
        "PREFIX_PACKS",
        "TRIMMED_TEXT",
        "FAST_CLIP_TOKENIZER",
        "BUILD_ON_DEVICE",
        *accelerations.JOINT_ONLY,
    }
    clip, twin, siglip = plain_runs
    assert not clip["model"]["text_trimmed"] and not clip["model"]["text_prefix_sharing"]
    assert not clip["model"]["pixels_on_device"] and not clip["model"]["image_last_block_class_token_only"]
    assert not siglip["model"]["text_last_layer_pooled_position_only"]
    assert twin["image_sources"]["decoded"] == 12 and twin["lookahead"] is None
    clip, twin, siglip = fast_runs
    assert clip["model"]["text_prefix_sharing"] and siglip["model"]["text_last_layer_pooled_position_only"]
    assert twin["image_sources"]["from_pixel_memory"] == 12  # the first model's pixels


def test_unknown_acceleration_is_an_error_listing_the_valid_ones(tmp_path):
    shutil.copy(os.path.join(REFERENCE, CASES[0][1]), tmp_path / "in.jsonl")
    proc = run_script(
        "run_lgip_multi.py",
        *eval_args(tmp_path / "in.jsonl", models=[OPENCLIP_TINY], ACCELERATIONS_OFF=["PREFIX_PACK"]),
        check=False,
    )
    assert proc.returncode == 2 and "unknown acceleration(s) 'PREFIX_PACK'; valid: PREFIX_PACKS" in proc.stderr


def test_switches_go_back_after_a_run():
    before = accelerations.switch_off("all")
    assert not any(accelerations.state().values())
    accelerations.restore(before)
    assert all(accelerations.state().values())
