"""Models that score a pair jointly (LGIP_SPEC.md 13: types "generative" and "itm", lgip.models.joint,
lgip.scorers.joint) through the evaluations, on a tiny random-init LLaVA and BLIP ITM: every score a
plain forward of its one text, the text-prior controls over PRIOR_IMAGES images after each record's
own (mod N over the readable records), the relative invariance error restated, the cache and a
resumed run, and each bad input named. Every family: LLaVA, Qwen2-VL (its rope deltas), Gemma 3 (its
sliding-window layers), PaliGemma (a prefix-LM), BLIP and BLIP-2 ITM."""

import json
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from lgip import accelerations
from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, eval_settings, run_here
from tiny_vlm import tiny_blip2_itm, tiny_blip_itm, tiny_gemma3, tiny_lfm2_vl, tiny_llava, tiny_paligemma, tiny_qwen2_vl

PERTURB = "fixture_with_perturb.jsonl"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("joint")
    return {
        "llava": tiny_llava(root / "llava"),
        "blip": tiny_blip_itm(root / "blip"),
        "qwen2_vl": tiny_qwen2_vl(root / "qwen2_vl"),
        "paligemma": tiny_paligemma(root / "paligemma"),
        "blip2": tiny_blip2_itm(root / "blip2"),
        "gemma3": tiny_gemma3(root / "gemma3"),
        "lfm2_vl": tiny_lfm2_vl(root / "lfm2_vl"),
    }


def specs(folders, **llava):
    return [
        {"name": "llava", "type": "generative", "model_id": str(folders["llava"]), **llava},
        {"name": "blip", "type": "itm", "model_id": str(folders["blip"])},
    ]


def family(folders, name, **settings):
    return {"name": name, "type": "generative", "model_id": str(folders[name]), **settings}


def small_input(tmp_path, n=4, missing=None):
    """The first n records of the fixture; `missing`: the index of one whose image file does not exist."""
    lines = open(os.path.join(REFERENCE, PERTURB), encoding="utf-8").read().splitlines()[:n]
    if missing is not None:
        rec = json.loads(lines[missing])
        rec["image_path"] = "images/not_there.jpg"
        lines[missing] = json.dumps(rec)
    path = tmp_path / "small_with_perturb.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def plain(folders, name, image_path, texts, **settings):
    """Each text's score from one plain forward of the whole model (the definition, section 13)."""
    from transformers import (
        AutoModelForImageTextToText,
        Blip2ForImageTextRetrieval,
        BlipForImageTextRetrieval,
    )
    from lgip.models import generative, itm
    from lgip.models.joint import DEFAULT_QUESTION, _processor

    image = Image.open(os.path.join(FIXTURES, image_path)).convert("RGB")
    processor = _processor({"name": name, "model_id": str(folders[name])})[0]  # (PIL, or a fast-only family's)
    if name in ("blip", "blip2"):
        cls = BlipForImageTextRetrieval if name == "blip" else Blip2ForImageTextRetrieval
        return itm.plain_scores(cls.from_pretrained(folders[name]).eval(), processor, image, texts)
    model = AutoModelForImageTextToText.from_pretrained(folders[name]).eval()
    pali = name == "paligemma"
    if settings.get("score") == "vqascore":
        convs = [(("answer en " if pali else "") + DEFAULT_QUESTION.format(t), "Yes") for t in texts]
    else:
        convs = [("caption en" if pali else generative.DEFAULT_PROMPT, t) for t in texts]
    return generative.conversation_scores(
        model, processor, image, convs, mean=settings.get("score") == "logprob_mean", reuse=False
    )


def scored(jsonl, spec, prior_images=3, **extra):
    import common
    import run_lgip_multi

    config = dict(eval_settings(jsonl, "corrected", [spec], CACHE_DIR=None, PRIOR_IMAGES=prior_images), **extra)
    config.update(IMAGE_BATCH_SIZE=4, TEXT_BATCH_SIZE=16, DTYPE="fp32")
    records = common.load_records(str(jsonl), ("same_caps", "diff_caps"))
    run = common.ModelRun(spec, records, config)
    return records, run.score(*run.pairs(run_lgip_multi.published_calls), controls=True, relative=True)


@pytest.mark.parametrize(
    "which,settings",
    [
        ("llava", {}),
        ("llava", {"score": "vqascore"}),
        ("blip", {}),
        ("blip2", {}),
        ("qwen2_vl", {"score": "logprob_mean"}),
        ("gemma3", {}),
        ("paligemma", {}),
        ("paligemma", {"score": "vqascore"}),
        ("lfm2_vl", {}),
        ("lfm2_vl", {"score": "vqascore"}),
    ],
)
def test_every_score_and_prior_is_a_plain_forward_of_its_one_text(tmp_path, folders, which, settings):
    """Each pair's s (caption and text) is the model run on that one text; each prior the mean over the
    PRIOR_IMAGES readable records after its own, mod N (here 2 of 3 readable: one image is missing)."""
    jsonl = small_input(tmp_path, 4, missing=1)
    spec = (
        {"name": which, "type": "itm", "model_id": str(folders[which])}
        if which.startswith("blip")
        else family(folders, which, **settings)
    )
    records, got = scored(jsonl, spec, prior_images=2)
    assert got.failed == [1] and got.prior_images == 2 and got.n_samples == 3
    inv, sens = got.pairs
    readable = [0, 2, 3]
    want = {}
    for k in readable:  # every text of the run against every readable image
        texts = sorted(
            {t for p in (inv, sens) for t in p.text} | {t for r in readable for t in records[r][1]["orig_captions"]}
        )
        want[k] = dict(zip(texts, plain(folders, which, records[k][1]["image_path"], texts, **settings)))
    for pairs in (inv, sens):
        for j, (k, i, t) in enumerate(zip(pairs.rec, pairs.cap, pairs.text)):
            caption = records[k][1]["orig_captions"][i]
            assert pairs.base_sim[j] == pytest.approx(want[k][caption], abs=1e-4)
            assert pairs.sim[j] == pytest.approx(want[k][t], abs=1e-4)
            nxt = [readable[(readable.index(k) + d) % 3] for d in (1, 2)]
            assert pairs.prior[j] == pytest.approx(np.mean([want[n][t] for n in nxt]), abs=1e-4)
            assert pairs.prior_base[j] == pytest.approx(np.mean([want[n][caption] for n in nxt]), abs=1e-4)
    # the relative invariance error's terms: each caption with its image, and the record before's
    from lgip.controls import relative_terms

    rec, values = relative_terms(got.relative)
    expect = []
    for p, k in enumerate(readable):
        caps, before = records[k][1]["orig_captions"], records[readable[p - 1]][1]["orig_captions"]
        expect += [abs(want[k][c] - want[k][before[i % len(before)]]) for i, c in enumerate(caps)]
    assert sorted(rec.tolist()) == sorted(k for k in readable for _ in records[k][1]["orig_captions"])
    assert sorted(values) == pytest.approx(sorted(expect), abs=2e-4)


def test_a_mixed_run_gives_each_model_its_score_kind_and_the_relative_error(tmp_path, folders):
    """A dual encoder beside two scorers in one MODELS list: each row's score_kind and card, the prior
    images used, invariance_error_rel = mean |s(t_p) - s(t_i)| / the mean of its terms (restated), the
    text-only rate None for scorers, the score lines' score_kind, and the paired comparisons take the
    invariance error only between models of one kind (the relative one across kinds)."""
    jsonl = small_input(tmp_path, 5)
    rows, out, _ = run_here(
        "run_lgip_multi.py",
        **eval_settings(jsonl, "corrected", specs(folders) + [OPENCLIP_TINY], BOOTSTRAP=20, CACHE_DIR=None),
    )
    by = {r["model_tag"]: r for r in rows}
    assert [by[m]["score_kind"] for m in ("llava", "blip", "tiny_openclip")] == ["logprob", "itm_logodds", "cosine"]
    assert by["llava"]["prior_images"] == 3 and by["tiny_openclip"]["prior_images"] == "all"
    card = by["llava"]["model_card"]
    assert card["architecture"] == "llava" and card["loss"] == "next-token" and card["embed_dim"] is None
    assert card["params_image"] + card["params_text"] == card["params_total"] and card["score_kind"] == "logprob"
    assert by["blip"]["model_card"]["loss"] == "itm" and by["tiny_openclip"]["model_card"]["score_kind"] == "cosine"
    for name in ("llava", "blip"):
        assert by[name]["text_only_rate"] is None and by[name]["robust_pos_rate"] is not None
        assert by[name]["grounded_pos_rate"] is not None and by[name]["run"]["model"]["type"] in ("generative", "itm")
    for name, row in by.items():
        lines = [json.loads(line) for line in open(tmp_path / row["scores_file"], encoding="utf-8")]
        assert {line["score_kind"] for line in lines} == {row["score_kind"]}
        err = [abs(p["sim"] - line["sim"]) for line in lines for p in line["paraphrases"]]
        assert row["invariance_error_rel"] is not None and 0 < row["invariance_error_rel"]
        assert row["invariance_error_mean"] == pytest.approx(np.mean(err), abs=1e-5)
        lo, hi = row["invariance_error_rel_ci95"]
        assert lo <= row["invariance_error_rel"] <= hi
    compared = json.load(open(tmp_path / "small_with_perturb__LGIP_comparisons.metrics.json"))
    pairs = {(c["a"], c["b"], c["figure"]) for c in compared}
    assert ("llava", "blip", "invariance_error_mean") not in pairs and (
        "llava",
        "blip",
        "invariance_error_rel",
    ) in pairs
    assert ("llava", "tiny_openclip", "sensitivity_pos_rate") in pairs
    rel = next(c for c in compared if (c["a"], c["b"], c["figure"]) == ("llava", "blip", "invariance_error_rel"))
    assert rel["a_value"] == pytest.approx(by["llava"]["invariance_error_rel"], abs=1e-9)
    assert rel["diff"] == pytest.approx(
        by["llava"]["invariance_error_rel"] - by["blip"]["invariance_error_rel"], abs=1e-9
    )


def test_the_relative_error_of_a_dual_encoder_restated(tmp_path):
    """invariance_error_rel of a dual encoder: mean |cos(v, t_p) - cos(v, t_i)| over the paraphrase pairs,
    over the mean |cos(v_r, t_i) - cos(v_r, c)| with c caption (i mod n') of the record before r (the
    last before the first)."""
    import common
    from conftest import embed_image, encode_texts

    jsonl = small_input(tmp_path, 4)
    row = run_here(
        "run_lgip_multi.py", **eval_settings(jsonl, "corrected", [OPENCLIP_TINY], BOOTSTRAP=0, CACHE_DIR=None)
    )[0][0]
    enc = common.load_model(OPENCLIP_TINY, "corrected", "cpu", "fp32")
    records = [r for _, r in common.load_records(str(jsonl), ("same_caps", "diff_caps"))]
    texts = encode_texts(enc, [t for r in records for c in r["orig_captions"] for t in [c]])
    images = [embed_image(enc, Image.open(os.path.join(FIXTURES, r["image_path"])).convert("RGB")) for r in records]
    den = [
        abs(
            images[k] @ texts[c]
            - images[k] @ texts[records[k - 1]["orig_captions"][i % len(records[k - 1]["orig_captions"])]]
        )
        for k, r in enumerate(records)
        for i, c in enumerate(r["orig_captions"])
    ]
    assert row["invariance_error_rel"] == pytest.approx(row["invariance_error_mean"] / np.mean(den), rel=1e-4)


def test_a_cached_rerun_loads_no_weights_and_a_killed_run_resumes(tmp_path, folders, monkeypatch):
    """Scores are cached per (image, text): a re-run reads them all without loading the model and gives
    the same figures; a run killed part way resumes from what it had written, scoring only the rest."""
    from lgip.models import joint

    jsonl = small_input(tmp_path, 4)
    spec = specs(folders)[1]
    settings = eval_settings(jsonl, "corrected", [spec], BOOTSTRAP=0, CACHE_FLUSH_S=0)
    fresh = run_here("run_lgip_multi.py", **dict(settings, CACHE_DIR=None))[0][0]
    real, calls = joint.JointModel.submit, []

    def dies(self, image, texts):  # the third image's forward is killed
        calls.append(len(texts))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, image, texts)

    monkeypatch.setattr(joint.JointModel, "submit", dies)
    with pytest.raises(Exception):
        run_here("run_lgip_multi.py", **settings)
    monkeypatch.setattr(joint.JointModel, "submit", real)
    resumed = run_here("run_lgip_multi.py", **settings)[0][0]
    hits, looked = resumed["run"]["cache"]["resumed"]["pairs"]
    assert 0 < hits < looked and resumed["run"]["model"].get("weights_loaded", True)
    again = run_here("run_lgip_multi.py", **settings)[0][0]
    assert again["run"]["cache"]["resumed"]["pairs"][0] == again["run"]["cache"]["resumed"]["pairs"][1]
    assert again["run"]["model"]["weights_loaded"] is False
    for row in (resumed, again):
        for key in ("invariance_error_mean", "sensitivity_gap_mean", "prior_gap_mean", "invariance_error_rel"):
            assert row[key] == pytest.approx(fresh[key], abs=1e-6), key


@pytest.mark.parametrize("switch", accelerations.JOINT_ONLY)  # (each of a joint scorer's switches)
def test_each_joint_acceleration_off_gives_the_same_metrics(tmp_path, folders, switch):
    """ACCELERATIONS_OFF=[switch]: PREFIX_REUSE off runs the whole model per (image, text); CONVERSATION_SPLICE
    off the processor per text; TEXT_PACKS off batches on repeated caches; IMAGE_GROUPS off runs each image
    apart (its prefix, then its texts on the cache); JOINT_PIPELINE off waits for each image's scores before
    the next (and so runs no groups). The same figures to 1e-5; each row says what ran, and why not (BLIP has
    no conversation to splice or pack). The self-check ran on the first image where the prefix was reused."""
    jsonl = small_input(tmp_path, 3)
    keys = (
        "invariance_error_mean",
        "sensitivity_gap_mean",
        "prior_gap_mean",
        "grounded_gap_mean",
        "invariance_error_rel",
    )
    on = run_here(
        "run_lgip_multi.py", **eval_settings(jsonl, "corrected", specs(folders), BOOTSTRAP=0, CACHE_DIR=None)
    )[0]
    off = run_here(
        "run_lgip_multi.py",
        **eval_settings(jsonl, "corrected", specs(folders), BOOTSTRAP=0, CACHE_DIR=None, ACCELERATIONS_OFF=[switch]),
    )[0]
    for a, b in zip(on, off):
        assert not b["run"]["accelerations"][switch] and switch not in b["run"]["accelerations_not_applied"]
        if a["model_tag"] == "llava" or switch in ("PREFIX_REUSE", "JOINT_PIPELINE"):
            assert a["run"]["accelerations"][switch], a["model_tag"]
        else:
            assert "no conversation" in a["run"]["accelerations_not_applied"][switch]
        for key in keys:
            assert a[key] == pytest.approx(b[key], abs=1e-5), (a["model_tag"], key)
    check = on[0]["run"]["model"]["self_check"]
    assert check["texts"] == 3 and check["max_abs_diff"] < 1e-4 and check["bound"] == 1e-4
    assert ("self_check" in off[0]["run"]["model"]) == (switch != "PREFIX_REUSE")


def test_a_family_whose_cache_the_reuse_cannot_continue_runs_plain_forwards(tmp_path, folders, monkeypatch):
    """LFM2-VL (a hybrid cache: a short convolution beside attention) is not among REUSE_FAMILIES: one plain
    forward per text, said once in the console and in the row; its image processor exists only as a fast one,
    which makes its pixels and is named. The trap is real: a reuse that continued its cache (the family and
    its cache let through) scores visibly wrong; with only the family let through, the cache's check still
    sends each text through a plain forward."""
    from lgip.models import generative

    jsonl = small_input(tmp_path, 2)
    (rows, _, err) = run_here(
        "run_lgip_multi.py",
        **eval_settings(jsonl, "corrected", [family(folders, "lfm2_vl")], BOOTSTRAP=0, CACHE_DIR=None),
    )
    row = rows[0]
    assert err.count("is not among the families whose cache the reused prefix is known to continue exactly") == 1
    assert (
        not row["run"]["accelerations"]["PREFIX_REUSE"]
        and "cache" in row["run"]["accelerations_not_applied"]["PREFIX_REUSE"]
    )
    assert (
        row["run"]["model"]["image_processor"] == "Lfm2VlImageProcessorFast" and "self_check" not in row["run"]["model"]
    )
    from lgip.models.joint import _processor
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(folders["lfm2_vl"]).eval()
    processor = _processor({"name": "lfm2_vl", "model_id": str(folders["lfm2_vl"])})[0]
    image = Image.open(
        os.path.join(FIXTURES, "images", sorted(os.listdir(os.path.join(FIXTURES, "images")))[0])
    ).convert("RGB")
    convs = [
        (generative.DEFAULT_PROMPT, t) for t in ("A red bus parked on the side of the street.", "two dogs", "a cat")
    ]
    plain = generative.conversation_scores(model, processor, image, convs, reuse=False)
    monkeypatch.setattr(generative, "REUSE_FAMILIES", generative.REUSE_FAMILIES + ("lfm2_vl",))
    assert generative.conversation_scores(model, processor, image, convs, packs=64) == pytest.approx(plain, abs=1e-5)
    monkeypatch.setattr(generative, "_PLAIN_CACHES", generative._PLAIN_CACHES + ("Lfm2HybridConvCache",))
    monkeypatch.setattr(generative, "PACKED_FAMILIES", generative.PACKED_FAMILIES + ("lfm2_vl",))  # (one row)
    wrong = generative.conversation_scores(model, processor, image, convs, packs=64)
    assert max(abs(a - b) for a, b in zip(wrong, plain)) > 1e-3


def test_a_load_error_is_said_as_it_is_and_the_network_named_only_for_a_network_error():
    """A local path that does not exist is named as such; an error that is not the network's is said without
    the network's advice; a failed download (offline, unreachable) gets it."""
    from lgip.models.encoder import _download_hint

    spec = {"name": "m", "type": "generative", "model_id": "/no/such/folder"}
    assert "/no/such/folder does not exist" in str(_download_hint(spec, OSError("not a folder")))
    spec = {"name": "m", "type": "generative", "model_id": "org/model"}
    said = str(_download_hint(spec, ValueError("Lfm2VlImageProcessorFast does not have a slow version")))
    assert "slow version" in said and "network" not in said
    try:
        try:
            raise ConnectionError("Max retries exceeded with url: /org/model/resolve/main/config.json")
        except ConnectionError as e:
            raise OSError("We couldn't find them in the cached files") from e
    except OSError as e:
        assert "Check the network" in str(_download_hint(spec, e))


def test_the_self_check_stops_a_model_whose_fast_path_is_not_exact(tmp_path, folders, monkeypatch):
    """Every run checks its fast path on its first image (SELF_CHECK_TEXTS texts both ways): a reused-prefix
    score off by more than 1e-4 in float32 stops the model before any output, both numbers named; with
    PREFIX_REUSE off there is nothing to check and the run goes on."""
    import common
    from lgip.models import generative

    real = generative.submit

    def off_by_a_little(model, processor, image, convs, mean=False, reuse=True, *a, **k):
        values = real(model, processor, image, convs, mean, reuse, *a, **k).result()
        return generative.Pending([v + 1e-3 for v in values] if reuse else values)

    monkeypatch.setattr(generative, "submit", off_by_a_little)
    jsonl = small_input(tmp_path, 2)
    with pytest.raises(
        common.ModelError,
        match=r"model 'llava' .*the self-check failed: with its prefix run once, "
        r"'.*' scores -?[\d.]+; in one plain forward -?[\d.]+ \(difference 1\.0\de-03, "
        r"allowed 1\.00e-04 in float32\)",
    ):
        run_here("run_lgip_multi.py", **eval_settings(jsonl, "corrected", specs(folders)[:1], CACHE_DIR=None))
    assert not list(tmp_path.glob("*.metrics.json"))
    rows = run_here(
        "run_lgip_multi.py",
        **eval_settings(jsonl, "corrected", specs(folders)[:1], CACHE_DIR=None, ACCELERATIONS_OFF=["PREFIX_REUSE"]),
    )[0]
    assert "self_check" not in rows[0]["run"]["model"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_joint_scorers_on_the_gpu_give_the_cpus_figures(tmp_path, folders):
    """On CUDA (float32) a generative model with every acceleration (spliced conversations, packed texts, the
    pipeline, the self-check) and BLIP ITM give the CPU's figures to 1e-4, and the plain path's."""
    jsonl = small_input(tmp_path, 3)
    keys = (
        "invariance_error_mean",
        "sensitivity_gap_mean",
        "prior_gap_mean",
        "grounded_gap_mean",
        "invariance_error_rel",
    )
    rows = {}
    for device, off in (("cpu", []), ("cuda", []), ("cuda", ["PREFIX_REUSE"])):
        rows[device, bool(off)] = run_here(
            "run_lgip_multi.py",
            **eval_settings(
                jsonl,
                "corrected",
                specs(folders),
                BOOTSTRAP=0,
                CACHE_DIR=None,
                DEVICE=device,
                DTYPE="fp32",
                ACCELERATIONS_OFF=off,
            ),
        )[0]
    for a, b, c in zip(rows["cpu", False], rows["cuda", False], rows["cuda", True]):
        assert b["run"]["model"]["device"].startswith("cuda")
        for key in keys:
            assert b[key] == pytest.approx(a[key], abs=1e-4) and b[key] == pytest.approx(c[key], abs=1e-4), key
    assert rows["cuda", False][0]["run"]["accelerations"]["TEXT_PACKS"]


def test_the_enhanced_analysis_takes_its_strength_from_the_prior(tmp_path, folders):
    """rebuttal_enhanced: a scorer has no text distance: strength = clip01(prior[type]), said in
    strength_from; the paraphrase kinds' relative errors are there for both kinds of model."""
    name = "rebuttal_enhanced_fixture_with_fliptypes.jsonl"
    lines = open(os.path.join(REFERENCE, name), encoding="utf-8").read().splitlines()[:3]
    jsonl = tmp_path / name
    jsonl.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    rows = run_here(
        "rebuttal_enhanced_lgip_by_transformation.py",
        **eval_settings(jsonl, "corrected", [specs(folders)[1], OPENCLIP_TINY], BOOTSTRAP=0, CACHE_DIR=None),
    )[0]
    assert [r["strength_from"] for r in rows] == ["prior", "text_distance"]
    for r in rows:
        assert r["paraphrase_simple_inv_error_rel"] is not None and r["paraphrase_advanced_inv_error_rel"] is not None
    strengths = rows[0]["corrected"]["global_strength"]
    from rebuttal_enhanced_lgip_by_transformation import PRIORS

    assert min(PRIORS.values()) <= strengths["strength_mean"] <= max(PRIORS.values())


@pytest.mark.parametrize(
    "bad,message",
    [
        ({"score": "logprobs"}, "unknown score 'logprobs'; valid: logprob, logprob_mean, vqascore"),
        ({"prompt": ""}, "'prompt' must be a non-empty string"),
        ({"question": "Is it {} or {}?"}, "'question' must hold the caption's place as one {}"),
        ({"promt": "Say."}, "unknown key 'promt'; did you mean 'prompt'?"),
    ],
)
def test_a_bad_spec_is_named_before_any_work(tmp_path, folders, bad, message):
    import common

    jsonl = small_input(tmp_path, 2)
    with pytest.raises(
        common.ConfigError, match=message.replace("(", r"\(").replace("?", r"\?").replace("{}", r"\{\}")
    ):
        run_here("run_lgip_multi.py", **eval_settings(jsonl, "corrected", specs(folders, **bad)[:1]))
    with pytest.raises(common.ConfigError, match=r"PRIOR_IMAGES must be an int >= 1"):
        run_here("run_lgip_multi.py", **eval_settings(jsonl, "corrected", specs(folders)[1:], PRIOR_IMAGES=0))


def test_a_model_of_the_wrong_kind_a_missing_template_and_a_long_caption_are_named(tmp_path, folders):
    import common
    from conftest import SIGLIP_TINY

    jsonl = small_input(tmp_path, 2)
    wrong = {"name": "clip_as_vlm", "type": "generative", "model_id": SIGLIP_TINY["model_id"]}
    with pytest.raises(
        common.ModelError,
        match=r"is not a generative image-text model .*a dual encoder is type "
        r"'transformers', a BLIP matching head type 'itm'",
    ):
        run_here("run_lgip_multi.py", **eval_settings(jsonl, "corrected", [wrong], CACHE_DIR=None))
    with pytest.raises(common.ModelError, match=r"has no image-text matching head that type 'itm' reads"):
        run_here("run_lgip_multi.py", **eval_settings(jsonl, "corrected", [dict(wrong, type="itm")], CACHE_DIR=None))
    no_template = tmp_path / "no_template"
    shutil.copytree(folders["llava"], no_template)
    for name in os.listdir(no_template):
        if "chat_template" in name:
            os.remove(no_template / name)
    config = json.load(open(no_template / "processor_config.json"))
    config.pop("chat_template", None)
    json.dump(config, open(no_template / "processor_config.json", "w"))
    with pytest.raises(common.ModelError, match=r"model 'llava' .*its processor has no chat template"):
        run_here(
            "run_lgip_multi.py",
            **eval_settings(jsonl, "corrected", [dict(specs(folders)[0], model_id=str(no_template))], CACHE_DIR=None),
        )
    long = small_input(tmp_path, 2)
    recs = [json.loads(line) for line in open(long, encoding="utf-8")]
    recs[0]["orig_captions"][0] = " ".join(["a red bus"] * 120)
    long.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    with pytest.raises(common.ModelError, match=r"more than the model's context \(256\)"):
        run_here("run_lgip_multi.py", **eval_settings(long, "corrected", specs(folders)[:1], CACHE_DIR=None))


def test_steps_that_need_embeddings_leave_scorers_out_in_a_line(tmp_path, folders):
    """Retrieval (and explain_flips) leave a joint scorer out with one line; with a dual encoder beside it,
    that one runs; with scorers alone, nothing is written and the step returns None."""
    name = "fixture_with_fliptypes.jsonl"
    jsonl = tmp_path / name
    jsonl.write_text("".join(open(os.path.join(REFERENCE, name), encoding="utf-8").readlines()[:3]), encoding="utf-8")
    rows, out, _ = run_here(
        "run_lgip_retrieval.py",
        **eval_settings(jsonl, "corrected", specs(folders) + [OPENCLIP_TINY], CACHE_DIR=None, BOOTSTRAP=0),
    )
    assert [r["model_tag"] for r in rows] == ["tiny_openclip"]
    assert "run_lgip_retrieval.py: model 'llava' (type 'generative') is left out" in out
    before = set(os.listdir(tmp_path))
    got, out, _ = run_here(
        "explain_flips.py",
        JSONL_PATH=str(jsonl),
        IMAGE_ROOT=FIXTURES,
        DEVICE="cpu",
        NUM_WORKERS=0,
        MODELS=specs(folders),
        N_FLIPS=2,
    )
    assert got == [] and set(os.listdir(tmp_path)) == before and "nothing written" in out


def test_the_image_side_scores_each_altered_image_with_its_captions(tmp_path, folders):
    """run_lgip_images.py with a joint scorer (LGIP_SPEC.md 13): each pair's s(altered image, caption), the
    altered image made as section 11 makes it, equals the model run on it (restated); its figures are
    those pairs' means; no text-to-image search (said, and noted per kind); a re-run reads every score
    from the cache without the weights."""
    from transformers import AutoImageProcessor, AutoProcessor, BlipForImageTextRetrieval
    from lgip.alterations import alter, flip_offset, partner
    from lgip.models import itm

    name = "fixture_with_fliptypes.jsonl"
    jsonl = tmp_path / name
    jsonl.write_text("".join(open(os.path.join(REFERENCE, name), encoding="utf-8").readlines()[:4]), encoding="utf-8")
    blip = specs(folders)[1]
    settings = eval_settings(jsonl, "corrected", [blip], BOOTSTRAP=0, KINDS=["jpeg", "crop", "mix"])
    rows, out, _ = run_here("run_lgip_images.py", **settings)
    m = rows[0]
    assert "blip: scores a pair jointly: its image paraphrase and flip figures only" in out
    assert (
        m["by_kind"]["mix"]["note"].startswith("no text-to-image search")
        and "t2i_flip_top1_rate" not in m["by_kind"]["mix"]
    )
    model = BlipForImageTextRetrieval.from_pretrained(folders["blip"]).eval()
    processor = AutoProcessor.from_pretrained(folders["blip"])
    processor.image_processor = AutoImageProcessor.from_pretrained(folders["blip"], use_fast=False)
    records = [json.loads(line) for line in open(jsonl, encoding="utf-8")]
    images = [Image.open(os.path.join(FIXTURES, r["image_path"])).convert("RGB") for r in records]
    offset = flip_offset(len(records), 0)
    errs, gaps = [], []
    for line in open(tmp_path / m["scores_file"], encoding="utf-8"):
        row = json.loads(line)
        k, caption = row["line"] - 1, row["caption"]
        assert row["sim"] == pytest.approx(itm.plain_scores(model, processor, images[k], [caption])[0], abs=1e-4)
        for item in row.get("image_paraphrases", []) + row.get("image_flips", []):
            other = images[partner(k, len(records), offset)] if item["text"] == "mix" else None
            made = alter(images[k], item["text"], other, 0, k)
            assert item["sim"] == pytest.approx(itm.plain_scores(model, processor, made, [caption])[0], abs=1e-4)
            (gaps if item["text"] == "mix" else errs).append(row["sim"] - item["sim"])
    assert m["image_invariance_error_mean"] == pytest.approx(np.mean(np.abs(errs)), abs=1e-5)
    assert m["image_sensitivity_gap_mean"] == pytest.approx(np.mean(gaps), abs=1e-5)
    again = run_here("run_lgip_images.py", **settings)[0][0]
    assert again["run"]["model"]["weights_loaded"] is False
    assert again["image_invariance_error_mean"] == pytest.approx(m["image_invariance_error_mean"], abs=1e-9)


def test_a_changed_prompt_or_score_never_reuses_a_stale_score(tmp_path, folders):
    """The cache's identity holds the settings a score depends on (LGIP_SPEC.md 13): another prompt or score
    kind finds no entry of the first run's (and scores anew); the same settings again find them all."""
    jsonl = small_input(tmp_path, 2)

    def pairs(**llava):
        row = run_here(
            "run_lgip_multi.py", **eval_settings(jsonl, "corrected", specs(folders, **llava)[:1], BOOTSTRAP=0)
        )[0][0]
        return row["run"]["cache"]["resumed"]["pairs"], row["run"]["cache"]["dir"]

    (hits, n), first = pairs()
    assert hits == 0 and n > 0
    (hits, n), other = pairs(prompt="What is in the picture?")
    assert hits == 0 and other != first
    (hits, n), third = pairs(score="logprob_mean")
    assert hits == 0 and third not in (first, other)
    (hits, n), again = pairs(prompt="Describe the image in one sentence.")  # (the default, given: the same scores)
    assert hits == n and again == first


def test_a_score_that_is_not_finite_stops_before_any_output(tmp_path, folders, monkeypatch):
    """A NaN score (a model that overflowed) is a ModelError naming the text, before any metrics or score
    file is written: a NaN gap would count as not positive."""
    import common
    from lgip.models import generative, joint

    jsonl = small_input(tmp_path, 2)
    real = joint.JointModel.submit
    monkeypatch.setattr(
        joint.JointModel,
        "submit",
        lambda self, image, texts: generative.Pending(
            [float("nan") if t.startswith("A red bus") else v for t, v in zip(texts, real(self, image, texts).result())]
        ),
    )
    with pytest.raises(
        common.ModelError,
        match=r"model 'blip': \d+ image-text scores are not finite \(NaN or inf; "
        r"first text: 'A red bus",
    ):
        run_here("run_lgip_multi.py", **eval_settings(jsonl, "corrected", specs(folders)[1:], CACHE_DIR=None))
    assert not list(tmp_path.glob("*.metrics.json")) and not list(tmp_path.glob("*.scores.jsonl"))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_joint_switch_declared_bit_exact_gives_the_same_pair_entries_bit_for_bit(tmp_path, folders, dtype):
    """EXACT_DTYPES' claims for the switches that act on a joint model's pair scores (lgip.cache leaves them out
    of its identity): each off gives every cached pair score bit for bit, at each dtype a CPU runs."""
    import glob

    import numpy as np

    from lgip import accelerations
    from lgip.models import FAMILIES

    jsonl = small_input(tmp_path, 2)
    acting = FAMILIES["generative"].accelerations
    claimed = [n for n in acting if dtype in accelerations.EXACT_DTYPES[n]]
    assert "CONVERSATION_SPLICE" in claimed

    def entries(off):
        cache = tmp_path / f"cache_{'_'.join(off) or 'on'}_{dtype}"
        settings = dict(BOOTSTRAP=0, DTYPE=dtype, CACHE_DIR=str(cache), ACCELERATIONS_OFF=off)
        run_here("run_lgip_multi.py", **eval_settings(jsonl, "corrected", specs(folders)[:1], **settings))
        out = {}
        for chunk in glob.glob(str(cache / "llava-*" / "pair-*.npz")):
            with np.load(chunk) as z:
                out.update(zip(json.loads(bytes(z["keys"]).decode()), (r.tobytes() for r in z["emb"])))
        return out

    on = entries([])
    assert on
    for name in claimed:
        assert entries([name]) == on, name
