"""lgip.errors: the project's three error kinds, each ending a script with a message (lgip.cli.run_main).

InputError: bad input; the message names the file, line and field. ModelError: a model spec that
cannot be resolved or loaded; the message says what to do. CacheError: a cache chunk that does
not hold what it should (reported, deleted, rebuilt)."""


class InputError(ValueError):
    """Bad input; the message names the file, line and field."""


class ModelError(RuntimeError):
    """A model spec that cannot be resolved or loaded; the message says what to do."""


class CacheError(RuntimeError):
    """A cache chunk that does not hold what it should."""


class Interrupted(Exception):
    """Ctrl-C: the message says what was finished and how to resume."""


class ConfigError(ValueError):
    """A setting with a value it cannot take; the message lists the valid ones."""
