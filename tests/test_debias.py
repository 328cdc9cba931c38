"""debias_flips.py and lgip/debias.py (LGIP_SPEC.md 15): the balancing restated by hand (edges, bins, mirrored
sign groups, the seeded choice), its invariant (per type and debiasing scorer, right == wrong on what is kept),
a planted artifact gone after debiasing on it while a held-out scorer is measured, the debiased file a valid
input of the evaluations, and every bad input stopped before anything is written."""

import json
import shutil

import pytest

from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, eval_settings, run_here
from lgip import debias
from lgip.blind import Pair
from lgip.errors import ConfigError, InputError

THINGS = ["car", "dog", "cat", "bus", "boat", "kite", "bench", "horse", "plate", "train"]


def _records(n=80):
    """Number flips that add one to three words (length: right), and for every fourth record's second caption
    drop one or two (wrong); color flips that swap a word (length: a tie)."""
    out = []
    for r in range(n):
        thing = THINGS[r % 10]
        caps = [f"a red {thing} near the road", f"the big old {thing} is blue on the grass today"]
        longer = "two " * (1 + r % 3)
        shorter = caps[1].replace(" today", "").replace(" old", "" if r % 2 else " old")
        number = {"0": [longer + caps[0]], "1": [shorter if r % 4 == 0 else longer + caps[1]]}
        color = {"0": [caps[0].replace("red", "green")], "1": [caps[1].replace("blue", "pink")]}
        out.append(
            {
                "image_id": r,
                "image_path": f"images/{r:06d}.jpg",
                "orig_captions": caps,
                "diff_caps": {k: color[k] + number[k] + ["an untyped flip"] for k in ("0", "1")},
                "diff_caps_color": color,
                "diff_caps_number": number,
            }
        )
    return out


def _write(folder, records, name="x_with_fliptypes.jsonl"):
    path = folder / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_the_balancing_by_hand():
    assert debias.edges_of([0, -1, 2, 3, -4, 0.5], 2) == [2]  # a = [.5, 1, 2, 3, 4], e_1 = a[ceil(5/2) - 1]
    assert debias.edges_of([0, 0], 3) == [] and [debias.bin_of(g, [1, 3]) for g in (0, -1, 2, 3, -9)] == [0, 1, 2, 2, 3]
    pairs = [Pair(r, 0, "t", 0, "c", "f") for r in range(7)]
    gaps = {"a": [1.0, 1.0, 1.0, -1.0, 0.0, 0.0, -5.0]}
    keep, edges, unscored = debias.balance(pairs, gaps, bins=1, seed=0)
    assert edges == {"a": []} and not any(unscored)
    # one bin: three positives against two negatives -> two of each (the two smallest ranks); both ties kept
    first = sorted(range(3), key=lambda x: debias.rank(0, pairs[x]))
    assert keep == [x in first[:2] for x in range(3)] + [True, True, True, True]
    chosen = min(range(3), key=lambda x: debias.rank(0, pairs[x]))
    keep2, _, _ = debias.balance(pairs, {"a": [1.0, 1.0, 1.0, -1.0, 0.0, 0.0, None]}, bins=1, seed=0)
    assert keep2[chosen] and keep2[3] and sum(keep2[:3]) == 1 and not keep2[6]  # (unscored: not kept)


def test_debiasing_sets_its_scorers_at_chance_and_writes_a_file_the_evaluations_read(tmp_path):
    src = _write(tmp_path, _records())
    run_here("blind_audit.py", JSONL_PATH=str(src), SCORERS=["length", "ngram1", "edit"], BOOTSTRAP=100)
    m, out, _ = run_here(
        "debias_flips.py", JSONL_PATH=str(src), DEBIAS_SCORERS=["length", "ngram1"], HELD_OUT=["edit"], BOOTSTRAP=100
    )
    for s in ("length", "ngram1"):
        for t, b in m["after"][s].items():
            assert b["right"] == b["wrong"], (s, t, b)  # the invariant, by construction
    assert m["before"]["length"]["number"]["acc_untied"] > 0.6  # the planted artifact ...
    assert m["after"]["length"]["number"]["acc_untied"] in (0.5, None)  # ... gone
    assert set(m["after"]) == {"length", "ngram1", "edit"} and m["kept"]["all"]["kept"] > 0
    assert "held out edit: acc_untied" in out
    debiased = tmp_path / "x_with_fliptypes_debiased.jsonl"
    lines = [json.loads(x) for x in open(debiased, encoding="utf-8")]
    original = [json.loads(x) for x in open(src, encoding="utf-8")]
    assert len(lines) == len(original) and all(list(a) == list(b) for a, b in zip(lines, original))
    kept_typed = sum(len(v) for rec in lines for f in ("diff_caps_color", "diff_caps_number") for v in rec[f].values())
    assert kept_typed == m["kept"]["all"]["kept"]
    for rec in lines:  # diff_caps: the kept typed texts, in order; the untyped one dropped
        for k, texts in rec["diff_caps"].items():
            assert sorted(texts) == sorted(rec["diff_caps_color"][k] + rec["diff_caps_number"][k])
    meta = json.load(open(str(debiased) + ".meta.json"))
    assert meta["untyped_dropped"] == 160 and meta["input_sha256"] and meta["kept"] == m["kept"]


def test_the_few_kept_warning_says_what_each_scorer_did_there(tmp_path):
    """Every number flip adds words (length right on all: none kept); every color flip swaps one (length ties:
    all kept): the warning names length above chance with its counts, and never the colors."""
    from lgip.blind import standing

    records = _records(40)
    for r in records:
        r["diff_caps_number"] = {k: ["two two " + r["orig_captions"][int(k)]] for k in ("0", "1")}
        r["diff_caps"] = {k: r["diff_caps_color"][k] + r["diff_caps_number"][k] for k in ("0", "1")}
    src = _write(tmp_path, records)
    run_here("blind_audit.py", JSONL_PATH=str(src), SCORERS=["length", "edit"], BOOTSTRAP=100)
    m, out, _ = run_here("debias_flips.py", JSONL_PATH=str(src), DEBIAS_SCORERS=["length"], HELD_OUT=["edit"])
    b = m["kept"]["number"]
    head = f"  warning: number: {b['kept']:,} of 80 flips kept (under 10%): blind-solvable (length above chance);"
    assert head in out and "warning: color" not in out, out
    assert "    length: right on 80 of 80 untied (1.000 [1.000, 1.000])" in out
    assert standing({"scored": 8, "right": 4, "wrong": 4, "ties": 0, "acc_untied": 0.5, "acc_untied_ci95": None}) == (
        "at chance (4 right, 4 wrong)"
    )
    tied = {"scored": 40, "right": 0, "wrong": 0, "ties": 40, "acc_untied": None, "acc_untied_ci95": None}
    assert standing(tied) == "ties on all 40"
    low = {"scored": 26, "right": 2, "wrong": 22, "ties": 2, "acc_untied": 0.083, "acc_untied_ci95": [0.0, 0.2]}
    assert standing(low) == "wrong on 22 of 24 untied (0.083 [0.000, 0.200], 2 tied)"


def test_the_debiased_file_is_evaluated_as_any_input(tmp_path):
    src = tmp_path / "fixture_with_fliptypes.jsonl"
    shutil.copy(REFERENCE + "/fixture_with_fliptypes.jsonl", src)
    run_here("blind_audit.py", JSONL_PATH=str(src), SCORERS=["length", "ngram1"], BOOTSTRAP=0)
    m, _, _ = run_here("debias_flips.py", JSONL_PATH=str(src), DEBIAS_SCORERS=["ngram1"], HELD_OUT=["length"])
    debiased = tmp_path / "fixture_with_fliptypes_debiased.jsonl"
    (row,), _, _ = run_here(
        "run_lgip_by_fliptype.py", **eval_settings(debiased, "corrected", [OPENCLIP_TINY], IMAGE_ROOT=FIXTURES)
    )
    assert row["model_tag"] == "tiny_openclip" and m["kept"]["all"]["kept"] > 0
    for t, b in row["by_flip_type"].items():  # (every image reads: each type's flips are the kept ones)
        assert b["count"] == m["kept"][t]["kept"], t


def test_bad_input_stops_before_anything_is_written(tmp_path):
    src = _write(tmp_path, _records(6))
    for settings, error, words in (
        ({}, InputError, r"no blind audit of (?s:.*)python blind_audit.py"),
        ({"HELD_OUT": ["length"]}, ConfigError, r"HELD_OUT \['length'\] is also in DEBIAS_SCORERS"),
        ({"DEBIAS_SCORERS": []}, ConfigError, "DEBIAS_SCORERS is empty"),
        ({"BINS": 0}, ConfigError, "BINS must be an int >= 1"),
    ):
        with pytest.raises(error, match=words):
            run_here("debias_flips.py", JSONL_PATH=str(src), **settings)
    run_here("blind_audit.py", JSONL_PATH=str(src), SCORERS=["length", "ngram1"], BOOTSTRAP=0)
    with pytest.raises(InputError, match="has no ngram3, edit"):
        run_here("debias_flips.py", JSONL_PATH=str(src))
    src.write_text(src.read_text(encoding="utf-8") + "\n", encoding="utf-8")  # (another version of the input)
    with pytest.raises(InputError, match="input_sha256 differs"):
        run_here("debias_flips.py", JSONL_PATH=str(src), DEBIAS_SCORERS=["length"], HELD_OUT=["ngram1"])
    assert not list(tmp_path.glob("*debias*"))


def test_run_all_with_debias_evaluates_the_debiased_flips_and_the_report_sets_them_side_by_side(tmp_path):
    import re

    from conftest import run_script
    from lgip.demo import demo_inputs

    folder = tmp_path / "demo"
    demo_inputs(folder)  # (its records, images and generated inputs: run_all finds the generators' up to date)
    args = [f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}", "--DATA=demo", "--MODELS=demo", "--DEVICE=cpu"]
    out = run_script("run_all.py", *args, "--DEBIAS=True", "--NUM_WORKERS=0").stdout
    assert re.search(r"^\[5/13\] debias_flips\b", out, re.M) and re.search(
        r"^\[8/13\] run_lgip_by_fliptype_debiased\b", out, re.M
    )
    assert (folder / "lgip_demo_with_fliptypes_debiased__LGIP_fliptypes.metrics.json").is_file()
    md = (folder / "lgip_demo__LGIP_report.md").read_text(encoding="utf-8")
    side = md.split("### On the debiased flips")[1].split("\n## ")[0]
    assert re.search(r"\| demo_tiny_random \| \d\.\d{3} → \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\] \|", side), side
    assert re.search(r"Kept: \d+ of \d+ flips \(", side), side
    html = (folder / "lgip_demo__LGIP_report.html").read_text(encoding="utf-8")
    assert "<h3>On the debiased flips</h3>" in html
