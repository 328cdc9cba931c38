"""lgip.attribution: which words of a text a model's image-text similarity rests on (LGIP_SPEC.md
section 8, after CLIP4DM's F-CLIPScore). It owns the plain forward of each family's text tower
that keeps its attention probabilities, the token scores, tokens mapped to the text's words, and
the words a flip changed.

  s = cos(v, t)                     v the image embedding (a constant), t the text's, in fp32
  a_j = mean over the last `layers` layers l and their heads h of dS/dA^{l,h}[p, j] * A^{l,h}[p, j]
                                    A the attention probabilities (softmax output), p the pooled position
  word score = mean of its tokens' a_j; blamed word = the lowest (the first on ties)

Families (`text_tower` dispatches on the model's class): open_clip CLIP and CustomTextCLIP text
towers of plain ResidualAttentionBlocks (CLIP, OpenCLIP, EVA02; p = the end-of-text token),
transformers CLIPModel and MetaClip2Model (p: the first end-of-text token; the highest id for
CLIP configs with eos_token_id 2, as transformers does), SiglipModel and
Siglip2Model (p = the last of the 64 padded positions). The attention is written out (no fused
kernel: lgip.models.towers' faster forwards never form the probabilities), for the explained texts only;
`TextTower.reference` is the model's own text forward, which the plain one must equal.

Words are the text's whitespace words; a token belongs to the word whose characters it covers.
`align_words` proves that per text for any tokenizer through the Encoder's own `tokenize`: the
ids of the text up to the end of word k must extend those up to the end of word k-1, and the new
ids are word k's (CLIP's BPE and SigLIP's sentencepiece never merge across whitespace, so this
holds for every text; a tokenizer that did would give None, counted by the caller, never a wrong
map). Lowercasing, ftfy and punctuation removal happen inside `tokenize`, as the model sees the text.

Worked example (the tiny random-init open_clip fixture; v: its embedding of fixture image 1, [1, D]):
    >>> tower = text_tower(enc.model)
    >>> al = align_words(enc.tokenize, ["a red bus", "a blue bus"])[1]
    >>> al.words, al.ids, al.token_pos, al.token_word    # start and end tokens are no word's
    (['a', 'blue', 'bus'], [49406, 320, 1746, 2840, 49407], [1, 2, 3], [0, 1, 2])
    >>> s, scores = attribute(tower, pad_ids(enc, [al.ids]), v, layers=3)   # s = tensor([-0.3699])
    >>> ws = word_scores(scores[0, al.token_pos].tolist(), al.token_word, len(al.words))
    >>> [round(w, 4) for w in ws], changed_words("a red bus", "a blue bus"), blamed_word(ws)
    ([0.0221, -0.0043, 0.0017], [1], 1)                  # blamed: "blue", the changed word (a hit)
"""

import contextlib
import itertools
import math
import re

from .errors import ModelError
from .models.towers import _plain_blocks


FAMILIES = (
    "open_clip CLIP/CustomTextCLIP text towers of plain ResidualAttentionBlocks (CLIP, OpenCLIP, EVA02)",
    "transformers CLIPModel / MetaClip2Model",
    "transformers SiglipModel / Siglip2Model (SigLIP, SigLIP2)",
)


def _attend(q, k, v, heads, scale, mask, edit):
    """Multi-head attention written out on [N, L, W] q, k, v: softmax(q k^T * scale + mask) v,
    with edit(A) -> A given the probabilities [N, heads, L, L] before they weigh the values."""
    import torch

    n, length, width = q.shape
    q, k, v = (t.reshape(n, length, heads, width // heads).transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask
    probs = scores.softmax(dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)
    if edit is not None:
        probs = edit(probs)
    return (probs @ v).transpose(1, 2).reshape(n, length, width)


def _causal_mask(length, dtype, device):
    import torch

    return torch.full((length, length), float("-inf"), dtype=dtype, device=device).triu(1)


class TextTower:
    """One family's text tower as a plain forward. `embed(ids)` -> (x, additive mask or None);
    `block(l, x, mask, edit)` one layer, its attention written out; `pooled(ids)` -> p [N];
    `head(x, p)` -> text features [N, D] (not normalised); `reference(ids)` the model's own."""

    family = ""
    n_layers = 0

    def features(self, ids, edit=None, grad_from=None):
        """Text features [N, D] of padded ids [N, L]. edit(l, A) -> A sees each layer's attention
        probabilities; layers before grad_from run without autograd (nothing to differentiate there)."""
        import torch

        grad_from = self.n_layers if grad_from is None else grad_from
        with torch.no_grad():
            x, mask = self.embed(ids)
            for l in range(min(grad_from, self.n_layers)):
                x = self.block(l, x, mask, None if edit is None else lambda a, l=l: edit(l, a))
            if grad_from >= self.n_layers:
                return self.head(x, self.pooled(ids))
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            for l in range(grad_from, self.n_layers):
                x = self.block(l, x, mask, None if edit is None else lambda a, l=l: edit(l, a))
            return self.head(x, self.pooled(ids))


class _OpenClipTower(TextTower):
    family = "open_clip"

    def __init__(self, model, tower, blocks):
        self.model, self.tower, self.blocks, self.n_layers = model, tower, blocks, len(blocks)
        self.pool = getattr(tower, "text_pool_type", None) or getattr(tower, "pool_type", "argmax")
        self.eos_id = getattr(tower, "text_eos_id", None) if tower is model else getattr(tower, "eos_id", None)

    def embed(self, ids):
        t = self.tower
        dtype = t.token_embedding.weight.dtype
        n = ids.shape[1]
        x = t.token_embedding(ids).to(dtype) + t.positional_embedding[:n].to(dtype)
        return x, _causal_mask(n, dtype, ids.device)

    def block(self, l, x, mask, edit=None):
        b = self.blocks[l]
        a = b.attn
        import torch.nn.functional as F

        q, k, v = F.linear(b.ln_1(x), a.in_proj_weight, a.in_proj_bias).chunk(3, dim=-1)
        y = _attend(q, k, v, a.num_heads, (x.shape[-1] // a.num_heads) ** -0.5, mask, edit)
        x = x + b.ls_1(a.out_proj(y))
        return x + b.ls_2(b.mlp(b.ln_2(x)))

    def pooled(self, ids):
        return ids.argmax(dim=-1) if self.pool == "argmax" else (ids == self.eos_id).int().argmax(dim=-1)

    def head(self, x, p):
        import torch

        x = self.tower.ln_final(x[torch.arange(x.shape[0], device=x.device), p])
        proj = self.tower.text_projection
        if proj is not None:
            x = proj(x) if isinstance(proj, torch.nn.Linear) else x @ proj
        return x

    def reference(self, ids):
        import torch

        context = self.tower.positional_embedding.shape[0]
        full = torch.zeros(ids.shape[0], context, dtype=ids.dtype, device=ids.device)
        full[:, : ids.shape[1]] = ids  # (causal: what follows the end of text never reaches it)
        return self.model.encode_text(full)


class _TransformersTower(TextTower):
    """CLIPModel-like (causal, pooled at the end of text, text_projection) or SigLIP (no mask,
    pooled at the last position, the tower's head)."""

    def __init__(self, model, tower, family, causal):
        self.model, self.tower, self.family, self.causal = model, tower, family, causal
        self.layers = list(tower.encoder.layers)
        self.n_layers = len(self.layers)
        self.eos_id = getattr(tower, "eos_token_id", None)
        # CLIPTextTransformer keeps the highest-id rule for configs from before transformers PR
        # #24773 (eos_token_id 2); MetaClip2's always pools the first end-of-text token.
        self.legacy_eos = type(tower).__name__ == "CLIPTextTransformer" and self.eos_id == 2

    def embed(self, ids):
        x = self.tower.embeddings(input_ids=ids)
        return x, _causal_mask(ids.shape[1], x.dtype, ids.device) if self.causal else None

    def block(self, l, x, mask, edit=None):
        layer = self.layers[l]
        a = layer.self_attn
        h = layer.layer_norm1(x)
        heads = getattr(a, "num_heads", None) or a.config.num_attention_heads
        y = _attend(a.q_proj(h), a.k_proj(h), a.v_proj(h), heads, a.scale, mask, edit)
        x = x + a.out_proj(y)
        return x + layer.mlp(layer.layer_norm2(x))

    def pooled(self, ids):
        import torch

        if not self.causal:
            return torch.full((ids.shape[0],), ids.shape[1] - 1, dtype=torch.long, device=ids.device)
        if self.legacy_eos:
            return ids.argmax(dim=-1)
        return (ids == self.eos_id).int().argmax(dim=-1)  # the first end-of-text token

    def head(self, x, p):
        import torch

        x = self.tower.final_layer_norm(x[torch.arange(x.shape[0], device=x.device), p])
        return self.model.text_projection(x) if self.causal else self.tower.head(x)

    def reference(self, ids):
        out = self.model.get_text_features(input_ids=ids)
        return getattr(out, "pooler_output", out)  # (transformers 5: a ModelOutput)


def _unsupported(model, why=""):
    return ModelError(
        f"word attribution does not support this model ({type(model).__module__}.{type(model).__name__}"
        f"{': ' + why if why else ''}); supported: {'; '.join(FAMILIES)}"
    )


def text_tower(model):
    """The TextTower of a loaded model (an Encoder's `.model`), dispatched on its class; a
    ModelError naming the supported families for any other."""
    module = type(model).__module__
    if module.startswith("open_clip"):
        import open_clip
        from open_clip.transformer import TextTransformer

        if isinstance(model, open_clip.CLIP):
            tower, pool = model, getattr(model, "text_pool_type", "argmax")
        elif isinstance(getattr(model, "text", None), TextTransformer):
            tower, pool = model.text, model.text.pool_type
            if tower.cls_emb is not None or getattr(tower, "use_pad_mask", False):
                raise _unsupported(model, "its text tower appends a class token or masks padding")
        else:
            raise _unsupported(model, "no CLIP-style text tower")
        if pool not in ("argmax", "eos") or getattr(tower, "attn_mask", None) is None:
            raise _unsupported(model, f"its text tower is not causal with end-of-text pooling (pool type {pool!r})")
        blocks = _plain_blocks(tower.transformer)
        if blocks is None:
            raise _unsupported(model, "its text blocks are not plain ResidualAttentionBlocks")
        return _OpenClipTower(model, tower, blocks)
    if module.startswith("transformers"):
        tower = getattr(model, "text_model", None)
        tower = getattr(tower, "text_model", tower)  # (a *TextModel wrapping its transformer)
        kind = type(tower).__name__
        if kind in ("CLIPTextTransformer", "MetaClip2TextTransformer") and hasattr(model, "text_projection"):
            return _TransformersTower(model, tower, "transformers CLIP", causal=True)
        if kind in ("SiglipTextTransformer", "Siglip2TextTransformer"):
            return _TransformersTower(model, tower, "SigLIP", causal=False)
        raise _unsupported(model, f"text tower {kind}")
    raise _unsupported(model)


@contextlib.contextmanager
def in_fp32(enc):
    """The Encoder's model with its floating weights and buffers in fp32 (section 8: the text tower
    in fp32; its images are then encoded in fp32 too, as a model loaded in fp32 encodes them), and
    afterwards back as it was: the very tensors it had, so a caller's model in memory in bf16 or
    fp16 comes back untouched. Yields the dtypes it cast from ([]: the model was fp32 already).
        >>> with in_fp32(enc) as cast:       # cast == ["torch.bfloat16"] for a bf16 model
        ...     s, scores = attribute(text_tower(enc.model), ids, v)
    """
    import torch

    model, kept = getattr(enc, "model", None), []
    if isinstance(model, torch.nn.Module):
        for t in itertools.chain(model.parameters(), model.buffers()):
            if t.is_floating_point() and t.dtype != torch.float32 and all(t is not k for k, _ in kept):
                kept.append((t, t.data))
    dtype = enc.dtype
    try:
        for t, data in kept:
            t.data = data.float()
        if kept:
            enc.dtype = torch.float32
        yield sorted({str(data.dtype) for _, data in kept})
    finally:
        for t, data in kept:
            t.data = data
        enc.dtype = dtype


def check_tower(tower, ids, tolerance=1e-4):
    """The largest difference between the normalised text embeddings of the plain forward and of
    the model's own text forward on these ids; a ModelError above `tolerance` (a variant of a
    family whose layers compute something the plain forward does not)."""
    import torch

    with torch.no_grad():
        mine, own = (
            torch.nn.functional.normalize(t.float(), dim=-1) for t in (tower.features(ids), tower.reference(ids))
        )
    diff = float((mine - own).abs().max())
    if not diff <= tolerance:
        raise ModelError(
            f"word attribution: the plain forward of this {tower.family} text tower does not give the model's "
            f"own text embedding (max difference {diff:.2e} > {tolerance:g}); its layers are not the ones "
            f"lgip.attribution writes out"
        )
    return diff


def attention_grads(tower, ids, image_emb, layers=3, edit=None):
    """(s [N], probs, grads): s = cos(image_emb[n], text n) through the plain forward, and for
    each of the last `layers` layers its attention probabilities A [N, H, L, L] and dS/dA (the
    texts of a batch are independent: one backward of sum(s) gives every text's own gradient)."""
    import torch

    first = max(0, tower.n_layers - layers)
    kept = []

    def keep(l, a):
        if l >= first:
            kept.append(a)
        return a if edit is None else edit(l, a)

    t = tower.features(ids, keep, grad_from=first)
    with torch.enable_grad():
        s = _cos(t, image_emb)
        grads = torch.autograd.grad(s.sum(), kept)
    return s.detach(), [a.detach() for a in kept], grads


def similarity(tower, ids, image_emb):
    """s [N] = cos(image_emb[n], text n) through the plain forward, no gradients kept."""
    import torch

    with torch.no_grad():
        return _cos(tower.features(ids), image_emb)


def _cos(t, v):
    import torch

    dtype = torch.promote_types(t.dtype, torch.float32)  # s in fp32 (or the model's float64)
    t, v = t.to(dtype), v.to(device=t.device, dtype=dtype)
    return (t * v).sum(-1) / (t.norm(dim=-1) * v.norm(dim=-1)).clamp_min(1e-12)


def attribute(tower, ids, image_emb, layers=3):
    """(s [N], token scores [N, L]): a_j = mean over the last `layers` layers and their heads of
    dS/dA[p, j] * A[p, j], at every position j of the padded ids (callers keep the text's tokens)."""
    import torch

    s, probs, grads = attention_grads(tower, ids, image_emb, layers)
    rows = torch.arange(ids.shape[0], device=ids.device)
    p = tower.pooled(ids)
    per_layer = [(g * a)[rows, :, p, :].mean(dim=1) for a, g in zip(probs, grads)]  # [N, L] each
    return s, torch.stack(per_layer).mean(dim=0).float()


def pad_ids(enc, id_lists):
    """A LongTensor [N, L] of token-id lists padded as the Encoder pads a batch under the corrected
    protocol (SigLIP: 64 with its pad id; causal towers: to the longest, nothing after a text's end
    reaching it), on the Encoder's device."""
    import torch

    length = enc.pad_length([len(x) for x in id_lists]) or max(map(len, id_lists))
    out = torch.full((len(id_lists), length), enc.pad_id, dtype=torch.long)
    for r, ids in enumerate(id_lists):
        out[r, : len(ids)] = torch.tensor(ids[:length], dtype=torch.long)
    return out.to(enc.device)


class Alignment:
    """One text's tokens and words: `ids` (as tokenize gives them, specials included), `words`
    (the text's whitespace words, the template's left out), `token_pos` (the positions in ids
    of the tokens of the template and text: no start, end or padding) and `token_word` (each
    one's word index, None for the template's)."""

    def __init__(self, ids, words, token_pos, token_word):
        self.ids, self.words, self.token_pos, self.token_word = ids, words, token_pos, token_word


def _specials(tokenize):
    """(leading, trailing) special ids a tokenize adds to every text, from "" and "a"."""
    empty, one = tokenize(["", "a"])
    lead = 0
    while lead < min(len(empty), len(one)) and empty[lead] == one[lead]:
        lead += 1
    return empty[:lead], empty[lead:]


def align_words(tokenize, texts, template=""):
    """An Alignment per text of `template + text`, or None where tokenize's ids are not the
    word-by-word extension described in the module docstring (ids beyond the tokenizer's length
    limit are cut: the words they would hold have no tokens).
    >>> align_words(enc.tokenize, ["A dog."])[0].token_word   # CLIP: "a", "dog", "."
    [0, 1, 1]
    """
    if template and not template[-1].isspace():
        raise ValueError(f"a template must end in whitespace (its words are never the text's): {template!r}")
    lead, trail = _specials(tokenize)
    fulls = [template + t for t in texts]
    spans = [[m.end() for m in re.finditer(r"\S+", f)] for f in fulls]
    prefixes = [f[:end] for f, ends in zip(fulls, spans) for end in ends]
    ids_of = iter(tokenize(prefixes + fulls))
    prefix_ids = [[next(ids_of) for _ in ends] for ends in spans]
    out = []
    for text, full, pre, ids in zip(texts, fulls, prefix_ids, ids_of):
        out.append(_align(text, template, pre, ids, lead, trail))
    return out


def _core(ids, lead, trail):
    if len(ids) < len(lead) + len(trail) or ids[: len(lead)] != lead or ids[len(ids) - len(trail) :] != trail:
        return None
    return ids[len(lead) : len(ids) - len(trail)]


def _align(text, template, prefix_ids, ids, lead, trail):
    n_template = len(template.split())
    core = _core(ids, lead, trail)
    token_word, done = [], []
    for k, p in enumerate(prefix_ids):
        p = _core(p, lead, trail)
        if core is None or p is None or p[: len(done)] != done:
            return None
        token_word += [k - n_template if k >= n_template else None] * (len(p) - len(done))
        done = p
    if done != core:
        return None
    return Alignment(ids, text.split(), [len(lead) + j for j in range(len(core))], token_word)


def word_scores(token_scores, token_word, n_words):
    """Per word, the mean of its tokens' scores (None for a word without tokens); the template's
    tokens (word None) belong to no word."""
    sums, counts = [0.0] * n_words, [0] * n_words
    for score, w in zip(token_scores, token_word):
        if w is not None:
            sums[w] += score
            counts[w] += 1
    return [s / c if c else None for s, c in zip(sums, counts)]


def changed_words(caption, flip):
    """Indices of the flip's whitespace words that differ from the caption's: the positions that
    differ when both have as many words (an LGIP flip replaces one word by one), else the flip's
    words between the longest common start and end.
    >>> changed_words("A red bus.", "A blue bus."), changed_words("a bus", "a red bus")
    ([1], [1])
    """
    a, b = caption.split(), flip.split()
    if len(a) == len(b):
        return [j for j, (x, y) in enumerate(zip(a, b)) if x != y]
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[len(a) - 1 - end] == b[len(b) - 1 - end]:
        end += 1
    return list(range(start, len(b) - end))


def blamed_word(scores):
    """The index of the lowest word score (the first on ties; words without a score are never
    blamed), or None when no word has one."""
    best = None
    for j, s in enumerate(scores):
        if s is not None and not math.isnan(s) and (best is None or s < scores[best]):
            best = j
    return best


def token_namer(enc):
    """ids -> the tokenizer's names of those tokens (CLIP BPE: the text of each piece; transformers:
    its pieces, "▁" marking a space), for the explain files, from the tokenizer the model was loaded
    with (`enc.tokenizer`); ids as strings when it names none."""
    tok = getattr(enc, "tokenizer", None)
    if hasattr(tok, "decoder") and hasattr(tok, "byte_decoder"):  # open_clip's CLIP BPE

        def name(i):
            piece = tok.decoder.get(i, "")
            return bytearray(tok.byte_decoder[c] for c in piece).decode("utf-8", "replace").replace("</w>", "")

        return lambda ids: [name(i) for i in ids]
    tok = getattr(tok, "tokenizer", tok)  # (open_clip's HFTokenizer holds a transformers one)
    if hasattr(tok, "convert_ids_to_tokens"):
        return lambda ids: tok.convert_ids_to_tokens(list(ids))
    return lambda ids: [str(i) for i in ids]  # (names are for reading only; the scores do not depend on them)
