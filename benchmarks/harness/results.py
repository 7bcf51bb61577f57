"""benchmarks/RESULTS.md: the line about the machine a run had, and replacing one
benchmark's section while leaving the others as they were."""

from __future__ import annotations

import datetime
import os
import platform
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "RESULTS.md"


def machine() -> str:
    """One line about the machine: cores, CPU model, memory, kernel, Python."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (
        f"{os.cpu_count()} cores ({model}){memory}, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def today() -> str:
    return datetime.date.today().isoformat()


def update_section(heading: str, body: str, path: Path = RESULTS) -> None:
    """Replace (or append) the `## heading` section of RESULTS.md with `body`,
    leaving every other section as it was."""
    title = f"## {heading}"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(title)}[ \t]*\n.*?(?=^## |\Z)", re.M | re.S)
    section = f"{title}\n\n{body.strip()}\n\n"
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")
