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

from lgip import lookahead, prefix_packs, siglip_models
from lgip.cache import EmbeddingCache
from lgip.clip_tokenizer import _fast_clip_encode
from lgip.device import _Rows, cosines
from lgip.encoder import _as_features
from lgip.errors import ModelError
from lgip.evaluation import ModelRun, forget_token_tables, swap_process_state
from lgip.images import ImageEncoding, embed_images, open_rgb
from lgip.lookahead import Lookahead
from lgip.models import MODEL_PREPARERS, load_model
from lgip.openclip_models import _create_openclip_on
from lgip.pixel_memory import PixelMemory, pixel_memory, resolve_pixel_memory
from lgip.pixels import check_pixel_split, pixel_split_openclip
from lgip.prefix_packs import PrefixPacks
from lgip.records import load_records
from lgip.texts import TextBank, TextCalls, _LAST_PLAN, resolve_text_batch_size
from lgip.tokens import TokenTable, _TOKEN_TABLES, _pack, shared_token_table
from lgip.towers import _class_token_blocks, _siglip_text_last, _siglip_text_tower
from conftest import FIXTURES, OPENCLIP_TINY

TEXTS = ["dog", "a red bus waiting at a stop", "two dogs on the beach", "A cat sits on a computer.",
         "A very long caption about two white dogs and one person walking on the beach near a pier"]


def image_paths():
    return sorted(glob.glob(os.path.join(FIXTURES, "images", "*.jpg")))


@pytest.fixture(scope="module")
def enc():
    return load_model(OPENCLIP_TINY, "corrected", "cpu")


def test_text_batch_size_auto_and_checked():
    assert resolve_text_batch_size("auto", "cuda") == 2048
    assert resolve_text_batch_size("auto", "cuda:1") == 2048
    assert resolve_text_batch_size("auto", "cpu") == 64
    assert resolve_text_batch_size(None, "cpu") == 64 and resolve_text_batch_size(7, "cuda") == 7
    for bad in (0, -3, "big", 2.5):
        with pytest.raises(ModelError, match="TEXT_BATCH_SIZE"):
            resolve_text_batch_size(bad, "cpu")


def test_images_beside_texts_equal_images_alone(enc):
    alone, failed_alone = embed_images(enc, image_paths(), 2, 0)
    bank = TextBank(enc)
    slots = bank.add_call(TEXTS)
    job = ImageEncoding(enc, image_paths(), 2, num_workers=2)  # worker processes + hand-over thread
    txt, rows = bank.encode(batch_size=1, beside=job)  # 5 text batches, the images polled between them
    beside, failed = job.finish()
    assert failed == failed_alone == {}
    torch.testing.assert_close(beside, alone, atol=1e-6, rtol=0)
    bank2 = TextBank(enc)
    slots2 = bank2.add_call(TEXTS)
    txt2, rows2 = bank2.encode(batch_size=64)
    torch.testing.assert_close(txt[rows[slots]], txt2[rows2[slots2]], atol=1e-6, rtol=0)


def test_a_failing_loader_reaches_the_caller(enc, monkeypatch):
    """An error inside the decoding pipeline (here: batches that cannot be stacked) is raised to
    the caller by finish(), never lost in the hand-over thread."""
    sizes = iter(range(8, 100))
    odd = type("E", (), {"image_transform": staticmethod(lambda img: torch.zeros(3, next(sizes), 8)),
                         "name": "odd", "device": "cpu", "pixels": None, "storage_dtype": torch.float32})()
    job = ImageEncoding(odd, image_paths(), 4, num_workers=0)
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        job.start().finish()


def test_close_stops_the_hand_over_and_the_workers(enc):
    """A caller that fails mid-run closes the job: no thread or worker process is left waiting."""
    job = ImageEncoding(enc, image_paths(), 1, num_workers=2).start()
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
    bank = TextBank(enc)
    tokens = TokenTable()
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
    bank = TextBank(enc)
    tokens = TokenTable()
    bank._tokenize(TEXTS, tokens)
    keys = [(t, None) for t in TEXTS]
    batches, texts_of = bank._batches(list(range(len(keys))), keys, tokens, 2)
    for max_tokens in (1, 5, 10 ** 6):  # a group per batch, a few batches per group, one group
        out = list(bank._on_device(batches, texts_of, tokens, max_tokens=max_tokens))
        assert [b for b, _ in out] == batches
        for (b, (ids, exact)), (rows, pad) in zip(out, texts_of):
            assert exact and pad is None
            assert np.array_equal(ids.numpy(), bank._ids(rows, pad, tokens))
            assert all(ids[r, -1] == tokens.ids(keys[k][0]).max() for r, k in enumerate(b))  # EOT last: no padding


def test_reduced_precision_cache_chunks_are_fp16_and_exact(tmp_path):
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu", "bf16")
    cache = EmbeddingCache(str(tmp_path), enc, OPENCLIP_TINY)
    first, _ = embed_images(enc, image_paths(), 4, 0, cache=cache)
    chunks = glob.glob(os.path.join(cache.dir, "image-*.npz"))
    assert chunks and all(np.load(c)["emb"].dtype == np.float16 for c in chunks)
    cache2 = EmbeddingCache(str(tmp_path), enc, OPENCLIP_TINY)
    again, _ = embed_images(enc, image_paths(), 4, 0, cache=cache2)
    assert cache2.stats["image_hits"] == len(image_paths()) and torch.equal(first, again)


def test_models_that_tokenize_alike_share_one_token_table(enc):
    """Two open_clip models with one tokenizer: the second reuses the first's token ids (its own
    tokenizer is never called) and gets the same embeddings; SigLIP tokenizes otherwise."""
    from conftest import SIGLIP_TINY
    forget_token_tables()
    twin = load_model(dict(OPENCLIP_TINY, name="twin"), "corrected", "cpu")
    assert twin.tokenizer_key == enc.tokenizer_key
    assert load_model(SIGLIP_TINY, "corrected", "cpu").tokenizer_key != enc.tokenizer_key
    first = TextBank(enc)
    slots = first.add_call(TEXTS)
    emb, rows = first.encode(batch_size=2)

    def not_again(texts):
        raise AssertionError(f"tokenized again: {texts}")

    twin.tokenize = not_again
    second = TextBank(twin)
    slots2 = second.add_call(TEXTS)
    emb2, rows2 = second.encode(batch_size=2)
    assert torch.equal(emb[rows[slots]], emb2[rows2[slots2]])
    forget_token_tables()


# --- pixels: geometry in the workers, arithmetic on the device, shared between models ---------

SIGLIP_TINY = {"name": "tiny_siglip", "type": "siglip", "model_id": os.path.join(FIXTURES, "models", "siglip-tiny")}


@pytest.mark.parametrize("spec", [OPENCLIP_TINY, SIGLIP_TINY], ids=["openclip", "siglip"])
def test_pixel_split_is_bit_identical_to_the_cpu_transform(spec):
    """uint8 geometry + device arithmetic == the model's own CPU transform, bit for bit, on every
    fixture image (and on a grayscale and an RGBA one, through open_rgb)."""
    from PIL import Image
    enc = load_model(spec, "corrected", "cpu")
    assert enc.pixels is not None and enc.info["pixels_on_device"]
    imgs = [open_rgb(p) for p in image_paths()]
    imgs += [imgs[0].convert("L").convert("RGB"), Image.new("RGBA", (40, 90), (10, 250, 3, 7)).convert("RGB")]
    for img in imgs:
        u8 = enc.pixels.geometry(img)
        assert u8.dtype == torch.uint8 and u8.shape[0] == 3
        got = enc.pixels.to_input(u8[None], "cpu", torch.float32)[0]
        assert torch.equal(got, enc.image_transform(img))


def test_a_pixel_split_that_differs_is_refused(enc):
    """check_pixel_split keeps the CPU transform when the device arithmetic would differ."""
    split = pixel_split_openclip(enc.image_transform)
    assert check_pixel_split(enc, split) is split
    split.std = [s + 1e-7 for s in split.std]
    assert check_pixel_split(enc, split) is None
    divisor = pixel_split_openclip(enc.image_transform)
    divisor.rescale = ("div32", 254.99)
    assert check_pixel_split(enc, divisor) is None
    # Why no reciprocal: float32 x * float32(1/255) differs from x / 255 for 126 of the 256 values.
    x = torch.arange(256, dtype=torch.float32)
    assert (x * torch.tensor(1 / 255, dtype=torch.float32) != x / torch.tensor(255.0)).sum() == 126
    assert pixel_split_openclip(lambda img: img) is None


def test_pixels_are_decoded_once_per_geometry(enc, tmp_path):
    """A second model with the same geometry encodes the first one's remembered pixels: only
    the unreadable file is tried again (its error may have been passing) and reported alike;
    the same embeddings; another geometry decodes again; PIXEL_MEMORY_GB=0 turns it off."""
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not a jpeg")
    paths = image_paths() + [str(bad)]
    first = ImageEncoding(enc, paths, 3, num_workers=2)
    emb1, failed1 = first.start().finish()
    assert (first.n_decoded, first.n_remembered) == (len(paths), 0) and list(failed1) == [len(paths) - 1]
    again = ImageEncoding(enc, paths, 3, num_workers=2)
    emb2, failed2 = again.start().finish()
    assert (again.n_decoded, again.n_remembered, again.n_cached) == (1, len(paths) - 1, 0)
    assert failed2 == failed1
    assert torch.equal(emb1[:-1], emb2[:-1]) and torch.isnan(emb2[-1]).all()
    off = ImageEncoding(enc, paths, 3, num_workers=0, pixel_memory_gb=0)
    emb3, _ = off.start().finish()
    assert off.n_decoded == len(paths) and torch.equal(emb1[:-1], emb3[:-1])
    sig = load_model(SIGLIP_TINY, "corrected", "cpu")
    assert sig.pixels.key != enc.pixels.key
    other = ImageEncoding(sig, paths, 3, num_workers=0)
    other.start().finish()
    assert other.n_decoded == len(paths)
    after = ImageEncoding(enc, paths, 3, num_workers=0)  # both geometries fit: ours is still there
    after.start().finish()
    assert (after.n_decoded, after.n_remembered) == (1, len(paths) - 1)
    pixel_memory(0)  # a smaller budget evicts at once
    assert pixel_memory(0).bytes == 0 and not pixel_memory(0).geometries


def test_pixel_memory_keeps_to_its_budget(enc):
    """Past PIXEL_MEMORY_GB the rest is decoded again by the next model, never dropped; a
    geometry being decoded evicts the least recently used other one."""
    paths = image_paths()
    per_image = 3 * 64 * 64  # the tiny model's 64 px input
    budget_gb = 4.5 * per_image / 2 ** 30  # room for 4 images: one batch of 3, not the next
    ImageEncoding(enc, paths, 3, num_workers=0, pixel_memory_gb=budget_gb).start().finish()
    again = ImageEncoding(enc, paths, 3, num_workers=0, pixel_memory_gb=budget_gb)
    emb, failed = again.start().finish()
    assert (again.n_remembered, again.n_decoded) == (3, len(paths) - 3) and not failed
    torch.testing.assert_close(emb, embed_images(enc, paths, 3, 0)[0], atol=0, rtol=0)
    # Another geometry needing the room evicts ours (least recently used), not its own.
    sig = load_model(SIGLIP_TINY, "corrected", "cpu")
    ImageEncoding(sig, paths, 3, num_workers=0, pixel_memory_gb=budget_gb).start().finish()
    memory = pixel_memory(int(budget_gb * 2 ** 30))
    assert list(memory.geometries) == [sig.pixels.key] and memory.bytes == 3 * per_image
    with pytest.raises(ModelError, match="PIXEL_MEMORY_GB"):
        resolve_pixel_memory(-1)


def test_two_models_of_one_run_share_pixels(tmp_path):
    """run_evaluation with the same model twice: the second decodes no image, same metrics."""
    import json
    from conftest import REFERENCE, eval_args, run_script
    src = os.path.join(REFERENCE, "fixture_with_perturb.jsonl")
    jsonl = tmp_path / "fixture_with_perturb.jsonl"
    jsonl.write_text(open(src).read())
    twin = dict(OPENCLIP_TINY, name="tiny_openclip_again")
    run_script("run_lgip_multi.py", *eval_args(str(jsonl), models=[OPENCLIP_TINY, twin], image_root=FIXTURES,
                                               CACHE_DIR=None))
    a, b = (json.load(open(tmp_path / f"fixture_with_perturb__LGIP_{m['name']}.metrics.json"))
            for m in (OPENCLIP_TINY, twin))
    assert a["run"]["image_sources"]["decoded"] > 0 and a["run"]["image_sources"]["from_pixel_memory"] == 0
    assert b["run"]["image_sources"] == {"decoded": 0, "from_pixel_memory": a["run"]["image_sources"]["decoded"],
                                         "from_cache": 0}
    for key in ("invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate"):
        assert a[key] == b[key] is not None
    # open_clip texts share their prefixes' positions: fewer computed than held, both reported
    positions = a["run"]["text_positions"]
    assert 0 < positions["computed"] < positions["tokens"] and a["run"]["model"]["text_prefix_sharing"]
    assert positions["pack_nodes"] == prefix_packs.PACK_NODES


def test_openclip_tokenize_keeps_texts_whole_through_id_zero(enc):
    """open_clip's id 0 is "!" (also the padding value): 'a sign saying "stop!".' holds it mid-text.
    Tokens run to EOT (where the tower pools), equal open_clip's own padded rows, and the cut
    embedding equals the model's encode_text on the full 77-token row."""
    import open_clip
    tricky = ['a sign saying "stop!".', "x !(", "A café — naïve “quotes” &amp; 3½", " ".join(["word"] * 90), "dog"]
    tok = open_clip.get_tokenizer("local-dir:" + os.path.join(FIXTURES, "models", "openclip-tiny"))
    full = tok(tricky)
    ids = enc.tokenize(tricky)
    assert 0 in ids[0][1:-1]
    for row, cut in zip(full, ids):
        assert cut == row[:len(cut)].tolist() and not row[len(cut):].any() and cut[-1] == tok.eot_token_id
    assert len(ids[3]) == enc.context_length
    with torch.no_grad():
        want = torch.nn.functional.normalize(enc.model.encode_text(full[:1]).float(), dim=-1)
    torch.testing.assert_close(enc.encode_tokens(torch.tensor(ids[:1])), want, atol=1e-5, rtol=0)


def test_last_block_for_the_pooled_position_only(enc):
    """exact_length=True (every text ends at the last column): the last block runs for that
    position only and gives the full model's embeddings (77 padded tokens, open_clip's own
    encode_text) to 1e-6; the TextBank passes it for its exact-length batches."""
    import open_clip
    tok = open_clip.get_tokenizer("local-dir:" + os.path.join(FIXTURES, "models", "openclip-tiny"))
    same_length = ["a red bus", "a blue car", "two dogs run"]
    ids = enc.tokenize(same_length)
    assert len({len(t) for t in ids}) == 1
    with torch.no_grad():
        want = torch.nn.functional.normalize(enc.model.encode_text(tok(same_length)).float(), dim=-1)
    got = enc.encode_tokens(torch.tensor(ids), exact_length=True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(got, enc.encode_tokens(torch.tensor(ids)), atol=1e-6, rtol=0)
    calls = []
    real, packs = enc.encode_tokens, enc.encode_packs
    enc.encode_tokens = lambda ids, exact_length=False: calls.append(exact_length) or real(ids, exact_length)
    enc.encode_packs = None  # a causal tower without prefix packs: exact-length batches
    try:
        bank = TextBank(enc)
        bank.add_call(TEXTS)
        bank.encode(batch_size=2)
    finally:
        enc.encode_tokens, enc.encode_packs = real, packs
    assert calls and all(calls)


PREFIX_TEXTS = ["a photo of a dog.", "a photo of a dog on a mat.", "a photo of a cat.", "A photo of a dog.",
                "a photo of", "dog", "In this image, a dog.", "In this image, two dogs.", "a photo of a red bus",
                "a photo of a blue bus", 'a sign saying "stop!" twice', "a photo of a dog. <end_of_text> ignored",
                "A very long caption about two white dogs and one person walking on the beach near a pier " * 6]


def _plan(enc, texts, size, packs_per_batch):
    tokens = TokenTable()
    tokens.add(texts, *_pack(enc.tokenize(texts)))
    flat, starts, lengths = tokens.packed()
    return tokens, PrefixPacks(flat, starts, lengths, np.arange(len(texts)), size=size,
                                      packs_per_batch=packs_per_batch)


@pytest.mark.parametrize("size,packs_per_batch", [(77, 1), (80, 3), (256, 4)])
def test_prefix_packs_hold_every_text_once_and_share_only_true_prefixes(enc, size, packs_per_batch):
    """Every text appears once; reading its path through the pack gives back its own token ids
    at their own depths; packs never exceed their size; what is shared is a real common prefix
    (case-folded duplicates share everything, the truncated text fills the context)."""
    tokens, plan = _plan(enc, PREFIX_TEXTS, size, packs_per_batch)
    seen = []
    for where, (tok, pos, path, creator, eot, slot) in plan.batches():
        seen += where.tolist()
        assert tok.shape[1] == size and ((creator >= 0).sum(axis=1) <= size).all()
        pack_of = np.repeat(np.arange(eot.shape[0]), eot.shape[1])[slot]
        for t, (text_pos, g) in enumerate(zip(where.tolist(), pack_of.tolist())):
            want = tokens.ids(PREFIX_TEXTS[text_pos]).tolist()
            nodes = path[t, :len(want)]
            assert tok[g, nodes].tolist() == want and pos[g, nodes].tolist() == list(range(len(want)))
            assert eot.ravel()[slot[t]] == nodes[-1]
            # each node's creator has the same prefix up to that node
            for p, node in enumerate(nodes.tolist()):
                assert path[creator[g, node], p] == node
    assert sorted(seen) == list(range(len(PREFIX_TEXTS)))
    assert plan.n_tokens == sum(len(tokens.ids(t)) for t in PREFIX_TEXTS) and plan.n_nodes < plan.n_tokens
    with pytest.raises(ValueError, match="pack size 8 is below the longest text"):
        _plan(enc, PREFIX_TEXTS, 8, 1)


@pytest.mark.parametrize("size,packs_per_batch", [(77, 1), (80, 3), (256, 4)])
def test_prefix_packs_give_open_clip_embeddings(enc, size, packs_per_batch):
    """encode_packs equals open_clip's own encode_text (77 padded tokens) to 1e-6, however the
    texts fall into packs and batches."""
    import open_clip
    tok = open_clip.get_tokenizer("local-dir:" + os.path.join(FIXTURES, "models", "openclip-tiny"))
    with torch.no_grad():
        want = torch.nn.functional.normalize(enc.model.encode_text(tok(PREFIX_TEXTS)).float(), dim=-1)
    _, plan = _plan(enc, PREFIX_TEXTS, size, packs_per_batch)
    got = torch.zeros_like(want)
    for where, arrays in plan.batches():
        got[torch.as_tensor(where)] = enc.encode_packs(*(torch.from_numpy(a) for a in arrays))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_text_bank_shares_prefixes_and_counts_positions(enc):
    """A TextBank over an open_clip tower packs its texts: the same embeddings as exact-length
    batches (1e-6), fewer positions computed than the texts hold, both reported; uploads in
    groups keep every batch whole."""
    def run(packs, max_ints=1 << 23):
        saved = enc.encode_packs
        enc.encode_packs = packs
        real = TextBank._packs_on_device
        TextBank._packs_on_device = lambda self, plan, todo: real(self, plan, todo, max_ints=max_ints)
        try:
            bank = TextBank(enc)
            slots = bank.add_call(PREFIX_TEXTS)
            emb, rows = bank.encode(batch_size=2)
        finally:
            enc.encode_packs = saved
            TextBank._packs_on_device = real
        return emb[rows[slots]], bank.positions
    plain, plain_pos = run(None)
    for max_ints in (1, 1 << 23):
        packed, pos = run(enc.encode_packs, max_ints)
        torch.testing.assert_close(packed, plain, atol=1e-6, rtol=0)
        assert pos["tokens"] == plain_pos["tokens"] == plain_pos["computed"] and pos["computed"] < pos["tokens"]
    # packs smaller than the longest text (a long-context tower): the pack grows to hold it
    saved = prefix_packs.PACK_NODES
    prefix_packs.PACK_NODES = 8
    try:
        packed, _ = run(enc.encode_packs)
    finally:
        prefix_packs.PACK_NODES = saved
    torch.testing.assert_close(packed, plain, atol=1e-6, rtol=0)


def test_a_literal_end_of_text_in_a_caption_pools_where_open_clip_does(enc, tmp_path):
    """SimpleTokenizer reads "<end_of_text>" in a caption as the EOT id; open_clip pools at the
    first EOT (argmax), so the project's tokens stop there, in every path; the text cache keys
    carry the tokenization's tag, so caches from before these fixes are never reused."""
    import open_clip
    tok = open_clip.get_tokenizer("local-dir:" + os.path.join(FIXTURES, "models", "openclip-tiny"))
    texts = ["a dog <end_of_text> on grass", "a cat <end_of_text> on mats", "a dog"]
    with torch.no_grad():
        want = torch.nn.functional.normalize(enc.model.encode_text(tok(texts)).float(), dim=-1)
    assert [len(t) for t in enc.tokenize(texts)] == [4, 4, 4]
    cache = EmbeddingCache(str(tmp_path), enc, OPENCLIP_TINY)
    bank = TextBank(enc)
    slots = bank.add_call(texts)
    emb, rows = bank.encode(batch_size=8, cache=cache)
    torch.testing.assert_close(emb[rows[slots]], want, atol=1e-6, rtol=0)
    import json
    keys = [k for c in glob.glob(os.path.join(cache.dir, "text-*.npz")) for k in json.loads(bytes(np.load(c)["keys"]))]
    assert keys and all(k.startswith("eot2|") for k in keys)


def test_auto_pixel_memory_is_shared_by_torchrun_processes(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    one = resolve_pixel_memory("auto")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert 0 < resolve_pixel_memory("auto") <= one // 4 + 1
    assert one <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    assert resolve_pixel_memory(0) == 0 and resolve_pixel_memory(1.5) == int(1.5 * 2 ** 30)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("spec", [OPENCLIP_TINY, SIGLIP_TINY], ids=["openclip", "siglip"])
def test_pixel_split_is_bit_identical_on_the_gpu(spec):
    """On CUDA the device arithmetic must still equal the CPU transform bit for bit (no reciprocal
    division, no fused ops): the load-time check accepts the split, and real images agree."""
    enc = load_model(spec, "corrected", "cuda", "fp32")
    assert enc.pixels is not None
    for path in image_paths():
        img = open_rgb(path)
        got = enc.pixels.to_input(enc.pixels.geometry(img)[None], "cuda", torch.float32)[0].cpu()
        assert torch.equal(got, enc.image_transform(img))


def test_image_last_block_for_the_class_token_only(enc):
    """open_clip ViTs pooling their class token run the last block for that token alone: the
    same embeddings as open_clip's encode_image (1e-6); towers pooling otherwise keep the full
    forward."""
    import copy
    size = enc.model.visual.image_size
    x = torch.randn(3, 3, *(size if isinstance(size, tuple) else (size, size)), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = torch.nn.functional.normalize(enc.model.encode_image(x).float(), dim=-1)
    assert enc.info["image_last_block_class_token_only"]
    torch.testing.assert_close(enc.encode_images(x), want, atol=1e-6, rtol=0)
    assert _class_token_blocks(enc.model.visual) is not None
    for attr, value in (("pool_type", "avg"), ("output_tokens", True), ("attn_pool", torch.nn.Identity())):
        visual = copy.deepcopy(enc.model.visual)
        setattr(visual, attr, value)
        assert _class_token_blocks(visual) is None, attr


@pytest.mark.parametrize("protocol", ["corrected", "reference"])
def test_siglip_last_layer_for_the_pooled_position_only(protocol):
    """SigLIP pools its text at the last position: the last layer runs for it alone and gives
    get_text_features' embeddings (1e-6), with and without padding; a tower whose parts are
    not the expected ones keeps the full forward."""
    sig = load_model(SIGLIP_TINY, protocol, "cpu")
    assert sig.info["text_last_layer_pooled_position_only"]
    ids = [sig.tokenize([t])[0] for t in TEXTS]
    for width in (max(map(len, ids)), 64):
        batch = torch.full((len(ids), width), sig.pad_id, dtype=torch.long)
        for r, row in enumerate(ids):
            batch[r, :len(row)] = torch.tensor(row[:width])
        with torch.no_grad():
            want = torch.nn.functional.normalize(_as_features(sig.model.get_text_features(input_ids=batch)).float(), dim=-1)
        torch.testing.assert_close(sig.encode_tokens(batch), want, atol=1e-6, rtol=0)
    assert _siglip_text_tower(torch.nn.Linear(2, 2)) is None


def test_siglip_last_layer_path_is_dropped_when_it_disagrees(monkeypatch):
    """The load-time check (fp32, before the cast) refuses a last-layer path that does not give
    get_text_features' embeddings: the full forward is used."""
    real = _siglip_text_last
    monkeypatch.setattr(siglip_models, "_siglip_text_last", lambda tower, ids: real(tower, ids) * 1.01 + 0.01)
    sig = load_model(SIGLIP_TINY, "corrected", "cpu")
    assert not sig.info["text_last_layer_pooled_position_only"]
    ids = torch.tensor([sig.tokenize(["a red bus"])[0]])
    with torch.no_grad():
        want = torch.nn.functional.normalize(_as_features(sig.model.get_text_features(input_ids=ids)).float(), dim=-1)
    torch.testing.assert_close(sig.encode_tokens(ids), want, atol=1e-6, rtol=0)


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")  # meta tensors take no checkpoint values
def test_open_clip_models_are_built_on_their_device(monkeypatch):
    """On an accelerator the model is built under its device context (its random init runs
    there, and its checkpoint is loaded into it; "meta" stands in for a GPU here) with the
    same eval transform; a model whose code cannot be built that way is built on the CPU."""
    import open_clip
    from PIL import Image
    name = "local-dir:" + os.path.join(FIXTURES, "models", "openclip-tiny")
    model, preprocess, built_on = _create_openclip_on("meta", name, None, {})
    assert built_on == "meta" and all(p.device.type == "meta" for p in model.parameters())
    cpu_model, cpu_preprocess, cpu_built_on = _create_openclip_on("cpu", name, None, {})
    assert cpu_built_on == "cpu" and next(cpu_model.parameters()).device.type == "cpu"
    image = Image.new("RGB", (97, 61), (200, 30, 90))
    assert torch.equal(preprocess(image), cpu_preprocess(image))
    real = open_clip.create_model_and_transforms

    def refuses_meta(*args, **kwargs):
        if torch.empty(0).device.type == "meta":
            raise NotImplementedError("cannot build on meta")
        return real(*args, **kwargs)
    monkeypatch.setattr(open_clip, "create_model_and_transforms", refuses_meta)
    model, _, built_on = _create_openclip_on("meta", name, None, {})
    assert built_on == "cpu" and next(model.parameters()).device.type == "cpu"


def test_prefix_plan_is_reused_by_the_next_model_of_a_family(enc):
    """The same token table and the same rows (the next open_clip model of a run encoding the
    same texts) reuse the last plan; other rows or another table get their own."""
    tokens = TokenTable()
    tokens.add(PREFIX_TEXTS, *_pack(enc.tokenize(PREFIX_TEXTS)))
    rows = np.arange(len(PREFIX_TEXTS))
    plan = TextBank._plan(tokens, rows, 64)
    assert TextBank._plan(tokens, rows.copy(), 64) is plan
    assert TextBank._plan(tokens, rows[::-1].copy(), 64) is not plan
    other = TokenTable()
    other.add(PREFIX_TEXTS, *_pack(enc.tokenize(PREFIX_TEXTS)))
    assert TextBank._plan(other, rows, 64) is not TextBank._plan(tokens, rows, 64)
    forget_token_tables()
    assert not _LAST_PLAN


def _ahead_done(ahead):
    ahead._thread.join(120)
    assert not ahead._thread.is_alive()


def test_lookahead_tokenizes_and_decodes_for_a_later_model(enc, tmp_path):
    """While one model runs, a later model of another family gets its texts tokenized (the
    ids its own tokenizer gives) and its images decoded (the same embeddings as decoding them
    itself); a later model that tokenizes like the current one gets no job; close() ends it."""
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not a jpeg")
    paths = image_paths() + [str(bad)]
    sig = load_model(SIGLIP_TINY, "corrected", "cpu")
    twin = dict(OPENCLIP_TINY, name="tiny_openclip_again")
    ahead = Lookahead([twin, SIGLIP_TINY], "corrected", num_workers=1, image_batch=5)  # several batches
    assert ahead.active
    ahead.start(enc, TextCalls(TEXTS + TEXTS[:2], [0, len(TEXTS)]), paths)
    _ahead_done(ahead)
    assert [(j["model"], j["kind"], j["state"]) for j in ahead.jobs] == [("tiny_siglip", "tokens", "done"),
                                                                        ("tiny_siglip", "pixels", "done")]
    waited, report = ahead.settle(sig)
    assert waited >= 0 and [(j["kind"], j["items"]) for j in report] == [("tokens", len(TEXTS)),
                                                                         ("pixels", len(paths) - 1)]
    table = shared_token_table(sig.tokenizer_key)
    assert len(table) == len(TEXTS) and all(table.ids(t).tolist() == sig.tokenize([t])[0] for t in TEXTS)
    images = ImageEncoding(sig, paths, 3, num_workers=0)
    emb, failed = images.start().finish()
    assert (images.n_decoded, images.n_remembered) == (1, len(paths) - 1) and list(failed) == [len(paths) - 1]
    alone, _ = ImageEncoding(sig, paths, 3, num_workers=0, pixel_memory_gb=0).start().finish()
    assert torch.equal(emb[:-1], alone[:-1])
    ahead.close()


def test_lookahead_leaves_work_a_model_has_started_to_that_model(enc):
    """A model that starts before its job has begun does the work itself (the job is dropped,
    not run twice into one table); a later model that cannot be prepared is reported, and the
    other models' jobs still run; no workers, no lookahead."""
    sig = load_model(SIGLIP_TINY, "corrected", "cpu")
    broken = {"name": "broken_siglip", "type": "siglip", "model_id": "/nonexistent/siglip"}
    ahead = Lookahead([broken, SIGLIP_TINY], "corrected", num_workers=1)
    waited, report = ahead.settle(sig)  # before start: nothing to wait for
    assert report == []
    ahead.start(enc, TextCalls(TEXTS, [0]), image_paths())
    _ahead_done(ahead)
    states = [(j["model"], j["kind"], j["state"]) for j in ahead.jobs]
    assert states == [("broken_siglip", "prepare", "failed"), ("tiny_siglip", "tokens", "dropped"),
                      ("tiny_siglip", "pixels", "dropped")]
    assert "nonexistent" in ahead.jobs[0]["error"]
    assert ahead.settle(type("E", (), {"tokenizer_key": None, "pixels": None, "name": "broken_siglip"})())[1][0][
        "state"] == "failed"
    ahead.close()
    assert not Lookahead([SIGLIP_TINY], "corrected", num_workers=0).active


def test_lookahead_close_stops_a_running_job(enc):
    ahead = Lookahead([SIGLIP_TINY], "corrected", num_workers=1, chunk=8)
    texts = [f"{n} dogs on a red bus number {n}" for n in range(20000)]
    ahead.start(enc, TextCalls(texts, [0]), [])
    deadline = time.time() + 60
    while not ahead.jobs and time.time() < deadline:
        time.sleep(0.05)
    ahead.close()
    assert not ahead._thread.is_alive()
    job = ahead.jobs[0]
    assert job["state"] in ("stopped", "done") and bool(ahead._tables) == (job["state"] == "done")


def test_pixels_decoded_ahead_never_evict(enc):
    """evict=False (a Lookahead's pixels) keeps a batch only where it fits beside the others."""
    memory = PixelMemory(budget=2 * 3 * 4 * 4)
    u8 = torch.zeros((1, 3, 4, 4), dtype=torch.uint8)
    memory.add("a", ["x"], u8)
    memory.add("b", ["y"], u8, evict=False)
    memory.add("b", ["z"], u8, evict=False)  # no room left: not kept, "a" stays
    assert list(memory.geometries) == ["a", "b"] and set(memory.geometries["b"]["where"]) == {"y"}
    memory.add("c", ["w"], u8)  # an evicting add drops the least recently used ("a")
    assert list(memory.geometries) == ["b", "c"] and memory.bytes == 2 * u8.numel()


def test_a_run_with_lookahead_gives_the_same_metrics(tmp_path):
    """run_lgip_multi over open_clip then SigLIP, with and without LOOKAHEAD (1 worker): the
    same metrics; each model reports what was done ahead for it and how long it waited."""
    import json
    from conftest import REFERENCE, eval_args, run_script
    src = open(os.path.join(REFERENCE, "fixture_with_perturb.jsonl")).read()
    got = {}
    for ahead in (True, False):
        folder = tmp_path / str(ahead)
        folder.mkdir()
        jsonl = folder / "fixture_with_perturb.jsonl"
        jsonl.write_text(src)
        args = [a for a in eval_args(str(jsonl), "corrected", models=[OPENCLIP_TINY, SIGLIP_TINY], CACHE_DIR=None,
                                     LOOKAHEAD=ahead, BOOTSTRAP=0) if a != "--NUM_WORKERS=0"]
        run_script("run_lgip_multi.py", *args, "--NUM_WORKERS=1")
        got[ahead] = json.load(open(folder / "fixture_with_perturb__LGIP_ALL.metrics.json"))
    keys = ("num_invariance_pairs", "num_sensitivity_pairs", "invariance_error_mean", "sensitivity_gap_mean",
            "sensitivity_pos_rate")
    for a, b in zip(got[True], got[False]):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
        assert b["run"]["lookahead"] is None and "lookahead_wait" in a["run"]["seconds_by_phase"]
    assert got[True][0]["run"]["lookahead"] == []
    jobs = got[True][1]["run"]["lookahead"]
    assert [j["kind"] for j in jobs] == ["tokens", "pixels"] and {j["state"] for j in jobs} <= {"done", "dropped"}


def _prepare_with(monkeypatch, tokenize_hook):
    """SigLIP's preparer, its tokenize wrapped by tokenize_hook(texts) (runs in the workers)."""
    real = MODEL_PREPARERS["siglip"]

    def prepare(spec, protocol):
        prep = real(spec, protocol)
        inner = prep.tokenize
        prep.tokenize = lambda texts: (tokenize_hook(texts), inner(texts))[1]
        return prep
    monkeypatch.setitem(MODEL_PREPARERS, "siglip", prepare)


def test_a_dying_lookahead_worker_fails_its_job_only(enc, monkeypatch):
    """A worker killed mid-job (OOM killer, a crash in a tokenizer) fails that job, reported;
    the main process goes on, its own DataLoaders too, and the next job still runs."""
    import signal

    def die(texts):
        if any("poison" in t for t in texts):
            os.kill(os.getpid(), signal.SIGKILL)
    _prepare_with(monkeypatch, die)
    ahead = Lookahead([SIGLIP_TINY], "corrected", num_workers=1, chunk=2)
    ahead.start(enc, TextCalls(TEXTS + ["poison text"], [0]), image_paths())
    emb, failed = ImageEncoding(enc, image_paths(), 3, num_workers=1).start().finish()  # meanwhile
    _ahead_done(ahead)
    assert not failed and not torch.isnan(emb).any()
    tokens, pixels = ahead.jobs
    assert tokens["state"] == "failed" and "BrokenProcessPool" in tokens["error"] and not ahead._tables
    assert pixels["state"] == "done" and pixels["items"] == len(image_paths())
    assert not multiprocessing.active_children()


def test_a_stuck_lookahead_job_is_abandoned(enc, monkeypatch):
    """settle() stops waiting for a job that has done no batch for LOOKAHEAD_STALL_S (the model
    does the work itself); close() leaves no worker behind."""
    def stall(texts):
        if any("stall" in t for t in texts):
            time.sleep(60)
    _prepare_with(monkeypatch, stall)
    monkeypatch.setattr(lookahead, "LOOKAHEAD_STALL_S", 1.0)
    sig = load_model(SIGLIP_TINY, "corrected", "cpu")
    ahead = Lookahead([SIGLIP_TINY], "corrected", num_workers=1, chunk=2)
    ahead.start(enc, TextCalls(["stall here"] + TEXTS, [0]), [])
    deadline = time.time() + 60
    while not ahead.jobs and time.time() < deadline:
        time.sleep(0.05)
    waited, report = ahead.settle(sig)
    assert 0.5 < waited < 30 and report[0]["state"] == "abandoned"
    assert sig.tokenizer_key not in _TOKEN_TABLES  # nothing half-done is handed over
    t0 = time.time()
    ahead.close()
    assert time.time() - t0 < 10 and not ahead._thread.is_alive()
    time.sleep(0.5)
    assert not multiprocessing.active_children()


def test_reduced_precision_tables_hold_fp16_and_score_as_float32(tmp_path):
    """A model below fp32 keeps its embeddings as fp16 values (storage_dtype) on its device; the
    similarities are float32 products of them: the same as from a float32 copy of the table."""
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu", "bf16")
    assert enc.storage_dtype == torch.float16
    img, _ = embed_images(enc, image_paths(), 4, 0)
    bank = TextBank(enc)
    slots = bank.add_call(TEXTS)
    txt, rows = bank.encode(batch_size=2)
    assert img.dtype == txt.dtype == torch.float16
    ia, ib = [0, 1, 2, 3, 4], rows[slots]
    assert np.array_equal(cosines(img, txt, ia, ib), cosines(img.float(), txt.float(), ia, ib))


def test_a_failed_cache_write_is_raised_or_reported(tmp_path, monkeypatch, capsys):
    enc = load_model(OPENCLIP_TINY, "corrected", "cpu")
    cache = EmbeddingCache(str(tmp_path), enc, OPENCLIP_TINY, chunk_rows=4)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", disk_full)
    writer = cache.writer("text")
    writer.add(["a", "b", "c", "d"], torch.zeros(4, 3))  # a whole chunk: handed to the writer's thread
    with pytest.raises(OSError, match="No space left"):
        writer.close()
    writer = cache.writer("text")
    writer.add(["a", "b", "c", "d"], torch.zeros(4, 3))
    writer.abandon()  # the run failed anyway: its error stays the one raised, this one is reported
    assert "a cache chunk could not be written (OSError" in capsys.readouterr().err


def test_a_table_without_room_on_its_device_stays_on_the_host(monkeypatch, capsys):
    real = torch.full

    def no_room(size, fill, dtype=None, device=None):
        if device is not None and torch.device(device).type != "cpu":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real(size, fill, dtype=dtype, device=device)

    monkeypatch.setattr(torch, "full", no_room)
    rows = _Rows(3, 0.0, "meta", torch.float16)
    rows.put([2, 0], torch.ones(2, 4))
    assert rows.tensor().device.type == "cpu" and rows.tensor()[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert "kept on the host" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_embeddings_stay_on_the_gpu_and_score_as_on_the_cpu(tmp_path):
    """On CUDA the embedding tables and the similarities stay on the device: the metrics equal
    the CPU run's (fp32, to float rounding), and a cached re-run gives the same numbers."""
    import shutil
    import run_lgip_multi
    from conftest import REFERENCE, SIGLIP_TINY
    jsonl = tmp_path / "fixture_with_perturb.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), jsonl)
    records = load_records(str(jsonl), ("same_caps", "diff_caps"))
    run_lgip_multi.JSONL_PATH = str(jsonl)
    out = {}
    for device, cache in (("cpu", None), ("cuda", str(tmp_path / "cache")), ("cuda", str(tmp_path / "cache"))):
        for spec in (OPENCLIP_TINY, SIGLIP_TINY):
            config = {"JSONL_PATH": str(jsonl), "IMAGE_ROOT": FIXTURES, "PROTOCOL": "corrected", "DEVICE": device,
                      "DTYPE": "fp32", "IMAGE_BATCH_SIZE": 4, "TEXT_BATCH_SIZE": 16, "NUM_WORKERS": 0,
                      "CACHE_DIR": cache}
            run = ModelRun(spec, records, config)
            m = run_lgip_multi.evaluate(run)
            assert run.img_emb.device.type == device
            out.setdefault(spec["name"], []).append(m)
    for cpu, gpu, cached in out.values():
        for key in ("invariance_error_mean", "sensitivity_gap_mean"):
            assert gpu[key] == pytest.approx(cpu[key], abs=1e-5)
            assert cached[key] == gpu[key]


@pytest.mark.parametrize("family,protocol", [("openclip", "corrected"), ("siglip", "reference")])
def test_models_of_a_run_share_its_calls_and_what_derives_from_them(tmp_path, monkeypatch, family, protocol):
    """The second model of a run adopts the first's calls and pairs (built once), its keys and
    token-table rows (no tokenizing, no lookups): the same metrics as a run of its own. Also
    for the published SigLIP padding (each call to its longest text), shared by the models of
    one tokenizer."""
    import shutil
    import run_lgip_multi
    from conftest import REFERENCE, SIGLIP_TINY
    spec = OPENCLIP_TINY if family == "openclip" else SIGLIP_TINY
    jsonl = tmp_path / "fixture_with_perturb.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), jsonl)
    monkeypatch.setattr(run_lgip_multi, "JSONL_PATH", str(jsonl))
    config = {"JSONL_PATH": str(jsonl), "IMAGE_ROOT": FIXTURES, "PROTOCOL": protocol, "DEVICE": "cpu",
              "DTYPE": "fp32", "IMAGE_BATCH_SIZE": 4, "TEXT_BATCH_SIZE": 16, "NUM_WORKERS": 0, "CACHE_DIR": None}
    records = load_records(str(jsonl), ("same_caps", "diff_caps"))
    twin = dict(spec, name="twin")
    built, tokenized = [], []
    real_build, real_tokenize = run_lgip_multi.published_calls, TextBank._tokenize
    monkeypatch.setattr(run_lgip_multi, "published_calls", lambda run: built.append(1) or real_build(run))
    monkeypatch.setattr(TextBank, "_tokenize", lambda self, *a: tokenized.append(1) or real_tokenize(self, *a))
    first = ModelRun(spec, records, config)
    m1 = run_lgip_multi.evaluate(first)
    n_first = len(tokenized)
    second = ModelRun(twin, records, config)
    m2 = run_lgip_multi.evaluate(second)
    assert len(built) == 1 and len(tokenized) == n_first and second.bank.run_calls is first.bank.run_calls
    padding = ("fixed", None) if family == "openclip" else ("lengths", first.enc.tokenizer_key)
    assert second.bank.calls == first.bank.calls and list(first.bank.run_calls.keys) == [padding]
    swap_process_state()  # a fresh process: the twin alone builds and tokenizes for itself
    alone = run_lgip_multi.evaluate(ModelRun(twin, records, config))
    assert len(built) == 2 and len(tokenized) == 2 * n_first
    for key in ("invariance_error_mean", "sensitivity_gap_mean", "sensitivity_pos_rate", "num_invariance_pairs"):
        assert m2[key] == alone[key] and m1[key] == alone[key]  # (the twin has the same random-init weights)
    other = list(records)  # other records: built again
    run_lgip_multi.evaluate(ModelRun(twin, other, config))
    assert len(built) == 3


def test_fast_clip_encode_gives_open_clips_ids():
    """The fast path (plain ASCII skips ftfy and html.unescape; word ids kept) equals
    SimpleTokenizer.encode on random texts, plain or not; other texts take encode itself."""
    import random
    import open_clip
    tokenizer = open_clip.tokenizer.SimpleTokenizer()
    fast = _fast_clip_encode(tokenizer)
    rng = random.Random(0)
    plain = "".join(chr(c) for c in range(0x20, 0x7f) if chr(c) != "&")
    words = ["a", "photo", "of", "Dog", "DOGS", "isn't", "<end_of_text>", "<start_of_text>", "10:45", "x" * 40]
    texts = []
    for _ in range(3000):
        parts = [rng.choice(words) if rng.random() < 0.5 else "".join(rng.choice(plain) for _ in range(rng.randint(0, 12)))
                 for _ in range(rng.randint(0, 8))]
        texts.append((rng.choice([" ", "  ", ""])).join(parts))
    others = ["a &amp; b", "caf\u00e9 &lt;3", "tab\there", "new\nline", "cr\r\nlf", "\u201cquoted\u201d", "\x1b[31mred",
              "ﬁne ligature", "ｆｕｌｌ width", "mojibake Ã©", "nul\x00byte", "  &  ", "&#39;s"]
    assert [fast(t) for t in texts + others] == [tokenizer.encode(t) for t in texts + others]
    calls = []
    real = tokenizer.encode
    tokenizer.encode = lambda t: calls.append(t) or real(t)
    fast("A plain caption, as COCO's mostly are.")
    fast("caf\u00e9")
    assert calls == ["caf\u00e9"]
    other = open_clip.tokenizer.SimpleTokenizer(clean="whitespace")
    assert _fast_clip_encode(other) is None  # another cleaning: encode itself
