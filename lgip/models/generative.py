"""lgip.models.generative: a generative VLM's score of a text given an image (LGIP_SPEC.md 13: `logprob`,
`logprob_mean`), exactly as section 13 defines it, and the same scores with the image's prefix run once.

The score of a text t against image v is the sum of log P(token | everything before it) over t's
tokens in the conversation [user: image, prompt; assistant: t], rendered by the processor's chat
template and tokenized as the processor tokenizes it. t's tokens are found by the fast tokenizer's
offsets: the tokens whose characters end inside t's span in the rendered text (its last occurrence),
so a token straddling the span's start is t's and one straddling its end (the end of turn) is not.

`plain_scores` runs one forward per text: the definition. `prefix_scores` runs the tokens before the
texts (the template's opening, the image's tokens, the prompt) once per image and every text's tokens
on a copy of its key-value cache, in batches (the shared prefix: the tokens all the conversations
share before the first scored token, so a tokenizer that merges across the boundary only shortens
it). The two agree to 1e-4 in float32 (tests/test_generative.py). `conversation_scores` takes a
(prompt, answer) per text: `vqascore` asks a question that holds the caption and scores "Yes". The
MODELS type "generative" (lgip.models.joint) scores with it.

    >>> plain_scores(model, processor, image, "Describe the image in one sentence.", ["A red bus."])
    [-42.1]
"""

from ..errors import ModelError

DEFAULT_PROMPT = "Describe the image in one sentence."


def conversation(prompt, answer):
    """[user: image, prompt; assistant: answer] in the chat template's message form."""
    return [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]},
        {"role": "assistant", "content": [{"type": "text", "text": answer}]},
    ]


def tokenized(processor, image, prompt, answer):
    """(the processor's inputs for [user: image, prompt; assistant: answer] as its chat template renders
    it, the positions of the answer's tokens in input_ids). ModelError when the processor has no chat
    template or the answer cannot be found in what it renders."""
    if not getattr(processor, "chat_template", None):
        raise ModelError(
            f"{type(processor).__name__} has no chat template: section 13's conversation cannot be "
            "rendered for this model"
        )
    text = processor.apply_chat_template(conversation(prompt, answer))
    _answer_start(text, answer)
    # the processor expands the image token into the image's tokens: offsets are of the expanded text,
    # where the answer still comes last
    # special tokens as apply_chat_template(tokenize=True) adds them: none more where the template begins with
    # the BOS (Gemma 3's), else the tokenizer's own (LLaVA's BOS)
    bos = getattr(processor.tokenizer, "bos_token", None)
    extra = {"add_special_tokens": False} if bos and text.startswith(bos) else {}
    inputs = processor(images=image, text=text, return_tensors="pt", return_offsets_mapping=True, **extra)
    offsets = inputs.pop("offset_mapping")[0].tolist()
    positions = _answer_positions(text, answer, offsets)
    _check_answer_tokens(processor.tokenizer, inputs["input_ids"][0], positions, answer)
    return inputs, positions


def _answer_start(text, answer):
    start = text.rfind(answer)
    if not answer or start < 0:
        raise ModelError(f"the chat template does not render the text as written: {answer!r} is not in {text!r}")
    return start


def _answer_positions(text, answer, offsets):
    """The positions of the answer's tokens (its last occurrence in the rendered `text`) by the tokens'
    character `offsets`: those ending inside its span. The offsets may be of a longer text (the image's
    tokens spelled out) in which the answer and what follows it come last."""
    start = _answer_start(text, answer)
    end_char = max(b for _, b in offsets)  # (the tokenized text's end: its last token ends it)
    tail = len(text) - (start + len(answer))  # characters the template adds after the answer
    span_end = end_char - tail
    span_start = span_end - len(answer)
    return [j for j, (a, b) in enumerate(offsets) if span_start < b <= span_end and b > a]


def _check_answer_tokens(tokenizer, ids, positions, answer):
    if not isinstance(ids, list):
        ids = ids.tolist()
    found = tokenizer.decode([ids[p] for p in positions]) if positions else ""
    if " ".join(found.split()) != " ".join(answer.split()):  # (offsets that do not cover the text as assumed)
        raise ModelError(
            f"the tokens found for {answer!r} in the rendered conversation read {found!r}: this "
            f"tokenizer's offsets do not place the text; it cannot be scored as section 13 says"
        )


def _token_logprobs(logits, ids, positions):
    """log P(ids[p] | ids[:p]) for each p in positions (logits[p - 1] predicts ids[p])."""
    import torch

    logp = torch.log_softmax(logits.float(), dim=-1)
    return torch.stack([logp[p - 1, ids[p]] for p in positions])


def _on(inputs, model):
    """The processor's tensors on the model's device, floating ones (pixels) in its dtype."""
    device, dtype = model.device, model.dtype
    return {
        k: (v.to(device, dtype) if v.is_floating_point() else v.to(device)) if hasattr(v, "to") else v
        for k, v in inputs.items()
    }


def _check_length(model, ids, answer):
    limit = getattr(getattr(model.config, "text_config", model.config), "max_position_embeddings", None)
    if limit is not None and len(ids) > limit:
        raise ModelError(
            f"the conversation of {answer[:80]!r} is {len(ids)} tokens, more than the model's context "
            f"({limit}): shorten the text or the prompt"
        )


def plain_scores(model, processor, image, prompt, answers, mean=False):
    """Section 13's score of each answer against `image`: one forward of its whole conversation each
    (the definition the faster path is checked against). mean: divided by its token count (`logprob_mean`)."""
    return conversation_scores(model, processor, image, [(prompt, a) for a in answers], mean, reuse=False)


def prefix_scores(model, processor, image, prompt, answers, mean=False, batch=16):
    """plain_scores' numbers with the tokens before the answers (the template's opening, the image's
    tokens, the prompt) run once: their key-value cache is repeated for each batch of answers, whose
    tokens (right-padded, masked) run on it."""
    return conversation_scores(model, processor, image, [(prompt, a) for a in answers], mean, reuse=True, batch=batch)


def conversation_scores(model, processor, image, convs, mean=False, reuse=True, batch=16, packs=0, conversations=None):
    """The score of each (prompt, answer) of `convs` against `image`: its answer's log-probability (mean:
    per token) in [user: image, prompt; assistant: answer]. reuse False: one plain forward per conversation
    (the definition). reuse True: the tokens all conversations share before the first scored token (the
    template's opening, the image's tokens, what the prompts share: `vqascore`'s question up to the
    caption) run once; the rest of each conversation runs on that key-value cache: `packs` > 0 (a family
    of PACKED_FAMILIES), packed into rows of at most that many tokens, each text attending to the prefix
    and to itself through a block mask (no copy of the cache per text); else in batches of `batch`, the
    cache repeated per row (right-padded, masked). Where they share nothing past the image, every
    conversation runs plainly. conversations: a lgip.models.conversations.Conversations of the processor
    (the image processed once, the texts tokenized in one batch), or None (the processor per text)."""
    return submit(model, processor, image, convs, mean, reuse, batch, packs, conversations).result()


def submit(model, processor, image, convs, mean=False, reuse=True, batch=16, packs=0, conversations=None, group=None):
    """conversation_scores' work with its forwards launched, not waited for: `.result()` gives the scores.
    On a GPU the device runs them while the caller prepares the next image (lgip.scorers.joint). group: a
    lgip.models.image_groups.ImageGroup the image joins where its family allows (run with the group's
    other images, in one forward with no key-value cache), or None."""
    if not convs:
        return Pending([])
    reuse = reuse and reusable(model)  # (another family's cache: one plain forward per text)
    if getattr(model.config, "model_type", None) == "paligemma":
        return Pending(prefix_lm_scores(model, processor, image, convs, mean, reuse, batch))
    if reuse and conversations is not None and group is not None and group.lists:  # (TOKEN_LISTS: no tensor per text)
        pending = group.submit_lists(image, convs, conversations)
        if pending is not None:
            return pending
    if reuse and conversations is not None:
        items = conversations.items(image, convs)
    else:
        items = [tokenized(processor, image, prompt, answer) for prompt, answer in convs]
    for (inputs, _), (_, answer) in zip(items, convs):
        _check_length(model, inputs["input_ids"][0], answer)
    cut = _shared_length([inp["input_ids"][0] for inp, _ in items], min(pos[0] for _, pos in items))
    if not reuse or cut <= _last_image_token(model, items[0][0]["input_ids"][0]):
        return Pending([_plain(model, inputs, positions, mean) for inputs, positions in items])
    if group is not None and group.accepts(items[0][0]):
        return group.add(items, cut)
    if packs and packable(model, items[0][0]):
        return _on_prefix_packed(model, items, cut, mean, packs)
    return _on_prefix(model, processor, items, cut, mean, batch)


class Pending:
    """Scores whose forwards may still be running: parts of (text indices, a tensor of their scores on
    the model's device) or plain floats; `result()` waits for them (one transfer per part)."""

    def __init__(self, values=None, n=0):
        self._values = list(values) if values is not None else [None] * n
        self._parts = []

    def add(self, indices, scores):
        self._parts.append((list(indices), scores))

    def result(self):
        for indices, scores in self._parts:
            for j, v in zip(indices, scores.tolist()):
                self._values[j] = float(v)
        self._parts = []
        return list(self._values)


# families whose language model's cache the reused prefix is known to continue exactly: a plain attention
# key-value cache (sliding windows included), each proven against one plain forward per text by
# tests/test_generative.py. Another family (LFM2-VL's hybrid cache of short convolutions treats any input on a
# non-empty cache as one decoding step: reuse runs and is wrong) gets one plain forward per text
REUSE_FAMILIES = ("llava", "llava_next", "qwen2_vl", "qwen2_5_vl", "idefics3", "gemma3", "mllama", "paligemma")


def reusable(model):
    """True when `model`'s prefix may be run once and continued (REUSE_FAMILIES)."""
    return getattr(model.config, "model_type", None) in REUSE_FAMILIES


# families whose language model's cache is a plain attention key-value cache that a block mask over a
# packed row continues exactly (each proven against one plain forward per text by tests/test_generative.py);
# Gemma 3's sliding-window layers, Mllama's cross-attention rows and PaliGemma's prefix-LM mask are not
PACKED_FAMILIES = ("llava", "llava_next", "qwen2_vl", "qwen2_5_vl", "idefics3")


def packable(model, inputs=None):
    """True when `model`'s texts may run packed on its prefix (PACKED_FAMILIES; their token types, where a
    tokenizer gives them, say nothing the texts' tokens need: the rests run without them, as batched)."""
    if getattr(model.config, "model_type", None) not in PACKED_FAMILIES:
        return False
    return inputs is None or "cross_attention_mask" not in inputs


def scored_tokens(model, processor, image, prompt, answer):
    """How many tokens of `answer` its score sums."""
    if getattr(model.config, "model_type", None) == "paligemma":
        return len(prefix_lm_tokenized(processor, image, prompt, answer)[1])
    return len(tokenized(processor, image, prompt, answer)[1])


def prefix_lm_tokenized(processor, image, prefix, answer):
    """PaliGemma's conversation (LGIP_SPEC.md 13): `processor(text=prefix, images=image, suffix=answer)`, whose
    token_type_ids (1: the suffix) and labels make the model build its prefix-LM mask; (inputs, the positions
    of the answer's tokens: the suffix's, without the end token the processor appends)."""
    inputs = processor(text="<image>" + prefix, images=image, suffix=answer, return_tensors="pt")
    suffix = (inputs["token_type_ids"][0] == 1).nonzero().flatten().tolist()
    ids = inputs["input_ids"][0]
    if suffix and int(ids[suffix[-1]]) == processor.tokenizer.eos_token_id:
        suffix = suffix[:-1]
    if not suffix:
        raise ModelError(f"the processor gives no suffix tokens for {answer!r}: it cannot be scored as a prefix-LM's")
    return inputs, suffix


def prefix_lm_scores(model, processor, image, convs, mean=False, reuse=True, batch=16):
    """conversation_scores for a prefix-LM (PaliGemma): the prefix (image, prompt) bidirectional, the answer
    causal after it, as trained. The plain forward is one forward with token_type_ids and labels (without
    both the model attends over the whole text, and every score is wrong). reuse: where every conversation
    has one prefix (`logprob`), it runs once, bidirectionally alone (as in the whole forward: it never sees
    the answer), and the answers run on its cache, causal; `vqascore` puts the caption in the prefix, which
    the image's tokens attend to: no reuse."""
    items = [prefix_lm_tokenized(processor, image, prompt, answer) for prompt, answer in convs]
    for (inputs, _), (_, answer) in zip(items, convs):
        _check_length(model, inputs["input_ids"][0], answer)
    cut = items[0][1][0]
    same = all(
        pos[0] == cut and torch_equal(inp["input_ids"][0][:cut], items[0][0]["input_ids"][0][:cut])
        for inp, pos in items
    )
    if not reuse or not same:
        return [_plain(model, inputs, positions, mean) for inputs, positions in items]
    return _on_prefix(model, processor, items, cut, mean, batch, prefix_lm=True).result()


def torch_equal(a, b):
    import torch

    return a.shape == b.shape and bool(torch.equal(a, b))


def _plain(model, inputs, positions, mean):
    import torch

    with torch.no_grad():
        logits = model(**_on(inputs, model)).logits[0]
    lp = _token_logprobs(logits, inputs["input_ids"][0].to(logits.device), positions)
    return float(lp.mean() if mean else lp.sum())


def _shared_length(ids, limit):
    """How many leading tokens every id list shares, at most `limit`."""
    import torch

    m = min([limit] + [len(t) for t in ids])
    differ = (torch.stack([t[:m] for t in ids]) != ids[0][:m]).any(0).nonzero()  # (one comparison for them all)
    return int(differ[0]) if len(differ) else m


def _last_image_token(model, ids):
    """The position of the last image token in `ids` (-1 when the model names none): the shared
    prefix must hold the whole image, whose pixels go with it."""
    token = getattr(model.config, "image_token_id", None)
    token = getattr(model.config, "image_token_index", None) if token is None else token
    if token is None:
        return -1
    if isinstance(ids, list):  # (a TokenLists' ids)
        return max((i for i, t in enumerate(ids) if t == token), default=-1)
    where = (ids == token).nonzero()
    return int(where[-1]) if len(where) else -1


_PLAIN_CACHES = ("DynamicCache", "HybridCache", "StaticCache", "EncoderDecoderCache")  # (the tested families')
# the processor's tensors with a row per token (dimension 1), cut with the prefix
_PER_TOKEN = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids", "cross_attention_mask")


def _prefix_run(model, first, cut, prefix_lm=False):
    """The prefix's forward: (its key-value cache, its last logits: the prediction of the token at `cut`,
    the rope deltas of a multimodal rope or None), or None when its cache is not one of _PLAIN_CACHES (a
    hybrid cache of convolutions or recurrences, which a continued input would read as a decoding step)."""
    import torch

    prefix = {
        k: (v[:, :cut] if k in _PER_TOKEN else v)
        for k, v in first.items()
        if not (prefix_lm and k in ("token_type_ids", "labels"))
    }
    with torch.no_grad():
        out = model(**_on(prefix, model), use_cache=True)
    # multimodal rope (Qwen2-VL, Qwen2.5-VL): the positions after the image are shifted by the prefix's rope
    # deltas. Given here, as the model's own decoding step computes them, rather than left to it: Qwen2.5-VL's
    # (transformers 4.57) repeats the deltas along the wrong dimension for a batch on one cache and fails
    cache = out.past_key_values
    if type(cache).__name__ not in _PLAIN_CACHES:  # (a cache not known to continue exactly: the caller runs plain)
        return None
    return cache, out.logits[0, -1], getattr(out, "rope_deltas", None)


def _gathered(last, logits, rows, targets, owners, counts, mean):
    """The scores of the texts whose scored positions are (row of [last; logits] that predicts it, its token,
    the text's index), as one tensor on the device: log_softmax in float32, summed per text (mean: divided
    by its count of tokens)."""
    import torch

    device = logits.device
    table = torch.cat([last[None], logits], dim=0)
    rows, targets, owners = (
        torch.tensor(x, dtype=torch.long).to(device, non_blocking=True) for x in (rows, targets, owners)
    )
    lp = torch.log_softmax(table[rows].float(), dim=-1).gather(1, targets[:, None])[:, 0]
    sums = torch.zeros(len(counts), dtype=torch.float32, device=device).index_add_(0, owners, lp)
    if mean:
        sums = sums / torch.tensor(counts, dtype=torch.float32).to(device, non_blocking=True)
    return sums


def _on_prefix_packed(model, items, cut, mean, limit):
    """The scores of `items` (inputs, answer positions), their first `cut` tokens run once and the rest of
    the texts packed into rows of at most `limit` tokens (a longer text alone), one forward per row on a
    copy of the prefix's cache: each text's tokens at its own positions (cut, cut + 1, ...), attending to
    the prefix and to its own earlier tokens only (an additive block mask), so each sees what it sees in
    its plain forward."""
    import copy
    import torch

    ids = [inp["input_ids"][0] for inp, _ in items]
    prefix = _prefix_run(model, items[0][0], cut)
    if prefix is None:
        return Pending([_plain(model, inputs, positions, mean) for inputs, positions in items])
    cache, last, deltas = prefix
    device, dtype = last.device, model.dtype
    pending = Pending(n=len(items))
    order = sorted(range(len(items)), key=lambda j: len(ids[j]))
    packs, row, used = [], [], 0
    for j in order:
        n = len(ids[j]) - cut
        if row and used + n > limit:
            packs.append(row)
            row, used = [], 0
        row.append(j)
        used += n
    packs.append(row)
    for group in packs:
        rest = [ids[j][cut:] for j in group]
        lengths = [len(r) for r in rest]
        width = sum(lengths)
        seg = torch.repeat_interleave(torch.arange(len(rest)), torch.tensor(lengths))
        local = torch.cat([torch.arange(n) for n in lengths])
        seg, local_d = seg.to(device), local.to(device)
        own = (seg[:, None] == seg[None, :]) & (local_d[None, :] <= local_d[:, None])
        allowed = torch.cat([torch.ones((width, cut), dtype=torch.bool, device=device), own], dim=1)
        mask = torch.zeros((1, 1, width, cut + width), dtype=dtype, device=device)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        pos = (local + cut).to(device)
        if deltas is not None:
            pos = (pos + deltas.reshape(-1)[0].to(device)).view(1, 1, -1).expand(3, 1, -1)
        else:
            pos = pos[None]
        x = torch.cat(rest)[None].to(device)
        with torch.no_grad():
            logits = model(
                input_ids=x,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=copy.deepcopy(cache),
                use_cache=True,
                cache_position=torch.arange(cut, cut + width, device=device),
            ).logits[0]
        rows, targets, owners, counts, offset = [], [], [], [], 0
        rests = [r.tolist() for r in rest]
        for r, j in enumerate(group):
            positions = items[j][1]
            rows += [0 if q == cut else 1 + offset + (q - 1 - cut) for q in positions]
            rest = rests[r]
            targets += [rest[q - cut] for q in positions]
            owners += [r] * len(positions)
            counts.append(len(positions))
            offset += lengths[r]
        pending.add(group, _gathered(last, logits, rows, targets, owners, counts, mean))
    return pending


def _on_prefix(model, processor, items, cut, mean, batch, prefix_lm=False):
    """The scores of `items` (inputs, answer positions), their first `cut` tokens run once and every
    answer's rest on a copy of that key-value cache, in batches of like length (right-padded, masked).
    prefix_lm (PaliGemma): the prefix runs without token types, so it attends to all of itself, as in
    the whole forward; the rests run with token types and labels, so they stay causal after it."""
    import copy
    import torch

    ids = [inp["input_ids"][0] for inp, _ in items]
    first = items[0][0]
    prefix = _prefix_run(model, first, cut, prefix_lm)
    if prefix is None:
        return Pending([_plain(model, inputs, positions, mean) for inputs, positions in items])
    cache, last, deltas = prefix
    pad = processor.tokenizer.pad_token_id or 0
    device = last.device
    pending = Pending(n=len(items))
    order = sorted(range(len(items)), key=lambda j: len(ids[j]))  # (texts of like length together: less padding)
    for b in range(0, len(order), batch):
        group = order[b : b + batch]
        rest = [ids[j][cut:] for j in group]
        width = max(len(r) for r in rest)
        x = torch.full((len(rest), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rest), cut + width), dtype=torch.long)
        mask[:, :cut] = 1
        for r, t in enumerate(rest):
            x[r, : len(t)] = t
            mask[r, cut : cut + len(t)] = 1
        extra = {}
        if prefix_lm:  # (token types and labels: the answers causal, as in the whole forward)
            types = torch.zeros((len(rest), cut + width), dtype=torch.long)
            types[:, cut:] = 1
            labels = x.masked_fill(mask[:, cut:] == 0, -100)
            extra = {"token_type_ids": types.to(device), "labels": labels.to(device)}
        if "cross_attention_mask" in first:  # (Mllama: which image tiles each token sees, the whole text's
            # rows, which the model indexes by cache position; the padding's rows see none)
            full = torch.zeros(
                (len(rest), cut + width, *first["cross_attention_mask"].shape[2:]),
                dtype=first["cross_attention_mask"].dtype,
            )
            for r, j in enumerate(group):
                full[r, : len(ids[j])] = items[j][0]["cross_attention_mask"][0]
            extra["cross_attention_mask"] = full.to(device)
        if deltas is not None:
            pos = torch.arange(cut, cut + width, device=device) + deltas.reshape(-1)[0].to(device)
            extra["position_ids"] = pos.view(1, 1, -1).expand(3, len(rest), -1)
        c = copy.deepcopy(cache)
        c.batch_repeat_interleave(len(rest))
        with torch.no_grad():
            logits = model(
                input_ids=x.to(device),
                attention_mask=mask.to(device),
                past_key_values=c,
                use_cache=True,
                cache_position=torch.arange(cut, cut + width, device=device),
                **extra,
            ).logits
        # position p of the whole text is predicted by p - 1: the prefix's last logits for p = cut
        rows, targets, owners, counts = [], [], [], []
        for r, j in enumerate(group):
            positions, written = items[j][1], rest[r].tolist()
            rows += [0 if q == cut else 1 + r * width + (q - 1 - cut) for q in positions]
            targets += [written[q - cut] for q in positions]
            owners += [r] * len(positions)
            counts.append(len(positions))
        pending.add(group, _gathered(last, logits.reshape(-1, logits.shape[-1]), rows, targets, owners, counts, mean))
    return pending
