"""``python -m tests.durations JUNIT.xml``: rewrite tests/durations.json (seconds per test file,
longest first) from a run's JUnit report, the order ``make test`` hands files out in
(tests/parallel.py). ``make test`` writes its report to ``.pytest-junit.xml``."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter

from tests.parallel import DURATIONS


def file_of(classname: str) -> str:
    """``tests.server.test_x.TestY`` → ``tests/server/test_x.py``; ``docs.tls.md`` → ``docs/tls.md``."""
    if classname.startswith("tests."):
        return "/".join(p for p in classname.split(".") if not p[:1].isupper()) + ".py"
    if classname == "README.md":
        return classname
    return classname[:-3].replace(".", "/") + ".md"


def main(argv: list[str]) -> int:
    seconds: Counter[str] = Counter()
    for case in ET.parse(argv[0]).getroot().iter("testcase"):
        seconds[file_of(case.get("classname", ""))] += float(case.get("time", 0))
    ordered = {path: round(spent, 1) for path, spent in seconds.most_common()}
    DURATIONS.write_text(json.dumps(ordered, indent=0) + "\n")
    print(f"{DURATIONS}: {len(ordered)} files, {sum(ordered.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
