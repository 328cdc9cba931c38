"""run_all: the whole LGIP pipeline in order, skipping the steps whose outputs are up to date.

  python run_all.py                                  # COCO when present beside the scripts, else the demo
  python run_all.py --MODELS=demo                    # the demo model (tiny, random, ships in demo/model): no download
  python run_all.py --DATA='coco' --PROTOCOL='reference' --STEPS='run_lgip_multi,report'
  python run_all.py --DRY_RUN=True                   # what would run, and why; runs nothing
  python run_all.py --BENCHMARK_JSONL=sugar-crepe/data/lgip_sugarcrepe.jsonl   # import_benchmark.py's records

Data: COCO (the base JSONL BASE_JSONL, built from ANNOTATIONS_JSON by make_base when missing)
or, when no COCO is present, the demo bundled in demo/ (12 synthetic images, MIT, see
demo/README.md), or an imported benchmark (BENCHMARK_JSONL, import_benchmark.py's output: the
evaluations and the report only, no generator step). Every output is written next to its input.
Models: MODELS, or by default the nine published models (COCO) or ViT-B-16 (the demo data). When
the default's weights cannot be had (no network and not in the Hugging Face cache), run_all says so
once and runs the bundled demo with the demo model (a tiny random-init CLIP in demo/model that
knows nothing), every output marked as a demo. Models named in MODELS are never replaced: one that
cannot be had stops the run before any step, naming it and what to do.

Steps (names for STEPS), in order, each its script's run(**settings) in this process (STEP_START "fresh": each
a new Python process), its output as it comes; README's pipeline table says what each reads and writes:
make_base (COCO only), diff_gen_caption, make_perturb_with_fliptypes, rebuttal_enhanced_perturb, run_lgip_multi,
run_lgip_by_fliptype, run_lgip_retrieval, explain_flips, rebuttal_enhanced_lgip, run_lgip_images,
run_lgip_classification (CLASSIFY), report; with FINETUNE each arm's finetune and wise_ft (its WiSE-FT points), the
held-out probe, run_lgip_classification on it (CLASSIFY), finetune_report.

A step is skipped ("up to date") when all its outputs exist, none is older than its inputs
or its script, and it was made with the same settings: after each step run_all records the
settings that shape its results in `<output>.run_all.meta.json` (without that record it
reads the settings the output stores itself). FORCE=True re-runs the chosen steps. The
first failing step stops the run with its exit status.
"""

import os
import time

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
ANNOTATIONS_JSON = os.path.join(_HERE, "annotations", "captions_train2017.json")  # COCO captions_train2017.json
#   (make_base's input)
IMAGE_DIR = os.path.join(_HERE, "train2017", "train2017")  # folder of the COCO images (make_base checks each file
#   there)
BASE_JSONL = os.path.join(_HERE, "lgip_coco_native5_train2017.jsonl")  # COCO base JSONL (made by make_base when
#   missing); outputs go beside it
DEMO_JSONL = os.path.join(_HERE, "demo", "lgip_demo.jsonl")  # the bundled demo base JSONL (12 records); its outputs
#   go beside it
SHAPES_DIR = os.path.join(
    _HERE, "shapes"
)  # the shapes world's folder (DATA="shapes": made there by make_shapes_jsonl.py
#   when missing; the pretraining, the arms, the held-out probe and the report go there too)
BENCHMARK_JSONL = None  # an imported benchmark's records (import_benchmark.py: SugarCrepe, SugarCrepe++, RoCOCO):
#   the evaluations and the report run on it, no generator step; None = none
DATA = "auto"  # "auto" (the benchmark when BENCHMARK_JSONL is set, else COCO when ANNOTATIONS_JSON or BASE_JSONL
#   exists, else the demo), "coco", "demo", "benchmark" or "shapes" (the fine-tuning demo, LGIP_SPEC.md 14: a
#   synthetic world, a tiny CLIP pretrained on one part, FINETUNE's arms trained on another and probed on a third)
MODELS = None  # list of model specs or names (see run_lgip_multi.py; "demo": the bundled tiny random model); None =
#   the nine published models for COCO, the smallest (openclip_ViT-B-16_openai, downloaded on first use) for the
#   demo, the demo model when those cannot be had
SHARD = None  # None (every model), "i/n" (0 <= i < n: models i, i + n, i + 2n, ... of the expanded MODELS: one job
#   of n; the jobs' rows merge in the same files) or "slurm" (i and n from SLURM_ARRAY_TASK_ID, _MIN and _COUNT);
#   the steps get this shard's models
ON_MODEL_ERROR = "stop"  # "stop" (a model that cannot be had, loaded or run stops the run) or "skip" (it is left
#   out and recorded in each row's run.skipped_models; the run fails only when every model does)
PROTOCOL = "corrected"  # "corrected" (texts encoded as each model was trained) or "reference" (as the published code)
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
DTYPE = "auto"  # "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "bf16", "fp16"
IMAGE_BATCH_SIZE = None  # int: images per forward pass in the evaluations; None = their default
TEXT_BATCH_SIZE = None  # int: texts per forward pass in the evaluations; None = their default
NUM_WORKERS = None  # int: image-decoding workers in the evaluations; None = their default (from the CPU count)
OUTPUT_DIR = None  # folder for every evaluation's outputs and the report (a training run's own), created when
#   missing; None = beside their inputs (the generators' outputs stay beside the base JSONL)
SETTINGS = {}  # {NAME: value} passed as --NAME=value to every step that has NAME, e.g. {"BOOTSTRAP": 0,
#   "N_IMAGES": 1000, "CACHE_DIR": None}; a NAME no step has is an error
STEPS = None  # None = every step; or a list of step names (or one string "a,b"): make_base, diff_gen_caption,
#   make_perturb_with_fliptypes, rebuttal_enhanced_perturb, blind_audit, debias_flips (DEBIAS), run_lgip_multi,
#   run_lgip_by_fliptype, run_lgip_by_fliptype_debiased (DEBIAS), run_lgip_retrieval, explain_flips,
#   rebuttal_enhanced_lgip, run_lgip_images, run_lgip_classification (CLASSIFY), report; FINETUNE's finetune,
#   wise_ft, finetune_by_fliptype, finetune_retrieval, finetune_images, run_lgip_classification, finetune_report;
#   DATA="shapes": make_shapes, make_perturb_with_fliptypes, pretrain_shapes and FINETUNE's
DEBIAS = False  # True: also debias_flips.py after the blind audit and run_lgip_by_fliptype.py on the debiased flips
#   (LGIP_SPEC.md 15; the report sets each model's positive rate on all flips and on the debiased ones side by side)
FINETUNE = None  # None, or {"model": a dual encoder spec or published name (of a type that trains), "arms":
#   {name: {CONSTANT: value}}, other finetune_lgip.py constants}: each arm fine-tuned (arms default: "plain" with
#   W_SC = W_INV = W_VC = 0, and "lgip"; "wise": the WiSE-FT alphas of each arm, default [0.5], [] none), then the
#   start, the arms and their WiSE-FT points probed on the held-out images in one run (LGIP_SPEC.md 14, 16)
CLASSIFY = "auto"  # "auto" ("shapes" with DATA="shapes", else None), None (no classification step), "shapes" (the
#   shapes world's held-out images as the id set and glyphs of no class as the ood set, from SHAPES_DIR) or a
#   DATASETS list of run_lgip_classification.py (LGIP_SPEC.md 16): step run_lgip_classification after the
#   evaluations, on the file the report reads (with FINETUNE: the start, each arm and its WiSE-FT points, held out)
FORCE = False  # True: re-run the chosen steps even when they are up to date
DRY_RUN = False  # True: print what each step would do (run and why, with its command, or skip) and run nothing
VERBOSE = False  # False: a line per step and per model result, the table and the report at the end; True: each
#   step's command and time, the paths it wrote, each paired comparison, the notes (today's detail)
STEP_START = "process"  # "process" (each step its script's run(**settings) in this process: torch and the
#   libraries imported once, a step's models freed after it) or "fresh" (each step a new Python process, isolated)
# step name -> its script, in the order they run
_SCRIPTS = {
    "make_shapes": "make_shapes_jsonl.py",
    "make_base": "make_base_jsonl.py",
    "diff_gen_caption": "diff_gen_caption.py",
    "make_perturb_with_fliptypes": "make_perturb_with_fliptypes.py",
    "rebuttal_enhanced_perturb": "rebuttal_enhanced_perturb_with_fliptypes.py",
    "blind_audit": "blind_audit.py",
    "pretrain_shapes": "finetune_lgip.py",
    "finetune": "finetune_lgip.py",
    "wise_ft": "wise_ft.py",
    "debias_flips": "debias_flips.py",
    "run_lgip_multi": "run_lgip_multi.py",
    "run_lgip_by_fliptype": "run_lgip_by_fliptype.py",
    "run_lgip_by_fliptype_debiased": "run_lgip_by_fliptype.py",
    "run_lgip_retrieval": "run_lgip_retrieval.py",
    "explain_flips": "explain_flips.py",
    "rebuttal_enhanced_lgip": "rebuttal_enhanced_lgip_by_transformation.py",
    "run_lgip_images": "run_lgip_images.py",
    "run_lgip_classification": "run_lgip_classification.py",
    "report": "report.py",
    "finetune_by_fliptype": "run_lgip_by_fliptype.py",
    "finetune_retrieval": "run_lgip_retrieval.py",
    "finetune_images": "run_lgip_images.py",
    "finetune_report": "report.py",
}
# Settings run_all sets itself (SETTINGS may not).
_OWN = {
    "INPUT_JSONL",
    "OUTPUT_JSONL",
    "JSONL_PATH",
    "OUTPUT_PREFIX",
    "ANNOTATIONS_JSON",
    "IMAGE_DIR",
    "MODELS",
    "DATASETS",
    "ARM",
    "ALPHA",
    "PROTOCOL",
    "DEVICE",
    "DTYPE",
    "IMAGE_BATCH_SIZE",
    "TEXT_BATCH_SIZE",
    "NUM_WORKERS",
    "UNSUPPORTED",
    "SHARD",
    "ON_MODEL_ERROR",
    "OUTPUT_DIR",
    "VERBOSE",
}
CONFIG = common.configure(
    globals(),
    unknown_hint=lambda key, value: common.step_setting_hint(
        key, value, [os.path.join(_HERE, s) for s in _SCRIPTS.values()], _OWN
    ),
)
SCRIPTS = _SCRIPTS

DEMO_MODEL = "openclip_ViT-B-16_openai"  # the smallest published model: the demo's default


def choose_data():
    """("coco" | "demo" | "benchmark", base JSONL)."""
    if DATA not in ("auto", "coco", "demo", "benchmark", "shapes"):
        raise common.ConfigError(f"DATA must be 'auto', 'coco', 'demo', 'benchmark' or 'shapes', got {DATA!r}")
    mode = DATA
    if mode == "shapes":
        if MODELS is not None:
            raise common.ConfigError(
                "DATA='shapes' probes its own models (the pretrained tiny CLIP and FINETUNE's arms): leave MODELS unset"
            )
        print(f"data: the shapes world (synthetic), in {common.show(SHAPES_DIR)}")
        return mode, os.path.abspath(os.path.join(SHAPES_DIR, "lgip_shapes.jsonl"))
    if mode == "auto":
        mode = (
            "benchmark"
            if BENCHMARK_JSONL
            else "coco"
            if os.path.isfile(ANNOTATIONS_JSON) or os.path.isfile(BASE_JSONL)
            else "demo"
        )
    if mode == "benchmark":
        if not isinstance(BENCHMARK_JSONL, str) or not os.path.isfile(BENCHMARK_JSONL):
            raise common.ConfigError(
                f"BENCHMARK_JSONL={BENCHMARK_JSONL!r} is not a file: give import_benchmark.py's "
                f"output (DATA='benchmark' needs it)"
            )
        print(f"data: imported benchmark {common.show(BENCHMARK_JSONL)} (evaluations and report only)")
        return mode, os.path.abspath(BENCHMARK_JSONL)
    if mode == "coco":
        print(f"data: COCO, base {common.show(BASE_JSONL)}")
        return mode, os.path.abspath(BASE_JSONL)
    if not os.path.isfile(DEMO_JSONL):
        raise common.ConfigError(f"demo data {DEMO_JSONL} not found (pass --DEMO_JSONL=<path>, or --DATA='coco')")
    why = "" if DATA == "demo" else f" (no COCO annotations at {common.show(ANNOTATIONS_JSON)})"
    print(f"data: demo, base {common.show(DEMO_JSONL)}{why}")
    return mode, os.path.abspath(DEMO_JSONL)


def default_models(mode):
    if MODELS is not None:
        return MODELS  # (names and zoo entries expanded, and SHARD applied, by the settings check)
    if mode == "shapes":
        return []  # (its models are made by its steps)
    if mode in ("coco", "benchmark"):
        return common.shard(common.PUBLISHED_MODELS, SHARD)
    return common.shard([m for m in common.PUBLISHED_MODELS if m["name"] == DEMO_MODEL], SHARD)


def choose_models(mode, base, steps):
    """(mode, base, models): MODELS as given; its default, unless the chosen steps evaluate and its
    weights cannot be had: then the bundled demo with the demo model, said once."""
    models = default_models(mode)
    if MODELS is not None or mode in ("benchmark", "shapes") or not any("MODELS" in s.args for s in steps):
        return mode, base, models  # (a benchmark asked for is never swapped for the demo: its models must be had)
    problems = common.check_models(models)
    if not problems:
        return mode, base, models
    names = [n for n in problems][:3] + (["..."] if len(problems) > 3 else [])
    print(
        f"note: the default model{'s' if len(models) > 1 else ''} ({', '.join(names)}) cannot be had here:\n  "
        + "\n  ".join(common.describe_model_problems(problems))
    )
    if mode == "coco":
        print(
            "  COCO is here, but without weights there is nothing to evaluate it with: pass --MODELS=<specs> "
            '(README "Models"), or --MODELS=demo --DATA=coco to run the demo model over it'
        )
    print(
        f"so run_all runs the bundled demo instead: {common.show(DEMO_JSONL)} (synthetic images) with "
        f"{common.DEMO_ABOUT}. Every output says it is a demo.",
        flush=True,
    )
    return "demo", os.path.abspath(DEMO_JSONL), [common.DEMO_MODEL]


def step(name, args, inputs, outputs, note=None, needs=None):
    args = dict(args, VERBOSE=VERBOSE)  # (each step says as much as run_all: its result lines, or all)
    return common.Step(name, os.path.join(_HERE, SCRIPTS[name]), args, inputs, outputs, note, SETTINGS, needs)


def blind_path(fliptypes):
    return common.blind_file(fliptypes, "metrics")


ARMS = {"plain": {"W_SC": 0, "W_INV": 0, "W_VC": 0}, "lgip": {}}  # FINETUNE's default arms


def finetune_steps(fliptypes, evaluation, out_dir, ft, datasets=None):
    """FINETUNE's steps (LGIP_SPEC.md 14, 16): each arm's finetune_lgip.py (RUN_NAME <model>__ft_<arm>, one split,
    SEED and STEPS for all), each arm's WiSE-FT points (wise_ft.py, <arm>__wise<alpha>), then run_lgip_by_fliptype,
    run_lgip_retrieval, run_lgip_images and (with `datasets`) run_lgip_classification on the held-out file, ONE run
    each with MODELS = [the start, arm 1, its WiSE-FT points by alpha, arm 2, ...] (the paired comparisons need one
    run), then the report on it."""
    if not isinstance(ft, dict):
        raise common.ConfigError(f'FINETUNE must be {{"model": ..., "arms": ..., ...}} or None, got {FINETUNE!r}')
    ft = dict(ft)
    start, arms = ft.pop("model", None), ft.pop("arms", None) or ARMS
    if start is None or not isinstance(arms, dict) or not arms:
        raise common.ConfigError(
            f'FINETUNE must be {{"model": a spec or published name, "arms": {{name: {{CONSTANT: value}}}}, ...}}, '
            f"got {FINETUNE!r}"
        )
    from lgip.finetune import saved_spec, start_spec
    from lgip.wise import check_alphas, wise_name

    alphas = check_alphas(ft.pop("wise", [0.5]))
    start = start_spec(start)  # (checked here: a FINETUNE model that cannot be trained stops before any step)
    stem = common.default_output(fliptypes, "")
    heldout = stem + "__ft_heldout.jsonl"
    specs, steps, made, mixed = [start], [], [], []
    for arm, over in arms.items():
        name = f"{start['name']}__ft_{arm}"
        folder = stem + f"__ft_{name}"
        args = dict(ft, **over, JSONL_PATH=fliptypes, MODEL=start, RUN_NAME=name, DEVICE=DEVICE)
        made.append(os.path.join(folder, "model_spec.json"))
        steps.append(step("finetune", args, [fliptypes], [made[-1], heldout]))
        trained = saved_spec(start, name, folder)
        specs.append(trained)
        for alpha in alphas:  # (after every arm's training: wise_ft's steps follow the finetune steps)
            point = wise_name(name, alpha)
            args = dict(JSONL_PATH=fliptypes, MODEL=start, ARM=trained, ALPHA=alpha, RUN_NAME=point)
            spec_file = os.path.join(stem + f"__ft_{point}", "model_spec.json")
            mixed.append(step("wise_ft", args, [made[-1]], [spec_file]))
            specs.append(saved_spec(start, point, stem + f"__ft_{point}"))
    made += [s.outputs[0] for s in mixed]
    probe = dict(evaluation, MODELS=specs, JSONL_PATH=heldout)
    names = ("LGIP_fliptypes.metrics.json", "LGIP_retrieval.metrics.json", "LGIP_images.metrics.json")
    metrics = [common.metrics_path(heldout, f) for f in names]
    steps += mixed + [
        step("finetune_by_fliptype", probe, [heldout] + made, [metrics[0]]),
        step("finetune_retrieval", probe, [heldout] + made, [metrics[1]]),
        step("finetune_images", probe, [heldout] + made, [metrics[2]]),
    ]
    if datasets is not None:  # (what each arm may have broken: classification beside the probe)
        steps.append(classify_step(datasets, probe, made))
        metrics.append(steps[-1].outputs[0])
    steps.append(
        step(
            "finetune_report",
            dict({"JSONL_PATH": heldout}, **out_dir),
            metrics,
            [common.metrics_path(heldout, "LGIP_report.md")],
        )
    )
    return steps


def classify_datasets(mode):
    """CLASSIFY as run_lgip_classification.py's DATASETS (LGIP_SPEC.md 16), or None: no classification step."""
    choice = ("shapes" if mode == "shapes" else None) if CLASSIFY == "auto" else CLASSIFY
    if choice is None:
        return None
    if choice == "shapes":
        root = os.path.abspath(SHAPES_DIR)
        return [
            {"name": "shapes", "source": "shapes", "role": "id", "root": root},
            {"name": "shapes_ood", "source": "shapes", "role": "ood", "root": root},
        ]
    if isinstance(choice, (list, tuple)) and choice and all(isinstance(d, dict) for d in choice):
        return [dict(d) for d in choice]  # (each checked by run_lgip_classification.py, before any model loads)
    raise common.ConfigError(
        f'CLASSIFY must be "auto", None, "shapes" or a list of datasets ({{"name", "source", "role", ...}}: '
        f"run_lgip_classification.py's DATASETS), got {CLASSIFY!r}"
    )


def classify_step(datasets, evaluation, made=()):
    """Step run_lgip_classification (LGIP_SPEC.md 16): evaluation's MODELS on `datasets`, its outputs named by
    evaluation's JSONL_PATH (the file the report reads); run again when a dataset's file or folder changes."""
    jsonl = evaluation["JSONL_PATH"]
    files = []
    for d in datasets:
        if d.get("source") == "shapes":
            files.append(os.path.join(d.get("root") or os.path.abspath(SHAPES_DIR), "lgip_shapes.jsonl"))
        files += [d[k] for k in ("path", "root") if isinstance(d.get(k), str) and d.get("source") != "shapes"]
    files = list(dict.fromkeys(os.path.abspath(f) for f in files))
    out = common.metrics_path(jsonl, "LGIP_classification.metrics.json")
    args = dict(evaluation, DATASETS=datasets)
    return step("run_lgip_classification", args, [jsonl, *made, *files], [out], needs=[jsonl, *files])


# the shapes world's pretraining (L_clip alone, every image) and its arms' defaults (FINETUNE's keys replace them)
SHAPES_PRETRAIN = {"STEPS": 150, "BATCH_SIZE": 64, "LR": 1e-3, "WARMUP": 20, "HELDOUT_FRACTION": 0}
SHAPES_FINETUNE = {"STEPS": 150, "BATCH_SIZE": 64, "LR": 5e-4, "WARMUP": 10}


def shapes_plan(base, evaluation, out_dir, datasets=None):
    """DATA="shapes" (issue 51's demo): the world made, its main part flipped, a tiny CLIP pretrained on the other
    part with L_clip alone, then FINETUNE's arms from it and the held-out probe (finetune_steps)."""
    from lgip import shapes

    pretrain = os.path.join(SHAPES_DIR, "lgip_shapes_pretrain.jsonl")
    fliptypes = common.default_output(base, "_with_fliptypes.jsonl")
    start = shapes.start_spec(os.path.join(SHAPES_DIR, "start_model"), "shapes_random_init")
    made = os.path.join(common.default_output(pretrain, "__ft_shapes_pretrained"), "model_spec.json")
    args = dict(SHAPES_PRETRAIN, JSONL_PATH=pretrain, MODEL=start, RUN_NAME="shapes_pretrained", DEVICE=DEVICE)
    args.update(W_SC=0, W_INV=0, W_VC=0)
    config = os.path.join(SHAPES_DIR, "start_model", "open_clip_config.json")
    steps = [
        step("make_shapes", {"OUTPUT_DIR": os.path.abspath(SHAPES_DIR)}, [], [base, pretrain, config]),
        step("make_perturb_with_fliptypes", {"INPUT_JSONL": base}, [base], [fliptypes]),
        step("pretrain_shapes", args, [pretrain, config], [made]),
    ]
    pretrained = shapes.start_spec(os.path.join(os.path.dirname(made), "model"), "shapes_pretrained")
    ft = {**SHAPES_FINETUNE, "model": pretrained, **(FINETUNE or {})}
    return steps + finetune_steps(fliptypes, evaluation, out_dir, ft, datasets)


def plan(mode, base, models):
    """Every step of this data, in order."""
    # (an imported benchmark's records have every field the evaluations read: they take it as it is)
    perturb = base if mode == "benchmark" else common.default_output(base, "_with_perturb.jsonl")
    fliptypes = base if mode == "benchmark" else common.default_output(base, "_with_fliptypes.jsonl")
    enhanced = common.default_output(base, "_with_fliptypes.jsonl", prefix="rebuttal_enhanced_")
    metrics = [
        common.metrics_path(perturb, "LGIP_ALL.metrics.json"),
        common.metrics_path(fliptypes, "LGIP_fliptypes.metrics.json"),
        common.metrics_path(enhanced, "ENHANCED_LGIP_analysis.json"),
        common.metrics_path(fliptypes, "LGIP_retrieval.metrics.json"),
    ]
    explained = common.metrics_path(fliptypes, "LGIP_explain.metrics.json")
    images = common.metrics_path(fliptypes, "LGIP_images.metrics.json")
    evaluation = {
        "MODELS": models,
        "PROTOCOL": PROTOCOL,
        "DEVICE": DEVICE,
        "DTYPE": DTYPE,
        "ON_MODEL_ERROR": ON_MODEL_ERROR,
    }
    evaluation.update(
        {
            k: v
            for k, v in (
                ("IMAGE_BATCH_SIZE", IMAGE_BATCH_SIZE),
                ("TEXT_BATCH_SIZE", TEXT_BATCH_SIZE),
                ("NUM_WORKERS", NUM_WORKERS),
            )
            if v is not None
        }
    )
    out_dir = {"OUTPUT_DIR": os.path.abspath(OUTPUT_DIR)} if OUTPUT_DIR is not None else {}
    evaluation.update(out_dir)
    datasets = classify_datasets(mode)
    if mode == "shapes":
        return shapes_plan(base, evaluation, out_dir, datasets)
    steps = []
    if mode == "coco":
        note = None
        if not os.path.isfile(ANNOTATIONS_JSON) and os.path.isfile(base):
            note = f"no annotations at {common.show(ANNOTATIONS_JSON)}; using the existing base"
        steps.append(
            step(
                "make_base",
                {
                    "ANNOTATIONS_JSON": os.path.abspath(ANNOTATIONS_JSON),
                    "IMAGE_DIR": os.path.abspath(IMAGE_DIR),
                    "OUTPUT_JSONL": base,
                },
                [os.path.abspath(ANNOTATIONS_JSON)],
                [base],
                note,
                needs=[os.path.abspath(ANNOTATIONS_JSON), os.path.abspath(IMAGE_DIR)],
            )
        )
    steps += (
        []
        if mode == "benchmark"
        else [
            step("diff_gen_caption", {"INPUT_JSONL": base}, [base], [perturb]),
            step("make_perturb_with_fliptypes", {"INPUT_JSONL": base}, [base], [fliptypes]),
            step("rebuttal_enhanced_perturb", {"INPUT_JSONL": base}, [base], [enhanced]),
        ]
    )
    # the probe's own audit (LGIP_SPEC.md 15): text only, no model, seconds
    steps.append(step("blind_audit", dict(out_dir, JSONL_PATH=fliptypes), [fliptypes], [blind_path(fliptypes)]))
    debiased = common.default_output(fliptypes, "_debiased.jsonl")
    debiased_metrics = common.metrics_path(debiased, "LGIP_fliptypes.metrics.json")
    if DEBIAS:  # the flips a blind scorer cannot tell, and the models on them (LGIP_SPEC.md 15)
        debias_out = [debiased, common.blind_file(fliptypes, "debias")]
        steps.append(
            step("debias_flips", dict(out_dir, JSONL_PATH=fliptypes), [fliptypes, blind_path(fliptypes)], debias_out)
        )
    steps += [
        step("run_lgip_multi", dict(evaluation, JSONL_PATH=perturb), [perturb], [metrics[0]]),
        step("run_lgip_by_fliptype", dict(evaluation, JSONL_PATH=fliptypes), [fliptypes], [metrics[1]]),
        *(
            [
                step(
                    "run_lgip_by_fliptype_debiased",
                    dict(evaluation, JSONL_PATH=debiased),
                    [debiased],
                    [debiased_metrics],
                )
            ]
            if DEBIAS
            else []
        ),
        # after by_fliptype: every embedding it needs is then in the cache (no model's weights are loaded)
        step("run_lgip_retrieval", dict(evaluation, JSONL_PATH=fliptypes), [fliptypes], [metrics[3]]),
        # (after the score files it takes TOP_K from; a model whose family it cannot explain is left out, said)
        # (its TEXT_BATCH_SIZE counts texts per forward and backward pass with the attention kept: not the evaluations')
        step(
            "explain_flips",
            dict(
                {k: v for k, v in evaluation.items() if k != "TEXT_BATCH_SIZE"},
                JSONL_PATH=fliptypes,
                UNSUPPORTED="skip",
            ),
            [fliptypes, metrics[1]],
            [explained],
        ),
    ]
    if mode != "benchmark":  # (its records have no combined_caps: the rebuttal analysis is LGIP's own)
        steps.append(step("rebuttal_enhanced_lgip", dict(evaluation, JSONL_PATH=enhanced), [enhanced], [metrics[2]]))
    # the image side, after the text evaluations: on the file run_lgip_retrieval searches (an imported benchmark
    # as it is), so its galleries hold the same records, and its captions and original images are in the cache
    steps.append(step("run_lgip_images", dict(evaluation, JSONL_PATH=fliptypes), [fliptypes], [images]))
    steps += finetune_steps(fliptypes, evaluation, out_dir, FINETUNE, datasets) if FINETUNE else []
    classified = []  # (with FINETUNE the start and its arms are classified on the held-out file: finetune_steps)
    if datasets is not None and not FINETUNE:
        steps.append(classify_step(datasets, dict(evaluation, JSONL_PATH=base)))
        classified = steps[-1].outputs
    steps += [
        step(
            "report",
            dict({"JSONL_PATH": base}, **out_dir),
            metrics + [explained, images, blind_path(fliptypes)] + ([debiased_metrics] if DEBIAS else []) + classified,
            [
                common.metrics_path(base, "LGIP_report.md"),
                common.metrics_path(base, "LGIP_report.csv"),
                common.metrics_path(base, "LGIP_report.html"),
                common.metrics_path(base, "LGIP_factors.metrics.json"),
            ],
            needs=[],
        ),
    ]
    return steps


def check_settings(steps):
    common.check_step_settings(SETTINGS, CONFIG, [os.path.join(_HERE, s) for s in SCRIPTS.values()], _OWN)
    return common.select_steps(
        steps, STEPS, list(SCRIPTS), {"make_base": "runs only on COCO data (pass --DATA='coco')"}
    )


def main():
    mode, base = choose_data()
    mode, base, models = choose_models(mode, base, check_settings(plan(mode, base, default_models(mode))))
    steps = check_settings(plan(mode, base, models))
    problems = common.blockers(steps, models, skip_models=ON_MODEL_ERROR == "skip")
    if problems and not DRY_RUN:  # before any step: not after the generators' minutes
        raise common.ModelError("cannot run, nothing was run:\n  " + "\n  ".join(problems))
    for line in ["a real run would stop here, before any step:"] + problems if problems else []:
        print(line, flush=True)
    common.new_run()
    pending, ran = set(), 0
    t0 = time.perf_counter()
    for k, s in enumerate(steps, 1):
        reason = common.reason_to_run(s, pending, FORCE, DRY_RUN)
        if reason is None:
            print(f"[{k}/{len(steps)}] skip {s.name}: {s.note or 'up to date'}", flush=True)
            continue
        common.run_step(s, k, len(steps), reason, DRY_RUN, STEP_START, VERBOSE, FORCE)
        pending.update(s.outputs)
        ran += 1
    verb = "would run" if DRY_RUN else "ran"
    print(
        f"run_all: {verb} {ran} of {len(steps)} steps ({len(steps) - ran} up to date) "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    common.say_report(common.default_output(base, "_with_fliptypes__ft_heldout.jsonl") if mode == "shapes" else base)
    demo_model = any(isinstance(m, dict) and m.get("demo") for m in models)
    if demo_model or mode == "demo":
        print(common.fit(f"note: {common.demo_message(demo_model, mode == 'demo')}"))
    if problems:  # (a dry run: said above, before the steps; its exit status says it too)
        raise common.ModelError("a real run would stop before any step:\n  " + "\n  ".join(problems))


if __name__ == "__main__":
    common.run_main(main)
