"""remit for LangGraph: ``checkpointer=RemitSaver.from_conn_string(url)`` keeps the resume contract.

    from remit_langgraph import RemitSaver

    with RemitSaver.from_conn_string("sqlite:///app.db") as saver:
        graph = builder.compile(checkpointer=saver)

The core's entry points and errors are re-exported, so an app imports from one place.
"""

from remit_core import (
    ConsumeConflict,
    CorruptRecord,
    EffectInDoubt,
    RemitError,
    SerializationError,
    StateValidationError,
    effect,
    open_store,
)
from remit_core.adapter import MigrationError, UnregisteredType
from remit_langgraph._seam import LangGraphSeamError
from remit_langgraph.recovery import RecoveryReport, arecover, recover
from remit_langgraph.saver import RemitSaver

__version__ = "0.1.0"

__all__ = [
    "ConsumeConflict",
    "CorruptRecord",
    "EffectInDoubt",
    "LangGraphSeamError",
    "MigrationError",
    "RecoveryReport",
    "RemitError",
    "RemitSaver",
    "SerializationError",
    "StateValidationError",
    "UnregisteredType",
    "arecover",
    "effect",
    "open_store",
    "recover",
]
