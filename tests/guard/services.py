"""The example services of examples/ started as real processes (uvicorn on a free port)."""

from __future__ import annotations

import sys
from pathlib import Path

from harness import ServiceProcess, free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class ExampleService:
    """``examples/{script}`` on a port of its own; ``restart()`` keeps port and arguments."""

    def __init__(self, workdir: Path, script: str, *args: str):
        self.workdir, self.script, self.args = workdir, script, args
        self.port = free_port()
        self.proc: ServiceProcess | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def argv(self) -> list[str]:
        return [sys.executable, str(EXAMPLES / self.script), *self.args, "--port", str(self.port)]

    def start(self) -> ExampleService:
        self.starts += 1
        self.proc = ServiceProcess(self.argv, ready_url=self.url + "/healthz",
                                   log_path=self.workdir / f"{self.script}-{self.starts}.log")
        self.proc.start()
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def restart(self) -> ExampleService:
        self.stop()
        return self.start()
