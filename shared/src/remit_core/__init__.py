"""remit-core: the store that keeps the resume contract.

The public surface::

    from remit_core import open_store, effect
    from remit_core import (RemitError, ConsumeConflict, StateValidationError,
                            EffectInDoubt, CorruptRecord)
"""

from remit_core.effects import effect, effect_scope
from remit_core.errors import (
    ConsumeConflict,
    CorruptRecord,
    EffectInDoubt,
    RemitError,
    SerializationError,
    StateValidationError,
)
from remit_core.ids import derive_id
from remit_core.store import Store, open_store
from remit_core.validation import StateSchema

__version__ = "0.1.0"

__all__ = [
    "ConsumeConflict",
    "CorruptRecord",
    "EffectInDoubt",
    "RemitError",
    "SerializationError",
    "StateSchema",
    "StateValidationError",
    "Store",
    "derive_id",
    "effect",
    "effect_scope",
    "open_store",
]
