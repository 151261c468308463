"""Index intervals: the checks of ``[start, end)`` fields (scene -> frame -> agent, frame -> face).

A parent's intervals are valid when each row's ``end >= start``, each ``start`` is the previous
row's ``end`` (contiguous), and together they cover the child array exactly. Passes compute a
small bounds table per block of parent rows (:func:`block_bounds`); :func:`check_bounds` finds
every problem from those tables, naming the array, the field and the first bad row.
"""

from __future__ import annotations

import numpy as np

from l5dask.errors import IntervalError


def interval_problems(iv: np.ndarray, offset: int, child_len: int) -> tuple[int, int, str]:
    """Check ``[start, end)`` rows of one block: (number of bad rows, first bad row, why).

    Rows are bad when ``end < start`` (not increasing), when ``start`` is not the
    previous row's ``end`` (not contiguous), or when they point outside the child.
    """
    if len(iv) == 0:
        return 0, -1, ""
    starts, ends = iv[:, 0], iv[:, 1]
    checks = (  # the most telling reason first, when a row has several
        ((starts < 0) | (ends > child_len), f"points outside the child array of length {child_len}"),
        (ends < starts, "end < start (not increasing)"),
        (np.r_[False, starts[1:] != ends[:-1]], "start != previous end (not contiguous)"),
    )
    bad = np.zeros(len(iv), bool)
    first, why = len(iv), ""
    for mask, reason in checks:
        bad |= mask
        hit = np.flatnonzero(mask)
        if len(hit) and hit[0] < first:
            first, why = int(hit[0]), reason
    n = int(bad.sum())
    return n, (offset + first if n else -1), why


def block_bounds(records: np.ndarray, field: str, offset: int, child_len: int) -> np.ndarray:
    """Per parent block: first start, last end, rows, bad rows, first bad row, reason code."""
    iv = records[field] if records.dtype.names else records
    n_bad, first_bad, why = interval_problems(iv, offset, child_len)
    reasons = ("", "end < start (not increasing)", "start != previous end (not contiguous)")
    code = reasons.index(why) if why in reasons else 3
    start, end = (int(iv[0, 0]), int(iv[-1, 1])) if len(iv) else (-1, -1)
    return np.array([[start, end, len(iv), n_bad, first_bad, code]], dtype=np.int64)


def _reason(code: int, child_len: int) -> str:
    return (
        "",
        "end < start (not increasing)",
        "start != previous end (not contiguous)",
        f"points outside the child array of length {child_len}",
    )[code]


def check_bounds(table: np.ndarray, parent: str, field: str, child_len: int) -> list[str]:
    """All interval problems of a parent array, from its per-block bounds table."""
    problems = []
    offsets = np.r_[0, np.cumsum(table[:, 2])[:-1]] if len(table) else np.zeros(0, np.int64)
    for _start, _end, _rows, n_bad, first_bad, code in table:
        if n_bad:
            problems.append(
                f"{parent}.{field}: row {first_bad}: {_reason(code, child_len)} ({n_bad} bad row(s) in its chunk)"
            )
    expected = 0
    for off, (start, end, rows, *_r) in zip(offsets, table):
        if rows == 0:
            continue
        if start != expected:
            problems.append(
                f"{parent}.{field}: row {off}: starts at {start}, expected {expected} "
                + ("(not contiguous with the previous row)" if off else "(the first row starts the child array)")
            )
        expected = end
    if len(table) and table[:, 2].sum() and expected != child_len:
        problems.append(f"{parent}.{field}: the last row ends at {expected}, but the child array has {child_len} rows")
    elif not (len(table) and table[:, 2].sum()) and child_len:
        problems.append(f"{parent}.{field}: no rows, but the child array has {child_len} rows")
    return problems


def first_problem_row(problem: str) -> int:
    try:
        return int(problem.split(": row ")[1].split(":")[0])
    except (IndexError, ValueError):
        return 2**62


def raise_first(problems: list[str]) -> None:
    if problems:
        raise IntervalError(min(problems, key=first_problem_row))


def check_intervals(iv: np.ndarray, parent: str, field: str, child_len: int) -> None:
    """Raise on the first problem of intervals held whole in memory (e.g. the scenes')."""
    raise_first(check_bounds(block_bounds(iv, field, 0, child_len), parent, field, child_len))
