"""lgip.models.itm: a cross-encoder's score of a text given an image (LGIP_SPEC.md 13, type "itm"): the
log-odds of a match, s = logit[1] - logit[0], from the image-text matching head of transformers'
`BlipForImageTextRetrieval` (`use_itm_head=True`: `itm_score`) or `Blip2ForImageTextRetrieval`
(`use_image_text_matching_head=True`: `logits_per_image`, the head's logits averaged over the query
tokens).

`plain_scores` runs the whole model once per text (the definition). `reused_scores` runs BLIP's vision
tower once per image and its text encoder, cross-attending to that one image's states, over batches of
texts (padded, masked: a BERT-style encoder's text never depends on its batch); BLIP-2's Q-Former
takes its query tokens with the text, so it runs whole, in batches. The two agree to 1e-4 in float32
(tests/test_joint.py).

    >>> plain_scores(model, processor, image, ["A red bus."])
    [1.7]
"""
from ..errors import ModelError


def head_kind(model):
    """"blip" or "blip2" by the model's class; ModelError for any other (the type's two heads)."""
    name = type(model).__name__
    if name == "BlipForImageTextRetrieval":
        return "blip"
    if name == "Blip2ForImageTextRetrieval":
        return "blip2"
    raise ModelError(f"{name} has no image-text matching head that type 'itm' reads (BlipForImageTextRetrieval, "
                     f"Blip2ForImageTextRetrieval)")


def _inputs(model, processor, image, texts):
    import torch
    enc = processor(images=[image] * len(texts), text=list(texts), return_tensors="pt", padding=True)
    limit = getattr(getattr(model.config, "text_config", model.config), "max_position_embeddings", None)
    if limit is not None and enc["input_ids"].shape[1] > limit:
        raise ModelError(f"a text is {enc['input_ids'].shape[1]} tokens, more than the model's context ({limit}): "
                         f"{max(texts, key=len)[:80]!r}")
    return {k: (v.to(model.device, model.dtype) if v.is_floating_point() else v.to(model.device))
            for k, v in enc.items() if isinstance(v, torch.Tensor)}


def _log_odds(logits):
    logits = logits.float()
    return (logits[:, 1] - logits[:, 0]).tolist()


def plain_scores(model, processor, image, texts):
    """The match log-odds of each text against `image`: the whole model run on that one pair."""
    import torch
    kind, out = head_kind(model), []
    for text in texts:
        inputs = _inputs(model, processor, image, [text])
        with torch.no_grad():
            if kind == "blip":
                logits = model(**inputs, use_itm_head=True).itm_score
            else:
                logits = model(**inputs, use_image_text_matching_head=True).logits_per_image
        out += _log_odds(logits)
    return out


def reused_scores(model, processor, image, texts, batch=64):
    """plain_scores' numbers with the image encoded once (BLIP) and the texts in batches."""
    import torch
    if not texts:
        return []
    kind, out = head_kind(model), []
    if kind == "blip":
        pixels = _inputs(model, processor, image, texts[:1])["pixel_values"]
        with torch.no_grad():
            states = model.vision_model(pixel_values=pixels).last_hidden_state
    for b in range(0, len(texts), batch):
        group = list(texts[b:b + batch])
        inputs = _inputs(model, processor, image, group)
        with torch.no_grad():
            if kind == "blip":
                n = len(group)
                hidden = states.expand(n, -1, -1)
                text = model.text_encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                          encoder_hidden_states=hidden,
                                          encoder_attention_mask=torch.ones(hidden.shape[:-1], dtype=torch.long,
                                                                            device=hidden.device))
                logits = model.itm_head(text.last_hidden_state[:, 0, :])
            else:
                logits = model(**inputs, use_image_text_matching_head=True).logits_per_image
        out += _log_odds(logits)
    return out
