"""The house's rules, checked over the package's own imports (as import-linter's layers and
independence contracts would): the core knows no system; prediction knows no other system;
evaluation and perception use the core and prediction's public modules, never each other; no
import cycle; no private name crosses a package line; the package's own modules are imported at
the top of each module."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

import l5dask

PACKAGE = Path(l5dask.__file__).parent
SYSTEMS = ("prediction", "evaluation", "perception")
#: what each part may import of the package (besides itself, l5dask.errors and l5dask's version)
ALLOWED = {
    "core": set(),
    "prediction": {"core"},
    "evaluation": {"core", "prediction"},
    "perception": {"core", "prediction"},
    "top": {"core", *SYSTEMS},
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path) -> list[tuple[str, list[str], int, bool]]:
    """``(module, names, line, at top level)`` of each import of the package's own modules."""
    tree = ast.parse(path.read_text())
    top = set(id(n) for n in tree.body)
    for node in tree.body:  # imports under ``if TYPE_CHECKING:`` count as top level
        if isinstance(node, ast.If):
            top |= {id(n) for n in node.body}
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod == "l5dask" or mod.startswith("l5dask."):
                out.append((mod, [a.name for a in node.names], node.lineno, id(node) in top))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("l5dask"):
                    out.append((a.name, [], node.lineno, id(node) in top))
    return out


def _part(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ("core", *SYSTEMS):
        return parts[1]
    return "top"


def _target(module: str, names: list[str], modules: dict) -> list[str]:
    """The modules an import statement reaches (``from pkg import submodule`` reaches it)."""
    got = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules]
    return got or [module]


def test_the_layers_hold():
    modules = _modules()
    bad = []
    for name, path in modules.items():
        src = _part(name)
        for mod, names, line, _ in _imports(name, path):
            for target in _target(mod, names, modules):
                dst = _part(target)
                if target in ("l5dask", "l5dask.errors") or dst == src:
                    continue
                if dst not in ALLOWED[src]:
                    bad.append(f"{name}:{line} imports {target} ({src} may not import {dst})")
    assert bad == []


def test_no_private_name_crosses_a_package_line():
    modules = _modules()
    bad = []
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for mod, names, line, _ in _imports(name, path):
            for n in names:
                private = n.startswith("_") and not n.startswith("__")
                owner = mod if f"{mod}.{n}" not in modules else f"{mod}.{n}".rpartition(".")[0]
                if private and owner != here and not mod.endswith("._kernels"):
                    bad.append(f"{name}:{line} imports {mod}.{n}")
                if private and mod.endswith("._kernels") and mod.rpartition(".")[0] != here:
                    bad.append(f"{name}:{line} imports {mod}.{n}")
            parts = mod.split(".")
            if any(p.startswith("_") and not p.startswith("__") for p in parts[1:]) and ".".join(parts[:-1]) != here:
                bad.append(f"{name}:{line} imports the private module {mod}")
    assert bad == []


def test_no_import_cycle():
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for mod, names, _, _ in _imports(name, path):
            for target in _target(mod, names, modules):
                if target in modules and target != name:
                    graph[name].add(target)
    # a package's __init__ importing its own modules is the package's face, not a cycle
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(modules):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_package_imports_its_own_modules_at_the_top():
    """Only the command line (its lazy table of systems, and each system's command module, whose
    commands import what they run: ``l5dask --help`` lists every command without importing dask,
    xarray or pandas), the package's lazy public names and the dataset facade's views (xarray,
    pandas) import the package's modules inside functions."""
    modules = _modules()
    lazy = {"l5dask", "l5dask.cli", "l5dask.core.cli", *(f"l5dask.{s}.cli" for s in SYSTEMS)}
    # the dataset facade's xarray views and dataframes bring xarray and pandas: made on demand
    heavy = {
        ("l5dask.prediction.dataset", "l5dask.prediction.views"),
        ("l5dask.prediction.dataset", "l5dask.prediction.dataframe"),
    }
    inner = [
        f"{name}:{line} {mod}"
        for name, path in modules.items()
        if name not in lazy
        for mod, _, line, top in _imports(name, path)
        if not top and (name, mod) not in heavy
    ]
    assert inner == []


#: Third-party libraries of S3 requests whose use the store keeps in one place.
IO_LIBRARIES = {"obstore", "aiohttp", "botocore"}


def test_object_store_libraries_are_used_from_one_module():
    """obstore is imported only by ``l5dask.core.objects`` (the store's S3 reads), aiohttp by none
    (the hand-written GET client is gone), botocore only there (a profile's credentials) and by
    the store's resolution of the AWS chain; nothing else calls s3fs's coroutines (``_cat_file``)."""
    allowed_botocore = {"l5dask.core.objects", "l5dask.core.store"}
    found: dict[str, set[str]] = defaultdict(set)
    for name, path in _modules().items():
        text = path.read_text()
        tree = ast.parse(text)
        for node in ast.walk(tree):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                mods = [node.module or ""]
            for mod in mods:
                if mod.split(".")[0] in IO_LIBRARIES:
                    found[mod.split(".")[0]].add(name)
        if "._cat_file(" in text:
            found["_cat_file"].add(name)
    assert found["obstore"] == {"l5dask.core.objects"}
    assert "aiohttp" not in found
    assert found["botocore"] <= allowed_botocore
    assert found["_cat_file"] <= {"l5dask.core.objects"}


#: The engine's policy module, the one place that hands a graph to a scheduler or starts threads;
#: the store's read-ahead threads (which the policy module imports) keep their own pool.
RUNS_GRAPHS = "l5dask.core.policy"
OWN_POOL = {"l5dask.core.policy", "l5dask.core.diskread"}
#: The engine, the one place that makes lazy calls (``lazy_map``) and trees of them (``tree_combine``).
BUILDS_TREES = "l5dask.core.engine"


def test_graphs_run_and_threads_start_only_in_the_engines_policy():
    """No ``dask.compute``/``dask.persist`` call (nor a ``ThreadPoolExecutor``) outside
    :mod:`l5dask.core.policy` (and the store's read-ahead): every run has its client, progress bar
    and Ctrl-C there. No ``dask.delayed`` call outside :mod:`l5dask.core.engine` either: lazy
    calls are the engine's (``lazy_map``, ``Job.map`` of dask collections), and their partials merge
    in its one tree (``tree_combine``), never in a tree of ``delayed`` calls of a module's own."""
    bad = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("dask", "dask.delayed") and name != BUILDS_TREES:
                if any(a.name == "delayed" for a in node.names):
                    bad.append(f"{name}:{node.lineno} imports dask's delayed")
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            called = (
                f"{f.value.id}.{f.attr}"
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                else getattr(f, "id", getattr(f, "attr", ""))
            )
            if called in ("dask.compute", "dask.persist") and name != RUNS_GRAPHS:
                bad.append(f"{name}:{node.lineno} calls {called}")
            if called == "dask.delayed" and name != BUILDS_TREES:
                bad.append(f"{name}:{node.lineno} calls {called}")
            if called.endswith("ThreadPoolExecutor") and name not in OWN_POOL:
                bad.append(f"{name}:{node.lineno} starts a ThreadPoolExecutor")
    assert bad == []


def test_outputs_are_moved_into_place_only_by_the_one_helper():
    """One way to write an output whole: :func:`l5dask.core.outputs.atomic_output` (files and
    folders); no other module renames a temporary file or folder into place."""
    bad = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
            ):
                called = f"{node.func.value.id}.{node.func.attr}"
                if called in ("os.replace", "os.rename") and name != "l5dask.core.outputs":
                    bad.append(f"{name}:{node.lineno} calls {called}")
    assert bad == []


# --- where to run: one keyword on every public function ---------------------------------------
#: Names of parameters that would say where to run another way than ``scheduler=`` (dask's own).
NOT_WHERE = {"client", "job", "cluster", "address", "scheduler_address", "executor", "pool", "get"}
#: Parameters so named that do not say where to run: a scheduled job's file and its ``[cluster]`` table
#: (``docs/jobs.md``), whose runs take where to run as ``scheduler=`` too; and the engine's
#: vocabulary, an analysis declared into the job :func:`l5dask.analyze` runs (``plan(ds, job)``: the
#: caller chose where, through ``analyze(..., scheduler=)``).
NAMED_SO_BUT_NOT_WHERE = {
    ("l5dask.jobs.run_job", "job"),
    ("l5dask.core.runs.plan", "job"),
    ("l5dask.core.jobfile.Job", "cluster"),
    ("l5dask.prediction.analyses.Report.plan", "job"),
    ("l5dask.prediction.analyses.Catalog.plan", "job"),
    ("l5dask.prediction.analyses.Aggregate.plan", "job"),
}


def _public_callables() -> dict[str, object]:
    """Every public function, class and public method of the package: the names the API page lists
    (``docs/api.md``; not its "Internals", the helpers the modules' own documentation names for
    readers of the code, which hand a :class:`~l5dask.core.engine.Job` or a client on) and the
    packages' ``__all__``."""
    import importlib
    import inspect
    import re

    import l5dask.evaluation
    import l5dask.perception

    page = PACKAGE.parent / "docs" / "api.md"
    if not page.exists():  # l5dask installed from a wheel (.ci/installed): the source tree's run checks it
        pytest.skip("the API page (docs/api.md) is the source tree's: this rule runs in the suite's run from it")
    api = page.read_text()
    head, internals = api.split("## Internals", 1)
    api = head + "## " + internals.split("\n## ", 1)[1]
    names = []
    for mod, items in re.findall(
        r"currentmodule:: (\S+)\n\n\.\. autosummary::\n   :toctree: \S+\n\n((?:   \S+\n)+)", api
    ):
        names += [f"{mod}.{it}" for it in items.split()]
    for pkg in (l5dask, l5dask.evaluation, l5dask.perception):
        names += [f"{pkg.__name__}.{n}" for n in pkg.__all__ if not n.startswith("_")]
    assert len(names) > 100  # (the page's layout was read)

    def resolve(path: str) -> object:
        parts = path.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for p in parts[i:]:
                obj = getattr(obj, p)
            return obj
        raise AssertionError(path)

    out: dict[str, object] = {}
    for n in names:
        obj = resolve(n)
        if inspect.ismodule(obj) or not callable(obj):
            continue
        out[n] = obj
        if inspect.isclass(obj):
            for m, v in vars(obj).items():
                if not m.startswith("_") and callable(v) or isinstance(v, staticmethod | classmethod):
                    out[f"{n}.{m}"] = getattr(obj, m)
    return out


def test_every_public_function_takes_where_to_run_as_scheduler():
    """Where a public function runs is said one way, ``scheduler=`` (as ``dask.compute``: a
    ``distributed.Client`` or its address, ``"threads"``, ``"sync"``...): no parameter names it
    otherwise (``client``, ``job``...); a function that shows progress runs work, so takes
    ``scheduler`` too; ``scheduler`` defaults to ``None`` (the active client, else local threads)."""
    import inspect

    bad = []
    checked = 0
    for name, f in _public_callables().items():
        try:
            params = inspect.signature(f).parameters
        except (TypeError, ValueError):
            continue
        checked += 1
        bad += [f"{name} takes {p}=" for p in params if p in NOT_WHERE and (name, p) not in NAMED_SO_BUT_NOT_WHERE]
        if "progress" in params and "scheduler" not in params:
            bad.append(f"{name} shows progress but takes no scheduler=")
        if "scheduler" in params and params["scheduler"].default is not None:
            bad.append(f"{name}'s scheduler= defaults to {params['scheduler'].default!r}, not None")
    assert checked > 100
    assert bad == []


def test_the_old_where_keywords_still_work_where_they_were_taken():
    """Every public function that takes ``scheduler=`` and took ``client=`` or ``job=`` before
    (their names as of 0.1.0) keeps them for one release (``where_keywords``, which warns)."""
    took_old = {
        "l5dask.core.engine.Job",
        "l5dask.prediction.aggregation.aggregate",
        "l5dask.prediction.surgery.concat",
        "l5dask.prediction.surgery.subset",
        "l5dask.prediction.surgery.split",
        "l5dask.prediction.report.compute_report",
        "l5dask.prediction.catalog.catalog",
        "l5dask.analyze",
        "l5dask.prediction.exports.export",
        "l5dask.evaluation.csvfiles.read_gt_csv",
        "l5dask.evaluation.csvfiles.read_pred_csv",
        "l5dask.evaluation.csvfiles.write_gt_csv",
        "l5dask.evaluation.csvfiles.write_pred_csv",
        "l5dask.evaluation.csvfiles.scan",
        "l5dask.evaluation.agents.select_agents",
        "l5dask.evaluation.ground_truth.export_zarr_to_csv",
        "l5dask.evaluation.chop.create_chopped_dataset",
        "l5dask.evaluation.metrics.evaluate",
        "l5dask.perception.dataset.open_perception",
        "l5dask.perception.dataset.PerceptionDataset",
        "l5dask.perception.detection.evaluate",
    }
    found = _public_callables()
    missing = [n for n in took_old if n not in found]
    assert missing == []
    plain = [n for n in took_old if not getattr(getattr(found[n], "__init__", found[n]), "__l5_where__", False)]
    plain = [n for n in plain if not getattr(found[n], "__l5_where__", False)]
    assert plain == []
