"""lgip.models.encoder: the one small interface every model loader returns (`Encoder`), what a
later model's tokenizer and pixels need before its weights (`Prepared`), and what they share:
protocols, dtype and device resolution, normalising, the tokenizer key.

An Encoder turns token ids and pixels into L2-normalised float32 embeddings; the scripts never
branch on model family (lgip.models.registry holds the registry of loaders)."""
from ..errors import ModelError


PROTOCOLS = ("corrected", "reference")


SIGLIP_TEXT_LENGTH = 64  # SigLIP/SigLIP2 were trained on text padded to 64 tokens


class Encoder:
    """The interface every loader returns; scripts never branch on model family.

    image_transform(PIL RGB image) -> inputs for one image (tensor or dict of tensors);
        picklable, so it runs in DataLoader workers.
    pixels: a PixelSplit of image_transform (uint8 geometry in the workers, arithmetic on the
        device, bit-identical) or None; the loader sets a candidate, load_model keeps it only
        once check_pixel_split has proven it on the device.
    encode_images(batched inputs) -> [N, D] float32, L2-normalised.
    tokenize(texts) -> list of token-id lists (truncated, not padded).
    pad_length(call_lengths) -> the length a published call pads its texts to (None: the
        batch may be cut to its longest member without changing any embedding).
    encode_tokens(LongTensor [N, L], exact_length=False) -> [N, D] float32, L2-normalised
        (exact_length: every text ends at the last column, which a causal tower may exploit).
    encode_packs(*PrefixPacks arrays) -> [T, D] float32, L2-normalised, or None: causal towers
        whose texts may share their common prefixes' computation (TextBank then packs them).
    """
    encode_packs = None
    encode_tokens = encode_images = None  # (None in an Encoder without weights: see lgip.models.key_encoder)
    weights_loaded = True
    name = type = protocol = None
    demo = False  # True for the bundled demo model (lgip.demo): its outputs say so
    device = "cpu"
    dtype = None
    pad_id = 0
    pad_needs_lengths = False  # True when a call's padding depends on its texts' lengths
    tokenizer_key = None  # set by load_model: equal keys tokenize alike (see shared_token_table); None: not shared
    pixels = None  # PixelSplit of image_transform, or None (see above)
    image_transform = None
    text_key_tag = ""  # prefix of this family's text cache keys: bumped when its tokenization changes
    info = {}
    release = None  # called once a run is done with the model (a caller's model in memory: its mode restored)
    accelerations = frozenset()  # the per-model switches (lgip.accelerations.PER_MODEL) its loader applied
    tokenizer = None  # the tokenizer the model was loaded with (its token names, for word attribution)

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


def _as_features(out):
    # transformers 5 returns a ModelOutput from get_*_features; 4.x a tensor.
    return getattr(out, "pooler_output", out)


def _normalise(x):
    x = x.float()
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def resolve_dtype(dtype, device):
    """DTYPE constant -> torch dtype: None/"auto" = bf16 on CUDA, fp32 elsewhere."""
    import torch
    names = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
             "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
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


def _download_hint(spec, err):
    from .hub import local_copy_hint
    what = spec.get("model_id") or f"{spec.get('model_name')} / {spec.get('pretrained')}"
    local = local_copy_hint(spec)
    return ModelError(f"model {spec.get('name')!r}: could not load weights for {what} ({type(err).__name__}: {err}). "
                      f"Check the network, or download them once elsewhere and point the spec at a local copy: "
                      f"{local}; a populated Hugging Face cache also works with HF_HUB_OFFLINE=1.")


# Texts that tell tokenizations apart: case, punctuation, digits, HTML entities, non-ASCII, and
# one longer than any context (truncation).
_TOKENIZER_PROBES = ["A Red BUS, parked & waiting at 10:45!", "Ünïcödé café — naïve “quotes” &amp; 3½ emojis 🚌",
                     " ".join(f"w{k}" for k in range(120))]


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
