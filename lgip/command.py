"""lgip.command: the `lgip` console command (pyproject.toml's [project.scripts], or `python -m lgip`), beside
the scripts, as CLIP_benchmark and lm-eval give one: `lgip <step> [--NAME=value ...]` runs the checkout's
script of that step exactly as `python <script>.py --NAME=value ...` would (its constants, its --help, its
exit status).

    lgip run-all --DATA=demo --MODELS=demo
    lgip report --JSONL_PATH=demo/lgip_demo.jsonl
    lgip eval run_lgip_by_fliptype --JSONL_PATH=x_with_fliptypes.jsonl --MODELS=demo
    lgip export runs/demo                       # the per-pair scores as one flat table (lgip.export)
    lgip compare runs/before runs/after         # two runs paired over the images both scored (lgip.compare)
    lgip list                                   # every step and script it runs, then every named model's card
    lgip list models                            # the named models alone (docs/finetunes.md)
"""

import os
import sys

from . import scripts
from .cli import exit_code

# the words `lgip` takes for a script (a script's own name, "_" or "-", is taken too)
COMMANDS = {
    "run-all": "run_all",
    "report": "report",
    "multi": "run_lgip_multi",
    "by-fliptype": "run_lgip_by_fliptype",
    "retrieval": "run_lgip_retrieval",
    "images": "run_lgip_images",
    "classify": "run_lgip_classification",
    "explain": "explain_flips",
    "enhanced": "rebuttal_enhanced_lgip_by_transformation",
    "import-benchmark": "import_benchmark",
    "blind-audit": "blind_audit",
    "debias": "debias_flips",
    "finetune": "finetune_lgip",
    "shapes": "make_shapes_jsonl",
    "make-base": "make_base_jsonl",
    "perturb": "diff_gen_caption",
    "fliptypes": "make_perturb_with_fliptypes",
    "enhanced-perturb": "rebuttal_enhanced_perturb_with_fliptypes",
    "sanity-check": "siglip_sanity_check",
}
# the package's own commands, over outputs already written (no script of the checkout): word -> module
TOOLS = {
    "export": ("lgip.export", "an evaluation's per-pair scores as one flat table (CSV, parquet)"),
    "compare": ("lgip.compare", "two runs' figures on one input, paired over the images both scored"),
}
USAGE = (
    "usage: lgip <command> [--NAME=value ...]   (each command runs its script of the checkout, as\n"
    "       python <script>.py --NAME=value ... would; `lgip <command> --help` lists its settings)\n"
    "       lgip eval <script> [--NAME=value ...]   (any script by its file name)\n"
    "       lgip export RUN [--FORMAT=csv|parquet]\n"
    "       lgip compare RUN_A RUN_B [--A=model] [--B=model]\n"
    "       lgip list [models]"
)


def script_of(word):
    """The script a command word names (COMMANDS, or a script's own name with "-" or "_"), or None."""
    word = word[:-3] if word.endswith(".py") else word
    name = COMMANDS.get(word, word.replace("-", "_"))
    return name if name in scripts.SCRIPTS else None


def listing():
    named = {v: k for k, v in COMMANDS.items()}
    steps = [f"  {named.get(s, s.replace('_', '-')):<18} {s}.py" for s in scripts.SCRIPTS]
    return "\n".join(steps + [f"  {word:<18} {what}" for word, (_, what) in TOOLS.items()])


def models_listing():
    """Every named model of MODELS (lgip.models.registry.NAMED_MODELS: the published nine, "demo", the field's
    fine-tunes) with its card: what its spec tells without loading it (a fine-tune: its weights, spec and cited
    facts, lgip.models.finetunes.card_lines)."""
    from .models.families import family
    from .models.finetunes import FINETUNES, card_lines
    from .models.registry import NAMED_MODELS

    lines = ["named models (MODELS takes each name; docs/models.md, docs/finetunes.md):"]
    for name, spec in NAMED_MODELS.items():
        if name in FINETUNES:
            lines += card_lines(name)
            continue
        told = {**family(spec).named(spec), **(spec.get("card") or {})}
        shown = {k: v for k, v in spec.items() if k not in ("name", "card", "demo")}
        lines += [f"{name}: {shown}"] + [f"  {k}: {v}" for k, v in told.items() if v is not None]
    return "\n".join(lines)


def main(argv=None):
    """`lgip ...`: the script's exit status (2, with the valid commands, for one it does not know)."""
    import difflib
    import runpy

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["eval"]:
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE + "\n\ncommands:\n" + listing())
        return 0
    if argv[0] == "list":
        if argv[1:] not in ([], ["models"]):
            print(f"error: lgip: list takes nothing or 'models', got {' '.join(argv[1:])!r}\n{USAGE}", file=sys.stderr)
            return 2
        print(models_listing() if argv[1:] else listing() + "\n\n" + models_listing())
        return 0
    if argv[0] in TOOLS:
        import importlib

        return importlib.import_module(TOOLS[argv[0]][0]).main(argv[1:])
    name = script_of(argv[0])
    if name is None:
        words = list(COMMANDS) + list(TOOLS) + [s.replace("_", "-") for s in scripts.SCRIPTS]
        close = difflib.get_close_matches(argv[0], words, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"error: lgip: unknown command {argv[0]!r}{hint}\n{USAGE}\n\ncommands:\n{listing()}", file=sys.stderr)
        return 2
    path = os.path.join(scripts.ROOT, name + ".py")
    if not os.path.isfile(path):
        print(
            f"error: lgip: {path} is not there: the command runs the scripts of an editable install "
            f"(pip install -e <checkout>)",
            file=sys.stderr,
        )
        return 2
    sys.argv = [path, *argv[1:]]
    sys.path.insert(0, scripts.ROOT)  # (as `python <script>.py` puts the script's folder first)
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        return exit_code(e)
    return 0
