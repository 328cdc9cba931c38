"""The embedding cache on disk (lgip/cache.py): reuse, staleness, corruption (checksums), resume
after an interruption or kill -9, fp16 chunks for reduced precision, failed writes raised or
reported."""

import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from lgip.cache import ModelCache, image_cache_key, pair_cache_key
from lgip.images import embed_images
from lgip.models import load_model
from lgip.texts import TextBank
from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, ROOT, SIGLIP_TINY, eval_settings, image_paths, run_here


TEXTS = ["a red bus", "two dogs on the beach", "A cat sits on a computer.", "dog"]


def encode_all(enc, cache):
    bank = TextBank(enc)
    slots = bank.add_call(TEXTS)
    txt, rows = bank.encode(3, cache=cache)
    img, failed = embed_images(enc, image_paths(), 4, 0, cache=cache)
    return txt[rows[slots]], img, bank


def test_cache_serves_identical_embeddings_and_skips_work(tmp_path):
    enc = load_model(SIGLIP_TINY, "reference", "cpu")
    cache = ModelCache(str(tmp_path), enc, SIGLIP_TINY)
    txt1, img1, bank1 = encode_all(enc, cache)
    assert bank1.n_encoded == 4
    cache2 = ModelCache(str(tmp_path), enc, SIGLIP_TINY)
    txt2, img2, bank2 = encode_all(enc, cache2)
    assert bank2.n_encoded == 0 and cache2.stats["image_hits"] == 12 and cache2.stats["text_hits"] == 4
    assert torch.equal(txt1, txt2) and torch.equal(img1, img2)


@pytest.mark.parametrize("change", ["protocol", "dtype", "spec", "weights"])
def test_changed_setting_never_reuses_entries(tmp_path, change):
    spec = dict(SIGLIP_TINY)
    enc = load_model(spec, "reference", "cpu")
    first = ModelCache(str(tmp_path / "c"), enc, spec).dir
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
        first = ModelCache(str(tmp_path / "c"), enc, spec).dir
        os.utime(local / "model.safetensors", ns=(1, 1))
    assert ModelCache(str(tmp_path / "c"), enc, spec).dir != first


def test_image_cache_key_follows_file_changes(tmp_path):
    p = tmp_path / "a.jpg"
    shutil.copy(image_paths()[0], p)
    k1 = image_cache_key(str(p))
    shutil.copy(image_paths()[1], p)
    assert image_cache_key(str(p)) != k1


def test_corrupt_or_truncated_chunk_is_reported_and_rebuilt(tmp_path, capsys):
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu")
    cache = ModelCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    txt1, img1, _ = encode_all(enc, cache)
    chunks = sorted(glob.glob(os.path.join(cache.dir, "image-*.npz")))
    assert len(chunks) == 3  # 12 images, a chunk every 4 rows (resumable granularity)
    data = open(chunks[0], "rb").read()
    open(chunks[0], "wb").write(data[: len(data) // 2])  # truncated
    open(chunks[1], "r+b").write(b"garbage!")  # corrupt header
    cache2 = ModelCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    txt2, img2, _ = encode_all(enc, cache2)
    assert cache2.stats["corrupt_chunks"] == 2 and cache2.stats["image_hits"] == 4
    assert "is corrupt" in capsys.readouterr().err
    torch.testing.assert_close(img1, img2, atol=1e-6, rtol=0)
    cache3 = ModelCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    encode_all(enc, cache3)
    assert cache3.stats["corrupt_chunks"] == 0 and cache3.stats["image_hits"] == 12


def test_interrupted_write_leaves_no_chunk_and_resumes(tmp_path):
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu")
    cache = ModelCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
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
    cache2 = ModelCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    embed_images(enc, image_paths(), 4, 0, cache=cache2)
    assert cache2.stats["image_hits"] == 8


def test_kill_9_mid_run_then_resume(tmp_path):
    """A process killed mid-run leaves only finished chunks; the re-run completes from them.
    (Chunks are written by the cache's own thread: the kill waits until the two handed over
    are on disk, as they are within milliseconds in a real run.)"""
    script = f"""
import glob, os, signal, sys, time
sys.path.insert(0, {ROOT!r})
from lgip.cache import ModelCache
from lgip.images import embed_images
from lgip.models import load_model
enc = load_model({OPENCLIP_TINY!r}, "corrected", "cpu")
cache = ModelCache({str(tmp_path)!r}, enc, {OPENCLIP_TINY!r}, chunk_rows=4)
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
embed_images(enc, sorted(glob.glob({os.path.join(FIXTURES, "images", "*.jpg")!r})), 4, 0, cache=cache)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -9
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu")
    cache = ModelCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    img, failed = embed_images(enc, image_paths(), 4, 0, cache=cache)
    assert cache.stats["image_hits"] == 8 and not failed and not torch.isnan(img).any()


def test_rerun_of_the_three_scripts_encodes_nothing_new(tmp_path):
    for name in ("fixture_with_perturb.jsonl", "fixture_with_fliptypes.jsonl"):
        shutil.copy(os.path.join(REFERENCE, name), tmp_path / name)
    cache = tmp_path / "cache"
    for _ in range(2):
        run_here(
            "run_lgip_multi.py",
            **eval_settings(tmp_path / "fixture_with_perturb.jsonl", "corrected", [SIGLIP_TINY], CACHE_DIR=str(cache)),
        )
        run_here(
            "run_lgip_by_fliptype.py",
            **eval_settings(
                tmp_path / "fixture_with_fliptypes.jsonl", "corrected", [SIGLIP_TINY], CACHE_DIR=str(cache)
            ),
        )
    m = json.load(open(tmp_path / "fixture_with_fliptypes__LGIP_fliptypes.metrics.json"))[0]
    assert m["run"]["num_unique_texts_encoded"] > 0 and m["run"]["cache"]["image_hits"] == 12
    assert m["run"]["cache"]["text_hits"] == m["run"]["num_unique_texts_encoded"]


def test_a_chunk_with_a_changed_byte_is_caught_by_its_checksum(tmp_path, capsys):
    """Cache chunks are written without fsync: what a power cut could leave (any bytes changed,
    the zip structure intact) must still be caught, reported and rebuilt."""
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu")
    cache = ModelCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    first, _ = embed_images(enc, image_paths(), 4, 0, cache=cache)
    chunk = sorted(glob.glob(os.path.join(cache.dir, "image-*.npz")))[0]
    data = bytearray(open(chunk, "rb").read())
    data[len(data) // 3] ^= 0xFF  # inside the embeddings' bytes
    open(chunk, "wb").write(bytes(data))
    cache2 = ModelCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    again, _ = embed_images(enc, image_paths(), 4, 0, cache=cache2)
    assert cache2.stats["corrupt_chunks"] == 1 and cache2.stats["image_hits"] == 8
    assert "is corrupt" in capsys.readouterr().err and torch.equal(first, again)


def test_reduced_precision_cache_chunks_are_fp16_and_exact(tmp_path):
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu", "bf16")
    cache = ModelCache(str(tmp_path), enc, OPENCLIP_TINY)
    first, _ = embed_images(enc, image_paths(), 4, 0, cache=cache)
    chunks = glob.glob(os.path.join(cache.dir, "image-*.npz"))
    assert chunks and all(np.load(c)["emb"].dtype == np.float16 for c in chunks)
    cache2 = ModelCache(str(tmp_path), enc, OPENCLIP_TINY)
    again, _ = embed_images(enc, image_paths(), 4, 0, cache=cache2)
    assert cache2.stats["image_hits"] == len(image_paths()) and torch.equal(first, again)


def test_pair_scores_have_their_own_entries_beside_the_embeddings(tmp_path):
    """A score per (image, text) pair (LGIP_SPEC.md 13's scorers) is a third kind of entry: its own
    chunks, read back exactly in float32 (even in a reduced-precision cache), keyed by both image and
    text; today's text and image entries, and the stats a dual encoder's run block shows, unchanged."""
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu", "bf16")
    cache = ModelCache(str(tmp_path), enc, OPENCLIP_TINY)
    txt, img, _ = encode_all(enc, cache)
    before = {kind: sorted(glob.glob(os.path.join(cache.dir, f"{kind}-*.npz"))) for kind in ("text", "image")}
    stats = dict(cache.stats)
    images = [image_cache_key(p) for p in image_paths()[:2]]
    keys = [pair_cache_key(i, t) for i in images for t in TEXTS]
    scores = torch.tensor([[-1.0 / 3 - j] for j in range(len(keys))])  # (not fp16 values)
    writer = cache.writer("pair")
    writer.add(keys, scores)
    writer.close()
    assert len(set(keys)) == len(keys) and cache.stats == stats  # (no pair was looked up: no pair_hits key)
    again = ModelCache(str(tmp_path), enc, OPENCLIP_TINY)
    pos, found = again.lookup("pair", keys[::-1] + ["not a pair"])
    assert pos == list(range(len(keys))) and torch.equal(found, scores.flip(0))
    assert again.stats["pair_hits"] == len(keys) and "pair" not in again.index("text")
    assert {kind: sorted(glob.glob(os.path.join(cache.dir, f"{kind}-*.npz"))) for kind in ("text", "image")} == before
    txt2, img2, bank = encode_all(enc, again)  # the embeddings: all still served from their own entries
    assert bank.n_encoded == 0 and torch.equal(txt, txt2) and torch.equal(img, img2)


def test_a_cache_that_cannot_be_written_is_said_once_and_left_whole(tmp_path, monkeypatch, capsys):
    """A full disk (ENOSPC) costs the cache, never the run: said once, no partial chunk, no more
    writes; any other failed write is raised by close, or reported by abandon."""
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu")
    cache = ModelCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)
    writer = cache.writer("text")
    writer.add(["a", "b", "c", "d"], torch.zeros(4, 3))  # written: stays usable
    writer.close()
    real = np.savez

    def disk_full(f, **arrays):
        f.write(b"PK")  # a piece of the chunk, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", disk_full)
    for _ in range(2):
        writer = cache.writer("text")
        writer.add(["e", "f", "g", "h"], torch.zeros(4, 3))  # a whole chunk: handed to the writer's thread
        writer.close()  # not raised
    err = capsys.readouterr().err
    assert err.count("warning: the embedding cache cannot be written (") == 1 and "no space left on the device" in err
    assert cache.stats["write_error"] == "no space left on the device" and not cache.writable
    assert sorted(os.listdir(cache.dir)) == [
        "meta.json",
        os.path.basename(glob.glob(os.path.join(cache.dir, "text-*"))[0]),
    ]
    assert ModelCache(str(tmp_path), enc, OPENCLIP_TINY).lookup("text", list("abcdefgh"))[0] == [0, 1, 2, 3]

    def broken(*args, **kwargs):
        raise RuntimeError("not a disk's error")

    monkeypatch.setattr(np, "savez", broken)
    cache = ModelCache(str(tmp_path / "other"), enc, OPENCLIP_TINY, chunk_rows=4)
    writer = cache.writer("text")
    writer.add(["a", "b", "c", "d"], torch.zeros(4, 3))
    with pytest.raises(RuntimeError, match="not a disk's error"):
        writer.close()
    writer = cache.writer("text")
    writer.add(["a", "b", "c", "d"], torch.zeros(4, 3))
    writer.abandon()  # the run failed anyway: its error stays the one raised, this one is reported
    assert "a cache chunk could not be written (RuntimeError" in capsys.readouterr().err
    monkeypatch.setattr(np, "savez", real)


def test_through_asks_for_the_missing_keys_alone_and_no_cache_for_all(tmp_path):
    """ModelCache.through (lm-eval's CachingLM for one keyed computation): a second call computes only the keys
    the first did not; rows computed now come back as computed (a float64 score stays one), rows from the cache
    as stored (float32); NoCache computes every key, holds nothing, writes nothing."""
    from lgip.cache import NoCache

    enc = load_model(OPENCLIP_TINY, "corrected", "cpu")
    asked = []

    def compute(keys):
        def rows(todo):
            asked.append([keys[p] for p in todo])
            return [[len(keys[p]) + 1 / 3] for p in todo]

        return rows

    cache = ModelCache(str(tmp_path), enc, OPENCLIP_TINY)
    first = cache.through("text", ["a", "bb"], compute(["a", "bb"]))
    assert asked == [["a", "bb"]] and first == [[1 + 1 / 3], [2 + 1 / 3]]
    again = ModelCache(str(tmp_path), enc, OPENCLIP_TINY)
    keys = ["bb", "ccc", "a"]
    got = again.through("text", keys, compute(keys))
    assert asked[-1] == ["ccc"] and again.stats["text_hits"] == 2
    assert got == [[np.float32(2 + 1 / 3)], [3 + 1 / 3], [np.float32(1 + 1 / 3)]]
    third = ModelCache(str(tmp_path), enc, OPENCLIP_TINY)  # (a cache's index is read once, before its writes)
    assert third.holds({"text": ["a", "bb", "ccc"]}) and not third.holds({"text": ["a", "dddd"]})
    none = NoCache()
    assert not none and none.through("text", keys, compute(keys)) == [[2 + 1 / 3], [3 + 1 / 3], [1 + 1 / 3]]
    assert asked[-1] == keys and none.lookup("text", keys) == ([], None) and none.writer("text") is None
    assert none.holds({"text": []}) and not none.holds({"text": ["a"]}) and none.through("text", [], None) == []


def test_the_identity_holds_the_familys_code_version_and_the_inexact_switches_on(tmp_path, capsys):
    """Issue 62: a bumped code_version misses the cache; a switch on that is not bit-exact at the run's dtype is in
    the identity (off: another folder), an exact one is not; an older lgip's folder (no code_version) is named once
    and never used."""
    from dataclasses import replace

    from lgip import accelerations
    from lgip.models import FAMILIES, register

    src = tmp_path / "x_with_perturb.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), src)

    def multi(**extra):
        (row,), _, err = run_here("run_lgip_multi.py", **eval_settings(src, "corrected", [OPENCLIP_TINY], **extra))
        return row, err

    first, _ = multi()
    folder = glob.glob(str(tmp_path / ".lgip_cache" / "tiny_openclip-*"))
    assert len(folder) == 1
    meta = json.load(open(os.path.join(folder[0], "meta.json"), encoding="utf-8"))
    assert meta["code_version"] == {"openclip": FAMILIES["openclip"].code_version}
    assert meta["accelerations"] == accelerations.inexact(FAMILIES["openclip"].accelerations, "fp32")
    assert "PREFIX_PACKS" in meta["accelerations"] and "FAST_CLIP_TOKENIZER" not in meta["accelerations"]
    again, _ = multi()
    assert again["run"]["model"]["weights_loaded"] is False  # (the same code and switches: every entry read)
    exact, _ = multi(ACCELERATIONS_OFF=["FAST_CLIP_TOKENIZER"])  # (bit-exact at fp32: the same entries serve)
    assert exact["run"]["model"]["weights_loaded"] is False
    inexact, _ = multi(ACCELERATIONS_OFF=["PREFIX_PACKS"])  # (not bit-exact: computed anew, in a folder of its own)
    assert inexact["run"]["model"]["weights_loaded"] is True
    assert len(glob.glob(str(tmp_path / ".lgip_cache" / "tiny_openclip-*"))) == 2
    record = FAMILIES["openclip"]
    try:
        register(replace(record, code_version=record.code_version + 1))
        bumped, _ = multi()
        assert bumped["run"]["model"]["weights_loaded"] is True  # (a change to the family's code: nothing stale)
    finally:
        register(record)
    assert len(glob.glob(str(tmp_path / ".lgip_cache" / "tiny_openclip-*"))) == 3
    # a folder an older lgip wrote (its meta without code_version and accelerations): named once, not used
    old = tmp_path / "old"
    shutil.copytree(folder[0], old / ".lgip_cache" / "tiny_openclip-0123456789abcdef")
    meta_path = old / ".lgip_cache" / "tiny_openclip-0123456789abcdef" / "meta.json"
    json.dump({k: v for k, v in meta.items() if k not in ("code_version", "accelerations")}, open(meta_path, "w"))
    shutil.copy(src, old / src.name)
    src = old / src.name
    row, err = multi()
    assert row["run"]["model"]["weights_loaded"] is True
    assert err.count("was written by an older lgip (its meta.json has no code_version): not used") == 1
    assert "tiny_openclip-0123456789abcdef" in err


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_switch_declared_bit_exact_at_a_dtype_gives_the_same_entries_bit_for_bit(tmp_path, dtype):
    """EXACT_DTYPES' claims for the switches that act on a dual encoder's or a joint model's entries, at the dtypes
    a CPU runs: each such switch off gives every cached entry bit for bit (the cache's identity leaves it out)."""
    from lgip import accelerations
    from lgip.models import FAMILIES

    src = tmp_path / "x_with_perturb.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), src)
    models = [OPENCLIP_TINY, dict(OPENCLIP_TINY, name="twin")]  # (a twin: pixel memory and shared tokens act)
    acting = set(FAMILIES["openclip"].accelerations)
    claimed = [n for n in accelerations.NAMES if n in acting and dtype in accelerations.EXACT_DTYPES[n]]
    assert {"FAST_CLIP_TOKENIZER", "PIXEL_MEMORY", "SHARED_TOKENS"} <= set(claimed)

    def entries(name, off):
        cache = tmp_path / f"cache_{'_'.join(off) or 'on'}"
        run_here(
            "run_lgip_multi.py",
            **eval_settings(
                src, "corrected", models, DTYPE=dtype, CACHE_DIR=str(cache), ACCELERATIONS_OFF=off, BOOTSTRAP=0
            ),
        )
        out = {}
        for chunk in glob.glob(str(cache / f"{name}-*" / "*.npz")):
            with np.load(chunk) as z:
                for k, row in zip(json.loads(bytes(z["keys"]).decode()), z["emb"]):
                    out[k] = row.tobytes()
        return out

    on = entries("twin", [])
    for name in claimed:
        assert entries("twin", [name]) == on, name
