"""lgip.models.checkpoints: an open_clip weights file (not a tag), as the field's fine-tunes ship them.

- QuickGELU (LGIP_SPEC.md 12): a state dict does not record its activation. An openclip spec's `quick_gelu`
  (true or false) says it; absent, today's rule (lgip.models.openclip.openclip_create_kwargs) guesses, and a weights
  file on an architecture whose QuickGELU twin `<arch>-quickgelu` exists in open_clip (or a local-dir whose
  open_clip_config.json matches such an architecture and does not say `quick_gelu`) gets one warning per process
  and spec (`warn_activation`): fine-tunes of OpenAI's weights (NegCLIP, CE-CLIP, FSC-CLIP, ...) run QuickGELU,
  and a file built with GELU gives every score wrong, with no error.
- A file in a Hub repository that is not an open_clip model folder (FSC-CLIP's `.pt` files):
  `"pretrained": "hf-hub:org/repo/file.pt"`, fetched through the Hugging Face cache (lgip.models.hub: `hub_file`,
  `local_file`; offline once cached, as every Hub file, and checked before any work).
- A training checkpoint (`{"epoch", "state_dict", "optimizer", ...}`, numpy scalars inside) loads under torch's
  weights-only unpickler with numpy's scalar and dtype types allowed (`numpy_allowed`), nothing else: open_clip
  then takes its state_dict and drops DDP's "module." prefixes.

    >>> kwargs = spec_activation({"quick_gelu": True})       # {"quick_gelu": True}: built so, whatever the rule
"""

import contextlib
import json
import os
import sys

from ..errors import ModelError
from ..memory import KEPT
from .hub import HUB_PREFIX, hub_file

SCHEMAS = ("hf-hub:", "local-dir:")


def check(spec):
    """ModelError for an openclip spec's `quick_gelu` that is not true, false or null, or an "hf-hub:" pretrained
    that names no file (no file is read)."""
    said = spec.get("quick_gelu")
    if said is not None and not isinstance(said, bool):
        raise ModelError(
            f"model {spec.get('name')!r}: quick_gelu must be true (QuickGELU, as OpenAI's CLIP and its fine-tunes), "
            f"false (GELU) or absent (today's rule), got {said!r}"
        )
    pretrained = spec.get("pretrained")
    if isinstance(pretrained, str) and pretrained.startswith(HUB_PREFIX) and hub_file(pretrained) is None:
        raise ModelError(
            f"model {spec.get('name')!r}: pretrained {pretrained!r} names no file: a file in a Hub repository is "
            f'"hf-hub:org/repo/file.pt" (a whole open_clip repository is "model_name": "hf-hub:org/repo")'
        )


def is_weights_file(pretrained):
    """True for a "pretrained" that is a file (a path, or a file in a Hub repository), not an open_clip tag."""
    return hub_file(pretrained) is not None or (isinstance(pretrained, str) and os.path.isfile(pretrained))


def spec_activation(spec):
    """open_clip's create kwargs for the activation a spec says ({"quick_gelu": bool}: the model's config
    overridden, whatever its name, tag or folder says), or None when the spec does not say."""
    said = spec.get("quick_gelu")
    return None if said is None else {"quick_gelu": bool(said)}


def quick_gelu_twin(architecture):
    """`<architecture>-quickgelu` when open_clip has it (the architecture itself builds GELU), else None."""
    import open_clip

    if not isinstance(architecture, str) or architecture.startswith(SCHEMAS):
        return None
    twin = architecture + "-quickgelu"
    return twin if twin in open_clip.list_models() else None


def local_dir_config(model_name):
    """The open_clip_config.json of a "local-dir:" model name (None when it cannot be read: the load says why)."""
    path = os.path.join(model_name[len("local-dir:") :], "open_clip_config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) and isinstance(config.get("model_cfg"), dict) else None


def _architecture_of(model_cfg):
    """The open_clip architecture with a QuickGELU twin whose config is `model_cfg`, else None."""
    import open_clip

    for name in open_clip.list_models():
        if name.endswith("-quickgelu") or quick_gelu_twin(name) is None:
            continue
        if open_clip.get_model_config(name) == model_cfg:
            return name
    return None


def unknown_activation(spec):
    """(architecture, what the weights are) when a spec's activation cannot be told (module docstring), else None:
    no `quick_gelu`, and a weights file on an architecture with a QuickGELU twin, or a local-dir whose config
    matches such an architecture and has no `quick_gelu`. A tag's metadata and a config that says are known."""
    if spec.get("type") != "openclip" or spec.get("quick_gelu") is not None or spec.get("demo"):
        return None
    name, pretrained = spec.get("model_name"), spec.get("pretrained")
    if not isinstance(name, str):
        return None
    if name.startswith("local-dir:"):
        config = local_dir_config(name)
        if config is None or "quick_gelu" in config["model_cfg"]:
            return None
        arch = _architecture_of(config["model_cfg"])
        return (arch, f"the folder {name[len('local-dir:') :]}") if arch else None
    if name.startswith(SCHEMAS) or not is_weights_file(pretrained) or quick_gelu_twin(name) is None:
        return None
    return name, f"the file {pretrained}"


def warn_activation(spec, quick):
    """Print the warning of a spec whose activation cannot be told, once per process and spec (`quick`: whether it
    is built with QuickGELU, or a function telling it, asked only then); returns True when the spec's activation
    is unconfirmed (warned now or before)."""
    unknown = unknown_activation(spec)
    if unknown is None:
        return False
    key = json.dumps(spec, sort_keys=True, default=str)
    if key not in KEPT.warned:
        KEPT.warned.add(key)
        arch, what = unknown
        quick = quick() if callable(quick) else quick
        built = "QuickGELU (its file name starts with openai)" if quick else f"GELU ({arch}'s own activation)"
        print(
            f"warning: model {spec.get('name')!r}: {what} holds weights for {arch}, whose twin {arch}-quickgelu "
            f"exists in open_clip, and a state dict does not record its activation: it is built with {built}. "
            f'Fine-tunes of OpenAI\'s weights (NegCLIP, CE-CLIP, FSC-CLIP from "openai", ...) use QuickGELU, and '
            f"the wrong one gives every score wrong without an error: say which in the spec, "
            f'"quick_gelu": true (weights trained from OpenAI\'s) or false',
            file=sys.stderr,
            flush=True,
        )
    return True


def activation_info(spec, quick):
    """What the run block adds of a spec's activation (LGIP_SPEC.md 12): `quick_gelu_from` "spec" when the spec
    says, "unconfirmed" when it cannot be told (and warned); {} otherwise (the run block unchanged)."""
    if spec.get("quick_gelu") is not None:
        return {"quick_gelu_from": "spec"}
    return {"quick_gelu_from": "unconfirmed"} if warn_activation(spec, quick) else {}


def _numpy_globals():
    import numpy as np

    core = getattr(np, "_core", None) or np.core  # (numpy 2 moved numpy.core to numpy._core)
    scalar = core.multiarray.scalar
    dtypes = {type(np.dtype(c)) for c in "?bBhHiIlLqQefdgFDG"}
    named = [(scalar, "numpy.core.multiarray.scalar"), (scalar, "numpy._core.multiarray.scalar")]
    return [scalar, *named, np.dtype, *sorted(dtypes, key=str)]


@contextlib.contextmanager
def numpy_allowed():
    """torch's weights-only loading with numpy's scalar and dtype types allowed (a training checkpoint's epoch or
    step is often a numpy scalar): no other object, so a file still cannot run code."""
    import torch

    allow = getattr(torch.serialization, "safe_globals", None)
    if allow is None:  # (an older torch: its own default)
        yield
        return
    with allow(_numpy_globals()):
        yield
