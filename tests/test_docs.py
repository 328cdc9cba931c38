"""The docs' Python as written: every ```python block of the README and docs/ compiles, and every one with a
loop (a training loop of one's own, an evaluation per epoch) runs as it stands, from a folder of its own, on the
demo's tiny model and data it names: a key a loop reads that a row lacks, or a name it never defines, fails here."""

import glob
import os
import re

import pytest

from conftest import ROOT

BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks():
    """[(file, first line, code)] of every ```python block of README.md and docs/*.md."""
    out = []
    for path in [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]:
        text = open(path, encoding="utf-8").read()
        for m in BLOCK.finditer(text):
            out.append((os.path.relpath(path, ROOT), text[: m.start()].count("\n") + 2, m.group(1)))
    return out


def loops():
    """The blocks with a loop, each code once (the README's and docs/configuration.md's are the same)."""
    seen, out = set(), []
    for where, line, code in python_blocks():
        if re.search(r"^for .+:$", code, re.M) and code not in seen:
            seen.add(code)
            out.append(pytest.param(code, id=f"{where}:{line}"))
    return out


def test_every_python_block_of_the_docs_compiles():
    blocks = python_blocks()
    assert len(blocks) >= 5
    for where, line, code in blocks:
        compile(code, f"{where}:{line}", "exec")


@pytest.mark.parametrize("code", loops())
def test_a_docs_loop_runs_as_written(code, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs", "exec"), {"__name__": "__docs__"})
    printed = capsys.readouterr().out
    assert re.search(r"^[01] 0\.\d+$|^0\.\d+ 0\.\d+$", printed, re.M), printed[-2000:]  # (the figures it prints)
    assert not os.listdir(os.path.join(ROOT, "demo", "images")) == []  # (the demo copied, not moved)
    assert os.path.isdir(tmp_path / "demo_run")  # (its outputs in its own folder, not the checkout's demo/)


def test_the_docs_have_their_loops():
    ids = [p.id for p in loops()]
    assert any(i.startswith("README.md") for i in ids) and any(i.startswith("docs/finetune.md") for i in ids), ids
