"""lgip: the engine behind the scripts' `common.py`, one module per concern.

The map of its modules, in the order they build on each other, is common.py's docstring (and
docs/architecture.md, linked from README.md "How it is built"); every module's own docstring says what it owns.
"""
