"""lgip.method: the LGIP perturbation method (LGIP_SPEC.md sections 2-3): word lists,
templates, paraphrases, flips, and the flip type of a one-word flip. The room for a new flip type
or paraphrase rule; pure functions over strings and a random.Random.

    >>> typed_flips("a red bus", random.Random(42))
    [('a gray bus', 'color'), ('a red bicycle', 'object')]
"""

import functools
import re


COLORS = ["red", "blue", "green", "yellow", "black", "white", "brown", "gray", "orange", "pink", "purple"]


NUMBER_WORDS = ["one", "two", "three", "four", "five"]


OBJECTS = ["dog", "cat", "horse", "car", "bus", "train", "person", "bird", "boat", "bicycle", "truck"]


FLIP_LISTS = [("color", COLORS), ("number", NUMBER_WORDS), ("object", OBJECTS)]


FLIP_TYPES = [t for t, _ in FLIP_LISTS]


TEMPLATES = ["a photo of {}", "an image of {}", "a picture of {}", "{}", "{} in the scene", "a scene showing {}"]


PREFIXES = ["In this image, {}", "In the picture, {}", "This image shows {}"]


# (type, pattern, {word: the other words of its list}); the alternatives keep list order.
_FLIP_PATTERNS = [
    (t, re.compile(r"\b(" + "|".join(words) + r")\b"), {w: [x for x in words if x != w] for w in words})
    for t, words in FLIP_LISTS
]


_PASSIVE_RULES = [
    (
        re.compile(
            r"^A (\w+) (is|are|sits|sitting|stands|standing|lies|lying) "
            r"(on|in|at|by|next to|behind|in front of) (.+)\.$",
            re.I,
        ),
        r"A \4 \2 \3 \1.",
    ),
    (
        re.compile(
            r"^(\w+) (is|are|sits|sitting|stands|standing|lies|lying) "
            r"(on|in|at|by|next to|behind|in front of) (.+)\.$",
            re.I,
        ),
        r"\4 \2 \3 \1.",
    ),
    (
        re.compile(r"^A (\w+) (is|are) (going|running|moving) (down|along|through) (.+)\.$", re.I),
        r"\5 \2 \3 \1 \4 them.",
    ),
]


SYNONYMS = {
    "cat": ["feline", "kitty"],
    "dog": ["canine", "puppy", "hound"],
    "person": ["individual", "human", "man", "woman"],
    "sits": ["rests", "perches"],
    "stands": ["stands", "poses"],
    "large": ["big", "huge", "enormous"],
    "small": ["little", "tiny", "miniature"],
    "red": ["crimson", "scarlet"],
    "blue": ["azure", "navy"],
    "green": ["emerald", "lime"],
}


def dedupe(items):
    """Keep the first occurrence of each item, in order."""
    return list(dict.fromkeys(items))


def simple_paraphrases(c):
    """Templates then prefixes filled with c, stripped, >= 5 chars, de-duplicated.

    >>> simple_paraphrases("dog")[:2]
    ['a photo of dog', 'an image of dog']
    """
    filled = [t.format(c).strip() for t in TEMPLATES + PREFIXES]
    return dedupe(p for p in filled if len(p) >= 5)


def passive_paraphrases(c):
    s = c.strip()
    out = []
    for pattern, repl in _PASSIVE_RULES:
        if pattern.match(s):
            p = pattern.sub(repl, s).capitalize()
            if p != s:
                out.append(p)
    return out


def synonym_paraphrases(c):
    """Single, then double synonym substitutions over `c.lower().split()`."""
    tokens = c.lower().split()
    slots = [i for i, tok in enumerate(tokens) if tok in SYNONYMS]
    out = []

    def emit(replacements):
        toks = list(tokens)
        for i, syn in replacements:
            toks[i] = syn
        p = " ".join(toks).capitalize()
        if p != c:
            out.append(p)

    for i in slots:
        for syn in SYNONYMS[tokens[i]]:
            emit([(i, syn)])
    for a, i in enumerate(slots):
        for j in slots[a + 1 :]:
            for syn_i in SYNONYMS[tokens[i]]:
                for syn_j in SYNONYMS[tokens[j]]:
                    emit([(i, syn_i), (j, syn_j)])
    return out


def advanced_candidates(c):
    """Every advanced-paraphrase candidate of c, stripped, in generation order, with repeats."""
    raw = [t.format(c) for t in TEMPLATES + PREFIXES] + passive_paraphrases(c) + synonym_paraphrases(c)
    return [p.strip() for p in raw]


def advanced_paraphrases(c, order="generation"):
    """The enhanced generator's paraphrase pool of c.

    order="generation" (this project): templates, prefixes, passive, single then double
    synonyms, first occurrence kept: the same list under any PYTHONHASHSEED.
    order="set": iterate a Python set as the published script does; its order depends on
    PYTHONHASHSEED (the fixtures were made with PYTHONHASHSEED=0).
    """
    cands = advanced_candidates(c)
    pool = dedupe(cands) if order == "generation" else list(set(cands))
    low = c.lower()
    return [p for p in pool if len(p) >= 5 and p.lower() != low]


def typed_flips(c, rng):
    """Flip the first color, number and object word of c: [(text, type)], in that order.

    Consumes one rng.choice per word list that matches.
    >>> typed_flips("a red bus", random.Random(42))
    [('a gray bus', 'color'), ('a red bicycle', 'object')]
    """
    out = []
    for ftype, pattern, alternatives in _FLIP_PATTERNS:
        m = pattern.search(c)
        if not m:
            continue
        new = rng.choice(alternatives[m.group(1)])
        flipped = c[: m.start()] + new + c[m.end() :]  # = pattern.sub(new, c, count=1)
        if flipped != c:
            out.append((flipped.strip(), ftype))
    seen, kept = set(), []
    for text, ftype in out:
        if len(text) >= 5 and text not in seen:
            seen.add(text)
            kept.append((text, ftype))
    return kept


def add_typed_flips(fields, key, c, rng, cap, stats):
    """Set fields["diff_caps"][key] and the per-type lists to c's flips (sampled to cap).

    `fields` holds "diff_caps" and "diff_caps_<type>" dicts; the typed lists split the same
    texts by type, in the same order, as the published fliptypes generators write them.
    """
    flips = cap_sample([(t, ft) for t, ft in typed_flips(c, rng) if t.strip() != c.strip()], cap, rng)
    fields["diff_caps"][key] = [t for t, _ in flips]
    for ftype in FLIP_TYPES:
        fields["diff_caps_" + ftype][key] = [t for t, ft in flips if ft == ftype]
        stats["flips_" + ftype] += len(fields["diff_caps_" + ftype][key])


def cap_sample(items, cap, rng):
    """At most `cap` items: `rng.sample` only when there are more."""
    return rng.sample(items, cap) if len(items) > cap else items


_FLIP_WORD_TYPE = {w: t for t, words in FLIP_LISTS for w in words}


@functools.lru_cache(maxsize=1 << 21)  # every model of a run asks again for the same (caption, flip)
def infer_flip_type(caption, flip):
    """The flip type of a one-word flip of caption ("color", "number", "object"), or None.

    >>> infer_flip_type("a red bus", "a red car")
    'object'
    """
    a, b = caption.split(), flip.split()
    if len(a) != len(b):
        return None
    diff = [(x, y) for x, y in zip(a, b) if x != y]
    if len(diff) != 1:
        return None
    x, y = (re.sub(r"\W", "", w) for w in diff[0])
    t = _FLIP_WORD_TYPE.get(x)
    return t if t is not None and _FLIP_WORD_TYPE.get(y) == t else None


# a model card's fields (LGIP_SPEC.md 12), in the order the cards and the report list them
CARD_FIELDS = (
    "source",
    "architecture",
    "pretrained",
    "family",
    "params_image",
    "params_text",
    "params_total",
    "embed_dim",
    "image_size",
    "context_length",
    "loss",
    "training_data",
    "samples_seen",
)
# card fields a card carries only where known (rows without them stay as they were): the activation a spec says
# (LGIP_SPEC.md 12: `quick_gelu`) and what a fine-tune started from, was trained on and which images it saw
# (lgip.models.finetunes' named models), each fact's citation in `card_sources` {field: where it is written}
CARD_FIELDS_WHEN_KNOWN = ("quick_gelu", "fine_tuned_from", "fine_tuned_on", "images_seen", "card_sources")
