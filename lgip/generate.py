"""lgip.generate: the generators' shared loop (stream records, add perturbation fields,
write the JSONL atomically with a .meta.json beside it)."""
import os
import random

from .errors import Interrupted
from .util import Timer, atomic_open, count_lines, progress, provenance, write_json
from .records import dump_jsonl_line, iter_records
from .method import FLIP_TYPES


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
    try:
        with Timer() as timer, atomic_open(output_path) as out:
            for _, rec in progress(iter_records(input_path), total, desc=os.path.basename(script), unit="rec"):
                stats["records"] += 1
                stats["captions"] += len(rec["orig_captions"])
                for key, value in perturb(rec, rng, stats).items():
                    rec[key] = value
                out.write(dump_jsonl_line(rec))
    except KeyboardInterrupt:
        raise Interrupted(f"at record {stats['records']:,} of ~{total:,}; {output_path} was not written (no partial "
                          f"file is left). The generator is quick and deterministic: run the same command again.") from None
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
