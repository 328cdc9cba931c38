"""lgip/models/families.py: a model type is one record. A new family registered here (as its own module would
register it) runs through every part of a run (the settings check, the Hub check, the loader, the scorer, the
card) with nothing else added; its figures are the wrapped model's."""

import dataclasses
import json
import shutil

import pytest

from conftest import OPENCLIP_TINY, REFERENCE, eval_settings, run_here
from lgip.errors import ConfigError, ModelError
from lgip.models import FAMILIES, Family, family, register
from lgip.models.openclip import load_openclip


def _load_mine(spec, protocol, device, dtype):
    """A family of one's own: an open_clip folder given as "weights" (the tiny fixture model)."""
    return load_openclip(dict(spec, type="openclip", model_name=spec["weights"]), protocol, device, dtype)


def _mine_card(spec, model, enc):
    return {"architecture": "mine-arch", "params_total": sum(p.numel() for p in model.parameters()) if model else None}


@pytest.fixture
def mine(monkeypatch):
    record = Family(
        "mine",
        required="weights",
        options=("size",),
        load=_load_mine,
        named=lambda spec: {"pretrained": spec["weights"]},
        card=_mine_card,
        score_kind=lambda spec: "cosine",
    )
    monkeypatch.setitem(FAMILIES, "mine", record)  # (register() adds it for the process; the test's ends with it)
    return record


def test_a_new_family_is_one_record(tmp_path, mine):
    src = tmp_path / "x_with_perturb.jsonl"
    shutil.copy(REFERENCE + "/fixture_with_perturb.jsonl", src)
    spec = {"name": "mine_tiny", "type": "mine", "weights": OPENCLIP_TINY["model_name"]}
    rows, _, _ = run_here(
        "run_lgip_multi.py", **eval_settings(src, "corrected", [spec, OPENCLIP_TINY], BOOTSTRAP=0, CACHE_DIR=None)
    )
    ours, theirs = rows
    card = ours["model_card"]
    assert card["source"] == "mine" and card["architecture"] == "mine-arch" and card["params_total"] > 0
    assert card["pretrained"] == spec["weights"] and card["score_kind"] == "cosine"
    for key in ("invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate"):
        assert ours[key] == theirs[key]  # (the same weights, loaded by the new family)
    saved = json.load(open(tmp_path / "x_with_perturb__LGIP_ALL.metrics.json"))
    assert [r["model_tag"] for r in saved] == ["mine_tiny", "tiny_openclip"]


def test_a_spec_of_a_family_is_checked_by_its_record(tmp_path, mine):
    src = tmp_path / "x_with_perturb.jsonl"
    shutil.copy(REFERENCE + "/fixture_with_perturb.jsonl", src)
    with pytest.raises(ConfigError, match=r"type .mine. needs .weights."):
        run_here("run_lgip_multi.py", **eval_settings(src, "corrected", [{"name": "m", "type": "mine"}]))
    with pytest.raises(ConfigError, match=r"colour.*size"):
        run_here(
            "run_lgip_multi.py",
            **eval_settings(src, "corrected", [{"name": "m", "type": "mine", "weights": "x", "colour": 1}]),
        )
    with pytest.raises(ModelError, match=r"unknown type 'mien'; valid: openclip, .*itm, mine"):
        family({"name": "m", "type": "mien"})


def test_the_registered_families_and_register_refuses_what_is_not_a_record():
    assert list(FAMILIES)[:6] == ["openclip", "transformers", "siglip", "python", "generative", "itm"]
    assert [FAMILIES[t].scorer for t in ("openclip", "siglip", "python", "generative", "itm")] == [
        "embeddings",
        "embeddings",
        "embeddings",
        "joint",
        "joint",
    ]
    assert FAMILIES["itm"].spec_keys() == ("name", "type", "model_id", "card", "demo")
    with pytest.raises(TypeError):
        register({"type": "x"})
    with pytest.raises(ValueError, match="scorer must be"):
        register(dataclasses.replace(FAMILIES["openclip"], type="x", scorer="pairs"))
    assert "x" not in FAMILIES
