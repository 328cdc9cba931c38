"""lgip.models.registry: the registry (CLIP_benchmark's shape): a model spec's "type" picks its family's
record (lgip.models.families: its loader returning an Encoder, its preparer returning its tokenizer and
pixels without its weights, its key encoder making its cache keys without them, its scorer, card and Hub
files). Each family's module registers its record when imported here; `describe_types()` lists them with their
keys (what --help and a bad spec's error say). A MODELS entry may also be a name (NAMED_MODELS: the published
nine, and "demo", the bundled demo model, lgip.demo); `expand_models` turns names into specs before any work.
The room for a new model family: a module with its loader (spec, protocol, device, dtype) -> Encoder and
its record, `register(Family(...))` (lgip.models.families), imported below; nothing else.

    >>> enc = load_model({"name": "b16", "type": "openclip", "model_name": "ViT-B-16", "pretrained": "openai"})
    >>> enc.encode_images(pixels), enc.encode_tokens(ids)
"""

import sys

from .. import accelerations
from ..demo import DEMO_MODEL, DEMO_NAME
from ..errors import ModelError, WrongModelType
from .zoo import ZOO_SPEC_TYPE, expand_zoo, is_zoo
from .finetunes import FINETUNES, require_weights
from .encoder import PROTOCOLS, check_keys, resolve_device, resolve_dtype, tokenizer_key
from .pixels import check_pixel_split
from .hub import check_model
from .families import FAMILIES, describe_types, family, known_family

# the family modules, each registering its record when imported: their order is the order errors list the types
# (imported for their records: openclip, dual_encoders, own_loader, joint, causal_lm register their types)
from . import openclip, dual_encoders, own_loader, joint, causal_lm  # noqa: F401


PUBLISHED_MODELS = [  # the nine models of the paper, as the published scripts specify them
    {"name": "openclip_ViT-B-16_openai", "type": "openclip", "model_name": "ViT-B-16", "pretrained": "openai"},
    {"name": "openclip_ViT-L-14_openai", "type": "openclip", "model_name": "ViT-L-14", "pretrained": "openai"},
    {
        "name": "openclip_ViT-L-14_laion2b_s32b_b82k",
        "type": "openclip",
        "model_name": "ViT-L-14",
        "pretrained": "laion2b_s32b_b82k",
    },
    {
        "name": "openclip_ViT-H-14_laion2b_s32b_b79k",
        "type": "openclip",
        "model_name": "ViT-H-14",
        "pretrained": "laion2b_s32b_b79k",
    },
    {
        "name": "openclip_EVA02-L-14_merged2b_s4b_b131k",
        "type": "openclip",
        "model_name": "EVA02-L-14",
        "pretrained": "merged2b_s4b_b131k",
    },
    {"name": "siglip_google_siglip-base-patch16-224", "type": "siglip", "model_id": "google/siglip-base-patch16-224"},
    {"name": "siglip_google_siglip-base-patch16-384", "type": "siglip", "model_id": "google/siglip-base-patch16-384"},
    {"name": "siglip_google_siglip-large-patch16-384", "type": "siglip", "model_id": "google/siglip-large-patch16-384"},
    {
        "name": "siglip2_google_siglip2-base-patch16-224",
        "type": "siglip",
        "model_id": "google/siglip2-base-patch16-224",
    },
]


# names a MODELS entry may give instead of a spec: the published nine by their names, "demo", and the field's
# compositional fine-tunes (lgip.models.finetunes: never among PUBLISHED_MODELS, the paper's default nine)
NAMED_MODELS = {
    **{m["name"]: m for m in PUBLISHED_MODELS},
    DEMO_NAME: DEMO_MODEL,
    **{name: entry.spec for name, entry in FINETUNES.items()},
}


def expand_models(models):
    """MODELS as a list of spec dicts: a name (a string, or a string of names "a,b") stands for its
    spec in NAMED_MODELS, a dict without "type" naming one for that spec with the dict's keys over it
    ({"name": "negclip", "pretrained": "/data/negclip.pth"}: a fine-tune released as a file, lgip.models.finetunes,
    whose name alone is an error saying where its file is), an {"type": "openclip_zoo", "match", "tags"} entry for
    its open_clip models
    (lgip.models.zoo; a pair that another entry of the list names is evaluated once, as that entry), a
    spec dict stays as given (copied), None stays None (a script's own default). An unknown name is an
    error naming the closest valid names.
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
        if isinstance(m, dict) and "type" not in m and m.get("name") in NAMED_MODELS:
            m = {**NAMED_MODELS[m["name"]], **m}  # (a named model given its own settings: its file, its card)
            require_weights(m)
        if isinstance(m, str):
            if m not in NAMED_MODELS:
                close = difflib.get_close_matches(m, list(NAMED_MODELS), n=3, cutoff=0.4)
                hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
                raise ModelError(
                    f"unknown model name {m!r}; {hint}named models: {', '.join(NAMED_MODELS)} "
                    f'(or give a spec dict, README "Models")'
                )
            m = NAMED_MODELS[m]
            require_weights(m)
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
    """An open_clip spec's (architecture, pretrained tag), else None (a zoo's specs are of its type)."""
    if isinstance(spec, dict) and spec.get("type") == ZOO_SPEC_TYPE:
        return spec.get("model_name"), spec.get("pretrained")
    return None


def spec_keys(model_type):
    """The keys a spec of `model_type` may have, in the order the error lists them."""
    return family(model_type).spec_keys()


def _check_spec(spec, protocol):
    if not isinstance(spec, dict) or "name" not in spec or "type" not in spec:
        raise ModelError(
            f"a model spec is a dict with 'name', 'type' and its type's keys (types: {describe_types('; ')}), "
            f"got {spec!r}"
        )
    kind = family(spec)  # (an unknown type: the error names the valid ones)
    check_keys(spec, kind.spec_keys(), f"model {spec['name']!r} (type {spec['type']!r})")
    required = kind.required
    if required not in spec:
        raise ModelError(f"model {spec['name']!r}: type {spec['type']!r} needs {required!r}")
    if required != "loader" and (not isinstance(spec[required], str) or not spec[required].strip()):
        raise ModelError(f"model {spec['name']!r}: {required!r} must be a non-empty string, got {spec[required]!r}")
    kind.check(spec)
    if protocol not in PROTOCOLS:
        raise ModelError(f"unknown PROTOCOL {protocol!r}; valid: {', '.join(PROTOCOLS)}")


def cacheable(spec):
    """False for a model held in memory (type python, a function or the objects as its loader):
    nothing on disk names its weights (a training loop's next epoch has the same name and
    objects), so its embeddings are never cached."""
    kind = known_family(spec)
    return kind is None or not kind.in_memory(spec)


def load_model(spec, protocol="corrected", device="cpu", dtype=None):
    """Build the Encoder for one model spec through its family's loader. A model whose
    files can be had neither locally nor from the Hub stops here at once (lgip.models.hub)."""
    _check_spec(spec, protocol)
    check_model(spec)
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    try:
        enc = family(spec).load(spec, protocol, device, torch_dtype)
    except WrongModelType as e:
        raise ModelError(
            f"{e} Valid types: {', '.join(FAMILIES)} (type 'python' takes a loader of your own "
            f"returning (model, preprocess, tokenizer))"
        ) from e
    enc.named(spec, protocol)
    if enc.tokenize is not None:  # (a joint scorer, lgip.models.joint, has neither tokens nor pixels of its own)
        enc.tokenizer_key = tokenizer_key(enc.type, enc.tokenizer_identity, enc.tokenize)
    enc.pixels = check_pixel_split(enc, enc.pixels) if accelerations.PIXELS_ON_DEVICE else None
    enc.info = dict(enc.info, pixels_on_device=enc.pixels is not None, weights_loaded=True)
    warning = family(spec).random_init(spec)
    if warning:
        enc.info["random_init"] = True
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    return enc


def random_init(spec):
    """True for a spec whose family builds it with random weights (an open_clip architecture named without
    "pretrained"; the demo model is random by design and says so)."""
    kind = FAMILIES.get(spec.get("type")) if isinstance(spec, dict) else None
    return kind is not None and kind.random_init(spec) is not None


def key_encoder(spec, protocol="corrected", device="cpu", dtype=None):
    """A KeyEncoder (lgip.models.encoder: no weights, no encode_* functions) that makes the cache keys
    the loaded model makes (its family's keys), cheaply: a re-run whose texts and images are all in the cache
    needs no more. None when the family cannot tell its keys without the model. Keys it gets wrong
    only miss: the run then loads the model."""
    _check_spec(spec, protocol)
    keys = family(spec).keys
    enc = keys(spec, protocol) if keys is not None else None
    if enc is None:
        return None
    enc.named(spec, protocol)
    enc.device = resolve_device(device)
    enc.dtype = resolve_dtype(dtype, enc.device)
    if random_init(spec):
        enc.info["random_init"] = True
    return enc
