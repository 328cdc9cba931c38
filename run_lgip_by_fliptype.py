"""run_lgip_by_fliptype: invariance error, and sensitivity per flip type (color, number, object).

LGIP_SPEC.md section 4. Reads `<stem>_with_fliptypes.jsonl` (from make_perturb_with_fliptypes.py)
and writes all models' results to `<stem>__LGIP_fliptypes.metrics.json` next to it; per-pair
similarities go to `<stem>__LGIP_fliptypes_<model>.scores.jsonl`. The types are those of the
input's `diff_caps_<type>` lists, in order of first appearance: LGIP's color, number, object, or an
imported benchmark's own (import_benchmark.py: its positive rate per type is its accuracy).
  python run_lgip_by_fliptype.py --JSONL_PATH=lgip_coco_native5_train2017_with_fliptypes.jsonl
"""

import os

import numpy as np

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017_with_fliptypes.jsonl")  # input:
#   make_perturb_with_fliptypes.py output (or import_benchmark.py's)
IMAGE_ROOT = None  # folder that image_path is relative to; None = the JSONL's folder
OUTPUT_DIR = None  # folder for the outputs (metrics, score files), created when missing; None = beside JSONL_PATH
MODELS = common.PUBLISHED_MODELS  # list of model specs {"name", "type", ...} (the types and their keys: --help,
#   README "Models") or names: "demo" (the bundled tiny random model), a published model's name
SHARD = None  # None (every model), "i/n" (0 <= i < n: models i, i + n, i + 2n, ... of the expanded MODELS: one job
#   of n; the jobs' rows merge in the same files) or "slurm" (i and n from SLURM_ARRAY_TASK_ID, _MIN and _COUNT)
ON_MODEL_ERROR = "stop"  # "stop" (a model that cannot be had, loaded or run stops the run) or "skip" (it is left
#   out and recorded in each row's run.skipped_models; the run fails only when every model does)
PROTOCOL = "corrected"  # "corrected" (texts encoded as each model was trained) or "reference" (as the published code)
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
DTYPE = "auto"  # "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "bf16", "fp16"
IMAGE_BATCH_SIZE = 64  # int >= 1: images per forward pass
TEXT_BATCH_SIZE = "auto"  # int >= 1, or "auto" (2048 on CUDA, 64 on CPU): texts per forward pass (CLIP family:
#   about 16 token positions per text, in prefix packs of 128)
NUM_WORKERS = None  # int >= 0 (0: decoded in the main process): image-decoding worker processes; None = from the
#   CPU count
CACHE_DIR = "auto"  # embedding cache folder; "auto" = .lgip_cache beside the input; None = no cache
CACHE_FLUSH_S = 60  # float >= 0: cache chunks are also written after this many seconds of work, so a crash loses
#   at most about that much
PIXEL_MEMORY_GB = "auto"  # float >= 0: host memory for decoded pixels kept for the next model with the same
#   preprocessing (each image decoded once per geometry); "auto" = a quarter of the memory this process may use (per
#   torchrun process on a node), 0 = off
LOOKAHEAD = True  # True: while a model runs, the later models' tokenizing and image decoding are done in
#   low-priority background workers (their GPU then never waits for them); False: each model does its own
ACCELERATIONS_OFF = []  # list of names from lgip/accelerations.py to switch off, or "all": the plain computation
#   (slower; the same numbers to float rounding)
PRIOR_IMAGES = 3  # int >= 1: a joint scorer's (type generative or itm) text-prior controls score each text with
#   this many other images (LGIP_SPEC.md 13); dual encoders use every other image
BOOTSTRAP = 1000  # int >= 0: bootstrap resamples of the images for the *_ci95 fields; 0 = no intervals
BOOTSTRAP_SEED = 0  # int: seed of the bootstrap resampling
WRITE_SCORES = True  # True: also write per-pair similarities to <stem>__LGIP_fliptypes_<model>.scores.jsonl
EXPORT = None  # None, "csv" or "parquet": the per-pair scores also as one table, <stem>__LGIP_<script>_pairs.csv
TRACKERS = []  # list of "wandb", "mlflow", "tensorboard": each model's figures also logged there (docs/outputs.md)
VERBOSE = True  # True: every line (paths written, comparisons, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())
FIELDS = ["same_caps", "diff_caps", "diff_caps_+"]  # (+: the typed lists, at least one per record)
PUBLISHED_TEXT_BATCH = 64  # the published encode_text's batch: a longer call is padded per 64 texts


def sensitivity(pairs):
    rec_idx, gaps = np.asarray(pairs.rec), pairs.base_sim - pairs.sim
    block = {"gap_mean": common.mean_or_none(gaps), "pos_rate": common.mean_or_none(gaps > 0), "count": int(len(gaps))}
    common.add_ci(block, "gap_mean", rec_idx, gaps, BOOTSTRAP, BOOTSTRAP_SEED)
    return common.add_ci(block, "pos_rate", rec_idx, gaps > 0, BOOTSTRAP, BOOTSTRAP_SEED)


def controls(block, pairs, inv=None):
    """LGIP_SPEC.md section 9's figures (and section 10's hard positives) beside the published ones."""
    common.prior_figures(block, pairs, inv, BOOTSTRAP, BOOTSTRAP_SEED, paras_too=inv is not None)
    return common.hard_positive_figures(block, pairs, BOOTSTRAP, BOOTSTRAP_SEED)


def compare(run, flip_type, pairs, inv=None):
    """The figures the run's models are compared on, pair by pair (LGIP_SPEC.md section 9)."""
    grounded = common.prior_values(pairs)[1]
    run.compare("sensitivity_pos_rate", flip_type, pairs.rec, pairs.base_sim - pairs.sim > 0)
    run.compare("grounded_pos_rate", flip_type, pairs.rec, None if grounded is None else grounded > 0)
    if inv is not None:
        run.compare("invariance_error_mean", flip_type, inv.rec, abs(inv.base_sim - inv.sim))


def published_calls(records, ks, calls):
    """The published script's encode_text calls over records ks, as data (lgip.texts.TextCalls), and
    the pairs they make: (paraphrases, flips, typed flips)."""
    inv, flips, typed = common.Pairs(), common.Pairs(), common.Pairs()
    fields = ["same_caps", "diff_caps"] + ["diff_caps_" + t for t in common.flip_types(records)]
    for k in ks:
        rec = records[k][1]
        orig = calls.add_call(
            rec["orig_captions"], PUBLISHED_TEXT_BATCH, captions_of=k
        )  # the published calls: 5 originals, then each list per caption
        for i in range(len(rec["orig_captions"])):
            for field in fields:  # diff_caps is its own call (the global figures), then each typed list
                texts = common.caption_texts(rec, field, i)
                pairs = inv if field == "same_caps" else flips if field == "diff_caps" else typed
                pairs.add(k, i, orig[i], calls.add_call(texts, PUBLISHED_TEXT_BATCH), texts, field[len("diff_caps_") :])
    return inv, flips, typed


def evaluate(run):
    # (the pairs are built once per run; controls and hard positives as in run_lgip_multi.py)
    scored = run.score(*run.pairs(published_calls), controls=True, hard_positives=[(1, 0), (2, 0)], relative=True)
    inv, flips, typed = scored.pairs
    if not run.is_main:
        return None
    err = abs(inv.base_sim - inv.sim)
    by_type = {t: typed.subset(np.flatnonzero(typed.labels == t)) for t in common.flip_types(run.records)}
    overall = sensitivity(flips)
    m = {
        "model_tag": run.enc.name,
        "num_samples": scored.n_samples,  # published: records with a readable image and a caption
        "invariance_error_mean": common.mean_or_none(err),
        "global_sensitivity": overall,
        # (run_lgip_multi's names for the same figures beside the published block, so one key reads both rows)
        **{f"sensitivity_{k}": overall[k] for k in ("gap_mean", "gap_mean_ci95", "pos_rate", "pos_rate_ci95")},
        "by_flip_type": {t: controls(sensitivity(pairs), pairs) for t, pairs in by_type.items()},
    }
    common.add_ci(m, "invariance_error_mean", inv.rec, err, BOOTSTRAP, BOOTSTRAP_SEED)
    controls(m, flips, inv)  # (the row's own keys, beside the published ones)
    terms = common.relative_terms(scored.relative)  # (LGIP_SPEC.md 13: comparable across score kinds)
    common.relative_figures(m, "invariance_error_rel", inv.rec, err, terms, BOOTSTRAP, BOOTSTRAP_SEED)
    compare(run, None, flips, inv)
    if terms is not None:
        run.compare("invariance_error_rel", None, inv.rec, err, denominator=terms)
    for t, pairs in by_type.items():
        compare(run, t, pairs)
    if WRITE_SCORES:
        sidecar = common.ScoreSidecar(run.records, run.enc.score_kind)
        sidecar.add("paraphrases", inv)
        prior = common.prior_values(typed)[0]  # (None with fewer than 2 images: no prior_gap written)
        sidecar.add(
            "flips",
            typed,
            type=typed.label,
            **({} if prior is None else {"prior_gap": common.PerModel([round(float(v), 6) for v in prior])}),
        )
        path = common.score_file(JSONL_PATH, "fliptypes", run.enc.name)
        m["scores_file"] = sidecar.save(
            path
        )  # its name; None when it could not be written (said; the metrics still are)
    return m


def summary(m):
    """The headline, then the positive rate by flip type."""
    by = ", ".join(f"{t} {common.fmt(b['pos_rate'], '.3f')}" for t, b in m["by_flip_type"].items())
    return (
        f"invariance error {common.fmt(m['invariance_error_mean'])}, "
        f"positive rate {common.fmt(m['global_sensitivity']['pos_rate'], '.3f')} (with any image "
        f"{common.fmt(m['prior_pos_rate'], '.3f')}, grounded {common.fmt(m['grounded_pos_rate'], '.3f')})"
        + (f"\nby flip type: {by}" if by else "")
    )


def run(**constants):
    """The command line's run, and a call from Python: the constants above as keyword arguments
    (`run(JSONL_PATH=..., MODELS=[...], WRITE_SCORES=False)`), in force for this call only; returns
    the list of per-model metrics dicts it writes (None on torchrun's other ranks)."""
    with common.script_call(globals(), constants) as config:
        results = common.run_evaluation(__file__, config, FIELDS, evaluate, summary)
        if results is not None:
            common.write_results(__file__, config, results, "LGIP_fliptypes.metrics.json")  # (then EXPORT, TRACKERS)
        return results


if __name__ == "__main__":
    common.run_main(run)
