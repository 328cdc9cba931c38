"""report.py's web page at the published scale (nine models, the default TOP_K), opened in a real
headless Chromium from another folder; and the lgip.report helpers against plain restatements.

The nine models' metrics and score files are made here (no model runs): each model's strongest
failures fall on images of its own, so the galleries show as many different photographs as they
can (the page's size at its worst), and two of them point at a missing and an unreadable image.
Five models have explain_flips.py metrics, four of them its per-flip lines (word scores). All but the
last (NO_CONTROLS, an evaluation from before them) have the text-prior controls in their metrics and
each flip's prior gap in their score files; the paired comparisons of the others are beside them.
"""

import csv
import json
import os
import random
import re
import shutil

import numpy as np
import pytest

from conftest import run_script
from lgip.method import COLORS, NUMBER_WORDS, OBJECTS
from lgip.models import PUBLISHED_MODELS

MODELS = [m["name"] for m in PUBLISHED_MODELS]  # nine
HTML_WORDS = "waiting near Tom & Jerry's <b>wall</b>"  # captions are text, never markup
PER_MODEL = 20  # records whose flips and paraphrases only this model gets badly wrong
MAX_PAGE_BYTES = 5_000_000
# localization: above chance, at chance, below, no interval
EXPLAINED = {
    MODELS[0]: (0.6, [0.4, 0.8]),
    MODELS[1]: (0.15, [0.05, 0.3]),
    MODELS[2]: (0.0, [0.0, 0.05]),
    MODELS[3]: (0.3, None),
    MODELS[4]: (0.5, [0.3, 0.7]),
}
EXPLAIN_MISSING = MODELS[4]  # in the explain metrics, its lines' file not there
# F-CLIPScore's AP, CLIPScore's, the gain's interval; MODELS[3]: an older file
DETECTION = {
    MODELS[0]: (0.52, 0.44, [0.03, 0.13]),
    MODELS[1]: (0.40, 0.43, [-0.07, 0.01]),
    MODELS[2]: (0.45, 0.45, None),
    MODELS[4]: (None, None, None),
}
UNEXPLAINED = 1  # an explained model's own record j = 1 has no explain line: its card says nothing more
NO_CONTROLS = MODELS[-1]  # its metrics and score files from before the text-prior controls
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def photos(folder, n, size=(320, 240)):
    """n different photographs (crops of matplotlib's sample portrait, mirrored and tinted)."""
    from matplotlib import cbook
    from PIL import Image, ImageOps

    rng = random.Random(0)
    with Image.open(cbook.get_sample_data("grace_hopper.jpg")) as src:
        src = src.convert("RGB").resize((1024, 1200))
    os.makedirs(folder, exist_ok=True)
    names = []
    for i in range(n):
        w = rng.randint(420, 1000)
        x, y = rng.randint(0, 1024 - w), rng.randint(0, 1200 - w * 3 // 4)
        img = src.crop((x, y, x + w, y + w * 3 // 4)).resize(size)
        if i % 2:
            img = ImageOps.mirror(img)
        tint = Image.new("RGB", size, tuple(rng.randint(0, 255) for _ in range(3)))
        img = Image.blend(img, tint, 0.25)
        name = f"{i + 1:012d}.jpg"
        img.save(os.path.join(folder, name), quality=90)
        names.append(name)
    return names


def swap(word, words, rng):
    return rng.choice([w for w in words if w != word])


def make_inputs(folder):
    """nine.jsonl's two evaluations (multi, fliptypes) as their scripts leave them: metrics with
    intervals and one score file per model, the sims drawn so that model m fails worst on records
    [m * PER_MODEL, (m + 1) * PER_MODEL); the two last records have no readable image."""
    rng = random.Random(1)
    names = photos(os.path.join(folder, "images"), PER_MODEL * len(MODELS))
    with open(os.path.join(folder, "images", "corrupt.jpg"), "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 this is not a JPEG")
    names += ["missing.jpg", "corrupt.jpg"]
    records = []
    for i, name in enumerate(names):
        n, c, o = rng.choice(NUMBER_WORDS[1:]), rng.choice(COLORS), rng.choice(OBJECTS)
        rest = "waiting near the old stone wall" if i < len(names) - 2 else HTML_WORDS
        caption = f"{n} {c} {o}s {rest}"
        flips = [
            (f"{swap(n, NUMBER_WORDS, rng)} {c} {o}s {rest}", "number"),
            (f"{n} {swap(c, COLORS, rng)} {o}s {rest}", "color"),
            (f"{n} {c} {swap(o, OBJECTS, rng)}s {rest}", "object"),
        ]
        paraphrases = ["a photo of " + caption, caption.replace("waiting near", "standing close to")]
        records.append((i + 1, "images/" + name, caption, flips, paraphrases))
    owner = {i: min(i // PER_MODEL, len(MODELS) - 1) for i in range(len(records))}
    owner[len(records) - 2], owner[len(records) - 1] = 0, 1  # missing: model 0's; unreadable: model 1's
    spread = [0.01 + 0.005 * ((5 * m) % len(MODELS)) for m in range(len(MODELS))]  # invariance not in model order
    for stem, key in (("nine_with_perturb", "multi"), ("nine_with_fliptypes", "fliptypes")):
        metrics = []
        for m, model in enumerate(MODELS):
            lines, errs, gaps, types = [], [], [], []
            for i, (image_id, path, caption, flips, paraphrases) in enumerate(records):
                # a model's own records: the first half with one preferred flip each, the second half
                # with one paraphrase that moves the score; the unreadable images' flips all preferred
                mine, j = owner[i] == m, i % PER_MODEL
                last = i >= len(records) - 2
                base = round(rng.uniform(0.22, 0.3), 6)
                para = [
                    {
                        "text": t,
                        "sim": round(
                            base
                            + rng.choice([-1, 1])
                            * (
                                rng.uniform(0.1, 0.3)
                                if mine and not last and j >= PER_MODEL // 2 and k == j % 2
                                else rng.uniform(0, spread[m])
                            ),
                            6,
                        ),
                    }
                    for k, t in enumerate(paraphrases)
                ]
                fl = [
                    {
                        "text": t,
                        "sim": round(
                            base
                            + (
                                rng.uniform(0.32, 0.5)
                                if mine and last
                                else rng.uniform(0.02, 0.2)
                                if mine and j < PER_MODEL // 2 and k == j % 3
                                else -rng.uniform(0, 0.1)
                            ),
                            6,
                        ),
                        "type": kind,
                    }
                    for k, (t, kind) in enumerate(flips)
                ]
                if model != NO_CONTROLS:  # each flip against the average other image: preferred there too, or not
                    for k, f in enumerate(fl):
                        f["prior_gap"] = prior_gap(i, k)
                lines.append(
                    {
                        "line": i + 1,
                        "image_id": image_id,
                        "image_path": path,
                        "caption_index": 0,
                        "caption": caption,
                        "sim": base,
                        "paraphrases": para,
                        "flips": fl,
                    }
                )
                errs.append(np.mean([abs(p["sim"] - base) for p in para]))
                gaps += [base - f["sim"] for f in fl]
                types += [f["type"] for f in fl]
            scores = f"{stem}__LGIP_{'fliptypes_' if key == 'fliptypes' else ''}{model}.scores.jsonl"
            with open(os.path.join(folder, scores), "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in lines)
            gaps, types = np.array(gaps), np.array(types)
            run = {
                "config": {"JSONL_PATH": os.path.join(folder, stem + ".jsonl"), "IMAGE_ROOT": None},
                "model": {"protocol": "corrected", "type": "siglip" if "siglip" in model else "openclip"},
                "num_records_in_file": len(records),
                "num_failed_images": 2,
                "versions": {"python": "3.11", "numpy": np.__version__},
            }
            err = float(np.mean(errs))
            m_out = {"model_tag": model, "num_samples": len(records), "scores_file": scores, "run": run}
            figures = {"invariance_error_mean": err, "invariance_error_mean_ci95": [err * 0.9, err * 1.1]}
            pos = float((gaps > 0).mean())
            sens = {
                "gap_mean": float(gaps.mean()),
                "gap_mean_ci95": [float(gaps.mean()) - 0.01, float(gaps.mean()) + 0.01],
                "pos_rate": pos,
                "pos_rate_ci95": [pos - 0.02, min(1.0, pos + 0.01)],
            }
            m_out.update(figures)
            if key == "multi":
                m_out.update({"sensitivity_" + k: v for k, v in sens.items()})
            else:
                m_out["global_sensitivity"] = dict(sens, count=len(gaps))
                m_out["by_flip_type"] = {
                    t: {
                        "pos_rate": float((gaps[types == t] > 0).mean()),
                        "gap_mean": float(gaps[types == t].mean()),
                        "count": int((types == t).sum()),
                    }
                    for t in ("color", "number", "object")
                }
            if model != NO_CONTROLS:
                add_controls(m_out, m, pos)
            metrics.append(m_out)
        write_comparisons(folder, stem, key, metrics)
        suffix = "LGIP_ALL.metrics.json" if key == "multi" else "LGIP_fliptypes.metrics.json"
        with open(os.path.join(folder, f"{stem}__{suffix}"), "w", encoding="utf-8") as f:
            json.dump(metrics, f)
    with open(os.path.join(folder, "nine.jsonl"), "w", encoding="utf-8") as f:
        for image_id, path, caption, _, _ in records:
            f.write(json.dumps({"image_id": image_id, "image_path": path, "orig_captions": [caption]}) + "\n")
    make_explain(folder, records)
    make_retrieval(folder, len(records) - 2)
    make_images(folder, records[:-2])
    return records


IMAGE_FLIP_OFFSET = 7  # the rotation the image side's other image follows (any k in 1..N-1)


def make_images(folder, readable):
    """run_lgip_images.py's outputs for nine_with_fliptypes.jsonl as it leaves them (LGIP_SPEC.md 11; the
    two records without a readable image skipped): each model prefers the altered images of its own
    records, mix for the first half and patch for the second; figures distinct per model."""
    n, k = len(readable), IMAGE_FLIP_OFFSET
    metrics = []
    for m, model in enumerate(MODELS):
        lines = []
        for i, (image_id, path, caption, _, _) in enumerate(readable):
            base, j = round(0.25 + 0.0001 * i, 6), i % PER_MODEL
            mine = i // PER_MODEL == m
            flips = []
            for kind in ("mix", "patch"):
                preferred = mine and (kind == "mix") == (j < PER_MODEL // 2)
                gap = -(0.01 + 0.001 * (7 * j % PER_MODEL)) if preferred else 0.02  # (mix and patch interleaved)
                flips.append(
                    {"text": kind, "sim": round(base - gap, 6), "other_image_path": readable[(i + k) % n][1], "r": i}
                )
            lines.append(
                {
                    "line": i + 1,
                    "image_id": image_id,
                    "image_path": path,
                    "caption_index": 0,
                    "caption": caption,
                    "sim": base,
                    "image_paraphrases": [
                        {"text": t, "sim": round(base - 0.002, 6)} for t in ("jpeg", "downscale", "crop", "hflip")
                    ],
                    "image_flips": flips,
                }
            )
        name = f"nine_with_fliptypes__LGIP_images_{model}.scores.jsonl"
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
        inv, pos = 0.002 + 0.0005 * m, round(0.5 + 0.04 * m, 6)
        out = {
            "model_tag": model,
            "num_samples": n,
            "image_invariance_error_mean": inv,
            "image_invariance_error_mean_ci95": [inv - 0.0005, inv + 0.0005],
            "image_sensitivity_gap_mean": 0.001 * m,
            "image_sensitivity_gap_mean_ci95": [0.001 * m - 0.002, 0.001 * m + 0.002],
            "image_sensitivity_pos_rate": pos,
            "image_sensitivity_pos_rate_ci95": [round(pos - 0.05, 6), round(pos + 0.05, 6)],
            "by_kind": {
                **{t: {"count": n, "image_invariance_error_mean": inv} for t in ("jpeg", "downscale", "crop", "hflip")},
                **{
                    t: {
                        "count": n,
                        "image_sensitivity_gap_mean": 0.001 * m,
                        "image_sensitivity_pos_rate": pos,
                        "t2i_flip_recall@1": 0.4,
                        "t2i_flip_recall@5": 0.7,
                        "t2i_flip_recall@10": 0.8,
                        "t2i_flip_top1_rate": 0.1 + 0.01 * m,
                    }
                    for t in ("mix", "patch")
                },
            },
            "num_images": n,
            "flip_offset": k,
            "gallery_size": n,
            "num_blocks": 1,
            "scores_file": name,
            "run": {
                "config": {"JSONL_PATH": os.path.join(folder, "nine_with_fliptypes.jsonl"), "SEED": 0},
                "model": {"protocol": "corrected"},
                "num_records_in_file": n + 2,
                "num_failed_images": 2,
            },
        }
        metrics.append(out)
    with open(os.path.join(folder, "nine_with_fliptypes__LGIP_images.metrics.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f)


def prior_gap(i, k):
    """Flip k of record i: preferred on the average other image too (prior gap < 0), or not."""
    return -0.05 if (i + k) % 2 == 0 else 0.03


def add_controls(m_out, m, pos):
    """Model m's text-prior controls and hard positives (LGIP_SPEC.md 9, 10) as the evaluations write
    them, with intervals: its prior positive rate equal to, below or above its positive rate by m."""

    def rate(v):
        return round(min(1.0, max(0.0, v)), 6)

    prior = rate(pos + (0.0, -0.1, 0.05)[m % 3])
    figures = {
        "prior_pos_rate": prior,
        "grounded_pos_rate": rate(0.45 + 0.05 * (m % 4)),
        "prior_gap_mean": 0.01 * m - 0.03,
        "grounded_gap_mean": 0.002 * m,
        "robust_pos_rate": rate(0.3 + 0.05 * m),
        "text_only_rate": rate(0.6 - 0.02 * m),
    }
    for key, v in figures.items():
        m_out[key], m_out[key + "_ci95"] = (
            v,
            ([rate(v - 0.06), rate(v + 0.06)] if "rate" in key else [v - 0.01, v + 0.01]),
        )
    m_out["invariance_error_prior_mean"], m_out["invariance_error_grounded_mean"] = 0.02, 0.01 + 0.001 * m
    for b in (m_out.get("by_flip_type") or {}).values():
        b.update(
            prior_pos_rate=rate(b["pos_rate"] - 0.05),
            grounded_pos_rate=0.5,
            prior_gap_mean=0.0,
            grounded_gap_mean=0.01,
            robust_pos_rate=0.4,
            text_only_rate=None,
        )


def comparison_value(m_out, figure, flip_type):
    if flip_type is not None:
        return m_out["by_flip_type"][flip_type]["pos_rate" if figure == "sensitivity_pos_rate" else figure]
    if figure == "sensitivity_pos_rate":
        return m_out.get("sensitivity_pos_rate", (m_out.get("global_sensitivity") or {}).get("pos_rate"))
    return m_out[figure]


def write_comparisons(folder, stem, key, metrics):
    """<stem>__LGIP_comparisons.metrics.json as the evaluations write it: run_lgip_multi.py's every pair
    of the models with controls, run_lgip_by_fliptype.py's of the first three, overall and by flip type;
    the interval of each difference 0.03 either side (so some exclude 0), one pair without an interval."""
    ms = [m for m in metrics if m["model_tag"] != NO_CONTROLS][: None if key == "multi" else 3]
    figures = [(f, None) for f in ("sensitivity_pos_rate", "grounded_pos_rate", "invariance_error_mean")]
    if key == "fliptypes":
        figures += [
            (f, t) for t in ("color", "number", "object") for f in ("sensitivity_pos_rate", "grounded_pos_rate")
        ]
    rows = []
    for ia, a in enumerate(ms):
        for b in ms[ia + 1 :]:
            for figure, flip_type in figures:
                va, vb = comparison_value(a, figure, flip_type), comparison_value(b, figure, flip_type)
                diff = va - vb
                ci = (
                    None
                    if (ia, b["model_tag"], figure) == (0, ms[1]["model_tag"], "grounded_pos_rate")
                    else [diff - 0.03, diff + 0.03]
                )
                rows.append(
                    {
                        "script": "run_lgip_multi.py" if key == "multi" else "run_lgip_by_fliptype.py",
                        "a": a["model_tag"],
                        "b": b["model_tag"],
                        "figure": figure,
                        "flip_type": flip_type,
                        "diff": diff,
                        "diff_ci95": ci,
                        "a_value": va,
                        "b_value": vb,
                        "num_images": 180,
                        "excludes_zero": None if ci is None else ci[0] > 0 or ci[1] < 0,
                        "run": {"created": "2026-01-01"},
                    }
                )
    with open(os.path.join(folder, f"{stem}__LGIP_comparisons.metrics.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f)


RETRIEVAL_RATES = [
    "i2t_recall@1",
    "i2t_recall@5",
    "i2t_recall@10",
    "t2i_recall@1",
    "t2i_recall@5",
    "t2i_recall@10",
    "i2t_flip_recall@1",
    "i2t_flip_recall@5",
    "i2t_flip_recall@10",
    "i2t_flip_top1_rate",
    "own_flip_preferred_rate",
    "t2i_paraphrase_recall@1",
    "t2i_paraphrase_agreement@1",
]


def make_retrieval(folder, n):
    """nine_with_fliptypes' retrieval metrics as run_lgip_retrieval.py writes them: every rate of
    LGIP_SPEC.md section 7 with its interval, per flip type, the counts; distinct per model."""
    metrics = []
    for m, model in enumerate(MODELS):
        out = {
            "model_tag": model,
            "num_samples": n,
            "gallery_size": n,
            "num_blocks": 1,
            "num_captions": n,
            "num_flips": 3 * n,
            "num_paraphrases": 2 * n,
            "num_images_with_flips": n,
        }
        for k, name in enumerate(RETRIEVAL_RATES):
            v = round(0.05 + 0.1 * ((2 * m + k) % 9), 6)
            out[name], out[name + "_ci95"] = v, [round(v - 0.03, 6), round(v + 0.04, 6)]
        out["by_flip_type"] = {
            t: {"i2t_flip_top1_rate": 0.1 * j + 0.01 * m, "own_flip_preferred_rate": 0.2 + 0.01 * m, "count": n}
            for j, t in enumerate(("color", "number", "object"))
        }
        out["run"] = {
            "config": {"JSONL_PATH": os.path.join(folder, "nine_with_fliptypes.jsonl")},
            "model": {"protocol": "corrected", "weights_loaded": False},
            "num_records_in_file": n + 2,
            "num_failed_images": 2,
        }
        metrics.append(out)
    with open(os.path.join(folder, "nine_with_fliptypes__LGIP_retrieval.metrics.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f)


def explain_line(image_path, caption, flip, scores):
    words, caption_words = flip.split(), caption.split()
    changed = [w for w, (a, b) in enumerate(zip(caption_words, words)) if a != b]
    blamed = min((v, w) for w, v in enumerate(scores) if v is not None)[1]
    return {
        "line": 1,
        "image_path": image_path,
        "caption_index": 0,
        "caption": caption,
        "flip": flip,
        "flip_type": "color",
        "drawn": ["top_k"],
        "sim_caption": 0.25,
        "sim_flip": 0.3,
        "gap": -0.05,
        "tokens": words,
        "token_words": list(range(len(words))),
        "token_scores": scores,
        "words": words,
        "word_scores": scores,
        "changed": changed,
        "blamed": blamed,
        "hit": blamed in changed,
        "caption_words": caption_words,
        "caption_word_scores": [0.001] * len(caption_words),
    }


def make_explain(folder, records):
    """explain_flips.py's outputs for nine_with_fliptypes.jsonl as it leaves them: an explained
    model's lines are the flips of its own records (but for record UNEXPLAINED and the unreadable
    images) and, with other scores, the next model's first records' flips; its metrics are EXPLAINED."""
    rng = random.Random(2)
    metrics = []
    for m, model in enumerate(EXPLAINED):
        lines = []
        for i, (_, path, caption, flips, _) in enumerate(records[:-2]):
            own, nexts = (
                i // PER_MODEL == m and i % PER_MODEL != UNEXPLAINED,
                i // PER_MODEL == m + 1 and i % PER_MODEL < 3,
            )
            for k, (flip, _) in enumerate(flips if own or nexts else ()):
                scores = [round(rng.uniform(-0.01, 0.01), 6) for _ in flip.split()]
                changed = next(w for w, (a, b) in enumerate(zip(caption.split(), flip.split())) if a != b)
                if k == 1:
                    scores[changed] = -0.02  # blamed: the changed word
                if k == 2 and own:
                    scores[-1] = None  # a word without tokens
                lines.append(explain_line(path, caption, flip, scores))
        name = f"nine_with_fliptypes__LGIP_explain_{model}.jsonl"
        if model != EXPLAIN_MISSING:
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                f.writelines(json.dumps(line) + "\n" for line in lines)
        acc, ci = EXPLAINED[model]
        block = {
            "localization_acc": acc,
            "localization_acc_detected": min(1.0, acc + 0.1),
            "num_detected": 30,
            "localization_acc_preferred": max(0.0, acc - 0.1),
            "num_preferred": 27,
            "chance": 0.125,
        }
        if ci:
            block.update(
                {
                    f"{key}_ci95": [max(0.0, block[key] + ci[0] - acc), min(1.0, block[key] + ci[1] - acc)]
                    for key in ("localization_acc", "localization_acc_detected", "localization_acc_preferred")
                }
            )
        if model in DETECTION:  # explain_flips.py's misalignment detection (LGIP_SPEC.md 8): captions against flips
            ap_f, ap_s, ci = DETECTION[model]
            gain = None if ap_f is None else round(ap_f - ap_s, 6)
            block.update(
                detection_num_captions=None if ap_f is None else 40,
                detection_num_flips=None if ap_f is None else 57,
                detection_ap_clipscore=ap_s,
                detection_ap_clipscore_ci95=None if ap_s is None else [ap_s - 0.05, ap_s + 0.05],
                detection_ap_fclipscore=ap_f,
                detection_ap_fclipscore_ci95=None if ap_f is None else [ap_f - 0.05, ap_f + 0.05],
                detection_ap_gain=gain,
                detection_ap_gain_ci95=ci,
            )
        metrics.append(
            dict(
                block,
                model_tag=model,
                num_flips=57,
                explain_file=name,
                by_flip_type={"color": {"count": 19, "localization_acc": acc, "chance": 0.125}},
                run={
                    "config": {"JSONL_PATH": os.path.join(folder, "nine_with_fliptypes.jsonl"), "LAYERS": 3},
                    "model": {"protocol": "corrected"},
                    "num_records_in_file": len(records),
                    "num_failed_images": 2,
                    "versions": {"python": "3.11", "numpy": np.__version__},
                },
            )
        )
    with open(os.path.join(folder, "nine_with_fliptypes__LGIP_explain.metrics.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f)


@pytest.fixture(scope="module")
def nine(tmp_path_factory):
    """(folder, its records, report.py's output) for nine models at the default TOP_K."""
    folder = tmp_path_factory.mktemp("nine")
    records = make_inputs(str(folder))
    proc = run_script("report.py", f"--JSONL_PATH={folder / 'nine.jsonl'}")
    return folder, records, proc


def test_page_is_small_self_contained_and_names_unreadable_images(nine):
    folder, _, proc = nine
    page = folder / "nine__LGIP_report.html"
    html = page.read_text(encoding="utf-8")
    assert page.stat().st_size <= MAX_PAGE_BYTES, page.stat().st_size
    assert f"-> {page} (" in proc.stdout and "2 gallery images missing or unreadable" in proc.stdout
    assert "http://" not in html and "https://" not in html and "<link" not in html
    assert html.count('<table id="results"') == 1 and html.count("<tr data-model=") == len(MODELS)
    assert html.count('<article class="card"') == 2 * 10 * len(MODELS)  # top K per model; those over all are among them
    assert "Tom &amp; Jerry&#39;s &lt;b&gt;wall&lt;/b&gt;" in html and "<b>wall" not in html
    for name, why in (("missing.jpg", "image not found"), ("corrupt.jpg", "unreadable image")):
        assert f"<strong>{why}" in html and os.path.join(str(folder), "images", name) in html
    # the markdown, CSV and PNGs are still written beside it
    for name in ("report.md", "report.csv", "frontier.png", "fliptypes.png"):
        assert (folder / f"nine__LGIP_{name}").is_file(), name


def _launch(playwright, profile):
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    return playwright.chromium.launch_persistent_context(
        str(profile),
        executable_path=executable,
        headless=True,
        args=CHROMIUM_ARGS,
        viewport={"width": 1400, "height": 900},
    )


def test_page_in_chromium(request, tmp_path):
    """One page load, from a folder holding the page alone: every image decoded, no console or page
    error, nothing fetched; a header click sorts the table; flips' changed words in <mark>; filters."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright not installed (pip install -r requirements-test.txt)"
    )
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("no Chromium installed (apt-get install -y chromium; .ci/run installs it when missing)")
    folder, _, _ = request.getfixturevalue("nine")  # made only when the browser can run
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    page_path = elsewhere / "page.html"
    shutil.copy(folder / "nine__LGIP_report.html", page_path)
    errors, fetched = [], []
    with sync_api.sync_playwright() as p:
        browser = _launch(p, tmp_path / "profile")
        try:
            page = browser.new_page()
            page.on(
                "console",
                lambda m: errors.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None,
            )
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("request", lambda r: fetched.append(r.url))
            page.goto(page_path.as_uri(), wait_until="load")
            images = page.evaluate("""() => Promise.all([...document.images].map(img => img.decode().then(
                () => [img.alt, img.naturalWidth], () => [img.alt, 0])))""")
            placeholders = page.eval_on_selector_all(".placeholder", "els => els.map(e => e.textContent)")

            def order():
                return page.eval_on_selector_all("#results tbody tr", "rows => rows.map(r => r.dataset.model)")

            def column(name):
                return page.evaluate(
                    """name => { const th = [...document.querySelectorAll('#results thead th')]
                    .findIndex(h => h.textContent.includes(name));
                    return [...document.querySelectorAll('#results tbody tr')]"""
                    """.map(r => parseFloat(r.cells[th].dataset.v)); }""",
                    name,
                )

            before = order()
            page.click("#results thead th:has-text('Inv. error') button")
            ascending, values_up = order(), column("Inv. error")
            page.click("#results thead th:has-text('Inv. error') button")
            descending, values_down = order(), column("Inv. error")
            escaped = page.eval_on_selector_all("#flips .card td.txt b", "els => els.length")
            scored = page.eval_on_selector_all(
                "#flips .card",
                """cards => cards.map(c => ({
                model: c.dataset.model, image: c.querySelector('.imgid').title,
                caption: c.querySelector('td.txt').textContent, flip: c.querySelector('td.alt').textContent,
                words: [...c.querySelectorAll('td.alt .ws')].map(w => ({text: w.textContent, cls: w.className, """
                """title: w.title,
                    tag: w.tagName, bg: getComputedStyle(w).backgroundColor, """
                """outline: getComputedStyle(w).outlineStyle})),
                blame: c.querySelector('.blame') ? c.querySelector('.blame').textContent : null}))""",
            )
            legend = page.inner_text("#flips .legend")
            headers = page.eval_on_selector_all(
                "#results thead th", "ths => ths.map(t => t.textContent.replace(/\\u00a0/g, ' ').trim())"
            )
            priors = page.eval_on_selector_all(
                "#prior .priors li", "lis => lis.map(li => [li.dataset.model, li.textContent])"
            )
            detections = page.eval_on_selector_all(
                "#attribution .detection li", "lis => lis.map(li => [li.dataset.model, li.textContent])"
            )
            summaries = page.eval_on_selector_all(
                "#prior details.comparisons summary", "ss => ss.map(s => s.textContent)"
            )
            overall_shown = page.is_visible("#comparisons")  # (nine models: 93 comparisons, the list closed)
            page.click("#prior details.comparisons summary >> nth=0")
            overall = page.eval_on_selector_all(
                "#comparisons tbody tr",
                """rows => rows.map(r =>
                [...r.cells].map(c => c.textContent.replace(/\\s+/g, ' ').trim()))""",
            )
            overall_opened = page.is_visible("#comparisons") and page.is_visible("#comparisons tbody tr:last-child")
            by_type_shown = page.is_visible("#comparisons-by-type")
            prior_cards = page.eval_on_selector_all(
                "#flips .card",
                """cards => cards.map(c => ({
                model: c.dataset.model, image: c.querySelector('.imgid').title, """
                """caption: c.querySelector('td.txt').textContent,
                flip: c.querySelector('td.alt').textContent,
                prior: c.querySelector('.prior') && [c.querySelector('.prior').className, """
                """c.querySelector('.prior').textContent]}))""",
            )
            flips = page.eval_on_selector_all(
                "#flips .card",
                """cards => cards.map(c => [
                c.querySelector('td.txt').textContent, c.querySelector('td.alt').textContent,
                [...c.querySelectorAll('td.alt mark')].map(m => m.textContent.trim())])""",
            )

            def visible(section):
                return page.eval_on_selector_all(
                    f"#{section} .card:not([hidden])", "cards => cards.map(c => [c.dataset.model, c.dataset.type])"
                )

            shown_all = visible("flips")
            altered_all = visible("altered")
            shown_all_placeholders = len(page.query_selector_all("#flips .card:not([hidden]) .placeholder"))
            page.click(f"button.f-model[data-model='{MODELS[3]}']")
            shown_model, shown_model_paras = visible("flips"), visible("paraphrases")
            page.click("#flips button.f-type[data-type='color']")
            shown_color = visible("flips")
            shown_color_scored = len(page.query_selector_all("#flips .card:not([hidden]) .blame"))
            status = page.inner_text("#flips .status")
            altered_model = visible("altered")
            page.click("#altered button.f-type[data-type='patch']")
            altered_patch, altered_status = visible("altered"), page.inner_text("#altered .status")
            altered_pairs = page.eval_on_selector_all(
                "#altered .card:not([hidden])",
                """cards => cards.map(c =>
                [...c.querySelectorAll('.pair img')].map(i => i.naturalWidth > 0 && """
                """i.getBoundingClientRect().width > 0))""",
            )
            side = page.eval_on_selector_all("#image-side .priors li", "lis => lis.map(li => li.dataset.model)")
        finally:
            browser.close()
    assert not errors, errors
    assert all(u == page_path.as_uri() or u.startswith("data:") for u in fetched), fetched
    assert [m for m, _ in detections] == list(EXPLAINED)  # a misalignment-detection line per explained model
    assert "F beats s by +0.080" in detections[0][1] and "the interval excludes 0" in detections[0][1]
    # the thumbnails (six are placeholders), four figures, the image side's figure, its gallery's two images a card
    assert len(images) == 2 * 10 * len(MODELS) - 6 + 4 + 1 + 2 * 10 * len(MODELS)
    assert side == MODELS and len(altered_all) == 10  # a line per model; the top 10 altered images over all models
    assert len(altered_model) == 10 and {m for m, _ in altered_model} == {MODELS[3]}  # its own: mix, then patch
    assert altered_patch and {t for _, t in altered_patch} == {"patch"} and {m for m, _ in altered_patch} == {MODELS[3]}
    assert altered_status.startswith(
        f"{len(altered_patch)} altered images shown: the patch altered images among the top 10 of "
    )
    assert altered_pairs and all(
        pair == [True, True] for pair in altered_pairs
    )  # the original and the altered, both shown
    assert any(alt.startswith("Positive rate against prior positive rate") and width > 0 for alt, width in images)
    assert all(width > 0 for _, width in images), [alt for alt, width in images if not width]
    assert {t.split("images")[-1] for t in placeholders} == {os.sep + "missing.jpg", os.sep + "corrupt.jpg"}
    assert all(("image not found" in t) == ("missing.jpg" in t) for t in placeholders)
    assert before != ascending and values_up == sorted(values_up) and values_down == sorted(values_down, reverse=True)
    assert descending == ascending[::-1]
    assert len(flips) >= 10 * len(MODELS) and escaped == 0
    assert sum(HTML_WORDS in caption for caption, _, _ in flips) >= 6  # shown as the text it is
    for caption, flip, marks in flips:  # the flip changes one word: that word, and only it, is marked
        changed = [b for a, b in zip(caption.split(), flip.split()) if a != b]
        assert len(caption.split()) == len(flip.split()) and marks == changed and len(marks) == 1, (
            caption,
            flip,
            marks,
        )
    assert len(shown_all) == 10 and shown_all_placeholders == 6  # the two unreadable images' flips head the list
    assert len(shown_model) == 10 and {m for m, _ in shown_model} == {MODELS[3]}
    assert len(shown_model_paras) == 10 and {m for m, _ in shown_model_paras} == {MODELS[3]}
    assert shown_color and {t for _, t in shown_color} == {"color"} and {m for m, _ in shown_color} == {MODELS[3]}
    from lgip.report import short_label

    label = short_label(MODELS[3])
    assert status.startswith(
        f"{len(shown_color)} flip{'s' if len(shown_color) != 1 else ''} shown: the color flips among "
        f"the top 10 of {label}; {shown_color_scored} of them with word scores."
    ), status
    check_word_scores(folder, scored, legend)
    check_controls(folder, headers, priors, summaries, overall, prior_cards)
    assert not overall_shown and overall_opened and not by_type_shown  # (a click opens the overall list)


def check_controls(folder, headers, priors, summaries, overall, cards):
    """The results table's Prior pos. and Grounded pos. right after Pos. rate; a line per model; the
    paired comparisons, each with "interval excludes 0", "—" or "— (no interval)"; each flip card whose
    score file has its prior gap says whether the model prefers the flip on the average other image too."""
    from lgip.report.controls_text import prior_line

    at = headers.index("Pos. rate ↑")
    assert headers[at : at + 3] == ["Pos. rate ↑", "Prior pos.", "Grounded pos. ↑"], headers
    rows = {r["model"]: r for r in csv.DictReader(open(folder / "nine__LGIP_report.csv", newline="", encoding="utf-8"))}
    assert [m for m, _ in priors] == MODELS
    kinds = set()
    for model, text in priors:
        r = {
            k: float(v) if v else None
            for k, v in rows[model].items()
            if k.startswith(("pos_rate", "prior_", "grounded_"))
        }
        line = prior_line(
            dict(r, model=model, _controls=model != NO_CONTROLS), "nine_with_perturb__LGIP_ALL.metrics.json"
        )
        assert text == line.replace("`", ""), (text, line)
        kinds |= {k for k in ("all (", "own images add", "take", "no text-prior control in") if k in text}
    assert kinds == {"all (", "own images add", "take", "no text-prior control in"}
    files = [
        json.loads((folder / f"nine_with_{s}__LGIP_comparisons.metrics.json").read_text(encoding="utf-8"))
        for s in ("perturb", "fliptypes")
    ]
    expected = [c for f in files for c in f if c["flip_type"] is None]
    assert len(overall) == len(expected) == 28 * 3 + 3 * 3
    says = [row[-1] for row in overall]
    assert says.count("interval excludes 0") == sum(bool(c["excludes_zero"]) for c in expected) > 0
    dashes = sum(c["excludes_zero"] is False for c in expected)
    assert says.count("— (no interval)") == 2 and says.count("—") == dashes > 0
    n_by_type = sum(c["flip_type"] is not None for f in files for c in f)
    assert summaries == [
        f"Overall ({len(expected)} comparisons, {says.count('interval excludes 0')} with an interval that excludes 0)",
        f"By flip type ({n_by_type} comparisons, "
        f"{sum(bool(c['excludes_zero']) for f in files for c in f if c['flip_type'])} "
        "with an interval that excludes 0)",
    ]
    gaps = {}
    for path in folder.glob("nine_with_*__LGIP_*.scores.jsonl"):
        model = next(m for m in MODELS if path.name.endswith(f"_{m}.scores.jsonl"))
        for line in map(json.loads, path.read_text(encoding="utf-8").splitlines()):
            for f in line.get("flips") or ():  # (the image side's score files have image_flips)
                gaps[model, line["image_path"], line["caption"], f["text"]] = f.get("prior_gap")
    seen = set()
    for c in cards:
        gap = gaps[c["model"], c["image"], c["caption"], c["flip"]]
        if gap is None:
            assert c["prior"] is None and c["model"] == NO_CONTROLS, c
            seen.add("none")
            continue
        cls, text = c["prior"]
        signed = f"{gap:+.4f}".replace("-", "−")
        if gap <= 0:
            assert (
                cls == "prior any" and text.startswith("prefers it on the average other image too") and signed in text
            ), c
        else:
            assert cls == "prior own" and text.startswith("prefers it only on this image") and signed in text, c
        seen.add(cls)
    assert seen == {"none", "prior any", "prior own"}


def explain_lines(folder):
    """{(model, image path, caption, flip): its first explain line} of the explain files written."""
    lines = {}
    for model in EXPLAINED:
        path = folder / f"nine_with_fliptypes__LGIP_explain_{model}.jsonl"
        for line in map(json.loads, path.read_text(encoding="utf-8").splitlines() if path.is_file() else ()):
            lines.setdefault((model, line["image_path"], line["caption"], line["flip"]), line)
    return lines


def check_word_scores(folder, cards, legend):
    """Each flip card with an explain line of its model shows its flip's words coloured by their
    scores (the score on hover), the blamed word outlined and named; the others show none."""
    lines, explained_cards, seen = explain_lines(folder), 0, set()
    for card in cards:
        line = lines.get((card["model"], card["image"], card["caption"], card["flip"]))
        if line is None:
            assert card["words"] == [] and card["blame"] is None, card
            continue
        explained_cards += 1
        words = card["words"]
        assert [w["text"] for w in words] == line["words"] == card["flip"].split()
        for k, (w, score) in enumerate(zip(words, line["word_scores"])):
            assert ("blamed" in w["cls"].split()) == (k == line["blamed"]) == w["title"].startswith("blamed")
            assert (w["tag"] == "MARK") == (k in line["changed"]) == w["title"].endswith(", the changed word")
            assert (w["outline"] == "solid") == (k == line["blamed"])
            seen.add("no score" if score is None else "scored")
            if score is None:
                assert (
                    w["title"] == "no score (no tokens)"
                    and "none" in w["cls"].split()
                    and w["bg"] == "rgba(0, 0, 0, 0)"
                )
                continue
            shown = float(re.search(r"[+−]\d[\d.]*(e[+−]\d+)?", w["title"]).group().replace("−", "-"))
            assert shown == float(f"{score:+.3g}"), (w, score)
            assert ("neg" if score < 0 else "pos") in w["cls"].split()
            assert w["bg"].startswith("rgba(") and w["bg"] != "rgba(0, 0, 0, 0)"  # coloured
        blamed = line["words"][line["blamed"]]
        seen.add("hit" if line["hit"] else "miss")
        assert card["blame"] == f"blames {blamed} " + ("the changed word" if line["hit"] else "not the changed word")
    assert seen == {"scored", "no score", "hit", "miss"}
    assert explained_cards >= 25 and any(c["words"] == [] and c["model"] in EXPLAINED for c in cards)
    assert not any(c["words"] for c in cards if c["model"] in (EXPLAIN_MISSING, *MODELS[5:]))
    metrics = json.loads((folder / "nine_with_fliptypes__LGIP_explain.metrics.json").read_text(encoding="utf-8"))
    each = {m["num_flips"] for m in metrics}.pop()  # (the fixture's explained models explained as many flips each)
    assert (
        f"{sum(1 for c in cards if c['words'])} of the {len(cards)} flip cards on this page show word scores: "
        f"explain_flips.py explained {each} flips of each of {len(metrics)} models "
        f"({sum(m['num_flips'] for m in metrics)} "
        "in all), on nine_with_fliptypes.jsonl;"
    ) in legend, legend


def localization_line(m):
    """A model's markdown line, restated from its explain_flips.py metrics."""

    def fig(key):
        ci = m.get(key + "_ci95")
        return f"{m[key]:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")

    ci, chance = m.get("localization_acc_ci95"), m["chance"]
    flag = (
        ""
        if not ci
        else ": **at chance level** (its interval contains chance)"
        if ci[0] <= chance <= ci[1]
        else ": below chance"
        if ci[1] < chance
        else ": above chance"
    )
    return (
        f"- `{m['model_tag']}`: localization {fig('localization_acc')} of {m['num_flips']} flips, "
        f"chance {chance:.3f}{flag}; "
        f"detected {fig('localization_acc_detected')} of {m['num_detected']} flips, "
        f"preferred {fig('localization_acc_preferred')} of {m['num_preferred']} flips."
    )


def test_markdown_csv_and_page_give_each_explained_models_localization(nine):
    """One markdown line per explained model (figure, interval, chance, detected / preferred), the
    same on the page; the results table's and the CSV's localization columns; a missing explain file named."""
    from html import unescape

    folder, _, _ = nine
    metrics = json.loads((folder / "nine_with_fliptypes__LGIP_explain.metrics.json").read_text(encoding="utf-8"))
    md = (folder / "nine__LGIP_report.md").read_text(encoding="utf-8")
    section = md.split("\n## Which word does a model blame?\n")[1].split("\n## ")[0].split("\n### ")[0]
    lines = [line for line in section.splitlines() if line.startswith("- ")]
    assert lines == [localization_line(m) for m in metrics] and len(lines) == len(EXPLAINED)
    assert [
        sum(flag in line for line in lines) for flag in ("above chance", "**at chance level**", "below chance")
    ] == [2, 1, 1]
    assert f"missing: `nine_with_fliptypes__LGIP_explain_{EXPLAIN_MISSING}.jsonl`" in section
    table = md.split("\n## Results\n")[1].strip().split("\n\n")[0].splitlines()
    assert table[0].rstrip(" |").endswith("Loc. acc. ↑")
    assert table[2].split("|")[-2].strip() == "0.600 [0.400, 0.800]" and table[-1].split("|")[-2].strip() == "–"
    with open(folder / "nine__LGIP_report.csv", newline="", encoding="utf-8") as f:
        rows = {r["model"]: r for r in csv.DictReader(f)}
    by_tag = {m["model_tag"]: m for m in metrics}
    for model in MODELS:
        r, m = rows[model], by_tag.get(model)
        if m is None:
            assert all(r[c] == "" for c in r if c.startswith("localization_")), model
            continue
        assert float(r["localization_acc"]) == m["localization_acc"] and float(r["localization_chance"]) == m["chance"]
        ci = [repr(v) for v in m["localization_acc_ci95"]] if "localization_acc_ci95" in m else ["", ""]
        assert [r["localization_acc_ci_lo"], r["localization_acc_ci_hi"]] == ci
        assert (
            int(r["localization_num_flips"]) == m["num_flips"]
            and int(r["localization_num_preferred"]) == m["num_preferred"]
        )
        assert float(r["localization_color_acc"]) == m["by_flip_type"]["color"]["localization_acc"]
        assert r["localization_number_acc"] == ""
    text = unescape(re.sub(r"<[^>]+>", "", (folder / "nine__LGIP_report.html").read_text(encoding="utf-8")))
    for line in lines:
        assert line[2:].replace("`", "").replace("**", "") in text, line


def test_a_line_per_explained_model_says_whether_f_clipscore_beats_clipscore(nine):
    """The misalignment detection (LGIP_SPEC.md 8): a line per explained model in the markdown and on the page,
    the console's sentence (lgip.explain.detection_line) with the counts; an explain file from before the
    detection figures said as such; every figure in the CSV, overall and by flip type."""
    from html import unescape
    from lgip.explain import detection_line

    folder, _, _ = nine
    metrics = json.loads((folder / "nine_with_fliptypes__LGIP_explain.metrics.json").read_text(encoding="utf-8"))
    md = (folder / "nine__LGIP_report.md").read_text(encoding="utf-8")
    section = md.split("\n### Misalignment detection: F-CLIPScore against CLIPScore\n")[1].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("- ")]
    expected = []
    for m in metrics:
        if "detection_ap_gain" not in m:
            expected.append(
                f"- `{m['model_tag']}`: no misalignment detection in its explain metrics (written before "
                "F-CLIPScore: re-run `explain_flips.py`)."
            )
        else:
            counts = (
                f" ({m['detection_num_captions']} captions, {m['detection_num_flips']} flips)"
                if m["detection_num_flips"]
                else ""
            )
            expected.append(f"- `{m['model_tag']}`: {detection_line(m)}{counts}.")
    assert lines == expected and len(lines) == len(EXPLAINED)
    says = {tag: next(line for line in lines if f"`{tag}`" in line) for tag in DETECTION}
    assert "F beats s by +0.080 [+0.030, +0.130]; the interval excludes 0 (40 captions, 57 flips)." in says[MODELS[0]]
    assert "F does not beat s by -0.030 [-0.070, +0.010]; the interval includes 0" in says[MODELS[1]]
    assert says[MODELS[2]].endswith("F does not beat s by +0.000 (40 captions, 57 flips).")  # no interval
    assert says[MODELS[4]].endswith("misalignment detection: n/a (needs explained flips and their captions).")
    text = unescape(re.sub(r"<[^>]+>", "", (folder / "nine__LGIP_report.html").read_text(encoding="utf-8")))
    for line in lines:
        assert line[2:].replace("`", "") in text, line
    with open(folder / "nine__LGIP_report.csv", newline="", encoding="utf-8") as f:
        rows = {r["model"]: r for r in csv.DictReader(f)}
    for m in metrics:
        r = rows[m["model_tag"]]
        for key in ("detection_ap_clipscore", "detection_ap_fclipscore", "detection_ap_gain"):
            v, ci = m.get(key), m.get(key + "_ci95")
            assert r[key] == ("" if v is None else repr(v)), (m["model_tag"], key)
            assert [r[key + "_ci_lo"], r[key + "_ci_hi"]] == ([repr(x) for x in ci] if ci else ["", ""])
        assert r["detection_num_captions"] == str(m.get("detection_num_captions") or "")
        assert r["detection_color_ap_gain"] == ""  # (by type: none in this fixture's blocks)


def _spearman(xs, ys):
    """The test's own: Pearson's r of the ranks, tied values sharing their mean rank."""

    def ranks(v):
        order = sorted(v)
        return [np.mean([k + 1 for k, w in enumerate(order) if w == x]) for x in v]

    return float(np.corrcoef(ranks(xs), ranks(ys))[0, 1])


def test_retrieval_figures_beside_lgip_in_the_table_csv_figure_and_text(nine):
    """run_lgip_retrieval.py's figures: two table columns beside the positive rate, every figure in
    the CSV, the figure written, and Spearman's rho across the nine models stated (not descriptive)."""
    folder, _, proc = nine
    metrics = json.loads((folder / "nine_with_fliptypes__LGIP_retrieval.metrics.json").read_text(encoding="utf-8"))
    md = (folder / "nine__LGIP_report.md").read_text(encoding="utf-8")
    table = md.split("\n## Results\n")[1].strip().split("\n\n")[0].splitlines()
    header = [c.strip() for c in table[0].split("|")[1:-1]]
    assert header[4:9] == ["Pos. rate ↑", "Prior pos.", "Grounded pos. ↑", "I2T R@1 ↑", "Flip top\u20111 ↓"]
    first = [c.strip() for c in table[2].split("|")[1:-1]]
    m0 = metrics[0]
    assert first[7] == f"{m0['i2t_recall@1']:.3f} [{m0['i2t_recall@1_ci95'][0]:.3f}, {m0['i2t_recall@1_ci95'][1]:.3f}]"
    with open(folder / "nine__LGIP_report.csv", newline="", encoding="utf-8") as f:
        rows = {r["model"]: r for r in csv.DictReader(f)}
    for m in metrics:
        r = rows[m["model_tag"]]
        for name in RETRIEVAL_RATES:
            assert (
                float(r[f"retrieval_{name}"]) == m[name] and float(r[f"retrieval_{name}_ci_hi"]) == m[name + "_ci95"][1]
            )
        assert float(r["retrieval_number_i2t_flip_top1_rate"]) == m["by_flip_type"]["number"]["i2t_flip_top1_rate"]
        assert (
            int(r["retrieval_gallery_size"]) == m["gallery_size"]
            and int(r["retrieval_color_count"]) == m["num_samples"]
        )
        assert int(r["retrieval_num_samples"]) == m["num_samples"]
    assert (
        folder / "nine__LGIP_retrieval.png"
    ).is_file() and f"-> {folder / 'nine__LGIP_retrieval.png'}" in proc.stdout
    pos = [float(rows[m["model_tag"]]["pos_rate"]) for m in metrics]
    rhos = [_spearman([m[x] for m in metrics], pos) for x in ("i2t_recall@1", "i2t_flip_top1_rate")]
    note = next(line for line in md.splitlines() if line.startswith("LGIP beside retrieval: across 9 models"))
    assert f"(`i2t_recall@1`) ρ = {rhos[0]:.2f}" in note and f"(`i2t_flip_top1_rate`) ρ = {rhos[1]:.2f}" in note
    assert "descriptive" not in note
    from html import unescape

    html = (folder / "nine__LGIP_report.html").read_text(encoding="utf-8")
    assert note.replace("`", "") in unescape(re.sub(r"<[^>]+>", "", html)) and "I2T R@1\u00a0↑" in html


def test_a_rank_correlation_under_five_models_is_labelled_descriptive():
    from lgip.report.overview import retrieval_note

    rows = [
        {"model": f"m{i}", "pos_rate": p, "retrieval_i2t_recall@1": r, "retrieval_i2t_flip_top1_rate": t}
        for i, (p, r, t) in enumerate([(0.9, 0.5, 0.1), (0.8, 0.6, 0.2), (0.7, 0.4, 0.3)])
    ]
    note = retrieval_note(rows)
    assert (
        "across 3 models" in note
        and "(`i2t_recall@1`) ρ = 0.50" in note
        and "ρ = -1.00" in note
        and "**descriptive**" in note
    )
    assert "undefined (fewer than 3 models" in retrieval_note(rows[:2])
    assert retrieval_note([{"model": "m", "pos_rate": 0.5}]) is None


# --- the lgip.report helpers ---


def test_attributions_go_to_the_flips_of_their_model_image_caption_and_text(tmp_path):
    """attach_attributions: an item gets the line of its own model, image path, caption and flip
    (the same flip text under two captions gets each caption's line); items without a line are
    left as they were; a bad line stops with its file and line."""
    import copy

    from lgip.errors import InputError
    from lgip.report import attach_attributions, word_marks

    def item(model, image, caption, flip):
        caption_words, words = word_marks(caption, flip)
        return {
            "kind": "flip",
            "model": model,
            "image_path": image,
            "caption": caption,
            "caption_words": caption_words,
            "text": flip,
            "words": words,
        }

    a, b, flip = "two red buses on a road", "two green buses on a road", "two blue buses on a road"
    items = [
        item("m1", "1.jpg", a, flip),
        item("m1", "1.jpg", b, flip),  # one flip text under two captions
        item("m2", "1.jpg", a, flip),
        item("m1", "2.jpg", a, flip),
        item("m1", "1.jpg", a, "three red buses on a road"),
    ]
    before = copy.deepcopy(items[2:])
    m1 = [
        explain_line("1.jpg", a, flip, [0.01, -0.02, 0.005, None, 0.0, -0.001]),  # blames blue: a hit
        explain_line("1.jpg", b, flip, [0.01, 0.02, -0.03, 0.004, 0.0, 0.002]),  # blames buses
        explain_line("1.jpg", a, flip, [-0.5] * 6),  # the same texts again (another caption index): the first counts
        explain_line("3.jpg", a, flip, [-0.1] * 6),
    ]  # a flip not in the gallery
    m2 = [
        explain_line("1.jpg", b, flip, [0.1] * 6),  # m2's item has caption a: no line
        explain_line("2.jpg", a, flip, [0.1] * 6),
    ]  # m1's item of this image: not m2's line
    files = []
    for model, lines in (("m1", m1), ("m2", m2)):
        files.append((model, str(tmp_path / f"{model}.jsonl")))
        (tmp_path / f"{model}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    assert attach_attributions(items, files) == 2
    for it, line, blamed, hit in ((items[0], m1[0], "blue", True), (items[1], m1[1], "buses", False)):
        scale = max(abs(v) for v in line["word_scores"] if v is not None)
        assert [(w["text"], w["changed"], w["score"], w["blamed"], w["strength"]) for w in it["words"]] == [
            (t, k == 1, v, k == line["blamed"], None if v is None else round(abs(v) / scale, 2))
            for k, (t, v) in enumerate(zip(flip.split(), line["word_scores"]))
        ]
        assert it["attribution"] == {
            "blamed": blamed,
            "hit": hit,
            "changed": ["blue"],
            "sim_caption": 0.25,
            "sim_flip": 0.3,
            "gap": -0.05,
        }
    assert items[2:] == before
    bad = dict(m1[0])
    del bad["word_scores"]
    (tmp_path / "bad.jsonl").write_text("\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=re.escape(f"{tmp_path / 'bad.jsonl'}:2: missing word_scores")):
        attach_attributions(items, [("m1", str(tmp_path / "bad.jsonl"))])
    for change, said in (
        ({"blamed": 6}, "blamed 6 or changed"),
        ({"changed": 1}, "field 'changed' is int, not a list"),
        ({"words": 5}, "field 'words' is int, not a list"),
        ({"hit": "no"}, "field 'hit' is 'no', not true or false"),
        ({"word_scores": ["x"] * 6}, "field 'word_scores' holds a value that is not a finite number or null"),
        ({"image_path": ["1.jpg"]}, "field 'image_path' is list, not a string"),
        ({"gap": "x"}, "field 'gap' is 'x', not a finite number"),
        ({"sim_flip": float("nan")}, "field 'sim_flip' is nan, not a finite number"),
    ):
        (tmp_path / "bad.jsonl").write_text(json.dumps(dict(m1[0], **change)) + "\n", encoding="utf-8")
        with pytest.raises(InputError, match=re.escape(f"bad.jsonl:1: {said}")):  # (never a traceback)
            attach_attributions(items, [("m1", str(tmp_path / "bad.jsonl"))])


def test_word_marks_compare_position_by_position_or_by_runs():
    from lgip.report import word_marks

    caption, flip = word_marks("a yellow train moving", "a green train moving")
    assert [w["text"] for w in flip if w["changed"]] == ["green"] and [w["text"] for w in caption if w["changed"]] == [
        "yellow"
    ]
    caption, para = word_marks("Two bicycles parked near a car.", "a photo of Two bicycles parked near a car.")
    assert [w["text"] for w in para if w["changed"]] == ["a", "photo", "of"] and not any(w["changed"] for w in caption)
    caption, para = word_marks("dogs waiting near the wall", "dogs standing close to the wall")
    assert [w["text"] for w in para if w["changed"]] == ["standing", "close", "to"]
    assert [w["text"] for w in caption if w["changed"]] == ["waiting", "near"]
    assert word_marks("", "") == ([], [])


def test_thumbnails_fit_and_unreadable_images_say_why(tmp_path):
    import base64
    import io

    from PIL import Image
    from lgip.report import thumbnail

    Image.new("RGB", (640, 480), (200, 30, 30)).save(tmp_path / "wide.png")
    Image.new("L", (300, 900), 128).save(tmp_path / "tall.png")
    (tmp_path / "bad.jpg").write_bytes(b"not an image")
    for name, size in (("wide.png", (200, 150)), ("tall.png", (67, 200))):
        t = thumbnail(str(tmp_path / name), 200)
        assert (t["width"], t["height"]) == size and t["src"].startswith("data:image/jpeg;base64,")
        with Image.open(io.BytesIO(base64.b64decode(t["src"].split(",", 1)[1]))) as img:
            assert img.size == size and img.mode == "RGB"
    assert thumbnail(str(tmp_path / "none.jpg"), 200) == {
        "error": "image not found",
        "path": str(tmp_path / "none.jpg"),
    }
    bad = thumbnail(str(tmp_path / "bad.jpg"), 200)
    assert bad["error"].startswith("unreadable image (") and bad["path"] == str(tmp_path / "bad.jpg")


def test_top_lists_per_model_and_over_all_models_are_the_extremes(tmp_path):
    """scan_scores' lists against a plain sort of every pair: per model and over all models."""
    from lgip.report import scan_scores

    rng = random.Random(3)
    files, pairs = [], []
    for model in ("a", "b", "c"):
        path = tmp_path / f"{model}.scores.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for i in range(40):
                base = rng.uniform(-0.3, 0.3)
                r = {
                    "image_id": i,
                    "image_path": f"{i}.jpg",
                    "caption_index": 0,
                    "caption": f"cap {i}",
                    "sim": base,
                    "paraphrases": [{"text": f"p{i}{j}", "sim": base + rng.uniform(-0.2, 0.2)} for j in range(3)],
                    "flips": [
                        {"text": f"f{i}{j}", "sim": base + rng.uniform(-0.2, 0.2), "type": "color"} for j in range(3)
                    ],
                }
                f.write(json.dumps(r) + "\n")
                pairs += [(model, "para", abs(p["sim"] - base), p["text"]) for p in r["paraphrases"]]
                pairs += [(model, "flip", fl["sim"] - base, fl["text"]) for fl in r["flips"] if base - fl["sim"] < 0]
        files.append(("multi", model, str(path)))
    tops = scan_scores(files + files[:1], 7)  # a file read twice: its pairs count once

    def top(kind, model=None):
        chosen = [p for p in pairs if p[1] == kind and model in (None, p[0])]
        return [t for *_, t in sorted(chosen, key=lambda p: -p[2])[:7]]

    for model in (None, "a", "b", "c"):
        assert [r["text"] for r in tops.paraphrases[model]] == top("para", model)
        assert [r["text"] for r in tops.flips[model]] == top("flip", model)
    per_model, _ = tops.for_markdown(per_model=True)
    assert list(per_model) == ["a", "b", "c"] and list(tops.for_markdown(per_model=False)[0]) == [None]


def test_topk_keeps_largest_once():
    from lgip.report import TopK

    top = TopK(3)
    for i, score in enumerate([0.1, 0.5, 0.3, 0.5, 0.9, 0.2]):
        top.offer(score, ("k", i), i)
    top.offer(0.95, ("k", 4), "duplicate")  # key already held: ignored
    assert top.rows() == [4, 1, 3]


def test_pareto_front():
    from lgip.report import pareto_front

    assert pareto_front([(0.1, 0.6), (0.2, 0.9), (0.3, 0.8), (0.1, 0.5)]) == [0, 1]
    assert pareto_front([(0.2, 0.5), (0.1, 0.7)]) == [1]
    assert pareto_front([(0.1, 0.5), (0.1, 0.5)]) == [0, 1]  # ties dominate neither


def test_short_labels():
    from lgip.report import short_labels

    labels = short_labels(MODELS + ["tiny_siglip"])
    assert labels["openclip_ViT-H-14_laion2b_s32b_b79k"] == "ViT-H-14 (laion2b)"
    assert labels["openclip_EVA02-L-14_merged2b_s4b_b131k"] == "EVA02-L-14 (merged2b)"
    assert labels["siglip2_google_siglip2-base-patch16-224"] == "siglip2-base-patch16-224"
    assert labels["tiny_siglip"] == "tiny_siglip"
    assert len(set(labels.values())) == len(labels)
    assert short_labels(["openclip_A_x_s1b_b1k", "openclip_A_x_s2b_b2k"]) == {
        "openclip_A_x_s1b_b1k": "openclip_A_x_s1b_b1k",
        "openclip_A_x_s2b_b2k": "openclip_A_x_s2b_b2k",
    }


def test_a_score_file_of_the_wrong_kind_is_named_not_a_traceback(tmp_path):
    from lgip.errors import InputError
    from lgip.report import scan_scores

    path = tmp_path / "x.scores.jsonl"
    good = {"line": 1, "caption_index": 0, "sim": 0.2, "flips": [{"text": "f", "sim": 0.3}]}
    for bad, says in (
        ([1, 2], "not a *.scores.jsonl line"),
        ({"sim": 0.2}, "field 'caption_index' missing"),
        (dict(good, flips=[{"text": "f"}]), "field 'flips[0]' is not an object with 'text' and a finite 'sim'"),
        (dict(good, sim="high"), "field 'sim' is 'high', not a finite number or null"),
    ):
        path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
        with pytest.raises(InputError, match=re.escape(f"{path}:2: {says}")):
            scan_scores([("multi", "m", str(path))], 5)


# --- the page's layout in a real browser: 1, 2 and 9 models at 1400 and 1920 px ---


def few_models(folder, dest, n, demo=None, random_init=()):
    """`dest`/few.jsonl's evaluations: the nine's metrics of its first n models only (score and
    explain files shared), plus an enhanced analysis, so that the results table has every column
    (the widest it gets); each metrics row's run block carries `demo` when given, and the models
    in `random_init` say they ran without pretrained weights (run.model.random_init)."""
    dest.mkdir()
    shutil.copy(folder / "nine.jsonl", dest / "few.jsonl")
    for name in os.listdir(folder):
        path = folder / name
        if name.startswith("nine__LGIP_") and name.endswith(".json"):
            continue  # (report.py's own outputs: the factors file)
        if not name.endswith(".json"):
            if path.is_file():
                os.symlink(path, dest / name)  # (score and explain files: read where the metrics name them)
            continue
        ms = [
            m
            for m in json.loads(path.read_text(encoding="utf-8"))  # (a paired comparison: both its models)
            if {m.get("model_tag"), m.get("a"), m.get("b")} - {None} <= set(MODELS[:n])
        ]
        for m in ms:
            if demo is not None and "model_tag" in m:
                m["run"]["demo"] = demo
            if m.get("model_tag") in random_init and "model" in m.get("run", {}):
                m["run"]["model"]["random_init"] = True
        (dest / name.replace("nine", "few")).write_text(json.dumps(ms), encoding="utf-8")
    enhanced = []
    for i, model in enumerate(MODELS[:n]):
        fig = {
            "pos_rate": 0.9 - 0.01 * i,
            "pos_rate_ci95": [0.85, 0.95],
            "gap_mean": 0.04,
            "gap_mean_ci95": [0.03, 0.05],
        }
        enhanced.append(
            {
                "model_tag": model,
                "num_samples": 180,
                "global_invariance_error_mean": 0.0123,
                "global_invariance_error_mean_ci95": [0.0101, 0.0145],
                "paraphrase_simple_inv_error_mean": 0.0111,
                "paraphrase_simple_inv_error_mean_ci95": [0.0101, 0.0121],
                "paraphrase_advanced_inv_error_mean": 0.0222,
                "paraphrase_advanced_inv_error_mean_ci95": [0.0201, 0.0243],
                "corrected": {"num_records": 180, "global_sensitivity": fig, "combined": {"global_sensitivity": fig}},
                "run": dict({"model": {"protocol": "corrected"}}, **({"demo": demo} if demo is not None else {})),
            }
        )
    (dest / "rebuttal_enhanced_few_with_fliptypes__ENHANCED_LGIP_analysis.json").write_text(
        json.dumps(enhanced), encoding="utf-8"
    )
    proc = run_script("report.py", f"--JSONL_PATH={dest / 'few.jsonl'}")
    if random_init:  # (said on the console too, once)
        assert proc.stdout.count("note: Random init: " + ", ".join(random_init)) == 1, proc.stdout
    return dest / "few__LGIP_report.html"


DEMO = (
    "Demo run: synthetic images (not COCO photographs) and a tiny random-init model that knows nothing; these "
    "figures show that the pipeline works, not how any model behaves."
)
LAYOUT = (
    """() => {
  const main = document.querySelector('main'), style = getComputedStyle(main), """
    """box = document.getElementById('results').parentElement;
  const rect = e => { const r = e.getBoundingClientRect(); return [r.left, r.right]; };
  const labelBottom = th => { const range = document.createRange();
    range.selectNodeContents([...th.querySelector('button').childNodes].find(n => n.nodeType === 3));
    return Math.max(...[...range.getClientRects()].map(r => r.bottom)); };
  return {inner: window.innerWidth, page: document.documentElement.scrollWidth,
          main: [main.getBoundingClientRect().left + parseFloat(style.paddingLeft), """
    """main.getBoundingClientRect().right - parseFloat(style.paddingRight)],
          box: rect(box), boxScroll: [box.scrollWidth, box.clientWidth], """
    """table: rect(document.getElementById('results')),
          columns: document.querySelectorAll('#results thead th').length,
          shown: [...document.querySelectorAll('#results thead th')].filter(th => th.getClientRects().length).length,
          labels: [...document.querySelectorAll('#results thead th')].filter(th => th.getClientRects().length)
            .map(labelBottom),
          others: [...document.querySelectorAll('figure, .card:not([hidden]), .filters, .legend')]
            .filter(e => e.getClientRects().length).map(rect),  // (shown: a hidden card's figures have no box)
          banner: [...document.querySelectorAll('.demo-banner')].map(e => e.textContent)};
}"""
)


def test_page_layout_fits_the_window_with_one_two_and_nine_models(request, tmp_path):
    """At 1400 and 1920 px (and 1000, where it cannot fit): the page never scrolls sideways; the
    results table starts at the page's margin and fits, or scrolls inside its own box; its header
    labels end on one line (sorted or not); figures and galleries stay in the column; the demo
    banner shows on a demo run's page only."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright not installed (pip install -r requirements-test.txt)"
    )
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("no Chromium installed (apt-get install -y chromium; .ci/run installs it when missing)")
    folder, _, _ = request.getfixturevalue("nine")
    demo = {"model": True, "input": True, "message": "the bundled demo"}
    pages = {
        1: few_models(folder, tmp_path / "one", 1, demo),
        2: few_models(folder, tmp_path / "two", 2),
        9: folder / "nine__LGIP_report.html",
    }
    seen = {}
    with sync_api.sync_playwright() as p:
        browser = _launch(p, tmp_path / "profile")
        try:
            page = browser.new_page()
            for n, path in pages.items():
                page.goto(path.as_uri(), wait_until="load")
                for width in (1400, 1920, 1000):
                    page.set_viewport_size({"width": width, "height": 900})
                    seen[n, width] = page.evaluate(LAYOUT)
                page.set_viewport_size({"width": 1400, "height": 900})
                page.click("#results thead th:nth-child(3) button")  # sorted: its arrow shows
                seen[n, "sorted"] = page.evaluate(LAYOUT)
                page.click("#all-columns")  # every column, one click away
                seen[n, "all"] = page.evaluate(LAYOUT)
                seen[n, "all", "button"] = page.inner_text("#all-columns")
        finally:
            browser.close()
    assert seen[1, 1400]["columns"] == 19 and seen[9, 1400]["columns"] == 16  # (one model: every column there is)
    # the headline columns first (the console's and Inv. rel.), the rest one click away
    assert seen[1, 1400]["shown"] <= 10 and seen[9, 1400]["shown"] <= 10, (
        seen[1, 1400]["shown"],
        seen[9, 1400]["shown"],
    )
    assert seen[1, "all"]["shown"] == 19 and seen[9, "all"]["shown"] == 16
    assert seen[9, "all", "button"] == "Show the headline columns"
    for n in pages:
        del seen[n, "all", "button"]
    for (n, width), m in seen.items():
        where = f"{n} model(s) at {width}"
        left, right = m["main"]
        assert m["page"] <= m["inner"], (where, m["page"], m["inner"])  # the page never scrolls sideways
        assert left - 0.5 <= m["box"][0] and m["box"][1] <= right + 0.5, (where, m["box"], m["main"])
        assert m["table"][0] >= left - 0.5, (where, m["table"], m["main"])  # from the margin, not left of it
        assert max(m["labels"]) - min(m["labels"]) <= 1, (where, m["labels"])  # the header labels' bottoms in line
        assert all(left - 0.5 <= a and b <= right + 0.5 for a, b in m["others"]), (
            where,
            [x for x in m["others"] if not (left - 0.5 <= x[0] and x[1] <= right + 0.5)],
            m["main"],
        )
        assert m["banner"] == ([DEMO] if n == 1 else []), (where, m["banner"])
        if width in (1400, 1920, "sorted", "all"):
            assert m["boxScroll"][0] <= m["boxScroll"][1], (where, m["boxScroll"])  # it fits: nothing to scroll
    assert seen[1, 1000]["boxScroll"][0] <= seen[1, 1000]["boxScroll"][1]  # the headline columns fit at 1000 px too


ONE_MODEL = """() => {
  const shown = e => !!e && e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden';
  const results = document.getElementById('results-section').innerText;
  return {filter: shown(document.getElementById('model-filter')),
          single: [...document.querySelectorAll('.single-model')].filter(shown).map(e => e.textContent),
          figures: [...document.querySelectorAll('#figures figcaption .file')].map(e => e.textContent),
          frontier: results.includes('Pareto frontier ('), retrieval: results.includes('LGIP beside retrieval: across'),
          rho: document.body.innerText.includes('undefined (1 model'),
          galleries: [...document.querySelectorAll('section.gallery')].map(s =>
            [s.id, [...s.querySelectorAll('.demo-note')].filter(shown).map(e => e.textContent)]),
          warn: [...document.querySelectorAll('#results-section .warn')].filter(shown).map(e => e.textContent),
          status: document.querySelector('#flips .status').textContent};
}"""


def test_a_one_model_page_leaves_out_what_compares_models_and_says_so_once(request, tmp_path):
    """In Chromium: a one-model page shows no model filter, no Pareto frontier or rank-correlation
    text and no retrieval figure (each means nothing with one model), and says so once; the demo
    notice stands beside each gallery as well as at the top. A two-model page shows them all, and
    names a model run without pretrained weights above its results."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright not installed (pip install -r requirements-test.txt)"
    )
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("no Chromium installed (apt-get install -y chromium; .ci/run installs it when missing)")
    folder, _, _ = request.getfixturevalue("nine")
    demo = {"model": True, "input": True, "message": "the bundled demo"}
    one = few_models(folder, tmp_path / "one", 1, demo)
    two = few_models(folder, tmp_path / "two", 2, random_init=(MODELS[1],))
    seen = {}
    with sync_api.sync_playwright() as p:
        browser = _launch(p, tmp_path / "profile")
        try:
            page = browser.new_page()
            for n, path in ((1, one), (2, two)):
                page.goto(path.as_uri(), wait_until="load")
                seen[n] = page.evaluate(ONE_MODEL)
        finally:
            browser.close()
    single = seen[1]
    assert not single["filter"] and not single["frontier"] and not single["retrieval"] and not single["rho"], single
    assert len(single["single"]) == 1 and "One model" in single["single"][0], single["single"]
    assert "few__LGIP_frontier.png" in " ".join(single["figures"])
    assert not any("retrieval" in f for f in single["figures"]), single["figures"]
    assert {g for g, _ in single["galleries"]} >= {"flips", "paraphrases"}, single["galleries"]
    assert all(notes == [DEMO] for _, notes in single["galleries"]), single["galleries"]
    assert single["warn"] == [], single["warn"]
    assert "shown: " in single["status"] and "model" not in single["status"], single["status"]  # (no "over all models")
    assert "over all models" in seen[2]["status"], seen[2]["status"]
    pair = seen[2]
    assert pair["filter"] and pair["frontier"] and pair["retrieval"] and pair["single"] == [], pair
    assert any("retrieval" in f for f in pair["figures"]), pair["figures"]
    assert all(notes == [] for _, notes in pair["galleries"]), pair["galleries"]
    assert len(pair["warn"]) == 1 and pair["warn"][0].startswith(
        f"Random init: {MODELS[1]} ran without pretrained weights"
    ), pair["warn"]
    md = (tmp_path / "two" / "few__LGIP_report.md").read_text(encoding="utf-8")
    assert md.count(f"**Random init: `{MODELS[1]}` ran without pretrained weights") == 1
