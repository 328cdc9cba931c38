"""A generative VLM's score of a text given an image (lgip/models/generative.py, LGIP_SPEC.md 13) on a
tiny random-init LLaVA: the scored tokens are the text's (by offsets), the score is the sum (or mean)
of their log-probabilities in one plain forward of the whole conversation, and running the image's
prefix once for every text gives the same scores to 1e-4 in float32."""

import os

import pytest
import torch
from PIL import Image

from conftest import FIXTURES
from tiny_vlm import (
    tiny_gemma3,
    tiny_idefics3,
    tiny_llava,
    tiny_llava_next,
    tiny_mllama,
    tiny_paligemma,
    tiny_qwen2_5_vl,
    tiny_qwen2_vl,
)

TEXTS = [
    "A red bus parked on the side of the street.",
    "two dogs",
    "A cat sits on a computer keyboard, looking up.",
    "a  photo of A red bus parked on the side of the street.",
    "Yes",
]


FAMILIES = {
    "llava": tiny_llava,
    "qwen2_vl": tiny_qwen2_vl,
    "gemma3": tiny_gemma3,
    "qwen2_5_vl": tiny_qwen2_5_vl,
    "llava_next": tiny_llava_next,
    "idefics3": tiny_idefics3,
    "mllama": tiny_mllama,
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def llava(request, tmp_path_factory):
    """A tiny generative VLM of each family: LLaVA-1.5's shape, Qwen2-VL's (multimodal rope: the image's
    positions compressed to its grid, every later position shifted by the rope deltas), Gemma 3's
    (sliding-window layers shorter than the conversation; the BOS written by its template), Qwen2.5-VL's
    (the rope deltas again, and transformers 4.57's own decoding step failing on a batch: the positions are
    given), LLaVA-NeXT's and SmolVLM's (Idefics3: the image in tiles, its token count set by its size;
    the fixture's images are 120 x 160 and 128 x 128) and Llama 3.2 Vision's (Mllama: one image token,
    the image read by cross-attention through a per-token mask over its tiles, which the texts' rows
    must continue)."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor

    build = FAMILIES[request.param]
    folder = build(tmp_path_factory.mktemp(request.param))
    processor = AutoProcessor.from_pretrained(folder)
    processor.image_processor = AutoImageProcessor.from_pretrained(folder, use_fast=False)
    return AutoModelForImageTextToText.from_pretrained(folder).eval(), processor


def _image(n=0):
    folder = os.path.join(FIXTURES, "images")
    return Image.open(os.path.join(folder, sorted(os.listdir(folder))[n])).convert("RGB")


def test_the_scored_tokens_are_the_texts_and_the_score_is_their_log_probability(llava):
    from lgip.models import generative
    from lgip.models.generative import DEFAULT_PROMPT, plain_scores, tokenized

    model, processor = llava
    for text in TEXTS:
        inputs, positions = tokenized(processor, _image(), DEFAULT_PROMPT, text)
        ids = inputs["input_ids"][0]
        bos = processor.tokenizer.bos_token_id
        assert (
            bos is None or int((ids == bos).sum()) <= 1
        )  # (a BOS once, as apply_chat_template(tokenize=True) adds it)
        conv = generative.conversation(DEFAULT_PROMPT, text)
        conv[0]["content"][0]["image"] = _image()  # (the library's own tokenizing of the conversation, image included)
        own = processor.apply_chat_template(conv, tokenize=True, return_dict=True, return_tensors="pt")
        assert torch.equal(own["input_ids"][0], ids)
        assert processor.tokenizer.decode(ids[positions]).strip() == text.strip()
        assert (
            positions == list(range(positions[0], positions[-1] + 1)) and positions[-1] < len(ids) - 1
        )  # (end of turn after)
        with torch.no_grad():
            logp = torch.log_softmax(model(**inputs).logits[0].double(), -1)
        restated = sum(float(logp[p - 1, ids[p]]) for p in positions)
        assert plain_scores(model, processor, _image(), DEFAULT_PROMPT, [text]) == pytest.approx([restated], abs=1e-4)
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
        assert prefix_scores(
            model, processor, _image(n), DEFAULT_PROMPT, TEXTS, mean=True, batch=batch
        ) == pytest.approx(plain_scores(model, processor, _image(n), DEFAULT_PROMPT, TEXTS, mean=True), abs=1e-4)


@pytest.mark.parametrize("packs", [1, 12, 4096])
def test_texts_packed_on_the_prefix_with_a_block_mask_give_the_plain_scores(llava, packs, monkeypatch):
    """TEXT_PACKS: every text's rest packed into rows of at most `packs` tokens (1: a text a row; 12: two or
    three a row; 4096: all in one), each text attending to the prefix and to itself: the plain scores to
    1e-4 (sum and mean, logprob and vqascore), one forward for the prefix and one per row, no repeated cache.
    Families outside PACKED_FAMILIES (Gemma 3's sliding windows, Mllama's cross-attention rows) are not
    packed: their batches run."""
    from lgip.models import generative
    from lgip.models.conversations import Conversations
    from lgip.models.joint import DEFAULT_QUESTION

    model, processor = llava
    conv = Conversations(processor)
    calls = []
    real_forward = model.forward
    monkeypatch.setattr(
        model, "forward", lambda *a, **k: calls.append(k.get("input_ids").shape) or real_forward(*a, **k)
    )
    for n in (0, 1):
        for convs in (
            [(generative.DEFAULT_PROMPT, t) for t in TEXTS],
            [(DEFAULT_QUESTION.format(t), "Yes") for t in TEXTS],
        ):
            for mean in (False, True):
                plain = generative.conversation_scores(model, processor, _image(n), convs, mean, reuse=False)
                calls.clear()
                packed = generative.conversation_scores(
                    model, processor, _image(n), convs, mean, reuse=True, packs=packs, conversations=conv
                )
                assert packed == pytest.approx(plain, abs=1e-4), (n, mean, convs[0])
                if generative.packable(model):
                    assert all(c[0] == 1 for c in calls) and (len(calls) == 2 if packs == 4096 else len(calls) > 2)
                    assert packs > 1 or len(calls) == 1 + len(convs)
    assert conv.refused is None


@pytest.mark.parametrize("size,lists,scored_logits", [(1, False, False), (3, False, False), (3, True, True)])
def test_images_grouped_in_one_forward_give_the_plain_scores(llava, size, lists, scored_logits, monkeypatch):
    """IMAGE_GROUPS: images of a family of GROUP_FAMILIES run `size` at a time in one forward with no cache,
    each row its prefix then its packed texts (rows of different lengths padded to WIDTH_STEP): the plain
    scores to 1e-4, sum and mean, logprob and vqascore, whatever the group's other images; a group runs
    when full or when one of its results is asked for. Other families go per image, the group unused. With
    TOKEN_LISTS (the texts' ids as lists, the rows made tensors once) and SCORED_LOGITS (the head on the scored
    positions only) the same."""
    from lgip.models import generative, image_groups
    from lgip.models.conversations import Conversations
    from lgip.models.joint import DEFAULT_QUESTION

    model, processor = llava
    conv = Conversations(processor)
    forwards = []
    # (the body: what the whole model runs, and SCORED_LOGITS runs apart from the head)
    body = getattr(model, "model", model)
    real_forward = body.forward
    monkeypatch.setattr(
        body,
        "forward",
        lambda *a, **k: forwards.append(getattr(k.get("input_ids"), "shape", None)) or real_forward(*a, **k),
    )
    jobs = [
        (_image(0), [(generative.DEFAULT_PROMPT, t) for t in TEXTS]),
        (_image(1), [(generative.DEFAULT_PROMPT, t) for t in TEXTS[:2]]),
        (_image(1), [(DEFAULT_QUESTION.format(t), "Yes") for t in TEXTS]),
    ]
    for mean in (False, True):
        want = [generative.conversation_scores(model, processor, im, cv, mean, reuse=False) for im, cv in jobs]
        group = image_groups.ImageGroup(model, mean, size, lists, scored_logits)
        forwards.clear()
        pending = [
            generative.submit(model, processor, im, cv, mean, conversations=conv, group=group) for im, cv in jobs
        ]
        got = [p.result() for p in pending]
        for g, w in zip(got, want):
            assert g == pytest.approx(w, abs=1e-4), mean
        if image_groups.groupable(model, conv.items(_image(0), jobs[0][1][:1])[0][0]):
            assert len(forwards) == (3 if size == 1 else 1) and forwards[-1][1] % image_groups.WIDTH_STEP == 0
            assert forwards[-1][0] == (1 if size == 1 else 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_lists_give_the_grouped_scores_bit_for_bit(llava, dtype):
    """TOKEN_LISTS (EXACT_DTYPES: every dtype): an image group's texts as lists of ids, its rows made tensors once,
    run the same forward as the rows cut from a tensor per text: the same scores bit for bit, fp32 and bf16; the
    lists are the splice's own ids and positions."""
    from lgip.models import generative, image_groups
    from lgip.models.conversations import Conversations

    model, processor = llava
    conv = Conversations(processor)
    jobs = [(_image(n), [(generative.DEFAULT_PROMPT, t) for t in TEXTS[: 5 - n]]) for n in (0, 1)]
    listed = conv.lists(*jobs[0])
    if not image_groups.groupable(model, conv.items(*jobs[0])[0][0]):
        assert listed is None or listed.ids  # (other families: the group unused)
        return
    items = conv.items(*jobs[0])
    assert listed.ids == [inp["input_ids"][0].tolist() for inp, _ in items]
    assert listed.positions == [pos for _, pos in items]
    assert all(torch.equal(a[0]["input_ids"], b[0]["input_ids"]) for a, b in zip(listed.items(), items))
    model = model.to(dtype)
    try:
        got = []
        for lists in (False, True):
            group = image_groups.ImageGroup(model, False, 2, lists=lists)
            pending = [generative.submit(model, processor, im, cv, conversations=conv, group=group) for im, cv in jobs]
            got.append([p.result() for p in pending])
        assert got[0] == got[1]
    finally:
        model.to(torch.float32)


def test_the_conversations_spliced_are_the_processors_own(llava):
    """CONVERSATION_SPLICE: one image's conversations tokenized in one batch, the image's tokens spliced in,
    are what the processor gives for each (ids, masks, token types, Mllama's cross-attention rows, the
    answer's positions), for every family and both fixture image sizes; the image processed once."""
    from lgip.models import generative
    from lgip.models.conversations import Conversations
    from lgip.models.joint import DEFAULT_QUESTION

    model, processor = llava
    conv = Conversations(processor)
    processed = []
    real = processor.image_processor.__class__.__call__
    for n in (0, 1):
        for convs in (
            [(generative.DEFAULT_PROMPT, t) for t in TEXTS],
            [(DEFAULT_QUESTION.format(t), "Yes") for t in TEXTS],
        ):
            processor.image_processor.__class__.__call__ = lambda self, *a, **k: (
                processed.append(1) or real(self, *a, **k)
            )
            try:
                got = conv.items(_image(n), convs)
            finally:
                processor.image_processor.__class__.__call__ = real
            assert len(processed) == 1
            processed.clear()
            for (inputs, positions), (prompt, answer) in zip(got, convs):
                own, own_positions = generative.tokenized(processor, _image(n), prompt, answer)
                assert positions == own_positions and set(inputs) == set(own)
                for key in own:
                    assert torch.equal(inputs[key], own[key]), (key, answer)
    assert conv.refused is None


def test_a_splice_that_differs_from_the_processor_is_refused_and_each_text_goes_through_it(llava, monkeypatch):
    """The splice is checked against the processor on a second conversation: tokens that differ (a tokenizer
    that merged across the image's end, made here by dropping a token) leave every conversation to the
    processor, `refused` says why, and the scores are still the plain ones."""
    from lgip.models import conversations, generative

    model, processor = llava
    real = conversations._encoded
    monkeypatch.setattr(
        conversations,
        "_encoded",
        lambda tok, texts, special: (
            lambda ids, offsets: ([i[:-2] + i[-1:] for i in ids], [o[:-2] + o[-1:] for o in offsets])
        )(*real(tok, texts, special)),
    )
    conv = conversations.Conversations(processor)
    convs = [(generative.DEFAULT_PROMPT, t) for t in TEXTS]
    got = conv.items(_image(), convs)
    assert conv.refused in (
        "the processor's tokens of a conversation differ from the splice's",
        "an answer's tokens come before the image's",
    )
    for (inputs, positions), (prompt, answer) in zip(got, convs):
        own, own_positions = generative.tokenized(processor, _image(), prompt, answer)
        assert positions == own_positions and torch.equal(inputs["input_ids"], own["input_ids"])
    scores = generative.conversation_scores(model, processor, _image(), convs, conversations=conv)
    assert scores == pytest.approx(
        generative.conversation_scores(model, processor, _image(), convs, reuse=False), abs=1e-4
    )


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
    real_plain = generative._plain
    monkeypatch.setattr(generative, "_plain", lambda *a, **k: plain.append(a) or real_plain(*a, **k))
    real_forward = model.forward
    monkeypatch.setattr(
        model, "forward", lambda *a, **k: calls.append(k.get("input_ids").shape) or real_forward(*a, **k)
    )
    generative.prefix_scores(model, processor, _image(), generative.DEFAULT_PROMPT, TEXTS, batch=2)
    assert plain == [] and len(calls) == 1 + 3  # the prefix, then 5 texts in batches of 2
    assert calls[0][0] == 1 and all(c[0] <= 2 for c in calls[1:])


def test_vqascore_conversations_share_the_question_up_to_the_caption(llava):
    """vqascore's conversations differ inside the user's turn (the caption in the question): the reuse
    runs what they share (the image and the question's start) once, and gives each plain forward's score
    of "Yes" to 1e-4."""
    from lgip.models import generative
    from lgip.models.joint import DEFAULT_QUESTION

    model, processor = llava
    convs = [(DEFAULT_QUESTION.format(t), "Yes") for t in TEXTS[:4]]
    plain = generative.conversation_scores(model, processor, _image(1), convs, reuse=False)
    assert generative.conversation_scores(model, processor, _image(1), convs, reuse=True, batch=3) == pytest.approx(
        plain, abs=1e-4
    )
    ids = [generative.tokenized(processor, _image(1), p, a)[0]["input_ids"][0] for p, a in convs]
    shared = generative._shared_length(ids, 10**6)
    assert generative._last_image_token(model, ids[0]) < shared < min(len(t) for t in ids) - 3


@pytest.fixture(scope="module")
def paligemma(tmp_path_factory):
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor

    folder = tiny_paligemma(tmp_path_factory.mktemp("pali"))
    processor = AutoProcessor.from_pretrained(folder)
    processor.image_processor = AutoImageProcessor.from_pretrained(folder, use_fast=False)
    return AutoModelForImageTextToText.from_pretrained(folder).eval(), processor


def _prefix_lm_restated(model, inputs, positions):
    """The answer's log-probability under a prefix-LM mask made here by hand (prefix: every prefix token;
    answer: the prefix and the answer up to itself), passed as a 4D mask the model takes as it is."""
    n = inputs["input_ids"].shape[1]
    prefix = positions[0]
    allowed = torch.zeros(n, n, dtype=torch.bool)
    allowed[:, :prefix] = True
    allowed |= torch.ones(n, n, dtype=torch.bool).tril()
    mask = torch.zeros(1, 1, n, n).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        logits = model(input_ids=inputs["input_ids"], pixel_values=inputs["pixel_values"], attention_mask=mask).logits[
            0
        ]
    logp = torch.log_softmax(logits.double(), -1)
    ids = inputs["input_ids"][0]
    return sum(float(logp[p - 1, ids[p]]) for p in positions)


def test_paligemma_is_scored_as_a_prefix_lm_with_its_prefix_run_once(paligemma):
    """PaliGemma (LGIP_SPEC.md 13): the answer's tokens are the suffix's less the end token; the plain score
    is the prefix-LM's (restated with a mask made by hand); without token types and labels the model
    attends over the whole text and the score differs (the trap); the prefix run once gives the plain
    scores to 1e-4; vqascore (the caption in the bidirectional prefix) runs whole, and equals its plain."""
    from lgip.models import generative
    from lgip.models.joint import DEFAULT_QUESTION

    model, processor = paligemma
    image = _image(1)
    convs = [("caption en", t) for t in TEXTS]
    for prompt, text in convs:
        inputs, positions = generative.prefix_lm_tokenized(processor, image, prompt, text)
        assert processor.tokenizer.decode(inputs["input_ids"][0][positions]).strip() == text.strip()
        plain = generative.prefix_lm_scores(model, processor, image, [(prompt, text)], reuse=False)[0]
        assert plain == pytest.approx(_prefix_lm_restated(model, inputs, positions), abs=1e-4)
    inputs, positions = generative.prefix_lm_tokenized(processor, image, "caption en", TEXTS[0])
    with torch.no_grad():
        unmasked = model(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], pixel_values=inputs["pixel_values"]
        ).logits[0]
    wrong = float(generative._token_logprobs(unmasked, inputs["input_ids"][0], positions).sum())
    assert abs(wrong - _prefix_lm_restated(model, inputs, positions)) > 1e-3
    plain = generative.conversation_scores(model, processor, image, convs, reuse=False)
    for batch in (1, 2, 16):
        assert generative.conversation_scores(model, processor, image, convs, reuse=True, batch=batch) == pytest.approx(
            plain, abs=1e-4
        )
    asks = [("answer en " + DEFAULT_QUESTION.format(t), "Yes") for t in TEXTS[:3]]
    assert generative.conversation_scores(model, processor, image, asks, reuse=True) == pytest.approx(
        generative.conversation_scores(model, processor, image, asks, reuse=False), abs=1e-6
    )


def test_each_familys_card_splits_its_parameters_into_image_and_text(llava):
    """Section 12's card of a generative VLM (lgip.models.cards.joint_card): the vision tower with its
    projector and the language model with its head, whatever each family calls them, adding up to the whole."""
    from lgip.models.cards import joint_card

    model, processor = llava
    card = joint_card({"type": "generative", "model_id": "tiny"}, model, processor)
    assert card["params_image"] > 0 and card["params_text"] > 0
    assert (
        card["params_image"] + card["params_text"] == card["params_total"] == sum(p.numel() for p in model.parameters())
    )
    assert card["architecture"] == model.config.model_type and card["loss"] == "next-token"
    # the side the model sees; a processor that sizes by pixel count (Qwen's min_pixels..max_pixels, which its
    # `size` holds as shortest_edge 3136) has none, and says why (section 12's factor leaves it out)
    if model.config.model_type.startswith("qwen"):
        assert card["image_size"] is None and "pixel count" in card["image_size_why"]
    else:
        assert card["image_size"] > 0 and "image_size_why" not in card
