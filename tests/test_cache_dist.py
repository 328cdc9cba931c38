"""Embedding cache (reuse, staleness, corruption, resume) and torchrun sharding."""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from lgip.cache import EmbeddingCache, image_cache_key
from lgip.images import embed_images
from lgip.models import load_model
from lgip.texts import TextBank
from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, ROOT, SIGLIP_TINY, TINY_MODELS, eval_args, run_script

TEXTS = ["a red bus", "two dogs on the beach", "A cat sits on a computer.", "dog"]


def image_paths():
    return sorted(glob.glob(os.path.join(FIXTURES, "images", "*.jpg")))


def encode_all(enc, cache):
    bank = TextBank(enc)
    slots = bank.add_call(TEXTS)
    txt, rows = bank.encode(3, cache=cache)
    img, failed = embed_images(enc, image_paths(), 4, 0, cache=cache)
    return txt[rows[slots]], img, bank


def test_cache_serves_identical_embeddings_and_skips_work(tmp_path):
    enc = load_model(SIGLIP_TINY, "reference", "cpu")
    cache = EmbeddingCache(str(tmp_path), enc, SIGLIP_TINY)
    txt1, img1, bank1 = encode_all(enc, cache)
    assert bank1.n_encoded == 4
    cache2 = EmbeddingCache(str(tmp_path), enc, SIGLIP_TINY)
    txt2, img2, bank2 = encode_all(enc, cache2)
    assert bank2.n_encoded == 0 and cache2.stats["image_hits"] == 12 and cache2.stats["text_hits"] == 4
    assert torch.equal(txt1, txt2) and torch.equal(img1, img2)


@pytest.mark.parametrize("change", ["protocol", "dtype", "spec", "weights"])
def test_changed_setting_never_reuses_entries(tmp_path, change):
    spec = dict(SIGLIP_TINY)
    enc = load_model(spec, "reference", "cpu")
    first = EmbeddingCache(str(tmp_path / "c"), enc, spec).dir
    if change == "protocol":
        enc = load_model(spec, "corrected", "cpu")
    elif change == "dtype":
        enc = load_model(spec, "reference", "cpu", "bf16")
    elif change == "spec":
        spec = dict(OPENCLIP_TINY, name=spec["name"])
    else:  # same spec, replaced weights in a local folder
        local = tmp_path / "model"
        shutil.copytree(spec["model_id"], local)
        spec = dict(spec, model_id=str(local))
        first = EmbeddingCache(str(tmp_path / "c"), enc, spec).dir
        os.utime(local / "model.safetensors", ns=(1, 1))
    assert EmbeddingCache(str(tmp_path / "c"), enc, spec).dir != first


def test_image_cache_key_follows_file_changes(tmp_path):
    p = tmp_path / "a.jpg"
    shutil.copy(image_paths()[0], p)
    k1 = image_cache_key(str(p))
    shutil.copy(image_paths()[1], p)
    assert image_cache_key(str(p)) != k1


def test_corrupt_or_truncated_chunk_is_reported_and_rebuilt(tmp_path, capsys):
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu")
    cache = EmbeddingCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    txt1, img1, _ = encode_all(enc, cache)
    chunks = sorted(glob.glob(os.path.join(cache.dir, "image-*.npz")))
    assert len(chunks) == 3  # 12 images, a chunk every 4 rows (resumable granularity)
    data = open(chunks[0], "rb").read()
    open(chunks[0], "wb").write(data[: len(data) // 2])  # truncated
    open(chunks[1], "r+b").write(b"garbage!")  # corrupt header
    cache2 = EmbeddingCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    txt2, img2, _ = encode_all(enc, cache2)
    assert cache2.stats["corrupt_chunks"] == 2 and cache2.stats["image_hits"] == 4
    assert "is corrupt" in capsys.readouterr().err
    torch.testing.assert_close(img1, img2, atol=1e-6, rtol=0)
    cache3 = EmbeddingCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    encode_all(enc, cache3)
    assert cache3.stats["corrupt_chunks"] == 0 and cache3.stats["image_hits"] == 12


def test_interrupted_write_leaves_no_chunk_and_resumes(tmp_path):
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu")
    cache = EmbeddingCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    calls = {"n": 0}
    real = enc.encode_images

    def dies_on_third_batch(batch):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(batch)

    enc.encode_images = dies_on_third_batch
    with pytest.raises(KeyboardInterrupt):
        embed_images(enc, image_paths(), 4, 0, cache=cache)
    enc.encode_images = real
    assert len(glob.glob(os.path.join(cache.dir, "image-*.npz"))) == 2
    cache2 = EmbeddingCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    embed_images(enc, image_paths(), 4, 0, cache=cache2)
    assert cache2.stats["image_hits"] == 8


def test_kill_9_mid_run_then_resume(tmp_path):
    """A process killed mid-run leaves only finished chunks; the re-run completes from them.
    (Chunks are written by the cache's own thread: the kill waits until the two handed over
    are on disk, as they are within milliseconds in a real run.)"""
    script = f"""
import glob, os, signal, sys, time
sys.path.insert(0, {ROOT!r})
from lgip.cache import EmbeddingCache
from lgip.images import embed_images
from lgip.models import load_model
enc = load_model({OPENCLIP_TINY!r}, "corrected", "cpu")
cache = EmbeddingCache({str(tmp_path)!r}, enc, {OPENCLIP_TINY!r}, chunk_rows=4)
real, n = enc.encode_images, [0]
def enc_then_die(batch):
    n[0] += 1
    if n[0] == 3:
        deadline = time.time() + 60
        while len(glob.glob(os.path.join(cache.dir, "image-*.npz"))) < 2 and time.time() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(batch)
enc.encode_images = enc_then_die
embed_images(enc, sorted(glob.glob({os.path.join(FIXTURES, 'images', '*.jpg')!r})), 4, 0, cache=cache)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -9
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu")
    cache = EmbeddingCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    img, failed = embed_images(enc, image_paths(), 4, 0, cache=cache)
    assert cache.stats["image_hits"] == 8 and not failed and not torch.isnan(img).any()


def test_rerun_of_the_three_scripts_encodes_nothing_new(tmp_path):
    for name in ("fixture_with_perturb.jsonl", "fixture_with_fliptypes.jsonl"):
        shutil.copy(os.path.join(REFERENCE, name), tmp_path / name)
    cache = tmp_path / "cache"
    for _ in range(2):
        run_script("run_lgip_multi.py", *eval_args(tmp_path / "fixture_with_perturb.jsonl", "corrected", [SIGLIP_TINY], CACHE_DIR=str(cache)))
        run_script("run_lgip_by_fliptype.py", *eval_args(tmp_path / "fixture_with_fliptypes.jsonl", "corrected", [SIGLIP_TINY], CACHE_DIR=str(cache)))
    m = json.load(open(tmp_path / "fixture_with_fliptypes__LGIP_fliptypes.metrics.json"))[0]
    assert m["run"]["num_unique_texts_encoded"] > 0 and m["run"]["cache"]["image_hits"] == 12
    assert m["run"]["cache"]["text_hits"] == m["run"]["num_unique_texts_encoded"]


@pytest.mark.parametrize("script,jsonl,name", [
    ("run_lgip_multi.py", "fixture_with_perturb.jsonl", "fixture_with_perturb__LGIP_ALL.metrics.json"),
    ("rebuttal_enhanced_lgip_by_transformation.py", "rebuttal_enhanced_fixture_with_fliptypes.jsonl",
     "rebuttal_enhanced_fixture_with_fliptypes__ENHANCED_LGIP_analysis.json"),
])
def test_torchrun_two_gloo_processes_give_single_process_metrics(tmp_path, script, jsonl, name):
    from test_evaluation import assert_matches
    single, multi = tmp_path / "single", tmp_path / "multi"
    for folder in (single, multi):
        folder.mkdir()
        shutil.copy(os.path.join(REFERENCE, jsonl), folder / jsonl)
    run_script(script, *eval_args(single / jsonl, "reference", TINY_MODELS, CACHE_DIR=None))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, script), *eval_args(multi / jsonl, "reference", TINY_MODELS, CACHE_DIR=None)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours, ref = json.load(open(multi / name)), json.load(open(single / name))
    for a, b in zip(ours, ref):
        a.pop("run"), b.pop("run")
    assert_matches(ours, ref)
    assert json.load(open(multi / name))[0]["run"]["num_processes"] == 2
    a = open(multi / json.load(open(multi / name))[0]["scores_file"]).read().splitlines()
    b = open(single / json.load(open(single / name))[0]["scores_file"]).read().splitlines()
    assert len(a) == len(b) == 60


def test_a_chunk_with_a_changed_byte_is_caught_by_its_checksum(tmp_path, capsys):
    """Cache chunks are written without fsync: what a power cut could leave (any bytes changed,
    the zip structure intact) must still be caught, reported and rebuilt."""
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu")
    cache = EmbeddingCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    first, _ = embed_images(enc, image_paths(), 4, 0, cache=cache)
    chunk = sorted(glob.glob(os.path.join(cache.dir, "image-*.npz")))[0]
    data = bytearray(open(chunk, "rb").read())
    data[len(data) // 3] ^= 0xFF  # inside the embeddings' bytes
    open(chunk, "wb").write(bytes(data))
    cache2 = EmbeddingCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    again, _ = embed_images(enc, image_paths(), 4, 0, cache=cache2)
    assert cache2.stats["corrupt_chunks"] == 1 and cache2.stats["image_hits"] == 8
    assert "is corrupt" in capsys.readouterr().err and torch.equal(first, again)
