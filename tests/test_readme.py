"""The README's examples run as written.

How the README is read (:func:`blocks`): every fenced block whose fence names ``python``,
``bash`` or ``console``, in document order. A block whose fence follows a line
``<!-- skip-test: reason -->`` (the line right before the fence) is not run: examples that need
a GPU, a dask cluster or another machine.

* ``python`` blocks run in order in one namespace (later examples use what earlier ones
  defined), in one fresh temporary directory. The README's first block writes the operand
  files the examples name. ``backend="auto"`` resolves to NumPy here, as on a machine without
  a GPU.
* ``bash`` blocks: every line that starts with ``bigmm `` (a trailing ``\\`` continues it) runs
  as ``python -m bigmm ...`` in a second fresh temporary directory, in order, and must exit 0;
  the command line section generates its own operands there. Where the command takes
  ``--backend`` and the line names none, ``--backend numpy`` is added. Other lines (``pip
  install``, loops) are not run.
* ``console`` blocks: the ``$ bigmm ...`` line runs in that second directory too, and its output
  must be the lines that follow it, except those whose label is in MACHINE_DEPENDENT.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


README = Path(__file__).resolve().parent.parent / "README.md"
#: Subcommands that take --backend (the test runs them on the NumPy backend).
BACKEND_COMMANDS = {"multiply", "gram", "plan", "demo", "bench", "calibrate"}
#: Output lines of console blocks that differ between machines, by their first words.
MACHINE_DEPENDENT = ("files", "predicted time", "calibration")
SKIP = re.compile(r"^<!--\s*skip-test\b.*-->\s*$")
FENCE = re.compile(r"^```([\w-]*)\s*$")


@dataclass(frozen=True)
class Block:
    lang: str
    line: int  # line number of the first line inside the fence (1-based)
    text: str
    skip: bool


def blocks(path: Path = README) -> list[Block]:
    """The fenced blocks of ``path`` (any language), in order."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i + 1
        end = start
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        if end == len(lines):
            raise AssertionError(f"README.md line {i + 1}: a fence that is never closed")
        skip = i > 0 and bool(SKIP.match(lines[i - 1]))
        out.append(Block(lang, start + 1, "\n".join(lines[start:end]), skip))
        i = end + 1
    return out


def command_lines(text: str) -> list[str]:
    """The ``bigmm ...`` lines of a bash block, continuation lines joined."""
    joined, cur = [], ""
    for line in text.splitlines():
        cur += line.rstrip()
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        joined.append(cur.strip())
        cur = ""
    return [line for line in joined if line.startswith("bigmm ")]


def argv_of(line: str) -> list[str]:
    """``python -m bigmm`` arguments of a README command line (comments dropped, the NumPy
    backend chosen where the command takes one and names none)."""
    words = shlex.split(line, comments=True)[1:]
    if words and words[0] in BACKEND_COMMANDS and "--backend" not in words:
        words += ["--backend", "numpy"]
    return words


def run_bigmm(words: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-m", "bigmm", *words], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def console_check(text: str, cwd: Path) -> None:
    """Run the ``$ bigmm`` line of a console block; its output must be the block's lines."""
    lines = text.splitlines()
    assert lines and lines[0].startswith("$ bigmm "), lines[:1]
    command, expected = lines[0][2:], lines[1:]
    proc = run_bigmm(argv_of(command), cwd)
    assert proc.returncode == 0, f"{command}\n{proc.stderr}"
    got = proc.stdout.splitlines()
    assert len(got) == len(expected), f"{command}\n{proc.stdout}"
    for want, have in zip(expected, got):
        if want.startswith(MACHINE_DEPENDENT):
            assert have.split()[:2] == want.split()[:2], have
        else:
            assert have.rstrip() == want.rstrip(), f"{command}: expected\n{want}\ngot\n{have}"


# ----- the extractor ----------------------------------------------------------------------------

def test_the_readme_has_examples_to_run():
    found = blocks()
    run = [b for b in found if not b.skip]
    assert sum(b.lang == "python" for b in run) >= 2
    assert sum(len(command_lines(b.text)) for b in run if b.lang == "bash") >= 5
    assert any(b.lang == "console" for b in run)
    # a skipped block names why, and every skipped block is one the extractor would run
    assert all(b.lang in ("python", "bash", "console") for b in found if b.skip)


def test_the_extractor(tmp_path):
    text = "\n".join([
        "<!-- skip-test: needs a GPU -->",
        "```python",
        "import cupy",
        "```",
        "```bash",
        "python3 -m pip install . && bigmm demo",
        "bigmm plan a.h5:/A b.h5:/B \\",
        "    --memory 4MiB   # a comment",
        "bigmm verify a.h5:/A b.h5:/B c.h5:/C --json",
        "```",
        "```",
        "plain text",
        "```",
    ])
    path = tmp_path / "R.md"
    path.write_text(text)
    got = blocks(path)
    assert [(b.lang, b.skip, b.line) for b in got] == [("python", True, 3), ("bash", False, 6),
                                                       ("", False, 12)]
    lines = command_lines(got[1].text)
    assert lines == ["bigmm plan a.h5:/A b.h5:/B      --memory 4MiB   # a comment",
                     "bigmm verify a.h5:/A b.h5:/B c.h5:/C --json"]
    assert argv_of(lines[0]) == ["plan", "a.h5:/A", "b.h5:/B", "--memory", "4MiB",
                                 "--backend", "numpy"]
    assert argv_of(lines[1])[-1] == "--json"


# ----- the examples -----------------------------------------------------------------------------

def test_python_examples(tmp_path, monkeypatch, capsys):
    import bigmm.backends

    monkeypatch.setattr(bigmm.backends, "probe_cuda", lambda: False)  # auto -> NumPy
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    ran = 0
    for b in blocks():
        if b.lang != "python" or b.skip:
            continue
        # padded so that a traceback names the README's own line numbers
        code = compile("\n" * (b.line - 1) + b.text, str(README), "exec")
        exec(code, namespace)
        ran += 1
    assert ran >= 2
    out = capsys.readouterr().out
    assert "PASSED" in out  # the verify example


def test_command_line_examples(tmp_path):
    ran = 0
    for b in blocks():
        if b.skip:
            continue
        if b.lang == "bash":
            for line in command_lines(b.text):
                words = argv_of(line)
                proc = run_bigmm(words, tmp_path)
                assert proc.returncode == 0, f"README.md line {b.line}: {line}\n{proc.stderr}"
                if "--json" in words:
                    json.loads(proc.stdout)
                ran += 1
        elif b.lang == "console":
            console_check(b.text, tmp_path)
            ran += 1
    assert ran >= 6
