"""lgip.models.encoder: the one small interface every model loader returns (`Encoder`), a model
without its weights that makes its cache keys (`KeyEncoder`), what a later model's tokenizer and
pixels need before its weights (`Prepared`), and what they share:
protocols, dtype and device resolution, normalising, the tokenizer key.

An Encoder turns token ids and pixels into L2-normalised float32 embeddings; the scripts never
branch on model family (lgip.models.registry holds the registry of loaders)."""

from ..accelerations import JOINT_ONLY
from ..errors import ModelError

# (a switch that acts inside a joint scorer's model: said of every other model that does not get it)
_JOINT_ONLY = {
    n: "for a model that scores a pair jointly (types generative and itm, LGIP_SPEC.md 13)" for n in JOINT_ONLY
}


PROTOCOLS = ("corrected", "reference")


SIGLIP_TEXT_LENGTH = 64  # SigLIP/SigLIP2 were trained on text padded to 64 tokens


class _Model:
    """What every model object of a run has, with or without weights, and what the run asks of any of them.

    Set on every model: its name in MODELS, type, protocol and demo flag (`named`, by the registry), device and
    dtype, what the run block says of it (`info`), whether its weights are loaded (`weights_loaded`, each
    class's), what a pair's score is (`score_kind`). The rest below is what the run may ask of a model of any
    kind (the lookahead, the run block, the accelerations' report), each with the answer of a model that does not
    have it; what a model does beyond (an Encoder's encode_*, a JointModel's submit) is its own class's."""

    name = type = protocol = None  # (named() sets them before any use)
    demo = False  # True for the bundled demo model (lgip.demo): its outputs say so
    device = "cpu"
    dtype = None
    info = {}
    weights_loaded = False
    score_kind = "cosine"  # what a pair's score is (LGIP_SPEC.md 13): a dual encoder's cosine
    tokenize = None  # texts -> token ids, for its text bank and cache keys (Encoder); None: no tokenizer of its own
    tokenizer_key = None  # equal keys tokenize alike (load_model sets it: shared_token_table); None: not shared
    pixels = None  # a PixelSplit of its image transform, proven on the device (lgip.models.pixels); None: none
    encode_packs = None  # texts encoded with their common prefixes shared (lgip.models.prefix_packs); None: cannot
    accelerations = frozenset()  # the per-model switches its loader applied
    why_not = _JOINT_ONLY  # {acceleration: why it does not apply to this model} (lgip.accelerations.applied)
    not_applied = None  # why the model gets none of the others, when it is one reason (a loader of one's own)

    def release(self):
        """Called once a run is done with the model: nothing to do here (a loader that must put its model back,
        a caller's model in memory returned to the mode it came in, sets its own)."""

    def named(self, spec, protocol):
        """This model as MODELS names it: its spec's name, type and demo flag, and the protocol."""
        self.name, self.type, self.protocol, self.demo = spec["name"], spec["type"], protocol, bool(spec.get("demo"))
        return self

    @property
    def rounds_to_fp16(self):
        """True when the model runs below fp32: its embeddings are then rounded to fp16."""
        import torch

        return self.dtype not in (None, torch.float32)

    @property
    def storage_dtype(self):
        """Embeddings as stored and used: float32 from an fp32 model, else rounded to fp16
        (below the model's own precision), so a cached re-run gives the same numbers. Similarities
        are computed in float32 from them."""
        import torch

        return torch.float16 if self.rounds_to_fp16 else torch.float32


class Encoder(_Model):
    """The interface every loader returns; scripts never branch on model family. A loader fills in:

    model, tokenizer: the model and the tokenizer it was loaded with (its token names, for word
        attribution); device, dtype: where and in what it runs.
    image_transform(PIL RGB image) -> inputs for one image (tensor or dict of tensors);
        picklable, so it runs in DataLoader workers.
    pixels: a PixelSplit of image_transform (uint8 geometry in the workers, arithmetic on the
        device, bit-identical) or None; the loader gives a candidate, load_model keeps it only
        once check_pixel_split has proven it on the device.
    encode_images(batched inputs) -> [N, D] float32, L2-normalised.
    tokenize(texts) -> list of token-id lists (truncated, not padded); tokenizer_identity: what
        makes two tokenizers tokenize alike (lgip.models.encoder.tokenizer_key).
    pad_length(call_lengths) -> the length a published call pads its texts to (None: the
        batch may be cut to its longest member without changing any embedding); pad_needs_lengths:
        True when a call's padding depends on its texts' lengths; pad_id: the padding token.
    encode_tokens(LongTensor [N, L], exact_length=False) -> [N, D] float32, L2-normalised
        (exact_length: every text ends at the last column, which a causal tower may exploit).
    encode_packs(*PrefixPacks arrays) -> [T, D] float32, L2-normalised, or None: causal towers
        whose texts may share their common prefixes' computation (TextBank then packs them).
    text_key_tag: the prefix of this family's text cache keys (bumped when its tokenization changes).
    info: what the run block says of the model (lgip.evaluation: run.model).
    accelerations: the per-model switches (lgip.accelerations.PER_MODEL) its loader applied.
    release: what to call once a run is done with the model (a caller's model in memory: its mode
        restored), or None for nothing (_Model.release). context_length: the text tower's longest text
        (open_clip), or None.
    """

    weights_loaded = True

    def __init__(
        self,
        *,
        model,
        device,
        dtype,
        tokenizer,
        image_transform,
        tokenize,
        encode_tokens,
        encode_images,
        pad_length,
        text_key_tag,
        tokenizer_identity=None,
        info=None,
        pad_id=0,
        pad_needs_lengths=False,
        pixels=None,
        encode_packs=None,
        accelerations=frozenset(),
        release=None,
        context_length=None,
    ):
        self.model, self.device, self.dtype, self.tokenizer = model, device, dtype, tokenizer
        self.image_transform, self.pixels, self.encode_images = image_transform, pixels, encode_images
        self.tokenize, self.tokenizer_identity = tokenize, tokenizer_identity
        self.pad_length, self.pad_needs_lengths, self.pad_id = pad_length, pad_needs_lengths, pad_id
        self.encode_tokens, self.encode_packs, self.context_length = encode_tokens, encode_packs, context_length
        self.text_key_tag, self.info, self.accelerations = text_key_tag, dict(info or {}), frozenset(accelerations)
        if release is not None:
            self.release = release


class KeyEncoder(_Model):
    """A model without its weights (lgip.models.key_encoder): it makes the cache keys the loaded model
    makes (text_key_tag, pad_length; tokenize and tokenizer_key where the padding needs the texts'
    lengths), so a re-run whose embeddings are all in the cache needs no more. It encodes nothing
    (encode_* None); the run loads the weights (lgip.evaluation.ModelRun.load_weights) once
    something is not in the cache."""

    weights_loaded = False

    model = tokenizer = image_transform = encode_tokens = encode_images = None  # (no weights)

    def __init__(
        self, *, text_key_tag, pad_length, tokenize=None, tokenizer_identity=None, pad_id=0, pad_needs_lengths=False
    ):
        self.text_key_tag, self.pad_length, self.pad_needs_lengths = text_key_tag, pad_length, pad_needs_lengths
        self.tokenize, self.tokenizer_identity, self.pad_id = tokenize, tokenizer_identity, pad_id
        self.info = {"weights_loaded": False}


def _as_features(out):
    # transformers 5 returns a ModelOutput from get_*_features; 4.x a tensor.
    return getattr(out, "pooler_output", out)


def _normalise(x):
    x = x.float()
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def resolve_dtype(dtype, device):
    """DTYPE constant -> torch dtype: None/"auto" = bf16 on CUDA, fp32 elsewhere."""
    import torch

    names = {
        "fp32": torch.float32,
        "float32": torch.float32,
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
    }
    if dtype in (None, "auto"):
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if dtype not in names:
        raise ModelError(f"unknown DTYPE {dtype!r}; valid: auto, {', '.join(names)}")
    return names[dtype]


def resolve_device(device):
    import torch

    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


# what a failed download says, by exception class names (along its causes) or message: only these get the
# network's advice; any other load error is said as it is
_NETWORK_ERRORS = {
    "LocalEntryNotFoundError",
    "OfflineModeIsEnabled",
    "ConnectionError",
    "ConnectTimeout",
    "ReadTimeout",
    "ConnectError",
    "TimeoutException",
    "ProxyError",
    "SSLError",
    "MaxRetryError",
    "NewConnectionError",
    "NameResolutionError",
    "gaierror",
}
_NETWORK_WORDS = (
    "couldn't connect",
    "could not connect",
    "offline mode",
    "max retries exceeded",
    "temporary failure in name resolution",
    "name or service not known",
    "connection refused",
    "network is unreachable",
    "connection reset",
    "timed out",
)


def _is_network_error(err):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        text = str(err).lower()
        if type(err).__name__ in _NETWORK_ERRORS or any(w in text for w in _NETWORK_WORDS):
            return True
        err = err.__cause__ or err.__context__
    return False


def _download_hint(spec, err):
    """The ModelError of a model that could not be loaded: a local path that does not exist named as such,
    a network failure with the network's advice, anything else as it is."""
    import os
    from .hub import local_copy_hint

    what = spec.get("model_id") or f"{spec.get('model_name')} / {spec.get('pretrained')}"
    name = spec.get("name")
    for path in (spec.get("model_id"), spec.get("pretrained")):
        if isinstance(path, str) and looks_local(path) and not os.path.exists(os.path.expanduser(path)):
            return ModelError(f"model {name!r}: {path} does not exist (a local path: check it)")
    if not _is_network_error(err):
        return ModelError(f"model {name!r}: could not load {what} ({type(err).__name__}: {err})")
    local = local_copy_hint(spec)
    return ModelError(
        f"model {name!r}: could not load weights for {what} ({type(err).__name__}: {err}). "
        f"Check the network, or download them once elsewhere and point the spec at a local copy: "
        f"{local}; a populated Hugging Face cache also works with HF_HUB_OFFLINE=1."
    )


def looks_local(path):
    """True for a path on this machine rather than a Hub id or a tag: absolute, ~, ./, ../, or a file name
    with a checkpoint's extension."""
    return (
        path.startswith(("/", "~", "./", "../", ".\\"))
        or path.endswith((".bin", ".pt", ".pth", ".safetensors"))
        or (len(path) > 1 and path[1] == ":")
    )


# Texts that tell tokenizations apart: case, punctuation, digits, HTML entities, non-ASCII, and
# one longer than any context (truncation).
_TOKENIZER_PROBES = [
    "A Red BUS, parked & waiting at 10:45!",
    "Ünïcödé café — naïve “quotes” &amp; 3½ emojis 🚌",
    " ".join(f"w{k}" for k in range(120)),
]


def tokenizer_key(model_type, identity, tokenize):
    """What tells tokenizations apart (see shared_token_table): equal keys, equal ids."""
    return (model_type, identity, tuple(map(tuple, tokenize(_TOKENIZER_PROBES))))


class Prepared:
    """What a later model's texts and images need before the model itself: its tokenizer
    (`tokenize`, `tokenizer_key`) and its pixel geometry (`pixels`, a PixelSplit or None), got
    without its weights (see Lookahead). The same functions its loader uses, so equal keys
    mean equal token ids and pixels; a loaded model whose keys differ just uses none of it."""

    def __init__(self, name, key, tokenize, pixels):
        self.name, self.tokenizer_key, self.tokenize, self.pixels = name, key, tokenize, pixels


def check_keys(spec, valid, what):
    """A key the spec's type does not read is a typo until proven otherwise ('pretraind' would mean
    random weights): ModelError naming it, the closest valid key and them all."""
    import difflib

    for key in spec:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ModelError(f"{what}: unknown key {key!r}; {hint}valid keys: {', '.join(valid)}")


def hf_config(spec):
    """A transformers spec's config (its model_id's config.json, no weights); a load error said as it is
    (_download_hint)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(spec["model_id"])
    except (OSError, ValueError) as e:
        raise _download_hint(spec, e) from e
