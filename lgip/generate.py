"""lgip.generate: the generators' shared loop (stream records, add perturbation fields,
write the JSONL atomically with a .meta.json beside it)."""

import os
import random

from .console import detail
from .errors import InputError, Interrupted
from .util import Timer, count_lines, progress, provenance
from .outputs import atomic_open, refuse_overwriting_input, remove_stale_temps, write_json
from .records import check_input_file, dump_jsonl_line, iter_records
from .method import FLIP_TYPES


_SAY_SKIPPED = 5  # skipped records said one by one (all are counted)


class SkipRecord(Exception):
    """Raised by a generator's perturb(): the record is not written (counted as skipped_<why>)."""

    def __init__(self, why, message):
        super().__init__(message)
        self.why, self.message = why, message


def run_generator(script, config, input_path, output_path, perturb):
    """The generators' shared loop: stream records, add perturbation fields, write atomically.

    `perturb(record, rng, stats)` returns the new per-caption fields (dicts keyed "0".."4");
    they are set on the record in the order returned, after its existing keys; raising
    SkipRecord skips the record (counted, the first few said with file:line). Writes
    `output_path` plus `<output_path>.meta.json` (settings, versions, counts: the JSONL
    itself must stay byte-identical to the published format) and prints a summary.
    """
    from collections import Counter

    rng = random.Random(config["SEED"])
    stats = Counter()
    check_input_file(input_path)
    refuse_overwriting_input(output_path, input_path)
    stale = remove_stale_temps(output_path)
    if stale:
        print(
            f"removed {len(stale)} temp file(s) a killed earlier run left for {os.path.basename(output_path)}: "
            f"{', '.join(stale[:3])}"
        )
    total = count_lines(input_path)
    try:
        with Timer() as timer, atomic_open(output_path) as out:
            for lineno, rec in progress(iter_records(input_path), total, desc=os.path.basename(script), unit="rec"):
                stats["records"] += 1
                stats["captions"] += len(rec["orig_captions"])
                stats["records_without_captions"] += not rec["orig_captions"]  # (written, with empty fields)
                try:
                    fields = perturb(rec, rng, stats)
                except SkipRecord as skip:
                    stats["skipped_" + skip.why] += 1
                    if stats["skipped_" + skip.why] <= _SAY_SKIPPED:
                        print(f"{input_path}:{lineno}: record skipped: {skip.message}", flush=True)
                    continue
                for key, value in fields.items():
                    rec[key] = value
                out.write(dump_jsonl_line(rec))
                stats["written"] += 1
            if not stats["written"]:  # (raised inside: the empty output is not left behind)
                skipped = ", ".join(
                    f"{v} {k[8:].replace('_', ' ')}" for k, v in stats.items() if k.startswith("skipped_")
                )
                raise InputError(
                    f"{input_path}: no record to write: "
                    + (
                        f"all {stats['records']:,} skipped ({skipped})"
                        if stats["records"]
                        else "the file is empty or holds only blank lines"
                    )
                    + f"; {output_path} was not written"
                )
    except KeyboardInterrupt:
        raise Interrupted(
            f"at record {stats['records']:,} of ~{total:,}; {output_path} was not written (no partial "
            f"file is left). The generator is quick and deterministic: run the same command again."
        ) from None
    rate = stats["records"] / max(timer.seconds, 1e-9)
    meta = provenance(script, config)
    meta.update(
        input=os.path.abspath(input_path),
        output=os.path.abspath(output_path),
        counts=dict(stats),
        seconds=round(timer.seconds, 3),
    )
    write_json(output_path + ".meta.json", meta)
    flips = ", ".join(f"{t} {stats['flips_' + t]}" for t in FLIP_TYPES)
    line = (
        f"{os.path.basename(script)}: {stats['records']} records, {stats['captions']} captions, "
        f"{stats['paraphrases']} paraphrases, flips: {flips}"
    )
    if stats["combined"]:
        line += f", combined {stats['combined']}"
    print(line)
    skipped = {k: v for k, v in stats.items() if k.startswith("skipped_") and v}
    if skipped or stats["records_without_captions"]:
        print(
            f"  written {stats['written']} records"
            + "".join(f"; {v} skipped ({k[8:].replace('_', ' ')})" for k, v in skipped.items())
            + (
                f"; {stats['records_without_captions']} written without captions (no perturbations: the "
                f"evaluations skip and count them)"
                if stats["records_without_captions"]
                else ""
            )
        )
    detail(f"  {timer.seconds:.2f} s ({rate:,.0f} records/s) -> {output_path}")
    return stats
