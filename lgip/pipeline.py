"""pipeline: run_all's steps, each its script's run(**settings) in run_all's process (or a new process: STEP_START
"fresh"), run again only when it must.

A `Step` is a script with the settings it accepts, its inputs and its outputs. `reason_to_run`
says why a step must run, or None when it is up to date: every output exists, none is older than
an input or the script, and it was made with the same settings. After a step, `write_stamp`
records those settings beside its first output (`<output>.run_all.meta.json`, with the outputs'
dates, so that the record vouches only for these files); without that record the settings the
output stores itself are read (a metrics file's run.config, a JSONL's .meta.json).

Example:
    step = Step("diff_gen_caption", "/lgip/diff_gen_caption.py", {"INPUT_JSONL": base}, [base], [perturb])
    reason = reason_to_run(step, pending=set())   # "…_with_perturb.jsonl missing", or None
    if reason:
        run_step(step, 1, 1, reason)              # its output as it comes; a failure exits with its status
"""

import ast
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from .cli import parse_value
from .errors import Terminated
from .records import read_json
from .outputs import write_json

# Settings that never change a step's results: left out of the recorded settings, so that
# changing them re-runs nothing.
NO_EFFECT = {
    "INPUT_JSONL",
    "OUTPUT_JSONL",
    "JSONL_PATH",
    "ANNOTATIONS_JSON",
    "IMAGE_DIR",
    "DEVICE",
    "IMAGE_BATCH_SIZE",
    "TEXT_BATCH_SIZE",
    "NUM_WORKERS",
    "CACHE_DIR",
    "PIXEL_MEMORY_GB",
    "LOOKAHEAD",
    "ON_MODEL_ERROR",
    "VERBOSE",
}  # (ON_MODEL_ERROR: which rows a failure leaves, never a row's figures)


class Step:
    """One step: its script, the settings it gets (those it accepts), its inputs and outputs.
    `settings` ({NAME: value}, run_all's SETTINGS) go to every step whose script has NAME."""

    def __init__(self, name, script, args, inputs, outputs, note=None, settings=None, needs=None):
        self.name, self.script = name, script
        self.inputs, self.outputs = inputs, outputs  # inputs that do not exist are ignored
        self.needs = inputs[:1] if needs is None else needs  # files and folders it cannot run without
        self.note = note  # a reason to skip regardless of dates (make_base without annotations)
        accepted = script_settings(script)
        self.args = {k: v for k, v in args.items() if k in accepted}
        self.args.update({k: v for k, v in (settings or {}).items() if k in accepted})
        self.recorded = {k: v for k, v in self.args.items() if k not in NO_EFFECT}

    @property
    def stamp(self):
        return self.outputs[0] + ".run_all.meta.json"

    def command(self):
        return [sys.executable, self.script] + [f"--{k}={v!r}" for k, v in self.args.items()]

    def shown(self, models_as=None):
        """The command as one can paste it into a shell (strings bare where that means the same).
        models_as: what to print for MODELS instead of its specs (a later step's "as above")."""
        words = ["python", shlex.quote(show(self.script))]
        for k, v in self.args.items():
            if k == "MODELS" and models_as is not None:
                words.append(f"--MODELS=<{models_as}>")
                continue
            arg = f"--{k}={v}" if isinstance(v, str) and parse_value(v) == v else f"--{k}={v!r}"
            if shlex.quote(arg) != arg:  # double quotes read better around Python's single-quoted reprs
                arg = shlex.quote(arg) if any(c in arg for c in '"$`\\!') else f'"{arg}"'
            words.append(arg)
        return " ".join(words)


def script_settings(path):
    """The settings a script accepts: its UPPERCASE constants up to `CONFIG = common.configure(...)`."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError):
        return set()
    names = set()
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and "configure" in ast.dump(node.value.func)
        ):
            break
        names.update(t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper() and not t.id.startswith("_"))
    return names


def show(path):
    """A path as the user reads it: relative to the current folder when below it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def recorded_settings(step):
    """The settings an output was made with: run_all's record when it vouches for the current
    files, else what the output stores itself (metrics: run.config; JSONL: .meta.json).
    Returns (settings or None when unknown, whether they came from run_all's record)."""
    try:
        stamp = read_json(step.stamp)
        if stamp.get("outputs") == {os.path.basename(p): os.stat(p).st_mtime_ns for p in step.outputs}:
            return stamp["settings"], True
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    try:
        path = step.outputs[0]
        if not path.endswith(".metrics.json") and not path.endswith("_analysis.json"):
            path += ".meta.json"
        data = read_json(path)
        config = data[0]["run"]["config"] if isinstance(data, list) else data["config"]
        return {k: config[k] for k in step.recorded if k in config}, False
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None, False


def write_stamp(step):
    write_json(
        step.stamp,
        {
            "step": step.name,
            "script": os.path.basename(step.script),
            "settings": step.recorded,
            "outputs": {os.path.basename(p): os.stat(p).st_mtime_ns for p in step.outputs},
            "note": "written by run_all.py: the settings these outputs were made with",
        },
    )


def reason_to_run(step, pending, force=False, dry_run=False):
    """None when the step is up to date, else why it must run. `pending`: files a dry run would
    rewrite (an earlier step's outputs). An up-to-date output without run_all's record gets one,
    except in a dry run, so that a later change of settings is seen."""
    if step.note:
        return None
    if force:
        return "FORCE=True"
    missing = [p for p in step.outputs if not os.path.exists(p)]
    if missing:
        return f"{show(missing[0])} missing"
    oldest = min(os.stat(p).st_mtime_ns for p in step.outputs)
    for path in step.inputs + [step.script]:
        if path in pending:
            return f"{show(path)} would be rewritten"
        if os.path.exists(path) and os.stat(path).st_mtime_ns > oldest:
            return f"{show(path)} is newer"
    recorded, stamped = recorded_settings(step)
    if recorded is None:
        return "settings of the existing outputs unknown" if step.recorded else None
    wanted = json.loads(json.dumps(step.recorded))  # as read back: tuples are lists
    changed = sorted(
        k
        for k in set(wanted) | set(recorded if stamped else wanted)
        if recorded.get(k, "<unset>") != wanted.get(k, "<unset>")
    )
    if changed:
        return f"settings changed ({', '.join(changed)})"
    if not stamped and not dry_run:
        write_stamp(step)
    return None


def step_setting_hint(key, value, scripts, own):
    """run_all's word on an unknown --NAME that is a step's setting, or close to one: where it goes
    (SETTINGS), as a command line that works; '' when no step has anything like it."""
    from .cli import close_names

    known = set().union(*(script_settings(s) for s in scripts)) - set(own)
    if key in known:
        name, said = key, f"{key} is a step's setting."
    else:
        near = close_names(key, sorted(known))
        if not near:
            return ""
        name = near[0]
        said = f"did you mean {name}, a step's setting?"
    example = {name: value}
    return f"{said} A step's setting goes in SETTINGS: --SETTINGS=\"{example!r}\"; run_all's own "


def check_step_settings(settings, config, scripts, own):
    """run_all's SETTINGS ({NAME: value} for every step that has NAME): a dict, no name run_all sets
    itself (`own`), every name some step's script has, every value its rule allows (lgip.settings,
    before any step's work); run_all's FORCE and DRY_RUN True or False."""
    from .errors import ConfigError
    from .settings import check_settings

    if not isinstance(settings, dict):
        raise ConfigError(f"SETTINGS must be a dict {{NAME: value}}, got {settings!r}")
    known = set().union(*(script_settings(s) for s in scripts))
    for key in settings:
        if key in own:
            raise ConfigError(
                f"SETTINGS may not set {key}: " + (f"use --{key}=..." if key in config else "run_all sets it")
            )
        if key not in known:
            import difflib

            close = difflib.get_close_matches(key, sorted(known - own), n=3)
            mean = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise ConfigError(
                f"SETTINGS: no step has a setting {key!r}{mean}; the steps' settings: {', '.join(sorted(known - own))}"
            )
    check_settings(settings)
    for name in ("FORCE", "DRY_RUN"):
        if not isinstance(config[name], bool):
            raise ConfigError(f"{name} must be True or False, got {config[name]!r}")


def select_steps(steps, names, valid, absent_why=None):
    """The steps STEPS names (None: all; a list of names, or one string "a,b"), in run order; a
    valid name with no step in this plan is an error saying why (`absent_why`: {name: why})."""
    from .errors import ConfigError

    names = names.split(",") if isinstance(names, str) else names
    if names is None:
        return steps
    if not isinstance(names, (list, tuple)):
        raise ConfigError(
            f'STEPS must be None, a list of step names or one string "a,b", got {names!r}; '
            f"valid names: {', '.join(valid)}"
        )
    names = [str(n).strip() for n in names if str(n).strip()]
    for n in names:
        if n not in valid:
            raise ConfigError(f"unknown step {n!r} in STEPS; valid: {', '.join(valid)}")
        if not any(s.name == n for s in steps):
            raise ConfigError(f"STEPS names {n}, which {(absent_why or {}).get(n, 'this run has no step for')}")
    return [s for s in steps if s.name in names]


def _also(first, others):
    """The report's other files under its first line: their names, wrapped under ~160 characters (the folder once,
    where they all share the first's)."""
    import textwrap

    if not others:
        return
    folder = os.path.dirname(first)
    same = all(os.path.dirname(p) == folder for p in others)
    names = [os.path.basename(p) for p in others] if same else others
    lead = f"  also in {folder or '.'}: " if same else "  also: "
    print(textwrap.fill(", ".join(names), width=158, initial_indent=lead, subsequent_indent="    "))


def say_report(base):
    """Where the report of a base JSONL is: the page to open, and the other files written."""
    from .filenames import metrics_path

    page = metrics_path(base, "LGIP_report.html")
    others = [
        show(p)
        for p in (
            metrics_path(base, name)
            for name in (
                "LGIP_report.md",
                "LGIP_report.csv",
                "LGIP_frontier.png",
                "LGIP_prior.png",
                "LGIP_fliptypes.png",
                "LGIP_retrieval.png",
                "LGIP_image_side.png",
                "LGIP_factors.png",
                "LGIP_classification_tradeoff.png",
                "LGIP_classification_reliability.png",
            )
        )
        if os.path.isfile(p)
    ]
    if os.path.isfile(page):
        print(f"report: open {show(page)} in a browser")
        _also(show(page), others)
    elif others:
        print(f"report: {others[0]}")
        _also(others[0], others[1:])
    else:
        print(f"report: not written yet (step report -> {show(page)})")


def blockers(steps, models, skip_models=False):
    """What a run of these steps would stop at, found before any of them runs: models whose files
    cannot be had (lgip.models.hub; with `skip_models`, ON_MODEL_ERROR "skip", only said, unless it is
    every model), inputs a step needs that are neither there nor made by an earlier step. Lines to
    print, [] when none."""
    from .models.hub import check_models, describe

    lines, made = [], set()
    models = list(models) + _own_models(steps, models)
    if any("MODELS" in s.args or "MODEL" in s.args for s in steps):
        problems = check_models(models)
        said = [f"{len(problems)} of {len(models)} models cannot be had:"] + ["  " + x for x in describe(problems)]
        if problems and skip_models and len(problems) < len(models):
            print(
                "\n".join(said[:1] + [x for x in said[1:]]) + "\n(ON_MODEL_ERROR=skip: the steps leave them out)",
                flush=True,
            )
        elif problems:
            lines += said
    for s in steps:
        lines += [
            f"step {s.name}: {show(p)} is not there (and no earlier step makes it)"
            for p in s.needs
            if p not in made and not os.path.exists(p) and not s.note
        ]
        made.update(s.outputs)
    return lines


def _own_models(steps, models):
    """The MODEL specs of steps (fine-tuning's start) that MODELS does not name and no earlier step makes: they
    must be had before any step too. An earlier step makes a model when it writes into its local path, or the
    `model_spec.json` beside it (a fine-tuning run's folder: the shapes world's pretrained model)."""
    from .models.families import known_family

    out, made, named = [], set(), {m.get("name") for m in models if isinstance(m, dict)}
    for s in steps:
        spec = s.args.get("MODEL")
        kind = known_family(spec)
        if kind is not None and spec.get("name") not in named:
            paths = [os.path.abspath(p) for _, p in kind.local_paths(spec)]
            ahead = {os.path.join(os.path.dirname(p), "model_spec.json") for p in paths}
            if not any(o in ahead or o == p or o.startswith(p + os.sep) for p in paths for o in made):
                out.append(spec)
                named.add(spec.get("name"))
        made.update(os.path.abspath(o) for o in s.outputs)
    return out


def stopped_by(proc, sigterm, grace=25):
    """Let a step that was stopped end as it does (its rows encoded so far written to the cache):
    SIGTERM is passed on (a scheduler may have signalled this process alone; a step that got it
    too ignores the second), Ctrl-C reached it from the terminal. One still running after `grace`
    seconds gets SIGTERM (again), then SIGKILL: a scheduler's SIGKILL follows 30 s after its SIGTERM."""
    if sigterm:
        proc.send_signal(signal.SIGTERM)
    for then in (signal.SIGTERM, signal.SIGKILL):
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.send_signal(then)
        except KeyboardInterrupt:  # a second Ctrl-C: stop it now
            proc.send_signal(signal.SIGKILL)
    return proc.wait()


def _in_process(step):
    """Step's script's run(**args) in this process (lgip.scripts loads it once), as `python <script> --NAME=value`
    would run it: its exit status (the command line's: lgip.cli.exit_status), its output on this process's."""
    import gc
    from . import scripts
    from .cli import exit_code, exit_status

    module = scripts.load(os.path.splitext(os.path.basename(step.script))[0])
    try:
        return exit_status(lambda: module.run(**step.args), step=True)
    except SystemExit as e:  # (a script's own exit)
        return exit_code(e)
    except Exception:  # a bug: its traceback, as a new process would print it, and status 1
        import traceback

        traceback.print_exc()
        return 1
    finally:  # (the step's models and tensors are its own: freed before the next step)
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def in_process(step):
    """Whether run_all may run `step` in its own process: its script is one of the checkout's (lgip.scripts)."""
    from . import scripts

    name = os.path.splitext(os.path.basename(step.script))[0]
    return name in scripts.SCRIPTS and os.path.dirname(os.path.abspath(step.script)) == scripts.ROOT


def _new_process(step):
    """Step as a new Python process: its exit status (negative: the signal that ended it)."""
    proc = subprocess.Popen(step.command())
    try:
        return proc.wait()
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the step stops as cleanly, and is waited for
        stopped_by(proc, isinstance(e, Terminated))
        return 143 if isinstance(e, Terminated) else 130


_MODELS_SHOWN = {}  # repr(MODELS) -> the step that printed those specs in full (later steps point to it)


def new_run():
    """Forget the specs shown by an earlier run in this process (run_all called twice from Python, or in tests):
    each run shows its own in full once."""
    _MODELS_SHOWN.clear()


def interrupted(name, stopped, force):
    """The error line of a run stopped during step `name` (by SIGTERM, else Ctrl-C), and how to go on: under
    FORCE=True the same command would run every step again, so the advice leaves FORCE out."""
    how = "stopped by SIGTERM" if stopped else "interrupted"
    again = (
        "Run the same command without --FORCE=True to go on (with it, every step runs again)"
        if force
        else "Run the same command again to go on"
    )
    return (
        f"error: {how} during step {name}; later steps not run. {again}: finished steps are skipped, "
        "an interrupted evaluation resumes from its cache"
    )


def run_step(step, k, n, reason, dry_run=False, start="process", verbose=True, force=False):
    """Run step k of n (print its command, its output as it comes, stamp its outputs); in a dry run only
    say it would. A failing step exits with its status, a stopped one with 130 (Ctrl-C) or 143 (SIGTERM).
    The model specs are printed in full by the first step that takes them; a later step with the same
    specs says whose (a failing step's error gives its whole command). start: "process" (its script's
    run(**args) in this process, where in_process allows) or "fresh" (a new Python process). verbose False:
    the step's one line (its command and time left out; a dry run says them all the same); the step's own
    detail follows the VERBOSE setting run_all passes it (lgip.console)."""
    tag = f"[{k}/{n}] {step.name}"
    if not os.path.isfile(step.script):
        raise SystemExit(f"error: step {step.name}: {step.script} not found")
    shown = step.shown()
    models = repr(step.args.get("MODELS")) if "MODELS" in step.args else None
    first = _MODELS_SHOWN.setdefault(models, f"[{k}/{n}] {step.name}") if models else None
    said = shown if first in (None, tag) else step.shown(models_as=f"the model specs of {first}")
    if verbose or dry_run:
        print(f"{tag}: {'would run' if dry_run else 'run'} ({reason})\n  $ {said}", flush=True)
    else:
        print(f"{tag}: {reason}", flush=True)
    if dry_run:
        return
    t0 = time.perf_counter()
    # (the step says as much as `verbose` through its own VERBOSE setting, which run_all passes it)
    rc = _in_process(step) if start == "process" and in_process(step) else _new_process(step)
    if rc in (130, 143, -signal.SIGINT, -signal.SIGTERM):
        stopped = rc in (143, -signal.SIGTERM)
        print("\n" + interrupted(step.name, stopped, force), file=sys.stderr)
        raise SystemExit(143 if stopped else 130)
    seconds = time.perf_counter() - t0
    if rc != 0:
        status = rc if rc > 0 else 128 - rc  # killed by a signal: the shell's convention
        print(f"{tag}  FAILED after {seconds:.1f} s (exit status {status})", flush=True)
        print(
            f"error: step {step.name} failed (exit status {status}); later steps not run. Its command:\n  {shown}",
            file=sys.stderr,
        )
        raise SystemExit(status)
    write_stamp(step)
    if verbose:
        print(f"{tag}  done in {seconds:.1f} s -> {show(step.outputs[0])}", flush=True)
