"""The ``where`` language of :func:`~l5dask.prediction.aggregation.aggregate` (``l5dask agg
--where``) and of the scene filters (``--scenes``, :meth:`L5Dataset.query
<l5dask.prediction.dataset.L5Dataset.query>`): a Python expression of columns, numbers and strings,
comparisons, ``and``/``or``/``not`` and arithmetic, parsed with Python's ``ast`` and evaluated over numpy
columns (never ``eval``). A table's categorical columns compare with their category names."""

from __future__ import annotations

import ast
import copy
import functools
import re
from typing import Any

import numpy as np

from l5dask.core import config
from l5dask.errors import UsageError
from l5dask.prediction import format as fmt

# --- where ----------------------------------------------------------------------------------
_CMP = {
    ast.Eq: np.equal,
    ast.NotEq: np.not_equal,
    ast.Lt: np.less,
    ast.LtE: np.less_equal,
    ast.Gt: np.greater,
    ast.GtE: np.greater_equal,
}
_BIN = {
    ast.Add: np.add,
    ast.Sub: np.subtract,
    ast.Mult: np.multiply,
    ast.Div: np.true_divide,
    ast.FloorDiv: np.floor_divide,
    ast.Mod: np.mod,
    ast.Pow: np.power,
    ast.BitAnd: np.logical_and,
    ast.BitOr: np.logical_or,
}


def _parse(text: str) -> ast.Expression:
    if not isinstance(text, str):  # (before the cache: a list is not hashable, an int has no strip)
        raise UsageError(f"where must be a string, such as 'distance_to_ego < 20', not {type(text).__name__} {text!r}")
    return _parsed(text)


@functools.lru_cache(maxsize=64)
def _parsed(text: str) -> ast.Expression:
    try:
        return ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        # (Python's column counts from 1 in the stripped text; 0 or none: the text ended too soon)
        at = f"at column {exc.offset + len(text) - len(text.lstrip())}" if exc.offset else "at its end"
        hint = ""
        if re.search(r"(?<![=!<>])=(?!=)", text):  # (SQL's "x = 1")
            hint = "; compare with == (x == 1), not ="
        elif re.search(r"&&|\|\||\b(AND|OR|NOT)\b", text):
            hint = "; join conditions with and, or, not (lower case)"
        raise UsageError(f"where {text!r} does not parse: {exc.msg} ({at}){hint}") from None


config.on_reset(_parsed.cache_clear)


def names_in(text: str) -> set[str]:
    """Every bare name of a ``where`` (columns, and category names compared with one), parsed once."""
    return {n.id for n in ast.walk(_parse(text)) if isinstance(n, ast.Name)}


@functools.lru_cache(maxsize=64)
def _named(text: str, categories: tuple[tuple[str, tuple[str, ...]], ...]) -> ast.Expression:
    """The parsed ``where`` with each bare name compared with a categorical column (``categories``:
    its names) that is one of its categories read as that category, as if quoted: ``label ==
    PERCEPTION_LABEL_CAR``, ``label in [PERCEPTION_LABEL_CAR, PERCEPTION_LABEL_VAN]``. Unambiguous:
    the only other reading, the column of that name (the label's probability), cannot be compared
    with a category."""
    cats = dict(categories)
    tree = copy.deepcopy(_parse(text))

    def as_category(node: ast.expr, names: tuple[str, ...]) -> ast.expr:
        if isinstance(node, ast.Name) and node.id in names:
            return ast.copy_location(ast.Constant(node.id), node)
        if isinstance(node, (ast.List, ast.Tuple)):
            node.elts = [as_category(e, names) for e in node.elts]
        return node

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for i in range(len(operands) - 1):
                for x, y in ((i, i + 1), (i + 1, i)):
                    a = operands[x]
                    if isinstance(a, ast.Name) and a.id in cats:
                        operands[y] = as_category(operands[y], cats[a.id])
            node.left, node.comparators = operands[0], operands[1:]
    return tree


config.on_reset(_named.cache_clear)


def _kind(node: ast.AST, table: Any) -> str | None:
    """``"number"`` or ``"text"``: what a compared operand holds (a column that is not categorical,
    a constant, a list of constants of one kind); ``None``: not known before computing (arithmetic)."""
    if isinstance(node, ast.Name):
        col = table.columns.get(node.id)
        if col is None or col.categorical:
            return None
        kind = np.dtype(col.dtype).kind
        return "number" if kind in "biufmM" else "text" if kind in "SU" else None
    if isinstance(node, ast.Constant):
        return "text" if isinstance(node.value, str) else "number"
    if isinstance(node, (ast.List, ast.Tuple)):
        kinds = {_kind(e, table) for e in node.elts}
        return kinds.pop() if len(kinds) == 1 else None
    return None


def _unquoted(text: str, tree: ast.AST, table: Any, unknown: list[str]) -> str:
    """A hint for a string compared with a text column without its quotes (``host == host-a011``
    parses as ``host == host - a011``): the comparison as it is meant, else nothing."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for a, b in zip(operands, operands[1:]):
            for x, y in ((a, b), (b, a)):
                if not (
                    isinstance(x, ast.Name)
                    and x.id in table.columns
                    and (table.columns[x.id].categorical or _kind(x, table) == "text")
                ):
                    continue
                for e in y.elts if isinstance(y, (ast.List, ast.Tuple)) else [y]:
                    if any(isinstance(n, ast.Name) and n.id in unknown for n in ast.walk(e)):
                        said = (ast.get_source_segment(text, e) or ast.unparse(e)).strip()
                        return f" ({x.id} is text: a string is written in quotes, {said!r})"
    return ""


def reworded(message: str, expr: str, what: str) -> str:
    """A ``where``'s one-line error said as its caller names the expression (``what``: ``--scenes
    '...'``, a job's ``scenes '...'``): its checks begin ``where '<expr>'``, its evaluation's
    ``where: ...``."""
    for prefix in (f"where {expr!r}", "where"):
        if message.startswith(prefix):
            return what + message[len(prefix) :]
    return f"{what}: {message}"


def _joins(node: ast.AST) -> bool:
    """Whether ``node`` joins with ``&`` or ``|`` (a compared operand that does is a condition
    written as pandas' query reads it, not as Python does)."""
    return isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr))


def _not_a_condition(node: ast.AST, table: Any) -> ast.AST | None:
    """The part of a ``where`` that must be a condition and is not (a number, a text, a list), or
    ``None``: comparisons are conditions, and ``and``, ``or``, ``not``, ``&``, ``|`` and ``~``
    join conditions alone (``not speed`` kept the rows where speed is 0; ``speed > 1 and
    scene_index`` meant ``scene_index != 0``), as do a bool column and ``True``/``False``."""
    if isinstance(node, ast.Compare):
        return None
    if isinstance(node, ast.BoolOp):
        parts = node.values
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.Invert)):
        parts = [node.operand]
    elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
        parts = [node.left, node.right]
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return None
    elif (
        isinstance(node, ast.Name)
        and node.id in table.columns
        and not table.columns[node.id].categorical
        and np.dtype(table.columns[node.id].dtype) == np.dtype(bool)
    ):
        return None
    else:
        return node
    return next((bad for part in parts if (bad := _not_a_condition(part, table)) is not None), None)


def _gives(node: ast.AST, table: Any) -> str | None:
    """What a part of a ``where`` that is no condition gives (``float64 values``, ``label names``),
    when its columns and numbers say it before computing; else ``None``."""
    if isinstance(node, ast.Name):
        col = table.columns.get(node.id)
        if col is None:
            return None
        return f"{node.id} names" if col.categorical else f"{np.dtype(col.dtype).name} values"
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            return "text"
        return f"{np.asarray(node.value).dtype.name} values" if isinstance(node.value, (bool, int, float)) else None
    if isinstance(node, (ast.List, ast.Tuple)):
        return "a list"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _gives(node.operand, table)
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        a, b = _gives(node.left, table), _gives(node.right, table)
        if a is None or b is None or not a.endswith(" values") or not b.endswith(" values"):
            return None
        if isinstance(node.op, ast.Div):
            return "float64 values"
        return f"{np.result_type(np.dtype(a.split()[0]), np.dtype(b.split()[0])).name} values"
    return None


def where_columns(text: str, table: Any, what: str | None = None, values: bool = True) -> list[str]:
    """The columns a ``where`` names, checked (its syntax too) before any computation; ``what``
    names the table in the line that lists its columns (by default its array's name). ``values``:
    also check the names compared with a categorical column against its categories (not over a
    table whose categories are not known yet: a catalog before it is made)."""
    named = {
        n.id
        for n in ast.walk(_parse(text))
        if isinstance(n, ast.Name) and n.id in table.columns and table.columns[n.id].categorical
    }
    tree = _named(text, tuple((n, tuple(table.categories(n) or ())) for n in sorted(named)))
    names: list[str] = []

    def check(node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float, str, bool)):
                raise UsageError(f"where {text!r}: {node.value!r} is not a number or a string")
        elif (
            isinstance(node, ast.BoolOp)
            and isinstance(node.op, (ast.And, ast.Or))
            or isinstance(node, ast.UnaryOp)
            and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd, ast.Invert))
            or isinstance(node, ast.BinOp)
            and type(node.op) in _BIN
            or isinstance(node, (ast.List, ast.Tuple))
        ):
            pass
        elif isinstance(node, ast.Compare):
            if not all(type(op) in _CMP or isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                raise UsageError(f"where {text!r}: only ==, !=, <, <=, >, >=, in and not in compare")
            for o in node.comparators:
                if isinstance(o, (ast.List, ast.Tuple)) and any(isinstance(e, (ast.List, ast.Tuple)) for e in o.elts):
                    raise UsageError(f"where {text!r}: in takes a list of numbers or names, not of lists")
            if any(_joins(o) for o in (node.left, *node.comparators)):
                # (Python binds & and | before comparisons, pandas' query after them: the same text,
                # two answers; `speed > 1 & speed < 3` would keep every row over 1)
                raise UsageError(
                    f"where {text!r}: & and | bind before comparisons here; join conditions with and, or "
                    "(speed > 1 and speed < 3), or put each in parentheses ((speed > 1) & (speed < 3))"
                )
        elif not isinstance(node, (ast.Expression, ast.Load, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)):
            raise UsageError(
                f"where {text!r}: {ast.unparse(node)!r} is not allowed (columns, numbers, strings, "
                "comparisons, and/or/not, arithmetic)"
            )
        for child in ast.iter_child_nodes(node):
            check(child)

    check(tree)
    # a bare name compared with a categorical column that is none of its categories is said to be
    # no category (below), not an unknown column
    compared = {
        e.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(isinstance(o, ast.Name) and o.id in named for o in (node.left, *node.comparators))
        for o in (node.left, *node.comparators)
        for e in (o.elts if isinstance(o, (ast.List, ast.Tuple)) else [o])
        if isinstance(e, ast.Name) and e.id not in named
    }
    unknown = [n for n in dict.fromkeys(names) if n not in table.columns and n not in compared]
    if unknown:
        raise UsageError(
            f"where {text!r} names unknown column{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}{_unquoted(text, tree, table, unknown)}; the columns of "
            f"{what or fmt.SHORT_NAMES[table.array]} are: {', '.join(table.columns)}"
        )
    if not names:
        raise UsageError(f"where {text!r} names no column")
    # categorical columns compare with their category names, and only by (in)equality
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, operands, operands[1:]):
                for x, y in ((a, b), (b, a)):
                    if isinstance(x, ast.Name) and table.columns[x.id].categorical:
                        if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                            raise UsageError(f"where {text!r}: {x.id} is categorical: compare it with == or in")
                        if isinstance(y, ast.Name) and y.id in table.columns:
                            # another column: a categorical one compares by its names, as pandas does
                            # (a null equals nothing); any other is no category name
                            if not table.columns[y.id].categorical or not isinstance(op, (ast.Eq, ast.NotEq)):
                                raise UsageError(
                                    f"where {text!r}: {x.id} is categorical: compare it with its names "
                                    f"({x.id} == 'name', {x.id} in [...]) or with another categorical column by == or !="
                                )
                            continue
                        cats = list(table.categories(x.id) or ())
                        if not values and not cats:  # (not known yet: a catalog's hosts, before it is made)
                            continue
                        consts = y.elts if isinstance(y, (ast.List, ast.Tuple)) else [y]
                        for c in consts:
                            if not (isinstance(c, ast.Constant) and c.value in cats):
                                raise UsageError(
                                    f"where {text!r}: {ast.unparse(c)} is not a {x.id}; they are: {', '.join(cats)}"
                                )
                # a number column compares with numbers, a text column with strings (numpy has no
                # comparison of the two)
                for x, y in ((a, b), (b, a)):
                    if not isinstance(x, ast.Name) or table.columns[x.id].categorical:
                        continue
                    kx = _kind(x, table)
                    for e in [y] if not isinstance(y, (ast.List, ast.Tuple)) else y.elts:
                        ke = _kind(e, table)
                        if kx is not None and ke is not None and kx != ke:
                            dtype = np.dtype(table.columns[x.id].dtype)
                            other = (
                                repr(e.value) if isinstance(e, ast.Constant) else f"{ast.unparse(e)} (a {ke} column)"
                            )
                            kind, with_ = {
                                "M": ("time", "a number (nanoseconds since the epoch, UTC)"),
                                "U": ("text", "a string"),
                                "S": ("text", "a string"),
                            }.get(dtype.kind, ("number", "a number"))
                            raise UsageError(
                                f"where {text!r}: {x.id} is a {kind} column ({dtype.name if kind != 'text' else dtype.str[1:]}): "
                                f"compare it with {with_}, not {other}"
                            )
    for node in ast.walk(tree):  # (after the categorical columns' own lines: `turn in turn_unwrapped`)
        if isinstance(node, ast.Compare):
            for op, o in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)) and not isinstance(o, (ast.List, ast.Tuple)):
                    raise UsageError(
                        f"where {text!r}: in takes a list of numbers or names ([3, 4]), not {ast.unparse(o)}"
                    )
    body = tree.body if isinstance(tree, ast.Expression) else tree
    bad = _not_a_condition(body, table)
    if bad is not None:
        gives = _gives(bad, table)
        if bad is body:
            raise UsageError(f"where {text!r} is not a condition" + (f" (it gives {gives})" if gives else ""))
        raise UsageError(
            f"where {text!r}: {ast.unparse(bad)} is not a condition; and, or, not, & and | join conditions "
            "(speed > 1 and scene_index == 3)"
        )
    return list(dict.fromkeys(names))


def _value(node: ast.AST, chunk, categories: dict, cats: tuple[str, ...] | None = None):
    """The value of a node of a ``where`` over one chunk (module level: no reference cycle keeps
    the chunk's columns alive)."""
    if isinstance(node, ast.Expression):
        return _value(node.body, chunk, categories)
    if isinstance(node, ast.Name):
        return chunk[node.id]
    if isinstance(node, ast.Constant):
        if cats is not None and isinstance(node.value, str):  # (none of them: no row's code, -1 is null)
            return cats.index(node.value) if node.value in cats else -2
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e, chunk, categories, cats) for e in node.elts]
    if isinstance(node, ast.BoolOp):
        parts = [np.asarray(_value(v, chunk, categories), bool) for v in node.values]
        return functools.reduce(np.logical_and if isinstance(node.op, ast.And) else np.logical_or, parts)
    if isinstance(node, ast.UnaryOp):
        v = _value(node.operand, chunk, categories)
        if isinstance(node.op, (ast.Not, ast.Invert)):
            return np.logical_not(v)
        if isinstance(node.op, ast.USub):
            if isinstance(v, int) and not isinstance(v, bool):  # (a literal: -9223372036854775808 fits)
                return -v
            return _checked(node, ast.Sub(), 0, v) if _integer(v) else -v
        return v
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left, chunk, categories), _value(node.right, chunk, categories)
        if isinstance(node.op, _CHECKED) and _integer(left) and _integer(right):
            return _checked(node, node.op, left, right)
        if (
            isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod))
            and _integer(left)
            and _integer(right)
            and np.any(np.asarray(right) == 0)
        ):
            # (numpy makes x // 0 and x % 0 of integers zero: a condition true of every row; a float
            # divided by zero is IEEE's infinity or NaN, numpy's warning one line)
            raise UsageError(f"where: {ast.unparse(node)!r} divides by an integer zero; refused")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and _integer(left) and _integer(right):
            # (in int64: numpy refused an int8 column % 128 with a traceback, 128 not being an int8)
            num, den = _as_int64(node, left), _as_int64(node, right)
            if isinstance(node.op, ast.FloorDiv) and np.any((num == _INT64.min) & (den == -1)):
                raise UsageError(f"where: {ast.unparse(node)!r} overflows int64 (e.g. {_INT64.min} // -1); refused")
            return _BIN[type(node.op)](num, den)
        return _BIN[type(node.op)](left, right)
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        out = None
        for op, a, b in zip(node.ops, operands, operands[1:]):
            ca = categories.get(a.id) if isinstance(a, ast.Name) else None
            cb = categories.get(b.id) if isinstance(b, ast.Name) else None
            if ca is not None and cb is not None:  # (two categorical columns: == and != only, checked)
                assert isinstance(a, ast.Name) and isinstance(b, ast.Name)
                r = _same_names(chunk[a.id], ca, chunk[b.id], cb)
                r = r if isinstance(op, ast.Eq) else ~r
                out = r if out is None else out & r
                continue
            left, right = _value(a, chunk, categories, cb), _value(b, chunk, categories, ca)
            if isinstance(op, (ast.In, ast.NotIn)):
                r = _member(left, right)
                r = ~r if isinstance(op, ast.NotIn) else r
            else:
                r = _CMP[type(op)](left, right)
            out = r if out is None else out & r
        return out
    raise UsageError(f"where: {ast.unparse(node)!r} is not allowed")


def _member(left: Any, values: list) -> np.ndarray:
    """Rows of ``left`` equal to one of ``values``, each compared as ``==`` compares it: an integer
    with an integer column exactly (``np.isin`` of the list as one array made float64 of a list
    that mixed 2**63 + 4 and 2: every id near 2**63 matched), one outside the column's type never."""
    a = np.asarray(left)
    out = np.zeros(a.shape, bool)
    ints = [v for v in values if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))]
    rest = [v for v in values if not (isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)))]
    if ints and a.dtype.kind in "iu":
        info = np.iinfo(a.dtype)
        fit = [int(v) for v in ints if info.min <= int(v) <= info.max]
        if fit:
            out |= np.isin(a, np.array(fit, a.dtype))
    elif ints:
        for v in ints:  # (a float column: as == compares an integer with it)
            out |= np.equal(a, v)
    for v in rest:
        out |= np.equal(a, v)
    return out


#: Integer arithmetic done in int64 and checked: numpy wraps it silently (``track_id - 5 < 0``
#: kept no row of an unsigned column; an int32 column times 1000 wrapped at 2**31), as pandas'
#: ``query`` does; here an overflow is refused, as an integer sum that does not fit is.
_CHECKED = (ast.Add, ast.Sub, ast.Mult, ast.Pow)
_INT64 = np.iinfo(np.int64)
_SIGN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Pow: "**"}


def _integer(v: Any) -> bool:
    """An integer operand (not a boolean): an integer array, or a Python or numpy integer."""
    if isinstance(v, (bool, np.bool_)):
        return False
    if isinstance(v, (int, np.integer)):
        return True
    return isinstance(v, np.ndarray) and v.dtype.kind in "iu"


def _as_int64(node: ast.AST, v: Any) -> np.ndarray:
    a = np.asarray(v)
    if a.dtype.kind == "u" and a.size and int(a.max()) > _INT64.max:
        raise UsageError(f"where: {ast.unparse(node)!r}: a value exceeds int64 (e.g. {int(a.max())}); refused")
    if a.dtype == object or (a.ndim == 0 and not _INT64.min <= int(a) <= _INT64.max):
        raise UsageError(f"where: {ast.unparse(node)!r}: {int(a)} does not fit int64; refused")
    return a.astype(np.int64, copy=False)


def _checked(node: ast.AST, op: ast.operator, left: Any, right: Any) -> Any:
    """``left op right`` of integers in int64, refused (one line) where any row overflows it."""
    a, b = _as_int64(node, left), _as_int64(node, right)
    with np.errstate(over="ignore"):
        if isinstance(op, ast.Add):
            r = a + b
            bad = ((a ^ r) & (b ^ r)) < 0
        elif isinstance(op, ast.Sub):
            r = a - b
            bad = ((a ^ b) & (a ^ r)) < 0
        elif isinstance(op, ast.Mult):
            r = a * b
            nz = a != 0
            bad = (nz & (r // np.where(nz, a, 1) != b)) | ((a == -1) & (b == _INT64.min))
        else:
            if np.any(b < 0):
                raise UsageError(f"where: {ast.unparse(node)!r}: an integer to a negative power; write it as a float")
            exact = np.power(a.astype(np.float64), b.astype(np.float64))
            r = np.power(a, b)
            bad = np.abs(exact) >= 2.0**63
    if np.any(bad):
        i = int(np.flatnonzero(np.broadcast_to(bad, np.broadcast(a, b).shape))[0]) if np.ndim(bad) else 0
        x, y = (int(np.broadcast_to(v, np.broadcast(a, b).shape).flat[i]) for v in (a, b))
        raise UsageError(
            f"where: {ast.unparse(node)!r} overflows int64 (e.g. {x} {_SIGN[type(op)]} {y}); refused rather than "
            "wrapped (write a number as a float, e.g. 1000.0, to compute in float64)"
        )
    return r


def _same_names(x: np.ndarray, xcats: tuple[str, ...], y: np.ndarray, ycats: tuple[str, ...]) -> np.ndarray:
    """Rows where two categorical columns (codes, ``-1`` null; each its own category names) hold the
    same name: ``y``'s codes read in ``x``'s names first; a null equals nothing, not even a null (pandas)."""
    if tuple(xcats) != tuple(ycats):
        # (a name of y's that x has not: -3, no code of x; index -1 of the lookup is y's null)
        lookup = np.array([xcats.index(c) if c in xcats else -3 for c in ycats] + [-1], np.int64)
        y = lookup[np.asarray(y, np.int64)]
    return (np.asarray(x) == y) & (np.asarray(x) >= 0)


def evaluate_where(text: str, chunk, categories: dict[str, tuple[str, ...]]) -> np.ndarray:
    """The rows of a chunk (:class:`l5dask.prediction.columns.Chunk`) that ``text`` keeps."""
    keep = np.asarray(_value(_named(text, tuple(sorted(categories.items()))), chunk, categories))
    if keep.dtype != bool:
        raise UsageError(f"where {text!r} is not a condition (it gives {keep.dtype} values)")
    return np.broadcast_to(keep, (len(chunk),))
