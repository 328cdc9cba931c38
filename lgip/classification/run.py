"""lgip.classification.run: run_lgip_classification.py's loop (LGIP_SPEC.md 16): the step's own settings checked and
DATASETS read before any model loads, each model of MODELS whose scorer gives class scores (lgip.scorers:
"class_scores"; a text-only model left out in a line) run as every evaluation runs one (lgip.evaluation.ModelRun:
its cache, a cached re-run without weights, the accelerations, LOOKAHEAD, ON_MODEL_ERROR, torchrun: each process
a share of each set's images, the class scores gathered on rank 0), its JSONL written at once, its row kept; the
paired comparisons added once all are done and the rows merged into `<N>__LGIP_classification.metrics.json`.

    >>> rows = classify(__file__, CONFIG, shapes_root="shapes")
"""

import os
import sys

import numpy as np

from .. import accelerations
from ..batch import ModelLoop
from ..console import detail
from ..demo import demo_block
from ..errors import ConfigError, Interrupted, ModelError
from ..evaluation import ModelRun, model_lines
from ..filenames import metrics_path
from ..lookahead import Lookahead
from ..models.cards import model_card
from ..outputs import atomic_open
from ..ranks import distributed
from ..results import write_rows
from ..scorers import ClassRequest, ClassTask, gives, leave_out
from ..settings import setting
from ..util import Timer, fmt, jsonable, provenance
from .datasets import load_sets, read_templates
from .figures import OOD_SCORES
from .rows import comparisons, model_figures

OWN = ("DATASETS", "TEMPLATES", "GENERATIVE_TEMPLATES", "OOD_SCORE", "SPLIT_SEED", "BOOTSTRAP", "BOOTSTRAP_SEED")
METRICS = "LGIP_classification.metrics.json"
PROTOCOL_NOTE = (
    "classification has no published output: its class prompts are encoded as the corrected protocol encodes "
    "texts whatever PROTOCOL (LGIP_SPEC.md 16), so each model is loaded as the corrected protocol loads it"
)


def output_name(config):
    """N of the outputs: JSONL_PATH's stem, else "lgip" (in OUTPUT_DIR, or the working folder)."""
    return config.get("JSONL_PATH") or os.path.abspath("lgip.jsonl")


def check_settings(config, models):
    """The step's own settings (ConfigError, exit status 2, before any work): OOD_SCORE, SPLIT_SEED,
    GENERATIVE_TEMPLATES, and "mcm" only with models that give embeddings."""
    if config["OOD_SCORE"] not in OOD_SCORES:
        raise ConfigError(f"OOD_SCORE must be one of {', '.join(map(repr, OOD_SCORES))}, got {config['OOD_SCORE']!r}")
    seed = config["SPLIT_SEED"]
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"SPLIT_SEED must be an int (the temperature split's seed), got {seed!r}")
    read_templates(config["GENERATIVE_TEMPLATES"], "GENERATIVE_TEMPLATES")
    if config["OOD_SCORE"] == "mcm":
        for spec in models:
            if isinstance(spec, dict) and not gives(spec, ("embeddings",)):
                raise ConfigError(
                    f'OOD_SCORE "mcm" is a softmax over a dual encoder\'s cosines: model {spec.get("name")!r} '
                    f'(type {spec.get("type")!r}) has none; use "msp" or "maxlogit", or leave it out of MODELS'
                )


def classify(script, config, shapes_root=None):
    """The step (module docstring): the rows written (rank 0; None on the other ranks, or when every model is left
    out)."""
    check_settings(config, config["MODELS"])
    models = leave_out(config["MODELS"], ("class_scores",), os.path.basename(script))
    if not models:
        return None
    sets = load_sets(config["DATASETS"], config["TEMPLATES"], shapes_root)  # (bad input: before any model loads)
    if config["PROTOCOL"] != "corrected":
        print(f"{os.path.basename(script)}: note: {PROTOCOL_NOTE}", flush=True)
    run_config = dict(config, MODELS=models, PROTOCOL="corrected", JSONL_PATH=output_name(config))
    settings = {k: config[k] for k in OWN}
    settings["GENERATIVE_TEMPLATES"] = read_templates(config["GENERATIVE_TEMPLATES"], "GENERATIVE_TEMPLATES")
    rank, world = distributed()
    loop = ModelLoop(run_config, models, distributed=world > 1)
    switched = accelerations.switch_off(setting(config, "ACCELERATIONS_OFF"))
    runnable = loop.runnable
    ahead = (
        Lookahead(runnable[1:], "corrected", config["NUM_WORKERS"], setting(config, "PIXEL_MEMORY_GB"))
        if setting(config, "LOOKAHEAD") and accelerations.LOOKAHEAD and len(runnable) > 1
        else None
    )
    rows, kept = [], []
    try:
        for spec in runnable:
            with Timer() as t, loop.model(spec) as ok:
                run = ModelRun(spec, [], run_config, lookahead=ahead)
                try:
                    scores = run.score_classes(_request(sets, rank, world, settings))
                finally:
                    run.release()
                scored = _gathered(run, sets, scores, config["OOD_SCORE"] == "mcm")
                if run.is_main:
                    row, made = _model_row(script, config, run, spec, sets, scored, scores, settings)
            if not ok or not run.is_main:
                continue
            row["run"]["seconds"] = round(t.seconds, 3)
            rows.append(row)
            kept.append((row["model_tag"], made.kept))
            said = model_lines(row["model_tag"], summary(row), f"({t.seconds:.1f} s){loop.progress()}")
            print("\n".join(said), flush=True)
    except KeyboardInterrupt:
        done = ", ".join(r["model_tag"] for r in rows) or "none"
        raise Interrupted(
            f"models finished: {done} (their JSONL files are written; the metrics file is written at the end); "
            f"the embeddings and scores computed so far are in the cache: the same command resumes from it"
        ) from None
    finally:
        if ahead is not None:
            ahead.close()
        accelerations.restore(switched)
    if rank == 0:
        paired = comparisons(kept, sets, settings)
        for row in rows:
            row["comparisons"] = paired.get(row["model_tag"], [])
        loop.finish(rows)
        detail(f"-> {write_rows(metrics_path(run_config['JSONL_PATH'], METRICS), rows)}", flush=True)
    if world > 1:  # (every rank ends here together, then leaves the group: lgip.evaluation.evaluate_models)
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return rows if rank == 0 else None


def _request(sets, rank, world, settings):
    """This process's share of each set's images (every world-th), each set's classes and templates."""
    tasks = [ClassTask(s.images[rank::world], list(s.classes), list(s.templates)) for s in sets]
    return ClassRequest(tasks, generative_templates=list(settings["GENERATIVE_TEMPLATES"]))


def _gathered(run, sets, scores, keep_cos):
    """{set name: (z [n, C], cos or None, {index: why not read})} in each set's own order, every process's share
    put back in place on rank 0 (None on the others)."""
    mine = [(z, c if keep_cos else None, f) for z, c, f in zip(scores.z, scores.cos, scores.failed)]
    parts = run.gathered(mine) if run.world > 1 else [mine]
    if not run.is_main:
        return None
    out = {}
    for j, s in enumerate(sets):
        n = len(s.images)
        z = np.full((n, len(s.classes)), np.nan)
        cos = np.full((n, len(s.classes)), np.nan) if keep_cos and parts[0][j][1] is not None else None
        failed = {}
        for r, part in enumerate(parts):
            pz, pc, pf = part[j]
            z[r :: run.world] = pz
            if cos is not None:
                cos[r :: run.world] = pc
            failed.update({r + run.world * i: why for i, why in pf.items()})
        out[s.name] = (z, cos, dict(sorted(failed.items())))
    return out


def _model_row(script, config, run, spec, sets, scored, scores, settings):
    """One model's row (LGIP_SPEC.md 16's keys) and its figures; its JSONL written here, at once."""
    name = run.enc.name
    _check_finite(name, sets, scored)
    for s in sets:
        for j, why in list(scored[s.name][2].items())[:20]:
            print(f"warning: {name}: {s.name}: skipping unreadable image {s.shown[j] or j} ({why})", file=sys.stderr)
    if scores.scale_said:
        print(f"{name}: {scores.scale_said}", flush=True)
    made = model_figures(sets, scored, settings)
    row = {
        "model": name,
        "model_tag": name,
        "score_kind": run.enc.score_kind,
        "logit_scale": scores.logit_scale,
        **made.figures,
        "comparisons": [],
        "model_card": model_card(spec, run.enc),
        "settings": {**jsonable(settings), "templates": {s.name: s.templates for s in sets if s.role != "ood"}},
        "run": _run_block(script, config, run, sets, scored, scores),
    }
    path = metrics_path(output_name(config), f"LGIP_classification_{name}.jsonl")
    with atomic_open(path) as f:
        f.writelines(_json_line(line) for line in made.lines)
    detail(f"-> {path}", flush=True)
    return row, made


def _json_line(obj):
    import json

    return json.dumps(obj, ensure_ascii=False) + "\n"


def _check_finite(name, sets, scored):
    """ModelError (before anything of the model is written) when a read image's class score is NaN or infinite: a
    model that overflowed (bf16, fp16), or NaN in its weights."""
    for s in sets:
        z, _, failed = scored[s.name]
        ok = [j for j in range(len(s.images)) if j not in failed]
        bad = [j for j in ok if not np.isfinite(z[j]).all()]
        if bad:
            raise ModelError(
                f"model {name!r}: {len(bad)} image(s) of {s.name!r} have class scores that are not finite (NaN or "
                f'inf; first: {s.shown[bad[0]] or bad[0]}): run it with DTYPE="float32" (an overflow), or check '
                f"its weights. Nothing was written for it."
            )


def _run_block(script, config, run, sets, scored, scores):
    """What made the row: settings and versions (provenance), the model, the processes, the accelerations, the
    cache, where the time went, the images read and not."""
    enc = run.enc
    info = provenance(script, config)
    info["model"] = {
        "name": enc.name,
        "type": enc.type,
        "protocol": "corrected",
        "device": str(enc.device),
        "dtype": str(enc.dtype).replace("torch.", ""),
        **enc.info,
    }
    if config["PROTOCOL"] != "corrected":
        info["protocol_note"] = PROTOCOL_NOTE
    if enc.demo:
        info["demo"] = demo_block(True, None)
    failed = [(s, j, why) for s in sets for j, why in scored[s.name][2].items()]
    applied, not_applied = accelerations.applied(enc)
    info.update(
        num_processes=run.world,
        accelerations=applied,
        accelerations_not_applied=not_applied,
        seconds_by_phase=dict(run.seconds, **scores.seconds),
        lookahead=scores.ahead,
        texts=scores.texts,
        image_sources=scores.image_sources,
        num_images={s.name: len(s.images) for s in sets},
        num_failed_images=len(failed),
        failed_images=[{"dataset": s.name, "image": s.shown[j] or j, "error": why} for s, j, why in failed[:20]],
    )
    if run.cache is not None:
        info["cache"] = {"dir": run.cache.dir, **run.cache.stats, "resumed": scores.resumed}
    return info


def summary(row):
    """A model's lines, one a set: each set's acc1 and ECE (and after T*), each OOD set's AUROC and FPR@95, shape
    bias."""
    f = lambda v: fmt(v, ".3f")
    parts = []
    for name, d in row["datasets"].items():
        if d["role"] != "ood":
            parts.append(f"{name} acc1 {f(d['acc1'])}, ECE {f(d['ece'])} -> {f(d['ece_t'])}")
    parts += [f"{name} AUROC {f(o['auroc'])}, FPR@95 {f(o['fpr95'])}" for name, o in row["ood"].items()]
    parts += [f"{name} shape bias {f(c['shape_bias'])}" for name, c in row["cue_conflict"].items()]
    t = row["temperature"]
    if t is not None and parts:  # (the fit temperature and the model's own scale: after the first set's figures)
        parts[0] += f" (T* {t:.3f}, s {f(row['logit_scale'])})"
    return "\n".join(parts)  # (a line a set: the console's lines stay short with many sets)
