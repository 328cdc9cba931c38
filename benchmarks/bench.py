"""bench: the project's evaluation against a loop that encodes the way the published code does.

On the same records and the same model (loaded once; load time is reported, never counted in
either path): the project path is common.ModelRun + the pair building and scoring of
run_lgip_multi.evaluate (images encoded beside the texts, so a pass has one time); the
published-style path opens and encodes one image per forward pass, the 5 originals in one text
call, then per caption the paraphrases in one call and the flips in one call (open_clip:
tokenizer padded to the full context, 77; SigLIP: padding=True per call), fp32, appending
|base - para| and base - flip to Python lists. Prints both times, their ratio, images/s,
texts/s and the metrics of both paths with their largest difference; then the project path
with CACHE_DIR set, cold then warm; with SCALE_IMAGES, the project path alone on that many more
records, as a user runs it (cache on), whose rates the projection uses: the architectures'
at-scale passes run after all comparisons, back to back, as one run_lgip_multi.py process's
sequence of models (a later model reuses the token table and the remembered pixels of earlier
ones, and gets what the LOOKAHEAD did for it, as in the nine-model run). On a GPU it measures
the same for each architecture of the nine published models (random init, same cost as trained
weights) and projects the time of the 40,000-image job. Records: N_IMAGES synthetic 640x480
JPEGs, captions of demo/lgip_demo.jsonl cycled (made unique per record), perturbed by
diff_gen_caption.py.
  python benchmarks/bench.py                                        # CPU: MODEL only (targets in BENCHMARKS.md)
  python benchmarks/bench.py --ARCHS="['ViT-B-16', 'siglip-base-patch16-224']" --N_IMAGES=4
  python benchmarks/bench.py --N_IMAGES=256 --SCALE_IMAGES=3072     # GPU: the 8 architectures (BENCHMARKS.md)
  python benchmarks/bench.py --N_IMAGES=128 --SCALE_IMAGES=3072 --LOOKAHEAD=False   # the sequence without the lookahead
"""

import contextlib
import copy
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project root
sys.path.insert(1, _ROOT)  # common and lgip, when run as python benchmarks/<script>.py
import common  # noqa: E402
from lgip import accelerations  # noqa: E402

N_IMAGES = 32  # int >= 1: synthetic COCO-sized (640x480) JPEG images, one record each
MODEL = {
    "name": "bench_ViT-B-16",
    "type": "openclip",
    "model_name": "ViT-B-16",
    "pretrained": None,
}  # model spec (as in MODELS of run_lgip_multi) of the main comparison and the cache test;
#   pretrained None = random init
PROTOCOL = "corrected"  # "corrected" or "reference": the project's text protocol (the published-style loop always
#   encodes as the published code); identical for random-init open_clip, for SigLIP only "reference" gives comparable
#   metrics
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
DTYPE = "auto"  # project path: "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "bf16", "fp16"
PUBLISHED_DTYPE = "fp32"  # published-style path: "fp32" (as the published code) or "same" (the project's DTYPE)
IMAGE_BATCH_SIZE = 64  # int: project path, images per forward pass
TEXT_BATCH_SIZE = "auto"  # int, or "auto" (2048 on CUDA, 64 on CPU): project path, texts per forward pass
NUM_WORKERS = None  # int: project path, image-decoding worker processes; None = from the CPU count
ARCHS = "auto"  # "auto" (on GPU the 8 architectures of the nine published models, on CPU none: MODEL only), or a list
#   of: ViT-B-16, ViT-L-14, ViT-H-14, EVA02-L-14 (or any open_clip model name), siglip-base-patch16-224,
#   siglip-base-patch16-384, siglip-large-patch16-384, siglip2-base-patch16-224 (all random init), or model spec dicts
REPEATS = 1  # int >= 1: timed runs of each path (alternating); the fastest is reported
SCALE_IMAGES = 0  # int >= 0: also run the project path alone, as a user's run (cache on, cold), on this many more
#   records, and project from its rates; 0 = project from the N_IMAGES run
METRIC_TOL = 1e-4  # float: largest allowed |project - published| of a metric when both paths are fp32 and encode alike
WORK_DIR = (
    None  # scratch folder for images, JSONL, cache, random-init SigLIP folders; None = a temp dir removed at the end
)
RESULTS_JSON = "auto"  # results file, rewritten after every model ("complete": true at the end); "auto" =
#   bench_results.json beside bench.py; None = not written
SEED = 0  # int: seed of the synthetic images and of the random-init weights
PREFIX_PACKS = True  # True, or False: CLIP-family texts in exact-length batches instead of prefix packs (to measure
#   what the packs buy on a device)
LOOKAHEAD = True  # True, or False: the at-scale sequence without common.Lookahead (each model tokenizes and decodes for
#   itself, as before 2026-11-23 11:00 UTC)
AND_WITHOUT_LOOKAHEAD = False  # True, or False: with LOOKAHEAD, the at-scale sequence again without it in the same
#   process, after it (rows "scale" and "scale_no_lookahead"; the projection from the first)
PROFILE = None  # None, a model name of the at-scale sequence (e.g. "bench_ViT-B-16", "siglip-large-patch16-384"), or
#   "all": its at-scale pass runs under torch.profiler, which prints and saves (row "scale" -> "profile") how long the
#   device was busy against the pass's wall time, and the top operations; the profiler's own overhead is then in that
#   pass's time
STACKS = None  # None, or a model name of the at-scale sequence: during its pass a thread samples where every thread of
#   the process is (sys._current_frames, every STACK_INTERVAL_S) and how late the sampler itself wakes (a GIL or CPU
#   held elsewhere): row "scale" -> "stacks"
STACK_INTERVAL_S = 0.005  # float > 0: the sampler's period
PROJECT_IMAGES = 40000  # int: images of the real job the projection is for
PROJECT_CAPTIONS = 5  # float: captions per image in the real job (COCO: 5)
PROJECT_PARAPHRASES = 6.0  # float: paraphrases per caption in the real job (diff_gen_caption keeps up to 6)
PROJECT_FLIPS = 1.5  # float: flips per caption in the real job (assumed about 1.5 for COCO captions)
CONFIG = common.configure(globals())
if not PREFIX_PACKS:
    accelerations.switch_off(["PREFIX_PACKS"])

DEMO_JSONL = os.path.join(_ROOT, "demo", "lgip_demo.jsonl")
SIGLIP_TOKENIZER = os.path.join(
    _ROOT, "tests", "fixtures", "models", "siglip-tiny"
)  # sentencepiece ids only; texts padded/truncated to 64
_OPENCLIP_ARCHS = ["ViT-B-16", "ViT-L-14", "ViT-H-14", "EVA02-L-14"]
# google/siglip*-patch16-* config.json sizes (text and vision towers alike): width, MLP, heads, layers, vocab,
# image size.
_SIGLIP_ARCHS = {
    "siglip-base-patch16-224": dict(width=768, mlp=3072, heads=12, layers=12, vocab=32000, image=224),
    "siglip-base-patch16-384": dict(width=768, mlp=3072, heads=12, layers=12, vocab=32000, image=384),
    "siglip-large-patch16-384": dict(width=1024, mlp=4096, heads=16, layers=24, vocab=32000, image=384),
    "siglip2-base-patch16-224": dict(width=768, mlp=3072, heads=12, layers=12, vocab=256000, image=224),
}
ARCH_NAMES = _OPENCLIP_ARCHS + list(_SIGLIP_ARCHS)
_SHAPE_COLORS = [
    (200, 30, 30),
    (30, 60, 200),
    (40, 160, 60),
    (230, 200, 40),
    (20, 20, 20),
    (240, 240, 240),
    (120, 80, 40),
    (128, 128, 128),
    (240, 140, 20),
    (240, 150, 180),
    (120, 40, 160),
]


# --- inputs ------------------------------------------------------------------------------------


def make_images(folder, n, seed):
    """n COCO-sized JPEGs (640x480, quality 90): gradient, shapes, texture; different per image.
    Made in parallel, in slices of 256 images, each slice seeded from (seed, slice)."""
    import multiprocessing

    os.makedirs(folder, exist_ok=True)
    jobs = [(folder, k, min(k + 256, n), seed) for k in range(0, n, 256)]
    if len(jobs) == 1:
        return _make_image_slice(*jobs[0])
    with multiprocessing.get_context("fork").Pool(min(len(jobs), os.cpu_count() or 1)) as pool:
        return [name for names in pool.starmap(_make_image_slice, jobs) for name in names]


def _make_image_slice(folder, start, stop, seed):
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed if start == 0 else [seed, start // 256])
    names = []
    for k in range(start, stop):
        a, b = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
        t = np.linspace(0.0, 1.0, 640)[None, :, None] if k % 2 else np.linspace(0.0, 1.0, 480)[:, None, None]
        pixels = np.broadcast_to(a * (1 - t) + b * t, (480, 640, 3)) + rng.normal(0, 14, (480, 640, 3))
        img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(img)
        for _ in range(int(rng.integers(3, 9))):
            x0, y0 = int(rng.integers(0, 560)), int(rng.integers(0, 400))
            box = [x0, y0, x0 + int(rng.integers(30, 260)), y0 + int(rng.integers(30, 220))]
            color = _SHAPE_COLORS[int(rng.integers(len(_SHAPE_COLORS)))]
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=color)
        name = f"{k + 1:012d}.jpg"
        img.save(os.path.join(folder, name), quality=90)
        names.append(name)
    return names


def unique_caption(c, r, n):
    """Cycle r of a demo caption; r > 0 starts it with a number of its own (n: the caption's
    index over all records), so no text repeats across records (COCO captions do not), which
    would let the text dedup skip work, and no repeat shares its start with the original,
    which would let prefix sharing skip work COCO would need: on the 32 records 41% of the
    token positions are shared prefixes, as on the 12 demo records alone (real captions);
    a marker at the end ("... in photo 3") gave 57%."""
    return c if r == 0 else f"{n + 1} {c}"


def make_records(work, n, seed, placeholder_images=False):
    """Images, base JSONL, and its perturbation by diff_gen_caption.py; returns the perturbed path.
    placeholder_images: one-byte files instead of JPEGs, for passes that never decode them."""
    if placeholder_images:
        names = [f"{k + 1:012d}.jpg" for k in range(n)]
        os.makedirs(os.path.join(work, "images"), exist_ok=True)
        for name in names:
            with open(os.path.join(work, "images", name), "wb") as f:
                f.write(b"\xff")
    else:
        names = make_images(os.path.join(work, "images"), n, seed)
    demo = [rec for _, rec in common.iter_records(DEMO_JSONL)]
    base = os.path.join(work, "bench_base.jsonl")
    with common.atomic_open(base) as f:
        for k, name in enumerate(names):
            caps = [
                unique_caption(c, k // len(demo), 5 * k + i) for i, c in enumerate(demo[k % len(demo)]["orig_captions"])
            ]
            f.write(common.dump_jsonl_line({"image_id": k + 1, "image_path": f"images/{name}", "orig_captions": caps}))
    proc = subprocess.run(
        [sys.executable, os.path.join(_ROOT, "diff_gen_caption.py"), f"--INPUT_JSONL={base}"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"diff_gen_caption.py failed:\n{proc.stdout}\n{proc.stderr}")
    return common.default_output(base, "_with_perturb.jsonl")


def text_counts(records):
    caps = sum(len(rec["orig_captions"]) for _, rec in records)
    paras = sum(
        len(common.caption_texts(rec, "same_caps", i)) for _, rec in records for i in range(len(rec["orig_captions"]))
    )
    flips = sum(
        len(common.caption_texts(rec, "diff_caps", i)) for _, rec in records for i in range(len(rec["orig_captions"]))
    )
    calls = sum(
        1
        + sum(
            bool(common.caption_texts(rec, f, i))
            for i in range(len(rec["orig_captions"]))
            for f in ("same_caps", "diff_caps")
        )
        for _, rec in records
    )
    return {
        "images": len(records),
        "captions": caps,
        "paraphrases": paras,
        "flips": flips,
        "texts": caps + paras + flips,
        "text_calls_published": calls,
        "captions_per_image": caps / len(records),
        "paraphrases_per_caption": paras / caps,
        "flips_per_caption": flips / caps,
        "texts_per_image": (caps + paras + flips) / len(records),
    }


# --- models ------------------------------------------------------------------------------------


def make_siglip_folder(arch, folder, seed):
    """A random-init SigLIP of the published checkpoint's sizes, saved with a processor, so the
    project's own loader (lgip.models.dual_encoders.load_transformers) reads it; token ids from the
    fixture's tokenizer."""
    import torch
    from transformers import AutoModel, SiglipConfig, SiglipImageProcessor, SiglipProcessor, SiglipTokenizer

    a = _SIGLIP_ARCHS[arch]
    tower = dict(
        hidden_size=a["width"],
        intermediate_size=a["mlp"],
        num_attention_heads=a["heads"],
        num_hidden_layers=a["layers"],
    )
    config = SiglipConfig(
        text_config=dict(tower, vocab_size=a["vocab"], max_position_embeddings=common.SIGLIP_TEXT_LENGTH),
        vision_config=dict(tower, image_size=a["image"], patch_size=16),
    )
    torch.manual_seed(seed)
    AutoModel.from_config(config).save_pretrained(folder)
    tokenizer = SiglipTokenizer.from_pretrained(SIGLIP_TOKENIZER, model_max_length=common.SIGLIP_TEXT_LENGTH)
    image_processor = SiglipImageProcessor(
        size={"height": a["image"], "width": a["image"]}, resample=3, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    SiglipProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder


def arch_spec(arch, work):
    """(model spec, scratch folder or None) of one ARCHS entry."""
    if isinstance(arch, dict):
        return arch, None
    if arch in _SIGLIP_ARCHS:
        folder = make_siglip_folder(arch, os.path.join(work, "models", arch), SEED)
        return {"name": f"bench_{arch}", "type": "siglip", "model_id": folder}, folder
    return {"name": f"bench_{arch}", "type": "openclip", "model_name": arch, "pretrained": None}, None


def arch_key(spec):
    """The ARCH_NAMES entry a spec is a random-init instance of, else None."""
    style = PUBLISHED_STYLE.get(spec.get("type"))
    return style.arch_key(spec) if style is not None else None


def published_arch(spec):
    return PUBLISHED_STYLE[spec["type"]].arch(spec)


def load(spec):
    """The project's Encoder for spec, and the published-style encoder on the same weights."""
    import torch

    torch.manual_seed(SEED)
    enc = common.load_model(spec, PROTOCOL, DEVICE, DTYPE)
    pub_dtype = enc.dtype if PUBLISHED_DTYPE == "same" else torch.float32
    model = enc.model if enc.dtype == pub_dtype else copy.deepcopy(enc.model).to(dtype=pub_dtype)
    return enc, PUBLISHED_STYLE[spec["type"]](spec, model, enc)


class _Published:
    """Encodes as the published scripts do: one PIL image per call; texts per call (each style its padding)."""

    any_protocol = False  # (its texts are the project's whatever PROTOCOL: a metric comparison holds)

    def __init__(self, spec, model, enc):
        import torch

        self.model, self.device, self.dtype = model, enc.device, next(model.parameters()).dtype
        self.no_grad = torch.no_grad

    def image(self, path):
        from PIL import Image

        with self.no_grad():
            x = self._image(Image.open(path).convert("RGB"))
        return x / x.norm(dim=-1, keepdim=True)

    def texts(self, texts):
        with self.no_grad():
            x = self._texts(texts)
        return x / x.norm(dim=-1, keepdim=True)


class PublishedOpenClip(_Published):
    """The published open_clip calls: create_model_and_transforms' preprocess, texts padded to the context."""

    any_protocol = True

    def __init__(self, spec, model, enc):
        import open_clip

        super().__init__(spec, model, enc)
        self.preprocess = enc.image_transform  # create_model_and_transforms' preprocess
        self.tokenizer = open_clip.get_tokenizer(spec["model_name"])

    def _image(self, img):
        return self.model.encode_image(self.preprocess(img).unsqueeze(0).to(self.device, self.dtype))

    def _texts(self, texts):
        return self.model.encode_text(self.tokenizer(texts).to(self.device))

    @staticmethod
    def arch_key(spec):
        ok = spec.get("pretrained") is None and spec.get("model_name") in _OPENCLIP_ARCHS
        return spec["model_name"] if ok else None

    @staticmethod
    def arch(spec):
        return spec["model_name"]


class PublishedSiglip(_Published):
    """The published transformers calls: the processor's pixels, texts padded to the call's longest."""

    def __init__(self, spec, model, enc):
        from transformers import AutoProcessor

        super().__init__(spec, model, enc)
        self.processor = AutoProcessor.from_pretrained(spec["model_id"])

    def _image(self, img):
        inputs = self.processor(images=img, return_tensors="pt")
        return _features(self.model.get_image_features(pixel_values=inputs["pixel_values"].to(self.device, self.dtype)))

    def _texts(self, texts):
        inputs = self.processor.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        return _features(self.model.get_text_features(input_ids=inputs["input_ids"].to(self.device)))

    @staticmethod
    def arch_key(spec):
        name = os.path.basename(str(spec.get("model_id", "")).rstrip("/"))
        return name if name in _SIGLIP_ARCHS else None

    @staticmethod
    def arch(spec):
        return spec["model_id"].split("/")[-1]


# the published scripts' way of encoding, by the spec types they used (the two of PUBLISHED_MODELS)
PUBLISHED_STYLE = {"openclip": PublishedOpenClip, "siglip": PublishedSiglip}


class CpuShare:
    """Share of the machine's CPU time used by other processes (and VM steal) while in the block,
    from /proc/stat and os.times(); None where /proc/stat is missing. Others' load slows the
    published-style loop (many small, thread-synchronised calls) far more than the project path."""

    def __enter__(self):
        self.start = self._sample()
        return self

    def __exit__(self, *exc):
        end = self._sample()
        self.others = None
        if self.start and end:
            (busy0, own0, wall0), (busy1, own1, wall1) = self.start, end
            hz, cpus = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
            self.others = max(0.0, ((busy1 - busy0) / hz - (own1 - own0)) / max((wall1 - wall0) * cpus, 1e-9))

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # all but idle and iowait
        t = os.times()
        return busy, t.user + t.system + t.children_user + t.children_system, time.perf_counter()


def _features(out):
    return getattr(out, "pooler_output", out)  # transformers 5: a ModelOutput; 4.x: a tensor


# --- the two paths ------------------------------------------------------------------------------


def sync(device):
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def metrics_of(inv_errors, gaps):
    import numpy as np

    inv_errors, gaps = np.asarray(inv_errors, dtype=np.float64), np.asarray(gaps, dtype=np.float64)
    return {
        "num_invariance_pairs": len(inv_errors),
        "num_sensitivity_pairs": len(gaps),
        "invariance_error_mean": common.mean_or_none(inv_errors),
        "sensitivity_gap_mean": common.mean_or_none(gaps),
        "sensitivity_pos_rate": common.mean_or_none(gaps > 0),
    }


def project_pass(enc, spec, records, config, fresh=True, lookahead=None):
    """ModelRun + run_lgip_multi.evaluate, as run_lgip_multi.py runs a model (its pairs,
    scoring, confidence intervals and score file, written into the records' folder): images are
    encoded beside the texts, so the pass has one time (total_s). fresh: tokenize and decode
    everything, as a fresh process's first model does (else: as a later model of one run, see
    at_scale_sequence)."""
    import run_lgip_multi

    if fresh:
        common.forget_token_tables()
        common.forget_pixels()
    run_lgip_multi.JSONL_PATH = config["JSONL_PATH"]  # its score file goes beside the records
    with common.Timer() as t:
        run = common.ModelRun(spec, records, config, enc=enc, lookahead=lookahead)
        m = run_lgip_multi.evaluate(run)
        run.finished()
        sync(enc.device)
    out = {
        "total_s": t.seconds,
        "unique_texts_encoded": run.scored.texts["encoded"],
        "seconds_by_phase": run.seconds,
        "image_sources": run.scored.image_sources,
        "lookahead": run.ahead,
        "metrics": {
            k: m[k]
            for k in (
                "num_invariance_pairs",
                "num_sensitivity_pairs",
                "invariance_error_mean",
                "sensitivity_gap_mean",
                "sensitivity_pos_rate",
            )
        },
    }
    if run.cache is not None:
        out["cache"] = dict(run.cache.stats)
    return out


def one_pass(script, spec, enc, records, config):
    """An evaluation script's evaluate(run) on a fresh process's state (bench_retrieval, bench_images):
    (metrics, seconds, seconds by phase)."""
    common.forget_token_tables()
    common.forget_pixels()
    with common.Timer() as t:
        run = common.ModelRun(spec, records, config, enc=enc)
        m = script.evaluate(run)
        run.finished()
    return m, t.seconds, run.seconds


def at_scale_sequence(runs, scale, lookahead=True, key="scale"):
    """The project path alone on the at-scale records, cache on and cold, as one
    run_lgip_multi.py process runs its MODELS: `runs` [(row, spec, enc)] one after another, each
    finding what the earlier ones left (token table, prefix plan, remembered pixels) and, with
    `lookahead`, what common.Lookahead tokenized and decoded for it while they ran. The models are
    loaded beforehand (compare), so no load gives the lookahead free time: loads are counted
    apart, once per model (projection). Sets row[key] (and with key "scale", row["speedup_at_scale"]);
    yields each row when done. Each row's entry has the pass's start and end and, with a lookahead,
    the jobs' (seconds from the sequence's start: which work ran beside which pass)."""
    s_records, s_jsonl, s_work, s_counts = scale
    cache_dir = os.path.join(s_work, "cache")
    shutil.rmtree(cache_dir, ignore_errors=True)
    config = eval_config(s_jsonl, s_work, cache_dir)
    saved = common.swap_process_state()  # a fresh process
    ahead = (
        common.Lookahead([spec for _, spec, _ in runs[1:]], PROTOCOL, config["NUM_WORKERS"], "auto")
        if lookahead
        else None
    )
    t_start = time.perf_counter()
    try:
        for row, spec, enc in runs:
            t0 = time.perf_counter() - t_start
            with (
                profiled(PROFILE in ("all", row["name"]), enc.device) as prof,
                sampled(STACKS == row["name"]) as stacks,
            ):
                res = project_pass(enc, spec, s_records, config, fresh=False, lookahead=ahead)
            if prof:
                res["profile"] = profile_summary(prof, res["total_s"])
            if stacks is not None:
                res["stacks"] = stacks
            res["pass_s"] = [round(t0, 3), round(time.perf_counter() - t_start, 3)]
            if ahead is not None:
                res["ahead_jobs_s"] = [
                    [
                        j["model"],
                        j["kind"],
                        j["state"],
                        round(j.get("t0", t_start) - t_start, 3),
                        round(j.get("t1", time.perf_counter()) - t_start, 3),
                    ]
                    for j in list(ahead.jobs)
                    if "t0" in j
                ]
            row[key] = dict(rates(res, s_counts), images=s_counts["images"], texts=s_counts["texts"])
            if key == "scale":
                row["speedup_at_scale"] = row["published"]["s_per_record"] / row["scale"]["s_per_record"]
            yield row
    finally:
        if ahead is not None:
            ahead.close()
        common.swap_process_state(saved)
        shutil.rmtree(cache_dir, ignore_errors=True)


@contextlib.contextmanager
def sampled(on):
    """Where the process's threads are during the block, when `on`: a thread wakes every STACK_INTERVAL_S
    and notes each thread's innermost frames of this project or torch (file:line function); yields a dict
    filled at the end: {samples, late_ms: percentiles of how late the sampler woke (another thread holding
    the GIL, or the CPU), threads: {thread name: [[where, share of samples], ...]}}."""
    if not on:
        yield None
        return
    import collections
    import threading

    out, stop, counts, late = {}, threading.Event(), collections.defaultdict(collections.Counter), []
    names = {}

    def where(frame):
        parts = []
        while frame is not None and len(parts) < 3:
            f = frame.f_code.co_filename
            if (
                "/lgip/" in f
                or "/torch/" in f
                or "/benchmarks/" in f
                or "concurrent" in f
                or "multiprocessing" in f
                or "threading" in f
                or "queue" in f
            ):
                parts.append(f"{os.path.basename(f)}:{frame.f_lineno} {frame.f_code.co_name}")
            frame = frame.f_back
        return " < ".join(parts) or "(elsewhere)"

    def sample():
        me = threading.get_ident()
        nxt = time.perf_counter()
        while not stop.is_set():
            nxt += STACK_INTERVAL_S
            time.sleep(max(0.0, nxt - time.perf_counter()))
            late.append(max(0.0, time.perf_counter() - nxt))
            for t in threading.enumerate():
                names[t.ident] = t.name
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    counts[names.get(ident, str(ident))][where(frame)] += 1
            nxt = max(nxt, time.perf_counter())

    thread = threading.Thread(target=sample, name="bench-sampler", daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()
        import numpy as np

        n = max(1, len(late))
        out.update(
            samples=len(late),
            interval_ms=STACK_INTERVAL_S * 1e3,
            late_ms={q: round(float(np.percentile(np.array(late or [0.0]) * 1e3, q)), 2) for q in (50, 90, 99)},
            late_total_s=round(sum(late), 3),
            threads={name: [[w, round(c / n, 3)] for w, c in ctr.most_common(8)] for name, ctr in counts.items()},
        )


@contextlib.contextmanager
def profiled(on, device):
    """torch.profiler over the block when `on` (CPU operations, and the GPU's kernels on CUDA), else None."""
    if not on:
        yield None
        return
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if str(device).startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        yield prof


def profile_summary(prof, wall_s, top=12):
    """{device_busy_s: the union of the device's kernel times (None on the CPU), device_busy_share
    of the pass's wall time, top: the operations with the most time (device time on a GPU, own
    CPU time else) as [name, ms, calls]}: where a pass's time goes, and how long the GPU idled."""
    import torch

    events = prof.events()
    spans = sorted(
        (e.time_range.start, e.time_range.end) for e in events if e.device_type == torch.autograd.DeviceType.CUDA
    )
    busy, end = 0.0, float("-inf")
    for start, stop in spans:  # union of the intervals (us)
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    on_gpu = bool(spans)
    key = "device_time_total" if on_gpu else "self_cpu_time_total"
    ops = sorted(
        prof.key_averages(), key=lambda a: getattr(a, key, 0) or getattr(a, "cuda_time_total", 0), reverse=True
    )
    return {
        "device_busy_s": round(busy / 1e6, 3) if on_gpu else None,
        "device_busy_share": round(busy / 1e6 / wall_s, 3) if on_gpu and wall_s > 0 else None,
        "top": [
            [a.key, round((getattr(a, key, 0) or getattr(a, "cuda_time_total", 0)) / 1e3, 2), a.count]
            for a in ops[:top]
        ],
    }


def published_pass(pub, records, image_root):
    """The published loop: per record one image, the originals, then per caption paraphrases and flips."""
    inv_errors, gaps = [], []
    image_s = text_s = 0.0
    for _, rec in records:
        t0 = time.perf_counter()
        v = pub.image(os.path.join(image_root, rec["image_path"]))
        sync(pub.device)
        t1 = time.perf_counter()
        caps = rec["orig_captions"]
        base = (v @ pub.texts(caps).T)[0].tolist()
        for i in range(len(caps)):
            paras = common.caption_texts(rec, "same_caps", i)
            if paras:
                inv_errors.extend(abs(base[i] - s) for s in (v @ pub.texts(paras).T)[0].tolist())
            flips = common.caption_texts(rec, "diff_caps", i)
            if flips:
                gaps.extend(base[i] - s for s in (v @ pub.texts(flips).T)[0].tolist())
        t2 = time.perf_counter()
        image_s, text_s = image_s + t1 - t0, text_s + t2 - t1
    return {"total_s": image_s + text_s, "image_s": image_s, "text_s": text_s, "metrics": metrics_of(inv_errors, gaps)}


def eval_config(jsonl, work, cache_dir=None):
    return {
        "JSONL_PATH": jsonl,
        "IMAGE_ROOT": work,
        "PROTOCOL": PROTOCOL,
        "DEVICE": DEVICE,
        "DTYPE": DTYPE,
        "IMAGE_BATCH_SIZE": IMAGE_BATCH_SIZE,
        "TEXT_BATCH_SIZE": TEXT_BATCH_SIZE,
        "NUM_WORKERS": NUM_WORKERS,
        "CACHE_DIR": cache_dir,
    }


def rates(res, counts):
    """Throughput of a pass over the whole job: images/s and texts/s both count the pass's total
    time (the project encodes images beside texts, so its time does not split)."""
    total = res["total_s"]
    return dict(
        res,
        images_per_s=counts["images"] / max(total, 1e-12),
        texts_per_s=counts["texts"] / max(total, 1e-12),
        records=counts["images"],
        s_per_record=total / counts["images"],
        texts_per_record=counts["texts"] / counts["images"],
    )


def compare(spec, records, jsonl, work, counts, cache_test=False, keep=False):
    """Both paths on one model: (row of times (fastest of REPEATS), metrics, their largest
    difference; the project's Encoder when `keep`, for at_scale_sequence, else None)."""
    import torch

    with common.Timer() as t_load:
        enc, pub = load(spec)
    print(
        f"{spec['name']}: loaded in {t_load.seconds:.1f} s ({enc.device}, project {str(enc.dtype)[6:]}, "
        f"published-style {str(pub.dtype)[6:]}, torch threads {torch.get_num_threads()}, pixel arithmetic on the "
        f"device, bit-identical: {enc.pixels is not None}, text prefix packs: "
        f"{enc.encode_packs is not None and accelerations.PREFIX_PACKS})",
        flush=True,
    )
    config = eval_config(jsonl, work)
    # Untimed warm-ups: first-call allocations and kernel choices, once per shape. The project
    # meets a shape per text length, so it warms up on all records; its cost is kept (first_pass_s).
    first = project_pass(enc, spec, records, config)
    published_pass(pub, records[:2], work)
    runs = {"project": [], "published": []}
    with CpuShare() as share:
        for _ in range(REPEATS):
            runs["project"].append(project_pass(enc, spec, records, config))
            runs["published"].append(published_pass(pub, records, work))
    best = {k: rates(min(v, key=lambda r: r["total_s"]), counts) for k, v in runs.items()}
    a, b = best["project"]["metrics"], best["published"]["metrics"]
    keys = ("invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate")
    diff = max(abs(a[k] - b[k]) for k in keys if a[k] is not None and b[k] is not None)
    same_counts = all(a[k] == b[k] for k in ("num_invariance_pairs", "num_sensitivity_pairs"))
    comparable = enc.dtype == pub.dtype == torch.float32 and (pub.any_protocol or PROTOCOL == "reference")
    row = {
        "name": spec["name"],
        "spec": spec,
        "arch": arch_key(spec),
        "device": str(enc.device),
        "dtype_project": str(enc.dtype)[6:],
        "dtype_published": str(pub.dtype)[6:],
        "load_s": t_load.seconds,
        "project": best["project"],
        "published": best["published"],
        "all_runs_total_s": {k: [r["total_s"] for r in v] for k, v in runs.items()},
        "speedup": best["published"]["total_s"] / best["project"]["total_s"],
        "cpu_used_by_others": share.others,
        "max_abs_metric_diff": diff,
        "same_pair_counts": same_counts,
        "metrics_comparable": comparable,
        "metrics_agree": (diff <= METRIC_TOL and same_counts) if comparable else None,
        "project_first_pass_s": first["total_s"],
        "pixels_on_device": enc.pixels is not None,
    }
    if cache_test:
        cache_dir = os.path.join(work, "cache")
        shutil.rmtree(cache_dir, ignore_errors=True)
        cold = project_pass(enc, spec, records, eval_config(jsonl, work, cache_dir))
        warm = project_pass(enc, spec, records, eval_config(jsonl, work, cache_dir))
        cold_s, warm_s = cold["total_s"], warm["total_s"]
        row["cache"] = {
            "cold_s": cold_s,
            "warm_s": warm_s,
            "ratio": cold_s / max(warm_s, 1e-12),
            "ratio_with_load": (cold_s + t_load.seconds) / (warm_s + t_load.seconds),
            "warm_hits": warm.get("cache"),
            "warm_texts_encoded": warm["unique_texts_encoded"],
            "same_metrics": warm["metrics"] == cold["metrics"],
        }
    del pub
    if not keep:
        del enc
        enc = None
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row, enc


# --- reporting ---------------------------------------------------------------------------------


def print_comparison(row):
    for path in ("project", "published"):
        r = row[path]
        split = (
            f"images {r['image_s']:.2f} s, then texts {r['text_s']:.2f} s" if "image_s" in r else "images beside texts"
        )
        print(
            f"  {path + ':':11s}{r['total_s']:8.2f} s ({split})  {r['images_per_s']:.2f} images/s  "
            f"{r['texts_per_s']:.1f} texts/s"
        )
    print(f"  speed-up project vs published-style: {row['speedup']:.2f}x")
    a, b = row["project"]["metrics"], row["published"]["metrics"]
    for k in ("invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate"):
        print(f"  {k:22s} project {a[k]:.6f}  published {b[k]:.6f}")
    if row["metrics_comparable"]:
        verdict = "agree" if row["metrics_agree"] else "DISAGREE"
    elif row["dtype_project"] != row["dtype_published"]:
        verdict = f"not compared: project {row['dtype_project']} vs published-style {row['dtype_published']}"
    else:
        verdict = "not compared: corrected SigLIP pads to 64, the published code to each call's longest text"
    if not row["metrics_comparable"]:
        row["metrics_note"] = verdict
    print(
        f"  max abs metric diff: {row['max_abs_metric_diff']:.2e} (tolerance {METRIC_TOL:g}; pair counts "
        f"{'equal' if row['same_pair_counts'] else 'DIFFER'}): {verdict}"
    )
    if row["cpu_used_by_others"] is not None:
        busy = row["cpu_used_by_others"]
        print(
            f"  other processes used {100 * busy:.0f}% of the CPUs during the timed runs"
            + (": timings unreliable, re-run on a quiet machine" if busy > 0.1 else "")
        )
    if "cache" in row:
        c = row["cache"]
        print(f"  cache: first run (cold) {c['cold_s']:.2f} s, re-run (warm) {c['warm_s']:.3f} s")
        print(
            f"  cache speed-up warm vs cold: {c['ratio']:.1f}x (warm hits {c['warm_hits']}, "
            f"texts encoded {c['warm_texts_encoded']}, same metrics: {c['same_metrics']})"
        )
        print(
            f"  (counting the model load of {row['load_s']:.1f} s in both runs, as a fresh script would: "
            f"{c['ratio_with_load']:.1f}x)"
        )


def projection(rows_by_arch, main_row):
    """Projected hours for PROJECT_IMAGES images from measured s/image and s/text."""
    per_image_texts = PROJECT_CAPTIONS * (1 + PROJECT_PARAPHRASES + PROJECT_FLIPS)

    def hours(row, path):
        """Seconds per record of the job, plus once per model its construction. Published-style:
        its image and text parts, the text part scaled to the job's texts per image. Project
        (images beside texts; the at-scale run when there is one): time per record scaled by the
        job's texts per record, plus once its worker processes' start (start_images,
        start_tokenizers) and its first pass's extra cost (kernel choice per new shape)."""
        once = row["load_s"]
        if path == "published":
            r = row["published"]
            per_record = (r["image_s"] + r["text_s"] * per_image_texts / r["texts_per_record"]) / r["records"]
        else:
            r = row.get("scale", row["project"])
            phases = r.get("seconds_by_phase", {})
            start = phases.get("start_images", 0.0) + phases.get(
                "start_tokenizers", 0.0
            )  # forking workers: once per run
            per_record = (r["total_s"] - start) / r["records"] * per_image_texts / r["texts_per_record"]
            once += start + max(0.0, row["project_first_pass_s"] - row["project"]["total_s"])
        return (PROJECT_IMAGES * per_record + once) / 3600

    models = []
    for m in common.PUBLISHED_MODELS:
        row = rows_by_arch.get(published_arch(m))
        models.append(
            {
                "model": m["name"],
                "arch": published_arch(m),
                "project_h": hours(row, "project") if row else None,
                "published_h": hours(row, "published") if row else None,
            }
        )
    done = [m for m in models if m["project_h"] is not None]
    out = {
        "images": PROJECT_IMAGES,
        "texts_per_image": per_image_texts,
        "assumed": {
            "captions_per_image": PROJECT_CAPTIONS,
            "paraphrases_per_caption": PROJECT_PARAPHRASES,
            "flips_per_caption": PROJECT_FLIPS,
        },
        "main_model": {"project_h": hours(main_row, "project"), "published_h": hours(main_row, "published")},
        "models": models,
        "models_measured": len(done),
        "nine_models_project_h": sum(m["project_h"] for m in done) if done else None,
        "nine_models_published_h": sum(m["published_h"] for m in done) if done else None,
    }
    return out


def print_at_scale(row, key="scale"):
    r = row[key]
    print(
        f"{row['name']}: at scale, project alone on {r['images']} images (cache on, cold; model of one run): "
        f"{r['total_s']:.2f} s  {r['images_per_s']:.1f} images/s  {r['texts_per_s']:.0f} texts/s"
    )
    print(f"  phases, s: {r['seconds_by_phase']}; images: {r['image_sources']}; done ahead: {r['lookahead']}")
    print(
        f"  pass from {r['pass_s'][0]} s to {r['pass_s'][1]} s of the sequence; lookahead jobs [model, kind, state, "
        f"from, to]: {r.get('ahead_jobs_s')}"
    )
    if r.get("stacks"):
        st = r["stacks"]
        print(f"  stacks: {st['samples']} samples, sampler late (ms) {st['late_ms']}, {st['late_total_s']} s in all")
        for name, places in st["threads"].items():
            print(f"    {name}: " + "; ".join(f"{share:.0%} {w}" for w, share in places[:5]))
    if r.get("profile"):
        p = r["profile"]
        print(
            f"  profile: device busy {p['device_busy_s']} s ({p['device_busy_share']} of the pass); top: "
            + "; ".join(f"{name} {ms:.1f} ms x{n}" for name, ms, n in p["top"])
        )
    speedup = row["published"]["s_per_record"] / r["s_per_record"]
    print(
        f"  speed-up at scale (per record: published-style {row['published']['s_per_record']:.4f} s, "
        f"project {r['s_per_record']:.4f} s): {speedup:.1f}x",
        flush=True,
    )


def print_tables(rows, proj):
    print("\nper model (fastest of REPEATS; model load excluded)")
    head = (
        f"{'model':34s} {'device':7s} {'project s':>9s} {'publ. s':>9s} {'ratio':>6s} {'proj img/s':>10s} "
        f"{'proj txt/s':>10s} {'publ img/s':>10s} {'publ txt/s':>10s} {'max|diff|':>9s} {'at scale':>8s}"
    )
    print(head + "\n" + "-" * len(head))
    for r in rows:
        p, q = r["project"], r["published"]
        at_scale = f"{r['speedup_at_scale']:7.1f}x" if "scale" in r else f"{'-':>8s}"
        print(
            f"{r['name'][:34]:34s} {r['device'][:7]:7s} {p['total_s']:9.2f} {q['total_s']:9.2f} {r['speedup']:5.2f}x "
            f"{p['images_per_s']:10.2f} {p['texts_per_s']:10.1f} {q['images_per_s']:10.2f} {q['texts_per_s']:10.1f} "
            f"{r['max_abs_metric_diff']:9.1e} {at_scale}"
        )
    a = proj["assumed"]
    print(
        f"\nprojection: {proj['images']} images x {proj['texts_per_image']:g} texts/image "
        f"({a['captions_per_image']:g} captions, {a['paraphrases_per_caption']:g} paraphrases and "
        f"{a['flips_per_caption']:g} flips per caption)"
    )
    m = proj["main_model"]
    print(f"  {rows[0]['name']}: project {m['project_h']:.2f} h, published-style {m['published_h']:.2f} h")
    for r in proj["models"]:
        if r["project_h"] is None:
            print(f"  {r['model']:42s} not measured")
        else:
            print(f"  {r['model']:42s} project {r['project_h']:8.2f} h  published-style {r['published_h']:8.2f} h")
    if proj["models_measured"]:
        what = (
            "nine models"
            if proj["models_measured"] == len(proj["models"])
            else f"the {proj['models_measured']} measured of nine models"
        )
        print(
            f"  total, {what}: project {proj['nine_models_project_h']:.2f} h, "
            f"published-style {proj['nine_models_published_h']:.2f} h"
        )


def machine_info():
    import torch

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "load_average_at_start": list(os.getloadavg()),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def resolve_archs(device):
    if ARCHS == "auto":
        return ARCH_NAMES if device.startswith("cuda") else []
    return list(ARCHS)


@contextlib.contextmanager
def scratch_dir(work_dir, prefix):
    """The WORK_DIR-style folder `work_dir` (created, kept), or a temp dir removed at the end."""
    work = work_dir or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(work, exist_ok=True)
    try:
        yield work
    finally:
        if not work_dir:
            shutil.rmtree(work, ignore_errors=True)


def save_results(rows, proj, info, counts, complete):
    """RESULTS_JSON with the rows so far, rewritten after every model (`complete`: all done), so
    a run cut short (a time limit on a lent GPU) still leaves what it measured."""
    if not RESULTS_JSON:
        return None
    path = (
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_results.json")
        if RESULTS_JSON == "auto"
        else RESULTS_JSON
    )
    meta = common.provenance(__file__, CONFIG)
    meta["versions"] = common.package_versions(
        ("torch", "torchvision", "open_clip_torch", "transformers", "timm", "numpy", "pillow")
    )
    out = dict(
        meta,
        command=" ".join([os.path.basename(sys.executable), *sys.argv]),
        machine=info,
        data=counts,
        complete=complete,
        results=rows,
        projection=proj,
    )
    return common.write_json(path, json.loads(json.dumps(out, default=str)))


def main():
    with scratch_dir(WORK_DIR, "lgip_bench_") as work:
        jsonl = make_records(work, N_IMAGES, SEED)
        records = common.load_records(jsonl, ("same_caps", "diff_caps"))
        counts = text_counts(records)
        info = machine_info()
        print(
            f"{counts['images']} images, {counts['texts']} texts ({counts['captions']} captions, "
            f"{counts['paraphrases']} paraphrases, {counts['flips']} flips; "
            f"{counts['text_calls_published']} published text calls) in {work}"
        )
        print(f"machine: {info}")
        scale = None
        if SCALE_IMAGES:
            s_work = os.path.join(work, "scale")
            s_jsonl = make_records(s_work, SCALE_IMAGES, SEED + 1)
            s_records = common.load_records(s_jsonl, ("same_caps", "diff_caps"))
            scale = (s_records, s_jsonl, s_work, text_counts(s_records))
            print(f"at scale: {len(s_records)} more records, {scale[3]['texts']} texts, in {s_work}")
        main_row, main_enc = compare(MODEL, records, jsonl, work, counts, cache_test=True, keep=bool(scale))
        print_comparison(main_row)
        rows, by_arch, sequence = [main_row], {}, [(main_row, MODEL, main_enc)]
        if main_row["arch"]:
            by_arch[main_row["arch"]] = main_row
        save_results(rows, projection(by_arch, main_row), info, counts, complete=False)
        for arch in resolve_archs(common.resolve_device(DEVICE)):
            if arch == MODEL or (not isinstance(arch, dict) and arch == arch_key(MODEL)):
                print(f"{arch if isinstance(arch, str) else arch['name']}: same model as MODEL, measured above")
                continue
            spec, _ = arch_spec(arch, work)
            row, enc = compare(spec, records, jsonl, work, counts, keep=bool(scale))
            print_comparison(row)
            rows.append(row)
            sequence.append((row, spec, enc))
            if row["arch"]:
                by_arch.setdefault(row["arch"], row)
            save_results(rows, projection(by_arch, main_row), info, counts, complete=False)
        if scale:
            for on, key in (
                ((True, "scale"), (False, "scale_no_lookahead"))
                if LOOKAHEAD and AND_WITHOUT_LOOKAHEAD
                else ((LOOKAHEAD, "scale"),)
            ):
                print(
                    f"\nat scale: the {len(sequence)} models as one run_lgip_multi.py process (lookahead: {on})",
                    flush=True,
                )
                for row in at_scale_sequence(sequence, scale, lookahead=on, key=key):
                    print_at_scale(row, key)
                    save_results(rows, projection(by_arch, main_row), info, counts, complete=False)
        del sequence, main_enc
        info["load_average_at_end"] = list(os.getloadavg())
        proj = projection(by_arch, main_row)
        print_tables(rows, proj)
        path = save_results(rows, proj, info, counts, complete=True)
        if path:
            print(f"-> {path}")
        bad = [r["name"] for r in rows if r["metrics_agree"] is False]
        if bad:
            raise SystemExit(f"error: metrics of the two paths differ by more than {METRIC_TOL:g}: {', '.join(bad)}")


if __name__ == "__main__":
    common.run_main(main)
