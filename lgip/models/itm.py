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
    """ "blip" or "blip2" by the model's class; ModelError for any other (the type's two heads)."""
    name = type(model).__name__
    if name == "BlipForImageTextRetrieval":
        return "blip"
    if name == "Blip2ForImageTextRetrieval":
        return "blip2"
    raise ModelError(
        f"{name} has no image-text matching head that type 'itm' reads (BlipForImageTextRetrieval, "
        f"Blip2ForImageTextRetrieval)"
    )


def _inputs(model, processor, image, texts):
    import torch

    enc = processor(images=[image] * len(texts), text=list(texts), return_tensors="pt", padding=True)
    limit = getattr(getattr(model.config, "text_config", model.config), "max_position_embeddings", None)
    if limit is not None and enc["input_ids"].shape[1] > limit:
        raise ModelError(
            f"a text is {enc['input_ids'].shape[1]} tokens, more than the model's context ({limit}): "
            f"{max(texts, key=len)[:80]!r}"
        )
    return {
        k: (v.to(model.device, model.dtype) if v.is_floating_point() else v.to(model.device))
        for k, v in enc.items()
        if isinstance(v, torch.Tensor)
    }


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


LENGTH_STEP = 16  # texts run padded to a multiple of this many tokens, by their own length


def reused_scores(model, processor, image, texts, batch=64):
    """plain_scores' numbers with the image processed once (and BLIP's vision tower run once) and the texts
    in batches. Each text runs in a batch of exactly `batch` rows (filled with copies of its first text)
    padded to its own length rounded up to LENGTH_STEP, with texts of that same padded length: every text's
    arithmetic has one shape whatever texts share its image's call, so its score is the same bits in one
    process or split over torchrun's (where an image's texts arrive in other groups)."""
    import torch

    if not texts:
        return []
    kind = head_kind(model)
    one = _inputs(model, processor, image, texts[:1])  # (the image's pixels, processed once)
    pixels = one["pixel_values"]
    if kind == "blip":
        with torch.no_grad():
            states = model.vision_model(pixel_values=pixels).last_hidden_state
    tok = processor.tokenizer
    limit = getattr(getattr(model.config, "text_config", model.config), "max_position_embeddings", None)
    lengths = [len(ids) for ids in tok(list(texts))["input_ids"]]
    for text, n in zip(texts, lengths):
        if limit is not None and n > limit:
            raise ModelError(f"a text is {n} tokens, more than the model's context ({limit}): {text[:80]!r}")
    by_width = {}
    for j, n in enumerate(lengths):
        width = -(-n // LENGTH_STEP) * LENGTH_STEP
        by_width.setdefault(min(width, limit) if limit else width, []).append(j)
    out = [None] * len(texts)
    for width, idx in sorted(by_width.items()):
        for b in range(0, len(idx), batch):
            group = idx[b : b + batch]
            rows = [texts[j] for j in group] + [texts[group[0]]] * (batch - len(group))
            enc = tok(rows, padding="max_length", max_length=width, return_tensors="pt")
            ids, mask = enc["input_ids"].to(model.device), enc["attention_mask"].to(model.device)
            with torch.no_grad():
                if kind == "blip":
                    hidden = states.expand(batch, -1, -1)
                    text = model.text_encoder(
                        input_ids=ids,
                        attention_mask=mask,
                        encoder_hidden_states=hidden,
                        encoder_attention_mask=torch.ones(hidden.shape[:-1], dtype=torch.long, device=hidden.device),
                    )
                    logits = model.itm_head(text.last_hidden_state[:, 0, :])
                else:
                    logits = model(
                        input_ids=ids,
                        attention_mask=mask,
                        pixel_values=pixels.expand(batch, *pixels.shape[1:]),
                        use_image_text_matching_head=True,
                    ).logits_per_image
            for j, v in zip(group, _log_odds(logits)):
                out[j] = v
    return out
