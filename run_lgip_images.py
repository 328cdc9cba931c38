"""run_lgip_images: the image side of LGIP (after RoCOCO): does a model score an image the same
against its caption when the image is re-saved, downscaled, cropped or mirrored (image
paraphrases), and lower when another image is mixed or pasted into it (image flips)? And does a
caption still find its own image when the altered images join the gallery?

LGIP_SPEC.md section 11. Reads `<stem>_with_fliptypes.jsonl` (any JSONL of records: only the
captions and images are used) and writes all models' figures to `<stem>__LGIP_images.metrics.json`
next to it, and each model's per-pair similarities to `<stem>__LGIP_images_<model>.scores.jsonl`.
The altered pixels are made from the decoded image in the image loader's workers (no image file is
written; SAVE_EXAMPLES writes a few to look at), the same for the same SEED on any machine; their
embeddings are cached beside the other evaluations' (keyed by the source image, the kind and SEED),
and the captions and original images are theirs: a re-run loads no weights.
  python run_lgip_images.py --JSONL_PATH=lgip_coco_native5_train2017_with_fliptypes.jsonl
  python run_lgip_images.py --KINDS="['jpeg', 'mix']" --SAVE_EXAMPLES=3
  torchrun --nproc_per_node=4 run_lgip_images.py ...          # records sharded, galleries searched on rank 0
"""

import os

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017_with_fliptypes.jsonl")  # input:
#   make_perturb_with_fliptypes.py output (or any JSONL of records: its captions and images)
IMAGE_ROOT = None  # folder that image_path is relative to; None = the JSONL's folder
OUTPUT_DIR = None  # folder for the outputs (metrics, score files), created when missing; None = beside JSONL_PATH
MODELS = common.PUBLISHED_MODELS  # list of model specs {"name", "type", ...} or names ("demo", a published
#   model's name), as run_lgip_multi.py's MODELS (README "Models")
SHARD = None  # None (every model), "i/n" (0 <= i < n: models i, i + n, i + 2n, ... of the expanded MODELS:
#   one job of n; the jobs' rows merge in the same files) or "slurm" (i and n from SLURM_ARRAY_TASK_ID, _MIN and _COUNT)
ON_MODEL_ERROR = "stop"  # "stop" (a model that cannot be had, loaded or run stops the run) or "skip" (it is left out
#   and recorded in each row's run.skipped_models; the run fails only when every model does)
PROTOCOL = "corrected"  # "corrected" (texts encoded as each model was trained) or "reference" (as the published code)
KINDS = ["jpeg", "downscale", "crop", "hflip", "mix", "patch"]  # image alterations to evaluate: paraphrases jpeg,
#   downscale, crop, hflip; flips mix, patch (LGIP_SPEC.md 11)
SEED = 0  # int >= 0: which other image each record's flips take (pi), and patch's box
GALLERY_SIZE = 5000  # int >= 1: records per gallery of the text-to-image search, each searched on its own (5000:
#   the COCO 5k protocol); None = one gallery of all records
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
DTYPE = "auto"  # "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "bf16", "fp16"
IMAGE_BATCH_SIZE = 64  # int >= 1: images per forward pass
TEXT_BATCH_SIZE = "auto"  # int >= 1, or "auto" (2048 on CUDA, 64 on CPU): texts per forward pass
NUM_WORKERS = None  # int >= 0 (0: decoded in the main process): image-decoding worker processes (they make the altered
#   images too); None = from the CPU count
CACHE_DIR = "auto"  # embedding cache folder; "auto" = .lgip_cache beside the input (shared with the other
#   evaluations); None = no cache
CACHE_FLUSH_S = 60  # float >= 0: cache chunks also written after this many seconds of work (a crash loses that)
PIXEL_MEMORY_GB = "auto"  # float >= 0: host memory for decoded pixels kept for the next model with the same
#   preprocessing (altered images too); "auto" = a quarter of the memory this process may use, 0 = off
LOOKAHEAD = True  # True: while a model runs, the later models' tokenizing and image decoding are done in low-priority
#   background workers; False: each model does its own
ACCELERATIONS_OFF = []  # list of names from lgip/accelerations.py to switch off, or "all":
#   the plain computation (slower; the same numbers to float rounding)
BOOTSTRAP = 1000  # int >= 0: bootstrap resamples of the images for the *_ci95 fields; 0 = no intervals
BOOTSTRAP_SEED = 0  # int: seed of the bootstrap resampling
WRITE_SCORES = True  # True: also write per-pair similarities to <stem>__LGIP_images_<model>.scores.jsonl
SAVE_EXAMPLES = 0  # int >= 0: write the altered images of the first this many readable records as PNG files to
#   <stem>__LGIP_images_examples/ (to look at); 0 = none
EXPORT = None  # None, "csv" or "parquet": the per-pair scores also as one table, <stem>__LGIP_<script>_pairs.csv
TRACKERS = []  # list of "wandb", "mlflow", "tensorboard": each model's figures also logged there (docs/outputs.md)
VERBOSE = True  # True: every line (paths written, comparisons, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())
PUBLISHED_TEXT_BATCH = 64  # the captions as run_lgip_multi.py and run_lgip_by_fliptype.py
#   call them: the same cache keys
_examples_saved = False  # True once this call has written SAVE_EXAMPLES' images (the pixels are every model's)


def caption_calls(records, ks, calls):
    """Each record's captions as the text evaluations' first published call: their embeddings (and
    the original images') are then in the cache after those, and nothing else is encoded."""
    captions = common.Pairs()
    for k in ks:
        texts = records[k][1]["orig_captions"]
        for i, slot in enumerate(calls.add_call(texts, PUBLISHED_TEXT_BATCH)):
            captions.add(k, i, slot, [slot], [texts[i]], "caption")
    return (captions,)


def evaluate(run):
    (captions,) = run.pairs(caption_calls)
    scored = run.score(captions, keep_embeddings=True)  # captions and original images, encoded or read from the cache
    if not scored.gives("embeddings") and run.is_main:  # (LGIP_SPEC.md 13: the pairs' figures, no galleries)
        print(
            f"{run.enc.name}: scores a pair jointly: its image paraphrase and flip figures only; the text-to-image "
            f"galleries need embeddings (t2i figures left out)",
            flush=True,
        )
    side = common.ImageSide(run, scored, captions, common.check_kinds(KINDS), SEED).encode()  # (N agreed by all)
    run.phase_done("altered_images")
    mine = side.part()
    scored.text_embeddings = None  # (the galleries have what they need: the text table's memory back)
    parts = run.gathered(mine) if run.world > 1 else [mine]  # galleries need every record
    if not run.is_main:
        return None
    figures, pairs = side.figures(parts, GALLERY_SIZE, BOOTSTRAP, BOOTSTRAP_SEED)
    run.phase_done("image_side")
    run.compare("image_sensitivity_pos_rate", None, *common.image_flip_positives(pairs))  # (comparisons: 9, 12)
    m = {"model_tag": run.enc.name, **figures}
    if side.offset is None and any(k in ("mix", "patch") for k in side.kinds):
        print(
            f"warning: {run.enc.name}: {side.n} readable image(s): no image flips (mix and patch take another "
            f"record's image); their figures are None",
            flush=True,
        )
    global _examples_saved
    if SAVE_EXAMPLES and not _examples_saved:
        folder = common.metrics_path(JSONL_PATH, "LGIP_images_examples")
        common.save_examples(folder, run.records, side.readable, run.image_root, side.kinds, SEED, SAVE_EXAMPLES)
        _examples_saved = True
        print(f"-> {folder}: the altered images of {min(SAVE_EXAMPLES, side.n)} record(s), to look at", flush=True)
    if WRITE_SCORES:
        sidecar = common.ScoreSidecar(run.records, run.enc.score_kind)
        for group, group_pairs, labels in side.score_groups(pairs):
            sidecar.add(group, group_pairs, **labels)
        m["scores_file"] = sidecar.save(common.score_file(JSONL_PATH, "images", run.enc.name))
    return m


def summary(m):
    """The headline, then a line per kind of image flip."""
    f = lambda v: common.fmt(v, ".3f")
    kinds = [
        f"{kind}: gap {common.fmt(b['image_sensitivity_gap_mean'])}, positive {f(b['image_sensitivity_pos_rate'])}, "
        f"t2i R@1 with them {f(b['t2i_flip_recall@1'])}, top-1 altered {f(b['t2i_flip_top1_rate'])}"
        for kind, b in m["by_kind"].items()
        if "t2i_flip_top1_rate" in b
    ]
    head = (
        f"image invariance error {common.fmt(m['image_invariance_error_mean'])}, image gap "
        f"{common.fmt(m['image_sensitivity_gap_mean'])}, positive rate {f(m['image_sensitivity_pos_rate'])}"
    )
    return "\n".join([head] + kinds)


def run(**constants):
    """The command line's run, and a call from Python (`run(JSONL_PATH=..., MODELS=[...], KINDS=["mix"])`):
    returns the list of per-model metrics dicts it writes (None on torchrun's other ranks)."""
    with common.script_call(globals(), constants) as config:
        common.check_kinds(config["KINDS"]), common.check_seed(config["SEED"])  # before any model's work
        common.check_gallery_size(config["GALLERY_SIZE"]), common.require_int(config, "SAVE_EXAMPLES", 0)
        global _examples_saved
        _examples_saved = False
        results = common.run_evaluation(__file__, config, (), evaluate, summary, needs=("altered_images",))
        if results is not None:
            common.write_results(__file__, config, results, "LGIP_images.metrics.json")  # (then EXPORT, TRACKERS)
        return results


if __name__ == "__main__":
    common.run_main(run)
