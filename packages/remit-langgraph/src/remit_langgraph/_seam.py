"""Every LangGraph internal remit-langgraph relies on, in one place, checked at import.

The resume contract needs to know *which invocation* asks the saver for a checkpoint
and *what it delivers*. LangGraph's public saver interface does not say, so remit
takes it from a few internals of the Pregel loop. They are all named here:

==============================================  =========================================
internal                                        what remit does with it
==============================================  =========================================
``SyncPregelLoop.__enter__`` / ``__exit__``,    wrapped: one invocation is one loop, from
``AsyncPregelLoop.__aenter__`` / ``__aexit__``  its entry to its exit (CO: one claim per
                                                invocation, released on every way out)
loop attributes ``input``, ``is_nested``,       read while the loop enters: the resume
``checkpointer``, ``config``,                   value delivered, whether the loop is a
``interrupt_before``, ``interrupt_after``,      subgraph's, the static breakpoints, the
``checkpoint_metadata``                         metadata of the checkpoint it writes
loop attributes ``status``, ``tasks``;         read when the root loop exits: how the
``langgraph.errors.GraphInterrupt``             run's execution ended (parked on
                                                interrupts, a static breakpoint, done)
``Pregel.stream`` / ``astream``                 wrapped: the graph's ``name`` is known to
                                                the loop it runs (the run lifecycle)
``PregelLoop._put_checkpoint`` and the module   wrapped: the loop mints a checkpoint's id
global ``_loop.create_checkpoint`` it calls     there; remit derives it instead (RD)
``PregelLoop.put_writes``; loop attributes      wrapped: a task's writes that finish its
``durability``, ``checkpointer_put_writes``,    step are announced to the store, which
``checkpoint``, ``checkpoint_config``           commits them with the step's checkpoint
                                                (group commit)
``Pregel.bulk_update_state`` /                  wrapped: a ``put`` made for
``abulk_update_state``                          ``update_state`` (FD forks)
``Pregel.get_state`` / ``get_state_history``    wrapped, as the loop's entry: the
(and async), ``Pregel.channels``, loop          graph's channel types are allowed in the
``specs``                                       envelope before its state is read
``pregel._utils.is_xxh3_128_hexdigest``         LangGraph's rule for "this resume value is
                                                a map of interrupt ids"
``pregel._task_status.read_task_statuses``      LangGraph's rule for pending interrupts,
(langgraph >= 1.2.15; the same rule is          where the installed release has it
applied here before)
``_internal._constants`` config keys            the runtime, task id, checkpointer,
                                                scratchpad, durability, checkpoint map,
                                                strict resume (>= 1.2.15) of a task
``channels.delta.DeltaChannel`` (optional)      graphs with delta channels keep
                                                LangGraph's ids
``checkpoint.serde._msgpack`` SAFE_MSGPACK_*,   migration's allow-list of what a stock
``_internal._serde.curated_core_allowlist``,    store may name, and the names the stock
a stock serializer's allowed modules            serializer was told to allow (optional:
(all optional)                                  remit's own list otherwise)
``checkpoint.serde.types._DeltaSnapshot``       allowed in the envelope (what a delta
(optional)                                      channel stores)
a stock ``PostgresSaver._cursor()``             migration reads the stock tables with it
==============================================  =========================================

If one of them is missing, or no longer does what remit relies on, importing
remit_langgraph raises :class:`LangGraphSeamError` naming the installed langgraph,
rather than running with a contract property silently off. :func:`verify` repeats the
cheap part of that check on every checkpoint load, so a seam undone after import
(another library wrapping the same method, say) is refused too.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import contextvars
import functools
import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Protocol

from remit_core import RemitError
from remit_core.adapter import aio

SUPPORTED = "langgraph >= 1.0, < 1.3 (tested on 1.0.0, 1.2.9 and 1.2.24)"

try:
    LANGGRAPH_VERSION = metadata.version("langgraph")
except metadata.PackageNotFoundError:  # pragma: no cover - a source checkout of langgraph
    LANGGRAPH_VERSION = "unknown"


class LangGraphSeamError(RemitError, RuntimeError):
    """The installed langgraph lacks (or changed) an internal remit-langgraph relies on.

    ``seam`` names it. remit refuses to run rather than keep the resume contract with
    one of its properties silently switched off.
    """

    def __init__(self, seam: str, problem: str) -> None:
        self.seam = seam
        self.langgraph_version = LANGGRAPH_VERSION
        super().__init__(
            f"remit-langgraph cannot keep the resume contract on langgraph "
            f"{LANGGRAPH_VERSION}: {seam} {problem}. remit-langgraph supports {SUPPORTED}; "
            "install one of those releases (or a remit-langgraph that supports this one)."
        )


def _require(module: str, *names: str) -> list[Any]:
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise LangGraphSeamError(module, f"cannot be imported ({exc})") from None
    found = []
    for name in names:
        obj: Any = mod
        for part in name.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                raise LangGraphSeamError(f"{module}.{name}", "does not exist") from None
        found.append(obj)
    return found


def _calls(fn: Callable[..., Any], name: str, seam: str) -> None:
    """``fn`` refers to ``name`` (a global it calls, or an attribute it reads)."""
    code = getattr(fn, "__code__", None)
    if code is None or name not in code.co_names:
        raise LangGraphSeamError(seam, f"no longer uses {name}")


_loop_mod: Any = importlib.import_module("langgraph.pregel._loop")
(PregelLoop, SyncPregelLoop, AsyncPregelLoop) = _require(
    "langgraph.pregel._loop", "PregelLoop", "SyncPregelLoop", "AsyncPregelLoop")
(Pregel,) = _require("langgraph.pregel.main", "Pregel")
(GraphInterrupt, GraphRecursionError) = _require("langgraph.errors", "GraphInterrupt",
                                                 "GraphRecursionError")
(is_xxh3_128_hexdigest,) = _require("langgraph.pregel._utils", "is_xxh3_128_hexdigest")
(
    CONFIG_KEY_CHECKPOINTER, CONFIG_KEY_TASK_ID, CONFIG_KEY_RUNTIME, CONFIG_KEY_SCRATCHPAD,
    CONFIG_KEY_DURABILITY, CONFIG_KEY_CHECKPOINT_MAP, NULL_TASK_ID, INTERRUPT, RESUME, ERROR,
) = _require(
    "langgraph._internal._constants", "CONFIG_KEY_CHECKPOINTER", "CONFIG_KEY_TASK_ID",
    "CONFIG_KEY_RUNTIME", "CONFIG_KEY_SCRATCHPAD", "CONFIG_KEY_DURABILITY",
    "CONFIG_KEY_CHECKPOINT_MAP", "NULL_TASK_ID", "INTERRUPT", "RESUME", "ERROR",
)
_constants = importlib.import_module("langgraph._internal._constants")
CONFIG_KEY_STRICT_RESUME: str | None = getattr(_constants, "CONFIG_KEY_STRICT_RESUME", None)
ERROR_SOURCE_NODE: str = getattr(_constants, "ERROR_SOURCE_NODE", "__error_source_node__")
CONTROL_WRITES = frozenset((INTERRUPT, RESUME, ERROR, ERROR_SOURCE_NODE))

_read_task_statuses: Callable[[Iterable[tuple[str, str, Any]]], dict[str, Any]] | None
try:  # langgraph >= 1.2.15: the one place LangGraph reads task status from pending writes
    from langgraph.pregel._task_status import read_task_statuses as _read_task_statuses
except ImportError:
    _read_task_statuses = None

DeltaChannel: type[Any] | None
try:
    from langgraph.channels.delta import DeltaChannel
except ImportError:  # langgraph before delta channels
    DeltaChannel = None

for _cls, _names in ((SyncPregelLoop, ("__enter__", "__exit__")),
                     (AsyncPregelLoop, ("__aenter__", "__aexit__")),
                     (PregelLoop, ("_put_checkpoint",)),
                     (Pregel, ("bulk_update_state", "abulk_update_state", "get_state",
                               "aget_state", "get_state_history", "aget_state_history",
                               "stream", "astream"))):
    for _name in _names:
        if _name not in vars(_cls) and not getattr(getattr(_cls, _name, None), "__remit__", False):
            raise LangGraphSeamError(f"{_cls.__module__}.{_cls.__qualname__}.{_name}",
                                     "is not defined there")
if not callable(getattr(_loop_mod, "create_checkpoint", None)):
    raise LangGraphSeamError("langgraph.pregel._loop.create_checkpoint", "does not exist")
_calls(inspect.unwrap(vars(SyncPregelLoop)["__enter__"]), "get_tuple",
       "SyncPregelLoop.__enter__")
_calls(inspect.unwrap(vars(AsyncPregelLoop)["__aenter__"]), "aget_tuple",
       "AsyncPregelLoop.__aenter__")
_calls(inspect.unwrap(vars(PregelLoop)["_put_checkpoint"]), "create_checkpoint",
       "PregelLoop._put_checkpoint")


# ======================================================= the stock savers (migration only)

# What migration and ``legacy=`` read of the stock savers and their serializer, where the
# installed langgraph-checkpoint has it; each is optional, with the fallback named.
SAFE_MSGPACK_TYPES: frozenset[tuple[str, ...]] = frozenset()
SAFE_MSGPACK_METHODS: frozenset[tuple[str, ...]] = frozenset()
with contextlib.suppress(ImportError):  # langgraph-checkpoint >= 3 (else remit's own list)
    from langgraph.checkpoint.serde import _msgpack

    SAFE_MSGPACK_TYPES = frozenset(getattr(_msgpack, "SAFE_MSGPACK_TYPES", ()))
    SAFE_MSGPACK_METHODS = frozenset(getattr(_msgpack, "SAFE_MSGPACK_METHODS", ()))

_curated: Callable[[], Iterable[tuple[str, ...]]] | None
try:  # LangGraph's own curated list of message types (langgraph >= 1.2)
    from langgraph._internal._serde import curated_core_allowlist as _curated
except ImportError:
    _curated = None

DeltaSnapshot: type[Any] | None
try:  # what a DeltaChannel stores (langgraph-checkpoint >= 4)
    from langgraph.checkpoint.serde.types import _DeltaSnapshot as DeltaSnapshot
except ImportError:
    DeltaSnapshot = None


def curated_message_types() -> set[tuple[str, ...]]:
    """LangGraph's curated allow-list of langchain-core message types (empty if absent)."""
    return set(_curated()) if _curated is not None else set()


def serializer_allowlist(serde: Any) -> set[tuple[str, ...]]:
    """The exact ``(module, name)`` pairs a stock serializer (or the one it wraps, for an
    ``EncryptedSerializer``) was told to allow (its ``allowed_msgpack_modules``)."""
    found: set[tuple[str, ...]] = set()
    while serde is not None:
        listed = getattr(serde, "_allowed_msgpack_modules", None)
        if isinstance(listed, set | frozenset):
            found |= {tuple(k) for k in listed if isinstance(k, tuple)
                      and all(isinstance(p, str) for p in k)}
        serde = getattr(serde, "serde", None)
    return found


def stock_cursor(saver: Any) -> Any:
    """A stock ``PostgresSaver``'s cursor context (its lock, connection or pool)."""
    cursor = getattr(saver, "_cursor", None)
    if cursor is None:
        raise LangGraphSeamError(f"{type(saver).__qualname__}._cursor",
                                 "does not exist, so remit cannot read the stock saver's tables")
    return cursor()


# ====================================================================== reading a loop

_LOOP_ATTRIBUTES = ("input", "is_nested", "checkpointer", "config", "interrupt_before",
                    "interrupt_after")


@dataclass(frozen=True)
class LoopView:
    """What the gate reads off a loop while it enters (see :func:`view`)."""

    input: Any
    is_nested: bool
    checkpointer: Any
    config: dict[str, Any]
    breakpoints: bool  # static interrupt_before / interrupt_after declared for this run

    @property
    def configurable(self) -> dict[str, Any]:
        return dict(self.config.get("configurable") or {})


def view(loop: Any) -> LoopView:
    missing = [a for a in _LOOP_ATTRIBUTES if not hasattr(loop, a)]
    if missing:
        raise LangGraphSeamError(f"{type(loop).__qualname__}", f"has no {', '.join(missing)}")
    return LoopView(loop.input, bool(loop.is_nested), loop.checkpointer, loop.config or {},
                    bool(loop.interrupt_before) or bool(loop.interrupt_after))


def is_resume_map(resume: Any) -> bool:
    """LangGraph's rule: a dict whose every key is an interrupt id answers interrupts by id."""
    return isinstance(resume, dict) and all(
        isinstance(k, str) and is_xxh3_128_hexdigest(k) for k in resume)


@dataclass(frozen=True)
class Parked:
    """An interrupt waiting for an answer: its task, its id and how many answers the task
    had received before it (its place among the task's interrupts)."""

    task_id: str
    interrupt_id: str
    answered: int


def _interrupt_id(item: Any) -> str:
    value = getattr(item, "id", None)
    return value if isinstance(value, str) and value else repr(item)


def parked(writes: Sequence[tuple[str, str, Any]] | None) -> list[Parked]:
    """The interrupts still waiting at a checkpoint: each unfinished task's latest
    interrupts (LangGraph's rule, from LangGraph's own ``read_task_statuses`` where the
    installed release has it)."""
    writes = list(writes or ())
    answered: dict[str, int] = {}
    latest: dict[str, list[Any]] = {}
    finished: set[str] = set()
    for task_id, channel, value in writes:
        if task_id == NULL_TASK_ID:
            continue
        if channel == INTERRUPT:
            latest[task_id] = list(value) if isinstance(value, list | tuple) else [value]
        elif channel == RESUME:
            answered[task_id] = len(value) if isinstance(value, list) else 1
        elif channel not in CONTROL_WRITES:
            finished.add(task_id)
    if _read_task_statuses is not None:
        statuses = _read_task_statuses(writes)
        pending = {t: [_interrupt_id(i) for i in s.pending_interrupts]
                   for t, s in statuses.items()}
    else:
        pending = {t: [_interrupt_id(i) for i in items]
                   for t, items in latest.items() if t not in finished}
    return sorted((Parked(t, i, answered.get(t, 0)) for t, ids in pending.items() for i in ids),
                  key=lambda p: (p.interrupt_id, p.task_id))


def new_interrupt_ids(writes: Sequence[tuple[str, Any]]) -> set[str]:
    return {_interrupt_id(i) for ch, v in writes if ch == INTERRUPT
            for i in (v if isinstance(v, list | tuple) else [v])}


# ====================================================================== the hooks


class Hooks(Protocol):
    def graph_types(self, checkpointer: Any, channels: Any) -> None: ...
    def entered(self, loop: Any) -> None: ...
    def exited(self, loop: Any, *, ok: bool, error: BaseException | None) -> None: ...
    def derive_id(self, loop: Any, parent: Any, channels: Any, step: int, new: Any) -> None: ...
    def task_writes(self, loop: Any, task_id: str, writes: Sequence[tuple[str, Any]]
                    ) -> None: ...


class _NoHooks:
    def graph_types(self, checkpointer: Any, channels: Any) -> None: return None
    def entered(self, loop: Any) -> None: return None
    def exited(self, loop: Any, *, ok: bool, error: BaseException | None) -> None:
        return None
    def derive_id(self, loop: Any, parent: Any, channels: Any, step: int, new: Any) -> None:
        return None
    def task_writes(self, loop: Any, task_id: str, writes: Sequence[tuple[str, Any]]
                    ) -> None:
        return None


_hooks: Hooks = _NoHooks()

_entering: contextvars.ContextVar[Any] = contextvars.ContextVar("remit_lg_entering", default=None)
_putting: contextvars.ContextVar[Any] = contextvars.ContextVar("remit_lg_putting", default=None)
_updating: contextvars.ContextVar[bool] = contextvars.ContextVar("remit_lg_updating",
                                                                default=False)


def entering_loop() -> Any | None:
    """The Pregel loop entering in this context (it is loading its checkpoint), if any."""
    return _entering.get()


def updating_state() -> bool:
    """Whether this ``put`` serves ``update_state`` (not a loop)."""
    return _updating.get()


def _mark(fn: Any) -> Any:
    fn.__remit__ = True
    return fn


async def _exited(loop: Any, *, ok: bool, error: BaseException | None) -> None:
    """The exit hook of an async loop, on the event loop (its store I/O awaits the async
    driver), shielded: a cancel that arrives meanwhile does not cut short the release
    of the invocation's claims and the end of its run."""
    await asyncio.shield(aio.run(_hooks.exited, loop, ok=ok, error=error))


def _install_loops() -> dict[str, Any]:
    originals: dict[str, Any] = {}
    enter, exit_ = vars(SyncPregelLoop)["__enter__"], vars(SyncPregelLoop)["__exit__"]
    aenter, aexit = vars(AsyncPregelLoop)["__aenter__"], vars(AsyncPregelLoop)["__aexit__"]
    originals.update(enter=enter, exit=exit_, aenter=aenter, aexit=aexit)

    @functools.wraps(enter)
    def __enter__(self: Any) -> Any:
        _hooks.graph_types(getattr(self, "checkpointer", None), getattr(self, "specs", None))
        token = _entering.set(self)
        try:
            result = enter(self)
        except BaseException as exc:
            _entering.reset(token)
            _hooks.exited(self, ok=False, error=exc)
            raise
        _entering.reset(token)
        try:
            _hooks.entered(self)
        except BaseException as exc:
            try:
                exit_(self, type(exc), exc, exc.__traceback__)
            finally:
                _hooks.exited(self, ok=False, error=exc)
            raise
        return result

    @functools.wraps(exit_)
    def __exit__(self: Any, et: Any, ev: Any, tb: Any) -> Any:
        ok = False
        try:
            suppressed = exit_(self, et, ev, tb)
            ok = et is None or bool(suppressed)
            return suppressed
        finally:
            _hooks.exited(self, ok=ok, error=ev)

    @functools.wraps(aenter)
    async def __aenter__(self: Any) -> Any:
        _hooks.graph_types(getattr(self, "checkpointer", None), getattr(self, "specs", None))
        token = _entering.set(self)
        try:
            result = await aenter(self)
        except BaseException as exc:
            _entering.reset(token)
            await _exited(self, ok=False, error=exc)
            raise
        _entering.reset(token)
        try:
            _hooks.entered(self)
        except BaseException as exc:
            try:
                await aexit(self, type(exc), exc, exc.__traceback__)
            finally:
                await _exited(self, ok=False, error=exc)
            raise
        return result

    @functools.wraps(aexit)
    async def __aexit__(self: Any, et: Any, ev: Any, tb: Any) -> Any:
        ok = False
        try:
            suppressed = await aexit(self, et, ev, tb)
            ok = et is None or bool(suppressed)
            return suppressed
        finally:
            await _exited(self, ok=ok, error=ev)

    SyncPregelLoop.__enter__ = _mark(__enter__)
    SyncPregelLoop.__exit__ = _mark(__exit__)
    AsyncPregelLoop.__aenter__ = _mark(__aenter__)
    AsyncPregelLoop.__aexit__ = _mark(__aexit__)
    return originals


# ============================================================== the graph a loop runs, and its end

_graph_name: contextvars.ContextVar[str | None] = contextvars.ContextVar("remit_lg_graph",
                                                                       default=None)


def graph_name() -> str | None:
    """The ``name`` of the graph whose ``stream`` / ``astream`` runs in this context."""
    return _graph_name.get()


class _Named(collections.abc.Generator[Any, Any, Any]):
    """``Pregel.stream``'s generator, run with the graph's name in the context: each
    resumption of it (where the loop enters, runs and exits) sees :func:`graph_name`."""

    __slots__ = ("_gen", "_name")

    def __init__(self, gen: Any, name: str | None) -> None:
        self._gen, self._name = gen, name

    def _in(self, fn: Callable[..., Any], *args: Any) -> Any:
        token = _graph_name.set(self._name)
        try:
            return fn(*args)
        finally:
            _graph_name.reset(token)

    def send(self, value: Any) -> Any:
        return self._in(self._gen.send, value)

    def throw(self, *args: Any) -> Any:
        return self._in(self._gen.throw, *args)

    def close(self) -> None:
        self._in(self._gen.close)


class _ANamed(collections.abc.AsyncGenerator[Any, Any]):
    """``Pregel.astream``'s async generator, likewise."""

    __slots__ = ("_gen", "_name")

    def __init__(self, gen: Any, name: str | None) -> None:
        self._gen, self._name = gen, name

    async def _in(self, fn: Callable[..., Any], *args: Any) -> Any:
        token = _graph_name.set(self._name)
        try:
            return await fn(*args)
        finally:
            _graph_name.reset(token)

    async def asend(self, value: Any) -> Any:
        return await self._in(self._gen.asend, value)

    async def athrow(self, *args: Any) -> Any:
        return await self._in(self._gen.athrow, *args)

    async def aclose(self) -> None:
        await self._in(self._gen.aclose)


def _install_streams() -> None:
    stream, astream = vars(Pregel)["stream"], vars(Pregel)["astream"]

    @functools.wraps(stream)
    def _stream(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _Named(stream(self, *args, **kwargs), getattr(self, "name", None))

    @functools.wraps(astream)
    def _astream(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _ANamed(astream(self, *args, **kwargs), getattr(self, "name", None))

    Pregel.stream = _mark(_stream)
    Pregel.astream = _mark(_astream)


@dataclass(frozen=True)
class LoopEnd:
    """How a root loop's execution ended, as the run lifecycle records it."""

    error: BaseException | None  # what ended it; None: it ended normally
    parked: bool = False  # on interrupts or a static breakpoint (``waiting``)
    waiting: Any = None
    drained: bool = False  # stopped on request with tasks left: it continues later


def loop_end(loop: Any, *, ok: bool, error: BaseException | None) -> LoopEnd:
    """Read how ``loop`` ended from what its exit saw and its ``status``."""
    if not hasattr(loop, "status"):
        raise LangGraphSeamError(f"{type(loop).__qualname__}", "has no status")
    status = loop.status
    if ok and isinstance(error, GraphInterrupt):
        interrupts = list(error.args[0]) if error.args and error.args[0] else []
        if interrupts:
            return LoopEnd(None, True, {"interrupts": [
                {"id": str(getattr(i, "id", "")), "value": getattr(i, "value", None)}
                for i in interrupts]})
    if ok and status in ("interrupt_before", "interrupt_after"):
        tasks = getattr(loop, "tasks", None) or {}
        return LoopEnd(None, True, {"breakpoint": status,
                                    "nodes": sorted({t.name for t in tasks.values()})})
    if ok and isinstance(error, GraphInterrupt):  # parked on interrupts of its subgraphs
        return LoopEnd(None, True, {"interrupts": []})
    if not ok:
        return LoopEnd(error)
    if status == "draining":
        return LoopEnd(None, drained=True)
    if status == "out_of_steps":
        return LoopEnd(GraphRecursionError(
            "the run reached its recursion limit before it ended (config recursion_limit)"))
    return LoopEnd(None)


def step_writes(loop: Any) -> list[tuple[str, list[tuple[str, Any]]]]:
    """The state writes of the superstep a loop is checkpointing (``after_tick``): per
    task that wrote, (task id, its writes in order), by task id; control writes
    (interrupts, resumes, errors) left out. They are the writes LangGraph stored as
    the parent checkpoint's pending writes and then applied to its values."""
    tasks = getattr(loop, "tasks", None)
    if not isinstance(tasks, Mapping):
        raise LangGraphSeamError("PregelLoop.tasks",
                                 "is not the mapping of the superstep's tasks it was")
    out = []
    for task_id in sorted(tasks):
        written = [(ch, v) for ch, v in tasks[task_id].writes if ch not in CONTROL_WRITES]
        if written:
            out.append((str(task_id), written))
    return out


def _install_ids() -> None:
    put_checkpoint = vars(PregelLoop)["_put_checkpoint"]
    create = _loop_mod.create_checkpoint

    @functools.wraps(put_checkpoint)
    def _put_checkpoint(self: Any, metadata: Any) -> Any:
        token = _putting.set(self)
        try:
            return put_checkpoint(self, metadata)
        finally:
            _putting.reset(token)

    @functools.wraps(create)
    def create_checkpoint(checkpoint: Any, channels: Any, step: int, *args: Any,
                          **kwargs: Any) -> Any:
        new = create(checkpoint, channels, step, *args, **kwargs)
        loop = _putting.get()
        if loop is not None and kwargs.get("id") is None:
            _hooks.derive_id(loop, checkpoint, channels, step, new)
        return new

    PregelLoop._put_checkpoint = _mark(_put_checkpoint)
    _loop_mod.create_checkpoint = _mark(create_checkpoint)


def _install_writes() -> None:
    put_writes = vars(PregelLoop)["put_writes"]

    @functools.wraps(put_writes)
    def wrapped(self: Any, task_id: str, writes: Any, *args: Any, **kwargs: Any) -> Any:
        _hooks.task_writes(self, task_id, writes)  # before the loop hands them to the saver
        return put_writes(self, task_id, writes, *args, **kwargs)

    PregelLoop.put_writes = _mark(wrapped)


def finishing_writes(loop: Any, task_id: str, writes: Sequence[tuple[str, Any]]
                     ) -> tuple[str, str, str, bool] | None:
    """(thread id, namespace, checkpoint id, background) the loop is about to store
    ``writes`` against, when they are the last of their step: regular writes (no error,
    no interrupt) of a task of the running step whose every other task finished without
    an error, in a loop that stores pending writes; the step's checkpoint is what it
    stores next. ``background``: under ``durability="async"`` the loop goes on while its
    checkpoints are stored one after another (under ``"sync"`` it waits for each). None
    otherwise."""
    durability = getattr(loop, "durability", None)
    if not writes or durability not in ("sync", "async"):
        return None
    if getattr(loop, "checkpointer_put_writes", None) is None:
        return None
    if any(ch in (ERROR, INTERRUPT) for ch, _ in writes):
        return None
    tasks = getattr(loop, "tasks", None)
    if not isinstance(tasks, Mapping) or task_id not in tasks:
        return None  # the null task's writes (an input, a resume), or no step running
    for other_id, task in tasks.items():
        if other_id != task_id and (not task.writes
                                    or any(ch == ERROR for ch, _ in task.writes)):
            return None  # a sibling still runs (or failed: no checkpoint follows)
    # (the config LangGraph's put_writes hands the saver: these three, as here)
    return (str(loop.checkpoint_config["configurable"]["thread_id"]),
            str(loop.config["configurable"].get("checkpoint_ns") or ""),
            str(loop.checkpoint["id"]), durability == "async")


def _install_updates() -> None:
    bulk, abulk = vars(Pregel)["bulk_update_state"], vars(Pregel)["abulk_update_state"]

    @functools.wraps(bulk)
    def bulk_update_state(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _updating.set(True)
        try:
            return bulk(self, *args, **kwargs)
        finally:
            _updating.reset(token)

    @functools.wraps(abulk)
    async def abulk_update_state(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _updating.set(True)
        try:
            return await abulk(self, *args, **kwargs)
        finally:
            _updating.reset(token)

    Pregel.bulk_update_state = _mark(bulk_update_state)
    Pregel.abulk_update_state = _mark(abulk_update_state)


def _graph_types(graph: Any) -> None:
    """Before a graph's state is read, tell its RemitSaver the graph's channel types
    (and its subgraphs'), so that a reader in a fresh process can rebuild them."""
    _hooks.graph_types(getattr(graph, "checkpointer", None), getattr(graph, "channels", None))
    with contextlib.suppress(Exception):  # a graph whose subgraphs cannot be listed
        for _, sub in graph.get_subgraphs(recurse=True):
            _hooks.graph_types(getattr(graph, "checkpointer", None),
                               getattr(sub, "channels", None))


def _install_reads() -> None:
    get_state, aget_state = vars(Pregel)["get_state"], vars(Pregel)["aget_state"]
    history, ahistory = vars(Pregel)["get_state_history"], vars(Pregel)["aget_state_history"]

    @functools.wraps(get_state)
    def _get_state(self: Any, *args: Any, **kwargs: Any) -> Any:
        _graph_types(self)
        return get_state(self, *args, **kwargs)

    @functools.wraps(aget_state)
    async def _aget_state(self: Any, *args: Any, **kwargs: Any) -> Any:
        _graph_types(self)
        return await aget_state(self, *args, **kwargs)

    @functools.wraps(history)
    def _get_state_history(self: Any, *args: Any, **kwargs: Any) -> Any:
        _graph_types(self)
        yield from history(self, *args, **kwargs)

    @functools.wraps(ahistory)
    async def _aget_state_history(self: Any, *args: Any, **kwargs: Any) -> Any:
        _graph_types(self)
        async for snapshot in ahistory(self, *args, **kwargs):
            yield snapshot

    Pregel.get_state = _mark(_get_state)
    Pregel.aget_state = _mark(_aget_state)
    Pregel.get_state_history = _mark(_get_state_history)
    Pregel.aget_state_history = _mark(_aget_state_history)


_installed: dict[str, Any] = {}


def install(hooks: Hooks) -> None:
    """Wrap the seams (once per process) and route them to ``hooks``."""
    global _hooks
    _hooks = hooks
    if _installed:
        return
    _installed.update(_install_loops())
    _install_ids()
    _install_writes()
    _install_updates()
    _install_reads()
    _install_streams()


# the seams the contract needs, checked on every load (PregelLoop.put_writes is not among
# them: without its wrapper a step's writes are committed on their own, which costs a
# commit, not a guarantee)
_WRAPPED = ((Pregel, "stream"), (Pregel, "astream"),
            (SyncPregelLoop, "__enter__"), (SyncPregelLoop, "__exit__"),
            (AsyncPregelLoop, "__aenter__"), (AsyncPregelLoop, "__aexit__"),
            (PregelLoop, "_put_checkpoint"), (Pregel, "bulk_update_state"),
            (Pregel, "abulk_update_state"), (Pregel, "get_state"), (Pregel, "aget_state"),
            (Pregel, "get_state_history"), (Pregel, "aget_state_history"))


#: what verify() last saw pass, by identity (checked at dict speed on every load): for each
#: seam, the namespace of each class of the MRO down to the one that holds the wrapper,
#: with None for those that must not define the name and the wrapper for that one
_verified: list[tuple[Mapping[str, Any], str, Any]] = []


def verify() -> None:
    """Raise :class:`LangGraphSeamError` if a wrapped seam was replaced after import."""
    for where, name, wrapper in _verified:
        if where.get(name) is not wrapper:
            break
    else:
        if _verified:
            return
    for cls, name in _WRAPPED:
        if not getattr(getattr(cls, name, None), "__remit__", False):
            raise LangGraphSeamError(
                f"{cls.__module__}.{cls.__qualname__}.{name}",
                "was replaced after remit-langgraph wrapped it (by another library or a "
                "test), so remit would not see which invocation loads a checkpoint")
    if not getattr(getattr(_loop_mod, "create_checkpoint", None), "__remit__", False):
        raise LangGraphSeamError("langgraph.pregel._loop.create_checkpoint",
                                 "was replaced after remit-langgraph wrapped it")
    found = []
    for cls, name in _WRAPPED:
        for c in cls.__mro__:  # as getattr finds it: a class before the holder shadows it
            held = vars(c).get(name)
            found.append((vars(c), name, held))
            if held is not None:
                break
    found.append((vars(_loop_mod), "create_checkpoint", vars(_loop_mod)["create_checkpoint"]))
    _verified[:] = found
