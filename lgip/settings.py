"""lgip.settings: the rules of the settings several scripts share, checked in one place before any
model or data work (lgip.cli.run_main on the command line, lgip.entry.script_call for run() from
Python), so that a bad value ends at once with a ConfigError (exit status 2) naming the setting, its
valid values and the value given, never with a traceback after an hour of encoding.

SETTINGS: NAME -> Setting(test, what it must be, default), each defined once. A script checks its own
constants beside it (explain_flips' check_config); a setting whose default in the script's source is None
takes None too (that script's comment says what None means: run_all's MODELS, IMAGE_BATCH_SIZE, ...).

    >>> check_settings({"BOOTSTRAP": "x"})
    ConfigError: BOOTSTRAP must be an int >= 0 (bootstrap resamples; 0 = no intervals), got 'x'
    >>> check_settings({"MODELS": [{"name": "a/b", "type": "openclip", "model_name": "ViT-B-16"}]})
    ConfigError: MODELS: model name 'a/b' is not file-safe (it names output files): use letters, digits, ...
"""

import numbers
import re
from dataclasses import dataclass
from typing import Any, Callable

from .errors import ConfigError, ModelError

# a model's name is part of its output files' names: no folder separators, nothing a shell or a
# file system treats specially (PUBLISHED_MODELS' names are letters, digits, '_', '-', '.')
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+@-]*$")
SAFE_NAME_TEXT = "letters, digits and . _ - + @, starting with a letter or digit"


def _int(low=None):
    # (bool is an int to Python, never a count or a seed here)
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and (low is None or v >= low)


def _number(low):
    return lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool) and v == v and v >= low


def _device(v, here=True):
    """A device string torch parses; `here`: one this machine has."""
    if v == "auto":
        return True
    if not isinstance(v, str):
        return False
    import torch

    try:
        device = torch.device(v)
    except (RuntimeError, ValueError):
        return False
    if (
        device.type == "cuda" and here
    ):  # (else the first model's loading fails with a driver message, after the data work)
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(
                f"DEVICE is {v!r} but CUDA is not available here (torch.cuda.is_available() is False): "
                f'use "cpu" or "auto" (cuda if available)'
            )
        if device.index is not None and device.index >= count:
            raise ConfigError(
                f"DEVICE is {v!r} but this machine has {count} CUDA device(s): cuda:0 to cuda:{count - 1}"
            )
    return True


def _accelerations(v):
    from . import accelerations

    try:
        accelerations.restore(accelerations.switch_off(v))  # (its own check, which names the valid names)
    except ConfigError as e:
        raise ConfigError(f"ACCELERATIONS_OFF: {e}") from None
    return True


def check_models(models, name="MODELS"):
    """A non-empty list of model specs (lgip.models' rules: a dict with a known type and its field),
    each "name" file-safe (it names the output files) and used once (else two models' files are one)."""
    from .models.registry import _check_spec

    if not isinstance(models, (list, tuple)) or not models:
        raise ConfigError(
            f'{name} is empty: give a list of one or more model specs (README "Models"), got {models!r}'
            if isinstance(models, (list, tuple))
            else f'{name} must be a list of model specs (dicts with "name" and "type"), got {models!r}'
        )
    seen = set()
    for spec in models:
        try:
            _check_spec(spec, "corrected")
        except ModelError as e:
            raise ConfigError(f"{name}: {e}") from None
        tag = spec["name"]
        if not isinstance(tag, str) or not SAFE_NAME.match(tag):
            raise ConfigError(
                f"{name}: model name {tag!r} is not file-safe (it names output files): use {SAFE_NAME_TEXT}, "
                f"e.g. 'openclip_ViT-B-16_openai'"
            )
        if tag in seen:
            raise ConfigError(
                f'{name}: two models are named {tag!r} (their output files would be one): give each a different "name"'
            )
        seen.add(tag)
    return True


def _shard(v):
    from .models.zoo import shard_of

    shard_of(v)  # (its own ConfigError says what is wrong: a malformed "i/n", SLURM's variables not set)
    return True


def _models(v):
    return check_models(v)


def _model(v):
    """One model: a spec, a named model's name, or a dict naming one ({"name": "negclip", "pretrained": ...})."""
    if isinstance(v, str) or (isinstance(v, dict) and "type" not in v):
        from .models.registry import expand_models

        try:
            v = expand_models([v])
        except ModelError as e:
            raise ConfigError(f"MODEL: {e}") from None
        if len(v) != 1:
            raise ConfigError(f"MODEL is one model, got {len(v)}: {', '.join(str(m.get('name')) for m in v)}")
        v = v[0]
    return check_models([v], "MODEL")


TRACKER_NAMES = ("wandb", "mlflow", "tensorboard")
_TRACKER_MODULES = {"wandb": "wandb", "mlflow": "mlflow", "tensorboard": "tensorboard"}


def _installed(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _trackers(v):
    """A list of TRACKER_NAMES, each once and installed (found, not imported: each is imported when it logs)."""
    if not isinstance(v, (list, tuple)) or any(t not in TRACKER_NAMES for t in v) or len(set(v)) != len(v):
        return False
    missing = [t for t in v if not _installed(_TRACKER_MODULES[t])]
    if missing:
        raise ConfigError(
            f"TRACKERS names {', '.join(missing)}, not installed here: pip install {' '.join(missing)} "
            f"(or leave {'it' if len(missing) == 1 else 'them'} out of TRACKERS)"
        )
    return True


def _export(v):
    if v == "parquet" and not _installed("pyarrow"):
        raise ConfigError('EXPORT is "parquet" but pyarrow is not installed: pip install pyarrow, or EXPORT="csv"')
    return v in (None, "csv", "parquet")


_NO_DEFAULT = object()


@dataclass(frozen=True)
class Setting:
    """One shared setting, defined once: its test, what it must be (the error's words: its allowed values and
    a line saying what it is), and the package's fallback when a caller's config leaves it out (a config
    built by hand, an older script); every script that has the setting has this default as its constant
    (tests/test_settings.py checks it)."""

    test: Callable
    what: str
    default: Any = _NO_DEFAULT


_DTYPES = ("auto", "fp32", "bf16", "fp16", "float32", "bfloat16", "float16")
_PROTOCOLS = ("corrected", "reference")  # (lgip.models.encoder.PROTOCOLS, without importing torch here)
_COUNT = "an int >= 0"

SETTINGS = {
    "BOOTSTRAP": Setting(_int(0), "an int >= 0 (bootstrap resamples; 0 = no intervals)", default=1000),
    "BOOTSTRAP_SEED": Setting(_int(), "an int (the bootstrap's seed)", default=0),
    "SEED": Setting(_int(), "an int (a seed)"),
    "PRIOR_IMAGES": Setting(
        _int(1),
        "an int >= 1 (other images each text of a joint scorer is scored with for the "
        "text-prior controls, LGIP_SPEC.md 13)",
        default=3,
    ),
    "IMAGE_BATCH_SIZE": Setting(_int(1), "an int >= 1 (images per forward pass)"),
    "TEXT_BATCH_SIZE": Setting(lambda v: v == "auto" or _int(1)(v), 'an int >= 1 or "auto" (texts per forward pass)'),
    "NUM_WORKERS": Setting(
        lambda v: v is None or _int(0)(v),
        "an int >= 0 or None (image-decoding worker processes; 0 = in the main process, None = from the CPU count)",
    ),
    "DEVICE": Setting(_device, '"auto" or a torch device: "cpu", "cuda", "cuda:1", "mps", ...'),
    "DTYPE": Setting(lambda v: v in _DTYPES, "one of " + ", ".join(map(repr, _DTYPES))),
    "PROTOCOL": Setting(lambda v: v in _PROTOCOLS, "one of " + ", ".join(map(repr, _PROTOCOLS))),
    "MODELS": Setting(_models, "a non-empty list of model specs"),
    "MODEL": Setting(_model, "a model spec"),
    "OUTPUT_DIR": Setting(lambda v: isinstance(v, str) and v != "", "a folder path (None: beside the input)"),
    "CACHE_DIR": Setting(
        lambda v: v is None or (isinstance(v, str) and v != ""),
        'a folder path, "auto" (.lgip_cache beside the input, or in OUTPUT_DIR) or None (no cache)',
    ),
    "CACHE_FLUSH_S": Setting(_number(0), "a number >= 0 (seconds between cache writes)", default=60),
    "PIXEL_MEMORY_GB": Setting(
        lambda v: v == "auto" or _number(0)(v),
        'a number >= 0 or "auto" (GB of decoded pixels kept; 0 = off)',
        default="auto",
    ),
    "LOOKAHEAD": Setting(lambda v: isinstance(v, bool), "True or False", default=True),
    "WRITE_SCORES": Setting(lambda v: isinstance(v, bool), "True or False"),
    "VERBOSE": Setting(lambda v: isinstance(v, bool), "True or False"),
    "ACCELERATIONS_OFF": Setting(_accelerations, 'a list of names from lgip/accelerations.py, or "all"', default=[]),
    "SHARD": Setting(
        _shard,
        'None, "i/n" (0 <= i < n: this job runs models i, i + n, ...) or "slurm" (i and n from '
        "SLURM_ARRAY_TASK_ID, _MIN and _COUNT)",
    ),
    "STEP_START": Setting(
        lambda v: v in ("process", "fresh"),
        "\"process\" (each of run_all's steps its script's run() in "
        'run_all\'s process) or "fresh" (every step a new process)',
    ),
    "ON_MODEL_ERROR": Setting(
        lambda v: v in ("stop", "skip"),
        '"stop" (a model that fails stops the run) or "skip" (it is '
        "left out, recorded in skipped_models; the others go on)",
        default="stop",
    ),
    "EXPORT": Setting(
        _export,
        'None, "csv" or "parquet" (the per-pair scores also as one flat table beside the metrics, '
        "<stem>__LGIP_<script>_pairs.csv or .parquet: docs/outputs.md)",
        default=None,
    ),
    "TRACKERS": Setting(
        _trackers,
        'a list of "wandb", "mlflow", "tensorboard" (where the figures are also logged; [] none: docs/outputs.md)',
        default=[],
    ),
    "MAX_SAME_PER_CAP": Setting(_int(0), f"{_COUNT} (paraphrases kept per caption)"),
    "MAX_DIFF_PER_CAP": Setting(_int(0), f"{_COUNT} (flips kept per caption)"),
    "MAX_COMBINED_PER_CAP": Setting(_int(0), f"{_COUNT} (paraphrase+flip texts kept per caption)"),
    "COMBINED_SOURCE_PARAS": Setting(_int(0), f"{_COUNT} (paraphrases flipped for combined_caps)"),
}


def require_int(config, name, low=None, none_ok=False):
    """A script's own int setting (a count, a size): its value, else a ConfigError in the shared form.
    >>> require_int({"TOP_K": -1}, "TOP_K", 0)
    ConfigError: TOP_K must be an int >= 0, got -1
    """
    value = config[name]
    if (value is None and none_ok) or _int(low)(value):
        return value
    raise ConfigError(
        f"{name} must be an int{f' >= {low}' if low is not None else ''}{' or None' if none_ok else ''}, got {value!r}"
    )


def require_number(config, name, low, strict=False):
    """A script's own number setting (a weight, a rate): its value, else a ConfigError in the shared form.
    >>> require_number({"LR": 0}, "LR", 0, strict=True)
    ConfigError: LR must be a number > 0, got 0
    """
    value = config[name]
    if _number(low)(value) and (not strict or value > low):
        return value
    raise ConfigError(f"{name} must be a number {'>' if strict else '>='} {low}, got {value!r}")


def setting(config, name):
    """config[name], or its default (SETTINGS) when the config leaves it out; a name without one is a KeyError."""
    if name in config:
        return config[name]
    value = SETTINGS[name].default if name in SETTINGS else _NO_DEFAULT
    if value is _NO_DEFAULT:
        raise KeyError(f"setting {name!r} is not in the config and has no default in lgip.settings.SETTINGS")
    return list(value) if isinstance(value, list) else value


def defaults():
    """{name: default} of the settings that have one."""
    return {name: s.default for name, s in SETTINGS.items() if s.default is not _NO_DEFAULT}


def check_settings(config, none_ok=()):
    """Raise a ConfigError for the first setting of `config` (NAME -> value) that breaks its rule
    in SETTINGS; names without one are the script's own to check. `none_ok`: names that may be None."""
    for name, value in config.items():
        if name not in SETTINGS or (value is None and name in none_ok):
            continue
        test, what = SETTINGS[name].test, SETTINGS[name].what
        if name == "DEVICE" and config.get("DRY_RUN") is True:  # (run_all's plan may be for another machine)
            test = lambda v: _device(v, here=False)
        if not test(value):
            raise ConfigError(f"{name} must be {what}, got {value!r}")
    if config.get("EXPORT") is not None and config.get("WRITE_SCORES") is False:  # (the table is made from them)
        raise ConfigError(
            f"EXPORT={config['EXPORT']!r} makes its table from the score files, which WRITE_SCORES=False leaves "
            f"unwritten: set WRITE_SCORES=True, or EXPORT=None"
        )
