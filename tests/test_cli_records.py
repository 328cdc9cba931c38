"""The command line and the records: --NAME=value overrides of a script's constants (lgip/cli.py),
JSONL reading and validation with file:line and field in every error (lgip/records.py), atomic
writes (lgip/util.py) and run_main's exit codes."""

import json
import os

import pytest

from lgip.cli import configure, run_main
from lgip.errors import InputError
from lgip.records import iter_records
from lgip.outputs import atomic_open
from conftest import BASE_JSONL, OPENCLIP_TINY, REFERENCE, eval_args, run_script


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


GOOD = json.dumps({"image_path": "a.jpg", "orig_captions": ["A red bus on the road."]})


@pytest.mark.parametrize(
    "bad_line,expected",
    [
        ('{"image_path": "a.jpg", "orig_captions": [', ":3: invalid JSON"),
        ('{"image_path": "a.jpg"}', ":3: missing field 'orig_captions'"),
        ('{"image_path": "a.jpg", "orig_captions": ["ok", 7]}', ":3: field 'orig_captions[1]' is int"),
        ('{"image_path": "a.jpg", "orig_captions": "A bus"}', ":3: field 'orig_captions' is str"),
        ('{"orig_captions": ["A bus"]}', ":3: missing field 'image_path'"),
        ("[1, 2]", ":3: expected a JSON object"),
        # valid JSON, but no text: nothing can write or tokenize a lone surrogate; no path holds a NUL
        (
            '{"image_path": "a.jpg", "orig_captions": ["A bus \\ud800"]}',
            ":3: field 'orig_captions[0]' holds a lone UTF-16 surrogate",
        ),
        (
            '{"image_path": "a\\u0000.jpg", "orig_captions": ["A bus"]}',
            ":3: field 'image_path' contains a NUL character",
        ),
        ('{"image_path": "a.jpg", "orig_captions": ["A bus", ""]}', ":3: field 'orig_captions[1]' is empty"),
        ('{"image_path": "a.jpg", "orig_captions": ["A bus", " \\t"]}', ":3: field 'orig_captions[1]' is blank"),
    ],
)
@pytest.mark.parametrize(
    "script", ["diff_gen_caption.py", "make_perturb_with_fliptypes.py", "rebuttal_enhanced_perturb_with_fliptypes.py"]
)
def test_malformed_record_stops_with_file_line_field(tmp_path, script, bad_line, expected):
    src = write_lines(tmp_path / "in.jsonl", [GOOD, "", bad_line, GOOD])
    out = tmp_path / "out.jsonl"
    out.write_text("previous run\n")
    proc = run_script(script, f"--INPUT_JSONL={src}", f"--OUTPUT_JSONL={out}", check=False)
    assert proc.returncode == 2
    assert f"{src}{expected}" in proc.stderr
    assert out.read_text() == "previous run\n"  # no half-written output replaced it
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


GENERATORS = ["diff_gen_caption.py", "make_perturb_with_fliptypes.py", "rebuttal_enhanced_perturb_with_fliptypes.py"]


@pytest.mark.parametrize("script", GENERATORS)
def test_generator_refuses_to_write_over_its_input(tmp_path, script):
    src = write_lines(tmp_path / "in.jsonl", [GOOD])
    (tmp_path / "link.jsonl").symlink_to(src)
    for output in (src, tmp_path / "link.jsonl", tmp_path / "." / "in.jsonl"):
        proc = run_script(script, f"--INPUT_JSONL={src}", f"--OUTPUT_JSONL={output}", check=False)
        assert proc.returncode == 2 and "is the input file" in proc.stderr and "Traceback" not in proc.stderr
        assert src.read_text() == GOOD + "\n"
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "link.jsonl"]


def test_generator_input_missing_or_a_folder_is_said(tmp_path):
    for path, said in ((tmp_path / "none.jsonl", "no such file"), (tmp_path, "is a directory, expected a JSONL file")):
        proc = run_script(
            "diff_gen_caption.py", f"--INPUT_JSONL={path}", f"--OUTPUT_JSONL={tmp_path / 'o.jsonl'}", check=False
        )
        assert proc.returncode == 2 and f"{path}: {said}" in proc.stderr and "Traceback" not in proc.stderr
    assert os.listdir(tmp_path) == []


def test_caption_keyed_fields_take_only_caption_indices(tmp_path):
    rec = {
        "image_path": "a.jpg",
        "orig_captions": ["A red bus.", "A dog."],
        "same_caps": {"0": [], "1": []},
        "diff_caps": {"0": ["A blue bus."], "7": ["lost"], "x": ["lost"]},
    }
    src = write_lines(tmp_path / "in.jsonl", ["", json.dumps(rec)])
    with pytest.raises(
        InputError,
        match=r"in.jsonl:2: field 'diff_caps' has key '7', not a caption index "
        r'\("0".."1" for this record.s 2 captions\)',
    ):
        list(iter_records(str(src), per_caption_fields=["same_caps", "diff_caps"]))
    rec["diff_caps"] = {"0": [], "01": []}
    write_lines(src, [json.dumps(rec)])
    with pytest.raises(InputError, match=r"in.jsonl:1: field 'diff_caps' has key '01'"):
        list(iter_records(str(src), per_caption_fields=["diff_caps"]))
    rec["diff_caps"] = {"1": ["A cat."], "0": []}  # any order; a caption may be absent
    write_lines(src, [json.dumps(rec)])
    assert len(list(iter_records(str(src), per_caption_fields=["same_caps", "diff_caps"]))) == 1


def test_paired_surrogates_are_text(tmp_path):
    src = write_lines(
        tmp_path / "in.jsonl", [json.dumps({"image_path": "a.jpg", "orig_captions": ["A \U0001f600 bus"]})]
    )
    assert "\\ud83d" in src.read_text() and list(iter_records(str(src)))[0][1]["orig_captions"] == ["A \U0001f600 bus"]


def test_too_long_caption_skips_its_record_alone(tmp_path):
    """Over MAX_CAPTION_WORDS a record is skipped before any random call: the others are as they
    would be without it (its double synonym swaps grow with the square of its length)."""
    lines = open(BASE_JSONL, encoding="utf-8").read().splitlines()
    long = json.dumps({"image_path": "long.jpg", "orig_captions": ["a red dog sits " * 30]})
    with_long = write_lines(tmp_path / "with.jsonl", lines[:3] + [long] + lines[3:6])
    without = write_lines(tmp_path / "without.jsonl", lines[:6])
    script = "rebuttal_enhanced_perturb_with_fliptypes.py"
    proc = run_script(script, f"--INPUT_JSONL={with_long}", f"--OUTPUT_JSONL={tmp_path / 'a.jsonl'}")
    run_script(script, f"--INPUT_JSONL={without}", f"--OUTPUT_JSONL={tmp_path / 'b.jsonl'}")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (
        f"{with_long}:4: record skipped: field 'orig_captions[0]' has 120 words, over MAX_CAPTION_WORDS=100"
        in proc.stdout
    )
    assert "written 6 records; 1 skipped (caption over MAX CAPTION WORDS)" in proc.stdout
    meta = json.load(open(tmp_path / "a.jsonl.meta.json"))
    assert meta["counts"]["skipped_caption_over_MAX_CAPTION_WORDS"] == 1 and meta["counts"]["written"] == 6


@pytest.mark.parametrize("script", ["diff_gen_caption.py", "rebuttal_enhanced_perturb_with_fliptypes.py"])
def test_a_generator_with_no_record_to_write_stops_and_writes_nothing(tmp_path, script):
    """An empty input, or one whose every record is skipped, is an input error (exit 2), no output."""
    long = json.dumps({"image_path": "long.jpg", "orig_captions": ["a red dog sits " * 30]})
    cases = [("empty.jsonl", ["", "  "], "the file is empty or holds only blank lines")]
    if script.startswith("rebuttal"):
        cases.append(("long.jsonl", [long, long], "all 2 skipped (2 caption over MAX CAPTION WORDS)"))
    for name, lines, why in cases:
        src = write_lines(tmp_path / name, lines)
        out = tmp_path / ("out_" + name)
        proc = run_script(script, f"--INPUT_JSONL={src}", f"--OUTPUT_JSONL={out}", check=False)
        assert proc.returncode == 2 and f"{src}: no record to write: {why}; {out} was not written" in proc.stderr
        assert (
            "Traceback" not in proc.stderr and not out.exists() and not (tmp_path / (out.name + ".meta.json")).exists()
        )
        assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_a_killed_generators_temp_file_is_removed_by_the_next_run(tmp_path):
    out = tmp_path / "out.jsonl"
    stale, live = tmp_path / ".out.jsonl.k1ll3d.tmp", tmp_path / ".out.jsonl.wr1t1n.tmp"
    stale.write_text("half")
    live.write_text("being written")
    os.utime(stale, (1e9, 1e9))  # untouched for years: its writer is gone
    proc = run_script("diff_gen_caption.py", f"--INPUT_JSONL={BASE_JSONL}", f"--OUTPUT_JSONL={out}")
    assert "removed 1 temp file(s) a killed earlier run left for out.jsonl" in proc.stdout
    assert not stale.exists() and live.exists()  # a fresh one may be another run's, writing


def test_blank_lines_are_skipped(tmp_path):
    src = write_lines(tmp_path / "in.jsonl", ["", GOOD, "   ", GOOD, ""])
    assert [n for n, _ in iter_records(str(src))] == [2, 4]


def test_per_caption_fields_are_validated(tmp_path):
    rec = {"image_path": "a.jpg", "orig_captions": ["x"], "same_caps": {"0": ["ok", None]}}
    src = write_lines(tmp_path / "in.jsonl", [json.dumps(rec)])
    with pytest.raises(InputError, match=r"in.jsonl:1: field 'same_caps.0\[1\]' is NoneType"):
        list(iter_records(str(src), per_caption_fields=["same_caps"]))
    with pytest.raises(InputError, match=r"in.jsonl:1: missing field 'diff_caps'"):
        list(iter_records(str(src), per_caption_fields=["diff_caps"]))


def test_atomic_open_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "x.json"
    with pytest.raises(RuntimeError):
        with atomic_open(str(target)) as f:
            f.write("partial")
            raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []


def test_outputs_get_the_mode_of_any_file_the_user_makes(tmp_path):
    """Not mkstemp's 0600: on a shared machine colleagues read the results as the user's umask allows."""
    (tmp_path / "plain.txt").write_text("x")
    with atomic_open(str(tmp_path / "x.json")) as f:
        f.write("{}")
    assert os.stat(tmp_path / "x.json").st_mode & 0o777 == os.stat(tmp_path / "plain.txt").st_mode & 0o777


def test_configure_overrides_and_errors(capsys):
    ns = {"__file__": "x.py", "BATCH": 32, "NAME": "a", "PATH": None}
    cfg = configure(ns, ["--BATCH=64", "--NAME=cuda:0", "--PATH=[1, 'b']"])
    assert cfg == {"BATCH": 64, "NAME": "cuda:0", "PATH": [1, "b"]} and ns["BATCH"] == 64
    assert "override: BATCH = 64" in capsys.readouterr().out
    for argv, message in (
        (["--BATC=1"], "unknown setting 'BATC' (did you mean BATCH?); valid settings: BATCH, NAME, PATH"),
        (["BATCH=1"], "expected --NAME=value"),
    ):
        with pytest.raises(SystemExit) as e:
            configure(ns, argv)
        assert e.value.code == 2 and message in capsys.readouterr().err  # (2: as every other bad input)


def test_help_lists_constants_with_comments():
    proc = run_script("diff_gen_caption.py", "--help")
    assert "--MAX_SAME_PER_CAP=6" in proc.stdout
    assert "paraphrases kept per caption" in proc.stdout


def test_default_output_is_next_to_input(tmp_path):
    src = tmp_path / "base.jsonl"
    src.write_bytes(open(BASE_JSONL, "rb").read())
    run_script("make_perturb_with_fliptypes.py", f"--INPUT_JSONL={src}")
    assert (tmp_path / "base_with_fliptypes.jsonl").exists()
    run_script("rebuttal_enhanced_perturb_with_fliptypes.py", f"--INPUT_JSONL={src}")
    assert (tmp_path / "rebuttal_enhanced_base_with_fliptypes.jsonl").exists()


def test_gpu_out_of_memory_says_what_to_lower(capsys):
    import torch

    def main():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(SystemExit) as exit_info:
        run_main(main)
    assert exit_info.value.code == 3
    err = capsys.readouterr().err
    assert "ran out of memory (CUDA out of memory. Tried to allocate 2.00 GiB)" in err and "--TEXT_BATCH_SIZE=" in err
    with pytest.raises(ValueError):  # anything else is not swallowed
        run_main(lambda: (_ for _ in ()).throw(ValueError("other")))


def test_malformed_eval_record_stops_with_file_line(tmp_path):
    lines = open(os.path.join(REFERENCE, "fixture_with_perturb.jsonl")).read().splitlines()
    rec = json.loads(lines[4])
    rec["diff_caps"]["2"] = "not a list"
    lines[4] = json.dumps(rec)
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    proc = run_script("run_lgip_multi.py", *eval_args(src, models=[OPENCLIP_TINY]), check=False)
    assert proc.returncode == 2 and f"{src}:5: field 'diff_caps.2' is str" in proc.stderr
