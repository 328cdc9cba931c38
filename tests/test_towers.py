"""The exact faster tower forwards (lgip/models/towers.py) give the full forward's embeddings: open_clip
text batches cut to their longest text (CLIP and CustomTextCLIP), the last block for the pooled
position or the class token only, SigLIP's last layer for its pooled position only (and the
load-time check that drops it when it disagrees)."""

import json
import os

import pytest
import torch

from lgip.models import dual_encoders as transformers_models
from lgip.models.encoder import _as_features
from lgip.models import load_model
from lgip.texts import TextBank
from lgip.models.towers import _class_token_blocks, _plain_blocks, _siglip_text_last, _siglip_text_tower
from conftest import FIXTURES, OPENCLIP_TINY, SIGLIP_TINY, TEXTS, UNEVEN_TEXTS


def test_openclip_cut_to_longest_equals_full_context(openclip_tiny):
    """Causal mask + EOT pooling: cutting a batch to its longest text changes no embedding."""
    import open_clip

    enc = openclip_tiny
    full = open_clip.get_tokenizer(OPENCLIP_TINY["model_name"])(UNEVEN_TEXTS)  # padded to 77, as published
    with torch.no_grad():
        expected = torch.nn.functional.normalize(enc.model.encode_text(full), dim=-1)
    tokens = enc.tokenize(UNEVEN_TEXTS)
    longest = max(len(t) for t in tokens)
    assert enc.info["text_trimmed"] and enc.pad_length([5, 9]) is None and longest < 77
    cut = torch.zeros(len(UNEVEN_TEXTS), longest, dtype=torch.long)  # mixed lengths, cut to the longest
    for r, t in enumerate(tokens):
        cut[r, : len(t)] = torch.tensor(t)
    torch.testing.assert_close(enc.encode_tokens(cut), expected, atol=1e-6, rtol=0)
    bank = TextBank(enc)  # the bank's own batches (grouped by exact length) agree too
    slots = bank.add_call(UNEVEN_TEXTS)
    emb, rows = bank.encode(batch_size=2)
    torch.testing.assert_close(emb[rows[slots]], expected, atol=1e-6, rtol=0)


def test_custom_text_tower_cut_too(tmp_path):
    """CustomTextCLIP (EVA02-L-14's "custom_text": true) has the same causal text tower in
    model.text: it is cut to the longest text as well, through the is_causal attention blocks."""
    import open_clip

    cfg = json.load(open(os.path.join(FIXTURES, "models", "openclip-tiny", "open_clip_config.json")))
    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(
        json.dumps(dict(cfg, model_cfg=dict(cfg["model_cfg"], custom_text=True)))
    )
    torch.manual_seed(0)
    model = open_clip.create_model("local-dir:" + str(folder), pretrained=None)
    torch.save(model.state_dict(), folder / "open_clip_pytorch_model.bin")
    enc = load_model(
        {"name": "custom", "type": "openclip", "model_name": "local-dir:" + str(folder)}, "corrected", "cpu"
    )
    assert isinstance(enc.model, open_clip.CustomTextCLIP) and enc.info["text_trimmed"]
    assert _plain_blocks(enc.model.text.transformer) is not None
    full = open_clip.get_tokenizer("local-dir:" + str(folder))(UNEVEN_TEXTS)
    with torch.no_grad():
        expected = torch.nn.functional.normalize(enc.model.encode_text(full), dim=-1)
    bank = TextBank(enc)
    slots = bank.add_call(UNEVEN_TEXTS)
    emb, rows = bank.encode(batch_size=2)
    torch.testing.assert_close(emb[rows[slots]], expected, atol=1e-6, rtol=0)


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


def test_image_last_block_for_the_class_token_only(enc):
    """open_clip ViTs pooling their class token run the last block for that token alone: the
    same embeddings as open_clip's encode_image (1e-6); towers pooling otherwise keep the full
    forward."""
    import copy

    size = enc.model.visual.image_size
    x = torch.randn(
        3, 3, *(size if isinstance(size, tuple) else (size, size)), generator=torch.Generator().manual_seed(0)
    )
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
            batch[r, : len(row)] = torch.tensor(row[:width])
        with torch.no_grad():
            want = torch.nn.functional.normalize(
                _as_features(sig.model.get_text_features(input_ids=batch)).float(), dim=-1
            )
        torch.testing.assert_close(sig.encode_tokens(batch), want, atol=1e-6, rtol=0)
    assert _siglip_text_tower(torch.nn.Linear(2, 2)) is None


def test_siglip_last_layer_path_is_dropped_when_it_disagrees(monkeypatch):
    """The load-time check (fp32, before the cast) refuses a last-layer path that does not give
    get_text_features' embeddings: the full forward is used."""
    real = _siglip_text_last
    monkeypatch.setattr(transformers_models, "_siglip_text_last", lambda tower, ids: real(tower, ids) * 1.01 + 0.01)
    sig = load_model(SIGLIP_TINY, "corrected", "cpu")
    assert not sig.info["text_last_layer_pooled_position_only"]
    ids = torch.tensor([sig.tokenize(["a red bus"])[0]])
    with torch.no_grad():
        want = torch.nn.functional.normalize(_as_features(sig.model.get_text_features(input_ids=ids)).float(), dim=-1)
    torch.testing.assert_close(sig.encode_tokens(ids), want, atol=1e-6, rtol=0)
