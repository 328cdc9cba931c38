"""lgip.batch: a run over many models as a batch job (LGIP_SPEC.md section 12): the progress
over models (done, left, failed, elapsed), and ON_MODEL_ERROR="skip", which leaves a model that
cannot be had, loaded or run out of the rows (never a row of its own) with its error recorded in
`skipped_models: [{name, error}]` of the run block of every row the run writes, so one model whose
weights fail does not cost the other 99. A run where every model fails ends with an error.

    >>> loop = ModelLoop(config, models)              # the Hub checked: ON_MODEL_ERROR "stop" stops here
    >>> for spec in loop.runnable:
    ...     with loop.model(spec) as ok:              # an error of the model's own: recorded, the loop goes on
    ...         metrics = evaluate(spec)
    ...     if ok: rows.append(metrics); print(loop.progress(spec["name"]))
    >>> loop.finish(rows)                             # run.skipped_models stamped; all failed: ModelError
"""

import sys
import time
from contextlib import contextmanager

from .settings import setting
from .errors import ConfigError, InputError, Interrupted, ModelError, OutputError
from .models.hub import check_models, describe, require_models

# errors that are not a model's own: the input, the settings, the disk, a stop asked for
NOT_THE_MODELS = (InputError, ConfigError, OutputError, Interrupted, KeyboardInterrupt)


class ModelLoop:
    def __init__(self, config, models, distributed=False):
        self.skip = setting(config, "ON_MODEL_ERROR") == "skip"
        self.distributed = distributed  # (torchrun: a failure on one rank would leave the others waiting)
        self.models, self.skipped, self.done, self.t0 = list(models), [], 0, time.perf_counter()
        if not self.skip:
            require_models(self.models)  # before the first model's work: not after an hour
            self.runnable = list(self.models)
            return
        problems = check_models(self.models)
        for line in describe(problems) if problems else []:
            print(f"warning: ON_MODEL_ERROR=skip: {line}", file=sys.stderr, flush=True)
        self.skipped = [{"name": name, "error": msg} for name, msg in problems.items()]
        self.runnable = [m for m in self.models if not (isinstance(m, dict) and m.get("name") in problems)]

    @contextmanager
    def model(self, spec):
        """Run one model's work; with ON_MODEL_ERROR "skip" an error of the model's own (not the
        input's, the settings', the disk's, nor a Ctrl-C) is recorded and the block left: the flag it
        yields is then False."""
        ok = _Flag(True)
        try:
            yield ok
        except NOT_THE_MODELS:
            raise
        except Exception as e:
            if not self.skip or self.distributed:
                raise
            ok.value = False
            error = f"{type(e).__name__}: {e}".strip()
            self.skipped.append(
                {"name": spec.get("name") if isinstance(spec, dict) else str(spec), "error": error[:2000]}
            )
            print(
                f"warning: ON_MODEL_ERROR=skip: model {self.skipped[-1]['name']!r} failed and is left out: "
                f"{error.splitlines()[0][:300]}",
                file=sys.stderr,
                flush=True,
            )

    def progress(self, name=None):
        """'[k/n]' and, over several models, done / left / failed and the time so far."""
        self.done += 1
        n = len(self.models)
        if n <= 1:
            return ""
        minutes = (time.perf_counter() - self.t0) / 60
        return (
            f" [{self.done + len(self.skipped)}/{n}: {self.done} done, {n - self.done - len(self.skipped)} left, "
            f"{len(self.skipped)} failed, {minutes:.1f} min]"
        )

    def finish(self, rows):
        """Every row's run block gets `skipped_models` (with ON_MODEL_ERROR "skip"); ModelError when
        every model failed."""
        if self.skip:
            for row in rows:
                if isinstance(row, dict) and isinstance(row.get("run"), dict):
                    row["run"]["skipped_models"] = list(self.skipped)
        if self.skipped:
            names = ", ".join(s["name"] for s in self.skipped)
            print(
                f"{len(self.skipped)} of {len(self.models)} models skipped (ON_MODEL_ERROR=skip): {names}", flush=True
            )
        if self.skipped and not rows and len(self.skipped) == len(self.models):
            raise ModelError(
                f"every model failed ({len(self.skipped)}), so nothing was written:\n  "
                + "\n  ".join(f"{s['name']}: {s['error'].splitlines()[0][:300]}" for s in self.skipped)
            )
        return rows


class _Flag:
    def __init__(self, value):
        self.value = value

    def __bool__(self):
        return self.value
