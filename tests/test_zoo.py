"""Many models in one setting (LGIP_SPEC.md section 12): openclip_zoo entries expanded against
open_clip.list_pretrained(), SHARD, ON_MODEL_ERROR, model cards (the tag table, parameters counted per
tower), and a resumed run that loads the weights of the unfinished models only."""

import fnmatch
import json
import os
import shutil

import pytest

from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, SIGLIP_TINY, eval_args, run_script
from lgip.errors import ConfigError, ModelError
from lgip.models.cards import TRAINING_DATA, count_towers, family_of, model_card, tag_facts
from lgip.models.registry import expand_models
from lgip.models.zoo import shard, shard_of

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_zoo_entry_expands_to_the_matching_pretrained_pairs():
    import open_clip

    got = expand_models([{"type": "openclip_zoo", "match": "ViT-B-*", "tags": "laion*"}])
    want = [
        (a, t)
        for a, t in open_clip.list_pretrained()
        if fnmatch.fnmatchcase(a, "ViT-B-*") and fnmatch.fnmatchcase(t, "laion*")
    ]
    assert [(m["model_name"], m["pretrained"]) for m in got] == want and len(want) >= 3
    assert all(m["type"] == "openclip" and m["name"] == f"{m['model_name']}__{m['pretrained']}" for m in got)
    # a pair named twice is evaluated once; an explicit spec of the same pair is kept, the zoo's copy not added
    again = expand_models(
        [
            {"name": "mine", "type": "openclip", "model_name": want[0][0], "pretrained": want[0][1]},
            {"type": "openclip_zoo", "match": "ViT-B-*", "tags": "laion*"},
            {"type": "openclip_zoo", "match": want[1][0], "tags": want[1][1]},
        ]
    )
    assert [m["name"] for m in again] == ["mine"] + [m["name"] for m in got[1:]]
    # the same when the spec comes after the zoo entry: the user's spec is kept where they put it
    after = expand_models(
        [
            {"type": "openclip_zoo", "match": "ViT-B-*", "tags": "laion*"},
            {"name": "mine", "type": "openclip", "model_name": want[0][0], "pretrained": want[0][1]},
        ]
    )
    assert [m["name"] for m in after] == [m["name"] for m in got[1:]] + ["mine"]
    # and for a published name: the zoo's openai ViT-B-16 is the published spec, once, by its name
    openai = expand_models(
        [{"type": "openclip_zoo", "match": "ViT-B-16", "tags": "openai"}, "openclip_ViT-B-16_openai"]
    )
    assert [m["name"] for m in openai] == ["openclip_ViT-B-16_openai"]
    # two specs of their own naming one pair are both the user's: kept (they may differ in settings)
    two = expand_models(
        [
            {"name": "x", "type": "openclip", "model_name": "RN50", "pretrained": "openai"},
            {"name": "y", "type": "openclip", "model_name": "RN50", "pretrained": "openai"},
        ]
    )
    assert [m["name"] for m in two] == ["x", "y"]
    every = expand_models([{"type": "openclip_zoo", "match": "*"}])
    assert len(every) == len(open_clip.list_pretrained())


def test_no_match_names_the_pattern():
    with pytest.raises(
        ModelError,
        match=r"no pretrained open_clip model matches architecture 'vit-b-16' .* "
        r"architectures such as: ViT-B-16",
    ):
        expand_models([{"type": "openclip_zoo", "match": "vit-b-16"}])
    with pytest.raises(ModelError, match='needs "match"'):
        expand_models([{"type": "openclip_zoo"}])


def test_shards_take_every_nth_model():
    models = list("abcdefg")
    assert [shard(models, f"{i}/3") for i in range(3)] == [["a", "d", "g"], ["b", "e"], ["c", "f"]]
    assert shard(models, None) == models
    env = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4", "SLURM_ARRAY_TASK_COUNT": "3"}
    assert shard_of("slurm", env) == (1, 3) and shard(models, "slurm", env) == ["b", "e"]
    for bad, message in (("3/3", "shard 3 of 3"), ("x", "SHARD must be None"), ("slurm", "SLURM_ARRAY_TASK_ID")):
        with pytest.raises(ConfigError, match=message):
            shard_of(bad, {})


def test_a_shard_runs_its_models_and_the_shards_rows_merge(tmp_path):
    src = tmp_path / "in.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), src)
    for i in (1, 0):  # (the second job first: rows merge whatever the order)
        proc = run_script(
            "run_lgip_multi.py",
            *eval_args(src, "reference", [OPENCLIP_TINY, SIGLIP_TINY], BOOTSTRAP=0, CACHE_DIR=None),
            f"--SHARD={i}/2",
        )
        assert f"SHARD {i}/2: 1 of 2 models" in proc.stdout
    rows = json.load(open(tmp_path / "in__LGIP_ALL.metrics.json"))
    assert [r["model_tag"] for r in rows] == ["tiny_siglip", "tiny_openclip"]
    assert rows[1]["run"]["config"]["SHARD"] == "0/2" and len(rows[1]["run"]["config"]["MODELS"]) == 1
    proc = run_script("run_lgip_multi.py", *eval_args(src, "reference", [OPENCLIP_TINY], CACHE_DIR=None), "--SHARD=3/4")
    assert "note: SHARD '3/4' has no model of the 1 in MODELS: nothing to do" in proc.stdout  # (exit status 0)


def test_a_failing_model_is_skipped_and_the_others_rows_are_whole(tmp_path):
    src = tmp_path / "in.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), src)
    broken = {"name": "broken", "type": "python", "loader": os.path.join(HERE, "user_loaders.py") + ":broken"}
    missing = {"name": "missing", "type": "openclip", "model_name": "local-dir:" + str(tmp_path / "no_model")}
    models = [OPENCLIP_TINY, broken, missing, SIGLIP_TINY]
    proc = run_script(
        "run_lgip_multi.py", *eval_args(src, "reference", models, BOOTSTRAP=0, CACHE_DIR=None), "--ON_MODEL_ERROR=skip"
    )
    rows = json.load(open(tmp_path / "in__LGIP_ALL.metrics.json"))
    assert [r["model_tag"] for r in rows] == ["tiny_openclip", "tiny_siglip"]  # a skipped model is never a row
    for r in rows:
        # (the missing folder is found before any model runs; the broken loader when its model loads)
        assert [s["name"] for s in r["run"]["skipped_models"]] == ["missing", "broken"]
        assert "no_model does not exist" in r["run"]["skipped_models"][0]["error"]
        assert "no checkpoint at epoch3.pt" in r["run"]["skipped_models"][1]["error"]
    assert "2 of 4 models skipped (ON_MODEL_ERROR=skip): missing, broken" in proc.stdout
    assert "model 'broken' failed and is left out" in proc.stderr
    ref = json.load(open(os.path.join(REFERENCE, "fixture_with_perturb__LGIP_ALL.metrics.json")))
    for ours, published in zip(rows, ref):
        for key, value in published.items():
            assert ours[key] == pytest.approx(value, abs=1e-6) if isinstance(value, float) else ours[key] == value
    proc = run_script(
        "run_lgip_multi.py",
        *eval_args(src, "reference", [broken, missing], CACHE_DIR=None),
        "--ON_MODEL_ERROR=skip",
        check=False,
    )
    assert proc.returncode == 2 and "every model failed (2), so nothing was written" in proc.stderr
    proc = run_script(
        "run_lgip_multi.py", *eval_args(src, "reference", [OPENCLIP_TINY, broken], CACHE_DIR=None), check=False
    )  # ("stop", the default: the first failure stops the run)
    assert proc.returncode == 2 and "no checkpoint at epoch3.pt" in proc.stderr


def test_a_resumed_run_loads_the_weights_of_the_unfinished_models_only(tmp_path):
    import run_lgip_by_fliptype

    src = tmp_path / "in.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"), src)
    settings = dict(
        JSONL_PATH=str(src), IMAGE_ROOT=FIXTURES, DEVICE="cpu", NUM_WORKERS=0, BOOTSTRAP=0, WRITE_SCORES=False
    )
    first = run_lgip_by_fliptype.run(MODELS=[OPENCLIP_TINY], **settings)  # a run stopped after its first model
    rows = run_lgip_by_fliptype.run(MODELS=[OPENCLIP_TINY, SIGLIP_TINY], **settings)
    assert [r["run"]["model"]["weights_loaded"] for r in rows] == [False, True]
    assert rows[0]["by_flip_type"] == first[0]["by_flip_type"]


def test_the_tag_table_and_families():
    assert tag_facts("laion2b_s32b_b82k") == ("LAION-2B", 32_000_000_000)
    assert tag_facts("datacomp_xl_s13b_b90k") == ("DataComp-1B", 13_000_000_000)
    assert tag_facts("commonpool_m_clip_s128m_b4k") == ("CommonPool", 128_000_000)
    assert tag_facts("openai") == ("WIT-400M", None) and tag_facts("frozen_laion5b_s13b_b90k") == (None, 13_000_000_000)
    assert tag_facts(None) == (None, None) and tag_facts("/ckpt/openai_e3.pt") == (None, None)
    for token, data in TRAINING_DATA.items():
        assert tag_facts(token + "_s1k")[0] == data and tag_facts(token + "_s1k")[1] == 1000
    assert [family_of(a) for a in ("RN50", "ViT-B-16", "EVA02-L-14", "convnext_base", "ViT-SO400M-14-SigLIP")] == [
        "RN50",
        "ViT",
        "EVA02",
        "convnext",
        "SigLIP",
    ]
    assert family_of("nllb-clip-base-siglip") == "nllb"  # "SigLIP" as the section writes it, case and all


def test_cards_count_each_tower_as_the_models_own_parameters_say():
    import torch
    from lgip.models import load_model

    for spec in (OPENCLIP_TINY, SIGLIP_TINY):
        enc = load_model(spec, "corrected", "cpu")
        model = enc.model
        total = sum(p.numel() for p in model.parameters())
        image = sum(p.numel() for p in (model.visual if hasattr(model, "visual") else model.vision_model).parameters())
        loaded = model_card(spec, enc, torch.zeros(2, 32))
        built = model_card(spec)  # (no model: counted on the meta device)
        for card in (loaded, built):
            assert card["params_total"] == total and card["params_image"] == image
            assert card["params_text"] == total - image - sum(
                p.numel() for n, p in model.named_parameters() if n.startswith(("logit_scale", "logit_bias"))
            )
            assert card["image_size"] == 64 and card["context_length"] == (77 if spec is OPENCLIP_TINY else 64)
        assert loaded["embed_dim"] == built["embed_dim"] == model_card(spec, enc)["embed_dim"] == 32
    assert model_card(SIGLIP_TINY)["loss"] == "sigmoid" and model_card(OPENCLIP_TINY)["loss"] == "softmax"
    assert model_card(OPENCLIP_TINY)["architecture"] is None  # a local folder: no open_clip name to go by
    assert model_card(OPENCLIP_TINY)["training_data"] is None  # (its weights are the folder's: not known)
    random_rn50 = model_card({"name": "r", "type": "openclip", "model_name": "RN50", "pretrained": None})
    assert (
        random_rn50["training_data"] is None and random_rn50["samples_seen"] is None
    )  # (no tag: the table says nothing)
    assert random_rn50["params_total"] > 10**7 and random_rn50["family"] == "RN50" and random_rn50["embed_dim"] == 1024
    mine = {
        "name": "mine",
        "type": "python",
        "loader": os.path.join(HERE, "user_loaders.py") + ":openclip_tiny",
        "card": {"training_data": "in-house 50M", "loss": "softmax"},
    }
    enc = load_model(mine, "corrected", "cpu")
    card = model_card(mine, enc)
    assert card["params_total"] == sum(p.numel() for p in enc.model.parameters()) and card["params_image"] is None
    assert card["training_data"] == "in-house 50M" and card["loss"] == "softmax"  # the spec's card wins
    assert count_towers(torch.nn.Linear(2, 3)) == {"params_image": None, "params_text": None, "params_total": 9}


def test_a_card_whose_model_cannot_be_built_keeps_what_its_spec_says(monkeypatch):
    """No model to count (its text tower's files not at hand, say): the architecture, family and
    the tag's facts are still the spec's; only what needs the model is None."""
    import open_clip
    from lgip.models import cards

    def cannot(*args, **kwargs):
        raise OSError("the text tower's config cannot be had")

    monkeypatch.setattr(open_clip, "create_model", cannot)
    monkeypatch.setattr(cards, "_CARDS", {})
    card = model_card({"name": "n", "type": "openclip", "model_name": "nllb-clip-base-siglip", "pretrained": "v1"})
    assert (card["architecture"], card["family"], card["pretrained"], card["source"]) == (
        "nllb-clip-base-siglip",
        "nllb",
        "v1",
        "openclip",
    )
    assert card["params_total"] is None and card["embed_dim"] is None and card["training_data"] is None
    laion = model_card({"name": "l", "type": "openclip", "model_name": "ViT-B-32", "pretrained": "laion2b_s34b_b79k"})
    assert (laion["family"], laion["training_data"], laion["samples_seen"]) == ("ViT", "LAION-2B", 34_000_000_000)


def test_the_cards_worked_example():
    import doctest
    from lgip.models import cards

    assert doctest.testmod(cards, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0


def test_every_evaluation_row_has_its_card(tmp_path):
    import run_lgip_multi

    src = tmp_path / "in.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), src)
    row = run_lgip_multi.run(
        JSONL_PATH=str(src),
        IMAGE_ROOT=FIXTURES,
        MODELS=["demo"],
        DEVICE="cpu",
        NUM_WORKERS=0,
        BOOTSTRAP=0,
        WRITE_SCORES=False,
    )[0]
    card = row["model_card"]
    assert card["family"] == "demo" and card["training_data"] == "none (random init)" and card["embed_dim"] == 32
    assert card["params_total"] == 1661729 and card["source"] == "openclip"
    with pytest.raises(ConfigError, match="SHARD must be None"):
        run_lgip_multi.run(JSONL_PATH=str(src), MODELS=["demo"], SHARD="half")
