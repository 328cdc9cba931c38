"""Results that leave the tool: an evaluation's per-pair scores as one flat table (`lgip export`, EXPORT), read back
with pandas; two runs compared on the images both scored (`lgip compare`), section 9's paired bootstrap, the lines
and the file; the errors a user meets (no shared image, no score file, models to name)."""

import json
import os
import shutil

import numpy as np
import pytest

from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, SIGLIP_TINY, eval_settings, run_here

pd = pytest.importorskip("pandas", reason="pandas reads the tables back (pip install -r requirements-test.txt)")
COLUMNS = ["model", "record", "line", "caption_index", "kind", "type", "text", "score", "image_path"]
INPUT = "fixture_with_fliptypes.jsonl"


def _input(folder, n=None, edit=None):
    """A copy of the fixture's fliptypes input in `folder` (its first n lines), each record edited by `edit`."""
    os.makedirs(folder, exist_ok=True)
    lines = open(os.path.join(REFERENCE, INPUT), encoding="utf-8").read().splitlines()[:n]
    if edit is not None:
        lines = [json.dumps(edit(json.loads(x)), ensure_ascii=False) for x in lines]
    path = os.path.join(folder, INPUT)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _fliptypes(folder, models, n=None, edit=None, **extra):
    src = _input(folder, n, edit)
    settings = eval_settings(src, "corrected", models=models, BOOTSTRAP=200, OUTPUT_DIR=str(folder), **extra)
    return run_here("run_lgip_by_fliptype.py", **settings)[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run A: tiny_openclip on the whole input, EXPORT="csv"; run B: tiny_siglip on its first 6 lines."""
    root = tmp_path_factory.mktemp("runs")
    a = _fliptypes(root / "a", [OPENCLIP_TINY], EXPORT="csv")
    b = _fliptypes(root / "b", [SIGLIP_TINY], n=6)
    return root, a, b


def test_export_setting_writes_the_flat_table_with_its_meta(runs):
    root, rows, _ = runs
    table = pd.read_csv(root / "a" / "fixture_with_fliptypes__LGIP_fliptypes_pairs.csv")
    assert list(table.columns[: len(COLUMNS)]) == COLUMNS and "gap" in table.columns
    assert not (root / "a" / "fixture_with_fliptypes__LGIP_fliptypes_pairs.parquet").exists()  # (EXPORT="csv")
    scores = [json.loads(x) for x in open(root / "a" / rows[0]["scores_file"], encoding="utf-8")]
    flips = sum(len(s.get("flips", [])) for s in scores)
    assert (table.kind == "caption").sum() == len(scores) and (table.kind == "flip").sum() == flips
    assert (table.kind == "paraphrase").sum() == sum(len(s.get("paraphrases", [])) for s in scores)
    assert rows[0]["by_flip_type"]["color"]["count"] == ((table.kind == "flip") & (table.type == "color")).sum()
    first = scores[0]
    caption = table[(table.line == first["line"]) & (table.caption_index == first["caption_index"])]
    assert caption.iloc[0].text == first["caption"] and caption.iloc[0].score == pytest.approx(first["sim"])
    assert list(caption[caption.kind == "flip"].text) == [f["text"] for f in first["flips"]]
    gaps = caption[caption.kind == "flip"].gap.to_numpy()
    assert np.allclose(gaps, [round(first["sim"] - f["sim"], 6) for f in first["flips"]], atol=1e-9)
    # the table's flips give the row's positive rate (to the score file's 6 decimals)
    assert ((table[table.kind == "flip"].gap > 0).mean()) == pytest.approx(rows[0]["sensitivity_pos_rate"], abs=0.02)
    meta = json.load(open(root / "a" / "fixture_with_fliptypes__LGIP_fliptypes_pairs.meta.json"))
    assert meta["rows"] == len(table) and meta["models"][0]["model"] == "tiny_openclip" and not meta["left_out"]
    assert meta["models"][0]["run"]["config"]["EXPORT"] == "csv" and "torch" in meta["models"][0]["run"]["versions"]
    assert meta["export"]["versions"]["python"]


def test_lgip_export_of_a_folder_writes_csv_and_parquet_alike(runs, tmp_path, capsys):
    pytest.importorskip("pyarrow", reason="parquet needs pyarrow")
    from lgip.command import main

    root, _, _ = runs
    folder = shutil.copytree(root / "b", tmp_path / "b")
    assert main(["export", str(folder)]) == 0
    out = capsys.readouterr().out
    csv_path = folder / "fixture_with_fliptypes__LGIP_fliptypes_pairs.csv"
    assert f"-> {csv_path}" in out
    a, b = pd.read_csv(csv_path), pd.read_parquet(csv_path.with_suffix(".parquet"))
    assert list(b.columns) == list(a.columns) and len(a) == len(b) > 0
    assert b.record.dtype == np.int64 and (a.text.fillna("") == b.text.fillna("")).all()
    assert np.allclose(a.score, b.score) and set(a.kind) == {"caption", "paraphrase", "flip"}
    metrics = folder / "fixture_with_fliptypes__LGIP_fliptypes.metrics.json"  # (a metrics file: the same table)
    assert main(["export", str(metrics), "--FORMAT=csv"]) == 0 and pd.read_csv(csv_path).equals(a)
    assert main(["export", str(tmp_path / "nowhere")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert main(["export", str(folder), "--FORMT=csv"]) == 2
    assert "unknown setting 'FORMT' (did you mean FORMAT?)" in capsys.readouterr().err


def test_an_image_side_score_file_exports_its_altered_images_by_kind(tmp_path):
    """The image side's groups: a row per altered image, kind image_paraphrase / image_flip, type its alteration,
    text the caption it was scored with, other_image_path the image a flip mixed in."""
    from lgip.export import export

    line = {
        "line": 3,
        "image_id": 7,
        "image_path": "images/a.jpg",
        "caption_index": 0,
        "caption": "a red bus",
        "sim": 0.3,
        "image_paraphrases": [{"text": "jpeg", "sim": 0.29}],
        "image_flips": [{"text": "mix", "sim": 0.31, "other_image_path": "images/b.jpg", "r": 0}],
        "score_kind": "cosine",
    }
    (tmp_path / "x__LGIP_images_m.scores.jsonl").write_text(json.dumps(line) + "\n")
    row = {"model_tag": "m", "scores_file": "x__LGIP_images_m.scores.jsonl", "run": {"script": "run_lgip_images.py"}}
    (tmp_path / "x__LGIP_images.metrics.json").write_text(json.dumps([row]))
    export(str(tmp_path), "csv")
    table = pd.read_csv(tmp_path / "x__LGIP_images_pairs.csv")
    assert list(table.kind) == ["caption", "image_paraphrase", "image_flip"] and list(table.record) == [7, 7, 7]
    assert list(table.type.fillna("")) == ["", "jpeg", "mix"] and set(table.text) == {"a red bus"}
    assert table.gap.tolist()[1:] == pytest.approx([0.01, -0.01]) and table.other_image_path.iloc[2] == "images/b.jpg"


def test_compare_pairs_two_runs_on_the_images_both_scored(runs, tmp_path, monkeypatch, capsys):
    from lgip.command import main

    root, _, _ = runs
    monkeypatch.chdir(tmp_path)
    assert main(["compare", str(root / "a"), str(root / "b"), "--BOOTSTRAP=300"]) == 0
    out = capsys.readouterr().out
    assert "A tiny_openclip" in out and "B tiny_siglip" in out and "6 image(s) both scored" in out
    lines = [x.strip() for x in out.splitlines() if x.startswith("  ")]
    overall = next(x for x in lines if x.startswith("sensitivity_pos_rate:"))
    assert any(x.startswith("sensitivity_pos_rate [color]: A ") for x in lines)
    saved = json.load(open(tmp_path / "fixture__LGIP_compare.metrics.json"))
    row = next(r for r in saved if r["figure"] == "sensitivity_pos_rate" and r["flip_type"] is None)
    lo, hi = row["diff_ci95"]
    assert overall == (
        f"sensitivity_pos_rate: A {row['a_value']:.3f}, B {row['b_value']:.3f}, diff {row['diff']:+.3f} "
        f"[{lo:+.3f}, {hi:+.3f}]"
    )
    assert row["num_images"] == 6 and row["model_a"] == "tiny_openclip" and row["run"]["config"]["BOOTSTRAP"] == 300
    # A's figure over the shared images, from its exported table: the images of B's six lines alone
    table = pd.read_csv(root / "a" / "fixture_with_fliptypes__LGIP_fliptypes_pairs.csv")
    b_images = {(x["line"], x["image_path"]) for x in map(json.loads, open(next((root / "b").glob("*.scores.jsonl"))))}
    shared = np.array([k in b_images for k in zip(table.line, table.image_path)])
    flips = table[(table.kind == "flip").to_numpy() & shared]
    assert row["a_value"] == pytest.approx((flips.gap > 0).mean(), abs=1e-12)
    assert row["diff"] == pytest.approx(row["a_value"] - row["b_value"]) and lo <= row["diff"] <= hi
    # the same figures again: the same interval (seeded); another seed's differs
    assert main(["compare", str(root / "a"), str(root / "b"), "--BOOTSTRAP=300", "--BOOTSTRAP_SEED=1"]) == 0
    capsys.readouterr()
    again = json.load(open(tmp_path / "fixture__LGIP_compare.metrics.json"))
    assert len(again) == len(saved)  # (the same runs' comparisons replaced, not added twice)


def test_compare_says_what_is_wrong(runs, tmp_path, monkeypatch, capsys):
    from lgip.command import main

    root, _, _ = runs
    monkeypatch.chdir(tmp_path)
    moved = _fliptypes(
        tmp_path / "moved", [OPENCLIP_TINY], n=4, edit=lambda r: dict(r, image_path="./" + r["image_path"])
    )
    assert moved and main(["compare", str(root / "a"), str(tmp_path / "moved")]) == 2
    assert "share no image" in capsys.readouterr().err
    _fliptypes(tmp_path / "noscores", [OPENCLIP_TINY], n=4, WRITE_SCORES=False)
    assert main(["compare", str(root / "a"), str(tmp_path / "noscores")]) == 2
    assert "WRITE_SCORES=True" in capsys.readouterr().err
    two = tmp_path / "two"
    shutil.copytree(root / "b", two)
    rows = json.load(open(two / "fixture_with_fliptypes__LGIP_fliptypes.metrics.json"))
    other = dict(rows[0], model_tag="other")
    (two / "fixture_with_fliptypes__LGIP_fliptypes.metrics.json").write_text(json.dumps(rows + [other]))
    assert main(["compare", str(root / "a"), str(two)]) == 2
    assert "--A=<a model of RUN_A> --B=<a model of RUN_B>" in capsys.readouterr().err
    assert main(["compare", str(root / "a"), str(two), "--B=other"]) == 0  # (A: its one model)
    assert "A tiny_openclip" in capsys.readouterr().out
    assert main(["compare", str(root / "a")]) == 2 and "two runs" in capsys.readouterr().err


def test_export_is_checked_before_any_work(tmp_path):
    from lgip.errors import ConfigError

    src = _input(tmp_path)
    for bad, said in (
        ({"EXPORT": "xlsx"}, "EXPORT must be"),
        ({"EXPORT": "csv", "WRITE_SCORES": False}, "WRITE_SCORES"),
    ):
        with pytest.raises(ConfigError, match=said):
            run_here("run_lgip_by_fliptype.py", **eval_settings(src, models=[OPENCLIP_TINY], **bad))
    assert sorted(os.listdir(tmp_path)) == [INPUT]  # (nothing written)
    assert os.path.isdir(FIXTURES)
