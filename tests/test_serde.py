"""Tests for tether.serde: round trips, hint-driven rebuilding, limits and safe error rebuilding."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from enum import Enum, StrEnum
from typing import Any, Literal, NewType, Protocol
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from tether.errors import PayloadTooLarge, SerializationError, StepFailed
from tether.serde import (
    DEFAULT_MAX_PAYLOAD,
    Serde,
    canonical,
    encode_error,
    rebuild_error,
)

SERDE = Serde()
FAST = settings(max_examples=60, deadline=None, database=None)

# --- strategies -----------------------------------------------------------------------------------

finite_floats = st.floats(allow_nan=False, allow_infinity=False)
json_scalars = st.none() | st.booleans() | st.integers() | finite_floats | st.text(max_size=10)
# Keys starting with "$" often, so that one-key dicts exercise the {"$dict": ...} escape.
dict_keys = st.text(max_size=6) | st.text(max_size=5).map(lambda s: "$" + s)
json_values = st.recursive(
    json_scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(dict_keys, kids, max_size=4),
    max_leaves=15,
)
offsets = st.integers(-(23 * 60 + 59), 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
zones = st.none() | offsets
decimals = st.decimals(allow_nan=False, allow_infinity=False)
hashable_scalars = (
    st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.uuids() | decimals
    | st.binary(max_size=5) | st.dates() | st.timedeltas()
)  # fmt: skip
special_scalars = (
    st.binary(max_size=10) | st.binary(max_size=10).map(bytearray)
    | st.datetimes(timezones=zones) | st.dates() | st.times(timezones=zones) | st.timedeltas()
    | st.uuids() | decimals | st.sets(hashable_scalars, max_size=4)
    | st.frozensets(hashable_scalars, max_size=4)
)  # fmt: skip
mixed_values = st.recursive(
    json_scalars | special_scalars,
    lambda kids: (
        st.lists(kids, max_size=3)
        | st.lists(kids, max_size=3).map(tuple)
        | st.dictionaries(dict_keys, kids, max_size=3)
    ),
    max_leaves=12,
)


# --- types used through hints ---------------------------------------------------------------------


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


class Level(Enum):
    LOW = 1
    HIGH = 2


@dataclass(frozen=True)
class Address:
    street: str
    moved_in: datetime | None = None


@dataclass
class Person:
    name: str
    id: UUID
    born: date
    tags: list[str]
    scores: dict[str, float]
    address: Address
    previous: tuple[Address, ...]
    pair: tuple[int, str]
    color: Color
    level: Level
    balance: Decimal
    nickname: str | None = None
    labels: frozenset[str] = frozenset()


@dataclass
class Node:
    value: int
    children: list[Node] = field(default_factory=list)


@dataclass
class WithDerived:
    base: int
    double: int = field(init=False)

    def __post_init__(self) -> None:
        self.double = self.base * 2


class Order(BaseModel):
    id: UUID
    placed: datetime
    items: list[str]
    total: Decimal
    note: str | None = None


@dataclass
class Checkout:
    order: Order
    at: datetime


UserId = NewType("UserId", int)

addresses = st.builds(Address, st.text(max_size=10), st.none() | st.datetimes(timezones=zones))
people = st.builds(
    Person,
    name=st.text(max_size=10),
    id=st.uuids(),
    born=st.dates(),
    tags=st.lists(st.text(max_size=5), max_size=3),
    scores=st.dictionaries(st.text(max_size=5), finite_floats, max_size=3),
    address=addresses,
    previous=st.lists(addresses, max_size=2).map(tuple),
    pair=st.tuples(st.integers(), st.text(max_size=5)),
    color=st.sampled_from(Color),
    level=st.sampled_from(Level),
    balance=decimals,
    nickname=st.none() | st.text(max_size=5),
    labels=st.frozensets(st.text(max_size=3), max_size=3),
)
orders = st.builds(
    Order,
    id=st.uuids(),
    placed=st.datetimes(min_value=datetime(1900, 1, 1), timezones=zones),
    items=st.lists(st.text(max_size=5), max_size=3),
    total=decimals,
    note=st.none() | st.text(max_size=5),
)


# --- round-trip properties ------------------------------------------------------------------------


@FAST
@given(json_values)
def test_plain_json_values_round_trip_exactly_with_hint_any(value: object) -> None:
    text = SERDE.dumps(value)
    loaded = SERDE.loads(text)
    assert loaded == value
    assert SERDE.dumps(loaded) == text  # also catches 1 vs 1.0 vs true, and -0.0


@FAST
@given(json_values)
def test_plain_json_without_dollar_keys_is_stored_as_plain_json(value: object) -> None:
    text = SERDE.dumps(value)
    if '"$' not in text:
        assert json.loads(text) == value


@FAST
@given(mixed_values)
def test_values_mixing_special_types_round_trip(value: object) -> None:
    text = SERDE.dumps(value)
    loaded = SERDE.loads(text)
    assert loaded == value
    assert SERDE.dumps(loaded) == text  # tz offsets, tuple-ness and set order are preserved


@FAST
@given(people)
def test_nested_dataclasses_round_trip_through_their_type_hint(person: Person) -> None:
    loaded = SERDE.loads(SERDE.dumps(person), Person)
    assert loaded == person
    assert type(loaded.address) is Address
    assert type(loaded.color) is Color
    assert type(loaded.previous) is tuple


@FAST
@given(orders)
def test_pydantic_model_round_trips_through_its_type_hint(order: Order) -> None:
    assert SERDE.loads(SERDE.dumps(order), Order) == order


@FAST
@given(orders, st.datetimes(timezones=offsets))
def test_dataclass_holding_a_pydantic_model_round_trips(order: Order, at: datetime) -> None:
    value = Checkout(order, at)
    assert SERDE.loads(SERDE.dumps(value), Checkout) == value


def _reordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reordered(v) for k, v in reversed(list(value.items()))}
    if isinstance(value, list | tuple):
        return type(value)(map(_reordered, value))
    return value


@FAST
@given(st.dictionaries(st.text(max_size=5), mixed_values, max_size=5))
def test_canonical_is_equal_for_dicts_built_in_different_key_order(value: dict[str, Any]) -> None:
    reordered = _reordered(value)
    assert reordered == value
    assert canonical(reordered) == canonical(value)


# --- encoding examples ----------------------------------------------------------------------------


def test_canonical_sorts_keys_and_has_no_whitespace() -> None:
    assert canonical({"b": [1, {"d": 1, "c": "é"}], "a": None}) == (
        '{"a":null,"b":[1,{"c":"é","d":1}]}'
    )


def test_sets_are_stored_in_canonical_order_whatever_their_iteration_order() -> None:
    assert SERDE.dumps({"b", "a", 3}) == '{"$set":["a","b",3]}'  # '"' sorts before '3'
    assert canonical(frozenset({2, 1})) == canonical({1, 2})


def test_timedelta_is_stored_exactly_as_days_seconds_and_microseconds() -> None:
    value = timedelta(days=-3, seconds=5, microseconds=7)
    assert SERDE.dumps(value) == '{"$timedelta":[-3,5,7]}'
    assert SERDE.loads(SERDE.dumps(value)) == value


def test_a_one_key_dollar_dict_survives_a_round_trip_without_being_decoded() -> None:
    value = {"$bytes": "not base64!", "nested": [{"$tuple": 1}]}
    assert SERDE.loads(SERDE.dumps(value)) == value
    assert SERDE.loads(SERDE.dumps({"$bytes": "x"})) == {"$bytes": "x"}


def test_enum_values_and_init_false_fields_are_stored_by_value() -> None:
    assert SERDE.dumps([Color.RED, Level.HIGH]) == '["red",2]'
    text = SERDE.dumps(WithDerived(4))
    assert json.loads(text) == {"base": 4, "double": 8}
    assert SERDE.loads(text, WithDerived) == WithDerived(4)


def test_unsupported_type_gives_serialization_error_naming_the_type_and_path() -> None:
    class Opaque:
        pass

    with pytest.raises(
        SerializationError, match=r"result of step 'x' at \$\.a\[1\].*Opaque.*dataclass"
    ):
        SERDE.dumps({"a": [1, Opaque()]}, what="result of step 'x'")


class Celsius(float):
    pass


@dataclass
class Reading:
    value: float


@pytest.mark.parametrize("number", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize(
    ("place", "path"),
    [
        (lambda n: n, ""),
        (lambda n: {"x": [n]}, r" at \$\.x\[0\]"),
        (lambda n: (1, n), r" at \$\[1\]"),
        (lambda n: {n}, ""),
        (lambda n: [Reading(n)], r" at \$\[0\]\.value"),
        (lambda n: {"t": Celsius(n)}, r" at \$\.t"),
    ],
    ids=["alone", "in-a-list", "in-a-tuple", "in-a-set", "in-a-dataclass", "a-float-subclass"],
)
def test_nan_and_infinity_are_refused_wherever_they_sit(
    number: float, place: Any, path: str
) -> None:
    # The stored text's encoder would write them as null: the walk before it must refuse them.
    with pytest.raises(SerializationError, match=rf"cannot store value{path}: .*store None"):
        SERDE.dumps(place(number))


def test_the_stored_text_of_every_character_is_the_standard_librarys() -> None:
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    text = "".join(chars)
    assert SERDE.dumps(text) == json.dumps(text, ensure_ascii=False)
    some = {"k": chars[:600], "".join(chars[:40]): "v"}
    assert SERDE.dumps(some) == json.dumps(some, ensure_ascii=False, separators=(",", ":"))


no_dollar_keys = st.text(max_size=6).filter(lambda k: not k.startswith("$"))
json_values_without_floats = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(no_dollar_keys, kids, max_size=4),
    max_leaves=15,
)


@FAST
@given(json_values_without_floats)
def test_stored_text_without_floats_is_the_standard_librarys(value: object) -> None:
    # Stored text must read the same whichever encoder wrote it (a float's exponent aside).
    standard = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert SERDE.dumps(value) == standard


@FAST
@given(finite_floats)
def test_a_stored_float_reads_back_as_the_same_float(number: float) -> None:
    assert json.loads(SERDE.dumps([number])) == [number]
    assert float(SERDE.dumps(Celsius(number))) == number


class FirstValues(dict[str, Any]):
    """A dict subclass that shows other items than it holds (as werkzeug's MultiDict does)."""

    def items(self) -> Any:  # type: ignore[override]
        return [(key, values[0]) for key, values in super().items()]


class Doubled(list[Any]):
    """A list subclass whose iteration is not its storage."""

    def __iter__(self) -> Any:
        return (item * 2 for item in super().__iter__())


class Loud(float):
    def __sub__(self, other: object) -> float:
        raise AssertionError("the walk ran the subclass's own arithmetic")


def test_a_dict_or_list_subclass_is_stored_as_the_items_it_shows() -> None:
    # What was walked is what is written: never the subclass's storage, which orjson reads.
    shown = FirstValues(a=["1", "2"], b=[3])
    assert SERDE.dumps(shown) == json.dumps({"a": "1", "b": 3}, separators=(",", ":"))
    assert SERDE.dumps({"k": Doubled([1, 2])}) == '{"k":[2,4]}'
    assert SERDE.dumps(Loud(1.5)) == "1.5"


class FirstOnly(list[Any]):
    """A list subclass whose iteration shows its first item only."""

    def __iter__(self) -> Any:
        return iter(list.__getitem__(self, slice(0, 1)))


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (FirstValues(x=[0.5, float("nan")]), {"x": 0.5}),
        (FirstValues(x=[1, Reading(float("inf"))]), {"x": 1}),
        (FirstValues(x=["a", datetime(2026, 1, 1)]), {"x": "a"}),
        ({"k": FirstOnly([1, float("nan"), Reading(2.0)])}, {"k": [1]}),
    ],
    ids=["nan-in-storage", "dataclass-in-storage", "datetime-in-storage", "list-storage"],
)
def test_what_a_subclass_holds_but_does_not_show_is_never_written(
    value: object, shown: object
) -> None:
    # Storage the walk never saw would reach the encoder unchecked: NaN as null, a dataclass or
    # a datetime untagged. Only what the subclass shows is written.
    assert SERDE.dumps(value) == json.dumps(shown, separators=(",", ":"))


def test_nan_shown_by_a_subclass_is_refused() -> None:
    with pytest.raises(SerializationError, match=r"at \$\.v\.x: nan is not a number"):
        SERDE.dumps({"v": FirstValues(x=[float("nan"), 0.0])})


def test_a_dataclass_shown_only_by_items_is_stored_by_its_fields() -> None:
    stored = SERDE.dumps(FirstValues(r=[Reading(2.5)]))
    assert json.loads(stored) == {"r": {"value": 2.5}}


def test_ints_over_64_bits_and_deep_nesting_are_stored_too() -> None:
    # Past what orjson writes: the standard library writes them.
    big = {"n": 2**64, "m": [-(2**200), 1.5]}
    assert SERDE.loads(SERDE.dumps(big)) == big
    deep: list[object] = []
    for _ in range(300):
        deep = [deep]
    assert SERDE.loads(SERDE.dumps(deep)) == deep


def test_non_str_dict_key_is_refused() -> None:
    with pytest.raises(SerializationError, match=r"keys must be str.*int 1"):
        SERDE.dumps({"ok": {1: "one"}})


def test_a_cyclic_value_is_refused() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    with pytest.raises(SerializationError, match="cyclic"):
        SERDE.dumps(cycle)


@pytest.mark.parametrize("limit", [DEFAULT_MAX_PAYLOAD, 40])  # without and with a size encode
def test_lone_surrogates_are_refused_because_no_database_can_store_them(limit: int) -> None:
    with pytest.raises(SerializationError, match="surrogate"):
        Serde(max_payload=limit).dumps("bad \ud800 text é")


def test_sets_of_tuples_of_frozensets_round_trip() -> None:
    value = {(1, frozenset({2})), frozenset({frozenset({3})})}
    assert SERDE.loads(SERDE.dumps(value)) == value


@pytest.mark.parametrize(
    ("unit", "unit_bytes"), [("a", 1), ("é", 2), ("€", 3), ("😀", 4)]
)  # fmt: skip
def test_payload_at_the_limit_passes_and_one_byte_over_is_too_large(
    unit: str, unit_bytes: int
) -> None:
    serde = Serde(max_payload=2 + 10 * unit_bytes)  # the JSON string adds two quote bytes
    assert serde.dumps(unit * 10) == f'"{unit * 10}"'
    with pytest.raises(PayloadTooLarge, match=rf"{3 + 10 * unit_bytes} bytes.*limit.*reference"):
        serde.dumps(unit * 10 + "a")


def test_a_payload_far_over_the_limit_is_refused_without_encoding_it() -> None:
    with pytest.raises(PayloadTooLarge, match=r"at least 1002 bytes.*limit of 100 bytes"):
        Serde(max_payload=100).dumps("é" * 1000)
    assert Serde().max_payload == DEFAULT_MAX_PAYLOAD


# --- loading by hint ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "hint", "expected"),
    [
        ([1, 2], list[int], [1, 2]),
        ((1, 2), list[int], [1, 2]),
        ([1, 2], tuple[int, ...], (1, 2)),
        ([1, "a"], tuple[int, str], (1, "a")),
        ([1, 1], set[int], {1}),
        ([1], frozenset[int], frozenset({1})),
        ((1, 2), Sequence[int], (1, 2)),
        ({"a": "red"}, Mapping[str, Color], {"a": Color.RED}),
        (None, int | None, None),
        (3, int | None, 3),
        ("x", int | str, "x"),
        (1, float, 1.0),
        (True, bool | int, True),
        ("red", Literal["red", "blue"], "red"),
        (2, Level, Level.HIGH),
        (7, UserId, 7),
        ("2024-01-02T03:04:05+00:00", datetime, datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2024-01-02", date, date(2024, 1, 2)),
        ("12:30:00", time, time(12, 30)),
        ("00000000-0000-0000-0000-000000000001", UUID, UUID(int=1)),
        ("1.50", Decimal, Decimal("1.50")),
        (b"x", bytes, b"x"),
        ({"value": 1, "children": [{"value": 2}]}, Node, Node(1, [Node(2)])),
        ({"street": "Main"}, Address, Address("Main")),
    ],
)
def test_hints_rebuild_containers_unions_literals_enums_and_scalars(
    value: object, hint: object, expected: object
) -> None:
    loaded = SERDE.convert(value, hint)
    assert loaded == expected
    assert type(loaded) is type(expected)


@pytest.mark.parametrize(
    ("text", "hint", "message"),
    [
        ('{"name": 1}', Address, r"no field 'name'"),
        ("{}", Address, r"misses fields \['street'\]"),
        ('{"street": 5}', Address, r"expected str, got int 5 at \$\.street"),
        ('[1, "2"]', list[int], r"expected int, got str '2' at \$\[1\]"),
        ("true", int, "expected int, got bool"),
        ("1.5", int, "expected int"),
        ('"green"', Color, "expected Color"),
        ('"maybe"', Literal["yes", "no"], "expected Literal"),
        ("[1, 2, 3]", tuple[int, int], "expected tuple"),
        ('{"a": [1, "x"]}', dict[str, list[int]], r"at \$\.a\[1\]"),
        ('"not-a-uuid"', UUID, "expected UUID"),
        ("[1]", int | str, "expected int | str"),
        ('{"id": "x"}', Order, "Order"),
    ],
)
def test_loads_of_data_not_fitting_the_hint_gives_serialization_error(
    text: str, hint: object, message: str
) -> None:
    with pytest.raises(SerializationError, match=message):
        SERDE.loads(text, hint, what="step result")


def test_loads_of_invalid_json_or_a_malformed_tag_gives_serialization_error() -> None:
    with pytest.raises(SerializationError, match="not valid JSON"):
        SERDE.loads("{oops", what="arguments")
    with pytest.raises(SerializationError, match=r"malformed \$uuid"):
        SERDE.loads('{"$uuid": 5}')


def test_an_unresolved_string_hint_is_refused_with_advice() -> None:
    with pytest.raises(SerializationError, match="resolve it first"):
        SERDE.loads("1", "int")


def test_a_hint_that_cannot_be_rebuilt_is_refused() -> None:
    class Greeter(Protocol):
        def greet(self) -> str: ...

    with pytest.raises(SerializationError, match="cannot rebuild"):
        SERDE.loads('"hi"', Greeter)


def test_convert_rebuilds_an_already_decoded_value() -> None:
    raw = SERDE.loads(SERDE.dumps({"street": "Main", "moved_in": datetime(2020, 1, 1)}))
    assert SERDE.convert(raw, Address) == Address("Main", datetime(2020, 1, 1))


def test_none_as_hint_means_no_hint_and_nonetype_means_the_value_none() -> None:
    assert SERDE.loads('{"a": 1}', None) == {"a": 1}
    assert SERDE.loads("null", type(None)) is None
    with pytest.raises(SerializationError, match="expected None"):
        SERDE.loads("1", type(None))


def test_unknown_tags_stay_plain_dicts() -> None:
    assert SERDE.loads('{"$ref": "abc"}') == {"$ref": "abc"}


# --- errors ---------------------------------------------------------------------------------------


class ChargeDeclinedError(Exception):
    init_calls = 0

    def __init__(self, amount: int, *, card: str) -> None:
        type(self).init_calls += 1
        super().__init__(f"declined {amount} on {card}")


class Outer:
    class InnerError(Exception):
        pass


class NeedsInitError(Exception):
    def __init__(self, code: int) -> None:
        self.code = code
        super().__init__(code)

    def __str__(self) -> str:
        return f"code {self.code}"


def _raise(exc: BaseException) -> None:
    raise exc


def _recorded(exc: BaseException) -> dict[str, str]:
    try:
        _raise(exc)
    except BaseException as caught:
        return encode_error(caught)
    raise AssertionError("unreachable")


def test_encode_error_names_builtins_without_module_and_keeps_the_traceback() -> None:
    error = _recorded(ValueError("bad input"))
    assert error["type"] == "ValueError"
    assert error["message"] == "bad input"
    assert "Traceback" in error["traceback"]
    assert "ValueError: bad input" in error["traceback"]
    assert _recorded(Outer.InnerError("x"))["type"].endswith("test_serde.Outer.InnerError")


def test_rebuild_error_gives_back_a_builtin_value_error_with_message_and_note() -> None:
    exc = rebuild_error(_recorded(ValueError("bad input")))
    assert type(exc) is ValueError
    assert str(exc) == "bad input"
    assert exc.__notes__[0].startswith("recorded traceback:\nTraceback")


def test_rebuild_error_gives_back_a_class_from_an_already_imported_module_without_init() -> None:
    error = _recorded(ChargeDeclinedError(5, card="visa"))
    calls = ChargeDeclinedError.init_calls
    exc = rebuild_error(error)
    assert type(exc) is ChargeDeclinedError
    assert exc.args == ("declined 5 on visa",)
    assert ChargeDeclinedError.init_calls == calls
    assert type(rebuild_error(_recorded(Outer.InnerError("x")))) is Outer.InnerError


def test_rebuild_error_gives_step_failed_for_a_module_that_is_not_imported() -> None:
    error = {"type": "nosuchmodule.Nope", "message": "boom", "traceback": "Traceback: ..."}
    exc = rebuild_error(error)
    assert isinstance(exc, StepFailed)
    assert exc.error_type == "nosuchmodule.Nope"
    assert str(exc) == "nosuchmodule.Nope: boom"
    assert exc.__notes__ == ["recorded traceback:\nTraceback: ..."]
    assert "nosuchmodule" not in sys.modules


@pytest.mark.parametrize(
    "name", ["KeyboardInterrupt", "os.path", "os.sep", "NoSuchBuiltin", "", "test_serde.<locals>.E"]
)
def test_rebuild_error_gives_step_failed_for_names_that_are_not_exception_classes(
    name: str,
) -> None:
    exc = rebuild_error({"type": name, "message": "m"})
    assert isinstance(exc, StepFailed)
    assert not getattr(exc, "__notes__", [])


def test_rebuild_error_gives_step_failed_when_the_class_cannot_live_without_init() -> None:
    exc = rebuild_error(_recorded(NeedsInitError(3)))
    assert isinstance(exc, StepFailed)
    assert "code 3" in str(exc)


def test_rebuild_error_does_not_trigger_a_lazy_module_getattr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lazy = types.ModuleType("lazy_mod")
    asked: list[str] = []

    def module_getattr(name: str) -> object:
        asked.append(name)
        raise AttributeError(name)

    lazy.__getattr__ = module_getattr  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "lazy_mod", lazy)
    assert isinstance(rebuild_error({"type": "lazy_mod.Missing", "message": ""}), StepFailed)
    assert asked == []
