"""run_all: the whole LGIP pipeline in order, skipping the steps whose outputs are up to date.

  python run_all.py                                  # COCO when present beside the scripts, else the demo
  python run_all.py --DATA='coco' --PROTOCOL='reference' --STEPS='run_lgip_multi,report'
  python run_all.py --DRY_RUN=True                   # what would run, and why; runs nothing

Data: COCO (the base JSONL BASE_JSONL, built from ANNOTATIONS_JSON by make_base when missing)
or, when no COCO is present, the demo bundled in demo/ (12 synthetic images, MIT, see
demo/README.md). Every output is written next to its input (the base JSONL's folder).

Steps (names for STEPS), each a subprocess of this Python with its output streamed:
  make_base                    annotations -> base JSONL (COCO only; needs ANNOTATIONS_JSON)
  diff_gen_caption             base -> <stem>_with_perturb.jsonl
  make_perturb_with_fliptypes  base -> <stem>_with_fliptypes.jsonl
  rebuttal_enhanced_perturb    base -> rebuttal_enhanced_<stem>_with_fliptypes.jsonl
  run_lgip_multi               _with_perturb.jsonl -> <its stem>__LGIP_ALL.metrics.json
  run_lgip_by_fliptype         _with_fliptypes.jsonl -> <its stem>__LGIP_fliptypes.metrics.json
  run_lgip_retrieval           _with_fliptypes.jsonl -> <its stem>__LGIP_retrieval.metrics.json (from the cached embeddings)
  explain_flips                _with_fliptypes.jsonl (+ its score files) -> <its stem>__LGIP_explain.metrics.json
  rebuttal_enhanced_lgip       rebuttal_enhanced_..jsonl -> <its stem>__ENHANCED_LGIP_analysis.json
  report                       the metrics -> <base stem>__LGIP_report.html/.md/.csv and plots

A step is skipped ("up to date") when all its outputs exist, none is older than its inputs
or its script, and it was made with the same settings: after each step run_all records the
settings that shape its results in `<output>.run_all.meta.json` (without that record it
reads the settings the output stores itself). FORCE=True re-runs the chosen steps. The
first failing step stops the run with its exit status.
"""
import ast
import json
import os
import shlex
import subprocess
import sys
import time

import common

_HERE = os.path.dirname(os.path.abspath(__file__))
ANNOTATIONS_JSON = os.path.join(_HERE, "annotations", "captions_train2017.json")  # COCO captions_train2017.json (make_base's input)
IMAGE_DIR = os.path.join(_HERE, "train2017", "train2017")  # folder of the COCO images (make_base checks each file there)
BASE_JSONL = os.path.join(_HERE, "lgip_coco_native5_train2017.jsonl")  # COCO base JSONL (made by make_base when missing); outputs go beside it
DEMO_JSONL = os.path.join(_HERE, "demo", "lgip_demo.jsonl")  # the bundled demo base JSONL (12 records); its outputs go beside it
DATA = "auto"  # "auto" (COCO when ANNOTATIONS_JSON or BASE_JSONL exists, else the demo), "coco" or "demo"
MODELS = None  # list of model specs (see run_lgip_multi.py); None = the nine published models for COCO, the smallest (openclip_ViT-B-16_openai, downloaded on first use) for the demo
PROTOCOL = "corrected"  # "corrected" (texts encoded as each model was trained) or "reference" (as the published code)
DEVICE = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
DTYPE = "auto"  # "auto" (bf16 on CUDA, fp32 on CPU), "fp32", "bf16", "fp16"
IMAGE_BATCH_SIZE = None  # int: images per forward pass in the evaluations; None = their default
TEXT_BATCH_SIZE = None  # int: texts per forward pass in the evaluations; None = their default
NUM_WORKERS = None  # int: image-decoding workers in the evaluations; None = their default (from the CPU count)
SETTINGS = {}  # {NAME: value} passed as --NAME=value to every step that has NAME, e.g. {"BOOTSTRAP": 0, "N_IMAGES": 1000, "CACHE_DIR": None}; a NAME no step has is an error
STEPS = None  # None = every step; or a list of step names (or one string "a,b"): make_base, diff_gen_caption, make_perturb_with_fliptypes, rebuttal_enhanced_perturb, run_lgip_multi, run_lgip_by_fliptype, run_lgip_retrieval, explain_flips, rebuttal_enhanced_lgip, report
FORCE = False  # True: re-run the chosen steps even when they are up to date
DRY_RUN = False  # True: print what each step would do (run and why, with its command, or skip) and run nothing
CONFIG = common.configure(globals())

STEP_NAMES = ["make_base", "diff_gen_caption", "make_perturb_with_fliptypes", "rebuttal_enhanced_perturb",
              "run_lgip_multi", "run_lgip_by_fliptype", "run_lgip_retrieval", "explain_flips", "rebuttal_enhanced_lgip",
              "report"]
DEMO_MODEL = "openclip_ViT-B-16_openai"  # the smallest published model: the demo's default
# Settings run_all sets itself (SETTINGS may not), and those that never change a step's results
# (left out of the recorded settings, so changing them re-runs nothing).
_OWN = {"INPUT_JSONL", "OUTPUT_JSONL", "JSONL_PATH", "OUTPUT_PREFIX", "ANNOTATIONS_JSON", "IMAGE_DIR", "MODELS",
        "PROTOCOL", "DEVICE", "DTYPE", "IMAGE_BATCH_SIZE", "TEXT_BATCH_SIZE", "NUM_WORKERS", "UNSUPPORTED"}
_NO_EFFECT = {"INPUT_JSONL", "OUTPUT_JSONL", "JSONL_PATH", "ANNOTATIONS_JSON", "IMAGE_DIR", "DEVICE",
              "IMAGE_BATCH_SIZE", "TEXT_BATCH_SIZE", "NUM_WORKERS", "CACHE_DIR", "PIXEL_MEMORY_GB", "LOOKAHEAD"}


class Step:
    """One step: its script, the settings it gets (those it accepts), its inputs and outputs."""

    def __init__(self, name, script, args, inputs, outputs, note=None):
        self.name, self.script = name, os.path.join(_HERE, script)
        self.inputs, self.outputs = inputs, outputs  # inputs that do not exist are ignored
        self.note = note  # a reason to skip regardless of dates (make_base without annotations)
        accepted = script_settings(self.script)
        self.args = {k: v for k, v in args.items() if k in accepted}
        self.args.update({k: v for k, v in SETTINGS.items() if k in accepted})
        self.recorded = {k: v for k, v in self.args.items() if k not in _NO_EFFECT}

    @property
    def stamp(self):
        return self.outputs[0] + ".run_all.meta.json"

    def command(self):
        return [sys.executable, self.script] + [f"--{k}={v!r}" for k, v in self.args.items()]

    def shown(self):
        """The command as one can paste it into a shell (strings bare where that means the same)."""
        words = ["python", shlex.quote(show(self.script))]
        for k, v in self.args.items():
            arg = f"--{k}={v}" if isinstance(v, str) and common.parse_value(v) == v else f"--{k}={v!r}"
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
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and "configure" in ast.dump(node.value.func):
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


def choose_data():
    """("coco" | "demo", base JSONL)."""
    if DATA not in ("auto", "coco", "demo"):
        raise SystemExit(f"error: DATA must be 'auto', 'coco' or 'demo', got {DATA!r}")
    mode = DATA
    if mode == "auto":
        mode = "coco" if os.path.isfile(ANNOTATIONS_JSON) or os.path.isfile(BASE_JSONL) else "demo"
    if mode == "coco":
        print(f"data: COCO, base {show(BASE_JSONL)}")
        return mode, os.path.abspath(BASE_JSONL)
    if not os.path.isfile(DEMO_JSONL):
        raise SystemExit(f"error: demo data {DEMO_JSONL} not found (pass --DEMO_JSONL=<path>, or --DATA='coco')")
    why = "" if DATA == "demo" else f" (no COCO annotations at {show(ANNOTATIONS_JSON)})"
    print(f"data: demo, base {show(DEMO_JSONL)}{why}")
    return mode, os.path.abspath(DEMO_JSONL)


def default_models(mode):
    if MODELS is not None:
        return MODELS
    if mode == "coco":
        return common.PUBLISHED_MODELS
    return [m for m in common.PUBLISHED_MODELS if m["name"] == DEMO_MODEL]


def plan(mode, base):
    """Every step of this data, in order."""
    perturb = common.default_output(base, "_with_perturb.jsonl")
    fliptypes = common.default_output(base, "_with_fliptypes.jsonl")
    enhanced = common.default_output(base, "_with_fliptypes.jsonl", prefix="rebuttal_enhanced_")
    metrics = [common.metrics_path(perturb, "LGIP_ALL.metrics.json"),
               common.metrics_path(fliptypes, "LGIP_fliptypes.metrics.json"),
               common.metrics_path(enhanced, "ENHANCED_LGIP_analysis.json"),
               common.metrics_path(fliptypes, "LGIP_retrieval.metrics.json")]
    explained = common.metrics_path(fliptypes, "LGIP_explain.metrics.json")
    evaluation = {"MODELS": default_models(mode), "PROTOCOL": PROTOCOL, "DEVICE": DEVICE, "DTYPE": DTYPE}
    evaluation.update({k: v for k, v in (("IMAGE_BATCH_SIZE", IMAGE_BATCH_SIZE), ("TEXT_BATCH_SIZE", TEXT_BATCH_SIZE),
                                         ("NUM_WORKERS", NUM_WORKERS)) if v is not None})
    steps = []
    if mode == "coco":
        note = None
        if not os.path.isfile(ANNOTATIONS_JSON) and os.path.isfile(base):
            note = f"no annotations at {show(ANNOTATIONS_JSON)}; using the existing base"
        steps.append(Step("make_base", "make_base_jsonl.py",
                          {"ANNOTATIONS_JSON": os.path.abspath(ANNOTATIONS_JSON), "IMAGE_DIR": os.path.abspath(IMAGE_DIR),
                           "OUTPUT_JSONL": base}, [os.path.abspath(ANNOTATIONS_JSON)], [base], note))
    steps += [
        Step("diff_gen_caption", "diff_gen_caption.py", {"INPUT_JSONL": base}, [base], [perturb]),
        Step("make_perturb_with_fliptypes", "make_perturb_with_fliptypes.py", {"INPUT_JSONL": base}, [base], [fliptypes]),
        Step("rebuttal_enhanced_perturb", "rebuttal_enhanced_perturb_with_fliptypes.py", {"INPUT_JSONL": base},
             [base], [enhanced]),
        Step("run_lgip_multi", "run_lgip_multi.py", dict(evaluation, JSONL_PATH=perturb), [perturb], [metrics[0]]),
        Step("run_lgip_by_fliptype", "run_lgip_by_fliptype.py", dict(evaluation, JSONL_PATH=fliptypes),
             [fliptypes], [metrics[1]]),
        # after by_fliptype: every embedding it needs is then in the cache (no model's weights are loaded)
        Step("run_lgip_retrieval", "run_lgip_retrieval.py", dict(evaluation, JSONL_PATH=fliptypes),
             [fliptypes], [metrics[3]]),
        # (after the score files it takes TOP_K from; a model whose family it cannot explain is left out, said)
        # (its TEXT_BATCH_SIZE counts texts per forward and backward pass with the attention kept: not the evaluations')
        Step("explain_flips", "explain_flips.py",
             dict({k: v for k, v in evaluation.items() if k != "TEXT_BATCH_SIZE"}, JSONL_PATH=fliptypes, UNSUPPORTED="skip"),
             [fliptypes, metrics[1]], [explained]),
        Step("rebuttal_enhanced_lgip", "rebuttal_enhanced_lgip_by_transformation.py",
             dict(evaluation, JSONL_PATH=enhanced), [enhanced], [metrics[2]]),
        Step("report", "report.py", {"JSONL_PATH": base}, metrics + [explained],  # the page colours explained flips
             [common.metrics_path(base, "LGIP_report.md"), common.metrics_path(base, "LGIP_report.csv"),
              common.metrics_path(base, "LGIP_report.html")]),
    ]
    return steps


def check_settings(steps):
    if not isinstance(SETTINGS, dict):
        raise SystemExit(f"error: SETTINGS must be a dict {{NAME: value}}, got {SETTINGS!r}")
    known = set().union(*(script_settings(os.path.join(_HERE, s)) for s in (
        "make_base_jsonl.py", "diff_gen_caption.py", "make_perturb_with_fliptypes.py",
        "rebuttal_enhanced_perturb_with_fliptypes.py", "run_lgip_multi.py", "run_lgip_by_fliptype.py",
        "run_lgip_retrieval.py", "explain_flips.py", "rebuttal_enhanced_lgip_by_transformation.py", "report.py")))
    for key in SETTINGS:
        if key in _OWN:
            own = f"use --{key}=..." if key in CONFIG else "run_all sets it"
            raise SystemExit(f"error: SETTINGS may not set {key}: {own}")
        if key not in known:
            raise SystemExit(f"error: SETTINGS: no step has a setting {key!r}; the steps' settings: "
                             f"{', '.join(sorted(known - _OWN))}")
    if PROTOCOL not in common.PROTOCOLS:
        raise SystemExit(f"error: PROTOCOL must be one of {', '.join(map(repr, common.PROTOCOLS))}, got {PROTOCOL!r}")
    names = STEPS.split(",") if isinstance(STEPS, str) else STEPS
    if names is None:
        return steps
    names = [str(n).strip() for n in names if str(n).strip()]
    for n in names:
        if n not in STEP_NAMES:
            raise SystemExit(f"error: unknown step {n!r} in STEPS; valid: {', '.join(STEP_NAMES)}")
    if "make_base" in names and not any(s.name == "make_base" for s in steps):
        raise SystemExit("error: STEPS names make_base, which runs only on COCO data (pass --DATA='coco')")
    return [s for s in steps if s.name in names]


def _json(value):
    return json.loads(json.dumps(value))


def recorded_settings(step):
    """The settings an output was made with: run_all's record when it vouches for the current
    files, else what the output stores itself (metrics: run.config; JSONL: .meta.json)."""
    try:
        stamp = common.read_json(step.stamp)
        if stamp.get("outputs") == {os.path.basename(p): os.stat(p).st_mtime_ns for p in step.outputs}:
            return stamp["settings"], True
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    try:
        path = step.outputs[0]
        if not path.endswith(".metrics.json") and not path.endswith("_analysis.json"):
            path += ".meta.json"
        data = common.read_json(path)
        config = data[0]["run"]["config"] if isinstance(data, list) else data["config"]
        return {k: config[k] for k in step.recorded if k in config}, False
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None, False


def write_stamp(step):
    common.write_json(step.stamp, {
        "step": step.name, "script": os.path.basename(step.script), "settings": step.recorded,
        "outputs": {os.path.basename(p): os.stat(p).st_mtime_ns for p in step.outputs},
        "note": "written by run_all.py: the settings these outputs were made with"})


def reason_to_run(step, pending):
    """None when the step is up to date, else why it must run. `pending`: files a dry run would rewrite."""
    if step.note:
        return None
    if FORCE:
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
    wanted = _json(step.recorded)
    changed = sorted(k for k in set(wanted) | set(recorded if stamped else wanted)
                     if recorded.get(k, "<unset>") != wanted.get(k, "<unset>"))
    if changed:
        return f"settings changed ({', '.join(changed)})"
    if not stamped and not DRY_RUN:
        write_stamp(step)  # vouch for the files as they are: a later change of settings is seen
    return None


def stopped_by(proc, sigterm, grace=25):
    """Let a step that was stopped end as it does (its rows encoded so far written to the cache):
    SIGTERM is passed on (a scheduler may have signalled this process alone; a step that got it
    too ignores the second), Ctrl-C reached it from the terminal. One still running after `grace`
    seconds gets SIGTERM (again), then SIGKILL: a scheduler's SIGKILL follows 30 s after its SIGTERM."""
    import signal
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


def run_step(step, k, n, reason):
    tag = f"[{k}/{n}] {step.name}"
    if not os.path.isfile(step.script):
        raise SystemExit(f"error: step {step.name}: {step.script} not found")
    shown = step.shown()
    print(f"{tag}: {'would run' if DRY_RUN else 'run'} ({reason})\n  $ {shown}", flush=True)
    if DRY_RUN:
        return
    t0 = time.perf_counter()
    proc = subprocess.Popen(step.command())
    try:
        rc = proc.wait()
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the step stops as cleanly, and is waited for
        stopped_by(proc, isinstance(e, common.Terminated))
        print(f"\nerror: {'stopped by SIGTERM' if isinstance(e, common.Terminated) else 'interrupted'} during step "
              f"{step.name}; later steps not run. Run the same command again to go on: finished steps are skipped, "
              f"an interrupted evaluation resumes from its cache", file=sys.stderr)
        raise SystemExit(143 if isinstance(e, common.Terminated) else 130)
    seconds = time.perf_counter() - t0
    if rc != 0:
        status = rc if rc > 0 else 128 - rc  # killed by a signal: the shell's convention
        print(f"{tag}  FAILED after {seconds:.1f} s (exit status {status})", flush=True)
        print(f"error: step {step.name} failed (exit status {status}); later steps not run. "
              f"Its command:\n  {shown}", file=sys.stderr)
        raise SystemExit(status)
    write_stamp(step)
    print(f"{tag}  done in {seconds:.1f} s -> {show(step.outputs[0])}", flush=True)


def main():
    mode, base = choose_data()
    steps = check_settings(plan(mode, base))
    pending, ran = set(), 0
    t0 = time.perf_counter()
    for k, step in enumerate(steps, 1):
        reason = reason_to_run(step, pending)
        if reason is None:
            print(f"[{k}/{len(steps)}] skip {step.name}: {step.note or 'up to date'}", flush=True)
            continue
        run_step(step, k, len(steps), reason)
        pending.update(step.outputs)
        ran += 1
    verb = "would run" if DRY_RUN else "ran"
    print(f"run_all: {verb} {ran} of {len(steps)} steps ({len(steps) - ran} up to date) "
          f"in {time.perf_counter() - t0:.1f} s")
    page = common.metrics_path(base, "LGIP_report.html")
    report = common.metrics_path(base, "LGIP_report.md")
    others = [show(p) for p in (report, common.metrics_path(base, "LGIP_report.csv"), common.metrics_path(base, "LGIP_frontier.png"),
                                common.metrics_path(base, "LGIP_fliptypes.png"), common.metrics_path(base, "LGIP_retrieval.png"))
              if os.path.isfile(p)]
    if os.path.isfile(page):
        print(f"report: open {show(page)} in a browser" + (f" (also {', '.join(others)})" if others else ""))
    elif others:
        print(f"report: {others[0]}" + (f" (also {', '.join(others[1:])})" if others[1:] else ""))
    else:
        print(f"report: not written yet (step report -> {show(page)})")


if __name__ == "__main__":
    common.run_main(main)
