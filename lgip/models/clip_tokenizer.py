"""lgip.models.clip_tokenizer: open_clip's tokenizers as id lists (to EOT for a causal tower),
with a fast path for the CLIP BPE tokenizer that gives its exact ids (accelerations.FAST_CLIP_TOKENIZER).

    >>> tokenize = _openclip_tokenize_fn(open_clip.get_tokenizer("ViT-B-16"), 77, trimmable=True)
    >>> tokenize(["a dog"])
    [[49406, 320, 1929, 49407]]
"""

import re

from .. import accelerations


_PLAIN_ASCII = re.compile(r"[\x20-\x25\x27-\x7e]*")  # printable ASCII but '&': ftfy and html.unescape leave it as it is


_CLIP_ENCODE_CHECKS = [
    "a photo of a dog",
    "  Two  DOGS, one cat!! ",
    "it's 10:45 -- isn't it?",
    "<end_of_text> x",
    "a<start_of_text>b",
    "don't",
    "x" * 300,
    "(a) [b] {c} |d| ~e~ `f` \\g/ ^h^ $i$ #j# @k@ %l%",
    "\"quoted\" 'single' ;semi; :colon: =eq= +plus+ _under_ ?q?",
    "abc123def 4 5.6 7,8",
]


def _fast_clip_encode(tokenizer):
    """tokenizer.encode (open_clip's SimpleTokenizer with its default 'lower' cleaning) made
    ~5x faster, same ids: a text of printable ASCII without '&' skips ftfy and html.unescape
    (they leave such text as it is; the cleaning left is whitespace and case), and each word's
    BPE ids are kept once made. Other texts go through tokenizer.encode itself. None when the
    tokenizer is not that one, or the two disagree on a few checks.
    >>> _fast_clip_encode(open_clip.tokenizer.SimpleTokenizer())("A dog") == [320, 1929]
    True
    """
    import open_clip

    if getattr(tokenizer, "clean_fn", None) is not getattr(open_clip.tokenizer, "_clean_lower", False):
        return None
    words, pat, byte_encoder, ids_of, bpe = {}, tokenizer.pat, tokenizer.byte_encoder, tokenizer.encoder, tokenizer.bpe

    def encode(text):
        if not _PLAIN_ASCII.fullmatch(text):
            return tokenizer.encode(text)
        out = []
        for word in pat.findall(" ".join(text.split()).lower()):
            ids = words.get(word)
            if ids is None:
                ids = words[word] = [ids_of[p] for p in bpe("".join(byte_encoder[b] for b in word.encode())).split(" ")]
            out += ids
        return out

    return encode if all(encode(t) == tokenizer.encode(t) for t in _CLIP_ENCODE_CHECKS) else None


def _openclip_tokenize_fn(tokenizer, context, trimmable):
    """tokenize(texts) -> token id lists for an open_clip tokenizer: a causal (trimmable) tower's
    texts end at their EOT, any other tower's are full padded rows. Shared by load_openclip and
    prepare_openclip, so a text tokenized ahead has the ids the model would give it."""
    import open_clip

    simple = type(tokenizer) is open_clip.tokenizer.SimpleTokenizer and tokenizer.reduction_fn is None
    sot, eot = getattr(tokenizer, "sot_token_id", None), getattr(tokenizer, "eot_token_id", None)
    fast = _fast_clip_encode(tokenizer) if accelerations.FAST_CLIP_TOKENIZER else None
    encode = (fast or tokenizer.encode) if simple and trimmable else None

    def tokenize(texts):
        if encode is not None:  # SimpleTokenizer.__call__'s ids, without its padded tensor
            out = []
            for t in texts:
                ids = [sot] + encode(t) + [eot]
                if len(ids) > context:
                    ids = ids[:context]
                    ids[-1] = eot
                # A literal "<end_of_text>" in a caption is an EOT id too; the tower pools at the
                # first EOT (argmax), so nothing after it counts.
                out.append(ids[: ids.index(eot) + 1])
            return out
        ids = tokenizer(list(texts))  # [N, context]
        if not trimmable:
            return ids.tolist()  # full rows: the tower sees every position
        # Up to EOT (the argmax id, where the tower pools), not "ids != 0": id 0 is "!" and
        # occurs inside texts such as 'he said "stop!"'.
        return [row[:n].tolist() for row, n in zip(ids, (ids.argmax(dim=1) + 1).tolist())]

    tokenize.fast = encode is not None and encode is fast  # (FAST_CLIP_TOKENIZER applies: the run block says so)
    return tokenize


def _openclip_tokenizer_identity(tokenizer, context):
    return (type(tokenizer).__name__, len(getattr(tokenizer, "encoder", {})), context)
