"""remit for pydantic-graph 1.x: ``persistence=RemitStatePersistence.from_url(url, run_id=...)``.

    from remit_pydantic_graph import RemitStatePersistence

    persistence = RemitStatePersistence.from_url("sqlite:///runs.db", run_id="order-42")
    await graph.run(Start(), state=state, persistence=persistence)
    # later, in any process:
    async with graph.iter_from_persistence(persistence) as run: ...
    # runs whose process died, found without their ids and finished:
    recover(graph, "sqlite:///runs.db")

Supports pydantic-graph>=1.0,<2 (2.0 removed the persistence API); importing this
package next to another version raises ImportError. The core's entry points and
errors are re-exported, so an app imports from one place.
"""

from remit_core import (
    ConsumeConflict,
    CorruptRecord,
    EffectInDoubt,
    RemitError,
    StateValidationError,
    effect,
    open_store,
)
from remit_pydantic_graph._compat import (  # first: the version guard
    PYDANTIC_GRAPH_VERSION,
    PydanticGraphSeamError,
)
from remit_pydantic_graph.persistence import NodeStatusConflict, RemitStatePersistence
from remit_pydantic_graph.recovery import GraphTarget, RecoveryReport, arecover, recover

__version__ = "0.1.0"

__all__ = [
    "PYDANTIC_GRAPH_VERSION",
    "ConsumeConflict",
    "CorruptRecord",
    "EffectInDoubt",
    "GraphTarget",
    "NodeStatusConflict",
    "PydanticGraphSeamError",
    "RecoveryReport",
    "RemitError",
    "RemitStatePersistence",
    "StateValidationError",
    "arecover",
    "effect",
    "open_store",
    "recover",
]
