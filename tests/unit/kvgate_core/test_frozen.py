"""``fast_constructor``: the same frozen instances as the class builds, or the class itself where it can't."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass, field

import pytest

from kvgate_core.frozen import fast_constructor
from policies.api import Role, WorkerId, WorkerView


@dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int = 2
    tags: tuple[str, ...] = field(default_factory=tuple)
    label: str = field(default="p", kw_only=True)


def test_it_builds_the_class_itself_with_its_defaults() -> None:
    build = fast_constructor(Point)
    assert build is not Point
    p = build(1)
    assert type(p) is Point and isinstance(p, Point)
    assert p == Point(1) and hash(p) == hash(Point(1))
    assert build(3, 4, ("a",), label="q") == Point(3, 4, ("a",), label="q")
    assert repr(build(5, label="z")) == repr(Point(5, label="z"))
    assert pickle.loads(pickle.dumps(build(7))) == Point(7)


def test_what_it_builds_stays_frozen_and_slotted() -> None:
    p = fast_constructor(Point)(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3  # type: ignore[misc]
    assert not hasattr(p, "__dict__")
    assert dataclasses.replace(p, y=9) == Point(1, 9)


def test_it_keeps_the_signature_and_its_errors() -> None:
    build = fast_constructor(Point)
    with pytest.raises(TypeError):
        build()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        build(1, 2, (), "positional label")  # type: ignore[misc]


def test_a_routing_view_is_the_same_view() -> None:
    kwargs = {"id": WorkerId("w0"), "role": Role.DECODE, "healthy": False, "inflight_tokens": 9,
              "recent_tokens": 1.5, "prefill_tokens": 3}  # fmt: skip
    assert fast_constructor(WorkerView)(**kwargs) == WorkerView(**kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Checked:
    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("n < 0")


@dataclass(slots=True)
class Mutable:
    n: int


@dataclass(frozen=True)
class Unslotted:
    n: int


@dataclass(frozen=True, slots=True)
class Child(Point):
    z: int = 0


@pytest.mark.parametrize("cls", [Checked, Mutable, Unslotted, Child, int])
def test_a_class_the_trick_does_not_fit_comes_back_unchanged(cls: type) -> None:
    assert fast_constructor(cls) is cls


@dataclass(frozen=True, slots=True)
class Defaults:
    items: list[int] = field(default_factory=list)
    derived: int = field(default=7, init=False)
    made: tuple[int, ...] = field(default_factory=lambda: (1,), init=False)
    when: float = field(default=0.5, kw_only=True)


def test_factories_run_per_call_and_fields_outside_init_get_their_defaults() -> None:
    build = fast_constructor(Defaults)
    assert build is not Defaults
    a, b = build(), build()
    assert a == Defaults() and a.items is not b.items  # a fresh list each time, as the class gives
    assert (a.derived, a.made, a.when) == (7, (1,), 0.5)
    assert build([1], when=2.0) == Defaults([1], when=2.0)
    with pytest.raises(TypeError):
        build([1], 2.0)  # type: ignore[misc]  # keyword-only stays keyword-only


@dataclass(frozen=True, slots=True)
class Shadowing:
    _cls: int


def test_a_field_named_like_the_generated_codes_own_names_gets_the_class() -> None:
    assert fast_constructor(Shadowing) is Shadowing
