"""Every ```python block of README.md and docs/ also runs pasted into the interactive
interpreter, which is how the README tells the reader to try them.

The suite runs the blocks as scripts (Sybil); the REPL reads them differently: a compound
statement (``with``, ``for``, ``if``...) ends only at a blank line, so a dedented statement right
after one is a SyntaxError there, and a blank line inside a block ends it early. Each block is
pushed line by line into ``code.InteractiveConsole`` (the REPL's own reader) with a ``runcode``
that runs nothing, so only the paste's syntax is checked.
"""

from __future__ import annotations

import code
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "docs").glob("*/*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


class _Paste(code.InteractiveConsole):
    """The REPL's reader with nothing run: records the first SyntaxError of a paste."""

    def __init__(self) -> None:
        super().__init__(filename="<stdin>")
        self.error: str | None = None

    def runcode(self, compiled) -> None:  # noqa: ARG002 - the syntax is all that is checked
        return None

    def showsyntaxerror(self, filename=None, **kw) -> None:  # noqa: ARG002
        if self.error is None:
            self.error = "SyntaxError"

    def paste(self, text: str) -> str | None:
        for number, line in enumerate([*text.splitlines(), ""], 1):
            self.push(line)
            if self.error is not None:
                return f"line {number}: {line!r}"
        return None


def paste_error(text: str) -> str | None:
    """Where ``text`` pasted into ``python``'s prompt is a SyntaxError (None: it is not)."""
    return _Paste().paste(text)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", match.group(1)))
    return found


def test_the_check_reproduces_the_repls_rule():
    assert paste_error("with open('x') as f:\n    pass\nprint(1)\n") == "line 3: 'print(1)'"
    assert paste_error("with open('x') as f:\n    pass\n\nprint(1)\n") is None
    assert paste_error("if True:\n    a = 1\n\n    b = 2\n") == "line 4: '    b = 2'"
    assert paste_error("x = [\n    1,\n]\nprint(x)\n") is None


@pytest.mark.parametrize(("where", "block"),
                         [pytest.param(where, block, id=where) for where, block in _blocks()])
def test_each_block_pastes_into_the_repl(where, block):
    try:
        compile(block, where, "exec", dont_inherit=True)
    except SyntaxError:
        pytest.skip("not a script either: an illustrative fragment")
    error = paste_error(block)
    assert error is None, (f"{where}: pasted into python this is a SyntaxError at {error}; end "
                           "each indented block with a blank line before the next statement, "
                           "and keep blank lines out of indented blocks")
