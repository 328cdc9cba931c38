"""bench_generative: a generative VLM's scores (lgip/models/generative.py, LGIP_SPEC.md 13), the image's
prefix run once for all its texts against one forward per text.

For each of N_IMAGES records of a perturbed JSONL: its texts (captions, paraphrases, flips) and those of
the PRIOR_IMAGES records before it (the text-prior controls score them against this image too), scored
with `plain_scores` (one forward of the whole conversation per text) and `prefix_scores` (the
template's opening, the image's tokens and the prompt once per image; the texts in batches of BATCH on
a copy of its key-value cache). Prints each path's seconds and texts per second, the language-model
tokens run per text (padding included), their ratio, and the largest difference of the scores.
  python benchmarks/bench_generative.py                     # the tests' tiny LLaVA, the demo's records, CPU
  python benchmarks/bench_generative.py --MODEL_ID=llava-hf/llava-1.5-7b-hf --DEVICE=cuda --N_IMAGES=20
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

MODEL_ID = None  # a Hugging Face id or folder of an AutoModelForImageTextToText with a chat template; None = the tests' tiny random-init LLaVA
JSONL_PATH = None  # a *_with_perturb.jsonl (images beside it); None = the bundled demo's 12 records, perturbed here
N_IMAGES = 4  # int >= 1: records (images) scored
PRIOR_IMAGES = 3  # int >= 0: earlier records whose texts each image also scores (the controls' prior)
BATCH = 16  # int >= 1: texts per forward on the shared prefix
DEVICE = "cpu"  # "cpu", "cuda", ...
CONFIG = common.configure(globals())


def model_and_processor(work):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor
    folder = MODEL_ID
    if folder is None:
        sys.path.insert(1, os.path.join(_ROOT, "tests"))
        from tiny_vlm import tiny_llava
        folder = tiny_llava(os.path.join(work, "tiny_llava"))
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval().to(DEVICE)
    return model, AutoProcessor.from_pretrained(folder)


def perturbed(work):
    if JSONL_PATH is not None:
        return JSONL_PATH
    shutil.copy(os.path.join(_ROOT, "demo", "lgip_demo.jsonl"), work)
    shutil.copytree(os.path.join(_ROOT, "demo", "images"), os.path.join(work, "images"))
    subprocess.run([sys.executable, os.path.join(_ROOT, "diff_gen_caption.py"),
                    f"--INPUT_JSONL={os.path.join(work, 'lgip_demo.jsonl')}"], check=True, capture_output=True)
    return os.path.join(work, "lgip_demo_with_perturb.jsonl")


def record_texts(rec):
    texts = list(rec["orig_captions"])
    for field in ("same_caps", "diff_caps"):
        for i in range(len(rec["orig_captions"])):
            texts += common.caption_texts(rec, field, i)
    return list(dict.fromkeys(texts))


def main():
    import torch
    from PIL import Image
    from lgip.models.generative import DEFAULT_PROMPT, plain_scores, prefix_scores, tokenized
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
            jobs.append((image, list(dict.fromkeys(texts))))
        n_texts = sum(len(t) for _, t in jobs)
        tokens_plain = tokens_reused = 0
        for image, texts in jobs:  # (counted, not timed)
            items = [tokenized(processor, image, DEFAULT_PROMPT, t) for t in texts]
            lengths = [inp["input_ids"].shape[1] for inp, _ in items]
            cut = min(pos[0] for _, pos in items)
            tokens_plain += sum(lengths)
            rests = [n - cut for n in lengths]
            tokens_reused += cut + sum(max(rests[b:b + BATCH]) * len(rests[b:b + BATCH]) for b in range(0, len(rests), BATCH))
        timed = {}
        for name, fn in (("plain", lambda im, ts: plain_scores(model, processor, im, DEFAULT_PROMPT, ts)),
                         ("prefix", lambda im, ts: prefix_scores(model, processor, im, DEFAULT_PROMPT, ts, batch=BATCH))):
            t0 = time.perf_counter()
            scores = [fn(image, texts) for image, texts in jobs]
            if DEVICE.startswith("cuda"):
                torch.cuda.synchronize()
            timed[name] = (time.perf_counter() - t0, [s for part in scores for s in part])
        diff = max(abs(a - b) for a, b in zip(timed["plain"][1], timed["prefix"][1]))
        print(f"{N_IMAGES} images, {n_texts} texts ({n_texts / len(jobs):.0f} per image, PRIOR_IMAGES {PRIOR_IMAGES}), "
              f"model {MODEL_ID or 'tiny LLaVA (tests/tiny_vlm.py)'} on {DEVICE}, batch {BATCH}")
        for name, tokens in (("plain", tokens_plain), ("prefix", tokens_reused)):
            seconds = timed[name][0]
            print(f"  {name:6s} {seconds:8.2f} s  {n_texts / seconds:8.1f} texts/s  {tokens / n_texts:7.1f} LM tokens per text")
        print(f"  LM tokens, plain / prefix: {tokens_plain / tokens_reused:.1f}x; time, plain / prefix: "
              f"{timed['plain'][0] / timed['prefix'][0]:.1f}x; max |score difference|: {diff:.2e}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    common.run_main(main)
