"""WiSE-FT (LGIP_SPEC.md 16, FINETUNE["wise"]; lgip/wise.py, wise_ft.py): every floating-point tensor of the state
dict (1 - alpha) start + alpha arm and the others the arm's, by hand; alpha 0 gives the start's embeddings and
figures and 1 the arm's (the tiny open_clip fixture and the shapes world's tiny CLIP), the point saved as an arm is
(a MODELS spec of the start's type, loaded as the evaluations load it); bad settings stopped before any model."""

import json
import os
import shutil

import numpy as np
import pytest
import torch

from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, encode_texts, eval_settings, run_here
from lgip import wise
from lgip.errors import ConfigError, ModelError


def test_floats_are_mixed_by_hand_and_every_other_tensor_is_the_arms():
    g = torch.Generator().manual_seed(0)
    start = {"w": torch.randn(3, 4, generator=g), "h": torch.randn(5, generator=g).half(), "ids": torch.arange(4)}
    arm = {"w": torch.randn(3, 4, generator=g), "h": torch.randn(5, generator=g).half(), "ids": torch.arange(4) + 7}
    mixed, counts = wise.interpolate(start, arm, 0.25)
    assert counts == {"interpolated": 2, "from_arm": 1}
    assert torch.allclose(mixed["w"], 0.75 * start["w"] + 0.25 * arm["w"], atol=1e-7)
    want = (0.75 * start["h"].double() + 0.25 * arm["h"].double()).half()
    assert mixed["h"].dtype == torch.float16 and torch.equal(mixed["h"], want)
    assert torch.equal(mixed["ids"], arm["ids"])  # (an integer buffer: the arm's, whatever alpha)
    for alpha, same in ((0.0, start), (1.0, arm)):
        got, _ = wise.interpolate(start, arm, alpha)
        assert all(torch.equal(got[k], same[k]) for k in ("w", "h")), alpha
    with pytest.raises(ModelError, match="not one architecture.*'extra'"):
        wise.interpolate(start, dict(arm, extra=torch.zeros(1)), 0.5)
    with pytest.raises(ModelError, match=r"w is \(3, 4\) and \(4, 3\)"):
        wise.interpolate(start, dict(arm, w=torch.zeros(4, 3)), 0.5)
    assert wise.wise_name("m__ft_lgip", 0.5) == "m__ft_lgip__wise0.5" and wise.wise_name("a", 1) == "a__wise1"
    assert wise.check_alphas([0.5, 0.25, 0.5]) == [0.25, 0.5] and wise.check_alphas([]) == []
    for bad in (0.5, [1.5], [True], ["0.5"]):
        with pytest.raises(ConfigError, match=r'FINETUNE\["wise"\] must be a list of numbers from 0 to 1'):
            wise.check_alphas(bad)


def _shapes_start(folder):
    from lgip import shapes

    return shapes.start_model(str(folder))


def _an_arm(start, folder, name):
    """The start's weights moved by noise, saved as finetune_lgip.py saves an arm (model/ and model_spec.json)."""
    from lgip.models.families import family
    from lgip.outputs import write_json

    towers = family(start).trainable(start, "cpu")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in towers.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    spec = towers.save(str(folder / "model"), name, True)
    write_json(str(folder / "model_spec.json"), spec, output=False)
    return spec


def _embeddings(spec, texts, images):
    from conftest import embed_image
    from lgip.images import open_rgb
    from lgip.models.registry import load_model

    enc = load_model(spec, "corrected", "cpu")
    t = encode_texts(enc, texts)
    return np.stack([t[x] for x in texts]), np.stack([embed_image(enc, open_rgb(p)) for p in images])


@pytest.mark.parametrize("which", ["tiny_openclip", "shapes"])
def test_alpha_0_gives_the_starts_embeddings_and_1_the_arms(tmp_path, which):
    start = OPENCLIP_TINY if which == "tiny_openclip" else _shapes_start(tmp_path / "start")
    arm = _an_arm(start, tmp_path / "x__ft_arm", f"{start['name']}__ft_lgip")
    jsonl = tmp_path / "x_with_fliptypes.jsonl"
    jsonl.write_text("")
    saved = {}
    for alpha in (0, 0.5, 1):
        spec, out, _ = run_here("wise_ft.py", JSONL_PATH=str(jsonl), MODEL=start, ARM=arm, ALPHA=alpha)
        name = f"{start['name']}__ft_lgip__wise{alpha:g}"
        folder = tmp_path / f"x_with_fliptypes__ft_{name}"
        assert spec == json.load(open(folder / "model_spec.json")) and spec["name"] == name
        assert spec["type"] == "openclip" and spec["model_name"] == "local-dir:" + str(folder / "model")
        meta = json.load(open(folder / "wise.meta.json"))
        assert meta["alpha"] == alpha and meta["status"] == "done" and meta["arm"]["name"] == arm["name"]
        assert meta["tensors"]["interpolated"] > 0 and "torch" in meta["versions"] and name in out
        saved[alpha] = spec
    images = [os.path.join(FIXTURES, "images", n) for n in sorted(os.listdir(os.path.join(FIXTURES, "images")))[:2]]
    texts = ["a red bus on the street", "two cats on a sofa"]
    got = {k: _embeddings(s, texts, images) for k, s in [("start", start), ("arm", arm)] + list(saved.items())}
    for alpha, same in ((0, "start"), (1, "arm")):
        for a, b in zip(got[alpha], got[same]):
            assert np.array_equal(a, b), (alpha, same)
    assert not np.allclose(got[0.5][0], got["start"][0]) and not np.allclose(got[0.5][0], got["arm"][0])


def test_alpha_0_gives_the_starts_figures_and_1_the_arms(tmp_path):
    """run_lgip_by_fliptype.py over the start, the arm and their WiSE-FT points at 0 and 1, in one run."""
    arm = _an_arm(OPENCLIP_TINY, tmp_path / "x__ft_arm", "tiny_openclip__ft_lgip")
    points = [
        run_here("wise_ft.py", JSONL_PATH=str(tmp_path / "x.jsonl"), MODEL=OPENCLIP_TINY, ARM=arm, ALPHA=a)[0]
        for a in (0, 1)
    ]
    src = tmp_path / "fixture_with_fliptypes.jsonl"
    shutil.copy(REFERENCE + "/fixture_with_fliptypes.jsonl", src)
    models = [OPENCLIP_TINY, arm] + points
    settings = eval_settings(src, "corrected", models, BOOTSTRAP=10, WRITE_SCORES=False, CACHE_DIR=None)
    run_here("run_lgip_by_fliptype.py", **settings)
    rows = {
        r["model_tag"]: r for r in json.load(open(tmp_path / "fixture_with_fliptypes__LGIP_fliptypes.metrics.json"))
    }
    keys = ("invariance_error_mean", "invariance_error_mean_ci95", "global_sensitivity", "by_flip_type")
    for point, same in (
        ("tiny_openclip__ft_lgip__wise0", "tiny_openclip"),
        ("tiny_openclip__ft_lgip__wise1", arm["name"]),
    ):
        assert {k: rows[point][k] for k in keys} == {k: rows[same][k] for k in keys}, point
    assert rows["tiny_openclip"]["global_sensitivity"] != rows[arm["name"]]["global_sensitivity"]


def test_bad_settings_stop_before_any_model(tmp_path):
    arm = {"name": "a", "type": "openclip", "model_name": "local-dir:" + str(tmp_path / "none"), "pretrained": None}
    for extra, words in (
        (dict(ALPHA=1.5, ARM=arm), "ALPHA must be a number from 0 to 1"),
        (dict(ARM=None), "ARM must be the fine-tuned arm's MODELS spec"),
        (dict(ARM=str(tmp_path / "nothing.json")), "is not there"),
        (dict(ARM=arm, RUN_NAME="a b"), "RUN_NAME must be a file-safe name"),
        (dict(ARM=arm, MODEL={"name": "g", "type": "generative", "model_id": "x"}), "fine-tune a dual encoder"),
    ):
        with pytest.raises(Exception, match=words):
            run_here("wise_ft.py", **{"JSONL_PATH": str(tmp_path / "x.jsonl"), "MODEL": OPENCLIP_TINY, **extra})
    siglip = {"name": "s", "type": "siglip", "model_id": os.path.join(FIXTURES, "models", "siglip-tiny")}
    with pytest.raises(ConfigError, match="WiSE-FT mixes the weights of one architecture"):
        run_here("wise_ft.py", JSONL_PATH=str(tmp_path / "x.jsonl"), MODEL=OPENCLIP_TINY, ARM=siglip)
    assert not any(p.name.startswith("x__ft_") for p in tmp_path.iterdir())
