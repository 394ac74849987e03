"""Spark 4's ``transformWithState`` on the runtime's stores: a user's ``StatefulProcessor``,
unchanged, with value, list and map state, TTL, timers and initial state."""

from state_runtime.runtime.tws.operator import Handle, transform_with_state
from state_runtime.runtime.tws.variables import TIMERS_STORE

__all__ = ["TIMERS_STORE", "Handle", "transform_with_state"]
