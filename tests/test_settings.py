"""Bad settings end before any work with exit status 2 and a message naming the setting, its valid
values and the value given; nothing is written. The shared rules live in lgip.settings, applied by
run_main (command line) and script_call (a script's run() from Python)."""

import ast
import importlib
import json
import os
import shutil

import pytest

from conftest import BASE_JSONL, FIXTURES, OPENCLIP_TINY, ROOT, eval_args, eval_settings, run_script
from lgip.cli import check_config, configure
from lgip.errors import ConfigError
from lgip.models import PUBLISHED_MODELS
from lgip.settings import SETTINGS, check_models, check_settings

SCRIPTS = [
    "bench",
    "bench_host",
    "bench_images",
    "bench_in_memory",
    "bench_lookahead",
    "bench_retrieval",
    "diff_gen_caption",
    "explain_flips",
    "import_benchmark",
    "make_base_jsonl",
    "make_perturb_with_fliptypes",
    "rebuttal_enhanced_lgip_by_transformation",
    "rebuttal_enhanced_perturb_with_fliptypes",
    "report",
    "run_all",
    "run_lgip_by_fliptype",
    "run_lgip_multi",
    "run_lgip_images",
    "run_lgip_retrieval",
    "siglip_sanity_check",
]


def files(folder):
    return sorted(os.listdir(folder))


@pytest.fixture
def perturbed(tmp_path):
    """A copy of the fixture base JSONL with its paraphrases and flips, alone in its folder."""
    shutil.copy(BASE_JSONL, tmp_path / "base.jsonl")
    run_script("diff_gen_caption.py", f"--INPUT_JSONL={tmp_path / 'base.jsonl'}")
    return tmp_path / "base_with_perturb.jsonl"


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_default_passes_its_rule(script):
    mod = importlib.import_module(script)  # (imported, a script keeps its defaults)
    check_config(mod.CONFIG, mod.__file__)


def test_published_model_names_are_file_safe():
    assert check_models(PUBLISHED_MODELS)


BAD = [
    ("BOOTSTRAP", "x"),
    ("BOOTSTRAP", -1),
    ("BOOTSTRAP", 2.5),
    ("BOOTSTRAP", True),
    ("BOOTSTRAP_SEED", "x"),
    ("SEED", [1]),
    ("IMAGE_BATCH_SIZE", 0),
    ("IMAGE_BATCH_SIZE", -3),
    ("IMAGE_BATCH_SIZE", "x"),
    ("TEXT_BATCH_SIZE", 0),
    ("TEXT_BATCH_SIZE", "big"),
    ("NUM_WORKERS", -1),
    ("NUM_WORKERS", "x"),
    ("DEVICE", "tpu"),
    ("DEVICE", 0),
    ("DTYPE", "fp8"),
    ("PROTOCOL", "fast"),
    ("MODELS", "x"),
    ("MODELS", []),
    ("MODEL", {"name": "a"}),
    ("CACHE_DIR", 5),
    ("CACHE_DIR", ""),
    ("CACHE_FLUSH_S", -1),
    ("CACHE_FLUSH_S", "x"),
    ("PIXEL_MEMORY_GB", -1),
    ("LOOKAHEAD", "x"),
    ("WRITE_SCORES", "maybe"),
    ("WRITE_SCORES", 1),
    ("ACCELERATIONS_OFF", ["nope"]),
    ("ACCELERATIONS_OFF", "nope"),
    ("MAX_SAME_PER_CAP", -1),
    ("MAX_DIFF_PER_CAP", 2.5),
    ("MAX_COMBINED_PER_CAP", "x"),
    ("COMBINED_SOURCE_PARAS", -1),
]


@pytest.mark.parametrize("name,value", BAD)
def test_bad_value_names_the_setting_and_the_value(name, value):
    with pytest.raises(ConfigError) as e:
        check_settings({name: value})
    assert str(e.value).startswith(name) and (
        repr(value) in str(e.value) or name in ("MODELS", "MODEL", "ACCELERATIONS_OFF")
    )


def test_rules_take_their_documented_values():
    good = {
        "BOOTSTRAP": 0,
        "SEED": -5,
        "IMAGE_BATCH_SIZE": 1,
        "TEXT_BATCH_SIZE": "auto",
        "NUM_WORKERS": 0,
        "DEVICE": "cpu",
        "DTYPE": "bf16",
        "CACHE_DIR": None,
        "CACHE_FLUSH_S": 0.5,
        "PIXEL_MEMORY_GB": 0,
        "ACCELERATIONS_OFF": "all",
        "MODELS": [OPENCLIP_TINY, dict(OPENCLIP_TINY, name="tiny+v2@b")],
    }
    check_settings(good)
    check_settings({"MODELS": None}, none_ok={"MODELS"})  # (run_all: None = the published models)
    assert set(good) <= set(SETTINGS)


@pytest.mark.parametrize(
    "models,message",
    [
        ([OPENCLIP_TINY, dict(OPENCLIP_TINY)], "two models are named 'tiny_openclip'"),
        ([dict(OPENCLIP_TINY, name="../evil")], "model name '../evil' is not file-safe"),
        ([dict(OPENCLIP_TINY, name="a b")], "letters, digits and . _ - + @"),
        ([dict(OPENCLIP_TINY, type="onnx")], "unknown type 'onnx'"),
        ([{"name": "x", "type": "siglip"}], "needs 'model_id'"),
    ],
)
def test_models_rules(models, message):
    with pytest.raises(ConfigError, match="^MODELS: ") as e:
        check_models(models)
    assert message in str(e.value)


def test_cuda_without_cuda_is_an_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ConfigError, match="DEVICE is 'cuda:1' but CUDA is not available here"):
        check_settings({"DEVICE": "cuda:1"})


@pytest.mark.parametrize(
    "override,message",
    [
        ("--BOOTSTRAP='x'", "error: BOOTSTRAP must be an int >= 0 (bootstrap resamples; 0 = no intervals), got 'x'"),
        ("--MODELS=[]", "error: MODELS is empty"),
        ("--NUM_WORKERS=-1", "error: NUM_WORKERS must be an int >= 0 or None"),
        ("--NOPE=1", "error: unknown setting 'NOPE'"),
    ],
)
def test_command_line_bad_setting_exits_2_before_any_work(perturbed, override, message):
    before = files(perturbed.parent)
    proc = run_script("run_lgip_multi.py", *eval_args(perturbed, models=[OPENCLIP_TINY]), override, check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert files(perturbed.parent) == before  # no metrics, no cache, no score file


@pytest.mark.parametrize(
    "script,args,message",
    [
        ("diff_gen_caption.py", ["--MAX_SAME_PER_CAP=-1"], "MAX_SAME_PER_CAP must be an int >= 0"),
        ("siglip_sanity_check.py", ["--N_RECORDS=-1"], "N_RECORDS must be an int >= 1, got -1"),
        ("run_all.py", ["--DATA=demo", "--DRY_RUN=True", "--STEPS=5"], "STEPS must be None, a list of step names"),
    ],
)
def test_script_own_settings_exit_2(tmp_path, script, args, message):
    shutil.copy(BASE_JSONL, tmp_path / "base.jsonl")
    where = "--INPUT_JSONL" if script == "diff_gen_caption.py" else "--JSONL_PATH"
    args = args if script == "run_all.py" else [f"{where}={tmp_path / 'base.jsonl'}"] + args
    proc = run_script(script, *args, check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert files(tmp_path) == ["base.jsonl"]


@pytest.mark.parametrize(
    "constants,message",
    [
        ({"BOOTSTRAP": "x"}, "BOOTSTRAP must be an int >= 0"),
        ({"MODELS": []}, "MODELS is empty"),
        ({"MODELS": [OPENCLIP_TINY, OPENCLIP_TINY]}, "two models are named 'tiny_openclip'"),
        ({"MODELS": [dict(OPENCLIP_TINY, name="../evil")]}, "is not file-safe"),
        ({"IMAGE_BATCH_SIZE": -3}, "IMAGE_BATCH_SIZE must be an int >= 1"),
        ({"WRITE_SCORES": "maybe"}, "WRITE_SCORES must be True or False"),
    ],
)
def test_python_run_checks_settings_before_any_work(perturbed, constants, message):
    import run_lgip_multi

    before = files(perturbed.parent)
    args = dict(JSONL_PATH=str(perturbed), IMAGE_ROOT=FIXTURES, DEVICE="cpu", NUM_WORKERS=0, MODELS=[OPENCLIP_TINY])
    with pytest.raises(ConfigError, match=message):
        run_lgip_multi.run(**dict(args, **constants))
    assert files(perturbed.parent) == before
    assert run_lgip_multi.BOOTSTRAP == 1000 and run_lgip_multi.MODELS is not args["MODELS"]  # defaults back


def test_unknown_name_on_the_command_line_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        configure({"__file__": "x.py", "BATCH": 1}, ["--BATC=2"])
    assert e.value.code == 2 and "unknown setting 'BATC' (did you mean BATCH?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        configure({"__file__": "x.py", "BATCH": 1}, ["--ZZZ=2"])
    assert "unknown setting 'ZZZ'; valid settings: BATCH" in capsys.readouterr().err  # (nothing close: no guess)


def unbreakable(line):
    """A help line holding one string with no space (a path): the help never cuts one, whatever its length."""
    try:
        value = ast.literal_eval(line.strip().rstrip(","))
    except (ValueError, SyntaxError):
        return False
    return isinstance(value, str) and not any(c.isspace() for c in value)


def test_help_wraps_long_defaults():
    """Every line of --help within 100 columns, but for a default too long for one that cannot be cut
    (an absolute path, as long as the checkout's folder makes it): the rule holds in any folder."""
    proc = run_script("run_lgip_multi.py", "--help")
    lines = proc.stdout.splitlines()
    models = lines.index("  --MODELS=")  # the nine specs below it, one a line
    assert all("'name': 'openclip_" in lines[models + 1 + k] for k in range(5))
    indented = [line for line in lines if line.startswith("      ") and "'name'" not in line]
    assert indented and all(len(line) <= 100 or unbreakable(line) for line in indented), [
        line for line in indented if len(line) > 100
    ]
    assert unbreakable("      '/a/very/long/path.jsonl'") and not unbreakable("      a comment, in words")


def test_help_puts_a_long_path_on_its_own_line():
    from lgip.cli import _help_entry

    path = "/tmp/" + "a" * 150 + "/in.jsonl"
    assert _help_entry("JSONL_PATH", path, "input JSONL; its outputs go beside it").splitlines() == [
        "  --JSONL_PATH=",
        f"      {path!r}",
        "      input JSONL; its outputs go beside it",
    ]


def test_models_by_name_and_a_mistyped_name(perturbed):
    import run_lgip_multi

    with pytest.raises(ConfigError, match=r"MODELS: unknown model name 'dem'; did you mean 'demo'\?"):
        run_lgip_multi.run(JSONL_PATH=str(perturbed), MODELS="dem")
    proc = run_script(
        "run_lgip_multi.py",
        *eval_args(perturbed, models=[OPENCLIP_TINY]),
        "--MODELS=demo",
        "--BOOTSTRAP=0",
        "--WRITE_SCORES=False",
    )
    rows = json.load(open(perturbed.parent / "base_with_perturb__LGIP_ALL.metrics.json"))
    assert [r["model_tag"] for r in rows] == ["demo_tiny_random"]
    assert rows[0]["run"]["config"]["MODELS"][0]["model_name"].endswith("demo/model")  # the spec, not the name
    assert rows[0]["run"]["demo"] == {
        "model": True,
        "input": False,
        "message": (
            "Demo run: a tiny random-init model that knows nothing; these figures show that the pipeline works, "
            "not how any model behaves."
        ),
    }
    assert proc.stdout.count("note: Demo run:") == 1


def test_the_demo_data_is_marked_wherever_it_is_copied(tmp_path):
    """The bundled demo's records carry "synthetic_image": true, through the generators, so an output
    made from a copy of them anywhere says its images are synthetic."""
    import run_lgip_multi

    shutil.copy(os.path.join(ROOT, "demo", "lgip_demo.jsonl"), tmp_path / "d.jsonl")
    shutil.copytree(os.path.join(ROOT, "demo", "images"), tmp_path / "images")
    run_script("diff_gen_caption.py", f"--INPUT_JSONL={tmp_path / 'd.jsonl'}")
    rows = run_lgip_multi.run(
        JSONL_PATH=str(tmp_path / "d_with_perturb.jsonl"),
        MODELS=[OPENCLIP_TINY],
        DEVICE="cpu",
        NUM_WORKERS=0,
        BOOTSTRAP=0,
        WRITE_SCORES=False,
    )
    assert rows[0]["run"]["demo"]["input"] is True and rows[0]["run"]["demo"]["model"] is False
    assert rows[0]["run"]["demo"]["message"].startswith("Demo run: synthetic images (not COCO photographs); these")


def test_image_encoding_close_after_a_failed_start_shows_the_real_error(enc):
    from conftest import image_paths
    from lgip.images import ImageEncoding

    job = ImageEncoding(enc, image_paths()[:2], batch_size=0, num_workers=0, pixel_memory_gb=0)
    with pytest.raises(ZeroDivisionError):  # (batch_size 0 is refused by IMAGE_BATCH_SIZE's rule before this)
        try:
            job.start()
        finally:
            job.close()


def test_a_dry_run_may_plan_for_a_gpu_elsewhere():
    check_settings({"DEVICE": "cuda:1", "DRY_RUN": True})  # (a login node's plan of a GPU job)
    with pytest.raises(ConfigError, match="DEVICE must be"):
        check_settings({"DEVICE": "tpu", "DRY_RUN": True})


def test_a_value_that_is_no_literal_is_taken_as_a_string():
    """--NAME=value: what ast.literal_eval cannot make (an unhashable key, a value too deeply nested
    to evaluate) is the string, then checked as any value, never a traceback."""
    from lgip.cli import parse_value

    assert parse_value("{[]: 1}") == "{[]: 1}" and parse_value("{{}}") == "{{}}"
    assert parse_value("-" * 100000 + "1") == "-" * 100000 + "1"


TYPO = [{"name": "b32", "type": "openclip", "model_name": "ViT-B-32", "pretraind": "openai"}]
TYPO_ERROR = (
    "error: MODELS: model 'b32' (type 'openclip'): unknown key 'pretraind'; did you mean 'pretrained'? "
    "valid keys: name, type, model_name, pretrained, quick_gelu, card, demo\n"
)


def test_a_misspelled_spec_key_stops_before_any_work(perturbed):
    """'pretraind' would have meant random weights: the command line, the dry run of run_all and a
    script's run() all stop at once, naming the key, the closest valid one and them all; nothing is written."""
    before = sorted(os.listdir(perturbed.parent))
    proc = run_script("run_lgip_multi.py", f"--JSONL_PATH={perturbed}", f"--MODELS={TYPO!r}", check=False)
    assert proc.returncode == 2 and proc.stderr == TYPO_ERROR, proc.stderr
    proc = run_script("run_all.py", f"--MODELS={TYPO!r}", "--DRY_RUN=True", check=False)
    assert proc.returncode == 2 and proc.stderr.endswith(TYPO_ERROR), proc.stderr
    import run_lgip_multi

    with pytest.raises(ConfigError, match="unknown key 'pretraind'; did you mean 'pretrained'"):
        run_lgip_multi.run(JSONL_PATH=str(perturbed), MODELS=TYPO)
    assert sorted(os.listdir(perturbed.parent)) == before
    for spec, key, close in (
        ({"name": "s", "type": "siglip", "model_id": "x", "lower_case": True}, "lower_case", "lowercase"),
        ({"name": "p", "type": "python", "loader": "m.py:f", "kwarg": {}}, "kwarg", "kwargs"),
        ({"type": "openclip_zoo", "match": "ViT-B-16", "tag": "laion*"}, "tag", "tags"),
    ):
        with pytest.raises(ConfigError, match=f"unknown key '{key}'; did you mean '{close}'\\?"):
            check_settings({"MODELS": [spec]} if spec["type"] != "openclip_zoo" else {"MODELS": expand(spec)})
    with pytest.raises(
        ConfigError, match=r"unknown key 'weights'; valid keys: name, type, model_id, lowercase, card, demo$"
    ):
        check_settings({"MODELS": [{"name": "s", "type": "siglip", "model_id": "x", "weights": 1}]})


def expand(spec):
    from lgip.models.registry import expand_models

    try:
        return expand_models([spec])
    except Exception as e:
        raise ConfigError(str(e)) from None


def test_a_random_init_model_is_named_as_such(perturbed, capsys):
    """An open_clip architecture without a pretrained tag runs (a benchmark's random init is legitimate),
    but the console says what it is and the row carries random_init; a trained or local model does not."""
    import run_lgip_multi
    from lgip.models.registry import random_init

    spec = {"name": "rand", "type": "openclip", "model_name": "ViT-B-32", "pretrained": None}
    assert random_init(spec) and not random_init(dict(spec, pretrained="openai")) and not random_init(OPENCLIP_TINY)
    assert not random_init({"name": "d", "type": "openclip", "model_name": "ViT-B-32", "demo": True})
    from lgip.models.registry import key_encoder, load_model

    assert key_encoder(spec).info["random_init"] is True and "random_init" not in key_encoder(OPENCLIP_TINY).info
    enc = load_model(spec, "corrected", "cpu", "fp32")
    assert enc.info["random_init"] is True and enc.info["weights_loaded"] is True
    assert (
        "warning: model 'rand' has no pretrained weights (open_clip ViT-B-32 with pretrained None): a random-init "
        'model, whose figures say nothing of a trained one; give "pretrained" a tag (openai, '
    ) in capsys.readouterr().err
    run_lgip_multi.run(
        **{k: v for k, v in eval_settings(perturbed, "corrected", [OPENCLIP_TINY]).items()},
        BOOTSTRAP=0,
        WRITE_SCORES=False,
    )
    row = json.load(open(perturbed.parent / "base_with_perturb__LGIP_ALL.metrics.json"))[0]
    assert row["run"]["model"]["weights_loaded"] is True and "random_init" not in row["run"]["model"]


def test_every_setting_of_every_script_has_its_comment_for_help():
    """Each constant a script's configure() takes (those before CONFIG) has its comment, whatever the formatter
    did to its line (a value spread over lines, a comment continued on "#   " lines), and a None default is
    read as None (a setting may then be given None)."""
    import glob

    from lgip.cli import _constant_docs

    scripts = glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))
    missing = {}
    for path in scripts:
        tree = ast.parse(open(path, encoding="utf-8").read())
        names = []
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                if node.targets[0].id == "CONFIG":
                    break
                names.append(node.targets[0].id)
        else:
            continue  # (no configure(): not a script with settings)
        docs = _constant_docs(path)
        settings = [n for n in names if n.isupper() and not n.startswith("_")]
        missing.update({f"{os.path.basename(path)}:{n}": docs.get(n) for n in settings if not docs.get(n, ("", ""))[1]})
    assert not missing, missing
    docs = _constant_docs(os.path.join(ROOT, "run_lgip_multi.py"))
    assert docs["NUM_WORKERS"][0] == "None" and "CPU count" in docs["NUM_WORKERS"][1]


def test_a_default_the_package_falls_back_on_is_every_scripts_own():
    """lgip.settings.SETTINGS holds each fallback once; every script that has the setting has the same default
    (so a config built by hand, leaving it out, runs as the script would)."""
    import glob

    from lgip.cli import _constant_docs
    from lgip.settings import defaults, setting

    DEFAULTS = defaults()

    seen = {}
    for path in glob.glob(os.path.join(ROOT, "*.py")):
        for name, (expr, _) in _constant_docs(path).items():
            if name in DEFAULTS:
                seen.setdefault(name, []).append(os.path.basename(path))
                assert ast.literal_eval(expr) == DEFAULTS[name], (os.path.basename(path), name, expr)
    assert set(seen) == set(DEFAULTS), set(DEFAULTS) - set(seen)  # (each default is some script's setting)
    assert setting({}, "PRIOR_IMAGES") == 3 and setting({"PRIOR_IMAGES": 5}, "PRIOR_IMAGES") == 5
    off = setting({}, "ACCELERATIONS_OFF")
    off.append("x")  # (a fresh list each time: the default itself never changes)
    assert setting({}, "ACCELERATIONS_OFF") == []
    with pytest.raises(KeyError, match="MODELS"):
        setting({}, "MODELS")
