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
    "fliptypes": (
        "run_lgip_by_fliptype.py",
        "fixture_with_fliptypes.jsonl",
        "fixture_with_fliptypes__LGIP_fliptypes.metrics.json",
    ),
    "enhanced": (
        "rebuttal_enhanced_lgip_by_transformation.py",
        "rebuttal_enhanced_fixture_with_fliptypes.jsonl",
        "rebuttal_enhanced_fixture_with_fliptypes__ENHANCED_LGIP_analysis.json",
    ),
}
MODELS = ["tiny_openclip", "tiny_siglip"]
OUTPUTS = [
    "fixture__LGIP_report.md",
    "fixture__LGIP_report.csv",
    "fixture__LGIP_frontier.png",
    "fixture__LGIP_fliptypes.png",
]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """A folder holding the base JSONL `fixture.jsonl`, its three derived inputs, and the
    metrics and score files of all three evaluations (corrected protocol, tiny models)."""
    folder = tmp_path_factory.mktemp("report")
    shutil.copy(BASE_JSONL, folder / "fixture.jsonl")

    for script, jsonl, _ in EVALS.values():  # (in this process, one after the other: run_here)
        shutil.copy(os.path.join(REFERENCE, jsonl), folder / jsonl)
        run_here(
            script,
            **eval_settings(folder / jsonl, protocol="corrected", image_root=FIXTURES, BOOTSTRAP=200, CACHE_DIR=None),
        )
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
        for col, key in (
            ("invariance_error", "invariance_error_mean"),
            ("gap", "sensitivity_gap_mean"),
            ("pos_rate", "sensitivity_pos_rate"),
        ):
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
    best_delta, worst_gap = 0.0, 0.0
    preferred = set()  # every flip scored above its caption: (model, image, caption index, flip), once
    for path in folder.glob("*.scores.jsonl"):
        model = next(m for m in MODELS if path.name.endswith(f"_{m}.scores.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            for p in r.get("paraphrases", []):
                best_delta = max(best_delta, abs(p["sim"] - r["sim"]))
            for f in r.get("flips", []):
                worst_gap = min(worst_gap, r["sim"] - f["sim"])
                if r["sim"] - f["sim"] < 0:
                    preferred.add((model, r["image_path"], r["caption_index"], f["text"]))
    md = (folder / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    para = md.split("## Paraphrases that move the score most")[1].split("## Flips")[0]
    flips = md.split("## Flips most preferred over their original")[1].split("\n---\n")[0]
    para_rows = [line for line in para.splitlines() if line.startswith("|") and line.split("|")[1].strip().isdigit()]
    flip_rows = [line for line in flips.splitlines() if line.startswith("|") and line.split("|")[1].strip().isdigit()]
    assert len(para_rows) == 10 and 0 < len(flip_rows) <= 10
    assert abs(float(para_rows[0].split("|")[-2])) == pytest.approx(best_delta, abs=1e-4)
    header = next(line for line in flips.splitlines() if line.startswith("|") and "Gap" in line)
    gap_column = [c.strip() for c in header.split("|")].index("Gap")  # (an "Average other image" column may follow it)
    assert float(flip_rows[0].split("|")[gap_column]) == pytest.approx(worst_gap, abs=1e-4)
    deltas = [abs(float(line.split("|")[-2])) for line in para_rows]
    assert deltas == sorted(deltas, reverse=True)
    assert len(set(para_rows)) == len(para_rows)  # the same pair from two evaluations is listed once
    # each list's sentence names what it counts, and says when there were fewer than TOP_K
    assert "\nTop 10 paraphrases over all models by |Δ sim|, Δ sim = " in para
    n = min(10, len(preferred))
    assert len(flip_rows) == n
    assert (
        f"\nTop 10 flips over all models with gap < 0{f' (only {n} flips have gap < 0)' if n < 10 else ''}, gap = "
        in flips
    )


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
    expected = {
        "multi": m.get("invariance_error_mean"),
        "fliptypes": m.get("invariance_error_mean"),
        "enhanced": m.get("global_invariance_error_mean"),
    }[key]
    assert num(rows[1]["invariance_error"]) == expected
    md = (tmp_path / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    assert EVALS[key][0] in md and all(EVALS[k][0] not in md for k in EVALS if k != key)
    assert len(re.findall(r"^\|\s*1 \|", md, re.M)) == 2  # each top list has rows


def test_evaluation_input_as_jsonl_path(evaluated, tmp_path):
    """JSONL_PATH = an evaluation's own input: only that evaluation, outputs named after it."""
    prefix = str(tmp_path / "out_")
    run_script(
        "report.py",
        f"--JSONL_PATH={evaluated / EVALS['fliptypes'][1]}",
        f"--OUTPUT_PREFIX={prefix}",
        "--TOP_K=0",
        "--HEADLINE='fliptypes'",
    )
    assert sorted(os.listdir(tmp_path)) == [
        "out_factors.metrics.json",
        "out_factors.png",
        "out_fliptypes.png",
        "out_frontier.png",
        "out_prior.png",
        "out_report.csv",
        "out_report.html",
        "out_report.md",
    ]
    md = (tmp_path / "out_report.md").read_text(encoding="utf-8")
    assert "# LGIP report: fixture_with_fliptypes" in md and "run_lgip_multi.py" not in md
    assert "Paraphrases that move" not in md  # TOP_K=0: no lists


def test_headline_choice(evaluated, tmp_path):
    run_script(
        "report.py",
        f"--JSONL_PATH={evaluated / 'fixture.jsonl'}",
        f"--OUTPUT_PREFIX={tmp_path / 'x_'}",
        "--HEADLINE='enhanced'",
        "--TOP_K=0",
    )
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
    for looked in (
        "nothing__LGIP_ALL.metrics.json",
        "nothing_with_perturb__LGIP_ALL.metrics.json",
        "nothing_with_fliptypes__LGIP_fliptypes.metrics.json",
        "rebuttal_enhanced_nothing_with_fliptypes__ENHANCED_LGIP_analysis.json",
    ):
        assert str(tmp_path / looked) in proc.stderr
    assert not list(tmp_path.iterdir())


def test_headline_not_found_is_an_error(evaluated, tmp_path):
    folder = tmp_path
    shutil.copy(evaluated / EVALS["multi"][2], folder / EVALS["multi"][2])
    proc = run_script("report.py", f"--JSONL_PATH={folder / 'fixture.jsonl'}", "--HEADLINE='enhanced'", check=False)
    assert proc.returncode == 2 and "HEADLINE" in proc.stderr


def test_without_explain_outputs_nothing_about_attribution(full_report, tmp_path):
    """No explain_flips.py (nor run_lgip_retrieval.py, nor run_lgip_images.py) outputs beside the inputs: no
    localization (or retrieval, or image) column in the CSV, no section in the markdown or the page, no
    retrieval figure; the explain metrics alone make no report."""
    from lgip.report import COLUMNS, EVALUATIONS

    folder, _ = full_report
    optional = {c for e in EVALUATIONS if e.key in ("explain", "retrieval", "images") for c in e.columns}
    with open(folder / "fixture__LGIP_report.csv", newline="", encoding="utf-8") as f:
        assert next(csv.reader(f)) == [c for c in COLUMNS if c not in optional]
    md = (folder / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    html = (folder / "fixture__LGIP_report.html").read_text(encoding="utf-8")
    assert "ocalization" not in md and "blame" not in md
    assert "retrieval" not in md.split("<sub>Made by")[0] and not (folder / "fixture__LGIP_retrieval.png").exists()
    assert 'id="attribution"' not in html and 'class="ws ' not in html and 'class="blame ' not in html
    assert 'id="image-side"' not in html and not (folder / "fixture__LGIP_image_side.png").exists()
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
    # (each distinct thumbnail once: the other cards showing it name it, page.js)
    assert html.count('src="data:image/jpeg;base64,') + html.count("<img data-same=") == len(cards)
    assert 'class="placeholder"' not in html
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


def fails_with(folder, before, path, text):
    """fails_leaving_the_report_whole with `path` holding `text` meanwhile (its bytes put back after)."""
    good = path.read_bytes()
    path.write_text(text, encoding="utf-8")
    try:
        return fails_leaving_the_report_whole(folder, before)
    finally:
        path.write_bytes(good)


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


@pytest.mark.parametrize(
    "key, change, field, why",
    [
        ("multi", nan, "invariance_error_mean", "is nan, not a finite number"),
        ("multi", a_string, "sensitivity_pos_rate", "is the string '0.5', not a number"),
        ("multi", short_interval, "sensitivity_gap_mean_ci95", "is [1] (list), not [low, high] or null"),
        ("multi", headline_missing, "invariance_error_mean", "is missing"),
        ("enhanced", inf_in_combined, "corrected.combined.global_sensitivity.pos_rate", "is inf, not a finite number"),
        ("fliptypes", rate_over_one, "by_flip_type.color.pos_rate", "is 1.5, not a rate within [0, 1]"),
        (
            "multi",
            lambda m: m.update(invariance_error_mean=-0.5),
            "invariance_error_mean",
            "is -0.5, not a mean of absolute differences (>= 0)",
        ),
        ("multi", lambda m: m.update(sensitivity_gap_mean=10**400), "sensitivity_gap_mean", "is 1000000000"),
        (
            "multi",
            lambda m: m["run"]["config"].update(IMAGE_ROOT=5),
            "run.config.IMAGE_ROOT",
            "is 5 (int), not a string or null",
        ),
        ("multi", lambda m: m["run"].update(versions="x"), "run.versions", "is the string 'x', not an object"),
        (
            "fliptypes",
            lambda m: m["run"]["model"].update(protocol=["x"]),
            "run.model.protocol",
            "is ['x'] (list), not a string or null",
        ),
        (
            "multi",
            lambda m: m["run"]["versions"].update(torch=2),
            "run.versions.torch",
            "is 2 (int), not a version string",
        ),
        ("multi", lambda m: m["run"]["config"].update(SEED="7"), "run.config.SEED", "is the string '7', not an int"),
    ],
)
def test_a_bad_metrics_value_names_file_model_and_field(reported, key, change, field, why):
    folder, before = reported
    path = folder / EVALS[key][2]
    data = json.loads(path.read_bytes())
    change(data[1])  # tiny_siglip's
    err = fails_with(folder, before, path, json.dumps(data))  # (NaN and Infinity as Python's json writes them)
    assert f"error: {path}: model tiny_siglip: field '{field}' {why}" in err


def test_an_empty_metrics_file_is_an_error(reported):
    folder, before = reported
    path = folder / EVALS["enhanced"][2]
    err = fails_with(folder, before, path, "[]\n")
    assert f"error: {path}: no model's metrics in it" in err


def test_a_truncated_score_file_leaves_the_previous_report_whole(reported):
    """The last line cut short: the error names the file and line, and no output is replaced
    (before, the CSV and the figures were, the markdown and the page not)."""
    folder, before = reported
    path = next(folder.glob("fixture_with_perturb__LGIP_*.scores.jsonl"))
    lines = path.read_bytes().decode("utf-8").splitlines(keepends=True)
    err = fails_with(folder, before, path, "".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    assert f"{path}:{len(lines)}: invalid JSON" in err


def test_a_missing_or_empty_score_file_is_said(reported, tmp_path):
    """A score file the metrics name that is not there, or empty (its pairs would vanish from the
    lists without a word), is said under the lists, by name."""
    folder, _ = reported
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    files = sorted(copy.glob("fixture_with_perturb__LGIP_*.scores.jsonl"))
    assert len(files) == 2
    files[0].write_text("")
    os.remove(files[1])
    run_script("report.py", f"--JSONL_PATH={copy / 'fixture.jsonl'}")
    md = (copy / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    assert f"Score files listed in the metrics but missing: `{files[1].name}`." in md
    assert f"Score files listed in the metrics but empty (their pairs are in no list): `{files[0].name}`." in md


def test_a_score_line_of_the_wrong_shape_is_named_not_listed(reported):
    """A score line whose similarity is NaN, infinite or missing, or whose fields are of the wrong type,
    stops the report with path:line and the field (a NaN was listed as a gap of +nan; a missing sim
    skipped the caption; a number for `flips` was a traceback); JSON nested thousands deep or a number
    of thousands of digits is named too."""
    folder, before = reported
    path = next(folder.glob("fixture_with_perturb__LGIP_*.scores.jsonl"))
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    first = json.loads(lines[0])
    assert first["flips"], "the fixture's first line has flips"

    def changed(change):
        row = json.loads(lines[0])
        change(row)
        return json.dumps(row) + "\n" + "".join(lines[1:])

    cases = [
        (lambda r: r.update(sim=float("nan")), "field 'sim' is nan, not a finite number or null"),
        (lambda r: r.pop("sim"), "field 'sim' missing"),
        (lambda r: r.update(flips=7), "field 'flips' is int, not a list of objects"),
        (lambda r: r.update(caption=5), "field 'caption' is int, not a string"),
        (
            lambda r: r["flips"][0].update(sim=float("inf")),
            "field 'flips[0]' is not an object with 'text' and a finite 'sim'",
        ),
    ]
    for change, said in cases:
        err = fails_with(folder, before, path, changed(change))
        assert f"{path}:1: {said}" in err, err
    err = fails_with(folder, before, path, "[" * 100000 + "]" * 100000 + "\n")
    assert f"{path}:1: JSON this program does not read (nested too deeply)" in err, err
    metrics = folder / EVALS["multi"][2]
    err = fails_with(folder, before, metrics, '[{"model_tag": "x", "num_samples": ' + "9" * 5000 + "}]")
    assert (
        f"{metrics}: JSON this program does not read (Exceeds the limit (4300 digits) for integer string conversion"
        in err
    )


@pytest.mark.parametrize(
    "arg, message",
    [
        ("--TOP_K=x", "TOP_K must be an int >= 0, got 'x'"),
        ("--TOP_K=-1", "TOP_K must be an int >= 0, got -1"),
        ("--DPI=0", "DPI must be an int from 10 to 1000 (dots per inch), got 0"),
        ("--LABELS=x", "LABELS must be a dict of model tag -> label, both strings"),
        ("--MAX_TEXT_CHARS=x", "MAX_TEXT_CHARS must be an int >= 0, got 'x'"),
    ],
)
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

    for key, name, field in (
        ("retrieval", "x__LGIP_retrieval.metrics.json", "i2t_recall@1"),
        ("explain", "x__LGIP_explain.metrics.json", "localization_acc"),
    ):
        path = tmp_path / name
        path.write_text(json.dumps([{"model_tag": "m", field: 0.5, field + "_ci95": [0.4, 0.6]}]), encoding="utf-8")
        assert load_metrics(str(path), key)[0][field] == 0.5
        path.write_text(json.dumps([{"model_tag": "m", field: float("nan")}]), encoding="utf-8")
        with pytest.raises(
            InputError, match=re.escape(f"{path}: model m: field '{field}' is nan, not a finite number")
        ):
            load_metrics(str(path))  # (the evaluation known by its file name)
        path.write_text(json.dumps([{"model_tag": "m", field: 0.5, field + "_ci95": [0.6, 0.4]}]), encoding="utf-8")
        with pytest.raises(
            InputError, match=re.escape(f"field '{field}_ci95' is [0.6, 0.4], not [low, high] with low <= high")
        ):
            load_metrics(str(path), key)


def test_an_output_set_is_renamed_whole_or_not_at_all(tmp_path):
    from lgip.errors import OutputError
    from lgip.outputs import OutputSet

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


# --- the figures' axes: a rate's axis never runs past [0, 1] ---


def _rate_rows(values):
    """Rows as lgip.report.build_rows makes them, every rate of a model at `value` with an
    interval reaching the rate's end (0 or 1) where it lies there."""
    from lgip.report import COLUMNS

    rows = []
    for i, value in enumerate(values):
        row = dict.fromkeys(COLUMNS)
        lo, hi = max(0.0, value - 0.05), min(1.0, value + 0.05)
        row.update(
            model=f"model_{i}",
            label=f"model {i}",
            invariance_error=0.02 + 0.01 * i,
            invariance_error_ci_lo=0.015 + 0.01 * i,
            invariance_error_ci_hi=0.025 + 0.01 * i,
        )
        for name in (
            "pos_rate",
            "color_pos_rate",
            "number_pos_rate",
            "object_pos_rate",
            "retrieval_i2t_recall@1",
            "retrieval_i2t_flip_top1_rate",
            "prior_pos_rate",
        ):
            row.update({name: value, name + "_ci_lo": lo, name + "_ci_hi": hi})
        row.update(
            color_count=10, number_count=10, object_count=10, headline_source="multi", flip_type_source="fliptypes"
        )
        rows.append(row)
    return rows


@pytest.mark.parametrize("values", [[1.0], [1.0, 0.98], [0.0, 1.0], [0.0], [0.3, 0.6]])
def test_rate_axes_stay_within_zero_and_one(tmp_path, monkeypatch, values):
    """Every axis of a rate (the positive rates, recall, the flip top-1 rate, the prior positive rate) in
    the frontier, flip-type, retrieval and text-prior figures: its limits and its labelled ticks within [0, 1],
    a rate at 0 or 1 included."""
    from lgip.report import diagnostic_plots, plots

    drawn = {}
    for module in (plots, diagnostic_plots):
        monkeypatch.setattr(
            module, "_save", lambda fig, path, dpi, files=None: drawn.setdefault(os.path.basename(path), fig)
        )
    rows = _rate_rows(values)
    plots.plot_frontier(rows, str(tmp_path / "frontier.png"))
    plots.plot_fliptypes(rows, str(tmp_path / "fliptypes.png"))
    plots.plot_retrieval(rows, str(tmp_path / "retrieval.png"))
    diagnostic_plots.plot_prior(rows, str(tmp_path / "prior.png"))
    rate_axes = [
        ("frontier.png", 0, "y"),
        ("fliptypes.png", 0, "y"),
        ("retrieval.png", 0, "x"),
        ("retrieval.png", 1, "x"),
        ("retrieval.png", 0, "y"),
        ("retrieval.png", 1, "y"),
        ("prior.png", 0, "x"),
        ("prior.png", 0, "y"),
    ]
    for name, k, axis in rate_axes:
        ax = drawn[name].axes[k]
        lo, hi = ax.get_xlim() if axis == "x" else ax.get_ylim()
        assert 0.0 <= lo < hi <= 1.0, (name, k, axis, lo, hi)
        ticks = [t for t in (ax.get_xticks() if axis == "x" else ax.get_yticks()) if lo - 1e-9 <= t <= hi + 1e-9]
        assert ticks and all(-1e-9 <= t <= 1.0 + 1e-9 for t in ticks), (name, axis, ticks)
        for v in values:  # every rate drawn is inside its axis
            assert lo - 1e-9 <= v <= hi + 1e-9, (name, axis, v, lo, hi)
    assert drawn["frontier.png"].axes[0].get_xlim()[0] >= 0.0  # an invariance error is never negative either


def test_rate_limits_pad_inside_zero_and_one():
    from lgip.report.plots import rate_limits

    assert rate_limits([0.3, 0.5], 0.02) == pytest.approx(
        (0.28, 0.52)
    )  # (as before: away from the ends nothing changes)
    assert rate_limits([1.0, 1.0], 0.02) == pytest.approx((0.96, 1.0))  # the span kept, moved inward
    assert rate_limits([0.0, 0.1], 0.02) == pytest.approx((0.0, 0.12))
    assert rate_limits([0.0, 1.0], 0.18) == (0.0, 1.0)


# --- a demo run says so at the top ---

DEMO_BOTH = (
    "Demo run: synthetic images (not COCO photographs) and a tiny random-init model that knows nothing; "
    "these figures show that the pipeline works, not how any model behaves."
)


def test_demo_note_says_what_is_demo():
    """run.demo's flags (any metrics row of any evaluation) make the sentence; none, or a falsy one, none."""
    from lgip.report.overview import demo_note

    def metrics(*demos, key="multi"):
        return {key: [{"model_tag": f"m{i}", "run": {} if d is None else {"demo": d}} for i, d in enumerate(demos)]}

    assert demo_note(metrics(None, None)) is None and demo_note(metrics({}, False)) is None and demo_note({}) is None
    assert demo_note(metrics({"model": True, "input": True, "message": "x"})) == DEMO_BOTH
    assert demo_note(metrics(None, {"model": True, "input": True}, key="explain")) == DEMO_BOTH.replace(
        "model that knows nothing", "model that knows nothing (`m1`)"
    )  # one of two models: named
    assert demo_note(metrics({"model": True, "input": False}, {"model": True, "input": False})) == (
        "Demo run: tiny random-init models that know nothing; these figures show that the pipeline works, not how any "
        "model behaves."
    )
    assert demo_note(metrics({"model": False, "input": True})) == (
        "Demo run: synthetic images (not COCO photographs); these figures show that the pipeline works, not how the "
        "models behave on real photographs."
    )
    assert (
        demo_note(metrics({"model": False, "input": False, "message": "made by run_all.py's demo."}))
        == "Demo run: made by run_all.py's demo."
    )


def test_a_demo_run_has_a_banner_on_the_page_and_a_bold_line_in_the_markdown(evaluated, full_report, tmp_path):
    """Metrics rows carrying run.demo (as the bundled demo writes them): the page opens with the banner,
    the markdown with the same sentence in bold; an ordinary run's outputs have neither."""
    for path in evaluated.iterdir():
        if path.is_file():
            shutil.copy(path, tmp_path / path.name)
    path = tmp_path / EVALS["multi"][2]
    ms = json.loads(path.read_text(encoding="utf-8"))
    for m in ms:
        m["run"]["demo"] = {"model": True, "input": True, "message": "the bundled demo"}
    path.write_text(json.dumps(ms), encoding="utf-8")
    run_script("report.py", f"--JSONL_PATH={tmp_path / 'fixture.jsonl'}")
    md = (tmp_path / "fixture__LGIP_report.md").read_text(encoding="utf-8").splitlines()
    assert md[:4] == [
        "# LGIP report: fixture",
        "",
        f"**{DEMO_BOTH.replace('a tiny random-init model that knows', 'tiny random-init models that know')}**",
        "",
    ]
    html = (tmp_path / "fixture__LGIP_report.html").read_text(encoding="utf-8")
    banner = re.search(r'<header>\s*<p class="demo-banner" role="note">([^<]+)</p>\s*<h1>', html)
    assert banner and unescape(banner.group(1)) == DEMO_BOTH.replace(
        "a tiny random-init model that knows", "tiny random-init models that know"
    )
    folder, _ = full_report
    assert "Demo run" not in (folder / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    assert 'demo-banner"' not in (folder / "fixture__LGIP_report.html").read_text(encoding="utf-8")


def test_the_word_scores_note_counts_cards_and_explained_flips():
    """The flip gallery's sentence: how many of its cards have word scores, out of how many, and how
    many flips explain_flips.py explained (of which model, on which input)."""
    from lgip.report.attribution_text import word_scores_note

    run = {"config": {"JSONL_PATH": "/data/x_with_fliptypes.jsonl"}}
    metrics = {"explain": [{"model_tag": "a", "num_flips": 77, "run": run}]}
    rows = [{"model": "a", "localization_num_flips": 77}, {"model": "b", "localization_num_flips": None}]
    assert word_scores_note(rows, metrics, 3, 10) == (
        "3 of the 10 flip cards on this page show word scores: `explain_flips.py` explained 77 flips of `a`, on "
        "`x_with_fliptypes.jsonl`; a card whose flip is not among them shows none."
    )
    rows[1]["localization_num_flips"] = 40
    assert "explained 117 flips over 2 models, on" in word_scores_note(rows, metrics, 1, 1)
    assert word_scores_note(rows, metrics, 1, 1).startswith("1 of the 1 flip card on this page shows word scores")
    rows[1]["localization_num_flips"] = 77
    assert "explained 77 flips of each of 2 models (154 in all), on" in word_scores_note(rows, metrics, 0, 4)
    assert word_scores_note(rows, {}, 0, 4) is None


# --- is it the image? the text-prior controls, the paired comparisons (LGIP_SPEC.md sections 9, 10) ---

CONTROL_KEYS = {
    "prior_pos_rate": "prior_pos_rate",
    "grounded_pos_rate": "grounded_pos_rate",
    "prior_gap_mean": "prior_gap",
    "grounded_gap_mean": "grounded_gap",
    "invariance_error_prior_mean": "invariance_error_prior",
    "invariance_error_grounded_mean": "invariance_error_grounded",
    "robust_pos_rate": "robust_pos_rate",
    "text_only_rate": "text_only_rate",
}
TYPE_KEYS = {k: v for k, v in CONTROL_KEYS.items() if not k.startswith("invariance")}


def comparisons(folder, key):
    with open(
        folder / EVALS[key][2].replace(EVALS[key][2].split("__")[1], "LGIP_comparisons.metrics.json"), encoding="utf-8"
    ) as f:
        return json.load(f)


def md_table_rows(md, after):
    """The cells of the first markdown table after the line `after`."""
    lines = next(b for b in md.split("\n" + after + "\n")[1].strip().split("\n\n") if b.startswith("|")).splitlines()
    return [[c.strip() for c in line.split("|")[1:-1]] for line in lines if line.startswith("|")]


def test_controls_in_the_table_right_after_the_positive_rate_and_every_one_in_the_csv(full_report):
    """Prior pos. (a control: no arrow) and Grounded pos. ↑ right after Pos. rate ↑, from the headline
    evaluation's row with their intervals; the CSV has every control figure of both evaluations, per flip type too."""
    from lgip.report import RESULT_COLUMNS

    names = [c.name for c in RESULT_COLUMNS]
    assert names[names.index("pos_rate") + 1 : names.index("pos_rate") + 3] == ["prior_pos_rate", "grounded_pos_rate"]
    assert {c.name: c.better for c in RESULT_COLUMNS}["prior_pos_rate"] == ""  # neither higher nor lower is better
    folder, _ = full_report
    md = (folder / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    table = md_table_rows(md, "## Results")
    header = table[0]
    at = header.index("Pos. rate ↑")
    assert header[at : at + 3] == ["Pos. rate ↑", "Prior pos.", "Grounded pos. ↑"]
    multi, flip = metrics(folder, "multi"), metrics(folder, "fliptypes")
    for cells in table[2:]:
        m = multi[cells[0]]
        for j, key in ((at + 1, "prior_pos_rate"), (at + 2, "grounded_pos_rate")):
            lo, hi = m[key + "_ci95"]
            assert cells[j] == f"{m[key]:.3f} [{lo:.3f}, {hi:.3f}]"
    rows = {r["model"]: r for r in read_csv(folder / "fixture__LGIP_report.csv")}
    for model in MODELS:
        r, m, f = rows[model], multi[model], flip[model]
        for key, name in CONTROL_KEYS.items():
            for prefix, src in (("", m), ("multi_", m), ("fliptypes_", f)):
                assert num(r[prefix + name]) == src[key], prefix + name
                ci = src.get(key + "_ci95")
                assert [num(r[prefix + name + "_ci_lo"]), num(r[prefix + name + "_ci_hi"])] == (ci or [None, None])
        for t in ("color", "number", "object"):
            for key, name in TYPE_KEYS.items():
                assert num(r[f"{t}_{name}"]) == f["by_flip_type"][t][key], (t, name)
    assert m["prior_pos_rate"] is not None and m["robust_pos_rate"] is not None  # (the fixture has both)


def test_the_prior_figure_is_written_linked_and_embedded(full_report):
    folder, proc = full_report
    check_png(folder / "fixture__LGIP_prior.png")
    assert f"-> {folder / 'fixture__LGIP_prior.png'}" in proc.stdout
    md = (folder / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    assert "![Positive rate against prior positive rate" in md and "](fixture__LGIP_prior.png)" in md
    html = (folder / "fixture__LGIP_report.html").read_text(encoding="utf-8")
    assert re.search(r'<img src="data:image/png;base64,[^"]+" alt="Positive rate against prior positive rate', html)


@pytest.mark.parametrize("values", [[0.5], [0.2, 0.9], [0.0, 1.0]])
def test_the_prior_figure_draws_the_diagonal_within_zero_and_one(tmp_path, monkeypatch, values):
    """x = prior positive rate, y = positive rate, one span for both within [0, 1], the diagonal y = x
    across it and labelled, each model a point with both whiskers and its label."""
    from lgip.report import diagnostic_plots

    drawn = {}
    monkeypatch.setattr(diagnostic_plots, "_save", lambda fig, path, dpi, files=None: drawn.setdefault("fig", fig))
    rows = _rate_rows(values)
    for i, r in enumerate(rows):  # prior positive rates unlike the positive rates
        prior = min(1.0, max(0.0, r["pos_rate"] + (0.1 if i % 2 else -0.1)))
        r.update(
            prior_pos_rate=prior,
            prior_pos_rate_ci_lo=max(0.0, prior - 0.04),
            prior_pos_rate_ci_hi=min(1.0, prior + 0.04),
        )
    assert diagnostic_plots.plot_prior(rows, str(tmp_path / "prior.png")) == str(tmp_path / "prior.png")
    ax = drawn["fig"].axes[0]
    assert ax.get_xlim() == ax.get_ylim() and 0.0 <= ax.get_xlim()[0] < ax.get_xlim()[1] <= 1.0
    lo, hi = ax.get_xlim()
    diagonal = [line for line in ax.get_lines() if line.get_label() == "y = x"]
    assert len(diagonal) == 1 and list(diagonal[0].get_xdata()) == list(diagonal[0].get_ydata()) == [lo, hi]
    texts = [t.get_text() for t in ax.texts]
    assert "y = x: all of it text prior" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert all(r["label"] in texts for r in rows)
    assert "Prior positive rate" in ax.get_xlabel() and "Positive rate" in ax.get_ylabel()
    for r in rows:
        for v in (r["pos_rate"], r["prior_pos_rate"]):
            assert lo - 1e-9 <= v <= hi + 1e-9
    assert diagnostic_plots.plot_prior([dict(r, prior_pos_rate=None) for r in rows], str(tmp_path / "none.png")) is None


def _prior_row(pos=0.568, prior=0.568, grounded=0.5, ci=(0.45, 0.55), controls=True):
    r = {"model": "m", "pos_rate": pos, "prior_pos_rate": prior, "grounded_pos_rate": grounded, "_controls": controls}
    r["grounded_pos_rate_ci_lo"], r["grounded_pos_rate_ci_hi"] = ci or (None, None)
    return r


@pytest.mark.parametrize(
    "row, says",
    [
        (
            _prior_row(),
            "`m`: of its 0.568 positive rate, all (0.568) is reached with any image: text prior. On its own image "
            "the caption beats the flip by more than on the average image in 0.500 [0.450, 0.550] of pairs "
            "(grounded; 0.5 = the image decides nothing); its interval contains 0.5.",
        ),
        (
            _prior_row(0.8, 0.6, 0.7, (0.62, 0.78)),
            "`m`: of its 0.800 positive rate, 0.600 is reached with any image (text prior); its own images add 0.200. "
            "On its own image the caption beats the flip by more than on the average image in 0.700 [0.620, 0.780] of "
            "pairs (grounded; 0.5 = the image decides nothing); its interval lies above 0.5.",
        ),
        (
            _prior_row(0.455, 0.481, 0.4, (0.3, 0.45)),
            "`m`: its 0.455 positive rate is below the 0.481 it reaches with any image (text prior): its own images "
            "take 0.026 away. On its own image the caption beats the flip by more than on the average image in 0.400 "
            "[0.300, 0.450] of pairs (grounded; 0.5 = the image decides nothing); its interval lies below 0.5.",
        ),
        (
            _prior_row(0.6, 0.5, 0.55, None),  # BOOTSTRAP=0: no interval, nothing said of it
            "`m`: of its 0.600 positive rate, 0.500 is reached with any image (text prior); its own images add 0.100. "
            "On its own image the caption beats the flip by more than on the average image in 0.550 of pairs "
            "(grounded; 0.5 = the image decides nothing).",
        ),
        (
            _prior_row(0.6, None, None, None),
            "`m`: positive rate 0.600; no text-prior control (fewer than 2 images: no other image to average).",
        ),
        (_prior_row(None, None, None, None), "`m`: no flip measured (no positive rate), so no text-prior control."),
        (
            _prior_row(0.6, None, None, None, controls=False),
            "`m`: no text-prior control in `x.json` (written before the controls, or by an evaluation without them: "
            "re-run `run_lgip_multi.py` or `run_lgip_by_fliptype.py`).",
        ),
    ],
)
def test_the_line_in_plain_words(row, says):
    from lgip.report.controls_text import prior_line

    assert prior_line(row, "x.json") == says


def test_the_markdown_and_page_say_it_per_model_and_list_the_paired_comparisons(full_report):
    """A line per model, then the comparisons of both evaluations (overall; by flip type apart), each with
    its difference and interval and "interval excludes 0" or "—"; the word "significant" nowhere."""
    from lgip.report.controls_text import prior_line

    folder, _ = full_report
    md = (folder / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    html = (folder / "fixture__LGIP_report.html").read_text(encoding="utf-8")
    text = unescape(re.sub(r"<[^>]+>", "", html))
    section = md.split("\n## Is it the image? Text-prior controls\n")[1].split("\n## ")[0]
    rows = {r["model"]: r for r in read_csv(folder / "fixture__LGIP_report.csv")}
    multi = metrics(folder, "multi")
    for model in MODELS:
        m = multi[model]
        line = prior_line(
            {
                "model": model,
                "_controls": True,
                "pos_rate": m["sensitivity_pos_rate"],
                "prior_pos_rate": m["prior_pos_rate"],
                "grounded_pos_rate": m["grounded_pos_rate"],
                "grounded_pos_rate_ci_lo": m["grounded_pos_rate_ci95"][0],
                "grounded_pos_rate_ci_hi": m["grounded_pos_rate_ci95"][1],
            }
        )
        assert "\n- " + line + "\n" in section and line.replace("`", "") in text
        assert float(rows[model]["prior_pos_rate"]) == m["prior_pos_rate"]
    overall = md_table_rows(section, "### Paired comparisons")
    assert overall[0] == ["Evaluation", "Figure", "A", "B", "A − B [95% CI]", "Images", "Interval excludes 0?"]
    expected = []
    for key in ("multi", "fliptypes"):
        order = ["sensitivity_pos_rate", "grounded_pos_rate", "invariance_error_mean", "invariance_error_rel"]
        for c in sorted(
            (c for c in comparisons(folder, key) if c["flip_type"] is None), key=lambda c: order.index(c["figure"])
        ):
            d = 4 if c["figure"] == "invariance_error_mean" else 3
            lo, hi = c["diff_ci95"]
            expected.append(
                [
                    f"`{EVALS[key][0]}`",
                    {
                        "sensitivity_pos_rate": "Pos. rate",
                        "grounded_pos_rate": "Grounded pos.",
                        "invariance_error_mean": "Inv. error",
                        "invariance_error_rel": "Inv. rel.",
                    }[c["figure"]],
                    f"tiny_openclip ({c['a_value']:.{d}f})",
                    f"tiny_siglip ({c['b_value']:.{d}f})",
                    f"{c['diff']:+.{d}f} [{lo:.{d}f}, {hi:.{d}f}]",
                    str(c["num_images"]),
                    "interval excludes 0" if c["excludes_zero"] else "—",
                ]
            )
    assert overall[2:] == expected and len(expected) == 8
    assert {c[-1] for c in expected} == {"interval excludes 0", "—"}  # (the tiny models: both kinds)
    by_type = md_table_rows(section, "By flip type:")
    assert len(by_type) - 2 == sum(c["flip_type"] is not None for c in comparisons(folder, "fliptypes")) == 6
    assert [r[2] for r in by_type[2:]] == ["color", "number", "object"] * 2
    assert "significant" not in md.lower() and "significant" not in text.lower()
    assert text.count("interval excludes 0") >= sum(c[-1] == "interval excludes 0" for c in expected)
    assert 'id="comparisons"' in html and 'id="comparisons-by-type"' in html


def test_a_comparison_without_an_interval_or_from_an_earlier_run():
    """No interval (BOOTSTRAP=0): '— (no interval)'; a model's value that is not its table figure: marked †."""
    from lgip.report.markdown import comparisons_table
    from lgip.report.controls_text import comparison_rows, comparisons_notes

    rows = [{"model": "a", "label": "A", "multi_pos_rate": 0.6}, {"model": "b", "label": "B", "multi_pos_rate": 0.5}]
    base = {
        "script": "run_lgip_multi.py",
        "a": "a",
        "b": "b",
        "figure": "sensitivity_pos_rate",
        "flip_type": None,
        "diff": 0.1,
        "lo": None,
        "hi": None,
        "a_value": 0.6,
        "b_value": 0.5,
        "num_images": 12,
        "excludes_zero": None,
        "created": None,
        "source": "multi",
        "file": "x__LGIP_comparisons.metrics.json",
    }
    stale = dict(base, a_value=0.7, diff=0.2, lo=0.05, hi=0.3, excludes_zero=True)
    table = comparison_rows([base, stale], rows)
    header, cells, _ = comparisons_table(table["overall"])
    assert cells[0][4:] == ["+0.100", "12", "— (no interval)"] and cells[0][2:4] == ["A (0.600)", "B (0.500)"]
    assert cells[1][4:] == ["+0.200 [0.050, 0.300] †", "12", "interval excludes 0"]
    notes = comparisons_notes(table, [base, stale], rows)
    assert notes[0] == "From `x__LGIP_comparisons.metrics.json`." and notes[1].startswith(
        "† 1 comparison: a model's value"
    )
    assert comparisons_notes(comparison_rows([], rows), [], [dict(r, _controls=True) for r in rows])[0].startswith(
        "No paired comparison: they are made for the models evaluated together in one run"
    )


def test_both_evaluations_on_one_input_share_a_comparisons_file_and_each_row_keeps_its_script(tmp_path):
    """On an imported benchmark run_lgip_multi and run_lgip_by_fliptype read one input, so both write
    `<stem>__LGIP_comparisons.metrics.json`: each row is its own script's, and is checked against that
    script's figures (by flip type too), not run_lgip_multi's."""
    from lgip.report.comparisons import comparison_files, load_comparisons
    from lgip.report.controls_text import _stale

    found = {}
    for key, suffix in (("multi", "LGIP_ALL.metrics.json"), ("fliptypes", "LGIP_fliptypes.metrics.json")):
        found[key] = str(tmp_path / f"bench__{suffix}")
        open(found[key], "w").write("[]")

    def row(script, flip_type):
        return {
            "script": script,
            "a": "A",
            "b": "B",
            "figure": "sensitivity_pos_rate",
            "flip_type": flip_type,
            "diff": 0.1,
            "diff_ci95": [0.05, 0.15],
            "a_value": 0.7,
            "b_value": 0.6,
            "num_images": 10,
        }

    (tmp_path / "bench__LGIP_comparisons.metrics.json").write_text(
        json.dumps(
            [
                row("run_lgip_multi.py", None),
                row("run_lgip_by_fliptype.py", None),
                row("run_lgip_by_fliptype.py", "color"),
            ]
        )
    )
    files, absent = comparison_files(found)
    assert [os.path.basename(p) for _, p in files] == ["bench__LGIP_comparisons.metrics.json"] and absent == []
    read = [c for key, path in files for c in load_comparisons(path, key)]
    assert [c["source"] for c in read] == ["multi", "fliptypes", "fliptypes"]
    # A's run_lgip_multi figure was run again (0.9); run_lgip_by_fliptype's is the one compared (0.7), and
    # its color figure is not (0.3): only the rows whose script's figure moved are stale
    by_model = {
        "A": {"multi_pos_rate": 0.9, "fliptypes_pos_rate": 0.7, "flip_type_source": "fliptypes", "color_pos_rate": 0.3},
        "B": {"multi_pos_rate": 0.6, "fliptypes_pos_rate": 0.6, "flip_type_source": "fliptypes", "color_pos_rate": 0.6},
    }
    assert [_stale(c, by_model) for c in read] == [True, False, True]


def comparisons_path(folder):
    return folder / "fixture_with_perturb__LGIP_comparisons.metrics.json"


@pytest.mark.parametrize(
    "change, field, why",
    [
        (lambda c: c.update(diff=float("nan")), "diff", "is nan, not a finite number"),
        (lambda c: c.update(diff_ci95=[0.1]), "diff_ci95", "is [0.1] (list), not [low, high] or null"),
        (lambda c: c.update(diff_ci95=[0.2, 0.1]), "diff_ci95", "is [0.2, 0.1], not [low, high] with low <= high"),
        (lambda c: c.update(a_value="high"), "a_value", "is the string 'high', not a number"),
        (lambda c: c.update(figure="sensitivity_pos_rate", b_value=1.5), "b_value", "is 1.5, not a rate within [0, 1]"),
        (
            lambda c: c.update(figure="grounded_pos_rate", diff=1.5, diff_ci95=None),
            "diff",
            "is 1.5, not a difference of two rates (within [-1, 1])",
        ),
        (
            lambda c: c.update(diff_ci95=[0.01, 0.02], excludes_zero=False),
            "excludes_zero",
            "is False, but diff_ci95 [0.01, 0.02] excludes 0",
        ),
        (lambda c: c.update(num_images=-1), "num_images", "is -1 (int), not a count (an int >= 0)"),
        (lambda c: c.pop("b"), "b", "is missing, not a non-empty string"),
    ],
)
def test_a_bad_comparison_names_file_row_and_field(reported, change, field, why):
    folder, before = reported
    path = comparisons_path(folder)
    data = json.loads(path.read_bytes())
    change(data[1])
    err = fails_with(folder, before, path, json.dumps(data))
    assert f"error: {path}: row 2 of {len(data)} (" in err and f"): field '{field}' {why}" in err, err


def test_a_comparisons_file_that_is_not_a_list_is_an_error_and_a_missing_one_is_fine(reported, tmp_path):
    folder, before = reported
    path = comparisons_path(folder)
    err = fails_with(folder, before, path, '{"a": 1}')
    assert f"error: {path}: expected a list of paired comparisons" in err
    for p in folder.iterdir():
        if p.is_file() and not p.name.startswith("fixture__LGIP_") and "comparisons" not in p.name:
            shutil.copy(p, tmp_path / p.name)
    run_script("report.py", f"--JSONL_PATH={tmp_path / 'fixture.jsonl'}", "--TOP_K=0")
    md = (tmp_path / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    assert "\n## Is it the image? Text-prior controls\n" in md
    assert "No paired comparison: they are made for the models evaluated together in one run" in md


def test_metrics_from_before_the_controls_show_none_of_them(reported, tmp_path):
    """Metrics files written before the controls (no such keys, no comparisons file): no Prior pos. or
    Grounded pos. column, no section, no prior figure; the CSV's control columns empty. One model without
    them beside one with them: its line says so, naming its file."""
    folder, _ = reported
    for p in folder.iterdir():
        if p.is_file() and not p.name.startswith("fixture__LGIP_") and "comparisons" not in p.name:
            shutil.copy(p, tmp_path / p.name)
    for key in ("multi", "fliptypes"):
        path = tmp_path / EVALS[key][2]
        data = json.loads(path.read_text(encoding="utf-8"))
        for m in data:
            for b in [m] + list((m.get("by_flip_type") or {}).values()):
                for k in [k for k in b if k.replace("_ci95", "") in CONTROL_KEYS]:
                    del b[k]
        path.write_text(json.dumps(data), encoding="utf-8")
    proc = run_script("report.py", f"--JSONL_PATH={tmp_path / 'fixture.jsonl'}", "--TOP_K=0")
    md = (tmp_path / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    assert "Prior pos." not in md and "Grounded pos." not in md and "Is it the image?" not in md
    assert (
        not (tmp_path / "fixture__LGIP_prior.png").exists()
        and "(no text-prior controls in the metrics: " in proc.stdout
    )
    rows = read_csv(tmp_path / "fixture__LGIP_report.csv")
    assert all(r[name] == "" for r in rows for name in CONTROL_KEYS.values())
    # one model with the controls again: the section, with a line for the other saying why it has none
    path = tmp_path / EVALS["multi"][2]
    data = json.loads(path.read_text(encoding="utf-8"))
    data[0].update(
        {k: v for k, v in metrics(folder, "multi")[MODELS[0]].items() if k.replace("_ci95", "") in CONTROL_KEYS}
    )
    path.write_text(json.dumps(data), encoding="utf-8")
    run_script("report.py", f"--JSONL_PATH={tmp_path / 'fixture.jsonl'}", "--TOP_K=0")
    md = (tmp_path / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    assert (
        f"- `{MODELS[1]}`: no text-prior control in `{EVALS['multi'][2]}` (written before the controls" in md
        and f"- `{MODELS[0]}`: " in md
        and (tmp_path / "fixture__LGIP_prior.png").exists()
    )


def test_a_flips_prior_gap_is_read_from_its_score_file_and_checked(tmp_path):
    """A score file's flips may carry `prior_gap` (the flip against the average other image): the top
    lists keep it (None where absent); anything but a finite number is named with its file, line and field."""
    from lgip.errors import InputError
    from lgip.report import scan_scores

    path = tmp_path / "x.scores.jsonl"
    line = {
        "line": 1,
        "image_path": "1.jpg",
        "caption_index": 0,
        "caption": "a red bus",
        "sim": 0.2,
        "flips": [
            {"text": "a blue bus", "sim": 0.3, "type": "color", "prior_gap": -0.01},
            {"text": "a red dog", "sim": 0.25, "type": "object", "prior_gap": 0.02},
            {"text": "two red bus", "sim": 0.24, "type": "number"},
        ],
    }
    path.write_text(json.dumps(line) + "\n", encoding="utf-8")
    tops = scan_scores([("multi", "m", str(path))], 5)
    assert [(r["text"], r["prior_gap"]) for r in tops.flips[None]] == [
        ("a blue bus", -0.01),
        ("a red dog", 0.02),
        ("two red bus", None),
    ]
    for bad in ("-0.01", float("nan"), True):
        line["flips"][1]["prior_gap"] = bad
        path.write_text(
            json.dumps(dict(line, flips=line["flips"][:1])) + "\n" + json.dumps(line) + "\n", encoding="utf-8"
        )
        with pytest.raises(
            InputError, match=re.escape(f"{path}:2: field 'flips[1].prior_gap' is {bad!r}, not a finite number")
        ):
            scan_scores([("multi", "m", str(path))], 5)


def test_models_chooses_the_reports_models(evaluated, tmp_path):
    """MODELS (names or fnmatch patterns): the report of those models alone (table, CSV, top lists,
    comparisons), under its own names so that the report of every model stays; a name that matches
    none is an error naming the models there are, before any output."""
    for path in evaluated.iterdir():  # (the inputs and the evaluations' outputs: not a report other tests made)
        if path.name.startswith(("fixture", "rebuttal_enhanced_fixture")) and not path.name.startswith(
            "fixture__LGIP_"
        ):
            shutil.copy(path, tmp_path / path.name)
    proc = run_script("report.py", f"--JSONL_PATH={tmp_path / 'fixture.jsonl'}", "--MODELS=['tiny_open*']")
    rows = read_csv(tmp_path / "fixture__LGIP_tiny_open-_report.csv")
    assert [r["model"] for r in rows] == ["tiny_openclip"] and "tiny_siglip" not in proc.stdout
    md = (tmp_path / "fixture__LGIP_tiny_open-_report.md").read_text(encoding="utf-8")
    assert "tiny_siglip" not in md and not (tmp_path / "fixture__LGIP_report.md").exists()
    proc = run_script(
        "report.py", f"--JSONL_PATH={tmp_path / 'fixture.jsonl'}", "--MODELS=tiny_siglip,nope*", check=False
    )
    assert proc.returncode == 2 and proc.stderr == (
        "error: MODELS: 'nope*' matches no model of the metrics; their models: tiny_openclip, tiny_siglip\n"
        "  no output was written (the previous report, if any, is as it was)\n"
    ), proc.stderr
    proc = run_script("report.py", f"--JSONL_PATH={tmp_path / 'fixture.jsonl'}", "--MODELS=[1]", check=False)
    assert proc.returncode == 2 and "MODELS must be None, a list of model names or patterns" in proc.stderr


def test_the_image_side_figure_takes_inv_rel_on_x_when_the_kinds_are_mixed(tmp_path, monkeypatch):
    """A logprob model's text invariance error (~21) beside cosine models' (~0.1) says nothing on one axis:
    with mixed score kinds the left panel's x is Inv. rel., as the frontier's is; one kind keeps the error."""
    from lgip.report import diagnostic_plots

    drawn = {}
    monkeypatch.setattr(diagnostic_plots, "_save", lambda fig, path, dpi, files=None: drawn.setdefault(path, fig))
    rows = _rate_rows([0.6, 0.7])
    for i, r in enumerate(rows):
        r.update(
            score_kind=("logprob", "cosine")[i],
            invariance_error=(21.0, 0.1)[i],
            invariance_error_rel=(0.4, 0.3)[i],
            image_invariance_error=(2.0, 0.01)[i],
            image_pos_rate=0.55,
        )
    diagnostic_plots.plot_image_side(rows, str(tmp_path / "mixed.png"))
    ax = drawn[str(tmp_path / "mixed.png")].axes[0]
    assert "Inv. rel." in ax.get_xlabel() and ax.get_xlim()[1] < 1.0
    for r in rows:
        r["score_kind"] = "cosine"
    diagnostic_plots.plot_image_side(rows, str(tmp_path / "one.png"))
    ax = drawn[str(tmp_path / "one.png")].axes[0]
    assert "Inv. rel." not in ax.get_xlabel() and ax.get_xlim()[1] > 21.0


# --- the flip-type figure: readable with any number of long model names ---


@pytest.mark.parametrize(
    "labels,counts",
    [
        (
            ["ViT-B-16 (laion2b_s34b_b88k)", "ViT-B-16 (laion2b_s34b_b88k__ft_plain)", "ViT-B-16 (laion2b__ft_lgip)"],
            61234,
        ),
        (["demo_tiny_random"], 93456),
        ([f"siglip2-base-patch16-224_{i}" for i in range(9)], 6),
        ([f"openclip_ViT-B-16_laion2b_s34b_b88k__ft_arm{i}_with_a_long_suffix" for i in range(14)], 6),
        ([f"model_{i:02d}_something_long_here" for i in range(40)], 6),
    ],
    ids=["three_long", "one", "nine", "fourteen_longer", "forty"],
)
def test_the_fliptype_figure_has_no_overprinted_label_and_nothing_cut_at_an_edge(tmp_path, monkeypatch, labels, counts):
    """Model names on the axis wrapped (level where the widest fits its model's slot, else turned, neighbours
    apart), the legend and the title whole within the figure (in rows where one row would not fit), the bars at
    least MIN_AXES_INCHES high, whatever the names and their number."""
    import math

    from lgip.report import plots

    drawn = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path, dpi, files=None: drawn.setdefault("fig", fig))
    rows = _rate_rows([0.4 + 0.5 * (i % 2) for i in range(len(labels))])
    for row, label in zip(rows, labels):
        row.update(label=label, color_count=counts, number_count=counts, object_count=counts)
    note = "lgip_demo_with_fliptypes__ft_heldout · run_lgip_by_fliptype ·\nwhiskers: 95% CI"
    plots.plot_fliptypes(rows, str(tmp_path / "f.png"), note)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = drawn["fig"]
    FigureCanvasAgg(fig).draw()  # (closed by then: a canvas of its own to measure on)
    ax, renderer = fig.axes[0], fig.canvas.get_renderer()
    ticks = [t for t in ax.get_xticklabels() if t.get_text()]
    assert [t.get_text().replace("\n", "").replace(" ", "") for t in ticks] == [x.replace(" ", "") for x in labels]
    for artist in [ax.get_legend(), ax.title, *ticks]:
        assert plots._inside(fig, artist, margin=0), artist
    boxes = [t.get_window_extent(renderer) for t in ticks]
    angle = ticks[0].get_rotation()
    if angle == 0:  # level: side by side, none over its neighbour
        assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:])), [(b.x0, b.x1) for b in boxes]
    else:  # turned: parallel bands of text, each neighbour a text's height or more away across them
        anchors = [ax.transData.transform((x, 0))[0] for x in ax.get_xticks()[: len(ticks)]]
        lines = max(t.get_text().count("\n") + 1 for t in ticks)
        height = lines * 10 * 1.2 * fig.dpi / 72  # (10 pt labels)
        assert all((b - a) * math.sin(math.radians(angle)) >= height for a, b in zip(anchors, anchors[1:]))
    assert ax.get_position().height * fig.get_figheight() >= plots.MIN_AXES_INCHES - 1e-6
    assert fig.get_figwidth() <= max(plots.MAX_FIGURE_INCHES, 0.22 * len(labels) + 2.5) + 1e-6
    if len(labels) == 3:  # (the fine-tuning demo's page: three long names, level, wrapped)
        assert angle == 0 and any("\n" in t.get_text() for t in ticks)


def test_a_long_model_name_wraps_at_its_parts():
    from lgip.report.plots import wrap_label

    assert wrap_label("ViT-B-16 (laion2b_s34b_b88k__ft_plain)", 16) == "ViT-B-16\n(laion2b_s34b_\nb88k__ft_plain)"
    assert wrap_label("ViT-B-16 (openai)", 17) == "ViT-B-16 (openai)"  # (one that fits: as it is)
    assert wrap_label("siglip2-base-patch16-224", 16) == "siglip2-base-\npatch16-224"
    assert wrap_label("averyveryverylongname", 8) == "averyveryverylongname"  # (a part longer than a line: whole)
