"""Pairs, means and bootstrap intervals (lgip/scoring.py): intervals that contain their estimate,
narrow with more images, are seeded and share their draws within a budget; a headline metric's
interval in every metrics file; pairs and their subsets; the flip type of a pair (lgip/method.py)."""

import json

import numpy as np
import pytest

from lgip import scoring
from lgip.method import infer_flip_type
from lgip.scoring import Pairs, bootstrap_ci, bootstrap_draws
from conftest import CASES


def test_ci_contains_estimate_and_narrows_with_more_images():
    rng = np.random.default_rng(1)
    widths = []
    for n in (50, 500, 5000):
        rec = np.repeat(np.arange(n), 5)
        values = rng.normal(0.1, 0.05, size=n)[rec] + rng.normal(0, 0.02, size=len(rec))
        lo, hi = bootstrap_ci(rec, values, resamples=400, seed=0)
        assert lo <= values.mean() <= hi
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]
    assert widths[1] / widths[2] == pytest.approx(np.sqrt(10), rel=0.3)


def test_ci_is_seeded_and_handles_empty():
    rec, vals = [0, 0, 1, 2, 3], [0.1, 0.3, 0.2, 0.5, 0.4]
    assert bootstrap_ci(rec, vals, 200, seed=3) == bootstrap_ci(rec, vals, 200, seed=3)
    assert bootstrap_ci([], [], 200) is None
    assert bootstrap_ci(rec, vals, 0) is None


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


def test_infer_flip_type():
    assert infer_flip_type("a red bus", "a red car") == "object"
    assert infer_flip_type("two dogs", "five dogs") == "number"
    assert infer_flip_type("A red bus.", "A blue bus.") == "color"
    assert infer_flip_type("a red bus", "a big red bus") is None


def _reference_ci(record_idx, values, resamples, seed, chunk=50):
    """bootstrap_ci as first written: a fresh multinomial draw for every interval."""
    values, record_idx = np.asarray(values, dtype=np.float64), np.asarray(record_idx)
    used = np.unique(record_idx)
    pos = np.searchsorted(used, record_idx)
    sums, counts = np.bincount(pos, weights=values), np.bincount(pos).astype(np.float64)
    rng = np.random.default_rng(seed)
    stats = []
    for start in range(0, resamples, chunk):
        w = rng.multinomial(len(used), np.full(len(used), 1.0 / len(used)), size=min(chunk, resamples - start))
        stats.append((w.astype(np.float64) @ sums) / np.maximum(w.astype(np.float64) @ counts, 1e-300))
    lo, hi = np.quantile(np.concatenate(stats), [0.025, 0.975])
    return [float(lo), float(hi)]


def test_ci_draws_are_shared_and_equal_fresh_draws(monkeypatch):
    monkeypatch.setattr(scoring, "_BOOTSTRAP_DRAWS", {})
    rng = np.random.default_rng(2)
    for n, resamples, seed in ((3000, 1000, 0), (40, 333, 7), (5, 120, 1)):
        rec = np.repeat(np.arange(n), 3)[rng.permutation(3 * n)]
        values = rng.random(3 * n)
        assert bootstrap_ci(rec, values, resamples, seed) == _reference_ci(rec, values, resamples, seed)
        drawn = scoring._BOOTSTRAP_DRAWS[(n, resamples, seed, 50)]
        assert drawn.dtype == np.uint8 and drawn.shape == (resamples, n)
        # another metric over records of the same count: the same draws, no new ones, same interval as fresh
        again = values > 0.5
        assert bootstrap_ci(rec + 7, again, resamples, seed) == _reference_ci(rec + 7, again, resamples, seed)
        assert scoring._BOOTSTRAP_DRAWS[(n, resamples, seed, 50)] is drawn


def test_ci_draws_kept_within_their_budget(monkeypatch):
    monkeypatch.setattr(scoring, "_BOOTSTRAP_DRAWS", {})
    monkeypatch.setattr(scoring, "BOOTSTRAP_CACHE_BYTES", 2500)
    for n in (10, 11, 12, 10):  # 1000 bytes each: two fit; 10 is used again, so 11 is the oldest
        bootstrap_draws(n, 100, 0)
    assert list(scoring._BOOTSTRAP_DRAWS) == [(12, 100, 0, 50), (10, 100, 0, 50)]
    monkeypatch.setattr(scoring, "BOOTSTRAP_CACHE_BYTES", 0)
    bootstrap_draws(13, 100, 0)  # over budget alone: still returned, kept until the next
    assert list(scoring._BOOTSTRAP_DRAWS) == [(13, 100, 0, 50)]


def test_pairs_subsets_of_the_run_share_their_lists():
    import copy

    pairs = Pairs()
    for k in range(5):
        pairs.add(k, 0, 0, [1, 2], [f"a{k}", f"b{k}"], "x")
    first, later = copy.copy(pairs), copy.copy(pairs)  # two models' copies (ModelRun.pairs)
    first.sim = later.sim = np.arange(10.0)
    a, b, c = first.subset([1, 3, 4]), later.subset(np.array([1, 3, 4])), later.subset([1, 3])
    assert a.text is b.text and a.rec is b.rec and a.text == ["b0", "b1", "a2"] and list(b.sim) == [1.0, 3.0, 4.0]
    assert c.text == ["b0", "b1"] and c.text is not a.text


def test_pairs_need_a_slot_per_text():
    pairs = Pairs()
    pairs.add(4, 1, 9, [10, 11], ["a", "b"], "same_caps")
    assert (pairs.rec, pairs.cap, pairs.base_slot, pairs.slot, pairs.text, pairs.label) == (
        [4, 4],
        [1, 1],
        [9, 9],
        [10, 11],
        ["a", "b"],
        ["same_caps"] * 2,
    )
    with pytest.raises(ValueError, match="2 slots for 3 texts"):
        pairs.add(4, 1, 9, [10, 11], ["a", "b", "c"], "same_caps")
