"""lgip.accelerations: the switch of every acceleration that the plain computation does not need.

Each gives the plain path's numbers (to float rounding: ~1e-7 in fp32), and the plain path stays
alive beside it: tests/test_accelerations.py runs each evaluation on the fixture with every switch
off and with all on, and compares every output number. A script switches them off with its
ACCELERATIONS_OFF constant (names below, or "all"); every metrics file records their state in
`run.accelerations`. docs/performance.md, "Accelerations", says what each does, how it is proven exact, and
what it gained where it was measured. The switches are read when a model loads or a run starts.

    >>> from lgip import accelerations
    >>> before = accelerations.switch_off(["PREFIX_PACKS"]); accelerations.PREFIX_PACKS
    False
    >>> accelerations.restore(before)
"""

from .errors import ConfigError


PREFIX_PACKS = True  # CLIP-family texts packed as prefix trees, a shared start computed once
#   (lgip/models/prefix_packs.py); False: batches of one exact length
POOLED_LAST_BLOCK = True  # the last block of open_clip's text and image towers and SigLIP's last text layer run for
#   the pooled position only (lgip/models/towers.py); False: the towers' own forward
TRIMMED_TEXT = True  # CLIP-family text batches cut to their longest text, blocks through SDPA with is_causal
#   (lgip/models/towers.py); False: 77 positions through open_clip's encode_text
FAST_CLIP_TOKENIZER = True  # open_clip's CLIP tokenizer through a fast path with its exact ids
#   (lgip/models/clip_tokenizer.py); False: SimpleTokenizer.encode
PIXELS_ON_DEVICE = True  # decoding workers send uint8 pixels, scaled and normalised on the device
#   (lgip/models/pixels.py); False: the CPU transform in the workers
PIXEL_MEMORY = True  # decoded pixels kept for the run's later models of the same geometry (lgip/pixel_memory.py;
#   needs PIXELS_ON_DEVICE); False: each model decodes its images
LOOKAHEAD = True  # the later models' tokenizing and decoding done in background workers (lgip/lookahead.py);
#   False: each model does its own
SHARED_TOKENS = True  # models that tokenize alike share one token table and prefix plan (lgip/tokens.py,
#   lgip/texts.py); False: each model tokenizes and plans
SHARED_CALLS = True  # the published calls, pairs, keys and token-table rows built once per run (lgip/texts.py RunCalls,
#   lgip/evaluation.py); False: per model
SHARED_SCORE_LAYOUT = True  # a score file's text less its numbers made once per run (lgip/scorefile.py);
#   False: per model
DEVICE_TABLES = True  # embeddings kept and scored on the model's device, uploads pinned and non-blocking
#   (lgip/device.py); False: tables and scoring on the host
BUILD_ON_DEVICE = True  # open_clip models built directly on the GPU, not initialised on the CPU
#   (lgip/models/openclip.py); False: built on the CPU, then moved
PREFIX_REUSE = True  # a joint scorer's shared start run once per image (LGIP_SPEC.md 13:
#   a generative model's image and prompt tokens, their key-value cache reused for every text;
#   BLIP's vision tower), texts in batches (lgip/models/generative.py, itm.py); False: the whole model per (image, text)
CONVERSATION_SPLICE = True  # a generative model's conversations of one image: the image processed once,
#   the texts tokenized in one batch with the image's tokens spliced in, checked against the processor's own
#   (lgip/models/conversations.py); False: the processor per text
TEXT_PACKS = True  # a generative model's texts on its reused prefix packed into rows of PACK_TOKENS with a block mask,
#   no cache copy per text (lgip/models/generative.py; the families of PACKED_FAMILIES);
#   False: batches of TEXT_BATCH on repeated caches
IMAGE_GROUPS = True  # a generative model's images run GROUP_IMAGES at a time in one forward,
#   each image's row its prefix and packed texts under a block mask, no key-value cache (lgip/models/image_groups.py;
#   GROUP_FAMILIES; needs JOINT_PIPELINE); False: per image, the prefix then its texts on its cache
TOKEN_LISTS = True  # an image group's texts kept as Python lists of token ids (no tensor, slice or cat per text),
#   each group's rows made tensors once (lgip/models/conversations.py TokenLists, image_groups.py; needs
#   CONVERSATION_SPLICE and IMAGE_GROUPS); False: a tensor per text, the rows cut and joined from them
SCORED_LOGITS = True  # an image group's language-model head run on the scored positions only, not on every position
#   of every row (lgip/models/image_groups.py; needs IMAGE_GROUPS); False: the model's logits at every position
WIDE_GROUPS = True  # an image group of WIDE_GROUP_IMAGES (16) images per forward, not GROUP_IMAGES (8): half the
#   forwards; the memory the head's logits no longer take (lgip/models/joint.py; needs SCORED_LOGITS); False: 8
LATE_SELF_CHECK = True  # a run's self-check (lgip/models/joint.py) made when its first image's group has run, not by
#   running that image alone first (one forward fewer per run; needs IMAGE_GROUPS); False: the first image alone
JOINT_PIPELINE = True  # a joint scorer prepares the next image (tokenizing, launching its forwards)
#   while the device runs the last one's (lgip/scorers/joint.py); False: each image's scores waited for before the next
NGRAM_MEMO = True  # an n-gram model's probabilities and a text's words computed once and looked up after
#   (lgip/blind.py); False: computed at every use
SHARED_BOOTSTRAP_DRAWS = True  # bootstrap resamples drawn once per (images, resamples, seed), shared by every interval
#   (lgip/scoring.py); False: drawn per interval

NAMES = [
    "PREFIX_PACKS",
    "POOLED_LAST_BLOCK",
    "TRIMMED_TEXT",
    "FAST_CLIP_TOKENIZER",
    "PIXELS_ON_DEVICE",
    "PIXEL_MEMORY",
    "LOOKAHEAD",
    "SHARED_TOKENS",
    "SHARED_CALLS",
    "SHARED_SCORE_LAYOUT",
    "DEVICE_TABLES",
    "BUILD_ON_DEVICE",
    "SHARED_BOOTSTRAP_DRAWS",
    "NGRAM_MEMO",
    "PREFIX_REUSE",
    "CONVERSATION_SPLICE",
    "TEXT_PACKS",
    "IMAGE_GROUPS",
    "TOKEN_LISTS",
    "SCORED_LOGITS",
    "WIDE_GROUPS",
    "LATE_SELF_CHECK",
    "JOINT_PIPELINE",
]


# The dtypes at which each switch, on, gives bit-identical numbers to the plain path (its exactness test in
# tests/test_accelerations.py shows it at each dtype it names that runs on a CPU: fp32 and bf16); () where it gives
# the same numbers only to float rounding (another order of the same sums). A switch on that a model's family lets
# act on it (Family.accelerations) and that is not bit-exact at the run's dtype is part of the model's cache identity
# (lgip/cache.py, `accelerations` in its meta.json): a run with it off never reads what a run with it on computed.
ALL_DTYPES = ("fp32", "bf16", "fp16")
EXACT_DTYPES = {
    "PREFIX_PACKS": (),  # (packed rows: attention over another layout, other sums)
    "POOLED_LAST_BLOCK": (),  # (one position through the last block: other matrix shapes)
    "TRIMMED_TEXT": (),  # (fewer positions: other matrix shapes)
    "FAST_CLIP_TOKENIZER": ALL_DTYPES,  # (the same token ids)
    "PIXELS_ON_DEVICE": ALL_DTYPES,  # (the same pixels bit for bit: test_pixel_split_is_bit_identical_...)
    "PIXEL_MEMORY": ALL_DTYPES,  # (the same pixels, kept)
    "LOOKAHEAD": ALL_DTYPES,  # (the same work, done earlier)
    "SHARED_TOKENS": ALL_DTYPES,  # (the same token table)
    "SHARED_CALLS": ALL_DTYPES,  # (the same calls)
    "SHARED_SCORE_LAYOUT": ALL_DTYPES,  # (the same text)
    "DEVICE_TABLES": (),  # (cosines on another device)
    "BUILD_ON_DEVICE": (),  # (a random init differs by device; not measured off a GPU)
    "SHARED_BOOTSTRAP_DRAWS": ALL_DTYPES,  # (the same draws)
    "NGRAM_MEMO": ALL_DTYPES,  # (the same floats, looked up)
    "PREFIX_REUSE": (),  # (a key-value cache: other matrix shapes)
    "CONVERSATION_SPLICE": ALL_DTYPES,  # (the same ids and pixels, checked against the processor's)
    "TEXT_PACKS": (),  # (packed rows under a block mask)
    "IMAGE_GROUPS": (),  # (several images per forward under a block mask)
    "TOKEN_LISTS": ALL_DTYPES,  # (the same rows, positions and mask: the same forward)
    "SCORED_LOGITS": (),  # (the head on fewer rows: another matrix shape)
    "WIDE_GROUPS": (),  # (more rows per forward: other matrix shapes)
    "LATE_SELF_CHECK": (),  # (the first image in a full group, not alone: another row width)
    "JOINT_PIPELINE": (),  # (off: each image waited for, so no image groups either)
}


def dtype_name(dtype):
    """ "fp32", "bf16" or "fp16" for a torch dtype (or its name), else its str."""
    name = str(dtype).replace("torch.", "")
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(name, name)


def inexact(names, dtype):
    """The switches of `names` that are on and not bit-exact at `dtype` (EXACT_DTYPES), sorted: what a cache's
    identity must hold for the entries computed now."""
    at = dtype_name(dtype)
    return sorted(n for n in names if globals()[n] and at not in EXACT_DTYPES[n])


# the switches that act inside a model's encoders: on, they apply only to the towers and preprocessing that admit
# them (an Encoder's `accelerations` says which of the first five; PIXELS_ON_DEVICE and PIXEL_MEMORY need its pixels)
PER_MODEL = (
    "PREFIX_PACKS",
    "POOLED_LAST_BLOCK",
    "TRIMMED_TEXT",
    "FAST_CLIP_TOKENIZER",
    "BUILD_ON_DEVICE",
    "PIXELS_ON_DEVICE",
    "PIXEL_MEMORY",
    "PREFIX_REUSE",
    "CONVERSATION_SPLICE",
    "TEXT_PACKS",
    "IMAGE_GROUPS",
    "TOKEN_LISTS",
    "SCORED_LOGITS",
    "WIDE_GROUPS",
    "LATE_SELF_CHECK",
    "JOINT_PIPELINE",
)
JOINT_ONLY = (  # a joint scorer's alone
    "PREFIX_REUSE",
    "CONVERSATION_SPLICE",
    "TEXT_PACKS",
    "IMAGE_GROUPS",
    "TOKEN_LISTS",
    "SCORED_LOGITS",
    "WIDE_GROUPS",
    "LATE_SELF_CHECK",
    "JOINT_PIPELINE",
)

EMBEDDING_ONLY = tuple(n for n in PER_MODEL if n not in JOINT_ONLY) + ("SHARED_TOKENS",)  # a dual encoder's


def state():
    """{name: on} of every switch."""
    return {name: globals()[name] for name in NAMES}


def applied(enc):
    """({name: on and it ran for this model}, {name: why not, for a switch that is on but did not}):
    the run block's record, so that no row claims an acceleration its model did not get."""
    ran = set(getattr(enc, "accelerations", ()) or ())
    if getattr(enc, "pixels", None) is not None:
        ran |= {"PIXELS_ON_DEVICE", "PIXEL_MEMORY"}
    why = (
        "the model's weights were not loaded: every embedding came from the cache"
        if not getattr(enc, "weights_loaded", True)
        else getattr(enc, "not_applied", None)
        or "not for this model's towers or preprocessing (docs/performance.md, Accelerations)"
    )
    on_cpu = str(getattr(enc, "device", "cpu")).startswith("cpu")
    on = state()
    record = {n: v and (n not in PER_MODEL or n in ran) for n, v in on.items()}
    own = getattr(enc, "why_not", None) or {}  # (the model's own reasons: lgip.models.encoder, .joint)
    return record, {
        n: "the model runs on the CPU" if n == "BUILD_ON_DEVICE" and on_cpu else own.get(n, why)
        for n, v in on.items()
        if v and not record[n]
    }


def switch_off(names):
    """Switch off the named accelerations ("all": every one); returns the state before."""
    if names in (None, (), []):
        return state()
    if names == "all":
        names = NAMES
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ConfigError(
            f'ACCELERATIONS_OFF is a list of names or "all", got {names!r}; valid names: {", ".join(NAMES)}'
        )
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise ConfigError(f"unknown acceleration(s) {', '.join(map(repr, unknown))}; valid: {', '.join(NAMES)}")
    before = state()
    for name in names:
        globals()[name] = False
    return before


def restore(before):
    """Put back a state that switch_off returned."""
    globals().update(before)
