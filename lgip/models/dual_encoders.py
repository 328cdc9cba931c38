"""lgip.models.dual_encoders: the transformers loader (types "transformers" and "siglip", one
loader): any dual encoder with `get_text_features` and `get_image_features` (CLIPModel and
MetaCLIP checkpoints, AltCLIPModel, AlignModel, ChineseCLIPModel, SiglipModel, Siglip2Model, ...),
through its own AutoProcessor, the image processor pinned to its PIL backend.

A text's embedding never depends on the texts that share its batch. How, per family
(`text_rules`; tests/test_any_model.py shows each):
- SigLIP/SigLIP2: trained without an attention mask on text padded to 64, so padded to 64 and
  no mask (corrected), or to the longest text of its published call (reference, as the published
  code); SigLIP2 lowercased (corrected), as trained.
- a tokenizer that emits an attention mask (CLIP, AltCLIP, ALIGN, ChineseCLIP, ...): texts are
  batched with texts of their own token length, so nothing is padded (the mask passed is all
  ones) and each text is encoded as if alone: what the processor's padding, masked, gives too.
- any other (no mask): padded as its processor pads (its fixed length), else not at all
  (corrected); to the longest text of its call (reference).

    >>> enc = load_transformers({"name": "b32", "type": "transformers", "model_id": "openai/clip-vit-base-patch32"},
    ...                         "corrected", "cuda", torch.bfloat16)
"""

import os

from .. import accelerations
from ..errors import ModelError, WrongModelType
from .cards import dual_encoder_card, model_id_named
from .families import Family, register
from .hub import model_id_files, model_id_paths
from .encoder import (
    Encoder,
    KeyEncoder,
    Prepared,
    SIGLIP_TEXT_LENGTH,
    _as_features,
    _download_hint,
    _normalise,
    tokenizer_key,
)
from .towers import _siglip_text_last, _siglip_text_tower
from .pixels import pixel_split_siglip
from .trainable import Trainable


SIGLIP_FAMILY = ("siglip", "siglip2")  # config.model_type of the models padded as SigLIP was trained
# The prefix of the text cache keys of the other families ("" for SigLIP, whose keys predate it).
TEXT_KEY_TAG = "hf1|"
REQUIRED = ("get_text_features", "get_image_features")  # what a model needs to be evaluated


def _transformers_version():
    import transformers

    return tuple(int(p) for p in transformers.__version__.split(".")[:2])


def _transformers_dtype_kwarg(dtype):
    return {"dtype": dtype} if _transformers_version() >= (4, 56) else {"torch_dtype": dtype}


def _pil_image_processor_kwarg():
    """Pin the PIL (4.x "slow") image processor: transformers 5 defaults to the torchvision one,
    whose resize differs by up to one uint8 level (2/255 after SigLIP's normalisation)."""
    return {"backend": "pil"} if _transformers_version() >= (5, 0) else {"use_fast": False}


class TextRules:
    """How a family's texts are tokenized and padded (see the module docstring).
    pad: "fixed" (every text to `length`), "call" (the longest text of its published call) or
    None (no padding: batches of texts of one token length)."""

    def __init__(self, family, max_len, lowercase=False, mask=False, pad=None, length=None):
        self.family, self.max_len, self.lowercase, self.mask, self.pad, self.length = (
            family,
            max_len,
            lowercase,
            mask,
            pad,
            length,
        )

    def padding(self):
        """{"pad_length", "pad_needs_lengths"} of an Encoder of this family (see lgip.models.encoder.Encoder)."""
        if self.pad == "call":
            return {"pad_length": lambda call_lengths: max(call_lengths), "pad_needs_lengths": True}
        if self.pad == "fixed":
            return {"pad_length": lambda call_lengths: self.length}
        return {"pad_length": lambda call_lengths: None}

    def info(self):
        return {
            "family": self.family,
            "text_length": {"call": "longest in call", "fixed": self.length}.get(self.pad, "own length (no padding)"),
            "lowercase": self.lowercase,
            "text_attention_mask": self.mask,
        }


def _limit(tok, config):
    """Most tokens a text keeps: the tokenizer's limit, within the model's position table."""
    limits = [
        n
        for n in (
            getattr(tok, "model_max_length", None),
            getattr(getattr(config, "text_config", config), "max_position_embeddings", None),
        )
        if isinstance(n, int) and 0 < n < 1_000_000
    ]
    return min(limits) if limits else 512


def _processor_pad_length(processor, tok):
    """The fixed length the processor pads a short text to, or None when it does not pad."""
    try:
        ids = processor(text=["a photo"])["input_ids"][0]
    except Exception:  # a processor that needs images too: the tokenizer's own default (no padding)
        return None
    alone = len(tok(["a photo"])["input_ids"][0])
    return len(ids) if len(ids) > alone else None


def text_rules(spec, protocol, config, processor, tok):
    """The TextRules of a model (its config, processor and tokenizer), per protocol."""
    model_type = getattr(config, "model_type", "")
    if model_type in SIGLIP_FAMILY:
        is_siglip2 = "siglip2" in str(spec["model_id"]).lower() or model_type == "siglip2"
        max_len = min(SIGLIP_TEXT_LENGTH, getattr(tok, "model_max_length", SIGLIP_TEXT_LENGTH) or SIGLIP_TEXT_LENGTH)
        lowercase = bool(spec.get("lowercase", is_siglip2) and protocol == "corrected")
        pad = "call" if protocol == "reference" else "fixed"
        return TextRules(model_type, max_len, lowercase, mask=False, pad=pad, length=max_len)
    max_len = _limit(tok, config)
    lowercase = bool(spec.get("lowercase", False))
    if "attention_mask" in getattr(tok, "model_input_names", ()):
        return TextRules(model_type, max_len, lowercase, mask=True, pad=None)
    if protocol == "reference":
        return TextRules(model_type, max_len, lowercase, pad="call")
    length = _processor_pad_length(processor, tok) if processor is not None else None
    return TextRules(model_type, max_len, lowercase, pad="fixed" if length else None, length=length)


def _tokenize_fn(tok, rules):
    """(tokenize(texts) -> unpadded id lists, tokenizer identity). Shared by the loader, the
    preparer and the key encoder, so a text tokenized ahead has the model's ids."""

    def tokenize(texts):
        texts = [t.lower() for t in texts] if rules.lowercase else list(texts)
        return tok(texts, truncation=True, max_length=rules.max_len, padding=False)["input_ids"]

    return tokenize, (type(tok).__name__, len(tok), rules.max_len, rules.lowercase)


def _preprocessors(model_id, images=True):
    """(processor or None, tokenizer, PIL image processor or None) of a checkpoint."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    try:
        processor = AutoProcessor.from_pretrained(model_id)
    except (OSError, ValueError, KeyError):  # a checkpoint with a tokenizer but no processor config
        processor = None
    tok = getattr(processor, "tokenizer", None)
    if tok is None:
        tok = (
            processor
            if processor is not None and hasattr(processor, "convert_tokens_to_ids")
            else AutoTokenizer.from_pretrained(model_id)
        )
    # Only the image processor gets the backend kwarg: through AutoProcessor it would reach the
    # tokenizer too (4.x use_fast=False turns SigLIP2's Gemma tokenizer slow).
    image_processor = AutoImageProcessor.from_pretrained(model_id, **_pil_image_processor_kwarg()) if images else None
    return processor, tok, image_processor


def _not_loadable(spec, e):
    model_id = spec["model_id"]
    if (
        os.path.isdir(model_id)
        or "not a valid model identifier" in str(e)
        or "does not appear" in str(e)
        or "Unrecognized" in str(e)
    ):
        return ModelError(
            f"model {spec.get('name')!r}: {model_id!r} is not a transformers checkpoint that "
            f"AutoModel and AutoProcessor can load (a Hub id like openai/clip-vit-base-patch32 or "
            f"google/siglip-base-patch16-224, or a folder saved with save_pretrained): {e}"
        )
    return _download_hint(spec, e)


def _check_dual_encoder(spec, model):
    missing = [m for m in REQUIRED if not callable(getattr(model, m, None))]
    if missing:
        raise WrongModelType(
            f"model {spec.get('name')!r}: {type(model).__name__} ({spec['model_id']}) has no "
            f"{' and no '.join(missing)}, so it is not an image-text dual encoder the 'transformers' "
            f"type can evaluate (CLIPModel, AltCLIPModel, AlignModel, ChineseCLIPModel, SiglipModel, "
            f"Siglip2Model, ...)."
        )


def _load_fp32(spec):
    """(config, processor or None, tokenizer, image processor, model in fp32) of a transformers dual encoder,
    checked to be one. The dtype is pinned (transformers 5 would otherwise load in the checkpoint's dtype): the
    evaluations check SigLIP's last-layer path in fp32 before their cast, fine-tuning trains in it."""
    import torch
    from transformers import AutoConfig, AutoModel

    model_id = spec["model_id"]
    try:
        config = AutoConfig.from_pretrained(model_id)
        processor, tok, image_processor = _preprocessors(model_id)
        model = AutoModel.from_pretrained(model_id, **_transformers_dtype_kwarg(torch.float32))
    except (OSError, ValueError) as e:
        raise _not_loadable(spec, e) from e
    _check_dual_encoder(spec, model)
    return config, processor, tok, image_processor, model


def load_transformers(spec, protocol, device, dtype):
    import torch

    config, processor, tok, image_processor, model = _load_fp32(spec)
    model = model.eval().to(device=device)
    rules = text_rules(spec, protocol, config, processor, tok)
    tokenize, identity = _tokenize_fn(tok, rules)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    siglip = rules.family in SIGLIP_FAMILY
    tower = _siglip_text_tower(model) if siglip and accelerations.POOLED_LAST_BLOCK else None

    @torch.no_grad()
    def encode_tokens(ids, exact_length=False, last_only=True):
        ids = ids.to(device, non_blocking=True)
        if tower is not None and last_only:
            return _normalise(_siglip_text_last(tower, ids))
        inputs = {"input_ids": ids}
        if rules.mask:
            # Texts of a masked family come in batches of one token length (pad_length None):
            # nothing is padded, so the mask is all ones.
            if not exact_length:
                raise ValueError("a batch of texts of different lengths reached a masked tower unpadded")
            inputs["attention_mask"] = torch.ones_like(ids)
        return _normalise(_as_features(model.get_text_features(**inputs)))

    if tower is not None:  # proven on this model and device in fp32 (before the cast), else the full forward
        probe = torch.full((3, rules.max_len), pad_id, dtype=torch.long)
        for r, ids in enumerate(tokenize(["a photo of a dog", "two red buses parked on a street.", "A cat!"])):
            probe[r, : len(ids)] = torch.tensor(ids)
        for ids in (probe, probe[:, :8]):  # padded as trained, and cut short (the reference protocol)
            if tower is not None and not (encode_tokens(ids, last_only=False) - encode_tokens(ids)).abs().max() < 1e-4:
                tower = None
    model.to(dtype=dtype)

    @torch.no_grad()
    def encode_images(batch):
        batch = batch if isinstance(batch, dict) else {"pixel_values": batch}
        batch = {
            k: (v.to(device=device, dtype=dtype) if v.is_floating_point() else v.to(device)) for k, v in batch.items()
        }
        return _normalise(_as_features(model.get_image_features(**batch)))

    return Encoder(
        model=model,
        device=device,
        dtype=dtype,
        tokenizer=tok,
        tokenize=tokenize,
        encode_tokens=encode_tokens,
        encode_images=encode_images,
        tokenizer_identity=identity,
        pad_id=pad_id,
        image_transform=ProcessorImageTransform(image_processor),
        pixels=pixel_split_siglip(image_processor),
        text_key_tag="" if siglip else TEXT_KEY_TAG,
        **rules.padding(),
        info=dict(
            rules.info(), model_class=type(model).__name__, text_last_layer_pooled_position_only=tower is not None
        ),
        accelerations=["POOLED_LAST_BLOCK"] if tower is not None else [],
    )


def _rules_without_weights(spec, protocol, siglip=False):
    """(TextRules, tokenizer or None) from the small files alone (siglip: a spec of type siglip, padded as trained
    without reading its tokenizer)."""
    from transformers import AutoConfig

    if siglip and protocol != "reference":
        # (as trained: the fixed length needs neither the tokenizer nor the config; a checkpoint
        # that is not SigLIP after all has other keys: they miss, and the model loads)
        return TextRules("siglip", SIGLIP_TEXT_LENGTH, pad="fixed", length=SIGLIP_TEXT_LENGTH), None
    try:
        config = AutoConfig.from_pretrained(spec["model_id"])
        processor, tok, _ = _preprocessors(spec["model_id"], images=False)
    except Exception as e:  # (a folder without a config or a tokenizer: the library's own words, not a traceback)
        raise _download_hint(spec, e) from e
    return text_rules(spec, protocol, config, processor, tok), tok


def transformers_key_encoder(spec, protocol, siglip=False):
    """An Encoder without weights that makes a transformers model's cache keys: its tokenizer
    only where the padding needs the texts' lengths (the published SigLIP padding), its config
    and processor files otherwise (siglip: type siglip's, its fixed padding known without them). (A tokenizer
    with a shorter limit than SigLIP's 64: its keys miss, and the model loads.)"""
    rules, tok = _rules_without_weights(spec, protocol, siglip)
    enc = KeyEncoder(text_key_tag="" if rules.family in SIGLIP_FAMILY else TEXT_KEY_TAG, **rules.padding())
    if rules.pad == "call":
        enc.tokenize, enc.tokenizer_identity = _tokenize_fn(tok, rules)
        enc.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        enc.tokenizer_key = tokenizer_key(spec["type"], enc.tokenizer_identity, enc.tokenize)
    return enc


class ProcessorImageTransform:
    """PIL image -> pixel_values (and any extra inputs the processor makes), picklable."""

    def __init__(self, image_processor):
        self.image_processor = image_processor

    def __call__(self, img):
        out = self.image_processor(images=img, return_tensors="pt")
        out = {k: v[0] for k, v in out.items()}
        return out["pixel_values"] if len(out) == 1 else out


def prepare_transformers(spec, protocol):
    """The tokenizer and pixel geometry of a transformers model: small files, no weights."""
    from transformers import AutoConfig

    processor, tok, image_processor = _preprocessors(spec["model_id"])
    rules = text_rules(spec, protocol, AutoConfig.from_pretrained(spec["model_id"]), processor, tok)
    tokenize, identity = _tokenize_fn(tok, rules)
    pixels = pixel_split_siglip(image_processor) if accelerations.PIXELS_ON_DEVICE else None
    return Prepared(spec["name"], tokenizer_key(spec["type"], identity, tokenize), tokenize, pixels)


def transformers_saved_spec(start, run_name, folder):
    """The MODELS spec of a fine-tuned copy of `start` saved in `folder` (save_pretrained): the start's type."""
    out = {"name": run_name, "type": start["type"], "model_id": folder}
    return dict(out, lowercase=start["lowercase"]) if "lowercase" in start else out


def trainable_transformers(spec, device):
    """A transformers dual encoder (AutoModel with get_text_features / get_image_features: CLIPModel, SiglipModel,
    ...) in fp32, its image processor and its texts tokenized by the evaluations' rules (SigLIP padded to its fixed
    length, a masked family in groups of one token length, as the evaluations batch them); saved with
    save_pretrained (model and processor), a spec of the same type."""
    import torch

    config, processor, tok, image_processor, model = _load_fp32(spec)
    model = model.to(device).float()
    rules = text_rules(spec, "corrected", config, processor, tok)
    tokenize, _ = _tokenize_fn(tok, rules)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    transform = ProcessorImageTransform(image_processor)

    def encode_texts(texts):
        ids = tokenize(texts)
        if rules.pad == "fixed":
            groups = {rules.length: list(range(len(ids)))}
        else:  # (no padding: each length its own forward, as the evaluations batch such a tower)
            groups = {}
            for k, x in enumerate(ids):
                groups.setdefault(len(x), []).append(k)
        parts, order = [], []
        for length, ks in groups.items():
            batch = torch.full((len(ks), length), pad_id, dtype=torch.long)
            for row, k in enumerate(ks):
                batch[row, : len(ids[k])] = torch.tensor(ids[k])
            inputs = {"input_ids": batch.to(device)}
            if rules.mask:
                inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
            parts.append(_as_features(model.get_text_features(**inputs)))
            order += ks
        out = torch.cat(parts)
        return out[torch.argsort(torch.tensor(order, device=out.device))]

    def encode_images(images):
        made = [transform(img) for img in images]
        if isinstance(made[0], dict):
            batch = {k: torch.stack([m[k] for m in made]).to(device) for k in made[0]}
        else:
            batch = {"pixel_values": torch.stack(made).to(device)}
        return _as_features(model.get_image_features(**batch))

    def save(folder, run_name, write=True):
        if write:
            os.makedirs(folder, exist_ok=True)
            model.save_pretrained(folder)
            # (the processor first: the tokenizer and image processor the evaluations load come last, as used)
            for part in ([processor] if processor is not None else []) + [tok, image_processor]:
                part.save_pretrained(folder)
        return transformers_saved_spec(spec, run_name, folder)

    return Trainable(model, encode_images, encode_texts, save)


def _dual_encoder_family(kind, keys, label, about):
    """The record of a transformers dual encoder type: one loader for both (its text rules read from the config)."""
    return Family(
        kind,
        required="model_id",
        options=("lowercase",),
        load=load_transformers,
        prepare=prepare_transformers,
        keys=keys,
        hub_files=model_id_files,
        named=model_id_named,
        card=dual_encoder_card,
        local_paths=model_id_paths,
        trainable=trainable_transformers,
        saved_spec=transformers_saved_spec,
        accelerations=accelerations.EMBEDDING_ONLY,
        about=about,
        label=label,
    )


TRANSFORMERS = register(
    _dual_encoder_family(
        "transformers",
        transformers_key_encoder,
        lambda model_family: "SigLIP" if str(model_family or "").startswith("siglip") else "other",
        "any transformers dual encoder (CLIP, MetaCLIP, AltCLIP, ALIGN, ChineseCLIP, SigLIP, ...)",
    )
)
# the published specs' type for SigLIP and SigLIP 2: the same loader; its cache keys known without the tokenizer
SIGLIP = register(
    _dual_encoder_family(
        "siglip",
        lambda spec, protocol: transformers_key_encoder(spec, protocol, siglip=True),
        lambda model_family: "SigLIP",
        "SigLIP and SigLIP 2 through transformers (the published specs' type)",
    )
)
