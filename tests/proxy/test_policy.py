"""Policy patterns and files (pure functions: which lock may write which table and row)."""

from __future__ import annotations

import pytest

from resource_proxy.errors import LockNotAllowed
from resource_proxy.policy import Pattern, PolicyError, load_policy
from resource_proxy.tables import Column, Kind, Table

ACCOUNTS = Table("accounts", {"id": Column("id", Kind.INTEGER, False, int_bits=64),
                              "last_fence": Column("last_fence", Kind.INTEGER)}, ("id",))
ORDERS = Table("orders", {"customer": Column("customer", Kind.TEXT, False),
                          "n": Column("n", Kind.INTEGER, False, int_bits=32)}, ("customer", "n"))


@pytest.mark.parametrize(("pattern", "lock", "key", "expected"), [
    ("*", "anything/at:all", None, True),
    ("jobs/*", "jobs/nightly", None, True),
    ("jobs/*", "jobsx/nightly", None, False),
    ("jobs/nightly", "jobs/nightly", None, True),
    ("jobs/nightly", "jobs/nightly2", None, False),
    ("a.b", "axb", None, False),  # literal characters are literal, not regex
    ("accounts/{key}", "accounts/7", {"key": "7"}, True),
    ("accounts/{key}", "accounts/8", {"key": "7"}, False),
    ("accounts/{key}", "accounts/7", None, False),  # an insert with no key cannot bind a row
    ("accounts/{key}", "accounts/7/x", {"key": "7"}, False),
    ("accounts/{key}*", "accounts/7-shard", {"key": "7"}, True),
])
def test_pattern_matching(pattern, lock, key, expected):
    assert Pattern.parse(pattern).matches(lock, key) is expected


def test_key_and_column_placeholders_bind_a_lock_to_one_row(tmp_path):
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(
        "tables:\n"
        "  accounts: {locks: ['accounts/{key}'], fence_column: last_fence}\n"
        "  orders: ['orders/{customer}/*', 'order/{key}']\n"
    )
    policy = load_policy(policy_file)
    catalog = policy.bind({"accounts": ACCOUNTS, "orders": ORDERS})
    assert catalog["accounts"].fence_column == "last_fence"
    policy.check_write("accounts/7", ACCOUNTS, (7,))
    with pytest.raises(LockNotAllowed):
        policy.check_write("accounts/7", ACCOUNTS, (8,))
    with pytest.raises(LockNotAllowed):
        policy.check_write("accounts/7", ACCOUNTS, None)
    policy.check_write("orders/acme/anything", ORDERS, ("acme", 3))
    policy.check_write("order/acme/3", ORDERS, ("acme", 3))  # {key} of a composite key: joined by /
    with pytest.raises(LockNotAllowed):
        policy.check_write("orders/other/x", ORDERS, ("acme", 3))
    with pytest.raises(LockNotAllowed):  # a table the file does not list, and no default
        policy.check_write("x", Table("other", {}, ()), None)


@pytest.mark.parametrize("text", [
    "tables: [1, 2]", "tables: {accounts: {locks: [3]}}", "tables: {accounts: {lock: '*'}}",
    "default: 5", "surprise: 1", "- a\n- b", "tables: {accounts: ['acc/{key']}", ":\n  - [",
])
def test_malformed_policy_files_are_refused(tmp_path, text):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError):
        load_policy(path)


@pytest.mark.parametrize("text", [
    "tables: {nope: '*'}",  # not served
    "tables: {accounts: ['accounts/{owner}']}",  # not a key column
    "tables: {accounts: {fence_column: missing}}",
    "tables: {accounts: {fence_column: id}}",  # the key cannot be the fence column
])
def test_policy_that_does_not_fit_the_tables_is_refused(tmp_path, text):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError):
        load_policy(path).bind({"accounts": ACCOUNTS})


def test_json_policy_and_default(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"default": ["jobs/*"], "tables": {"accounts": "bank"}}')
    policy = load_policy(path)
    policy.check_write("jobs/1", Table("other", {}, ()), None)
    policy.check_write("bank", ACCOUNTS, (1,))
    with pytest.raises(LockNotAllowed):
        policy.check_write("jobs/1", ACCOUNTS, (1,))
