"""run_lgip_classification: classification beside the probe: zero-shot accuracy under distribution shift,
calibration (ECE, NLL, before and after temperature scaling), out-of-distribution detection (AUROC, FPR@95,
AUPR-in) and shape bias, for every scorer that gives class scores: dual encoders at their own logit scale,
generative VLMs and cross-encoders through section 13's pair score (a text-only model is left out in a line).

LGIP_SPEC.md section 16; docs/classification.md says what each figure means and which choices change it. Writes
`<N>__LGIP_classification.metrics.json` (a row per model, merged with an earlier run's) and
`<N>__LGIP_classification_<model>.jsonl` (a line per image), N = JSONL_PATH's stem, else "lgip".
  python run_lgip_classification.py --MODELS='["demo"]'    # the shapes world (make_shapes_jsonl.py or run_all.py
                                                           # --DATA=shapes made it): its held-out images, its OOD glyphs
  python run_lgip_classification.py --DATASETS='[{"name": "in1k", "source": "clip_benchmark", "role": "id",
      "dataset": "imagenet1k", "root": "/data/imagenet"}, {"name": "in-r", "source": "clip_benchmark",
      "role": "shift", "dataset": "imagenet-r", "root": "/data/imagenet-r"}]'
  torchrun --nproc_per_node=4 run_lgip_classification.py ...            # each set's images sharded, gathered on rank 0
"""

import os

import common
from lgip.classification.run import classify

_HERE = os.path.dirname(os.path.abspath(__file__))
DATASETS = "shapes"  # "shapes" (the shapes world's held-out images, role "id", and its no-class glyphs, role "ood")
#   or a list of {"name", "source", "role", ...}: source "clip_benchmark" {"dataset", "root", "split"}, "folder"
#   {"root", "classnames", "templates"}, "jsonl" {"path", "classnames", "templates"}, "shapes" {"root", "count"};
#   role "id" (at most one), "shift", "ood" (needs an id set) or "cue_conflict" (a jsonl set: shape bias)
MODELS = common.PUBLISHED_MODELS  # list of specs or names (README "Models"): any scorer kind of LGIP_SPEC.md 13;
#   a text-only model (type causal_lm) is left out in a line
TEMPLATES = "dataset"  # "dataset" (each dataset's own), a list of templates with {c}, or a CLIP_benchmark template
#   key ("imagenet1k": OpenAI's 80): a dual encoder's prompts, every set
GENERATIVE_TEMPLATES = ["a photo of a {c}."]  # list of templates with {c}: a joint scorer's class score is the mean
#   of its pair scores over them
OOD_SCORE = "msp"  # "msp" (max softmax at T*), "maxlogit" (max class score) or "mcm" (max softmax of the cosines:
#   dual encoders only)
SPLIT_SEED = 0  # int: the id set's split into the half that fits the temperature and the half that judges it
BOOTSTRAP = 1000  # int >= 0: bootstrap resamples of the images for the *_ci95 fields; 0 = no intervals
BOOTSTRAP_SEED = 0  # int: seed of the bootstrap resampling
JSONL_PATH = None  # None, or a JSONL (the probe's input): its stem names the outputs, so report.py finds them
#   beside the probe's
OUTPUT_DIR = None  # folder for the outputs, created when missing; None = beside JSONL_PATH, else the working folder
PROTOCOL = "corrected"  # "corrected" or "reference": class prompts are encoded as the corrected protocol encodes
#   texts either way (no published output exists for them), so the models are loaded so
SHARD = None  # None (every model), "i/n" (models i, i + n, ... of the expanded MODELS: one job of n; the jobs' rows
#   merge in the same file) or "slurm" (i and n from SLURM_ARRAY_TASK_ID, _MIN and _COUNT)
ON_MODEL_ERROR = "stop"  # "stop" (a model that cannot be had, loaded or run stops the run) or "skip" (it is left out
#   and recorded in each row's run.skipped_models; the run fails only when every model does)
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
DTYPE = "auto"  # "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "bf16", "fp16"
IMAGE_BATCH_SIZE = 64  # int >= 1: images per forward pass
TEXT_BATCH_SIZE = "auto"  # int >= 1, or "auto" (2048 on CUDA, 64 on CPU): texts per forward pass
NUM_WORKERS = None  # int >= 0 (0: decoded in the main process): image-decoding worker processes;
#   None = from the CPU count
CACHE_DIR = "auto"  # embedding cache folder; "auto" = .lgip_cache beside JSONL_PATH (or in OUTPUT_DIR, or the
#   working folder; shared with the other evaluations); None = no cache
CACHE_FLUSH_S = 60  # float >= 0: cache chunks are also written after this many seconds of work
PIXEL_MEMORY_GB = "auto"  # float >= 0: host memory for decoded pixels kept for the next model with the same
#   preprocessing; "auto" = a quarter of the memory this process may use, 0 = off
LOOKAHEAD = True  # True: while a model runs, the later models' tokenizing and image decoding are done in
#   low-priority background workers; False: each model does its own
ACCELERATIONS_OFF = []  # list of names from lgip/accelerations.py to switch off, or "all": the plain computation
VERBOSE = True  # True: every line (paths written); False: the result lines (run_all's default)
CONFIG = common.configure(globals())


def run(**constants):
    """The command line's run, and a call from Python: the constants above as keyword arguments
    (`run(DATASETS=[...], MODELS=[...])`), in force for this call only; returns the list of per-model rows it
    writes (None on torchrun's other ranks, or when every model is left out)."""
    with common.script_call(globals(), constants) as config:
        return classify(__file__, config, shapes_root=os.path.join(_HERE, "shapes"))


if __name__ == "__main__":
    common.run_main(run)
