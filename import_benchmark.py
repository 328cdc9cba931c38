"""import_benchmark: another benchmark's hard negatives (and hard positives) as LGIP records.

LGIP_SPEC.md section 10. Reads the benchmark's JSON files as its repository has them (SOURCE_DIR)
and the COCO images they name (looked up in IMAGE_DIRS, in order, under both COCO namings); writes
one LGIP record per image found: its distinct captions, every negative of each caption in
`diff_caps` and by the benchmark's own type in `diff_caps_<type>` (SugarCrepe++: a second true
caption in `same_caps`). Every evaluation then takes the file as it takes LGIP's own: positive rate
by type (the benchmark's accuracy), intervals, retrieval, word attribution, the text-prior
controls, the report. Images found in no folder are not written: counted, said, and listed in
`<OUTPUT_JSONL>.meta.json`.
  python import_benchmark.py --SOURCE=sugarcrepe --SOURCE_DIR=sugar-crepe/data --IMAGE_DIRS="['val2017']"
  python run_all.py --BENCHMARK_JSONL=sugar-crepe/data/lgip_sugarcrepe.jsonl      # evaluations and report
"""

import collections
import os

import common
from lgip.sources import SOURCES, ImageFinder, build_records

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = "sugarcrepe"  # "sugarcrepe" (7 types, COCO val2017), "sugarcrepe++" (5 types, val2017,
#   with a second true caption) or "rococo" (4 altered-caption sets, val2014 pictures)
SOURCE_DIR = os.path.join(_HERE, "sugar-crepe", "data")  # the benchmark's folder of JSON files,
#   as its repository has them
IMAGE_DIRS = [os.path.join(_HERE, "val2017"), os.path.join(_HERE, "train2017", "train2017")]  # list of folders searched
#   in order for each image, under both COCO namings (000000391895.jpg, COCO_val2014_000000391895.jpg)
OUTPUT_JSONL = None  # output path; None = lgip_<source>.jsonl in SOURCE_DIR (sugarcrepe++: lgip_sugarcrepe_pp.jsonl)
VERBOSE = True  # True: every line (paths written, comparisons, notes); False: the result lines (run_all's default)
CONFIG = common.configure(globals())

_SHOW_MISSING = 10  # images named in the console line (all of them go to the meta file)


def check_config():
    if SOURCE not in SOURCES:
        raise common.ConfigError(f"SOURCE must be one of {', '.join(repr(s) for s in SOURCES)}, got {SOURCE!r}")
    if not isinstance(SOURCE_DIR, str) or not os.path.isdir(SOURCE_DIR):
        raise common.InputError(
            f"SOURCE_DIR={SOURCE_DIR!r} is not a folder: give the folder of the benchmark's JSON "
            f"files ({SOURCES[SOURCE].URL}); it must hold "
            f"{', '.join(f + '.json' for f in SOURCES[SOURCE].FILES)}"
        )
    if OUTPUT_JSONL is not None and (not isinstance(OUTPUT_JSONL, str) or not OUTPUT_JSONL.strip()):
        raise common.ConfigError(
            f"OUTPUT_JSONL must be None or the path of the JSONL file to write, got {OUTPUT_JSONL!r}"
        )
    dirs = [IMAGE_DIRS] if isinstance(IMAGE_DIRS, str) else IMAGE_DIRS
    if not isinstance(dirs, (list, tuple)) or not dirs or not all(isinstance(d, str) for d in dirs):
        raise common.ConfigError(f"IMAGE_DIRS must be a list of folders, got {IMAGE_DIRS!r}")
    return dirs


def output_path():
    return OUTPUT_JSONL or os.path.join(SOURCE_DIR, f"lgip_{SOURCE.replace('++', '_pp')}.jsonl")


def main():
    dirs = check_config()
    output = output_path()
    stale = common.remove_stale_temps(output)
    if stale:
        print(f"removed {len(stale)} temp file(s) a killed earlier run left for {os.path.basename(output)}")
    with common.Timer() as t:
        items = list(SOURCES[SOURCE].read(SOURCE_DIR))  # (every file read and checked before anything is written)
        inputs = [os.path.join(SOURCE_DIR, f + ".json") for f in SOURCES[SOURCE].FILES]
        if not items:
            raise common.InputError(f"no item in {SOURCE}'s files ({', '.join(inputs)}): each is empty")
        common.refuse_overwriting_input(output, *inputs)
        searched = [d for d in dirs if os.path.isdir(d)]
        records, missing = build_records(items, ImageFinder(searched), os.path.dirname(os.path.abspath(output)))
        if not records:
            raise common.InputError(
                f"none of the {len(set(i.image for i in items))} images of {SOURCE} was found in "
                f"IMAGE_DIRS {dirs} (folders that exist: {searched or 'none'}); pass "
                f"--IMAGE_DIRS=\"['/path/to/coco/val2017', ...]\""
            )
    by_type = collections.Counter(i.type for i in items)
    written = collections.Counter(i.type for i in items if i.image not in missing)
    meta = common.provenance(__file__, CONFIG)
    meta.update(
        source=SOURCE,
        source_url=SOURCES[SOURCE].URL,
        inputs=[os.path.abspath(p) for p in inputs],
        image_dirs=[os.path.abspath(d) for d in dirs],
        image_dirs_missing=[d for d in dirs if d not in searched],
        output=os.path.abspath(output),
        num_items=len(items),
        num_images=len(records) + len(missing),
        num_images_written=len(records),
        num_images_missing=len(missing),
        items_by_type={k: by_type[k] for k in by_type},
        items_written_by_type={k: written[k] for k in by_type},
        missing_images=[{"image": k, "items": v} for k, v in missing.items()],
        seconds=round(t.seconds, 3),
    )
    with common.OutputSet() as files:  # (the records and their meta file: both, or neither)
        with files.open(output) as f:
            f.writelines(common.dump_jsonl_line(rec) for rec in records)
        common.write_json(output + ".meta.json", meta, files=files)
    print(
        f"{SOURCE}: {len(items)} items on {len(records) + len(missing)} images; {len(records)} images written "
        f"({sum(written.values())} items) in {t.seconds:.1f} s -> {output}"
    )
    print(
        "  items by type: "
        + ", ".join(f"{k} {written[k]}" + (f" (of {by_type[k]})" if written[k] != by_type[k] else "") for k in by_type)
    )
    if missing:
        shown = ", ".join(list(missing)[:_SHOW_MISSING]) + (", ..." if len(missing) > _SHOW_MISSING else "")
        print(
            f"  warning: {len(missing)} images found in no folder of IMAGE_DIRS ({sum(missing.values())} items), "
            f"not written: {shown}; all listed in {os.path.basename(output)}.meta.json"
        )
    for d in dirs:
        if d not in searched:
            print(f"  warning: IMAGE_DIRS folder {d} does not exist")
    return output


def run(**constants):
    """The command line's run, and a call from Python: the constants as keyword arguments (lgip.entry);
    returns the output's path."""
    with common.script_call(globals(), constants):
        return main()


if __name__ == "__main__":
    common.run_main(run)
