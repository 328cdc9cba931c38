"""lgip.models.cards: what a model is, beside its figures (LGIP_SPEC.md section 12): `model_card`, the
`model_card` of every evaluation's per-model dict: source, architecture, pretrained, family, parameters
counted per tower, embedding size, image size, context length, loss, training data and samples seen
(from open_clip's tag, by the section's table). A spec's own `card` dict wins, field by field.
Nothing is guessed: what cannot be told is None.

Counting needs no weights: a model whose embeddings all came from the cache (its weights not
loaded) is built on PyTorch's meta device (open_clip, transformers: shapes only, no memory, well
under a second) and counted there; a model of one's own (type python) is counted when loaded.

    >>> model_card({"name": "b16", "type": "openclip", "model_name": "ViT-B-16", "pretrained": "laion2b_s34b_b88k"})
    {'source': 'openclip', 'architecture': 'ViT-B-16', 'pretrained': 'laion2b_s34b_b88k', 'family': 'ViT',
     'params_image': 86192640, 'params_text': 63428096, 'params_total': 149620737, 'embed_dim': 512,
     'image_size': 224, 'context_length': 77, 'loss': 'softmax', 'training_data': 'LAION-2B',
     'samples_seen': 34000000000, 'score_kind': 'cosine'}
"""

import json
import os
import re

from ..method import CARD_FIELDS, CARD_FIELDS_WHEN_KNOWN
from .families import family

FIELDS = CARD_FIELDS  # (LGIP_SPEC.md 12: one list, lgip.method's, for the cards and the report)
WHEN_KNOWN = CARD_FIELDS_WHEN_KNOWN  # (written only when not None: a card without them is as before)

# an open_clip tag's first "_"-separated token -> its training data (section 12's table)
TRAINING_DATA = {
    "openai": "WIT-400M",
    "laion400m": "LAION-400M",
    "laion2b": "LAION-2B",
    "laion5b": "LAION-5B",
    "laion": "LAION",
    "datacomp": "DataComp-1B",
    "datacomp1b": "DataComp-1B",
    "datacompdr": "DataCompDR-1B",
    "commonpool": "CommonPool",
    "dfn2b": "DFN-2B",
    "dfn5b": "DFN-5B",
    "dfndr2b": "DFNDR-2B",
    "webli": "WebLI",
    "metaclip": "MetaCLIP",
    "metaclip2": "MetaCLIP-2",
    "yfcc15m": "YFCC-15M",
    "cc12m": "CC12M",
    "mscoco": "COCO",
    "merged2b": "Merged-2B",
}
_SEEN = re.compile(r"^s(\d+(?:\.\d+)?)([kmb])$")
_SCALE = {"k": 1e3, "m": 1e6, "b": 1e9}
_CARDS = {}  # (spec as JSON) -> the counted part of its card, for the process (every evaluation of a run asks)


def family_of(architecture):
    """An open_clip architecture's family: up to its first "-" or "_" ("SigLIP" when the name says so).
    >>> [family_of(a) for a in ("RN50", "ViT-B-16", "EVA02-L-14", "convnext_base", "ViT-B-16-SigLIP")]
    ['RN50', 'ViT', 'EVA02', 'convnext', 'SigLIP']
    """
    if not architecture:
        return None
    if "SigLIP" in architecture:  # (as section 12 says it, case and all: nllb-clip-base-siglip is "nllb")
        return "SigLIP"
    return re.split(r"[-_]", architecture, 1)[0]


def tag_facts(tag):
    """(training data, samples seen) of an open_clip pretrained tag, None where the tag does not say.
    >>> tag_facts("laion2b_s32b_b82k"), tag_facts("openai"), tag_facts("merged2b_s4b_b131k")
    (('LAION-2B', 32000000000), ('WIT-400M', None), ('Merged-2B', 4000000000))
    """
    if not isinstance(tag, str) or not tag or os.path.sep in tag or tag.endswith((".bin", ".pt", ".safetensors")):
        return None, None
    tokens = tag.split("_")
    seen = None
    for t in tokens[1:]:
        m = _SEEN.match(t)
        if m:
            seen = int(round(float(m.group(1)) * _SCALE[m.group(2)]))
            break
    return TRAINING_DATA.get(tokens[0]), seen


def _numel(modules):
    seen, total = set(), 0
    for module in modules:
        for p in module.parameters() if hasattr(module, "parameters") else [module]:
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return total


def count_towers(model):
    """{params_image, params_text, params_total} of an open_clip or transformers dual encoder: every
    parameter on the path from pixels to the image embedding (open_clip `visual`; transformers
    `vision_model` and `visual_projection`), the text tower likewise, and every parameter; a tower
    that cannot be told apart: None."""
    total = _numel([model])
    image = text = None
    if hasattr(model, "visual"):  # open_clip: CLIP keeps its text tower's parts at the top, CustomTextCLIP in .text
        image = _numel([model.visual])
        if hasattr(model, "text"):
            text = _numel([model.text])
        else:
            scalars = [getattr(model, n) for n in ("logit_scale", "logit_bias") if getattr(model, n, None) is not None]
            text = total - image - sum(s.numel() for s in scalars)
    elif hasattr(model, "vision_model") and hasattr(model, "text_model"):  # transformers
        image = _numel(
            [model.vision_model] + ([model.visual_projection] if hasattr(model, "visual_projection") else [])
        )
        text = _numel([model.text_model] + ([model.text_projection] if hasattr(model, "text_projection") else []))
    return {"params_image": image, "params_text": text, "params_total": total}


def _openclip_embed_dim(name, model, on_meta):
    """The width of an open_clip model's embeddings: its config's `embed_dim` (an open_clip name), else
    an image's through the model built on the meta device (shapes only), else its projections'."""
    import open_clip
    import torch

    config = open_clip.get_model_config(name) if not name.startswith(("hf-hub:", "local-dir:")) else None
    if isinstance((config or {}).get("embed_dim"), int):
        return config["embed_dim"]
    size = getattr(getattr(model, "visual", None), "image_size", None)
    size = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
    if on_meta and all(isinstance(s, int) for s in size):
        try:
            return int(model.encode_image(torch.zeros(1, 3, *size, device="meta")).shape[-1])
        except Exception:
            pass
    projection = getattr(model, "text_projection", None)
    if isinstance(projection, torch.Tensor) and projection.ndim == 2:
        return int(projection.shape[1])
    dim = getattr(getattr(model, "visual", None), "output_dim", None)
    return dim if isinstance(dim, int) else None


def openclip_card(spec, model, enc=None):
    """An open_clip model's counted card (on the meta device when not loaded)."""
    name = str(spec.get("model_name", ""))
    on_meta = model is None
    if model is None:
        from .hub import hub_status

        # (an unreachable Hub: offline mode first, so a text tower's config not in the cache fails at once)
        hub_status()
        import logging
        import warnings
        import open_clip
        import torch

        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)  # ("No pretrained weights loaded": none is wanted here)
        try:
            with warnings.catch_warnings(), torch.device("meta"):
                warnings.simplefilter(
                    "ignore"
                )  # (a local-dir checkpoint copied onto meta tensors: a no-op, said per tensor)
                model = open_clip.create_model(name, pretrained=None, device="meta")
        finally:
            logging.getLogger().setLevel(quiet)
    size = getattr(getattr(model, "visual", None), "image_size", None)
    size = size[0] if isinstance(size, (tuple, list)) and len(set(size)) == 1 else size
    card = dict(
        count_towers(model),
        image_size=size if isinstance(size, int) else None,
        context_length=getattr(model, "context_length", None),
        loss="sigmoid" if getattr(model, "logit_bias", None) is not None else "softmax",
        embed_dim=_openclip_embed_dim(name, model, on_meta),
    )
    return card


def dual_encoder_card(spec, model, enc=None):
    """A transformers dual encoder's counted card (its config; on the meta device when not loaded)."""
    from transformers import AutoConfig
    from .hub import hub_status

    if model is None:
        hub_status()  # (an unreachable Hub: offline mode first, so a config not in the cache fails at once)
    config = model.config if model is not None else AutoConfig.from_pretrained(spec["model_id"])
    if model is None:
        import torch
        from transformers import AutoModel

        with torch.device("meta"):
            model = AutoModel.from_config(config)
    kind = getattr(config, "model_type", None)
    vision, text = getattr(config, "vision_config", None), getattr(config, "text_config", None)
    logit_only = hasattr(model, "logit_scale") and getattr(model, "logit_bias", None) is None
    projection = getattr(
        model, "visual_projection", None
    )  # (SigLIP's image embedding is its vision tower's pooled output)
    embed_dim = (
        getattr(projection, "out_features", None) if projection is not None else getattr(vision, "hidden_size", None)
    )
    return dict(
        count_towers(model),
        architecture=kind,
        family=kind,
        embed_dim=embed_dim,
        image_size=getattr(vision, "image_size", None),
        context_length=getattr(text, "max_position_embeddings", None),
        loss="sigmoid" if kind in ("siglip", "siglip2") else "softmax" if logit_only else None,
    )


def _counted(spec, enc):
    """The part of the card that needs the model (built on the meta device when not loaded): its family's card."""
    key = json.dumps({k: v for k, v in spec.items() if k != "name"}, sort_keys=True, default=str)
    model = getattr(enc, "model", None) if getattr(enc, "weights_loaded", False) else None
    if key in _CARDS and model is None:
        return _CARDS[key]
    counter = family(spec).card
    try:
        card = counter(spec, model, enc) if counter is not None else {}
    except Exception:  # (a card is what can be told; a model that cannot be built here says nothing)
        card = {}
    _CARDS[key] = card
    return card


def own_card(spec, model, enc):
    """A model of one's own (type python): its parameters' total, when it is loaded."""
    return {"params_total": _numel([model])} if model is not None and hasattr(model, "parameters") else {}


def openclip_named(spec):
    """What an open_clip spec tells without its model: its tag (a file's name for a checkpoint file), the tag's
    training data and samples seen (section 12's table), and the architecture and family its name says."""
    tag, name = spec.get("pretrained"), spec.get("model_name")
    data, seen = tag_facts(tag)
    named = {"pretrained": os.path.basename(tag) if isinstance(tag, str) and os.path.isfile(tag) else tag}
    named.update(training_data=data, samples_seen=seen, quick_gelu=spec.get("quick_gelu"))  # (None: not said)
    if isinstance(name, str) and not name.startswith(("local-dir:", "hf-hub:")):
        named.update(architecture=name, family=family_of(name))  # (known when the model cannot be built here)
    return named


def model_id_named(spec):
    """A transformers spec's card from the spec alone: its model_id as the pretrained weights."""
    return {"pretrained": spec.get("model_id")}


def loader_named(spec):
    """A loader of one's own: its "module:function" as the pretrained field (None for objects in memory)."""
    return {"pretrained": spec.get("loader") if isinstance(spec.get("loader"), str) else None}


def model_card(spec, enc=None, image_embeddings=None):
    """The card of one model spec (module docstring); `enc`: its Encoder (its loaded model counted
    as is), `image_embeddings`: the run's, whose width is the embedding size. What the spec tells and what
    is counted on the model are its family's (lgip.models.families: named, card)."""
    kind = family(spec)
    card = dict.fromkeys(FIELDS)
    named = kind.named(spec)
    card.update(source=kind.type, **{k: v for k, v in named.items() if k in FIELDS})
    card.update({k: v for k, v in _counted(spec, enc).items() if k in FIELDS or k == "vision_encoder"})
    card["score_kind"] = kind.score_kind(spec)  # what its score is (LGIP_SPEC.md 13): cosine for a dual encoder
    card.update({k: named[k] for k in WHEN_KNOWN if named.get(k) is not None})  # (the activation a spec says)
    if image_embeddings is not None and getattr(image_embeddings, "ndim", 0) == 2:
        card["embed_dim"] = int(image_embeddings.shape[1])
    if isinstance(spec.get("card"), dict):  # the spec's own card wins, field by field
        card.update({k: v for k, v in spec["card"].items()})
    return card


def _part(model, names):
    """The first of `names` found on the model or its inner `.model`, else None."""
    for owner in (model, getattr(model, "model", None)):
        for name in names:
            part = getattr(owner, name, None) if owner is not None else None
            if part is not None:
                return part
    return None


def joint_card(spec, model=None, processor=None, head="lm"):
    """Section 12's fields for a joint model (LGIP_SPEC.md 13): architecture and family = config.model_type;
    generative: params_text = the language model and its head, params_image = all the rest (the vision
    tower, its projector or connector, LLaVA-NeXT's image_newline); itm: params_image = the vision tower,
    params_text = all the rest (the text encoder with the head); embed_dim None; image_size the
    processor's; context_length the language model's positions; loss; vision_encoder = the vision
    config's _name_or_path where it names one. model None: built on the meta device from the config."""
    from .encoder import hf_config as _config

    if model is None:
        import torch
        from transformers import AutoModelForImageTextToText, Blip2ForImageTextRetrieval, BlipForImageTextRetrieval

        config = _config(spec)
        with torch.device("meta"):
            if head == "itm":
                cls = BlipForImageTextRetrieval if config.model_type == "blip" else Blip2ForImageTextRetrieval
                model = cls(config)
            else:
                model = AutoModelForImageTextToText.from_config(config)
    config = model.config
    total = _numel([model])
    if head == "lm":  # (a generative model's image path: what is not the language model, whatever its names)
        lm = _part(model, ("language_model", "text_model"))
        lm_head = getattr(model, "lm_head", None)
        text = _numel([m for m in (lm, lm_head) if m is not None]) if lm is not None else None
        image = total - text if text is not None else None
    else:
        vision = _part(model, ("vision_tower", "visual", "vision_model"))
        image = _numel([vision]) if vision is not None else None
        text = total - image if image is not None else None
    vconf, tconf = getattr(config, "vision_config", None), getattr(config, "text_config", None)
    name = getattr(vconf, "_name_or_path", None) or None
    size, why = _image_side(getattr(processor, "image_processor", None), vconf)
    card = {
        "architecture": config.model_type,
        "family": config.model_type,
        "params_image": image,
        "params_text": text,
        "params_total": total,
        "embed_dim": None,
        "image_size": size,
        "context_length": getattr(tconf, "max_position_embeddings", None),
        "loss": "next-token" if head == "lm" else "itm",
        "vision_encoder": name,
    }
    if why:
        card["image_size_why"] = why
    return card


def _image_side(ip, vconf):
    """(the side in pixels of the images a processor gives its model, or None; why None). A processor that
    sizes each image by its pixel count (Qwen2-VL's min_pixels..max_pixels, whose `size` holds those counts
    under shortest_edge and longest_edge) or by its token count (LFM2-VL's) has no side: the image's own
    follows. Else its crop, its fixed height, its shortest edge, a tile's longest edge (Idefics3's
    max_image_size), or the vision tower's image_size."""
    if ip is not None:
        if getattr(ip, "min_pixels", None) is not None or getattr(ip, "max_pixels", None) is not None:
            return None, (
                f"{type(ip).__name__} sizes each image by its pixel count ({getattr(ip, 'min_pixels', None)}"
                f"..{getattr(ip, 'max_pixels', None)}): the side follows the image"
            )
        if getattr(ip, "min_image_tokens", None) is not None or getattr(ip, "max_image_tokens", None) is not None:
            return None, (
                f"{type(ip).__name__} sizes each image by its token count ({getattr(ip, 'min_image_tokens', None)}"
                f"..{getattr(ip, 'max_image_tokens', None)}): the side follows the image"
            )
        for d in (getattr(ip, "crop_size", None), getattr(ip, "size", None), getattr(ip, "max_image_size", None)):
            if isinstance(d, dict):
                side = d.get("height") or d.get("shortest_edge")
                if side:
                    return side, None
        tile = getattr(ip, "max_image_size", None)
        if isinstance(tile, dict) and tile.get("longest_edge"):
            return tile["longest_edge"], None
    side = getattr(vconf, "image_size", None)
    return (side, None) if side else (None, "neither the processor nor the vision tower names a side")
