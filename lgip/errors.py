"""lgip.errors: the project's error kinds, each ending a script with a message (lgip.cli.run_main).

InputError: bad input; the message names the file, line and field. ModelError: a model spec that
cannot be resolved or loaded; the message says what to do (WrongModelType: a model its type
cannot evaluate). OutputError: an output that cannot be
written (no space, no permission, a read-only folder); the message names the file, why, and what
to do. CacheError: a cache chunk that does not hold what it should (reported, deleted, rebuilt).
Interrupted: Ctrl-C or SIGTERM, with what was finished; Terminated: the KeyboardInterrupt that
SIGTERM raises (so every path that stops cleanly on Ctrl-C stops so on SIGTERM)."""


class InputError(ValueError):
    """Bad input; the message names the file, line and field."""


class ModelError(RuntimeError):
    """A model spec that cannot be resolved or loaded; the message says what to do."""


class WrongModelType(ModelError):
    """A model its spec's type cannot evaluate (e.g. a transformers checkpoint that is no image-text
    dual encoder). Raised by a loader; the registry (lgip.models.registry.load_model) adds the
    valid types to the message, so no loader needs to know the registry."""


class CacheError(RuntimeError):
    """A cache chunk that does not hold what it should."""


class OutputError(RuntimeError):
    """An output file that cannot be written; the message names it, says why and what to do.
    `path`: the file (or folder); `errno`: the operating system's error number."""

    def __init__(self, message, path=None, errno=None, reason=None):
        super().__init__(message)
        self.path, self.errno, self.reason = path, errno, reason


class Interrupted(Exception):
    """Ctrl-C or SIGTERM: the message says what was finished and how to resume."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's preemption or time limit), raised in the main thread by the handler
    lgip.cli.run_main installs: a KeyboardInterrupt, so it takes Ctrl-C's way out (exit status 143)."""


class NothingToDo(Exception):
    """Settings that leave a run nothing to do (a job array's SHARD past the last model): said, exit 0."""


class ConfigError(ValueError):
    """A setting with a value it cannot take; the message lists the valid ones."""
