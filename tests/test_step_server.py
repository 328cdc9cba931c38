"""lgip/step_server.py: run_all's steps forked from a helper that imported torch once (STEP_START "fork")
are what new processes would be: the same outputs as STEP_START "fresh" (the plain path), the same argv,
folder, sys.path, environment, signal handlers and exit status; Ctrl-C and SIGTERM stop a forked step as
they stop a new one, leaving no process behind; a killed helper is said."""
import glob
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import BENCHMARKS, ROOT, TINY_MODELS, run_script
from lgip.step_server import StepStarter, can_fork

pytestmark = pytest.mark.skipif(not can_fork() or not os.path.isdir("/proc"),
                                reason="the step helper forks on Linux only (elsewhere STEP_START falls back to fresh)")

# what a script sees of its process, printed as one line
PROBE = """import os, signal, sys
print(repr((sys.argv, os.getcwd(), sys.path[0], __name__, os.environ.get("PROBE_MARK"),
            signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.getsignal(signal.SIGTERM))),
      flush=True)
what = sys.argv[1]
if what == "raise":
    raise ValueError("from the script")
if what == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if what == "helper":
    os.kill(os.getppid(), signal.SIGKILL)
sys.exit(int(what))
"""


def _started(starter, folder, script, *args):
    """(the process object, returncode, stdout, stderr) of `python script args` as the starter starts it,
    its streams files of `folder`."""
    with open(folder / "out", "w+") as out, open(folder / "err", "w+") as err:
        proc = starter.popen([sys.executable, script, *args], forkable=True, stdout=out, stderr=err)
        rc = proc.wait(timeout=60)
        out.seek(0), err.seek(0)
        return proc, rc, out.read(), err.read()


def test_a_forked_step_sees_what_a_new_process_sees_and_ends_as_it_would(tmp_path, monkeypatch):
    script = str(tmp_path / "probe.py")
    open(script, "w").write(PROBE)
    monkeypatch.setenv("PROBE_MARK", "m1")
    monkeypatch.chdir(tmp_path)
    with StepStarter("fork", preload=()) as starter:
        for what, code in (("0", 0), ("3", 3), ("raise", 1), ("kill", -signal.SIGKILL)):
            proc, rc, out, err = _started(starter, tmp_path, script, what)
            fresh = subprocess.run([sys.executable, script, what], capture_output=True, text=True)
            assert type(proc).__name__ == "_Child" and rc == fresh.returncode == code, (what, rc, err)
            assert out == fresh.stdout and "'m1'" in out and str(tmp_path) in out, (out, fresh.stdout)
            if what == "raise":
                assert err.endswith(fresh.stderr.splitlines()[-1] + "\n") and "Traceback" in err
        # a changed environment (a library may have read it when the helper imported it): a new process
        monkeypatch.setenv("PROBE_MARK", "m2")
        proc, rc, out, _ = _started(starter, tmp_path, script, "0")
        assert type(proc).__name__ == "Popen" and rc == 0 and "'m2'" in out
        monkeypatch.setenv("PROBE_MARK", "m1")
        with pytest.raises(RuntimeError, match="the step helper ended unexpectedly"):
            _started(starter, tmp_path, script, "helper")


def test_a_helper_that_cannot_start_is_said_once_and_every_command_starts_fresh(tmp_path, monkeypatch, capfd):
    script = str(tmp_path / "probe.py")
    open(script, "w").write(PROBE)
    (tmp_path / "boom.py").write_text("raise RuntimeError('a broken install')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with StepStarter("fork", preload=("boom",)) as starter:
        for _ in range(2):
            proc, rc, out, _ = _started(starter, tmp_path, script, "0")
            assert type(proc).__name__ == "Popen" and rc == 0 and starter.helper is None
    err = capfd.readouterr().err
    assert err.count("note: the step helper did not start (RuntimeError: a broken install)") == 1, err


def test_a_helper_whose_imports_touched_cuda_would_not_fork():
    """lgip.step_server.fork_poisoned asks a forked child whether CUDA is usable there (torch's mark): where it
    is not, the helper says it is not ready and every step starts fresh."""
    from lgip.step_server import fork_poisoned
    assert fork_poisoned(None) is False and fork_poisoned(lambda: False) is False
    assert fork_poisoned(lambda: True) is True


def test_fresh_mode_and_no_fork_start_new_processes(tmp_path, monkeypatch):
    script = str(tmp_path / "probe.py")
    open(script, "w").write(PROBE)
    with StepStarter("fresh") as starter:
        proc, rc, _, _ = _started(starter, tmp_path, script, "0")
        assert type(proc).__name__ == "Popen" and rc == 0 and starter.helper is None
    import lgip.step_server as server
    monkeypatch.setattr(server, "can_fork", lambda: False)
    assert StepStarter("fork").mode == "fresh"
    with pytest.raises(ValueError, match="'fork', 'fresh'"):
        StepStarter("spawn")


def _run_all(folder, mode, *args):
    return run_script("run_all.py", f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}", "--DATA=demo",
                      f"--MODELS={TINY_MODELS[:1]!r}", "--DEVICE=cpu", "--NUM_WORKERS=0", f"--STEP_START={mode}",
                      "--STEPS=['diff_gen_caption', 'run_lgip_multi', 'report']", "--SETTINGS={'BOOTSTRAP': 50}", *args)


def test_forked_steps_write_what_new_processes_write(tmp_path):
    """The exactness test of STEP_START: the same steps run fresh, then forked, in the same folder (so
    every path they record is the same), give the same outputs but for their times
    (benchmarks/compare_outputs.py)."""
    from test_run_all import demo_inputs
    folder = demo_inputs(tmp_path / "demo")
    fresh = _run_all(folder, "fresh")
    shutil.move(folder, tmp_path / "fresh")  # (its cache too: the forked run computes everything again)
    demo_inputs(folder)
    forked = _run_all(folder, "fork")
    assert "ran 3 of 3 steps" in fresh.stdout and "ran 3 of 3 steps" in forked.stdout
    compared = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "compare_outputs.py"), str(tmp_path / "fresh"),
                               str(folder)], capture_output=True, text=True)
    assert compared.returncode == 0 and " 0 differ" in compared.stdout, compared.stdout


def _marked(mark):
    """pids of live processes whose environment holds `mark` (run_all, its helper, the steps and their workers)."""
    found = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            if mark.encode() in open(os.path.join(d, "environ"), "rb").read():
                if open(os.path.join(d, "stat")).read().split(")")[-1].split()[0] != "Z":
                    found.append(int(os.path.basename(d)))
        except OSError:
            pass
    return found


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_forked_step_stops_as_a_new_one_does_and_leaves_nothing(tmp_path, how):
    """Ctrl-C (SIGINT to the terminal's process group) or a scheduler's SIGTERM to run_all alone, while a
    forked evaluation runs: run_all passes it on, the step stops as it does (no metrics file), run_all
    exits 130 or 143 saying the same command goes on, and no process of the run is left."""
    from test_run_all import demo_inputs
    folder = demo_inputs(tmp_path / "demo")
    spec = {"name": "slow", "type": "python", "loader": os.path.join(ROOT, "tests", "user_loaders.py") + ":slow"}
    mark = f"LGIP_TEST_MARK={tmp_path}"
    env = dict(os.environ, LGIP_TEST_MARK=str(tmp_path))
    # (SIGINT handled as in a terminal, even where the tests run in the background with it ignored)
    code = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            f"sys.argv = sys.argv[1:]; runpy.run_path({os.path.join(ROOT, 'run_all.py')!r}, run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", code, "run_all.py", f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}",
                             "--DATA=demo", f"--MODELS={[spec]!r}", "--DEVICE=cpu", "--NUM_WORKERS=0",
                             "--STEPS=['diff_gen_caption', 'make_perturb_with_fliptypes', 'run_lgip_multi', "
                             "'run_lgip_by_fliptype']", "--TEXT_BATCH_SIZE=4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("encoded"):
            break
    assert lines and lines[-1].startswith("encoded"), "".join(lines) + proc.stderr.read()
    helpers = [p for p in _marked(mark) if b"step_server.py" in open(f"/proc/{p}/cmdline", "rb").read()]
    assert len(helpers) == 2  # (the helper and the step forked from it)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    t0 = time.perf_counter()
    rc = proc.wait(timeout=60)
    seconds, err = time.perf_counter() - t0, proc.stderr.read()
    # (within run_all's 25 s grace: the step stopped on the signal itself, not on run_all's second SIGTERM)
    assert rc == (130 if how == "ctrl-c" else 143) and seconds < 20, (rc, seconds, err[-2000:])
    assert "during step run_lgip_multi; later steps not run. Run the same command again to go on" in err, err[-2000:]
    assert not glob.glob(str(folder / "*.metrics.json"))
    deadline = time.time() + 10
    while _marked(mark) and time.time() < deadline:
        time.sleep(0.1)
    assert _marked(mark) == []
