"""F-CLIPScore and misalignment detection (LGIP_SPEC.md section 8, CLIP4DM's own claim): F recounted
from each explain line's words and similarity, the captions' word scores against a hand-written
restatement of the tower, average precision against scikit-learn's (ties, weights, one class)."""

import json
import os
import shutil

import numpy as np
import pytest
import torch

from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE
from lgip.explain import average_precision, detection, fclipscore

sklearn_metrics = pytest.importorskip("sklearn.metrics")


@pytest.fixture(scope="module")
def explained(tmp_path_factory):
    import explain_flips

    folder = tmp_path_factory.mktemp("fclip")
    shutil.copy(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"), folder / "x_with_fliptypes.jsonl")
    m = explain_flips.run(
        JSONL_PATH=str(folder / "x_with_fliptypes.jsonl"),
        IMAGE_ROOT=FIXTURES,
        DEVICE="cpu",
        MODELS=[OPENCLIP_TINY],
        N_FLIPS=None,
        TOP_K=0,
        BOOTSTRAP=200,
        NUM_WORKERS=0,
    )[0]
    return m, [json.loads(x) for x in open(folder / m["explain_file"])]


def test_f_is_recounted_from_each_lines_words_and_similarity(explained):
    m, lines = explained
    assert lines
    for x in lines:
        neg = min(w for w in x["word_scores"] if w is not None)
        assert neg == x["word_scores"][x["blamed"]]  # the blamed word's score
        assert x["fclipscore"] == pytest.approx(neg * (1 - x["sim_flip"] / 2.5), abs=1e-12)
        cap = min(w for w in x["caption_word_scores"] if w is not None)
        assert x["caption_fclipscore"] == pytest.approx(cap * (1 - x["sim_caption"] / 2.5), abs=1e-12)
    assert fclipscore([None, None], 0.3) is None


def test_detection_figures_equal_scikit_learns_on_the_lines(explained):
    m, lines = explained
    captions = {(x["line"], x["caption"]): x for x in lines}  # each distinct record and caption once
    y = [1] * len(captions) + [0] * len(lines)
    s = [x["sim_caption"] for x in captions.values()] + [x["sim_flip"] for x in lines]
    f = [x["caption_fclipscore"] for x in captions.values()] + [x["fclipscore"] for x in lines]
    assert m["detection_num_captions"] == len(captions) and m["detection_num_flips"] == len(lines)
    assert m["detection_ap_clipscore"] == pytest.approx(sklearn_metrics.average_precision_score(y, s), abs=1e-12)
    assert m["detection_ap_fclipscore"] == pytest.approx(sklearn_metrics.average_precision_score(y, f), abs=1e-12)
    assert m["detection_ap_gain"] == pytest.approx(
        m["detection_ap_fclipscore"] - m["detection_ap_clipscore"], abs=1e-12
    )
    for key in ("detection_ap_clipscore", "detection_ap_fclipscore", "detection_ap_gain"):
        lo, hi = m[key + "_ci95"]
        assert lo <= m[key] <= hi, key
    for t, block in m["by_flip_type"].items():
        typed = [x for x in lines if x["flip_type"] == t]
        caps = {(x["line"], x["caption"]): x for x in typed}
        yt = [1] * len(caps) + [0] * len(typed)
        ft = [x["caption_fclipscore"] for x in caps.values()] + [x["fclipscore"] for x in typed]
        assert block["detection_ap_fclipscore"] == pytest.approx(
            sklearn_metrics.average_precision_score(yt, ft), abs=1e-12
        )


def test_the_captions_word_scores_equal_a_plain_restatement(explained):
    """A caption is attributed as its flip is: its word scores against test_attribution's float64
    restatement of the open_clip text tower (dS/dA * A over the last 3 layers), words as align_words puts them."""
    from test_attribution import _restated_openclip
    from lgip.attribution import align_words
    from lgip.images import embed_images
    from lgip.models import load_model

    _, lines = explained
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu")
    seen = {}
    for x in lines[:12]:
        seen.setdefault((x["image_path"], x["caption"]), x)
    for (image_path, caption), x in seen.items():
        v = embed_images(enc, [os.path.join(FIXTURES, image_path)], 1, 0)[0][0]
        al = align_words(enc.tokenize, [caption])[0]
        ids = torch.tensor([al.ids])
        _, scores = _restated_openclip(enc.model, ids, v[None], layers=3)
        tokens = scores[0, al.token_pos].tolist()
        for w, got in enumerate(x["caption_word_scores"]):
            mine = [s for s, tw in zip(tokens, al.token_word) if tw == w]
            assert got == pytest.approx(sum(mine) / len(mine), abs=1e-5) if mine else got is None


def test_average_precision_equals_scikit_learns_with_ties_and_weights():
    rng = np.random.default_rng(7)
    tried = 0
    for _ in range(300):
        n = int(rng.integers(2, 30))
        scores = rng.integers(0, 5, size=n).astype(float)  # many ties
        positive = rng.random(n) < 0.5
        if positive.all() or not positive.any():
            assert average_precision(scores, positive) is None  # a single class: None, not a crash
            continue
        tried += 1
        assert average_precision(scores, positive) == pytest.approx(
            sklearn_metrics.average_precision_score(positive, scores), abs=1e-12
        )
        weights = rng.integers(0, 3, size=n).astype(float)
        if (weights * positive).sum() and (weights * ~positive).sum():
            assert average_precision(scores, positive, weights) == pytest.approx(
                sklearn_metrics.average_precision_score(positive, scores, sample_weight=weights), abs=1e-12
            )
    assert tried > 100
    many = average_precision([0.9, 0.1], [True, False], np.array([[1, 1], [0, 1], [2, 0]]))
    assert many[0] == 1.0 and np.isnan(many[1]) and np.isnan(many[2])  # per weighting; one class: NaN


def test_with_a_template_f_and_detection_take_the_attributed_similarity(tmp_path):
    """CLIP4DM's "A photo depicts " (TEMPLATE): the words and their scores are the caption's, the
    template's tokens never among them; s in F = neg * (1 - s / 2.5) and in detection's CLIPScore is
    the similarity of the text that was attributed (the template's, sim_*_template), while the LGIP
    gap stays the one of the texts as written (sim_caption, sim_flip)."""
    import explain_flips

    shutil.copy(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"), tmp_path / "x_with_fliptypes.jsonl")
    m = explain_flips.run(
        JSONL_PATH=str(tmp_path / "x_with_fliptypes.jsonl"),
        IMAGE_ROOT=FIXTURES,
        DEVICE="cpu",
        MODELS=[OPENCLIP_TINY],
        N_FLIPS=40,
        TOP_K=0,
        BOOTSTRAP=0,
        NUM_WORKERS=0,
        TEMPLATE="A photo depicts ",
    )[0]
    lines = [json.loads(x) for x in open(tmp_path / m["explain_file"])]
    assert lines
    for x in lines:
        assert x["words"] == x["flip"].split() and x["caption_words"] == x["caption"].split()
        assert x["sim_flip_template"] != x["sim_flip"]  # (another text: another similarity)
        assert x["gap"] == pytest.approx(x["sim_caption"] - x["sim_flip"], abs=1e-12)
        neg = min(w for w in x["word_scores"] if w is not None)
        assert x["fclipscore"] == pytest.approx(neg * (1 - x["sim_flip_template"] / 2.5), abs=1e-12)
        cap = min(w for w in x["caption_word_scores"] if w is not None)
        assert x["caption_fclipscore"] == pytest.approx(cap * (1 - x["sim_caption_template"] / 2.5), abs=1e-12)
    captions = {(x["line"], x["caption"]): x for x in lines}
    y = [1] * len(captions) + [0] * len(lines)
    s = [x["sim_caption_template"] for x in captions.values()] + [x["sim_flip_template"] for x in lines]
    assert m["detection_ap_clipscore"] == pytest.approx(sklearn_metrics.average_precision_score(y, s), abs=1e-12)


def test_a_caption_written_in_two_slots_is_one_positive():
    """The same caption text at two indices of one record (SugarCrepe++ items of one image, a COCO
    duplicate) is one (record, caption): attributed once, so one positive; another record's is another."""

    def line(rec, index, caption, s_flip):
        return {
            "line": rec,
            "caption_index": index,
            "caption": caption,
            "sim_caption": 0.3,
            "sim_flip": s_flip,
            "fclipscore": -0.2,
            "caption_fclipscore": -0.05,
        }

    lines = [line(1, 0, "a red bus", 0.2), line(1, 2, "a red bus", 0.35), line(2, 0, "a red bus", 0.1)]
    block = detection(lines, {"BOOTSTRAP": 0, "BOOTSTRAP_SEED": 0})
    assert block["detection_num_captions"] == 2 and block["detection_num_flips"] == 3
    y, s = [1, 1, 0, 0, 0], [0.3, 0.3, 0.2, 0.35, 0.1]
    assert block["detection_ap_clipscore"] == pytest.approx(sklearn_metrics.average_precision_score(y, s), abs=1e-12)


def test_detection_of_a_single_class_gives_none():
    line = {
        "line": 1,
        "caption_index": 0,
        "caption": "a bus",
        "sim_caption": 0.3,
        "sim_flip": 0.2,
        "fclipscore": -0.1,
        "caption_fclipscore": None,
    }
    block = detection([line], {"BOOTSTRAP": 50, "BOOTSTRAP_SEED": 0})
    assert block["detection_ap_clipscore"] is None and block["detection_ap_gain_ci95"] is None
    assert block["detection_num_captions"] == 0 and block["detection_num_flips"] == 1
    assert detection([], {"BOOTSTRAP": 50, "BOOTSTRAP_SEED": 0})["detection_ap_fclipscore"] is None


def test_the_cost_benchmark_runs(tmp_path):
    from conftest import run_script

    proc = run_script(
        "benchmarks/bench_explain.py",
        "--N_IMAGES=3",
        "--N_FLIPS=8",
        "--REPEATS=1",
        "--DEVICE=cpu",
        f"--WORK_DIR={str(tmp_path)!r}",
    )
    assert "texts attributed (one backward pass each)" in proc.stdout and "captions add" in proc.stdout
    assert "misalignment detection (captions vs flips)" in proc.stdout
