"""The reference protocol against the published loops (tests/published_style.py) on data the
fixture never shows: records without flips, a caption with one flip type, empty and missing
lists, a flip equal to its caption, a record without captions, lists longer than a published
text batch, odd flip-field names, records without typed lists, and unreadable images (the
published rebuttal drops the whole batch of 32 records around one). Each published field must
agree to 1e-6 (counts exactly), with tiny_openclip and the SigLIP whose words split unevenly."""

import json
import os

import pytest

from lgip.records import dump_jsonl_line, load_records
import published_style
from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, SIGLIP_PIECES, eval_args, eval_settings, run_here, run_script
from test_evaluation import assert_matches

MODELS = [OPENCLIP_TINY, SIGLIP_PIECES]
OUTPUT = {
    "run_lgip_multi.py": "LGIP_ALL.metrics.json",
    "run_lgip_by_fliptype.py": "LGIP_fliptypes.metrics.json",
    "rebuttal_enhanced_lgip_by_transformation.py": "ENHANCED_LGIP_analysis.json",
}
SOURCE = {
    "run_lgip_multi.py": "fixture_with_perturb.jsonl",
    "run_lgip_by_fliptype.py": "fixture_with_fliptypes.jsonl",
    "rebuttal_enhanced_lgip_by_transformation.py": "rebuttal_enhanced_fixture_with_fliptypes.jsonl",
}
MISSING = "images/missing.jpg"
FLIP_FIELDS = ("diff_caps", "diff_caps_color", "diff_caps_number", "diff_caps_object")


def _clear(rec, fields):
    for f in fields:
        if f in rec:
            rec[f] = {k: [] for k in rec[f]}


def fixture_records(script, n):
    """n records cycled from the fixture's input of the script (copies)."""
    with open(os.path.join(REFERENCE, SOURCE[script]), encoding="utf-8") as f:
        base = [json.loads(line) for line in f]
    return [json.loads(json.dumps(base[j % len(base)])) for j in range(n)]


def edge_records(script, n=40):
    """n records cycled from the fixture's, the first ones made into the edge cases."""
    recs = fixture_records(script, n)
    recs[-1]["image_path"] = MISSING  # unreadable: skipped (the rebuttal's published fields: records 32-39 too)
    _clear(recs[1], FLIP_FIELDS)  # no flips at all
    _clear(recs[2], ("diff_caps_number", "diff_caps_object"))  # one flip type left
    recs[2]["diff_caps"] = {k: list(v) for k, v in recs[2].get("diff_caps_color", recs[2]["diff_caps"]).items()}
    _clear(recs[3], ("same_caps",))  # no paraphrases
    cap = recs[4]["orig_captions"][0]
    recs[4]["diff_caps"]["0"] = [cap]  # a flip equal to its caption (gap 0 on CLIP; not on published SigLIP)
    if "diff_caps_color" in recs[4]:
        recs[4]["diff_caps_color"]["0"] = [cap]
        recs[4]["diff_caps_number"]["0"] = recs[4]["diff_caps_object"]["0"] = []
    recs[5]["orig_captions"] = []  # no captions: not counted by the published scripts
    long = [f"{recs[6]['orig_captions'][1]} seen from spot {j}" + " far" * (j % 5) for j in range(70)]
    recs[6]["same_caps"]["1"] = long  # over a 64-text batch: padded per batch
    recs[6]["diff_caps"]["1"] = long[:66]
    for f in ("diff_caps", "same_caps"):  # a caption missing from the per-caption dicts
        recs[7][f].pop("3", None)
    if script.startswith("rebuttal"):
        recs[8]["diff_caps_Flip_Spatial"] = {"0": ["A man standing under a bus."]}  # published type: "spatial"
        for f in FLIP_FIELDS[1:]:  # only diff_caps: its flips are counted once in the corrected figures
            recs[9].pop(f)
        recs[10]["diff_caps"]["2"] = [
            f"{recs[10]['orig_captions'][2]} {j}" for j in range(520)
        ]  # over 512: two batches
    for r in recs:
        if not r["orig_captions"]:
            for f in r:
                if isinstance(r[f], dict):
                    r[f] = {}
    return recs


def write_jsonl(path, recs):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(dump_jsonl_line(r) for r in recs)
    return path


@pytest.fixture(scope="module")
def edge_runs(tmp_path_factory):
    """{script: (its metrics on the edge cases, what it printed to stderr, the records)}; each script
    run once, in this process (run_here)."""
    out = {}
    for script in OUTPUT:
        folder = tmp_path_factory.mktemp(script.split(".")[0])
        src = write_jsonl(folder / "edge.jsonl", edge_records(script))
        _, _, stderr = run_here(script, **eval_settings(src, models=MODELS, BOOTSTRAP=0, WRITE_SCORES=False))
        out[script] = (json.load(open(folder / f"edge__{OUTPUT[script]}")), stderr, load_records(str(src)))
    return out


@pytest.fixture(scope="module")
def published(edge_runs):
    """published(script) -> the published loops' (metrics of MODELS, text calls) on its edge records,
    computed once per script (the calls are the same for every model)."""
    done = {}

    def get(script):
        if script not in done:
            done[script] = published_style.evaluate(script, MODELS, edge_runs[script][2], FIXTURES)
        return done[script]

    return get


@pytest.mark.parametrize("script", list(OUTPUT))
def test_reference_protocol_matches_published_loops_on_edge_cases(edge_runs, published, script):
    ours, stderr, records = edge_runs[script]
    theirs, calls = published(script)
    assert_matches(ours, theirs)
    assert "unreadable image" in stderr and all(m["run"]["num_failed_images"] == 1 for m in ours)


@pytest.mark.parametrize("script", list(OUTPUT))
def test_edge_case_calls_are_the_published_calls(edge_runs, published, script):
    """The calls of the records the published script reaches, each cut into its text batches."""
    import test_published_calls

    _, _, records = edge_runs[script]
    _, calls = published(script)
    batch = published_style.EVALUATIONS[script][1]
    expected = [texts[b : b + batch] for texts in calls for b in range(0, len(texts), batch)]
    # the rebuttal reaches no record of the unreadable image's batch of 32
    reached = (
        range(32)
        if script.startswith("rebuttal")
        else [k for k, (_, r) in enumerate(records) if r["image_path"] != MISSING]
    )
    ours = test_published_calls.calls_of(script, records, reached)
    assert ours[: len(expected)] == expected
    assert len(expected) > len(calls)  # a list longer than a batch made two calls
    if not script.startswith("rebuttal"):
        assert len(ours) == len(expected)


def test_edge_case_counts(edge_runs):
    multi, _, _ = edge_runs["run_lgip_multi.py"]
    assert [m["num_samples"] for m in multi] == [38, 38]  # 40 less the unreadable image and the captionless record
    fliptype, _, _ = edge_runs["run_lgip_by_fliptype.py"]
    assert [m["num_samples"] for m in fliptype] == [38, 38]
    enhanced, _, _ = edge_runs["rebuttal_enhanced_lgip_by_transformation.py"]
    for m in enhanced:
        c = m["corrected"]
        assert m["num_samples"] == 1 and c["published_batches_dropped"] == 1  # batch 1 (records 32-39) dropped
        assert c["num_records"] == 38  # the corrected figures keep every readable record with captions
        assert "spatial" in m["error_type_stats"] and "spatial" in c["error_type_stats"]
        # every flip once: the typed items, and the "all" items of record 9, which has no typed lists
        once = c["global_sensitivity"]["count"]
        assert once > m["global_sensitivity"]["count"] - m["error_type_stats"]["all"]["overall"]["count"]


def test_rebuttal_without_any_flip_has_published_bin_edges(tmp_path):
    recs = edge_records("rebuttal_enhanced_lgip_by_transformation.py")[10:13]
    for r in recs:
        _clear(r, FLIP_FIELDS + ("combined_caps",))
    src = write_jsonl(tmp_path / "flat.jsonl", recs)
    run_here("rebuttal_enhanced_lgip_by_transformation.py", **eval_settings(src, models=[OPENCLIP_TINY]))
    m = json.load(open(tmp_path / "flat__ENHANCED_LGIP_analysis.json"))[0]
    theirs, _ = published_style.evaluate(
        "rebuttal_enhanced_lgip_by_transformation.py", [OPENCLIP_TINY], load_records(str(src)), FIXTURES
    )
    assert_matches([m], theirs)
    assert (m["global_strength"]["q_low"], m["global_strength"]["q_high"]) == (0.0, 1.0)
    assert m["corrected"]["global_strength"]["q_low"] is None and m["error_type_stats"] == {}


def test_rebuttal_strength_bins_use_the_published_float32_edges():
    """With 5 strengths the 0.25 quantile is the second strength itself; torch.quantile on the
    published list computes it in float32, which here rounds below it: that strength is "medium"."""
    import importlib

    import numpy as np
    import torch

    mod = importlib.import_module("rebuttal_enhanced_lgip_by_transformation")
    v = next(x for x in np.linspace(0.3, 0.4, 1001) if float(np.float32(x)) < x)
    s = np.array([0.1, v, 0.5, 0.6, 0.9])
    q_low = float(torch.quantile(torch.tensor(s.tolist()), 0.25))
    assert q_low < v  # the published edge
    out = mod.strength_analysis(
        np.array(["color"] * 5, dtype=object), np.linspace(-0.1, 0.1, 5), s, np.arange(5), published=True
    )
    bins = out["error_type_stats"]["color"]
    assert (bins["weak"]["count"], bins["medium"]["count"], bins["strong"]["count"]) == (1, 3, 1)
    assert abs(out["global_strength"]["q_low"] - q_low) < 1e-7


def test_inputs_the_published_code_reads_but_the_project_refuses(tmp_path):
    """Deliberate differences, each stopped with file:line and the field: a record without a field
    the script reads (the published code takes it as empty: a wrong input file), and flips given as
    {"text", "flip_type"} objects (the published rebuttal's parser reads them; no generator writes
    them)."""
    recs = fixture_records("rebuttal_enhanced_lgip_by_transformation.py", 2)
    recs[1]["diff_caps"]["0"] = [{"text": "A blue bus.", "flip_type": "color"}]
    src = write_jsonl(tmp_path / "objects.jsonl", recs)
    proc = run_script(
        "rebuttal_enhanced_lgip_by_transformation.py", *eval_args(src, models=[OPENCLIP_TINY]), check=False
    )
    assert proc.returncode == 2 and "objects.jsonl:2: field 'diff_caps.0[0]' is dict, expected a string" in proc.stderr
    recs = fixture_records("run_lgip_by_fliptype.py", 2)
    del recs[1]["diff_caps"]
    src = write_jsonl(tmp_path / "no_field.jsonl", recs)
    proc = run_script("run_lgip_by_fliptype.py", *eval_args(src, models=[OPENCLIP_TINY]), check=False)
    assert proc.returncode == 2 and "no_field.jsonl:2: missing field 'diff_caps'" in proc.stderr


def test_summary_lines_show_missing_metrics_as_na(tmp_path):
    recs = fixture_records("run_lgip_multi.py", 2)
    for r in recs:
        _clear(r, ("diff_caps",))
    src = write_jsonl(tmp_path / "noflips.jsonl", recs)
    _, stdout, _ = run_here("run_lgip_multi.py", **eval_settings(src, models=[OPENCLIP_TINY]))
    assert "gap n/a, positive rate n/a" in stdout
    m = json.load(open(tmp_path / "noflips__LGIP_ALL.metrics.json"))[0]
    assert m["sensitivity_gap_mean"] is None and m["num_sensitivity_pairs"] == 0
