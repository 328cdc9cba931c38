"""lgip.models.joint: the models that score an (image, text) pair jointly instead of embedding each apart
(LGIP_SPEC.md 13), and their MODELS types:
  generative  {"model_id", "score", "prompt", "question"}: a transformers AutoModelForImageTextToText with
              a chat template (LLaVA, Qwen2-VL, ...); score "logprob" (default), "logprob_mean" or "vqascore"
  itm         {"model_id"}: a BLIP or BLIP-2 image-text matching head; the match log-odds

Their loaders return a `JointModel`: the run's model object (name, type, device, dtype, info, as an
Encoder has them) with `score(image, texts)`, the score of each text against one PIL image. What
scores an evaluation's pairs with it is lgip.scorers.joint. A cached re-run starts from `JointKey`,
which has no weights: the scores come from the cache.

    >>> model = load_generative({"name": "llava", "type": "generative", "model_id": "llava-hf/llava-1.5-7b-hf"},
    ...                         "corrected", "cuda", torch.bfloat16)
    >>> model.score(image, ["A red bus.", "A blue bus."])
"""

import sys

from .. import accelerations
from ..errors import ModelError, WrongModelType
from .cards import joint_card, model_id_named
from .conversations import Conversations
from .encoder import _Model, _download_hint, hf_config as _config
from .families import Family, register
from .hub import model_id_files, model_id_paths

SCORES = ("logprob", "logprob_mean", "vqascore")  # a generative spec's "score"
ITM_SCORE = "itm_logodds"  # an itm spec's score kind: the matching head's log-odds of a match
DEFAULT_PROMPT = "Describe the image in one sentence."
DEFAULT_QUESTION = 'Does this figure show "{}"? Please answer yes or no.'
PALIGEMMA_PROMPT = "caption en"
TEXT_BATCH = 16  # texts per forward on one image's shared prefix, where the texts are not packed
PACK_TOKENS = 2048  # text tokens per forward on one image's shared prefix, packed (accelerations.TEXT_PACKS)
GROUP_IMAGES = 8  # images per forward, each its prefix and packed texts in a row (accelerations.IMAGE_GROUPS)
WIDE_GROUP_IMAGES = 16  # images per forward with accelerations.WIDE_GROUPS (int >= 1): with the head on the scored
#   positions only (SCORED_LOGITS), 16 rows take less memory than 8 rows' logits did (LLaVA-1.5-7B, bf16, ~3,200
#   tokens a row: 16 x 3,200 x 32,064 x 2 bytes = 3.3 GB of logits, never made)
SELF_CHECK_TEXTS = 3  # texts of the first image scored both ways before a run's first scores are kept
# the largest |reused - plain| score the self-check lets pass: float32 (LGIP_SPEC.md 13's 1e-4), and per scored
# token below it (bf16 keeps 8 bits of mantissa: the two paths' sums of different shapes round apart)
SELF_CHECK_BOUND = {"float32": 1e-4, "bfloat16": 0.05, "float16": 0.01}


class JointModel(_Model):
    """A model that scores a pair jointly (module docstring). A loader fills in:
    model, processor: what transformers loaded; device, dtype; score_kind: what s is (LGIP_SPEC.md 13:
    logprob, logprob_mean, vqascore, itm_logodds); settings: what the score depends on beyond the
    weights (score, prompt, question: the cache's identity holds them); score(image, texts) -> floats;
    card: section 12's fields the model tells; info: the run block's model details."""

    weights_loaded = True

    def __init__(
        self,
        *,
        model,
        processor,
        device,
        dtype,
        score_kind,
        settings,
        score,
        info=None,
        accelerations_applied=frozenset(),
        release=None,
        submit=None,
        why_not=None,
    ):
        self.model, self.processor, self.device, self.dtype = model, processor, device, dtype
        self.score_kind, self.settings, self._score, self._submit = score_kind, dict(settings), score, submit
        self.info, self.accelerations = dict(info or {}), frozenset(accelerations_applied)
        if release is not None:
            self.release = release
        self.why_not = dict(why_not or {})  # {acceleration: why it does not apply to this model}
        self.in_flight = 1  # submissions a pipelined scorer leaves pending (an image group's size: they run together)
        self.tokenizer = getattr(processor, "tokenizer", None)

    def score(self, image, texts):
        """The score of each text against one PIL RGB image (LGIP_SPEC.md 13), in `texts`' order."""
        return self.submit(image, texts).result()

    def submit(self, image, texts):
        """score's work begun: `.result()` gives the scores. A model that can leave its device working
        returns before its forwards end, so the caller prepares the next image meanwhile."""
        if self._submit is not None:
            return self._submit(image, list(texts))
        from .generative import Pending

        return Pending(self._score(image, list(texts)))


class JointKey(_Model):
    """A joint model without its weights (a re-run whose pair scores are all in the cache)."""

    weights_loaded = False
    why_not = {}  # (no weights: the run block says so of every switch)

    def __init__(self, *, score_kind, settings):
        self.score_kind, self.settings = score_kind, dict(settings)
        self.info = {"weights_loaded": False}


def check_settings(spec):
    """ModelError naming a generative spec for a "score", "prompt" or "question" that is not valid (no files read:
    the settings check runs it before any work)."""
    what = f"model {spec.get('name')!r} (type {spec.get('type')!r})"
    score = spec.get("score", "logprob")
    if score not in SCORES:
        raise ModelError(f"{what}: unknown score {score!r}; valid: {', '.join(SCORES)}")
    for key in ("prompt", "question"):
        if key in spec and (not isinstance(spec[key], str) or not spec[key].strip()):
            raise ModelError(f"{what}: {key!r} must be a non-empty string, got {spec[key]!r}")
    question = spec.get("question", DEFAULT_QUESTION)
    rest = question.replace("{}", "")
    if question.count("{}") != 1 or "{" in rest or "}" in rest:
        raise ModelError(
            f"{what}: 'question' must hold the caption's place as one {{}} and no other braces, "
            f"got {question!r} (default {DEFAULT_QUESTION!r})"
        )


def settings_of(spec, config=None):
    """A generative spec's scoring settings with their defaults: {"score", "prompt", "question"}, checked
    (check_settings). The prompt's default needs the model's config (PaliGemma's is "caption en"): read without
    the weights."""
    check_settings(spec)
    prompt = spec.get("prompt")
    if prompt is None:
        kind = getattr(config if config is not None else _config(spec), "model_type", None)
        prompt = PALIGEMMA_PROMPT if kind == "paligemma" else DEFAULT_PROMPT
    return {"score": spec.get("score", "logprob"), "prompt": prompt, "question": spec.get("question", DEFAULT_QUESTION)}


def score_kind_of(spec):
    """The score_kind a generative spec's model gives (LGIP_SPEC.md 13): its "score"."""
    return spec.get("score", "logprob")


def _processor(spec):
    """The model's AutoProcessor, its image processor the PIL one (use_fast=False, as every type's pixels),
    or, for a family that has only a fast one (LFM2-VL, Cohere2-Vision, ...), that one; its tokenizer must be
    fast (offsets). Returns (processor, the image processor's class name, or None)."""
    from transformers import AutoImageProcessor, AutoProcessor
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()  # (its notes on slow and fast image processors: the PIL one is taken on purpose)
    try:
        processor = AutoProcessor.from_pretrained(spec["model_id"])
        if getattr(processor, "image_processor", None) is not None:
            try:
                processor.image_processor = AutoImageProcessor.from_pretrained(spec["model_id"], use_fast=False)
            except ValueError as e:
                if "slow version" not in str(e) and "slow image processor" not in str(e):
                    raise
                # (fast-only: the processor's own, which AutoProcessor already made; said in the row)
    except (OSError, ValueError) as e:
        raise _download_hint(spec, e) from e
    finally:
        logging.set_verbosity(level)
    ip = getattr(processor, "image_processor", None)
    return processor, type(ip).__name__ if ip is not None else None


def load_generative(spec, protocol, device, dtype):
    """A JointModel of type "generative" (module docstring)."""
    from transformers import AutoModelForImageTextToText
    from .dual_encoders import _transformers_dtype_kwarg

    what = f"model {spec['name']!r} ({spec['model_id']})"
    config = _config(spec)
    settings = settings_of(spec, config)
    try:
        model = AutoModelForImageTextToText.from_pretrained(spec["model_id"], **_transformers_dtype_kwarg(dtype))
    except ValueError as e:
        if "Unrecognized configuration class" in str(e) or "AutoModelForImageTextToText" in str(e):
            raise WrongModelType(
                f"{what} is not a generative image-text model (AutoModelForImageTextToText does not "
                f"load a {config.model_type!r}): a dual encoder is type 'transformers', a BLIP "
                f"matching head type 'itm'."
            ) from e
        raise
    except OSError as e:
        raise _download_hint(spec, e) from e
    model = model.to(device).eval()
    processor, image_processor = _processor(spec)
    joint = generative_model(spec, model, processor, settings, device, dtype)
    joint.info["image_processor"] = image_processor  # (which made the pixels: a PIL one, or a fast-only family's)
    return joint


def generative_model(spec, model, processor, settings, device, dtype):
    """The JointModel of a loaded generative `model` and its `processor` (load_generative's; a benchmark's
    model built in memory): its scores with `settings` (settings_of), the accelerations on."""
    from . import generative, image_groups

    what = f"model {spec['name']!r} ({spec['model_id']})"
    config = model.config
    prefix_lm = config.model_type == "paligemma"  # (no chat template: processor(text=prefix, suffix=answer))
    if not prefix_lm and not getattr(processor, "chat_template", None):
        raise ModelError(
            f"{what}: its processor has no chat template, so LGIP_SPEC.md 13's conversation cannot "
            f"be rendered; give the model_id of a chat (instruction-tuned) checkpoint, whose processor "
            f"has one"
        )
    if not getattr(processor.tokenizer, "is_fast", False):
        raise ModelError(f"{what}: its tokenizer is not a fast one: the caption's tokens are found by offsets")
    mean = settings["score"] == "logprob_mean"
    reuse = accelerations.PREFIX_REUSE and generative.reusable(model)
    if accelerations.PREFIX_REUSE and not reuse:
        print(
            f"note: {what}: a {config.model_type!r} is not among the families whose cache the reused prefix is "
            f"known to continue exactly ({', '.join(generative.REUSE_FAMILIES)}): one plain forward per text",
            file=sys.stderr,
        )
    conversations = Conversations(processor, splice=accelerations.CONVERSATION_SPLICE) if not prefix_lm else None
    packs = PACK_TOKENS if accelerations.TEXT_PACKS and generative.packable(model) else 0
    groups = (
        reuse
        and accelerations.IMAGE_GROUPS
        and accelerations.JOINT_PIPELINE
        and config.model_type in image_groups.GROUP_FAMILIES
    )
    lists = groups and conversations is not None and conversations.splice and accelerations.TOKEN_LISTS
    scored_logits = groups and accelerations.SCORED_LOGITS and image_groups.head_apart(model)
    wide = scored_logits and accelerations.WIDE_GROUPS
    size = WIDE_GROUP_IMAGES if wide else GROUP_IMAGES
    group = image_groups.ImageGroup(model, mean, size, lists, scored_logits) if groups else None
    late = groups and accelerations.LATE_SELF_CHECK
    checked = []  # (the self-check runs once, on the first image)

    def convs_of(texts):
        if settings["score"] == "vqascore":
            ask = "answer en " if prefix_lm else ""  # (PaliGemma's task prefix)
            return [(ask + settings["question"].format(t), "Yes") for t in texts]
        return [(settings["prompt"], t) for t in texts]

    def submit(image, texts):
        convs = convs_of(texts)
        pending = generative.submit(
            model, processor, image, convs, mean, reuse, TEXT_BATCH, packs, conversations, group
        )
        if reuse and not checked and convs:
            checked.append(True)

            def check(values):
                joint.info["self_check"] = self_check(model, processor, image, convs, values, mean, what)
                return values

            if late:  # (checked when the first image's group has run: before any of its scores is kept)
                return _Checked(pending, check)
            pending = generative.Pending(check(pending.result()))
        return pending

    why_not = {}
    if accelerations.PREFIX_REUSE and not reuse:
        why = (
            f"a {config.model_type!r}'s cache is not one the reused prefix is known to continue exactly "
            f"(REUSE_FAMILIES): one plain forward per text"
        )
        why_not.update(PREFIX_REUSE=why, CONVERSATION_SPLICE=why, TEXT_PACKS=why)
    elif not accelerations.PREFIX_REUSE:
        why_not.update(
            CONVERSATION_SPLICE="PREFIX_REUSE is off: the processor per text, as the definition",
            TEXT_PACKS="PREFIX_REUSE is off: one plain forward per text",
        )
    elif prefix_lm:
        why_not["CONVERSATION_SPLICE"] = "PaliGemma's conversation is its processor's prefix and suffix"
    if reuse and not packs and accelerations.TEXT_PACKS and "TEXT_PACKS" not in why_not:
        why_not["TEXT_PACKS"] = (
            f"a {config.model_type!r} is not among the families whose cache a packed row "
            f"continues exactly ({', '.join(generative.PACKED_FAMILIES)}): batches of "
            f"{TEXT_BATCH} on repeated caches"
        )
    if accelerations.IMAGE_GROUPS and not groups:
        why_not["IMAGE_GROUPS"] = (
            "PREFIX_REUSE is off or does not apply"
            if not reuse
            else "JOINT_PIPELINE is off: each image is waited for"
            if not accelerations.JOINT_PIPELINE
            else f"a {config.model_type!r} is not among the families whose images run in one forward "
            f"({', '.join(image_groups.GROUP_FAMILIES)}): per image"
        )
    needs = {
        "TOKEN_LISTS": (lists, "CONVERSATION_SPLICE is off: the processor's tensors per text"),
        "SCORED_LOGITS": (scored_logits, "the model's language-model head is not apart from its body"),
        "WIDE_GROUPS": (wide, "SCORED_LOGITS is off or does not apply: every position's logits"),
        "LATE_SELF_CHECK": (late, ""),
    }
    for name, (ran, why) in needs.items():
        if getattr(accelerations, name) and not ran:
            why_not[name] = (
                f"no image groups ({why_not.get('IMAGE_GROUPS', 'IMAGE_GROUPS is off')})" if not groups else why
            )
    applied = {n for n in accelerations.JOINT_ONLY if getattr(accelerations, n) and n not in why_not}
    joint = JointModel(
        model=model,
        processor=processor,
        device=device,
        dtype=dtype,
        score_kind=settings["score"],
        settings=settings,
        score=None,
        submit=submit,
        info={"model_id": spec["model_id"], "class": type(model).__name__, **settings},
        accelerations_applied=applied,
        why_not=why_not,
    )
    joint.in_flight = size if groups else 1
    return joint


class _Checked:
    """A first image's pending scores whose result() makes the run's self-check on them first (LATE_SELF_CHECK):
    `check(values)` returns them, or raises ModelError."""

    def __init__(self, pending, check):
        self._pending, self._check = pending, check

    def result(self):
        from .generative import Pending

        if self._check is not None:
            values, check, self._check = self._pending.result(), self._check, None
            self._pending = Pending(check(values))
        return self._pending.result()


def self_check(model, processor, image, convs, values, mean, what):
    """Issue 53's check of a run's fast path on its first image: the first SELF_CHECK_TEXTS conversations'
    scores (`values`, reused prefix) against one plain forward each. ModelError naming both numbers when
    they differ by more than SELF_CHECK_BOUND (float32 absolute; below it per scored token); else
    {texts, max_abs_diff, bound, seconds}, the run block's record."""
    import time
    from . import generative

    t0 = time.perf_counter()
    n = min(SELF_CHECK_TEXTS, len(convs))
    plain = generative.conversation_scores(model, processor, image, convs[:n], mean, reuse=False)
    dtype = str(model.dtype).replace("torch.", "")
    per_token = dtype != "float32" and not mean  # (a mean's difference is already per token)
    tokens = [generative.scored_tokens(model, processor, image, p, a) if per_token else 1 for p, a in convs[:n]]
    bound = SELF_CHECK_BOUND.get(dtype, SELF_CHECK_BOUND["bfloat16"])
    worst = max(range(n), key=lambda j: abs(values[j] - plain[j]) / (bound * tokens[j]))
    diff = abs(values[worst] - plain[worst])
    if diff > bound * tokens[worst] or not all(map(_finite, values[:n] + plain)):
        raise ModelError(
            f"{what}: the self-check failed: with its prefix run once, {convs[worst][1]!r} scores "
            f"{values[worst]:.6f}; in one plain forward {plain[worst]:.6f} (difference {diff:.2e}, "
            f"allowed {bound * tokens[worst]:.2e} in {dtype}). The fast path is not exact for this "
            f'model: run with ACCELERATIONS_OFF=["PREFIX_REUSE"] (one plain forward per text), and '
            f"report it"
        )
    return {
        "texts": n,
        "max_abs_diff": max(abs(a - b) for a, b in zip(values, plain)),
        "bound": bound,
        "bound_per_token": per_token,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def _finite(x):
    import math

    return math.isfinite(x)


def load_itm(spec, protocol, device, dtype):
    """A JointModel of type "itm" (module docstring)."""
    from transformers import Blip2ForImageTextRetrieval, BlipForImageTextRetrieval
    from . import itm
    from .dual_encoders import _transformers_dtype_kwarg

    what = f"model {spec['name']!r} ({spec['model_id']})"
    config = _config(spec)
    classes = {"blip": BlipForImageTextRetrieval, "blip-2": Blip2ForImageTextRetrieval}
    if config.model_type not in classes:
        raise WrongModelType(
            f"{what} has no image-text matching head that type 'itm' reads (a {config.model_type!r}; "
            f"it reads BLIP and BLIP-2 retrieval checkpoints such as Salesforce/blip-itm-base-coco)."
        )
    try:
        model = classes[config.model_type].from_pretrained(spec["model_id"], **_transformers_dtype_kwarg(dtype))
    except OSError as e:
        raise _download_hint(spec, e) from e
    model = model.to(device).eval()
    processor, image_processor = _processor(spec)

    def score(image, texts):
        if accelerations.PREFIX_REUSE:
            return itm.reused_scores(model, processor, image, texts)
        return itm.plain_scores(model, processor, image, texts)

    why = "BLIP's matching head has no conversation: its texts run in batches on the image's vision states"
    return JointModel(
        model=model,
        processor=processor,
        device=device,
        dtype=dtype,
        score_kind=ITM_SCORE,
        settings={},
        score=score,
        info={"model_id": spec["model_id"], "class": type(model).__name__, "image_processor": image_processor},
        accelerations_applied={n for n in ("PREFIX_REUSE", "JOINT_PIPELINE") if getattr(accelerations, n)},
        why_not={n: why for n in accelerations.JOINT_ONLY if n not in ("PREFIX_REUSE", "JOINT_PIPELINE")},
    )


def generative_key(spec, protocol):
    """The JointKey of a generative spec (its settings read from its config: no weights)."""
    return JointKey(score_kind=score_kind_of(spec), settings=settings_of(spec))


def itm_key(spec, protocol):
    """The JointKey of an itm spec: its score is the head's log-odds, with no settings."""
    return JointKey(score_kind=ITM_SCORE, settings={})


def _generative_card(spec, model, enc):
    return joint_card(spec, model, getattr(enc, "processor", None), head="lm")


def _itm_card(spec, model, enc):
    return joint_card(spec, model, getattr(enc, "processor", None), head="itm")


# LGIP_SPEC.md 13: a pair scored by one model (the "joint" scorer); its card and files as a transformers model's
GENERATIVE = register(
    Family(
        "generative",
        required="model_id",
        options=("score", "prompt", "question"),
        load=load_generative,
        keys=generative_key,
        scorer="joint",
        score_kind=score_kind_of,
        hub_files=model_id_files,
        named=model_id_named,
        card=_generative_card,
        check=check_settings,
        local_paths=model_id_paths,
        accelerations=accelerations.JOINT_ONLY,
        about="a generative VLM scoring a pair by a text's log-probability (LGIP_SPEC.md 13)",
        label=lambda model_family: "generative VLM",
    )
)
ITM = register(
    Family(
        "itm",
        required="model_id",
        load=load_itm,
        keys=itm_key,
        scorer="joint",
        score_kind=lambda spec: ITM_SCORE,
        hub_files=model_id_files,
        named=model_id_named,
        card=_itm_card,
        local_paths=model_id_paths,
        accelerations=accelerations.JOINT_ONLY,
        about="a BLIP / BLIP-2 image-text matching head scoring a pair (LGIP_SPEC.md 13)",
        label=lambda model_family: "ITM cross-encoder",
    )
)
