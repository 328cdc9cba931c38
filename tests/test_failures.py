"""Runs that fail fast, lose little to a crash, re-run from the cache without the model, and stop
cleanly on Ctrl-C. No network: the Hub is pointed at a closed local port, Hugging Face's cache
at a temp folder; the models are the tiny fixture ones."""

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import (
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
from test_accelerations import assert_same_numbers

HUB_SIGLIP = {"name": "hub_siglip", "type": "siglip", "model_id": "google/siglip-base-patch16-224"}
HUB_OPENCLIP = {"name": "hub_b16", "type": "openclip", "model_name": "ViT-B-16", "pretrained": "openai"}


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


@pytest.fixture
def no_hub(tmp_path):
    """Environment of a machine whose Hub cannot be reached, with an empty Hugging Face cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}", HF_HOME=str(tmp_path / "hf_home"))
    return env


def python(code, env, timeout=120):
    return subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r})\n{code}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


LOAD_TIMED = """
import time
import open_clip, transformers  # (their imports are seconds of CPU on a busy machine: not what is timed)
from lgip.errors import ModelError
from lgip.models import load_model
t0 = time.perf_counter()
try:
    load_model({spec!r}, "corrected", "cpu")
except ModelError as e:
    print("seconds", time.perf_counter() - t0)
    print(e)
"""


@pytest.mark.parametrize("spec", [HUB_SIGLIP, HUB_OPENCLIP], ids=["siglip", "openclip"])
def test_unreachable_hub_fails_a_model_at_once_with_what_to_do(no_hub, spec):
    proc = python(LOAD_TIMED.format(spec=spec), no_hub)
    seconds = float(proc.stdout.split("seconds", 1)[1].split()[0])
    assert seconds < 10, proc.stdout
    message = proc.stdout.split("\n", 1)[1]
    assert f"model {spec['name']!r}" in message and "cannot be reached (ConnectionRefusedError" in message
    assert "HF_HUB_OFFLINE=1" in message and (
        '"model_id": "/path/to/folder"' in message or "local-dir:/path/to/folder" in message
    )
    assert "Retrying" not in proc.stderr + proc.stdout  # no retry warnings


def test_offline_setting_is_honoured_without_asking_the_hub(no_hub):
    env = dict(
        no_hub, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://192.0.2.1:9"
    )  # (a non-routable address: a request would hang)
    proc = python(LOAD_TIMED.format(spec=HUB_SIGLIP), env)
    assert float(proc.stdout.split("seconds", 1)[1].split()[0]) < 5
    assert "HF_HUB_OFFLINE=1 is set" in proc.stdout


def test_a_run_names_every_model_it_cannot_load_before_any_work(no_hub, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(open(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), "rb").read())
    t0 = time.perf_counter()
    proc = run_script(
        "run_lgip_multi.py", *eval_args(src, models=[OPENCLIP_TINY, HUB_SIGLIP, HUB_OPENCLIP]), env=no_hub, check=False
    )
    assert proc.returncode == 2 and time.perf_counter() - t0 < 60
    assert "2 of 3 models cannot be loaded, so nothing was run" in proc.stderr
    assert "model 'hub_siglip'" in proc.stderr and "model 'hub_b16'" in proc.stderr
    assert not glob.glob(str(tmp_path / "*.json")) and not os.path.exists(tmp_path / ".lgip_cache")


def hf_cache_with(tmp_path, repo, folder):
    """A Hugging Face cache (HF_HOME) holding `folder`'s files as `repo` at main."""
    home = tmp_path / "hf_home"
    snap = home / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    for name in os.listdir(folder):
        os.symlink(os.path.join(folder, name), snap / name)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("0" * 40)
    return home


def test_a_cached_hub_model_loads_without_the_hub(no_hub, tmp_path):
    """A Hub id found in the local cache loads from it while the Hub cannot be reached: the same
    numbers as the local folder, no retries."""
    hf_cache_with(tmp_path, "lgip-test/siglip-tiny", os.path.join(FIXTURES, "models", "siglip-tiny"))
    spec = {"name": "cached", "type": "siglip", "model_id": "lgip-test/siglip-tiny"}
    out = {}
    for name, model in (("hub", spec), ("local", dict(SIGLIP_TINY, name="cached"))):
        folder = tmp_path / name
        folder.mkdir()
        src = folder / "in.jsonl"
        src.write_bytes(open(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), "rb").read())
        if name == "hub":  # (a process of its own: the Hub's address and cache are read from its environment)
            proc = run_script("run_lgip_multi.py", *eval_args(src, models=[model], CACHE_DIR=None), env=no_hub)
            assert "Retrying" not in proc.stderr
        else:
            run_here("run_lgip_multi.py", **eval_settings(src, models=[model], CACHE_DIR=None))
        out[name] = json.load(open(folder / "in__LGIP_ALL.metrics.json"))
    assert_same_numbers(out["hub"], out["local"], tol=0)


def test_cache_chunks_are_written_after_cache_flush_s_of_work(tmp_path):
    """Rows made more than CACHE_FLUSH_S ago reach the disk though the chunk is far from full."""
    import torch
    from lgip.cache import ModelCache
    from lgip.device import _DeviceRows, _Rows
    from lgip.models import key_encoder

    enc = key_encoder(OPENCLIP_TINY, "corrected", "cpu")
    cache = ModelCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=1 << 20, flush_s=0.3)
    writer = cache.writer("text")
    rows = _DeviceRows(enc, _Rows(4, 0.0, "cpu", torch.float32), writer, ["a", "b", "c", "d"].__getitem__)
    rows.add([0], torch.ones(1, 3))
    assert not glob.glob(os.path.join(cache.dir, "text-*.npz"))
    time.sleep(0.35)
    rows.add([1], torch.ones(1, 3))  # its batch ends 0.35 s of work after the last write: both rows go to disk
    writer.close()
    assert len(glob.glob(os.path.join(cache.dir, "text-*.npz"))) == 1
    assert ModelCache(str(tmp_path), enc, OPENCLIP_TINY).lookup("text", ["a", "b", "c"])[0] == [0, 1]


KILLED_RUN = """
import os, runpy, signal, glob, time
from lgip import evaluation
real = evaluation.load_model
def load(*args, **kwargs):
    enc = real(*args, **kwargs)
    encode, n = enc.encode_tokens, [0]
    def encode_then_die(*a, **k):
        n[0] += 1
        if n[0] == {kill_at}:  # two chunks on disk first (the cache's thread writes them within ms)
            deadline = time.time() + 30
            while len(glob.glob({chunks!r})) < 2 and time.time() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        return encode(*a, **k)
    enc.encode_tokens = encode_then_die
    return enc
evaluation.load_model = load
sys.argv = {argv!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def test_a_run_killed_mid_way_resumes_and_gives_the_same_metrics(tmp_path):
    src = {}
    for name in ("killed", "whole"):
        (tmp_path / name).mkdir()
        src[name] = tmp_path / name / "in.jsonl"
        src[name].write_bytes(open(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), "rb").read())
    settings = dict(protocol="reference", models=[SIGLIP_TINY], TEXT_BATCH_SIZE=16, CACHE_FLUSH_S=0)
    code = KILLED_RUN.format(
        kill_at=12,
        chunks=str(tmp_path / "killed" / ".lgip_cache" / "*" / "text-*.npz"),
        argv=["run_lgip_multi.py", *eval_args(src["killed"], **settings)],
        script=os.path.join(ROOT, "run_lgip_multi.py"),
    )
    proc = python(code, dict(os.environ))
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not glob.glob(str(tmp_path / "killed" / "*.json"))
    _, stdout, _ = run_here("run_lgip_multi.py", **eval_settings(src["killed"], **settings))  # the same command again
    line = next(l for l in stdout.splitlines() if "from the cache:" in l)
    hits, total = (int(x.replace(",", "")) for x in line.split("from the cache: ")[1].split(" texts")[0].split(" of "))
    assert 16 <= hits < total  # at least the chunks written before the kill (a chunk per batch of 16)
    run_here("run_lgip_multi.py", **eval_settings(src["whole"], "reference", [SIGLIP_TINY], TEXT_BATCH_SIZE=16))
    killed, whole = (json.load(open(tmp_path / n / "in__LGIP_ALL.metrics.json")) for n in ("killed", "whole"))
    assert killed[0]["run"]["cache"]["resumed"]["texts"] == [hits, total]
    assert_same_numbers(killed, whole)


@pytest.mark.parametrize("protocol", ["corrected", "reference"])
def test_a_rerun_from_the_cache_does_not_load_the_weights(tmp_path, protocol):
    import shutil

    src = tmp_path / "in.jsonl"
    src.write_bytes(open(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"), "rb").read())
    shutil.copytree(os.path.join(FIXTURES, "images"), tmp_path / "images")
    models = [OPENCLIP_TINY, SIGLIP_TINY]
    outputs = []
    for attempt in range(3):
        if attempt == 2:  # an image that changed: its embedding is not in the cache, the model loads
            os.utime(tmp_path / "images" / "000000000003.jpg", (time.time() + 5, time.time() + 5))
        _, stdout, _ = run_here("run_lgip_by_fliptype.py", **eval_settings(src, protocol, models, image_root=tmp_path))
        outputs.append(json.load(open(tmp_path / "in__LGIP_fliptypes.metrics.json")))
    first, cached, changed = outputs
    assert [m["run"]["model"]["weights_loaded"] for m in first] == [True, True]
    assert [m["run"]["model"]["weights_loaded"] for m in cached] == [False, False]
    assert [m["run"]["model"]["weights_loaded"] for m in changed] == [True, True]
    assert all(m["run"]["cache"]["resumed"]["images"] == [11, 12] for m in changed)
    assert "(all of them: the model's weights were not loaded)" not in stdout
    assert_same_numbers(first, cached, tol=0)
    assert_same_numbers(first, changed)


# A run whose every text batch takes 0.15 s longer and says how many texts it encoded: slow enough
# to be stopped mid-way (Ctrl-C here, SIGTERM in test_faults.py).
SLOW_RUN = """
import os, runpy, time
from lgip import evaluation
real = evaluation.load_model
def load(*args, **kwargs):
    enc = real(*args, **kwargs)
    for name in ("encode_tokens", "encode_packs"):
        f = getattr(enc, name)
        if f is not None:
            def slow(*a, _f=f, **k):
                time.sleep(0.15)
                out = _f(*a, **k)
                print("encoded", len(out), flush=True)
                return out
            setattr(enc, name, slow)
    return enc
evaluation.load_model = load
sys.argv = {argv!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def processes_with(marker):
    """pids of live processes whose command line holds `marker` (forked workers keep their parent's)."""
    out = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(os.path.join(d, "cmdline"), "rb") as f:
                if marker.encode() in f.read():
                    with open(os.path.join(d, "stat")) as f:
                        if f.read().split(")")[-1].split()[0] != "Z":
                            out.append(int(os.path.basename(d)))
        except OSError:
            pass
    return out


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to find the processes left behind")
def test_ctrl_c_stops_within_seconds_leaving_nothing_behind(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(open(os.path.join(REFERENCE, "fixture_with_fliptypes.jsonl"), "rb").read())
    models = [OPENCLIP_TINY, dict(OPENCLIP_TINY, name="twin"), SIGLIP_TINY]
    settings = dict(protocol="corrected", models=models, NUM_WORKERS=2, TEXT_BATCH_SIZE=8)
    args = eval_args(src, **settings)
    # Ctrl-C as in a terminal, even when the tests were started in the background (a shell's `cmd &`
    # starts them with SIGINT ignored, and a process inherits that: Python then leaves it ignored)
    code = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n" + SLOW_RUN.format(
        argv=["run_lgip_by_fliptype.py", *args], script=os.path.join(ROOT, "run_lgip_by_fliptype.py")
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r})\n{code}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines = []
    for line in proc.stdout:  # until the first model is done, then Ctrl-C (to the process group, as a terminal)
        lines.append(line)
        if line.startswith("tiny_openclip: invariance error"):
            break
    assert lines[-1].startswith("tiny_openclip: invariance error"), "".join(lines) + proc.stderr.read()
    os.killpg(proc.pid, signal.SIGINT)
    t0 = time.perf_counter()
    rc = proc.wait(timeout=30)
    seconds = time.perf_counter() - t0
    err = proc.stderr.read()
    assert rc == 130 and seconds < 10, (rc, seconds, err[-2000:])
    assert (
        "interrupted: during model twin; finished 1 of 3 models (tiny_openclip); no metrics file was written "
        "(it is written at the end), the finished models' score files are;"
    ) in err, err[-1500:]
    assert "the same command resumes" in err and "Traceback" not in err
    deadline = time.time() + 5
    while processes_with(str(src)) and time.time() < deadline:
        time.sleep(0.1)
    assert processes_with(str(src)) == []  # no worker left behind
    # nothing partial, no temp file: the input, and the finished model's whole score file
    assert sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "*"))) == [
        "in.jsonl",
        "in__LGIP_fliptypes_tiny_openclip.scores.jsonl",
    ]
    assert not glob.glob(str(tmp_path / ".*.tmp")) and not glob.glob(str(tmp_path / ".lgip_cache" / "*" / ".*.tmp"))
    _, stdout, _ = run_here("run_lgip_by_fliptype.py", **eval_settings(src, **settings))  # the same command again
    assert "tiny_openclip: from the cache: " in stdout


def test_an_interrupted_generator_leaves_no_output(tmp_path, capsys):
    from lgip.cli import run_main
    from lgip.generate import run_generator

    out = tmp_path / "out.jsonl"
    done = []

    def perturb(rec, rng, stats):
        done.append(1)
        if len(done) == 3:
            raise KeyboardInterrupt
        return {}

    with pytest.raises(SystemExit) as e:
        run_main(
            lambda: run_generator(
                "gen.py", {"SEED": 42}, os.path.join(FIXTURES, "lgip_fixture_base.jsonl"), str(out), perturb
            )
        )
    assert e.value.code == 130
    assert "interrupted: at record 3 of ~12; " in capsys.readouterr().err
    assert os.listdir(tmp_path) == []
