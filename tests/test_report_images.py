"""The image side in the report (issue 32, part 3; LGIP_SPEC.md section 11): run_lgip_images.py's figures
in the table and the CSV as its metrics file has them, the figure of image against text, a line per
model, and the gallery of the altered images a model prefers to their original, each remade from
its score line: the pixels the model scored (encoded again, the same similarity), shown beside the
original; the top lists are the extremes of the score files, one card per (model, record, kind);
bad score lines are named; an older score file without `r` still makes a report."""

import base64
import csv
import io
import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from conftest import OPENCLIP_TINY, embed_image, encode_texts, eval_settings, run_here, run_script
from test_image_side import FLIPS, KINDS, PARA, fixture_jsonl, restated

from lgip.report import image_side as IS

MODELS3 = ["alpha_model", "beta_model", "gamma_model"]


def noise_images(folder, n):
    """n different smooth images of different sizes (the other image is resized to each original's size)."""
    os.makedirs(folder / "images", exist_ok=True)
    names = []
    for i in range(n):
        size = (64 + 8 * i, 48 + 4 * (i % 3))
        yy, xx = np.mgrid[0 : size[1], 0 : size[0]]
        arr = np.stack([255 * xx / size[0], 255 * yy / size[1], np.full(xx.shape, 40.0 * i % 256)], -1).astype(np.uint8)
        arr[: size[1] // 2, : size[0] // 2] = (
            200 - 30 * i
        ) % 256  # (smooth, so JPEG keeps it close; a block per image)
        name = f"images/{i + 1:012d}.png"
        Image.fromarray(arr).save(folder / name)
        names.append(name)
    return names


def made_inputs(folder, n=6, captions=3, seed=0, with_r=True):
    """A base JSONL and, beside it, run_lgip_multi.py's metrics and run_lgip_images.py's metrics and
    score files for three models (no model runs): model j prefers the altered images of record j
    (mix) and j + 3 (patch) for some captions, by known gaps. Returns (base JSONL, {model: [score lines]})."""
    names = noise_images(folder, n)
    base = folder / "x.jsonl"
    base.write_text(
        "".join(
            json.dumps(
                {"image_id": i + 1, "image_path": p, "orig_captions": [f"caption {i} {c}" for c in range(captions)]}
            )
            + "\n"
            for i, p in enumerate(names)
        )
    )
    fliptypes = folder / "x_with_fliptypes.jsonl"
    shutil.copy(base, fliptypes)
    multi, images, lines_of = [], [], {}
    for j, model in enumerate(MODELS3):
        run = {
            "config": {"JSONL_PATH": str(folder / "x_with_perturb.jsonl"), "IMAGE_ROOT": None},
            "model": {"protocol": "corrected", "type": "openclip"},
            "num_records_in_file": n,
            "num_failed_images": 0,
        }
        multi.append(
            {
                "model_tag": model,
                "num_samples": n,
                "invariance_error_mean": 0.1 + 0.01 * j,
                "invariance_error_mean_ci95": [0.09 + 0.01 * j, 0.11 + 0.01 * j],
                "sensitivity_gap_mean": 0.02,
                "sensitivity_gap_mean_ci95": [0.01, 0.03],
                "sensitivity_pos_rate": 0.6 + 0.1 * j,
                "sensitivity_pos_rate_ci95": [0.55 + 0.1 * j, 0.65 + 0.1 * j],
                "run": run,
            }
        )
        k = 1 + (seed + j) % (n - 1)  # (any rotation: the report reads the other image from the line)
        lines = []
        for i, p in enumerate(names):
            for c in range(captions):
                base_sim = 0.3 - 0.01 * c
                flips = []
                for kind in FLIPS:
                    preferred = (kind == "mix" and i == j) or (kind == "patch" and i == j + 3)
                    gap = -(0.05 * (j + 1) + 0.01 * c) if preferred and c < 2 else 0.02 + 0.001 * c
                    item = {"text": kind, "sim": round(base_sim - gap, 6), "other_image_path": names[(i + k) % n]}
                    if with_r:
                        item["r"] = i
                    flips.append(item)
                lines.append(
                    {
                        "line": i + 1,
                        "image_id": i + 1,
                        "image_path": p,
                        "caption_index": c,
                        "caption": f"caption {i} {c}",
                        "sim": base_sim,
                        "image_paraphrases": [{"text": t, "sim": base_sim - 0.001} for t in PARA],
                        "image_flips": flips,
                    }
                )
        scores = f"x_with_fliptypes__LGIP_images_{model}.scores.jsonl"
        (folder / scores).write_text("".join(json.dumps(x) + "\n" for x in lines))
        lines_of[model] = lines
        m = {
            "model_tag": model,
            "num_samples": n,
            "image_invariance_error_mean": 0.004 + 0.001 * j,
            "image_invariance_error_mean_ci95": [0.003 + 0.001 * j, 0.005 + 0.001 * j],
            "image_sensitivity_gap_mean": 0.01 * j,
            "image_sensitivity_gap_mean_ci95": [0.01 * j - 0.005, 0.01 * j + 0.005],
            "image_sensitivity_pos_rate": [0.45, 0.62, 0.9][j],
            "image_sensitivity_pos_rate_ci95": [[0.3, 0.6], [0.4, 0.7], [0.85, 0.95]][j],
            "by_kind": {
                **{
                    t: {
                        "count": n * captions,
                        "image_invariance_error_mean": 0.002 * (q + 1),
                        "image_invariance_error_mean_ci95": [0.001, 0.01],
                    }
                    for q, t in enumerate(PARA)
                },
                **{
                    t: {
                        "count": n * captions,
                        "image_sensitivity_gap_mean": 0.01,
                        "image_sensitivity_pos_rate": 0.5 + 0.1 * q,
                        "t2i_flip_recall@1": 0.3,
                        "t2i_flip_recall@5": 0.6,
                        "t2i_flip_recall@10": 0.9,
                        "t2i_flip_top1_rate": 0.2 + 0.1 * q,
                        "t2i_flip_top1_rate_ci95": [0.1, 0.4],
                    }
                    for q, t in enumerate(FLIPS)
                },
            },
            "num_images": n,
            "flip_offset": k,
            "gallery_size": 5000,
            "num_blocks": 1,
            "scores_file": scores,
            "run": dict(
                run, config={"JSONL_PATH": str(fliptypes), "IMAGE_ROOT": None, "SEED": seed, "KINDS": list(KINDS)}
            ),
        }
        images.append(m)
    (folder / "x_with_perturb__LGIP_ALL.metrics.json").write_text(json.dumps(multi))
    (folder / "x_with_fliptypes__LGIP_images.metrics.json").write_text(json.dumps(images))
    return base, lines_of


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def decoded(uri):
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB"), dtype=np.int16)


def test_table_csv_figure_lines_and_gallery_follow_the_image_metrics(tmp_path):
    base, lines_of = made_inputs(tmp_path)
    proc = run_script("report.py", f"--JSONL_PATH={base}", "--TOP_K=4")
    assert "Img. inv. ↓" in proc.stdout and "Img. pos. ↑" in proc.stdout
    metrics = {m["model_tag"]: m for m in json.load(open(tmp_path / "x_with_fliptypes__LGIP_images.metrics.json"))}
    rows = {r["model"]: r for r in read_csv(tmp_path / "x__LGIP_report.csv")}
    for tag, m in metrics.items():  # every figure as its file has it (the CSV: repr of the float)
        r = rows[tag]
        for key, col in (
            ("image_invariance_error_mean", "image_invariance_error"),
            ("image_sensitivity_gap_mean", "image_gap"),
            ("image_sensitivity_pos_rate", "image_pos_rate"),
        ):
            assert float(r[col]) == m[key] and [float(r[col + "_ci_lo"]), float(r[col + "_ci_hi"])] == m[key + "_ci95"]
        for kind in PARA:
            assert float(r[f"image_{kind}_invariance_error"]) == m["by_kind"][kind]["image_invariance_error_mean"]
        for kind in FLIPS:
            b = m["by_kind"][kind]
            assert float(r[f"image_{kind}_pos_rate"]) == b["image_sensitivity_pos_rate"]
            assert float(r[f"image_{kind}_t2i_flip_top1_rate"]) == b["t2i_flip_top1_rate"]
            assert (
                float(r[f"image_{kind}_t2i_flip_top1_rate_ci_hi"]) == 0.4
                and r[f"image_{kind}_t2i_flip_recall@1_ci_lo"] == ""
            )
            assert int(r[f"image_{kind}_count"]) == b["count"]
        assert int(r["image_num_images"]) == 6
    # the figure, the markdown's section: a line per model with its verdict against chance
    assert (tmp_path / "x__LGIP_image_side.png").is_file()
    md = (tmp_path / "x__LGIP_report.md").read_text(encoding="utf-8")
    section = md.split("## The image side")[1].split("\n## ")[0]
    assert "](x__LGIP_image_side.png)" in section
    assert (
        "- `alpha_model`: image invariance error 0.0040 [0.0030, 0.0050] (text: 0.1000); image positive rate 0.450 "
        "[0.300, 0.600] (text: 0.600): **at chance level**" in section
    )
    assert (
        "`gamma_model`: " in section
        and "(text: 0.800): above chance; by kind mix 0.500, patch 0.600; with the altered "
        "images in the gallery, one of them ranks first for 0.200 (mix) and 0.300 (patch) of the captions."
        in section
    )
    # the markdown's list over all models: the most negative gaps first, one row per (model, record, kind)
    table = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    assert [(c.split("|")[2].strip(), c.split("|")[4].strip(), c.split("|")[5].strip()) for c in table] == [
        ("`gamma_model`", "mix", "-0.1600"),
        ("`gamma_model`", "patch", "-0.1600"),
        ("`beta_model`", "mix", "-0.1100"),
        ("`beta_model`", "patch", "-0.1100"),
    ]
    assert "2 of 3" in table[0]
    # the page: the section, its link, the gallery with the filter by kind and both images per card
    html = (tmp_path / "x__LGIP_report.html").read_text(encoding="utf-8")
    assert 'href="#image-side"' in html and 'id="image-side"' in html and 'id="altered"' in html
    assert html.count('<article class="card altered"') == 6  # (each model's two: all of them in some list)
    assert 'data-type="mix"' in html and 'data-type="patch"' in html


def test_top_lists_are_the_extremes_one_card_per_model_record_and_kind(tmp_path):
    base, lines_of = made_inputs(tmp_path)
    files = [("images", m, str(tmp_path / f"x_with_fliptypes__LGIP_images_{m}.scores.jsonl")) for m in MODELS3]
    tops = IS.scan_altered(files, k=3)
    # restated: per model, record and kind, the captions preferring the altered image and the worst gap
    expected = {}
    for model, lines in lines_of.items():
        for x in lines:
            for it in x["image_flips"]:
                gap = x["sim"] - it["sim"]
                if gap < 0:
                    e = expected.setdefault((model, x["line"], it["text"]), {"n": 0, "gap": 0.0, "caption": None})
                    e["n"] += 1
                    if gap < e["gap"]:
                        e["gap"], e["caption"] = gap, x["caption"]
    ranked = sorted(expected.items(), key=lambda kv: kv[1]["gap"])
    assert [(r["model"], r["line"], r["kind"]) for r in tops.lists[None]] == [key for key, _ in ranked[:3]]
    for model in MODELS3:
        mine = [(key, e) for key, e in ranked if key[0] == model]
        assert [(r["line"], r["kind"]) for r in tops.lists[model]] == [key[1:] for key, _ in mine[:3]]
        for r, (_, e) in zip(tops.lists[model], mine):
            assert r["gap"] == pytest.approx(e["gap"]) and r["preferred"] == e["n"] and r["captions"] == 3
            assert r["caption"] == e["caption"] and r["sim"] - r["caption_sim"] == pytest.approx(-r["gap"])
    # each card: its original and its altered image, remade as section 11 writes it
    roots = {("images", m): [str(tmp_path)] for m in MODELS3}
    items = IS.altered_items(tops, roots, {m: m for m in MODELS3}, {m: 0 for m in MODELS3}, thumb_px=400)
    assert len(items) == len({(r["model"], r["line"], r["kind"]) for rows in tops.lists.values() for r in rows})
    for it in items:
        x = Image.open(tmp_path / it["image_path"]).convert("RGB")
        y = Image.open(tmp_path / it["other_image_path"]).convert("RGB")
        want = np.asarray(restated(x, it["kind"], y, 0, it["r"]), dtype=np.int16)
        got = decoded(it["altered_thumb"]["src"])  # (a JPEG of the same size: its pixels within JPEG's error)
        assert got.shape == want.shape and np.abs(got - want).mean() < 6, it["kind"]
        assert np.abs(decoded(it["thumb"]["src"]) - np.asarray(x, dtype=np.int16)).mean() < 6
        assert np.abs(decoded(it["thumb"]["src"]) - got).mean() > 1  # (the altered image is not the original)


def test_remade_pixels_are_exactly_section_11s():
    rng = np.random.default_rng(3)
    x = Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8))
    y = Image.fromarray(rng.integers(0, 256, (20, 31, 3), dtype=np.uint8))
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        x.save(os.path.join(d, "x.png")), y.save(os.path.join(d, "y.png"))
        for kind in FLIPS:
            for seed, r in ((0, 0), (5, 17)):
                got = IS.remake(os.path.join(d, "x.png"), os.path.join(d, "y.png"), kind, seed, r)
                assert np.array_equal(np.asarray(got), np.asarray(restated(x, kind, y, seed, r))), (kind, seed, r)
        with pytest.raises(ValueError, match="no 'r'"):
            IS.remake(os.path.join(d, "x.png"), os.path.join(d, "y.png"), "patch", 0, None)


def test_the_gallery_shows_the_pixels_the_model_scored(tmp_path):
    """End to end with a real (tiny) model: run_lgip_images.py, then the report's cards; each card's
    altered image, remade from its score line and encoded again, has the similarity the line records."""
    from lgip.models import load_model

    jsonl = fixture_jsonl(tmp_path, n=6, unreadable=False)
    settings = eval_settings(jsonl, "corrected", [OPENCLIP_TINY], image_root=tmp_path, BOOTSTRAP=20, SEED=3)
    run_here("run_lgip_images.py", **settings)
    run_here("run_lgip_by_fliptype.py", **{k: v for k, v in settings.items() if k != "SEED"})
    proc = run_script("report.py", f"--JSONL_PATH={jsonl}", "--TOP_K=50", f"--IMAGE_ROOT={tmp_path}")
    assert "Img. pos. ↑" in proc.stdout
    metrics = json.load(open(tmp_path / "in_with_fliptypes__LGIP_images.metrics.json"))
    files = [("images", m["model_tag"], str(tmp_path / m["scores_file"])) for m in metrics]
    tops = IS.scan_altered(files, k=50)
    assert tops.lists[None], "the tiny model prefers no altered image: nothing to check"
    items = IS.altered_items(
        tops, {("images", OPENCLIP_TINY["name"]): [str(tmp_path)]}, {}, IS.seeds({"images": metrics})
    )
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu")
    texts = encode_texts(enc, [it["caption"] for it in items])
    checked = set()
    for it in items:
        assert "src" in it["altered_thumb"], it["altered_thumb"]
        img = IS.remake(it["path"], it["other_path"], it["kind"], 3, it["r"])
        t = texts[it["caption"]].astype(np.float64)
        v = embed_image(enc, img).astype(np.float64)
        cos = float(v @ t / (np.linalg.norm(v) * np.linalg.norm(t)))
        assert cos == pytest.approx(it["sim"], abs=2e-5), (it["kind"], it["line"])
        checked.add(it["kind"])
    assert checked == set(FLIPS)
    html = (tmp_path / "in_with_fliptypes__LGIP_report.html").read_text(encoding="utf-8")
    assert html.count('<article class="card altered"') == len(items)


def test_bad_score_lines_are_named_and_an_older_file_still_reports(tmp_path):
    base, _ = made_inputs(tmp_path, with_r=False)
    path = tmp_path / "x_with_fliptypes__LGIP_images_alpha_model.scores.jsonl"
    # an older score file (no r): the report is made; patch's card says why it has no altered image
    run_script("report.py", f"--JSONL_PATH={base}", "--TOP_K=2")
    html = (tmp_path / "x__LGIP_report.html").read_text(encoding="utf-8")
    assert "not remade (ValueError: the score file has no &#39;r&#39; (written before it)" in html
    good = path.read_text()
    for old, new, field in (
        ('"text": "mix"', '"text": "blur"', "field 'image_flips[0]'.text is 'blur'"),
        ('"other_image_path"', '"r": -1, "other_image_path"', "field 'image_flips[0]'.r is -1"),
        ('"sim": 0.3, ', '"sim": "high", ', "field 'sim' is 'high', not a finite number or null"),
    ):
        path.write_text(good.replace(old, new, 1))
        proc = run_script("report.py", f"--JSONL_PATH={base}", "--TOP_K=2", check=False)
        assert proc.returncode != 0 and f"{path}:1: {field}" in proc.stderr, proc.stderr
        assert "no output was written" in proc.stderr
    path.write_text(good)


def test_factors_read_the_image_positive_rate_from_the_table(tmp_path):
    base, _ = made_inputs(tmp_path)
    run_script("report.py", f"--JSONL_PATH={base}", "--TOP_K=0")
    factors = json.load(open(tmp_path / "x__LGIP_factors.metrics.json"))
    assert "image_sensitivity_pos_rate" in factors["outcomes"]
    html = (tmp_path / "x__LGIP_report.html").read_text(encoding="utf-8")
    assert 'id="altered"' not in html and 'id="image-side"' in html  # (TOP_K=0: no galleries; the section still)


def test_no_image_metrics_no_image_side(tmp_path):
    base, _ = made_inputs(tmp_path)
    os.remove(tmp_path / "x_with_fliptypes__LGIP_images.metrics.json")
    proc = run_script("report.py", f"--JSONL_PATH={base}", "--TOP_K=2")
    assert "Img." not in proc.stdout and "x__LGIP_image_side.png not written" in proc.stdout
    assert not (tmp_path / "x__LGIP_image_side.png").exists()
    assert "image_pos_rate" not in read_csv(tmp_path / "x__LGIP_report.csv")[0]
    html = (tmp_path / "x__LGIP_report.html").read_text(encoding="utf-8")
    assert 'id="image-side"' not in html and 'id="altered"' not in html
