"""lgip.entry: a script's `run(**constants)`, the one function behind its command line and a
call from Python (as lm-evaluation-harness's simple_evaluate): the script's constants as keyword
arguments, in force for the call only, in a process state as fresh as a new process's.

Each call starts with no token tables, prefix plan, shared calls, score-file layout or
remembered pixels left by an earlier one, and drops its own when it ends (the lookahead's workers
end with its run, the accelerations' switches are restored by run_evaluation), so a second call
gives what a fresh process gives. Its settings (lgip.settings) and output folders are checked to take a file before
any work (lgip.cli.run_main does the same on the command line). The command line calls the same run()
with no arguments: its `--NAME=value` overrides are already the module's constants.

    >>> import run_lgip_multi
    >>> results = run_lgip_multi.run(JSONL_PATH="x_with_perturb.jsonl", WRITE_SCORES=False,
    ...                              MODELS=[{"name": "epoch3", "type": "python",
    ...                                       "loader": (model, preprocess, tokenizer)}])
    >>> results[0]["sensitivity_pos_rate"]
"""

import contextlib
import os

from .cli import check_config, closest, output_folders
from .console import quiet
from .errors import ConfigError
from .evaluation import swap_process_state
from .outputs import OUTPUTS, check_writable
from .filenames import set_output_dir


@contextlib.contextmanager
def script_call(namespace, constants):
    """Apply `constants` to a script's module constants (the names its `configure` returned as
    CONFIG) for the duration of the block, in a fresh process state; yields the settings in force.
    An unknown name is an error listing the valid ones; so is a value its rule refuses."""
    names = list(namespace["CONFIG"])
    unknown = sorted(set(constants) - set(names))
    if unknown:
        script = os.path.basename(namespace.get("__file__", "the script"))
        hints = "".join(closest(u, names) for u in unknown)
        raise ConfigError(
            f"{script}: unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}{hints}; "
            f"valid settings: {', '.join(names)}"
        )
    saved = {k: namespace[k] for k in names + ["CONFIG"]}
    state = swap_process_state()  # (None: empty, a fresh process's)
    namespace.update(constants)
    try:
        config = {k: namespace[k] for k in names}
        namespace["CONFIG"] = config  # (what the script's main() reads and records: the settings of this call)
        check_config(config, namespace.get("__file__", ""), namespace)  # bad settings: before any work
        set_output_dir(config)
        folders, elsewhere = output_folders(config)
        if OUTPUTS.checked != folders:  # (the command line's run_main checked them already)
            OUTPUTS.reset(elsewhere)  # what this call writes, and could not (a score file: None in its metrics)
            check_writable(folders)  # before any work: not after an hour
        with quiet(config.get("VERBOSE") is False):  # (VERBOSE False: the result lines alone, lgip.console)
            yield config
    finally:
        namespace.update(saved)
        swap_process_state(state)
