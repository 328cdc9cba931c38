"""lgip.export: an evaluation's per-pair scores as one flat table, for pandas, R, a spreadsheet or a database
(`lgip export RUN`, and each evaluation's setting EXPORT): `<stem>__LGIP_<script>_pairs.csv` (and `.parquet`
where pyarrow is installed, or asked for) with `<stem>__LGIP_<script>_pairs.meta.json` beside it (what it was made
from: each model's score file and the configuration and versions its evaluation recorded, and the export's own).

A row per scored text: the caption itself (kind "caption"), then each paraphrase, flip, combined text, or altered
image (kind "image_paraphrase", "image_flip": the caption scored against the image altered as `type` says), with
the columns COLUMNS and then EXTRA_COLUMNS. The table is made from the score files (lgip.scorefile.iter_score_lines:
every line checked, a bad one named by file, line and field), of every model of the evaluation's list file, so it
mirrors that file: a later run's models are added to it, not put in its place.

    >>> export("runs/demo")                 # every evaluation with score files there
    ['runs/demo/lgip_demo_with_perturb__LGIP_multi_pairs.csv', ...]
    >>> pandas.read_csv("runs/demo/lgip_demo_with_perturb__LGIP_multi_pairs.csv")
"""

import glob
import os
import sys
from dataclasses import dataclass, field

from .errors import ConfigError, InputError
from .scorefile import COLUMNS, EXTRA_COLUMNS, iter_pairs, script_key, stem_of

FORMATS = ("csv", "parquet")
BATCH_ROWS = 100_000  # rows per parquet row group (a model's millions of pairs never all in memory)


@dataclass
class Scored:
    """One evaluation's rows in one folder: every model whose row names a score file (its own, or None when
    WRITE_SCORES was False or it could not be written), from the metrics files read (`sources`)."""

    folder: str
    stem: str
    script: str
    rows: list = field(default_factory=list)
    sources: list = field(default_factory=list)

    @property
    def key(self):
        return script_key(self.script)

    def table_path(self, ext):
        return os.path.join(self.folder, f"{self.stem}__LGIP_{self.key}_pairs.{ext}")

    def score_file(self, row):
        """The model's score file (a path that exists), or None."""
        name = row.get("scores_file")
        path = os.path.join(self.folder, name) if isinstance(name, str) and name else None
        return path if path and os.path.isfile(path) else None


def _metrics_rows(path):
    """The per-model rows of a metrics file (a list file, or run_lgip_multi's file of one model) that name a score
    file (or None); InputError naming the file when it is not JSON."""
    from .records import read_json

    value = read_json(path)
    rows = value if isinstance(value, list) else [value]
    return [r for r in rows if isinstance(r, dict) and isinstance(r.get("model_tag"), str) and "scores_file" in r]


def find_scored(run):
    """The evaluations with score files of RUN (an evaluation's output folder, or one of its metrics files), in
    the order their metrics files sort; InputError when it holds none."""
    if not os.path.exists(run):
        raise InputError(f"{run}: no such file or folder (give an evaluation's output folder or a metrics file)")
    files = (
        [run]
        if os.path.isfile(run)
        else sorted(
            glob.glob(os.path.join(glob.escape(run), "*.metrics.json"))
            + glob.glob(os.path.join(glob.escape(run), "*__ENHANCED_LGIP_analysis.json"))
        )
    )
    found = {}
    for path in files:
        for row in _metrics_rows(path):
            script = ((row.get("run") or {}).get("script")) or "scores"
            key = (os.path.dirname(os.path.abspath(path)), stem_of(path), script)
            scored = found.setdefault(key, Scored(*key))
            if path not in scored.sources:
                scored.sources.append(path)
            if all(r["model_tag"] != row["model_tag"] for r in scored.rows):  # (the list file and a model's own)
                scored.rows.append(row)
    if not found:
        where = "in it" if os.path.isfile(run) else f"among its {len(files)} metrics file(s)"
        raise InputError(
            f"{run}: no evaluation's rows with score files {where} (run_lgip_multi.py, run_lgip_by_fliptype.py, "
            f"run_lgip_images.py and the enhanced analysis write them, with WRITE_SCORES=True)"
        )
    return list(found.values())


def check_format(fmt):
    """None (csv, and parquet where pyarrow is installed), "csv" or "parquet" (pyarrow needed: a ConfigError
    before any work when it is missing); returns the formats to write."""
    import importlib.util

    if fmt not in (None, *FORMATS):
        raise ConfigError(f'EXPORT must be None, "csv" or "parquet", got {fmt!r}')
    has_arrow = importlib.util.find_spec("pyarrow") is not None
    if fmt == "parquet" and not has_arrow:
        raise ConfigError('EXPORT is "parquet" but pyarrow is not installed: pip install pyarrow, or EXPORT="csv"')
    return ("csv", "parquet") if fmt is None and has_arrow else ("csv",) if fmt is None else (fmt,)


class _Parquet:
    """A parquet file written a batch of rows at a time (its record column int64, or text when an input's
    image ids are not all ints)."""

    def __init__(self, f):
        self.f, self.writer, self.schema, self.batch = f, None, None, []

    def add(self, row):
        self.batch.append(row)
        if len(self.batch) >= BATCH_ROWS:
            self.flush()

    def flush(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.batch:
            return
        columns = list(zip(*self.batch))
        names = COLUMNS + EXTRA_COLUMNS
        if self.schema is None:
            records = [v for v in columns[1] if v is not None]
            ids = pa.int64() if all(isinstance(v, int) and not isinstance(v, bool) for v in records) else pa.string()
            kinds = {"record": ids, "line": pa.int64(), "caption_index": pa.int64()}
            kinds.update({k: pa.float64() for k in ("score", "gap", "prior_gap", "strength")})
            self.schema = pa.schema([(n, kinds.get(n, pa.string())) for n in names])
            self.writer = pq.ParquetWriter(self.f, self.schema)
        if self.schema.field("record").type == pa.string():
            columns[1] = [None if v is None else str(v) for v in columns[1]]
        table = pa.table({n: pa.array(c, type=self.schema.field(n).type) for n, c in zip(names, columns)})
        self.writer.write_table(table)
        self.batch = []

    def close(self):
        self.flush()
        if self.writer is None:  # (no row at all: an empty table with the columns)
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({n: pa.array([], type=pa.string()) for n in COLUMNS + EXTRA_COLUMNS}), self.f)
        else:
            self.writer.close()


def write_table(scored, formats, config=None):
    """The table (each of `formats`) and its meta of one evaluation, written as one set (all or none); returns
    the paths written. A model whose score file is missing is left out and named in the meta and on stderr."""
    import csv
    from contextlib import ExitStack

    from .outputs import OutputSet, write_json
    from .util import provenance

    models, left_out, count = [], [], 0
    paths = [scored.table_path(ext) for ext in formats]
    with OutputSet() as files, ExitStack() as stack:
        sinks = []
        for ext, path in zip(formats, paths):
            f = stack.enter_context(files.open(path, "w" if ext == "csv" else "wb"))
            if ext == "csv":
                writer = csv.writer(f, lineterminator="\n")
                writer.writerow(COLUMNS + EXTRA_COLUMNS)
                sinks.append(writer.writerow)
            else:
                sinks.append(stack.enter_context(_closing_parquet(f)).add)
        for row in scored.rows:
            path = scored.score_file(row)
            if path is None:
                why = (
                    "its evaluation wrote no score file (WRITE_SCORES=False)"
                    if row.get("scores_file") is None
                    else f"its score file {row['scores_file']} is not in {scored.folder}"
                )
                left_out.append({"model": row["model_tag"], "why": why})
                print(f"warning: {scored.key} table: {row['model_tag']} left out: {why}", file=sys.stderr, flush=True)
                continue
            n = 0
            for pair in iter_pairs(path, row["model_tag"]):
                for sink in sinks:
                    sink(pair)
                n += 1
            count += n
            run = row.get("run") or {}
            models.append(
                {
                    "model": row["model_tag"],
                    "scores_file": os.path.basename(path),
                    "rows": n,
                    "run": {k: run.get(k) for k in ("script", "config", "versions", "created")},
                }
            )
        stack.close()  # (the tables finished before the meta names them)
        meta = {
            "files": [os.path.basename(p) for p in paths],
            "columns": list(COLUMNS + EXTRA_COLUMNS),
            "rows": count,
            "evaluation": scored.script,
            "metrics_files": [os.path.basename(p) for p in scored.sources],
            "models": models,
            "left_out": left_out,
            "export": provenance("lgip export", config or {"FORMATS": list(formats)}),
        }
        meta_path = os.path.join(scored.folder, f"{scored.stem}__LGIP_{scored.key}_pairs.meta.json")
        write_json(meta_path, meta, files=files)
    return paths + [meta_path]


class _closing_parquet:
    def __init__(self, f):
        self.table = _Parquet(f)

    def __enter__(self):
        return self.table

    def __exit__(self, kind, value, tb):
        if kind is None:
            self.table.close()


def export(run, fmt=None, config=None):
    """Every evaluation with score files of RUN written as its flat table; returns the paths written."""
    formats = check_format(fmt)
    written = []
    for scored in find_scored(run):
        written += write_table(scored, formats, config)
    return written


def export_after_run(config, script, list_file):
    """An evaluation's EXPORT (None: nothing): its list file's table, made once its rows are written."""
    fmt = config.get("EXPORT")
    if fmt is None or not os.path.isfile(list_file):
        return []
    from .console import detail

    scored = [s for s in find_scored(list_file) if s.script == os.path.basename(script)]
    written = [p for s in scored for p in write_table(s, check_format(fmt), config)]
    for p in written:
        detail(f"-> {p}")
    return written


def write_results(script, config, rows, suffix):
    """An evaluation's rows merged into its list file (`<stem>__<suffix>`, lgip.results), said; then its EXPORT
    table and its TRACKERS (lgip.trackers) from them. Returns the list file's path."""
    from .console import detail
    from .filenames import metrics_path
    from .results import write_rows
    from .trackers import log_evaluation

    path = metrics_path(config["JSONL_PATH"], suffix)
    detail(f"-> {write_rows(path, rows)}")
    export_after_run(config, script, path)
    log_evaluation(script, config, rows, os.path.dirname(path))
    return path


USAGE = """usage: lgip export RUN [--FORMAT=csv|parquet]

  RUN: an evaluation's output folder (every evaluation with score files there) or one of its metrics files.
  Writes, beside the metrics, <stem>__LGIP_<script>_pairs.csv (and .parquet where pyarrow is installed; --FORMAT=
  one of them alone) and <stem>__LGIP_<script>_pairs.meta.json: a row per scored text, columns
  """ + ", ".join(COLUMNS + EXTRA_COLUMNS)


def main(argv):
    """`lgip export ...`: its exit status (2: bad input, named; 4: an output that cannot be written)."""
    from .cli import command_settings, exit_status

    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0

    def work():
        runs, config = command_settings("export", argv, {"FORMAT": None}, USAGE)
        if len(runs) != 1:
            raise ConfigError(f"lgip export takes one RUN, got {len(runs)}\n{USAGE}")
        for path in export(runs[0], config["FORMAT"], config):
            print(f"-> {path}", flush=True)

    return exit_status(work, step=True)
