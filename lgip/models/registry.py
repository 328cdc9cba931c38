"""lgip.models.registry: the registry (CLIP_benchmark's shape): a model spec's "type" picks a loader
returning an Encoder, a preparer returning its tokenizer and pixels without its weights, and a
key encoder making its cache keys without them. The types:
  openclip      {"model_name", "pretrained"}: open_clip names and tags, hf-hub:, local-dir:, checkpoint files
  transformers  {"model_id"}: any transformers dual encoder (CLIP, MetaCLIP, AltCLIP, ALIGN, ChineseCLIP, SigLIP, ...)
  siglip        {"model_id"}: the same loader, the published specs' name for SigLIP/SigLIP2
  python        {"loader", "kwargs"}: a loader of one's own returning (model, preprocess, tokenizer)
  generative    {"model_id", "score", "prompt", "question"}: a generative VLM scoring a pair (LGIP_SPEC.md 13:
                a JointModel, lgip.models.joint)
  itm           {"model_id"}: a BLIP / BLIP-2 image-text matching head (the same)
A MODELS entry may also be a name (NAMED_MODELS: the published nine, and "demo", the bundled demo
model, lgip.demo); `expand_models` turns names into specs before any work.
The room for a new model family: a module with its loader (spec, protocol, device, dtype) ->
Encoder, registered in the four dicts below (preparer and key encoder may be None).

    >>> enc = load_model({"name": "b16", "type": "openclip", "model_name": "ViT-B-16", "pretrained": "openai"})
    >>> enc.encode_images(pixels), enc.encode_tokens(ids)
"""
import sys

from .. import accelerations
from ..demo import DEMO_MODEL, DEMO_NAME
from ..errors import ModelError, WrongModelType
from .zoo import expand_zoo, is_zoo
from .encoder import PROTOCOLS, check_keys, resolve_device, resolve_dtype, tokenizer_key
from .pixels import check_pixel_split
from .hub import check_model
from .joint import check_settings, joint_key, load_generative, load_itm
from .openclip import load_openclip, openclip_key_encoder, prepare_openclip
from .python import in_memory, load_python, loader_files, python_key_encoder
from .transformers import load_transformers, prepare_transformers, transformers_key_encoder


PUBLISHED_MODELS = [  # the nine models of the paper, as the published scripts specify them
    {"name": "openclip_ViT-B-16_openai", "type": "openclip", "model_name": "ViT-B-16", "pretrained": "openai"},
    {"name": "openclip_ViT-L-14_openai", "type": "openclip", "model_name": "ViT-L-14", "pretrained": "openai"},
    {"name": "openclip_ViT-L-14_laion2b_s32b_b82k", "type": "openclip", "model_name": "ViT-L-14", "pretrained": "laion2b_s32b_b82k"},
    {"name": "openclip_ViT-H-14_laion2b_s32b_b79k", "type": "openclip", "model_name": "ViT-H-14", "pretrained": "laion2b_s32b_b79k"},
    {"name": "openclip_EVA02-L-14_merged2b_s4b_b131k", "type": "openclip", "model_name": "EVA02-L-14", "pretrained": "merged2b_s4b_b131k"},
    {"name": "siglip_google_siglip-base-patch16-224", "type": "siglip", "model_id": "google/siglip-base-patch16-224"},
    {"name": "siglip_google_siglip-base-patch16-384", "type": "siglip", "model_id": "google/siglip-base-patch16-384"},
    {"name": "siglip_google_siglip-large-patch16-384", "type": "siglip", "model_id": "google/siglip-large-patch16-384"},
    {"name": "siglip2_google_siglip2-base-patch16-224", "type": "siglip", "model_id": "google/siglip2-base-patch16-224"},
]


# names a MODELS entry may give instead of a spec: the published nine by their names, and "demo"
NAMED_MODELS = {**{m["name"]: m for m in PUBLISHED_MODELS}, DEMO_NAME: DEMO_MODEL}


def expand_models(models):
    """MODELS as a list of spec dicts: a name (a string, or a string of names "a,b") stands for its
    spec in NAMED_MODELS, an {"type": "openclip_zoo", "match", "tags"} entry for its open_clip models
    (lgip.models.zoo; a pair that another entry of the list names is evaluated once, as that entry), a spec dict stays as given
    (copied), None stays None (a script's own default). An unknown name is an error naming the
    closest valid names.
    >>> [m["name"] for m in expand_models(["demo", {"name": "mine", "type": "python", "loader": "m.py:f"}])]
    ['demo_tiny_random', 'mine']
    """
    import difflib
    if models is None:
        return None
    if isinstance(models, str):
        models = [n.strip() for n in models.split(",") if n.strip()]
    if not isinstance(models, (list, tuple)):
        return models  # (the settings check names what a list of specs must be)
    out, zoo = [], []  # zoo: the positions in `out` that a zoo entry filled
    for m in models:
        if is_zoo(m):
            zoo += range(len(out), len(out) + len(expanded := expand_zoo(m)))
            out += expanded
            continue
        if isinstance(m, str):
            if m not in NAMED_MODELS:
                close = difflib.get_close_matches(m, list(NAMED_MODELS), n=3, cutoff=0.4)
                hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
                raise ModelError(f"unknown model name {m!r}; {hint}named models: {', '.join(NAMED_MODELS)} "
                                 f"(or give a spec dict, README \"Models\")")
            m = NAMED_MODELS[m]
        out.append(dict(m) if isinstance(m, dict) else m)
    # a pair named twice is evaluated once: a zoo's pair goes when a spec of the list names it (before
    # or after the zoo entry: that spec's name and settings are the user's own) or an earlier zoo had it
    named = {_pair(s) for i, s in enumerate(out) if i not in zoo} - {None}
    keep, seen = [], set()
    for i, s in enumerate(out):
        if i in zoo:
            if _pair(s) in named or _pair(s) in seen:
                continue
            seen.add(_pair(s))
        keep.append(s)
    return keep


def _pair(spec):
    """An open_clip spec's (architecture, pretrained tag), else None."""
    if isinstance(spec, dict) and spec.get("type") == "openclip":
        return spec.get("model_name"), spec.get("pretrained")
    return None


# spec "type" -> (spec, protocol, device, dtype) -> Encoder
MODEL_LOADERS = {"openclip": load_openclip, "transformers": load_transformers, "siglip": load_transformers,
                 "python": load_python, "generative": load_generative, "itm": load_itm}
# same keys: (spec, protocol) -> Prepared (tokenizer and pixels, no weights), or None: nothing to do ahead
MODEL_PREPARERS = {"openclip": prepare_openclip, "transformers": prepare_transformers, "siglip": prepare_transformers,
                   "python": None, "generative": None, "itm": None}
# same keys: (spec, protocol) -> Encoder making the cache keys without weights, or None
MODEL_KEYS = {"openclip": openclip_key_encoder, "transformers": transformers_key_encoder,
              "siglip": transformers_key_encoder, "python": python_key_encoder, "generative": joint_key,
              "itm": joint_key}
# same keys: the field a spec of the type must have
MODEL_FIELDS = {"openclip": "model_name", "transformers": "model_id", "siglip": "model_id", "python": "loader",
                "generative": "model_id", "itm": "model_id"}
# same keys: the fields a spec of the type may have besides its required one and SPEC_COMMON's
MODEL_OPTIONS = {"openclip": ("pretrained",), "transformers": ("lowercase",), "siglip": ("lowercase",),
                 "python": ("kwargs",), "generative": ("score", "prompt", "question"), "itm": ()}
SPEC_COMMON = ("name", "type", "card", "demo")  # every type's: its name, type, own card fields, demo marker
# same keys: spec -> the files beyond its checkpoint whose size and mtime its cache's identity covers
# (a loader of one's own: its code and its kwargs' files), or None (lgip.cache)
MODEL_CACHE_FILES = {"openclip": None, "transformers": None, "siglip": None, "python": loader_files,
                     "generative": None, "itm": None}
# same keys: how a model of the type scores a pair (lgip.scorer.SCORERS): "embeddings", a dual encoder's
# image and text embedded apart and scored by cosine; "joint", a pair scored by one model (LGIP_SPEC.md 13)
MODEL_SCORERS = {"openclip": "embeddings", "transformers": "embeddings", "siglip": "embeddings", "python": "embeddings",
                 "generative": "joint", "itm": "joint"}


def spec_keys(model_type):
    """The keys a spec of `model_type` may have, in the order the error lists them."""
    return SPEC_COMMON[:2] + (MODEL_FIELDS[model_type],) + MODEL_OPTIONS[model_type] + SPEC_COMMON[2:]


def _check_spec(spec, protocol):
    if not isinstance(spec, dict) or "name" not in spec or "type" not in spec:
        raise ModelError(f"a model spec is a dict with 'name' and 'type' (+ 'model_name'/'pretrained' for openclip, "
                         f"'model_id' for transformers and siglip, 'loader' for python), got {spec!r}")
    if spec["type"] not in MODEL_LOADERS:
        raise ModelError(f"model {spec['name']!r}: unknown type {spec['type']!r}; valid: {', '.join(MODEL_LOADERS)}")
    check_keys(spec, spec_keys(spec["type"]), f"model {spec['name']!r} (type {spec['type']!r})")
    required = MODEL_FIELDS[spec["type"]]
    if required not in spec:
        raise ModelError(f"model {spec['name']!r}: type {spec['type']!r} needs {required!r}")
    if required != "loader" and (not isinstance(spec[required], str) or not spec[required].strip()):
        raise ModelError(f"model {spec['name']!r}: {required!r} must be a non-empty string, got {spec[required]!r}")
    check_settings(spec)
    if protocol not in PROTOCOLS:
        raise ModelError(f"unknown PROTOCOL {protocol!r}; valid: {', '.join(PROTOCOLS)}")


def cacheable(spec):
    """False for a model held in memory (type python, a function or the objects as its loader):
    nothing on disk names its weights (a training loop's next epoch has the same name and
    objects), so its embeddings are never cached."""
    return not in_memory(spec)


def load_model(spec, protocol="corrected", device="cpu", dtype=None):
    """Build the Encoder for one model spec through the MODEL_LOADERS registry. A model whose
    files can be had neither locally nor from the Hub stops here at once (lgip.models.hub)."""
    _check_spec(spec, protocol)
    check_model(spec)
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    try:
        enc = MODEL_LOADERS[spec["type"]](spec, protocol, device, torch_dtype)
    except WrongModelType as e:
        raise ModelError(f"{e} Valid types: {', '.join(MODEL_LOADERS)} (type 'python' takes a loader of your own "
                         f"returning (model, preprocess, tokenizer))") from e
    enc.named(spec, protocol)
    if enc.tokenize is not None:  # (a joint scorer, lgip.models.joint, has neither tokens nor pixels of its own)
        enc.tokenizer_key = tokenizer_key(enc.type, enc.tokenizer_identity, enc.tokenize)
    enc.pixels = check_pixel_split(enc, enc.pixels) if accelerations.PIXELS_ON_DEVICE else None
    enc.info = dict(enc.info, pixels_on_device=enc.pixels is not None, weights_loaded=True)
    if random_init(spec):
        enc.info["random_init"] = True
        print(f"warning: model {spec['name']!r} has no pretrained weights (open_clip {spec['model_name']} with "
              f"pretrained None): a random-init model, whose figures say nothing of a trained one; give "
              f"\"pretrained\" a tag ({', '.join(_tags(spec['model_name'])) or 'none for this architecture'}) "
              f"or a checkpoint file", file=sys.stderr, flush=True)
    return enc


def random_init(spec):
    """True for an open_clip architecture named without weights (no "pretrained", not hf-hub: or
    local-dir:): open_clip builds it with random weights; the demo model is random by design and says so."""
    name = spec.get("model_name")
    return (spec.get("type") == "openclip" and not spec.get("pretrained") and not spec.get("demo")
            and isinstance(name, str) and not name.startswith(("hf-hub:", "local-dir:")))


def _tags(name):
    import open_clip
    return open_clip.list_pretrained_tags_by_model(name)[:4]


def key_encoder(spec, protocol="corrected", device="cpu", dtype=None):
    """A KeyEncoder (lgip.models.encoder: no weights, no encode_* functions) that makes the cache keys
    the loaded model makes (MODEL_KEYS), cheaply: a re-run whose texts and images are all in the cache
    needs no more. None when the family cannot tell its keys without the model. Keys it gets wrong
    only miss: the run then loads the model."""
    _check_spec(spec, protocol)
    enc = MODEL_KEYS[spec["type"]](spec, protocol) if MODEL_KEYS[spec["type"]] is not None else None
    if enc is None:
        return None
    enc.named(spec, protocol)
    enc.device = resolve_device(device)
    enc.dtype = resolve_dtype(dtype, enc.device)
    if random_init(spec):
        enc.info["random_init"] = True
    return enc
