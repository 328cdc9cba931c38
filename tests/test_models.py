"""Model loading and text encoding: trimming proof, SigLIP padding, QuickGELU, bad specs, bad images."""
import json
import os
import shutil

import numpy as np
import pytest
import torch

from lgip.encoder import _as_features
from lgip.errors import ModelError
from lgip.images import open_rgb
from lgip.models import PUBLISHED_MODELS, load_model
from lgip.openclip_models import openclip_create_kwargs
from lgip.records import iter_records
from lgip.texts import TextBank
from lgip.tokens import TokenTable
from lgip.towers import _plain_blocks
from conftest import FIXTURES, OPENCLIP_TINY, REFERENCE, SIGLIP_TINY, eval_args, run_script

TEXTS = ["dog", "a red bus waiting at a stop",
         "A very long caption about two white dogs and one person walking on the beach near a pier at sunset"]


@pytest.fixture(scope="module")
def openclip_tiny():
    return load_model(OPENCLIP_TINY, "reference", "cpu")


@pytest.fixture(scope="module")
def siglip_tiny():
    return load_model(SIGLIP_TINY, "corrected", "cpu")


def test_openclip_cut_to_longest_equals_full_context(openclip_tiny):
    """Causal mask + EOT pooling: cutting a batch to its longest text changes no embedding."""
    import open_clip
    enc = openclip_tiny
    full = open_clip.get_tokenizer(OPENCLIP_TINY["model_name"])(TEXTS)  # padded to 77, as published
    with torch.no_grad():
        expected = torch.nn.functional.normalize(enc.model.encode_text(full), dim=-1)
    tokens = enc.tokenize(TEXTS)
    longest = max(len(t) for t in tokens)
    assert enc.info["text_trimmed"] and enc.pad_length([5, 9]) is None and longest < 77
    cut = torch.zeros(len(TEXTS), longest, dtype=torch.long)  # mixed lengths, cut to the longest
    for r, t in enumerate(tokens):
        cut[r, :len(t)] = torch.tensor(t)
    torch.testing.assert_close(enc.encode_tokens(cut), expected, atol=1e-6, rtol=0)
    bank = TextBank(enc)  # the bank's own batches (grouped by exact length) agree too
    slots = bank.add_call(TEXTS)
    emb, rows = bank.encode(batch_size=2)
    torch.testing.assert_close(emb[rows[slots]], expected, atol=1e-6, rtol=0)


def test_custom_text_tower_cut_too(tmp_path):
    """CustomTextCLIP (EVA02-L-14's "custom_text": true) has the same causal text tower in
    model.text: it is cut to the longest text as well, through the is_causal attention blocks."""
    import open_clip
    cfg = json.load(open(os.path.join(FIXTURES, "models", "openclip-tiny", "open_clip_config.json")))
    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(json.dumps(
        dict(cfg, model_cfg=dict(cfg["model_cfg"], custom_text=True))))
    torch.manual_seed(0)
    model = open_clip.create_model("local-dir:" + str(folder), pretrained=None)
    torch.save(model.state_dict(), folder / "open_clip_pytorch_model.bin")
    enc = load_model({"name": "custom", "type": "openclip", "model_name": "local-dir:" + str(folder)}, "corrected", "cpu")
    assert isinstance(enc.model, open_clip.CustomTextCLIP) and enc.info["text_trimmed"]
    assert _plain_blocks(enc.model.text.transformer) is not None
    full = open_clip.get_tokenizer("local-dir:" + str(folder))(TEXTS)
    with torch.no_grad():
        expected = torch.nn.functional.normalize(enc.model.encode_text(full), dim=-1)
    bank = TextBank(enc)
    slots = bank.add_call(TEXTS)
    emb, rows = bank.encode(batch_size=2)
    torch.testing.assert_close(emb[rows[slots]], expected, atol=1e-6, rtol=0)


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


@pytest.mark.parametrize("spec,message", [
    ({"name": "x", "type": "clip"}, "unknown type 'clip'; valid: openclip, siglip"),
    ({"name": "x", "type": "openclip", "model_name": "ViT-B-61", "pretrained": "openai"}, "unknown open_clip model_name 'ViT-B-61'; close matches: ViT-B-16"),
    ({"name": "x", "type": "openclip", "model_name": "ViT-B-16", "pretrained": "opneai"}, "unknown pretrained tag 'opneai' for open_clip ViT-B-16; valid: openai"),
    ({"name": "x", "type": "siglip"}, "needs 'model_id'"),
])
def test_bad_model_spec_lists_valid_choices(spec, message):
    with pytest.raises(ModelError, match=message.replace("(", r"\(")):
        load_model(spec, "corrected", "cpu")


@pytest.mark.parametrize("spec", [
    {"name": "siglip_offline", "type": "siglip", "model_id": "google/siglip-base-patch16-224"},
    {"name": "openclip_offline", "type": "openclip", "model_name": "ViT-B-32", "pretrained": "laion2b_s34b_b79k"},
])
def test_weights_that_cannot_be_downloaded_name_model_and_local_copy(tmp_path, monkeypatch, spec):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache: nothing to fall back on
    import huggingface_hub.constants as hc
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError) as err:
        load_model(spec, "corrected", "cpu")
    msg = str(err.value)
    assert spec["name"] in msg and "local" in msg


def make_bad_images(folder):
    """One image per case, referenced by the 12 fixture records in this order."""
    from PIL import Image
    src = os.path.join(FIXTURES, "images", "000000000001.jpg")
    rgb = Image.open(src).convert("RGB")
    os.makedirs(folder / "images")
    cases = {}

    def path(k):
        return folder / "images" / f"{k:012d}.jpg"

    cases[1] = "ok"; shutil.copy(src, path(1))
    cases[2] = "missing"
    cases[3] = "empty"; path(3).write_bytes(b"")
    data = open(src, "rb").read()
    cases[4] = "truncated"; path(4).write_bytes(data[: len(data) // 2])
    cases[5] = "not an image"; path(5).write_text("this is not a jpeg")
    cases[6] = "grayscale"; rgb.convert("L").save(path(6), "JPEG")
    cases[7] = "cmyk"; rgb.convert("CMYK").save(path(7), "JPEG")
    cases[8] = "palette+transparency"; p = rgb.convert("P"); p.info["transparency"] = 0; p.save(path(8), "PNG")
    cases[9] = "rgba"; rgb.convert("RGBA").save(path(9), "PNG")
    for k in (10, 11, 12):
        shutil.copy(os.path.join(FIXTURES, "images", f"{k:012d}.jpg"), path(k))
    return cases


def test_bad_images_are_skipped_counted_and_listed(tmp_path):
    make_bad_images(tmp_path)
    src = tmp_path / "in.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), src)
    proc = run_script("run_lgip_multi.py", *eval_args(src, "corrected", [OPENCLIP_TINY], image_root=tmp_path))
    m = json.load(open(tmp_path / "in__LGIP_tiny_openclip.metrics.json"))
    assert m["num_samples"] == 8 and m["run"]["num_failed_images"] == 4
    good = [rec for _, rec in iter_records(str(src)) if rec["image_id"] not in (2, 3, 4, 5)]
    assert m["num_invariance_pairs"] == sum(len(v) for rec in good for v in rec["same_caps"].values())
    assert m["num_sensitivity_pairs"] == sum(len(v) for rec in good for v in rec["diff_caps"].values())
    failed = {os.path.basename(f["path"]): f["error"] for f in m["run"]["failed_images"]}
    assert set(failed) == {f"{k:012d}.jpg" for k in (2, 3, 4, 5)}
    assert "empty" in failed["000000000003.jpg"] and "truncated" in failed["000000000004.jpg"]
    assert "skipping unreadable image" in proc.stderr and "4 unreadable images" in proc.stdout


@pytest.mark.parametrize("mode", ["L", "CMYK", "P", "RGBA", "LA", "I;16"])
def test_open_rgb_converts_every_mode(tmp_path, mode):
    from PIL import Image
    img = Image.new("RGB", (8, 8), (200, 30, 40)).convert(mode)
    path = tmp_path / ("x.png" if mode not in ("CMYK",) else "x.jpg")
    if mode == "P":
        img.info["transparency"] = 0
    img.save(path)
    assert open_rgb(path).mode == "RGB"


def test_malformed_eval_record_stops_with_file_line(tmp_path):
    lines = open(os.path.join(REFERENCE, "fixture_with_perturb.jsonl")).read().splitlines()
    rec = json.loads(lines[4])
    rec["diff_caps"]["2"] = "not a list"
    lines[4] = json.dumps(rec)
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    proc = run_script("run_lgip_multi.py", *eval_args(src, models=[OPENCLIP_TINY]), check=False)
    assert proc.returncode == 2 and f"{src}:5: field 'diff_caps.2' is str" in proc.stderr


def test_unknown_model_type_stops_script(tmp_path):
    src = tmp_path / "in.jsonl"
    shutil.copy(os.path.join(REFERENCE, "fixture_with_perturb.jsonl"), src)
    proc = run_script("run_lgip_multi.py", *eval_args(src, models=[{"name": "m", "type": "blip"}]), check=False)
    assert proc.returncode == 2 and "unknown type 'blip'; valid: openclip, siglip" in proc.stderr


def test_parallel_tokenization_matches_serial(openclip_tiny):
    texts = [f"a photo of {n} red buses number {n}" for n in range(300)] + TEXTS
    serial, parallel = TokenTable(), TokenTable()
    TextBank(openclip_tiny, 0)._tokenize(texts, serial, chunk=16)
    TextBank(openclip_tiny, 2)._tokenize(texts, parallel, chunk=16)  # > 8 chunks: worker processes
    assert serial.row == parallel.row and len(serial) == len(set(texts))
    assert all(np.array_equal(a, b) for a, b in zip(serial.packed(), parallel.packed()))
    assert all(serial.ids(t).tolist() == openclip_tiny.tokenize([t])[0] for t in TEXTS)
