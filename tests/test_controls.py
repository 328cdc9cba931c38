"""Is it the image? The text-prior controls (LGIP_SPEC.md section 9), the hard positives (section 10)
and the paired model comparisons, in run_lgip_multi.py and run_lgip_by_fliptype.py: each figure
against a restatement that takes the mean of the other images explicitly, models built so that
the answer is known, fewer than 2 images, and a re-run from the cache."""

import json
import os
import shutil

import numpy as np
import pytest

from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE

HERE = os.path.dirname(os.path.abspath(__file__))
PERTURB, FLIPTYPES = "fixture_with_perturb.jsonl", "fixture_with_fliptypes.jsonl"


def records_of(path):
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


def constructed(mode, jsonl, name="constructed", weight=3.0):
    captions = {c: os.path.join(FIXTURES, r["image_path"]) for r in records_of(jsonl) for c in r["orig_captions"]}
    return {
        "name": name,
        "type": "python",
        "loader": os.path.join(HERE, "constructed_models.py") + ":build",
        "kwargs": {"mode": mode, "captions": captions, "weight": weight},
    }


def copy_input(tmp_path, name):
    shutil.copy(os.path.join(REFERENCE, name), tmp_path / name)
    return tmp_path / name


def run(script, jsonl, models, **extra):
    import importlib

    module = importlib.import_module(script)
    settings = dict(
        JSONL_PATH=str(jsonl),
        IMAGE_ROOT=FIXTURES,
        MODELS=models,
        DEVICE="cpu",
        NUM_WORKERS=0,
        BOOTSTRAP=0,
        WRITE_SCORES=False,
        CACHE_DIR=None,
    )
    settings = {k: v for k, v in settings.items() if k in module.CONFIG}  # (those the script has)
    settings.update(extra)
    return module.run(**settings)


class Embeddings:
    """The constructed model's own embeddings, one text or image at a time, L2-normalised, float64."""

    def __init__(self, spec):
        import constructed_models
        from PIL import Image

        self.model, self.preprocess, self.tokenizer = constructed_models.build(**spec["kwargs"])
        self.image_cache, self.text_cache, self.Image = {}, {}, Image

    def image(self, path):
        if path not in self.image_cache:
            with self.Image.open(path) as img:
                v = self.model.encode_image(self.preprocess(img.convert("RGB"))[None]).double().numpy()[0]
            self.image_cache[path] = v / np.linalg.norm(v)
        return self.image_cache[path]

    def text(self, t):
        if t not in self.text_cache:
            v = self.model.encode_text(self.tokenizer([t])).double().numpy()[0]
            self.text_cache[t] = v / np.linalg.norm(v)
        return self.text_cache[t]


def restated(jsonl, spec, flip_field="diff_caps"):
    """Section 9 and 10's figures over the records' pairs, each pair's other images averaged explicitly."""
    emb = Embeddings(spec)
    recs = records_of(jsonl)
    V = [emb.image(os.path.join(FIXTURES, r["image_path"])) for r in recs]
    out = {k: [] for k in ("gap", "prior", "shift", "prior_shift", "robust", "text_only")}
    for r, rec in enumerate(recs):
        others = np.mean([V[s] for s in range(len(V)) if s != r], axis=0)
        for i, c in enumerate(rec["orig_captions"]):
            t_i = emb.text(c)
            paras = [emb.text(p) for p in rec.get("same_caps", {}).get(str(i), [])]
            for t_p in paras:
                out["shift"].append(V[r] @ (t_p - t_i))
                out["prior_shift"].append(others @ (t_p - t_i))
            for f in rec.get(flip_field, {}).get(str(i), []):
                t_f = emb.text(f)
                out["gap"].append(V[r] @ (t_i - t_f))
                out["prior"].append(others @ (t_i - t_f))
                if paras:
                    out["robust"].append(V[r] @ t_i > V[r] @ t_f and all(V[r] @ t_p > V[r] @ t_f for t_p in paras))
                    out["text_only"].append(all(t_i @ t_p > t_i @ t_f and t_i @ t_p > t_p @ t_f for t_p in paras))
    a = {k: np.array(v, dtype=np.float64) for k, v in out.items()}
    grounded, d_e = a["gap"] - a["prior"], a["shift"] - a["prior_shift"]
    return {
        "prior_gap_mean": a["prior"].mean(),
        "grounded_gap_mean": grounded.mean(),
        "prior_pos_rate": (a["prior"] > 0).mean(),
        "grounded_pos_rate": (grounded > 0).mean(),
        "invariance_error_prior_mean": np.abs(a["prior_shift"]).mean(),
        "invariance_error_grounded_mean": np.abs(d_e).mean(),
        "robust_pos_rate": a["robust"].mean(),
        "text_only_rate": a["text_only"].mean(),
        "sensitivity_pos_rate": (a["gap"] > 0).mean(),
        "count": len(a["gap"]),
    }


KEYS = (
    "prior_gap_mean",
    "grounded_gap_mean",
    "prior_pos_rate",
    "grounded_pos_rate",
    "invariance_error_prior_mean",
    "invariance_error_grounded_mean",
    "robust_pos_rate",
    "text_only_rate",
)


@pytest.mark.parametrize("mode", ["random", "image"])
def test_figures_equal_an_explicit_restatement(tmp_path, mode):
    jsonl = copy_input(tmp_path, PERTURB)
    spec = constructed(mode, jsonl, weight=0.15)
    row = run("run_lgip_multi", jsonl, [spec])[0]
    want = restated(jsonl, spec)
    assert row["sensitivity_pos_rate"] == pytest.approx(want["sensitivity_pos_rate"], abs=1e-12)
    for key in KEYS:
        assert row[key] == pytest.approx(want[key], abs=1e-6), key
    assert 0 < row["grounded_pos_rate"] < 1 and 0 < row["robust_pos_rate"] < 1  # (the restatement is not vacuous)


def test_by_fliptype_figures_per_type_equal_the_restatement(tmp_path):
    jsonl = copy_input(tmp_path, FLIPTYPES)
    spec = constructed("image", jsonl, weight=0.15)
    row = run("run_lgip_by_fliptype", jsonl, [spec])[0]
    overall = restated(jsonl, spec)
    for key in KEYS:
        assert row[key] == pytest.approx(overall[key], abs=1e-6), key
    assert row["global_sensitivity"]["pos_rate"] == pytest.approx(overall["sensitivity_pos_rate"], abs=1e-12)
    for t in ("color", "number", "object"):
        want, block = restated(jsonl, spec, "diff_caps_" + t), row["by_flip_type"][t]
        assert block["count"] == want["count"]
        for key in KEYS:
            if not key.startswith("invariance"):
                assert block[key] == pytest.approx(want[key], abs=1e-6), (t, key)


def test_a_model_that_favours_captions_by_text_alone_is_found_out(tmp_path):
    jsonl = copy_input(tmp_path, PERTURB)
    prior = run("run_lgip_multi", jsonl, [constructed("prior", jsonl)])[0]
    assert prior["sensitivity_pos_rate"] > 0.95 and prior["prior_pos_rate"] > 0.95  # "sensitive" by text alone
    assert 0.3 < prior["grounded_pos_rate"] < 0.7  # chance: the image decides nothing
    image = run("run_lgip_multi", jsonl, [constructed("image", jsonl)])[0]
    assert image["grounded_pos_rate"] > 0.95 and image["sensitivity_pos_rate"] > 0.95
    assert prior["invariance_error_prior_mean"] > 0 and image["invariance_error_grounded_mean"] > 0


def test_fewer_than_two_images_gives_none(tmp_path):
    jsonl = tmp_path / "one.jsonl"
    jsonl.write_text(open(os.path.join(REFERENCE, PERTURB), encoding="utf-8").readline(), encoding="utf-8")
    row = run("run_lgip_multi", jsonl, [OPENCLIP_TINY], BOOTSTRAP=50)[0]
    assert row["sensitivity_pos_rate"] is not None
    for key in KEYS[:6]:  # (present, as with two images: a row's keys do not depend on its data)
        assert key in row and key + "_ci95" in row and row[key] is None and row[key + "_ci95"] is None, key
    keys = list(row)
    assert keys.index("prior_pos_rate_ci95") == keys.index("prior_pos_rate") + 1
    assert row["robust_pos_rate"] is not None  # (one image suffices for the hard positives)


def test_hard_positives_are_none_without_paraphrases(tmp_path):
    recs = records_of(os.path.join(REFERENCE, PERTURB))
    jsonl = tmp_path / "no_para.jsonl"
    jsonl.write_text("".join(json.dumps(dict(r, same_caps={})) + "\n" for r in recs), encoding="utf-8")
    row = run("run_lgip_multi", jsonl, [OPENCLIP_TINY])[0]
    assert row["robust_pos_rate"] is None and row["text_only_rate"] is None
    assert row["invariance_error_mean"] is None and row["invariance_error_prior_mean"] is None
    assert row["prior_pos_rate"] is not None


def test_paired_comparisons_resample_the_same_images_for_both_models(tmp_path):
    from lgip.scoring import bootstrap_draws

    jsonl = copy_input(tmp_path, PERTURB)
    a, b = constructed("image", jsonl, "a", 0.15), constructed("random", jsonl, "b")
    run("run_lgip_multi", jsonl, [a, b], BOOTSTRAP=200, BOOTSTRAP_SEED=3)
    rows = json.load(open(tmp_path / "fixture_with_perturb__LGIP_comparisons.metrics.json"))
    assert [(r["a"], r["b"], r["figure"], r["flip_type"]) for r in rows] == [
        ("a", "b", f, None)
        for f in ("sensitivity_pos_rate", "grounded_pos_rate", "invariance_error_mean", "invariance_error_rel")
    ]
    recs = records_of(jsonl)
    per = {}
    for spec in (a, b):  # per image: the pairs' positive outcomes (sensitivity_pos_rate), restated
        emb = Embeddings(spec)
        per[spec["name"]] = [
            [
                float(emb.image(os.path.join(FIXTURES, r["image_path"])) @ (emb.text(c) - emb.text(f)) > 0)
                for i, c in enumerate(r["orig_captions"])
                for f in r["diff_caps"].get(str(i), [])
            ]
            for r in recs
        ]
    draws = bootstrap_draws(len(recs), 200, 3)
    diffs = []
    for w in draws:  # each resample: its drawn images' pairs, the same images for both models
        x = {m: [v for k, n in enumerate(w) for _ in range(n) for v in per[m][k]] for m in per}
        diffs.append(np.mean(x["a"]) - np.mean(x["b"]))
    row = rows[0]
    full = {m: np.mean([v for vs in per[m] for v in vs]) for m in per}
    assert row["diff"] == pytest.approx(full["a"] - full["b"], abs=1e-12)
    assert row["diff_ci95"] == pytest.approx(list(np.quantile(diffs, [0.025, 0.975])), abs=1e-9)
    assert row["excludes_zero"] == (row["diff_ci95"][0] > 0 or row["diff_ci95"][1] < 0)
    assert row["num_images"] == len(recs) and row["run"]["created"]


def test_retrieval_explain_and_images_compare_their_own_figures(tmp_path):
    """Section 12's controlled pairs take each outcome's paired interval from section 9's comparisons:
    run_lgip_retrieval.py (i2t_recall@1, i2t_flip_top1_rate), explain_flips.py (localization_acc) and
    run_lgip_images.py (image_sensitivity_pos_rate) write them into the input's comparisons file,
    beside each other; each row's values are the models' figures, over each model's images, and the
    interval is the same resampling of images for both (restated from the explain lines)."""
    from conftest import SIGLIP_TINY
    from lgip.scoring import bootstrap_draws

    jsonl = copy_input(tmp_path, FLIPTYPES)
    models = [OPENCLIP_TINY, SIGLIP_TINY]
    got = {
        "run_lgip_retrieval.py": run("run_lgip_retrieval", jsonl, models, BOOTSTRAP=100, BOOTSTRAP_SEED=1),
        "explain_flips.py": run("explain_flips", jsonl, models, BOOTSTRAP=100, BOOTSTRAP_SEED=1, N_FLIPS=30, TOP_K=0),
        "run_lgip_images.py": run("run_lgip_images", jsonl, models, BOOTSTRAP=100, BOOTSTRAP_SEED=1),
    }
    rows = json.load(open(tmp_path / "fixture_with_fliptypes__LGIP_comparisons.metrics.json"))
    assert [(r["script"], r["a"], r["b"], r["figure"]) for r in rows] == [
        (script, "tiny_openclip", "tiny_siglip", figure)
        for script, figure in (
            ("run_lgip_retrieval.py", "i2t_recall@1"),
            ("run_lgip_retrieval.py", "i2t_flip_top1_rate"),
            ("explain_flips.py", "localization_acc"),
            ("run_lgip_images.py", "image_sensitivity_pos_rate"),
        )
    ]
    for r in rows:
        a, b = got[r["script"]]
        assert (r["a_value"], r["b_value"]) == pytest.approx((a[r["figure"]], b[r["figure"]]), abs=1e-12), r["figure"]
        assert r["diff"] == pytest.approx(a[r["figure"]] - b[r["figure"]], abs=1e-12)
        assert r["diff_ci95"][0] <= r["diff"] <= r["diff_ci95"][1] and r["flip_type"] is None
    assert rows[0]["num_images"] == 12 and rows[3]["num_images"] == 12
    per = {}  # localization, restated: per record line, each model's explained flips' hits
    for m in got["explain_flips.py"]:
        lines = [json.loads(x) for x in open(tmp_path / m["explain_file"], encoding="utf-8")]
        per[m["model_tag"]] = {}
        for x in lines:
            per[m["model_tag"]].setdefault(x["line"], []).append(float(x["hit"]))
    used = sorted(set(per["tiny_openclip"]) | set(per["tiny_siglip"]))
    diffs = []
    for w in bootstrap_draws(len(used), 100, 1):
        x = {t: [v for k, n in zip(used, w) for _ in range(n) for v in per[t].get(k, [])] for t in per}
        if x["tiny_openclip"] and x["tiny_siglip"]:
            diffs.append(np.mean(x["tiny_openclip"]) - np.mean(x["tiny_siglip"]))
    assert rows[2]["num_images"] == len(used)
    assert rows[2]["diff_ci95"] == pytest.approx(list(np.quantile(diffs, [0.025, 0.975])), abs=1e-9)


def test_a_rerun_from_the_cache_gives_the_same_controls(tmp_path):
    jsonl = copy_input(tmp_path, FLIPTYPES)
    first = run("run_lgip_by_fliptype", jsonl, [OPENCLIP_TINY], CACHE_DIR="auto", BOOTSTRAP=20)[0]
    again = run("run_lgip_by_fliptype", jsonl, [OPENCLIP_TINY], CACHE_DIR="auto", BOOTSTRAP=20)[0]
    assert again["run"]["model"]["weights_loaded"] is False
    for key in KEYS:
        assert again[key] == first[key] and again.get(key + "_ci95") == first.get(key + "_ci95"), key
    assert again["by_flip_type"]["color"]["grounded_pos_rate"] == first["by_flip_type"]["color"]["grounded_pos_rate"]


def test_published_fields_are_unchanged(tmp_path):
    """The new keys come beside the published ones: reference protocol still reproduces them."""
    from conftest import TINY_MODELS

    jsonl = copy_input(tmp_path, PERTURB)
    rows = run("run_lgip_multi", jsonl, TINY_MODELS, PROTOCOL="reference")
    ref = json.load(open(os.path.join(REFERENCE, "fixture_with_perturb__LGIP_ALL.metrics.json")))
    for ours, published in zip(rows, ref):
        for key, value in published.items():
            assert ours[key] == pytest.approx(value, abs=1e-6) if isinstance(value, float) else ours[key] == value
        assert [k for k in ours if k in published] == list(published)  # the published keys, in their order
    assert os.path.isfile(tmp_path / "fixture_with_perturb__LGIP_comparisons.metrics.json")
