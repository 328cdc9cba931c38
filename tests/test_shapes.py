"""The shapes world (lgip/shapes.py, make_shapes_jsonl.py) and `run_all.py --DATA=shapes` (issue 51): the world's
captions carry every flip type, each object word is its own glyph, the world is a function of its seed, and the
whole demo (pretraining, two arms, the held-out probe, the report) shows the LGIP arm repairing what the plain
arm does not, on images neither arm saw."""

import json
import os
import re

import numpy as np
import pytest

from conftest import run_here, run_script
from lgip import shapes
from lgip.method import COLORS, NUMBER_WORDS, OBJECTS


def test_each_object_word_is_its_own_glyph_and_each_scene_its_picture():
    from PIL import Image, ImageDraw

    masks = {}
    for obj, kind in shapes.GLYPHS.items():
        img = Image.new("L", (16, 16))
        shapes.draw_glyph(ImageDraw.Draw(img), kind, 1, 1, 14, 255)
        masks[obj] = np.asarray(img) > 127
    assert set(masks) == set(OBJECTS) and len(set(shapes.GLYPHS.values())) == len(OBJECTS)
    for a in OBJECTS:
        for b in OBJECTS:
            if a < b:
                assert (masks[a] != masks[b]).sum() >= 8, (a, b)  # (glyphs a tiny ViT can tell apart)
    assert set(shapes.RGB) == set(COLORS) and len(set(shapes.RGB.values())) == len(COLORS)
    scene = {"color": "red", "number": "three", "object": "dog", "size": "large", "background": "plain"}
    img = np.asarray(shapes.draw_image(scene, np.random.default_rng(0)))
    reds = (img[..., 0] > 150) & (img[..., 1] < 90)
    from scipy import ndimage

    assert ndimage.label(reds)[1] == 3  # (three discs, apart)


def test_the_world_is_its_seeds_and_every_caption_is_flipped_by_each_type(tmp_path):
    a = run_here("make_shapes_jsonl.py", OUTPUT_DIR=str(tmp_path / "a"), N_PRETRAIN=4, N_MAIN=12, SEED=3)[0]
    b = run_here("make_shapes_jsonl.py", OUTPUT_DIR=str(tmp_path / "b"), N_PRETRAIN=4, N_MAIN=12, SEED=3)[0]
    assert open(a, "rb").read() == open(b, "rb").read()
    for name in sorted(os.listdir(tmp_path / "a" / "images")):
        assert (
            open(tmp_path / "a" / "images" / name, "rb").read() == open(tmp_path / "b" / "images" / name, "rb").read()
        )
    records = [json.loads(x) for x in open(a, encoding="utf-8")]
    assert len(records) == 12 and all(r["synthetic_image"] for r in records)
    for r in records:
        scene = r["shapes"]
        assert scene["number"] in NUMBER_WORDS and len(r["orig_captions"]) == 5
        for c in r["orig_captions"]:
            for word in (scene["color"], scene["number"], scene["object"]):
                assert re.search(rf"\b{word}\b", c), (word, c)
    flipped = run_here("make_perturb_with_fliptypes.py", INPUT_JSONL=a)[0]
    for r in (json.loads(x) for x in open(flipped, encoding="utf-8")):
        for t in ("color", "number", "object"):
            assert all(r[f"diff_caps_{t}"][str(i)] for i in range(5)), t
    pre = [json.loads(x) for x in open(tmp_path / "a" / "lgip_shapes_pretrain.jsonl", encoding="utf-8")]
    assert len(pre) == 4 and not {r["image_path"] for r in pre} & {r["image_path"] for r in records}
    meta = json.load(open(tmp_path / "a" / "lgip_shapes__shapes.meta.json"))
    assert meta["config"]["SEED"] == 3 and meta["start"]["name"] == "shapes_random_init"
    assert os.path.isfile(meta["start"]["model_name"][len("local-dir:") :] + "/open_clip_pytorch_model.bin")
    with pytest.raises(Exception, match="N_MAIN"):
        run_here("make_shapes_jsonl.py", OUTPUT_DIR=str(tmp_path / "c"), N_MAIN=1)


def _comparison(rows, a, b, figure):
    (c,) = [r for r in rows if (r["a"], r["b"], r["figure"], r["flip_type"]) == (a, b, figure, None)]
    return c["diff"], c["diff_ci95"]


def test_the_shapes_demo_repairs_what_the_plain_arm_does_not_on_held_out_images(tmp_path):
    """The demo as shipped (run_all.py --DATA=shapes): the LGIP arm's held-out invariance error clearly below the
    plain arm's, its positive rate above with the paired interval above 0, recall@1 within 0.05 both ways."""
    folder = tmp_path / "shapes"
    args = ["--DATA=shapes", f"--SHAPES_DIR={folder}", "--DEVICE=cpu"]
    out = run_script("run_all.py", *args).stdout
    assert "ran 12 of 12 steps" in out
    held = folder / "lgip_shapes_with_fliptypes__ft_heldout"
    rows = {r["model_tag"]: r for r in json.load(open(f"{held}__LGIP_fliptypes.metrics.json"))}
    start, plain, lgip = "shapes_pretrained", "shapes_pretrained__ft_plain", "shapes_pretrained__ft_lgip"
    assert list(rows) == [start, plain, f"{plain}__wise0.5", lgip, f"{lgip}__wise0.5"]  # (FINETUNE's WiSE-FT points)
    assert rows[lgip]["invariance_error_mean"] < 0.5 * rows[plain]["invariance_error_mean"]
    comparisons = json.load(open(f"{held}__LGIP_comparisons.metrics.json"))
    diff, ci = _comparison(comparisons, plain, lgip, "invariance_error_mean")  # (a - b: plain's minus lgip's)
    assert diff > 0 and ci[0] > 0
    diff, ci = _comparison(comparisons, plain, lgip, "sensitivity_pos_rate")
    assert diff < 0 and ci[1] < 0, (diff, ci)  # (lgip's positive rate above plain's, the interval above 0)
    retrieval = {r["model_tag"]: r for r in json.load(open(f"{held}__LGIP_retrieval.metrics.json"))}
    for key in ("i2t_recall@1", "t2i_recall@1"):
        assert abs(retrieval[lgip][key] - retrieval[plain][key]) <= 0.05, key
    report = open(f"{held}__LGIP_report.md", encoding="utf-8").read()
    section = report[report.index("## Fine-tuning") :]
    assert f"`{plain}`" in section and f"`{lgip}`" in section and "LGIP_finetune.png" in section
    assert re.search(rf"\| `{lgip}__wise0\.5` +\| +WiSE-FT α 0\.5 \|", section)
    # (issue 63: the start, the arms and their WiSE-FT points classified, what each repair cost beside what it gained)
    classified = {r["model_tag"]: r for r in json.load(open(f"{held}__LGIP_classification.metrics.json"))}
    assert list(classified) == list(rows)
    shapes = classified[start]["datasets"]["shapes"]
    assert shapes["acc1"] > 1 / 11 and shapes["acc1_ci95"][0] <= shapes["acc1"] <= shapes["acc1_ci95"][1]
    assert classified[start]["ood"]["shapes_ood"]["auroc"] is not None
    classification = report[report.index("## Classification") :]
    assert all(f"`{m}`" in classification for m in rows) and "LGIP_classification_tradeoff.png" in report
    again = run_script("run_all.py", *args).stdout
    assert "ran 0 of 12 steps (12 up to date)" in again


def test_a_finetune_model_of_ones_own_replaces_the_pretrained_one_in_the_shapes_plan(tmp_path):
    from conftest import OPENCLIP_TINY

    ft = {"model": OPENCLIP_TINY, "STEPS": 2}
    args = ["--DATA=shapes", f"--SHAPES_DIR={tmp_path / 'shapes'}", "--DRY_RUN=True", f"--FINETUNE={ft!r}"]
    out = run_script("run_all.py", *args).stdout
    assert "tiny_openclip__ft_lgip" in out and "shapes_pretrained__ft_lgip" not in out and "--STEPS=2" in out
