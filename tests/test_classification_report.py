"""report.py's section "Classification" (LGIP_SPEC.md 16; lgip/report/classification_text.py, classification_plot.py)
from hand-made files as run_lgip_classification.py and a FINETUNE run leave them on a held-out file (a start, two
arms and a WiSE-FT point of each): a table per dataset with each figure and its interval as the metrics file has it,
the OOD table, each model against its start, the effective robustness of the shift set over the 3 models that have it
against a hand restatement (and its file), the reliability diagram from the per-image files (its bins and ECE by
hand), the trade-off plot's points and lines; the Fine-tuning section's WiSE-FT rows; a bad field named by its dotted
path (or its per-image file's line and field), no output written; the page in Chromium."""

import base64
import json
import math
import os
import re
import shutil
import statistics

import numpy as np
import pytest

from conftest import run_here
from lgip.errors import InputError
from lgip.classification.figures import effective_robustness
from lgip.report.classification_text import reliability_bins

STEM = "held"
START = "start"
PLAIN, LGIP = "start__ft_plain", "start__ft_lgip"
MODELS = [START, PLAIN, f"{PLAIN}__wise0.5", LGIP, f"{LGIP}__wise0.5"]
ACC = {MODELS[0]: 0.8, MODELS[1]: 0.775, MODELS[2]: 0.8, MODELS[3]: 0.65, MODELS[4]: 0.725}  # (of 40 id images)
POS = {MODELS[0]: 0.55, MODELS[1]: 0.56, MODELS[2]: 0.6, MODELS[3]: 0.8, MODELS[4]: 0.7}
SHIFT = {START: 0.6, PLAIN: 0.5666666666666667, LGIP: 0.4}  # (of 30 images; the WiSE-FT points' rows lack the set)
AUROC = {m: 0.9 - 0.03 * k for k, m in enumerate(MODELS)}
N_ID, N_SHIFT, N_OOD, CLASSES = 40, 30, 25, 11


def ece_by_hand(conf, correct):
    """Section 16's ECE restated: bin b = 0..14 holds k in (b/15, (b+1)/15] (k <= 1/15 in bin 0)."""
    total = 0.0
    for b in range(15):
        members = [i for i, k in enumerate(conf) if (b / 15 < k <= (b + 1) / 15) or (b == 0 and k <= 1 / 15)]
        if members:
            acc = sum(correct[i] for i in members) / len(members)
            total += len(members) / len(conf) * abs(acc - sum(conf[i] for i in members) / len(members))
    return total


def ci(v, w=0.06):
    return [round(max(0.0, v - w), 6), round(min(1.0, v + w), 6)]


def per_image(model, seed):
    """A model's id-set and ood-set lines; its id accuracy ACC[model], confidences off the bins' edges."""
    rng = np.random.default_rng(seed)
    right = round(ACC[model] * N_ID)
    lines, conf, correct = [], [], []
    for i in range(N_ID):
        label = i % CLASSES
        ok = i < right
        k = float(np.round(rng.uniform(0.2, 0.98), 4))
        k = k + 0.00005 if abs(k * 15 - round(k * 15)) < 1e-3 else k
        pred = label if ok else (label + 1) % CLASSES
        lines.append(
            {
                "dataset": "shapes",
                "index": i,
                "image": f"images/{i}.png",
                "label": label,
                "pred": pred,
                "p_label": k if ok else (1 - k) / 2,
                "top5": [[pred, k]],
                "conf": k,
                "ood_score": round(k**1.5, 6),
            }
        )
        conf.append(k)
        correct.append(ok)
    for i in range(N_OOD):
        s = float(rng.uniform(0.1, 0.6))
        lines.append({"dataset": "shapes_ood", "index": i, "image": f"images/ood_{i}.png", "label": None})
        lines[-1].update(pred=0, p_label=None, top5=[[0, s]], conf=s, ood_score=s**1.5)
    return lines, conf, correct


def make_files(folder):
    """held.jsonl's fliptypes metrics, each arm's and point's folder, the classification metrics and per-image files."""
    os.makedirs(folder, exist_ok=True)
    with open(folder / f"{STEM}.jsonl", "w", encoding="utf-8") as f:
        f.write(json.dumps({"image_id": 1, "image_path": "images/1.png", "orig_captions": ["one red dog"]}) + "\n")
    specs = []
    for m in MODELS:
        run_folder = folder / f"{STEM}__ft_{m}"
        os.makedirs(run_folder / "model", exist_ok=True)
        spec = {"name": m, "type": "openclip", "model_name": f"local-dir:{run_folder / 'model'}", "pretrained": None}
        if m == START:
            spec = {"name": m, "type": "openclip", "model_name": "local-dir:/nowhere/start", "pretrained": None}
        elif "__wise" in m:
            arm = m.split("__wise")[0]
            meta = {"alpha": 0.5, "start": {"name": START}, "arm": {"name": arm}, "status": "done"}
            (run_folder / "wise.meta.json").write_text(json.dumps(meta), encoding="utf-8")
        else:
            w = 0 if m == PLAIN else 1
            config = {"STEPS": 3, "W_SC": w, "W_INV": w, "W_VC": 0}
            meta = {"status": "done", "start": {"name": START}, "steps_done": 3, "config": config}
            meta["split"] = {"images": {"heldout": 10}}
            (run_folder / "finetune.meta.json").write_text(json.dumps(meta), encoding="utf-8")
            log = [{"step": s, "loss": 2.0 - 0.1 * s, "loss_clip": 1.5} for s in range(3)]
            (run_folder / "train_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in log), encoding="utf-8")
        specs.append(spec)
    run = {
        "config": {"JSONL_PATH": str(folder / f"{STEM}.jsonl"), "MODELS": specs},
        "model": {"protocol": "corrected", "type": "openclip"},
        "num_records_in_file": 10,
        "num_failed_images": 0,
        "versions": {"python": "3.11"},
    }
    flips = []
    for k, m in enumerate(MODELS):
        p = POS[m]
        sens = {"gap_mean": 0.01 * k, "gap_mean_ci95": [0.01 * k - 0.01, 0.01 * k + 0.01], "pos_rate": p}
        row = {"model_tag": m, "num_samples": 10, "invariance_error_mean": 0.02, "invariance_error_mean_ci95": None}
        row["global_sensitivity"] = dict(sens, pos_rate_ci95=ci(p, 0.05), count=30)
        row["by_flip_type"] = {t: {"pos_rate": p, "gap_mean": 0.01, "count": 10} for t in ("color", "number", "object")}
        flips.append(dict(row, run=run))
    (folder / f"{STEM}__LGIP_fliptypes.metrics.json").write_text(json.dumps(flips), encoding="utf-8")
    rows, hand = [], {}
    for k, m in enumerate(MODELS):
        lines, conf, correct = per_image(m, k)
        name = folder / f"{STEM}__LGIP_classification_{m}.jsonl"
        name.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
        hand[m] = (conf, correct)
        acc = ACC[m]
        ident = {"role": "id", "source": "shapes", "num_classes": CLASSES, "n": N_ID, "n_test": N_ID // 2}
        ident.update(n_unreadable=1, unreadable=["images/40.png"], acc1=acc, acc1_ci95=ci(acc), acc5=0.95)
        ident.update(ece=ece_by_hand(conf, correct), ece_ci95=[0.01, 0.2], ece_t=0.05 + 0.01 * k, nll=0.9)
        ident.update(nll_t=0.6 + 0.1 * k, nll_t_ci95=[0.5 + 0.1 * k, 0.7 + 0.1 * k], conf_mean=0.6, conf_mean_t=0.55)
        sets = {"shapes": ident}
        if m in SHIFT:
            a = SHIFT[m]
            sets["shapes_shift"] = {"role": "shift", "source": "folder", "num_classes": CLASSES, "n": N_SHIFT}
            sets["shapes_shift"].update(n_unreadable=0, unreadable=[], acc1=a, acc1_ci95=ci(a), ece=0.1, ece_t=0.08)
            sets["shapes_shift"].update(nll_t=1.1, nll_t_ci95=[1.0, 1.2])
        sets["shapes_ood"] = {"role": "ood", "source": "shapes", "num_classes": CLASSES, "n": N_OOD, "n_unreadable": 0}
        sets["cue"] = {"role": "cue_conflict", "source": "jsonl", "num_classes": CLASSES, "n": 12, "acc1": 0.5}
        auroc = AUROC[m]
        ood = {"ood_score": "msp", "auroc": auroc, "auroc_ci95": ci(auroc, 0.04), "fpr95": 0.2 + 0.05 * k}
        ood.update(fpr95_ci95=ci(0.2 + 0.05 * k, 0.1), aupr_in=0.9, n_id=N_ID, n_ood=N_OOD)
        cue = {
            "shape_bias": 0.4 + 0.05 * k,
            "shape_match": 0.3,
            "texture_match": 0.45 - 0.05 * k,
            "n": 12,
            "dropped": 2,
        }
        comparisons = []
        for other in MODELS[k + 1 :]:
            d = acc - ACC[other]
            comparisons.append({"a": m, "b": other, "dataset": "shapes", "figure": "acc1", "diff": d})
            comparisons[-1]["diff_ci95"] = [d - 0.04, d + 0.04]
            d = AUROC[m] - AUROC[other]
            comparisons.append({"a": m, "b": other, "dataset": "shapes_ood", "figure": "auroc", "diff": d})
            comparisons[-1]["diff_ci95"] = [d - 0.1, d + 0.1]
        rows.append(
            {
                "model": specs[k],
                "model_tag": m,
                "score_kind": "cosine",
                "logit_scale": 100.0,
                "temperature": 1.5 + 0.1 * k,
                "datasets": sets,
                "ood": {"shapes_ood": ood},
                "cue_conflict": {"cue": cue},
                "comparisons": comparisons,
                "model_card": {},
                "settings": {"OOD_SCORE": "msp", "SPLIT_SEED": 0, "BOOTSTRAP": 1000},
                "run": {"config": {"JSONL_PATH": str(folder / f"{STEM}.jsonl")}, "versions": {"python": "3.11"}},
            }
        )
    (folder / f"{STEM}__LGIP_classification.metrics.json").write_text(json.dumps(rows), encoding="utf-8")
    return hand


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("classification") / "held"
    hand = make_files(folder)
    out = run_here("report.py", JSONL_PATH=str(folder / f"{STEM}.jsonl"), TOP_K=0)[0]
    return folder, hand, out


def section(md, title="Classification"):
    return md.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0] if f"\n## {title}\n" in md else ""


def table(text, caption):
    """The rows of the markdown table after the line starting with `caption`, each {header: cell}."""
    lines = text.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith(caption)) + 1
    at = next(i for i in range(at, len(lines)) if lines[i].startswith("|"))
    cells = lambda x: [c.strip() for c in x.strip().strip("|").split("|")]
    header, rows = cells(lines[at]), []
    for x in lines[at + 2 :]:
        if not x.startswith("|"):
            break
        rows.append(dict(zip(header, cells(x))))
    return rows


def shown(v, lohi, digits=3):
    return f"{v:.{digits}f}" + (f" [{lohi[0]:.{digits}f}, {lohi[1]:.{digits}f}]" if lohi else "")


def test_each_model_and_set_with_its_figures_and_intervals(made):
    folder, _, _ = made
    md = section((folder / f"{STEM}__LGIP_report.md").read_text(encoding="utf-8"))
    metrics = json.load(open(folder / f"{STEM}__LGIP_classification.metrics.json"))
    ident = table(md, "`shapes` (in-distribution; 11 classes, 40 images, the `*_t` figures on its test half of 20)")
    assert [r["Model"] for r in ident] == [f"`{m}`" for m in MODELS]
    for r, m in zip(ident, metrics):
        d = m["datasets"]["shapes"]
        assert r["T*"] == f"{m['temperature']:.2f}"
        assert r["Acc@1 ↑"] == shown(d["acc1"], d["acc1_ci95"])
        assert r["ECE ↓"] == shown(d["ece"], d["ece_ci95"]) and r["ECE (T*) ↓"] == shown(d["ece_t"], None)
        assert r["NLL (T*) ↓"] == shown(d["nll_t"], d["nll_t_ci95"])
    shift = table(md, "`shapes_shift` (distribution shift;")
    assert [r["Model"] for r in shift] == [f"`{m}`" for m in SHIFT]
    assert "Eff. robustness ↑" in shift[0] and "T*" not in shift[0]
    ood = table(md, "Out-of-distribution detection by `msp`")
    for r, m in zip(ood, metrics):
        o = m["ood"]["shapes_ood"]
        assert r["`shapes_ood` AUROC ↑"] == shown(o["auroc"], o["auroc_ci95"])
        assert r["`shapes_ood` FPR@95 ↓"] == shown(o["fpr95"], o["fpr95_ci95"])
    cue = table(md, "`cue` (cue conflict")
    assert [r["Shape bias"] for r in cue] == [f"{0.4 + 0.05 * k:.3f}" for k in range(5)]
    comp = table(md, "Paired comparisons")
    # each arm and point against its start (the file's start − arm, turned): arm − start
    row = next(r for r in comp if r["Model − reference"] == f"`{LGIP}` − `{START}`" and r["Figure"].startswith("Acc"))
    d = ACC[LGIP] - ACC[START]
    assert row["Difference [95% CI]"] == f"**{d:+.3f} [{d - 0.04:+.3f}, {d + 0.04:+.3f}]**"
    assert not any(r["Model − reference"] == f"`{LGIP}` − `{PLAIN}`" for r in comp)
    assert f"- `{LGIP}` against its start `{START}`: Acc@1 on `shapes` {d:+.3f}" in md
    assert "worse beyond resampling noise" in md and "`shapes`: 1 image unreadable, counted and not scored" in md
    html = (folder / f"{STEM}__LGIP_report.html").read_text(encoding="utf-8")
    assert 'id="classification"' in html and 'href="#classification"' in html
    assert html.count('data-set="shapes"') == 1 and shown(ACC[LGIP], ci(ACC[LGIP])).split(" ")[0] in html


def test_effective_robustness_of_the_three_models_with_the_shift_set_by_hand(made):
    folder, _, _ = made
    got = json.load(open(folder / f"{STEM}__LGIP_classification_er.metrics.json"))
    assert list(got) == ["shapes_shift"]
    fit = got["shapes_shift"]
    assert fit["models"] == list(SHIFT)
    phi = statistics.NormalDist()
    x = [phi.inv_cdf(min(max(ACC[m], 0.5 / N_ID), 1 - 0.5 / N_ID)) for m in SHIFT]
    y = [phi.inv_cdf(min(max(SHIFT[m], 0.5 / N_SHIFT), 1 - 0.5 / N_SHIFT)) for m in SHIFT]
    mx, my = sum(x) / 3, sum(y) / 3
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
    intercept = my - slope * mx
    assert fit["slope"] == pytest.approx(slope, abs=1e-9) and fit["intercept"] == pytest.approx(intercept, abs=1e-9)
    for m, xi in zip(SHIFT, x):
        assert fit["effective_robustness"][m] == pytest.approx(SHIFT[m] - phi.cdf(slope * xi + intercept), abs=1e-9)
    md = section((folder / f"{STEM}__LGIP_report.md").read_text(encoding="utf-8"))
    shift = table(md, "`shapes_shift` (distribution shift;")
    want = [f"{round(fit['effective_robustness'][m], 3) + 0.0:+.3f}" for m in SHIFT]  # (no "-0.000")
    assert [r["Eff. robustness ↑"] for r in shift] == want

    def rows(points):
        return [
            {
                "model": m,
                "datasets": {"i": {"role": "id", "acc1": a, "n": n}, "s": {"role": "shift", "acc1": b, "n": k}},
            }
            for m, a, n, b, k in points
        ]

    assert effective_robustness(rows([("a", 0.5, 10, 0.4, 10), ("b", 0.6, 10, 0.5, 10)])) == {"s": None}  # (< 3)
    # an accuracy of 1 or 0 is clipped to 1 - 0.5 / n, 0.5 / n before the probit: a finite fit
    edge = effective_robustness(rows([("a", 1.0, 10, 0.0, 20), ("b", 0.5, 10, 0.4, 20), ("c", 0.7, 10, 0.5, 20)]))
    assert all(math.isfinite(v) for v in edge["s"]["effective_robustness"].values())


def test_the_reliability_bins_and_ece_by_hand(made):
    _, hand, _ = made
    conf = np.array([0.0, 1 / 15, 1 / 15 + 1e-9, 2 / 15, 0.5, 1.0])
    counts, mean_conf, acc, ece = reliability_bins(conf, np.array([1, 0, 1, 1, 0, 1], dtype=bool))
    assert counts.tolist()[:2] == [2, 2] and counts[7] == 1 and counts[14] == 1 and counts.sum() == 6
    assert acc[0] == 0.5 and mean_conf[1] == pytest.approx((1 / 15 + 1e-9 + 2 / 15) / 2)
    assert ece == pytest.approx(ece_by_hand(conf.tolist(), [1, 0, 1, 1, 0, 1]), abs=1e-12)
    for conf_, correct in hand.values():
        got = reliability_bins(np.array(conf_), np.array(correct))[3]
        assert got == pytest.approx(ece_by_hand(conf_, correct), abs=1e-12)


def test_the_figures_are_written_and_the_tradeoff_joins_each_arm_to_its_start(made):
    from PIL import Image

    from lgip.report import build_rows, load_finetune, load_metrics
    from lgip.report.classification_plot import tradeoff_points
    from lgip.report.classification_text import load_classification

    folder, _, out = made
    for key in ("reliability", "er", "tradeoff"):
        png = folder / f"{STEM}__LGIP_classification_{key}.png"
        assert out[f"classification_{key}.png"] == str(png)
        with Image.open(png) as img:
            assert img.width > 500 and img.height > 400, key
    md = (folder / f"{STEM}__LGIP_report.md").read_text(encoding="utf-8")
    html = (folder / f"{STEM}__LGIP_report.html").read_text(encoding="utf-8")
    for key in ("reliability", "tradeoff"):
        png = folder / f"{STEM}__LGIP_classification_{key}.png"
        assert f"]({png.name})" in section(md) and base64.b64encode(png.read_bytes()).decode("ascii") in html
    metrics = {"fliptypes": load_metrics(str(folder / f"{STEM}__LGIP_fliptypes.metrics.json"))}
    rows = build_rows(metrics, "auto", {}, {"fliptypes": str(folder / f"{STEM}__LGIP_fliptypes.metrics.json")})
    fine = load_finetune(metrics, MODELS)
    found = load_classification(str(folder / f"{STEM}__LGIP_classification.metrics.json"))
    pts, lines = tradeoff_points(found, rows, fine)
    assert lines == [[START, MODELS[2], PLAIN], [START, MODELS[4], LGIP]]
    for p in pts:
        assert (p["x"], p["y"]) == (ACC[p["model"]], POS[p["model"]])
        assert [p["x_lo"], p["x_hi"]] == ci(ACC[p["model"]]) and [p["y_lo"], p["y_hi"]] == ci(POS[p["model"]], 0.05)


def test_the_fine_tuning_section_lists_each_arms_wise_point_after_it(made):
    folder, _, _ = made
    md = section((folder / f"{STEM}__LGIP_report.md").read_text(encoding="utf-8"), "Fine-tuning")
    rows = table(md, "Fine-tuned copies")
    assert [r["Model"] for r in rows] == [f"`{m}`" for m in MODELS]
    assert [r["W_SC / W_INV / W_VC"] for r in rows] == ["start", "0 / 0 / 0", "WiSE-FT α 0.5", "1 / 1 / 0"] + [
        "WiSE-FT α 0.5"
    ]
    assert f"- `{MODELS[4]}` (WiSE-FT: (1 − 0.5) `{START}` + 0.5 `{LGIP}`) against its start" in md


def _broken(folder, tmp_path, edit, name=f"{STEM}__LGIP_classification.metrics.json"):
    """report.py on a copy of the files with `edit` applied to one of them: its InputError's text."""
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    path = copy / name
    path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")
    before = sorted(os.listdir(copy))
    with pytest.raises(InputError) as e:
        run_here("report.py", JSONL_PATH=str(copy / f"{STEM}.jsonl"), TOP_K=0, OUTPUT_PREFIX=str(copy / "again_"))
    assert sorted(os.listdir(copy)) == before  # (no output written)
    shutil.rmtree(copy)
    return str(e.value)


def _json_edit(change):
    def edit(text):
        data = json.loads(text)
        change(data)
        return json.dumps(data)

    return edit


@pytest.mark.parametrize(
    "change, words",
    [
        (
            lambda d: d[1]["datasets"]["shapes"].update(acc1_ci95=[0.5, "x"]),
            f"model {PLAIN}: field 'datasets.shapes.acc1_ci95' is the string 'x', not a finite number",
        ),
        (
            lambda d: d[0]["ood"]["shapes_ood"].update(auroc=1.5),
            f"model {START}: field 'ood.shapes_ood.auroc' is 1.5, not a number within [0, 1]",
        ),
        (lambda d: d[2]["datasets"]["cue"].update(role="test"), "field 'datasets.cue.role' is the string 'test'"),
        (lambda d: d[3].update(temperature=0), f"model {LGIP}: field 'temperature' is 0, not a number > 0"),
        (lambda d: d[0]["comparisons"][1].update(diff=None, diff_ci95=[0.2, 0.1]), "'comparisons[1].diff_ci95'"),
        (
            lambda d: d[4]["datasets"]["shapes"].update(nll_t=-1),
            "field 'datasets.shapes.nll_t' is -1, not a number >= 0",
        ),
    ],
)
def test_a_bad_field_is_named_by_its_dotted_path_and_nothing_is_written(made, tmp_path, change, words):
    folder, _, _ = made
    said = _broken(folder, tmp_path, _json_edit(change))
    assert words in said and f"{STEM}__LGIP_classification.metrics.json" in said, said


def test_a_bad_per_image_line_is_named_by_its_file_line_and_field(made, tmp_path):
    folder, _, _ = made
    name = f"{STEM}__LGIP_classification_{LGIP}.jsonl"

    def edit(text):
        lines = text.splitlines(keepends=True)
        lines[2] = json.dumps(dict(json.loads(lines[2]), conf="high")) + "\n"
        return "".join(lines)

    said = _broken(folder, tmp_path, edit, name)
    assert re.search(rf"{re.escape(name)}: line 3: field 'conf' is the string 'high', not a confidence", said), said


def test_without_the_msp_score_the_t_star_curve_is_said_not_drawn_and_no_file_no_section(made, tmp_path):
    folder, _, _ = made
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    path = copy / f"{STEM}__LGIP_classification.metrics.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    for row in data:
        row["ood"]["shapes_ood"]["ood_score"] = "maxlogit"
        row["settings"]["OOD_SCORE"] = "maxlogit"
    path.write_text(json.dumps(data), encoding="utf-8")
    run_here("report.py", JSONL_PATH=str(copy / f"{STEM}.jsonl"), TOP_K=0)
    md = section((copy / f"{STEM}__LGIP_report.md").read_text(encoding="utf-8"))
    assert f"`{START}`: the reliability diagram at T* is not drawn" in md and "(this run's: maxlogit)" in md
    assert "Out-of-distribution detection by `maxlogit`" in md
    os.remove(path)
    os.remove(copy / f"{STEM}__LGIP_classification_er.metrics.json")
    run_here("report.py", JSONL_PATH=str(copy / f"{STEM}.jsonl"), TOP_K=0)
    md = (copy / f"{STEM}__LGIP_report.md").read_text(encoding="utf-8")
    assert "## Fine-tuning" in md and "## Classification" not in md
    assert not (copy / f"{STEM}__LGIP_classification_er.metrics.json").exists()


CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def test_the_section_in_chromium(made, tmp_path):
    """The page from another folder: the section's tables, figures decoded, no console or page error, nothing
    fetched."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if not executable:
        pytest.skip("no Chromium installed (apt-get install -y chromium)")
    folder, _, _ = made
    page_path = tmp_path / "page.html"
    shutil.copy(folder / f"{STEM}__LGIP_report.html", page_path)
    errors, fetched = [], []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=executable, headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: fetched.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
            page.goto(page_path.as_uri(), wait_until="load")
            visible = page.is_visible("#classification")
            models = page.eval_on_selector_all(
                "#classification table[data-set='shapes'] tbody tr", "rows => rows.map(r => r.dataset.model)"
            )
            cells = page.eval_on_selector_all(
                "#classification table[data-set='shapes'] tbody tr:first-child td",
                "tds => tds.map(t => t.textContent.trim())",
            )
            figures = page.evaluate(
                """() => Promise.all([...document.querySelectorAll('#classification figure img')].map(img =>
                img.decode().then(() => [img.closest('figure').id, img.naturalWidth], () => [img.alt, 0])))"""
            )
            page.click("nav a[href='#classification']")
            in_view = page.evaluate("() => document.querySelector('#classification').getBoundingClientRect().top")
        finally:
            browser.close()
    assert visible and models == MODELS and not errors and not fetched, (errors, fetched)
    acc = json.load(open(folder / f"{STEM}__LGIP_classification.metrics.json"))[0]["datasets"]["shapes"]
    assert cells[1].startswith(f"{acc['acc1']:.3f}") and f"[{acc['acc1_ci95'][0]:.3f}" in cells[1]
    assert sorted(f for f, _ in figures) == sorted(f"classification-{k}" for k in ("reliability", "er", "tradeoff"))
    assert all(w > 0 for _, w in figures) and abs(in_view) < 5
