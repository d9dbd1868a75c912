"""docs/go.md's five-line example (acquire, renewed in the background, fenced write) compiles
and runs as written, in a module of its own that requires the client as the page's Install
section says, against a real lockd and proxy (its URLs and row key swapped for theirs)."""

from __future__ import annotations

import re
import subprocess
import uuid

from tests.clients.conftest import GO_MODULE, ROOT, go_env

WRAPPER = """package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"lockd.dev/lockd"
)

func run(ctx context.Context) error {
%s
	return err
}

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	_ = time.Second
}
"""


def example() -> str:
    """The first ```go block of docs/go.md: the acquire/renew/fenced-write example."""
    match = re.search(r"```go\n(.*?)```", (ROOT / "docs" / "go.md").read_text(), re.S)
    assert match
    return match.group(1)


def test_the_example_is_five_lines():
    assert len(example().strip().splitlines()) == 5


def test_the_five_line_example_runs(go, servers, tmp_path):
    lockd, proxy = servers
    key = uuid.uuid4().int % 1_000_000_000 + 1
    code = (example().replace("http://127.0.0.1:7070", lockd.url)
            .replace("http://127.0.0.1:7071", proxy.url)
            .replace('"items/7"', f'"items/{key}"').replace('"7"', f'"{key}"')
            .replace('"id": 7', f'"id": {key}'))
    # A module of its own, using the client as docs/go.md's Install section says.
    (tmp_path / "go.mod").write_text(
        f"module docsexample\n\ngo 1.19\n\nrequire lockd.dev/lockd v0.0.0\n\n"
        f"replace lockd.dev/lockd => {GO_MODULE}\n")
    (tmp_path / "main.go").write_text(WRAPPER % code)
    run = subprocess.run([go, "run", "."], cwd=tmp_path, env=go_env(), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert [row for row in proxy.rows("items") if row[0] == key] == [(key, "", 1)]
