"""finetune_lgip: fine-tune a dual encoder against the probe, beside a plain control on the same data, and keep
images neither saw for probing both (after RoCOCO's semantic and visual contrastive losses and NegCLIP).

LGIP_SPEC.md section 14. Splits the records by image into `<stem>__ft_train.jsonl` and `<stem>__ft_heldout.jsonl`
beside the input, trains on the first with L = L_clip + W_SC L_sc (the flips as hard negatives) + W_INV L_inv
(a paraphrase scored as its caption) + W_VC L_vc (mixed images as negatives), and writes the run folder:
`model/` (a MODELS spec in `model_spec.json`), `train_log.jsonl` (a line a step), `finetune.meta.json`, and
`resume.pt` (a killed run resumes to what an unbroken run gives). The plain control: W_SC = W_INV = W_VC = 0.
  python finetune_lgip.py --JSONL_PATH=lgip_coco_native5_train2017_with_fliptypes.jsonl --MODEL=openclip_ViT-B-16_openai
  python finetune_lgip.py ... --RUN_NAME=plain --W_SC=0 --W_INV=0
  python run_lgip_by_fliptype.py --JSONL_PATH=lgip_coco_native5_train2017_with_fliptypes__ft_heldout.jsonl \\
      --MODELS="[<the start>, <each run's model_spec.json>]"
It trains any model whose family can be built for training (open_clip; transformers dual encoders, CLIP-style
and SigLIP), in one process or under torchrun (each rank its slice of a batch, the gradients averaged):
  torchrun --nproc_per_node=4 finetune_lgip.py --JSONL_PATH=... --MODEL=...
The start model is checked before any work as the evaluations check theirs: one that cannot be had (no network,
not cached) or a local path that is not there stops it at once with exit status 2, nothing written.
"""

import json
import os

import common
from lgip import finetune, trainer
from lgip.settings import SAFE_NAME as _SAFE_NAME  # (not a setting: --help lists UPPER-case names)

_HERE = os.path.dirname(os.path.abspath(__file__))
JSONL_PATH = os.path.join(_HERE, "lgip_coco_native5_train2017_with_fliptypes.jsonl")  # input: records with
#   same_caps and diff_caps (make_perturb_with_fliptypes.py's or diff_gen_caption.py's)
MODEL = "openclip_ViT-B-16_openai"  # the start: one MODELS spec or a published model's name (type openclip)
RUN_NAME = "lgip"  # str: the run's name (its folder's and its saved model's)
OUTPUT_DIR = None  # the run folder; None = <stem>__ft_<RUN_NAME>/ beside JSONL_PATH
HELDOUT_FRACTION = 0.2  # float in [0, 1): images held out (never trained on); 0 = train on every record
SPLIT_SEED = 0  # int: which images are held out
SEED = 0  # int: the batches, the draws, the initial random state
STEPS = 500  # int >= 0: optimisation steps (0: the start model saved unchanged)
BATCH_SIZE = 128  # int >= 2: records per step
N_FLIPS = 3  # int >= 0: flips drawn per record and step (the hard negatives)
W_SC = 1.0  # float >= 0: weight of L_sc (flips as negatives of their image)
W_INV = 1.0  # float >= 0: weight of L_inv (a paraphrase scored as its caption)
W_VC = 0.0  # float >= 0: weight of L_vc (mixed images as negatives of their caption)
LR = 1e-5  # float > 0: peak learning rate (AdamW; linear warmup, then cosine to 0)
WARMUP = 50  # int >= 0: warmup steps
WEIGHT_DECAY = 0.1  # float >= 0: AdamW weight decay (not on gains, biases, logit scale)
GRAD_CLIP = 1.0  # float > 0: the gradient's L2 norm clipped to this
SAVE_EVERY = 100  # int >= 1: resume.pt written after every this many steps (and the last)
RESUME = True  # True: continue from resume.pt when its settings match; False: start over
KEEP_RESUME = False  # True: keep resume.pt once the run is done (the optimiser's state too); False: removed then
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
DTYPE = "auto"  # "auto" (bf16 autocast on CUDA, fp32 on CPU), "fp32", "bf16"
TRACKERS = []  # list of "wandb", "mlflow", "tensorboard": each step's loss terms also logged there (docs/outputs.md)
VERBOSE = True  # True: every line (paths written, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())


def check_config():
    """(the start's spec, the loop's settings: lgip.finetune.TrainSettings), every setting checked before any work."""
    settings = finetune.TrainSettings.from_config(CONFIG)
    common.require_int(CONFIG, "SPLIT_SEED")
    if not (isinstance(HELDOUT_FRACTION, (int, float)) and 0 <= HELDOUT_FRACTION < 1):
        raise common.ConfigError(f"HELDOUT_FRACTION must be a number in [0, 1), got {HELDOUT_FRACTION!r}")
    if not isinstance(RUN_NAME, str) or not _SAFE_NAME.match(RUN_NAME):
        raise common.ConfigError(f"RUN_NAME must be a file-safe name (letters, digits, . _ -), got {RUN_NAME!r}")
    spec = start_spec()
    common.require_models([spec])  # (a model that cannot be had, a local path not there: before any work, exit 2)
    return spec, settings


def start_spec():
    """MODEL as a spec (lgip.finetune.start_spec)."""
    return finetune.start_spec(MODEL)


def split_files(records, raw, sha, rank=0):
    """The train records (split by image, files written beside the input, reused when made alike)."""
    stem = common.default_output(JSONL_PATH, "")
    names = {"train": stem + "__ft_train.jsonl", "heldout": stem + "__ft_heldout.jsonl"}
    meta_path = stem + "__ft_split.meta.json"
    if HELDOUT_FRACTION == 0:
        return list(range(len(records))), None
    held = finetune.split_records(records, HELDOUT_FRACTION, SPLIT_SEED)
    train = [k for k, (_, rec) in enumerate(records) if not held[rec["image_path"]]]
    heldout = [k for k, (_, rec) in enumerate(records) if held[rec["image_path"]]]
    if not train or not heldout:
        raise common.InputError(
            f"HELDOUT_FRACTION={HELDOUT_FRACTION} leaves the {'train' if not train else 'held-out'} side of "
            f"{JSONL_PATH} empty ({len(held)} images): change it"
        )
    meta = {"input": os.path.abspath(JSONL_PATH), "input_sha256": sha, "HELDOUT_FRACTION": HELDOUT_FRACTION}
    meta.update(
        SPLIT_SEED=SPLIT_SEED, images={"train": sum(not h for h in held.values()), "heldout": sum(held.values())}
    )
    meta.update(records={"train": len(train), "heldout": len(heldout)}, files=names)
    same = os.path.isfile(meta_path) and all(os.path.isfile(p) for p in names.values())
    if same:
        with open(meta_path, encoding="utf-8") as f:
            old = json.load(f)
        same = [old.get(k) for k in ("input_sha256", "HELDOUT_FRACTION", "SPLIT_SEED")] == [
            sha,
            HELDOUT_FRACTION,
            SPLIT_SEED,
        ]
    if not same and rank == 0:  # (under torchrun rank 0 writes; the split itself is every rank's, in memory)
        with common.OutputSet() as files:
            for side, ks in (("train", train), ("heldout", heldout)):
                with files.open(names[side]) as f:
                    f.writelines(common.dump_jsonl_line(raw[k]) for k in ks)
            common.write_json(meta_path, meta, files=files)
        common.detail(f"-> {names['train']} ({len(train)} records)\n-> {names['heldout']} ({len(heldout)} records)")
    return train, meta


def main():
    spec, train_settings = check_config()
    sha = common.file_sha256(JSONL_PATH)
    records = common.load_records(JSONL_PATH, ("same_caps", "diff_caps"))
    folder = OUTPUT_DIR or common.default_output(JSONL_PATH, f"__ft_{RUN_NAME}")
    settings = {k: CONFIG[k] for k in finetune.HASHED if k in CONFIG}
    digest = finetune.run_hash(dict(settings, input_sha256=sha, MODEL=spec))
    meta_path = os.path.join(folder, "finetune.meta.json")
    if os.path.isfile(meta_path):  # (a done run of these settings: nothing to do)
        with open(meta_path, encoding="utf-8") as f:
            old = json.load(f)
        if old.get("status") == "done" and old.get("hash") == digest:
            print(f"{RUN_NAME}: already done ({old.get('steps_done')} steps) -> {meta_path}", flush=True)
            return old["saved"]
        if old.get("status") == "done":  # (a done run of other settings: its model is never overwritten)
            was = old.get("config") or {}
            differs = ", ".join(k for k in settings if k in was and was[k] != settings[k]) or "its input or MODEL"
            raise common.ConfigError(
                f"{folder} holds a done run of other settings (it differs in {differs}): give another RUN_NAME or "
                f"OUTPUT_DIR (its model is kept)"
            )
    rank, size = trainer.world()  # (torchrun's; (0, 1) in one process)
    if BATCH_SIZE % size:
        raise common.ConfigError(f"BATCH_SIZE {BATCH_SIZE} is not a multiple of the {size} ranks: change it")
    raw = [json.loads(line) for line in open(JSONL_PATH, encoding="utf-8-sig") if line.strip()]
    train, split = split_files(records, raw, sha, rank)
    root = os.path.dirname(os.path.abspath(JSONL_PATH))
    usable, unreadable = trainer.readable(records, train, root)
    n = len(usable)
    check_data(records, usable, n)
    job = trainer.Trainer(spec, DEVICE, DTYPE)
    meta = dict(common.provenance(__file__, CONFIG), start=spec, saved=None, split=split, N=n, steps_done=0)
    meta.update(left_out=unreadable, world_size=size, device=str(job.device), dtype=job.dtype_name, hash=digest)
    if rank == 0:
        os.makedirs(folder, exist_ok=True)
        common.write_json(meta_path, dict(meta, status="running"), output=False)  # (a killed run's meta says so)
    paths = [os.path.join(root, records[k][1]["image_path"]) for k in usable]
    recs = [records[k][1] for k in usable]
    on_line, close_trackers = common.track_steps(CONFIG, folder, RUN_NAME) if rank == 0 else (None, lambda: None)
    try:
        done = job.train(folder, recs, paths, train_settings, digest, settings, RESUME, on_line)
    finally:
        close_trackers()
    saved = job.save(folder, RUN_NAME)
    if rank == 0:
        common.write_json(meta_path, dict(meta, saved=saved, steps_done=done, status="done"))
        resume = os.path.join(folder, "resume.pt")
        if not KEEP_RESUME and os.path.isfile(resume):  # (the model is saved: a done run needs it no more)
            os.unlink(resume)
        print(f"{RUN_NAME}: {done} steps on {n} train records -> {os.path.join(folder, 'model_spec.json')}", flush=True)
    return saved


def check_data(records, usable, n):
    if n < BATCH_SIZE:
        raise common.InputError(
            f"{n} train records with a readable image, fewer than BATCH_SIZE {BATCH_SIZE}: lower it"
        )
    if W_VC > 0 and n < 2:
        raise common.InputError("W_VC > 0 needs at least 2 train records (a mixed image takes another's)")
    if W_SC > 0 and not any(
        (records[k][1].get("diff_caps") or {}) and any(records[k][1]["diff_caps"].values()) for k in usable
    ):
        raise common.InputError(
            f"W_SC > 0 but no train record of {JSONL_PATH} has a flip: run make_perturb_with_fliptypes.py first"
        )
    if W_INV > 0 and not any(any((records[k][1].get("same_caps") or {}).values()) for k in usable):
        raise common.InputError(f"W_INV > 0 but no train record of {JSONL_PATH} has a paraphrase")


def run(**constants):
    """The command line's run, and a call from Python: the constants as keyword arguments (lgip.entry);
    returns the saved model's spec."""
    with common.script_call(globals(), constants):
        return main()


if __name__ == "__main__":
    common.run_main(run)
