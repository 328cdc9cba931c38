"""lgip.cli: a script's command line: `--NAME=value` overrides of its UPPERCASE constants
(`configure`, as nanoGPT's configurator), and `run_main`, which ends bad input with its message
(exit status 2) and a GPU out of memory with what to lower (exit status 3).

    JSONL_PATH = "x.jsonl"  # path to the input
    CONFIG = configure(globals())   # applies --JSONL_PATH=... from sys.argv, prints each override
"""
import ast
import os
import re
import sys

from .errors import ConfigError, InputError, Interrupted, ModelError


_CONST_LINE = re.compile(r"^([A-Z][A-Z0-9_]*)\s*=\s*(.*?)\s*(?:#\s*(.*))?$")


def _constant_docs(path):
    """NAME -> (source expression, comment) for the top-level constants of a script."""
    docs = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = _CONST_LINE.match(line.rstrip("\n"))
                if m and m.group(1) not in docs:
                    docs[m.group(1)] = (m.group(2), m.group(3) or "")
    except OSError:
        pass
    return docs


def parse_value(text):
    """`--NAME=value`: a Python literal if it parses as one, else the string itself.

    >>> parse_value("64"), parse_value("[1, 2]"), parse_value("cuda:0"), parse_value("None")
    (64, [1, 2], 'cuda:0', None)
    """
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def configure(namespace, argv=None):
    """Apply `--NAME=value` command-line overrides to a script's UPPERCASE constants.

    `namespace` is the script's globals(). Unknown names are an error listing the valid
    ones; `--help` prints every constant with its comment. Returns the dict of constants
    actually in force (recorded in every output file). The command line belongs to the script
    being run: a script imported by another (bench_host imports bench) keeps its defaults.
    """
    if argv is None:
        argv = sys.argv[1:] if namespace.get("__name__") == "__main__" else []
    names = [k for k, v in namespace.items() if k.isupper() and not k.startswith("_")
             and not callable(v) and not isinstance(v, type(sys))]
    script = namespace.get("__file__", "")
    if any(a in ("-h", "--help") for a in argv):
        docs = _constant_docs(script)
        print(f"usage: python {os.path.basename(script)} [--NAME=value ...]\n")
        print((namespace.get("__doc__") or "").strip() + "\n")
        print("constants (value is a Python literal, else a string):")
        for k in names:
            comment = docs.get(k, ("", ""))[1]
            print(f"  --{k}={namespace[k]!r}\n      {comment}")
        raise SystemExit(0)
    for arg in argv:
        if not arg.startswith("--") or "=" not in arg:
            raise SystemExit(f"error: expected --NAME=value, got {arg!r} (see --help)")
        key, text = arg[2:].split("=", 1)
        if key not in names:
            raise SystemExit(f"error: unknown setting {key!r}; valid settings: {', '.join(names)}")
        value = parse_value(text)
        print(f"override: {key} = {value!r}")
        namespace[key] = value
    return {k: namespace[k] for k in names}


def run_main(main):
    """Run a script's main(); bad input ends with its message and exit status 2, a GPU out of
    memory with what to lower and exit status 3, Ctrl-C with what was finished and how to resume
    (exit status 130, no partial output: every output file is written whole or not at all)."""
    try:
        main()
    except (InputError, ModelError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    except (KeyboardInterrupt, Interrupted) as e:
        said = str(e) if isinstance(e, Interrupted) else "no output file was left half-written; run the same command again"
        print(f"\ninterrupted: {said}", file=sys.stderr)
        raise SystemExit(130)
    except Exception as e:
        torch = sys.modules.get("torch")  # imported by then if a model ran
        if torch is None or not isinstance(e, torch.cuda.OutOfMemoryError):
            raise
        print(f"error: the GPU ran out of memory ({str(e).splitlines()[0]}). Lower --TEXT_BATCH_SIZE= "
              f"(\"auto\" is 2048 on CUDA) or --IMAGE_BATCH_SIZE=, or use --DTYPE=bf16; finished cache chunks "
              f"are kept, so a re-run resumes.", file=sys.stderr)
        raise SystemExit(3)
