"""The tiny generative and matching models the scorer tests build (tests/tiny_vlm.py; LGIP_SPEC.md 13):
made offline from their configs, read back as a Hub id would be, and run: LLaVA's chat template
renders [user: image, prompt; assistant: caption], its tokens carry one BOS and the image's tokens,
and the fast tokenizer's offsets find the caption's tokens; BLIP's matching head scores a pair."""

import os

import torch
from PIL import Image

from conftest import FIXTURES
from tiny_vlm import tiny_blip_itm, tiny_llava

CAPTION = "A red bus parked on the side of the street."


def _image():
    folder = os.path.join(FIXTURES, "images")
    return Image.open(os.path.join(folder, sorted(os.listdir(folder))[0])).convert("RGB")


def test_a_tiny_llava_builds_offline_and_scores_a_caption_through_its_chat_template(tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = tiny_llava(tmp_path / "llava")
    model, processor = AutoModelForImageTextToText.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)
    conversation = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image."}]},
        {"role": "assistant", "content": [{"type": "text", "text": CAPTION}]},
    ]
    text = processor.apply_chat_template(conversation)
    assert text == f"USER: <image>\nDescribe the image. ASSISTANT: {CAPTION}</s>"
    inputs = processor(images=_image(), text=text, return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    tok = processor.tokenizer
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert ids.count(model.config.image_token_index) == 4  # (32 px, patch 16: 2 x 2 image tokens)
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, len(ids), model.config.text_config.vocab_size) and torch.isfinite(logits).all()
    # the caption's tokens by the fast tokenizer's offsets (its characters' span in the rendered text; a
    # token straddling the span's start is the caption's, one straddling its end is not: section 13)
    start = text.rindex(CAPTION)
    end = start + len(CAPTION)
    enc = tok(text, return_offsets_mapping=True)
    caption = [t for t, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if start < b <= end]
    assert tok.decode(caption).strip() == CAPTION and tok.decode(enc["input_ids"][-1:]) == "</s>"


def test_a_tiny_blip_matching_head_scores_a_pair(tmp_path):
    from transformers import AutoProcessor, BlipForImageTextRetrieval

    folder = tiny_blip_itm(tmp_path / "blip")
    model, processor = BlipForImageTextRetrieval.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)
    inputs = processor(
        images=[_image(), _image()], text=[CAPTION, "two dogs on the beach"], return_tensors="pt", padding=True
    )
    assert processor.tokenizer.unk_token_id not in inputs["input_ids"][0].tolist()  # (the captions' words are known)
    with torch.no_grad():
        scores = model(**inputs, use_itm_head=True).itm_score
    assert scores.shape == (2, 2) and torch.isfinite(scores).all() and not torch.equal(scores[0], scores[1])
