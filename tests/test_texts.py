"""The published calls and their encoding (lgip/texts.py and what it stands on): the TextBank's
batches and uploads, the "auto" text batch, token tables shared by models that tokenize alike
(lgip/tokens.py), CLIP token ids fast (lgip/models/clip_tokenizer.py), parallel tokenization, prefix-tree
packs (lgip/models/prefix_packs.py), and the calls a run's models share."""

import glob
import os

import numpy as np
import pytest
import torch

from lgip.models import prefix_packs
from lgip.cache import ModelCache
from lgip.models.clip_tokenizer import _fast_clip_encode
from lgip.errors import ModelError
from lgip.evaluation import ModelRun, forget_token_tables, swap_process_state
from lgip.models import load_model
from lgip.models.prefix_packs import PrefixPacks
from lgip.records import load_records
from lgip.memory import KEPT
from lgip.texts import TextBank, resolve_text_batch_size
from lgip.tokens import TokenTable, _pack
from conftest import FIXTURES, OPENCLIP_TINY, TEXTS, UNEVEN_TEXTS


def test_text_batch_size_auto_and_checked():
    assert resolve_text_batch_size("auto", "cuda") == 2048
    assert resolve_text_batch_size("auto", "cuda:1") == 2048
    assert resolve_text_batch_size("auto", "cpu") == 64
    assert resolve_text_batch_size(None, "cpu") == 64 and resolve_text_batch_size(7, "cuda") == 7
    for bad in (0, -3, "big", 2.5):
        with pytest.raises(ModelError, match="TEXT_BATCH_SIZE"):
            resolve_text_batch_size(bad, "cpu")


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
    expected = sorted(
        todo, key=lambda k: ((0, keys[k][1]) if keys[k][1] else (1, lengths[keys[k][0]]), lengths[keys[k][0]])
    )
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
    for max_tokens in (1, 5, 10**6):  # a group per batch, a few batches per group, one group
        out = list(bank._on_device(batches, texts_of, tokens, max_tokens=max_tokens))
        assert [b for b, _ in out] == batches
        for (b, (ids, exact)), (rows, pad) in zip(out, texts_of):
            assert exact and pad is None
            assert np.array_equal(ids.numpy(), bank._ids(rows, pad, tokens))
            assert all(ids[r, -1] == tokens.ids(keys[k][0]).max() for r, k in enumerate(b))  # EOT last: no padding


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


def test_openclip_tokenize_keeps_texts_whole_through_id_zero(enc):
    """open_clip's id 0 is "!" (also the padding value): 'a sign saying "stop!".' holds it mid-text.
    Tokens run to EOT (where the tower pools), equal open_clip's own padded rows, and the cut
    embedding equals the model's encode_text on the full 77-token row."""
    import open_clip

    tricky = [
        'a sign saying "stop!".',
        "x !(",
        "A café — naïve “quotes” &amp; 3½",
        " ".join(["word"] * 90),
        "dog",
    ]
    tok = open_clip.get_tokenizer("local-dir:" + os.path.join(FIXTURES, "models", "openclip-tiny"))
    full = tok(tricky)
    ids = enc.tokenize(tricky)
    assert 0 in ids[0][1:-1]
    for row, cut in zip(full, ids):
        assert cut == row[: len(cut)].tolist() and not row[len(cut) :].any() and cut[-1] == tok.eot_token_id
    assert len(ids[3]) == enc.context_length
    with torch.no_grad():
        want = torch.nn.functional.normalize(enc.model.encode_text(full[:1]).float(), dim=-1)
    torch.testing.assert_close(enc.encode_tokens(torch.tensor(ids[:1])), want, atol=1e-5, rtol=0)


PREFIX_TEXTS = [
    "a photo of a dog.",
    "a photo of a dog on a mat.",
    "a photo of a cat.",
    "A photo of a dog.",
    "a photo of",
    "dog",
    "In this image, a dog.",
    "In this image, two dogs.",
    "a photo of a red bus",
    "a photo of a blue bus",
    'a sign saying "stop!" twice',
    "a photo of a dog. <end_of_text> ignored",
    "A very long caption about two white dogs and one person walking on the beach near a pier " * 6,
]


def _plan(enc, texts, size, packs_per_batch):
    tokens = TokenTable()
    tokens.add(texts, *_pack(enc.tokenize(texts)))
    flat, starts, lengths = tokens.packed()
    return tokens, PrefixPacks(flat, starts, lengths, np.arange(len(texts)), size=size, packs_per_batch=packs_per_batch)


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
            nodes = path[t, : len(want)]
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
    cache = ModelCache(str(tmp_path), enc, OPENCLIP_TINY)
    bank = TextBank(enc)
    slots = bank.add_call(texts)
    emb, rows = bank.encode(batch_size=8, cache=cache)
    torch.testing.assert_close(emb[rows[slots]], want, atol=1e-6, rtol=0)
    import json

    keys = [k for c in glob.glob(os.path.join(cache.dir, "text-*.npz")) for k in json.loads(bytes(np.load(c)["keys"]))]
    assert keys and all(k.startswith("eot2|") for k in keys)


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
    assert KEPT.plan is None


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
    config = {
        "JSONL_PATH": str(jsonl),
        "IMAGE_ROOT": FIXTURES,
        "PROTOCOL": protocol,
        "DEVICE": "cpu",
        "DTYPE": "fp32",
        "IMAGE_BATCH_SIZE": 4,
        "TEXT_BATCH_SIZE": 16,
        "NUM_WORKERS": 0,
        "CACHE_DIR": None,
    }
    records = load_records(str(jsonl), ("same_caps", "diff_caps"))
    twin = dict(spec, name="twin")
    built, tokenized = [], []
    real_build, real_tokenize = run_lgip_multi.published_calls, TextBank._tokenize
    monkeypatch.setattr(run_lgip_multi, "published_calls", lambda *data: built.append(1) or real_build(*data))
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
    plain = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "&")
    words = ["a", "photo", "of", "Dog", "DOGS", "isn't", "<end_of_text>", "<start_of_text>", "10:45", "x" * 40]
    texts = []
    for _ in range(3000):
        parts = [
            rng.choice(words) if rng.random() < 0.5 else "".join(rng.choice(plain) for _ in range(rng.randint(0, 12)))
            for _ in range(rng.randint(0, 8))
        ]
        texts.append((rng.choice([" ", "  ", ""])).join(parts))
    others = [
        "a &amp; b",
        "caf\u00e9 &lt;3",
        "tab\there",
        "new\nline",
        "cr\r\nlf",
        "\u201cquoted\u201d",
        "\x1b[31mred",
        "ﬁne ligature",
        "ｆｕｌｌ width",
        "mojibake Ã©",
        "nul\x00byte",
        "  &  ",
        "&#39;s",
    ]
    assert [fast(t) for t in texts + others] == [tokenizer.encode(t) for t in texts + others]
    calls = []
    real = tokenizer.encode
    tokenizer.encode = lambda t: calls.append(t) or real(t)
    fast("A plain caption, as COCO's mostly are.")
    fast("caf\u00e9")
    assert calls == ["caf\u00e9"]
    other = open_clip.tokenizer.SimpleTokenizer(clean="whitespace")
    assert _fast_clip_encode(other) is None  # another cleaning: encode itself


def test_parallel_tokenization_matches_serial(openclip_tiny):
    texts = [f"a photo of {n} red buses number {n}" for n in range(300)] + UNEVEN_TEXTS
    serial, parallel = TokenTable(), TokenTable()
    TextBank(openclip_tiny, 0)._tokenize(texts, serial, chunk=16)
    TextBank(openclip_tiny, 2)._tokenize(texts, parallel, chunk=16)  # > 8 chunks: worker processes
    assert serial.row == parallel.row and len(serial) == len(set(texts))
    assert all(np.array_equal(a, b) for a, b in zip(serial.packed(), parallel.packed()))
    assert all(serial.ids(t).tolist() == openclip_tiny.tokenize([t])[0] for t in UNEVEN_TEXTS)
