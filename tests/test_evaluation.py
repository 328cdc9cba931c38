"""The three evaluation scripts against the published metrics (reference protocol, tiny models)."""

import dataclasses
import json
import math
import os
import shutil

import pytest

from conftest import CASES, OPENCLIP_TINY, REFERENCE, eval_args, eval_settings, run_here, run_script

TOL = 1e-6


def assert_matches(ours, ref, path="$", tol=TOL):
    """Every field of the published output is present in ours, equal (numbers within `tol`), same key order."""
    if isinstance(ref, dict):
        assert isinstance(ours, dict), path
        assert [k for k in ours if k in ref] == list(ref), f"{path}: key order"
        for k in ref:
            assert k in ours, f"{path}.{k} missing"
            assert_matches(ours[k], ref[k], f"{path}.{k}", tol)
    elif isinstance(ref, list):
        assert isinstance(ours, list) and len(ours) == len(ref), path
        for i, (a, b) in enumerate(zip(ours, ref)):
            assert_matches(a, b, f"{path}[{i}]", tol)
    elif isinstance(ref, float):
        assert isinstance(ours, (int, float)) and math.isclose(ours, ref, rel_tol=0, abs_tol=tol), (
            f"{path}: {ours} != {ref}"
        )
    else:
        assert ours == ref and type(ours) is type(ref), f"{path}: {ours!r} != {ref!r}"


@pytest.mark.parametrize("script,jsonl,outputs", CASES)
def test_reference_protocol_reproduces_published_metrics(reference_runs, script, jsonl, outputs):
    folder, _ = reference_runs[script]
    for name in outputs:
        ours = json.load(open(folder / name))
        assert_matches(ours, json.load(open(os.path.join(REFERENCE, name))))


def _same_as_global_block(row):
    """run_lgip_multi's names for the overall figures, beside run_lgip_by_fliptype's published block."""
    g = row["global_sensitivity"]
    for key in ("gap_mean", "gap_mean_ci95", "pos_rate", "pos_rate_ci95"):
        assert row["sensitivity_" + key] == g[key], key
    keys = list(row)
    assert keys.index("global_sensitivity") + 1 == keys.index("sensitivity_gap_mean")  # (beside it)


def test_fliptype_rows_name_the_overall_figures_as_run_lgip_multi_does(reference_runs, tmp_path):
    """sensitivity_pos_rate and sensitivity_gap_mean (and their intervals) in run_lgip_by_fliptype's rows, equal
    to the published global_sensitivity block beside them, in both protocols: one key reads both scripts' rows."""
    folder, (rows, _, _) = reference_runs["run_lgip_by_fliptype.py"]
    for row in rows + json.load(open(folder / "fixture_with_fliptypes__LGIP_fliptypes.metrics.json")):
        _same_as_global_block(row)
        assert row["sensitivity_pos_rate_ci95"] is not None
    src = shutil.copy(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"), tmp_path / "f_with_fliptypes.jsonl")
    settings = eval_settings(src, "corrected", models=[OPENCLIP_TINY], BOOTSTRAP=20, WRITE_SCORES=False)
    corrected, _, _ = run_here("run_lgip_by_fliptype.py", **settings)
    _same_as_global_block(corrected[0])
    assert corrected[0]["sensitivity_pos_rate"] is not None


@pytest.mark.parametrize("script,jsonl,outputs", CASES)
def test_outputs_record_configuration_and_versions(reference_runs, script, jsonl, outputs):
    folder, _ = reference_runs[script]
    data = json.load(open(folder / outputs[0]))
    for m in data if isinstance(data, list) else [data]:
        run = m["run"]
        assert run["config"]["PROTOCOL"] == "reference" and run["config"]["DEVICE"] == "cpu"
        assert run["config"]["TEXT_BATCH_SIZE"] == "auto" and run["text_batch_size"] == 64  # "auto" on CPU
        assert len(run["config"]["MODELS"]) == 2
        phases = run["seconds_by_phase"]
        assert list(phases) == [
            "load",
            "pairs",
            "lookahead_wait",
            "lookup_and_tokenize",
            "start_tokenizers",
            "start_images",
            "texts",
            "images_after_texts",
            "scoring",
            "metrics_and_scores_file",
        ]
        assert min(phases.values()) >= 0 and sum(phases.values()) <= run["seconds"] + 0.01  # parts of the model's time
        assert run["config"]["LOOKAHEAD"] is True and "lookahead" in run  # (NUM_WORKERS=0 here: nothing done ahead)
        assert run["model"]["dtype"] == "float32" and run["model"]["protocol"] == "reference"
        assert {"torch", "open_clip_torch", "transformers"} <= set(run["versions"])
        assert run["num_failed_images"] == 0 and run["num_records_in_file"] == 12


def test_enhanced_corrected_fields(reference_runs):
    folder, _ = reference_runs["rebuttal_enhanced_lgip_by_transformation.py"]
    for m in json.load(open(folder / CASES[2][2][0])):
        c = m["corrected"]
        assert m["num_samples"] == 1 and c["num_records"] == 12  # published count is of 32-record batches
        assert m["global_sensitivity"]["count"] == 154 and c["global_sensitivity"]["count"] == 77
        assert "all" not in c["error_type_stats"]
        assert sum(v["overall"]["count"] for v in c["error_type_stats"].values()) == 77
        combined = c["combined"]
        assert combined["global_sensitivity"]["count"] > 0
        assert set(combined["error_type_stats"]) <= {"para+color", "para+number", "para+object"}


def test_corrected_protocol_siglip_independent_of_text_batch_size(tmp_path):
    from conftest import SIGLIP_TINY

    src = tmp_path / "in.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), src)
    results = []
    for bs in (1, 7, 512):
        run_here("run_lgip_multi.py", **eval_settings(src, "corrected", [SIGLIP_TINY], TEXT_BATCH_SIZE=bs))
        results.append(json.load(open(tmp_path / "in__LGIP_ALL.metrics.json"))[0])
    for key in ("invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate"):
        assert max(r[key] for r in results) - min(r[key] for r in results) < 1e-6
    assert results[0]["run"]["model"]["text_length"] == 64


def test_siglip_sanity_check_shows_both_protocols(tmp_path):
    from conftest import FIXTURES, SIGLIP_TINY

    src = tmp_path / "in.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"), src)
    proc = run_script(
        "siglip_sanity_check.py",
        f"--JSONL_PATH={src}",
        f"--IMAGE_ROOT={FIXTURES}",
        f"--MODEL={SIGLIP_TINY!r}",
        "--N_RECORDS=4",
        "--DEVICE=cpu",
    )
    out = json.load(open(tmp_path / "in__siglip_sanity.json"))
    captions = [r for r in out["rows"] if not r["is_flip"]]
    flips = [r for r in out["rows"] if r["is_flip"]]
    assert len(captions) == 4 and 4 <= len(flips) <= 20
    assert all(-1 <= r["sim_corrected"] <= 1 and -1 <= r["sim_reference"] <= 1 for r in out["rows"])
    assert any(abs(r["sim_corrected"] - r["sim_reference"]) > 1e-3 for r in out["rows"])
    assert "corrected:" in proc.stdout and "reference:" in proc.stdout and "flip: " in proc.stdout
    assert out["run"]["config"]["N_RECORDS"] == 4


def test_siglip_sanity_check_encodes_images_by_each_protocols_model(tmp_path):
    """MODEL may be any model: one trained with QuickGELU (a checkpoint named openai*) is built with it
    when corrected and as published (GELU) when reference, both towers; each column's images are that
    build's. Restated with open_clip directly: the caption's similarity under each build."""
    import subprocess
    import sys

    import open_clip
    import torch
    from PIL import Image
    from conftest import FIXTURES, ROOT

    tiny = os.path.join(FIXTURES, "models", "openclip-tiny")
    config = tmp_path / "lgip-tiny-quick.json"  # (open_clip names an added config after its file)
    config.write_text(json.dumps(json.load(open(os.path.join(tiny, "open_clip_config.json")))["model_cfg"]))
    weights = tmp_path / "openai_tiny.bin"
    shutil.copy(os.path.join(tiny, "open_clip_pytorch_model.bin"), weights)
    spec = {"name": "quick", "type": "openclip", "model_name": "lgip-tiny-quick", "pretrained": str(weights)}
    src = tmp_path / "in.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"), src)
    argv = [
        "siglip_sanity_check.py",
        f"--JSONL_PATH={src}",
        f"--IMAGE_ROOT={FIXTURES}",
        f"--MODEL={spec!r}",
        "--N_RECORDS=2",
        "--DEVICE=cpu",
    ]
    code = (
        f"import sys, runpy, open_clip; open_clip.add_model_config({str(config)!r}); sys.argv = {argv!r}; "
        f"runpy.run_path('siglip_sanity_check.py', run_name='__main__')"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [r for r in json.load(open(tmp_path / "in__siglip_sanity.json"))["rows"] if not r["is_flip"]]
    assert len(rows) == 2
    open_clip.add_model_config(str(config))
    for column, quick in (("sim_corrected", True), ("sim_reference", False)):
        model, _, preprocess = open_clip.create_model_and_transforms(
            "lgip-tiny-quick", pretrained=str(weights), force_quick_gelu=quick
        )
        model.eval()
        tokenizer = open_clip.get_tokenizer("lgip-tiny-quick")
        for r in rows:
            with torch.no_grad():
                image = model.encode_image(
                    preprocess(Image.open(os.path.join(FIXTURES, r["image_path"])).convert("RGB"))[None]
                )
                text = model.encode_text(tokenizer([r["text"]]))
            want = torch.nn.functional.cosine_similarity(image, text).item()
            assert abs(r[column] - want) < 1e-5, (column, r["text"], r[column], want)
    assert any(abs(r["sim_corrected"] - r["sim_reference"]) > 1e-4 for r in rows)


def _fixture_lines(name):
    return open(os.path.join(REFERENCE, name), encoding="utf-8").read().splitlines()


def test_records_without_captions_and_repeated_images_are_counted(tmp_path):
    """A record without captions is skipped and said; a repeated image_path is kept (the published
    scripts count it) but warned and recorded in the run block."""
    from conftest import OPENCLIP_TINY

    lines = _fixture_lines("fixture_with_perturb.jsonl")[:4]
    empty = json.loads(lines.pop())
    empty.update(orig_captions=[], same_caps={}, diff_caps={})
    src = tmp_path / "x.jsonl"
    src.write_text("\n".join(lines + [json.dumps(empty), lines[1]]) + "\n")
    _, stdout, _ = run_here(
        "run_lgip_multi.py", **eval_settings(src, models=[OPENCLIP_TINY], BOOTSTRAP=0, WRITE_SCORES=False)
    )
    assert f"warning: {src}: 1 record(s) without captions, skipped (lines 4)" in stdout
    assert f"warning: {src}: 1 record(s) repeat an earlier record's image_path (lines 5)" in stdout
    assert "(4 records, 0 unreadable images, 1 without captions (skipped)," in stdout
    m = json.load(open(tmp_path / "x__LGIP_ALL.metrics.json"))[0]
    assert m["num_samples"] == 4
    assert m["run"]["num_records_without_captions"] == 1 and m["run"]["records_without_captions_lines"] == [4]
    assert m["run"]["num_duplicate_image_paths"] == 1 and m["run"]["duplicate_image_path_lines"] == [5]


def test_a_run_with_no_usable_record_fails_before_writing_metrics(tmp_path):
    from conftest import OPENCLIP_TINY

    src = tmp_path / "x.jsonl"
    src.write_text("\n".join(_fixture_lines("fixture_with_perturb.jsonl")[:2]) + "\n")
    (tmp_path / "noimages").mkdir()
    proc = run_script(
        "run_lgip_multi.py",
        *eval_args(src, models=[OPENCLIP_TINY], image_root=tmp_path / "noimages", BOOTSTRAP=0, CACHE_DIR=None),
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"no usable records: 2 in {src}, 2 unreadable images (first: {tmp_path / 'noimages'}/" in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["noimages", "x.jsonl"]  # no metrics, no score file
    # an empty or blank-only file: before any model is loaded (this one could not be)
    src.write_text("\n  \n")
    missing = {"name": "nowhere", "type": "openclip", "model_name": "local-dir:" + str(tmp_path / "nowhere")}
    for path in (src, tmp_path / "empty.jsonl"):
        path.write_text("\n  \n")
        proc = run_script("run_lgip_multi.py", *eval_args(path, models=[missing]), check=False)
        assert proc.returncode == 2 and f"no usable records: 0 in {path} (the file is empty" in proc.stderr


@pytest.mark.parametrize("script", ["run_lgip_multi.py", "rebuttal_enhanced_lgip_by_transformation.py"])
def test_evaluation_input_of_the_wrong_kind_or_a_folder_is_said(tmp_path, script):
    from conftest import OPENCLIP_TINY

    proc = run_script(script, *eval_args(tmp_path, models=[OPENCLIP_TINY]), check=False)
    assert proc.returncode == 2 and f"{tmp_path}: is a directory, expected a JSONL file" in proc.stderr
    if script.startswith("rebuttal"):  # a _with_perturb file: no combined_caps
        src = shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), tmp_path / "p.jsonl")
        proc = run_script(script, *eval_args(src, models=[OPENCLIP_TINY]), check=False)
        assert (
            proc.returncode == 2
            and (
                f"{src}:1: missing field 'combined_caps': this script reads the output of "
                f"rebuttal_enhanced_perturb_with_fliptypes.py"
            )
            in proc.stderr
        )
    else:  # a caption-keyed field with keys that are no caption index: an error, not 30 pairs lost
        lines = _fixture_lines("fixture_with_perturb.jsonl")[:3]
        rec = json.loads(lines[2])
        rec["diff_caps"]["7"] = rec["diff_caps"].pop("4")
        src = tmp_path / "k.jsonl"
        src.write_text("\n".join(lines[:2] + [json.dumps(rec)]) + "\n")
        proc = run_script(script, *eval_args(src, models=[OPENCLIP_TINY]), check=False)
        assert proc.returncode == 2 and f"{src}:3: field 'diff_caps' has key '7', not a caption index" in proc.stderr
        rec["diff_caps"]["4"] = rec["diff_caps"].pop("7")
        rec["same_caps"]["1"] = ["A bus \ud800"]  # written with ensure_ascii: the escape, no UTF-8 could hold it
        src.write_text("\n".join(lines[:2] + [json.dumps(rec)]) + "\n")
        proc = run_script(script, *eval_args(src, models=[OPENCLIP_TINY]), check=False)
        assert proc.returncode == 2 and f"{src}:3: field 'same_caps.1[0]' holds a lone UTF-16 surrogate" in proc.stderr


def test_a_tie_is_not_positive(tmp_path):
    """A flip scored exactly as its caption (here: the same text, so the same embedding) is no
    evidence either way: gap 0, counted not positive (section 4: gap > 0), in the published figures,
    the text-prior controls (grounded gap 0) and per flip type. (Under the reference protocol SigLIP
    pads a text to its call's longest, so the caption and the same text as a flip differ: no tie.)"""
    from conftest import OPENCLIP_TINY, SIGLIP_TINY

    records = [json.loads(line) for line in _fixture_lines("fixture_with_fliptypes.jsonl")[:3]]
    for r in records:
        caption = r["orig_captions"][0]
        for key in [k for k in r if k.startswith("diff_caps")]:
            r[key] = {"0": [caption]} if key in ("diff_caps", "diff_caps_color") else {}
    src = tmp_path / "tie_with_fliptypes.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    for protocol, models in (("corrected", [OPENCLIP_TINY, SIGLIP_TINY]), ("reference", [OPENCLIP_TINY])):
        multi, _, _ = run_here(
            "run_lgip_multi.py", **eval_settings(src, protocol, models, BOOTSTRAP=0, CACHE_DIR=None, WRITE_SCORES=False)
        )
        typed, _, _ = run_here(
            "run_lgip_by_fliptype.py",
            **eval_settings(src, protocol, models, BOOTSTRAP=0, CACHE_DIR=None, WRITE_SCORES=False),
        )
        for m in multi:
            assert (m["sensitivity_gap_mean"], m["sensitivity_pos_rate"]) == (0.0, 0.0), (protocol, m["model_tag"])
            assert (m["grounded_gap_mean"], m["grounded_pos_rate"]) == (0.0, 0.0), (protocol, m["model_tag"])
        for m in typed:
            assert m["global_sensitivity"]["pos_rate"] == 0.0 and m["global_sensitivity"]["gap_mean"] == 0.0, protocol
            assert m["by_flip_type"]["color"]["pos_rate"] == 0.0 and m["by_flip_type"]["color"]["count"] == 3, protocol


def test_images_too_small_and_inputs_with_nothing_to_do_are_said(tmp_path):
    """An image of a side under 8 px is unreadable, skipped and counted, for SigLIP too (its processor
    took a 1-px side for the channels: a traceback for 50x1, a wrong embedding for 100x3); explain_flips
    and siglip_sanity_check on an input without flips stop before any model (they wrote all-n/a outputs
    with exit status 0); a model spec whose model_name is not a string is named."""
    from PIL import Image
    from conftest import FIXTURES, OPENCLIP_TINY, SIGLIP_TINY
    from lgip.errors import InputError, ModelError
    from lgip.models import load_model

    records = [json.loads(line) for line in _fixture_lines("fixture_with_perturb.jsonl")[:4]]
    for k, size in ((1, (50, 1)), (2, (100, 3))):
        Image.new("RGB", size, (200, 10, 10)).save(tmp_path / f"small{k}.png")
        records[k]["image_path"] = str(tmp_path / f"small{k}.png")
    src = tmp_path / "small_with_perturb.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    rows, out, err = run_here(
        "run_lgip_multi.py",
        **eval_settings(
            src, "corrected", [SIGLIP_TINY, OPENCLIP_TINY], BOOTSTRAP=0, CACHE_DIR=None, WRITE_SCORES=False
        ),
    )
    for m in rows:
        assert m["num_samples"] == 2 and m["run"]["num_failed_images"] == 2, m["model_tag"]
    assert "image too small (50x1 px; at least 8 px a side)" in err
    flat = tmp_path / "flat_with_fliptypes.jsonl"
    recs = [json.loads(line) for line in _fixture_lines("fixture_with_fliptypes.jsonl")[:2]]
    for r in recs:
        for key in [k for k in r if k.startswith("diff_caps")]:
            r[key] = {}
    flat.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    with pytest.raises(InputError, match="no flip to explain: 2 records in"):
        run_here("explain_flips.py", JSONL_PATH=str(flat), IMAGE_ROOT=FIXTURES, MODELS=[OPENCLIP_TINY], DEVICE="cpu")
    proc = run_script(
        "siglip_sanity_check.py",
        f"--JSONL_PATH={flat}",
        f"--IMAGE_ROOT={FIXTURES}",
        f"--MODEL={SIGLIP_TINY!r}",
        "--DEVICE=cpu",
        check=False,
    )
    assert proc.returncode == 2 and "no record with a flip (diff_caps)" in proc.stderr, proc.stderr
    assert not [
        p
        for p in os.listdir(tmp_path)
        if p.startswith("flat") and p.endswith((".metrics.json", ".json")) and not p.endswith(".jsonl")
    ]
    with pytest.raises(ModelError, match="model 't': 'model_name' must be a non-empty string, got 5"):
        load_model({"name": "t", "type": "openclip", "model_name": 5}, "corrected", "cpu")


def test_score_returns_what_it_scored_and_an_evaluation_names_what_it_needs(tmp_path, monkeypatch):
    """The seam (lgip.scorers): ModelRun.score hands back a Scored (the pairs with their scores, the
    records read, the counts), which the run block is made from; an evaluation that needs what a
    model's scorer does not give (retrieval: the embeddings) leaves that model out before any data work,
    in one line naming it; with none left it says so, writes nothing and returns None (exit status 0)."""
    import common
    import run_lgip_multi
    from conftest import FIXTURES, OPENCLIP_TINY
    from lgip import scorers as scorer
    from lgip.models import registry

    src = tmp_path / "seam_with_perturb.jsonl"
    src.write_text("".join(line + "\n" for line in _fixture_lines("fixture_with_perturb.jsonl")[:4]), encoding="utf-8")
    config = {
        "JSONL_PATH": str(src),
        "IMAGE_ROOT": FIXTURES,
        "PROTOCOL": "corrected",
        "DEVICE": "cpu",
        "DTYPE": "fp32",
        "IMAGE_BATCH_SIZE": 4,
        "TEXT_BATCH_SIZE": 16,
        "NUM_WORKERS": 0,
        "CACHE_DIR": None,
    }
    records = common.load_records(str(src), ("same_caps", "diff_caps"))
    run = common.ModelRun(OPENCLIP_TINY, records, config)
    scored = run.score(*run.pairs(run_lgip_multi.published_calls), controls=True)
    inv, sens = scored.pairs
    assert isinstance(scored, scorer.Scored) and run.scored is scored and scored.provides == frozenset(scorer.PROVIDES)
    assert scored.n_samples == scored.n_ok == len(scored.ok) == 4 and scored.failed == []
    assert len(inv.base_sim) == len(inv) > 0 and len(sens.prior) == len(sens) > 0
    assert scored.image_embeddings.shape[0] == 4 and scored.text_embeddings is None  # (not asked for)
    assert scored.texts["unique"] == run.info("x")["num_unique_texts_encoded"] > 0

    class ScoresOnly(scorer.PairScorer):  # (a joint scorer, LGIP_SPEC.md 13: no embeddings)
        pass

    monkeypatch.setitem(scorer.SCORERS, "joint", ScoresOnly)
    monkeypatch.setitem(
        registry.FAMILIES, "openclip", dataclasses.replace(registry.FAMILIES["openclip"], scorer="joint")
    )
    got, out, _ = run_here(
        "run_lgip_retrieval.py", **eval_settings(tmp_path / "absent.jsonl", "corrected", [OPENCLIP_TINY])
    )
    assert got is None and not list(tmp_path.glob("*retrieval*")), out
    lines = out.splitlines()
    assert (
        "run_lgip_retrieval.py: model 'tiny_openclip' (type 'openclip') is left out: its scorer gives no "
        "embeddings, which this step needs" in lines
    )
    assert any("every model of MODELS is left out" in line and "nothing written" in line for line in lines)
