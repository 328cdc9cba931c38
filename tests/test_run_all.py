"""run_all.py: the whole pipeline on the demo data (tiny models, CPU), skipping, re-running, failing; COCO mode."""

import glob
import json
import os
import re
import shutil

import pytest

from conftest import FIXTURES, ROOT, TINY_MODELS, hub_cache_env, run_script
from lgip.models import PUBLISHED_MODELS

HAVE_REPORT = os.path.isfile(os.path.join(ROOT, "report.py"))  # written separately; its step is left out when absent
GENERATORS = ["diff_gen_caption", "make_perturb_with_fliptypes", "rebuttal_enhanced_perturb"]
AUDIT = ["blind_audit"]  # the probe's own audit (LGIP_SPEC.md 15), after the generators
EVALUATIONS = ["run_lgip_multi", "run_lgip_by_fliptype", "run_lgip_retrieval", "rebuttal_enhanced_lgip"]
EXPLAIN = ["explain_flips"]  # after the by-fliptype evaluation, whose score files it reads
IMAGES = ["run_lgip_images"]  # the image side, after the text evaluations
STEPS = GENERATORS + AUDIT + EVALUATIONS[:3] + EXPLAIN + EVALUATIONS[3:] + IMAGES + (["report"] if HAVE_REPORT else [])
OUTPUTS = [
    "lgip_demo_with_perturb.jsonl",
    "lgip_demo_with_fliptypes.jsonl",
    "rebuttal_enhanced_lgip_demo_with_fliptypes.jsonl",
    "lgip_demo_with_perturb__LGIP_ALL.metrics.json",
    "lgip_demo_with_fliptypes__LGIP_fliptypes.metrics.json",
    "rebuttal_enhanced_lgip_demo_with_fliptypes__ENHANCED_LGIP_analysis.json",
    "lgip_demo_with_fliptypes__LGIP_retrieval.metrics.json",
]
AUDIT_OUTPUTS = ["lgip_demo_with_fliptypes__LGIP_blind.metrics.json", "lgip_demo_with_fliptypes__LGIP_blind.gaps.jsonl"]
INPUT_OF = {
    "run_lgip_multi": OUTPUTS[0],
    "run_lgip_by_fliptype": OUTPUTS[1],
    "run_lgip_retrieval": OUTPUTS[1],
    "rebuttal_enhanced_lgip": OUTPUTS[2],
}
EXPLAIN_OUTPUTS = [
    "lgip_demo_with_fliptypes__LGIP_explain.metrics.json",
    "lgip_demo_with_fliptypes__LGIP_explain_tiny_openclip.jsonl",
    "lgip_demo_with_fliptypes__LGIP_explain_tiny_siglip.jsonl",
]
IMAGES_OUTPUTS = ["lgip_demo_with_fliptypes__LGIP_images.metrics.json"]
REPORT_OUTPUTS = [
    "lgip_demo__LGIP_report.md",
    "lgip_demo__LGIP_report.csv",
    "lgip_demo__LGIP_frontier.png",
    "lgip_demo__LGIP_fliptypes.png",
    "lgip_demo__LGIP_retrieval.png",
    "lgip_demo__LGIP_image_side.png",
    "lgip_demo__LGIP_report.html",
]


def run_all(folder, *args, check=True):
    base = [
        f"--DEMO_JSONL={os.path.join(folder, 'lgip_demo.jsonl')}",
        "--DATA=demo",
        f"--MODELS={TINY_MODELS!r}",
        "--DEVICE=cpu",
        "--NUM_WORKERS=0",
        "--VERBOSE=True",  # (these tests read each step's command and time: the default console is tested apart)
    ]
    if not HAVE_REPORT and not any(a.startswith("--STEPS=") for a in args):
        base.append(f"--STEPS={STEPS!r}")
    return run_script("run_all.py", *base, *args, check=check)


def ran(proc, step):
    """The step ran: its "done in" line (VERBOSE), or its one line (the default console) that is not a skip."""
    done = re.search(rf"^\[\d+/\d+\] {step}  done in [\d.]+ s -> ", proc.stdout, re.M)
    said = re.search(rf"^\[\d+/\d+\] {step}: (?!would run)", proc.stdout, re.M)
    return (done or said) is not None and "error: step " + step not in proc.stderr


def skipped(proc, step):
    return re.search(rf"^\[\d+/\d+\] skip {step}: up to date$", proc.stdout, re.M) is not None


def would_run(proc, step, reason=""):
    return re.search(rf"^\[\d+/\d+\] {step}: would run \(.*{re.escape(reason)}", proc.stdout, re.M) is not None


def commands(proc):
    """{step: the command line run_all shows for it}, a later step's "--MODELS=<the model specs of
    [k/n] step>" read as that step's specs (printed in full once)."""
    found = dict(re.findall(r"^\[\d+/\d+\] (\w+): (?:would )?run .*\n  \$ (.*)$", proc.stdout, re.M))

    def specs(m):
        return re.search(r'"--MODELS=\[.*?\]"(?= --)', found[m.group(1)]).group(0)

    return {step: re.sub(r"--MODELS=<the model specs of \[\d+/\d+\] (\w+)>", specs, cmd) for step, cmd in found.items()}


def mtimes(folder):
    return {name: os.stat(os.path.join(folder, name)).st_mtime_ns for name in os.listdir(folder)}


def demo_inputs(folder):
    """`folder` made to hold the demo's inputs: its JSONL and its images, copied by name. Never the
    whole demo/ folder: a run_all.py run in the checkout leaves its outputs there (ignored by git),
    and a copy of them would make the steps here 'up to date'."""
    folder.mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "demo", "lgip_demo.jsonl"), folder / "lgip_demo.jsonl")
    shutil.copytree(os.path.join(ROOT, "demo", "images"), folder / "images")
    return folder


@pytest.fixture(scope="module")
def demo_done(tmp_path_factory):
    """The demo folder after one full run (every step executed)."""
    folder = demo_inputs(tmp_path_factory.mktemp("run_all") / "demo")
    return folder, run_all(folder)


@pytest.fixture
def demo_copy(demo_done, tmp_path):
    """A copy of the finished demo folder (file times preserved) that a test may change."""
    return shutil.copytree(demo_done[0], tmp_path / "demo")


def test_end_to_end_writes_every_output(demo_done):
    folder, proc = demo_done
    for name in OUTPUTS + AUDIT_OUTPUTS + EXPLAIN_OUTPUTS + IMAGES_OUTPUTS + (REPORT_OUTPUTS if HAVE_REPORT else []):
        assert (folder / name).is_file(), name
    if HAVE_REPORT:  # the blind audit's section (LGIP_SPEC.md 15), in the markdown and on the page
        md = (folder / "lgip_demo__LGIP_report.md").read_text(encoding="utf-8")
        assert "## Is the probe blind-solvable?" in md and "| ngram3 |" in md and " of color flips" in md
        html = (folder / "lgip_demo__LGIP_report.html").read_text(encoding="utf-8")
        assert '<section id="blind">' in html and 'href="#blind"' in html
    for k, step in enumerate(STEPS, 1):
        assert re.search(rf"^\[{k}/{len(STEPS)}\] {step}  done in [\d.]+ s -> ", proc.stdout, re.M), step
    assert f"ran {len(STEPS)} of {len(STEPS)} steps" in proc.stdout
    if HAVE_REPORT:
        assert re.search(
            r"^report: open .*lgip_demo__LGIP_report\.html in a browser\n  also in .*: lgip_demo__LGIP_report\.md",
            proc.stdout,
            re.M,
        )
    for name in OUTPUTS[3:]:
        for m in json.load(open(folder / name)):
            assert m["run"]["config"]["PROTOCOL"] == "corrected" and m["run"]["config"]["MODELS"] == TINY_MODELS
        stamp = json.load(open(folder / (name + ".run_all.meta.json")))
        assert stamp["settings"] == {"MODELS": TINY_MODELS, "PROTOCOL": "corrected", "DTYPE": "auto"}
    # the retrieval runs after run_lgip_by_fliptype, on the embeddings it cached
    assert [m["run"]["model"]["weights_loaded"] for m in json.load(open(folder / OUTPUTS[6]))] == [False, False]
    images = json.load(open(folder / IMAGES_OUTPUTS[0]))  # the image side: the demo's 12 images, every kind
    assert [(m["model_tag"], m["num_images"], len(m["by_kind"])) for m in images] == [
        (m["name"], 12, 6) for m in TINY_MODELS
    ]
    explained = json.load(open(folder / EXPLAIN_OUTPUTS[0]))
    assert [m["model_tag"] for m in explained] == [m["name"] for m in TINY_MODELS]
    assert all(m["num_flips"] > 0 and m["run"]["config"]["MODELS"] == TINY_MODELS for m in explained)
    if HAVE_REPORT:  # the report, made last, has the word attribution: a line per model, the explained flips coloured
        md = (folder / REPORT_OUTPUTS[0]).read_text(encoding="utf-8")
        lines = md.split("## Which word does a model blame?")[1].split("\n## ")[0].split("\n### ")[0]
        assert [
            re.match(r"- `(\w+)`: localization ", x).group(1) for x in lines.splitlines() if x.startswith("- ")
        ] == [m["model_tag"] for m in explained]
        html = (folder / REPORT_OUTPUTS[-1]).read_text(encoding="utf-8")
        assert 'class="ws ' in html and html.count('<div class="blame ') >= 1
        # and retrieval beside LGIP: its columns, and the rank correlation (undefined for two models)
        assert "I2T R@1 ↑" in md and "LGIP beside retrieval: across 2 models" in md and "undefined" in md
        # and the image side beside the text side: its columns, a line per model, the altered images preferred
        side = md.split("## The image side: does the score follow the image?")[1].split("\n## ")[0]
        assert "Img. pos. ↑" in md and [x.split("`")[1] for x in side.splitlines() if x.startswith("- `")] == [
            m["model_tag"] for m in images
        ]
        assert 'id="image-side"' in html and html.count('<article class="card altered"') >= 1


def test_second_run_skips_every_step(demo_copy):
    before = mtimes(demo_copy)
    proc = run_all(demo_copy)
    for step in STEPS:
        assert skipped(proc, step) and not ran(proc, step), step
    assert f"ran 0 of {len(STEPS)} steps" in proc.stdout
    assert mtimes(demo_copy) == before
    forced = run_all(demo_copy, "--FORCE=True", "--DRY_RUN=True")
    assert all(would_run(forced, step, "FORCE=True") for step in STEPS)
    # the model specs in full once, by the first step that takes them; the later steps point to it
    evaluations = sum(
        would_run(forced, step, "FORCE=True") for step in STEPS if step not in GENERATORS + AUDIT + ["report"]
    )
    assert forced.stdout.count('"--MODELS=[') == 1, forced.stdout
    assert len(re.findall(r"--MODELS=<the model specs of \[5/\d+\] run_lgip_multi>", forced.stdout)) == evaluations - 1


def test_newer_input_reruns_the_steps(demo_copy):
    os.utime(demo_copy / "lgip_demo.jsonl")  # now: newer than every output
    dry = run_all(demo_copy, "--DRY_RUN=True")
    for step in GENERATORS:
        assert would_run(dry, step, "lgip_demo.jsonl is newer"), step
    for step in STEPS[3:]:
        assert would_run(dry, step, "would be rewritten"), step
    proc = run_all(demo_copy, f"--STEPS={GENERATORS!r}")
    assert all(ran(proc, step) for step in GENERATORS)
    dry = run_all(demo_copy, "--DRY_RUN=True")
    assert all(skipped(dry, step) for step in GENERATORS)
    for step in EVALUATIONS:
        assert would_run(dry, step, f"{INPUT_OF[step]} is newer"), step


def test_settings_change_reruns_the_evaluations(demo_copy):
    dry = run_all(demo_copy, "--PROTOCOL=reference", "--DRY_RUN=True")
    assert all(skipped(dry, step) for step in GENERATORS)
    assert all(would_run(dry, step, "settings changed (PROTOCOL)") for step in EVALUATIONS)
    proc = run_all(demo_copy, "--PROTOCOL=reference", "--STEPS=run_lgip_multi")
    assert ran(proc, "run_lgip_multi") and "[1/1]" in proc.stdout
    metrics = json.load(open(demo_copy / OUTPUTS[3]))
    assert {m["run"]["config"]["PROTOCOL"] for m in metrics} == {"reference"}
    assert skipped(run_all(demo_copy, "--PROTOCOL=reference", "--STEPS=run_lgip_multi"), "run_lgip_multi")
    dry = run_all(demo_copy, "--DRY_RUN=True")  # back to the default protocol
    assert would_run(dry, "run_lgip_multi", "settings changed (PROTOCOL)") and skipped(dry, "run_lgip_by_fliptype")
    # An override added, or given once and dropped later, is a change; settings that only change speed are not.
    dry = run_all(demo_copy, "--SETTINGS={'BOOTSTRAP': 10}", "--IMAGE_BATCH_SIZE=3", "--DRY_RUN=True")
    assert would_run(dry, "run_lgip_by_fliptype", "settings changed (BOOTSTRAP)")
    assert skipped(
        run_all(demo_copy, "--TEXT_BATCH_SIZE=7", "--DEVICE=cuda:1", "--DRY_RUN=True"), "run_lgip_by_fliptype"
    )
    stamp_path = demo_copy / (OUTPUTS[4] + ".run_all.meta.json")
    stamp = json.load(open(stamp_path))
    stamp["settings"]["BOOTSTRAP"] = 10  # as if the last run had --SETTINGS={'BOOTSTRAP': 10}
    stamp_path.write_text(json.dumps(stamp))
    assert would_run(run_all(demo_copy, "--DRY_RUN=True"), "run_lgip_by_fliptype", "settings changed (BOOTSTRAP)")


def test_settings_read_from_the_metrics_without_a_record(demo_copy):
    os.remove(demo_copy / (OUTPUTS[4] + ".run_all.meta.json"))
    assert skipped(run_all(demo_copy, "--DRY_RUN=True"), "run_lgip_by_fliptype")
    dry = run_all(demo_copy, f"--MODELS={TINY_MODELS[:1]!r}", "--DRY_RUN=True")
    assert would_run(dry, "run_lgip_by_fliptype", "settings changed (MODELS)")


def test_failing_step_stops_the_run(demo_copy):
    before = mtimes(demo_copy)
    # (a spec run_all's own check passes, a folder that is there with no model in it: the step fails loading it)
    empty = demo_copy.parent / "empty_model"
    empty.mkdir()
    bad = [{"name": "bad", "type": "openclip", "model_name": "local-dir:" + str(empty)}]
    proc = run_all(demo_copy, f"--MODELS={bad!r}", check=False)
    assert proc.returncode != 0
    assert f"error: step run_lgip_multi failed (exit status {proc.returncode})" in proc.stderr
    assert "empty_model" in proc.stderr and "could not load" in proc.stderr  # the step's own message
    assert "run_lgip_by_fliptype" not in proc.stdout  # nothing after the failing step
    cache = ".lgip_cache"  # (the cache folder was opened before the model failed to load: its entries change)
    assert {k: v for k, v in mtimes(demo_copy).items() if k != cache} == {k: v for k, v in before.items() if k != cache}


def test_demo_defaults_and_settings_passed_only_where_accepted(tmp_path):
    folder = demo_inputs(tmp_path / "demo")
    before = mtimes(folder)
    proc = run_script(
        "run_all.py",
        f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}",
        "--DRY_RUN=True",
        f"--ANNOTATIONS_JSON={tmp_path / 'none.json'}",
        f"--BASE_JSONL={tmp_path / 'none.jsonl'}",
        "--SETTINGS={'BOOTSTRAP': 0, 'SEED': 7}",
        "--IMAGE_BATCH_SIZE=8",
        env=hub_cache_env(tmp_path / "hf", PUBLISHED_MODELS[:1]),
    )  # (ViT-B-16 as if downloaded)
    assert "data: demo" in proc.stdout
    cmds = commands(proc)
    assert set(cmds) == set(GENERATORS + AUDIT + EVALUATIONS + EXPLAIN + IMAGES + ["report"])
    assert "--SEED=7" in cmds["run_lgip_images"] and "--BOOTSTRAP=0" in cmds["run_lgip_images"]
    assert "--BOOTSTRAP=0" in cmds["explain_flips"] and "'openclip_ViT-B-16_openai'" in cmds["explain_flips"]
    assert "--SEED=7" in cmds["explain_flips"] and "PROTOCOL" not in cmds["explain_flips"]
    for step in GENERATORS:
        assert "--SEED=7" in cmds[step] and "BOOTSTRAP" not in cmds[step] and "MODELS" not in cmds[step]
    for step in EVALUATIONS:
        cmd = cmds[step]
        assert "--BOOTSTRAP=0" in cmd and "--IMAGE_BATCH_SIZE=8" in cmd and "--SEED=" not in cmd
        assert "'openclip_ViT-B-16_openai'" in cmd and "ViT-L-14" not in cmd and "siglip" not in cmd
    # (report.py's BOOTSTRAP: the resamples of the models for the factors' intervals; SEED: not a report setting)
    assert "--BOOTSTRAP=0" in cmds["report"] and "SEED" not in cmds["report"] and "--JSONL_PATH=" in cmds["report"]
    assert mtimes(folder) == before  # a dry run writes nothing


@pytest.mark.parametrize(
    "args,message",
    [
        (["--STEPS=['nope']"], "unknown step 'nope'"),
        (["--STEPS=make_base"], "make_base, which runs only on COCO data"),
        (["--SETTINGS={'NOPE': 1}"], "no step has a setting 'NOPE';"),
        (["--SETTINGS={'BOOTSTAP': 0}"], "no step has a setting 'BOOTSTAP' (did you mean BOOTSTRAP"),
        (["--SETTINGS={'PROTOCOL': 'reference'}"], "use --PROTOCOL"),
        (["--SETTINGS={'INPUT_JSONL': 'x.jsonl'}"], "run_all sets it"),
        (["--DATA=both"], "DATA must be"),
        (["--PROTOCOL=fast"], "PROTOCOL must be"),
        (["--STEPS=5"], "STEPS must be None, a list of step names"),
        (["--SETTINGS={'BOOTSTRAP': 'x'}"], "BOOTSTRAP must be an int >= 0"),  # (before any step's work)
        (["--MODELS=[]"], "MODELS is empty"),
    ],
)
def test_bad_settings_are_errors(tmp_path, args, message):
    proc = run_script("run_all.py", "--DATA=demo", "--DRY_RUN=True", *args, check=False)
    assert proc.returncode == 2 and message in proc.stderr


# --- COCO mode ---------------------------------------------------------------


def make_coco(tmp_path, images=True):
    """A tiny COCO layout: 3 images with 5 captions, 1 with 4; the run_all settings that point at it."""
    records = [json.loads(line) for line in open(os.path.join(FIXTURES, "lgip_fixture_base.jsonl"))][:4]
    coco = {
        "images": [{"id": r["image_id"], "file_name": os.path.basename(r["image_path"])} for r in records],
        "annotations": [],
    }
    for r in records:
        captions = r["orig_captions"][:4] if r is records[-1] else r["orig_captions"]
        for c in captions:
            coco["annotations"].append({"id": len(coco["annotations"]) + 1, "image_id": r["image_id"], "caption": c})
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "captions_train2017.json").write_text(json.dumps(coco))
    if images:
        (tmp_path / "train2017" / "train2017").mkdir(parents=True)
        for img in coco["images"]:
            shutil.copy(os.path.join(FIXTURES, "images", img["file_name"]), tmp_path / "train2017" / "train2017")
    return [
        f"--ANNOTATIONS_JSON={tmp_path / 'annotations' / 'captions_train2017.json'}",
        f"--IMAGE_DIR={tmp_path / 'train2017' / 'train2017'}",
        f"--BASE_JSONL={tmp_path / 'lgip_coco_native5_train2017.jsonl'}",
        f"--DEMO_JSONL={tmp_path / 'no_demo.jsonl'}",
    ]


def test_coco_mode_builds_the_base_then_runs(tmp_path):
    args = make_coco(tmp_path)
    steps = f"--STEPS={['make_base'] + GENERATORS!r}"
    proc = run_script("run_all.py", *args, steps)
    assert "data: COCO" in proc.stdout and ran(proc, "make_base")
    base = [json.loads(line) for line in open(tmp_path / "lgip_coco_native5_train2017.jsonl")]
    assert [r["image_path"] for r in base] == [f"train2017/train2017/00000000000{i}.jpg" for i in (1, 2, 3)]
    for name in (
        "lgip_coco_native5_train2017_with_perturb.jsonl",
        "lgip_coco_native5_train2017_with_fliptypes.jsonl",
        "rebuttal_enhanced_lgip_coco_native5_train2017_with_fliptypes.jsonl",
    ):
        assert (tmp_path / name).is_file(), name
    assert all(ran(proc, step) for step in GENERATORS)

    again = run_script("run_all.py", *args, steps)
    assert all(skipped(again, step) for step in ["make_base"] + GENERATORS)
    os.utime(tmp_path / "annotations" / "captions_train2017.json")
    dry = run_script("run_all.py", *args, "--DRY_RUN=True", env=hub_cache_env(tmp_path / "hf", PUBLISHED_MODELS))
    assert would_run(dry, "make_base", "captions_train2017.json is newer")
    assert all(would_run(dry, step, "would be rewritten") for step in GENERATORS)
    cmd = commands(dry)["run_lgip_multi"]  # COCO: the nine published models by default
    assert all(
        f"'{m}'" in cmd for m in ("openclip_ViT-H-14_laion2b_s32b_b79k", "siglip2_google_siglip2-base-patch16-224")
    )

    os.remove(tmp_path / "annotations" / "captions_train2017.json")  # the base alone is enough
    dry = run_script("run_all.py", *args, steps, "--DRY_RUN=True")
    assert "skip make_base: no annotations at" in dry.stdout and all(skipped(dry, step) for step in GENERATORS)


def test_coco_without_images_stops_before_any_step(tmp_path):
    args = make_coco(tmp_path, images=False)
    proc = run_script("run_all.py", *args, check=False, env=hub_cache_env(tmp_path / "hf", PUBLISHED_MODELS))
    assert proc.returncode == 2 and "error: cannot run, nothing was run" in proc.stderr
    assert f"step make_base: {tmp_path / 'train2017' / 'train2017'} is not there" in proc.stderr
    assert not (tmp_path / "lgip_coco_native5_train2017.jsonl").exists()
    assert "diff_gen_caption" not in proc.stdout
    dry = run_script(
        "run_all.py", *args, "--DRY_RUN=True", check=False, env=hub_cache_env(tmp_path / "hf", PUBLISHED_MODELS)
    )
    assert "a real run would stop here, before any step:" in dry.stdout and "train2017 is not there" in dry.stdout
    assert would_run(dry, "make_base")  # (what it would do, all the same)
    assert dry.returncode == 2 and "error: a real run would stop before any step" in dry.stderr  # (as the real run)


def test_without_the_default_weights_the_demo_runs_with_the_demo_model_and_says_so(tmp_path):
    """Offline, with an empty Hugging Face cache: run_all's default models cannot be had, so it runs
    the bundled demo with the demo model, says so once, and every step is told to use it; a model
    the user names stays an error, before any step."""
    folder = demo_inputs(tmp_path / "demo")  # (its inputs only: never what a run left in demo/)
    offline = {"HF_HOME": str(tmp_path / "empty_hf"), "HF_HUB_OFFLINE": "1"}
    args = [
        f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}",
        f"--ANNOTATIONS_JSON={tmp_path / 'none.json'}",
        f"--BASE_JSONL={tmp_path / 'none.jsonl'}",
    ]
    dry = run_script("run_all.py", *args, "--DRY_RUN=True", env=offline)
    assert dry.stdout.count("cannot be had here") == 1 and dry.stdout.count("huggingface-cli download") == 1
    assert "runs the bundled demo instead" in dry.stdout and "knows nothing" in dry.stdout
    for step in EVALUATIONS + EXPLAIN:
        assert "'demo_tiny_random'" in commands(dry)[step] and "ViT-B-16" not in commands(dry)[step]
    assert "note: Demo run: synthetic images (not COCO photographs) and a tiny random-init model" in dry.stdout
    named = run_script(
        "run_all.py",
        *args,
        "--MODELS=openclip_ViT-B-16_openai,siglip_google_siglip-base-patch16-224",
        env=offline,
        check=False,
    )
    assert named.returncode == 2 and "error: cannot run, nothing was run" in named.stderr
    assert "2 of 2 models cannot be had" in named.stderr and named.stderr.count("huggingface-cli download") == 1
    assert "demo instead" not in named.stdout and "demo_tiny_random" not in named.stdout + named.stderr
    assert not list(folder.glob("*_with_*"))  # not even the generators ran


def test_a_steps_setting_on_run_alls_command_line_says_where_it_goes():
    """--BOOTSTRAPS=100 (a typo of a step's setting) and --BOOTSTRAP=100 (a step's setting given to
    run_all itself): exit status 2, the closest step setting named, and the command line that works."""
    proc = run_script("run_all.py", "--BOOTSTRAPS=100", check=False)
    assert proc.returncode == 2 and proc.stderr.startswith(
        "error: unknown setting 'BOOTSTRAPS'; did you mean BOOTSTRAP, a step's setting? A step's setting goes in "
        "SETTINGS: --SETTINGS=\"{'BOOTSTRAP': 100}\"; run_all's own valid settings: ANNOTATIONS_JSON, "
    ), proc.stderr
    proc = run_script("run_all.py", "--BOOTSTRAP=100", check=False)
    assert (
        proc.returncode == 2
        and "unknown setting 'BOOTSTRAP'; BOOTSTRAP is a step's setting. A step's setting "
        "goes in SETTINGS: --SETTINGS=\"{'BOOTSTRAP': 100}\""
        in proc.stderr
    ), proc.stderr
    proc = run_script("run_all.py", "--DRY_RUNN=True", check=False)
    assert proc.returncode == 2 and proc.stderr.startswith(
        "error: unknown setting 'DRY_RUNN' (did you mean DRY_RUN?); valid settings: "
    ), proc.stderr
    assert "SETTINGS" not in proc.stderr.split("valid settings:")[0]


def test_output_dir_takes_every_evaluations_outputs_and_the_report(tmp_path):
    """OUTPUT_DIR (a training run's own folder): the evaluations write there, report.py reads and
    writes there, nothing of theirs lands beside the inputs, and a second run finds it all up to date."""
    folder, out = demo_inputs(tmp_path / "demo"), tmp_path / "runs" / "epoch3"
    steps = ["diff_gen_caption", "make_perturb_with_fliptypes", "run_lgip_multi", "run_lgip_by_fliptype"]
    steps += ["report"] if HAVE_REPORT else []
    args = [f"--OUTPUT_DIR={out}", f"--STEPS={steps!r}", "--SETTINGS={'BOOTSTRAP': 0}"]
    proc = run_all(folder, *args)
    assert all(ran(proc, s) for s in steps), proc.stdout
    beside = sorted(os.listdir(folder))  # the inputs, the generators' outputs (the evaluations' inputs), their stamps
    assert beside == ["images", "lgip_demo.jsonl"] + [
        f"lgip_demo_with_{k}.jsonl{m}"
        for k in ("fliptypes", "perturb")
        for m in ("", ".meta.json", ".run_all.meta.json")
    ], beside
    made = set(os.listdir(out))
    assert {
        "lgip_demo_with_perturb__LGIP_ALL.metrics.json",
        "lgip_demo_with_fliptypes__LGIP_fliptypes.metrics.json",
        "lgip_demo_with_perturb__LGIP_tiny_openclip.scores.jsonl",
    } <= made, made
    rows = json.load(open(out / "lgip_demo_with_perturb__LGIP_ALL.metrics.json"))
    assert rows[0]["run"]["config"]["OUTPUT_DIR"] == str(out)
    if HAVE_REPORT:
        assert (
            "lgip_demo__LGIP_report.html" in made
            and f"report: open {out / 'lgip_demo__LGIP_report.html'}" in proc.stdout
        )
    again = run_all(folder, *args)
    assert all(skipped(again, s) for s in steps[2:]), again.stdout


def _steps_as(folder, mode, *args):
    return run_script(
        "run_all.py",
        f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}",
        "--DATA=demo",
        f"--MODELS={TINY_MODELS[:1]!r}",
        "--DEVICE=cpu",
        "--NUM_WORKERS=0",
        f"--STEP_START={mode}",
        "--STEPS=['diff_gen_caption', 'run_lgip_multi', 'report']",
        "--SETTINGS={'BOOTSTRAP': 50}",
        *args,
    )


def test_steps_in_run_alls_process_write_what_new_processes_write(tmp_path):
    """The exactness test of STEP_START: the same steps run as new processes ("fresh"), then in run_all's own
    process ("process", each script's run()), in the same folder (so every path they record is the same), give
    the same outputs but for their times (benchmarks/compare_outputs.py)."""
    import subprocess
    import sys

    folder = demo_inputs(tmp_path / "demo")
    fresh = _steps_as(folder, "fresh")
    shutil.move(folder, tmp_path / "fresh")  # (its cache too: the second run computes everything again)
    demo_inputs(folder)
    here = _steps_as(folder, "process")
    assert "ran 3 of 3 steps" in fresh.stdout and "ran 3 of 3 steps" in here.stdout
    compared = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "compare_outputs.py"), str(tmp_path / "fresh"), str(folder)],
        capture_output=True,
        text=True,
    )
    assert compared.returncode == 0 and " 0 differ" in compared.stdout, compared.stdout


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_step_in_run_alls_process_stops_as_a_new_one_does_and_leaves_nothing(tmp_path, how):
    """Ctrl-C (SIGINT to the terminal's process group) or a scheduler's SIGTERM to run_all, while an
    evaluation runs in its process: the step stops as it does alone (no metrics file), run_all exits 130 or
    143 saying the same command goes on, and it is the only process of the run (no helper, no step process)."""
    import signal
    import subprocess
    import sys
    import time

    folder = demo_inputs(tmp_path / "demo")
    spec = {"name": "slow", "type": "python", "loader": os.path.join(ROOT, "tests", "user_loaders.py") + ":slow"}
    # (SIGINT handled as in a terminal, even where the tests run in the background with it ignored)
    code = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"sys.argv = sys.argv[1:]; runpy.run_path({os.path.join(ROOT, 'run_all.py')!r}, run_name='__main__')"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            "run_all.py",
            f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}",
            "--DATA=demo",
            f"--MODELS={[spec]!r}",
            "--DEVICE=cpu",
            "--NUM_WORKERS=0",
            "--STEPS=['diff_gen_caption', 'make_perturb_with_fliptypes', 'run_lgip_multi', 'run_lgip_by_fliptype']",
            "--TEXT_BATCH_SIZE=4",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("encoded"):
            break
    assert lines and lines[-1].startswith("encoded"), "".join(lines) + proc.stderr.read()
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert not children, children  # (NUM_WORKERS=0: the step runs in run_all's process)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    t0 = time.perf_counter()
    rc = proc.wait(timeout=60)
    seconds, err = time.perf_counter() - t0, proc.stderr.read()
    assert rc == (130 if how == "ctrl-c" else 143) and seconds < 20, (rc, seconds, err[-2000:])
    assert "during step run_lgip_multi; later steps not run. Run the same command again to go on" in err, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert not glob.glob(str(folder / "*.metrics.json"))


def test_the_advice_after_an_interrupt_is_true_under_force():
    from lgip.pipeline import interrupted

    plain = interrupted("run_lgip_multi", False, False)
    assert plain.startswith("error: interrupted during step run_lgip_multi; later steps not run. Run the same command")
    forced = interrupted("run_lgip_multi", True, True)
    assert forced.startswith("error: stopped by SIGTERM during step run_lgip_multi;")
    assert "Run the same command without --FORCE=True to go on (with it, every step runs again)" in forced


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "g", "type": "generative", "model_id": "/nope/llava"},
        {"name": "i", "type": "itm", "model_id": "./nope/blip"},
        {"name": "t", "type": "transformers", "model_id": "~/nope/clip"},
        {"name": "o", "type": "openclip", "model_name": "ViT-B-16", "pretrained": "/nope/open_clip_model.bin"},
        {"name": "d", "type": "openclip", "model_name": "local-dir:/nope/folder"},
        {"name": "p", "type": "python", "loader": "/nope/my_models.py:build"},
    ],
    ids=lambda s: s["type"] + "-" + s["name"],
)
def test_a_local_path_that_does_not_exist_is_named_before_any_step(tmp_path, spec):
    """Every type's local paths are checked before any step: the message names the path and says it does not
    exist (no network advice), exit status 2, in a dry run too; nothing is created (no OUTPUT_DIR, no cache)."""
    folder = demo_inputs(tmp_path / "demo")
    out = tmp_path / "out"
    args = [f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}", "--DATA=demo", f"--MODELS={[spec]!r}", f"--OUTPUT_DIR={out}"]
    path = spec.get("model_id") or spec.get("pretrained") or spec.get("loader", "").split(":")[0]
    path = path if not spec.get("model_name", "").startswith("local-dir:") else spec["model_name"][len("local-dir:") :]
    for dry in (False, True):
        proc = run_script("run_all.py", *args, f"--DRY_RUN={dry}", check=False)
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert f"{path} does not exist" in proc.stderr and "network" not in proc.stderr, proc.stderr
        assert ": run (" not in proc.stdout  # (no step ran)
        assert not out.exists() and sorted(os.listdir(folder)) == ["images", "lgip_demo.jsonl"]


def test_the_console_says_a_line_per_step_and_per_model_result_and_verbose_says_the_rest(tmp_path):
    """By default: one line per step and the models' result lines (with "from the cache"), no command, no path
    written, no comparison, the demo note once at the end after the table and the report's path; VERBOSE=True:
    each step's command and time, the paths it wrote, the paired comparisons."""
    folder = demo_inputs(tmp_path / "demo")
    model_dir = os.path.join(ROOT, "demo", "model")
    models = ["demo", {"name": "demo2", "type": "openclip", "model_name": "local-dir:" + model_dir, "demo": True}]
    args = [f"--DEMO_JSONL={folder / 'lgip_demo.jsonl'}", "--DATA=demo", f"--MODELS={models!r}", "--DEVICE=cpu"]
    out = run_script("run_all.py", *args).stdout.splitlines()
    steps = [line for line in out if re.match(r"\[\d+/11\] ", line)]
    assert len(steps) == 11 and all(line.endswith("missing") for line in steps), steps
    results = [line for line in out if line.startswith(("demo_tiny_random:", "demo2:"))]
    assert len([r for r in results if ": invariance error" in r]) == 6  # (3 evaluations x 2)
    wide = [line for line in out if len(line) >= 160 and str(tmp_path) not in line]  # (a line taken in at a glance)
    assert not wide, wide
    assert any("from the cache: " in r for r in results)
    assert sum(line.startswith("blind audit: ") and "acc_untied (chance 0.5): length" in line for line in out) == 1
    assert not [line for line in out if line.startswith(("  $ ", "-> ")) or " - demo2: " in line or "done in" in line]
    assert sum("Demo run" in line for line in out) == 1 and "Demo run" in " ".join(out[-2:])  # (wrapped: two lines)
    at = next(i for i, line in enumerate(out) if line.startswith("report: open "))
    assert out[at - 1].startswith("run_all: ran 11 of 11 steps") and out[at + 1].startswith("  also in ")
    assert all(line.startswith(("  ", "note: Demo run")) for line in out[at + 1 :]), out[at:]
    # (overrides, data, steps, the generators' and models' results and their second lines, the table, the end)
    assert len(out) <= 4 + 1 + 11 + 4 + 2 * len(results) + 6 + 6, out
    loud = run_script("run_all.py", *args, "--FORCE=True", "--VERBOSE=True").stdout
    assert "  $ python " in loud and "done in" in loud and "\n-> " in loud
    assert "demo_tiny_random - demo2: " in loud  # (a paired comparison)
