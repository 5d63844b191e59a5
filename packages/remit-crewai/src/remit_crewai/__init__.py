"""remit for CrewAI Flows: flows that resume instead of re-running.

::

    from crewai.flow.flow import Flow, listen, start
    from crewai.flow.persistence import persist
    from remit_crewai import RemitFlowPersistence, durable, effect

    store = RemitFlowPersistence.from_url("sqlite:///flows.db")

    @durable
    @persist(store)
    class OrderFlow(Flow[OrderState]): ...

    report = recover(OrderFlow)  # continue the OrderFlows whose process died
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
from remit_crewai._durable import afork, durable, fork, fork_id, new_execution, use_as_default
from remit_crewai._seam import CrewAISeamError
from remit_crewai.persistence import RemitFlowPersistence
from remit_crewai.recovery import RecoveryReport, arecover, recover

__version__ = "0.1.0"

__all__ = [
    "ConsumeConflict",
    "CorruptRecord",
    "CrewAISeamError",
    "EffectInDoubt",
    "RecoveryReport",
    "RemitError",
    "RemitFlowPersistence",
    "StateValidationError",
    "afork",
    "arecover",
    "durable",
    "effect",
    "fork",
    "fork_id",
    "new_execution",
    "open_store",
    "recover",
    "use_as_default",
]
