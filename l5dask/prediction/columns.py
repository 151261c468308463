"""Named columns of each stored array: its fields flattened, derived values, and join columns.

One catalogue (:class:`Table`) per array of a dataset, shared by the dataframe view
(:func:`l5dask.prediction.dataframe.to_dask_dataframe`), the declarative aggregations
(:func:`l5dask.prediction.aggregation.aggregate`) and the CLI. A column is computed per stored chunk from
the chunk's records (decoded once; numbers and argmaxes gathered in one compiled pass, straight
from the compressed bytes when the chunk is handed over undecoded) and, for join columns, from
the rows of the parent array that overlap the chunk (the engine's
:class:`~l5dask.core.engine.Rows`):

- **stored**: one column per field, subarray fields one column per element: ``centroid_x``,
  ``extent_length``, ``velocity_y``, ``frame_index_start``/``_end`` for intervals, ``ego_x``,
  ``ego_rotation_xy``; probability fields one column per class (the 17 label names, the three
  traffic-light face statuses);
- **derived**: ``label`` and ``status`` (the argmax, categorical, numpy's first-maximum rule),
  ``speed`` (``sqrt(vx² + vy²)`` in float64, as the report), ``num_agents``/``num_frames``/
  ``num_tl_faces`` (interval lengths), ``hour`` (UTC hour of day of the timestamp);
- **join**: ``frame_index``, ``scene_index``, ``timestamp``, ``host`` (categorical), ``ego_x``,
  ``ego_y`` of each row's frame or scene; ``distance_to_ego`` (from the centroid and its frame's
  ego position, as the report) and ``hour`` need them too.

Each table's row index is a column too: ``scene_index`` (scenes), ``frame_index`` (frames),
``agent_index``, ``tl_face_index``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from l5dask.core.engine import Rows, parent_rows
from l5dask.errors import FormatError, UsageError
from l5dask.prediction import format as fmt
from l5dask.prediction.kernels import distance_to_parent, distance_to_runs, gather, norm2

#: Stored chunks fetched together, undecoded, when a partition's columns are made (12 MB of
#: agents' compressed bytes).
ENCODED_RUN = 16

#: The row index column of each array.
INDEX = {fmt.SCENES: "scene_index", fmt.FRAMES: "frame_index", fmt.AGENTS: "agent_index", fmt.TL_FACES: "tl_face_index"}
#: The interval field of each child's parent, and the parent.
PARENT = {
    fmt.FRAMES: (fmt.SCENES, "frame_index_interval"),
    fmt.AGENTS: (fmt.FRAMES, "agent_index_interval"),
    fmt.TL_FACES: (fmt.FRAMES, "traffic_light_faces_index_interval"),
}
#: Short names of subarray fields' columns (others: ``{field}_{element}``).
PREFIX = {
    "ego_translation": "ego",
    "frame_index_interval": "frame_index",
    "agent_index_interval": "agent_index",
    "traffic_light_faces_index_interval": "tl_face_index",
}
NS_PER_HOUR = 3_600_000_000_000


@dataclass(frozen=True)
class Column:
    """One named column: how a chunk makes it, what it needs."""

    name: str
    kind: str  # "index", "stored", "derived", "join"
    dtype: np.dtype
    make: Callable[[Chunk], np.ndarray]
    fields: tuple[str, ...] = ()  # stored fields read
    parent: tuple[str, ...] = ()  # parent row columns needed ("scene", "host", frame fields)
    needs: tuple[str, ...] = ()  # other columns it is computed from
    categories: Sequence[str] | None = None  # categorical: values are codes into these
    element: tuple[str, tuple[int, ...]] | None = None  # a stored number: (field, index in the field)
    argmax: str | None = None  # the argmax of this (float32) field

    @property
    def categorical(self) -> bool:
        return self.categories is not None


class Chunk:
    """The columns of one chunk of rows ``start .. start + len(data) - 1``, computed on demand
    (each once) from its records and the parent rows that overlap it.

    ``data`` is the records, or stored chunks not yet decoded (:class:`l5dask.prediction.reading.Encoded`):
    numbers and argmaxes are then gathered straight from the compressed bytes, and the records
    are decoded only if a column needs them as records."""

    def __init__(
        self, columns: dict[str, Column], data: Any, start: int, parent: Rows | None, parent_start: str = "start"
    ) -> None:
        self.columns, self._data, self.start, self.parent = columns, data, start, parent
        self.parent_start = parent_start
        self._cols: dict[str, np.ndarray] = {}
        self._pos: np.ndarray | None = None
        self._runs: np.ndarray | None | bool = False  # (False: not made yet)
        self._narrowed = False

    def __len__(self) -> int:
        return len(self._data)

    @property
    def data(self) -> np.ndarray:
        """The records."""
        return self._data if isinstance(self._data, np.ndarray) else self._data.records()

    def __getitem__(self, name: str) -> np.ndarray:
        col = self._cols.get(name)
        if col is None:
            col = self._cols[name] = self.columns[name].make(self)
        return col

    def gathered(self, name: str) -> np.ndarray:
        """A stored number or an argmax: made with every other one the columns use, in one pass
        over the records (``l5dask.prediction.kernels.gather``)."""
        if name not in self._cols:
            self._gather()
        return self._cols[name]

    def _gather(self) -> None:

        wanted = [c for c in self.columns.values() if c.element is not None and c.name not in self._cols]
        maxed = [c for c in self.columns.values() if c.argmax is not None and c.name not in self._cols]
        elements = [c.element for c in wanted if c.element is not None]
        argmax = [c.argmax for c in maxed if c.argmax is not None]
        values, maxes = (
            gather(self._data, elements, argmax)
            if isinstance(self._data, np.ndarray)
            else self._data.gather(elements, argmax)
        )
        self._cols.update(zip([c.name for c in wanted], values))
        self._cols.update(zip([c.name for c in maxed], maxes))

    @property
    def parent_rows(self) -> Rows:
        """The parent rows of this chunk's rows (a join column needs them): of the rows it was
        given (a task's parent blocks, 80,000 frames for 160,000 agents), those that overlap it
        (2,000), so that a column made per parent row is made for those alone."""
        if self.parent is None:
            raise ValueError("a join column of a chunk given no parent rows")
        if not self._narrowed:
            self.parent = self.parent.overlapping(self.start, self.start + len(self), self.parent_start)
            self._narrowed = True
        return self.parent

    def spread(self, values: np.ndarray) -> np.ndarray:
        """``values`` (one per parent row) of each row's parent: ``values[self.pos]``, in one pass
        (``Rows.spread``, its runs made once for the chunk's columns)."""
        runs = self.runs
        return values[self.pos] if runs is None else np.repeat(values, runs, axis=0)

    @property
    def runs(self) -> np.ndarray | None:
        """The rows of each parent row, in order (``Rows.runs``), or ``None`` (some row has no parent there)."""
        if self._runs is False:
            self._runs = self.parent_rows.runs(self.start, self.start + len(self), self.parent_start)
        return self._runs  # type: ignore[return-value]

    @property
    def pos(self) -> np.ndarray:
        """Position, in the parent rows, of each row's parent."""
        if self._pos is None:
            self._pos = self.parent_rows.locate(self.start, self.start + len(self), self.parent_start)
        return self._pos

    def kept(self, rows: np.ndarray) -> Kept:
        """These rows at ``rows`` (positions, increasing): what a ``where`` keeps."""
        return Kept(self, rows)


class Kept:
    """The rows ``rows`` (positions, increasing) of a :class:`Chunk`, the rows a ``where`` keeps:
    a column the chunk has made, or makes of its own rows, is taken at them; a column of the
    parent rows (a ``join``) is spread over them alone, never over every row of the chunk (the
    scene of the agents within 20 m of their ego: 240 MB not written for 30 M agents)."""

    __slots__ = ("chunk", "rows", "_cols", "_counts")

    def __init__(self, chunk: Chunk, rows: np.ndarray) -> None:
        self.chunk, self.rows = chunk, rows
        self._cols: dict[str, np.ndarray] = {}
        self._counts: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, name: str) -> np.ndarray:
        col = self._cols.get(name)
        if col is None:
            column = self.chunk.columns[name]
            if column.kind == "join" and name not in self.chunk._cols:
                # (its parent rows' values spread over these rows: a join's maker asks for the
                # parent rows and spread() alone)
                col = column.make(self)  # type: ignore[arg-type]
            else:
                col = self.chunk[name].take(self.rows)
            self._cols[name] = col
        return col

    @property
    def parent_rows(self) -> Rows:
        return self.chunk.parent_rows

    def spread(self, values: np.ndarray) -> np.ndarray:
        """``values`` (one per parent row) of each of these rows' parent."""
        if self._counts is None:
            rows = self.chunk.parent_rows
            self._counts = rows.parents_of(self.chunk.start + self.rows, self.chunk.parent_start)
        return np.repeat(values, self._counts, axis=0)


# --- column makers (module level: they travel in tasks) -----------------------------------
def _index(c: Chunk) -> np.ndarray:
    return np.arange(c.start, c.start + len(c), dtype=np.int64)


def _field(name: str, index: tuple, dtype: np.dtype, c: Chunk) -> np.ndarray:
    return np.array(c.data[name][(slice(None), *index)], dtype=dtype)


def _gathered(name: str, c: Chunk) -> np.ndarray:
    return c.gathered(name)


def _codes(name: str, categories: tuple[str, ...], c: Chunk) -> np.ndarray:
    values = c.data[name]
    cats = np.asarray(categories)
    codes = np.searchsorted(cats, values)
    codes[codes == len(cats)] = 0
    if not np.array_equal(cats[codes], values):
        raise FormatError(f"{name}: values that are not among the {len(cats)} categories found first")
    return codes.astype(np.int32)


#: Derived columns another analysis of a fused pass may have made of the same rows (the report's
#: agents loop: ``l5dask.prediction.stats.SHARED_COLUMNS``), the same bits: taken from the chunk
#: (``Encoded.derived``) when there, else made here.
SHARED = ("speed", "distance_to_ego")


def _made(c: Chunk, name: str) -> np.ndarray | None:
    """The column ``name`` of the chunk's rows made by another member of its fused pass, or ``None``."""
    derived = getattr(c._data, "derived", None)
    return derived(name) if derived is not None else None


def _speed(c: Chunk) -> np.ndarray:
    made = _made(c, "speed")
    return made if made is not None else norm2(c["velocity_x"], c["velocity_y"])


def _length(name: str, c: Chunk) -> np.ndarray:
    iv = c.data[name]
    return (iv[:, 1] - iv[:, 0]).astype(np.int64)


def hour_of_day(timestamp: np.ndarray) -> np.ndarray:
    """UTC hour of day (int8) of timestamps in nanoseconds since the epoch."""
    return ((timestamp // NS_PER_HOUR) % 24).astype(np.int8)


def _hour(c: Chunk) -> np.ndarray:
    return hour_of_day(c["timestamp"])


def _parent_hour(c: Chunk) -> np.ndarray:
    """The hour of each row's frame: computed per frame, then spread over its rows."""
    return c.spread(hour_of_day(c.parent_rows["timestamp"]))


def _distance(c: Chunk) -> np.ndarray:
    """``sqrt(dx * dx + dy * dy)`` in float64 to the ego of the row's frame, as the report (one
    compiled pass over the rows, a frame's rows at a time: no per-row copies of the ego, nor
    positions of it)."""
    made = _made(c, "distance_to_ego")
    if made is not None:
        return made
    x, y, ego = c["centroid_x"], c["centroid_y"], c.parent_rows["ego_translation"]
    runs = c.runs
    return distance_to_parent(x, y, ego, c.pos) if runs is None else distance_to_runs(x, y, ego, runs)


def _parent_index(c: Chunk) -> np.ndarray:
    rows = c.parent_rows
    return c.spread(np.arange(rows.offset, rows.offset + len(rows), dtype=np.int64))


def _parent_col(name: str, index: tuple, dtype: np.dtype, c: Chunk) -> np.ndarray:
    col = c.parent_rows[name]
    return np.asarray(c.spread(col[(slice(None), *index)] if index else col), dtype=dtype)


def _partial(func, *args):
    import functools

    return functools.partial(func, *args)


# --- the catalogue --------------------------------------------------------------------------
def element_names(name: str, shape: tuple[int, ...], labels: tuple[str, ...]) -> list[tuple[str, tuple]]:
    """``(column name, index)`` of each element of a subarray field."""
    if name == "label_probabilities":
        return [(label, (i,)) for i, label in enumerate(labels)]
    if name == "traffic_light_face_status":
        return [(s, (i,)) for i, s in enumerate(fmt.TL_FACE_STATUSES)]
    known = fmt.FIELD_DIMS.get(name)
    prefix = PREFIX.get(name, name)
    if known and all(c is not None for c in known[1]) and len(known[1]) == len(shape):
        import itertools

        return [
            (f"{prefix}_{''.join(parts)}", idx)
            for idx, parts in zip(itertools.product(*(range(n) for n in shape)), itertools.product(*known[1]))  # type: ignore[arg-type]
        ]
    import itertools

    return [(f"{prefix}_{'_'.join(map(str, idx))}", idx) for idx in itertools.product(*(range(n) for n in shape))]


@dataclass
class Table:
    """The columns of one array of a dataset (see the module's docstring).

    Parameters
    ----------
    ds : L5Dataset
    array : str
        ``agents``, ``frames``, ``scenes``, ``tl_faces`` (or the stored names).
    hosts : sequence of str, optional
        The host names (categories of ``host``); read from the scenes when first needed.
    read : callable, optional
        How the scenes are read whole for them (a job's ``read``, which each job does once).
    """

    ds: Any
    array: str
    hosts: tuple[str, ...] | None = None
    columns: dict[str, Column] = field(default_factory=dict)
    read: Any = None

    def __post_init__(self) -> None:
        self.array = {v: k for k, v in fmt.SHORT_NAMES.items()}.get(self.array, self.array)
        if self.array not in fmt.ARRAY_NAMES:
            raise UsageError(
                f"unknown array {self.array!r}; the arrays are {', '.join(fmt.SHORT_NAMES[n] for n in fmt.ARRAY_NAMES)}"
            )
        self.source = self.ds[self.array]
        self._build()

    def __dask_tokenize__(self):
        from dask.base import tokenize

        return ("l5dask.Table", tokenize(self.source), self.hosts)

    # -- building -----------------------------------------------------------------------------
    def _add(self, col: Column) -> None:
        self.columns.setdefault(col.name, col)

    @staticmethod
    def _stored(col: str, name: str, idx: tuple, dtype: np.dtype) -> Column:
        if dtype.kind in "biuf":  # numbers: gathered together in one pass over the records
            return Column(col, "stored", dtype, _partial(_gathered, col), fields=(name,), element=(name, idx))
        return Column(col, "stored", dtype, _partial(_field, name, idx, dtype), fields=(name,))

    def _build(self) -> None:
        a, dtype = self.array, self.source.dtype
        self._add(Column(INDEX[a], "index", np.dtype(np.int64), _index))
        for name in dtype.names:
            sub = dtype.fields[name][0]
            if sub.kind == "U" and name == "host":
                self._add(
                    Column(
                        "host",
                        "stored",
                        np.dtype(np.int32),
                        _partial(_codes, "host", self._hosts()),
                        fields=("host",),
                        categories=self._hosts(),
                    )
                )
            elif sub.shape:
                for col, idx in element_names(name, sub.shape, self.ds.labels):
                    self._add(self._stored(col, name, idx, sub.base))
            else:
                self._add(self._stored(name, name, (), sub))
        names = dtype.names
        # the argmax columns: each row's most probable label, or face status
        for col, fld, cats in (
            ("label", "label_probabilities", tuple(self.ds.labels)),
            ("status", "traffic_light_face_status", tuple(fmt.TL_FACE_STATUSES)),
        ):
            if fld in names:
                self._add(
                    Column(
                        col,
                        "derived",
                        np.dtype(np.int8),
                        _partial(_gathered, col),
                        fields=(fld,),
                        categories=cats,
                        argmax=fld,
                    )
                )
        if "velocity" in names:
            self._add(Column("speed", "derived", np.dtype(np.float64), _speed, needs=("velocity_x", "velocity_y")))
        for fld, col in (
            ("frame_index_interval", "num_frames"),
            ("agent_index_interval", "num_agents"),
            ("traffic_light_faces_index_interval", "num_tl_faces"),
        ):
            if fld in names:
                self._add(Column(col, "derived", np.dtype(np.int64), _partial(_length, fld), fields=(fld,)))
        # joins
        if a == fmt.FRAMES:
            self._add(Column("scene_index", "join", np.dtype(np.int64), _parent_index, parent=("start",)))
            self._add(
                Column(
                    "host",
                    "join",
                    np.dtype(np.int32),
                    _partial(_parent_col, "host", (), np.int32),
                    parent=("host",),
                    categories=self._hosts(),
                )
            )
        elif a in (fmt.AGENTS, fmt.TL_FACES):
            i64, f8 = np.dtype(np.int64), np.dtype(np.float64)
            self._add(Column("frame_index", "join", i64, _parent_index, parent=(self.parent_start,)))
            self._add(Column("scene_index", "join", i64, _partial(_parent_col, "scene", (), i64), parent=("scene",)))
            self._add(
                Column("timestamp", "join", i64, _partial(_parent_col, "timestamp", (), i64), parent=("timestamp",))
            )
            self._add(
                Column(
                    "host",
                    "join",
                    np.dtype(np.int32),
                    _partial(_parent_col, "host", (), np.int32),
                    parent=("host",),
                    categories=self._hosts(),
                )
            )
            for i, axis in enumerate("xy"):
                self._add(
                    Column(
                        f"ego_{axis}",
                        "join",
                        f8,
                        _partial(_parent_col, "ego_translation", (i,), f8),
                        parent=("ego_translation",),
                    )
                )
            if "centroid" in names:
                self._add(
                    Column(
                        "distance_to_ego",
                        "derived",
                        f8,
                        _distance,
                        needs=("centroid_x", "centroid_y"),
                        parent=("ego_translation",),
                    )
                )
        if "timestamp" in self.columns:
            if self.columns["timestamp"].kind == "join":
                self._add(Column("hour", "derived", np.dtype(np.int8), _parent_hour, parent=("timestamp",)))
            else:
                self._add(Column("hour", "derived", np.dtype(np.int8), _hour, needs=("timestamp",)))

    @property
    def parent_start(self) -> str:
        """The parent rows' column that holds each parent's first row of this array."""
        return PARENT[self.array][1] if self.array in (fmt.AGENTS, fmt.TL_FACES) else "start"

    def _hosts(self) -> LazyHosts:
        return LazyHosts(self)

    def host_names(self) -> tuple[str, ...]:
        """The distinct hosts of the dataset's scenes, sorted (their chunks read once, here: no
        dask computation, so that building a view computes nothing)."""
        if self.hosts is None:
            array = self.ds[fmt.SCENES]
            scenes = self.read(array) if self.read is not None else array.read(0, array.meta.nchunks, ["host"])
            # (sorted by code point, as numpy sorts them; np.unique imports numpy.ma: 7 ms of a run)
            self.hosts = tuple(sorted(set(scenes["host"].tolist())))
        return self.hosts

    # -- using ------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self.columns)

    def resolve(self, names: Iterable[str], what: str = "column") -> list[str]:
        """``names`` checked: an unknown one raises an error naming those that exist."""
        names = list(names)
        unknown = [n for n in names if n not in self.columns]
        if unknown:
            raise UsageError(
                f"unknown {what}{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                f"for {fmt.SHORT_NAMES[self.array]}; the columns are: {', '.join(self.columns)}"
            )
        return names

    def closure(self, names: Iterable[str]) -> list[Column]:
        """The columns ``names`` and every column they are computed from."""
        seen: dict[str, Column] = {}

        def visit(n: str) -> None:
            if n not in seen:
                col = self.columns[n]
                for d in col.needs:
                    visit(d)
                seen[n] = col

        for n in self.resolve(names):
            visit(n)
        return list(seen.values())

    def parent_columns(self, names: Iterable[str]) -> tuple[str, ...]:
        """The parent row columns the columns ``names`` need (empty: no parent pass)."""
        return tuple(sorted({p for c in self.closure(names) for p in c.parent}))

    def categories(self, name: str) -> tuple[str, ...] | None:
        cats = self.columns[name].categories
        return tuple(cats) if cats is not None else None

    def select(self, names: Iterable[str]) -> Selection:
        """What tasks carry to make the columns ``names``: those columns and what they need
        (host categories resolved: the scenes are read once, only when a host column is used)."""
        names = tuple(dict.fromkeys(self.resolve(names)))
        cols = {}
        for c in self.closure(names):
            if isinstance(c.categories, LazyHosts):
                hosts = self.host_names()
                make = c.make
                if c.kind == "stored":
                    make = _partial(_codes, "host", hosts)
                c = Column(c.name, c.kind, c.dtype, make, c.fields, c.parent, c.needs, hosts, c.element, c.argmax)
            cols[c.name] = c
        return Selection(self.array, self.source, names, cols, self.parent_start)


@dataclass(frozen=True)
class Selection:
    """Some columns of one array, ready to be made per chunk (this travels in tasks)."""

    array: str
    source: Any
    names: tuple[str, ...]
    columns: dict[str, Column]
    parent_start: str = "start"

    def __dask_tokenize__(self):
        from dask.base import tokenize

        cats = {n: c.categories for n, c in self.columns.items() if c.categories is not None}
        return ("l5dask.Selection", tokenize(self.source), self.names, tokenize(cats))

    @property
    def parent(self) -> tuple[str, ...]:
        """The parent row columns needed (empty: no parent pass)."""
        return tuple(sorted({p for c in self.columns.values() for p in c.parent}))

    def chunk(self, data: np.ndarray, start: int, parent: Rows | None) -> Chunk:
        return Chunk(self.columns, data, start, parent, self.parent_start)

    def arrays(self, data: np.ndarray, start: int, parent: Rows | None) -> dict[str, np.ndarray]:
        """The selected columns of one chunk."""
        c = self.chunk(data, start, parent)
        return {n: c[n] for n in self.names}

    def block(
        self, first: int, n: int, rows: Rows | None, blocks: tuple = ()
    ) -> tuple[int, np.ndarray, dict[str, np.ndarray]]:
        """Stored chunks ``first .. first + n - 1`` read as one block (each decoded once) and the
        selected columns made of it, given the parent ``rows`` or the parent pass's ``blocks``:
        ``(first row, records, columns)``."""
        parent = parent_rows(rows, blocks)
        lo = self.source.chunk_bounds(first)[0]
        data = self.source.read(first, n)
        return lo, data, self.arrays(data, lo, parent)

    def columns_of(
        self, first: int, n: int, rows: Rows | None, blocks: tuple = ()
    ) -> tuple[int, int, dict[str, np.ndarray]]:
        """The selected columns of stored chunks ``first .. first + n - 1``, each decoded once:
        ``(first row, end row, columns)``.

        From sources that can, runs of :data:`ENCODED_RUN` chunks are fetched undecoded and the
        columns gathered straight from their bytes (no records are made); from others, each chunk
        is decoded into one reused chunk of scratch. Either way the records of the whole block
        are never held (for a 100 MB partition that saved its allocation, page faults and a
        second trip through memory), nor more than a run of its stored bytes."""
        lo = self.source.chunk_bounds(first)[0]
        hi = self.source.chunk_bounds(first + n - 1)[1] if n else lo
        out = {name: np.empty(hi - lo, self.columns[name].dtype) for name in self.names}
        for start, cols in self.pieces(first, n, rows, blocks):
            for name, values in cols.items():
                out[name][start - lo : start - lo + len(values)] = values
        return lo, hi, out

    def pieces(
        self, first: int, n: int, rows: Rows | None, blocks: tuple = (), run: int = ENCODED_RUN
    ) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """The selected columns of stored chunks ``first .. first + n - 1`` a piece at a time
        (runs of ``run`` stored chunks, or each chunk): ``(first row, columns)``."""
        parent = parent_rows(rows, blocks)
        if hasattr(self.source, "read_encoded"):
            for f in range(first, first + n, run):
                yield (
                    self.source.chunk_bounds(f)[0],
                    self.arrays(
                        self.source.read_encoded(f, min(run, first + n - f)), self.source.chunk_bounds(f)[0], parent
                    ),
                )
        else:
            for start, data in self.source.iter_chunks(first, n):
                yield start, self.arrays(data, start, parent)

    def empty(self) -> dict[str, np.ndarray]:
        return {n: np.zeros(0, self.columns[n].dtype) for n in self.names}


class LazyHosts(Sequence):
    """The host categories, read from the scenes only when a host column is used (what a job's
    check leaves unread: ``aggregation.group_bound``)."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def _names(self) -> tuple[str, ...]:
        return self.table.host_names()

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self):
        return iter(self._names())

    def __reduce__(self):  # travels as the names themselves
        return (tuple, (self._names(),))

    def __dask_tokenize__(self):
        return ("l5dask.hosts", self._names())
