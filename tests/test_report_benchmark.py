"""report.py on an imported benchmark (LGIP_SPEC.md section 10): the per-type columns, CSV and figure follow
the benchmark's own types in the file's order, and a section "<Benchmark> table" reads like the benchmark's
own table (rows = models, a column per type: its accuracy with its interval, their unweighted mean;
SugarCrepe++'s ITT and TOT). Small imported files made by tests/test_import_benchmark.py's builders, tiny
models on CPU; the page looked at in Chromium at 1400 px."""

import csv
import json
import os
import shutil

import pytest

from conftest import OPENCLIP_TINY, SIGLIP_TINY, eval_args, run_script
from test_import_benchmark import img, run_import, sugarcrepe, sugarcrepe_pp, write

SC_TYPES = ["add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj"]


def metrics_types(jsonl):
    """The types of run_lgip_by_fliptype.py's by_flip_type, in its order: as they first appear in the records."""
    m = json.load(open(str(jsonl)[: -len(".jsonl")] + "__LGIP_fliptypes.metrics.json"))[0]
    return list(m["by_flip_type"])


def sugarcrepe_all_types(folder):
    """SugarCrepe's seven files, each with items (the builder's three types and four more)."""
    sugarcrepe(folder, missing_image=False)
    more = {
        "add_obj": ("A dog on the grass.", "A dog and a ball on the grass."),
        "replace_obj": ("A dog on the grass.", "A cat on the grass."),
        "replace_rel": ("A man next to a horse.", "A man on a horse."),
        "swap_att": ("A white cat and a black dog.", "A black cat and a white dog."),
    }
    for k, (stem, (caption, negative)) in enumerate(more.items()):
        write(folder, stem + ".json", {"0": {"filename": img(6 + k), "caption": caption, "negative_caption": negative}})
    return folder


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def md_section(md, title):
    return md.split(f"\n## {title}\n")[1].split("\n## ")[0]


def md_rows(text, after):
    """The rows of the markdown table after the line `after`: [[cells]] (header first, rule dropped)."""
    lines = text.split(after + "\n\n")[1].split("\n\n")[0].splitlines()
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines if not line.startswith("|--")]


@pytest.fixture(scope="module")
def scpp(tmp_path_factory):
    """SugarCrepe++ imported and run through run_all.py with two tiny models: the evaluations its table
    reads and the report (every step on an imported file: test_import_benchmark.py's end-to-end test)."""
    tmp = tmp_path_factory.mktemp("scpp")
    out, _ = run_import("sugarcrepe++", sugarcrepe_pp(tmp / "src"), tmp)
    proc = run_script(
        "run_all.py",
        f"--BENCHMARK_JSONL={out}",
        f"--MODELS={[OPENCLIP_TINY, SIGLIP_TINY]!r}",
        "--DEVICE=cpu",
        "--NUM_WORKERS=0",
        "--SETTINGS={'BOOTSTRAP': 20}",
        "--STEPS=run_lgip_multi,run_lgip_by_fliptype,report",
    )
    return out, proc


@pytest.fixture(scope="module")
def sc7(tmp_path_factory):
    """SugarCrepe, all seven types, run_lgip_by_fliptype.py with two tiny models, then report.py."""
    tmp = tmp_path_factory.mktemp("sc7")
    out, _ = run_import("sugarcrepe", sugarcrepe_all_types(tmp / "src"), tmp)
    run_script(
        "run_lgip_by_fliptype.py", *eval_args(out, protocol="corrected", image_root=None, BOOTSTRAP=20, CACHE_DIR=None)
    )
    run_script("report.py", f"--JSONL_PATH={out}")
    return out


def test_sugarcrepe_pp_report_reads_like_its_own_table(scpp):
    out, proc = scpp
    stem = str(out)[: -len(".jsonl")]
    fliptypes = {m["model_tag"]: m for m in json.load(open(stem + "__LGIP_fliptypes.metrics.json"))}
    multi = {m["model_tag"]: m for m in json.load(open(stem + "__LGIP_ALL.metrics.json"))}
    types = list(next(iter(fliptypes.values()))["by_flip_type"])
    assert types == ["replace_att", "swap_obj"]  # (the types with items, in the file's order)
    # the CSV: per-type columns for the benchmark's types (LGIP's none), the mean over them
    rows = read_csv(stem + "__LGIP_report.csv")
    header = list(rows[0])
    assert not any(c.startswith(("color_", "number_", "object_")) for c in header)
    assert [
        c[: -len("_pos_rate")] for c in header if c.endswith("_pos_rate") and c[: -len("_pos_rate")] in types
    ] == types
    assert header[-3:] == ["benchmark_mean_pos_rate", "benchmark_mean_robust_pos_rate", "benchmark_mean_text_only_rate"]
    for r in rows:
        blocks = fliptypes[r["model"]]["by_flip_type"]
        for t in types:
            assert float(r[f"{t}_pos_rate"]) == blocks[t]["pos_rate"] and int(r[f"{t}_count"]) == blocks[t]["count"]
            assert [float(r[f"{t}_pos_rate_ci_lo"]), float(r[f"{t}_pos_rate_ci_hi"])] == blocks[t]["pos_rate_ci95"]
            assert float(r[f"{t}_robust_pos_rate"]) == blocks[t]["robust_pos_rate"]
        assert float(r["benchmark_mean_pos_rate"]) == pytest.approx(
            sum(blocks[t]["pos_rate"] for t in types) / len(types)
        )
        assert float(r["benchmark_mean_text_only_rate"]) == pytest.approx(
            sum(blocks[t]["text_only_rate"] for t in types) / len(types)
        )
    # the markdown: the results table's per-type columns, and the section
    md = open(stem + "__LGIP_report.md", encoding="utf-8").read()
    results = md_rows(md, "## Results")[0]
    assert "Replace att pos. ↑" in results and "Swap obj pos. ↑" in results and "Color pos. ↑" not in results
    section = md_section(md, "SugarCrepe++ table")
    assert "`sugarcrepe++.jsonl.meta.json`" in section and "unweighted mean over the 2 types" in section
    table = md_rows(section, "Accuracy by type:")
    assert table[0] == [
        "Model",
        "replace_att (2 items)",
        "swap_obj (1 item)",
        "Mean (of 2 types)",
        "ITT (robust_pos_rate)",
        "TOT (text_only_rate)",
    ]
    for cells in table[1:]:
        tag = cells[0]
        b, m = fliptypes[tag]["by_flip_type"], multi[tag]
        assert (
            cells[1] == f"{b['replace_att']['pos_rate']:.3f} [{b['replace_att']['pos_rate_ci95'][0]:.3f}, "
            f"{b['replace_att']['pos_rate_ci95'][1]:.3f}]"
        )
        assert cells[3] == f"{(b['replace_att']['pos_rate'] + b['swap_obj']['pos_rate']) / 2:.3f}"  # no interval
        assert cells[4].startswith(f"{m['robust_pos_rate']:.3f} [") and cells[5].startswith(
            f"{m['text_only_rate']:.3f} ["
        )
    by_type = md_rows(section, "ITT and TOT by type:")
    assert by_type[0] == [
        "Model",
        "replace_att ITT",
        "replace_att TOT",
        "swap_obj ITT",
        "swap_obj TOT",
        "mean ITT",
        "mean TOT",
    ]
    # the page: the section, its link, the flip-type filter with the benchmark's types; the figure by type
    html = open(stem + "__LGIP_report.html", encoding="utf-8").read()
    assert '<a href="#benchmark">SugarCrepe++ table</a>' in html and '<section id="benchmark">' in html
    assert html.count('<table class="plain bench">') == 2
    assert os.path.isfile(stem + "__LGIP_fliptypes.png") and "SugarCrepe++&#39;s accuracy by type" in html
    assert os.path.isfile(stem + "__LGIP_factors.metrics.json")  # (run_all.py's report step writes it too)


def test_sugarcrepe_all_seven_types_in_order_and_without_hard_positives(sc7):
    stem = str(sc7)[: -len(".jsonl")]
    types = metrics_types(sc7)
    assert sorted(types) == SC_TYPES and types[:2] == ["add_att", "replace_att"]  # (the first image's two types first)
    md = open(stem + "__LGIP_report.md", encoding="utf-8").read()
    table = md_rows(md_section(md, "SugarCrepe table"), "Accuracy by type:")
    assert [h.split(" (")[0] for h in table[0][1:]] == types + ["Mean"]  # no ITT / TOT: SugarCrepe has no paraphrase
    assert "ITT and TOT by type" not in md
    rows = read_csv(stem + "__LGIP_report.csv")
    assert list(rows[0])[-1] == "benchmark_mean_pos_rate"
    for r in rows:
        assert float(r["benchmark_mean_pos_rate"]) == pytest.approx(
            sum(float(r[f"{t}_pos_rate"]) for t in SC_TYPES) / 7
        )


def test_types_that_are_not_lgips_make_a_benchmark_table_without_the_meta_file(sc7, tmp_path):
    folder = tmp_path / "bare"
    shutil.copytree(os.path.dirname(sc7), folder)
    os.remove(folder / (os.path.basename(sc7) + ".meta.json"))
    meta = str(sc7) + ".meta.json"  # (also looked for beside the input the evaluation recorded: moved away meanwhile)
    os.rename(meta, meta + ".away")
    try:
        run_script("report.py", f"--JSONL_PATH={folder / os.path.basename(sc7)}", "--TOP_K=0")
    finally:
        os.rename(meta + ".away", meta)
    md = (folder / "sugarcrepe__LGIP_report.md").read_text(encoding="utf-8")
    section = md_section(md, "Benchmark table")
    assert "no `import_benchmark.py` meta file beside it" in section
    assert [h.split(" (")[0] for h in md_rows(section, "Accuracy by type:")[0][1:]] == metrics_types(sc7) + ["Mean"]


def test_lgip_data_has_no_benchmark_table(tmp_path):
    from lgip.report import benchmark_source, report_types

    lgip = {"fliptypes": [{"model_tag": "m", "by_flip_type": {"number": {}, "color": {}}}]}
    assert report_types(lgip) == ["color", "number", "object"]  # LGIP's three, in LGIP's order, as always
    assert benchmark_source(str(tmp_path / "x.jsonl"), lgip, report_types(lgip)) is None
    bench = {
        "fliptypes": [{"model_tag": "m", "by_flip_type": {"same_concept": {}, "danger": {}}}],
        "explain": [{"model_tag": "m", "by_flip_type": {"danger": {}, "rand_voca": {}}}],
    }
    assert report_types(bench) == ["same_concept", "danger", "rand_voca"]
    (tmp_path / "x.jsonl.meta.json").write_text(json.dumps({"script": "import_benchmark.py", "source": "rococo"}))
    assert benchmark_source(str(tmp_path / "x.jsonl"), bench, report_types(bench))["name"] == "RoCOCO"


def test_the_benchmark_page_fits_1400_px(request, sc7, tmp_path):
    """SugarCrepe's seven types: at 1400 px the page never scrolls sideways, and the results table and the
    benchmark's table fit their boxes (the type columns' intervals wrapping as the results table's do)."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright not installed (pip install -r requirements-test.txt)"
    )
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("no Chromium installed (apt-get install -y chromium; .ci/run installs it when missing)")
    from test_report_page import _launch

    page_path = sc7.parent / "sugarcrepe__LGIP_report.html"
    errors = []
    with sync_api.sync_playwright() as p:
        browser = _launch(p, tmp_path / "profile")
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.as_uri(), wait_until="load")
            seen = page.evaluate(
                """() => ({inner: innerWidth, page: document.documentElement.scrollWidth,
                boxes: [...document.querySelectorAll('#results-section > .scroll, #benchmark .scroll')]"""
                """.map(b => [b.scrollWidth, b.clientWidth]),
                headers: [...document.querySelectorAll('#benchmark table.bench')[0].querySelectorAll('thead th')]"""
                """.map(t => t.firstChild.textContent.trim()),
                types: [...document.querySelectorAll('#results thead th')]"""
                """.map(t => t.textContent.replace(/\\u00a0/g, ' ').trim()).filter(t => / pos\\. ↑$/.test(t)),
                filters: [...document.querySelectorAll('#flips button.f-type')].map(b => b.dataset.type)})"""
            )
        finally:
            browser.close()
    assert not errors, errors
    assert seen["page"] <= seen["inner"] and len(seen["boxes"]) == 2
    assert all(scroll <= client for scroll, client in seen["boxes"]), seen["boxes"]
    types = metrics_types(sc7)
    assert seen["headers"] == ["Model"] + types + ["Mean"]
    assert seen["types"] == ["Grounded pos. ↑"] + [t.replace("_", " ").capitalize() + " pos. ↑" for t in types]
    assert seen["filters"][0] == "" and all(t in SC_TYPES for t in seen["filters"][1:])


def test_rococo_table_says_what_its_columns_are_and_where_its_own_figure_is(tmp_path):
    """RoCOCO imported, run_lgip_by_fliptype.py and run_lgip_retrieval.py (RoCOCO's own figure: retrieval
    with the altered captions in the gallery), then report.py: a column per type of the file, in its
    order, each the positive rate of its pairs as the metrics have it, with its count of pairs; the lead
    says what RoCOCO itself reports and where it is (the CSV's retrieval flip top-1 rate by type)."""
    from conftest import eval_settings, run_here
    from test_import_benchmark import rococo

    out, _ = run_import("rococo", rococo(tmp_path / "src"), tmp_path)
    for script in ("run_lgip_by_fliptype.py", "run_lgip_retrieval.py"):
        run_here(
            script,
            **eval_settings(
                out, "corrected", [OPENCLIP_TINY, SIGLIP_TINY], IMAGE_ROOT=None, BOOTSTRAP=20, CACHE_DIR=None
            ),
        )
    run_script("report.py", f"--JSONL_PATH={out}", "--TOP_K=0")
    stem = str(out)[: -len(".jsonl")]
    types = metrics_types(out)
    assert types == ["same_concept", "danger"]  # (the files' order; diff_concept and rand_voca have no item)
    md = open(stem + "__LGIP_report.md", encoding="utf-8").read()
    section = md_section(md, "RoCOCO table")
    assert (
        "RoCOCO itself reports retrieval with the altered captions in the gallery: `run_lgip_retrieval.py`'s flip "
        "top-1 rate, by type in the CSV" in section
    )
    assert "RoCOCO: https://github.com/pseulki/rococo." in section
    table = md_rows(section, "Accuracy by type:")
    metrics = {m["model_tag"]: m for m in json.load(open(stem + "__LGIP_fliptypes.metrics.json"))}
    counts = [next(iter(metrics.values()))["by_flip_type"][t]["count"] for t in types]
    assert counts == [10, 5]  # (pairs: an 11-text entry's sixth original has no altered version)
    assert table[0][1:] == [f"{t} ({n} items)" for t, n in zip(types, counts)] + ["Mean (of 2 types)"]
    for cells in table[1:]:
        m = metrics[cells[0]]
        for t, cell in zip(types, cells[1:]):
            assert cell.strip("* ").startswith(f"{m['by_flip_type'][t]['pos_rate']:.3f}"), (t, cell)
    rows = read_csv(stem + "__LGIP_report.csv")
    retrieval = {m["model_tag"]: m for m in json.load(open(stem + "__LGIP_retrieval.metrics.json"))}
    for r in rows:
        for t in types:
            want = retrieval[r["model"]]["by_flip_type"][t]["i2t_flip_top1_rate"]
            assert float(r[f"retrieval_{t}_i2t_flip_top1_rate"]) == pytest.approx(want, abs=1e-12)


def test_a_meta_file_of_the_wrong_shape_is_named(sc7, tmp_path):
    """import_benchmark.py's meta file, read for the benchmark table's counts and notes: a field of
    the wrong type stops the report with the file and the field (a traceback before)."""
    folder = tmp_path / "bad"
    shutil.copytree(os.path.dirname(sc7), folder)
    meta = folder / (os.path.basename(sc7) + ".meta.json")
    good = json.loads(meta.read_text(encoding="utf-8"))
    for change, said in (
        ({"items_by_type": ["add_att"]}, "field 'items_by_type' is ['add_att'] (list), not an object of counts"),
        ({"items_written_by_type": {"add_att": "3"}}, "field 'items_written_by_type' is"),
        ({"num_images_missing": -1}, "field 'num_images_missing' is -1 (int), not a count"),
    ):
        meta.write_text(json.dumps(dict(good, **change)), encoding="utf-8")
        proc = run_script("report.py", f"--JSONL_PATH={folder / os.path.basename(sc7)}", "--TOP_K=0", check=False)
        assert proc.returncode == 2 and f"error: {meta}: {said}" in proc.stderr, proc.stderr
