"""The loaders and their registry (lgip/models/registry.py, lgip/models/openclip.py,
lgip/models/dual_encoders.py, lgip/models/own_loader.py): SigLIP's padding in each protocol, QuickGELU for
the weights trained with it, bad model specs and weights that cannot be downloaded, open_clip models
built on their device."""

import os
import shutil

import pytest
import torch

from lgip.models.encoder import _as_features
from lgip.errors import ModelError
from lgip.models import PUBLISHED_MODELS, load_model
from lgip.models.openclip import _create_openclip_on, openclip_create_kwargs
from lgip.texts import TextBank
from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, SIGLIP_TINY, eval_args, run_script
from conftest import UNEVEN_TEXTS as TEXTS


@pytest.fixture(scope="module")
def siglip_tiny():
    return load_model(SIGLIP_TINY, "corrected", "cpu")


def test_siglip_corrected_same_embedding_alone_or_beside_longer(siglip_tiny):
    bank = TextBank(siglip_tiny)
    alone = bank.add_call(TEXTS[:1])
    beside = bank.add_call(TEXTS)
    emb, rows = bank.encode(batch_size=2)
    assert torch.equal(emb[rows[alone[0]]], emb[rows[beside[0]]])
    assert bank.n_unique == 3  # corrected protocol: one embedding per text


def test_siglip_reference_pads_each_call_to_its_longest():
    enc = load_model(SIGLIP_TINY, "reference", "cpu")
    bank = TextBank(enc)
    alone = bank.add_call(TEXTS[:1])
    beside = bank.add_call(TEXTS)
    emb, rows = bank.encode(batch_size=512)
    assert bank.n_unique == 4  # "dog" twice: padded to 2 different lengths
    cos = float(emb[rows[alone[0]]] @ emb[rows[beside[0]]])
    assert cos < 0.999  # the published encoding makes a caption depend on its neighbours


def test_siglip_reference_matches_processor_call():
    """Reference protocol encodes exactly as processor(text=call, padding=True, truncation=True)."""
    from transformers import AutoModel, AutoProcessor

    enc = load_model(SIGLIP_TINY, "reference", "cpu")
    proc = AutoProcessor.from_pretrained(SIGLIP_TINY["model_id"])
    model = AutoModel.from_pretrained(SIGLIP_TINY["model_id"]).eval()
    inputs = proc(text=TEXTS, padding=True, truncation=True, return_tensors="pt")
    assert set(inputs) == {"input_ids"}
    with torch.no_grad():
        expected = torch.nn.functional.normalize(_as_features(model.get_text_features(**inputs)), dim=-1)
    bank = TextBank(enc)
    slots = bank.add_call(TEXTS)
    emb, rows = bank.encode(batch_size=2)
    torch.testing.assert_close(emb[rows[slots]], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("spec", [m for m in PUBLISHED_MODELS if m["type"] == "openclip"])
def test_quick_gelu_for_weights_trained_with_it(spec):
    import open_clip

    name, tag, corrected = openclip_create_kwargs(spec, "corrected")
    _, _, reference = openclip_create_kwargs(spec, "reference")
    trained_with_quick_gelu = bool(open_clip.get_pretrained_cfg(name, tag).get("quick_gelu"))
    assert trained_with_quick_gelu == (tag == "openai")
    assert corrected == ({"force_quick_gelu": True} if tag == "openai" else {})
    assert reference == {}  # the published code builds these with GELU


def test_force_quick_gelu_reaches_the_network():
    """The kwarg really swaps the activation (built from a local config: no download)."""
    import open_clip
    from open_clip.transformer import QuickGELU

    model = open_clip.create_model(OPENCLIP_TINY["model_name"], force_quick_gelu=True)
    assert any(isinstance(m, QuickGELU) for m in model.modules())
    assert not load_model(OPENCLIP_TINY, "corrected", "cpu").info["quick_gelu"]


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"name": "x", "type": "clip"}, "unknown type 'clip'; valid: openclip, transformers, siglip, python"),
        (
            {"name": "x", "type": "openclip", "model_name": "ViT-B-61", "pretrained": "openai"},
            "unknown open_clip model_name 'ViT-B-61'; close matches: ViT-B-16",
        ),
        (
            {"name": "x", "type": "openclip", "model_name": "ViT-B-16", "pretrained": "opneai"},
            "unknown pretrained tag 'opneai' for open_clip ViT-B-16; valid: openai",
        ),
        ({"name": "x", "type": "siglip"}, "needs 'model_id'"),
    ],
)
def test_bad_model_spec_lists_valid_choices(spec, message):
    with pytest.raises(ModelError, match=message.replace("(", r"\(")):
        load_model(spec, "corrected", "cpu")


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "siglip_offline", "type": "siglip", "model_id": "google/siglip-base-patch16-224"},
        {"name": "openclip_offline", "type": "openclip", "model_name": "ViT-B-32", "pretrained": "laion2b_s34b_b79k"},
    ],
)
def test_weights_that_cannot_be_downloaded_name_model_and_local_copy(tmp_path, monkeypatch, spec):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache: nothing to fall back on
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError) as err:
        load_model(spec, "corrected", "cpu")
    msg = str(err.value)
    assert spec["name"] in msg and "local" in msg


def test_unknown_model_type_stops_script(tmp_path):
    src = tmp_path / "in.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), src)
    proc = run_script("run_lgip_multi.py", *eval_args(src, models=[{"name": "m", "type": "blip"}]), check=False)
    assert proc.returncode == 2 and "unknown type 'blip'; valid: openclip, transformers, siglip, python" in proc.stderr


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


def test_siglip2_texts_are_lowercased_when_corrected_only(tmp_path):
    """SigLIP2 was trained on lowercased text (section 6): the corrected protocol lowercases every
    text before its tokenizer, the reference protocol does not, nor for SigLIP (1); the tokenizer's
    identity (cache keys, shared token tables) says which. The fixture's tokenizers fold case
    themselves, so a stand-in tokenizer shows what reaches it; the loaded models show the rule."""
    from types import SimpleNamespace
    from lgip.models.dual_encoders import _tokenize_fn, text_rules

    class Seen:
        model_max_length = 64

        def __len__(self):
            return 100

        def __call__(self, texts, **kwargs):
            self.texts = list(texts)
            return {"input_ids": [[1] for _ in texts]}

    siglip = SimpleNamespace(model_type="siglip")  # (SigLIP2's fixed-resolution checkpoints say "siglip" too)
    cases = [
        ("google/siglip2-base-patch16-224", "corrected", True),
        ("google/siglip2-base-patch16-224", "reference", False),
        ("google/siglip-base-patch16-224", "corrected", False),
    ]
    identities = set()
    for model_id, protocol, lowered in cases:
        tok = Seen()
        tokenize, identity = _tokenize_fn(tok, text_rules({"model_id": model_id}, protocol, siglip, None, tok))
        tokenize(["Two DOGS on a Beach"])
        assert tok.texts == ["two dogs on a beach" if lowered else "Two DOGS on a Beach"], (model_id, protocol)
        identities.add(identity)
    assert len(identities) == 2  # (lowercased or not)
    copy = tmp_path / "siglip2-tiny"
    shutil.copytree(SIGLIP_TINY["model_id"], copy)
    for protocol, lowered in (("corrected", True), ("reference", False)):
        enc = load_model({"name": "s2", "type": "siglip", "model_id": str(copy)}, protocol, "cpu")
        assert enc.info["lowercase"] is lowered, protocol
    assert load_model(SIGLIP_TINY, "corrected", "cpu").info["lowercase"] is False


def test_a_loaded_model_and_a_weightless_one_are_their_declared_types(siglip_tiny):
    """Every loader returns an Encoder built from its declared keywords (what a loader fills in), named
    by the registry; a model without weights is a KeyEncoder: it makes the cache keys and encodes nothing."""
    from lgip.models import key_encoder
    from lgip.models.encoder import Encoder, KeyEncoder

    for spec, enc in ((SIGLIP_TINY, siglip_tiny), (OPENCLIP_TINY, load_model(OPENCLIP_TINY, "corrected", "cpu"))):
        assert type(enc) is Encoder and enc.weights_loaded and (enc.name, enc.type) == (spec["name"], spec["type"])
        for field in ("model", "tokenize", "encode_tokens", "encode_images", "image_transform", "pad_length"):
            assert getattr(enc, field) is not None, (spec["name"], field)
        keys = key_encoder(spec, "corrected", "cpu")
        assert type(keys) is KeyEncoder and not keys.weights_loaded and keys.info == {"weights_loaded": False}
        assert keys.encode_tokens is keys.encode_images is keys.model is None and keys.name == spec["name"]
        assert keys.text_key_tag == enc.text_key_tag and keys.pad_length([3, 5]) == enc.pad_length([3, 5])
