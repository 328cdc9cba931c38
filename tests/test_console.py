"""What a run shows as it goes: tqdm's bar on a terminal for every loop over a model's batches (texts, images,
pairs), however few; in a log (stderr not a terminal) only for a large job, as before (lgip.util.shows_bar)."""

import contextlib
import io
import shutil

from conftest import REFERENCE, TINY_MODELS, eval_settings


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _scored(tmp_path, stderr):
    import run_lgip_multi

    tmp_path.mkdir()
    src = tmp_path / "x_with_perturb.jsonl"
    shutil.copy(REFERENCE + "/fixture_with_perturb.jsonl", src)
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        run_lgip_multi.run(**eval_settings(src, "corrected", TINY_MODELS[:1], BOOTSTRAP=0, CACHE_DIR=None))
    return stderr.getvalue()


def test_a_terminal_shows_a_bar_for_a_small_job_and_a_log_does_not(tmp_path):
    from lgip.util import shows_bar

    shown = _scored(tmp_path / "tty", _Terminal())
    assert "tiny_openclip: texts" in shown and "tiny_openclip: images" in shown and "batch/s" in shown, shown
    logged = _scored(tmp_path / "log", io.StringIO())
    assert "batch/s" not in logged and "tiny_openclip: texts" not in logged
    with contextlib.redirect_stderr(_Terminal()):
        assert shows_bar(1, 2000) and not shows_bar(0, 2000)
    with contextlib.redirect_stderr(io.StringIO()):
        assert not shows_bar(1999, 2000) and shows_bar(2000, 2000) and shows_bar(None, 2000)


def test_a_log_gets_a_bars_start_and_end_lines_only():
    from lgip.util import progress, progress_bar

    log = io.StringIO()
    with contextlib.redirect_stderr(log):
        assert list(progress(range(2500), total=2500, desc="m: pairs", unit="pair")) == list(range(2500))
        bar = progress_bar(3000, desc="m: images", unit="image")
        for _ in range(3000):
            bar.update(1)
        bar.close()
        bar.close()  # (a second close writes nothing)
        assert list(progress(range(5), total=5, desc="small")) == list(range(5))  # (under min_total: no lines)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 4, lines
    assert lines[0] == "m: pairs: 2,500 pairs to go" and lines[1].startswith("m: pairs: 2,500 of 2,500 pairs in ")
    assert lines[2] == "m: images: 3,000 images to go" and lines[3].startswith("m: images: 3,000 of 3,000 images")


def test_detail_is_said_only_when_verbose(capsys):
    from lgip import console

    console.detail("a")
    with console.quiet():
        console.detail("b")
        with console.quiet(False):
            console.detail("c")
        console.detail("d")
    assert capsys.readouterr().out == "a\nc\n" and console.VERBOSE


def test_the_demo_inputs_from_python_are_made_when_missing(tmp_path):
    """lgip.demo.demo_inputs: the bundled demo's evaluation inputs as paths, made by the generators where missing
    (the same bytes as run_all's steps make), in a folder of one's own; then an evaluation runs on them."""
    import filecmp

    import run_lgip_multi
    from lgip.demo import DEMO_JSONL, demo_inputs

    paths = demo_inputs(tmp_path / "mine")
    assert sorted(paths) == ["base", "enhanced", "fliptypes", "perturb"]
    assert all(p.startswith(str(tmp_path / "mine")) for p in paths.values())
    assert filecmp.cmp(paths["base"], DEMO_JSONL, shallow=False)
    again = demo_inputs(tmp_path / "mine")  # (made once: the second call finds them)
    assert again == paths
    with contextlib.redirect_stdout(io.StringIO()):
        rows = run_lgip_multi.run(JSONL_PATH=paths["perturb"], MODELS=["demo"], BOOTSTRAP=0, DEVICE="cpu")
    assert rows[0]["model_tag"] == "demo_tiny_random" and rows[0]["num_samples"] == 12


def test_a_script_says_everything_by_default_and_its_result_lines_with_verbose_false(tmp_path):
    """Each script's VERBOSE: True (a script on its own) prints the paths it wrote; False (run_all's default,
    passed to its steps) its result lines alone."""
    from conftest import eval_args, run_script

    tmp_path.mkdir(exist_ok=True)
    src = tmp_path / "x_with_perturb.jsonl"
    shutil.copy(REFERENCE + "/fixture_with_perturb.jsonl", src)
    args = eval_args(src, "corrected", TINY_MODELS[:1], BOOTSTRAP=0, CACHE_DIR=None)
    loud = run_script("run_lgip_multi.py", *args).stdout
    terse = run_script("run_lgip_multi.py", *args, "--VERBOSE=False").stdout
    assert "\n-> " in loud and "-> " not in terse
    assert "tiny_openclip: invariance error" in loud and "tiny_openclip: invariance error" in terse
