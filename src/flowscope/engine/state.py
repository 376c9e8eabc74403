"""``ctx.state``: the session's state as node bodies see it, and what each node run changed.

:class:`TrackedState` is the dict ``ctx.state`` returns. What a run changed is recorded
when the run ends (one ``StateUpdated``, ``attempts.py``), whichever run set the key:

* a key set or deleted through the dict (``state[k] = v``, ``del``, ``pop``, ``update``,
  ``setdefault``, ``clear``) is marked *dirty* where it happens;
* a list or dict value changed in place (``state["items"].append(x)``) is found by
  comparison. Every list or dict value the state hands out (``state[k]``, ``get``,
  ``setdefault``, iterating ``values()`` or ``items()``, ``copy()``) is *lent*: remembered
  with its JSON text, taken when it is first handed out after its last record. When a run
  ends, each lent value is encoded again; one whose text differs is marked dirty, and so
  recorded, or refused, by the same rules as a key set (its new text is the snapshot from
  then on).

A lent value is compared at every run end, not only the first: a parallel branch that read
it before a sibling ended may change it after. It is forgotten at the first run end at
which no body that was running when it was last handed out still runs (the caller says
when the oldest running body started). The cost: a run end with nothing lent and nothing
set is one attribute check (:attr:`TrackedState.pending`); otherwise one JSON encoding of
each value lent, which in a chain is each value the run itself read, and with parallel
branches also those read by the branches running beside it.

The engine reads the state with dict's own methods (``dict.get(state, k)``): it lends
nothing. A value reached other than through these accessors (``dict(state)``,
``{**state}``, a value that is also a node's output or input) is not lent.
"""

from __future__ import annotations

import math
import time
from collections.abc import ItemsView, Iterator, Mapping, ValuesView
from collections.abc import Set as AbstractSet
from typing import Any, overload

from ..errors import StateNotSerializableError
from ..jsontext import dumps_finite
from .values import json_value

__all__ = ["TrackedState"]

_CLEAN: frozenset[str] = frozenset()
_ABSENT: Any = object()
_clock = time.perf_counter  # the clock of NodeContext.started_at
_dumps = dumps_finite
_NOT_JSON = (TypeError, ValueError, OverflowError, RecursionError)


def _text(value: Any) -> str | None:
    """The value's JSON text as the store would write it, or None if it is not JSON."""
    try:
        return _dumps(value)
    except _NOT_JSON:
        return None


class _Lent:
    """A list or dict value handed out: the value, its text as recorded (None: not JSON when
    it was handed out) and when it was last handed out (:func:`time.perf_counter`)."""

    __slots__ = ("value", "text", "at")

    def __init__(self, value: Any, text: str | None, at: float) -> None:
        self.value = value
        self.text = text
        self.at = at


class _Values(ValuesView[Any]):
    """``state.values()``: each value read through the state, so lists and dicts are lent."""

    __slots__ = ("_state",)

    def __init__(self, state: TrackedState) -> None:
        super().__init__(state)
        self._state = state

    def __reversed__(self) -> Iterator[Any]:
        m = self._state
        return (m[k] for k in reversed(m))

    def __repr__(self) -> str:
        return f"dict_values({list(self)!r})"


class _Items(ItemsView[str, Any]):
    """``state.items()``: each value read through the state, so lists and dicts are lent."""

    __slots__ = ("_state",)

    def __init__(self, state: TrackedState) -> None:
        super().__init__(state)
        self._state = state

    def __reversed__(self) -> Iterator[tuple[str, Any]]:
        m = self._state
        return ((k, m[k]) for k in reversed(m))

    def __repr__(self) -> str:
        return f"dict_items({list(self)!r})"


class TrackedState(dict[str, Any]):
    """``ctx.state``: a dict that knows what changed in it since its last record: keys set
    or deleted, and list and dict values it handed out that were changed in place."""

    def __init__(self, initial: Mapping[str, Any]) -> None:
        super().__init__(initial)
        #: The keys changed since the last event (none: a shared empty frozenset, so a run
        #: that changes no state makes no set).
        self.dirty: AbstractSet[str] = _CLEAN
        #: The list and dict values handed out and not forgotten, by key.
        self.lent: dict[str, _Lent] = {}
        #: Is there anything to look at when a run ends (a key dirty, a value lent)? The one
        #: check a run end makes when nothing of the state was set or read.
        self.pending = False
        self._compared = False  # check_changes compared the lent values, for this run's take_changes

    def _mark(self, key: str) -> None:
        dirty = self.dirty
        if type(dirty) is not set:
            dirty = self.dirty = set()
            self.pending = True
        dirty.add(key)

    def _lend(self, key: str, value: Any) -> None:
        e = self.lent.get(key)
        if e is not None and e.value is value:
            e.at = _clock()
        else:
            self.lent[key] = _Lent(value, _text(value), _clock())
            self.pending = True

    # -- reads that hand a value out -----------------------------------------------------

    def __getitem__(self, key: str) -> Any:
        v = dict.__getitem__(self, key)
        if type(v) is list or type(v) is dict:
            self._lend(key, v)
        return v

    def get(self, key: str, default: Any = None, /) -> Any:
        v = dict.get(self, key, _ABSENT)
        if v is _ABSENT:
            return default
        if type(v) is list or type(v) is dict:
            self._lend(key, v)
        return v

    def values(self) -> ValuesView[Any]:  # type: ignore[override]  # not dict's C view: it lends
        return _Values(self)

    def items(self) -> ItemsView[str, Any]:  # type: ignore[override]  # not dict's C view: it lends
        return _Items(self)

    def copy(self) -> dict[str, Any]:
        return {k: self[k] for k in dict.keys(self)}

    # -- changes through the dict --------------------------------------------------------

    def __setitem__(self, key: str, value: Any) -> None:
        # Refused where it is set, so the node that set it fails, naming the key; the
        # value kept is the one the store will hold (R12, docs/design.md).
        if type(key) is not str:
            raise StateNotSerializableError(
                f"ctx.state key {key!r} is a {type(key).__name__}: state keys are str (JSON object keys)"
            )
        super().__setitem__(key, json_value(value, f"ctx.state[{key!r}]", StateNotSerializableError))
        self._mark(key)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._mark(key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def __ior__(self, other: Any) -> TrackedState:  # type: ignore[override,misc]  # dict's own |= skips __setitem__
        self.update(other)
        return self

    def popitem(self) -> tuple[str, Any]:
        key, value = super().popitem()
        self._mark(key)
        return key, value

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    @overload
    def pop(self, key: str, /) -> Any: ...

    @overload
    def pop(self, key: str, default: Any, /) -> Any: ...

    def pop(self, key: str, /, *default: Any) -> Any:
        if key in self:
            self._mark(key)
        return super().pop(key, *default)

    def clear(self) -> None:
        for key in self.keys():
            self._mark(key)
        super().clear()

    # -- when a run ends -----------------------------------------------------------------

    def _compare(self) -> None:
        """Mark dirty each lent value still in the state whose text is not its snapshot's,
        and take its new text as the snapshot (the text it will be recorded with)."""
        for k, e in list(self.lent.items()):  # a copy: a sync body's thread may lend meanwhile
            if dict.get(self, k, _ABSENT) is not e.value:
                continue  # set or deleted through the dict since: dirty already
            text = _text(e.value)
            if text is None or text != e.text:
                e.text = text
                self._mark(k)

    def check_changes(self) -> None:
        """Raise ``StateNotSerializableError`` naming the first changed key whose value JSON
        cannot hold any more (a list mutated after it was set, by this run or an earlier
        one), else keep the changed values as the store will (the same rule as when they
        were set). Called as a run succeeds, right before its :meth:`take_changes`."""
        if self.lent:
            self._compare()
            self._compared = True  # no await before take_changes: it need not compare again
        try:
            for k in self.dirty:
                if k in self:
                    v = dict.__getitem__(self, k)
                    if type(v) is dict or type(v) is list:
                        dict.__setitem__(
                            self, k, json_value(v, f"ctx.state[{k!r}]", StateNotSerializableError)
                        )
        except BaseException:
            self._compared = False  # the run fails, and its end comes after an await
            raise

    def take_changes(self, oldest: float = math.inf) -> tuple[dict[str, Any], list[str], list[str]]:
        """The changed keys the store can keep, the keys it cannot (dropped), and the keys
        deleted (not set to None: a value of None is a value).

        ``oldest``: when the earliest body still running started (``perf_counter``); a
        value last handed out before it is forgotten (no body running can hold it)."""
        lent = self.lent
        if lent and not self._compared:
            self._compare()
        self._compared = False
        changes: dict[str, Any] = {}
        bad: list[str] = []
        deleted: list[str] = []
        for k in self.dirty:
            v = dict.get(self, k, _ABSENT)
            if v is _ABSENT:
                deleted.append(k)
                continue
            try:
                changes[k] = json_value(v, k, StateNotSerializableError)
            except StateNotSerializableError:
                bad.append(k)
                dict.pop(self, k, None)  # the live state keeps what the log will hold
        self.dirty = _CLEAN
        if lent:
            for k, e in list(lent.items()):
                if e.at >= oldest and dict.get(self, k, _ABSENT) is e.value:
                    continue  # a body running may still change it
                if lent.get(k) is e:  # not lent again meanwhile (a thread)
                    del lent[k]
        self.pending = bool(lent)
        return changes, bad, sorted(deleted)
