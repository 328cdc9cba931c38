"""The checkout installed editable and used from a project of one's own (a training loop): the
scripts are importable through lgip.scripts without editing sys.path, and none of our top-level
names (common, report, ...) replaces the project's own modules of the same names."""

import os
import shutil
import subprocess
import sys

from conftest import FIXTURES, REFERENCE, ROOT

TRAINING_LOOP = """
import json, os, sys
import common, report                      # the project's own modules of those names
import open_clip
from lgip.scripts import run_lgip_multi    # no sys.path edit: the editable install's lgip
here = os.path.dirname(os.path.abspath(__file__))
model, _, preprocess = open_clip.create_model_and_transforms("local-dir:" + sys.argv[1])
tokenizer = open_clip.get_tokenizer("local-dir:" + sys.argv[1])
for epoch in range(2):
    spec = {"name": f"epoch{epoch}", "type": "python", "loader": (model, preprocess, tokenizer)}
    rows = run_lgip_multi.run(JSONL_PATH=os.path.join(here, "data", "in_with_perturb.jsonl"), IMAGE_ROOT=sys.argv[2],
                              DEVICE="cpu", NUM_WORKERS=0, BOOTSTRAP=0, CACHE_DIR=None, WRITE_SCORES=False,
                              OUTPUT_DIR=os.path.join(here, "runs"), MODELS=[spec])
    print(epoch, rows[0]["sensitivity_pos_rate"])
assert common.MINE and report.MINE and "run_lgip_multi" not in sys.modules
assert run_lgip_multi.common is not common
print("ours:", run_lgip_multi.__file__)
"""


def _venv_seeing_these_packages(venv):
    """A new venv that sees the packages of the environment running the tests (their site-packages through a .pth
    file: `--system-site-packages` would give the base interpreter's, which lack them when the tests run in a venv
    of their own, as the README's commands make one) and installs into its own: its pip, setuptools and wheel are
    those requirements-test.txt installed, which build an editable wheel offline. Returns its python."""
    import site
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    own = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    ours = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        ours.append(site.getusersitepackages())
    with open(os.path.join(own, "_tests_environment.pth"), "w", encoding="utf-8") as f:
        f.writelines(p + "\n" for p in dict.fromkeys(ours) if os.path.isdir(p))
    return python


def test_an_editable_install_serves_a_training_loop_in_another_folder(tmp_path):
    checkout, project = tmp_path / "checkout", tmp_path / "project"
    keep = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", ".lgip_cache", "*.tmp", "*.egg-info")
    checkout.mkdir()
    for name in os.listdir(ROOT):
        src = os.path.join(ROOT, name)
        if name in ("lgip", "demo"):
            shutil.copytree(src, checkout / name, ignore=keep)
        elif name.endswith((".py", ".toml", ".txt", ".md")) or name == "LICENSE":
            shutil.copy(src, checkout / name)
    before = sorted(os.listdir(checkout))
    venv = tmp_path / "venv"
    python = _venv_seeing_these_packages(venv)
    proc = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index", "-e", str(checkout)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (project / "data").mkdir(parents=True)
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), project / "data" / "in_with_perturb.jsonl")
    (project / "common.py").write_text("MINE = True\n")
    (project / "report.py").write_text("MINE = True\n")
    (project / "train.py").write_text(TRAINING_LOOP)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [python, "train.py", os.path.join(FIXTURES, "models", "openclip-tiny"), FIXTURES],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"ours: {checkout / 'run_lgip_multi.py'}" in proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines() if line[:2] in ("0 ", "1 ")]
    assert len(rows) == 2 and rows[0][1] == rows[1][1]  # (the same model twice: the same figure)
    assert (project / "runs" / "in_with_perturb__LGIP_ALL.metrics.json").is_file()  # its OUTPUT_DIR
    assert os.listdir(project / "data") == ["in_with_perturb.jsonl"]  # nothing beside the input
    assert sorted(n for n in os.listdir(checkout) if not n.endswith(".egg-info")) == before  # nothing new there


def test_lgip_scripts_knows_every_script_and_names_a_mistyped_one():
    import pytest
    import lgip.scripts
    from lgip.errors import ConfigError

    root = {f[:-3] for f in os.listdir(ROOT) if f.endswith(".py") and f != "common.py"}
    assert set(lgip.scripts.SCRIPTS) == root
    with pytest.raises(
        ConfigError, match=r"no script 'run_lgip_mult' in lgip.scripts \(did you mean 'run_lgip_multi'\?\)"
    ):
        lgip.scripts.load("run_lgip_mult")


def test_a_new_venv_installs_the_checkout_with_its_dependencies_declared_and_the_lgip_command(tmp_path):
    """pip install -e <checkout> in a new venv of this Python (no site packages of ours: its own pip and
    setuptools, which have no wheel): the build requirements are declared, so pip's build environment gets them;
    the dependencies are declared (those of requirements.txt that a run needs); the `lgip` command is there.
    --no-deps: the libraries are gigabytes (torch); their declaration is what is checked."""
    import pytest

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    proc = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "-e", ROOT], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0 and ("No matching distribution" in proc.stderr or "connection" in proc.stderr.lower()):
        pytest.skip("pip's build environment needs setuptools and wheel from the package index, not reachable here")
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print('\\n'.join(m.requires('lgip')))"],
        capture_output=True,
        text=True,
    )
    declared = {r.split(">")[0].split("=")[0].split(";")[0].strip().lower() for r in shown.stdout.split()}
    needed = {"torch", "torchvision", "open_clip_torch", "transformers", "pillow", "numpy", "tqdm", "matplotlib"}
    assert needed <= declared, needed - declared
    listed = subprocess.run([str(venv / "bin" / "lgip"), "list"], capture_output=True, text=True)
    assert listed.returncode == 0 and "run_all.py" in listed.stdout and "report.py" in listed.stdout


def test_the_lgip_command_runs_a_script_as_its_command_line_and_names_an_unknown_one(capsys):
    from lgip.command import main

    argv, path = list(sys.argv), list(sys.path)
    try:
        assert main(["report", "--help"]) == 0
        assert "usage: python report.py" in capsys.readouterr().out
        assert main(["eval", "run_lgip_multi", "--help"]) == 0
        assert "--MODELS=" in capsys.readouterr().out
        assert main(["reprot"]) == 2
        assert "unknown command 'reprot' (did you mean 'report'?)" in capsys.readouterr().err
    finally:
        sys.argv, sys.path[:] = argv, path


def _names(path):
    """The package names a requirements file lists (its `-r` includes as ('-r', file))."""
    import re

    out = []
    for line in open(os.path.join(ROOT, path), encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            out.append(("-r", line[3:].strip()))
        elif line:
            out.append(re.split(r"[<>=!~; \[]", line, 1)[0].lower().replace("_", "-"))
    return out


def test_the_run_installs_no_test_tool_and_the_tests_install_what_they_need():
    """requirements.txt: the package's dependencies alone (pyproject's), the classification step's among them;
    requirements-test.txt: those, and the test and lint tools, wheel for the offline editable install, the
    tables' and trackers' libraries (pyproject's extra `test`); the README's two commands and .ci/run use them."""
    import re

    import pytest

    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's tomllib reads pyproject.toml")
    run, test = _names("requirements.txt"), _names("requirements-test.txt")
    tools = {"pytest", "pytest-xdist", "ruff", "playwright", "wheel", "wandb", "mlflow", "mlflow-skinny", "pandas"}
    assert not tools & set(run), tools & set(run)
    assert {"torch", "open-clip-torch", "transformers", "scikit-learn", "scipy", "clip-benchmark"} <= set(run)
    assert test[0] == ("-r", "requirements.txt") and tools - {"mlflow"} <= set(test[1:])
    project = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]
    declared = lambda reqs: [re.split(r"[<>=!~; \[]", r, 1)[0].lower().replace("_", "-") for r in reqs]
    assert sorted(declared(project["dependencies"])) == sorted(run)
    assert sorted(declared(project["optional-dependencies"]["test"])) == sorted(test[1:])
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    first = [x for x in readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines() if not x.startswith("#")]
    assert first == [
        "python -m pip install -q -r requirements.txt && python run_all.py",
        "python -m pip install -q -r requirements-test.txt && python -m pytest -q tests",
    ]
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert "pip install -q -r requirements-test.txt" in ci and "-r requirements.txt\n" not in ci
