"""The three evaluation scripts against the published metrics (reference protocol, tiny models)."""
import json
import math
import os
import shutil

import pytest

from conftest import CASES, REFERENCE, eval_args, run_script

TOL = 1e-6


def assert_matches(ours, ref, path="$"):
    """Every field of the published output is present in ours, equal (numbers within TOL), same key order."""
    if isinstance(ref, dict):
        assert isinstance(ours, dict), path
        assert [k for k in ours if k in ref] == list(ref), f"{path}: key order"
        for k in ref:
            assert k in ours, f"{path}.{k} missing"
            assert_matches(ours[k], ref[k], f"{path}.{k}")
    elif isinstance(ref, list):
        assert isinstance(ours, list) and len(ours) == len(ref), path
        for i, (a, b) in enumerate(zip(ours, ref)):
            assert_matches(a, b, f"{path}[{i}]")
    elif isinstance(ref, float):
        assert isinstance(ours, (int, float)) and math.isclose(ours, ref, rel_tol=0, abs_tol=TOL), f"{path}: {ours} != {ref}"
    else:
        assert ours == ref and type(ours) is type(ref), f"{path}: {ours!r} != {ref!r}"


@pytest.mark.parametrize("script,jsonl,outputs", CASES)
def test_reference_protocol_reproduces_published_metrics(reference_runs, script, jsonl, outputs):
    folder, proc = reference_runs[script]
    for name in outputs:
        ours = json.load(open(folder / name))
        assert_matches(ours, json.load(open(os.path.join(REFERENCE, name))))


@pytest.mark.parametrize("script,jsonl,outputs", CASES)
def test_outputs_record_configuration_and_versions(reference_runs, script, jsonl, outputs):
    folder, _ = reference_runs[script]
    data = json.load(open(folder / outputs[0]))
    for m in data if isinstance(data, list) else [data]:
        run = m["run"]
        assert run["config"]["PROTOCOL"] == "reference" and run["config"]["DEVICE"] == "cpu"
        assert run["config"]["TEXT_BATCH_SIZE"] == "auto" and run["text_batch_size"] == 64  # "auto" on CPU
        assert len(run["config"]["MODELS"]) == 2
        phases = run["seconds_by_phase"]
        assert list(phases) == ["load", "pairs", "lookahead_wait", "lookup_and_tokenize", "start_tokenizers",
                                "start_images", "texts", "images_after_texts", "scoring", "metrics_and_scores_file"]
        assert min(phases.values()) >= 0 and sum(phases.values()) <= run["seconds"] + 0.01  # parts of the model's time
        assert run["config"]["LOOKAHEAD"] is True and "lookahead" in run  # (NUM_WORKERS=0 here: nothing done ahead)
        assert run["model"]["dtype"] == "float32" and run["model"]["protocol"] == "reference"
        assert {"torch", "open_clip_torch", "transformers"} <= set(run["versions"])
        assert run["num_failed_images"] == 0 and run["num_records_in_file"] == 12


def test_enhanced_corrected_fields(reference_runs):
    folder, _ = reference_runs["rebuttal_enhanced_lgip_by_transformation.py"]
    for m in json.load(open(folder / CASES[2][2][0])):
        c = m["corrected"]
        assert m["num_samples"] == 1 and c["num_records"] == 12  # published count is of 32-record batches
        assert m["global_sensitivity"]["count"] == 154 and c["global_sensitivity"]["count"] == 77
        assert "all" not in c["error_type_stats"]
        assert sum(v["overall"]["count"] for v in c["error_type_stats"].values()) == 77
        combined = c["combined"]
        assert combined["global_sensitivity"]["count"] > 0
        assert set(combined["error_type_stats"]) <= {"para+color", "para+number", "para+object"}


def test_corrected_protocol_siglip_independent_of_text_batch_size(tmp_path):
    from conftest import SIGLIP_TINY
    src = tmp_path / "in.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), src)
    results = []
    for bs in (1, 7, 512):
        run_script("run_lgip_multi.py", *eval_args(src, "corrected", [SIGLIP_TINY], TEXT_BATCH_SIZE=bs))
        results.append(json.load(open(tmp_path / "in__LGIP_ALL.metrics.json"))[0])
    for key in ("invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate"):
        assert max(r[key] for r in results) - min(r[key] for r in results) < 1e-6
    assert results[0]["run"]["model"]["text_length"] == 64


def test_siglip_sanity_check_shows_both_protocols(tmp_path):
    from conftest import FIXTURES, SIGLIP_TINY
    src = tmp_path / "in.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"), src)
    proc = run_script("siglip_sanity_check.py", f"--JSONL_PATH={src}", f"--IMAGE_ROOT={FIXTURES}",
                      f"--MODEL={SIGLIP_TINY!r}", "--N_RECORDS=4", "--DEVICE=cpu")
    out = json.load(open(tmp_path / "in__siglip_sanity.json"))
    captions = [r for r in out["rows"] if not r["is_flip"]]
    flips = [r for r in out["rows"] if r["is_flip"]]
    assert len(captions) == 4 and 4 <= len(flips) <= 20
    assert all(-1 <= r["sim_corrected"] <= 1 and -1 <= r["sim_reference"] <= 1 for r in out["rows"])
    assert any(abs(r["sim_corrected"] - r["sim_reference"]) > 1e-3 for r in out["rows"])
    assert "corrected:" in proc.stdout and "reference:" in proc.stdout and "flip: " in proc.stdout
    assert out["run"]["config"]["N_RECORDS"] == 4
