"""The reference protocol's text calls are the published scripts' own (which texts share one
`encode_text` call decides the published SigLIP padding), checked call by call against
reference/calls/, and the SigLIP whose tokenizer splits words unevenly reproduces the published
numbers of all three evaluations."""

import importlib
import json
import os

import pytest

from lgip.records import dump_jsonl_line, load_records
from lgip.texts import TextBank, TextCalls
from conftest import CASES, REFERENCE
from test_evaluation import assert_matches

PIECES = os.path.join(REFERENCE, "siglip-tiny-pieces")


def calls_of(script, records, ok=None, with_pairs=False):
    """The calls the script's published_calls registers for records[ok], as lists of texts."""
    mod = importlib.import_module(script[:-3])
    registered = TextCalls()  # (the builder is a function of the records alone: no model, no run)
    pairs = mod.published_calls(records, range(len(records)) if ok is None else ok, registered)
    calls = [texts for _, texts in registered]
    return (calls, pairs) if with_pairs else calls


def project_calls(script, jsonl):
    records = load_records(os.path.join(REFERENCE, jsonl))
    calls, pairs = calls_of(script, records, with_pairs=True)
    return calls, records, pairs


def published_calls(script):
    with open(os.path.join(REFERENCE, "calls", f"calls_{script[:-3]}.jsonl"), encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    assert [line["call"] for line in lines] == list(range(len(lines)))
    return [line["texts"] for line in lines]


@pytest.mark.parametrize("script,jsonl", [(script, jsonl) for script, jsonl, _ in CASES])
def test_reference_calls_are_the_published_calls(script, jsonl):
    ours, records, _ = project_calls(script, jsonl)
    ref = published_calls(script)
    for n, texts in enumerate(ref):
        assert ours[n] == texts, f"call {n}"
    extra = ours[len(ref) :]
    if script.startswith("rebuttal"):
        # combined_caps, never encoded by the published script: one call each, after all of its calls
        combined = [
            [item["text"]]
            for _, rec in records
            for i in range(len(rec["orig_captions"]))
            for item in rec["combined_caps"].get(str(i), [])
        ]
        assert extra == combined and combined
    else:
        assert extra == []


def test_fliptype_global_figures_come_from_the_diff_caps_call():
    _, _, (inv, flips, typed) = project_calls("run_lgip_by_fliptype.py", "fixture_with_fliptypes.jsonl")
    assert len(flips) == len(typed) == 77 and set(typed.label) == {"color", "number", "object"}
    assert set(flips.slot).isdisjoint(typed.slot)  # the same texts, encoded in calls of their own
    assert sorted(flips.text) == sorted(typed.text)


def test_rebuttal_flip_items_share_one_call_per_caption():
    _, _, (para, flips, combined) = project_calls(
        "rebuttal_enhanced_lgip_by_transformation.py", "rebuttal_enhanced_fixture_with_fliptypes.jsonl"
    )
    assert len(flips) == 154 and flips.label[:1] == ["all"]
    # one caption's "all" item and its typed twin are consecutive slots of one call
    for k, i in set(zip(flips.rec, flips.cap)):
        slots = [s for s, kk, ii in zip(flips.slot, flips.rec, flips.cap) if (kk, ii) == (k, i)]
        assert slots == list(range(slots[0], slots[0] + len(slots)))


def test_add_call_splits_a_call_into_published_batches():
    bank = TextBank(None, 0)
    assert bank.add_call([]) == [] and len(bank.calls) == 0  # an empty list makes no call
    slots = bank.add_call([f"t{j}" for j in range(130)], 64)
    assert slots == list(range(130)) and [len(t) for _, t in bank.calls] == [64, 64, 2]


@pytest.mark.parametrize("script,jsonl,outputs", CASES)
def test_pieces_reproduce_published_metrics(pieces_runs, script, jsonl, outputs):
    folder, _ = pieces_runs[script]
    for name in outputs:
        name = name.replace("tiny_openclip", "tiny_siglip_pieces")
        if name.endswith("tiny_siglip.metrics.json"):
            continue
        ref = json.load(open(os.path.join(PIECES, name)))
        assert_matches(json.load(open(folder / name)), ref)


def test_siglip_sanity_check_draws_and_encodes_as_published(tmp_path):
    """Seed 42, the published order of random calls (shuffle; per shown record whose image reads,
    choice of a caption with flips, then sample when over 5), and the reference column from one
    processor call of caption + flips, padding=True."""
    import random

    import published_style
    from conftest import FIXTURES, SIGLIP_PIECES

    with open(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), encoding="utf-8") as f:
        recs = [json.loads(line) for line in f]
    recs[3]["image_path"] = "images/missing.jpg"
    # (a key that is no caption index, {"9": [...]}, which the published script counts as flips with no
    # caption to pick, is now an input error: tests/test_evaluation.py, test_cli_records.py)
    recs[7]["diff_caps"] = {"1": [f"{recs[7]['orig_captions'][1]} {w}" for w in "abcdefg"]}  # 7 flips: 5 sampled
    recs.append({"image_path": "images/000000000001.jpg", "orig_captions": ["A red bus."], "diff_caps": {"0": []}})
    src = tmp_path / "in.jsonl"
    src.write_text("".join(dump_jsonl_line(r) for r in recs), encoding="utf-8")

    rng = random.Random(42)  # the published script: random.seed(42), then the module's functions
    valid = [(n + 1, r) for n, r in enumerate(recs) if any(len(v) > 0 for v in r.get("diff_caps", {}).values())]
    rng.shuffle(valid)
    expected = []
    for line, r in valid[:12]:
        if not os.path.exists(os.path.join(FIXTURES, r["image_path"])):
            continue
        candidates = [i for i, _ in enumerate(r["orig_captions"]) if len(r["diff_caps"].get(str(i), [])) > 0]
        if not candidates:
            continue
        i = rng.choice(candidates)
        flips = r["diff_caps"][str(i)]
        expected.append((line, i, [r["orig_captions"][i]] + (rng.sample(flips, 5) if len(flips) > 5 else flips)))
    assert any(len(texts) == 6 and line == 8 for line, _, texts in expected)  # the sampled caption is shown

    proc = run_script_ok(
        "siglip_sanity_check.py",
        f"--JSONL_PATH={src}",
        f"--IMAGE_ROOT={FIXTURES}",
        f"--MODEL={SIGLIP_PIECES!r}",
        "--DEVICE=cpu",
        "--N_RECORDS=12",
    )
    rows = json.load(open(tmp_path / "in__siglip_sanity.json"))["rows"]
    shown = []
    for row in rows:
        if not row["is_flip"]:
            shown.append((row["line"], row["caption_index"], []))
        shown[-1][2].append(row["text"])
    assert shown == expected
    assert "image unreadable: skipped" in proc.stdout

    vlm = published_style.PublishedVLM(SIGLIP_PIECES, text_batch=1 << 20)
    for line, i, texts in expected:
        img = vlm.encode_image(os.path.join(FIXTURES, recs[line - 1]["image_path"]))
        published = (vlm.encode_text(texts) @ img).tolist()
        ours = [r["sim_reference"] for r in rows if (r["line"], r["caption_index"]) == (line, i)]
        assert max(abs(a - b) for a, b in zip(ours, published)) < 1e-6


def run_script_ok(script, *args):
    from conftest import run_script

    return run_script(script, *args)
