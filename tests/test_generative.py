"""A generative VLM's score of a text given an image (lgip/models/generative.py, LGIP_SPEC.md 13) on a
tiny random-init LLaVA: the scored tokens are the text's (by offsets), the score is the sum (or mean)
of their log-probabilities in one plain forward of the whole conversation, and running the image's
prefix once for every text gives the same scores to 1e-4 in float32."""
import os

import pytest
import torch
from PIL import Image

from conftest import FIXTURES
from tiny_vlm import tiny_llava

TEXTS = ["A red bus parked on the side of the street.", "two dogs", "A cat sits on a computer keyboard, looking up.",
         "a  photo of A red bus parked on the side of the street.", "Yes"]


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    from transformers import AutoModelForImageTextToText, AutoProcessor
    folder = tiny_llava(tmp_path_factory.mktemp("llava"))
    return AutoModelForImageTextToText.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)


def _image(n=0):
    folder = os.path.join(FIXTURES, "images")
    return Image.open(os.path.join(folder, sorted(os.listdir(folder))[n])).convert("RGB")


def test_the_scored_tokens_are_the_texts_and_the_score_is_their_log_probability(llava):
    from lgip.models.generative import DEFAULT_PROMPT, plain_scores, tokenized
    model, processor = llava
    for text in TEXTS:
        inputs, positions = tokenized(processor, _image(), DEFAULT_PROMPT, text)
        ids = inputs["input_ids"][0]
        assert processor.tokenizer.decode(ids[positions]).strip() == text.strip()
        assert positions == list(range(positions[0], positions[-1] + 1)) and positions[-1] == len(ids) - 2  # (</s> after)
        with torch.no_grad():
            logp = torch.log_softmax(model(**inputs).logits[0].double(), -1)
        restated = sum(float(logp[p - 1, ids[p]]) for p in positions)
        assert plain_scores(model, processor, _image(), DEFAULT_PROMPT, [text]) == pytest.approx([restated], abs=1e-5)
        mean = plain_scores(model, processor, _image(), DEFAULT_PROMPT, [text], mean=True)[0]
        assert mean == pytest.approx(restated / len(positions), abs=1e-5)


@pytest.mark.parametrize("batch", [1, 2, 16])
def test_the_image_prefix_run_once_gives_the_plain_scores(llava, batch):
    from lgip.models.generative import DEFAULT_PROMPT, plain_scores, prefix_scores
    model, processor = llava
    for n in (0, 1):
        plain = plain_scores(model, processor, _image(n), DEFAULT_PROMPT, TEXTS)
        reused = prefix_scores(model, processor, _image(n), DEFAULT_PROMPT, TEXTS, batch=batch)
        assert reused == pytest.approx(plain, abs=1e-4), (n, batch)
        assert prefix_scores(model, processor, _image(n), DEFAULT_PROMPT, TEXTS, mean=True, batch=batch) == \
            pytest.approx(plain_scores(model, processor, _image(n), DEFAULT_PROMPT, TEXTS, mean=True), abs=1e-4)


def test_a_processor_without_a_chat_template_or_a_text_it_changes_is_named(llava):
    from lgip.errors import ModelError
    from lgip.models.generative import tokenized
    model, processor = llava
    template, processor.chat_template = processor.chat_template, None
    try:
        with pytest.raises(ModelError, match="has no chat template"):
            tokenized(processor, _image(), "Describe.", "a bus")
    finally:
        processor.chat_template = template
    with pytest.raises(ModelError, match="is not in"):
        tokenized(processor, _image(), "Describe.", "")


def test_every_text_of_the_fixture_runs_on_the_shared_prefix(llava, monkeypatch):
    """The reuse is real: no text falls back to a plain forward here (their tokens before their own are
    the shared prefix), and the model runs one prefix forward and one forward per batch."""
    from lgip.models import generative
    model, processor = llava
    plain, calls = [], []
    real_plain = generative.plain_scores
    monkeypatch.setattr(generative, "plain_scores", lambda *a, **k: plain.append(a) or real_plain(*a, **k))
    real_forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: calls.append(k.get("input_ids").shape) or real_forward(*a, **k))
    generative.prefix_scores(model, processor, _image(), generative.DEFAULT_PROMPT, TEXTS, batch=2)
    assert plain == [] and len(calls) == 1 + 3  # the prefix, then 5 texts in batches of 2
    assert calls[0][0] == 1 and all(c[0] <= 2 for c in calls[1:])
