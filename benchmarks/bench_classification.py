"""bench_classification: run_lgip_classification.py's speed against CLIP_benchmark's own zero-shot loop, side by
side in one run on the same model, images and classes, and a generative scorer's classes per second with its
shared prefix reused against without.

1. Dual encoder: an open_clip ARCH at random init (saved once, so both paths load the same weights), N_IMAGES
   synthetic images in an ImageFolder of N_CLASSES classes (ImageNet's class names, CLIP_benchmark's), the first
   N_TEMPLATES of OpenAI's 80 templates. CLIP_benchmark: `zero_shot_classifier` + `run_classification` over
   torchvision's ImageFolder with the model's preprocessing (amp on CUDA, as its CLI; fp32 on the CPU); this
   step: `run_lgip_classification.run` (BOOTSTRAP 0), cold (an empty cache), then again (the class prompts and
   images read from the cache: no weights loaded). Model loading is timed apart in both and left out; the
   predictions of both paths are compared.
2. Generative: tests/tiny_vlm.py's tiny LLaVA, GEN_IMAGES images x GEN_CLASSES classes, no cache: classes per
   second with PREFIX_REUSE on, then off (ACCELERATIONS_OFF).

Prints images per second of each path and their ratio, the re-run's, and the generative classes per second.
  python benchmarks/bench_classification.py                                    # 1,000 classes x 80 templates
  python benchmarks/bench_classification.py --N_CLASSES=100 --N_TEMPLATES=8 --N_IMAGES=32   # a 2-core CPU
"""

import json
import os
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.abspath(os.path.dirname(__file__)))
sys.path.insert(1, _ROOT)
sys.path.insert(2, os.path.join(_ROOT, "tests"))
import common  # noqa: E402

ARCH = "ViT-B-16"  # open_clip architecture, random init
N_CLASSES = 1000  # int in 1..1000: ImageNet's first N class names
N_TEMPLATES = 80  # int in 1..80: OpenAI's first N templates
N_IMAGES = 256  # int >= 2: synthetic images (224 px noise), in the first classes
DEVICE = "cpu"  # "cpu", "cuda", ...
DTYPE = "auto"  # this step's DTYPE ("auto": bf16 on CUDA, fp32 on CPU); CLIP_benchmark's amp follows it
BATCH = 64  # images per batch, both paths
NUM_WORKERS = None  # image-decoding workers, both paths (None: the step's default)
GEN_CLASSES = 10  # int >= 1: the generative scorer's classes
GEN_IMAGES = 4  # int >= 1: its images
CONFIG = common.configure(globals())


def make_inputs(work):
    """The ImageFolder (N_CLASSES folders, N_IMAGES images), the class names and templates, the saved model."""
    import numpy as np
    import open_clip
    import torch
    from PIL import Image

    from lgip.classification.datasets import clip_benchmark_templates

    import clip_benchmark.datasets as cbd

    with open(os.path.join(os.path.dirname(cbd.__file__), "en_classnames.json")) as f:
        classes = json.load(f)["imagenet1k"][:N_CLASSES]
    templates = clip_benchmark_templates()["imagenet1k"][:N_TEMPLATES]
    root = os.path.join(work, "images")
    rng = np.random.default_rng(0)
    for c in range(N_CLASSES):
        os.makedirs(os.path.join(root, f"c{c:04d}"))
    for i in range(N_IMAGES):
        pixels = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(root, f"c{i % N_CLASSES:04d}", f"{i:05d}.png"))
    torch.manual_seed(0)
    weights = os.path.join(work, "bench_weights.pt")
    torch.save(open_clip.create_model(ARCH).state_dict(), weights)
    return root, classes, templates, weights


def clip_benchmark_pass(root, classes, templates, weights):
    """CLIP_benchmark's zero_shot_classifier + run_classification: (seconds without loading, predictions)."""
    import open_clip
    import torch
    from clip_benchmark.metrics.zeroshot_classification import run_classification, zero_shot_classifier
    from torchvision.datasets import ImageFolder

    t0 = time.perf_counter()
    model, _, preprocess = open_clip.create_model_and_transforms(ARCH, pretrained=weights, device=DEVICE)
    model.eval()
    load = time.perf_counter() - t0
    workers = common.default_num_workers() if NUM_WORKERS is None else NUM_WORKERS
    loader = torch.utils.data.DataLoader(
        ImageFolder(root, transform=preprocess, allow_empty=True), batch_size=BATCH, num_workers=workers
    )
    amp = str(DEVICE).startswith("cuda") and DTYPE != "fp32"
    t0 = time.perf_counter()
    classifier = zero_shot_classifier(model, open_clip.get_tokenizer(ARCH), classes, templates, DEVICE, amp=amp)
    logits, _ = run_classification(model, classifier, loader, DEVICE, amp=amp)
    return time.perf_counter() - t0, load, logits.argmax(1).tolist()


def step_pass(work, root, templates, weights, cache, **extra):
    """run_lgip_classification.run: (seconds without loading, loading seconds, predictions, its row)."""
    import run_lgip_classification

    spec = {"name": "bench", "type": "openclip", "model_name": ARCH, "pretrained": weights}
    names = os.path.join(work, "classnames.txt")
    data = [
        {"name": "bench", "source": "folder", "role": "id", "root": root, "templates": templates, "classnames": names}
    ]
    t0 = time.perf_counter()
    rows = run_lgip_classification.run(
        DATASETS=data,
        MODELS=[spec],
        BOOTSTRAP=0,
        DEVICE=DEVICE,
        DTYPE=DTYPE,
        IMAGE_BATCH_SIZE=BATCH,
        NUM_WORKERS=NUM_WORKERS,
        CACHE_DIR=cache,
        OUTPUT_DIR=os.path.join(work, "out"),
        VERBOSE=False,
        **extra,
    )
    wall = time.perf_counter() - t0
    load = rows[0]["run"]["seconds_by_phase"]["load"]
    with open(os.path.join(work, "out", "lgip__LGIP_classification_bench.jsonl"), encoding="utf-8") as f:
        preds = [json.loads(x)["pred"] for x in f]
    return wall - load, load, preds, rows[0]


def generative_pass(work, llava, off):
    """The tiny LLaVA over GEN_IMAGES images x GEN_CLASSES classes, no cache: (classes per second, seconds)."""
    import run_lgip_classification

    root = os.path.join(work, "gen_images")
    data = [{"name": "gen", "source": "folder", "role": "id", "root": root, "templates": ["a {c}."]}]
    rows = run_lgip_classification.run(
        DATASETS=data,
        MODELS=[{"name": "llava", "type": "generative", "model_id": llava}],
        BOOTSTRAP=0,
        DEVICE=DEVICE,
        CACHE_DIR=None,
        OUTPUT_DIR=os.path.join(work, "gen_out"),
        ACCELERATIONS_OFF=off,
        VERBOSE=False,
    )
    seconds = rows[0]["run"]["seconds_by_phase"]["pair_scores"]
    return GEN_IMAGES * GEN_CLASSES / seconds, seconds


def make_generative(work, classes):
    import numpy as np
    from PIL import Image

    from tiny_vlm import tiny_llava

    root = os.path.join(work, "gen_images")
    rng = np.random.default_rng(1)
    for c in range(GEN_CLASSES):
        os.makedirs(os.path.join(root, classes[c].replace(" ", "_").replace("/", "_")))
    for i in range(GEN_IMAGES):
        folder = os.path.join(root, sorted(os.listdir(root))[i % GEN_CLASSES])
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(os.path.join(folder, f"{i}.png"))
    return str(tiny_llava(os.path.join(work, "llava")))


def main():
    with tempfile.TemporaryDirectory() as work:
        root, classes, templates, weights = make_inputs(work)
        with open(os.path.join(work, "classnames.txt"), "w", encoding="utf-8") as f:
            f.writelines(c + "\n" for c in classes)
        print(
            f"{ARCH} (random init), {N_IMAGES} images, {N_CLASSES} classes x {N_TEMPLATES} templates "
            f"({N_CLASSES * N_TEMPLATES:,} prompts), device {DEVICE}, batch {BATCH}"
        )
        cb, cb_load, cb_pred = clip_benchmark_pass(root, classes, templates, weights)
        cache = os.path.join(work, "cache")
        ours, load, pred, row = step_pass(work, root, templates, weights, cache)
        again, load2, pred2, row2 = step_pass(work, root, templates, weights, cache)
        same = sum(a == b for a, b in zip(cb_pred, pred))
        print(
            f"CLIP_benchmark zero_shot_classifier + run_classification: {cb:.2f} s, {N_IMAGES / cb:.2f} images/s "
            f"(loading {cb_load:.2f} s apart)"
        )
        print(
            f"run_lgip_classification, cold cache: {ours:.2f} s, {N_IMAGES / ours:.2f} images/s "
            f"(loading {load:.2f} s apart; {row['run']['texts']['encoded']:,} prompts encoded)"
        )
        print(
            f"run_lgip_classification, re-run: {again:.2f} s, {N_IMAGES / again:.2f} images/s (weights loaded: "
            f"{row2['run']['model'].get('weights_loaded', True)}; resumed {row2['run']['cache']['resumed']})"
        )
        print(
            f"ratio (CLIP_benchmark time / this step's): cold {cb / ours:.2f}x, re-run {cb / again:.2f}x; "
            f"the same prediction on {same} of {N_IMAGES} images (acc1 {row['datasets']['bench']['acc1']:.4f})"
        )
        llava = make_generative(work, classes)
        on, s_on = generative_pass(work, llava, [])
        off, s_off = generative_pass(work, llava, ["PREFIX_REUSE"])
        print(
            f"generative (tiny LLaVA), {GEN_IMAGES} images x {GEN_CLASSES} classes: PREFIX_REUSE on {on:.1f} "
            f"classes/s ({s_on:.2f} s), off {off:.1f} classes/s ({s_off:.2f} s): {on / off:.2f}x"
        )


if __name__ == "__main__":
    main()
