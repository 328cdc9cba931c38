"""The command line and the records: --NAME=value overrides of a script's constants (lgip/cli.py),
JSONL reading and validation with file:line and field in every error (lgip/records.py), atomic
writes (lgip/util.py) and run_main's exit codes."""
import json
import os

import pytest

from lgip.cli import configure, run_main
from lgip.errors import InputError
from lgip.records import iter_records
from lgip.util import atomic_open
from conftest import BASE_JSONL, OPENCLIP_TINY, REFERENCE, eval_args, run_script


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


GOOD = json.dumps({"image_path": "a.jpg", "orig_captions": ["A red bus on the road."]})


@pytest.mark.parametrize("bad_line,expected", [
    ('{"image_path": "a.jpg", "orig_captions": [', ":3: invalid JSON"),
    ('{"image_path": "a.jpg"}', ":3: missing field 'orig_captions'"),
    ('{"image_path": "a.jpg", "orig_captions": ["ok", 7]}', ":3: field 'orig_captions[1]' is int"),
    ('{"image_path": "a.jpg", "orig_captions": "A bus"}', ":3: field 'orig_captions' is str"),
    ('{"orig_captions": ["A bus"]}', ":3: missing field 'image_path'"),
    ('[1, 2]', ":3: expected a JSON object"),
])
@pytest.mark.parametrize("script", ["diff_gen_caption.py", "make_perturb_with_fliptypes.py",
                                    "rebuttal_enhanced_perturb_with_fliptypes.py"])
def test_malformed_record_stops_with_file_line_field(tmp_path, script, bad_line, expected):
    src = write_lines(tmp_path / "in.jsonl", [GOOD, "", bad_line, GOOD])
    out = tmp_path / "out.jsonl"
    out.write_text("previous run\n")
    proc = run_script(script, f"--INPUT_JSONL={src}", f"--OUTPUT_JSONL={out}", check=False)
    assert proc.returncode == 2
    assert f"{src}{expected}" in proc.stderr
    assert out.read_text() == "previous run\n"  # no half-written output replaced it
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


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
    for argv, message in ((["--BATC=1"], "unknown setting 'BATC'; valid settings: BATCH, NAME, PATH"),
                          (["BATCH=1"], "expected --NAME=value")):
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
