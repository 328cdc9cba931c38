"""report.py's section "Fine-tuning" (LGIP_SPEC.md 14; lgip/report/finetune_text.py, finetune_plot.py): on the
held-out file of run_all's FINETUNE, the start and each arm with the figures of the metrics files, each arm's
paired comparisons with its start and a sentence on whether it beat it, the loss curves written and embedded;
no such section in an ordinary report; a corrupt train log named by file, line and field, a running arm marked,
a missing retrieval evaluation said."""

import base64
import contextlib
import json
import os
import re
import shutil

import pytest

from conftest import OPENCLIP_TINY, run_here, run_script
from lgip.errors import InputError
from lgip.report.finetune_text import load_meta

STEM = "lgip_demo_with_fliptypes__ft_heldout"
START = "tiny_openclip"
ARMS = ["tiny_openclip__ft_plain", "tiny_openclip__ft_lgip"]
POINTS = [f"{a}__wise0.5" for a in ARMS]  # (FINETUNE's default WiSE-FT alpha)
LINEUP = [START, ARMS[0], POINTS[0], ARMS[1], POINTS[1]]  # (the probe's MODELS: each arm, then its WiSE-FT point)
STEPS = "diff_gen_caption,make_perturb_with_fliptypes,finetune,wise_ft,finetune_by_fliptype,finetune_retrieval,"
STEPS += "finetune_report,run_lgip_by_fliptype,report"  # (the fine-tuning's steps and one ordinary report)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo's folder after run_all with FINETUNE (2 arms of the tiny open_clip model, 3 steps each)."""
    from lgip.demo import demo_inputs

    folder = tmp_path_factory.mktemp("finetune_report") / "demo"
    demo_inputs(folder)
    ft = {"model": OPENCLIP_TINY, "STEPS": 3, "BATCH_SIZE": 4, "WARMUP": 1, "SAVE_EVERY": 3, "LR": 1e-3}
    args = [f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}", "--DATA=demo", "--MODELS=demo", "--DEVICE=cpu"]
    run_script("run_all.py", *args, "--NUM_WORKERS=0", f"--STEPS={STEPS}", f"--FINETUNE={ft!r}")
    return folder


def section(md):
    """The markdown of the section "Fine-tuning" ('' when there is none)."""
    return md.split("\n## Fine-tuning\n", 1)[1].split("\n## ", 1)[0] if "\n## Fine-tuning\n" in md else ""


def table(text, first):
    """The rows of the markdown table whose header starts with `first`, each {header: cell}."""
    lines = text.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith(f"| {first}"))
    cells = lambda x: [c.strip() for c in x.strip().strip("|").split("|")]
    header, rows = cells(lines[at]), []
    for x in lines[at + 2 :]:
        if not x.startswith("|"):
            break
        rows.append(dict(zip(header, cells(x))))
    return rows


def figure(v, lo, hi, digits):
    return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def report(demo, prefix, **extra):
    """report.py on the held-out file, its outputs at `prefix` (the module's own report left as it is)."""
    run_here("report.py", JSONL_PATH=str(demo / f"{STEM}.jsonl"), OUTPUT_PREFIX=str(prefix), TOP_K=0, **extra)
    return open(f"{prefix}report.md", encoding="utf-8").read()


@contextlib.contextmanager
def changed(path, text):
    """`path` holding `text` (None: moved away) for the block's time, then as it was."""
    keep = f"{path}.kept"
    shutil.copy(path, keep)
    try:
        if text is None:
            os.remove(path)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        yield
    finally:
        os.replace(keep, path)


def test_the_table_has_the_start_then_each_arm_with_the_metrics_figures(demo):
    rows = table(section((demo / f"{STEM}__LGIP_report.md").read_text(encoding="utf-8")), "Model")
    assert [r["Model"] for r in rows] == [f"`{t}`" for t in LINEUP]
    assert [r["W_SC / W_INV / W_VC"] for r in rows] == ["start", "0 / 0 / 0", "WiSE-FT α 0.5", "1 / 1 / 0"] + [
        "WiSE-FT α 0.5"
    ]
    assert [r["Steps"] for r in rows] == ["–", "3", "–", "3", "–"]
    flips = json.load(open(demo / f"{STEM}__LGIP_fliptypes.metrics.json"))
    found = json.load(open(demo / f"{STEM}__LGIP_retrieval.metrics.json"))
    assert [m["model_tag"] for m in flips] == [m["model_tag"] for m in found] == LINEUP
    for r, m, ret in zip(rows, flips, found):
        g = m["global_sensitivity"]
        assert r["Pos. rate"] == figure(g["pos_rate"], *g["pos_rate_ci95"], 3)
        for t in ("color", "number", "object"):
            b = m["by_flip_type"][t]
            assert r[t] == figure(b["pos_rate"], *b["pos_rate_ci95"], 3)
        assert r["Grounded pos."] == figure(m["grounded_pos_rate"], *m["grounded_pos_rate_ci95"], 3)
        assert r["Inv. error"] == figure(m["invariance_error_mean"], *m["invariance_error_mean_ci95"], 4)
        assert r["I2T R@1"] == figure(ret["i2t_recall@1"], *ret["i2t_recall@1_ci95"], 3)
        assert r["T2I R@1"] == figure(ret["t2i_recall@1"], *ret["t2i_recall@1_ci95"], 3)


def test_each_arm_is_compared_with_its_start_and_the_other_arm(demo):
    md = section((demo / f"{STEM}__LGIP_report.md").read_text(encoding="utf-8"))
    rows = table(md, "Arm − reference")
    comparisons = json.load(open(demo / f"{STEM}__LGIP_comparisons.metrics.json"))
    signed = lambda v: f"{0.0 - v:+.3f}"  # (arm − start: the file's start − arm, turned)
    for arm in ARMS:
        for figure_, name in (("sensitivity_pos_rate", "Pos. rate"), ("grounded_pos_rate", "Grounded pos.")):
            row = next(
                r for r in rows if r["Arm − reference"] == f"`{arm}` − `{START}`" and r["Figure"].startswith(name)
            )
            for t in (None, "color", "number", "object"):
                c = next(
                    c for c in comparisons if (c["a"], c["b"], c["figure"], c["flip_type"]) == (START, arm, figure_, t)
                )
                want = f"{signed(c['diff'])} [{signed(c['diff_ci95'][1])}, {signed(c['diff_ci95'][0])}]"
                assert row["all" if t is None else t] == (f"**{want}**" if c["excludes_zero"] else want)
        pos = next(
            c
            for c in comparisons
            if (c["a"], c["b"], c["figure"], c["flip_type"]) == (START, arm, "sensitivity_pos_rate", None)
        )
        sentence = next(x for x in md.splitlines() if x.startswith(f"- `{arm}` against its start `{START}`: "))
        assert "on positive rate" in sentence and "on invariance error" in sentence
        assert ("which excludes 0" if pos["excludes_zero"] else "which contains 0") in sentence.split(";")[0]
    assert any(r["Arm − reference"] == f"`{ARMS[1]}` − `{ARMS[0]}`" for r in rows)
    assert "on the 2 held-out images that no arm trained on" in md
    # the later arm against the earlier (the plain control): every figure beyond noise in the table, said
    from lgip.report.finetune_text import FIGURE_WORDS

    sentence = next(x for x in md.splitlines() if x.startswith(f"- `{ARMS[1]}` against its start `{START}`: "))
    against = sentence.split(f" Against `{ARMS[0]}`: ")[1]
    beyond = [
        c["figure"]
        for c in comparisons
        if {c["a"], c["b"]} == set(ARMS) and c["flip_type"] is None and c["excludes_zero"]
    ]
    assert all(FIGURE_WORDS[f] in against for f in beyond) and (beyond or against.startswith("no figure beyond"))


def test_a_figure_beyond_noise_between_two_arms_is_said_with_its_side():
    from lgip.report.finetune_text import _beyond_noise

    found = {
        ("lgip", "plain", "image_sensitivity_pos_rate", None): (-0.009, -0.017, -0.001),
        ("lgip", "plain", "invariance_error_mean", None): (-0.002, -0.004, -0.001),
        ("lgip", "plain", "sensitivity_pos_rate", None): (0.01, -0.02, 0.04),
        ("lgip", "plain", "sensitivity_pos_rate", "color"): (0.2, 0.1, 0.3),
    }
    assert _beyond_noise(found, "lgip", "plain") == [
        "image positive rate fell (-0.009, 95% interval -0.017 to -0.001: worse)",
        "invariance error fell (-0.0020, 95% interval -0.0040 to -0.0010: better)",
    ]
    assert _beyond_noise(found, "plain", "lgip") is None


def test_the_loss_curves_are_drawn_and_embedded_in_the_page(demo):
    from PIL import Image

    png = demo / f"{STEM}__LGIP_finetune.png"
    with Image.open(png) as img:
        assert img.width > 600 and img.height > 400
    assert f"]({png.name})" in section((demo / f"{STEM}__LGIP_report.md").read_text(encoding="utf-8"))
    html = (demo / f"{STEM}__LGIP_report.html").read_text(encoding="utf-8")
    assert 'id="finetune"' in html and 'href="#finetune"' in html
    assert base64.b64encode(png.read_bytes()).decode("ascii") in html
    assert "(training not finished)" not in html


def test_an_ordinary_report_has_no_fine_tuning_section(demo):
    md = (demo / "lgip_demo__LGIP_report.md").read_text(encoding="utf-8")
    assert "## Results" in md and section(md) == ""
    assert 'id="finetune"' not in (demo / "lgip_demo__LGIP_report.html").read_text(encoding="utf-8")
    assert not (demo / "lgip_demo__LGIP_finetune.png").exists()


def test_a_corrupt_train_log_line_is_named_with_its_file_line_and_field(demo, tmp_path):
    log = demo / f"lgip_demo_with_fliptypes__ft_{ARMS[1]}" / "train_log.jsonl"
    lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
    bad = json.dumps(dict(json.loads(lines[1]), loss="1.5")) + "\n"
    with changed(log, lines[0] + bad + "".join(lines[2:])):
        with pytest.raises(
            InputError, match=re.escape(f"{log}: line 2: field 'loss' is the string '1.5', not a number")
        ):
            report(demo, tmp_path / "bad_")
    with changed(log, "".join(lines[:2]) + '{"step": 2, "loss": 1.') as _, pytest.raises(InputError) as e:
        report(demo, tmp_path / "cut_")
    assert f"{log}:3: invalid JSON" in str(e.value) and "no output was written" in str(e.value)
    assert not list(tmp_path.iterdir())


def test_a_running_arm_is_marked_and_a_missing_retrieval_is_said(demo, tmp_path):
    meta_path = demo / f"lgip_demo_with_fliptypes__ft_{ARMS[1]}" / "finetune.meta.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    with changed(meta_path, json.dumps(dict(meta, status="running", steps_done=1))):
        md = section(report(demo, tmp_path / "running_"))
    row = table(md, "Model")[3]
    assert row["Model"] == f"`{ARMS[1]}` (training not finished)" and row["Steps"] == "1 of 3"
    assert f"- `{ARMS[1]}` (training not finished) against its start" in md
    with changed(demo / f"{STEM}__LGIP_retrieval.metrics.json", None):
        md = section(report(demo, tmp_path / "noretrieval_"))
    assert {(r["I2T R@1"], r["T2I R@1"]) for r in table(md, "Model")} == {("not run", "not run")}
    with changed(meta_path, json.dumps(dict(meta, config=dict(meta["config"], W_SC="1")))):
        with pytest.raises(InputError, match=r"finetune.meta.json: field 'config.W_SC' is the string '1'"):
            load_meta(str(meta_path))


def test_a_wise_points_meta_is_checked_and_named_by_its_field(tmp_path):
    from lgip.report.finetune_text import load_wise_meta

    path = tmp_path / "wise.meta.json"
    good = {"alpha": 0.25, "start": {"name": START}, "arm": {"name": ARMS[1]}}
    path.write_text(json.dumps(good), encoding="utf-8")
    assert load_wise_meta(str(path)) == {"alpha": 0.25, "start": START, "arm": ARMS[1]}
    for bad, words in (
        ({"alpha": 1.5}, "field 'alpha' is 1.5 (float), not a number from 0 to 1"),
        ({"arm": None}, "'arm.name'"),
    ):
        path.write_text(json.dumps(dict(good, **bad)), encoding="utf-8")
        with pytest.raises(InputError, match=re.escape(words)):
            load_wise_meta(str(path))
