"""One row, one lock, as pure functions: policy files, templates, canonical key text.

The property tests (hypothesis) check that a row's lock name is a function of its key's VALUE
(every spelling of one value gives one name) and injective (different values, different names),
for each key kind; the HTTP tests of the same rule on both databases are in ``test_binding``.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resource_proxy.canonical import canonical, decode, encode
from resource_proxy.errors import InvalidRequest, LockNotAllowed
from resource_proxy.policy import Policy, PolicyError, TableBinding, Template, load_policy
from resource_proxy.rows.tables import Column, Kind, Table
from resource_proxy.rows.values import coerce

ACCOUNTS = Table("accounts", {"id": Column("id", Kind.INTEGER, False, int_bits=64),
                              "owner": Column("owner", Kind.TEXT),
                              "last_fence": Column("last_fence", Kind.INTEGER)}, ("id",))
ORDERS = Table("orders", {"customer": Column("customer", Kind.TEXT, False),
                          "n": Column("n", Kind.INTEGER, False, int_bits=32)}, ("customer", "n"))
NOCASE = Table("ci", {"id": Column("id", Kind.TEXT, False, inexact="under the collation NOCASE")},
               ("id",))
KEYLESS = Table("log", {"v": Column("v", Kind.TEXT)}, ())


def _policy(tmp_path, text: str) -> Policy:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return load_policy(path)


def test_default_each_table_is_written_under_the_lock_named_as_it():
    binding = Policy.default().bind({"accounts": ACCOUNTS, "orders": ORDERS})
    binding["accounts"].require("accounts", (7,))
    binding["orders"].require("orders", ("acme", 1))
    with pytest.raises(LockNotAllowed) as refused:
        binding["accounts"].require("accounts/7", (7,))
    assert refused.value.detail == "table 'accounts' is written under lock 'accounts', not 'accounts/7'"
    assert refused.value.extra["lock"] == "accounts"
    assert binding.governs("accounts") and not binding.governs("accounts/7")
    assert binding.unfenced == []


def test_templates_bind_each_row_to_one_lock(tmp_path):
    binding = _policy(tmp_path, (
        "tables:\n"
        "  accounts: {lock: 'accounts/{key}', fence_column: last_fence}\n"
        "  orders: 'orders/{customer}/{n}'\n"
    )).bind({"accounts": ACCOUNTS, "orders": ORDERS})
    assert binding.catalog["accounts"].fence_column == "last_fence"
    assert binding["accounts"].lock_for((7,)) == "accounts/7"
    assert binding["orders"].lock_for(("a/b c", 3)) == "orders/a:2Fb:20c/3"
    binding["accounts"].require("accounts/7", (7,))
    with pytest.raises(LockNotAllowed):
        binding["accounts"].require("accounts/7", (8,))
    with pytest.raises(InvalidRequest):  # an insert that leaves the key to the database
        binding["accounts"].require("accounts/7", None)
    assert binding.governs("orders/a:2Fb:20c/3") and binding.governs("accounts/7")
    for other in ("accounts/07", "accounts/+7", "accounts/7/x", "orders/a/b/3", "orders/x/1.0",
                  "orders/:61/1", "accounts/x", "orders"):
        assert not binding.governs(other), other


def test_grouping_and_literal_templates(tmp_path):
    binding = _policy(tmp_path, "tables: {orders: 'orders/{customer}', accounts: ledger}\n").bind(
        {"accounts": ACCOUNTS, "orders": ORDERS})
    assert binding["orders"].lock_for(("acme", 1)) == binding["orders"].lock_for(("acme", 2)) == "orders/acme"
    assert binding["orders"].lock_for_filters({"customer": "acme", "n": 5}) == "orders/acme"
    with pytest.raises(InvalidRequest):
        binding["orders"].lock_for_filters({"n": 5})
    assert binding["accounts"].lock_for(None) == "ledger"


def test_an_insert_leaving_unused_key_columns_to_the_database_is_bound_by_its_values(tmp_path):
    binding = _policy(tmp_path, "tables: {orders: 'orders/{customer}'}\n").bind({"orders": ORDERS})
    binding["orders"].require("orders/acme", None, values={"customer": "acme"})  # n: a serial
    with pytest.raises(LockNotAllowed):
        binding["orders"].require("orders/other", None, values={"customer": "acme"})
    with pytest.raises(InvalidRequest, match="give the row's key"):
        binding["orders"].require("orders/acme", None, values={"n": 1})


def test_unfenced_only_when_declared(tmp_path):
    binding = _policy(tmp_path, "tables: {accounts: {unfenced: true}}\n").bind(
        {"accounts": ACCOUNTS, "orders": ORDERS})
    assert binding.unfenced == ["accounts"]
    assert binding["accounts"].lock_for((1,)) is None
    assert binding["orders"].lock_for(("x", 1)) == "orders"


@pytest.mark.parametrize(("text", "reason"), [
    ("tables: {orders: 'orders/{customer}/*'}", "'*'"),
    ("tables: {orders: '*'}", "'*'"),
    ("tables: {orders: ['orders/{key}', 'o/{key}']}", "ONE template"),
    ("tables: {orders: {locks: ['orders/{key}']}}", "ONE template"),
    ("default: ['jobs/*']", "default"),
    ("tables: {orders: 'orders/{customer}{n}'}", "separated"),
    ("tables: {orders: 'orders/{customer}-{n}'}", "separated"),
    ("tables: {orders: 'orders {key}'}", "lock-name character"),
    ("tables: {orders: 'o/{key'}", "lock-name character"),
    ("tables: {orders: {lock: 'o', unfenced: true}}", "not both"),
    ("tables: {orders: {unfenced: 'yes'}}", "true or false"),
    ("tables: {orders: {lock: 3}}", "template"),
    ("tables: [1, 2]", "mapping"), ("surprise: 1", "unknown"), ("- a\n- b", "mapping"),
    (":\n  - [", "cannot read"),
])
def test_policies_that_do_not_give_one_lock_per_row_are_refused_on_one_line(tmp_path, text, reason):
    with pytest.raises(PolicyError) as refused:
        _policy(tmp_path, text)
    assert reason in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(("text", "reason"), [
    ("tables: {nope: x}", "does not serve"),
    ("tables: {accounts: 'accounts/{owner}'}", "neither {key} nor a primary-key column"),
    ("tables: {accounts: {fence_column: missing}}", "fence_column"),
    ("tables: {accounts: {fence_column: id}}", "may not be in its key"),
    ("tables: {ci: 'ci/{key}'}", "NOCASE"),
    ("tables: {ci: 'ci/{id}'}", "NOCASE"),
    ("tables: {log: 'log/{key}'}", "no primary key"),
    ("tables: {accounts: '" + "x" * 256 + "'}", "not a lock name"),
])
def test_policies_that_do_not_fit_the_tables_are_refused(tmp_path, text, reason):
    with pytest.raises(PolicyError) as refused:
        _policy(tmp_path, text).bind({"accounts": ACCOUNTS, "ci": NOCASE, "log": KEYLESS})
    assert reason in str(refused.value)


def test_inexact_keys_may_still_use_a_literal_lock_and_odd_table_names_need_one(tmp_path):
    assert _policy(tmp_path, "tables: {ci: ci}").bind({"ci": NOCASE})["ci"].lock_for(None) == "ci"
    with pytest.raises(PolicyError, match="not a valid lock name"):
        Policy.default().bind({"my table": KEYLESS})


def test_a_key_too_long_for_a_lock_name_is_refused_for_that_row(tmp_path):
    binding = _policy(tmp_path, "tables: {orders: 'orders/{key}'}").bind({"orders": ORDERS})
    assert len(binding["orders"].lock_for(("x" * 246, 1))) == 255
    with pytest.raises(InvalidRequest, match="lock name of 258"):
        binding["orders"].lock_for(("x" * 246 + "/", 1))  # "/" is escaped as ":2F"


def test_template_parts():
    template = Template.parse("orders/{customer}/{key}", "t")
    assert template.variables == ["customer", "key"] and not template.literal


# -- canonical text ------------------------------------------------------------------------

INT = Column("k", Kind.INTEGER, False, int_bits=64)
NUM = Column("k", Kind.NUMERIC, False)
FLT = Column("k", Kind.FLOAT, False)
TXT = Column("k", Kind.TEXT, False)
UID = Column("k", Kind.UUID, False)
TS = Column("k", Kind.TIMESTAMPTZ, False)
BOOL = Column("k", Kind.BOOLEAN, False)


@pytest.mark.parametrize(("column", "spellings", "text"), [
    (INT, ["1", "01", "+1", "001"], "1"),
    (INT, ["-0", "0", "+0"], "0"),
    (NUM, ["1", "1.0", "1.00", "+1", "1e0", "0.1e1", "01.000"], "1"),
    (NUM, ["-0", "0.00", "0e5"], "0"),
    (NUM, ["100", "1e2", "1.00E+2"], "100"),
    (NUM, ["0.5", ".5", "5e-1"], "0.5"),
    (FLT, ["1", "1.0", "1e0"], "1"),
    (UID, ["6F9619FF-8B86-D011-B42D-00CF4FC964FF", "6f9619ff8b86d011b42d00cf4fc964ff",
           "{6f9619ff-8b86-d011-b42d-00cf4fc964ff}"], "6f9619ff-8b86-d011-b42d-00cf4fc964ff"),
    (TS, ["2024-05-01T12:00:00Z", "2024-05-01T14:00:00+02:00", "2024-05-01 12:00:00",
          "20240501T120000Z"], "20240501T120000Z"),
    (BOOL, ["true", "TRUE", "False"], None),
    (TXT, [" 1"], " 1"),
])
def test_every_spelling_of_a_value_has_one_canonical_text(column, spellings, text):
    texts = {canonical(column, coerce(column, s, from_text=True)) for s in spellings}
    if column is BOOL:
        assert texts == {"true", "false"}
        return
    assert texts == {text}


NUM2 = Column("k", Kind.NUMERIC, False, scale=2)
TS0 = Column("k", Kind.TIMESTAMPTZ, False, scale=0)
TM3 = Column("k", Kind.TIME, False, scale=3)
REAL = Column("k", Kind.FLOAT, False, cast="real")


@pytest.mark.parametrize(("column", "spelling", "text"), [
    (NUM2, "1.004", "1"), (NUM2, "1.005", "1.01"), (NUM2, "-1.005", "-1.01"), (NUM2, "2.5", "2.5"),
    (TS0, "2024-05-01T12:00:00.5Z", "20240501T120001Z"),
    (TS0, "1999-12-31T23:59:58.5Z", "19991231T235958Z"),  # before 2000: half away from 2000
    (TS0, "2024-05-01T12:00:00.4Z", "20240501T120000Z"),
    (TM3, "12:00:00.0005", "12:00:00.001000"), (REAL, "1.00000001", "1"), (REAL, "0.1", "0.10000000149011612"),
])
def test_postgres_rounds_keys_on_store_and_so_does_the_canonical_text(column, spelling, text):
    assert canonical(column, coerce(column, spelling, from_text=True)) == text


def test_escaping():
    assert encode("a b/c:d%é") == "a:20b:2Fc:3Ad:25:C3:A9"
    assert encode(".hidden") == ":2Ehidden" and encode("a.b") == "a.b" and encode("..") == ":2E."
    for text in ("", "plain", "a b/c:d%é", ":2F", "..", "\u2603 snow"):
        assert decode(encode(text)) == text
    for bad in ("a:2f", "a:", "a/b", ":41", ".x"):  # not what encode produces
        with pytest.raises(ValueError):
            decode(bad)


def _name(column: Column, value, *, sqlite: bool = False) -> str:
    table = Table("t", {"k": column}, ("k",))
    return TableBinding(table, Template.parse("t/{key}", "t"), sqlite).lock_for((value,))


_DECIMALS = st.decimals(allow_nan=False, allow_infinity=False, places=None,
                        min_value=Decimal("-1e20"), max_value=Decimal("1e20"))
_MOMENTS = st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1),
                        timezones=st.just(UTC))
_FLOATS = st.floats(min_value=-1e100, max_value=1e100).filter(lambda x: x == 0 or abs(x) > 1e-100)
_OFFSETS = st.integers(min_value=-14 * 60, max_value=14 * 60).map(
    lambda m: timezone(timedelta(minutes=m)))


@settings(max_examples=300, deadline=None)
@given(a=_DECIMALS, b=_DECIMALS, zeros=st.integers(min_value=0, max_value=6))
def test_numeric_names_are_a_function_of_the_value_and_injective(a, b, zeros):
    padded = a + Decimal(0).scaleb(-zeros)  # the same value with more trailing zeros
    spellings = {str(a), format(a, "f"), format(a, "e"), str(padded), ("+" if a >= 0 else "") + str(a)}
    names = {_name(NUM, coerce(NUM, s, from_text=True)) for s in spellings}
    assert len(names) == 1, f"one value, several names: {spellings} -> {names}"
    assert (_name(NUM, a) == _name(NUM, b)) == (a == b)
    # SQLite stores NUMERIC keys as doubles: names follow the stored value there
    assert (_name(NUM, a, sqlite=True) == _name(NUM, b, sqlite=True)) == (float(a) == float(b))


@settings(max_examples=200, deadline=None)
@given(a=st.integers(min_value=-(2**63), max_value=2**63 - 1),
       b=st.integers(min_value=-(2**63), max_value=2**63 - 1),
       zeros=st.integers(min_value=0, max_value=5), plus=st.booleans())
def test_integer_names(a, b, zeros, plus):
    spelled = ("-" if a < 0 else ("+" if plus else "")) + "0" * zeros + str(abs(a))
    assert _name(INT, coerce(INT, spelled, from_text=True)) == _name(INT, a)
    assert (_name(INT, a) == _name(INT, b)) == (a == b)


@settings(max_examples=200, deadline=None)
@given(a=_FLOATS, b=_FLOATS)
def test_float_names(a, b):
    assert _name(FLT, a) == _name(FLT, float(repr(a)))
    assert (_name(FLT, a) == _name(FLT, b)) == (a == b)


@settings(max_examples=300, deadline=None)
@given(a=st.text(max_size=40), b=st.text(max_size=40))
def test_text_names_are_the_text_exactly_and_injective(a, b):
    a, b = a.replace("\x00", ""), b.replace("\x00", "")
    names = []
    for text in (a, b):
        escaped = "t/" + encode(canonical(TXT, text))
        if len(escaped) > 255:  # longer than a lock name: that row is refused (422), no name
            with pytest.raises(InvalidRequest, match="characters"):
                _name(TXT, text)
            names.append(None)
        else:
            names.append(_name(TXT, text))
    if None not in names:
        assert (names[0] == names[1]) == (a == b)
        assert decode(names[0][2:]) == a


@settings(max_examples=200, deadline=None)
@given(a=st.uuids(), b=st.uuids(), upper=st.booleans())
def test_uuid_names(a, b, upper):
    spelled = str(a).upper() if upper else a.hex
    assert _name(UID, coerce(UID, spelled, from_text=True)) == _name(UID, a)
    assert (_name(UID, a) == _name(UID, b)) == (a == b)


@settings(max_examples=200, deadline=None)
@given(a=_MOMENTS, b=_MOMENTS, offset=_OFFSETS)
def test_timestamp_names_are_the_instant_in_utc(a, b, offset):
    spelled = a.astimezone(offset).isoformat()
    assert _name(TS, coerce(TS, spelled, from_text=True)) == _name(TS, a)
    assert (_name(TS, a) == _name(TS, b)) == (a == b)


@settings(max_examples=100, deadline=None)
@given(customer=st.lists(st.text(max_size=8), min_size=2, max_size=2),
       n=st.lists(st.integers(min_value=0, max_value=9), min_size=2, max_size=2))
def test_composite_names_are_injective(customer, n):
    binding = TableBinding(ORDERS, Template.parse("orders/{key}", "t"))
    rows = [(customer[i].replace("\x00", ""), n[i]) for i in range(2)]
    assert (binding.lock_for(rows[0]) == binding.lock_for(rows[1])) == (rows[0] == rows[1])
    assert binding.governs(binding.lock_for(rows[0]))


def test_uuid_module_is_what_the_proxy_uses():
    assert canonical(UID, uuid.UUID(int=1)) == "00000000-0000-0000-0000-000000000001"


def test_a_text_key_whose_name_is_too_long_is_refused_not_truncated():
    four_bytes = "\U0001F600" * 40  # each escaped to several characters: over 255
    with pytest.raises(InvalidRequest, match="characters"):
        _name(TXT, four_bytes)
