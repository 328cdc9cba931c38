"""bench_in_memory: a model held in memory (a training loop's) against the same model named by a spec.

run_lgip_multi.run(...) twice on the same records, alternating, REPEATS times: MODELS = one open_clip spec
({"type": "openclip", "model_name": ARCH, "pretrained": <checkpoint>}), then the same model as a training
loop hands it over ({"type": "python", "loader": (model, preprocess, tokenizer)}), the checkpoint being
the in-memory model's weights (one function, two paths). Prints each run's seconds, the ratio of the
fastest of each, the metrics of both, and the accelerations each row says ran. The in-memory model's
build is outside its timing (a training loop has it); the spec's load is inside (a script loads it).
  python benchmarks/bench_in_memory.py                      # ViT-B-16, the demo's 12 records, CPU
  python benchmarks/bench_in_memory.py --JSONL_PATH=lgip_coco_native5_train2017_with_perturb.jsonl --REPEATS=1
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, _ROOT)
import common  # noqa: E402

ARCH = "ViT-B-16"  # any open_clip architecture name (random init: the same cost as trained weights)
JSONL_PATH = None  # a *_with_perturb.jsonl (images beside it); None = the bundled demo's 12 records, perturbed here
IMAGE_ROOT = None  # folder the records' image paths are relative to; None = the JSONL's folder
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", ...
REPEATS = 2  # int >= 1: timed runs of each (alternating); the fastest is reported
CONFIG = common.configure(globals())


def records():
    """(a perturbed JSONL, its image root, a scratch folder to remove or None)."""
    if JSONL_PATH is not None:
        return JSONL_PATH, IMAGE_ROOT or os.path.dirname(os.path.abspath(JSONL_PATH)), None
    work = tempfile.mkdtemp(prefix="lgip_bench_in_memory_")
    shutil.copy(os.path.join(_ROOT, "demo", "lgip_demo.jsonl"), work)
    shutil.copytree(os.path.join(_ROOT, "demo", "images"), os.path.join(work, "images"))
    subprocess.run(
        [
            sys.executable,
            os.path.join(_ROOT, "diff_gen_caption.py"),
            f"--INPUT_JSONL={os.path.join(work, 'lgip_demo.jsonl')}",
        ],
        check=True,
        capture_output=True,
    )
    return os.path.join(work, "lgip_demo_with_perturb.jsonl"), IMAGE_ROOT or work, work


def main():
    import open_clip
    import torch
    import run_lgip_multi

    jsonl, image_root, work = records()
    device = common.resolve_device(DEVICE)
    t0 = time.perf_counter()
    model, _, preprocess = open_clip.create_model_and_transforms(ARCH, device=device)
    model = model.eval().to(dtype=common.resolve_dtype("auto", device))  # (the spec's dtype: bf16 on CUDA)
    built_s = time.perf_counter() - t0
    scratch = tempfile.mkdtemp(prefix="lgip_bench_weights_")
    weights = os.path.join(scratch, "weights.pt")  # the spec loads the very weights: one function, two paths
    torch.save(model.state_dict(), weights)
    spec = {"name": "spec", "type": "openclip", "model_name": ARCH, "pretrained": weights}
    mine = {"name": "in_memory", "type": "python", "loader": (model, preprocess, open_clip.get_tokenizer(ARCH))}
    settings = dict(
        JSONL_PATH=jsonl, IMAGE_ROOT=image_root, DEVICE=DEVICE, CACHE_DIR=None, BOOTSTRAP=0, WRITE_SCORES=False
    )
    times, rows = {"spec": [], "in_memory": []}, {}
    try:
        for _ in range(REPEATS):
            for name, m in (("spec", spec), ("in_memory", mine)):
                t = time.perf_counter()
                rows[name] = run_lgip_multi.run(**settings, MODELS=[m])[0]
                times[name].append(time.perf_counter() - t)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    best = {k: min(v) for k, v in times.items()}
    print(f"\n{ARCH} on {device}, {rows['spec']['num_samples']} records (in-memory build {built_s:.1f} s, not timed)")
    for name in times:
        ran = [k for k, on in rows[name]["run"]["accelerations"].items() if on]
        print(
            f"  {name:10s} {', '.join(f'{s:.2f}' for s in times[name])} s (fastest {best[name]:.2f} s); "
            f"accelerations that ran: {', '.join(ran)}"
        )
    print(f"  in-memory / spec: {best['in_memory'] / best['spec']:.2f}x")
    for key in ("invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate"):
        print(f"  {key:24s} spec {rows['spec'][key]:.6f}  in memory {rows['in_memory'][key]:.6f}")


if __name__ == "__main__":
    main()
