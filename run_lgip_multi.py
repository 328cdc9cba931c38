"""run_lgip_multi: invariance error and sensitivity gap of each model on a perturbed JSONL.

LGIP_SPEC.md section 4. Reads `<stem>_with_perturb.jsonl` (from diff_gen_caption.py); for each
model writes `<stem>__LGIP_<model>.metrics.json` next to it, and all models together to
`<stem>__LGIP_ALL.metrics.json`; per-pair similarities go to `<stem>__LGIP_<model>.scores.jsonl`.
  python run_lgip_multi.py --JSONL_PATH=lgip_coco_native5_train2017_with_perturb.jsonl --PROTOCOL=reference
  torchrun --nproc_per_node=4 run_lgip_multi.py ...      # records sharded over 4 GPUs, same metrics
"""

import os

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017_with_perturb.jsonl")  # input: diff_gen_caption.py output
IMAGE_ROOT = None  # folder that image_path is relative to; None = the JSONL's folder
OUTPUT_DIR = None  # folder for the outputs (metrics, score files), created when missing; None = beside JSONL_PATH
MODELS = common.PUBLISHED_MODELS  # list of model specs {"name", "type", ...} (the types and their keys: --help,
#   README "Models") or names: "demo" (the bundled tiny random model), a published model's name
SHARD = None  # None (every model), "i/n" (0 <= i < n: models i, i + n, i + 2n, ... of the expanded MODELS:
#   one job of n; the jobs' rows merge in the same files) or "slurm" (i and n from SLURM_ARRAY_TASK_ID, _MIN and _COUNT)
ON_MODEL_ERROR = "stop"  # "stop" (a model that cannot be had, loaded or run stops the run)
#   or "skip" (it is left out and recorded in each row's run.skipped_models; the run fails only when every model does)
PROTOCOL = "corrected"  # "corrected" (texts encoded as each model was trained) or "reference" (as the published code)
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
DTYPE = "auto"  # "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "bf16", "fp16"
IMAGE_BATCH_SIZE = 64  # int >= 1: images per forward pass
TEXT_BATCH_SIZE = "auto"  # int >= 1, or "auto" (2048 on CUDA, 64 on CPU): texts per forward pass (CLIP family:
#   about 16 token positions per text, in prefix packs of 128)
NUM_WORKERS = None  # int >= 0 (0: decoded in the main process): image-decoding worker processes;
#   None = from the CPU count
CACHE_DIR = "auto"  # embedding cache folder; "auto" = .lgip_cache beside the input; None = no cache
CACHE_FLUSH_S = 60  # float >= 0: cache chunks are also written after this many seconds of work,
#   so a crash loses at most about that much
PIXEL_MEMORY_GB = "auto"  # float >= 0: host memory for decoded pixels kept for the next model with the same
#   preprocessing (each image decoded once per geometry); "auto" = a quarter of the memory this process may use
#   (per torchrun process on a node), 0 = off
LOOKAHEAD = True  # True: while a model runs, the later models' tokenizing and image decoding are done in low-priority
#   background workers (their GPU then never waits for them); False: each model does its own
ACCELERATIONS_OFF = []  # list of names from lgip/accelerations.py to switch off, or "all": the plain computation
#   (slower; the same numbers to float rounding)
PRIOR_IMAGES = 3  # int >= 1: a joint scorer's (type generative or itm) text-prior controls score each text with this
#   many other images (LGIP_SPEC.md 13); dual encoders use every other image
BOOTSTRAP = 1000  # int >= 0: bootstrap resamples of the images for the *_ci95 fields; 0 = no intervals
BOOTSTRAP_SEED = 0  # int: seed of the bootstrap resampling
WRITE_SCORES = True  # True: also write per-pair similarities to <stem>__LGIP_<model>.scores.jsonl
EXPORT = None  # None, "csv" or "parquet": the per-pair scores also as one table, <stem>__LGIP_<script>_pairs.csv
TRACKERS = []  # list of "wandb", "mlflow", "tensorboard": each model's figures also logged there (docs/outputs.md)
VERBOSE = True  # True: every line (paths written, comparisons, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())
PUBLISHED_TEXT_BATCH = 64  # the published encode_text's batch: a longer call is padded per 64 texts


def published_calls(records, ks, calls):
    """The published script's encode_text calls over records ks, as data (lgip.texts.TextCalls), and
    the pairs they make: (paraphrases, flips)."""
    inv, sens = common.Pairs(), common.Pairs()
    for k in ks:
        rec = records[k][1]
        orig = calls.add_call(
            rec["orig_captions"], PUBLISHED_TEXT_BATCH, captions_of=k
        )  # the published calls: 5 originals, then per caption
        for i in range(len(rec["orig_captions"])):
            for field, pairs in (("same_caps", inv), ("diff_caps", sens)):
                texts = common.caption_texts(rec, field, i)
                pairs.add(k, i, orig[i], calls.add_call(texts, PUBLISHED_TEXT_BATCH), texts, field)
    return inv, sens


def evaluate(run):
    records = run.records
    # (the pairs are built once per run; controls: their mean cosines with the other images, LGIP_SPEC.md 9;
    # hard positives: each flip against every paraphrase of its caption, section 10)
    scored = run.score(*run.pairs(published_calls), controls=True, hard_positives=[(1, 0)], relative=True)
    inv, sens = scored.pairs
    if not run.is_main:
        return None
    err, gaps = abs(inv.base_sim - inv.sim), sens.base_sim - sens.sim
    m = {
        "model_tag": run.enc.name,
        "num_samples": scored.n_samples,  # published: records with a readable image and a caption
        "num_invariance_pairs": len(inv),
        "num_sensitivity_pairs": len(sens),
        "invariance_error_mean": common.mean_or_none(err),
        "sensitivity_gap_mean": common.mean_or_none(gaps),
        "sensitivity_pos_rate": common.mean_or_none(gaps > 0),
    }
    for key, pairs, values in (
        ("invariance_error_mean", inv, err),
        ("sensitivity_gap_mean", sens, gaps),
        ("sensitivity_pos_rate", sens, gaps > 0),
    ):
        common.add_ci(m, key, pairs.rec, values, BOOTSTRAP, BOOTSTRAP_SEED)
    common.prior_figures(m, sens, inv, BOOTSTRAP, BOOTSTRAP_SEED)  # (beside the published fields)
    common.hard_positive_figures(m, sens, BOOTSTRAP, BOOTSTRAP_SEED)
    # the invariance error in units of how far another image's caption moves the score (LGIP_SPEC.md 13)
    terms = common.relative_terms(scored.relative)
    common.relative_figures(m, "invariance_error_rel", inv.rec, err, terms, BOOTSTRAP, BOOTSTRAP_SEED)
    grounded = common.prior_values(sens)[1]  # (None with fewer than 2 images)
    for figure, pairs, values in (
        ("sensitivity_pos_rate", sens, gaps > 0),  # (in section 9's order)
        ("grounded_pos_rate", sens, None if grounded is None else grounded > 0),
        ("invariance_error_mean", inv, err),
    ):
        run.compare(figure, None, pairs.rec, values)  # (paired model comparisons, LGIP_SPEC.md 9)
    if terms is not None:  # (comparable across score kinds, LGIP_SPEC.md 13)
        run.compare("invariance_error_rel", None, inv.rec, err, denominator=terms)
    if WRITE_SCORES:
        sidecar = common.ScoreSidecar(records, run.enc.score_kind)
        sidecar.add("paraphrases", inv)
        types = [
            common.infer_flip_type(records[k][1]["orig_captions"][i], t)
            for k, i, t in zip(sens.rec, sens.cap, sens.text)
        ]
        prior = common.prior_values(sens)[0]  # (None with fewer than 2 images: no prior_gap written)
        sidecar.add(
            "flips",
            sens,
            type=types,
            **({} if prior is None else {"prior_gap": common.PerModel([round(float(v), 6) for v in prior])}),
        )
        path = common.score_file(JSONL_PATH, "multi", run.enc.name)
        m["scores_file"] = sidecar.save(
            path
        )  # its name; None when it could not be written (said; the metrics still are)
    return m


def summary(m):
    return (
        f"invariance error {common.fmt(m['invariance_error_mean'])}, gap {common.fmt(m['sensitivity_gap_mean'])}, "
        f"positive rate {common.fmt(m['sensitivity_pos_rate'], '.3f')} (with any image: "
        f"{common.fmt(m['prior_pos_rate'], '.3f')}; grounded {common.fmt(m['grounded_pos_rate'], '.3f')})"
    )


def write_model(m):
    common.write_json(common.metrics_path(JSONL_PATH, f"LGIP_{m['model_tag']}.metrics.json"), m)


def run(**constants):
    """The command line's run, and a call from Python: the constants above as keyword arguments
    (`run(JSONL_PATH=..., MODELS=[...], WRITE_SCORES=False)`), in force for this call only; returns
    the list of per-model metrics dicts it writes (None on torchrun's other ranks)."""
    with common.script_call(globals(), constants) as config:
        main, results = common.is_main_process(), []
        rows = common.evaluate_models(
            __file__, config, ("same_caps", "diff_caps"), evaluate, summary, per_model_files=True
        )
        with common.closing(rows):
            for m in rows:  # each model's whole row, as it finishes: its own file at once
                write_model(m)
                results.append(m)
        if not main:
            return None
        common.write_results(__file__, config, results, "LGIP_ALL.metrics.json")  # (then EXPORT, TRACKERS)
        return results


if __name__ == "__main__":
    common.run_main(run)
