"""Bootstrap confidence intervals and the per-pair score sidecars."""
import json

import numpy as np
import pytest

import common
from conftest import CASES


def test_ci_contains_estimate_and_narrows_with_more_images():
    rng = np.random.default_rng(1)
    widths = []
    for n in (50, 500, 5000):
        rec = np.repeat(np.arange(n), 5)
        values = rng.normal(0.1, 0.05, size=n)[rec] + rng.normal(0, 0.02, size=len(rec))
        lo, hi = common.bootstrap_ci(rec, values, resamples=400, seed=0)
        assert lo <= values.mean() <= hi
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]
    assert widths[1] / widths[2] == pytest.approx(np.sqrt(10), rel=0.3)


def test_ci_is_seeded_and_handles_empty():
    rec, vals = [0, 0, 1, 2, 3], [0.1, 0.3, 0.2, 0.5, 0.4]
    assert common.bootstrap_ci(rec, vals, 200, seed=3) == common.bootstrap_ci(rec, vals, 200, seed=3)
    assert common.bootstrap_ci([], [], 200) is None
    assert common.bootstrap_ci(rec, vals, 0) is None


def test_metrics_carry_ci_for_every_headline_metric(reference_runs):
    folder, _ = reference_runs["run_lgip_multi.py"]
    for m in json.load(open(folder / "fixture_with_perturb__LGIP_ALL.metrics.json")):
        for key in ("invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate"):
            lo, hi = m[key + "_ci95"]
            assert lo <= m[key] <= hi
    folder, _ = reference_runs["run_lgip_by_fliptype.py"]
    for m in json.load(open(folder / "fixture_with_fliptypes__LGIP_fliptypes.metrics.json")):
        assert m["invariance_error_mean_ci95"][0] <= m["invariance_error_mean"] <= m["invariance_error_mean_ci95"][1]
        for block in [m["global_sensitivity"]] + list(m["by_flip_type"].values()):
            assert block["pos_rate_ci95"][0] <= block["pos_rate"] <= block["pos_rate_ci95"][1]
            assert block["gap_mean_ci95"][0] <= block["gap_mean"] <= block["gap_mean_ci95"][1]
    folder, _ = reference_runs["rebuttal_enhanced_lgip_by_transformation.py"]
    for m in json.load(open(folder / CASES[2][2][0])):
        for block in (m, m["corrected"]["global_sensitivity"], m["corrected"]["combined"]["global_sensitivity"]):
            for key, value in list(block.items()):
                if key.endswith("_ci95"):
                    assert value[0] <= block[key[:-5]] <= value[1]


def test_sidecar_reproduces_the_metrics(reference_runs):
    folder, _ = reference_runs["run_lgip_multi.py"]
    metrics = json.load(open(folder / "fixture_with_perturb__LGIP_tiny_siglip.metrics.json"))
    rows = [json.loads(line) for line in open(folder / metrics["scores_file"])]
    assert len(rows) == 60 and rows[0]["image_id"] == 1 and rows[0]["line"] == 1
    errs = [abs(r["sim"] - p["sim"]) for r in rows for p in r.get("paraphrases", [])]
    gaps = [r["sim"] - f["sim"] for r in rows for f in r.get("flips", [])]
    assert np.mean(errs) == pytest.approx(metrics["invariance_error_mean"], abs=1e-5)
    assert np.mean(gaps) == pytest.approx(metrics["sensitivity_gap_mean"], abs=1e-5)
    assert {f["type"] for r in rows for f in r.get("flips", [])} == {"color", "number", "object"}
    folder, _ = reference_runs["rebuttal_enhanced_lgip_by_transformation.py"]
    m = json.load(open(folder / CASES[2][2][0]))[0]
    rows = [json.loads(line) for line in open(folder / m["scores_file"])]
    assert sum(len(r.get("flips", [])) for r in rows) == m["corrected"]["global_sensitivity"]["count"]
    assert sum(len(r.get("combined", [])) for r in rows) == m["corrected"]["combined"]["global_sensitivity"]["count"]
    kinds = [p["kind"] for r in rows for p in r.get("paraphrases", [])]
    assert kinds.count("simple") == m["paraphrase_simple_count"]


def test_infer_flip_type():
    assert common.infer_flip_type("a red bus", "a red car") == "object"
    assert common.infer_flip_type("two dogs", "five dogs") == "number"
    assert common.infer_flip_type("A red bus.", "A blue bus.") == "color"
    assert common.infer_flip_type("a red bus", "a big red bus") is None
