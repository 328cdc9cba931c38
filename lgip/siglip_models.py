"""lgip.siglip_models: the transformers loader for SigLIP and SigLIP2 (transformers 4.4x
and 5.x): text without an attention mask, padded to 64 (corrected) or to the longest text of
its published call (reference); SigLIP2 lowercased as trained."""
import os

from . import accelerations
from .errors import ModelError
from .encoder import Encoder, Prepared, SIGLIP_TEXT_LENGTH, _as_features, _download_hint, _normalise, tokenizer_key
from .towers import _siglip_text_last, _siglip_text_tower
from .pixels import pixel_split_siglip


def _transformers_version():
    import transformers
    return tuple(int(p) for p in transformers.__version__.split(".")[:2])


def _transformers_dtype_kwarg(dtype):
    return {"dtype": dtype} if _transformers_version() >= (4, 56) else {"torch_dtype": dtype}


def _pil_image_processor_kwarg():
    """Pin the PIL (4.x "slow") image processor: transformers 5 defaults to the torchvision one,
    whose resize differs by up to one uint8 level (2/255 after SigLIP's normalisation)."""
    return {"backend": "pil"} if _transformers_version() >= (5, 0) else {"use_fast": False}


def _siglip_tokenize_fn(tok, spec, protocol, model_type):
    """(tokenize(texts) -> unpadded id lists, tokenizer identity, max length, lowercase) of a
    SigLIP/SigLIP2 tokenizer: SigLIP2 lowercases under the corrected protocol (as trained).
    Shared by load_siglip and prepare_siglip, so a text tokenized ahead has the model's ids."""
    is_siglip2 = "siglip2" in spec["model_id"].lower() or model_type == "siglip2"
    lowercase = bool(spec.get("lowercase", is_siglip2) and protocol == "corrected")
    max_len = min(SIGLIP_TEXT_LENGTH, getattr(tok, "model_max_length", SIGLIP_TEXT_LENGTH) or SIGLIP_TEXT_LENGTH)

    def tokenize(texts):
        texts = [t.lower() for t in texts] if lowercase else list(texts)
        return tok(texts, truncation=True, max_length=max_len, padding=False)["input_ids"]
    return tokenize, (type(tok).__name__, len(tok), max_len, lowercase), max_len, lowercase


def _siglip_preprocessors(model_id):
    """(tokenizer, PIL image processor) of a SigLIP/SigLIP2 checkpoint."""
    from transformers import AutoImageProcessor, AutoProcessor
    # Only the image processor gets the kwarg: through AutoProcessor it would reach the
    # tokenizer too (4.x use_fast=False turns SigLIP2's Gemma tokenizer slow).
    return (AutoProcessor.from_pretrained(model_id).tokenizer,
            AutoImageProcessor.from_pretrained(model_id, **_pil_image_processor_kwarg()))


def load_siglip(spec, protocol, device, dtype):
    import torch
    from transformers import AutoModel
    model_id = spec["model_id"]
    try:
        tok, image_processor = _siglip_preprocessors(model_id)
        # Pin the dtype (transformers 5 would otherwise load in the checkpoint's dtype): fp32
        # first, for the check of the last-layer path below, then the run's dtype.
        model = AutoModel.from_pretrained(model_id, **_transformers_dtype_kwarg(torch.float32))
    except OSError as e:
        if os.path.isdir(model_id) or "not a valid model identifier" in str(e) or "does not appear" in str(e):
            raise ModelError(f"model {spec.get('name')!r}: {model_id!r} is not a SigLIP/SigLIP2 checkpoint "
                             f"(a Hub id like google/siglip-base-patch16-224 or a local folder): {e}") from e
        raise _download_hint(spec, e) from e
    model = model.eval().to(device=device)
    tokenize, identity, max_len, lowercase = _siglip_tokenize_fn(tok, spec, protocol,
                                                                 model.config.model_type)
    enc = Encoder()
    enc.model, enc.device, enc.dtype = model, device, dtype
    enc.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0

    tower = _siglip_text_tower(model) if accelerations.POOLED_LAST_BLOCK else None

    @torch.no_grad()
    def encode_tokens(ids, exact_length=False, last_only=True):  # exact_length: unused (SigLIP pads to a fixed length)
        # input_ids only: SigLIP/SigLIP2 were trained without a text attention mask.
        ids = ids.to(device, non_blocking=True)
        if tower is not None and last_only:
            return _normalise(_siglip_text_last(tower, ids))
        return _normalise(_as_features(model.get_text_features(input_ids=ids)))

    if tower is not None:  # proven on this model and device in fp32 (before the cast), else the full forward
        probe = torch.full((3, max_len), enc.pad_id, dtype=torch.long)
        for r, ids in enumerate(tokenize(["a photo of a dog", "two red buses parked on a street.", "A cat!"])):
            probe[r, :len(ids)] = torch.tensor(ids)
        for ids in (probe, probe[:, :8]):  # padded as trained, and cut short (the reference protocol)
            if tower is not None and not (encode_tokens(ids, last_only=False) - encode_tokens(ids)).abs().max() < 1e-4:
                tower = None
    model.to(dtype=dtype)

    @torch.no_grad()
    def encode_images(batch):
        batch = batch if isinstance(batch, dict) else {"pixel_values": batch}
        batch = {k: (v.to(device=device, dtype=dtype) if v.is_floating_point() else v.to(device))
                 for k, v in batch.items()}
        return _normalise(_as_features(model.get_image_features(**batch)))

    enc.tokenize, enc.encode_tokens, enc.encode_images = tokenize, encode_tokens, encode_images
    enc.tokenizer_identity = identity
    enc.image_transform = SiglipImageTransform(image_processor)
    enc.pixels = pixel_split_siglip(image_processor)
    _set_padding(enc, protocol, max_len)
    enc.info = {"text_length": "longest in call" if protocol == "reference" else max_len, "lowercase": bool(lowercase),
                "text_last_layer_pooled_position_only": tower is not None}
    return enc


def _set_padding(enc, protocol, max_len):
    """The padding of the texts of a call: its longest text (reference: padding=True), else
    max_len (padding="max_length" as trained)."""
    if protocol == "reference":
        enc.pad_length = lambda call_lengths: max(call_lengths)
        enc.pad_needs_lengths = True
    else:
        enc.pad_length = lambda call_lengths: max_len


def siglip_key_encoder(spec, protocol):
    """An Encoder without weights that makes a SigLIP model's cache keys: its tokenizer where
    the published padding needs the texts' lengths, else nothing but the fixed length."""
    enc = Encoder()
    if protocol != "reference":
        _set_padding(enc, protocol, SIGLIP_TEXT_LENGTH)  # (a tokenizer with a shorter limit: its keys miss, the model loads)
        return enc
    from transformers import AutoConfig, AutoProcessor
    model_id = spec["model_id"]
    tok = AutoProcessor.from_pretrained(model_id).tokenizer
    tokenize, enc.tokenizer_identity, max_len, _ = _siglip_tokenize_fn(tok, spec, protocol,
                                                                       AutoConfig.from_pretrained(model_id).model_type)
    enc.tokenize, enc.pad_id = tokenize, tok.pad_token_id if tok.pad_token_id is not None else 0
    enc.tokenizer_key = tokenizer_key("siglip", enc.tokenizer_identity, tokenize)
    _set_padding(enc, protocol, max_len)
    return enc


class SiglipImageTransform:
    """PIL image -> pixel_values (and any extra inputs the processor makes), picklable."""

    def __init__(self, image_processor):
        self.image_processor = image_processor

    def __call__(self, img):
        out = self.image_processor(images=img, return_tensors="pt")
        out = {k: v[0] for k, v in out.items()}
        return out["pixel_values"] if len(out) == 1 else out


def prepare_siglip(spec, protocol):
    """The tokenizer and pixel geometry of a SigLIP/SigLIP2 model: small files, no weights."""
    from transformers import AutoConfig
    model_id = spec["model_id"]
    tok, image_processor = _siglip_preprocessors(model_id)
    tokenize, identity, _, _ = _siglip_tokenize_fn(tok, spec, protocol, AutoConfig.from_pretrained(model_id).model_type)
    pixels = pixel_split_siglip(image_processor) if accelerations.PIXELS_ON_DEVICE else None
    return Prepared(spec["name"], tokenizer_key("siglip", identity, tokenize), tokenize, pixels)
