"""lgip.report.benchmarks: an input that is an imported benchmark (import_benchmark.py: SugarCrepe,
SugarCrepe++, RoCOCO; LGIP_SPEC.md 10): which one (`benchmark_source`, from the import's meta file),
and the mean over its types that the benchmark itself reports, added to each row.

    >>> bench = benchmark_source("data/sugarcrepe.jsonl", metrics, types)   # None for LGIP's own data
    >>> extra = add_benchmark_means(rows) if bench else []
"""

import os

from ..errors import InputError
from ..method import FLIP_TYPES
from ..records import read_json
from .fields import what_is


BENCHMARK_NAMES = {
    "sugarcrepe": "SugarCrepe",
    "sugarcrepe++": "SugarCrepe++",
    "rococo": "RoCOCO",
}  # import_benchmark.py's SOURCE
PAIR_ACCURACY = (
    "sugarcrepe",
    "sugarcrepe++",
)  # benchmarks whose own accuracy is a type's positive rate (RoCOCO's is retrieval)
BENCHMARK_MEANS = (
    ("pos_rate", "benchmark_mean_pos_rate"),
    ("robust_pos_rate", "benchmark_mean_robust_pos_rate"),
    ("text_only_rate", "benchmark_mean_text_only_rate"),
)  # per-type figure -> its mean over the types (CSV)


def _import_meta(path):
    """import_benchmark.py's `<file>.meta.json` beside `path`, or None (absent, unreadable, or another
    script's: a generator's meta names no source)."""
    if not os.path.isfile(path + ".meta.json"):
        return None
    try:
        meta = read_json(path + ".meta.json")
    except (InputError, OSError, ValueError):
        return None
    if isinstance(meta, dict) and meta.get("script") == "import_benchmark.py" and isinstance(meta.get("source"), str):
        for key in ("items_by_type", "items_written_by_type"):  # (what the benchmark table reads of it: checked)
            v = meta.get(key)
            if v is not None and (
                not isinstance(v, dict)
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in v.values())
            ):
                raise InputError(
                    f"{path}.meta.json: field {key!r} is {what_is(v)}, not an object of counts per type"[:300]
                )
        for key in ("num_images", "num_images_missing"):
            v = meta.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise InputError(f"{path}.meta.json: field {key!r} is {what_is(v)}, not a count (an int >= 0)")
        if meta.get("source_url") is not None and not isinstance(meta["source_url"], str):
            raise InputError(f"{path}.meta.json: field 'source_url' is {what_is(meta['source_url'])}, not a string")
        return meta
    return None


def benchmark_source(jsonl_path, metrics, types):
    """{"source", "name", "meta": its import_benchmark.py meta (or None), "meta_path", "accuracy": whether
    the benchmark's own accuracy is a type's positive rate (SugarCrepe's, SugarCrepe++'s)} when the report
    is about an imported benchmark: the meta beside JSONL_PATH or beside the typed evaluations' input
    says so, or the per-type figures have types that are not LGIP's (then source None, name "Benchmark");
    else None."""
    inputs = [jsonl_path] + [
        ((m.get("run") or {}).get("config") or {}).get("JSONL_PATH")
        for key in ("fliptypes", "multi")
        for m in metrics.get(key, ())
    ]
    for path in dict.fromkeys(p for p in inputs if isinstance(p, str) and p):
        meta = _import_meta(path)
        if meta is not None:
            return {
                "source": meta["source"],
                "name": BENCHMARK_NAMES.get(meta["source"], meta["source"]),
                "meta": meta,
                "meta_path": path + ".meta.json",
                "accuracy": meta["source"] in PAIR_ACCURACY,
            }
    if types and not set(types) <= set(FLIP_TYPES):
        return {"source": None, "name": "Benchmark", "meta": None, "meta_path": None, "accuracy": False}
    return None


def type_mean(row, types, figure):
    """The unweighted mean over `types` of a row's per-type `figure` (as the benchmarks report their
    mean accuracy); None when a type has none."""
    values = [row.get(f"{t}_{figure}") for t in types]
    return None if not values or any(v is None for v in values) else sum(values) / len(values)


def add_benchmark_means(rows):
    """Each row's benchmark_mean_<figure> (BENCHMARK_MEANS, over its `_types`); returns the CSV's extra
    columns: the positive rate's mean, and the hard positives' when some row has them by type."""
    extra = []
    for figure, name in BENCHMARK_MEANS:
        for r in rows:
            r[name] = type_mean(r, r.get("_types") or [], figure)
        if figure == "pos_rate" or any(r[name] is not None for r in rows):
            extra.append(name)
    return extra
