"""run_all.py's CLASSIFY and FINETUNE["wise"] (LGIP_SPEC.md 16), planned (DRY_RUN): step run_lgip_classification
after the evaluations, on the file the report reads, with run_all's MODELS, or with FINETUNE the start, each arm and
its WiSE-FT points by alpha on the held-out file (the same models, in the same order, as the held-out probe's); each
arm's wise_ft steps after the arms are trained; CLASSIFY "auto" is "shapes" with DATA="shapes" and no step
otherwise; a bad CLASSIFY stops run_all before any step.

The plan is made by a copy of the checkout's scripts in a folder of the test's own, where run_lgip_classification.py
is the checkout's when it is there, else a stand-in with the settings LGIP_SPEC.md 16 gives it (a dry run reads a
step's settings from its script and runs nothing)."""

import ast
import glob
import os
import re
import shutil

import pytest

from conftest import OPENCLIP_TINY, ROOT, _here

STAND_IN = '''"""A stand-in for run_lgip_classification.py's settings (LGIP_SPEC.md 16): planned, never run."""
import common

DATASETS = None
MODELS = None
TEMPLATES = "dataset"
GENERATIVE_TEMPLATES = ["a photo of a {c}."]
OOD_SCORE = "msp"
SPLIT_SEED = 0
BOOTSTRAP = 1000
BOOTSTRAP_SEED = 0
JSONL_PATH = None
OUTPUT_DIR = None
PROTOCOL = "corrected"
DEVICE = "auto"
DTYPE = "auto"
ON_MODEL_ERROR = "stop"
SHARD = None
VERBOSE = True
CONFIG = common.configure(globals())
'''


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """The checkout's scripts, copied; run_lgip_classification.py the checkout's or the stand-in."""
    folder = tmp_path_factory.mktemp("checkout")
    for path in glob.glob(os.path.join(ROOT, "*.py")):
        shutil.copy(path, folder)
    if not (folder / "run_lgip_classification.py").exists():
        (folder / "run_lgip_classification.py").write_text(STAND_IN, encoding="utf-8")
    return folder


def dry_run(checkout, *args, check=True):
    proc = _here(str(checkout / "run_all.py"), ["--DRY_RUN=True", "--VERBOSE=False", *args])
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def steps(out):
    """[(k, name, its command line)] of a dry run's plan."""
    found = re.findall(r"^\[(\d+)/\d+\] (\w+): would run \(.*?\)\n  \$ (.*)$", out, re.M)
    return [(int(k), name, line) for k, name, line in found]


def setting(line, name):
    """The value of --NAME=... in a printed command line (a Python literal, quoted or not)."""
    m = re.search(rf'"--{name}=(.*?)"(?: |$)', line) or re.search(rf"--{name}=(\S+)", line)
    try:
        return ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        return m.group(1)


def test_the_shapes_plan_classifies_the_start_each_arm_and_its_wise_points_on_the_held_out_file(checkout, tmp_path):
    folder = tmp_path / "shapes"
    plan = steps(dry_run(checkout, "--DATA=shapes", f"--SHAPES_DIR={folder}").stdout)
    names = [n for _, n, _ in plan]
    assert names == [
        "make_shapes",
        "make_perturb_with_fliptypes",
        "pretrain_shapes",
        "finetune",
        "finetune",
        "wise_ft",
        "wise_ft",
        "finetune_by_fliptype",
        "finetune_retrieval",
        "finetune_images",
        "run_lgip_classification",
        "finetune_report",
    ]
    probe = dict((n, (k, line)) for k, n, line in plan)
    k, line = probe["finetune_by_fliptype"]
    start = "shapes_pretrained"
    order = [
        start,
        f"{start}__ft_plain",
        f"{start}__ft_plain__wise0.5",
        f"{start}__ft_lgip",
        f"{start}__ft_lgip__wise0.5",
    ]
    models = setting(line, "MODELS")
    assert [m["name"] for m in models] == order
    stem = folder / "lgip_shapes_with_fliptypes"
    point = models[2]["model_name"]
    assert point == f"local-dir:{stem}__ft_{order[2]}/model"
    _, classify = probe["run_lgip_classification"]
    assert f"--MODELS=<the model specs of [{k}/12] finetune_by_fliptype>" in classify  # (the same specs, in order)
    assert setting(classify, "JSONL_PATH") == f"{stem}__ft_heldout.jsonl"
    assert setting(classify, "DATASETS") == [
        {"name": "shapes", "source": "shapes", "role": "id", "root": str(folder)},
        {"name": "shapes_ood", "source": "shapes", "role": "ood", "root": str(folder)},
    ]
    wise = [line for _, n, line in plan if n == "wise_ft"]
    assert [setting(x, "ALPHA") for x in wise] == [0.5, 0.5]
    assert [setting(x, "ARM")["name"] for x in wise] == [order[1], order[3]]
    assert [setting(x, "RUN_NAME") for x in wise] == [order[2], order[4]]
    assert setting(wise[0], "MODEL")["name"] == start
    off = steps(dry_run(checkout, "--DATA=shapes", f"--SHAPES_DIR={folder}", "--CLASSIFY=None").stdout)
    assert "run_lgip_classification" not in [n for _, n, _ in off] and len(off) == 11


def test_wise_alphas_in_order_none_and_a_dataset_list_on_the_demo(checkout, tmp_path):
    from lgip.demo import demo_inputs

    folder = tmp_path / "demo"
    demo_inputs(folder)
    base = ["--DATA=demo", f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}", "--MODELS=demo"]
    sets = [{"name": "pets", "source": "folder", "role": "id", "root": str(tmp_path / "pets")}]
    ft = {"model": OPENCLIP_TINY, "STEPS": 2, "wise": [0.75, 0.25], "arms": {"lgip": {}}}
    plan = steps(dry_run(checkout, *base, f"--FINETUNE={ft!r}", f"--CLASSIFY={sets!r}", check=False).stdout)
    probe = dict((n, line) for _, n, line in plan)
    tags = ["tiny_openclip", "tiny_openclip__ft_lgip", "tiny_openclip__ft_lgip__wise0.25"]
    tags += ["tiny_openclip__ft_lgip__wise0.75"]
    assert [m["name"] for m in setting(probe["finetune_by_fliptype"], "MODELS")] == tags
    names = [n for _, n, _ in plan]
    assert names.index("run_lgip_classification") == names.index("finetune_images") + 1
    assert names.count("run_lgip_classification") == 1 and names[-2:] == ["finetune_report", "report"]
    assert setting(probe["run_lgip_classification"], "DATASETS") == sets
    assert "finetune_lgip.py" in probe["finetune"] and "--STEPS=2" in probe["finetune"]
    assert "--wise" not in probe["finetune"]  # (run_all's own key, not a finetune_lgip.py constant)
    # no FINETUNE: the demo's models on the base file, before the report; CLASSIFY "auto" (the default): no step
    plan = steps(dry_run(checkout, *base, f"--CLASSIFY={sets!r}", check=False).stdout)
    names = [n for _, n, _ in plan]
    assert names[-2:] == ["run_lgip_classification", "report"]
    line = plan[-2][2]
    assert setting(line, "JSONL_PATH") == str(folder / "lgip_demo.jsonl")
    assert "--MODELS=<the model specs of" in line
    assert "run_lgip_classification" not in [n for _, n, _ in steps(dry_run(checkout, *base, check=False).stdout)]
    ft["wise"] = []
    plan = steps(dry_run(checkout, *base, f"--FINETUNE={ft!r}", check=False).stdout)
    assert "wise_ft" not in [n for _, n, _ in plan]


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--CLASSIFY='imagenet'"], 'CLASSIFY must be "auto", None, "shapes" or a list of datasets'),
        (["--CLASSIFY=[]"], "CLASSIFY must be"),
        ([f"--FINETUNE={{'model': {OPENCLIP_TINY!r}, 'wise': [2]}}"], r'FINETUNE\["wise"\] must be a list of numbers'),
    ],
)
def test_a_bad_classify_or_wise_stops_before_any_step(checkout, tmp_path, extra, words):
    from lgip.demo import demo_inputs

    demo_inputs(tmp_path / "demo")
    proc = dry_run(
        checkout,
        "--DATA=demo",
        f"--DEMO_JSONL={tmp_path / 'demo' / 'lgip_demo.jsonl'}",
        "--MODELS=demo",
        *extra,
        check=False,
    )
    assert proc.returncode == 2 and re.search(words, proc.stderr), proc.stderr
    assert "would run" not in proc.stdout
