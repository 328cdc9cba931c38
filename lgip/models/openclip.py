"""lgip.models.openclip: the open_clip loader (CLIP, OpenCLIP, EVA02-CLIP): names, tags,
hf-hub:/local-dir:/checkpoint files, QuickGELU for weights trained with it (corrected protocol),
and an Encoder over the exact faster forwards of lgip.models.towers where the tower allows them.

    >>> enc = load_openclip({"name": "b16", "type": "openclip", "model_name": "ViT-B-16", "pretrained": "openai"},
    ...                     "corrected", "cuda", torch.bfloat16)
"""

import os

from .. import accelerations
from ..errors import ModelError
from . import checkpoints
from .cards import openclip_card, openclip_named
from .families import Family, register
from .hub import hub_file, local_file, openclip_files, openclip_paths
from .encoder import Encoder, KeyEncoder, Prepared, _download_hint, _normalise, tokenizer_key
from .towers import (
    _class_token_blocks,
    _openclip_causal_text_tower,
    _openclip_image_pooled,
    _openclip_text_packed,
    _openclip_text_trimmed,
    _plain_blocks,
)
from .clip_tokenizer import _openclip_tokenize_fn, _openclip_tokenizer_identity
from .pixels import pixel_split_openclip
from .trainable import Trainable, openclip_config, openclip_save


# The prefix of open_clip text cache keys, "eot2|": texts run to EOT (earlier caches cut a text at
# an inner id 0, "!": never reused).
TEXT_KEY_TAG = "eot2|"


def openclip_create_kwargs(spec, protocol):
    """(model_name, pretrained, extra create kwargs) for an open_clip spec.

    A spec's `quick_gelu` (LGIP_SPEC.md 12) decides, in either protocol: {"quick_gelu": true or false}
    overrides the config's activation (lgip.models.checkpoints). Absent, the corrected protocol: weights
    trained with QuickGELU (open_clip's own metadata for the tag says so: the OpenAI ones, MetaCLIP, ...)
    run with QuickGELU; open_clip >= 2.29 builds e.g. ViT-B-16 + openai with GELU and only warns. A
    checkpoint file whose name starts with "openai" is treated the same (a file's activation cannot be
    read from it: lgip.models.checkpoints.warn_activation says so). Reference protocol builds the model
    as the published code did.
    >>> openclip_create_kwargs({"model_name": "ViT-B-16", "pretrained": "openai"}, "corrected")
    ('ViT-B-16', 'openai', {'force_quick_gelu': True})
    """
    import open_clip

    name, pretrained = spec["model_name"], spec.get("pretrained")
    said = checkpoints.spec_activation(spec)
    if said is not None:
        return name, pretrained, said
    kwargs = {}
    if protocol != "corrected" or not isinstance(pretrained, str) or name.startswith(("hf-hub:", "local-dir:")):
        return name, pretrained, kwargs
    if checkpoints.is_weights_file(pretrained):
        trained_quick = os.path.basename((hub_file(pretrained) or ("", pretrained))[1])
        trained_quick = trained_quick.lower().startswith("openai")
    else:
        trained_quick = bool(open_clip.get_pretrained_cfg(name, pretrained).get("quick_gelu"))
    built_quick = bool((open_clip.get_model_config(name) or {}).get("quick_gelu"))
    if trained_quick and not built_quick:
        kwargs["force_quick_gelu"] = True
    return name, pretrained, kwargs


def _builds_quick_gelu(spec, protocol):
    """Whether a spec's model is built with QuickGELU, told without building it (its kwargs, its config)."""
    import open_clip

    name, _, kwargs = openclip_create_kwargs(spec, protocol)
    if "quick_gelu" in kwargs or kwargs.get("force_quick_gelu"):
        return bool(kwargs.get("quick_gelu", True))
    if name.startswith("local-dir:"):
        return bool((checkpoints.local_dir_config(name) or {"model_cfg": {}})["model_cfg"].get("quick_gelu"))
    return not name.startswith("hf-hub:") and bool((open_clip.get_model_config(name) or {}).get("quick_gelu"))


def _check_openclip_name(name):
    import open_clip

    if name.startswith(("hf-hub:", "local-dir:")):
        return
    valid = open_clip.list_models()
    if name not in valid:
        import difflib

        close = difflib.get_close_matches(name, valid, n=8, cutoff=0.5)
        raise ModelError(
            f"unknown open_clip model_name {name!r}; close matches: {', '.join(close) or 'none'} "
            f"(all {len(valid)}: open_clip.list_models()); 'hf-hub:org/repo' and "
            f"'local-dir:/path' names are accepted too"
        )


def _is_download_error(e):
    """open_clip reports a failed weight download as a RuntimeError naming it."""
    return "download" in str(e).lower() or "connect" in str(e).lower()


def _create_openclip_on(device, name, pretrained, kwargs):
    """open_clip.create_model_and_transforms -> (model, eval transform, device it was built on).
    On an accelerator the model is built there (a torch.device context): its random
    initialisation, which a checkpoint then overwrites, runs on the GPU instead of the CPU
    (ViT-H-14: 10.5 s on 2 CPU cores). Should a model's code not build that way, it is built on
    the CPU and moved, as open_clip does by default."""
    import open_clip
    import torch

    if torch.device(device).type != "cpu" and accelerations.BUILD_ON_DEVICE:
        try:
            with torch.device(device):
                model, _, preprocess = open_clip.create_model_and_transforms(
                    name, pretrained=pretrained, device=device, **kwargs
                )
            return model, preprocess, str(device)
        except (RuntimeError, TypeError, NotImplementedError) as e:
            if _is_download_error(e):
                raise
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=pretrained, **kwargs)
    return model, preprocess, "cpu"


def load_openclip(spec, protocol, device, dtype):
    import open_clip

    _check_openclip_name(spec["model_name"])
    name, pretrained, kwargs = openclip_create_kwargs(spec, protocol)
    if name.startswith(("hf-hub:", "local-dir:")):
        pretrained = None  # open_clip ignores it for these names
    elif hub_file(pretrained):
        pretrained = local_file(pretrained)  # (a file in a Hub repository, from the cache)
    elif pretrained and not os.path.isfile(str(pretrained)):
        tags = open_clip.list_pretrained_tags_by_model(name)
        if pretrained not in tags:
            raise ModelError(
                f"unknown pretrained tag {pretrained!r} for open_clip {name}; valid: {', '.join(tags) or 'none'} "
                f"(or a checkpoint file path, or None for random init)"
            )
    try:
        with checkpoints.numpy_allowed():  # (a training checkpoint's numpy scalars: nothing else)
            model, preprocess, built_on = _create_openclip_on(device, name, pretrained, kwargs)
    except (OSError, ConnectionError, TimeoutError) as e:
        raise _download_hint(spec, e) from e
    except RuntimeError as e:
        if _is_download_error(e):
            raise _download_hint(spec, e) from e
        raise
    model = model.eval().to(device=device, dtype=dtype)
    enc = openclip_encoder(model, preprocess, open_clip.get_tokenizer(name), device, dtype, built_on)
    enc.info.update(checkpoints.activation_info(spec, enc.info["quick_gelu"]))  # (and warned, once)
    return enc


def is_openclip(model, tokenizer):
    """An open_clip model and tokenizer, as open_clip builds them (a training loop's model in memory):
    openclip_encoder then gives it the accelerations of its spec twin."""
    import open_clip

    return (
        isinstance(model, (open_clip.CLIP, open_clip.CustomTextCLIP))
        and type(tokenizer).__module__ == open_clip.tokenizer.__name__
    )


def openclip_encoder(model, preprocess, tokenizer, device, dtype, built_on=None):
    """The Encoder of a built open_clip model (in eval mode, on `device` in `dtype`), with every
    acceleration its tower admits: load_openclip's, and a model of one's own held in memory
    (lgip.models.own_loader), whose weights it neither moves nor casts. `enc.accelerations`: the
    switches of lgip.accelerations.PER_MODEL that apply to this model (the run block records no other as on)."""
    import torch

    context_length = getattr(model, "context_length", None) or tokenizer.context_length
    tower = _openclip_causal_text_tower(model) if accelerations.TRIMMED_TEXT else None
    trimmable = tower is not None
    pooled = accelerations.POOLED_LAST_BLOCK
    blocks = _plain_blocks(tower.transformer) if trimmable else None

    tokenize = _openclip_tokenize_fn(tokenizer, context_length, trimmable)

    @torch.no_grad()
    def encode_tokens(ids, exact_length=False):
        ids = ids.to(device, non_blocking=True)
        if trimmable:
            x = _openclip_text_trimmed(tower, blocks, ids, exact_length and pooled)
        else:
            full = torch.zeros(ids.shape[0], context_length, dtype=ids.dtype, device=device)
            full[:, : ids.shape[1]] = ids
            x = model.encode_text(full)
        return _normalise(x)

    visual_blocks = _class_token_blocks(model.visual) if pooled else None

    @torch.no_grad()
    def encode_images(pixels):  # (in the Encoder's dtype of the moment: word attribution runs the model in fp32)
        pixels = pixels.to(device=device, dtype=enc.dtype, non_blocking=True)
        if visual_blocks is not None:
            return _normalise(_openclip_image_pooled(model.visual, visual_blocks, pixels))
        return _normalise(model.encode_image(pixels))

    @torch.no_grad()
    def encode_packs(*arrays):
        return _normalise(
            _openclip_text_packed(tower, blocks, *(a.to(device, non_blocking=True) for a in arrays), pooled=pooled)
        )

    packs = encode_packs if blocks is not None else None  # (only for a trimmable tower)
    # Causal mask + EOT pooling: positions after a text's EOT never reach its embedding, so
    # every batch is cut to its longest member (tests/test_towers.py proves it).
    enc = Encoder(
        model=model,
        device=device,
        dtype=dtype,
        tokenizer=tokenizer,
        image_transform=preprocess,
        pixels=pixel_split_openclip(preprocess),
        tokenize=tokenize,
        encode_tokens=encode_tokens,
        encode_images=encode_images,
        encode_packs=packs,
        context_length=context_length,
        tokenizer_identity=_openclip_tokenizer_identity(tokenizer, context_length),
        text_key_tag=TEXT_KEY_TAG,
        pad_length=lambda call_lengths: None if trimmable else context_length,
        info={
            "quick_gelu": _uses_quick_gelu(model),
            **({"built_on": built_on} if built_on is not None else {}),
            "text_trimmed": trimmable,
            "text_prefix_sharing": packs is not None,
            "image_last_block_class_token_only": visual_blocks is not None,
        },
        accelerations=(
            name
            for name, on in (
                ("PREFIX_PACKS", packs is not None),
                ("POOLED_LAST_BLOCK", visual_blocks is not None or trimmable and pooled),
                ("TRIMMED_TEXT", trimmable),
                ("FAST_CLIP_TOKENIZER", tokenize.fast),
                ("BUILD_ON_DEVICE", built_on is not None and built_on != "cpu"),
            )
            if on
        ),
    )
    return enc


def openclip_key_encoder(spec, protocol):
    """An Encoder without weights that makes an open_clip model's cache keys: a causal text
    tower's texts run to EOT and are cut to their batch's longest (no padding), which needs
    neither the tokenizer nor the model; None when the texts are padded (TRIMMED_TEXT off).
    A model whose tower turns out not causal has other keys: they miss, and it loads."""
    if not accelerations.TRIMMED_TEXT:
        return None
    enc = KeyEncoder(text_key_tag=TEXT_KEY_TAG, pad_length=lambda call_lengths: None)
    enc.info.update(checkpoints.activation_info(spec, lambda: _builds_quick_gelu(spec, protocol)))  # (warned once)
    return enc


def _uses_quick_gelu(model):
    from open_clip.transformer import QuickGELU

    return any(isinstance(m, QuickGELU) for m in model.modules())


def prepare_openclip(spec, protocol):
    """The tokenizer of an open_clip model (its pixels need the model built: None here)."""
    import open_clip

    _check_openclip_name(spec["model_name"])
    tokenizer = open_clip.get_tokenizer(spec["model_name"])
    context = tokenizer.context_length
    # Tokenized as a causal CLIP tower's texts (to EOT; full rows when TRIMMED_TEXT is off): a
    # tower that is not causal gets another key, and the texts tokenized ahead are not used.
    tokenize = _openclip_tokenize_fn(tokenizer, context, accelerations.TRIMMED_TEXT)
    return Prepared(
        spec["name"],
        tokenizer_key("openclip", _openclip_tokenizer_identity(tokenizer, context), tokenize),
        tokenize,
        None,
    )


def random_init(spec):
    """A warning for an open_clip architecture named without weights (no "pretrained", not hf-hub: or
    local-dir:): open_clip builds it with random weights; None otherwise (the demo model is random by design
    and says so)."""
    name = spec.get("model_name")
    if spec.get("pretrained") or spec.get("demo") or not isinstance(name, str):
        return None
    if name.startswith(("hf-hub:", "local-dir:")):
        return None
    import open_clip

    tags = open_clip.list_pretrained_tags_by_model(name)[:4]
    return (
        f"model {spec['name']!r} has no pretrained weights (open_clip {name} with pretrained None): a random-init "
        f'model, whose figures say nothing of a trained one; give "pretrained" a tag '
        f"({', '.join(tags) or 'none for this architecture'}) or a checkpoint file"
    )


def openclip_saved_spec(start, run_name, folder):
    """The MODELS spec of a fine-tuned copy of `start` saved in `folder` (an open_clip local-dir)."""
    return {"name": run_name, "type": "openclip", "model_name": "local-dir:" + folder, "pretrained": None}


def trainable_openclip(spec, device):
    """An open_clip model as the evaluations build it (the corrected protocol: QuickGELU where its weights were
    trained with it), its eval preprocessing and its tokenizer; saved as a local-dir."""
    import open_clip
    import torch

    name, pretrained, kwargs = openclip_create_kwargs(spec, "corrected")
    if name.startswith(("hf-hub:", "local-dir:")):
        pretrained = None
    pretrained = local_file(pretrained)
    model_cfg = openclip_config(spec)
    with checkpoints.numpy_allowed():
        model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=pretrained, **kwargs)
    model = model.to(device).float()
    quick_gelu = _uses_quick_gelu(model)  # (saved as built: section 14 writes it, true or false)
    checkpoints.warn_activation(spec, quick_gelu)
    tokenizer = open_clip.get_tokenizer(name)

    def encode_images(images):
        return model.encode_image(torch.stack([preprocess(img) for img in images]).to(device))

    def encode_texts(texts):
        return model.encode_text(tokenizer(list(texts)).to(device))

    def save(folder, run_name, write=True):
        if write:
            openclip_save(model, folder, model_cfg, quick_gelu)
        return openclip_saved_spec(spec, run_name, folder)

    return Trainable(model, encode_images, encode_texts, save)


OPENCLIP = register(
    Family(
        "openclip",
        required="model_name",
        options=("pretrained", "quick_gelu"),
        load=load_openclip,
        prepare=prepare_openclip,
        keys=openclip_key_encoder,
        hub_files=openclip_files,
        named=openclip_named,
        card=openclip_card,
        random_init=random_init,
        check=checkpoints.check,
        local_paths=openclip_paths,
        trainable=trainable_openclip,
        saved_spec=openclip_saved_spec,
        accelerations=accelerations.EMBEDDING_ONLY,
        about="open_clip (CLIP, OpenCLIP, EVA02-CLIP): names and tags, hf-hub:, local-dir:, checkpoint files",
        label=lambda model_family: "OpenCLIP",
    )
)
