"""What predicts robustness (LGIP_SPEC.md section 12, "Factors"): lgip.report.factors against plain
restatements (Spearman's rho with average ranks for ties, its interval over resampled models, the
levels of a categorical factor, the controlled pairs), and report.py's factors file, section and figure
from metrics files written here (no model runs)."""

import json
import math
import os

import numpy as np
import pytest

from conftest import run_script
from lgip.report import factors as F


def card(**fields):
    from lgip.report.fields import CARD_FIELDS

    return dict(dict.fromkeys(CARD_FIELDS), **fields)


def row(tag, card_fields, **figures):
    """A report row as build_rows makes it: every outcome's column (None where not given), its card."""
    r = {key: None for _, key, *_ in F.OUTCOMES if key != "image_pos_rate"}
    r.update(model=tag, label=tag, headline_source="multi", _card=card(**card_fields))
    r.update(figures)
    return r


# --- restatements, by hand ---


def average_ranks(values):
    """1-based ranks, a tie sharing the mean of the positions it takes (restated with loops)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def pearson(a, b):
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va, vb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    return None if va == 0 or vb == 0 else cov / math.sqrt(va * vb)


def spearman_restated(xs, ys):
    return pearson(average_ranks(list(xs)), average_ranks(list(ys)))


def interval_restated(xs, ys, resamples, seed):
    draws = np.random.default_rng(seed).integers(0, len(xs), size=(resamples, len(xs)))
    rhos = [spearman_restated([xs[i] for i in d], [ys[i] for i in d]) for d in draws]
    rhos = [r for r in rhos if r is not None]  # a resample with a constant column: skipped
    return [float(np.percentile(rhos, 2.5)), float(np.percentile(rhos, 97.5))], len(rhos)


PARAMS = [1.0e8, 1.5e8, 4.0e8, 4.0e8, 9.0e8, 2.0e9]  # a tie in size
POS = [0.55, 0.61, 0.58, 0.66, 0.66, 0.70]  # a tie in the figure


def six_models():
    return [
        row(
            f"m{i}",
            {"params_total": p, "image_size": 224 if i < 3 else 336, "samples_seen": None if i == 0 else 1e9 * (i + 1)},
            pos_rate=v,
            grounded_pos_rate=0.5 + 0.01 * i,
        )
        for i, (p, v) in enumerate(zip(PARAMS, POS))
    ]


def test_rho_and_its_interval_with_ties_against_a_restatement():
    rows = six_models()
    out = F.compute_factors(rows, {}, [], resamples=300, seed=7)
    st = out["numeric"]["log10_params_total"]["sensitivity_pos_rate"]
    xs = [math.log10(p) for p in PARAMS]
    assert st["n"] == 6 and st["rho"] == pytest.approx(spearman_restated(xs, POS), abs=1e-12)
    ci, used = interval_restated(xs, POS, 300, 7)
    assert st["resamples_used"] == used and st["rho_ci95"] == pytest.approx(ci, abs=1e-9)
    # four models, two of the same size: a resample drawing only those has a constant column, skipped
    four = six_models()[1:5]
    st4 = F.compute_factors(four, {}, [], resamples=300, seed=7)["numeric"]["log10_params_total"][
        "sensitivity_pos_rate"
    ]
    ci, used = interval_restated([math.log10(p) for p in PARAMS[1:5]], POS[1:5], 300, 7)
    assert st4["resamples_used"] == used < 300 and st4["rho_ci95"] == pytest.approx(ci, abs=1e-9)
    # log10 changes no rank: the same rho as the raw counts; image size: two levels, ranks tied within each
    assert st["rho"] == pytest.approx(spearman_restated(PARAMS, POS), abs=1e-12)
    size = out["numeric"]["image_size"]["sensitivity_pos_rate"]
    assert size["rho"] == pytest.approx(spearman_restated([224] * 3 + [336] * 3, POS), abs=1e-12)
    seen = out["numeric"]["log10_samples_seen"]["grounded_pos_rate"]  # the first model's samples unknown: left out
    assert seen["n"] == 5 and seen["rho"] == pytest.approx(1.0)
    # the vectorised rho of the resamples is lgip.scoring.spearman's
    from lgip.scoring import spearman

    rng = np.random.default_rng(0)
    for _ in range(50):
        a, b = rng.integers(0, 4, 9).astype(float), rng.normal(size=9)
        assert (
            F.rho(a, b) == pytest.approx(spearman(a, b), abs=1e-12)
            if spearman(a, b) is not None
            else F.rho(a, b) is None
        )


def test_under_four_models_rho_is_none_and_no_resample_is_drawn():
    rows = six_models()[:3]
    st = F.compute_factors(rows, {}, [], resamples=100, seed=0)["numeric"]["log10_params_total"]["sensitivity_pos_rate"]
    assert st == {"n": 3, "rho": None, "rho_ci95": None, "resamples_used": 0}
    rows = six_models()[:4]
    for r in rows:
        r["pos_rate"] = 0.6  # a constant figure: no rank correlation either
    st = F.compute_factors(rows, {}, [], resamples=100, seed=0)["numeric"]["log10_params_total"]["sensitivity_pos_rate"]
    assert st["n"] == 4 and st["rho"] is None and st["rho_ci95"] is None
    st = F.compute_factors(six_models(), {}, [], resamples=0, seed=0)["numeric"]["log10_params_total"][
        "sensitivity_pos_rate"
    ]
    assert st["rho"] is not None and st["rho_ci95"] is None  # BOOTSTRAP=0: no interval


def test_categorical_levels_and_which_are_compared():
    data = ["LAION-2B", "LAION-2B", "WIT-400M", "WIT-400M", "DFN-2B", None]
    rows = [
        row(f"m{i}", {"training_data": d, "family": "ViT", "loss": "softmax"}, pos_rate=0.5 + 0.05 * i)
        for i, d in enumerate(data)
    ]
    cat = F.compute_factors(rows, {}, [], resamples=0)["categorical"]
    levels = cat["training_data"]["sensitivity_pos_rate"]["levels"]
    assert [(lv["level"], lv["n"]) for lv in levels] == [("LAION-2B", 2), ("WIT-400M", 2), ("DFN-2B", 1), (None, 1)]
    assert levels[0]["mean"] == pytest.approx(0.525) and levels[1]["mean"] == pytest.approx(0.625)
    compared = cat["training_data"]["sensitivity_pos_rate"]["compared"]  # DFN-2B (one model) and unknown: never
    assert [(c["a"], c["b"]) for c in compared] == [("LAION-2B", "WIT-400M")]
    assert compared[0]["diff"] == pytest.approx(-0.1) and (compared[0]["n_a"], compared[0]["n_b"]) == (2, 2)
    assert cat["family"]["sensitivity_pos_rate"]["compared"] == []  # one level
    # a model without the outcome is not counted in its level
    rows[1]["pos_rate"] = None
    levels = F.compute_factors(rows, {}, [], resamples=0)["categorical"]["training_data"]["sensitivity_pos_rate"]
    assert levels["levels"][0]["n"] == 1 and levels["compared"] == []


def comparison(a, b, figure, diff, ci, va, vb, script="run_lgip_multi.py", flip_type=None):
    return {
        "script": script,
        "a": a,
        "b": b,
        "figure": figure,
        "flip_type": flip_type,
        "diff": diff,
        "lo": None if ci is None else ci[0],
        "hi": None if ci is None else ci[1],
        "a_value": va,
        "b_value": vb,
        "num_images": 100,
        "excludes_zero": None,
        "created": None,
        "source": "multi",
        "file": "x__LGIP_comparisons.metrics.json",
    }


def test_controlled_pairs_as_the_section_says():
    cards = {
        "a": {"architecture": "ViT-B-32", "family": "ViT", "training_data": "LAION-2B", "params_total": 151e6},
        "b": {"architecture": "ViT-B-32", "family": "ViT", "training_data": "WIT-400M", "params_total": 151e6},
        "c": {"architecture": "ViT-L-14", "family": "ViT", "training_data": "LAION-2B", "params_total": 428e6},
        "d": {"architecture": "ViT-B-32", "family": "ViT", "training_data": None, "params_total": 151e6},
        "e": {"architecture": "RN50", "family": "RN50", "training_data": "LAION-2B", "params_total": 102e6},
        "f": {"architecture": "ViT-B-16", "family": "ViT", "training_data": "LAION-2B", "params_total": None},
    }
    pos = {"a": 0.6, "b": 0.7, "c": 0.65, "d": 0.5, "e": 0.55, "f": 0.52}
    rows = [
        row(t, c, pos_rate=pos[t], invariance_error=0.01, **{"retrieval_i2t_recall@1": 0.3}) for t, c in cards.items()
    ]
    comps = [
        comparison("a", "b", "sensitivity_pos_rate", -0.1, [-0.15, -0.05], 0.6, 0.7),
        comparison("c", "a", "sensitivity_pos_rate", 0.05, [-0.01, 0.11], 0.65, 0.6),  # the other order
        comparison("a", "c", "invariance_error_mean", 0.0, [-0.002, 0.002], 0.02, 0.01),  # an earlier run's values
        comparison("a", "b", "sensitivity_pos_rate", -0.3, [-0.4, -0.2], 0.6, 0.7, script="run_lgip_by_fliptype.py"),
        comparison("a", "b", "sensitivity_pos_rate", 0.3, [0.2, 0.4], 0.6, 0.7, flip_type="color"),
        comparison("a", "b", "i2t_recall@1", 0.0, [-0.02, 0.03], 0.3, 0.3, script="run_lgip_retrieval.py"),
        comparison("a", "c", "i2t_recall@1", 0.0, [-0.5, 0.5], 0.3, 0.3),
    ]  # (not run_lgip_retrieval.py's: not used)
    pairs = F.compute_factors(rows, {}, comps, resamples=0)["controlled_pairs"]
    # a-b: same architecture, different known training data; a-c: same training data and family, other size;
    # d (training data unknown), e (another family), f (size unknown): no pair
    assert [(p["a"], p["b"], p["rule"]) for p in pairs] == [("a", "b", "training_data"), ("a", "c", "params_total")]
    ab, ac = pairs
    assert ab["why"] == "same architecture ViT-B-32, training data LAION-2B vs WIT-400M"
    assert ab["outcomes"]["sensitivity_pos_rate"] == {
        "a_value": 0.6,
        "b_value": 0.7,
        "diff": -0.1,
        "diff_ci95": [-0.15, -0.05],
        "from": "x__LGIP_comparisons.metrics.json",
        "note": None,
    }
    assert ac["outcomes"]["sensitivity_pos_rate"]["diff"] == pytest.approx(-0.05)  # c - a turned into a - c
    assert ac["outcomes"]["sensitivity_pos_rate"]["diff_ci95"] == pytest.approx([-0.11, 0.01])
    stale = ac["outcomes"]["invariance_error_mean"]  # its comparison's values are not the figures: not used
    assert (
        stale["diff"] == 0.0
        and stale["diff_ci95"] is None
        and stale["from"] is None
        and "no paired comparison" in stale["note"]
    )
    recall = ab["outcomes"]["i2t_recall@1"]  # run_lgip_retrieval.py's comparison of the pair
    assert recall["diff"] == 0.0 and recall["diff_ci95"] == [-0.02, 0.03] and recall["note"] is None
    recall = ac["outcomes"]["i2t_recall@1"]  # not compared by run_lgip_retrieval.py: the difference alone, said
    assert recall["diff"] == 0.0 and recall["diff_ci95"] is None and recall["note"]
    assert ac["why"] == "same training data LAION-2B and family ViT, 151.0M vs 428.0M parameters"


def test_an_outcome_the_rows_do_not_carry_is_read_from_the_metrics():
    """image_sensitivity_pos_rate (an image-side evaluation's, LGIP_SPEC.md 11): from the first evaluation
    whose per-model dict has it at its top; outcomes present only."""
    rows = six_models()
    metrics = {
        "multi": [{"model_tag": r["model"], "image_sensitivity_pos_rate": 0.4 + 0.05 * i} for i, r in enumerate(rows)]
    }
    out = F.compute_factors(rows, metrics, [], resamples=0)
    assert out["outcomes"] == ["sensitivity_pos_rate", "grounded_pos_rate", "image_sensitivity_pos_rate"]
    assert out["numeric"]["log10_params_total"]["image_sensitivity_pos_rate"]["rho"] == pytest.approx(
        spearman_restated(PARAMS, [0.4 + 0.05 * i for i in range(6)])
    )
    metrics["multi"][0]["image_sensitivity_pos_rate"] = "high"
    with pytest.raises(Exception, match="image_sensitivity_pos_rate"):
        F.compute_factors(rows, metrics, [], resamples=0)


# --- report.py: the factors file, its section and figure ---

ZOO = [
    ("vit_b32_laion", "ViT-B-32", "ViT", "LAION-2B", 151_277_313, 34e9, 224, 0.62),
    ("vit_b32_openai", "ViT-B-32", "ViT", "WIT-400M", 151_277_313, None, 224, 0.58),
    ("vit_l14_laion", "ViT-L-14", "ViT", "LAION-2B", 427_616_513, 32e9, 224, 0.71),
    ("rn50_openai", "RN50", "RN50", "WIT-400M", 102_007_137, None, 224, 0.55),
    ("tiny_unknown", None, None, None, 1_661_729, None, 64, 0.49),
]


def write_zoo(folder):
    """zoo.jsonl's run_lgip_multi.py metrics (five models with cards, figures with intervals) and its paired
    comparisons of the first two models (as the evaluation writes them)."""
    metrics = []
    for i, (tag, arch, family, data, params, seen, size, pos) in enumerate(ZOO):
        m = {
            "model_tag": tag,
            "num_samples": 100,
            "invariance_error_mean": 0.01 + 0.001 * i,
            "invariance_error_mean_ci95": [0.009, 0.02],
            "sensitivity_gap_mean": 0.01,
            "sensitivity_gap_mean_ci95": [0.0, 0.02],
            "sensitivity_pos_rate": pos,
            "sensitivity_pos_rate_ci95": [pos - 0.03, pos + 0.03],
            "grounded_pos_rate": 0.5 + 0.02 * i,
            "grounded_pos_rate_ci95": [0.45 + 0.02 * i, 0.55 + 0.02 * i],
            "model_card": {
                "source": "openclip",
                "architecture": arch,
                "pretrained": None,
                "family": family,
                "params_image": None,
                "params_text": None,
                "params_total": params,
                "embed_dim": 512,
                "image_size": size,
                "context_length": 77,
                "loss": "softmax" if family else None,
                "training_data": data,
                "samples_seen": seen,
            },
            "run": {
                "config": {"JSONL_PATH": str(folder / "zoo_with_perturb.jsonl")},
                "model": {"protocol": "corrected"},
            },
        }
        metrics.append(m)
    (folder / "zoo.jsonl").write_text("")
    (folder / "zoo_with_perturb__LGIP_ALL.metrics.json").write_text(json.dumps(metrics))
    a, b = metrics[0], metrics[1]
    comps = [
        {
            "script": "run_lgip_multi.py",
            "a": a["model_tag"],
            "b": b["model_tag"],
            "figure": "sensitivity_pos_rate",
            "flip_type": None,
            "diff": a["sensitivity_pos_rate"] - b["sensitivity_pos_rate"],
            "diff_ci95": [0.01, 0.07],
            "a_value": a["sensitivity_pos_rate"],
            "b_value": b["sensitivity_pos_rate"],
            "num_images": 100,
            "excludes_zero": True,
        }
    ]
    (folder / "zoo_with_perturb__LGIP_comparisons.metrics.json").write_text(json.dumps(comps))
    return metrics


def test_report_writes_the_factors_file_section_and_figure(tmp_path):
    write_zoo(tmp_path)
    proc = run_script(
        "report.py", f"--JSONL_PATH={tmp_path / 'zoo.jsonl'}", "--TOP_K=0", "--BOOTSTRAP=200", "--BOOTSTRAP_SEED=3"
    )
    path = tmp_path / "zoo__LGIP_factors.metrics.json"
    assert f"-> {path}" in proc.stdout and f"-> {tmp_path / 'zoo__LGIP_factors.png'}" in proc.stdout
    data = json.loads(path.read_text(encoding="utf-8"))
    assert list(data) == [
        "input",
        "outcomes",
        "models",
        "numeric",
        "categorical",
        "controlled_pairs",
        "settings",
        "run",
    ]
    assert data["input"] == str(tmp_path / "zoo.jsonl")
    assert data["outcomes"] == ["sensitivity_pos_rate", "grounded_pos_rate", "invariance_error_mean"]
    assert data["run"]["script"] == "report.py" and data["run"]["config"]["BOOTSTRAP"] == 200
    assert data["run"]["config"]["BOOTSTRAP_SEED"] == 3 and data["settings"] == {
        "resamples": 200,
        "seed": 3,
        "min_models_rho": 4,
        "min_models_level": 2,
    }
    assert [m["model"] for m in data["models"]] == [z[0] for z in ZOO]
    assert data["models"][0]["factors"] == {
        "log10_params_total": math.log10(ZOO[0][4]),
        "log10_samples_seen": math.log10(34e9),
        "image_size": 224,
        "family": "ViT",
        "training_data": "LAION-2B",
        "loss": "softmax",
    }
    assert set(data["numeric"]) == {"log10_params_total", "log10_samples_seen", "image_size"}
    assert set(data["categorical"]) == {"family", "training_data", "loss"}
    st = data["numeric"]["log10_params_total"]["sensitivity_pos_rate"]
    xs, ys = [math.log10(z[4]) for z in ZOO], [z[7] for z in ZOO]
    assert st["n"] == 5 and st["rho"] == pytest.approx(spearman_restated(xs, ys), abs=1e-12)
    assert st["rho_ci95"] == pytest.approx(interval_restated(xs, ys, 200, 3)[0], abs=1e-9)
    assert data["numeric"]["log10_samples_seen"]["sensitivity_pos_rate"]["n"] == 2  # under four: None
    assert data["numeric"]["log10_samples_seen"]["sensitivity_pos_rate"]["rho"] is None
    levels = data["categorical"]["training_data"]["sensitivity_pos_rate"]["levels"]
    assert [(lv["level"], lv["n"]) for lv in levels] == [("LAION-2B", 2), ("WIT-400M", 2), (None, 1)]
    pairs = [(p["a"], p["b"], p["rule"]) for p in data["controlled_pairs"]]
    assert pairs == [
        ("vit_b32_laion", "vit_b32_openai", "training_data"),
        ("vit_b32_laion", "vit_l14_laion", "params_total"),
    ]
    assert data["controlled_pairs"][0]["outcomes"]["sensitivity_pos_rate"]["diff_ci95"] == [0.01, 0.07]
    assert data["controlled_pairs"][1]["outcomes"]["sensitivity_pos_rate"]["diff_ci95"] is None
    md = (tmp_path / "zoo__LGIP_report.md").read_text(encoding="utf-8")
    section = md.split("## What predicts robustness")[1].split("\n---\n")[0]
    assert "](zoo__LGIP_factors.png)" in section and "training data: unknown" in section
    assert f"ρ {st['rho']:+.2f}".replace("-", "−") in section
    assert "training data: LAION-2B − WIT-400M" in section and "same architecture ViT-B-32" in section
    html = (tmp_path / "zoo__LGIP_report.html").read_text(encoding="utf-8")
    assert '<section id="factors">' in html and 'id="factor-table"' in html and 'id="controlled-pairs"' in html
    assert html.count('alt="Positive rate and grounded positive rate against parameters, by training data"') == 1
    from PIL import Image

    with Image.open(tmp_path / "zoo__LGIP_factors.png") as img:
        assert img.format == "PNG" and img.width > img.height


def test_a_bad_model_card_is_named_and_no_output_is_written(tmp_path):
    metrics = write_zoo(tmp_path)
    metrics[2]["model_card"]["params_total"] = "large"
    (tmp_path / "zoo_with_perturb__LGIP_ALL.metrics.json").write_text(json.dumps(metrics))
    proc = run_script("report.py", f"--JSONL_PATH={tmp_path / 'zoo.jsonl'}", "--TOP_K=0", check=False)
    assert (
        proc.returncode == 2
        and "model vit_l14_laion: field 'model_card.params_total' is the string 'large'" in proc.stderr
    )
    assert not os.path.exists(tmp_path / "zoo__LGIP_factors.metrics.json")
    proc = run_script("report.py", f"--JSONL_PATH={tmp_path / 'zoo.jsonl'}", "--BOOTSTRAP=-1", check=False)
    assert proc.returncode == 2 and "BOOTSTRAP" in proc.stderr


def test_one_set_of_weights_scored_two_ways_is_one_model():
    """Issue 54 item 6: two rows of the same weights (card source, architecture, pretrained) scored two ways
    count once in the statistics; the second is listed with same_weights_as and said in a note."""
    from lgip.report.factors import compute_factors, one_per_weights
    from lgip.report.factors_text import factor_lines

    def row(tag, kind, pretrained, params, pos):
        card = {"source": "generative", "architecture": "llava", "pretrained": pretrained, "params_total": params}
        card["family"] = "llava"
        return {"model": tag, "label": tag, "score_kind": kind, "_card": card, "pos_rate": pos}

    rows = [
        row("llava_lp", "logprob", "llava-hf/llava-1.5-7b-hf", 7e9, 0.8),
        row("llava_vqa", "vqascore", "llava-hf/llava-1.5-7b-hf", 7e9, 0.6),
        row("other", "logprob", "other/model", 3e9, 0.7),
    ]
    kept, same = one_per_weights(rows)
    assert [r["model"] for r in kept] == ["llava_lp", "other"] and same == {"llava_vqa": "llava_lp"}
    f = compute_factors(rows, {}, [], resamples=10, seed=0)
    assert [m["same_weights_as"] for m in f["models"]] == [None, "llava_lp", None]
    levels = f["categorical"]["family"]["sensitivity_pos_rate"]["levels"]
    assert levels == [{"level": "llava", "n": 2, "mean": pytest.approx(0.75)}]  # (not 3 models, mean 0.7)
    notes = factor_lines(f)["notes"]
    assert any("llava_vqa (vqascore) has the weights of llava_lp" in n for n in notes)
    assert factor_lines(compute_factors(rows[:2], {}, [], resamples=10, seed=0)) is None  # (one set of weights)
    unknown = [dict(r, _card=dict(r["_card"], pretrained=None)) for r in rows[:2]]
    assert one_per_weights(unknown)[1] == {}  # (weights the card does not tell: each row its own model)
