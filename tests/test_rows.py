"""The evaluations' list files keep every model's row (lgip.results; LGIP_SPEC.md section 4): a
later run replaces the rows of the models it evaluated and keeps the others, runs at once keep all
theirs, a file that cannot be merged with is left as it was and the rows written beside it; and
report.py names the file of each row's figures and the settings that differ between its files."""

import csv
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from conftest import (
    BASE_JSONL,
    FIXTURES,
    OPENCLIP_TINY,
    REFERENCE,
    ROOT,
    SIGLIP_PIECES,
    SIGLIP_TINY,
    eval_args,
    run_script,
)

MULTI = "fixture_with_perturb__LGIP_ALL.metrics.json"
HEADLINE = ("num_samples", "invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate")


def copy_input(folder, name="fixture_with_perturb.jsonl"):
    shutil.copy(os.path.join(REFERENCE, name), os.path.join(folder, name))
    return os.path.join(folder, name)


def settings(jsonl, models, **extra):
    return dict(
        JSONL_PATH=jsonl,
        IMAGE_ROOT=FIXTURES,
        PROTOCOL="reference",
        DEVICE="cpu",
        NUM_WORKERS=0,
        MODELS=models,
        WRITE_SCORES=False,
        **extra,
    )


def rows(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def leftovers(folder):
    """Lock files and temp files left in a folder (none should be)."""
    return [n for n in os.listdir(folder) if n.endswith(".lock") or n.endswith(".tmp")]


def test_a_later_run_replaces_only_the_rows_of_its_models(tmp_path):
    """Two models, then a run of one of them and a new one (as a training loop's run() or a
    one-model command): the other row is kept as it was, where it was; the replaced row takes its
    place with its new run's time; the new model is appended. The published numbers stay."""
    import run_lgip_multi

    jsonl = copy_input(str(tmp_path))
    out = str(tmp_path / MULTI)
    first = run_lgip_multi.run(**settings(jsonl, [OPENCLIP_TINY, SIGLIP_TINY]))
    assert rows(out) == first
    time.sleep(1.1)  # (run.created is to the second)
    second = run_lgip_multi.run(**settings(jsonl, [SIGLIP_PIECES, SIGLIP_TINY], BOOTSTRAP=50))
    assert [m["model_tag"] for m in second] == ["tiny_siglip_pieces", "tiny_siglip"]
    merged = rows(out)
    assert [m["model_tag"] for m in merged] == ["tiny_openclip", "tiny_siglip", "tiny_siglip_pieces"]
    assert merged[0] == first[0]  # kept whole, its own time with it
    assert merged[1] == second[1] and merged[2] == second[0]
    assert merged[1]["run"]["created"] > first[1]["run"]["created"]
    assert merged[1]["run"]["config"]["BOOTSTRAP"] == 50 and merged[0]["run"]["config"]["BOOTSTRAP"] == 1000
    published = {m["model_tag"]: m for m in rows(os.path.join(REFERENCE, MULTI))}
    for m in merged[:2]:
        for key in HEADLINE:
            assert m[key] == pytest.approx(published[m["model_tag"]][key], abs=1e-6)
    assert not leftovers(tmp_path)


def test_row_order_and_times():
    """Kept rows stay where they were, a replaced row takes its old place, new models are appended
    in the run's order; a row given without run.created gets the time it is written."""
    from lgip.results import merge_rows

    old = [{"model_tag": t, "v": 0} for t in "abcd"]
    new = [
        {"model_tag": "e", "v": 1},
        {"model_tag": "c", "v": 1},
        {"model_tag": "a", "v": 1},
        {"model_tag": "f", "v": 1},
    ]
    merged = merge_rows(old, new)
    assert [(m["model_tag"], m["v"]) for m in merged] == [("a", 1), ("b", 0), ("c", 1), ("d", 0), ("e", 1), ("f", 1)]
    assert merge_rows([], new) == new and merge_rows(old, []) == old
    assert old[0] == {"model_tag": "a", "v": 0}  # (the caller's lists untouched)
    with pytest.raises(ValueError, match="model_tag each"):
        merge_rows(old, [{"model_tag": "a"}, {"model_tag": "a"}])


def test_write_rows_stamps_and_keeps(tmp_path, capsys):
    from lgip.results import write_rows

    path = str(tmp_path / "x__LGIP_ALL.metrics.json")
    made = {"model_tag": "a", "run": {"created": "2020-01-01T00:00:00+0000"}}
    assert write_rows(path, [made, {"model_tag": "b"}]) == path
    a, b = rows(path)
    assert a == made and b["run"]["created"] >= time.strftime("%Y-%m-%d")
    write_rows(path, [{"model_tag": "c", "run": {"created": "2030-01-01T00:00:00+0000"}}])
    assert [m["model_tag"] for m in rows(path)] == ["a", "b", "c"] and rows(path)[0] == made
    assert "1 row written, 2 kept from the file as it was (a, b)" in capsys.readouterr().out
    assert not leftovers(tmp_path)


WRITER = """
import sys
sys.path.insert(0, {root!r})
from lgip.results import write_rows
for k in range({n}):
    write_rows({path!r}, [{{"model_tag": "p{i}_%d" % k, "k": k}}, {{"model_tag": "shared", "by": {i}}}])
"""


@pytest.mark.parametrize("portable", [False, True])
def test_processes_and_threads_at_once_keep_every_row(tmp_path, monkeypatch, portable):
    """Four processes and four threads, each writing 25 times its own row (and one row all of
    them replace) into one file at once: every row is there, the file is a list, no lock or temp
    file is left. portable: the lock file created exclusively (no fcntl), in both."""
    from lgip import results

    path = str(tmp_path / "x__LGIP_fliptypes.metrics.json")
    n = 25
    env = dict(os.environ)
    code = WRITER
    if portable:
        monkeypatch.setattr(results, "fcntl", None)
        code = code.replace(
            "from lgip.results import write_rows", "import lgip.results as r; r.fcntl = None; write_rows = r.write_rows"
        )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code.format(root=ROOT, n=n, path=path, i=i)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]

    def thread(i):
        for k in range(n):
            results.write_rows(path, [{"model_tag": f"t{i}_{k}", "k": k}, {"model_tag": "shared", "by": -i}])

    threads = [threading.Thread(target=thread, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
        assert "warning" not in p.stderr.read()
    got = rows(path)
    tags = [m["model_tag"] for m in got]
    expected = {f"{who}{i}_{k}" for who in "pt" for i in range(4) for k in range(n)} | {"shared"}
    assert set(tags) == expected and len(tags) == len(expected)
    assert not leftovers(tmp_path)


def test_two_runs_at_once_on_one_input_keep_both_rows(tmp_path):
    """A job array's two jobs, one model each, on the same input at the same time."""
    jsonl = copy_input(str(tmp_path))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                os.path.join(ROOT, "run_lgip_multi.py"),
                *eval_args(jsonl, models=[model], CACHE_DIR=None, WRITE_SCORES=False),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for model in (OPENCLIP_TINY, SIGLIP_TINY)
    ]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    got = rows(tmp_path / MULTI)
    assert sorted(m["model_tag"] for m in got) == ["tiny_openclip", "tiny_siglip"]
    published = {m["model_tag"]: m for m in rows(os.path.join(REFERENCE, MULTI))}
    for m in got:
        for key in HEADLINE:
            assert m[key] == pytest.approx(published[m["model_tag"]][key], abs=1e-6)
    assert not leftovers(tmp_path)


BROKEN = {
    "truncated": (
        '[{"model_tag": "a", "x": 1}, {"model_t',
        "invalid JSON (Unterminated string starting at: line 1, column 31)",
    ),
    "not a list": ('{"model_tag": "a"}', "holds a JSON object, not a list of per-model dicts"),
    "no model_tag": ('[{"model_tag": "a"}, {"x": 2}]', "row #2 of 2 has no 'model_tag' (a non-empty string)"),
    "not an object": ('[{"model_tag": "a"}, 3]', "row #2 of 2 is a JSON number, not an object"),
    "twice": (
        '[{"model_tag": "a"}, {"model_tag": "b"}, {"model_tag": "a"}]',
        "model a is listed twice (rows #1 and #3)",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_file_that_cannot_be_merged_is_kept_and_the_rows_written_beside(tmp_path, capsys, case):
    """Nothing dropped: the file is left byte for byte, the run's rows go to a file beside it, the
    console names both and why, and the output counts as not written (exit status 4 in a script)."""
    from lgip.results import write_rows
    from lgip.outputs import OUTPUTS

    OUTPUTS.reset()
    text, why = BROKEN[case]
    path = tmp_path / "x__LGIP_ALL.metrics.json"
    path.write_text(text, encoding="utf-8")
    new = [{"model_tag": "a", "run": {"created": "2030-01-01T00:00:00+0000"}}]
    beside = write_rows(str(path), new)
    assert path.read_text(encoding="utf-8") == text
    assert os.path.dirname(beside) == str(tmp_path) and os.path.basename(beside).startswith(
        "x__LGIP_ALL.metrics.unmerged-"
    )
    assert rows(beside) == new
    err = capsys.readouterr().err
    assert (
        f"warning: {path}" in err and why in err and beside in err and f"python -m lgip.results {path} {beside}" in err
    )
    assert OUTPUTS.unwritten == [(str(path), f"not merged: its rows are in {os.path.basename(beside)}")]
    assert sorted(os.listdir(tmp_path)) == sorted([path.name, os.path.basename(beside)])
    OUTPUTS.reset()


def test_a_script_whose_list_file_is_unreadable_ends_with_status_4_and_its_rows_beside(tmp_path):
    jsonl = copy_input(str(tmp_path))
    (tmp_path / MULTI).write_text('[\n  {"model_tag": "tiny_siglip", "num_sam', encoding="utf-8")
    proc = run_script(
        "run_lgip_multi.py", *eval_args(jsonl, models=[OPENCLIP_TINY], CACHE_DIR=None, WRITE_SCORES=False), check=False
    )
    assert proc.returncode == 4, proc.stderr
    [beside] = [n for n in os.listdir(tmp_path) if ".unmerged-" in n]
    assert (
        f"warning: {tmp_path / MULTI}: invalid JSON (Unterminated string starting at: line 2, column 32)" in proc.stderr
    )
    assert f"not written: {MULTI} (not merged: its rows are in {beside})" in proc.stderr
    assert [m["model_tag"] for m in rows(tmp_path / beside)] == ["tiny_openclip"]
    assert (tmp_path / MULTI).read_text(encoding="utf-8").endswith('"num_sam')
    # mended (here: removed), the rows go back in as a run would have written them
    os.remove(tmp_path / MULTI)
    done = subprocess.run(
        [sys.executable, "-m", "lgip.results", str(tmp_path / MULTI), str(tmp_path / beside)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert rows(tmp_path / MULTI) == rows(tmp_path / beside)


def test_the_portable_lock_removes_a_stale_lock_file_and_waits_for_a_live_one(tmp_path, monkeypatch, capsys):
    from lgip import results

    monkeypatch.setattr(results, "fcntl", None)
    path = str(tmp_path / "x.json")
    lock = path + ".lock"
    open(lock, "w").close()
    os.utime(lock, (time.time() - results.STALE_LOCK_S - 5,) * 2)
    assert results.write_rows(path, [{"model_tag": "a"}]) == path
    assert "removing the lock file" in capsys.readouterr().err and not os.path.exists(lock)
    open(lock, "w").close()  # a live holder: not given within the time, the rows go beside
    beside = results.write_rows(path, [{"model_tag": "b"}], timeout_s=0.3)
    assert beside != path and rows(beside)[0]["model_tag"] == "b" and [m["model_tag"] for m in rows(path)] == ["a"]
    assert "its lock" in capsys.readouterr().err
    from lgip.outputs import OUTPUTS

    OUTPUTS.reset()


def test_flock_refused_by_the_file_system_falls_back_to_the_portable_lock(tmp_path, monkeypatch):
    import errno
    from lgip import results

    if results.fcntl is None:
        pytest.skip("no fcntl here")

    class NoFlock:
        LOCK_EX, LOCK_NB = 2, 4

        @staticmethod
        def flock(fd, how):
            raise OSError(errno.ENOLCK, "no locks available")

    monkeypatch.setattr(results, "fcntl", NoFlock)
    path = str(tmp_path / "x.json")
    for tag in "ab":
        assert results.write_rows(path, [{"model_tag": tag}]) == path
    assert [m["model_tag"] for m in rows(path)] == ["a", "b"] and not leftovers(tmp_path)


# --- report.py: the file of each row's figures, and settings that differ between a model's files ---


def with_run(m, created, **config):
    """A published metrics row with a run block (the published files have none)."""
    spec = {"tiny_openclip": OPENCLIP_TINY, "tiny_siglip": SIGLIP_TINY}[m["model_tag"]]
    base = {
        "PROTOCOL": "reference",
        "DTYPE": "auto",
        "BOOTSTRAP": 1000,
        "BOOTSTRAP_SEED": 0,
        "NUM_WORKERS": 0,
        "LOOKAHEAD": True,
        "CACHE_DIR": "auto",
        "TEXT_BATCH_SIZE": "auto",
        "WRITE_SCORES": True,
        "JSONL_PATH": "x.jsonl",
        "MODELS": [spec],
    }
    base.update(config)
    return dict(
        m,
        run={
            "created": created,
            "config": base,
            "model": {"name": m["model_tag"], "protocol": base["PROTOCOL"], "dtype": "float32"},
        },
    )


def test_report_names_the_file_of_each_row_and_notes_mixed_settings(tmp_path):
    """The multi file lost tiny_siglip's row (as a one-model run did before rows were kept): its
    headline figures come from the fliptypes file, said per model in the notes, the sources table,
    the CSV and the page; tiny_openclip's two rows were made with different PROTOCOL and BOOTSTRAP
    (and NUM_WORKERS, CACHE_DIR, TEXT_BATCH_SIZE, which change no figure: not named)."""
    shutil.copy(BASE_JSONL, tmp_path / "fixture.jsonl")
    multi = rows(os.path.join(REFERENCE, MULTI))
    flips = rows(os.path.join(REFERENCE, "fixture_with_fliptypes__LGIP_fliptypes.metrics.json"))
    with open(tmp_path / MULTI, "w", encoding="utf-8") as f:
        json.dump([with_run(multi[0], "2025-01-01T10:00:00+0000")], f)
    with open(tmp_path / "fixture_with_fliptypes__LGIP_fliptypes.metrics.json", "w", encoding="utf-8") as f:
        json.dump(
            [
                with_run(
                    flips[0],
                    "2025-02-02T10:00:00+0000",
                    PROTOCOL="corrected",
                    BOOTSTRAP=200,
                    NUM_WORKERS=8,
                    CACHE_DIR=None,
                    TEXT_BATCH_SIZE=16,
                ),
                with_run(flips[1], "2025-02-03T10:00:00+0000", PROTOCOL="corrected"),
            ],
            f,
        )
    run_script("report.py", f"--JSONL_PATH={tmp_path / 'fixture.jsonl'}", "--TOP_K=0")
    with open(tmp_path / "fixture__LGIP_report.csv", newline="", encoding="utf-8") as f:
        csv_rows = {r["model"]: r for r in csv.DictReader(f)}
    o, s = csv_rows["tiny_openclip"], csv_rows["tiny_siglip"]
    assert (o["headline_source"], o["headline_file"], o["headline_created"]) == (
        "multi",
        MULTI,
        "2025-01-01T10:00:00+0000",
    )
    assert (s["headline_source"], s["headline_file"], s["headline_created"]) == (
        "fliptypes",
        "fixture_with_fliptypes__LGIP_fliptypes.metrics.json",
        "2025-02-03T10:00:00+0000",
    )
    assert o["flip_type_file"] == "fixture_with_fliptypes__LGIP_fliptypes.metrics.json"
    assert o["flip_type_created"] == "2025-02-02T10:00:00+0000"
    assert (
        o["mixed_settings"]
        == 'PROTOCOL "reference" (multi), "corrected" (fliptypes); BOOTSTRAP 1000 (multi), 200 (fliptypes)'
    )
    assert s["mixed_settings"] == ""
    assert float(o["invariance_error"]) == multi[0]["invariance_error_mean"]
    assert float(s["invariance_error"]) == flips[1]["invariance_error_mean"]
    md = (tmp_path / "fixture__LGIP_report.md").read_text(encoding="utf-8")
    assert (
        "- Invariance error, gap and positive rate from `run_lgip_multi.py` "
        "(`fixture_with_perturb__LGIP_ALL.metrics.json`) "
        "for `tiny_openclip`; from `run_lgip_by_fliptype.py` (`fixture_with_fliptypes__LGIP_fliptypes.metrics.json`) "
        "for `tiny_siglip`."
    ) in md
    assert (
        '- `tiny_openclip`: its figures come from runs of different settings: PROTOCOL "reference" '
        '(`fixture_with_perturb__LGIP_ALL.metrics.json`), "corrected" '
        "(`fixture_with_fliptypes__LGIP_fliptypes.metrics.json`); "
        "BOOTSTRAP 1000 (`fixture_with_perturb__LGIP_ALL.metrics.json`), 200 "
        "(`fixture_with_fliptypes__LGIP_fliptypes.metrics.json`)."
    ) in md
    assert "NUM_WORKERS" not in md.split("<sub>Made by")[0] and "tiny_siglip`: its figures" not in md
    assert (
        "| `tiny_siglip`   | `fixture_with_fliptypes__LGIP_fliptypes.metrics.json` | 2025-02-03T10:00:00+0000 |" in md
    )
    html = (tmp_path / "fixture__LGIP_report.html").read_text(encoding="utf-8")
    assert (
        'title="tiny_siglip · headline figures from fixture_with_fliptypes__LGIP_fliptypes.metrics.json '
        '(made 2025-02-03T10:00:00+0000)"' in html
    )
    assert "its figures come from runs of different settings" in html


def test_mixed_settings_compare_the_models_own_spec_and_its_resolved_dtype():
    """Another model beside it in MODELS is no difference; its own spec and the dtype it ran in are
    (but explain_flips' dtype, fixed at fp32); a setting a run does not record is not compared."""
    from lgip.report.evaluations import IGNORED_SETTINGS, mixed_settings

    assert {
        "NUM_WORKERS",
        "LOOKAHEAD",
        "CACHE_DIR",
        "WRITE_SCORES",
        "JSONL_PATH",
        "TEXT_BATCH_SIZE",
    } <= IGNORED_SETTINGS

    def row(models, dtype="float32", **config):
        return {
            "model_tag": "a",
            "run": {"config": dict(MODELS=models, PROTOCOL="corrected", **config), "model": {"dtype": dtype}},
        }

    a, b = {"name": "a", "type": "openclip", "model_name": "ViT-B-16"}, {"name": "b", "type": "siglip", "model_id": "x"}
    assert mixed_settings({"multi": row([a]), "fliptypes": row([b, a], GALLERY=1)}) == []
    other = dict(a, pretrained="openai")
    assert [k for k, _ in mixed_settings({"multi": row([a]), "fliptypes": row([other], dtype="bfloat16")})] == [
        "model spec",
        "dtype",
    ]
    assert mixed_settings({"multi": row([a], dtype="bfloat16"), "explain": row([a])}) == []
