"""Classification beside the probe (run_lgip_classification.py, lgip/classification/, LGIP_SPEC.md 16): each figure
against a hand restatement on a small set (the ECE bins and their edges, the temperature split and fit, the FPR@95
tie rule, AUROC's resamples, shape bias, effective robustness, paired comparisons); acc1 equal to CLIP_benchmark's
own code on the same tiny open_clip model and a webdataset root written in CLIP_benchmark's layout, offline; an
ImageFolder run, a cached re-run without weights, an unreadable image counted and listed; a generative tiny model
classifying through the same code; a text-only model left out; the shapes world's sets; every bad input of section
16 ending with exit status 2 before any model loads."""

import hashlib
import io
import json
import math
import os
import shutil
import tarfile

import numpy as np
import pytest

from conftest import OPENCLIP_TINY, image_paths, run_here, run_script

SCRIPT = "run_lgip_classification.py"
CLASSES = ["dog", "red bus", "cat"]


def settings(tmp_path, datasets, models=(OPENCLIP_TINY,), **extra):
    return dict(
        dict(DATASETS=datasets, MODELS=list(models), DEVICE="cpu", NUM_WORKERS=0, OUTPUT_DIR=str(tmp_path / "out")),
        **extra,
    )


def image_folder(root, broken=False):
    """The fixture's 12 images as an ImageFolder of 3 classes (and, broken: a file that is no image)."""
    for i, path in enumerate(image_paths()):
        folder = root / ["dog", "red_bus", "cat"][i % 3]
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / os.path.basename(path))
    if broken:
        (root / "cat" / "broken.jpg").write_bytes(b"not an image")
    return root


def lines(tmp_path, model="tiny_openclip", stem="lgip"):
    with open(tmp_path / "out" / f"{stem}__LGIP_classification_{model}.jsonl", encoding="utf-8") as f:
        return [json.loads(x) for x in f]


# --- the figures, each against its restatement by hand ---


def test_ece_bins_hold_k_in_their_half_open_interval_and_the_edges_go_below():
    from lgip.classification import figures as F

    k = np.array([0.0, 1 / 15, 0.05, 2 / 15, 2 / 15 + 1e-12, 0.5, 14 / 15, 1.0])
    by_hand = [max(0, next(b for b in range(15) if kk <= (b + 1) / 15)) for kk in k]  # (b/15, (b+1)/15], k <= 1/15: 0
    assert F.ece_bins(k).tolist() == by_hand == [0, 0, 0, 1, 2, 7, 13, 14]
    rng = np.random.default_rng(1)
    conf, correct = rng.uniform(0, 1, 200), rng.integers(0, 2, 200)
    conf[:15] = np.arange(15) / 15  # (every edge once)
    total = 0.0
    for b in range(15):
        inside = [i for i in range(200) if (b / 15 < conf[i] <= (b + 1) / 15) or (b == 0 and conf[i] <= 1 / 15)]
        if inside:
            total += len(inside) / 200 * abs(np.mean(correct[inside]) - np.mean(conf[inside]))
    assert F.ece(conf, correct) == pytest.approx(total, abs=1e-12)
    w = rng.integers(0, 3, 200).astype(float)  # (a resample's multiplicities: the images repeated)
    rep = np.repeat(np.arange(200), w.astype(int))
    assert F.ece(conf, correct, w) == pytest.approx(F.ece(conf[rep], correct[rep]), abs=1e-12)
    assert F.ece_rows(w[None] * 200 / w.sum(), conf, correct)[0] == pytest.approx(F.ece(conf, correct, w), abs=1e-12)


def test_set_figures_restated_by_hand_with_their_intervals():
    from lgip.classification import figures as F

    rng = np.random.default_rng(0)
    z = rng.normal(0, 2, (40, 6))
    z[0] = [1, 3, 3, 0, 0, 0]  # a tie: argmax takes the lower index, top-5 too
    y = rng.integers(0, 6, 40)
    y[0] = 2
    test = np.arange(1, 40, 2)
    got = F.set_figures(z, y, 1.7, test=test, resamples=200, seed=5)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    pred = [int(np.argmax(r)) for r in z]
    assert pred[0] == 1
    correct = np.array([pred[i] == y[i] for i in range(40)], dtype=float)
    top5 = [sorted(range(6), key=lambda c: (-z[i, c], c))[:5] for i in range(40)]
    recalls = [np.mean([pred[i] == c for i in range(40) if y[i] == c]) for c in range(6) if (y == c).any()]
    pt = np.exp(z / 1.7 - (z / 1.7).max(1, keepdims=True))
    pt /= pt.sum(1, keepdims=True)
    nll_t = np.array([-math.log(pt[i, y[i]]) for i in test])
    assert got["acc1"] == pytest.approx(correct.mean())
    assert got["acc5"] == pytest.approx(np.mean([y[i] in top5[i] for i in range(40)]))
    assert got["mean_per_class_recall"] == pytest.approx(np.mean(recalls))
    assert got["nll"] == pytest.approx(np.mean([-math.log(p[i, y[i]]) for i in range(40)]))
    assert got["conf_mean"] == pytest.approx(p.max(1).mean()) and got["conf_mean_t"] == pytest.approx(
        pt[test].max(1).mean()
    )
    assert got["nll_t"] == pytest.approx(nll_t.mean())
    assert got["ece_t"] == pytest.approx(F.ece(pt[test].max(1), correct[test]))
    w = np.random.default_rng(5).multinomial(40, np.full(40, 1 / 40), size=200)  # (section 9's W, one call)
    assert got["acc1_ci95"] == pytest.approx(np.quantile(w @ correct / 40, [0.025, 0.975]).tolist())
    ece_rows = [F.ece(p.max(1), correct, row) for row in w]
    assert got["ece_ci95"] == pytest.approx(np.quantile(ece_rows, [0.025, 0.975]).tolist())
    w_t = np.random.default_rng(5).multinomial(20, np.full(20, 1 / 20), size=200)  # (a fresh W over the test half)
    assert got["nll_t_ci95"] == pytest.approx(np.quantile(w_t @ nll_t / 20, [0.025, 0.975]).tolist())
    assert F.set_figures(z[:, :4], y % 4, 1.0)["acc5"] is None and F.set_figures(z, y, 1.0)["acc1_ci95"] is None


def test_the_temperature_split_and_its_fit():
    from scipy.optimize import minimize_scalar
    from scipy.special import logsumexp

    from lgip.classification import figures as F

    keys = ["b.jpg", "a/x.jpg", "c.png", "7", "10", "d"]
    cal, test = F.split_halves(keys, 3)
    ranked = sorted(range(6), key=lambda i: (hashlib.sha256(f"3:{keys[i]}".encode("utf-8")).hexdigest(), keys[i]))
    assert cal.tolist() == sorted(ranked[:3]) and test.tolist() == sorted(ranked[3:])
    assert F.split_halves(keys[:5], 3)[0].size == 2  # floor(n / 2) calibrate
    rng = np.random.default_rng(2)
    y = rng.integers(0, 4, 60)
    z = rng.normal(0, 1, (60, 4))
    z[np.arange(60), y] += 1.5
    z *= 6  # (informative but overconfident: T* inside the bounds, above 1)

    def nll(u):  # (by hand: -mean over images of z_y / T - log sum_c exp(z_c / T))
        zt = z / math.exp(u)
        return -np.mean(zt[np.arange(60), y] - logsumexp(zt, axis=1))

    want = minimize_scalar(nll, bounds=(math.log(0.01), math.log(100)), method="bounded", options={"xatol": 1e-6})
    t = F.fit_temperature(z, y)
    assert t == pytest.approx(math.exp(want.x), rel=1e-6) and t > 1  # (overconfident scores: cooled down)
    grid = np.linspace(math.log(0.01), math.log(100), 4001)
    assert F.mean_nll(z, y, t) <= min(nll(u) for u in grid) + 1e-9


def test_fpr95_counts_ties_at_the_threshold_and_auroc_resamples_are_sklearns():
    from sklearn.metrics import average_precision_score, roc_auc_score

    from lgip.classification import figures as F

    s_in = np.array(
        [0.9, 0.8, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.4, 0.3, 0.3, 0.2, 0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1]
    )
    s_out = np.array([0.05, 0.1, 0.1, 0.2, 0.95, 0.0])
    # m = ceil(0.95 * 20) = 19: the 19th largest of I is 0.1; O's scores >= 0.1 (ties included): 0.1, 0.1, 0.2, 0.95
    assert F.fpr95(s_in, s_out) == pytest.approx(4 / 6)
    assert F.fpr95(s_in[:10], s_out) == pytest.approx(1 / 6)  # m = ceil(9.5) = 10: tau = 0.4, only 0.95 above
    assert F.fpr95(s_in[:10], np.r_[s_out, 0.4]) == pytest.approx(2 / 7)  # (a tie with tau counts)
    got = F.ood_figures(s_in, s_out, resamples=100, seed=7)
    labels = [1] * 20 + [0] * 6
    assert got["auroc"] == pytest.approx(roc_auc_score(labels, np.r_[s_in, s_out]))
    assert got["aupr_in"] == pytest.approx(average_precision_score(labels, np.r_[s_in, s_out]))
    w_i = np.random.default_rng([7, 0]).multinomial(20, np.full(20, 1 / 20), size=100)
    w_o = np.random.default_rng([7, 1]).multinomial(6, np.full(6, 1 / 6), size=100)
    au = [roc_auc_score(labels, np.r_[s_in, s_out], sample_weight=np.r_[a, b]) for a, b in zip(w_i, w_o)]
    fp = [F.fpr95(np.repeat(s_in, a), np.repeat(s_out, b)) for a, b in zip(w_i, w_o)]
    assert got["auroc_ci95"] == pytest.approx(np.quantile(au, [0.025, 0.975]).tolist())
    assert got["fpr95_ci95"] == pytest.approx(np.quantile(fp, [0.025, 0.975]).tolist())
    z = np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    cos = np.array([[0.1, 0.3, 0.2], [0.2, 0.2, 0.2]])
    assert F.ood_score("maxlogit", z).tolist() == [2.0, 0.0]
    assert F.ood_score("msp", z, 2.0)[1] == pytest.approx(1 / 3)
    assert F.ood_score("mcm", z, 2.0, cos)[0] == pytest.approx(math.exp(0.3) / sum(math.exp(c) for c in cos[0]))


def test_shape_bias_with_and_without_a_category_map():
    from lgip.classification import figures as F

    pred, shape, texture = [0, 1, 2, 2, 3], [0, 1, 1, 0, 0], [1, 2, 2, 1, 3]
    assert F.shape_bias(pred, shape, texture) == {"shape_bias": 2 / 4, "shape_match": 2 / 5, "texture_match": 2 / 5}
    assert F.shape_bias([5], [0], [1])["shape_bias"] is None
    p = np.array([[0.1, 0.3, 0.3, 0.3], [0.6, 0.2, 0.1, 0.1]])
    cats = [("a", [0, 1]), ("b", [2, 3]), ("c", [1])]  # means: row 0 (0.2, 0.3, 0.3) -> b (the first); row 1 a
    assert F.category_predictions(p, cats).tolist() == [1, 0]


def test_effective_robustness_restated_by_hand():
    from scipy.stats import norm

    from lgip.classification.figures import effective_robustness

    accs = {"m1": (0.9, 0.6), "m2": (0.7, 0.4), "m3": (1.0, 0.3), "m4": (0.5, 0.45)}
    rows = [
        {
            "model_tag": m,
            "datasets": {"in": {"role": "id", "n": 200, "acc1": a}, "sh": {"role": "shift", "n": 50, "acc1": b}},
        }
        for m, (a, b) in accs.items()
    ]
    got = effective_robustness(rows)["sh"]
    x = norm.ppf([min(max(a, 0.5 / 200), 1 - 0.5 / 200) for a, _ in accs.values()])
    y = norm.ppf([min(max(b, 0.5 / 50), 1 - 0.5 / 50) for _, b in accs.values()])
    slope, intercept = np.polyfit(x, y, 1)
    assert got["slope"] == pytest.approx(slope) and got["intercept"] == pytest.approx(intercept)
    assert got["models"] == list(accs)
    for (m, (_, b)), xi in zip(accs.items(), x):
        assert got["effective_robustness"][m] == pytest.approx(b - norm.cdf(slope * xi + intercept))
    assert effective_robustness(rows[:2]) == {"sh": None}


def test_paired_comparisons_use_the_same_rows_for_both_models():
    from lgip.classification import figures as F

    rng = np.random.default_rng(3)
    ca, cb = rng.integers(0, 2, 30).astype(float), rng.integers(0, 2, 30).astype(float)
    diff, ci = F.paired(ca, cb, "acc1", 300, 4)
    w = np.random.default_rng(4).multinomial(30, np.full(30, 1 / 30), size=300)
    assert diff == pytest.approx(ca.mean() - cb.mean())
    assert ci == pytest.approx(np.quantile(w @ (ca - cb) / 30, [0.025, 0.975]).tolist())
    ka, kb = rng.uniform(0, 1, 30), rng.uniform(0, 1, 30)
    diff, ci = F.paired((ka, ca), (kb, cb), "ece_t", 300, 4)
    rows = [F.ece(ka, ca, r) - F.ece(kb, cb, r) for r in w]
    assert diff == pytest.approx(F.ece(ka, ca) - F.ece(kb, cb))
    assert ci == pytest.approx(np.quantile(rows, [0.025, 0.975]).tolist())


# --- the step, end to end ---


def write_wds(root, classes, templates):
    """A webdataset root in CLIP_benchmark's layout: test/nshards.txt, test/0.tar (a .jpg and a .cls per sample),
    classnames.txt, zeroshot_classification_templates.txt."""
    (root / "test").mkdir(parents=True)
    (root / "test" / "nshards.txt").write_text("1\n")
    (root / "classnames.txt").write_text("".join(c + "\n" for c in classes))
    (root / "zeroshot_classification_templates.txt").write_text("".join(t + "\n" for t in templates))
    with tarfile.open(root / "test" / "0.tar", "w") as tar:
        for i, path in enumerate(image_paths()):
            for ext, data in (("jpg", open(path, "rb").read()), ("cls", str(i % len(classes)).encode())):
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return root


def clip_benchmark_logits(root, classes, templates):
    """CLIP_benchmark's own zero-shot classification of the webdataset root: its builder, zero_shot_classifier and
    run_classification (fp32: amp off) on the same tiny open_clip model."""
    import open_clip
    import torch
    from clip_benchmark.datasets.builder import build_dataset
    from clip_benchmark.metrics.zeroshot_classification import run_classification, zero_shot_classifier

    name = OPENCLIP_TINY["model_name"]
    model, _, preprocess = open_clip.create_model_and_transforms(name)
    model.eval()
    ds = build_dataset("wds/tiny", root=str(root), split="test", download=False, transform=preprocess)
    loader = torch.utils.data.DataLoader(ds.batched(4), batch_size=None)
    classifier = zero_shot_classifier(model, open_clip.get_tokenizer(name), classes, templates, "cpu", amp=False)
    logits, target = run_classification(model, classifier, loader, "cpu", amp=False)
    return logits.numpy(), target.numpy(), float(model.logit_scale.detach().exp())


def test_a_webdataset_root_classified_as_clip_benchmark_classifies_it(tmp_path):
    templates = ["a photo of a {c}.", "a drawing of the {c}."]
    root = write_wds(tmp_path / "wds_tiny", CLASSES, templates)
    datasets = [{"name": "tiny", "source": "clip_benchmark", "role": "id", "dataset": "wds/tiny", "root": str(root)}]
    rows, out, _ = run_here(SCRIPT, **settings(tmp_path, datasets, BOOTSTRAP=20))
    logits, target, scale = clip_benchmark_logits(root, CLASSES, templates)
    row = rows[0]
    got = lines(tmp_path)
    assert [g["label"] for g in got] == target.tolist()
    assert [g["pred"] for g in got] == logits.argmax(1).tolist()
    assert row["datasets"]["tiny"]["acc1"] == float((logits.argmax(1) == target).mean())
    assert row["logit_scale"] == pytest.approx(scale)
    p = np.exp(logits * scale / 100)  # (CLIP_benchmark's logits are 100 cos; ours s cos)
    p /= p.sum(1, keepdims=True)
    assert [g["conf"] for g in got] == pytest.approx(p.max(1).tolist(), abs=1e-4)
    assert got[0]["image"] == "test/0.tar:000000" and row["settings"]["templates"]["tiny"] == templates


def test_an_image_folder_run_then_a_cached_rerun_without_weights_and_an_unreadable_image_listed(tmp_path):
    root = image_folder(tmp_path / "pets", broken=True)
    datasets = [
        {"name": "pets", "source": "folder", "role": "id", "root": str(root), "templates": ["a photo of a {c}."]},
        {"name": "pets_ood", "source": "folder", "role": "ood", "root": str(root)},
    ]
    first, _, err = run_here(SCRIPT, **settings(tmp_path, datasets, BOOTSTRAP=0, OOD_SCORE="mcm"))
    block = first[0]["datasets"]["pets"]
    assert block["n"] == 12 and block["n_unreadable"] == 1 and block["unreadable"] == ["cat/broken.jpg"]
    assert "skipping unreadable image cat/broken.jpg" in err
    assert [x["image"] for x in lines(tmp_path)].count("cat/broken.jpg") == 0
    assert first[0]["ood"]["pets_ood"]["ood_score"] == "mcm" and first[0]["ood"]["pets_ood"]["auroc"] == pytest.approx(
        0.5
    )
    (root / "cat" / "broken.jpg").unlink()  # (a file that cannot be read has no cached embedding: all readable now)
    run_here(SCRIPT, **settings(tmp_path, datasets, BOOTSTRAP=0))
    again, out, _ = run_here(SCRIPT, **settings(tmp_path, datasets, BOOTSTRAP=0))
    assert again[0]["run"]["model"]["weights_loaded"] is False and "weights were not loaded" in out
    assert again[0]["datasets"]["pets"]["acc1"] == first[0]["datasets"]["pets"]["acc1"]
    assert again[0]["logit_scale"] == first[0]["logit_scale"] and block["num_classes"] == 3


def test_a_generative_model_classifies_through_the_same_code_and_a_text_only_one_is_left_out(tmp_path):
    from PIL import Image

    from lgip.models import load_model
    from tiny_vlm import tiny_llava

    spec = {"name": "llava", "type": "generative", "model_id": str(tiny_llava(tmp_path / "llava"))}
    gpt = {"name": "gpt2_tiny", "type": "causal_lm", "model_id": str(tmp_path / "gpt2")}
    root = image_folder(tmp_path / "pets")
    templates = ["a photo of a {c}.", "a {c}."]
    datasets = [{"name": "pets", "source": "folder", "role": "id", "root": str(root)}]
    rows, out, _ = run_here(
        SCRIPT, **settings(tmp_path, datasets, [spec, gpt], GENERATIVE_TEMPLATES=templates, BOOTSTRAP=0)
    )
    assert "model 'gpt2_tiny' (type 'causal_lm') is left out: it reads no image" in out
    assert [r["model_tag"] for r in rows] == ["llava"] and rows[0]["logit_scale"] is None
    model = load_model(spec, "corrected", "cpu", "fp32")
    assert len(lines(tmp_path, "llava")) == 12
    for line in lines(tmp_path, "llava")[:3]:
        img = Image.open(root / line["image"]).convert("RGB")
        z = [np.mean(model.score(img, [t.format(c=c) for t in templates])) for c in CLASSES]
        p = np.exp(np.array(z) - max(z))
        assert line["top5"][0][1] == pytest.approx((p / p.sum()).max(), abs=1e-3)
    none, out, _ = run_here(SCRIPT, **settings(tmp_path, datasets, [gpt]))
    assert none is None and "every model of MODELS is left out" in out


def test_the_shapes_worlds_sets_labelled_by_object_word_and_its_ood_glyphs(tmp_path):
    from lgip import shapes
    from lgip.method import OBJECTS

    world = tmp_path / "shapes"
    shapes.make_world(world, n_pretrain=2, n_main=14, seed=3)
    (world / "lgip_shapes__shapes.meta.json").write_text(json.dumps({"config": {"SEED": 3}}))  # (make_shapes_jsonl's)
    spec = shapes.start_model(world / "start_model", 3)
    datasets = [
        {"name": "shapes_ood", "source": "shapes", "role": "ood", "root": str(world), "count": 6},
        {"name": "shapes", "source": "shapes", "role": "id", "root": str(world)},
    ]
    rows, _, _ = run_here(SCRIPT, **settings(tmp_path, datasets, [spec], BOOTSTRAP=0))
    records = [json.loads(x) for x in open(world / "lgip_shapes.jsonl", encoding="utf-8")]
    got = [x for x in lines(tmp_path, spec["name"]) if x["dataset"] == "shapes"]
    assert [x["label"] for x in got] == [OBJECTS.index(r["shapes"]["object"]) for r in records]
    ood = [x for x in lines(tmp_path, spec["name"]) if x["dataset"] == "shapes_ood"]
    assert [x["image"] for x in ood] == [f"images/ood_{i}.png" for i in range(6)] and ood[0]["label"] is None
    stamp = os.stat(world / "images" / "ood_0.png").st_mtime_ns
    assert shapes.make_ood(world, 6, 3) and os.stat(world / "images" / "ood_0.png").st_mtime_ns == stamp
    assert rows[0]["datasets"]["shapes"]["num_classes"] == len(OBJECTS) and rows[0]["ood"]["shapes_ood"]["n_ood"] == 6
    assert all(shapes.ood_scene(np.random.default_rng([3, 3, i]))["glyph"] in shapes.OOD_GLYPHS for i in range(6))


def test_two_models_compared_on_a_shift_and_a_cue_conflict_set(tmp_path):
    root = image_folder(tmp_path / "pets")
    cue = tmp_path / "cue.jsonl"
    rels = sorted(os.path.relpath(p, tmp_path) for p in root.rglob("*.jpg"))
    cue.write_text(
        "".join(
            json.dumps({"image_path": r, "label": i % 3, "shape_label": i % 3, "texture_label": (i + i % 2) % 3}) + "\n"
            for i, r in enumerate(rels)
        )
    )
    datasets = [
        {"name": "pets", "source": "folder", "role": "id", "root": str(root), "templates": ["a {c}."]},
        {"name": "pets2", "source": "folder", "role": "shift", "root": str(root)},
        {"name": "cue", "source": "jsonl", "role": "cue_conflict", "path": str(cue), "classnames": CLASSES},
    ]
    other = dict(OPENCLIP_TINY, name="tiny_again")
    rows, _, _ = run_here(SCRIPT, **settings(tmp_path, datasets, [OPENCLIP_TINY, other], BOOTSTRAP=30))
    a, b = rows
    figures = {(c["dataset"], c["figure"]) for c in a["comparisons"]}
    assert figures == {(d, f) for d in ("pets", "pets2", "cue") for f in ("acc1", "ece_t")} and b["comparisons"] == []
    assert all(c["diff"] == 0 and c["diff_ci95"] == [0, 0] for c in a["comparisons"])  # (the same model twice)
    assert a["cue_conflict"]["cue"]["dropped"] == 6 and a["cue_conflict"]["cue"]["n"] == 6
    assert a["datasets"]["cue"]["n"] == 6 and "n_test" not in a["datasets"]["pets2"]
    assert len([x for x in lines(tmp_path) if x["dataset"] == "cue"]) == 6


BAD = [
    ([{"name": "a", "source": "ftp", "role": "id"}], "DATASETS[0] ('a'): field \"source\": unknown source 'ftp'"),
    ([{"name": "a", "source": "folder", "role": "train", "root": "."}], "field \"role\": unknown role 'train'"),
    ("two_ids", "two sets have role 'id'"),
    ("ood_alone", "the 'ood' set 'o' needs an 'id' set"),
    ("classnames", 'field "classnames": 2 names for the 3 class folders'),
    ("template", "field \"templates\"[0]: template 'a photo' has no {c}"),
    ("no_label", 'field "label" missing: give the class index'),
    ("label_range", 'x.jsonl:1: field "label": 7 out of range: the dataset has 3 classes'),
    (
        [{"name": "a", "source": "clip_benchmark", "role": "id", "dataset": "imagenet2", "root": "."}],
        "CLIP_benchmark does not know 'imagenet2' (did you mean",
    ),
    ("empty", "no image: the dataset is empty"),
    (
        [{"name": "a", "source": "clip_benchmark", "role": "id", "dataset": "imagenet1k", "root": "/no/such"}],
        "field \"root\": '/no/such' does not exist; imagenet1k needs torchvision's ImageNet",
    ),
    ("imagenetv2", "lacks ImageNetV2-matched-frequency/ with its 10,000 images"),
    (
        [{"name": "a", "source": "clip_benchmark", "role": "id", "dataset": "voc2007_multilabel", "root": "."}],
        "is no single-label classification set (a multi-label set)",
    ),
    (
        [{"name": "a", "source": "clip_benchmark", "role": "id", "dataset": "mscoco_captions", "root": "."}],
        "CLIP_benchmark's task for it is zeroshot_retrieval",
    ),
    (
        [{"name": "o", "source": "folder", "role": "ood", "root": ".", "classnames": ["x"]}],
        'field "classnames": an "ood" set is scored with the id set\'s classes',
    ),
]


def bad_datasets(case, tmp_path):
    if not isinstance(case, str):
        return case
    root = image_folder(tmp_path / "pets")
    ok = {"name": "i", "source": "folder", "role": "id", "root": str(root)}
    jsonl = tmp_path / "x.jsonl"
    if case == "two_ids":
        return [ok, dict(ok, name="j")]
    if case == "ood_alone":
        return [{"name": "o", "source": "folder", "role": "ood", "root": str(root)}]
    if case == "classnames":
        return [dict(ok, classnames=["a", "b"])]
    if case == "template":
        return [dict(ok, templates=["a photo"])]
    if case in ("no_label", "label_range"):
        jsonl.write_text(
            json.dumps({"image_path": "pets/dog/000000000001.jpg", "label": 7})
            + "\n"
            + (json.dumps({"image_path": "pets/cat/000000000003.jpg"}) + "\n" if case == "no_label" else "")
        )
        return [{"name": "j", "source": "jsonl", "role": "id", "path": str(jsonl), "classnames": CLASSES}]
    if case == "empty":
        (tmp_path / "empty" / "a").mkdir(parents=True)
        return [dict(ok, root=str(tmp_path / "empty"))]
    (tmp_path / "v2" / "ImageNetV2-matched-frequency" / "0").mkdir(parents=True)
    return [
        {"name": "v2", "source": "clip_benchmark", "role": "id", "dataset": "imagenetv2", "root": str(tmp_path / "v2")}
    ]


@pytest.mark.parametrize("case,said", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_ends_with_exit_status_2_in_one_line_before_any_model_loads(case, said, tmp_path, monkeypatch):
    import lgip.classification.run as loop

    def no_model(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loop, "ModelRun", no_model)
    datasets = bad_datasets(case, tmp_path)
    proc = run_script(SCRIPT, f"--DATASETS={datasets!r}", f"--MODELS={[OPENCLIP_TINY]!r}", "--DEVICE=cpu", check=False)
    assert proc.returncode == 2, proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and said in error[0], proc.stderr
    if case == "no_label":
        assert f"{tmp_path / 'x.jsonl'}:2" in error[0]


def test_mcm_is_refused_for_a_joint_model_before_any_work():
    proc = run_script(
        SCRIPT, "--OOD_SCORE=mcm", "--MODELS=[{'name': 'm', 'type': 'itm', 'model_id': '/x'}]", check=False
    )
    assert proc.returncode == 2 and 'OOD_SCORE "mcm" is a softmax over a dual encoder\'s cosines' in proc.stderr


def test_a_dataset_of_no_files_is_read_by_index_and_keyed_by_its_pixels():
    from PIL import Image

    from lgip.cache import image_cache_key
    from lgip.classification.benchmark import indexed_items
    from lgip.images import _ImageFiles

    ds = [(Image.new("L", (9, 9), v), v % 2) for v in (0, 1, 1)]  # (grey: made RGB, as a file's image is)
    items, shown, keys, labels = indexed_items(ds, "arrays", "/r", "test")
    assert labels == [0, 1, 1] and keys == ["0", "1", "2"] and shown == [None] * 3
    assert image_cache_key(items[1]) == image_cache_key(items[1]) != image_cache_key(items[0])
    assert image_cache_key(items[1]).split("|")[-1] == image_cache_key(items[2]).split("|")[-1]  # (equal pixels)
    got = _ImageFiles(items, lambda img: img)[2]
    assert got[2] is None and got[1].mode == "RGB" and got[1].getpixel((0, 0)) == (1, 1, 1)
