"""run_lgip_retrieval: standard image-text retrieval beside LGIP, and retrieval with the flips in the
caption gallery (RoCOCO), from the same embeddings.

LGIP_SPEC.md section 7. Reads `<stem>_with_fliptypes.jsonl` (or a `<stem>_with_perturb.jsonl`: then
no per-type figures) and writes all models' figures to `<stem>__LGIP_retrieval.metrics.json` next to
it. Its texts are run_lgip_by_fliptype.py's published calls, so after that script on the same file
(or run_lgip_multi.py on a _with_perturb file) every embedding is in the cache: no weights are loaded.
  python run_lgip_retrieval.py --JSONL_PATH=lgip_coco_native5_train2017_with_fliptypes.jsonl
  python run_lgip_retrieval.py --GALLERY_SIZE=1000            # the COCO 1k protocol
  torchrun --nproc_per_node=4 run_lgip_retrieval.py ...        # records sharded, galleries searched on rank 0
"""

import os

import common
import run_lgip_by_fliptype as by_fliptype  # its published calls: the texts, paddings and so cache keys

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017_with_fliptypes.jsonl")  # input:
#   make_perturb_with_fliptypes.py (or diff_gen_caption.py) output
IMAGE_ROOT = None  # folder that image_path is relative to; None = the JSONL's folder
OUTPUT_DIR = None  # folder for the outputs (metrics, score files), created when missing; None = beside JSONL_PATH
MODELS = common.PUBLISHED_MODELS  # list of model specs {"name", "type", ...} (the types and their keys: --help,
#   README "Models") or names ("demo", a published model's name); a model without embeddings is left out, in a line
SHARD = None  # None (every model), "i/n" (0 <= i < n: models i, i + n, i + 2n, ... of the expanded MODELS:
#   one job of n; the jobs' rows merge in the same files) or "slurm" (i and n from SLURM_ARRAY_TASK_ID, _MIN and _COUNT)
ON_MODEL_ERROR = "stop"  # "stop" (a model that cannot be had, loaded or run stops the run)
#   or "skip" (it is left out and recorded in each row's run.skipped_models; the run fails only when every model does)
PROTOCOL = "corrected"  # "corrected" (texts encoded as each model was trained) or "reference" (as the published code)
GALLERY_SIZE = 5000  # int >= 1: records per gallery, searched on its own (5000: the COCO 5k protocol;
#   the last may be smaller); None = one gallery of all records
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
DTYPE = "auto"  # "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "bf16", "fp16"
IMAGE_BATCH_SIZE = 64  # int >= 1: images per forward pass
TEXT_BATCH_SIZE = "auto"  # int >= 1, or "auto" (2048 on CUDA, 64 on CPU): texts per forward pass (CLIP family:
#   about 16 token positions per text, in prefix packs of 128)
NUM_WORKERS = None  # int >= 0 (0: decoded in the main process): image-decoding worker processes;
#   None = from the CPU count
CACHE_DIR = "auto"  # embedding cache folder; "auto" = .lgip_cache beside the input (shared with the other evaluations);
#   None = no cache
CACHE_FLUSH_S = 60  # float >= 0: cache chunks are also written after this many seconds of work,
#   so a crash loses at most about that much
PIXEL_MEMORY_GB = "auto"  # float >= 0: host memory for decoded pixels kept for the next model with the same
#   preprocessing; "auto" = a quarter of the memory this process may use, 0 = off
LOOKAHEAD = True  # True: while a model runs, the later models' tokenizing and image decoding are done in low-priority
#   background workers; False: each model does its own
ACCELERATIONS_OFF = []  # list of names from lgip/accelerations.py to switch off, or "all": the plain computation
#   (slower; the same numbers to float rounding)
BOOTSTRAP = 1000  # int >= 0: bootstrap resamples of the images for the *_ci95 fields; 0 = no intervals
BOOTSTRAP_SEED = 0  # int: seed of the bootstrap resampling
TRACKERS = []  # list of "wandb", "mlflow", "tensorboard": each model's figures also logged there (docs/outputs.md)
VERBOSE = True  # True: every line (paths written, comparisons, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())
FIELDS = ("same_caps", "diff_caps", "diff_caps_*")  # the typed lists are optional (a _with_perturb file has none)


def retrieval_calls(records, ks, calls):
    """run_lgip_by_fliptype's published calls (paraphrases, flips, typed flips), then each record's
    captions once more as the same call: the same keys, so nothing more to encode, and a slot for
    every caption, also one that no pair names."""
    paras, flips, typed = by_fliptype.published_calls(records, ks, calls)
    captions = common.Pairs()
    for k in ks:
        texts = records[k][1]["orig_captions"]
        for i, slot in enumerate(calls.add_call(texts, by_fliptype.PUBLISHED_TEXT_BATCH)):
            captions.add(k, i, slot, [slot], [texts[i]], "caption")
    return captions, flips, typed, paras


def flip_types(records):
    """The flip types of section 7's by_flip_type: those whose typed list (diff_caps_<type>) some
    record has ("when present": none for a _with_perturb file), in order of first appearance (an
    imported benchmark's own types, section 10)."""
    return common.flip_types(records)


def evaluate(run):
    captions, flips, typed, paras = run.pairs(retrieval_calls)  # (built once per run)
    scored = run.score(keep_embeddings=True)  # every text and image encoded, or read from the cache; no pair to score
    mine = common.Gallery.from_pairs(
        scored.ok,
        scored.image_embeddings,
        *scored.text_embeddings,
        captions,
        flips,
        typed,
        paras,
        flip_types(run.records),
    )
    scored.text_embeddings = None  # (the gallery has what it needs: the text table's memory back)
    parts = run.gathered(mine.to_host()) if run.world > 1 else [mine]  # galleries need every record
    if not run.is_main:
        return None
    gallery = mine if run.world == 1 else common.Gallery.merged(parts, run.enc.device)
    found = common.search_galleries(gallery, run.config["GALLERY_SIZE"])
    run.phase_done("retrieval")  # (then "metrics_and_scores_file": the intervals)
    run.seconds.update({f"retrieval_{part}": v for part, v in found.seconds.items()})  # (the search's parts, of it)
    for figure, image, hit in common.retrieval_compared(found):
        run.compare(figure, None, image, hit)  # (paired model comparisons, LGIP_SPEC.md 9 and 12)
    return {
        "model_tag": run.enc.name,
        **common.retrieval_figures(found, run.config["BOOTSTRAP"], run.config["BOOTSTRAP_SEED"]),
    }


def summary(m):
    f = lambda key: common.fmt(m[key], ".3f")
    return (
        f"i2t R@1 {f('i2t_recall@1')}, with flips {f('i2t_flip_recall@1')}, top-1 a flip "
        f"{f('i2t_flip_top1_rate')}, own flip preferred {f('own_flip_preferred_rate')}, t2i R@1 {f('t2i_recall@1')} "
        f"({m['num_blocks']} galler{'y' if m['num_blocks'] == 1 else 'ies'} of {m['gallery_size']})"
    )


def run(**constants):
    """The command line's run, and a call from Python: the constants above as keyword arguments
    (`run(JSONL_PATH=..., MODELS=[...], GALLERY_SIZE=1000)`), in force for this call only; returns
    the list of per-model metrics dicts it writes (None on torchrun's other ranks)."""
    with common.script_call(globals(), constants) as config:
        common.check_gallery_size(config["GALLERY_SIZE"])  # before any model's work
        results = common.run_evaluation(__file__, config, FIELDS, evaluate, summary, needs=("embeddings",))
        if results is not None:
            common.write_results(__file__, config, results, "LGIP_retrieval.metrics.json")  # (then TRACKERS)
        return results


if __name__ == "__main__":
    common.run_main(run)
