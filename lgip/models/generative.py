"""lgip.models.generative: a generative VLM's score of a text given an image (LGIP_SPEC.md 13: `logprob`,
`logprob_mean`), exactly as section 13 defines it, and the same scores with the image's prefix run once.

The score of a text t against image v is the sum of log P(token | everything before it) over t's
tokens in the conversation [user: image, prompt; assistant: t], rendered by the processor's chat
template and tokenized as the processor tokenizes it. t's tokens are found by the fast tokenizer's
offsets: the tokens whose characters end inside t's span in the rendered text (its last occurrence),
so a token straddling the span's start is t's and one straddling its end (the end of turn) is not.

`plain_scores` runs one forward per text: the definition. `prefix_scores` runs the tokens before the
texts (the template's opening, the image's tokens, the prompt) once per image and every text's tokens
on a copy of its key-value cache, in batches; a text whose tokens before its own differ from the
shared prefix (a tokenizer that merges across the boundary) is scored plainly. The two agree to 1e-4
in float32 (tests/test_generative.py). Not yet a MODELS type: the evaluation loop's scorer for it is
the next step (lgip.scorer).

    >>> plain_scores(model, processor, image, "Describe the image in one sentence.", ["A red bus."])
    [-42.1]
"""
from ..errors import ModelError

DEFAULT_PROMPT = "Describe the image in one sentence."


def conversation(prompt, answer):
    """[user: image, prompt; assistant: answer] in the chat template's message form."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]},
            {"role": "assistant", "content": [{"type": "text", "text": answer}]}]


def tokenized(processor, image, prompt, answer):
    """(the processor's inputs for [user: image, prompt; assistant: answer] as its chat template renders
    it, the positions of the answer's tokens in input_ids). ModelError when the processor has no chat
    template or the answer cannot be found in what it renders."""
    if not getattr(processor, "chat_template", None):
        raise ModelError(f"{type(processor).__name__} has no chat template: section 13's conversation cannot be "
                         "rendered for this model")
    text = processor.apply_chat_template(conversation(prompt, answer))
    start = text.rfind(answer)
    if not answer or start < 0:
        raise ModelError(f"the chat template does not render the text as written: {answer!r} is not in {text!r}")
    # the processor expands the image token into the image's tokens: offsets are of the expanded text,
    # where the answer still comes last
    inputs = processor(images=image, text=text, return_tensors="pt", return_offsets_mapping=True)
    offsets = inputs.pop("offset_mapping")[0].tolist()
    end_char = max(b for _, b in offsets)  # (the expanded text's end: its last token ends it)
    tail = len(text) - (start + len(answer))  # characters the template adds after the answer
    span_end = end_char - tail
    span_start = span_end - len(answer)
    positions = [j for j, (a, b) in enumerate(offsets) if span_start < b <= span_end and b > a]
    found = processor.tokenizer.decode(inputs["input_ids"][0][positions]) if positions else ""
    if " ".join(found.split()) != " ".join(answer.split()):  # (offsets that do not cover the text as assumed)
        raise ModelError(f"the tokens found for {answer!r} in the rendered conversation read {found!r}: this "
                         f"tokenizer's offsets do not place the text; it cannot be scored as section 13 says")
    return inputs, positions


def _token_logprobs(logits, ids, positions):
    """log P(ids[p] | ids[:p]) for each p in positions (logits[p - 1] predicts ids[p])."""
    import torch
    logp = torch.log_softmax(logits.float(), dim=-1)
    return torch.stack([logp[p - 1, ids[p]] for p in positions])


def plain_scores(model, processor, image, prompt, answers, mean=False):
    """Section 13's score of each answer against `image`: one forward of its whole conversation each
    (the definition the faster path is checked against). mean: divided by its token count (`logprob_mean`)."""
    import torch
    out = []
    for answer in answers:
        inputs, positions = tokenized(processor, image, prompt, answer)
        with torch.no_grad():
            logits = model(**inputs).logits[0]
        lp = _token_logprobs(logits, inputs["input_ids"][0], positions)
        out.append(float(lp.mean() if mean else lp.sum()))
    return out


def prefix_scores(model, processor, image, prompt, answers, mean=False, batch=16):
    """plain_scores' numbers with the tokens before the answers (the template's opening, the image's
    tokens, the prompt) run once: their key-value cache is repeated for each batch of answers, whose
    tokens (right-padded, masked) run on it. An answer whose tokens before its own are not the shared
    prefix's is scored plainly."""
    import torch
    if not answers:
        return []
    items = [tokenized(processor, image, prompt, a) for a in answers]
    ids = [inp["input_ids"][0] for inp, _ in items]
    cut = min(pos[0] for _, pos in items)  # the shared prefix: every token before the first scored one
    first = items[0][0]
    shared = [j for j, t in enumerate(ids) if len(t) > cut and torch.equal(t[:cut], ids[0][:cut])]
    scores = [None] * len(answers)
    for j in set(range(len(answers))) - set(shared):
        scores[j] = plain_scores(model, processor, image, prompt, [answers[j]], mean)[0]
    prefix = {k: (v[:, :cut] if k in ("input_ids", "attention_mask", "token_type_ids") else v) for k, v in first.items()}
    with torch.no_grad():
        out = model(**prefix, use_cache=True)
    cache, last = out.past_key_values, out.logits[0, -1]  # (last: the prefix's prediction of the first token)
    pad = processor.tokenizer.pad_token_id or 0
    for b in range(0, len(shared), batch):
        group = shared[b:b + batch]
        rest = [ids[j][cut:] for j in group]
        width = max(len(r) for r in rest)
        x = torch.full((len(group), width), pad, dtype=torch.long)
        mask = torch.zeros((len(group), cut + width), dtype=torch.long)
        mask[:, :cut] = 1
        for r, t in enumerate(rest):
            x[r, :len(t)] = t
            mask[r, cut:cut + len(t)] = 1
        import copy
        c = copy.deepcopy(cache)
        c.batch_repeat_interleave(len(group))
        with torch.no_grad():
            logits = model(input_ids=x, attention_mask=mask, past_key_values=c, use_cache=True,
                           cache_position=torch.arange(cut, cut + width)).logits
        for r, j in enumerate(group):
            # position p of the whole text is predicted by p - 1: the prefix's last logits for p = cut
            full = torch.cat([last[None], logits[r]], dim=0)  # full[q] predicts token cut + q
            positions = items[j][1]
            lp = torch.stack([torch.log_softmax(full[p - cut].float(), -1)[ids[j][p]] for p in positions])
            scores[j] = float(lp.mean() if mean else lp.sum())
    return scores
