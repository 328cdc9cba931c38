"""lgip.console: how much a run says. run_all by default (its VERBOSE False) says one line per step and each
model's result line (the lines a batch job's user greps: the result, "from the cache: N of M texts"), the demo
note once, the report's table and its path at the end; the rest is detail (the paths each step wrote, each
paired comparison, the step's command and time), printed with VERBOSE=True and by a script run on its own.

    detail(f"-> {path}")           # printed when VERBOSE
    with quiet(not VERBOSE): ...   # run_all around a step
    print(fit(long_note))          # wrapped at spaces under LINE characters, later lines indented
"""

import contextlib
import textwrap

LINE = 160  # characters a console line stays under: one a reader takes in at a glance

VERBOSE = True  # the detail in force: a script on its own says it all; run_all sets it around each step


def detail(*args, **kwargs):
    """print(...) when VERBOSE: a line that is detail (a path written, a comparison, a note said elsewhere)."""
    if VERBOSE:
        print(*args, **kwargs)


@contextlib.contextmanager
def quiet(on=True):
    """The block says no detail (on False: all of it)."""
    global VERBOSE
    before, VERBOSE = VERBOSE, not on
    try:
        yield
    finally:
        VERBOSE = before


def fit(text, indent="  "):
    """`text` wrapped at spaces into lines under LINE characters, the later ones indented; a word longer than a
    line (a path) is never cut. Lines of `text` are wrapped each."""
    return "\n".join(
        textwrap.fill(x, width=LINE - 2, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
        for x in text.split("\n")
    )
