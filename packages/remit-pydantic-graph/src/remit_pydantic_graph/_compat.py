"""What remit-pydantic-graph relies on in pydantic-graph, checked once at import time.

* The supported range. pydantic-graph 2.0 removed the persistence API
  (``BaseStatePersistence``, ``Graph.iter_from_persistence``, ``persistence=``) that
  this adapter plugs into, so remit-pydantic-graph supports ``pydantic-graph>=1.0,<2``
  only. An import next to any other version raises :class:`ImportError` saying so.
* The execution seam (the table below, :func:`install`): where one execution of a run
  starts and ends, for the run lifecycle. Something missing there raises
  :class:`PydanticGraphSeamError` naming the installed version.

This is the only module that wraps pydantic-graph or uses its private names.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
from collections.abc import Callable
from typing import Any, Protocol

from remit_core import RemitError

SUPPORTED = ">=1.0,<2"

_HOW = (
    "remit-pydantic-graph supports pydantic-graph{range} only: pydantic-graph 2.0 removed the "
    "persistence API (BaseStatePersistence, Graph.iter_from_persistence, persistence=) that "
    "remit plugs into. {found} Pin it with: pip install 'pydantic-graph>=1.0,<2'."
)


def _refuse(found: str) -> ImportError:
    return ImportError(_HOW.format(range=SUPPORTED, found=found))


def check_pydantic_graph() -> str:
    """Return the installed pydantic-graph version, or raise ImportError explaining the range."""
    try:
        version = importlib.metadata.version("pydantic-graph")
    except importlib.metadata.PackageNotFoundError:
        raise _refuse("pydantic-graph is not installed.") from None
    head = version.split(".", 1)[0]
    if not head.isdigit() or not 1 <= int(head) < 2:
        raise _refuse(f"Found pydantic-graph {version}.")
    try:
        import pydantic_graph.persistence  # noqa: F401
    except ImportError as exc:  # a 1.x-numbered build without the persistence module
        raise _refuse(f"Found pydantic-graph {version} without pydantic_graph.persistence.") from exc
    return version


PYDANTIC_GRAPH_VERSION = check_pydantic_graph()


# ======================================================================= the execution seam
#
# pydantic-graph tells a persistence where a node runs (record_run) and what it returns
# (snapshot_node / snapshot_end), but not where a run's execution starts and ends: a run
# parked by leaving ``async with graph.iter(...)`` before its End (the documented way to
# stop before a node, and the human-in-the-loop pattern) makes no persistence call at
# all. The run lifecycle needs that end, so remit takes it from these, checked here:
#
# ===================================  ==================================================
# pydantic-graph                       what remit does with it
# ===================================  ==================================================
# ``Graph.iter``,                      wrapped: one ``async with`` block over a remit
# ``Graph.iter_from_persistence``      persistence is one execution of its run, from the
# (async context managers with the     block's entry to its exit (a block over any other
# parameters ``persistence`` and       persistence gets pydantic-graph's own object,
# ``infer_name``)                      untouched)
# ``Graph.run`` calls ``self.iter``    so ``graph.run(...)`` is such a block too
# (read in its source)
# ``Graph._infer_name(frame)``         called as pydantic-graph calls it, with the
#                                      caller's frame: the wrapper adds a frame, which
#                                      would otherwise hide the variable pydantic-graph
#                                      names an unnamed graph after
# ===================================  ==================================================
#
# If one is missing, importing remit_pydantic_graph raises PydanticGraphSeamError naming
# the installed pydantic-graph, rather than running with the lifecycle silently off;
# ``check_installed`` repeats the cheap part of that check when a node runs, so that the
# wrapper undone after import is refused too.

_MARK = "__remit_pydantic_graph_execution__"
_WRAPPED = ("iter", "iter_from_persistence")


class PydanticGraphSeamError(RemitError, RuntimeError):
    """The installed pydantic-graph lacks (or changed) what remit-pydantic-graph uses to see
    where a run's execution starts and ends (the run lifecycle, :func:`recover`)."""

    def __init__(self, what: str, why: str, advice: str | None = None) -> None:
        super().__init__(
            f"remit-pydantic-graph relies on pydantic-graph's {what}, which {why} "
            f"(installed: pydantic-graph {PYDANTIC_GRAPH_VERSION}). Without it a run would "
            "not keep its lifecycle (running, parked, done, failed), and recover() could "
            "not find it. " + (advice or (
                f"Install a pydantic-graph{SUPPORTED} that remit-pydantic-graph was tested "
                "with (1.0.0 to 1.107.10), or report the change.")))
        self.what = what


class Executions(Protocol):
    """What the wrapped blocks call: the persistence's side of one execution."""

    def ours(self, persistence: Any) -> bool: ...

    def entered(self, persistence: Any, graph: Any) -> None: ...

    async def exited(self, persistence: Any, error: BaseException | None) -> None: ...


class _Block:
    """One ``async with graph.iter(...)`` / ``iter_from_persistence(...)`` block over a
    remit persistence: pydantic-graph's own context manager, entered and exited inside."""

    __slots__ = ("_bound", "_cm", "_graph", "_hooks", "_original", "_persistence")

    def __init__(self, original: Callable[..., Any], graph: Any, persistence: Any,
                 bound: inspect.BoundArguments, hooks: Executions) -> None:
        self._original, self._graph, self._persistence = original, graph, persistence
        self._bound, self._hooks = bound, hooks
        self._cm: Any = None

    async def __aenter__(self) -> Any:
        if self._cm is not None:
            raise RuntimeError("a graph.iter(...) block is entered once")
        args = self._bound.arguments
        if args.get("infer_name", True) and self._graph.name is None:
            # as pydantic-graph does, from the frame of the caller's ``async with``
            self._graph._infer_name(inspect.currentframe())
        args["infer_name"] = False
        self._cm = self._original(*self._bound.args, **self._bound.kwargs)
        self._hooks.entered(self._persistence, self._graph)
        try:
            return await self._cm.__aenter__()
        except BaseException as exc:
            await self._hooks.exited(self._persistence, exc)
            raise

    async def __aexit__(self, kind: Any, error: BaseException | None, tb: Any) -> bool:
        try:
            suppressed = bool(await self._cm.__aexit__(kind, error, tb))
        except BaseException as exc:
            await self._hooks.exited(self._persistence, exc)
            raise
        await self._hooks.exited(self._persistence, None if suppressed else error)
        return suppressed


def _parameters(fn: Callable[..., Any], name: str) -> inspect.Signature:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise PydanticGraphSeamError(f"Graph.{name}", "has no readable signature") from None
    for param in ("persistence", "infer_name"):
        if param not in sig.parameters:
            raise PydanticGraphSeamError(f"Graph.{name}", f"takes no {param!r} parameter")
    return sig


def _wrap(original: Callable[..., Any], name: str, hooks: Executions) -> Callable[..., Any]:
    sig = _parameters(original, name)

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(self, *args, **kwargs)
        persistence = bound.arguments.get("persistence")
        if not hooks.ours(persistence):
            return original(self, *args, **kwargs)  # pydantic-graph's own, untouched
        return _Block(original, self, persistence, bound, hooks)

    setattr(method, _MARK, True)
    return method


def _graph_class() -> Any:
    from pydantic_graph.graph import Graph

    return Graph


def install(hooks: Executions) -> None:
    """Wrap ``Graph.iter`` and ``Graph.iter_from_persistence`` (once per process) after
    checking everything the wrappers rely on; raise PydanticGraphSeamError otherwise."""
    graph = _graph_class()
    if not callable(getattr(graph, "_infer_name", None)):
        raise PydanticGraphSeamError("Graph._infer_name", "does not exist")
    run = vars(graph).get("run")
    try:
        calls_iter = run is not None and "self.iter(" in inspect.getsource(run)
    except (OSError, TypeError):
        raise PydanticGraphSeamError("Graph.run", "has no readable source") from None
    if not calls_iter:
        raise PydanticGraphSeamError("Graph.run", "no longer runs through self.iter(...)")
    for name in _WRAPPED:
        fn = vars(graph).get(name)
        if not callable(fn):
            raise PydanticGraphSeamError(f"Graph.{name}", "does not exist")
        if _marked(fn):
            continue
        setattr(graph, name, _wrap(fn, name, hooks))


def _marked(fn: Any) -> bool:
    seen = 0
    while fn is not None and seen < 16:  # ours, or another library's wrapper around ours
        if getattr(fn, _MARK, False):
            return True
        fn, seen = getattr(fn, "__wrapped__", None), seen + 1
    return False


def check_installed() -> None:
    """Refuse to run a node when the wrappers were undone after import."""
    graph = _graph_class()
    for name in _WRAPPED:
        if not _marked(vars(graph).get(name)):
            raise PydanticGraphSeamError(
                f"Graph.{name}", "was replaced after remit_pydantic_graph was imported, "
                "and remit's wrapper is gone", "Whatever replaced it (another library, a "
                "test) should wrap the method it finds (functools.wraps), so that remit's "
                "stays inside.")
