"""hypothesis strategies for the property tests (``tests/test_properties.py``): structured records,
blosc settings and damaged headers, CSV number cells, ``where`` expressions with their numpy
meaning, and string columns."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from l5dask.prediction import format as fmt

#: field types of records (little-endian, as L5Kit's)
BASES = ["u1", "i1", "<u2", "<i4", "<u4", "<f4", "<f8", "<u8", "<i8"]


@st.composite
def record_dtypes(draw) -> np.dtype:
    """L5Kit's agents or traffic-light faces (strings), or 1-6 fields of numbers and small
    sub-arrays (records of 1-200 bytes: split streams at 16 bytes and less)."""
    kind = draw(st.integers(0, 3))
    if kind < 2:
        return fmt.AGENT_DTYPE if kind == 0 else fmt.TL_FACE_DTYPE
    n = draw(st.integers(1, 6))
    fields = []
    for i in range(n):
        base = draw(st.sampled_from(BASES))
        shape = draw(st.sampled_from([(), (), (2,), (3,), (5,)]))
        fields.append((f"f{i}", base, shape) if shape else (f"f{i}", base))
    return np.dtype(fields)


@st.composite
def records(draw, dtype: np.dtype, n: int) -> np.ndarray:
    """``n`` records of ``dtype``: runs of equal rows (compressible) or noise, any bit patterns
    (NaN, infinities, -0.0 among the floats)."""
    raw = draw(hnp.arrays(np.uint8, dtype.itemsize * min(n, 64)))
    base = np.frombuffer(raw.tobytes(), dtype)
    if draw(st.booleans()):
        out = np.resize(base, n)  # repeats: compresses
    else:
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        out = np.frombuffer(rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).tobytes(), dtype).copy()
        out[: len(base)] = base
    return out


BLOSC = st.fixed_dictionaries(
    {
        "cname": st.sampled_from(["lz4", "lz4", "lz4hc", "zstd", "blosclz", "zlib"]),
        "clevel": st.integers(0, 9),
        "shuffle": st.sampled_from([0, 1, 1, 2]),
        "blocksize": st.sampled_from([0, 0, 256, 1000, 4096, 65536]),
    }
)

#: header fields a damage may set: (offset, struct format)
FIELDS = {
    "version": (0, "B"),
    "versionlz": (1, "B"),
    "flags": (2, "B"),
    "typesize": (3, "B"),
    "nbytes": (4, "<i"),
    "blocksize": (8, "<i"),
    "cbytes": (12, "<i"),
}


@st.composite
def damaged(draw, raw: bytes) -> bytes:
    """``raw`` left alone, or with a header field set to a neighbour of its value or an edge, bytes
    flipped or zeroed inside the chunk, or cut short / extended."""
    kind = draw(st.sampled_from(["none", "none", "field", "bytes", "cut", "stream"]))
    buf = bytearray(raw)
    if kind == "stream" and len(buf) > 20 and not buf[2] & 0x02:  # a block's first stream zeroed
        nbytes, blocksize = struct.unpack_from("<ii", buf, 4)
        nblocks = -(-nbytes // blocksize) if blocksize > 0 else 0
        if nblocks and 16 + 4 * nblocks <= len(buf):
            b = draw(st.integers(0, nblocks - 1))
            (start,) = struct.unpack_from("<i", buf, 16 + 4 * b)
            if 16 <= start < len(buf) - 4:
                buf[start + 4 : start + 4 + draw(st.integers(1, 24))] = bytes(24)[: len(buf) - start - 4]
        return bytes(buf[: len(raw)])
    if kind == "field":
        name = draw(st.sampled_from(sorted(FIELDS)))
        off, code = FIELDS[name]
        (old,) = struct.unpack_from(code, buf, off)
        lo, hi = (0, 255) if code == "B" else (-(2**31), 2**31 - 1)
        new = draw(st.sampled_from([0, 1, lo, hi, old - 1, old + 1, old * 2, old // 2, old ^ 0x10]))
        struct.pack_into(code, buf, off, min(max(new, lo), hi))
    elif kind == "bytes" and len(buf) > 16:
        at = draw(st.integers(16, len(buf) - 1))
        width = draw(st.integers(1, 16))
        value = draw(st.sampled_from([0x00, 0xFF, None]))
        for i in range(at, min(at + width, len(buf))):
            buf[i] = buf[i] ^ 0x5A if value is None else value
    elif kind == "cut":
        buf = buf[: draw(st.integers(0, len(buf)))] if draw(st.booleans()) else buf + bytes(draw(st.integers(1, 9)))
    return bytes(buf)


# --- CSV number cells ----------------------------------------------------------------------------------
FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def number_cells(draw) -> str:
    """A decimal number as a CSV cell: Python's repr, L5Kit's %.5f, %.17g, %e, or digits spelled
    out (long mantissas, exponents past 22: the cells the parser hands to strtod)."""
    form = draw(st.sampled_from(["repr", "f5", "g17", "e", "digits"]))
    if form == "digits":
        sign = draw(st.sampled_from(["", "-"]))
        whole = draw(st.text("0123456789", min_size=1, max_size=25))
        frac = draw(st.text("0123456789", max_size=25))
        exp = draw(st.sampled_from(["", f"e{draw(st.integers(-330, 330))}", f"E+{draw(st.integers(0, 40))}"]))
        text = sign + whole + ("." + frac if frac else "") + exp
        return text if np.isfinite(float(text)) else "0.5"
    x = draw(FINITE.filter(lambda v: abs(v) < 1e300))
    return {"repr": repr(x), "f5": f"{x:.5f}", "g17": f"{x:.17g}", "e": f"{x:e}"}[form]


# --- where expressions and their numpy meaning -----------------------------------------------------------
COLUMNS = ("x", "y", "k")


def _leaf() -> st.SearchStrategy:
    col = st.sampled_from(COLUMNS)
    const = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, -1.25, 2.0]))
    op = st.sampled_from(
        [
            ("<", np.less),
            ("<=", np.less_equal),
            (">", np.greater),
            (">=", np.greater_equal),
            ("==", np.equal),
            ("!=", np.not_equal),
        ]
    )

    def make(c, o, v, scale):
        text, fn = o
        if scale:
            return f"({c} * 2 - {v}) {text} 1", (lambda d, c=c, fn=fn, v=v: fn(d[c] * 2 - v, 1))
        return f"{c} {text} {v}", (lambda d, c=c, fn=fn, v=v: fn(d[c], v))

    in_leaf = st.builds(
        lambda vs, neg: (
            f"k {'not in' if neg else 'in'} {list(vs)}",
            lambda d, vs=vs, neg=neg: np.isin(d["k"], vs) ^ neg,
        ),
        st.lists(st.integers(-3, 3), min_size=1, max_size=3),
        st.booleans(),
    )
    return st.one_of(st.builds(make, col, op, const, st.booleans()), in_leaf)


def where_expressions() -> st.SearchStrategy:
    """``(text, fn)``: a ``where`` and the same condition written with numpy on a dict of columns."""

    def extend(inner):
        both = st.tuples(inner, inner)
        return st.one_of(
            st.builds(
                lambda ab: (
                    f"({ab[0][0]}) and ({ab[1][0]})",
                    lambda d, ab=ab: np.logical_and(ab[0][1](d), ab[1][1](d)),
                ),
                both,
            ),
            st.builds(
                lambda ab: (f"({ab[0][0]}) or ({ab[1][0]})", lambda d, ab=ab: np.logical_or(ab[0][1](d), ab[1][1](d))),
                both,
            ),
            st.builds(lambda a: (f"not ({a[0]})", lambda d, a=a: np.logical_not(a[1](d))), inner),
        )

    return st.recursive(_leaf(), extend, max_leaves=6)


@st.composite
def where_columns(draw, n: int) -> dict[str, np.ndarray]:
    """Columns x, y (float64 with NaN and infinities) and k (int64) of ``n`` rows."""
    floats = st.one_of(st.floats(-4, 4), st.sampled_from([np.nan, np.inf, -np.inf, 0.5, -0.0]))
    return {
        "x": np.array(draw(st.lists(floats, min_size=n, max_size=n)), np.float64),
        "y": np.array(draw(st.lists(floats, min_size=n, max_size=n)), np.float64),
        "k": np.array(draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n)), np.int64),
    }


# --- string columns ---------------------------------------------------------------------------------------
TOKENS = st.one_of(st.text("0123456789abcdef", min_size=0, max_size=64), st.text(max_size=12))


# --- partials of the cache of partial results ---------------------------------------------------------------
_ARRAY_DTYPES = st.sampled_from(
    [np.dtype(b) for b in BASES]
    + [np.dtype("?"), np.dtype("<U5"), np.dtype("S3"), np.dtype("<c16"), np.dtype([("a", "<i8"), ("p", "<f4", (2,))])]
)


@st.composite
def _arrays(draw) -> np.ndarray:
    """Arrays of any of those dtypes, 0-3 dimensions (empty ones too), any bit patterns."""
    dtype = draw(_ARRAY_DTYPES)
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
    raw = draw(st.binary(min_size=dtype.itemsize * int(np.prod(shape)), max_size=dtype.itemsize * int(np.prod(shape))))
    return np.frombuffer(raw, dtype).reshape(shape).copy()


_INT64 = st.integers(-(2**63), 2**63 - 1)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),  # (any size)
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.text(max_size=8),
    _arrays(),
    _arrays().filter(lambda a: a.ndim == 0 and a.dtype.kind != "V").map(lambda a: a[()]),  # numpy scalars
    st.frozensets(_INT64, max_size=5),
    st.sets(st.text(max_size=4), max_size=5),
)


def partials() -> st.SearchStrategy:
    """Partials as a cache entry holds them: numbers, strings, arrays, numpy scalars, sets, nested
    in tuples, lists, dicts, and l5dask's own NamedTuples and dataclasses (a pass's ``Block``, the
    engine's ``Rows``)."""
    from l5dask.core.engine import Block, Rows

    def extend(inner: st.SearchStrategy) -> st.SearchStrategy:
        keys = st.one_of(st.text(max_size=4), st.integers(-5, 5))
        return st.one_of(
            st.tuples(inner, inner),
            st.lists(inner, max_size=4),
            st.dictionaries(keys, inner, max_size=4),
            st.builds(Block, inner, st.none(), st.none() | st.dictionaries(st.text(max_size=3), _arrays(), max_size=2)),
            st.builds(Rows, st.integers(0, 10**12), st.dictionaries(st.text(max_size=3), _arrays(), max_size=3)),
        )

    return st.recursive(_SCALARS, extend, max_leaves=12)
