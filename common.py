"""Shared machinery for the LGIP scripts.

Sections, in order:
  1. configuration: `--NAME=value` overrides of a script's constants (`configure`)
  2. JSONL input and atomic output (`iter_records`, `atomic_open`, `write_json`)
  3. caption perturbations: word lists, paraphrases, flips (the generators' method)
  4. run bookkeeping: provenance, progress bars, summaries

Example (a generator script):
    INPUT_JSONL = os.path.join(HERE, "x.jsonl")   # path to the base JSONL
    common.configure(globals())                   # applies --INPUT_JSONL=... from sys.argv
"""
import ast
import functools
import itertools
import json
import operator
import os
import platform
import random
import re
import sys
import tempfile
import time
from contextlib import contextmanager

# ---------------------------------------------------------------------------
# 1. Configuration
# ---------------------------------------------------------------------------

_CONST_LINE = re.compile(r"^([A-Z][A-Z0-9_]*)\s*=\s*(.*?)\s*(?:#\s*(.*))?$")


def _constant_docs(path):
    """NAME -> (source expression, comment) for the top-level constants of a script."""
    docs = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = _CONST_LINE.match(line.rstrip("\n"))
                if m and m.group(1) not in docs:
                    docs[m.group(1)] = (m.group(2), m.group(3) or "")
    except OSError:
        pass
    return docs


def parse_value(text):
    """`--NAME=value`: a Python literal if it parses as one, else the string itself.

    >>> parse_value("64"), parse_value("[1, 2]"), parse_value("cuda:0"), parse_value("None")
    (64, [1, 2], 'cuda:0', None)
    """
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def configure(namespace, argv=None):
    """Apply `--NAME=value` command-line overrides to a script's UPPERCASE constants.

    `namespace` is the script's globals(). Unknown names are an error listing the valid
    ones; `--help` prints every constant with its comment. Returns the dict of constants
    actually in force (recorded in every output file). The command line belongs to the script
    being run: a script imported by another (bench_host imports bench) keeps its defaults.
    """
    if argv is None:
        argv = sys.argv[1:] if namespace.get("__name__") == "__main__" else []
    names = [k for k, v in namespace.items() if k.isupper() and not k.startswith("_")
             and not callable(v) and not isinstance(v, type(sys))]
    script = namespace.get("__file__", "")
    if any(a in ("-h", "--help") for a in argv):
        docs = _constant_docs(script)
        print(f"usage: python {os.path.basename(script)} [--NAME=value ...]\n")
        print((namespace.get("__doc__") or "").strip() + "\n")
        print("constants (value is a Python literal, else a string):")
        for k in names:
            comment = docs.get(k, ("", ""))[1]
            print(f"  --{k}={namespace[k]!r}\n      {comment}")
        raise SystemExit(0)
    for arg in argv:
        if not arg.startswith("--") or "=" not in arg:
            raise SystemExit(f"error: expected --NAME=value, got {arg!r} (see --help)")
        key, text = arg[2:].split("=", 1)
        if key not in names:
            raise SystemExit(f"error: unknown setting {key!r}; valid settings: {', '.join(names)}")
        value = parse_value(text)
        print(f"override: {key} = {value!r}")
        namespace[key] = value
    return {k: namespace[k] for k in names}


# ---------------------------------------------------------------------------
# 2. JSONL input and atomic output
# ---------------------------------------------------------------------------

class InputError(ValueError):
    """Bad input; the message names the file, line and field."""


def _expect_str_list(value, where, field):
    if not isinstance(value, list):
        raise InputError(f"{where}: field {field!r} is {type(value).__name__}, expected a list of strings")
    for j, s in enumerate(value):
        if not isinstance(s, str):
            raise InputError(f"{where}: field '{field}[{j}]' is {type(s).__name__}, expected a string")


def validate_record(rec, where, per_caption_fields=()):
    """Check the fields the scripts read; `where` is "file:line". per_caption_fields: names of
    required {caption index: [texts]} fields; "prefix*" checks every field with that prefix;
    "combined_caps" (optional) holds lists of {"text", "combined_type"} objects."""
    if not isinstance(rec, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    for field in ("image_path", "orig_captions"):
        if field not in rec:
            raise InputError(f"{where}: missing field {field!r}")
    if not isinstance(rec["image_path"], str):
        raise InputError(f"{where}: field 'image_path' is {type(rec['image_path']).__name__}, expected a string")
    _expect_str_list(rec["orig_captions"], where, "orig_captions")
    for pattern in per_caption_fields:
        # "diff_caps_*": every field with that prefix, however many (none is fine)
        fields = [f for f in rec if f.startswith(pattern[:-1])] if pattern.endswith("*") else [pattern]
        for field in fields:
            block = rec.get(field)
            if block is None:
                if field == "combined_caps":
                    continue
                raise InputError(f"{where}: missing field {field!r} (run the generator first)")
            if not isinstance(block, dict):
                raise InputError(f"{where}: field {field!r} is {type(block).__name__}, expected an object keyed by caption index")
            for key, items in block.items():
                if field == "combined_caps":
                    _expect_combined(items, where, f"{field}.{key}")
                else:
                    _expect_str_list(items, where, f"{field}.{key}")


def _expect_combined(items, where, field):
    if not isinstance(items, list):
        raise InputError(f"{where}: field {field!r} is {type(items).__name__}, expected a list of objects")
    for j, item in enumerate(items):
        for name in ("text", "combined_type"):
            if not isinstance(item, dict) or not isinstance(item.get(name), str):
                raise InputError(f"{where}: field '{field}[{j}].{name}' is missing or not a string")


def iter_records(path, per_caption_fields=()):
    """Stream (line number, record) from a JSONL file, validating each record.

    Blank lines are skipped (as the published code does); anything else that is not a
    valid record raises InputError naming `path:line` and the field.
    """
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
            validate_record(rec, where, per_caption_fields)
            yield lineno, rec


def count_lines(path):
    """Non-blank-agnostic line count (for progress bars); fast on large files."""
    n = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            n += block.count(b"\n")
    return n


@contextmanager
def atomic_open(path, mode="w", durable=True):
    """Write `path` through a temp file in the same folder, renamed into place on success.

    An exception or a kill mid-write leaves any previous file untouched and no partial one.
    durable: the data reaches the disk before the rename (fsync), so a power loss cannot
    leave a renamed but empty file either; files whose readers detect that (checksummed cache
    chunks) skip it.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        kwargs = {} if "b" in mode else {"encoding": "utf-8", "newline": "\n"}
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def dump_jsonl_line(rec):
    """The published output format: default separators, non-ASCII kept."""
    return json.dumps(rec, ensure_ascii=False) + "\n"


def write_json(path, obj):
    with atomic_open(path) as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return path


def run_main(main):
    """Run a script's main(); bad input ends with its message and exit status 2, a GPU out of
    memory with what to lower and exit status 3."""
    try:
        main()
    except (InputError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    except Exception as e:
        torch = sys.modules.get("torch")  # imported by then if a model ran
        if torch is None or not isinstance(e, torch.cuda.OutOfMemoryError):
            raise
        print(f"error: the GPU ran out of memory ({str(e).splitlines()[0]}). Lower --TEXT_BATCH_SIZE= "
              f"(\"auto\" is 2048 on CUDA) or --IMAGE_BATCH_SIZE=, or use --DTYPE=bf16; finished cache chunks "
              f"are kept, so a re-run resumes.", file=sys.stderr)
        raise SystemExit(3)


# ---------------------------------------------------------------------------
# 3. Caption perturbations (LGIP_SPEC.md sections 2-3)
# ---------------------------------------------------------------------------

COLORS = ["red", "blue", "green", "yellow", "black", "white", "brown", "gray", "orange", "pink", "purple"]
NUMBER_WORDS = ["one", "two", "three", "four", "five"]
OBJECTS = ["dog", "cat", "horse", "car", "bus", "train", "person", "bird", "boat", "bicycle", "truck"]
FLIP_LISTS = [("color", COLORS), ("number", NUMBER_WORDS), ("object", OBJECTS)]
FLIP_TYPES = [t for t, _ in FLIP_LISTS]
TEMPLATES = ["a photo of {}", "an image of {}", "a picture of {}", "{}", "{} in the scene", "a scene showing {}"]
PREFIXES = ["In this image, {}", "In the picture, {}", "This image shows {}"]
# (type, pattern, {word: the other words of its list}); the alternatives keep list order.
_FLIP_PATTERNS = [(t, re.compile(r"\b(" + "|".join(words) + r")\b"), {w: [x for x in words if x != w] for w in words})
                  for t, words in FLIP_LISTS]

_PASSIVE_RULES = [
    (re.compile(r"^A (\w+) (is|are|sits|sitting|stands|standing|lies|lying) "
                r"(on|in|at|by|next to|behind|in front of) (.+)\.$", re.I), r"A \4 \2 \3 \1."),
    (re.compile(r"^(\w+) (is|are|sits|sitting|stands|standing|lies|lying) "
                r"(on|in|at|by|next to|behind|in front of) (.+)\.$", re.I), r"\4 \2 \3 \1."),
    (re.compile(r"^A (\w+) (is|are) (going|running|moving) (down|along|through) (.+)\.$", re.I),
     r"\5 \2 \3 \1 \4 them."),
]
SYNONYMS = {
    "cat": ["feline", "kitty"], "dog": ["canine", "puppy", "hound"],
    "person": ["individual", "human", "man", "woman"], "sits": ["rests", "perches"],
    "stands": ["stands", "poses"], "large": ["big", "huge", "enormous"],
    "small": ["little", "tiny", "miniature"], "red": ["crimson", "scarlet"],
    "blue": ["azure", "navy"], "green": ["emerald", "lime"],
}


def dedupe(items):
    """Keep the first occurrence of each item, in order."""
    return list(dict.fromkeys(items))


def simple_paraphrases(c):
    """Templates then prefixes filled with c, stripped, >= 5 chars, de-duplicated.

    >>> simple_paraphrases("dog")[:2]
    ['a photo of dog', 'an image of dog']
    """
    filled = [t.format(c).strip() for t in TEMPLATES + PREFIXES]
    return dedupe(p for p in filled if len(p) >= 5)


def passive_paraphrases(c):
    s = c.strip()
    out = []
    for pattern, repl in _PASSIVE_RULES:
        if pattern.match(s):
            p = pattern.sub(repl, s).capitalize()
            if p != s:
                out.append(p)
    return out


def synonym_paraphrases(c):
    """Single, then double synonym substitutions over `c.lower().split()`."""
    tokens = c.lower().split()
    slots = [i for i, tok in enumerate(tokens) if tok in SYNONYMS]
    out = []

    def emit(replacements):
        toks = list(tokens)
        for i, syn in replacements:
            toks[i] = syn
        p = " ".join(toks).capitalize()
        if p != c:
            out.append(p)

    for i in slots:
        for syn in SYNONYMS[tokens[i]]:
            emit([(i, syn)])
    for a, i in enumerate(slots):
        for j in slots[a + 1:]:
            for syn_i in SYNONYMS[tokens[i]]:
                for syn_j in SYNONYMS[tokens[j]]:
                    emit([(i, syn_i), (j, syn_j)])
    return out


def advanced_candidates(c):
    """Every advanced-paraphrase candidate of c, stripped, in generation order, with repeats."""
    raw = [t.format(c) for t in TEMPLATES + PREFIXES] + passive_paraphrases(c) + synonym_paraphrases(c)
    return [p.strip() for p in raw]


def advanced_paraphrases(c, order="generation"):
    """The enhanced generator's paraphrase pool of c.

    order="generation" (this project): templates, prefixes, passive, single then double
    synonyms, first occurrence kept: the same list under any PYTHONHASHSEED.
    order="set": iterate a Python set as the published script does; its order depends on
    PYTHONHASHSEED (the fixtures were made with PYTHONHASHSEED=0).
    """
    cands = advanced_candidates(c)
    pool = dedupe(cands) if order == "generation" else list(set(cands))
    low = c.lower()
    return [p for p in pool if len(p) >= 5 and p.lower() != low]


def typed_flips(c, rng):
    """Flip the first color, number and object word of c: [(text, type)], in that order.

    Consumes one rng.choice per word list that matches.
    >>> typed_flips("a red bus", random.Random(42))
    [('a gray bus', 'color'), ('a red bicycle', 'object')]
    """
    out = []
    for ftype, pattern, alternatives in _FLIP_PATTERNS:
        m = pattern.search(c)
        if not m:
            continue
        new = rng.choice(alternatives[m.group(1)])
        flipped = c[:m.start()] + new + c[m.end():]  # = pattern.sub(new, c, count=1)
        if flipped != c:
            out.append((flipped.strip(), ftype))
    seen, kept = set(), []
    for text, ftype in out:
        if len(text) >= 5 and text not in seen:
            seen.add(text)
            kept.append((text, ftype))
    return kept


def add_typed_flips(fields, key, c, rng, cap, stats):
    """Set fields["diff_caps"][key] and the per-type lists to c's flips (sampled to cap).

    `fields` holds "diff_caps" and "diff_caps_<type>" dicts; the typed lists split the same
    texts by type, in the same order, as the published fliptypes generators write them.
    """
    flips = cap_sample([(t, ft) for t, ft in typed_flips(c, rng) if t.strip() != c.strip()], cap, rng)
    fields["diff_caps"][key] = [t for t, _ in flips]
    for ftype in FLIP_TYPES:
        fields["diff_caps_" + ftype][key] = [t for t, ft in flips if ft == ftype]
        stats["flips_" + ftype] += len(fields["diff_caps_" + ftype][key])


def cap_sample(items, cap, rng):
    """At most `cap` items: `rng.sample` only when there are more."""
    return rng.sample(items, cap) if len(items) > cap else items


# ---------------------------------------------------------------------------
# 4. Run bookkeeping
# ---------------------------------------------------------------------------

def package_versions(names=("torch", "torchvision", "open_clip_torch", "transformers", "numpy", "pillow")):
    from importlib import metadata
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def provenance(script, config):
    """What made an output: script, settings in force, package versions, time."""
    return {
        "script": os.path.basename(script),
        "config": {k: v for k, v in config.items()},
        "versions": package_versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


class _NoBar:
    def update(self, n=1):
        pass

    def close(self):
        pass


def progress_bar(total, desc="", unit="it", min_total=2000):
    """A tqdm bar updated by hand (`.update(n)`, `.close()`) when the job is large; else a no-op."""
    if total < min_total:
        return _NoBar()
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, mininterval=0.5)


def progress(iterable, total=None, desc="", unit="it", min_total=2000):
    """A tqdm bar (items/s, ETA) on stderr when the job is large; the bare iterable otherwise."""
    if total is not None and total < min_total:
        return iterable
    from tqdm import tqdm
    return tqdm(iterable, total=total, desc=desc, unit=unit, dynamic_ncols=True, mininterval=0.5)


@contextmanager
def gc_paused():
    """Python's cyclic garbage collector paused while millions of dicts and lists that hold no
    cycles are made: each of its collections walks every object made since (its full ones, all
    the process's), which took half the time of reading a run's records (40,000 records:
    run_lgip_multi's 1.35 -> 0.66 s, the rebuttal's 3.5 -> 1.7 s; the next full collection
    then takes 0.1-0.2 s longer)."""
    import gc
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0


def run_generator(script, config, input_path, output_path, perturb):
    """The generators' shared loop: stream records, add perturbation fields, write atomically.

    `perturb(record, rng, stats)` returns the new per-caption fields (dicts keyed "0".."4");
    they are set on the record in the order returned, after its existing keys. Writes
    `output_path` plus `<output_path>.meta.json` (settings, versions, counts: the JSONL
    itself must stay byte-identical to the published format) and prints a summary.
    """
    from collections import Counter
    rng = random.Random(config["SEED"])
    stats = Counter()
    total = count_lines(input_path)
    with Timer() as timer, atomic_open(output_path) as out:
        for _, rec in progress(iter_records(input_path), total, desc=os.path.basename(script), unit="rec"):
            stats["records"] += 1
            stats["captions"] += len(rec["orig_captions"])
            for key, value in perturb(rec, rng, stats).items():
                rec[key] = value
            out.write(dump_jsonl_line(rec))
    rate = stats["records"] / max(timer.seconds, 1e-9)
    meta = provenance(script, config)
    meta.update(input=os.path.abspath(input_path), output=os.path.abspath(output_path),
                counts=dict(stats), seconds=round(timer.seconds, 3))
    write_json(output_path + ".meta.json", meta)
    flips = ", ".join(f"{t} {stats['flips_' + t]}" for t in FLIP_TYPES)
    line = (f"{os.path.basename(script)}: {stats['records']} records, {stats['captions']} captions, "
            f"{stats['paraphrases']} paraphrases, flips: {flips}")
    if stats["combined"]:
        line += f", combined {stats['combined']}"
    print(line)
    print(f"  {timer.seconds:.2f} s ({rate:,.0f} records/s) -> {output_path}")
    return stats


def default_output(input_path, suffix, prefix=""):
    """`<prefix><input stem><suffix>` next to the input."""
    folder, name = os.path.split(input_path)
    return os.path.join(folder, prefix + os.path.splitext(name)[0] + suffix)


# ---------------------------------------------------------------------------
# 5. Models: one registry, one small interface (LGIP_SPEC.md sections 5-6)
# ---------------------------------------------------------------------------

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
PROTOCOLS = ("corrected", "reference")
SIGLIP_TEXT_LENGTH = 64  # SigLIP/SigLIP2 were trained on text padded to 64 tokens


class ModelError(RuntimeError):
    """A model spec that cannot be resolved or loaded; the message says what to do."""


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
    name = type = protocol = None
    device = "cpu"
    dtype = None
    pad_id = 0
    pad_needs_lengths = False  # True when a call's padding depends on its texts' lengths
    tokenizer_key = None  # set by load_model: equal keys tokenize alike (see shared_token_table); None: not shared
    pixels = None  # PixelSplit of image_transform, or None (see above)
    text_key_tag = ""  # prefix of this family's text cache keys: bumped when its tokenization changes
    info = {}

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
    what = spec.get("model_id") or f"{spec.get('model_name')} / {spec.get('pretrained')}"
    local = ('"model_id": "/path/to/local/folder" (a folder saved with save_pretrained or a Hub snapshot)'
             if spec.get("type") == "siglip" else
             '"pretrained": "/path/to/open_clip_pytorch_model.bin" or "model_name": "local-dir:/path/to/folder"')
    return ModelError(f"model {spec.get('name')!r}: could not load weights for {what} ({type(err).__name__}: {err}). "
                      f"Check the network, or download them once elsewhere and point the spec at a local copy: "
                      f"{local}; a populated Hugging Face cache also works with HF_HUB_OFFLINE=1.")


def openclip_create_kwargs(spec, protocol):
    """(model_name, pretrained, extra create kwargs) for an open_clip spec.

    Corrected protocol: weights trained with QuickGELU (open_clip's own metadata for the tag
    says so: the OpenAI ones, MetaCLIP, ...) run with QuickGELU; open_clip >= 2.29 builds e.g.
    ViT-B-16 + openai with GELU and only warns. A checkpoint file whose name starts with
    "openai" is treated the same. Reference protocol builds the model as the published code did.
    >>> openclip_create_kwargs({"model_name": "ViT-B-16", "pretrained": "openai"}, "corrected")
    ('ViT-B-16', 'openai', {'force_quick_gelu': True})
    """
    import open_clip
    name, pretrained = spec["model_name"], spec.get("pretrained")
    kwargs = {}
    if protocol != "corrected" or not isinstance(pretrained, str) or name.startswith(("hf-hub:", "local-dir:")):
        return name, pretrained, kwargs
    if os.path.isfile(pretrained):
        trained_quick = os.path.basename(pretrained).lower().startswith("openai")
    else:
        trained_quick = bool(open_clip.get_pretrained_cfg(name, pretrained).get("quick_gelu"))
    built_quick = bool((open_clip.get_model_config(name) or {}).get("quick_gelu"))
    if trained_quick and not built_quick:
        kwargs["force_quick_gelu"] = True
    return name, pretrained, kwargs


def _check_openclip_name(name):
    import open_clip
    if name.startswith(("hf-hub:", "local-dir:")):
        return
    valid = open_clip.list_models()
    if name not in valid:
        import difflib
        close = difflib.get_close_matches(name, valid, n=8, cutoff=0.5)
        raise ModelError(f"unknown open_clip model_name {name!r}; close matches: {', '.join(close) or 'none'} "
                         f"(all {len(valid)}: open_clip.list_models()); 'hf-hub:org/repo' and "
                         f"'local-dir:/path' names are accepted too")


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
    if torch.device(device).type != "cpu":
        try:
            with torch.device(device):
                model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=pretrained, device=device,
                                                                             **kwargs)
            return model, preprocess, str(device)
        except (RuntimeError, TypeError, NotImplementedError) as e:
            if _is_download_error(e):
                raise
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=pretrained, **kwargs)
    return model, preprocess, "cpu"


_PLAIN_ASCII = re.compile(r"[\x20-\x25\x27-\x7e]*")  # printable ASCII but '&': ftfy and html.unescape leave it as it is
_CLIP_ENCODE_CHECKS = ["a photo of a dog", "  Two  DOGS, one cat!! ", "it's 10:45 -- isn't it?", "<end_of_text> x",
                       "a<start_of_text>b", "don't", "x" * 300, "(a) [b] {c} |d| ~e~ `f` \\g/ ^h^ $i$ #j# @k@ %l%",
                       "\"quoted\" 'single' ;semi; :colon: =eq= +plus+ _under_ ?q?", "abc123def 4 5.6 7,8"]


def _fast_clip_encode(tokenizer):
    """tokenizer.encode (open_clip's SimpleTokenizer with its default 'lower' cleaning) made
    ~5x faster, same ids: a text of printable ASCII without '&' skips ftfy and html.unescape
    (they leave such text as it is; the cleaning left is whitespace and case), and each word's
    BPE ids are kept once made. Other texts go through tokenizer.encode itself. None when the
    tokenizer is not that one, or the two disagree on a few checks.
    >>> _fast_clip_encode(open_clip.tokenizer.SimpleTokenizer())("A dog") == [320, 1929]
    True
    """
    import open_clip
    if getattr(tokenizer, "clean_fn", None) is not getattr(open_clip.tokenizer, "_clean_lower", False):
        return None
    words, pat, byte_encoder, ids_of, bpe = {}, tokenizer.pat, tokenizer.byte_encoder, tokenizer.encoder, tokenizer.bpe

    def encode(text):
        if not _PLAIN_ASCII.fullmatch(text):
            return tokenizer.encode(text)
        out = []
        for word in pat.findall(" ".join(text.split()).lower()):
            ids = words.get(word)
            if ids is None:
                ids = words[word] = [ids_of[p] for p in bpe("".join(byte_encoder[b] for b in word.encode())).split(" ")]
            out += ids
        return out
    return encode if all(encode(t) == tokenizer.encode(t) for t in _CLIP_ENCODE_CHECKS) else None


def _openclip_tokenize_fn(tokenizer, context, trimmable):
    """tokenize(texts) -> token id lists for an open_clip tokenizer: a causal (trimmable) tower's
    texts end at their EOT, any other tower's are full padded rows. Shared by load_openclip and
    prepare_openclip, so a text tokenized ahead has the ids the model would give it."""
    import open_clip
    simple = type(tokenizer) is open_clip.tokenizer.SimpleTokenizer and tokenizer.reduction_fn is None
    sot, eot = getattr(tokenizer, "sot_token_id", None), getattr(tokenizer, "eot_token_id", None)
    encode = (_fast_clip_encode(tokenizer) or tokenizer.encode) if simple and trimmable else None

    def tokenize(texts):
        if encode is not None:  # SimpleTokenizer.__call__'s ids, without its padded tensor
            out = []
            for t in texts:
                ids = [sot] + encode(t) + [eot]
                if len(ids) > context:
                    ids = ids[:context]
                    ids[-1] = eot
                # A literal "<end_of_text>" in a caption is an EOT id too; the tower pools at the
                # first EOT (argmax), so nothing after it counts.
                out.append(ids[:ids.index(eot) + 1])
            return out
        ids = tokenizer(list(texts))  # [N, context]
        if not trimmable:
            return ids.tolist()  # full rows: the tower sees every position
        # Up to EOT (the argmax id, where the tower pools), not "ids != 0": id 0 is "!" and
        # occurs inside texts such as 'he said "stop!"'.
        return [row[:n].tolist() for row, n in zip(ids, (ids.argmax(dim=1) + 1).tolist())]
    return tokenize


def _openclip_tokenizer_identity(tokenizer, context):
    return (type(tokenizer).__name__, len(getattr(tokenizer, "encoder", {})), context)


def load_openclip(spec, protocol, device, dtype):
    import open_clip
    import torch
    _check_openclip_name(spec["model_name"])
    name, pretrained, kwargs = openclip_create_kwargs(spec, protocol)
    if name.startswith(("hf-hub:", "local-dir:")):
        pretrained = None  # open_clip ignores it for these names
    elif pretrained and not os.path.isfile(str(pretrained)):
        tags = open_clip.list_pretrained_tags_by_model(name)
        if pretrained not in tags:
            raise ModelError(f"unknown pretrained tag {pretrained!r} for open_clip {name}; valid: {', '.join(tags) or 'none'} "
                             f"(or a checkpoint file path, or None for random init)")
    try:
        model, preprocess, built_on = _create_openclip_on(device, name, pretrained, kwargs)
    except (OSError, ConnectionError, TimeoutError) as e:
        raise _download_hint(spec, e) from e
    except RuntimeError as e:
        if _is_download_error(e):
            raise _download_hint(spec, e) from e
        raise
    model = model.eval().to(device=device, dtype=dtype)
    tokenizer = open_clip.get_tokenizer(name)
    enc = Encoder()
    enc.model, enc.device, enc.dtype = model, device, dtype
    enc.image_transform = preprocess
    enc.pixels = pixel_split_openclip(preprocess)
    enc.context_length = getattr(model, "context_length", None) or tokenizer.context_length
    tower = _openclip_causal_text_tower(model)
    trimmable = tower is not None
    blocks = _plain_blocks(tower.transformer) if trimmable else None
    enc.pad_id = 0

    tokenize = _openclip_tokenize_fn(tokenizer, enc.context_length, trimmable)

    @torch.no_grad()
    def encode_tokens(ids, exact_length=False):
        ids = ids.to(device, non_blocking=True)
        if trimmable:
            x = _openclip_text_trimmed(tower, blocks, ids, exact_length)
        else:
            full = torch.zeros(ids.shape[0], enc.context_length, dtype=ids.dtype, device=device)
            full[:, :ids.shape[1]] = ids
            x = model.encode_text(full)
        return _normalise(x)

    visual_blocks = _class_token_blocks(model.visual)

    @torch.no_grad()
    def encode_images(pixels):
        pixels = pixels.to(device=device, dtype=dtype, non_blocking=True)
        if visual_blocks is not None:
            return _normalise(_openclip_image_pooled(model.visual, visual_blocks, pixels))
        return _normalise(model.encode_image(pixels))

    @torch.no_grad()
    def encode_packs(*arrays):
        return _normalise(_openclip_text_packed(tower, blocks, *(a.to(device, non_blocking=True) for a in arrays)))

    enc.tokenize, enc.encode_tokens, enc.encode_images = tokenize, encode_tokens, encode_images
    if blocks is not None:  # (only for a trimmable tower)
        enc.encode_packs = encode_packs
    enc.tokenizer_identity = _openclip_tokenizer_identity(tokenizer, enc.context_length)
    # "eot2|": texts run to EOT (earlier caches cut a text at an inner id 0, "!": never reused).
    enc.text_key_tag = "eot2|"
    # Causal mask + EOT pooling: positions after a text's EOT never reach its embedding, so
    # every batch is cut to its longest member (tests/test_models.py proves it).
    enc.pad_length = lambda call_lengths: None if trimmable else enc.context_length
    enc.info = {"quick_gelu": _uses_quick_gelu(model),
                "built_on": built_on,
                "text_trimmed": trimmable,
                "text_prefix_sharing": enc.encode_packs is not None,
                "image_last_block_class_token_only": visual_blocks is not None}
    return enc


def _uses_quick_gelu(model):
    from open_clip.transformer import QuickGELU
    return any(isinstance(m, QuickGELU) for m in model.modules())


def _openclip_causal_text_tower(model):
    """The module holding an open_clip text tower that may be cut to its texts' real length
    (causal mask, EOT = argmax pooling, no pad mask or appended class token): the model itself
    for CLIP, `model.text` for CustomTextCLIP (EVA02, ...); None for any other tower."""
    import open_clip
    from open_clip.transformer import TextTransformer
    if isinstance(model, open_clip.CLIP):
        tower, pool = model, getattr(model, "text_pool_type", "argmax")
    elif isinstance(getattr(model, "text", None), TextTransformer):
        tower = model.text
        pool = tower.pool_type
        if tower.cls_emb is not None or getattr(tower, "use_pad_mask", False):
            return None
    else:
        return None
    return tower if pool == "argmax" and getattr(tower, "attn_mask", None) is not None else None


def _plain_blocks(transformer):
    """A transformer's blocks when each is a plain self-attention ResidualAttentionBlock
    (batch-first nn.MultiheadAttention), which `_sdpa_block` computes exactly; else None."""
    import torch
    from open_clip.transformer import ResidualAttentionBlock
    blocks = list(getattr(transformer, "resblocks", []))
    if not getattr(transformer, "batch_first", False) or not blocks:
        return None
    for b in blocks:
        a = getattr(b, "attn", None)
        if (type(b) is not ResidualAttentionBlock or hasattr(b, "ln_1_kv") or not isinstance(a, torch.nn.MultiheadAttention)
                or not a.batch_first or not a._qkv_same_embed_dim or a.bias_k is not None):
            return None
    return blocks


def _sdpa_block(block, x, causal=False, mask=None, rows=None):
    """A plain ResidualAttentionBlock (see _plain_blocks) on [N, L, W] through SDPA, with
    open_clip's causal mask given as is_causal (flash attention on a GPU) instead of an additive
    [L, L] float mask, a boolean mask [N, L, L] (prefix trees, see PrefixPacks), or no mask
    (image towers; ~5% faster than nn.MultiheadAttention's own path on a ViT-B/16 on CPU).
    rows: the output of some positions only (a tower's last block, where only the pooled ones
    count): keys and values for every position, the query, output projection and MLP for these
    alone. An int: one position that attends every position (the last one under the causal
    mask, -1; the class token without a mask, 0) -> [N, 1, W]; a [N, E] index tensor (with a
    mask) -> [N, E, W]."""
    import torch
    import torch.nn.functional as F
    attn = block.attn
    n, length, width = x.shape
    heads = attn.num_heads
    h = block.ln_1(x)
    w, b = attn.in_proj_weight, attn.in_proj_bias
    if rows is None:
        q, k, v = F.linear(h, w, b).chunk(3, dim=-1)
    else:
        if isinstance(rows, int):
            one = slice(rows, rows + 1 if rows != -1 else None)

            def take(t):
                return t[:, one]
        else:
            def take(t):
                return torch.gather(t, 1, rows[..., None].expand(-1, -1, t.shape[-1]))
        q = F.linear(take(h), w[:width], None if b is None else b[:width])
        k, v = F.linear(h, w[width:], None if b is None else b[width:]).chunk(2, dim=-1)
        x = take(x)
        mask = take(mask) if mask is not None else None
    q, k, v = (t.reshape(n, -1, heads, width // heads).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask[:, None],
                                       is_causal=causal and rows is None)
    x = x + block.ls_1(attn.out_proj(y.transpose(1, 2).reshape(n, -1, width)))
    return x + block.ls_2(block.mlp(block.ln_2(x)))


def _class_token_blocks(visual):
    """The blocks of an open_clip VisionTransformer that pools its class token alone (pool
    'tok', no attention pooling, no token outputs, plain blocks), for _openclip_image_pooled;
    else None (EVA02's timm tower, SigLIP's attention-pooled one: the full forward)."""
    from open_clip.transformer import VisionTransformer
    if (type(visual) is not VisionTransformer or getattr(visual, "attn_pool", None) is not None
            or getattr(visual, "pool_type", None) != "tok" or getattr(visual, "output_tokens", False)
            or not hasattr(visual, "_embeds")):
        return None
    return _plain_blocks(visual.transformer)


def _openclip_image_pooled(visual, blocks, pixels):
    """open_clip VisionTransformer.forward, its blocks through SDPA, the last one run for the
    class token only (the pooled one): ~7% fewer image FLOPs for 12 blocks, 2.6% for 32."""
    x = visual._embeds(pixels)
    for block in blocks[:-1]:
        x = _sdpa_block(block, x)
    x = visual.ln_post(_sdpa_block(blocks[-1], x, rows=0)[:, 0])  # per-token LayerNorm: before or after the pool alike
    return x @ visual.proj if visual.proj is not None else x


def _openclip_text_packed(tower, blocks, tok, pos, path, creator, eot, slot):
    """open_clip encode_text of the texts of PrefixPacks arrays (on the device), in slot order."""
    cast = tower.transformer.get_cast_dtype()
    x = tower.token_embedding(tok).to(cast) + tower.positional_embedding[pos].to(cast)
    mask = prefix_tree_mask(pos, path, creator)
    for block in blocks[:-1]:
        x = _sdpa_block(block, x, mask=mask)
    x = tower.ln_final(_sdpa_block(blocks[-1], x, mask=mask, rows=eot))
    return _project_text(tower, x.reshape(-1, x.shape[-1])[slot])


def _openclip_text_trimmed(tower, blocks, ids, exact_length=False):
    """open_clip encode_text on a [N, L] batch with L <= context length (tower: see
    _openclip_causal_text_tower; blocks: _plain_blocks of its transformer, or None).
    exact_length: the caller promises every text ends (EOT) at the last column, as in the
    project's batches of one exact length; the last block then runs for that position only
    (the pooled one): ~7% fewer text FLOPs for 12 blocks, and no check on the device."""
    import torch
    cast = tower.transformer.get_cast_dtype()
    n = ids.shape[1]
    x = tower.token_embedding(ids).to(cast) + tower.positional_embedding[:n].to(cast)
    eot = ids.argmax(dim=-1)  # EOT has the largest id
    if blocks is None:
        x = tower.transformer(x, attn_mask=tower.attn_mask[:n, :n])
    elif exact_length:
        for block in blocks[:-1]:
            x = _sdpa_block(block, x, causal=True)
        return _project_text(tower, tower.ln_final(_sdpa_block(blocks[-1], x, causal=True, rows=-1))[:, 0])
    else:
        for block in blocks:
            x = _sdpa_block(block, x, causal=True)
    x = tower.ln_final(x)
    return _project_text(tower, x[torch.arange(x.shape[0], device=x.device), eot])


def _project_text(tower, x):
    import torch
    proj = tower.text_projection
    if proj is not None:
        x = proj(x) if isinstance(proj, torch.nn.Linear) else x @ proj
    return x


def _transformers_version():
    import transformers
    return tuple(int(p) for p in transformers.__version__.split(".")[:2])


def _transformers_dtype_kwarg(dtype):
    return {"dtype": dtype} if _transformers_version() >= (4, 56) else {"torch_dtype": dtype}


def _pil_image_processor_kwarg():
    """Pin the PIL (4.x "slow") image processor: transformers 5 defaults to the torchvision one,
    whose resize differs by up to one uint8 level (2/255 after SigLIP's normalisation)."""
    return {"backend": "pil"} if _transformers_version() >= (5, 0) else {"use_fast": False}


def _siglip_text_tower(model):
    """The SigLIP/SigLIP2 text tower (4.x: model.text_model.text_model's transformer; 5.x:
    model.text_model) when its parts are the ones _siglip_text_last computes; else None."""
    tower = getattr(model, "text_model", None)
    tower = getattr(tower, "text_model", tower)
    layers = getattr(getattr(tower, "encoder", None), "layers", None)
    if tower is None or not layers or not all(hasattr(tower, a) for a in ("embeddings", "final_layer_norm", "head")):
        return None
    for layer in layers:
        a = getattr(layer, "self_attn", None)
        if (not all(hasattr(layer, n) for n in ("layer_norm1", "layer_norm2", "mlp")) or a is None
                or not all(hasattr(a, n) for n in ("q_proj", "k_proj", "v_proj", "out_proj", "num_heads", "head_dim", "scale"))):
            return None
    return tower


def _siglip_text_last(tower, ids):
    """SigLIP get_text_features without an attention mask, with the last layer run for the
    pooled (last) position only: keys and values for every position, the rest for one
    (~7% fewer text FLOPs for 12 layers, 3.5% for 24)."""
    import torch.nn.functional as F
    x = tower.embeddings(input_ids=ids)
    layers = tower.encoder.layers
    for layer in layers[:-1]:
        x = layer(x, None)
        x = x[0] if isinstance(x, tuple) else x
    last, n = layers[-1], x.shape[0]
    a = last.self_attn
    h = last.layer_norm1(x)
    q, k, v = a.q_proj(h[:, -1:]), a.k_proj(h), a.v_proj(h)
    q, k, v = (t.reshape(n, -1, a.num_heads, a.head_dim).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, scale=a.scale).transpose(1, 2).reshape(n, 1, -1)
    x = x[:, -1:] + a.out_proj(y)
    x = x + last.mlp(last.layer_norm2(x))
    return tower.head(tower.final_layer_norm(x)[:, 0])


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

    tower = _siglip_text_tower(model)

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
    if protocol == "reference":
        enc.pad_length = lambda call_lengths: max(call_lengths)  # padding=True: longest of the call
        enc.pad_needs_lengths = True
    else:
        enc.pad_length = lambda call_lengths: max_len  # padding="max_length" as trained
    enc.info = {"text_length": "longest in call" if protocol == "reference" else max_len, "lowercase": bool(lowercase),
                "text_last_layer_pooled_position_only": tower is not None}
    return enc


class SiglipImageTransform:
    """PIL image -> pixel_values (and any extra inputs the processor makes), picklable."""

    def __init__(self, image_processor):
        self.image_processor = image_processor

    def __call__(self, img):
        out = self.image_processor(images=img, return_tensors="pt")
        out = {k: v[0] for k, v in out.items()}
        return out["pixel_values"] if len(out) == 1 else out


class PixelSplit:
    """A model's image preprocessing cut in two, for speed: `geometry` (PIL RGB image -> uint8
    [3, H, W]: resize, crop; picklable, runs in the decoding workers) and `to_input` (a uint8
    batch -> the model's input on its device: scale to [0, 1], subtract the mean, divide by the
    std). The arithmetic repeats the CPU transform's float operations in the same order and
    precision (IEEE-exact on both: no reciprocals, no fused ops), so the input is bit-identical
    (`check_pixel_split` proves it on the model's device at load, else the CPU transform stays).
    Workers thus skip the float work and send 4x fewer bytes, and `key` names the geometry:
    models with equal keys get equal pixels (see PixelMemory).
    >>> split = pixel_split_openclip(preprocess)          # Resize, CenterCrop | ToTensor, Normalize
    >>> x = split.to_input(torch.stack([split.geometry(img)]), "cuda", torch.bfloat16)
    """

    def __init__(self, geometry, key, rescale, mean, std):
        self.geometry, self.key, self.rescale = geometry, key, rescale  # rescale: ("div32", 255) or ("mul64", 1/255)
        self.mean, self.std = [float(v) for v in mean], [float(v) for v in std]
        self._constants = {}  # (device, rescale, mean, std) -> their tensors, made once: a copy per batch would stall the GPU

    def to_input(self, u8, device, dtype):
        import torch
        kind, value = self.rescale
        key = (str(device), self.rescale, tuple(self.mean), tuple(self.std))
        if key not in self._constants:
            wide = torch.float32 if kind == "div32" else torch.float64
            self._constants[key] = (
                torch.full((1, 1, 1, 1), value, dtype=wide, device=device),
                torch.tensor(self.mean, dtype=torch.float32, device=device).view(1, -1, 1, 1),
                torch.tensor(self.std, dtype=torch.float32, device=device).view(1, -1, 1, 1))
        scale, mean, std = self._constants[key]
        x = u8.to(device, non_blocking=True)
        if kind == "div32":  # torchvision to_tensor: float32(x).div(255); a device divisor, never a reciprocal
            x = x.to(torch.float32) / scale
        else:  # transformers rescale: float32(float64(x) * factor)
            x = (x.to(torch.float64) * scale).to(torch.float32)
        return ((x - mean) / std).to(dtype)


class _PilToUint8:
    """PIL geometry transforms, then the image as uint8 [3, H, W] (to_tensor before its division)."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        import numpy as np
        import torch
        for t in self.transforms:
            img = t(img)
        if img.mode != "RGB":
            raise ValueError(f"expected an RGB image after {self.transforms}, got mode {img.mode}")
        return torch.from_numpy(np.array(img, dtype=np.uint8, copy=True)).permute(2, 0, 1).contiguous()


def pixel_split_openclip(preprocess):
    """PixelSplit of an open_clip preprocess Compose([Resize/CenterCrop/MaybeConvertMode...,
    (Maybe)ToTensor, Normalize]); None for any other shape."""
    from torchvision import transforms as T
    steps = list(getattr(preprocess, "transforms", []))
    known = (T.Resize, T.CenterCrop)
    if (len(steps) < 3 or type(steps[-2]).__name__ not in ("ToTensor", "MaybeToTensor")
            or not isinstance(steps[-1], T.Normalize)
            or not all(isinstance(t, known) or type(t).__name__ == "MaybeConvertMode" for t in steps[:-2])):
        return None
    geometry = steps[:-2]
    key = "torchvision:" + "|".join(f"MaybeConvertMode({t.mode})" if type(t).__name__ == "MaybeConvertMode" else repr(t)
                                    for t in geometry)
    return PixelSplit(_PilToUint8(geometry), key, ("div32", 255.0), steps[-1].mean, steps[-1].std)


class _HfGeometry:
    """A transformers image processor run without rescale and normalize: uint8 [3, H, W]."""

    def __init__(self, image_processor):
        self.image_processor = image_processor

    def __call__(self, img):
        import torch
        x = self.image_processor(images=img, do_rescale=False, do_normalize=False, return_tensors="pt")["pixel_values"][0]
        if x.dtype != torch.uint8:
            raise ValueError(f"{type(self.image_processor).__name__} without rescale gave {x.dtype}, not uint8")
        return x


def pixel_split_siglip(image_processor):
    """PixelSplit of a PIL SigLIP image processor (transformers 4.x SiglipImageProcessor, 5.x
    SiglipImageProcessorPil) that resizes, rescales and normalises, without a center crop, and
    returns pixel_values only; None for any other processor."""
    ip = image_processor
    if (type(ip).__name__ not in ("SiglipImageProcessor", "SiglipImageProcessorPil")
            or not (ip.do_resize and ip.do_rescale and ip.do_normalize) or getattr(ip, "do_center_crop", False)):
        return None
    key = f"transformers:{type(ip).__name__}:{ip.size}:{int(ip.resample)}:{getattr(ip, 'do_convert_rgb', None)}"
    return PixelSplit(_HfGeometry(ip), key, ("mul64", float(ip.rescale_factor)), ip.image_mean, ip.image_std)


def check_pixel_split(enc, split):
    """`split` when its device input equals enc.image_transform's, bit for bit, on probe images
    (odd sizes, full value range) on the model's device; else None (the CPU transform is used)."""
    import numpy as np
    import torch
    from PIL import Image
    if split is None:
        return None
    rng = np.random.default_rng(0)
    probes = [Image.fromarray(rng.integers(0, 256, size, dtype=np.uint8)) for size in ((97, 131, 3), (300, 211, 3))]
    try:
        for img in probes:
            want = enc.image_transform(img)
            if not torch.is_tensor(want):
                return None
            got = split.to_input(split.geometry(img)[None], enc.device, torch.float32)[0]
            if got.shape != want.shape or not torch.equal(got.cpu(), want.float()):
                return None
    except Exception:  # any surprise: keep the CPU transform
        return None
    return split


MODEL_LOADERS = {"openclip": load_openclip, "siglip": load_siglip}


def load_model(spec, protocol="corrected", device="cpu", dtype=None):
    """Build the Encoder for one model spec through the MODEL_LOADERS registry."""
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
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    enc = MODEL_LOADERS[spec["type"]](spec, protocol, device, torch_dtype)
    enc.name, enc.type, enc.protocol = spec["name"], spec["type"], protocol
    enc.tokenizer_key = tokenizer_key(enc.type, enc.tokenizer_identity, enc.tokenize)
    enc.pixels = check_pixel_split(enc, enc.pixels)
    enc.info = dict(enc.info, pixels_on_device=enc.pixels is not None)
    return enc


# Texts that tell tokenizations apart: case, punctuation, digits, HTML entities, non-ASCII, and
# one longer than any context (truncation).
_TOKENIZER_PROBES = ["A Red BUS, parked & waiting at 10:45!", "Ünïcödé café — naïve “quotes” &amp; 3½ emojis 🚌",
                     " ".join(f"w{k}" for k in range(120))]
_TOKEN_TABLES = {}


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


def prepare_openclip(spec, protocol):
    """The tokenizer of an open_clip model (its pixels need the model built: None here)."""
    import open_clip
    _check_openclip_name(spec["model_name"])
    tokenizer = open_clip.get_tokenizer(spec["model_name"])
    context = tokenizer.context_length
    # Tokenized as a causal CLIP tower's texts (to EOT): a tower that is not gets another key.
    tokenize = _openclip_tokenize_fn(tokenizer, context, True)
    return Prepared(spec["name"], tokenizer_key("openclip", _openclip_tokenizer_identity(tokenizer, context), tokenize),
                    tokenize, None)


def prepare_siglip(spec, protocol):
    """The tokenizer and pixel geometry of a SigLIP/SigLIP2 model: small files, no weights."""
    from transformers import AutoConfig
    model_id = spec["model_id"]
    tok, image_processor = _siglip_preprocessors(model_id)
    tokenize, identity, _, _ = _siglip_tokenize_fn(tok, spec, protocol, AutoConfig.from_pretrained(model_id).model_type)
    return Prepared(spec["name"], tokenizer_key("siglip", identity, tokenize), tokenize, pixel_split_siglip(image_processor))


MODEL_PREPARERS = {"openclip": prepare_openclip, "siglip": prepare_siglip}  # same keys as MODEL_LOADERS
_LAST_PLAN = []  # [(token table, rows digest, size, packs per batch), plan]: the next model of the family reuses it
_LAST_CALLS = []  # [(build, records, rank, world), RunCalls]: the next model of the run adopts them (ModelRun.pairs)


def shared_token_table(key):
    """The TokenTable of one tokenization (`Encoder.tokenizer_key`: the tokenizer's class, vocab
    size, length limit, casing, and its ids for probe texts), shared by the models of a process
    that tokenize alike (the paper's five open_clip models tokenize each text once). One table
    is kept at a time."""
    if key not in _TOKEN_TABLES:
        _TOKEN_TABLES.clear()
        _TOKEN_TABLES[key] = TokenTable()
    return _TOKEN_TABLES[key]


def install_token_table(key, table):
    """Make `table` (filled ahead, see Lookahead) the shared table of its tokenization."""
    _TOKEN_TABLES.clear()
    _TOKEN_TABLES[key] = table


def forget_token_tables():
    """Drop the shared TokenTables, the last prefix plan, the last run's calls and score-file
    layout (a fresh process's state: bench.py times tokenizing and building the pairs too)."""
    _TOKEN_TABLES.clear()
    _LAST_PLAN.clear()
    _LAST_CALLS.clear()
    _SCORE_LAYOUT.clear()


# ---------------------------------------------------------------------------
# 6. Batched encoding: images through DataLoader workers, texts deduplicated
# ---------------------------------------------------------------------------

def open_rgb(path):
    """Decode an image fully and convert it to RGB (grayscale, CMYK, palette, alpha)."""
    from PIL import Image
    with Image.open(path) as img:
        img.load()  # truncated files fail here, not later in a worker's transform
        if img.mode == "P" and "transparency" in img.info:
            img = img.convert("RGBA")
        return img.convert("RGB")


class _ImageFiles:
    """Dataset of (index, transformed image or None, error or None); bad files never raise."""

    def __init__(self, paths, transform):
        self.paths, self.transform = paths, transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        try:
            if os.path.getsize(self.paths[i]) == 0:
                raise OSError("empty file")
            return i, self.transform(open_rgb(self.paths[i])), None
        except Exception as e:  # any unreadable image is reported, never fatal
            return i, None, f"{type(e).__name__}: {e}"


def _collate_images(items):
    import torch
    good = [(i, x) for i, x, err in items if err is None]
    bad = [(i, err) for i, x, err in items if err is not None]
    if not good:
        return [], None, bad
    xs = [x for _, x in good]
    if isinstance(xs[0], dict):
        batch = {k: torch.stack([x[k] for x in xs]) for k in xs[0]}
    else:
        batch = torch.stack(xs)
    return [i for i, _ in good], batch, bad


def default_num_workers():
    """All CPUs but one (for the main process), at most 32: decoding bounds small models."""
    return max(0, min(32, (os.cpu_count() or 1) - 1))


def resolve_text_batch_size(value, device):
    """TEXT_BATCH_SIZE constant -> int: "auto" = 2048 on CUDA (fewer, larger launches), 64 on
    CPU (measured fastest there, BENCHMARKS.md)."""
    if value in (None, "auto"):
        return 2048 if str(device).startswith("cuda") else 64
    if not isinstance(value, int) or value < 1:
        raise ModelError(f"TEXT_BATCH_SIZE must be a positive int or 'auto', got {value!r}")
    return value


class _DeviceRows:
    """Embeddings computed on the device, put into a table on the device (`out`, a _Rows)
    every `flush_rows` rows, and handed to the cache writer (if any), which copies them to the
    host in its own thread. Nothing here waits for the device: the GPU queue never drains
    while the host prepares the next batch (a copy to the host per flush did: with the table
    on the host, rounding and storing 1.7M texts' rows took ~6 s of a 40,000-image run's host
    time per model, and scoring them there ~12 s).
    >>> rows = _DeviceRows(enc, out, writer, keys.__getitem__); rows.add(idx, emb); rows.flush()
    """

    def __init__(self, enc, out, writer=None, key_of=None, flush_rows=16384):
        if writer is not None:  # a cache chunk is written as soon as it is full (resume granularity)
            flush_rows = min(flush_rows, writer.cache.chunk_rows)
        self.enc, self.out, self.writer, self.key_of, self.flush_rows = enc, out, writer, key_of, flush_rows
        self.items, self.n = [], 0

    def add(self, idx, emb):
        self.items.append((list(idx), emb))
        self.n += len(idx)
        if self.n >= self.flush_rows:
            self.flush()

    def flush(self):
        import torch
        if not self.items:
            return
        idx = [i for ii, _ in self.items for i in ii]
        emb = torch.cat([e for _, e in self.items]).to(self.enc.storage_dtype)
        self.out.put(idx, emb)
        if self.writer is not None:
            self.writer.add([self.key_of(i) for i in idx], emb)
        self.items, self.n = [], 0


def _to_device(host, device):
    """A host tensor copied to `device` without waiting for the device: through pinned memory,
    non-blocking (a copy from pageable memory waits for the device's queue to drain; the pinned
    copy is kept by torch until the transfer is done)."""
    import torch
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _index_on(idx, device):
    """A LongTensor of idx on `device`, without waiting for the device."""
    import torch
    return _to_device(torch.as_tensor(idx, dtype=torch.long), device)


class _Rows:
    """A [n, D] table filled in pieces, on `device` in `dtype`; D is learnt from the first piece.
    Should the device have no room for it, it is made on the host instead (and says so)."""

    def __init__(self, n, fill=0.0, device="cpu", dtype=None):
        import torch
        self.n, self.fill, self.device, self.dtype, self.data = n, fill, torch.device(device), dtype, None

    def put(self, idx, vectors):
        import torch
        if self.data is None:
            dtype = self.dtype or torch.float32
            try:
                self.data = torch.full((self.n, vectors.shape[1]), self.fill, dtype=dtype, device=self.device)
            except torch.cuda.OutOfMemoryError:
                print(f"warning: no room on {self.device} for {self.n} x {vectors.shape[1]} embeddings: kept on "
                      f"the host (slower scoring)", file=sys.stderr)
                self.device = torch.device("cpu")
                self.data = torch.full((self.n, vectors.shape[1]), self.fill, dtype=dtype)
        self.data[_index_on(idx, self.device)] = vectors.to(self.device, self.data.dtype)

    def tensor(self):
        import torch
        return self.data if self.data is not None else torch.full((self.n, 1), self.fill, device=self.device)


def image_cache_key(path):
    """Path, size and mtime: an edited or replaced image is never served from the cache."""
    st = os.stat(path)
    return f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"


def image_cache_keys(paths):
    """{index: image_cache_key} of the paths that exist (a missing file: its loader reports it)."""
    keys = {}
    for i, p in enumerate(paths):
        try:
            keys[i] = image_cache_key(p)
        except OSError:
            pass
    return keys


def resolve_pixel_memory(value):
    """PIXEL_MEMORY_GB constant -> bytes per process: "auto" = a quarter of the memory this
    process may use (the machine's, or a smaller cgroup limit: containers, SLURM), shared
    by the processes torchrun starts on the node; 0 = off."""
    if value in (None, "auto"):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return 0
        for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
            try:
                with open(limit_file) as f:
                    total = min(total, int(f.read().strip()))
            except (OSError, ValueError):
                pass  # absent, or "max": no limit
        return total // 4 // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if not isinstance(value, (int, float)) or value < 0:
        raise ModelError(f"PIXEL_MEMORY_GB must be a number >= 0 or 'auto', got {value!r}")
    return int(value * 2 ** 30)


class PixelMemory:
    """uint8 pixels (PixelSplit.geometry's output) of the images decoded in this process, kept in
    host memory for the later models with the same geometry (PixelSplit.key): the paper's five
    open_clip models share 224 px resize-and-crop pixels, its SigLIP 384 models theirs, its two
    SigLIP 224 models theirs, so each image is decoded once per geometry, not once per model.
    Keyed like the embedding cache (path, size, mtime); an unreadable file is not remembered (a
    later model tries it again, as its error may have been passing). Holds up to `budget` bytes: a geometry being decoded evicts the least recently used
    others, then, when still full, its further images are simply not kept (decoded again later).
    """

    def __init__(self, budget):
        import collections
        import threading
        self.budget, self.bytes = budget, 0
        self.geometries = collections.OrderedDict()  # key -> {"where": {image key: (chunk, row)}, "chunks", "bytes"}
        self.lock = threading.Lock()  # a Lookahead fills a later model's geometry from its own thread

    def get(self, key):
        """The remembered pixels of one geometry (most recently used now), or None."""
        with self.lock:
            if key in self.geometries:
                self.geometries.move_to_end(key)
            return self.geometries.get(key)

    def add(self, key, image_keys, batch, evict=True):
        """Keep a uint8 batch of one geometry; evict=False (pixels decoded ahead for a later
        model) keeps it only if it fits without dropping another geometry."""
        import torch
        if not image_keys or not torch.is_tensor(batch) or batch.dtype != torch.uint8:
            return
        if not evict and self.bytes + batch.numel() > self.budget:
            return  # (checked again below, under the lock)
        kept = batch.clone()  # out of pinned memory (outside the lock: it is the slow part)
        with self.lock:
            g = self.geometries.setdefault(key, {"where": {}, "chunks": [], "bytes": 0})
            self.geometries.move_to_end(key)
            while evict and self.bytes + kept.numel() > self.budget and len(self.geometries) > 1:
                old = next(iter(self.geometries))
                if old == key:
                    break
                self.bytes -= self.geometries.pop(old)["bytes"]
            if self.bytes + kept.numel() > self.budget:
                return  # full: these images are decoded again by a later model
            g["chunks"].append(kept)
            g["bytes"] += kept.numel()
            self.bytes += kept.numel()
            for r, k in enumerate(image_keys):
                if k is not None:
                    g["where"][k] = (len(g["chunks"]) - 1, r)

    @staticmethod
    def batch(g, image_keys, pin=False):
        """uint8 [len(image_keys), 3, H, W] of remembered images of geometry `g` (a `get` result,
        held by the caller: an eviction meanwhile frees nothing it still uses), pinned for a GPU copy."""
        import torch
        first = g["chunks"][g["where"][image_keys[0]][0]]
        out = torch.empty((len(image_keys), *first.shape[1:]), dtype=torch.uint8, pin_memory=pin)
        for j, k in enumerate(image_keys):
            c, r = g["where"][k]
            out[j] = g["chunks"][c][r]
        return out


_PIXEL_MEMORY = []


def pixel_memory(budget):
    """The process's PixelMemory (created on first use; its budget follows the latest caller)."""
    if not _PIXEL_MEMORY:
        _PIXEL_MEMORY.append(PixelMemory(budget))
    memory = _PIXEL_MEMORY[0]
    with memory.lock:
        memory.budget = budget
        while memory.bytes > budget and memory.geometries:  # a smaller budget: least recently used go first
            memory.bytes -= memory.geometries.popitem(last=False)[1]["bytes"]
    return memory


def forget_pixels():
    """Drop remembered pixels (a fresh process's state: bench.py times decoding too)."""
    _PIXEL_MEMORY.clear()


def swap_process_state(state=None):
    """What one process keeps across its models (shared token tables, the last prefix plan,
    the last run's calls and pairs and score-file layout, remembered pixels), taken out and replaced by `state` (None: empty, a fresh process's):
    bench.py runs passes of one simulated run between passes that must start fresh."""
    old = {"token_tables": dict(_TOKEN_TABLES), "plan": list(_LAST_PLAN), "calls": list(_LAST_CALLS),
           "pixels": list(_PIXEL_MEMORY), "score_layout": list(_SCORE_LAYOUT)}
    state = state or {"token_tables": {}, "plan": [], "calls": [], "pixels": [], "score_layout": []}
    _TOKEN_TABLES.clear()
    _TOKEN_TABLES.update(state["token_tables"])
    _LAST_PLAN[:] = state["plan"]
    _LAST_CALLS[:] = state["calls"]
    _PIXEL_MEMORY[:] = state["pixels"]
    _SCORE_LAYOUT[:] = state["score_layout"]
    return old


class ImageEncoding:
    """Encoding of image files that runs beside other GPU work (the texts' encoding).

    `start()` opens the decoding worker processes, `poll()` encodes the batches they have
    ready without waiting, `finish()` encodes the rest and returns ([len(paths), D] float32,
    NaN rows for failures; {index: error}). CPU decoding thus overlaps the GPU's text batches,
    while every GPU call stays in the calling thread (a helper thread only hands the decoded
    batches over, and starts after all worker processes are forked). With an EmbeddingCache,
    images already encoded by this model (same path, size and mtime) are read from it, and
    new ones are saved to it as they are encoded.
    >>> job = ImageEncoding(enc, paths, cache=cache).start()
    >>> for batch in text_batches: encode(batch); job.poll()
    >>> emb, failed = job.finish()
    """
    _END = object()

    def __init__(self, enc, paths, batch_size=64, num_workers=None, desc="images", cache=None, pixel_memory_gb="auto"):
        self.enc, self.paths, self.batch_size, self.desc, self.cache = enc, paths, batch_size, desc, cache
        self.num_workers = default_num_workers() if num_workers is None else num_workers
        self.out, self.failed, self.keys = _Rows(len(paths), float("nan"), enc.device, enc.storage_dtype), {}, {}
        self.todo = list(range(len(paths)))
        self._queue = None
        budget = resolve_pixel_memory(pixel_memory_gb)
        self.memory = pixel_memory(budget) if enc.pixels is not None and budget > 0 else None
        if cache is not None or self.memory is not None:
            self.keys = image_cache_keys(paths)
        if cache is not None:
            have = [i for i in self.todo if i in self.keys]
            hit_pos, hit_emb = cache.lookup("image", [self.keys[i] for i in have])
            if hit_pos:
                self.out.put([have[p] for p in hit_pos], hit_emb)
            done = {have[p] for p in hit_pos}
            self.todo = [i for i in self.todo if i not in done]
        # Pixels decoded for an earlier model of this process with the same geometry: not decoded again.
        self.n_cached = len(paths) - len(self.todo)
        self._known = self.memory.get(enc.pixels.key) if self.memory is not None else None
        self.remembered = [i for i in self.todo if self._known is not None and self.keys.get(i) in self._known["where"]]
        if self.remembered:
            taken = set(self.remembered)
            self.todo = [i for i in self.todo if i not in taken]
        self.n_decoded, self.n_remembered = len(self.todo), len(self.remembered)

    def start(self):
        import queue
        import threading
        import torch
        if self._queue is not None or not (self.todo or self.remembered):
            return self
        self._writer = self.cache.writer("image") if self.cache is not None else None
        self._rows = _DeviceRows(self.enc, self.out, self._writer, self.keys.__getitem__)
        self._queue = queue.Queue(maxsize=4)  # bounded: decoded batches wait in the workers, not here
        self._ended, self._closed = False, threading.Event()
        # A worker decodes a whole batch: a small job gets smaller batches so every worker has one.
        per_worker = -(-len(self.todo) // max(1, self.num_workers))
        decode_batch = max(1, min(self.batch_size, per_worker))
        self._bar = progress_bar(-(-len(self.todo) // decode_batch) + -(-len(self.remembered) // self.batch_size),
                                 desc=f"{self.enc.name}: {self.desc}", unit="batch", min_total=20)
        if not self.todo:
            self._ended = True
            return self
        transform = self.enc.pixels.geometry if self.enc.pixels is not None else self.enc.image_transform
        loader = torch.utils.data.DataLoader(
            _ImageFiles([self.paths[i] for i in self.todo], transform),
            batch_size=decode_batch, shuffle=False, num_workers=self.num_workers,
            collate_fn=_collate_images, pin_memory=str(self.enc.device).startswith("cuda"), persistent_workers=False)
        batches = iter(loader)  # forks the workers, before the helper thread exists
        self._thread = threading.Thread(target=self._hand_over, args=(batches,), daemon=True)
        self._thread.start()
        return self

    def _hand_over(self, batches):
        try:
            for item in batches:
                if not self._put(item):
                    return  # closed: the loader's workers shut down with its iterator
        except BaseException as e:  # re-raised in the calling thread
            self._put(e)
        self._put(self._END)

    def _put(self, item):
        import queue
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                pass
        return False

    def close(self):
        """Stop early (the caller failed): the helper thread ends and the decoding workers with
        it; the cache chunks already whole are written."""
        if self._queue is None:
            return
        if not self._ended:
            self._closed.set()
            self._thread.join(timeout=30)
        if self._writer is not None:
            self._writer.abandon()
        self._bar.close()

    def _take(self, item):
        if item is self._END:
            self._ended = True
            return
        if isinstance(item, BaseException):
            raise item
        idx, batch, bad = item
        self.failed.update((self.todo[j], err) for j, err in bad)
        if self.memory is not None:
            self.memory.add(self.enc.pixels.key, [self.keys.get(self.todo[j]) for j in idx], batch)
        if idx:
            self._rows.add([self.todo[j] for j in idx], self._encode(batch))
        self._bar.update(1)

    def _encode(self, batch):
        """Embeddings of one batch: a uint8 one (enc.pixels.geometry's) gets its arithmetic on the device first."""
        import torch
        if torch.is_tensor(batch) and batch.dtype == torch.uint8:
            batch = self.enc.pixels.to_input(batch, self.enc.device, self.enc.dtype)
        return self.enc.encode_images(batch)

    def _recall(self):
        """Encode one batch of remembered pixels (False when none is left)."""
        if not self.remembered:
            return False
        take, self.remembered = self.remembered[:self.batch_size], self.remembered[self.batch_size:]
        pinned = str(self.enc.device).startswith("cuda")
        self._rows.add(take, self._encode(PixelMemory.batch(self._known, [self.keys[i] for i in take], pinned)))
        self._bar.update(1)
        return True

    def poll(self):
        """Encode the batches already decoded, and one remembered batch; never waits."""
        import queue
        if self._queue is None:
            return
        self._recall()
        while not self._ended:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            self._take(item)

    def finish(self):
        self.start()
        if self._queue is not None:
            try:
                while self._recall():
                    pass
                while not self._ended:
                    self._take(self._queue.get())
                self._rows.flush()
            except BaseException:
                self.close()
                raise
            self._bar.close()
            if self._writer is not None:
                self._writer.close()
        return self.out.tensor(), self.failed


def embed_images(enc, paths, batch_size=64, num_workers=None, desc="images", cache=None, pixel_memory_gb="auto"):
    """Encode image files: ([len(paths), D] float32 with NaN rows for failures, {index: error})."""
    return ImageEncoding(enc, paths, batch_size, num_workers, desc, cache, pixel_memory_gb).start().finish()


def _identity(x):
    return x


def padded_ids(flat, starts, lengths, width, fill):
    """[len(starts), width] int64 token ids: text i is flat[starts[i]:starts[i] + lengths[i]],
    cut to width or filled up with `fill`.
    >>> padded_ids(np.array([5, 6, 7, 8]), np.array([0, 2]), np.array([2, 2]), 3, -1)  # [[5, 6, -1], [7, 8, -1]]
    """
    import numpy as np
    cols = np.arange(width)
    if (lengths == width).all():
        return flat[starts[:, None] + cols]
    ids = np.full((len(starts), width), fill, dtype=np.int64)
    keep = cols[None, :] < np.minimum(lengths, width)[:, None]
    ids[keep] = flat[(starts[:, None] + cols)[keep]]
    return ids


def _upload_in_groups(items, device, max_ints=1 << 23):
    """(key, [int64 numpy arrays]) items -> (key, [the same arrays as views of device tensors]).
    The arrays of several items travel in one copy of up to max_ints values, which does not
    wait for the device (_to_device): a copy per batch costs a call each, and a copy from
    pageable memory drained the GPU's queue (16 times per model at 40,000 images)."""
    import numpy as np
    import torch

    def copied(group):
        flat = _to_device(torch.from_numpy(np.concatenate([a.ravel() for _, arrays in group for a in arrays])), device)
        offset = 0
        for key, arrays in group:
            views = []
            for a in arrays:
                views.append(flat[offset:offset + a.size].view(a.shape))
                offset += a.size
            yield key, views

    group, size = [], 0
    for key, arrays in items:
        group.append((key, arrays))
        size += sum(a.size for a in arrays)
        if size >= max_ints:
            yield from copied(group)
            group, size = [], 0
    if group:
        yield from copied(group)


def _pack(seqs):
    """Token id lists -> (flat int64 ids, int64 lengths): compact to pickle and to index."""
    import numpy as np
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lengths.sum()))
    return flat, lengths


class _TextChunks:
    """Dataset of tokenized chunks of a text list, packed (workers inherit the tokenizer by fork)."""

    def __init__(self, texts, tokenize, chunk):
        self.texts, self.tokenize, self.chunk = texts, tokenize, chunk

    def __len__(self):
        return -(-len(self.texts) // self.chunk)

    def __getitem__(self, n):
        return _pack(self.tokenize(self.texts[n * self.chunk:(n + 1) * self.chunk]))


class TokenTable:
    """Token ids of many texts in one flat array: `row[text]` -> a row whose ids are
    flat[starts[row]:starts[row] + lengths[row]].
    >>> table = TokenTable(); table.add(["a dog"], *_pack([[49406, 320, 1929, 49407]]))
    >>> table.ids("a dog")   # array([49406, 320, 1929, 49407])
    """

    def __init__(self):
        import numpy as np
        self.row = {}
        self.flat, self.starts, self.lengths = (np.empty(0, dtype=np.int64) for _ in range(3))
        self._parts = []

    def __contains__(self, text):
        return text in self.row

    def __len__(self):
        return len(self.row)

    def add(self, texts, flat, lengths):
        for t in texts:
            self.row[t] = len(self.row)
        self._parts.append((flat, lengths))

    def packed(self):
        """(flat, starts, lengths) over every text added so far."""
        import numpy as np
        if self._parts:
            flats, lens = zip(*self._parts)
            self.flat = np.concatenate([self.flat, *flats])
            self.lengths = np.concatenate([self.lengths, *lens])
            self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
            self._parts = []
        return self.flat, self.starts, self.lengths

    def ids(self, text):
        flat, starts, lengths = self.packed()
        r = self.row[text]
        return flat[starts[r]:starts[r] + lengths[r]]


LOOKAHEAD_STALL_S = 120  # a Lookahead job with no batch done for this long is abandoned (its model does the work itself)
PACK_NODES = 128  # tree nodes per prefix pack: larger shares a little more (1-2%), but its dense [M, M] tree mask costs attention FLOPs (~6% of a pack's at 128 on ViT-B-16 text, ~11% at 256); 0: no prefix packs (exact-length batches)
PACK_SORT_COLUMNS = 12  # texts are ordered by their first 12 ids (24 shared 0.1% more positions on the bench's texts, for 1.8 s more per 1.7M texts)
PACK_TOKENS_PER_TEXT = 16  # packs per batch = TEXT_BATCH_SIZE * this / PACK_NODES (a batch holds about as many positions as before)


class PrefixPacks:
    """Texts of a causal text tower packed as prefix trees: a shared token prefix is computed once.

    Under a causal mask the state of position p depends only on tokens 0..p, so texts that
    start alike ("a photo of a ...", a caption and its flips) can share those positions. Texts
    are sorted by their token ids (so a text's longest shared prefix is with the text before
    it) and cut into packs of at most `size` tree nodes; every node attends to its ancestors
    and itself (the tree mask), at the position of its depth. Embeddings equal the plain
    causal computation up to float rounding; nothing is approximated. On COCO-like texts
    about 40% of the token positions are shared prefixes.
    >>> plan = PrefixPacks(flat, starts, lengths, rows, size=128, packs_per_batch=8)
    >>> for texts, arrays in plan.batches(): emb = enc.encode_packs(*arrays)  # rows of `texts`
    """

    def __init__(self, flat, starts, lengths, rows, size=128, packs_per_batch=8, sort_columns=24):
        import numpy as np
        rows = np.asarray(rows, dtype=np.int64)
        lens = lengths[rows]
        if len(rows) and int(lens.max()) > size:
            raise ValueError(f"pack size {size} is below the longest text ({int(lens.max())} tokens)")
        self.flat, self.starts = flat, starts
        # Sorted by the first sort_columns ids (beyond them texts rarely share), several ids
        # packed in each sort key: any order is correct, since a text only takes from the
        # text before it what the two truly share.
        bits = int(flat.max() + 2).bit_length() if len(flat) else 1
        per_key = max(1, 63 // bits)
        keys = []
        for c0 in range(0, min(int(lens.max()) if len(rows) else 0, sort_columns), per_key):
            key = np.zeros(len(rows), dtype=np.int64)
            for c in range(c0, min(c0 + per_key, sort_columns)):
                ids = np.where(lens > c, flat[starts[rows] + np.minimum(c, lens - 1)] + 1, 0)  # past the end: 0, first
                key = (key << bits) | ids
            keys.append(key)
        order = np.lexsort(keys[::-1]) if keys else np.arange(len(rows))
        self.rows, self.lens, self.order = rows[order], lens[order], order
        # Common prefix with the text before, a column at a time over the pairs still equal.
        begin = starts[self.rows]
        lcp = np.zeros(len(rows), dtype=np.int64)
        live = np.arange(1, len(rows))
        live = live[np.minimum(self.lens[live], self.lens[live - 1]) > 0]
        c = 0
        while len(live):
            same = flat[begin[live] + c] == flat[begin[live - 1] + c]
            live = live[same]
            lcp[live] += 1
            c += 1
            live = live[np.minimum(self.lens[live], self.lens[live - 1]) > c]
        # Greedy packs over the sorted texts (a pack's first text brings its whole path): a
        # pack starting at text a ends at the last b with lens[a] + new nodes of a+1..b <= size.
        total = np.cumsum(self.lens - lcp)
        pack = np.empty(len(rows), dtype=np.int64)
        shared = lcp
        a = g = 0
        while a < len(rows):
            b = int(np.searchsorted(total, size - int(self.lens[a]) + int(total[a]), side="right"))
            pack[a:b] = g
            shared[a] = 0
            a, g = b, g + 1
        self.pack, self.shared, self.size, self.packs_per_batch = pack, shared, size, packs_per_batch
        self.n_packs = g
        self.n_tokens, self.n_nodes = int(self.lens.sum()), int((self.lens - shared).sum())

    def batches(self):
        """(positions into `rows` of the batch's texts, (tok, pos, path, creator, eot, slot)):
        tok/pos/creator [G, size] per node (token id, depth, batch-local text that created it);
        path [T, L] node index of each text's token at each depth (0 past its end); eot [G, E]
        the nodes where the pack's texts end (their pooled position); slot [T] each text's
        place in eot.flatten(). Pad nodes: token 0, depth 0, creator -1."""
        import numpy as np
        bounds = np.r_[np.searchsorted(self.pack, np.arange(0, self.n_packs, self.packs_per_batch)), len(self.pack)]
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            yield self.order[lo:hi], self._arrays(lo, hi)

    def _arrays(self, lo, hi):
        import numpy as np
        lens, shared, pack = self.lens[lo:hi], self.shared[lo:hi], self.pack[lo:hi]
        pack = pack - pack[0]
        n_texts, width = len(lens), int(lens.max())
        ids = padded_ids(self.flat, self.starts[self.rows[lo:hi]], lens, width, -1)
        new = lens - shared
        first = np.r_[True, pack[1:] != pack[:-1]]
        off = np.cumsum(new) - new  # batch-wide offset of each text's first new node
        off = off - np.maximum.accumulate(np.where(first, off, 0))  # ... within its pack
        # path[t, p]: the text that created the node of (t, p) is the last s <= t with shared[s] <= p.
        t_idx = np.arange(n_texts)
        src = np.maximum.accumulate(np.where(shared[:, None] <= np.arange(width)[None, :], t_idx[:, None], -1), axis=0)
        cols = np.arange(width)[None, :]
        path = off[src] + cols - shared[src]
        path = np.where(cols < lens[:, None], path, 0)
        n_packs = int(pack[-1]) + 1
        tok = np.zeros((n_packs, self.size), dtype=np.int64)
        pos = np.zeros((n_packs, self.size), dtype=np.int64)
        creator = np.full((n_packs, self.size), -1, dtype=np.int64)
        creator_t = np.repeat(t_idx, new)
        start = np.cumsum(new) - new
        depth = np.arange(int(new.sum())) - start[creator_t] + shared[creator_t]
        node = off[creator_t] + depth - shared[creator_t]
        tok[pack[creator_t], node] = ids[creator_t, depth]
        pos[pack[creator_t], node] = depth
        creator[pack[creator_t], node] = creator_t
        eot_node = path[t_idx, lens - 1]
        per_pack = np.bincount(pack, minlength=n_packs)
        rank = t_idx - (np.cumsum(per_pack) - per_pack)[pack]
        eot = np.zeros((n_packs, int(per_pack.max())), dtype=np.int64)
        eot[pack, rank] = eot_node
        slot = pack * eot.shape[1] + rank
        return tok, pos, path, creator, eot, slot


def prefix_tree_mask(pos, path, creator):
    """[G, M, M] bool: node j is an ancestor of node i (or i itself), from PrefixPacks arrays
    on any device. i's ancestor at depth d is path[creator[i], d]; pad nodes see themselves."""
    import torch
    g, m = pos.shape
    valid = creator >= 0
    anc = path[creator.clamp(min=0)]  # [G, M, L]
    at = torch.gather(anc, 2, pos[:, None, :].expand(g, m, m).clamp(max=anc.shape[2] - 1))
    mask = (at == torch.arange(m, device=pos.device)) & (pos[:, None, :] <= pos[:, :, None])
    mask &= valid[:, None, :] & valid[:, :, None]
    return mask | torch.eye(m, dtype=torch.bool, device=pos.device)


class TextCalls:
    """A TextBank's calls, flat: every call's texts one after another (`texts`; a text's slot is
    its place there) and where each call starts (`starts`). A tuple and a list per call made
    ~5M objects for the rebuttal's 2.6M calls at 40,000 records, which Python's garbage
    collector walked again and again: half the time of building the pairs.
    >>> calls = TextCalls(); calls.add(["a", "b"]); calls.add(["c"]); list(calls)
    [(0, ['a', 'b']), (2, ['c'])]
    """

    def __init__(self, texts=(), starts=()):
        self.texts, self.starts = list(texts), list(starts)

    def add(self, texts):
        self.starts.append(len(self.texts))
        self.texts.extend(texts)

    def __iter__(self):
        """(first slot, texts) per call."""
        for n, first in enumerate(self.starts):
            yield first, self.texts[first:self.starts[n + 1] if n + 1 < len(self.starts) else len(self.texts)]

    def __len__(self):
        return len(self.starts)

    def __eq__(self, other):
        return isinstance(other, TextCalls) and self.starts == other.starts and self.texts == other.texts

    def copy(self):
        return TextCalls(self.texts, self.starts)


class RunCalls:
    """An evaluation's text calls and pairs, built once per run: they depend on the records
    alone, so every model of the run adopts them (ModelRun.pairs), with what its TextBank
    derives from them: the keys of each padding and their rows in each token table (building
    and deriving took ~4 s per model at 40,000 images)."""

    def __init__(self, calls, pairs):
        self.calls, self.pairs = calls, pairs
        self.keys = {}  # TextBank._padding() -> (keys, slot -> key row)
        self.table_rows = {}  # (id(token table), TextBank._padding()) -> (the table, each key's row in it)


class TextBank:
    """Texts to encode, deduplicated, each padded exactly as the call it belongs to pads it.

    Register every text call first (`add_call` returns one slot id per text), then `encode`
    once: unique (text, padded length) pairs are tokenized in one pass and encoded in large
    batches grouped by padded length, so batching never changes an embedding.
    >>> bank = TextBank(enc)
    >>> slots = bank.add_call(["a red bus", "a blue bus"])   # one published call
    >>> emb, rows = bank.encode(batch_size=512)             # emb[rows[slots]] are the vectors
    """

    def __init__(self, enc, num_workers=0):
        self.enc, self.num_workers = enc, default_num_workers() if num_workers is None else num_workers
        self.calls = TextCalls()
        self.run_calls = None  # the RunCalls these calls are, once shared by the models of a run
        self.n_unique = self.n_encoded = 0
        self.seconds = {}  # wall-clock time of encode's phases: where a run's time went
        self.positions = {}  # token positions of the encoded texts, and how many were computed (prefix sharing)

    @property
    def n_slots(self):
        return len(self.calls.texts)

    def add_call(self, texts, batch=None):
        """Register one published `encode_text` call; returns a slot per text. An empty list
        makes no call (as published). batch: the published script's text batch inside a call
        (64, or 512 in the rebuttal): each batch of the call is padded on its own."""
        first = self.n_slots
        step = batch or len(texts)
        for b in range(0, len(texts), max(step, 1)):
            self.calls.add(texts[b:b + step])
        return list(range(first, self.n_slots))

    def _tokenize(self, texts, tokens, chunk=2048):
        """Add the texts not yet in `tokens` (a TokenTable); large jobs in DataLoader worker
        processes (tokenizers are pure Python and would otherwise bound a GPU run). Returns the
        seconds spent forking those workers (a cost per run, not per text: reported apart)."""
        import torch
        texts = [t for t in dict.fromkeys(texts) if t not in tokens]
        chunks = _TextChunks(texts, self.enc.tokenize, chunk)
        workers = self.num_workers if len(texts) > 8 * chunk else 0
        loader = torch.utils.data.DataLoader(chunks, batch_size=None, num_workers=workers, collate_fn=_identity)
        t0 = time.perf_counter()
        loader = iter(loader)  # forks the workers
        forks = time.perf_counter() - t0
        for n, (flat, lengths) in enumerate(progress(loader, total=len(chunks), desc=f"{self.enc.name}: tokenize",
                                                     unit="chunk", min_total=50)):
            tokens.add(texts[n * chunk:(n + 1) * chunk], flat, lengths)
        return forks

    def adopt(self, run_calls):
        """Take a RunCalls' calls as this bank's (made for another model of the run)."""
        self.calls, self.run_calls = run_calls.calls.copy(), run_calls

    def _padding(self):
        """What a text's padding depends on: one length for all, or (published SigLIP) the token
        lengths of its call under this tokenizer; None when that cannot be shared."""
        if not self.enc.pad_needs_lengths:
            return "fixed", self.enc.pad_length(None)
        return ("lengths", self.enc.tokenizer_key) if self.enc.tokenizer_key is not None else None

    def _keys(self, tokens):
        """(unique (text, padded length) keys, the slot -> key row map, seconds forking
        tokenizers). The same for every model of a run that pads alike: made once for its
        RunCalls (a call padded to its longest text needs its texts tokenized first)."""
        padding = self._padding()
        shared = self.run_calls is not None and padding is not None
        if shared and padding in self.run_calls.keys:
            return (*self.run_calls.keys[padding], 0.0)
        forks = 0.0
        if self.enc.pad_needs_lengths:  # published SigLIP padding: the call's longest text
            forks = self._tokenize(self.calls.texts, tokens)
        keys, rows = self._make_keys(tokens)
        if shared:
            self.run_calls.keys[padding] = keys, rows
        return keys, rows, forks

    def _make_keys(self, tokens):
        import numpy as np
        key_row, keys = {}, []
        rows = np.empty(self.n_slots, dtype=np.int64)
        fixed = None if self.enc.pad_needs_lengths else self.enc.pad_length(None)
        lengths = tokens.packed()[2] if self.enc.pad_needs_lengths else None
        for first, texts in self.calls:
            if not texts:
                continue
            pad = self.enc.pad_length([int(lengths[tokens.row[t]]) for t in texts]) if self.enc.pad_needs_lengths else fixed
            for j, t in enumerate(texts):
                key = (t, pad)
                row = key_row.get(key)
                if row is None:
                    row = key_row[key] = len(keys)
                    keys.append(key)
                rows[first + j] = row
        return keys, rows

    def encode(self, batch_size=512, desc="texts", cache=None, beside=None, then=None):
        """([unique keys, D] float32 embeddings, slot -> row). `beside`: an ImageEncoding
        started once the texts are tokenized and polled between text batches; `then`: called
        at that point too, when there are texts to encode (ModelRun starts a Lookahead)."""
        import numpy as np
        key = self.enc.tokenizer_key
        tokens = shared_token_table(key) if key is not None else TokenTable()
        t0 = time.perf_counter()
        keys, rows, forks = self._keys(tokens)
        out = _Rows(len(keys), 0.0, self.enc.device, self.enc.storage_dtype)
        todo = list(range(len(keys)))
        if cache is not None:
            cache_keys = [f"{self.enc.text_key_tag}{pad if pad is not None else '-'}|{t}" for t, pad in keys]
            hit_pos, hit_emb = cache.lookup("text", cache_keys)
            if hit_pos:
                out.put(hit_pos, hit_emb)
            hits = set(hit_pos)
            todo = [k for k in todo if k not in hits]
        # Rows of every key in the token table: known when another model of the run with this
        # table and padding had them (nothing to tokenize or look up), else found after tokenizing.
        padding = self._padding()
        known = self.run_calls.table_rows.get((id(tokens), padding)) if self.run_calls else None
        if known is None or known[0] is not tokens:
            forks += self._tokenize((keys[k][0] for k in todo), tokens)
        packs = (PACK_NODES > 0 and self.enc.encode_packs is not None and bool(todo)
                 and all(keys[k][1] is None for k in todo))
        writer = cache.writer("text") if cache is not None and todo else None
        rows_out = _DeviceRows(self.enc, out, writer, cache_keys.__getitem__ if writer is not None else None)
        t_start = time.perf_counter()
        if beside is not None:
            beside.start()  # after the tokenizer's worker processes are done
        if then is not None and todo:
            then()
        t1 = time.perf_counter()
        if known is not None and known[0] is tokens:
            todo_rows = known[1][np.asarray(todo, dtype=np.int64)]
        else:
            todo_rows = np.fromiter((tokens.row[keys[k][0]] for k in todo), dtype=np.int64, count=len(todo))
            if self.run_calls is not None and len(todo) == len(keys) and padding is not None:
                self.run_calls.table_rows[(id(tokens), padding)] = (tokens, todo_rows)
        held = int(tokens.packed()[2][todo_rows].sum())
        if packs:  # planned while the image decoders start their work
            plan = self._plan(tokens, todo_rows, batch_size)
            self.positions = {"tokens": held, "computed": plan.n_nodes}
            n_batches, uploaded = -(-plan.n_packs // plan.packs_per_batch), self._packs_on_device(plan, todo)
        else:
            batches, texts_of = self._batches(todo, keys, tokens, batch_size, todo_rows)
            self.positions = {"tokens": held, "computed": held}  # (texts padded longer compute their padding too)
            n_batches, uploaded = len(batches), self._on_device(batches, texts_of, tokens)
        try:
            for batch, inputs in progress(uploaded, total=n_batches, desc=f"{self.enc.name}: {desc}", unit="batch",
                                          min_total=20):
                rows_out.add(batch, self.enc.encode_packs(*inputs) if packs else self.enc.encode_tokens(*inputs))
                if beside is not None:
                    beside.poll()
            rows_out.flush()
        except BaseException:
            if writer is not None:
                writer.abandon()
            raise
        if writer is not None:
            writer.close()
        self.seconds = {"lookup_and_tokenize": round(t_start - t0 - forks, 3), "start_tokenizers": round(forks, 3),
                        "start_images": round(t1 - t_start, 3), "texts": round(time.perf_counter() - t1, 3)}
        self.n_unique, self.n_encoded = len(keys), len(todo)
        return out.tensor(), rows

    @staticmethod
    def _batches(todo, keys, tokens, batch_size, text_row=None):
        """(batches, [(token table rows, padded length)] per batch): lists of at most batch_size
        keys sharing one padded length, padded keys first (by padding, then length), then the
        keys that may be cut to their batch's longest (pad None), grouped by exact token length:
        no padding at all. Stable: equal keys keep their order. text_row: the token-table row
        of each todo key, when the caller has them."""
        import numpy as np
        if text_row is None:
            text_row = np.fromiter((tokens.row[keys[k][0]] for k in todo), dtype=np.int64, count=len(todo))
        lengths = tokens.packed()[2][text_row]
        pads = np.fromiter((-1 if keys[k][1] is None else keys[k][1] for k in todo), dtype=np.int64, count=len(todo))
        cut = pads < 0
        group_length = np.where(cut, lengths, pads)
        order = np.lexsort((lengths, group_length, cut))  # the last key sorts first
        todo_sorted = np.asarray(todo, dtype=np.int64)[order]
        starts = np.flatnonzero((np.diff(cut[order]) != 0) | (np.diff(group_length[order]) != 0)) + 1
        batches, texts_of = [], []
        for lo, hi in zip(np.concatenate([[0], starts]), np.concatenate([starts, [len(todo)]])):
            for b in range(lo, hi, batch_size):
                sel = order[b:min(b + batch_size, hi)]
                batch = todo_sorted[b:min(b + batch_size, hi)].tolist()
                texts_of.append((text_row[sel], None if cut[sel[0]] else int(pads[sel[0]])))
                batches.append(batch)
        return batches, texts_of

    def _ids(self, text_rows, pad, tokens):
        """[n, L] int64 token ids of one batch: its texts' ids, padded to `pad` or, when None,
        cut to its longest text."""
        flat, starts, lengths = tokens.packed()
        lengths = lengths[text_rows]
        return padded_ids(flat, starts[text_rows], lengths, pad if pad is not None else int(lengths.max()), self.enc.pad_id)

    def _on_device(self, batches, texts_of, tokens, max_tokens=1 << 23):
        """(batch, (its token ids on the device, whether all its texts have the batch's exact
        length)) for each batch; the ids of several batches travel in one copy (_upload_in_groups)."""
        items = (((batch, texts_of[n][1] is None), [self._ids(*texts_of[n], tokens)]) for n, batch in enumerate(batches))
        for (batch, exact), (ids,) in _upload_in_groups(items, self.enc.device, max_tokens):
            yield batch, (ids, exact)

    @staticmethod
    def _plan(tokens, rows, batch_size):
        """PrefixPacks of these token-table rows; the last plan is kept, so the next model of a
        family (the paper's five open_clip models tokenize alike) encoding the same texts
        does not sort and pack them again (~2 s per 1.7M texts)."""
        import hashlib
        size = max(PACK_NODES, int(tokens.packed()[2][rows].max()))  # a pack holds at least one whole text
        ppb = max(1, batch_size * PACK_TOKENS_PER_TEXT // size)
        key = (hashlib.sha1(rows.tobytes()).hexdigest(), size, ppb)  # a table only grows: a row's ids never change
        if _LAST_PLAN and _LAST_PLAN[0][0] is tokens and _LAST_PLAN[0][1:] == key:
            return _LAST_PLAN[1]
        plan = PrefixPacks(*tokens.packed(), rows, size=size, packs_per_batch=ppb, sort_columns=PACK_SORT_COLUMNS)
        _LAST_PLAN[:] = [(tokens, *key), plan]
        return plan

    def _packs_on_device(self, plan, todo, max_ints=1 << 23):
        """(batch, its PrefixPacks arrays on the device) per batch of the plan, the arrays of
        several batches travelling in one copy (_upload_in_groups)."""
        import numpy as np
        todo = np.asarray(todo, dtype=np.int64)
        yield from _upload_in_groups(((todo[where].tolist(), arrays) for where, arrays in plan.batches()),
                                     self.enc.device, max_ints)


class CacheError(RuntimeError):
    pass


class EmbeddingCache:
    """Embeddings already computed, on disk, per model, protocol and dtype.

    Layout: <CACHE_DIR>/<model>-<hash>/ with meta.json and chunk files `image-*.npz` /
    `text-*.npz` (arrays `emb` and `keys`, the keys as UTF-8 JSON). The hash covers the model
    spec (and a local checkpoint's size and mtime), the protocol, the dtype and the open_clip,
    transformers and torch versions, so a changed setting never reuses stale entries. Chunks
    are written whole (temp file, then rename) every few thousand items, so an interrupted run
    resumes from its last chunk; a chunk that fails to load (truncated, corrupt) is reported,
    deleted, and its items re-encoded.
    """

    def __init__(self, root, enc, spec, chunk_rows=8192):
        import hashlib
        ident = {"spec": {k: v for k, v in spec.items() if k != "name"}, "protocol": enc.protocol,
                 "dtype": str(enc.dtype), "versions": package_versions(("open_clip_torch", "transformers", "torch"))}
        for key in ("pretrained", "model_id", "model_name"):
            path = str(spec.get(key, "")).replace("local-dir:", "")
            if path and os.path.exists(path):
                ident[f"{key}_stat"] = _tree_stat(path)
        digest = hashlib.sha1(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", spec.get("name", "model"))[:80]
        self.dir = os.path.join(root, f"{slug}-{digest}")
        os.makedirs(self.dir, exist_ok=True)
        meta = os.path.join(self.dir, "meta.json")
        if not os.path.exists(meta):
            write_json(meta, ident)
        self.chunk_rows = chunk_rows
        self.fp16 = enc.rounds_to_fp16  # then stored rows are fp16 values
        self._index = {}
        self.stats = {"image_hits": 0, "text_hits": 0, "corrupt_chunks": 0}

    def _load(self, kind):
        import numpy as np
        if kind in self._index:
            return self._index[kind]
        index, arrays = {}, []
        for name in sorted(os.listdir(self.dir)):
            path = os.path.join(self.dir, name)
            if name.startswith("." + kind + "-") and name.endswith(".tmp"):
                # Left by an interrupted write; a young one may be another process's write in progress.
                if time.time() - os.path.getmtime(path) > 3600:
                    os.unlink(path)
                continue
            if not (name.startswith(kind + "-") and name.endswith(".npz")):
                continue
            try:
                with np.load(path, allow_pickle=False) as z:
                    emb, keys = z["emb"], json.loads(bytes(z["keys"]).decode("utf-8"))
                if emb.ndim != 2 or len(keys) != emb.shape[0]:
                    raise CacheError(f"{len(keys)} keys for {emb.shape} embeddings")
            except Exception as e:  # any unreadable chunk is rebuilt, never trusted
                print(f"warning: cache chunk {path} is corrupt ({type(e).__name__}: {e}); "
                      f"deleted, its entries will be encoded again", file=sys.stderr)
                self.stats["corrupt_chunks"] += 1
                os.unlink(path)
                continue
            c = len(arrays)
            arrays.append(emb)
            for r, k in enumerate(keys):
                index[k] = (c, r)
        self._index[kind] = (index, arrays)
        return self._index[kind]

    def lookup(self, kind, keys):
        """(positions of keys found, their embeddings as a float32 tensor)."""
        import numpy as np
        import torch
        index, arrays = self._load(kind)
        pos = [p for p, k in enumerate(keys) if k in index]
        if not pos:
            return [], None
        rows = np.stack([arrays[index[keys[p]][0]][index[keys[p]][1]] for p in pos])
        self.stats[kind + "_hits"] += len(pos)
        return pos, torch.from_numpy(rows.astype(np.float32))

    def writer(self, kind):
        return _ChunkWriter(self, kind)


def _tree_stat(path):
    """Sizes and mtimes of a checkpoint file or folder (to notice replaced weights)."""
    if os.path.isfile(path):
        st = os.stat(path)
        return [st.st_size, st.st_mtime_ns]
    out = []
    for name in sorted(os.listdir(path)):
        st = os.stat(os.path.join(path, name))
        out.append([name, st.st_size, st.st_mtime_ns])
    return out


class _ChunkWriter:
    """Adds embeddings to a cache in chunk files, written by a thread of its own: the copy to the
    host and the file write overlap the device's work instead of holding up the loop that feeds
    it (~2.6 GB of fp16 text rows per model at 40,000 images). At most `ahead` chunks wait to
    be written; a failed write is raised by the next add or by close."""

    def __init__(self, cache, kind, ahead=2):
        self.cache, self.kind, self.ahead, self.keys, self.embs, self.n = cache, kind, ahead, [], [], 0
        self._pool, self._pending = None, []

    def add(self, keys, emb):
        self.keys.extend(keys)
        self.embs.append(emb)
        self.n += len(keys)
        if self.n >= self.cache.chunk_rows:
            self.flush()

    def flush(self):
        import concurrent.futures as cf
        import torch
        if not self.keys:
            return
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="lgip-cache-writer")
        self._pending.append(self._pool.submit(self._write, self.keys, torch.cat(self.embs)))
        self.keys, self.embs, self.n = [], [], 0
        while len(self._pending) > self.ahead:
            self._pending.pop(0).result()

    def _write(self, keys, emb):
        import uuid
        import numpy as np
        import torch
        if self.cache.fp16:
            emb = emb.to(torch.float16)  # lossless: its values were rounded to fp16 already (storage_dtype)
        emb = emb.cpu().numpy()
        keys = np.frombuffer(json.dumps(keys, ensure_ascii=False).encode("utf-8"), dtype=np.uint8)
        path = os.path.join(self.cache.dir, f"{self.kind}-{uuid.uuid4().hex}.npz")
        with atomic_open(path, "wb", durable=False) as f:  # (np.load checks the zip's CRCs: a chunk lost to a power cut is rebuilt)
            np.savez(f, emb=emb, keys=keys)

    def close(self):
        """Write what is left and wait for every chunk (raises the first failed write)."""
        try:
            self.flush()
            while self._pending:
                self._pending.pop(0).result()
        finally:
            self.abandon()

    def abandon(self):
        """The run failed or was interrupted: the whole chunks handed over are written (a re-run
        resumes from them), the rows of the unfinished one are dropped."""
        self.keys, self.embs, self.n = [], [], 0
        for future in self._pending:
            try:
                future.result()
            except Exception as e:  # the run's own error is the one to see; this one is reported
                print(f"warning: a cache chunk could not be written ({type(e).__name__}: {e})", file=sys.stderr)
        self._pending = []
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


# ---------------------------------------------------------------------------
# 7. Evaluation helpers (LGIP_SPEC.md section 4)
# ---------------------------------------------------------------------------

def load_records(path, per_caption_fields=()):
    """All records of an evaluation input, validated: [(line number, record)]."""
    with gc_paused():
        return list(iter_records(path, per_caption_fields))


def caption_texts(rec, field, i):
    """The texts of `rec[field]` for caption i ([] when the caption has none)."""
    return rec.get(field, {}).get(str(i), [])


def image_paths(records, image_root):
    return [os.path.join(image_root, rec["image_path"]) for _, rec in records]


class RecordImages(ImageEncoding):
    """The images of records[indices], each file once; `finish()` returns ([len(records), D]
    embeddings, NaN where not encoded; the usable indices; a failure report
    {num_failed_images, failed_images: [{path, error}] (first few)}).
    """

    def __init__(self, enc, records, image_root, batch_size, num_workers, indices=None, cache=None, max_listed=20,
                 pixel_memory_gb="auto"):
        self.n_records, self.max_listed = len(records), max_listed
        self.indices = range(len(records)) if indices is None else indices
        self.path_of = {k: os.path.join(image_root, records[k][1]["image_path"]) for k in self.indices}
        super().__init__(enc, list(dict.fromkeys(self.path_of.values())), batch_size, num_workers, cache=cache,
                         pixel_memory_gb=pixel_memory_gb)

    def finish(self):
        import numpy as np
        import torch
        emb, failed = super().finish()
        where = {p: j for j, p in enumerate(self.paths)}
        full = torch.full((self.n_records, emb.shape[1]), float("nan"), dtype=emb.dtype, device=emb.device)
        if self.path_of:
            ks = list(self.path_of)
            full[torch.as_tensor(ks, device=emb.device)] = emb[
                torch.as_tensor(np.array([where[self.path_of[k]] for k in ks]), device=emb.device)]
        bad_paths = {self.paths[j]: err for j, err in failed.items()}
        for p, err in list(bad_paths.items())[:self.max_listed]:
            print(f"warning: {self.enc.name}: skipping unreadable image {p} ({err})", file=sys.stderr)
        if len(bad_paths) > self.max_listed:
            print(f"warning: {self.enc.name}: ... and {len(bad_paths) - self.max_listed} more unreadable images",
                  file=sys.stderr)
        ok = [k for k in self.indices if self.path_of[k] not in bad_paths]
        report = {"num_failed_images": len(bad_paths),
                  "failed_images": [{"path": p, "error": e} for p, e in list(bad_paths.items())[:self.max_listed]]}
        return full, ok, report


def encode_record_images(enc, records, image_root, batch_size, num_workers, indices=None, cache=None, max_listed=20,
                         pixel_memory_gb="auto"):
    """RecordImages(...) run to the end: (embeddings, usable indices, failure report)."""
    return RecordImages(enc, records, image_root, batch_size, num_workers, indices, cache, max_listed,
                        pixel_memory_gb).start().finish()


class Pairs:
    """(record, caption, text) pairs, each scored against its record's image and caption.

    >>> pairs = Pairs(); pairs.add(k, i, orig[i], bank.add_call(texts), texts, "para")
    >>> pairs.score(img_emb, txt_emb, rows)   # sets .base_sim, .sim (and .text_cos)
    """

    def __init__(self):
        self.rec, self.cap, self.base_slot, self.slot, self.text, self.label = [], [], [], [], [], []
        self._subsets = {}  # idx bytes -> the subset's lists; shared by shallow copies (the run's models: ModelRun.pairs)

    def add(self, k, i, base_slot, slots, texts, label):
        n = len(texts)
        if len(slots) != n:
            raise ValueError(f"{len(slots)} slots for {n} texts")
        repeat = itertools.repeat
        self.rec.extend(repeat(k, n)), self.cap.extend(repeat(i, n)), self.base_slot.extend(repeat(base_slot, n))
        self.slot.extend(slots), self.text.extend(texts), self.label.extend(repeat(label, n))

    def __len__(self):
        return len(self.rec)

    _FIELDS = ("rec", "cap", "base_slot", "slot", "text", "label")
    _SCORES = ("base_sim", "sim", "labels", "text_cos")

    def state(self):
        return {n: getattr(self, n) for n in self._FIELDS + self._SCORES if hasattr(self, n)}

    @classmethod
    def merged(cls, states):
        """Pairs from several processes, in record order (as one process would list them)."""
        import numpy as np
        out = cls()
        rec = np.concatenate([np.asarray(st["rec"], dtype=np.int64) for st in states])
        order = np.argsort(rec, kind="stable")  # each process lists its records in order
        for name in cls._FIELDS:
            seq = [x for st in states for x in st[name]]
            setattr(out, name, [seq[j] for j in order])
        for name in cls._SCORES:
            if name in states[0]:
                setattr(out, name, np.concatenate([st[name] for st in states])[order])
        return out

    def subset(self, idx):
        """The scored pairs at positions idx. Its lists are those of the last such subset of
        these pairs, when there was one: the run's later models take the same subsets (of the
        images that decode; the typed flips), and a score file's layout is made for those lists."""
        import numpy as np
        key = np.asarray(idx, dtype=np.int64).tobytes()
        fields = self._subsets.get(key)  # (the lists only grow while pairs are built: positions keep their pair)
        if fields is None:
            fields = [[seq[j] for j in idx] for seq in (getattr(self, name) for name in self._FIELDS)]
            if len(self._subsets) >= 4:
                self._subsets.pop(next(iter(self._subsets)))
            self._subsets[key] = fields
        out = Pairs()
        for name, seq in zip(self._FIELDS, fields):
            setattr(out, name, seq)
        for name in self._SCORES:
            if hasattr(self, name):
                setattr(out, name, getattr(self, name)[idx])
        return out

    def score(self, img_emb, txt_emb, rows, text_cos=False):
        import numpy as np
        base, other = rows[np.asarray(self.base_slot, dtype=np.int64)], rows[np.asarray(self.slot, dtype=np.int64)]
        self.base_sim = cosines(img_emb, txt_emb, self.rec, base)
        self.sim = cosines(img_emb, txt_emb, self.rec, other)
        self.labels = np.array(self.label, dtype=object)
        if text_cos:
            self.text_cos = cosines(txt_emb, txt_emb, base, other)
        return self


def cosines(a, b, ia, ib, chunk=None):
    """float64 array of cos(a[ia[k]], b[ib[k]]) for L2-normalised rows, computed in float32 on
    the device the rows are on (a GPU run's embeddings stay there: 1.5M pairs at 40,000 images
    took ~12 s on the host). chunk: pairs per step; None: 4096 on the CPU (fits its caches:
    2.5-5x faster than 262,144 at 768 dimensions, the same sums), 262,144 on a GPU."""
    import numpy as np
    import torch
    device = a.device if a.device == b.device else torch.device("cpu")  # (a table the device had no room for)
    a, b = a.to(device), b.to(device)
    chunk = chunk or (4096 if device.type == "cpu" else 1 << 18)
    ia = torch.from_numpy(np.asarray(ia, dtype=np.int64)).to(device)
    ib = torch.from_numpy(np.asarray(ib, dtype=np.int64)).to(device)
    out = torch.empty(len(ia), dtype=torch.float64, device=device)
    for s in range(0, len(ia), chunk):
        x = a[ia[s:s + chunk]].float()
        y = b[ib[s:s + chunk]].float()
        out[s:s + chunk] = (x * y).sum(dim=1).double()
    return out.cpu().numpy()


def mean_or_none(values):
    import numpy as np
    return float(np.mean(values)) if len(values) else None


def fmt(value, spec=".4f"):
    """A metric for a summary line: "n/a" for None (no pairs of that kind).
    >>> fmt(0.12345), fmt(None)
    ('0.1235', 'n/a')
    """
    return "n/a" if value is None else format(value, spec)


def metrics_path(jsonl_path, suffix):
    """`<input stem>__<suffix>` next to the input."""
    return default_output(jsonl_path, "__" + suffix)


def eval_run_info(script, config, enc, image_report, n_records, bank=None):
    """Provenance block stored in each model's metrics: settings, model details, bad inputs."""
    info = provenance(script, config)
    info.update(model={"name": enc.name, "type": enc.type, "protocol": enc.protocol, "device": str(enc.device),
                       "dtype": str(enc.dtype).replace("torch.", ""), **enc.info},
                num_records_in_file=n_records, **image_report)
    if bank is not None:
        info["num_unique_texts_encoded"] = getattr(bank, "n_unique", None)
    return info


# ---------------------------------------------------------------------------
# 8. Confidence intervals and per-pair score sidecars
# ---------------------------------------------------------------------------

BOOTSTRAP_CACHE_BYTES = 1 << 29  # resample draws kept for later metrics and models (1000 x 40,000 images: 40 MB)
_BOOTSTRAP_DRAWS = {}  # (records, resamples, seed, chunk) -> [resamples, records] draw counts, most recent last


def bootstrap_draws(n, resamples, seed, chunk=50):
    """[resamples, n] draw counts of bootstrap_ci's resamples over n records: row r how often
    resample r drew each record, exactly as rng.multinomial(n, uniform, size=chunk) gives them
    chunk after chunk. They depend on (n, resamples, seed) alone, so every metric of a run and
    every model over the same records share them: drawn once (numpy's multinomial is O(n) per
    resample, ~1.6 s for 1000 x 40,000 images, which each CI paid), kept as uint8.
    >>> bootstrap_draws(3, 4, seed=0).sum(axis=1).tolist()  # each resample draws 3 records
    [3, 3, 3, 3]
    """
    import numpy as np
    key = (n, resamples, seed, chunk)
    draws = _BOOTSTRAP_DRAWS.pop(key, None)
    if draws is None:
        rng = np.random.default_rng(seed)
        draws = np.empty((resamples, n), dtype=np.uint8)
        for start in range(0, resamples, chunk):
            block = rng.multinomial(n, np.full(n, 1.0 / n), size=min(chunk, resamples - start))
            if draws.dtype == np.uint8 and block.max() > 255:  # (n > 255 draws landing on one record)
                draws = draws.astype(np.int64)
            draws[start:start + len(block)] = block
    _BOOTSTRAP_DRAWS[key] = draws
    while sum(d.nbytes for d in _BOOTSTRAP_DRAWS.values()) > BOOTSTRAP_CACHE_BYTES and len(_BOOTSTRAP_DRAWS) > 1:
        del _BOOTSTRAP_DRAWS[next(iter(_BOOTSTRAP_DRAWS))]  # the least recently used
    return draws


def bootstrap_ci(record_idx, values, resamples=1000, seed=0, level=0.95, chunk=50):
    """Percentile bootstrap CI of a pair mean, resampling images (records) with replacement.

    The records resampled are those with at least one pair; a resample weights each by how
    often it was drawn, and the statistic is the mean over all pairs of the drawn records:
    sum(w * record sums) / sum(w * record counts).
    >>> bootstrap_ci([0, 0, 1, 2], [1.0, 1.0, 0.0, 1.0], resamples=200)  # doctest: +SKIP
    [0.33, 1.0]
    """
    import numpy as np
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0 or not resamples:
        return None
    record_idx = np.asarray(record_idx, dtype=np.int64)
    used = np.unique(record_idx)  # records that contribute pairs; records without any carry no weight
    pos = np.searchsorted(used, record_idx)
    sums = np.bincount(pos, weights=values, minlength=len(used))
    counts = np.bincount(pos, minlength=len(used)).astype(np.float64)
    draws = bootstrap_draws(len(used), resamples, seed, chunk)
    stats = []
    for start in range(0, resamples, chunk):  # float64 blocks of the shape the draws came in: the same sums, bit for bit
        w = draws[start:start + chunk].astype(np.float64)
        stats.append((w @ sums) / np.maximum(w @ counts, 1e-300))
    stats = np.concatenate(stats)
    alpha = (1.0 - level) / 2
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return [float(lo), float(hi)]


def add_ci(block, key, record_idx, values, resamples, seed):
    """Set block[key + "_ci95"] right after block[key]."""
    ci = bootstrap_ci(record_idx, values, resamples, seed)
    items = list(block.items())
    block.clear()
    for k, v in items:
        block[k] = v
        if k == key:
            block[key + "_ci95"] = ci
    return block


_FLIP_WORD_TYPE = {w: t for t, words in FLIP_LISTS for w in words}


@functools.lru_cache(maxsize=1 << 21)  # every model of a run asks again for the same (caption, flip)
def infer_flip_type(caption, flip):
    """The flip type of a one-word flip of caption ("color", "number", "object"), or None.

    >>> infer_flip_type("a red bus", "a red car")
    'object'
    """
    a, b = caption.split(), flip.split()
    if len(a) != len(b):
        return None
    diff = [(x, y) for x, y in zip(a, b) if x != y]
    if len(diff) != 1:
        return None
    x, y = (re.sub(r"\W", "", w) for w in diff[0])
    t = _FLIP_WORD_TYPE.get(x)
    return t if t is not None and _FLIP_WORD_TYPE.get(y) == t else None


def _json_values(values):
    """[json.dumps(v, ensure_ascii=False) for v in values], at C speed for the str, int, None
    and float values of a score file (texts, similarities, labels)."""
    import math
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    kinds = set(map(type, values))
    if kinds <= {str}:
        return list(map(json.encoder.encode_basestring, values))
    if kinds <= {float} and all(map(math.isfinite, values)):
        return list(map(float.__repr__, values))
    if kinds <= {int}:
        return list(map(int.__repr__, values))
    fast = {str: json.encoder.encode_basestring, int: int.__repr__, type(None): lambda v: "null",
            float: lambda v: float.__repr__(v) if math.isfinite(v) else json.dumps(v)}  # NaN, Infinity as json writes them
    if kinds <= set(fast):
        return [fast[type(v)](v) for v in values]
    return [json.dumps(v, ensure_ascii=False) for v in values]


def _rounded(values, digits=6):
    """round(float(v), digits) of each value (Python's correctly rounded round, not numpy's)."""
    return [round(v, digits) for v in map(float, values.tolist() if hasattr(values, "tolist") else values)]


_SCORE_LAYOUT = []  # [(the objects and values it was made from), _ScoreLayout]: the last score file's layout, for the run's next model (~0.4 GB at 40,000 images)


def _rounded_json(values):
    """_json_values(_rounded(values)) at twice its speed: "%.6f" gives round(v, 6)'s correctly
    rounded digits, and for 2e-4 <= |v| < 0.99 the shortest repr of that rounded double is those
    digits without trailing zeros (any shorter decimal is another multiple of 1e-6, ~1e10 ulps
    away); other values (near 0 or 1, NaN) go through round and repr.
    >>> _rounded_json([0.12345650000000001, 0.5, 3e-05])
    ['0.123457', '0.5', '3e-05']
    """
    import numpy as np
    x = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        other = np.flatnonzero(~((np.abs(x) >= 2e-4) & (np.abs(x) < 0.99)))
    if 4 * len(other) > len(x):  # (mostly zeros: a stand-in model's)
        return _json_values(_rounded(x))
    out = [s.rstrip("0") for s in map("%.6f".__mod__, x.tolist())]
    for j, text in zip(other.tolist(), _json_values(_rounded(x[other]))):
        out[j] = text
    return out


class PerModel:
    """A score-file label whose values differ between the models of a run (floats, written as
    json writes them: round them first), so that the file's layout can still be shared.
    >>> sidecar.add("flips", pairs, type=types, strength=PerModel(np.round(s, 6)))
    """

    def __init__(self, values):
        import numpy as np
        self.values = np.asarray(values, dtype=np.float64)

    def __len__(self):
        return len(self.values)


class _ScoreLayout:
    """A score file's text with its numbers left out: `pieces`, [text before, number, text
    after] per number, whose numbers come from `src` in the groups' [base_sim, sim, *PerModel
    labels] values (similarities rounded to 6 decimals; PerModel labels written as they are,
    `raw`). It depends on the records, pairs and other labels alone, which every model of a run
    shares, so the run's later models only format and place their numbers (40,000 images:
    200,000 lines of record fields, 1.46M texts with their labels, made once; 1.66M similarities
    per model: 2.7 -> 0.9 s per later model, BENCHMARKS.md).
    >>> layout = _ScoreLayout(records, groups); text = layout.text(groups)
    """

    def __init__(self, records, groups):
        import numpy as np
        width = 1 + max(int(np.max(p.cap)) for _, p, _ in groups)
        keys, grps, positions, srcs, raws, befores, afters = [], [], [], [], [], [], []
        line_keys, line_src, offset = [], [], 0  # per group: its lines, and the value each would give its caption's "sim"
        for g, (name, pairs, labels) in enumerate(groups):
            n = len(pairs)
            key = np.asarray(pairs.rec, dtype=np.int64) * width + np.asarray(pairs.cap, dtype=np.int64)
            order = np.argsort(key, kind="stable")  # (evaluations add pairs in record order: already sorted)
            key = key[order]
            first = np.diff(key, prepend=-1) != 0
            last = np.append(key[1:] != key[:-1], True)
            line_keys.append(key[first])
            line_src.append(offset + order[last])  # a caption's "sim": the base_sim of its last pair added
            order_list, last_list = order.tolist(), last.tolist()
            head = ", " + _json_values([name])[0] + ": ["
            texts = _json_values(pairs.text)
            slot_befores = [[(head if f else ", ") + '{"text": ' + texts[j] + ', "sim": '
                             for j, f in zip(order_list, first.tolist())]]
            slot_afters, form, columns = [], "", []  # the text after each number of an item: its labels up to the next number
            for label, values in [*labels.items(), (None, None)]:
                if label is not None and not isinstance(values, PerModel):
                    form += ", " + _json_values([label])[0].replace("%", "%%") + ": %s"
                    columns.append(_json_values(values))
                    continue
                form += "}" if label is None else ", " + _json_values([label])[0].replace("%", "%%") + ": "
                tails = [form % item for item in zip(*columns)] if columns else [form % ()] * n
                slot_afters.append([tails[j] for j in order_list])
                form, columns = "", []
                if label is not None:
                    slot_befores.append([""] * n)
            slot_afters[-1] = [a + "]" if e else a for a, e in zip(slot_afters[-1], last_list)]
            per_item = len(slot_afters)  # the similarity, then each PerModel label
            for t in range(per_item):
                keys.append(key), grps.append(np.full(n, g)), positions.append(np.arange(n) * per_item + t)
                srcs.append(offset + (1 + t) * n + order), raws.append(np.full(n, t > 0))
                befores.append(slot_befores[t]), afters.append(slot_afters[t])
            offset += (1 + per_item) * n
        lines = np.unique(np.concatenate(line_keys))
        sim_src = np.zeros(len(lines), dtype=np.int64)
        for k, src in zip(line_keys, line_src):
            sim_src[np.searchsorted(lines, k)] = src  # (a later group's caption sim wins, as the groups were added)
        recs = [records[k] for k in (lines // width).tolist()]
        caps = (lines % width).tolist()
        heads = zip(_json_values([line for line, _ in recs]), _json_values([r.get("image_id") for _, r in recs]),
                    _json_values([r["image_path"] for _, r in recs]), caps,
                    _json_values([r["orig_captions"][i] for (_, r), i in zip(recs, caps)]))
        keys.insert(0, lines), grps.insert(0, np.full(len(lines), -1)), positions.insert(0, np.zeros(len(lines), dtype=np.int64))
        srcs.insert(0, sim_src), raws.insert(0, np.zeros(len(lines), dtype=bool)), afters.insert(0, [""] * len(lines))
        befores.insert(0, [f'{{"line": {line}, "image_id": {image_id}, "image_path": {path}, "caption_index": {i}, '
                           f'"caption": {caption}, "sim": ' for line, image_id, path, i, caption in heads])
        key = np.concatenate(keys)
        slot = np.lexsort((np.concatenate(positions), np.concatenate(grps), key))  # per line: its sim, then each group's items
        self.src = np.concatenate(srcs)[slot]
        self.raw = np.flatnonzero(np.concatenate(raws)[slot])
        before, after = list(itertools.chain.from_iterable(befores)), list(itertools.chain.from_iterable(afters))
        for j in slot[np.append(key[slot][1:] != key[slot][:-1], True)].tolist():
            after[j] += "}\n"  # (the line's last item)
        take = operator.itemgetter(*slot.tolist()) if len(slot) > 1 else lambda seq: (seq[int(slot[0])],)
        self.pieces = [None] * (3 * len(slot))  # [before, number, after] per place
        self.pieces[0::3], self.pieces[2::3] = take(before), take(after)

    def text(self, groups):
        """The file's text, with these groups' similarities and PerModel labels."""
        import numpy as np
        values = np.concatenate([np.asarray(x, dtype=np.float64) for _, p, labels in groups for x in
                                 (p.base_sim, p.sim, *(v.values for v in labels.values() if isinstance(v, PerModel)))])
        values = values[self.src]
        numbers = _rounded_json(values)
        for j, number in zip(self.raw.tolist(), _json_values(values[self.raw])):
            numbers[j] = number
        self.pieces[1::3] = numbers
        return "".join(self.pieces)


class ScoreSidecar:
    """Per record and caption: the caption's similarity and each paraphrase's, flip's (and
    combined text's) similarity, written as one JSON line per caption next to the metrics.

    Line format: {"line", "image_id", "image_path", "caption_index", "caption", "sim",
                  "paraphrases": [{"text", "sim", ...}], "flips": [{"text", "sim", "type"}], ...}
    Similarities are rounded to 6 decimals; lines are in (record, caption) order, a line's
    groups in the order they were added, each group's items in pair order. The text is made a
    column at a time (~1.4M pairs at 40,000 images: a dict per pair, dumped line by line, took
    ~6 s per model while the GPU waited), and all but the similarities once per run
    (_ScoreLayout: the run's models score the same pairs, and label them alike).
    >>> sidecar = ScoreSidecar(records); sidecar.add("flips", pairs, type=types); sidecar.write(path)
    """

    def __init__(self, records):
        self.records = records
        self.groups = []  # (group name, Pairs, labels), in the order added

    def add(self, group, pairs, **labels):
        """Append scored `pairs` to `group` ("paraphrases", "flips", "combined") of their captions;
        `labels` maps a field name to one value per pair (a PerModel for values that differ
        between the run's models)."""
        if any(group == g for g, _, _ in self.groups):
            raise ValueError(f"score group {group!r} added twice: add all its pairs in one call")
        for name, values in labels.items():
            if len(values) != len(pairs):
                raise ValueError(f"score label {name!r} of group {group!r} has {len(values)} values for {len(pairs)} pairs")
        self.groups.append((group, pairs, labels))

    def _layout(self, groups):
        """The layout of these groups: the last one made, when made from the same records, pair
        lists (the run's models share them: ModelRun.pairs) and labels."""
        objects = [self.records, *(seq for _, p, _ in groups for seq in (p.rec, p.cap, p.text))]  # the same ones
        values = [(name, len(p), list(labels), [None if isinstance(v, PerModel) else v.tolist() if hasattr(v, "tolist")
                                                else list(v) for v in labels.values()]) for name, p, labels in groups]
        if _SCORE_LAYOUT:
            (last_objects, last_values), layout = _SCORE_LAYOUT
            if len(last_objects) == len(objects) and all(map(operator.is_, last_objects, objects)) and last_values == values:
                return layout
        _SCORE_LAYOUT[:] = [(objects, values), _ScoreLayout(self.records, groups)]
        return _SCORE_LAYOUT[1]

    def text(self):
        """The file's text."""
        groups = [(g, p, labels) for g, p, labels in self.groups if len(p)]
        return self._layout(groups).text(groups) if groups else ""

    def lines(self):
        """The file's lines, in order (JSON escapes a newline inside a string: each ends one)."""
        return [line + "\n" for line in self.text().split("\n")[:-1]]

    def write(self, path):
        with atomic_open(path) as f:
            f.write(self.text())
        return path


# ---------------------------------------------------------------------------
# 9. One model's evaluation pass: cache, sharding across processes (torchrun)
# ---------------------------------------------------------------------------

def distributed():
    """(rank, world size), starting torch.distributed when launched by torchrun."""
    import torch
    import torch.distributed as dist
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() and os.environ.get("LGIP_DIST_BACKEND") != "gloo" else "gloo"
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def _gather(obj, world):
    import torch.distributed as dist
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


_AHEAD_ITEMS = []  # in a Lookahead worker process: the job's items (inherited through fork)


def _ahead_worker_start(items):
    """A Lookahead worker: lowest CPU priority (it gets what the current model leaves), one
    thread, Ctrl-C left to the main process (which then stops the job)."""
    import signal
    import torch
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    try:
        os.nice(19)
    except OSError:
        pass
    _AHEAD_ITEMS[:] = [items]


def _ahead_item(n):
    return _AHEAD_ITEMS[0][n]


class _ImageBatches:
    """An _ImageFiles in batches, each as _collate_images makes it (a DataLoader's batches, as a sequence)."""

    def __init__(self, files, batch):
        self.files, self.batch = files, batch

    def __len__(self):
        return -(-len(self.files) // self.batch)

    def __getitem__(self, n):
        return _collate_images([self.files[i] for i in range(n * self.batch, min((n + 1) * self.batch, len(self.files)))])


class Lookahead:
    """The later models' CPU work, done while the current model keeps the GPU busy.

    A run's first model of a tokenization tokenizes every text, and its first model of a pixel
    geometry decodes every image, while the GPU waits (the paper's SigLIP and SigLIP2 models:
    two more tokenizations, two more geometries, ~1.5-2 min of a 40,000-image run). Once a model
    of the run has texts to encode, a helper thread prepares each later model without its
    weights (`MODEL_PREPARERS`: its tokenizer and pixel geometry) and, one job at a time, in
    worker processes at the lowest CPU priority, tokenizes the run's texts for each tokenization
    no model has had yet and decodes its images for each geometry not yet remembered (into the
    PixelMemory, only where they fit without evicting). `settle(enc)`, called as a model starts,
    waits for a running job it needs, drops one not begun (the model does it itself, at full
    priority), gives up on one with no batch done for LOOKAHEAD_STALL_S, and hands it the
    finished token table. A failed job (a worker killed, a model that cannot be prepared) costs
    only its time: the model does the work itself, and the failure is in its run info.
    >>> ahead = Lookahead(later_specs, "corrected", num_workers=15, pixel_memory_gb="auto")
    >>> ahead.settle(enc); ...; ahead.start(enc, bank.calls, image_paths)   # per model
    >>> ahead.close()                                                        # end of the run
    """

    def __init__(self, specs, protocol, num_workers, pixel_memory_gb="auto", chunk=2048, image_batch=64):
        import threading
        self.specs, self.protocol, self.chunk, self.image_batch = list(specs), protocol, chunk, image_batch
        self.num_workers = default_num_workers() if num_workers is None else num_workers
        self.budget = resolve_pixel_memory(pixel_memory_gb)
        self.jobs = []  # {"model", "kind": "tokens"|"pixels"|"prepare", "key", "state", "seconds", "items", "error"}
        self._tables = {}  # tokenizer key -> TokenTable filled ahead
        self._claimed = set()  # (kind, key) a model has started with: not begun ahead any more
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = None

    @property
    def active(self):
        """False when there is nothing to look ahead to, or no worker processes to do it in."""
        return bool(self.specs) and self.num_workers > 0

    def start(self, enc, calls, paths):
        """Begin (once per run) with the texts of `calls` (a TextBank's TextCalls) and
        the image `paths`; `enc`'s own tokenization and geometry are not repeated."""
        import threading
        if self._thread is not None or not self.active:
            return
        self._thread = threading.Thread(target=self._work, args=(self._needs(enc), calls, list(paths)), daemon=True)
        self._thread.start()

    @staticmethod
    def _needs(enc):
        """The (kind, key) jobs whose work a model (an Encoder or a Prepared) can use."""
        return {("tokens", enc.tokenizer_key), ("pixels", enc.pixels.key if enc.pixels is not None else None)}

    def settle(self, enc):
        """Before a model encodes: wait for the jobs it can use; (seconds waited, their records)."""
        wanted = self._needs(enc)
        t0 = time.perf_counter()
        with self._cond:
            self._claimed |= wanted
            while True:
                running = [j for j in self.jobs if j["state"] == "running" and (j["kind"], j["key"]) in wanted]
                if not running:
                    break
                for j in running:  # no batch for a while (a stuck worker): the model does the work itself
                    if time.perf_counter() - j["progress_at"] > LOOKAHEAD_STALL_S:
                        j["state"] = "abandoned"
                if any(j["state"] == "running" for j in running):
                    self._cond.wait(0.5)
            mine = [j for j in self.jobs if (j["kind"], j["key"]) in wanted
                    or (j["kind"] == "prepare" and j["model"] == enc.name)]
            table = self._tables.pop(enc.tokenizer_key, None)
        if table is not None:
            install_token_table(enc.tokenizer_key, table)
        report = [{k: j[k] for k in ("kind", "model", "state", "seconds", "items", "error") if j.get(k) is not None}
                  for j in mine]
        return round(time.perf_counter() - t0, 3), report

    def close(self):
        """Stop (the run ends or failed): the helper thread ends, its worker processes with it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _work(self, done, calls, paths):
        texts = None
        for spec in self.specs:
            if self._stop.is_set():
                return
            try:
                prep = MODEL_PREPARERS[spec["type"]](spec, self.protocol)
            except Exception as e:  # the model's own load reports it properly
                self._record({"model": spec.get("name"), "kind": "prepare", "key": None, "state": "failed",
                              "error": f"{type(e).__name__}: {e}"})
                continue
            for kind, key in sorted(self._needs(prep), key=lambda job: job[0] != "tokens"):  # tokens first
                if self._stop.is_set():
                    return
                if key is None or (kind, key) in done or (kind == "pixels" and self.budget <= 0):
                    continue
                done.add((kind, key))
                if kind == "tokens" and texts is None:
                    texts = list(dict.fromkeys(calls.texts))
                self._job(prep, kind, key, texts if kind == "tokens" else paths)

    def _record(self, job):
        with self._cond:
            self.jobs.append(job)
            self._cond.notify_all()

    def _job(self, prep, kind, key, items):
        job = {"model": prep.name, "kind": kind, "key": key, "state": "running", "progress_at": time.perf_counter()}
        with self._cond:
            if (kind, key) in self._claimed:
                job["state"] = "dropped"  # its model started first: it does the work itself
            self.jobs.append(job)
        if job["state"] == "dropped":
            return
        t0 = time.perf_counter()
        error = None
        try:
            n = self._tokenize(prep, items, job) if kind == "tokens" else self._decode(prep, items, job)
        except Exception as e:
            n, error = None, f"{type(e).__name__}: {e}"
            print(f"warning: looking ahead for {prep.name} ({kind}) failed, it does that itself: {error}",
                  file=sys.stderr)
        with self._cond:
            if job["state"] == "running":  # (not abandoned by settle meanwhile)
                job["state"] = "failed" if error else "done" if n is not None else "stopped"
            if job["state"] == "done" and kind == "tokens":
                self._tables[key] = n[1]
            job.update(seconds=round(time.perf_counter() - t0, 3), items=n[0] if kind == "tokens" and n else n,
                       error=error)
            self._cond.notify_all()

    def _batches(self, dataset, job):
        """Each item of `dataset` (a sequence), in order, computed by this job's worker processes
        (at most two per worker in flight). Not a DataLoader: torch watches its workers from the
        main thread, where a look-ahead worker's death would raise; here it fails the job only.
        Stops early (returns) when the run stops or settle abandons the job."""
        import collections
        import concurrent.futures as cf
        import multiprocessing
        pool = cf.ProcessPoolExecutor(self.num_workers, mp_context=multiprocessing.get_context("fork"),
                                      initializer=_ahead_worker_start, initargs=(dataset,))
        pending, sent, finished = collections.deque(), 0, False
        try:
            while sent < len(dataset) or pending:
                while sent < len(dataset) and len(pending) < 2 * self.num_workers:
                    pending.append(pool.submit(_ahead_item, sent))
                    sent += 1
                try:
                    item = pending[0].result(timeout=0.5)
                except cf.TimeoutError:
                    if self._stop.is_set() or job["state"] != "running":
                        return
                    continue
                pending.popleft()
                job["progress_at"] = time.perf_counter()
                yield item
                if self._stop.is_set() or job["state"] != "running":
                    return
            finished = True
        finally:
            procs = list((getattr(pool, "_processes", None) or {}).values())  # (shutdown forgets them)
            pool.shutdown(wait=finished, cancel_futures=True)
            if not finished:  # a worker may be stuck: do not leave it behind
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.join(timeout=5)

    def _tokenize(self, prep, texts, job):
        """(texts tokenized, their TokenTable), or None when stopped early."""
        table = TokenTable()
        chunks = _TextChunks(texts, prep.tokenize, self.chunk)
        for n, (flat, lengths) in enumerate(self._batches(chunks, job), 1):
            table.add(texts[(n - 1) * self.chunk:n * self.chunk], flat, lengths)
        return (len(table), table) if len(table) == len(texts) else None

    def _decode(self, prep, paths, job):
        """Images decoded and remembered (None when stopped early)."""
        memory = pixel_memory(self.budget)
        key = prep.pixels.key
        with memory.lock:
            known = set(memory.geometries[key]["where"]) if key in memory.geometries else set()
        paths = list(dict.fromkeys(paths))
        todo = [(paths[i], k) for i, k in image_cache_keys(paths).items() if k not in known]
        batches = _ImageBatches(_ImageFiles([p for p, _ in todo], prep.pixels.geometry), self.image_batch)
        n = done = 0
        for b, (idx, batch, _bad) in enumerate(self._batches(batches, job), 1):  # unreadable: their model retries and reports
            memory.add(key, [todo[j][1] for j in idx], batch, evict=False)  # idx: indices into todo
            n, done = n + len(idx), b
        return n if done == len(batches) else None


class ModelRun:
    """One model over one JSONL: its Encoder, embedding cache, image embeddings and text bank.

    Under torchrun each process takes every world-th record; `score` gathers the scored pairs
    on rank 0 in record order, so the metrics equal a single process's.
    >>> run = ModelRun(spec, records, CONFIG)       # loads the model
    >>> inv, sens = run.pairs(published_calls)      # pairs.add(k, i, orig[i], run.bank.add_call(texts), ...) for k in run.ok
    >>> inv, sens = run.score(inv, sens)            # encodes images and texts; None on ranks other than 0
    """

    def __init__(self, spec, records, config, enc=None, lookahead=None):
        t0 = time.perf_counter()
        self.rank, self.world = distributed()
        self.lookahead = lookahead  # a Lookahead over the run's later models, or None
        device = config["DEVICE"]
        if self.world > 1 and resolve_device(device) == "cuda":
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', self.rank))}"
        self.config, self.records = config, records
        self.enc = enc or load_model(spec, config["PROTOCOL"], device, config["DTYPE"])
        cache_dir = config.get("CACHE_DIR")
        if cache_dir == "auto":
            cache_dir = os.path.join(os.path.dirname(os.path.abspath(config["JSONL_PATH"])), ".lgip_cache")
        self.cache = EmbeddingCache(cache_dir, self.enc, spec) if cache_dir else None
        self.image_root = config.get("IMAGE_ROOT") or os.path.dirname(os.path.abspath(config["JSONL_PATH"]))
        self.mine = range(self.rank, len(records), self.world)
        # Images are encoded in score(), beside the texts; a record whose image cannot be read
        # is dropped there, with all its pairs.
        self.ok = list(self.mine)
        self.bank = TextBank(self.enc, config["NUM_WORKERS"])
        self._mark = time.perf_counter()
        self.seconds = {"load": round(self._mark - t0, 3)}  # where the model's time went (see info)

    @property
    def is_main(self):
        return self.rank == 0

    def pairs(self, build):
        """build(run) -> Pairs: the evaluation's published calls, registered through
        run.bank.add_call. Built by a run's first model and adopted by the next ones of the same
        process, records and shard (the calls depend on the records alone); each model gets
        its own copies of the Pairs to score.
        >>> inv, sens = run.score(*run.pairs(published_calls))
        """
        import copy
        last = _LAST_CALLS[0] if _LAST_CALLS else None
        if last is not None and last[0] is build and last[1] is self.records and last[2:] == (self.rank, self.world):
            self.bank.adopt(_LAST_CALLS[1])
        else:
            pairs = build(self)
            self.bank.run_calls = RunCalls(self.bank.calls.copy(), pairs)
            _LAST_CALLS[:] = [(build, self.records, self.rank, self.world), self.bank.run_calls]
        return [copy.copy(p) for p in self.bank.run_calls.pairs]

    def score(self, *pairs_list, text_cos=False):
        """Encode the bank's texts, score each Pairs; on rank 0 return them merged over processes."""
        self.seconds["pairs"] = round(time.perf_counter() - self._mark, 3)
        ahead = self.lookahead
        waited, self.ahead = ahead.settle(self.enc) if ahead is not None else (0.0, None)
        images = RecordImages(self.enc, self.records, self.image_root, self.config["IMAGE_BATCH_SIZE"],
                              self.config["NUM_WORKERS"], self.mine, self.cache,
                              pixel_memory_gb=self.config.get("PIXEL_MEMORY_GB", "auto"))
        batch = resolve_text_batch_size(self.config["TEXT_BATCH_SIZE"], self.enc.device)
        # The later models' tokenizing and decoding begin once this model's own are done.
        then = (lambda: ahead.start(self.enc, self.bank.calls, images.paths)) if ahead is not None else None
        try:
            txt_emb, rows = self.bank.encode(batch, cache=self.cache, beside=images, then=then)
        except BaseException:
            images.close()
            raise
        with Timer() as t_images:
            self.img_emb, self.ok, self.image_report = images.finish()
        self.seconds.update(lookahead_wait=waited, **self.bank.seconds, images_after_texts=round(t_images.seconds, 3))
        t_scoring = time.perf_counter()
        self.image_sources = {"decoded": images.n_decoded, "from_pixel_memory": images.n_remembered,
                              "from_cache": images.n_cached}
        good = set(self.ok)
        self.failed = [k for k in self.mine if k not in good]  # records whose image could not be read
        if self.failed:
            pairs_list = [p.subset([j for j, k in enumerate(p.rec) if k in good]) for p in pairs_list]
        for pairs in pairs_list:
            pairs.score(self.img_emb, txt_emb, rows, text_cos=text_cos)
        self.n_ok = len(self.ok)
        # the published scripts count a record once its image and captions encode: not one without captions
        self.n_samples = sum(1 for k in self.ok if self.records[k][1]["orig_captions"])
        if self.world == 1:
            self._scored(t_scoring)
            return pairs_list
        gathered = _gather(([p.state() for p in pairs_list], len(self.ok), self.image_report,
                            self.bank.n_unique, self.bank.n_encoded, self.bank.positions, self.n_samples,
                            self.failed), self.world)
        if not self.is_main:
            return [None] * len(pairs_list)
        self.n_ok = sum(g[1] for g in gathered)
        self.n_samples = sum(g[6] for g in gathered)
        self.failed = sorted(k for g in gathered for k in g[7])
        reports = [g[2] for g in gathered]
        self.image_report = {"num_failed_images": sum(r["num_failed_images"] for r in reports),
                             "failed_images": [f for r in reports for f in r["failed_images"]][:20]}
        self.bank.n_unique, self.bank.n_encoded = sum(g[3] for g in gathered), sum(g[4] for g in gathered)
        self.bank.positions = {k: sum(g[5].get(k, 0) for g in gathered) for k in ("tokens", "computed")}
        merged = [Pairs.merged([g[0][j] for g in gathered]) for j in range(len(pairs_list))]
        self._scored(t_scoring)
        return merged

    def _scored(self, since):
        self._mark = time.perf_counter()
        self.seconds["scoring"] = round(self._mark - since, 3)

    def finished(self):
        """Called once the evaluation's metrics are made: the time since scoring (confidence
        intervals, the score file) is its last phase."""
        self.seconds["metrics_and_scores_file"] = round(time.perf_counter() - self._mark, 3)

    def info(self, script):
        info = eval_run_info(script, self.config, self.enc, self.image_report, len(self.records), self.bank)
        info["num_processes"] = self.world
        info["seconds_by_phase"] = self.seconds  # in order: loading the model; building the pairs; waiting for work done ahead for this model; cache lookup + tokenizing; forking the tokenizers; forking the image decoders; texts (images polled between); images left after; similarities (and gathering them from other processes); confidence intervals and score file
        info["lookahead"] = getattr(self, "ahead", None)  # jobs done ahead for this model while earlier ones ran (None: no Lookahead)
        info["text_batch_size"] = resolve_text_batch_size(self.config["TEXT_BATCH_SIZE"], self.enc.device)
        # token positions of the encoded texts; computed: fewer when prefixes are shared (pack_nodes 0: no prefix packs)
        info["text_positions"] = dict(self.bank.positions, pack_nodes=PACK_NODES if self.enc.encode_packs is not None else 0)
        info["image_sources"] = getattr(self, "image_sources", {})  # unique images: decoded here, from an earlier model's pixels, cached embeddings
        if self.cache is not None:
            info["cache"] = {"dir": self.cache.dir, **self.cache.stats}
        return info


def run_evaluation(script, config, per_caption_fields, evaluate, summary, on_model=None):
    """The evaluation scripts' loop: each model of MODELS through `evaluate(run) -> metrics`.

    Prints `summary(metrics)` per model; returns the list of metrics on rank 0, None elsewhere.
    """
    records = load_records(config["JSONL_PATH"], per_caption_fields)
    results = []
    models = config["MODELS"]
    ahead = (Lookahead(models[1:], config["PROTOCOL"], config["NUM_WORKERS"], config.get("PIXEL_MEMORY_GB", "auto"))
             if config.get("LOOKAHEAD", True) and len(models) > 1 else None)
    try:
        for spec in models:
            with Timer() as t:
                run = ModelRun(spec, records, config, lookahead=ahead)
                metrics = evaluate(run)
                run.finished()
            if not run.is_main:
                continue
            metrics["run"] = run.info(script)
            metrics["run"]["seconds"] = round(t.seconds, 3)
            if on_model:
                on_model(metrics)
            print(f"{run.enc.name}: {summary(metrics)} ({run.n_ok} records, "
                  f"{run.image_report['num_failed_images']} unreadable images, {t.seconds:.1f} s)")
            results.append(metrics)
    finally:
        if ahead is not None:
            ahead.close()
    rank, world = distributed()
    if world > 1:
        # Every rank ends here together, then leaves the group: a rank that exited early with the
        # group still open aborted at interpreter exit in 1 of 4-12 runs ("terminate called
        # without an active exception").
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()
    return results if rank == 0 else None
