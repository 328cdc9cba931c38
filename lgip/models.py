"""lgip.models: the registry (CLIP_benchmark's shape): a model spec's "type" picks a loader
returning an Encoder, and a preparer returning its tokenizer and pixels without its weights.
The room for a new model family: a loader and a preparer here.

    >>> enc = load_model({"name": "b16", "type": "openclip", "model_name": "ViT-B-16", "pretrained": "openai"})
    >>> enc.encode_images(pixels), enc.encode_tokens(ids)
"""
from . import accelerations
from .errors import ModelError
from .encoder import PROTOCOLS, resolve_device, resolve_dtype, tokenizer_key
from .pixels import check_pixel_split
from .hub import check_model
from .openclip_models import load_openclip, openclip_key_encoder, prepare_openclip
from .siglip_models import load_siglip, prepare_siglip, siglip_key_encoder


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


MODEL_LOADERS = {"openclip": load_openclip, "siglip": load_siglip}  # spec "type" -> (spec, protocol, device, dtype) -> Encoder
MODEL_PREPARERS = {"openclip": prepare_openclip, "siglip": prepare_siglip}  # same keys: (spec, protocol) -> Prepared (no weights)
MODEL_KEYS = {"openclip": openclip_key_encoder, "siglip": siglip_key_encoder}  # same keys: (spec, protocol) -> Encoder making the cache keys, or None


def _check_spec(spec, protocol):
    if not isinstance(spec, dict) or "name" not in spec or "type" not in spec:
        raise ModelError(f"a model spec is a dict with 'name' and 'type' (+ 'model_name'/'pretrained' for openclip, "
                         f"'model_id' for siglip), got {spec!r}")
    if spec["type"] not in MODEL_LOADERS:
        raise ModelError(f"model {spec['name']!r}: unknown type {spec['type']!r}; valid: {', '.join(MODEL_LOADERS)}")
    required = {"openclip": "model_name", "siglip": "model_id"}[spec["type"]]
    if required not in spec:
        raise ModelError(f"model {spec['name']!r}: type {spec['type']!r} needs {required!r}")
    if protocol not in PROTOCOLS:
        raise ModelError(f"unknown PROTOCOL {protocol!r}; valid: {', '.join(PROTOCOLS)}")


def load_model(spec, protocol="corrected", device="cpu", dtype=None):
    """Build the Encoder for one model spec through the MODEL_LOADERS registry. A model whose
    files can be had neither locally nor from the Hub stops here at once (lgip.hub)."""
    _check_spec(spec, protocol)
    check_model(spec)
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    enc = MODEL_LOADERS[spec["type"]](spec, protocol, device, torch_dtype)
    enc.name, enc.type, enc.protocol = spec["name"], spec["type"], protocol
    enc.tokenizer_key = tokenizer_key(enc.type, enc.tokenizer_identity, enc.tokenize)
    enc.pixels = check_pixel_split(enc, enc.pixels) if accelerations.PIXELS_ON_DEVICE else None
    enc.info = dict(enc.info, pixels_on_device=enc.pixels is not None, weights_loaded=True)
    return enc


def key_encoder(spec, protocol="corrected", device="cpu", dtype=None):
    """An Encoder without weights (`weights_loaded` False, no encode_* functions) that makes the
    cache keys the loaded model makes (MODEL_KEYS), cheaply: a re-run whose texts and images are
    all in the cache needs no more. None when the family cannot tell its keys without the model.
    Keys it gets wrong only miss: the run then loads the model."""
    _check_spec(spec, protocol)
    enc = MODEL_KEYS[spec["type"]](spec, protocol)
    if enc is None:
        return None
    enc.name, enc.type, enc.protocol = spec["name"], spec["type"], protocol
    enc.device = resolve_device(device)
    enc.dtype = resolve_dtype(dtype, enc.device)
    enc.weights_loaded, enc.info = False, {"weights_loaded": False}
    return enc
