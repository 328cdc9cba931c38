"""The throughput machinery gives the same numbers as the plain path: images encoded beside the
texts, token ids uploaded in groups, the "auto" text batch, fp16 cache chunks. No timing here:
speed is measured by bench.py (BENCHMARKS.md)."""
import glob
import multiprocessing
import os
import time

import numpy as np
import pytest
import torch

import common
from conftest import FIXTURES, OPENCLIP_TINY

TEXTS = ["dog", "a red bus waiting at a stop", "two dogs on the beach", "A cat sits on a computer.",
         "A very long caption about two white dogs and one person walking on the beach near a pier"]


def image_paths():
    return sorted(glob.glob(os.path.join(FIXTURES, "images", "*.jpg")))


@pytest.fixture(scope="module")
def enc():
    return common.load_model(OPENCLIP_TINY, "corrected", "cpu")


def test_text_batch_size_auto_and_checked():
    assert common.resolve_text_batch_size("auto", "cuda") == 2048
    assert common.resolve_text_batch_size("auto", "cuda:1") == 2048
    assert common.resolve_text_batch_size("auto", "cpu") == 64
    assert common.resolve_text_batch_size(None, "cpu") == 64 and common.resolve_text_batch_size(7, "cuda") == 7
    for bad in (0, -3, "big", 2.5):
        with pytest.raises(common.ModelError, match="TEXT_BATCH_SIZE"):
            common.resolve_text_batch_size(bad, "cpu")


def test_images_beside_texts_equal_images_alone(enc):
    alone, failed_alone = common.embed_images(enc, image_paths(), 2, 0)
    bank = common.TextBank(enc)
    slots = bank.add_call(TEXTS)
    job = common.ImageEncoding(enc, image_paths(), 2, num_workers=2)  # worker processes + hand-over thread
    txt, rows = bank.encode(batch_size=1, beside=job)  # 5 text batches, the images polled between them
    beside, failed = job.finish()
    assert failed == failed_alone == {}
    torch.testing.assert_close(beside, alone, atol=1e-6, rtol=0)
    bank2 = common.TextBank(enc)
    slots2 = bank2.add_call(TEXTS)
    txt2, rows2 = bank2.encode(batch_size=64)
    torch.testing.assert_close(txt[rows[slots]], txt2[rows2[slots2]], atol=1e-6, rtol=0)


def test_a_failing_loader_reaches_the_caller(enc, monkeypatch):
    """An error inside the decoding pipeline (here: batches that cannot be stacked) is raised to
    the caller by finish(), never lost in the hand-over thread."""
    sizes = iter(range(8, 100))
    job = common.ImageEncoding(enc, image_paths(), 4, num_workers=0)
    job.enc = type("E", (), {"image_transform": staticmethod(lambda img: torch.zeros(3, next(sizes), 8)),
                             "name": "odd", "device": "cpu"})()
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        job.start().finish()


def test_close_stops_the_hand_over_and_the_workers(enc):
    """A caller that fails mid-run closes the job: no thread or worker process is left waiting."""
    job = common.ImageEncoding(enc, image_paths(), 1, num_workers=2).start()
    job._queue.get()  # one batch taken, the rest left undecoded or queued
    job.close()
    assert not job._thread.is_alive()
    for _ in range(50):  # the loader's iterator is gone with the thread: its workers exit
        if not multiprocessing.active_children():
            break
        time.sleep(0.1)
    assert not multiprocessing.active_children()


def test_batches_group_by_padding_then_exact_length(enc):
    """Padded keys first (by padding, then length), then cut keys by exact length; at most
    batch_size each; equal keys keep their order; ids padded or cut as their key says."""
    bank = common.TextBank(enc)
    tokens = common.TokenTable()
    bank._tokenize(TEXTS, tokens)
    lengths = {t: len(tokens.ids(t)) for t in TEXTS}
    keys = [(t, None) for t in TEXTS] + [(TEXTS[0], 20), (TEXTS[1], 20), (TEXTS[2], 16), (TEXTS[3], 20)]
    todo = list(range(len(keys)))
    batches, texts_of = bank._batches(todo, keys, tokens, 2)
    expected = sorted(todo, key=lambda k: ((0, keys[k][1]) if keys[k][1] else (1, lengths[keys[k][0]]),
                                           lengths[keys[k][0]]))
    assert [k for b in batches for k in b] == expected and all(len(b) <= 2 for b in batches)
    for b, (rows, pad) in zip(batches, texts_of):
        assert len({keys[k][1] or lengths[keys[k][0]] for k in b}) == 1
        ids = bank._ids(rows, pad, tokens)
        for r, k in enumerate(b):
            t, p = keys[k]
            want = tokens.ids(t).tolist()
            assert ids[r].tolist() == want + [enc.pad_id] * ((p or len(want)) - len(want))


def test_token_ids_uploaded_in_groups_keep_every_batch(enc):
    bank = common.TextBank(enc)
    tokens = common.TokenTable()
    bank._tokenize(TEXTS, tokens)
    keys = [(t, None) for t in TEXTS]
    batches, texts_of = bank._batches(list(range(len(keys))), keys, tokens, 2)
    for max_tokens in (1, 5, 10 ** 6):  # a group per batch, a few batches per group, one group
        out = list(bank._on_device(batches, texts_of, tokens, max_tokens=max_tokens))
        assert [b for b, _ in out] == batches
        for (b, ids), (rows, pad) in zip(out, texts_of):
            assert np.array_equal(ids.numpy(), bank._ids(rows, pad, tokens))
            assert all(ids[r, -1] == tokens.ids(keys[k][0]).max() for r, k in enumerate(b))  # EOT last: no padding


def test_reduced_precision_cache_chunks_are_fp16_and_exact(tmp_path):
    enc = common.load_model(OPENCLIP_TINY, "corrected", "cpu", "bf16")
    cache = common.EmbeddingCache(str(tmp_path), enc, OPENCLIP_TINY)
    first, _ = common.embed_images(enc, image_paths(), 4, 0, cache=cache)
    chunks = glob.glob(os.path.join(cache.dir, "image-*.npz"))
    assert chunks and all(np.load(c)["emb"].dtype == np.float16 for c in chunks)
    cache2 = common.EmbeddingCache(str(tmp_path), enc, OPENCLIP_TINY)
    again, _ = common.embed_images(enc, image_paths(), 4, 0, cache=cache2)
    assert cache2.stats["image_hits"] == len(image_paths()) and torch.equal(first, again)


def test_models_that_tokenize_alike_share_one_token_table(enc):
    """Two open_clip models with one tokenizer: the second reuses the first's token ids (its own
    tokenizer is never called) and gets the same embeddings; SigLIP tokenizes otherwise."""
    from conftest import SIGLIP_TINY
    common.forget_token_tables()
    twin = common.load_model(dict(OPENCLIP_TINY, name="twin"), "corrected", "cpu")
    assert twin.tokenizer_key == enc.tokenizer_key
    assert common.load_model(SIGLIP_TINY, "corrected", "cpu").tokenizer_key != enc.tokenizer_key
    first = common.TextBank(enc)
    slots = first.add_call(TEXTS)
    emb, rows = first.encode(batch_size=2)

    def not_again(texts):
        raise AssertionError(f"tokenized again: {texts}")

    twin.tokenize = not_again
    second = common.TextBank(twin)
    slots2 = second.add_call(TEXTS)
    emb2, rows2 = second.encode(batch_size=2)
    assert torch.equal(emb[rows[slots]], emb2[rows2[slots2]])
    common.forget_token_tables()
