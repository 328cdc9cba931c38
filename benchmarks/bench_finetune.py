"""bench_finetune: finetune_lgip.py's training step (lgip.trainer) beside open_clip's own (`open_clip.ClipLoss` on
`model(image, text)`, as open_clip_train's train_one_epoch steps: the same model, batch, records, eval
preprocessing, AdamW and gradient clipping), on the shapes world's records, for the shapes demo's tiny CLIP and
ViT-B-16 (random init: no download; the cost of a step does not depend on the weights).

Each configuration runs in a process of its own (its peak memory is its own): a warm-up step, then STEPS timed
steps; the median step's seconds. Prints, per model: open_clip's step, the plain arm's (L_clip alone: the same
work, within 10% is the goal) and the LGIP arm's (W_SC = W_INV = 1: its paraphrases and N_FLIPS flips a record
encoded too), steps/s, images/s, texts encoded per step, and the peak memory (CPU: the process's max RSS; CUDA:
torch's max allocated).
  python benchmarks/bench_finetune.py                                   # tiny (batch 64) and ViT-B-16 (batch 16)
  python benchmarks/bench_finetune.py --ARCHS="['ViT-B-16']" --BATCH_SIZES="{'ViT-B-16': 128}" --DEVICE=cuda
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.abspath(os.path.dirname(__file__)))
sys.path.insert(1, _ROOT)
import common  # noqa: E402

ARCHS = ["shapes_tiny", "ViT-B-16"]  # "shapes_tiny" (the shapes demo's CLIP) and/or open_clip architecture names
BATCH_SIZES = {"shapes_tiny": 64, "ViT-B-16": 16}  # {model: records per step}
STEPS = 5  # int >= 1: timed steps per configuration (after one warm-up step)
N_FLIPS = 3  # int >= 0: the LGIP arm's flips per record
DEVICE = "cpu"  # "cpu", "cuda", ...
DTYPE = "auto"  # finetune_lgip.py's: bf16 autocast on CUDA ("auto"), "fp32"
WORKER = None  # (internal) "<model>:<arm>:<folder>": one configuration, run in its own process
CONFIG = common.configure(globals())


def peak_memory_mb(device):
    import resource

    import torch

    if str(device).startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def spec_of(model, folder):
    from lgip import shapes

    if model == "shapes_tiny":
        return shapes.start_spec(os.path.join(folder, "start_model"), "shapes_tiny")
    return {"name": model, "type": "openclip", "model_name": model, "pretrained": None}


def the_records(folder):
    from lgip.records import load_records

    records = load_records(os.path.join(folder, "lgip_shapes_with_fliptypes.jsonl"), ("same_caps", "diff_caps"))
    return [rec for _, rec in records], [os.path.join(folder, rec["image_path"]) for _, rec in records]


def openclip_steps(spec, recs, paths, b):
    """open_clip's training step: model(image, text) -> ClipLoss -> backward -> clip -> AdamW, on each step's
    records (the same positions and captions as the trainer's)."""
    import open_clip
    import torch

    from lgip import finetune
    from lgip.images import open_rgb
    from lgip.trainer import Trainer

    towers = Trainer(spec, DEVICE, DTYPE)  # (built as the trainer builds it: the same module, preprocessing)
    model = towers.model
    from open_clip.transform import PreprocessCfg, image_transform_v2

    preprocess = image_transform_v2(PreprocessCfg(**model.visual.preprocess_cfg), is_train=False)
    tokenizer = open_clip.get_tokenizer(spec["model_name"])
    loss_fn = open_clip.ClipLoss()
    opt = torch.optim.AdamW(finetune.param_groups(model, 0.1), lr=1e-5, betas=(0.9, 0.98), eps=1e-6)
    params = [p for p in model.parameters() if p.requires_grad]
    times = []
    for s in range(STEPS + 1):
        t0 = time.perf_counter()
        pos = finetune.step_positions(s, len(recs), b, 0)
        caps = [finetune.draw(recs[r], 0, s, r, 0)[0] for r in pos]
        images = torch.stack([preprocess(open_rgb(paths[r])) for r in pos]).to(DEVICE)
        texts = tokenizer(caps).to(DEVICE)
        model.train()
        with towers.forward_context():
            out = model(images, texts)  # (image features, text features, logit scale: open_clip's forward)
            out = [out[k] for k in ("image_features", "text_features", "logit_scale")] if isinstance(out, dict) else out
            loss = loss_fn(*out[:3])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sync(DEVICE)
        times.append(time.perf_counter() - t0)
    return times[1:], b


def sync(device):
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def trainer_steps(spec, recs, paths, b, weights):
    """finetune_lgip.py's step (lgip.trainer.Trainer.step, then its backward, clip, AdamW, clamp)."""
    import torch

    from lgip import finetune
    from lgip.trainer import Trainer

    job = Trainer(spec, DEVICE, DTYPE)
    cfg = finetune.TrainSettings(
        batch_size=b, seed=0, n_flips=N_FLIPS, w_vc=0.0, **{k.lower(): v for k, v in weights.items()}
    )
    opt = torch.optim.AdamW(finetune.param_groups(job.model, 0.1), lr=1e-5, betas=(0.9, 0.98), eps=1e-6)
    params = [p for p in job.model.parameters() if p.requires_grad]
    times, texts = [], []
    for s in range(STEPS + 1):
        t0 = time.perf_counter()
        out = job.step(s, recs, paths, cfg, 1)
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            job.model.logit_scale.clamp_(0, 4.6052)
        sync(DEVICE)
        times.append(time.perf_counter() - t0)
        texts.append(b + (out["paras"] if weights["W_INV"] else 0) + (out["flips"] if weights["W_SC"] else 0))
    return times[1:], statistics.median(texts[1:])


def worker(model, arm, folder):
    recs, paths = the_records(folder)
    spec = spec_of(model, folder)
    b = BATCH_SIZES[model]
    if arm == "open_clip":
        times, texts = openclip_steps(spec, recs, paths, b)
    else:
        weights = {"W_SC": 0, "W_INV": 0} if arm == "plain" else {"W_SC": 1.0, "W_INV": 1.0}
        times, texts = trainer_steps(spec, recs, paths, b, weights)
    step = statistics.median(times)
    print(json.dumps({"step_s": step, "texts": texts, "batch": b, "memory_mb": peak_memory_mb(DEVICE)}))


def main():
    if WORKER:
        return worker(*WORKER.split(":", 2))
    import torch

    from lgip import scripts, shapes

    folder = tempfile.mkdtemp(prefix="bench_finetune_")
    shapes.make_world(folder, 2, 400, 0)
    shapes.start_model(os.path.join(folder, "start_model"), 0)
    scripts.load("make_perturb_with_fliptypes").run(
        INPUT_JSONL=os.path.join(folder, "lgip_shapes.jsonl"), VERBOSE=False
    )
    print(f"device {DEVICE}, torch {torch.__version__}, {os.cpu_count()} CPUs, {STEPS} timed steps (median)")
    results = {}
    for model in ARCHS:
        for arm in ("open_clip", "plain", "lgip"):
            cmd = [sys.executable, os.path.abspath(__file__), f"--WORKER={model}:{arm}:{folder}"]
            cmd += [f"--{k}={CONFIG[k]!r}" for k in ("BATCH_SIZES", "STEPS", "N_FLIPS", "DEVICE", "DTYPE")]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"{model} {arm}: {proc.stderr[-2000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            results[(model, arm)] = r
            print(
                f"{model:12s} {arm:9s} batch {r['batch']:4d}: {r['step_s']:.3f} s/step, {1 / r['step_s']:.2f} steps/s, "
                f"{r['batch'] / r['step_s']:.1f} images/s, {r['texts']:.0f} texts/step, peak {r['memory_mb']:.0f} MB",
                flush=True,
            )
        base = results[(model, "open_clip")]["step_s"]
        plain, lgip = results[(model, "plain")]["step_s"], results[(model, "lgip")]["step_s"]
        print(f"{model}: plain / open_clip {plain / base:.3f}; lgip / plain {lgip / plain:.3f}", flush=True)


if __name__ == "__main__":
    common.run_main(main)
