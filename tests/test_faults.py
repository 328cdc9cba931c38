"""Faults of shared machines: an output that cannot be written (a full disk, a read-only folder),
an embedding cache on a full disk, a scheduler's SIGTERM, a byte-order mark at the start of an
input, and two evaluations at once on one cache folder. A full disk is tests/small_disk.py (ENOSPC
once a folder's room is used, no root needed); where this machine lets a test mount a tmpfs, real
small and read-only file systems too."""

import glob
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import small_disk
from conftest import (
    BASE_JSONL,
    FIXTURES,
    OPENCLIP_TINY,
    REFERENCE,
    ROOT,
    SIGLIP_TINY,
    eval_args,
    eval_settings,
    run_here,
    run_script,
)
from test_evaluation import assert_matches
from test_failures import SLOW_RUN, processes_with
from test_make_base_jsonl import Coco, coco_dict

PERTURBED = os.path.join(REFERENCE, "fixture_with_perturb.jsonl")
ELSEWHERE_GENERATOR = "write elsewhere: pass --OUTPUT_JSONL=<a writable path with room>."

ON_SMALL_DISK = """
import runpy
sys.path.insert(0, {tests!r})
import small_disk
small_disk.install({rooms!r})
sys.argv = {argv!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def run_on_small_disk(script, rooms, *args):
    """A script run as its users do, with each folder of `rooms` holding that many bytes more."""
    code = ON_SMALL_DISK.format(
        tests=os.path.join(ROOT, "tests"),
        rooms={str(k): v for k, v in rooms.items()},
        argv=[script, *args],
        script=os.path.join(ROOT, script),
    )
    return subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r})\n{code}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def copy_input(folder, src=PERTURBED, name="in.jsonl"):
    os.makedirs(folder, exist_ok=True)
    shutil.copy(src, os.path.join(folder, name))
    return os.path.join(folder, name)


def whole_chunks(cache_dir):
    """{kind: set of keys} of a cache folder's chunks, each loaded whole; no temp file left."""
    assert not glob.glob(os.path.join(cache_dir, "*", ".*.tmp"))
    keys = {"text": set(), "image": set()}
    for path in glob.glob(os.path.join(cache_dir, "*", "*.npz")):
        with np.load(path, allow_pickle=False) as z:
            chunk = json.loads(bytes(z["keys"]).decode("utf-8"))
            assert z["emb"].shape[0] == len(chunk) > 0, path
        keys[os.path.basename(path).split("-")[0]].update(chunk)
    return keys


@pytest.fixture
def disk():
    yield small_disk
    small_disk.uninstall()


def test_an_output_that_cannot_be_written_says_which_why_and_what_to_do(tmp_path, disk):
    from lgip.errors import OutputError
    from lgip.outputs import OUTPUTS, atomic_open, check_writable

    full, empty, a_file = tmp_path / "full", tmp_path / "empty", tmp_path / "a_file"
    full.mkdir(), empty.mkdir(), a_file.write_text("")
    disk.install({full: 10, empty: 0})
    OUTPUTS.reset(elsewhere="pass --OUTPUT_JSONL=<a writable path with room>")
    with pytest.raises(OutputError) as e:
        with atomic_open(full / "out.jsonl") as f:
            f.write("x" * 100)
    assert str(e.value) == (
        f"cannot write {full / 'out.jsonl'}: no space left on the device (ENOSPC). "
        f"Free space on that disk (df -h {full}), or {ELSEWHERE_GENERATOR}"
    )
    assert os.listdir(full) == []  # no partial file, no temp file
    assert OUTPUTS.unwritten == [(full / "out.jsonl", "no space left on the device")] and OUTPUTS.written == []
    with pytest.raises(FileNotFoundError):  # the caller's own error (reading its input) passes as it is
        with atomic_open(tmp_path / "other.json") as f:
            open(tmp_path / "no such input")
    check_writable([full, tmp_path / "new" / "folder"])  # a byte fits; a folder not made yet: its parent is tried
    with pytest.raises(OutputError) as e:
        check_writable([full, empty / "sub"])
    assert str(e.value) == (
        f"cannot write in {empty}: no space left on the device (ENOSPC). Free space on that disk "
        f"(df -h {empty}), or {ELSEWHERE_GENERATOR} Nothing was run."
    )
    with pytest.raises(OutputError, match=f"cannot write in {a_file / 'sub'}: {a_file} is a file, not a folder"):
        check_writable([a_file / "sub"])


def test_a_full_disk_stops_a_script_before_its_work(tmp_path):
    """A generator and an evaluation whose output folder takes no byte stop at once (exit status 4)."""
    out = tmp_path / "out"
    out.mkdir()
    proc = run_on_small_disk(
        "diff_gen_caption.py", {out: 0}, f"--INPUT_JSONL={BASE_JSONL}", f"--OUTPUT_JSONL={out / 'x.jsonl'}"
    )
    assert proc.returncode == 4 and proc.stderr == (
        f"error: cannot write in {out}: no space left on the device (ENOSPC). Free space on that disk (df -h {out}), "
        f"or {ELSEWHERE_GENERATOR} Nothing was run.\n"
    )
    src = copy_input(out / "eval")
    t0 = time.perf_counter()
    proc = run_on_small_disk("run_lgip_multi.py", {out / "eval": 0}, *eval_args(src))
    assert proc.returncode == 4 and time.perf_counter() - t0 < 20, proc.stderr
    assert proc.stderr == (
        f"error: cannot write in {out / 'eval'}: no space left on the device (ENOSPC). Free space on that disk "
        f"(df -h {out / 'eval'}), or write elsewhere: the outputs go beside JSONL_PATH: copy it to a writable folder "
        f"with room and pass --JSONL_PATH=<the copy> --IMAGE_ROOT={FIXTURES}. Nothing was run.\n"
    )
    assert os.listdir(out / "eval") == ["in.jsonl"]  # no model was loaded, no cache made


def outputs_room(out, cache, args):
    """Room for run_lgip_multi's metrics files but not for a score file, measured by running `args`
    once with no limit in these very folders (the metrics hold the absolute paths of the checkout,
    the input and the cache, so their size grows with the folders' names), whose outputs and cache
    are then removed. A score file is written in one piece: it fails whole and takes none of the room."""
    proc = run_on_small_disk("run_lgip_multi.py", {}, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sizes = {f: os.path.getsize(out / f) for f in os.listdir(out) if f != "in.jsonl"}
    for f in sizes:
        os.remove(out / f)
    shutil.rmtree(cache)
    metrics = sum(n for f, n in sizes.items() if f.endswith(".metrics.json"))
    room = metrics + 1_000 + metrics // 20  # the output folders' check, and the full-disk fields the first run lacks
    assert room < min(n for f, n in sizes.items() if f.endswith(".scores.jsonl")), sizes  # the case under test
    return room


def test_a_full_disk_keeps_the_metrics_and_a_full_cache_costs_nothing(tmp_path):
    """Outputs on a disk with room for the metrics but not the score files, the cache on one with
    room for a chunk or two: the run says so once for the cache and once per score file, writes
    its metrics (the published numbers), leaves the cache whole, and ends with exit status 4."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    src = copy_input(out)
    args = eval_args(src, CACHE_DIR=str(cache), CACHE_FLUSH_S=0, TEXT_BATCH_SIZE=16)
    proc = run_on_small_disk("run_lgip_multi.py", {out: outputs_room(out, cache, args), cache: 10_000}, *args)
    err = proc.stderr
    assert proc.returncode == 4 and "Traceback" not in err, err
    assert err.count("warning: the embedding cache cannot be written (") == 1
    assert (
        "no space left on the device); the run goes on without caching the rest: its results are the same, what is "
        "cached stays usable, and a re-run encodes again what was not cached. Free space there (or get write "
        "permission), or pass --CACHE_DIR=<a writable folder with room> (None: no cache)."
    ) in err
    for model in ("tiny_openclip", "tiny_siglip"):
        assert (
            f"warning: cannot write {out / f'in__LGIP_{model}.scores.jsonl'}: no space left on the device (ENOSPC). "
            f"Free space on that disk (df -h {out}), or write elsewhere: the outputs go beside JSONL_PATH"
        ) in err
    assert "The run goes on without this score file (--WRITE_SCORES=False writes none)" in err
    assert err.endswith(
        "error: not every output could be written (see the warnings above: the run went on without them)\n"
        "  not written: in__LGIP_tiny_openclip.scores.jsonl (no space left on the device), "
        "in__LGIP_tiny_siglip.scores.jsonl (no space left on the device)\n"
        "  written: in__LGIP_tiny_openclip.metrics.json, in__LGIP_tiny_siglip.metrics.json, "
        "in__LGIP_comparisons.metrics.json, in__LGIP_ALL.metrics.json\n"
        "  no partial file was left\n"
        "  the embeddings encoded so far are in the cache: once there is room, the same command re-runs from it "
        "(a model whose embeddings are all there without loading its weights)\n"
    )
    assert sorted(os.listdir(out)) == [
        "in.jsonl",
        "in__LGIP_ALL.metrics.json",
        "in__LGIP_comparisons.metrics.json",
        "in__LGIP_tiny_openclip.metrics.json",
        "in__LGIP_tiny_siglip.metrics.json",
    ]
    metrics = json.load(open(out / "in__LGIP_ALL.metrics.json"))
    assert_matches(metrics, json.load(open(os.path.join(REFERENCE, "fixture_with_perturb__LGIP_ALL.metrics.json"))))
    assert [m["scores_file"] for m in metrics] == [None, None]
    assert [m["run"]["cache"]["write_error"] for m in metrics] == ["no space left on the device"] * 2
    assert whole_chunks(cache)["text"]  # what was written before the disk filled, whole


@pytest.fixture(scope="module")
def tmpfs(tmp_path_factory):
    """`unshare -m` when this machine lets it mount a tmpfs (root, or user namespaces), else skip."""
    if not shutil.which("unshare") or not os.path.isdir("/proc"):
        pytest.skip("no unshare")
    folder = tmp_path_factory.mktemp("probe")
    for prefix in (["unshare", "-m"], ["unshare", "-rm"]):
        probe = subprocess.run(
            prefix + ["sh", "-c", f"mount -t tmpfs -o size=16k tmpfs {shlex.quote(str(folder))}"], capture_output=True
        )
        if probe.returncode == 0:
            return prefix
    pytest.skip("cannot mount a tmpfs here")


def test_real_full_and_read_only_file_systems(tmp_path, tmpfs):
    """The generator's output on a 16 KiB tmpfs (its 25 KB do not fit: ENOSPC mid-write) and on a
    read-only one (EROFS, found before the work), in a mount namespace of their own."""
    small, ro = tmp_path / "small", tmp_path / "ro"
    small.mkdir(), ro.mkdir()
    q = lambda p: shlex.quote(str(p))
    gen = f"{q(sys.executable)} {q(os.path.join(ROOT, 'diff_gen_caption.py'))} {q('--INPUT_JSONL=' + BASE_JSONL)}"
    script = (
        f"mount -t tmpfs -o size=16k tmpfs {q(small)} && mount -t tmpfs -o ro,size=16k tmpfs {q(ro)} || exit 99\n"
        f"{gen} {q('--OUTPUT_JSONL=' + str(small / 'x.jsonl'))} 2> {q(tmp_path / 'small.err')}; "
        f"echo $? > {q(tmp_path / 'small.rc')}\n"
        f"ls -A {q(small)} > {q(tmp_path / 'small.ls')}\n"
        f"{gen} {q('--OUTPUT_JSONL=' + str(ro / 'x.jsonl'))} 2> {q(tmp_path / 'ro.err')}; "
        f"echo $? > {q(tmp_path / 'ro.rc')}\n"
    )
    proc = subprocess.run(tmpfs + ["sh", "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "small.rc").read_text() == "4\n" and (tmp_path / "small.ls").read_text() == ""  # nothing partial
    assert (tmp_path / "small.err").read_text() == (
        f"error: cannot write {small / 'x.jsonl'}: no space left on the device (ENOSPC). Free space on that disk "
        f"(df -h {small}), or {ELSEWHERE_GENERATOR}\n  no output file was written\n  no partial file was left\n"
    )
    assert (tmp_path / "ro.rc").read_text() == "4\n"
    assert (tmp_path / "ro.err").read_text() == (
        f"error: cannot write in {ro}: read-only file system (EROFS). Write elsewhere: pass --OUTPUT_JSONL=<a "
        f"writable path with room>. Nothing was run.\n"
    )


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to find the processes left behind")
@pytest.mark.parametrize("to", ["scheduler", "kill"])
def test_sigterm_stops_an_evaluation_as_ctrl_c_does_and_the_same_command_resumes(tmp_path, to):
    """SIGTERM to every process of the run (as SLURM at its time limit: its decoding and look-ahead
    workers get it too) or to the main one alone (`kill PID`: its decoding workers are stopped by
    it): exit status 143 within seconds, the message, no worker left, no partial file, the rows
    encoded so far in the cache; the re-run reads them back and gives the published numbers."""
    src = copy_input(tmp_path)
    models = [SIGLIP_TINY, OPENCLIP_TINY] if to == "scheduler" else [SIGLIP_TINY]  # (two: a look-ahead)
    args = eval_args(src, models=models, NUM_WORKERS=2, TEXT_BATCH_SIZE=8)
    code = SLOW_RUN.format(argv=["run_lgip_multi.py", *args], script=os.path.join(ROOT, "run_lgip_multi.py"))
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r})\n{code}"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    encoded = 0
    for line in proc.stdout:
        encoded += int(line.split()[1]) if line.startswith("encoded") else 0
        if encoded >= 40:
            break
    assert encoded >= 40, proc.stderr.read()
    (os.killpg if to == "scheduler" else os.kill)(proc.pid, signal.SIGTERM)
    t0 = time.perf_counter()
    rc = proc.wait(timeout=30)
    seconds, err = time.perf_counter() - t0, proc.stderr.read()
    assert rc == 143 and seconds < 10, (rc, seconds, err[-2000:])
    assert err.endswith(
        "stopped by SIGTERM: during model tiny_siglip; no model finished; no metrics file was written (it is written "
        "at the end); the texts and images it had encoded are in the cache (.lgip_cache beside the input): the same "
        "command resumes there (a finished model is read from the cache, without loading its weights).\n"
    ), err[-1500:]
    assert "Traceback" not in err
    deadline = time.time() + 5
    while processes_with(src) and time.time() < deadline:
        time.sleep(0.1)
    assert processes_with(src) == []  # no decoding, tokenizing or look-ahead worker left behind
    assert sorted(os.listdir(tmp_path)) == [".lgip_cache", "in.jsonl"]
    cached = len(whole_chunks(tmp_path / ".lgip_cache")["text"])
    assert encoded - 8 <= cached < 497  # every whole batch before the signal (8 texts a batch) was flushed
    if to == "scheduler":
        return  # (the re-run: once is enough)
    _, stdout, _ = run_here("run_lgip_multi.py", **eval_settings(src, models=models, NUM_WORKERS=2, TEXT_BATCH_SIZE=8))
    assert f"tiny_siglip: from the cache: {cached} of 497 texts" in stdout  # (the same command, in this process)
    assert_matches(
        json.load(open(tmp_path / "in__LGIP_tiny_siglip.metrics.json")),
        json.load(open(os.path.join(REFERENCE, "fixture_with_perturb__LGIP_tiny_siglip.metrics.json"))),
    )


def with_bom(src, dst, crlf=False):
    data = open(src, "rb").read()
    with open(dst, "wb") as f:
        f.write(b"\xef\xbb\xbf" + (data.replace(b"\n", b"\r\n") if crlf else data))
    return str(dst)


def test_a_byte_order_mark_and_crlf_are_read_as_utf_8(tmp_path):
    from lgip.errors import InputError
    from lgip.records import iter_json_lines, load_records, read_json

    fields = ("same_caps", "diff_caps")
    assert load_records(with_bom(PERTURBED, tmp_path / "bom.jsonl", crlf=True), fields) == load_records(
        PERTURBED, fields
    )
    metrics = os.path.join(REFERENCE, "fixture_with_perturb__LGIP_ALL.metrics.json")
    assert read_json(with_bom(metrics, tmp_path / "bom.json")) == json.load(open(metrics))
    (tmp_path / "utf16.jsonl").write_text('{"a": 1}\n', encoding="utf-16")
    with pytest.raises(
        InputError,
        match=r"utf16.jsonl: UTF-16 text \(it starts with the byte-order mark FF FE\); "
        r"save it as UTF-8",
    ):
        list(iter_json_lines(str(tmp_path / "utf16.jsonl")))
    (tmp_path / "latin1.jsonl").write_bytes(b'{"a": 1}\n\n{"a": "caf\xe9"}\n')
    with pytest.raises(
        InputError,
        match=r"latin1.jsonl:3: not UTF-8 text \(invalid continuation byte at byte 10 of "
        r"the line\); save the file as UTF-8",
    ):
        list(iter_json_lines(str(tmp_path / "latin1.jsonl")))


def test_scripts_read_inputs_that_start_with_a_byte_order_mark(tmp_path):
    """A generator (its output byte for byte the published one), make_base_jsonl's COCO file, and
    report.py's metrics and score files (the evaluations and the sanity check read through
    load_records, run_all through read_json: the test above)."""
    out = tmp_path / "out.jsonl"
    run_script(
        "diff_gen_caption.py",
        f"--INPUT_JSONL={with_bom(BASE_JSONL, tmp_path / 'base.jsonl', crlf=True)}",
        f"--OUTPUT_JSONL={out}",
    )
    assert out.read_bytes() == open(PERTURBED, "rb").read()
    plain, bom = Coco(tmp_path / "plain", coco_dict()), Coco(tmp_path / "bom", "\ufeff" + json.dumps(coco_dict()))
    plain.run(), bom.run()
    assert bom.records() == plain.records() and len(plain.records()) == 6
    sys.argv, argv = ["report.py"], sys.argv  # the module reads its --NAME=value overrides on import
    try:
        import report
    finally:
        sys.argv = argv
    metrics = os.path.join(REFERENCE, "fixture_with_perturb__LGIP_ALL.metrics.json")
    assert report.load_metrics(with_bom(metrics, tmp_path / "m.json")) == report.load_metrics(metrics)
    line = {
        "line": 1,
        "image_id": 1,
        "image_path": "a.jpg",
        "caption_index": 0,
        "caption": "c",
        "sim": 0.5,
        "paraphrases": [{"text": "p", "sim": 0.3}],
        "flips": [{"text": "f", "sim": 0.7, "type": "color"}],
    }
    (tmp_path / "s.jsonl").write_text(json.dumps(line) + "\n")
    scores = [("multi", "m", str(tmp_path / "s.jsonl"))]
    bom_scores = [("multi", "m", with_bom(tmp_path / "s.jsonl", tmp_path / "bom_s.jsonl", crlf=True))]
    with_mark, plain = report.scan_scores(bom_scores, 5), report.scan_scores(scores, 5)
    assert (with_mark.paraphrases, with_mark.flips) == (plain.paraphrases, plain.flips)
    assert plain.flips[None][0]["gap"] == pytest.approx(-0.2)


def test_two_evaluations_at_once_on_one_cache_folder(tmp_path):
    """Both give the published numbers, and the cache stays whole: every chunk loads, and holds
    every text and image of the run."""
    cache = tmp_path / "cache"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                os.path.join(ROOT, "run_lgip_multi.py"),
                *eval_args(
                    copy_input(tmp_path / name),
                    models=[SIGLIP_TINY],
                    CACHE_DIR=str(cache),
                    CACHE_FLUSH_S=0,
                    TEXT_BATCH_SIZE=16,
                ),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in "ab"
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "warning" not in err, err
    keys = whole_chunks(cache)
    assert len(keys["text"]) == 497 and len(keys["image"]) == 12 and len(os.listdir(cache)) == 1
    reference = json.load(open(os.path.join(REFERENCE, "fixture_with_perturb__LGIP_tiny_siglip.metrics.json")))
    for name in "ab":
        assert_matches(json.load(open(tmp_path / name / "in__LGIP_tiny_siglip.metrics.json")), reference)


def test_the_path_sensitive_cases_pass_from_a_long_folder(tmp_path):
    """The cases whose outputs hold absolute paths (a full disk's room for the metrics, the help's
    wrapping of a default path) run from a checkout in a folder of over 120 characters, their
    temporary folders there too: a fixed byte budget or width that only a short path meets fails here."""
    home = tmp_path / ("a_checkout_in_a_folder_with_a_long_name_" * 3)[:110]
    keep = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", ".lgip_cache", "*.tmp")
    home.mkdir()
    for name in os.listdir(ROOT):
        src = os.path.join(ROOT, name)
        if name in ("lgip", "tests", "demo", "benchmarks"):
            shutil.copytree(src, home / name, ignore=keep)
        elif name.endswith(".py") or name == "requirements.txt":
            shutil.copy(src, home / name)
    assert len(str(home)) > 120
    cases = [
        "tests/test_faults.py::test_a_full_disk_keeps_the_metrics_and_a_full_cache_costs_nothing",
        "tests/test_faults.py::test_a_full_disk_stops_a_script_before_its_work",
        "tests/test_faults.py::test_an_output_that_cannot_be_written_says_which_why_and_what_to_do",
        "tests/test_settings.py::test_help_wraps_long_defaults",
    ]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            f"--basetemp={home / 'pytest_tmp'}",
            *cases,
        ],
        cwd=home,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "4 passed" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]
