"""bench_generative: a generative VLM's scores (lgip/models/generative.py, LGIP_SPEC.md 13), the shared prefix
(the template's opening, the image's tokens, the prompt) run once per image for all its texts, against one
forward of the whole conversation per text (ACCELERATIONS_OFF=["PREFIX_REUSE"]).

For each of N_IMAGES records of a perturbed JSONL: its texts (captions, paraphrases, flips) and those of
the PRIOR_IMAGES records before it (the text-prior controls score them against this image too, as
lgip/scorers/joint.py does), scored both ways. Prints each path's seconds and texts per second, the
language-model tokens run per text (padding included), their ratio, and the largest score difference.
Then the same count at LLaVA-1.5-7B's shape for the paper's job (`run_lgip_multi.py` on 40,000 images,
`score` logprob, PRIOR_IMAGES 3): 576 image tokens, LLaVA-1.5's conversation around them, each text's
tokens as the open_clip CLIP tokenizer counts them (a stand-in for Llama's, which needs a download;
both are BPE vocabularies of English words), the texts per image of the input measured here.
  python benchmarks/bench_generative.py                          # the tests' tiny LLaVA, the demo's records, CPU
  python benchmarks/bench_generative.py --FAMILY=paligemma       # tiny qwen2_vl, paligemma too
  python benchmarks/bench_generative.py --MODEL_ID=llava-hf/llava-1.5-7b-hf --DEVICE=cuda --N_IMAGES=20
  python benchmarks/bench_generative.py --ARCH=llava-1.5-7b --DEVICE=cuda --DTYPE=bf16 --N_IMAGES=20   # no download
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.abspath(os.path.dirname(__file__)))
sys.path.insert(1, _ROOT)
import common  # noqa: E402

MODEL_ID = None  # a Hugging Face id or folder of an AutoModelForImageTextToText; None = ARCH,
#   else the tests' tiny random-init FAMILY
ARCH = None  # None, or "llava-1.5-7b": that architecture built here with random weights (no download:
#   the GPU issue's cost at the real shape), its tokenizer the tests' BPE trained on the fixture captions
SHRINK = 1  # int >= 1: ARCH's layers, widths and heads divided by this (576 image tokens kept):
#   a CPU smoke test of the same code
WIDTH_SHRINK = 1  # int >= 1: ARCH's widths and heads further divided by this, its layer counts kept (32 decoder
#   layers, 24 vision layers): the operators a forward dispatches at LLaVA-1.5-7B's structure, on a CPU
FAMILY = "llava"  # "llava", "qwen2_vl" or "paligemma": the tiny model built when MODEL_ID is None (tests/tiny_vlm.py)
SCORE = "logprob"  # "logprob", "logprob_mean" or "vqascore" (LGIP_SPEC.md 13)
JSONL_PATH = None  # a *_with_perturb.jsonl (images beside it); None = the bundled demo's 12 records, perturbed here
N_IMAGES = 4  # int >= 1: records (images) scored
PRIOR_IMAGES = 3  # int >= 1: earlier records whose texts each image also scores (the controls' prior)
MAX_TEXTS = None  # None, or int >= 1: at most this many texts per image (a quick smoke test)
BATCH = 16  # int >= 1: texts per forward on the shared prefix, batched (the "batches" and "per_text" paths)
GROUP_IMAGES = 8  # int >= 1: images per forward on the "groups" path (a family of GROUP_FAMILIES)
PACK_TOKENS = 2048  # int >= 1: text tokens per forward on the shared prefix, packed (the "prefix" path,
#   a family of PACKED_FAMILIES)
BEFORE_IMAGES = None  # None (= N_IMAGES), or int >= 1: images of the slow paths
#   ("plain", "per_text": the processor per text)
RECORDS = 0  # int >= 0: that many synthetic COCO-sized records instead of the demo's (benchmarks/bench.py's:
#   640 x 480 JPEGs, the demo's captions made unique per record, perturbed); 0 = the demo's 12 (or JSONL_PATH)
PIPELINE_IMAGES = None  # None (= N_IMAGES), or int >= 1: records of the run_lgip_multi timing
#   (a longer run: its start counts less)
PROFILE = False  # True, or False: torch.profiler over the prefix path's images:
#   the device's busy share of the wall time and its top kernels
PIPELINE = True  # True, or False: also time run_lgip_multi's evaluation of the N_IMAGES records with the model in
#   memory (the joint scorer, JOINT_PIPELINE on and off, the self-check in it)
DEVICE = "cpu"  # "cpu", "cuda", ...
DTYPE = "fp32"  # "fp32" or "bf16": the model's weights (bf16: the difference to fp32 is measured, not bounded)
OPERATORS = "both"  # "both", "each" or "none": the top-level aten operators per image of run_lgip_multi's evaluation of
#   the PIPELINE_IMAGES records (torch.profiler's CPU trace; a family of GROUP_FAMILIES), 6fc3297's path (the
#   switches of NEWER_SWITCHES off) and all on; "each": also each of them off alone
PAPER_IMAGES = 40000  # int >= 1: images of the paper's job, for the count at LLaVA-1.5-7B's shape
CONFIG = common.configure(globals())

# the accelerations newer than 6fc3297 (IMAGE_GROUPS on by default there): off, that commit's default path
NEWER_SWITCHES = ("TOKEN_LISTS", "SCORED_LOGITS", "WIDE_GROUPS", "LATE_SELF_CHECK")
LLAVA_7B_IMAGE_TOKENS = 576  # CLIP ViT-L/14 at 336 px: 24 x 24 patches
# LLaVA-1.5's conversation around the image and the caption: "USER: <image>\n{prompt} ASSISTANT: {caption}</s>"
LLAVA_7B_OPENING, LLAVA_7B_BEFORE_ANSWER, LLAVA_7B_AFTER_ANSWER = "<s>USER: ", "\n{prompt} ASSISTANT:", "</s>"


def model_and_processor(work):
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor

    folder = MODEL_ID
    if folder is None and ARCH is not None:
        return llava_arch(work)
    if folder is None:
        sys.path.insert(1, os.path.join(_ROOT, "tests"))
        import tiny_vlm

        folder = getattr(tiny_vlm, f"tiny_{FAMILY}")(os.path.join(work, f"tiny_{FAMILY}"))
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[DTYPE]
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype).eval().to(DEVICE)
    processor = AutoProcessor.from_pretrained(folder)
    processor.image_processor = AutoImageProcessor.from_pretrained(folder, use_fast=False)
    return model, processor


def llava_arch(work):
    """LLaVA-1.5-7B's architecture with random weights (CLIP ViT-L/14 at 336 px: 576 image tokens; a 32-layer
    Llama of width 4096; LLaVA-1.5's chat template), built on DEVICE in DTYPE; SHRINK divides its depth and
    widths. The tokenizer is the tests' BPE (a large vocabulary, so about a word per token, as Llama's)."""
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    sys.path.insert(1, os.path.join(_ROOT, "tests"))
    from tiny_vlm import LLAVA_TEMPLATE, caption_tokenizer

    if ARCH != "llava-1.5-7b":
        raise common.ConfigError(f"unknown ARCH {ARCH!r}; valid: None, 'llava-1.5-7b'")
    tok = caption_tokenizer(["<unk>", "<s>", "</s>", "<pad>", "<image>"], bos="<s>", vocab_size=32000)
    tok.add_special_tokens({"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})
    d, w = max(1, SHRINK), max(1, SHRINK) * max(1, WIDTH_SHRINK)  # (depth, width divisors)
    vision = CLIPVisionConfig(
        hidden_size=max(8, 1024 // w),
        intermediate_size=max(8, 4096 // w),
        num_hidden_layers=max(1, 24 // d),
        num_attention_heads=max(1, 16 // w),
        image_size=336,
        patch_size=14,
        projection_dim=max(8, 768 // w),
    )
    text = LlamaConfig(
        vocab_size=32064,
        hidden_size=max(8, 4096 // w),
        intermediate_size=max(8, 11008 // w),
        num_hidden_layers=max(1, 32 // d),
        num_attention_heads=max(1, 32 // w),
        num_key_value_heads=max(1, 32 // w),
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        image_seq_length=576,
    )
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[DTYPE]
    with torch.device(DEVICE):
        model = LlavaForConditionalGeneration._from_config(config, dtype=dtype).eval()
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}),
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        chat_template=LLAVA_TEMPLATE,
        num_additional_image_tokens=1,
    )
    return model, processor


def perturbed(work):
    if JSONL_PATH is not None:
        return JSONL_PATH
    if RECORDS:
        sys.path.insert(1, os.path.join(_ROOT, "benchmarks"))
        import bench

        return bench.make_records(work, RECORDS, 0)
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
    return os.path.join(work, "lgip_demo_with_perturb.jsonl")


def record_texts(rec):
    texts = list(rec["orig_captions"])
    for field in ("same_caps", "diff_caps"):
        for i in range(len(rec["orig_captions"])):
            texts += common.caption_texts(rec, field, i)
    return list(dict.fromkeys(texts))


def conversations(model, texts):
    from lgip.models.generative import DEFAULT_PROMPT
    from lgip.models.joint import DEFAULT_QUESTION, PALIGEMMA_PROMPT

    pali = model.config.model_type == "paligemma"
    if SCORE == "vqascore":
        return [(("answer en " if pali else "") + DEFAULT_QUESTION.format(t), "Yes") for t in texts]
    return [(PALIGEMMA_PROMPT if pali else DEFAULT_PROMPT, t) for t in texts]


def token_counts(model, processor, image, convs):
    """(LM tokens of one plain forward per conversation, LM tokens with the shared prefix once and the rest
    in batches of BATCH sorted by length, padding included), as lgip.models.generative runs them."""
    from lgip.models import generative

    if model.config.model_type == "paligemma":
        items = [generative.prefix_lm_tokenized(processor, image, p, a) for p, a in convs]
        cut = items[0][1][0] if SCORE != "vqascore" else 0
    else:
        items = [generative.tokenized(processor, image, p, a) for p, a in convs]
        cut = generative._shared_length([i["input_ids"][0] for i, _ in items], min(pos[0] for _, pos in items))
    lengths = sorted(inp["input_ids"].shape[1] for inp, _ in items)
    rests = [n - cut for n in lengths]
    reused = cut + sum(max(rests[b : b + BATCH]) * len(rests[b : b + BATCH]) for b in range(0, len(rests), BATCH))
    return sum(lengths), reused if cut else sum(lengths)


def llava_7b_count(jobs):
    """LM tokens per image at LLaVA-1.5-7B's shape, one forward per text and with the prefix once: the
    image's tokens and the conversation around them (open_clip's CLIP tokenizer's counts, see the docstring)."""
    import open_clip
    from lgip.models.generative import DEFAULT_PROMPT

    tok = open_clip.get_tokenizer("ViT-B-32")

    def n(text):  # (without CLIP's start and end tokens)
        return int((tok([text])[0] != 0).sum()) - 2

    prefix = n(LLAVA_7B_OPENING) + LLAVA_7B_IMAGE_TOKENS + n(LLAVA_7B_BEFORE_ANSWER.format(prompt=DEFAULT_PROMPT))
    plain = reused = texts = 0
    for _, t in jobs:
        rests = sorted(n(x) + n(LLAVA_7B_AFTER_ANSWER) for x in t)
        plain += sum(prefix + r for r in rests)
        reused += prefix + sum(
            max(rests[b : b + BATCH]) * len(rests[b : b + BATCH]) for b in range(0, len(rests), BATCH)
        )
        texts += len(t)
    return prefix, plain / len(jobs), reused / len(jobs), texts / len(jobs)


def sync():
    if DEVICE.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def timed_path(model, processor, jobs, **kw):
    """(seconds, scores) of one path over `jobs` [(image, texts)], its forwards waited for."""
    from lgip.models import generative

    sync()
    t0 = time.perf_counter()
    pending = [
        generative.submit(
            model, processor, image, conversations(model, texts), mean=SCORE == "logprob_mean", batch=BATCH, **kw
        )
        for image, texts in jobs
    ]
    scores = [s for p in pending for s in p.result()]
    sync()
    return time.perf_counter() - t0, scores


def pipeline_job(model, path, n):
    """(records, spec, settings, config) of run_lgip_multi's evaluation of the first n records of `path` with the
    bench's model in memory (run_lgip_multi.JSONL_PATH set to them)."""
    import common as c
    import run_lgip_multi
    from lgip.models import joint

    sub = os.path.join(os.path.dirname(os.path.abspath(path)), "pipeline_with_perturb.jsonl")
    with open(path, encoding="utf-8") as f, open(sub, "w", encoding="utf-8") as out:
        out.writelines(f.readlines()[:n])
    records = c.load_records(sub, ("same_caps", "diff_caps"))
    spec = {"name": "bench_generative", "type": "generative", "model_id": MODEL_ID or ARCH or FAMILY, "score": SCORE}
    settings = {
        "score": SCORE,
        "prompt": conversations(model, ["x"])[0][0] if SCORE != "vqascore" else "-",
        "question": joint.DEFAULT_QUESTION,
    }
    config = {
        "JSONL_PATH": sub,
        "IMAGE_ROOT": None,
        "PROTOCOL": "corrected",
        "DEVICE": DEVICE,
        "DTYPE": DTYPE,
        "IMAGE_BATCH_SIZE": 1,
        "TEXT_BATCH_SIZE": "auto",
        "NUM_WORKERS": None,
        "CACHE_DIR": None,
        "PRIOR_IMAGES": PRIOR_IMAGES,
        "BOOTSTRAP": 0,
    }
    run_lgip_multi.JSONL_PATH = sub
    return records, spec, settings, config


def evaluated(model, processor, job):
    """The JointModel after run_lgip_multi's evaluation of `job` (pipeline_job's) with the switches as they are."""
    import common as c
    import run_lgip_multi
    from lgip.models import joint

    records, spec, settings, config = job
    enc = joint.generative_model(spec, model, processor, settings, DEVICE, model.dtype).named(spec, "corrected")
    run_lgip_multi.evaluate(c.ModelRun(spec, records, config, enc=enc))
    return enc


def pipeline_seconds(model, processor, path, n, work):
    """{JOINT_PIPELINE on/off: (seconds per image, the self-check's record)}: run_lgip_multi's evaluation of the
    first n records of `path` with the model in memory (the joint scorer: decoding, the prior's texts, the
    pair bookkeeping), as the paper's job runs it."""
    import common as c
    from lgip import accelerations
    from lgip.models import joint

    records, spec, settings, config = job = pipeline_job(model, path, n)
    out = {}
    # (a first, untimed run on a few records: kernels, attention plans and workers met once, so neither timed
    # run pays what the first of them would)
    try:
        evaluated(model, processor, (records[: min(4, len(records))], spec, settings, config))
    except c.ModelError as e:  # (said; the timed runs say it again)
        print(f"  warm-up: {e}")
    for on in (True, False):
        before = accelerations.switch_off([] if on else ["JOINT_PIPELINE"])
        bounds = dict(joint.SELF_CHECK_BOUND)
        try:
            for attempt in (0, 1):
                sync()
                t0 = time.perf_counter()
                try:
                    enc = evaluated(model, processor, job)
                except c.ModelError as e:  # (the self-check's bound is a guess for bf16 until measured: said, then
                    if attempt or "self-check" not in str(e):  # timed without it)
                        raise
                    print(f"  {e}\n  (timed again with the self-check's bound lifted)")
                    joint.SELF_CHECK_BOUND.update({k: float("inf") for k in bounds})
                    continue
                sync()
                out[on] = ((time.perf_counter() - t0) / len(records), enc.info.get("self_check"))
                break
        finally:
            accelerations.restore(before)
            joint.SELF_CHECK_BOUND.update(bounds)
    return out


def top_level_operators(prof):
    """The aten:: events of a torch.profiler trace with no aten:: event above them: the operators the Python side
    dispatched (an operator's own inner calls not counted again)."""

    def top(event):
        parent = event.cpu_parent
        while parent is not None:
            if parent.name.startswith("aten::"):
                return False
            parent = parent.cpu_parent
        return True

    return [e for e in prof.events() if e.name.startswith("aten::") and top(e)]


def operators_per_image(model, processor, path, n):
    """{label: (top-level aten operators per image, wall seconds per image under the profiler)} of run_lgip_multi's
    evaluation of the first n records of `path`: 6fc3297's path (the switches of NEWER_SWITCHES off), each of them
    off alone (OPERATORS "each"), and all on. A first, uncounted run warms the path."""
    from torch.profiler import ProfilerActivity, profile

    from lgip import accelerations

    job = pipeline_job(model, path, n)
    runs = [("6fc3297", list(NEWER_SWITCHES))]
    runs += [(f"{name} off", [name]) for name in NEWER_SWITCHES] if OPERATORS == "each" else []
    runs += [("all on", [])]
    evaluated(model, processor, job)
    out = {}
    for label, off in runs:
        before = accelerations.switch_off(off)
        try:
            sync()
            t0 = time.perf_counter()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                evaluated(model, processor, job)
            sync()
            out[label] = (len(top_level_operators(prof)) / n, (time.perf_counter() - t0) / n)
        finally:
            accelerations.restore(before)
    return out


def main():
    from PIL import Image
    from lgip.models import generative
    from lgip.models.conversations import Conversations
    from lgip.models.image_groups import GROUP_FAMILIES, ImageGroup

    work = tempfile.mkdtemp(prefix="lgip_bench_generative_")
    try:
        model, processor = model_and_processor(work)
        path = perturbed(work)
        records = common.load_records(path, ("same_caps", "diff_caps"))
        root = os.path.dirname(os.path.abspath(path))
        jobs = []
        for k in range(min(N_IMAGES, len(records))):
            texts = record_texts(records[k][1])
            for j in range(1, min(PRIOR_IMAGES, len(records) - 1) + 1):
                texts += record_texts(records[(k - j) % len(records)][1])
            image = Image.open(os.path.join(root, records[k][1]["image_path"])).convert("RGB")
            jobs.append((image, list(dict.fromkeys(texts))[:MAX_TEXTS]))
        before = jobs[: BEFORE_IMAGES or len(jobs)]
        n_texts = sum(len(t) for _, t in jobs)
        tokens_plain = tokens_reused = 0
        for image, texts in jobs:  # (counted, not timed)
            plain, reused = token_counts(model, processor, image, conversations(model, texts))
            tokens_plain, tokens_reused = tokens_plain + plain, tokens_reused + reused
        packs = PACK_TOKENS if generative.packable(model) else 0
        conv = Conversations(processor)
        timed_path(
            model, processor, jobs[:1], reuse=True, packs=packs, conversations=conv
        )  # (warm-up: kernels, caches)
        paths = [
            ("plain", before, dict(reuse=False)),
            ("per_text", before, dict(reuse=True)),  # the processor per text, batches (the code before 2026-11-28)
            ("batches", jobs, dict(reuse=True, conversations=conv)),
            ("prefix", jobs, dict(reuse=True, packs=packs, conversations=conv)),
        ]
        if model.config.model_type in GROUP_FAMILIES:
            paths.append(
                (
                    "groups",
                    jobs,
                    dict(
                        reuse=True,
                        packs=packs,
                        conversations=conv,
                        group=ImageGroup(model, SCORE == "logprob_mean", GROUP_IMAGES),
                    ),
                )
            )
        timed = {
            name: (len(js), sum(len(t) for _, t in js), *timed_path(model, processor, js, **kw))
            for name, js, kw in paths
        }
        if PROFILE:
            import torch
            import bench

            sync()
            t0 = time.perf_counter()
            with bench.profiled(True, DEVICE) as prof:
                timed_path(model, processor, jobs, reuse=True, packs=packs, conversations=conv)
            summary = bench.profile_summary(prof, time.perf_counter() - t0, top=15)
            print(
                f"  profile of the prefix path ({len(jobs)} images): device busy {summary['device_busy_s']} s "
                f"({summary['device_busy_share']} of the wall time); top: "
                + "; ".join(f"{name[:60]} {ms:.1f} ms x{n}" for name, ms, n in summary["top"])
            )
            del torch
        host = None
        if model.config.model_type != "paligemma":  # (a prefix-LM's conversation is its processor's own)
            t0 = time.perf_counter()
            for image, texts in jobs:  # the fastest path's host work alone: its conversations tokenized
                conv.items(image, conversations(model, texts))
            host = (time.perf_counter() - t0) / len(jobs)
        n_before = sum(len(t) for _, t in before)
        diff = {name: max(abs(a - b) for a, b in zip(timed["plain"][3], timed[name][3][:n_before])) for name in timed}
        model_said = MODEL_ID or (
            (f"{ARCH}, random init" + (f", shrunk {SHRINK}x" if SHRINK > 1 else ""))
            if ARCH
            else f"tiny {FAMILY} (tests/tiny_vlm.py)"
        )
        print(
            f"{len(jobs)} images, {n_texts} texts ({n_texts / len(jobs):.0f} per image, PRIOR_IMAGES {PRIOR_IMAGES}), "
            f"model {model_said} "
            f"on {DEVICE} in {DTYPE}, score {SCORE}, "
            f"batch {BATCH}, packs of {packs or 'none (not a packed family)'} tokens; "
            f"the slow paths on {len(before)} images"
        )
        for name, (n_img, n_txt, seconds, _) in timed.items():
            tokens = tokens_plain if name == "plain" else tokens_reused
            print(
                f"  {name:8s} {seconds:8.2f} s  {n_txt / seconds:8.1f} texts/s  {seconds / n_img:7.3f} s per image  "
                f"max |score - plain| {diff[name]:.2e}  {tokens / n_texts:7.1f} LM tokens per text"
            )
        if host is not None:
            print(f"  host work of the prefix path (its conversations tokenized): {host:.3f} s per image")
        sec = {name: t[2] / t[0] for name, t in timed.items()}
        print(
            f"  LM tokens, plain / prefix: {tokens_plain / tokens_reused:.1f}x; time, plain / prefix: "
            f"{sec['plain'] / sec['prefix']:.1f}x, per_text / prefix: {sec['per_text'] / sec['prefix']:.1f}x; "
            f"max |score difference|: {diff['prefix']:.2e}"
        )
        print(
            f"  at this speed, {PAPER_IMAGES:,} images (texts per image as here): "
            + ", ".join(f"{name} {PAPER_IMAGES * s / 60:.1f} min" for name, s in sec.items())
        )
        if PIPELINE:
            n_pipe = min(PIPELINE_IMAGES or len(jobs), len(records))
            for on, (per, check) in pipeline_seconds(model, processor, path, n_pipe, work).items():
                print(
                    f"  run_lgip_multi on {n_pipe} records, JOINT_PIPELINE {'on ' if on else 'off'}: "
                    f"{per:.3f} s per image; "
                    f"{PAPER_IMAGES:,} images: {PAPER_IMAGES * per / 60:.1f} min; self-check: {check}"
                )
        if OPERATORS != "none" and model.config.model_type in GROUP_FAMILIES:
            n_pipe = min(PIPELINE_IMAGES or len(jobs), len(records))
            counts = operators_per_image(model, processor, path, n_pipe)
            (before_ops, before_s), (after_ops, after_s) = counts["6fc3297"], counts["all on"]
            layers = (model.config.text_config.num_hidden_layers, model.config.vision_config.num_hidden_layers)
            print(
                f"{'LLaVA-7B-shaped operators' if ARCH else 'Operators'} per image: {before_ops:,.0f} -> "
                f"{after_ops:,.0f} "
                f"({before_ops / after_ops:.1f}x fewer; 6fc3297's path -> all on; "
                f"wall {before_s:.3f} -> {after_s:.3f} s per image under the profiler; "
                f"run_lgip_multi on {n_pipe} records, {layers[0]} + {layers[1]} layers, {DEVICE}, {DTYPE})"
            )
            for label, (ops, sec) in counts.items():
                print(f"  operators per image, {label:22s} {ops:9,.0f}  {sec:7.3f} s per image")
        prefix, plain, reused, per_image = llava_7b_count(jobs)
        print(
            f"LLaVA-1.5-7B's shape (prefix {prefix} tokens, {LLAVA_7B_IMAGE_TOKENS} of them the image's; "
            f"{per_image:.0f} texts per image as here): {plain:,.0f} LM tokens per image plain, {reused:,.0f} with "
            f"the prefix once ({plain / reused:.1f}x fewer); the paper's job ({PAPER_IMAGES:,} images, score "
            f"logprob, PRIOR_IMAGES {PRIOR_IMAGES}): {PAPER_IMAGES * plain / 1e9:.2f}B vs "
            f"{PAPER_IMAGES * reused / 1e6:,.0f}M LM tokens"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    common.run_main(main)
