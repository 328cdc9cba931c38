"""explain_flips: which word does a model blame for a flip? Word attribution (LGIP_SPEC.md section 8,
after CLIP4DM), and how often it finds the flipped word.

For each model of MODELS and a sample of the input's flips (N_FLIPS drawn with SEED, plus the
model's TOP_K most preferred flips when a score file of this input is beside it, from
run_lgip_by_fliptype.py), cos(image, flip) and cos(image, caption) are attributed to their tokens
through the gradients of the last LAYERS attention layers of the text tower, the tokens' scores
averaged per word, and the lowest-scoring word blamed. A flip changes one known word, so
`localization_acc` says how often the blamed word is the changed one (over the flips the model
catches, gap > 0, and over those it prefers). Texts are encoded as the corrected protocol does,
in fp32. Writes `<stem>__LGIP_explain_<model>.jsonl` (one line per flip) and
`<stem>__LGIP_explain.metrics.json` (one dict per model) next to the input.
  python explain_flips.py --JSONL_PATH=lgip_coco_native5_train2017_with_fliptypes.jsonl --N_FLIPS=500
"""

import os
import random

import common
from lgip import explain, overlap
from lgip.scorers import ExplainRequest, scorer_for

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017_with_fliptypes.jsonl")  # input:
#   make_perturb_with_fliptypes.py output (any JSONL with diff_caps)
IMAGE_ROOT = None  # folder that image_path is relative to; None = the JSONL's folder
OUTPUT_DIR = None  # folder for the outputs (metrics, score files), created when missing; None = beside JSONL_PATH
MODELS = common.PUBLISHED_MODELS  # list of specs or names (see run_lgip_multi.py); a model whose scorer gives no
#   word attribution is left out, in a line (attributed: open_clip CLIP/OpenCLIP/EVA02, transformers CLIPModel, SigLIP)
SHARD = None  # None (every model), "i/n" (0 <= i < n: models i, i + n, i + 2n, ... of the expanded MODELS:
#   one job of n; the jobs' rows merge in the same files) or "slurm" (i and n from SLURM_ARRAY_TASK_ID, _MIN and _COUNT)
ON_MODEL_ERROR = "stop"  # "stop" (a model that cannot be had, loaded or run stops the run)
#   or "skip" (it is left out and recorded in each row's run.skipped_models; the run fails only when every model does)
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ... (the models run in fp32)
N_FLIPS = 1000  # int >= 0: flips drawn at random (with SEED) from all the input's flips, the same for every model;
#   None = all
SEED = 0  # int: seed of that draw
TOP_K = 50  # int >= 0: also each model's TOP_K most preferred flips (lowest caption - flip gap)
#   in its score file of this input, when there is one
LAYERS = 3  # int >= 1: the last LAYERS attention layers of the text tower are averaged (all when it has fewer)
TEMPLATE = ""  # "" (texts as written, as LGIP scores them) or a prefix ending in a space, e.g. "A photo depicts "
#   (CLIP4DM's); its tokens are never words
TEXT_BATCH_SIZE = 32  # int >= 1: texts per forward and backward pass
IMAGE_BATCH_SIZE = 64  # int >= 1: images per forward pass
NUM_WORKERS = None  # int >= 0 (0: decoded in the main process): image-decoding worker processes;
#   None = from the CPU count
UNSUPPORTED = "stop"  # "stop": a model of a family word attribution does not support stops the script,
#   naming the supported ones; "skip": it is left out with that message (listed in the metrics as "unsupported";
#   run_all.py's choice)
BOOTSTRAP = 1000  # int >= 0: bootstrap resamples of the flips for the *_ci95 fields; 0 = no intervals
BOOTSTRAP_SEED = 0  # int: seed of the bootstrap resampling
TRACKERS = []  # list of "wandb", "mlflow", "tensorboard": each model's figures also logged there (docs/outputs.md)
VERBOSE = True  # True: every line (paths written, comparisons, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())


def check_config(config):
    # (IMAGE_BATCH_SIZE, BOOTSTRAP and the other shared settings: lgip.settings; TEXT_BATCH_SIZE has no "auto" here)
    for name, low in (("N_FLIPS", 0), ("TOP_K", 0), ("LAYERS", 1), ("TEXT_BATCH_SIZE", 1)):
        common.require_int(config, name, low, none_ok=name == "N_FLIPS")
    if config["UNSUPPORTED"] not in ("stop", "skip"):
        raise common.ConfigError(f'UNSUPPORTED must be "stop" or "skip", got {config["UNSUPPORTED"]!r}')
    if not isinstance(TEMPLATE, str) or (TEMPLATE and not TEMPLATE[-1].isspace()):
        raise common.ConfigError(f'TEMPLATE must be "" or a string ending in a space, got {TEMPLATE!r}')


def run(**constants):
    """The command line's run, and a call from Python: the constants above as keyword arguments,
    in force for this call only; returns the list of per-model metrics dicts it writes."""
    with common.script_call(globals(), constants) as config:
        return explain_all(config)


def explain_all(config):
    check_config(config)
    records = common.load_records(JSONL_PATH, ("diff_caps", "diff_caps_*"))
    flips = explain.all_flips(records)
    if not flips:  # (before any model is loaded: all-n/a metrics with exit status 0 would pass for a result)
        raise common.InputError(
            f"no flip to explain: {len(records)} records in {JSONL_PATH}, none with a flip "
            f"(diff_caps); no metrics were written"
        )
    models = common.leave_out(MODELS, ("attributions",), "explain_flips.py")  # (what its scorer's explain gives)
    if not models:
        return []
    loop = common.ModelLoop(config, models)  # (models that cannot be had: before the first model's work)
    common.say_demo(models, JSONL_PATH, records)
    n = len(flips) if N_FLIPS is None else min(N_FLIPS, len(flips))
    sample = set(random.Random(SEED).sample(range(len(flips)), n))
    common.detail(
        f"{len(records)} records, {len(flips)} flips; explaining {n} drawn with seed {SEED} (+ TOP_K {TOP_K} per model)"
    )
    results, paired = [], common.Comparisons()
    for spec in loop.runnable:
        with common.Timer() as t, loop.model(spec) as ok:  # (ON_MODEL_ERROR "skip": a model that fails is left out)
            enc = common.load_model(spec, "corrected", DEVICE, "fp32")
            try:  # (the model's scorer blames the words: lgip.scorers, a dual encoder's through lgip.explain)
                m = scorer_for(spec).explain(enc, ExplainRequest(records, flips, sample, config))
            finally:
                enc.release()  # (a caller's model in memory: back in the mode it came in)
        if not ok:
            continue
        lines = m.pop("_lines", None)  # (the scorer's lines, one per flip: written here, whole or not at all)
        if lines is not None:
            with common.atomic_open(explain.explain_path(config, enc.name)) as f:
                f.writelines(common.dump_jsonl_line(line) for line in lines)
        for figure, rec, values in m.pop("_compared", ()):
            paired.add(enc.name, figure, None, rec, values)  # (paired model comparisons, LGIP_SPEC.md 9 and 12)
        m["model_card"] = common.model_card(spec, enc)
        root = IMAGE_ROOT or os.path.dirname(os.path.abspath(JSONL_PATH))
        seen = overlap.overlap_of(spec, m["model_card"], records, root)  # (absent: no question of seen images)
        if seen is not None:
            m["images_seen_overlap"] = seen
        m["run"] = dict(
            common.eval_run_info(__file__, config, enc, m.pop("image_report"), len(records), records=records),
            seconds=round(t.seconds, 3),
            family=m.pop("family"),
        )
        results.append(m)
        if "unsupported" in m:
            print(f"{enc.name}: skipped: {m['unsupported']}", flush=True)
            continue
        line = (
            f"{enc.name}: localization {common.fmt(m['localization_acc'], '.3f')} (detected "
            f"{common.fmt(m['localization_acc_detected'], '.3f')}, "
            f"preferred {common.fmt(m['localization_acc_preferred'], '.3f')}, "
            f"chance {common.fmt(m['chance'], '.3f')}) over {m['num_flips']} flips, {t.seconds:.1f} s -> "
            f"{m['explain_file']}"
            + (f"; {overlap.overlap_text(seen)}" if seen is not None else "")
            + (
                f"; left out: {', '.join(f'{v} {k}' for k, v in m['skipped'].items() if v)}"
                if any(m["skipped"].values())
                else ""
            )
            + loop.progress()
        )
        print(common.fit(line), flush=True)
        print(common.fit(f"{enc.name}: {explain.detection_line(m)}"), flush=True)
    loop.finish(results)
    common.write_results(__file__, config, results, "LGIP_explain.metrics.json")  # (then TRACKERS)
    if len(paired.models) >= 2:
        common.write_comparisons(__file__, config, paired)
    return results


if __name__ == "__main__":
    common.run_main(run)
