"""lgip.trackers: the figures also logged to the experiment trackers researchers use (setting TRACKERS: any of
"wandb", "mlflow", "tensorboard"), each library imported only when named: an evaluation's figures per model once
its rows are written (`log_evaluation`, which any step calls with its rows), fine-tuning's loss terms a step at a
time (`finetune_logger`, fed by lgip.trainer's log line), and, on W&B, a table of each model's scored pairs with
the image's thumbnail (lm-evaluation-harness's and lmms-eval's per-sample tables).

Where each writes: W&B a run in project $WANDB_PROJECT (else "lgip"), its files in $WANDB_DIR (else the outputs'
folder), online or as $WANDB_MODE says (offline: `wandb sync` later); MLflow a run in experiment
$MLFLOW_EXPERIMENT_NAME (else "lgip") at $MLFLOW_TRACKING_URI (else MLflow's default); TensorBoard event files in
`<stem>__LGIP_tensorboard/<evaluation>/` beside the metrics (fine-tuning: `tensorboard/` in its run folder). A run
already open in the process (wandb.run, mlflow.active_run(): a training loop's own) gets the figures and is left
open. A tracker that fails to log is said on stderr; the outputs are written by then and stay.

    >>> log_evaluation("run_lgip_multi.py", config, rows, folder)     # config["TRACKERS"] = ["wandb"]
    >>> on_line, close = finetune_logger(config, "runs/ft_lgip", "lgip"); on_line(log_line); close()
"""

import os
import re
import sys

from .util import jsonable

SAMPLE_ROWS = 500  # scored pairs per model in W&B's per-sample table (the score file's first, in its order)
THUMBNAIL_PX = 96  # the longer side of an image's thumbnail in that table
LOSS_KEYS = ("loss", "loss_clip", "loss_sc", "loss_inv", "loss_vc", "lr", "logit_scale", "logit_bias", "grad_norm")
LOSS_KEYS += ("num_flips", "num_paraphrases")
SKIPPED = ("run", "model_card")  # (a row's provenance and card: not figures)


def figures(row, prefix=""):
    """The numbers of a metrics row, flattened: {"sensitivity_pos_rate": 0.61, "by_flip_type/color/pos_rate": ...};
    intervals, texts and the run block left out."""
    out = {}
    for key, value in row.items():
        if key in SKIPPED and not prefix:
            continue
        if isinstance(value, dict):
            out.update(figures(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            out[prefix + key] = float(value)
    return out


def _flat_params(config):
    """A configuration as tracker parameters: NAME -> its value as text (long values cut, the whole in outputs)."""
    out = {}
    for key, value in jsonable(config).items():
        text = value if isinstance(value, str) else repr(value)
        out[key] = text if len(text) <= 480 else text[:477] + "..."
    return out


class _WandB:
    def __init__(self, name, config, folder, kind):
        import wandb

        self.wandb, self.own = wandb, wandb.run is None
        self.run = wandb.run or wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "lgip",
            name=name,
            job_type=kind,
            config=jsonable(config),
            dir=os.environ.get("WANDB_DIR") or folder,
        )

    def log(self, values, step=None):
        self.run.log(values, **({} if step is None or not self.own else {"step": step}))

    def samples(self, key, pairs, image_root):
        """A table per model of its scored pairs (the caption's image as a thumbnail), logged under `key`."""
        from PIL import Image

        thumbs, rows = {}, []
        for pair in pairs:
            path = pair["image_path"]
            if path not in thumbs:
                try:
                    with Image.open(os.path.join(image_root, path)) as im:
                        im = im.convert("RGB")
                        im.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX))
                        thumbs[path] = self.wandb.Image(im, caption=path)
                except OSError:  # (an image gone since: the row without its picture)
                    thumbs[path] = None
            rows.append([thumbs[path]] + [pair[c] for c in SAMPLE_COLUMNS[1:]])
        self.run.log({key: self.wandb.Table(columns=list(SAMPLE_COLUMNS), data=rows)})

    def close(self):
        if self.own:
            self.run.finish()


SAMPLE_COLUMNS = ("image", "image_path", "caption", "kind", "type", "text", "caption_score", "score", "gap")


def _metric_name(key):
    return re.sub(r"[^\w./ :-]", "_", key)  # (MLflow's characters)


class _MLflow:
    def __init__(self, name, config, folder, kind):
        import mlflow

        self.mlflow, self.own = mlflow, mlflow.active_run() is None
        if self.own:
            if not (os.environ.get("MLFLOW_EXPERIMENT_NAME") or os.environ.get("MLFLOW_EXPERIMENT_ID")):
                mlflow.set_experiment("lgip")
            mlflow.start_run(run_name=name, tags={"lgip.kind": kind})
            mlflow.log_params(_flat_params(config))

    def log(self, values, step=None):
        self.mlflow.log_metrics({_metric_name(k): v for k, v in values.items()}, step=step)

    def close(self):
        if self.own:
            self.mlflow.end_run()


class _TensorBoard:
    def __init__(self, name, config, folder, kind):
        from torch.utils.tensorboard import SummaryWriter

        os.makedirs(folder, exist_ok=True)
        self.calls = sum(1 for f in os.listdir(folder) if f.startswith("events.out.tfevents"))
        self.writer = SummaryWriter(log_dir=folder)
        self.writer.add_text("config", "\n\n".join(f"{k}: {v}" for k, v in _flat_params(config).items()), 0)

    def log(self, values, step=None):
        step = self.calls if step is None else step  # (an evaluation: its call's ordinal in this folder)
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step)

    def close(self):
        self.writer.close()


BACKENDS = {"wandb": _WandB, "mlflow": _MLflow, "tensorboard": _TensorBoard}


class Trackers:
    """The trackers named, each opened on a run of its own (or the one already open); a failure of one is said
    and that tracker dropped, never the outputs or the other trackers."""

    def __init__(self, names, name, config, folder, kind, tensorboard_folder):
        self.open = []
        for tracker in names or []:
            where = tensorboard_folder if tracker == "tensorboard" else folder
            self._try(tracker, lambda: self.open.append((tracker, BACKENDS[tracker](name, config, where, kind))))

    def _try(self, tracker, call):
        try:
            call()
            return True
        except Exception as e:  # (a tracker's own error, login or disk: the outputs are written and stay)
            print(f"warning: TRACKERS: {tracker} could not log ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
            self.open = [(t, b) for t, b in self.open if t != tracker]
            return False

    def log(self, values, step=None):
        for tracker, backend in list(self.open):
            self._try(tracker, lambda: backend.log(values, step))

    def samples(self, key, pairs, image_root):
        for tracker, backend in list(self.open):
            if hasattr(backend, "samples"):
                self._try(tracker, lambda: backend.samples(key, pairs, image_root))

    def close(self):
        for tracker, backend in list(self.open):
            self._try(tracker, backend.close)
        self.open = []


def _pairs(score_file, model, limit=SAMPLE_ROWS):
    """The first `limit` scored pairs (not captions) of a model's score file, as dicts of SAMPLE_COLUMNS."""
    from .scorefile import COLUMNS, EXTRA_COLUMNS, iter_pairs

    names, out, caption = COLUMNS + EXTRA_COLUMNS, [], None
    for values in iter_pairs(score_file, model):
        row = dict(zip(names, values))
        if row["kind"] == "caption":
            caption = row
            continue
        image_kind = row["kind"].startswith("image_")
        out.append(
            {
                "image_path": row["image_path"],
                "caption": caption["text"],
                "kind": row["kind"],
                "type": row["type"],
                "text": row["text"] if not image_kind else f"({row['type']} of the image) {row['text']}",
                "caption_score": caption["score"],
                "score": row["score"],
                "gap": row["gap"],
            }
        )
        if len(out) >= limit:
            break
    return out


def log_evaluation(script, config, rows, folder):
    """An evaluation's rows logged to config["TRACKERS"] (nothing when it names none): each model's figures under
    `<evaluation>/<figure>` (one model) or `<evaluation>/<model>/<figure>` (several), and on W&B a table of each
    model's first SAMPLE_ROWS scored pairs with the image's thumbnail (a row whose score file is in `folder`)."""
    names = config.get("TRACKERS") or []
    if not names or not rows:
        return
    from .scorefile import script_key

    key = script_key(script)
    stem = os.path.splitext(os.path.basename(config.get("JSONL_PATH") or key))[0]
    trackers = Trackers(
        names, f"{key} {stem}", config, folder, "eval", os.path.join(folder, f"{stem}__LGIP_tensorboard", key)
    )
    try:
        values = {}
        for row in rows:
            prefix = f"{key}/" if len(rows) == 1 else f"{key}/{row['model_tag']}/"
            values.update({prefix + k: v for k, v in figures(row).items()})
        trackers.log(values)
        root = config.get("IMAGE_ROOT") or os.path.dirname(os.path.abspath(config.get("JSONL_PATH") or "."))
        for row in rows:
            name = row.get("scores_file")
            if any(t == "wandb" for t, _ in trackers.open) and name and os.path.isfile(os.path.join(folder, name)):
                trackers.samples(
                    f"{key}/{row['model_tag']}/pairs", _pairs(os.path.join(folder, name), row["model_tag"]), root
                )
    finally:
        trackers.close()


def finetune_logger(config, folder, run_name):
    """(on_line, close): on_line(train_log.jsonl's line) logs a fine-tuning step's loss terms, lr, logit scale,
    gradient norm and draws at its step; close() ends the runs. Nothing is opened when TRACKERS names none."""
    names = config.get("TRACKERS") or []
    if not names:
        return None, lambda: None
    trackers = Trackers(names, run_name, config, folder, "finetune", os.path.join(folder, "tensorboard"))

    def on_line(line):
        trackers.log({k: float(line[k]) for k in LOSS_KEYS if line.get(k) is not None}, step=int(line["step"]))

    return on_line, trackers.close
