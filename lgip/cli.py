"""lgip.cli: a script's command line: `--NAME=value` overrides of its UPPERCASE constants
(`configure`, as nanoGPT's configurator), and `run_main`, which first checks the settings
(lgip.settings) and that the script's output folders take a file, then ends bad input with its
message (exit status 2), a GPU out of memory with what to lower (3), an output that cannot be
written with which, why and what to do (4), Ctrl-C (130) and SIGTERM (143) with what was finished
and how to resume.

    JSONL_PATH = "x.jsonl"  # path to the input
    CONFIG = configure(globals())   # applies --JSONL_PATH=... from sys.argv, prints each override
"""

import ast
import os
import re
import sys

from .errors import ConfigError, InputError, Interrupted, ModelError, NothingToDo, OutputError, Terminated
from .settings import check_settings
from .outputs import OUTPUTS, check_writable
from .filenames import set_output_dir


_CONST_NAME = re.compile(r"[A-Z][A-Z0-9_]*")  # a script's setting: an UPPERCASE top-level name


_CONTINUED = "#   "  # a comment line right after a constant's that goes on with its comment (lines under 120)


def _constant_docs(path):
    """NAME -> (source expression, comment) for the top-level constants of a script, read from its syntax
    tree (a value the formatter spread over lines included). A constant's comment is every comment within its
    lines, then the lines right after it that start with _CONTINUED:
        MODELS = None  # list of model specs or names; None = the nine
        #   published models (each line of it within 120 characters)"""
    import io
    import tokenize

    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source)
        comments = {
            t.start[0]: t.string
            for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type == tokenize.COMMENT
        }
    except (OSError, SyntaxError, tokenize.TokenError, ValueError):
        return {}
    lines = source.splitlines()
    docs = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if not _CONST_NAME.fullmatch(name) or name in docs:
            continue
        said = [comments[n].lstrip("#").strip() for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        n = node.end_lineno  # (1-based: lines[n] is the line after it)
        while n < len(lines) and lines[n].startswith(_CONTINUED):
            said.append(lines[n][len(_CONTINUED) :].strip())
            n += 1
        expr = " ".join((ast.get_source_segment(source, node.value) or "").split())
        docs[name] = (expr, " ".join(w for w in said if w))
    return docs


def parse_value(text):
    """`--NAME=value`: a Python literal if it parses as one, else the string itself.

    >>> parse_value("64"), parse_value("[1, 2]"), parse_value("cuda:0"), parse_value("None")
    (64, [1, 2], 'cuda:0', None)
    """
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # ({[]: 1}; 100,000 "-"s: a string)
        return text


def configure(namespace, argv=None, unknown_hint=None):
    """Apply `--NAME=value` command-line overrides to a script's UPPERCASE constants.

    `namespace` is the script's globals(). Unknown names are an error listing the valid
    ones (`unknown_hint(name, value)`: the script's own word on such a name, run_all's for a
    step's setting); `--help` prints every constant with its comment. Returns the dict of constants
    actually in force (recorded in every output file). The command line belongs to the script
    being run: a script imported by another (bench_host imports bench) keeps its defaults.
    """
    if argv is None:
        argv = sys.argv[1:] if namespace.get("__name__") == "__main__" else []
    names = [
        k
        for k, v in namespace.items()
        if k.isupper() and not k.startswith("_") and not callable(v) and not isinstance(v, type(sys))
    ]
    script = namespace.get("__file__", "")
    if any(a in ("-h", "--help") for a in argv):
        docs = _constant_docs(script)
        print(f"usage: python {os.path.basename(script)} [--NAME=value ...]\n")
        print((namespace.get("__doc__") or "").strip() + "\n")
        print("constants (value is a Python literal, else a string):")
        for k in names:
            print(_help_entry(k, namespace[k], docs.get(k, ("", ""))[1]))
        if {"MODELS", "MODEL"} & set(names):  # (the types from their records: a new family is listed as it is)
            from .models.families import describe_types

            print('\nmodel types (a spec is {"name", "type", ...} with its type\'s keys; README "Models"):')
            print("\n".join("  " + line for line in describe_types().splitlines()))
        raise SystemExit(0)
    for arg in argv:
        if not arg.startswith("--") or "=" not in arg:
            _usage_error(f"expected --NAME=value, got {arg!r} (see --help)")
        key, text = arg[2:].split("=", 1)
        value = parse_value(text)
        if key not in names:
            hint = unknown_hint(key, value) if unknown_hint is not None else ""
            _usage_error(f"unknown setting {key!r}{closest(key, names)}; {hint}valid settings: {', '.join(names)}")
        print(f"override: {key} = {_said(value) if key == 'MODELS' else repr(value)}")
        namespace[key] = value
    return {k: namespace[k] for k in names}


def _said(value, width=100):
    """An override as the console says it: its repr, but for a list of model specs longer than a line,
    their names (the specs in full are in every output's run.config and in run_all's command)."""
    text = repr(value)
    if len(text) <= width or not isinstance(value, (list, tuple)) or not all(isinstance(v, (dict, str)) for v in value):
        return text
    names = [v.get("name", v.get("type")) if isinstance(v, dict) else v for v in value]
    specs = f"{len(value)} model spec{'s' if len(value) != 1 else ''}"
    return f"[{', '.join(map(str, names))}] ({specs}; in full in run.config)"


def _help_entry(name, value, comment, width=100):
    """One constant in --help: `--NAME=value` (a long value, e.g. MODELS' nine specs, one item a line)
    and its comment, wrapped to `width` columns."""
    import pprint
    import textwrap

    text = f"  --{name}={value!r}"
    if len(text) > width:
        if isinstance(value, (list, tuple)) and value:
            body = "[" + ",\n ".join(repr(v) for v in value) + "]"
        else:
            body = pprint.pformat(value, width=width - 6, sort_dicts=False)
        text = f"  --{name}=\n" + textwrap.indent(body, "      ")
    return text + "\n" + textwrap.fill(comment, width, initial_indent="      ", subsequent_indent="      ")


def command_settings(command, argv, defaults, usage):
    """A command of the package's own (`lgip export`, `lgip compare`): its positional arguments and its settings
    (`--NAME=value` over `defaults`; an unknown name a ConfigError with "did you mean"; the shared ones checked by
    lgip.settings' rules). Returns (positional, config)."""
    config, positional = dict(defaults), []
    for arg in argv:
        if not arg.startswith("--"):
            positional.append(arg)
            continue
        if "=" not in arg:
            raise ConfigError(f"lgip {command}: expected --NAME=value, got {arg!r}\n{usage}")
        key, text = arg[2:].split("=", 1)
        if key not in config:
            raise ConfigError(
                f"lgip {command}: unknown setting {key!r}{closest(key, list(config))}; valid settings: "
                f"{', '.join(config)}"
            )
        config[key] = parse_value(text)
    check_settings(config, none_ok={k for k, v in defaults.items() if v is None})
    return positional, config


def _usage_error(message):
    """A command line that names no setting: exit status 2, as every other bad input."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_config(config, script, namespace=None):
    """The shared settings' rules (lgip.settings) over a script's constants in force, before any work;
    a constant whose default in the script's source is None may be None (its comment says what that means).
    First MODELS' names become their specs (lgip.models.registry.expand_models: "demo", a published
    model's name), in `config` and in the script's `namespace`, so the run and its records see specs.
    A script's `_OWN_RULES` (names) are its own to check: report.py's MODELS are names of models, not specs."""
    own = set(namespace.get("_OWN_RULES", ())) if namespace is not None else set()
    if own and isinstance(config, dict):
        config = {k: v for k, v in config.items() if k not in own}
    sharded = (
        isinstance(config, dict)
        and isinstance(config.get("MODELS"), ShardOfModels)
        and config["MODELS"].shard == config.get("SHARD")
    )  # (run_main checked them, and run() checks again)
    if (
        isinstance(config, dict)
        and "MODELS" in config
        and not sharded
        and (_has_names(config["MODELS"]) or config.get("SHARD") is not None)
    ):
        from .models.registry import expand_models
        from .models.zoo import shard

        given = config["MODELS"]
        try:
            config["MODELS"] = expand_models(given)
        except ModelError as e:
            raise ConfigError(f"MODELS: {e}") from None
        if config.get("SHARD") is not None and config["MODELS"] is not None:
            every = config["MODELS"]
            config["MODELS"] = ShardOfModels(shard(every, config["SHARD"]), config["SHARD"], len(every))
            if not config["MODELS"]:
                raise NothingToDo(
                    f"SHARD {config['SHARD']!r} has no model of the {len(every)} in MODELS: nothing to do"
                )
            print(f"SHARD {config['SHARD']}: {len(config['MODELS'])} of {len(every)} models", flush=True)
        _say_expansion(given, config["MODELS"])
        if namespace is not None:
            namespace["MODELS"] = config["MODELS"]
    if isinstance(config, dict) and isinstance(config.get("MODEL"), str) and "MODEL" not in own:
        from .models.registry import expand_models  # (one model by its name: "demo", a published or named model)

        try:
            (config["MODEL"],) = expand_models([config["MODEL"]])
        except ModelError as e:
            raise ConfigError(f"MODEL: {e}") from None
        if namespace is not None:
            namespace["MODEL"] = config["MODEL"]
    none_ok = {k for k, (expr, _) in _constant_docs(script).items() if expr == "None"}
    check_settings(config if isinstance(config, dict) else {}, none_ok)


class ShardOfModels(list):
    """MODELS once SHARD picked this job's models from the expanded list (`of` of them)."""

    def __init__(self, models, shard, of):
        super().__init__(models)
        self.shard, self.of = shard, of


def _has_names(models):
    """A MODELS value that expand_models changes: names, a zoo entry, or a dict naming a named model without a type
    ({"name": "negclip", "pretrained": "/path"}: lgip.models.finetunes)."""
    from .models.zoo import is_zoo

    return isinstance(models, str) or (
        isinstance(models, (list, tuple))
        and any(isinstance(m, str) or is_zoo(m) or (isinstance(m, dict) and "type" not in m) for m in models)
    )


def _say_expansion(given, models, shown=12):
    """What a zoo entry stood for, once (a dry run lists every model)."""
    from .models.zoo import is_zoo

    zoos = [m for m in given or [] if is_zoo(m)]
    if zoos and isinstance(models, list):
        names = [m["name"] for m in models if isinstance(m, dict)]
        print(
            f"MODELS: {len(zoos)} openclip_zoo entr{'y' if len(zoos) == 1 else 'ies'} -> {len(names)} models: "
            + ", ".join(names[:shown])
            + (f", ... (+{len(names) - shown})" if len(names) > shown else ""),
            flush=True,
        )


def close_names(name, valid):
    """The valid names closest to a mistyped one, best first ([] when none is close)."""
    import difflib

    close = difflib.get_close_matches(name, list(valid), n=3, cutoff=0.6)
    return close or [v for v in valid if name.lower() == v.lower()]


def closest(name, valid):
    """' (did you mean X?)' for the closest valid names to a mistyped one, '' when none is close."""
    close = close_names(name, valid)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def output_folders(config):
    """(the folders a script writes to, how to send its outputs elsewhere), from its settings:
    each OUTPUT_* path (a file or a prefix) that is set, else the folder of its JSONL_PATH or
    INPUT_JSONL, beside which its outputs go. ([], None) for a script with neither."""
    config = config if isinstance(config, dict) else {}
    if isinstance(config.get("OUTPUT_DIR"), str) and config["OUTPUT_DIR"]:  # (a folder: every output goes there)
        return [os.path.abspath(config["OUTPUT_DIR"])], "pass --OUTPUT_DIR=<a writable folder with room>"
    named = [k for k in config if k.startswith("OUTPUT_") and k != "OUTPUT_DIR"]
    chosen = [config[k] for k in named if isinstance(config[k], str) and config[k]]
    source = next((k for k in ("JSONL_PATH", "INPUT_JSONL") if isinstance(config.get(k), str)), None)
    if chosen:
        folders = [os.path.dirname(os.path.abspath(p)) for p in chosen]
    elif source:  # (an input whose folder is missing: its own error says so)
        folders = [os.path.dirname(os.path.abspath(config[source]))]
        folders = folders if os.path.isdir(folders[0]) else []
    else:
        return [], None
    if named:
        elsewhere = " or ".join(f"pass --{k}=<a writable path with room>" for k in named)
    else:  # evaluations: outputs beside their input, whose images are found relative to IMAGE_ROOT
        root = os.path.abspath(config.get("IMAGE_ROOT") or os.path.dirname(os.path.abspath(config[source])))
        elsewhere = (
            f"the outputs go beside {source}: copy it to a writable folder with room and pass "
            f"--{source}=<the copy>" + (f" --IMAGE_ROOT={root}" if "IMAGE_ROOT" in config else "")
        )
    return folders, elsewhere


_SIGTERM = []  # [signal number] once SIGTERM arrived: the script is stopping


def _handle_sigterm():
    """SIGTERM (a scheduler's preemption or time limit; SIGKILL follows after a grace period,
    SLURM's 30 s) raises Terminated in the main thread, a KeyboardInterrupt: the script stops
    as on Ctrl-C, its rows encoded so far flushed to the cache and its workers stopped. A second
    SIGTERM (a scheduler signals every process of the job; run_all.py passes it on) is ignored,
    so that the first one's cleanup finishes; so are worker processes dying of it (SIGCHLD: torch
    would raise for a DataLoader worker killed by a signal). Returns what restores the handlers."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_sigterm(signum, frame):
        if _SIGTERM:
            return
        _SIGTERM.append(signum)
        signal.signal(signal.SIGCHLD, lambda *a: None)
        raise Terminated()

    before = signal.signal(signal.SIGTERM, on_sigterm), signal.getsignal(signal.SIGCHLD)

    def restore():
        signal.signal(signal.SIGTERM, before[0])
        if before[1] is not None:
            signal.signal(signal.SIGCHLD, before[1])
        _SIGTERM.clear()

    return restore


def exit_code(e):
    """The exit status a SystemExit gives the interpreter: its int code (None: 0), or 1 with a message
    printed to stderr, as Python does; for a script run in this process (run_all's steps, `lgip`, the tests)."""
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=sys.stderr)
    return 1


def run_main(main):
    """Run a script's main() as its command line does: exit_status(main), a nonzero status raised as SystemExit."""
    status = exit_status(main)
    if status:
        raise SystemExit(status)


def exit_status(main, step=False):
    """Run main() and return the exit status its command line ends with (0: done). First its settings
    (check_config) are checked, and its output folders (output_folders, from its CONFIG) to take a file. Bad
    input ends with its message and exit status 2, a GPU out of memory with what to lower and exit status 3,
    an output that cannot be written with which, why, what to do and what was written (exit status 4; an
    optional output that could not be written, a score file, also ends so, once the rest is written), Ctrl-C
    with what was finished and how to resume (exit status 130), SIGTERM likewise (exit status 143). No partial
    output: every output file is written whole or not at all.
    step: main is a script's run(**constants) called by run_all in its own process (run() checks its settings
    and folders itself; run_all's SIGTERM handler is in force)."""
    namespace = getattr(main, "__globals__", {}) if not step else {}
    config = namespace.get("CONFIG") if isinstance(namespace.get("CONFIG"), dict) else {}
    restore = _handle_sigterm() if not step else (lambda: None)
    started = False
    if step:
        OUTPUTS.reset()  # (the step's run() checks its own folders: script_call)
    try:
        if not step:
            folders, elsewhere = output_folders(config)
            OUTPUTS.reset(elsewhere)
            check_config(namespace.get("CONFIG"), namespace.get("__file__", ""), namespace)  # bad settings: first
            set_output_dir(config)
            check_writable(folders)  # before any work: not after an hour
            OUTPUTS.checked = folders  # (a script's run() then checks them no more)
        started = True
        main()
        if OUTPUTS.unwritten:  # optional outputs the run went on without (said when they failed)
            raise OutputError(
                "not every output could be written (see the warnings above: the run went on without them)"
            )
        return 0
    except OutputError as e:
        lines = OUTPUTS.summary(failed=e.path) + ["no partial file was left"] if started else []
        lines += [OUTPUTS.resume] if started and OUTPUTS.resume else []
        print(f"error: {e}" + "".join(f"\n  {line}" for line in lines), file=sys.stderr)
        return 4
    except NothingToDo as e:  # (a job array's shard past the last model: not an error)
        print(f"note: {e}", flush=True)
        return 0
    except (InputError, ModelError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted) as e:
        said = (
            str(e) if isinstance(e, Interrupted) else "no output file was left half-written; run the same command again"
        )
        if _SIGTERM:
            print(f"\nstopped by SIGTERM: {said}", file=sys.stderr)
            return 143
        print(f"\ninterrupted: {said}", file=sys.stderr)
        return 130
    except Exception as e:
        if _SIGTERM:  # an error of the stopping itself (a worker killed by the same signal): the stop is the news
            print(
                f"\nstopped by SIGTERM (while stopping: {type(e).__name__}: {e}); no output file was left "
                f"half-written; run the same command again",
                file=sys.stderr,
            )
            return 143
        torch = sys.modules.get("torch")  # imported by then if a model ran
        if torch is None or not isinstance(e, torch.cuda.OutOfMemoryError):
            raise
        print(
            f"error: the GPU ran out of memory ({str(e).splitlines()[0]}). Lower --TEXT_BATCH_SIZE= "
            f'("auto" is 2048 on CUDA) or --IMAGE_BATCH_SIZE=, or use --DTYPE=bf16; finished cache chunks '
            f"are kept, so a re-run resumes.",
            file=sys.stderr,
        )
        return 3
    finally:
        restore()
