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
import json
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
    actually in force (recorded in every output file).
    """
    argv = sys.argv[1:] if argv is None else argv
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
    """Check the fields the scripts read; `where` is "file:line"."""
    if not isinstance(rec, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    for field in ("image_path", "orig_captions"):
        if field not in rec:
            raise InputError(f"{where}: missing field {field!r}")
    if not isinstance(rec["image_path"], str):
        raise InputError(f"{where}: field 'image_path' is {type(rec['image_path']).__name__}, expected a string")
    _expect_str_list(rec["orig_captions"], where, "orig_captions")
    for field in per_caption_fields:
        block = rec.get(field)
        if block is None:
            raise InputError(f"{where}: missing field {field!r} (run the generator first)")
        if not isinstance(block, dict):
            raise InputError(f"{where}: field {field!r} is {type(block).__name__}, expected an object keyed by caption index")
        for key, texts in block.items():
            _expect_str_list(texts, where, f"{field}.{key}")


def iter_records(path, per_caption_fields=()):
    """Stream (line number, record) from a JSONL file, validating each record.

    Blank lines are skipped (as the published code does); anything else that is not a
    valid record raises InputError naming `path:line` and the field.
    """
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
def atomic_open(path, mode="w"):
    """Write `path` through a temp file in the same folder, renamed into place on success.

    An exception or a kill mid-write leaves any previous file untouched and no partial one.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        kwargs = {} if "b" in mode else {"encoding": "utf-8", "newline": "\n"}
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
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


def run_main(main):
    """Run a script's main(); bad input ends with its message and exit status 2."""
    try:
        main()
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)


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


def progress(iterable, total=None, desc="", unit="it", min_total=2000):
    """A tqdm bar (items/s, ETA) on stderr when the job is large; the bare iterable otherwise."""
    if total is not None and total < min_total:
        return iterable
    from tqdm import tqdm
    return tqdm(iterable, total=total, desc=desc, unit=unit, dynamic_ncols=True, mininterval=0.5)


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
