"""A perception dataset opened lazily: tables parsed when a question needs them, tokens resolved
to row indices, chains checked and ranked, and joined columns on demand."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from l5dask.core.engine import Job
from l5dask.core.outputs import numpy_array
from l5dask.core.policy import where_keywords
from l5dask.core.store import Store
from l5dask.errors import FormatError, NotADatasetError, UnknownNameError
from l5dask.perception import links, tables
from l5dask.perception.geometry import check_values
from l5dask.perception.joins import frame
from l5dask.perception.lidar import sweeps


class Table:
    """One table with its links resolved: ``links[field]`` row indices (-1 none), ``lists[field]``
    CSR (offsets, indices); chained tables also have ``head`` and ``position`` per row."""

    def __init__(self, raw: tables.RawTable) -> None:
        self.name = raw.name
        self.arrow = raw.arrow
        self.where = raw.source
        self.present = raw.present
        self.links: dict[str, np.ndarray] = {}
        self.lists: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.head: np.ndarray | None = None
        self.position: np.ndarray | None = None
        self._cache: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return self.arrow.num_rows

    @property
    def tokens(self) -> Any:
        return self.arrow.column("token")

    def strings(self, col: str) -> np.ndarray:
        """A string column as a numpy object array (``None`` as ``""``)."""
        if col not in self._cache:
            values = np.array(self.arrow.column(col).to_pylist() if len(self) else [], object)
            values[values == None] = ""  # noqa: E711  (elementwise, over an object array)
            self._cache[col] = values
        return self._cache[col]

    def numbers(self, col: str, dtype=np.float64) -> np.ndarray:
        if col not in self._cache:
            values = numpy_array(self.arrow.column(col), 0)  # nulls as 0
            values = np.nan_to_num(values.astype(np.float64), nan=0.0)
            self._cache[col] = values.astype(dtype)
        return self._cache[col]

    def vectors(self, col: str) -> np.ndarray:
        """A fixed-length number list (translation, size, rotation) as an (n, k) float64 array."""
        if col not in self._cache:
            import pyarrow.compute as pc

            k = tables.VECTORS[col]
            flat = pc.list_flatten(self.arrow.column(col))
            self._cache[col] = numpy_array(flat).astype(np.float64).reshape(len(self), k)
        return self._cache[col]


class PerceptionDataset:
    """A Lyft perception dataset (folder, zip, tar, S3 or any fsspec URL).

    Tables are parsed when first needed (:meth:`load` parses several in parallel tasks);
    :meth:`table` gives one with its links resolved and checked, :meth:`frame` a pandas
    DataFrame of stored and joined columns (see :data:`l5dask.perception.joins.COLUMNS`).
    """

    @where_keywords
    def __init__(self, store: Store, scheduler: Any = None) -> None:
        self.store = store
        #: where its passes run (the report's lidar, points in boxes); ``None``: the tables on
        #: local threads, the rest on the active client, else local threads
        self.job = None if scheduler is None else Job.of(scheduler)
        self._raw: dict[str, tables.RawTable] = {}
        self._tables: dict[str, Table] = {}

    def __repr__(self) -> str:
        return f"<PerceptionDataset {self.store.url}>"

    @property
    def url(self) -> str:
        return self.store.url

    # -- parsing -----------------------------------------------------------------------------
    def load(self, names=tables.TABLES) -> None:
        """Parse these tables (those not parsed yet), one task each, in parallel."""
        todo = [n for n in dict.fromkeys(names) if n not in self._raw]
        if not todo:
            return
        if len(todo) == 1:
            order, got = todo, [tables.read(self.store, todo[0])]
        else:
            # one engine task per table (DuckDB parses without the GIL: local threads overlap the
            # tables, largest first; a cluster's workers parse them where they are)
            order = sorted(todo, key=_weight, reverse=True)
            job = self.job or Job(scheduler="threads")
            calls = [(self.store, n) for n in order]
            got = job.map(tables.read, calls, name="l5-perception-tables", remote=self.store.remote)
        for name, raw in zip(order, got):
            self._raw[name] = raw

    def raw(self, name: str) -> tables.RawTable:
        _known(name)
        self.load([name])
        return self._raw[name]

    def exists(self, name: str) -> bool:
        """Whether the table's file is there (only the annotation tables may be absent)."""
        return self.raw(name).present

    # -- resolved tables ---------------------------------------------------------------------
    def table(self, name: str) -> Table:
        """Table ``name`` with its links resolved to row indices, tokens checked unique, chains ranked."""
        if name in self._tables:
            return self._tables[name]
        _known(name)  # (before any read: a typo is not a missing file)
        targets = {t for t, _ in links.LINKS.get(name, {}).values()}
        self.load(
            [
                name,
                *sorted(targets),
                *(["scene"] if name == "sample" else []),
                *(["instance"] if name == "sample_annotation" else []),
            ]
        )
        t = Table(self._raw[name])
        spec = links.LINKS.get(name, {})
        own = [f for f, (target, _) in spec.items() if target == name]

        def resolve(field: str, found: Any = None) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
            target, required = spec[field]
            other = self._raw[target].arrow.column("token") if target != name else t.tokens
            if field in links.LIST_LINKS:
                return links.resolve_list(t.arrow.column(field), other, t.where, field, target, t.tokens)
            return links.resolve(t.arrow.column(field), other, t.where, field, target, required, t.tokens, found)

        others = [f for f in spec if f not in own]
        self._tables[name] = t
        try:
            # the links to other tables resolve in a thread (the lookups release the GIL) while
            # the table's own tokens are hashed and its prev/next looked up; errors in field order
            def other_links() -> dict:
                return {f: resolve(f) for f in others}

            def own_links() -> list:
                return links.self_index(t.tokens, t.where, *[t.arrow.column(f) for f in own])

            if len(t) >= 100_000:  # two engine tasks on local threads: the lookups release the GIL
                pending, own_found = Job(scheduler="threads").map(_call, [(other_links,), (own_links,)], "l5-links")
            else:
                pending, own_found = other_links(), own_links()
            found = dict(zip(own, own_found))
            for field, value in pending.items():
                (t.lists if field in links.LIST_LINKS else t.links)[field] = value
            for field in own:  # (own links are never lists)
                t.links[field] = resolve(field, found[field])  # type: ignore[assignment]
            if name == "sample":
                self._rank_samples(t)
            elif name == "sample_annotation":
                t.head, t.position = links.chain(
                    t.links["prev"], t.links["next"], t.links["instance_token"], t.where, t.tokens, "instance"
                )
                links.group_starts(
                    t.links["instance_token"],
                    len(self._raw["instance"]),
                    t.head,
                    t.where,
                    t.tokens,
                    "instance",
                    self._raw["instance"].arrow.column("token"),
                )
                # (each box a box, for every command: a rotation of norm 0 or a size of 0 was
                # counted by stats, points-in-boxes and to-l5kit, and refused by evaluate alone)
                check_values(
                    t.vectors("translation"),
                    t.vectors("size"),
                    t.vectors("rotation"),
                    lambda i: f"{t.where}: row {int(i)}",
                )
        except BaseException:
            del self._tables[name]
            raise
        return t

    def _rank_samples(self, t: Table) -> None:
        scene = self._raw["scene"]
        group = t.links["scene_token"]
        t.head, t.position = links.chain(t.links["prev"], t.links["next"], group, t.where, t.tokens, "scene")
        links.group_starts(group, len(scene), t.head, t.where, t.tokens, "scene", scene.arrow.column("token"))
        # a scene's first and last sample are the ends of its chain
        sc = self.table("scene")
        first, last = sc.links["first_sample_token"], sc.links["last_sample_token"]
        rows = np.arange(len(sc))
        for field, ends, bad_end in (
            ("first_sample_token", first, t.links["prev"]),
            ("last_sample_token", last, t.links["next"]),
        ):
            wrong = rows[(group[ends] != rows) | (bad_end[ends] >= 0)]
            if len(wrong):
                r = int(wrong[0])
                raise FormatError(
                    f"{sc.where}: row {r} (token {sc.tokens[r].as_py()}): {field} is not the "
                    f"{'start' if field.startswith('first') else 'end'} of the scene's sample chain "
                    "(the prev/next chain breaks)"
                )

    def frame(self, name: str, columns: list[str] | None = None) -> Any:
        """Table ``name`` as a pandas DataFrame of the named columns (stored or joined; default: the
        stored columns with links as row indices)."""

        return frame(self, name, columns)

    def to_dask_dataframe(self, name: str, columns: list[str] | None = None, npartitions: int | None = None) -> Any:
        """A table as a dask DataFrame (for the cluster path), partitions of about 100,000 rows."""
        import dask.dataframe as dd

        df = self.frame(name, columns)
        return dd.from_pandas(df, npartitions=npartitions or max(1, len(df) // 100_000))

    def sweeps(self, channels: list[str] | None = None, key_frames: bool = False, frame: str = "sensor") -> Any:
        """The lidar sweeps as one lazy dask array of points with L5Kit-style offsets per sweep
        (see :class:`l5dask.perception.lidar.Sweeps`)."""

        return sweeps(self, channels, key_frames, frame)


def _known(name: str) -> None:
    if name not in tables.SCHEMA:
        raise UnknownNameError(f"no table {name!r}; the tables are {', '.join(tables.TABLES)}")


def _call(func: Any) -> Any:
    return func()


def _weight(name: str) -> int:
    return {"sample_annotation": 4, "sample_data": 3, "ego_pose": 2}.get(name, 0)


@where_keywords
def open_perception(
    url: str | os.PathLike, storage_options: dict[str, Any] | None = None, scheduler: Any = None
) -> PerceptionDataset:
    """Open a Lyft perception dataset: a folder holding ``data/*.json`` (or one level above it), a
    ``.zip`` or ``.tar`` of it, ``s3://`` or any fsspec URL. Nothing is parsed yet.

    ``scheduler``: where its passes run (a ``distributed.Client`` or its address, ``"threads"``...;
    default: its tables on local threads, its lidar on the active client, else local threads);
    ``job=`` is its old name (until the next release, with a ``FutureWarning``)."""
    store = Store(os.fspath(url), storage_options)
    if not _has(store, "data/scene.json"):
        sub = _find_root(store)
        if sub is None:
            if not store.exists_root():
                raise NotADatasetError(f"{store.url}: no such file, folder or bucket")
            if _has(store, "scene.json"):
                raise NotADatasetError(
                    f"{store.url}: a folder of tables; give the folder above it (the dataset "
                    "holds data/*.json, lidar/, images/, maps/)"
                )
            if _has(store, ".zgroup"):
                raise NotADatasetError(
                    f"{store.url}: an L5Kit prediction dataset (zarr), not a perception dataset; "
                    "use l5dask stats / l5dask report"
                )
            raise NotADatasetError(f"{store.url}: not a Lyft perception dataset (no data/scene.json)")
        store = sub
    return PerceptionDataset(store, scheduler)


def _has(store: Store, key: str) -> bool:
    try:
        return bool(store.fs.exists(store.path(key)))
    except (OSError, ValueError):
        return False


def _find_root(store: Store) -> Store | None:

    try:
        subs = store.fs.ls(store.root or "", detail=False)
    except (OSError, ValueError):
        return None
    for sub in subs[:64]:
        sub = sub.rstrip("/")
        if store.fs.exists(f"{sub}/data/scene.json"):
            return store.with_root(sub)
    return None
