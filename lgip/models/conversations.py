"""lgip.models.conversations: one image's conversations for a generative VLM, tokenized exactly as its
processor tokenizes each of them (lgip.models.generative.tokenized, LGIP_SPEC.md 13), without paying the
processor once per text (accelerations.CONVERSATION_SPLICE).

The processor, called per conversation, processes the image again for every text (LLaVA-1.5's 336 px
CLIP preprocessing: ~28 ms of one CPU core) and tokenizes the whole conversation with the image's tokens
spelled out (576 for LLaVA-1.5: ~7 ms): about 1 s of host time per image at 166 texts, days for the
paper's 40,000 images. Here the image is processed once, the first conversation goes through the
processor, and every conversation is tokenized in one batch with the image's placeholder left as the
template writes it; the processor's expansion of the placeholder (read off the first conversation: the
tokens where its ids and the placeholder version differ) is spliced into each. That is the processor's
own result when its expansion only replaces the placeholder's tokens by tokens that do not depend on the
text, as every family the tests build does (special tokens split the text before the tokenizer's merges);
per-token inputs beside the ids (token types, Mllama's cross-attention rows) are the first
conversation's up to the image's end and its one value after it. It is checked, for each new shape of
expansion, on a second conversation through the processor: a difference (or per-token inputs that vary
along the text) leaves every conversation to the processor (the image still processed once), and
`refused` says why.

    >>> conv = Conversations(processor)
    >>> items = conv.items(image, [("Describe the image in one sentence.", "A red bus.")])   # [(inputs, positions)]
"""

import contextlib
import copy

_PROMPT, _ANSWER = "\u27e6lgip prompt\u27e7", "\u27e6lgip answer\u27e7"  # (stand-ins no caption holds)
# processor outputs with a value per token beyond the ids: the splice would have to rebuild them
_PER_TOKEN_EXTRAS = ("token_type_ids", "mm_token_type_ids", "cross_attention_mask")


def _common(a, b):
    """How many leading items two lists share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _leaves(images):
    if isinstance(images, (list, tuple)):
        return tuple(x for i in images for x in _leaves(i))
    return (id(images),)


@contextlib.contextmanager
def _image_once(processor):
    """The block's calls to `processor` process each image once (_ImageOnce in place of its image processor),
    the real one put back after."""
    real = getattr(processor, "image_processor", None)
    if real is not None:
        processor.image_processor = _ImageOnce(real)
    try:
        yield
    finally:
        if real is not None:
            processor.image_processor = real


class _ImageOnce:
    """An image processor that processes the same image objects once (their identity and the call's
    arguments the key); every other attribute is the real one's. A shallow copy of the result each
    time: some processors pop keys from it."""

    def __init__(self, real):
        self._real, self._memo = real, {}

    def __getattr__(self, name):
        return getattr(self._real, name)

    def __call__(self, images=None, *args, **kwargs):
        key = (_leaves(images), args, repr(sorted(kwargs.items())))
        if key not in self._memo:
            self._memo[key] = self._real(images, *args, **kwargs)
        return copy.copy(self._memo[key])


class Conversations:
    """A processor's conversations for one image at a time (module docstring). `refused`: None, or why
    the splice is not used for this processor (said once by the caller)."""

    def __init__(self, processor, splice=True):
        self.processor, self.splice = processor, splice
        self.refused = None if splice else "switched off"
        self._checked = set()  # expansion shapes (where, placeholder tokens, expansion tokens) found equal

    def items(self, image, convs):
        """[(inputs, positions of the answer's tokens)] for each (prompt, answer) of `convs`, equal to
        generative.tokenized's; the image processed once."""
        from .generative import tokenized

        processor = self.processor
        with _image_once(processor):
            first = tokenized(processor, image, *convs[0])
            spliced = self._spliced(image, convs, first) if len(convs) > 1 and self.refused is None else None
            if spliced is not None:
                return spliced
            return [first] + [tokenized(processor, image, p, a) for p, a in convs[1:]]

    def lists(self, image, convs):
        """One image's conversations as Python lists, no tensor per text (accelerations.TOKEN_LISTS): a
        TokenLists whose ids and positions are those of items(image, convs), or None where the splice is refused
        or the processor gives per-token inputs beside the ids (items() then)."""
        from .generative import tokenized

        processor = self.processor
        with _image_once(processor):
            first = tokenized(processor, image, *convs[0])
            if len(convs) == 1 or self.refused is not None:
                return None
            spliced = self._spliced(image, convs, first, lists=True)
            return None if spliced is None else TokenLists(first[0], *spliced)

    def _rendered(self, convs):
        """Each conversation as the chat template renders it: the template rendered once with a stand-in for
        the prompt and the answer, each conversation's put in their place, where the template writes both
        as given (checked on the first two; else each rendered)."""
        from .generative import conversation

        render = self.processor.apply_chat_template
        shape = render(conversation(_PROMPT, _ANSWER))
        if shape.count(_PROMPT) == 1 and shape.count(_ANSWER) == 1:
            texts = [shape.replace(_PROMPT, p).replace(_ANSWER, a) for p, a in convs]
            if all(texts[i] == render(conversation(*convs[i])) for i in range(min(2, len(convs)))):
                return texts
        return [render(conversation(p, a)) for p, a in convs]

    def _spliced(self, image, convs, first, lists=False):
        """The items by the splice, or None (self.refused then says why); lists: (each conversation's ids as a
        list, its answer's positions) instead, the conversations without extras (TokenLists)."""
        import torch
        from .generative import _answer_positions, tokenized

        inputs0, _ = first
        tok = self.processor.tokenizer
        texts = self._rendered(convs)
        bos = getattr(tok, "bos_token", None)
        extra = {"add_special_tokens": False} if bos and texts[0].startswith(bos) else {}
        collapsed, offsets = _encoded(tok, texts, not extra)
        c0, e0 = collapsed[0], inputs0["input_ids"][0].tolist()
        p = _common(c0, e0)
        s = 0
        while s < min(len(c0), len(e0)) - p and c0[-1 - s] == e0[-1 - s]:
            s += 1
        k = len(c0) - p - s  # the placeholder's tokens, replaced by the expansion e0[p:len(e0) - s]
        expansion = e0[p : len(e0) - s]
        if c0 == e0:  # (the processor expands nothing: Mllama's one image token)
            p = k = 0
        shift = len(expansion) - k
        shared = min(_common(c0, ids) for ids in collapsed)  # (the conversations' shared tokens, as written)
        shared = shared + shift if shared >= p + k else shared
        extras = {}  # per-token inputs beside the ids: the first conversation's, up to where they become one value
        for key in _PER_TOKEN_EXTRAS:  # (a text token's type, the image's tiles every text token sees) for good
            if key in inputs0:
                v = inputs0[key]
                same = (v == v[:, -1:]).reshape(v.shape[0], v.shape[1], -1).all(-1).all(0)
                changed = (~same).nonzero()
                head = int(changed[-1]) + 1 if len(changed) else 0
                if head > shared:
                    self.refused = f"the processor's {key} vary along the texts"
                    return None
                extras[key] = (v[:, :head], v[:, -1:])
        head_ids = inputs0["input_ids"][0, : p + len(expansion)]
        head_list = e0[: p + len(expansion)]
        out, written = [], []
        for i, ((_, answer), text, ids) in enumerate(zip(convs, texts, collapsed)):
            if ids[: p + k] != c0[: p + k]:
                self.refused = "the conversations differ before the image's tokens end"
                return None
            positions = _answer_positions(text, answer, offsets[i])
            if not positions or positions[0] < p + k:
                self.refused = "an answer's tokens come before the image's"
                return None
            if lists:  # (the same ids as the tensor below, kept as a list: no tensor per text)
                out.append((head_list + ids[p + k :], [q + shift for q in positions]))
                written.append(positions)
                continue
            # (the shared start and the expansion as the processor made them; the rest from this conversation)
            full = torch.cat([head_ids, torch.tensor(ids[p + k :], dtype=head_ids.dtype)])[None]
            inputs = {key: v for key, v in inputs0.items() if key not in ("input_ids", "attention_mask", *extras)}
            inputs["input_ids"] = full
            if "attention_mask" in inputs0:
                inputs["attention_mask"] = torch.ones_like(inputs["input_ids"], dtype=inputs0["attention_mask"].dtype)
            for key, (start, after) in extras.items():
                rest = full.shape[1] - start.shape[1]
                inputs[key] = torch.cat([start, after.expand(-1, rest, *after.shape[2:])], dim=1)
            out.append((inputs, [q + shift for q in positions]))
            written.append(positions)
        shape = (p, k, len(expansion))
        if shape not in self._checked:  # (the processor's own tokens of a second conversation: the splice's proof)
            own, own_positions = tokenized(self.processor, image, *convs[1])
            mine = TokenLists(inputs0, *zip(*out[1:2]), extras).items()[0][0] if lists else out[1][0]
            if (
                own_positions != out[1][1]
                or set(own) != set(mine)
                or not all(
                    torch.equal(own[key], mine[key]) for key in ("input_ids", "attention_mask", *extras) if key in own
                )
            ):
                self.refused = "the processor's tokens of a conversation differ from the splice's"
                return None
            self._checked.add(shape)
        from .generative import _check_answer_tokens

        for (_, positions), (_, answer), ids, p_ in zip(out, convs, collapsed, written):
            _check_answer_tokens(tok, ids, p_, answer)  # (the answer's tokens as written: the same tokens)
        return ([ids for ids, _ in out], [positions for _, positions in out], extras) if lists else out


class TokenLists:
    """One image's conversations with their token ids as Python lists (Conversations.lists): `inputs` the first
    conversation's processor inputs (the image's pixels, its keys), `ids` each conversation's token ids,
    `positions` its answer's, `extras` the per-token inputs beside the ids ({key: (the first conversation's start,
    the one value after it)}, as the splice rebuilds them). items() gives them as Conversations.items does (a
    tensor per conversation)."""

    def __init__(self, inputs, ids, positions, extras=None):
        self.inputs, self.ids, self.positions, self.extras = inputs, list(ids), list(positions), dict(extras or {})

    def __len__(self):
        return len(self.ids)

    def items(self):
        import torch

        first, extras = self.inputs, self.extras
        dtype = first["input_ids"].dtype
        shared = {key: v for key, v in first.items() if key not in ("input_ids", "attention_mask", *extras)}
        out = []
        for ids, positions in zip(self.ids, self.positions):
            inputs = dict(shared, input_ids=torch.tensor([ids], dtype=dtype))
            if "attention_mask" in first:
                inputs["attention_mask"] = torch.ones_like(inputs["input_ids"], dtype=first["attention_mask"].dtype)
            for key, (start, after) in extras.items():
                rest = len(ids) - start.shape[1]
                inputs[key] = torch.cat([start, after.expand(-1, rest, *after.shape[2:])], dim=1)
            out.append((inputs, list(positions)))
        return out


def _encoded(tok, texts, special):
    """(ids, offsets) of each text by a fast tokenizer, in one batch: its Rust tokenizer's own, where it has
    one (the transformers wrapper's per-text conversion costs more than the tokenizing)."""
    backend = getattr(tok, "_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        encodings = backend.encode_batch(texts, add_special_tokens=special)
        return [e.ids for e in encodings], [e.offsets for e in encodings]
    enc = tok(texts, return_offsets_mapping=True, add_special_tokens=special)
    return enc["input_ids"], enc["offset_mapping"]
