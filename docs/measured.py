"""The benchmarks' figures, in one place: ``docs/figures/NAME.json``, one file a benchmark, written
by the benchmark itself (``--record``, :func:`record`). The pages use them as MyST substitutions
(``{{ scale_cold_stats_s }}``: the file's name, then the figure's), the README quotes them, and
the test suite checks that the README's figures are the files' (tests/test_docs.py), so that no
page can say another figure than the last measurement.

A figure's name ends with its unit, which says how it is written: ``_s`` seconds (``28.5 s``),
``_x`` a ratio (``0.63x``), ``_gb`` gigabytes (``0.21 GB``), ``_n`` a count; a pair ``[lo, hi]``
is a range over runs (``1.13-1.14x``).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
from pathlib import Path

from l5dask.core.outputs import json_text

FIGURES = Path(__file__).resolve().parent / "figures"


def text(name: str, value) -> str:
    """How the pages write the figure ``name`` (its unit from its suffix; a range's two ends with
    the digits of its greater)."""
    lo, hi = value if isinstance(value, list) else (value, value)
    if name.endswith("_s"):
        number, unit = (f"{{:.{2 if hi < 10 else 1}f}}", " s")
    elif name.endswith("_x"):  # (3 digits under 0.1, none from 100)
        number, unit = (f"{{:.{3 if hi < 0.1 else 0 if hi >= 100 else 2}f}}", "x")
    elif name.endswith("_gb"):
        number, unit = ("{:.2f}", " GB")
    elif name.endswith("_n"):
        number, unit = ("{:,}", "")
    else:
        raise ValueError(f"{name}: a figure's name ends with its unit (_s, _x, _gb, _n)")
    a, b = number.format(lo), number.format(hi)
    return f"{a}{unit}" if a == b else f"{a}-{b}{unit}"


def load() -> dict[str, dict]:
    """Every figures file, by name (``scale_cold`` for ``docs/figures/scale_cold.json``)."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(FIGURES.glob("*.json"))}


def substitutions() -> dict[str, str]:
    """``{file_figure: text}`` of every figure, and ``{file_date, file_command}`` of each file."""
    out = {}
    for stem, data in load().items():
        out[f"{stem}_date"] = data["date"]
        out[f"{stem}_command"] = f"`{data['command']}`"  # (a code span: substitutions are Markdown)
        for key, value in data["figures"].items():
            out[f"{stem}_{key}"] = text(key, value)
    return out


def record(stem: str, command: str, figures: dict, note: str = "") -> Path:
    """Write a benchmark's figures to ``docs/figures/{stem}.json`` (atomically), with the date,
    the command and the commit they were measured at."""
    for key, value in figures.items():
        text(key, value)  # (a name without its unit is refused before anything is written)
        if not all(math.isfinite(v) for v in (value if isinstance(value, list) else [value])):
            raise ValueError(f"{stem}: the figure {key} is {value}: a figure is a finite number")
    root = Path(__file__).resolve().parent.parent
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    data = {
        "command": command,
        "date": datetime.date.today().isoformat(),
        "commit": head.stdout.strip() or "unknown",
        "note": note,
        "figures": figures,
    }
    path = FIGURES / f"{stem}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json_text(data, indent=1) + "\n")  # (strict JSON, as every file l5dask writes)
    os.replace(tmp, path)
    return path
