"""report.py on real evaluation outputs (tiny models, CPU): files, CSV values, markdown, plots, errors."""
import csv
import json
import os
import re
import shutil
from html import unescape

import pytest

from conftest import BASE_JSONL, FIXTURES, REFERENCE, eval_settings, run_here, run_script

EVALS = {  # evaluation -> (script, its input in the reference fixtures, its metrics file)
    "multi": ("run_lgip_multi.py", "fixture_with_perturb.jsonl", "fixture_with_perturb__LGIP_ALL.metrics.json"),
    "fliptypes": ("run_lgip_by_fliptype.py", "fixture_with_fliptypes.jsonl",
                  "fixture_with_fliptypes__LGIP_fliptypes.metrics.json"),
    "enhanced": ("rebuttal_enhanced_lgip_by_transformation.py", "rebuttal_enhanced_fixture_with_fliptypes.jsonl",
                 "rebuttal_enhanced_fixture_with_fliptypes__ENHANCED_LGIP_analysis.json"),
}
MODELS = ["tiny_openclip", "tiny_siglip"]
OUTPUTS = ["fixture__LGIP_report.md", "fixture__LGIP_report.csv", "fixture__LGIP_frontier.png",
           "fixture__LGIP_fliptypes.png"]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """A folder holding the base JSONL `fixture.jsonl`, its three derived inputs, and the
    metrics and score files of all three evaluations (corrected protocol, tiny models)."""
    folder = tmp_path_factory.mktemp("report")
    shutil.copy(BASE_JSONL, folder / "fixture.jsonl")

    for script, jsonl, _ in EVALS.values():  # (in this process, one after the other: run_here)
        shutil.copy(os.path.join(REFERENCE, jsonl), folder / jsonl)
        run_here(script, **eval_settings(folder / jsonl, protocol="corrected", image_root=FIXTURES, BOOTSTRAP=200,
                                         CACHE_DIR=None))
    return folder


@pytest.fixture(scope="module")
def full_report(evaluated):
    proc = run_script("report.py", f"--JSONL_PATH={evaluated / 'fixture.jsonl'}")
    return evaluated, proc


def metrics(folder, key):
    with open(folder / EVALS[key][2], encoding="utf-8") as f:
        return {m["model_tag"]: m for m in json.load(f)}


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def check_png(path):
    from PIL import Image
    with Image.open(path) as img:
        img.load()
        assert img.format == "PNG"
        assert 600 <= img.width <= 4000 and 300 <= img.height <= 3000, img.size


def num(text):
    return None if text == "" else float(text)


def test_full_report_files_and_plots(full_report):
    folder, proc = full_report
    for name in OUTPUTS:
        assert (folder / name).is_file(), name
    check_png(folder / "fixture__LGIP_frontier.png")
    check_png(folder / "fixture__LGIP_fliptypes.png")
    assert "Inv. error" in proc.stdout and "tiny_openclip" in proc.stdout  # the table is printed
    assert not list(folder.glob(".*.tmp"))  # atomic writes leave no temp files


def test_csv_matches_metrics(full_report):
    folder, _ = full_report
    rows = read_csv(folder / "fixture__LGIP_report.csv")
    assert [r["model"] for r in rows] == MODELS
    multi, flip, enh = (metrics(folder, k) for k in ("multi", "fliptypes", "enhanced"))
    for r in rows:
        m, f, e = multi[r["model"]], flip[r["model"]], enh[r["model"]]
        assert r["headline_source"] == "multi" and r["flip_type_source"] == "fliptypes"
        assert r["protocol"] == "corrected" and int(r["num_records"]) == 12 and int(r["num_failed_images"]) == 0
        for col, key in (("invariance_error", "invariance_error_mean"), ("gap", "sensitivity_gap_mean"),
                         ("pos_rate", "sensitivity_pos_rate")):
            assert num(r[col]) == m[key]
            assert [num(r[col + "_ci_lo"]), num(r[col + "_ci_hi"])] == m[key + "_ci95"]
        for t in ("color", "number", "object"):
            b = f["by_flip_type"][t]
            assert num(r[f"{t}_pos_rate"]) == b["pos_rate"]
            assert [num(r[f"{t}_pos_rate_ci_lo"]), num(r[f"{t}_pos_rate_ci_hi"])] == b["pos_rate_ci95"]
            assert num(r[f"{t}_gap"]) == b["gap_mean"] and int(r[f"{t}_count"]) == b["count"]
        assert num(r["fliptypes_invariance_error"]) == f["invariance_error_mean"]
        assert num(r["fliptypes_pos_rate"]) == f["global_sensitivity"]["pos_rate"]
        assert num(r["enhanced_simple_invariance_error"]) == e["paraphrase_simple_inv_error_mean"]
        assert num(r["enhanced_advanced_invariance_error_ci_hi"]) == e["paraphrase_advanced_inv_error_mean_ci95"][1]
        assert num(r["enhanced_invariance_error"]) == e["global_invariance_error_mean"]
        c = e["corrected"]
        assert num(r["enhanced_pos_rate"]) == c["global_sensitivity"]["pos_rate"]
        assert num(r["enhanced_combined_pos_rate"]) == c["combined"]["global_sensitivity"]["pos_rate"]
        assert num(r["enhanced_combined_gap_ci_lo"]) == c["combined"]["global_sensitivity"]["gap_mean_ci95"][0]


def test_markdown_content(full_report):
    folder, _ = full_report
    md = (folder / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    for model in MODELS:
        assert model in md
    for key in EVALS:
        assert EVALS[key][0] in md and EVALS[key][2] in md
    assert "](fixture__LGIP_frontier.png)" in md and "](fixture__LGIP_fliptypes.png)" in md
    assert "## Paraphrases that move the score most" in md
    assert "## Flips most preferred over their original" in md
    assert "corrected" in md and "Package versions" in md and "Made by `report.py`" in md
    multi = metrics(folder, "multi")["tiny_openclip"]
    assert f"{multi['invariance_error_mean']:.4f} [{multi['invariance_error_mean_ci95'][0]:.4f}," in md


def test_top_lists_are_the_extremes(full_report):
    """The first rows of the top lists are the largest |paraphrase change| and most negative flip gap
    over every score file (brute force)."""
    folder, _ = full_report
    best_delta, worst_gap, n_para = 0.0, 0.0, 0
    for path in folder.glob("*.scores.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            for p in r.get("paraphrases", []):
                best_delta = max(best_delta, abs(p["sim"] - r["sim"]))
            for f in r.get("flips", []):
                worst_gap = min(worst_gap, r["sim"] - f["sim"])
    md = (folder / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    para = md.split("## Paraphrases that move the score most")[1].split("## Flips")[0]
    flips = md.split("## Flips most preferred over their original")[1].split("\n---\n")[0]
    para_rows = [line for line in para.splitlines() if line.startswith("|") and line.split("|")[1].strip().isdigit()]
    flip_rows = [line for line in flips.splitlines() if line.startswith("|") and line.split("|")[1].strip().isdigit()]
    assert len(para_rows) == 10 and 0 < len(flip_rows) <= 10
    assert abs(float(para_rows[0].split("|")[-2])) == pytest.approx(best_delta, abs=1e-4)
    assert float(flip_rows[0].split("|")[-2]) == pytest.approx(worst_gap, abs=1e-4)
    deltas = [abs(float(line.split("|")[-2])) for line in para_rows]
    assert deltas == sorted(deltas, reverse=True)
    assert len(set(para_rows)) == len(para_rows)  # the same pair from two evaluations is listed once


@pytest.mark.parametrize("key", list(EVALS))
def test_only_one_evaluation(evaluated, tmp_path, key):
    """Only one evaluation's metrics and score files beside the base JSONL."""
    shutil.copy(evaluated / "fixture.jsonl", tmp_path / "fixture.jsonl")
    stem = os.path.splitext(EVALS[key][1])[0]
    for path in evaluated.glob(stem + "__*"):
        shutil.copy(path, tmp_path / path.name)
    run_script("report.py", f"--JSONL_PATH={tmp_path / 'fixture.jsonl'}", "--TOP_K=3")
    for name in OUTPUTS[:3]:
        assert (tmp_path / name).is_file(), name
    check_png(tmp_path / "fixture__LGIP_frontier.png")
    assert (tmp_path / "fixture__LGIP_fliptypes.png").is_file() == (key != "multi")
    rows = read_csv(tmp_path / "fixture__LGIP_report.csv")
    assert [r["model"] for r in rows] == MODELS and {r["headline_source"] for r in rows} == {key}
    m = metrics(evaluated, key)["tiny_siglip"]
    expected = {"multi": m.get("invariance_error_mean"), "fliptypes": m.get("invariance_error_mean"),
                "enhanced": m.get("global_invariance_error_mean")}[key]
    assert num(rows[1]["invariance_error"]) == expected
    md = (tmp_path / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    assert EVALS[key][0] in md and all(EVALS[k][0] not in md for k in EVALS if k != key)
    assert len(re.findall(r"^\|\s*1 \|", md, re.M)) == 2  # each top list has rows


def test_evaluation_input_as_jsonl_path(evaluated, tmp_path):
    """JSONL_PATH = an evaluation's own input: only that evaluation, outputs named after it."""
    prefix = str(tmp_path / "out_")
    run_script("report.py", f"--JSONL_PATH={evaluated / EVALS['fliptypes'][1]}", f"--OUTPUT_PREFIX={prefix}",
               "--TOP_K=0", "--HEADLINE='fliptypes'")
    assert sorted(os.listdir(tmp_path)) == ["out_fliptypes.png", "out_frontier.png", "out_report.csv", "out_report.html",
                                            "out_report.md"]
    md = (tmp_path / "out_report.md").read_text(encoding="utf-8")
    assert "# LGIP report: fixture_with_fliptypes" in md and "run_lgip_multi.py" not in md
    assert "Paraphrases that move" not in md  # TOP_K=0: no lists


def test_headline_choice(evaluated, tmp_path):
    run_script("report.py", f"--JSONL_PATH={evaluated / 'fixture.jsonl'}", f"--OUTPUT_PREFIX={tmp_path / 'x_'}",
               "--HEADLINE='enhanced'", "--TOP_K=0")
    rows = read_csv(tmp_path / "x_report.csv")
    enh = metrics(evaluated, "enhanced")
    for r in rows:
        e = enh[r["model"]]
        assert r["headline_source"] == "enhanced"
        assert num(r["invariance_error"]) == e["global_invariance_error_mean"]
        assert num(r["pos_rate"]) == e["corrected"]["global_sensitivity"]["pos_rate"]
        assert int(r["num_records"]) == e["corrected"]["num_records"] == 12  # not the published batch count


def test_no_metrics_is_a_clear_error(tmp_path):
    proc = run_script("report.py", f"--JSONL_PATH={tmp_path / 'nothing.jsonl'}", check=False)
    assert proc.returncode == 2
    for looked in ("nothing__LGIP_ALL.metrics.json", "nothing_with_perturb__LGIP_ALL.metrics.json",
                   "nothing_with_fliptypes__LGIP_fliptypes.metrics.json",
                   "rebuttal_enhanced_nothing_with_fliptypes__ENHANCED_LGIP_analysis.json"):
        assert str(tmp_path / looked) in proc.stderr
    assert not list(tmp_path.iterdir())


def test_headline_not_found_is_an_error(evaluated, tmp_path):
    folder = tmp_path
    shutil.copy(evaluated / EVALS["multi"][2], folder / EVALS["multi"][2])
    proc = run_script("report.py", f"--JSONL_PATH={folder / 'fixture.jsonl'}", "--HEADLINE='enhanced'", check=False)
    assert proc.returncode == 2 and "HEADLINE" in proc.stderr


def test_without_explain_outputs_nothing_about_attribution(full_report, tmp_path):
    """No explain_flips.py (nor run_lgip_retrieval.py) outputs beside the inputs: no localization (or
    retrieval) column in the CSV, no section in the markdown or the page, no retrieval figure; the
    explain metrics alone make no report."""
    from lgip.report import COLUMNS, EVALUATIONS
    folder, _ = full_report
    optional = {c for e in EVALUATIONS if e.key in ("explain", "retrieval") for c in e.columns}
    with open(folder / "fixture__LGIP_report.csv", newline="", encoding="utf-8") as f:
        assert next(csv.reader(f)) == [c for c in COLUMNS if c not in optional]
    md = (folder / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    html = (folder / "fixture__LGIP_report.html").read_text(encoding="utf-8")
    assert "ocalization" not in md and "blame" not in md
    assert "retrieval" not in md.split("<sub>Made by")[0] and not (folder / "fixture__LGIP_retrieval.png").exists()
    assert 'id="attribution"' not in html and 'class="ws ' not in html and 'class="blame ' not in html
    (tmp_path / "fixture_with_fliptypes__LGIP_explain.metrics.json").write_text(json.dumps([{"model_tag": "m"}]))
    proc = run_script("report.py", f"--JSONL_PATH={tmp_path / 'fixture.jsonl'}", check=False)
    assert proc.returncode == 2 and "no LGIP metrics found" in proc.stderr


def test_page_of_real_outputs(full_report):
    """The page beside the markdown: the same table figures, every listed pair with its image, nothing
    fetched from elsewhere (the browser test is in test_report_page.py)."""
    folder, proc = full_report
    page = folder / "fixture__LGIP_report.html"
    html = page.read_text(encoding="utf-8")
    assert f"-> {page} (" in proc.stdout
    assert "http://" not in html and "https://" not in html and 'src="data:image/png;base64,' in html
    multi = metrics(folder, "multi")
    for model in MODELS:
        assert f'<tr data-model="{model}">' in html
        assert f'data-v="{multi[model]["invariance_error_mean"]!r}"' in html
    cards = re.findall(r'<article class="card" data-kind="(\w+)" data-model="([^"]+)"', html)
    assert {kind for kind, _ in cards} == {"flip", "paraphrase"} and {m for _, m in cards} <= set(MODELS)
    assert html.count('src="data:image/jpeg;base64,') == len(cards) and 'class="placeholder"' not in html
    text = unescape(re.sub(r"<[^>]+>", "", html))  # the page's text, marks and all
    md = (folder / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    for title in ("## Paraphrases that move the score most", "## Flips most preferred over their original"):
        listed = md.split(title)[1].split("\n## ")[0].split("\n---\n")[0]
        for line in (line for line in listed.splitlines() if re.match(r"^\|\s*\d+ \|", line)):
            assert line.split("|")[5].strip().replace("\\", "") in text, line  # each listed pair is in a gallery


# Bad input: an error naming the file, the model and the field (exit status 2), nothing written,
# the previous report left whole (the same bytes); or, for a null figure, shown as – and said.

@pytest.fixture(scope="module")
def reported(evaluated, tmp_path_factory):
    """(folder, {output: bytes}): the evaluations' files and a report made from them, to be broken."""
    folder = tmp_path_factory.mktemp("reported")
    for path in evaluated.iterdir():
        if path.is_file() and not path.name.startswith("fixture__LGIP_"):
            shutil.copy(path, folder / path.name)
    run_script("report.py", f"--JSONL_PATH={folder / 'fixture.jsonl'}")
    return folder, outputs(folder)


def outputs(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name.startswith("fixture__LGIP_")}


def fails_leaving_the_report_whole(folder, before, *args):
    proc = run_script("report.py", f"--JSONL_PATH={folder / 'fixture.jsonl'}", *args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "no output was written" in proc.stderr
    assert outputs(folder) == before  # the same files, the same bytes
    assert not list(folder.glob(".*.tmp"))
    return proc.stderr


def nan(m):
    m["invariance_error_mean"] = float("nan")


def a_string(m):
    m["sensitivity_pos_rate"] = "0.5"


def short_interval(m):
    m["sensitivity_gap_mean_ci95"] = [1]


def headline_missing(m):
    del m["invariance_error_mean"]


def inf_in_combined(m):
    m["corrected"]["combined"]["global_sensitivity"]["pos_rate"] = float("inf")


def rate_over_one(m):
    m["by_flip_type"]["color"]["pos_rate"] = 1.5


@pytest.mark.parametrize("key, change, field, why", [
    ("multi", nan, "invariance_error_mean", "is nan, not a finite number"),
    ("multi", a_string, "sensitivity_pos_rate", "is the string '0.5', not a number"),
    ("multi", short_interval, "sensitivity_gap_mean_ci95", "is [1] (list), not [low, high] or null"),
    ("multi", headline_missing, "invariance_error_mean", "is missing"),
    ("enhanced", inf_in_combined, "corrected.combined.global_sensitivity.pos_rate", "is inf, not a finite number"),
    ("fliptypes", rate_over_one, "by_flip_type.color.pos_rate", "is 1.5, not a rate within [0, 1]"),
])
def test_a_bad_metrics_value_names_file_model_and_field(reported, key, change, field, why):
    folder, before = reported
    path = folder / EVALS[key][2]
    good = path.read_bytes()
    data = json.loads(good)
    change(data[1])  # tiny_siglip's
    path.write_text(json.dumps(data), encoding="utf-8")  # (NaN and Infinity as Python's json writes them)
    try:
        err = fails_leaving_the_report_whole(folder, before)
    finally:
        path.write_bytes(good)
    assert f"error: {path}: model tiny_siglip: field '{field}' {why}" in err


def test_an_empty_metrics_file_is_an_error(reported):
    folder, before = reported
    path = folder / EVALS["enhanced"][2]
    good = path.read_bytes()
    path.write_text("[]\n", encoding="utf-8")
    try:
        err = fails_leaving_the_report_whole(folder, before)
    finally:
        path.write_bytes(good)
    assert f"error: {path}: no model's metrics in it" in err


def test_a_truncated_score_file_leaves_the_previous_report_whole(reported):
    """The last line cut short: the error names the file and line, and no output is replaced
    (before, the CSV and the figures were, the markdown and the page not)."""
    folder, before = reported
    path = next(folder.glob("fixture_with_perturb__LGIP_*.scores.jsonl"))
    good = path.read_bytes()
    lines = good.decode("utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][:len(lines[-1]) // 2], encoding="utf-8")
    try:
        err = fails_leaving_the_report_whole(folder, before)
    finally:
        path.write_bytes(good)
    assert f"{path}:{len(lines)}: invalid JSON" in err


@pytest.mark.parametrize("arg, message", [
    ("--TOP_K=x", "TOP_K must be an int >= 0, got 'x'"), ("--TOP_K=-1", "TOP_K must be an int >= 0, got -1"),
    ("--DPI=0", "DPI must be an int from 10 to 1000 (dots per inch), got 0"),
    ("--LABELS=x", "LABELS must be a dict of model tag -> label, both strings"),
    ("--MAX_TEXT_CHARS=x", "MAX_TEXT_CHARS must be an int >= 0, got 'x'"),
])
def test_a_bad_constant_stops_before_any_output(reported, arg, message):
    folder, before = reported
    assert f"error: {message}" in fails_leaving_the_report_whole(folder, before, arg)


def test_a_null_headline_figure_is_shown_as_a_dash_and_said(reported, tmp_path):
    """null: the evaluation measured nothing (no pairs): not an error; the table shows –, the CSV an
    empty cell, and the output, the markdown and the page say which model, which figure, which file."""
    folder, _ = reported
    for path in folder.iterdir():
        if path.is_file() and not path.name.startswith("fixture__LGIP_"):
            shutil.copy(path, tmp_path / path.name)
    path = tmp_path / EVALS["multi"][2]
    data = json.loads(path.read_text(encoding="utf-8"))
    data[1]["invariance_error_mean"] = data[1]["invariance_error_mean_ci95"] = None
    path.write_text(json.dumps(data), encoding="utf-8")
    proc = run_script("report.py", f"--JSONL_PATH={tmp_path / 'fixture.jsonl'}", "--TOP_K=0")
    note = f"tiny_siglip: no invariance error (null in {path.name}: nothing measured)"
    assert "note: " + note in proc.stdout
    rows = read_csv(tmp_path / "fixture__LGIP_report.csv")
    assert rows[1]["invariance_error"] == "" and rows[0]["invariance_error"] != ""
    md = (tmp_path / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    assert f"`tiny_siglip`: no invariance error (null in `{path.name}`: nothing measured)" in md
    assert "| tiny_siglip   |      12 |                       – |" in md


def test_retrieval_and_explain_metrics_are_checked_too(tmp_path):
    from lgip.errors import InputError
    from lgip.report import load_metrics
    for key, name, field in (("retrieval", "x__LGIP_retrieval.metrics.json", "i2t_recall@1"),
                             ("explain", "x__LGIP_explain.metrics.json", "localization_acc")):
        path = tmp_path / name
        path.write_text(json.dumps([{"model_tag": "m", field: 0.5, field + "_ci95": [0.4, 0.6]}]), encoding="utf-8")
        assert load_metrics(str(path), key)[0][field] == 0.5
        path.write_text(json.dumps([{"model_tag": "m", field: float("nan")}]), encoding="utf-8")
        with pytest.raises(InputError, match=re.escape(f"{path}: model m: field '{field}' is nan, not a finite number")):
            load_metrics(str(path))  # (the evaluation known by its file name)
        path.write_text(json.dumps([{"model_tag": "m", field: 0.5, field + "_ci95": [0.6, 0.4]}]), encoding="utf-8")
        with pytest.raises(InputError, match=re.escape(f"field '{field}_ci95' is [0.6, 0.4], not [low, high] with low <= high")):
            load_metrics(str(path), key)


def test_an_output_set_is_renamed_whole_or_not_at_all(tmp_path):
    from lgip.errors import OutputError
    from lgip.util import OutputSet
    (tmp_path / "a.md").write_text("old a")
    with pytest.raises(RuntimeError):
        with OutputSet() as out:
            with out.open(str(tmp_path / "a.md")) as f:
                f.write("new a")
            assert open(out.staged(str(tmp_path / "a.md"))).read() == "new a"  # readable before the commit
            raise RuntimeError("bad input met late")
    assert sorted(os.listdir(tmp_path)) == ["a.md"] and (tmp_path / "a.md").read_text() == "old a"
    (tmp_path / "b.png").mkdir()  # a target that cannot be replaced: found before anything is renamed
    with pytest.raises(OutputError, match="b.png: it is a folder"):
        with OutputSet() as out:
            for name in ("a.md", "b.png"):
                with out.open(str(tmp_path / name)) as f:
                    f.write("new")
    assert sorted(os.listdir(tmp_path)) == ["a.md", "b.png"] and (tmp_path / "a.md").read_text() == "old a"
    with OutputSet() as out:
        for name in ("a.md", "c.csv"):
            with out.open(str(tmp_path / name)) as f:
                f.write("new " + name)
    assert (tmp_path / "a.md").read_text() == "new a.md" and (tmp_path / "c.csv").read_text() == "new c.csv"
