import contextlib
import glob
import importlib
import io
import os
import subprocess
import sys

import shutil

import pytest

# One intra-op thread for torch here and in every process a test starts (they inherit the
# environment), unless the caller chose: the fixture models are tiny, so a second thread gains
# nothing, and on a machine with more runnable processes than cores (a CI runner, a run's own
# decoding workers) torch's threads wait for each other spinning: one test measured 19 s of CPU
# with one thread and from 19 to 67 s with two. No test is about the thread count.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
REFERENCE = os.path.join(FIXTURES, "reference")
BASE_JSONL = os.path.join(FIXTURES, "lgip_fixture_base.jsonl")
BENCHMARKS = os.path.join(ROOT, "benchmarks")
sys.path.insert(0, ROOT)
sys.path.insert(1, BENCHMARKS)  # the benchmark scripts, imported by name as the scripts are


def _here(path, args):
    """`python <path> <args>` in this process (runpy, as __main__, with that argv): its exit status and what
    it printed, as subprocess.run(..., capture_output=True, text=True) returns them. A script's run() starts
    from a fresh process state (lgip.entry), so this is what a new process gives, without the seconds of CPU a
    new interpreter spends importing torch, open_clip and transformers again."""
    import runpy
    import traceback

    from lgip.cli import exit_code

    out, err = io.StringIO(), io.StringIO()
    argv, cwd, rc = sys.argv, os.getcwd(), 0
    sys.argv = [path, *args]
    os.chdir(ROOT)  # (where the new process started)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(path, run_name="__main__")
            except SystemExit as e:
                rc = exit_code(e)
            except Exception:  # a traceback and status 1, as the interpreter ends an uncaught error
                traceback.print_exc()
                rc = 1
    finally:
        sys.argv = argv
        os.chdir(cwd)
    return subprocess.CompletedProcess([sys.executable, path, *args], rc, out.getvalue(), err.getvalue())


def run_script(script, *args, env=None, check=True, fresh=False):
    """Run a project script as its users do, `python <script> <args>`: in this process (_here), or, with `env`
    (read by libraries when they are imported), `fresh` or a benchmark, as a new process. Returns the
    CompletedProcess."""
    path = os.path.join(ROOT, script)
    # (a benchmark is a process of its own: it sets the switches and module constants it measures and leaves them)
    if env is not None or fresh or script.startswith("benchmarks") or os.environ.get("LGIP_TEST_FRESH"):
        proc = subprocess.run(
            [sys.executable, path, *args], cwd=ROOT, env=dict(os.environ, **(env or {})), capture_output=True, text=True
        )
    else:
        proc = _here(path, args)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_here(script, **constants):
    """A script's `run(**constants)` in this process (lgip/entry.py: in a fresh process state, as a
    new process would): for a test whose subject is what a run computes or writes, not its command
    line, exit status or signals, so it does not pay a new interpreter's imports (Python, torch,
    open_clip, transformers: seconds of CPU a run). Returns (what run() returned, its stdout, its stderr)."""
    module = importlib.import_module(os.path.splitext(script)[0])
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            result = module.run(**constants)
    except BaseException:  # what it printed, shown with the failing test
        sys.stdout.write(out.getvalue())
        sys.stderr.write(err.getvalue())
        raise
    return result, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def fresh_process_state():
    """Each test starts as a fresh process would: no pixels, token tables or prefix plan left
    by another test, and the Hub not yet asked (lgip.models.hub keeps its answer for the process)."""
    from lgip.models import hub
    from lgip.evaluation import swap_process_state

    swap_process_state()
    hub._HUB.clear()
    yield
    swap_process_state()
    hub._HUB.clear()


def hub_cache_env(folder, specs):
    """The environment of a process whose Hugging Face cache (HF_HOME=`folder`) holds a stand-in
    (an empty file) for every Hub file the specs need, offline: lgip.models.hub then finds them
    cached, so a dry run plans them as a machine that downloaded them would (nothing is loaded)."""
    from lgip.models.hub import hub_files

    for spec in specs:
        for repo, names in hub_files(spec) or []:
            snapshot = os.path.join(folder, "hub", f"models--{repo.replace('/', '--')}", "snapshots", "0" * 40)
            os.makedirs(snapshot, exist_ok=True)
            open(os.path.join(snapshot, names[-1]), "wb").close()
            os.makedirs(os.path.join(snapshot, "..", "..", "refs"), exist_ok=True)
            with open(os.path.join(snapshot, "..", "..", "refs", "main"), "w") as f:
                f.write("0" * 40)
    return {"HF_HOME": str(folder), "HF_HUB_OFFLINE": "1"}


@pytest.fixture
def base_jsonl():
    return BASE_JSONL


OPENCLIP_TINY = {
    "name": "tiny_openclip",
    "type": "openclip",
    "model_name": "local-dir:" + os.path.join(FIXTURES, "models", "openclip-tiny"),
}
SIGLIP_TINY = {"name": "tiny_siglip", "type": "siglip", "model_id": os.path.join(FIXTURES, "models", "siglip-tiny")}
TINY_MODELS = [OPENCLIP_TINY, SIGLIP_TINY]
# words split into uneven pieces: the flips of a caption differ in token length, so the published
# grouping of texts into calls shows in its SigLIP numbers (reference/siglip-tiny-pieces/)
SIGLIP_PIECES = {
    "name": "tiny_siglip_pieces",
    "type": "siglip",
    "model_id": os.path.join(FIXTURES, "models", "siglip-tiny-pieces"),
}


def eval_args(jsonl, protocol="reference", models=TINY_MODELS, image_root=FIXTURES, **extra):
    """Command-line overrides for an evaluation script on CPU with the tiny fixture models."""
    args = [
        f"--JSONL_PATH={jsonl}",
        f"--IMAGE_ROOT={image_root}",
        f"--PROTOCOL={protocol}",
        "--DEVICE=cpu",
        "--NUM_WORKERS=0",
        f"--MODELS={models!r}",
    ]
    return args + [f"--{k}={v!r}" for k, v in extra.items()]


def eval_settings(jsonl, protocol="reference", models=TINY_MODELS, image_root=FIXTURES, **extra):
    """The same settings as run()'s keyword arguments (run_here)."""
    return dict(
        dict(
            JSONL_PATH=str(jsonl),
            IMAGE_ROOT=str(image_root),
            PROTOCOL=protocol,
            DEVICE="cpu",
            NUM_WORKERS=0,
            MODELS=models,
        ),
        **extra,
    )


def embed_image(enc, img):
    """One decoded image (PIL) through the model's own preprocessing, encoded on its own: float32 numpy."""
    import torch

    x = enc.image_transform(img)
    x = {k: v[None] for k, v in x.items()} if isinstance(x, dict) else x[None]
    with torch.no_grad():
        return enc.encode_images(x)[0].float().numpy()


def encode_texts(enc, texts):
    """text -> embedding (float32 numpy), each padded as the corrected protocol pads it alone (SigLIP:
    64; open_clip: its own length), a batch per padded length."""
    import torch

    by_length = {}
    for t in sorted(set(texts)):
        ids = enc.tokenize([t])[0]
        ids = ids + [enc.pad_id] * ((enc.pad_length(None) or len(ids)) - len(ids))
        by_length.setdefault(len(ids), []).append((t, ids))
    out = {}
    for group in by_length.values():
        with torch.no_grad():
            emb = enc.encode_tokens(torch.tensor([ids for _, ids in group])).float().numpy()
        out.update((t, e) for (t, _), e in zip(group, emb))
    return out


CASES = [
    (
        "run_lgip_multi.py",
        "fixture_with_perturb.jsonl",
        [
            "fixture_with_perturb__LGIP_ALL.metrics.json",
            "fixture_with_perturb__LGIP_tiny_openclip.metrics.json",
            "fixture_with_perturb__LGIP_tiny_siglip.metrics.json",
        ],
    ),
    (
        "run_lgip_by_fliptype.py",
        "fixture_with_fliptypes.jsonl",
        ["fixture_with_fliptypes__LGIP_fliptypes.metrics.json"],
    ),
    (
        "rebuttal_enhanced_lgip_by_transformation.py",
        "rebuttal_enhanced_fixture_with_fliptypes.jsonl",
        ["rebuttal_enhanced_fixture_with_fliptypes__ENHANCED_LGIP_analysis.json"],
    ),
]


def _reference_runs(tmp_path_factory, models):
    out = {}
    for script, jsonl, _ in CASES:
        folder = tmp_path_factory.mktemp(script.split(".")[0])
        src = folder / jsonl
        shutil.copy(os.path.join(REFERENCE, jsonl), src)
        out[script] = (folder, run_here(script, **eval_settings(src, models=models)))
    return out


@pytest.fixture(scope="session")
def reference_runs(tmp_path_factory):
    """Each script run once in reference protocol on a copy of its published input (in this
    process: run_here; {script: (folder, (results, stdout, stderr))})."""
    return _reference_runs(tmp_path_factory, TINY_MODELS)


@pytest.fixture(scope="session")
def pieces_runs(tmp_path_factory):
    """The same with the SigLIP whose tokenizer splits words unevenly."""
    return _reference_runs(tmp_path_factory, [SIGLIP_PIECES])


# --- shared by the tests of the engine's concerns (texts, towers, images, device, lookahead, models) ---

TEXTS = [
    "dog",
    "a red bus waiting at a stop",
    "two dogs on the beach",
    "A cat sits on a computer.",
    "A very long caption about two white dogs and one person walking on the beach near a pier",
]
# three texts of very different lengths: batches cut to their longest, SigLIP calls padded to theirs
UNEVEN_TEXTS = [
    "dog",
    "a red bus waiting at a stop",
    "A very long caption about two white dogs and one person walking on the beach near a pier at sunset",
]


def image_paths():
    return sorted(glob.glob(os.path.join(FIXTURES, "images", "*.jpg")))


@pytest.fixture(scope="module")
def enc():
    from lgip.models import load_model

    return load_model(OPENCLIP_TINY, "corrected", "cpu")


@pytest.fixture(scope="module")
def openclip_tiny():
    from lgip.models import load_model

    return load_model(OPENCLIP_TINY, "reference", "cpu")
