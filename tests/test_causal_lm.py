"""Type "causal_lm" (lgip/models/causal_lm.py) and scorer kind "text" (lgip/scorers/text.py), LGIP_SPEC.md 15: a
text-only model is one module and one record. A tiny random-init GPT-2 (its tokenizer trained on the fixture
captions) scores a text by its log-likelihood exactly as one plain forward of that text alone does, whatever the
batching or padding; it runs as a blind model through the evaluations (its figures its text prior's, a cached
re-run with no weights) and as blind_audit.py's lm:<name> scorer."""

import json
import math
import shutil

import pytest

from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, eval_settings, run_here
from tiny_vlm import caption_tokenizer


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("gpt2")
    tok = caption_tokenizer(["<|endoftext|>"])
    tok.eos_token = tok.bos_token = "<|endoftext|>"
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return {"name": "gpt2_tiny", "type": "causal_lm", "model_id": str(folder)}


def _plain(spec, text, mean=False):
    """log P(text) by one forward of [BOS] + its ids alone, in float64 from the float32 logits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(spec["model_id"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_id"]).eval()
    ids = [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].double(), -1)
    total = sum(logp[p, ids[p + 1]].item() for p in range(len(ids) - 1))
    return total / (len(ids) - 1) if mean else total


def test_a_texts_score_is_one_plain_forward_whatever_the_batching(tiny_gpt2):
    from lgip.models import load_model

    texts = ["a red bus", "A red bus parked on the side of the street.", "two dogs", "", "a cat on a couch near it"]
    enc = load_model(tiny_gpt2, "corrected", "cpu", "fp32")
    for batch in (1, 2, 5):
        got = enc.score_texts(texts, batch)
        for t, g in zip(texts, got):
            assert g == pytest.approx(_plain(tiny_gpt2, t), abs=1e-4), (batch, t)
    mean = load_model(dict(tiny_gpt2, score="logprob_mean"), "corrected", "cpu", "fp32")
    assert mean.score_texts(texts[1:2])[0] == pytest.approx(_plain(tiny_gpt2, texts[1], mean=True), abs=1e-4)
    with pytest.raises(Exception, match="score must be one of logprob, logprob_mean"):
        load_model(dict(tiny_gpt2, score="nll"), "corrected", "cpu", "fp32")


def test_a_text_model_runs_through_the_evaluations_as_a_blind_model(tmp_path, tiny_gpt2):
    src = tmp_path / "x_with_perturb.jsonl"
    shutil.copy(REFERENCE + "/fixture_with_perturb.jsonl", src)
    (row,), _, _ = run_here("run_lgip_multi.py", **eval_settings(src, "corrected", [tiny_gpt2], BOOTSTRAP=0))
    first = json.loads(open(src, encoding="utf-8").readline())
    cap, para = first["orig_captions"][0], first["same_caps"]["0"][0]
    lines = [json.loads(x) for x in open(tmp_path / "x_with_perturb__LGIP_gpt2_tiny.scores.jsonl", encoding="utf-8")]
    assert lines[0]["sim"] == pytest.approx(_plain(tiny_gpt2, cap), abs=1e-4)
    assert lines[0]["paraphrases"][0]["sim"] == pytest.approx(_plain(tiny_gpt2, para), abs=1e-4)
    assert row["score_kind"] == "logprob" and row["model_card"]["params_image"] == 0
    again, out, _ = run_here("run_lgip_multi.py", **eval_settings(src, "corrected", [tiny_gpt2], BOOTSTRAP=0))
    assert again[0]["invariance_error_mean"] == row["invariance_error_mean"]  # (from the cache ...)
    assert again[0]["run"]["model"]["weights_loaded"] is False  # (... with no weights)
    hits, looked = again[0]["run"]["cache"]["resumed"]["texts"]  # (lgip.scorers.cached: every text, said)
    assert hits == looked > 0 and row["run"]["cache"]["resumed"] == {"texts": [0, looked]}
    assert f"gpt2_tiny: from the cache: {hits:,} of {looked:,} texts" in out
    got, out, _ = run_here("run_lgip_retrieval.py", **eval_settings(src, "corrected", [tiny_gpt2]))
    assert got is None and "model 'gpt2_tiny' (type 'causal_lm') is left out: it reads no image" in out


def test_blind_audits_lm_scorer_and_a_models_prior(tmp_path, tiny_gpt2):
    from lgip.errors import InputError

    src = tmp_path / "fixture_with_fliptypes.jsonl"
    shutil.copy(REFERENCE + "/fixture_with_fliptypes.jsonl", src)
    m, _, _ = run_here("blind_audit.py", JSONL_PATH=str(src), SCORERS=["length", tiny_gpt2], DEVICE="cpu", BOOTSTRAP=0)
    assert "lm:gpt2_tiny" in m["by_scorer"] and m["scorers"][1]["kind"] == "lm"
    line = json.loads(open(tmp_path / "fixture_with_fliptypes__LGIP_blind.gaps.jsonl", encoding="utf-8").readline())
    want = _plain(tiny_gpt2, line["caption"]) - _plain(tiny_gpt2, line["flip"])
    assert math.isclose(line["gaps"]["lm:gpt2_tiny"], want, abs_tol=2e-4)
    with pytest.raises(InputError, match=r"prior:tiny_openclip: no score file (?s:.*)run_lgip_by_fliptype.py"):
        run_here("blind_audit.py", JSONL_PATH=str(src), SCORERS=["prior:tiny_openclip"])
    run_here("run_lgip_by_fliptype.py", **eval_settings(src, "corrected", [OPENCLIP_TINY], IMAGE_ROOT=FIXTURES))
    m, _, _ = run_here("blind_audit.py", JSONL_PATH=str(src), SCORERS=["prior:tiny_openclip"], BOOTSTRAP=0)
    scores = tmp_path / "fixture_with_fliptypes__LGIP_fliptypes_tiny_openclip.scores.jsonl"
    first = json.loads(open(scores, encoding="utf-8").readline())
    gaps = [json.loads(x) for x in open(tmp_path / "fixture_with_fliptypes__LGIP_blind.gaps.jsonl", encoding="utf-8")]
    mine = [g for g in gaps if g["line"] == first["line"] and g["caption_index"] == first["caption_index"]]
    assert [g["gaps"]["prior:tiny_openclip"] for g in mine] == [
        round(f["prior_gap"], 9) for t in m["types"] for f in first["flips"] if f["type"] == t
    ]
    assert m["by_scorer"]["prior:tiny_openclip"]["all"]["scored"] == m["num_pairs"]


def test_run_all_with_a_text_model_ends_with_a_page_the_report_reads_it_as_a_control(tmp_path, tiny_gpt2):
    """Issue 62: a blind model given to run_all beside the demo model: every step that needs images, altered images,
    embeddings or attributions leaves it out in one line; the evaluations that score pairs give it a row, which
    report.py reads (params_image 0 accepted: the row says it reads no image) and marks as a text-prior control."""
    from conftest import run_script
    from test_run_all import demo_inputs

    folder = demo_inputs(tmp_path / "demo")
    proc = run_script(
        "run_all.py",
        f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}",
        "--DATA=demo",
        f"--MODELS={['demo', tiny_gpt2]!r}",
        "--DEVICE=cpu",
        "--NUM_WORKERS=0",
    )
    assert (folder / "lgip_demo__LGIP_report.html").is_file(), proc.stdout
    for script, needs in (("run_lgip_retrieval", "embeddings"), ("explain_flips", "attributions")):
        want = f"{script}.py: model 'gpt2_tiny' (type 'causal_lm') is left out: it reads no image and gives no {needs}"
        assert want in proc.stdout
    assert "run_lgip_images.py: model 'gpt2_tiny' (type 'causal_lm') is left out" in proc.stdout
    rows = {}
    for name in (
        "lgip_demo_with_perturb__LGIP_ALL.metrics.json",
        "lgip_demo_with_fliptypes__LGIP_fliptypes.metrics.json",
    ):
        row = next(r for r in json.load(open(folder / name, encoding="utf-8")) if r["model_tag"] == "gpt2_tiny")
        assert row["reads_images"] is False and row["model_card"]["params_image"] == 0
        rows[name] = row
    for name in ("LGIP_retrieval", "LGIP_images", "LGIP_explain"):
        tags = [r["model_tag"] for r in json.load(open(folder / f"lgip_demo_with_fliptypes__{name}.metrics.json"))]
        assert tags == ["demo_tiny_random"]
    md = open(folder / "lgip_demo__LGIP_report.md", encoding="utf-8").read()
    assert (
        "| gpt2_tiny (logprob) [text] |" in md
        and "Text-prior control: `gpt2_tiny` (marked [text]) reads no image" in md
    )
    again = run_script("report.py", f"--JSONL_PATH={folder / 'lgip_demo.jsonl'}")  # (report.py alone reads them again)
    assert again.returncode == 0
    # a dual encoder's row with params_image 0 is still refused, naming the rule
    path = folder / "lgip_demo_with_perturb__LGIP_ALL.metrics.json"
    data = json.load(open(path, encoding="utf-8"))
    data[0]["model_card"]["params_image"] = 0
    json.dump(data, open(path, "w", encoding="utf-8"))
    bad = run_script("report.py", f"--JSONL_PATH={folder / 'lgip_demo.jsonl'}", check=False)
    assert bad.returncode == 2 and "0 only in the row of a model that reads no image" in bad.stderr


def test_the_audits_lm_scores_come_through_the_cache_and_a_prior_file_is_found_beside_the_input(tmp_path, tiny_gpt2):
    """Issue 62: blind_audit.py's lm:<name> scores through the model's scorer and cache (CACHE_DIR "auto", the
    evaluations' own): a re-run reads every text from the cache, loads no weights and says so in the wrapper's
    line, with the same gaps. prior:<tag> reads its score file in OUTPUT_DIR, else beside the input; missing from
    both, the error names both paths and the command."""
    from lgip.errors import InputError

    src = tmp_path / "fixture_with_fliptypes.jsonl"
    shutil.copy(REFERENCE + "/fixture_with_fliptypes.jsonl", src)
    settings = dict(JSONL_PATH=str(src), SCORERS=[tiny_gpt2], DEVICE="cpu", BOOTSTRAP=0)
    first, out, _ = run_here("blind_audit.py", **settings)
    gaps = open(tmp_path / "fixture_with_fliptypes__LGIP_blind.gaps.jsonl", encoding="utf-8").read()
    assert "from the cache" not in out and list((tmp_path / ".lgip_cache").glob("gpt2_tiny-*"))
    again, out, _ = run_here("blind_audit.py", **settings)
    assert "gpt2_tiny: from the cache: " in out and "(all of them: the model's weights were not loaded)" in out
    assert open(tmp_path / "fixture_with_fliptypes__LGIP_blind.gaps.jsonl", encoding="utf-8").read() == gaps
    assert again["by_scorer"] == first["by_scorer"]
    none, out, _ = run_here("blind_audit.py", **dict(settings, CACHE_DIR=None))
    assert "from the cache" not in out and none["by_scorer"] == first["by_scorer"]
    # a score file beside the input serves an audit written to OUTPUT_DIR
    run_here("run_lgip_by_fliptype.py", **eval_settings(src, "corrected", [OPENCLIP_TINY], IMAGE_ROOT=FIXTURES))
    out_dir = tmp_path / "out"
    m, _, _ = run_here("blind_audit.py", JSONL_PATH=str(src), SCORERS=["prior:tiny_openclip"], OUTPUT_DIR=str(out_dir))
    assert m["by_scorer"]["prior:tiny_openclip"]["all"]["scored"] == m["num_pairs"]
    with pytest.raises(InputError) as e:
        run_here("blind_audit.py", JSONL_PATH=str(src), SCORERS=["prior:other"], OUTPUT_DIR=str(out_dir))
    said = str(e.value)
    assert str(out_dir / "fixture_with_fliptypes__LGIP_fliptypes_other.scores.jsonl") in said
    assert str(tmp_path / "fixture_with_fliptypes__LGIP_fliptypes_other.scores.jsonl") in said
    assert f"python run_lgip_by_fliptype.py --JSONL_PATH={src} --MODELS=<other's spec> --OUTPUT_DIR={out_dir}" in said


def test_a_model_scorer_of_the_audit_reads_no_image():
    from lgip.blind_scorers import check_scorers
    from lgip.errors import ConfigError

    with pytest.raises(ConfigError, match="a model scorer reads the text alone"):
        check_scorers([OPENCLIP_TINY])
    with pytest.raises(ConfigError, match="did you mean 'ngram3'"):
        check_scorers(["ngarm3"])
    with pytest.raises(ConfigError, match="'length' is named twice"):
        check_scorers(["length", "length"])
