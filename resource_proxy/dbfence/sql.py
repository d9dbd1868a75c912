"""Every SQL text of database-side fencing: the fixed part (schema ``fencing``, the fence table,
claims, key texts, escaping) and the generators of each protected table's functions and triggers.

Names (schema ``fencing``)::

    fences(lock text PRIMARY KEY, highest bigint)   the ONE fence table (shared with the proxy)
    claim(lock, fence) -> highest                   a WRITE claim: raise or keep the highest;
                                                    LF001 if stale
    try_claim(lock, fence) -> highest               the same, never raises (the proxy's 409 path)
    claim_read(lock, fence) -> highest              a READ claim: the same raise and LF001, but
    try_claim_read(lock, fence) -> highest          recorded apart: it never lets a row be written
    try_claim_many(locks[], fences[]) -> (lock, highest) rows: try_claim of each, in COLLATE "C"
                                                    order (concurrent batches never deadlock)
    try_claim_many(locks[], fences[], purposes[])   the same, each 'write' or 'read'
    claimed(lock) -> boolean                        whether this transaction may write lock's rows
    escape(text) -> text                            canonical.encode: the lock-name alphabet
    key_int/_numeric/_float8/_uuid/_bool/_timestamp/_timestamptz/_date/_time/_bytea(v) -> text
                                                    canonical.canonical of the STORED value
    exempt() -> boolean                             current_user is a role named at install
    refuse(lock, table, via)                        raises LF002 naming the lock and the highest
                                                    (LF003 when the lock is claimed for reading only)
    lock_of_<table>(key columns...) -> text         the row's lock name (the table's template)
    lock_for(table, VARIADIC key text[]) -> text    the same for any fenced table (partitions
                                                    and children too), read from its trigger
    guard_of_<table>() trigger                      BEFORE INSERT/UPDATE/DELETE FOR EACH ROW
    guard_truncate() trigger                        BEFORE TRUNCATE: refused unless exempt

A claim is recorded for the current transaction only, in the transaction-local setting
``fencing.claims`` (``|lock|lock|``; lock names never contain ``|``), a read claim in
``fencing.read_claims``, which no trigger accepts; ROLLBACK and ROLLBACK TO SAVEPOINT undo it
together with the fence row they raised. A read claim first reads the highest and takes the
upsert (and its row lock) only when its epoch is above it, so readers at one epoch do not wait
for each other.

Every function pins ``search_path = pg_catalog, pg_temp``: the triggers run with the writer's
search path, and a role with a schema of its own (``strpos``, an operator) could otherwise change
what the check computes. Only the roles install names (``claim_roles``) and the owner may
execute the claim functions (``CLAIM_FUNCTIONS``): any other role could raise a fence for good.

Every function text is session-independent: dates and times go through ``to_char`` with fixed
formats (never DateStyle or TimeZone), floats through ``extra_float_digits = 1`` set on the
function, shortened to Python's ``repr`` where PostgreSQL's text is one digit longer.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["SCHEMA", "FENCES", "TRIGGER", "TRUNCATE_TRIGGER", "LF_STALE", "LF_UNCLAIMED",
           "LF_READ_ONLY", "BASE", "CLAIM_FUNCTIONS", "PINNED", "KEY_FUNCTIONS",
           "exempt_function", "lock_function", "guard_function", "guard_trigger",
           "truncate_trigger", "inline_key", "inline_escape", "ident", "literal", "object_name",
           "digest", "PROXY_TRY_CLAIM", "PROXY_TRY_CLAIM_READ", "PROXY_TRY_CLAIM_MANY"]

SCHEMA = "fencing"
FENCES = "fencing.fences"
TRIGGER = "zz_fencing_guard"        # sorts after the usual BEFORE triggers: checks the final NEW
TRUNCATE_TRIGGER = "zz_fencing_truncate"
LF_STALE = "LF001"
LF_UNCLAIMED = "LF002"
LF_READ_ONLY = "LF003"  # a row of a lock this transaction claimed for reading only
PINNED = "SET search_path = pg_catalog, pg_temp"

# What the proxy's gated single-row write puts in its fence CTE instead of the bare upsert, so
# its own write passes the row trigger (the claim is recorded in the same statement).
PROXY_TRY_CLAIM = "SELECT fencing.try_claim(%(lock)s, %(fence)s::bigint) AS highest"
# A fenced read's (and a claim-for-read's) claim: the same raise, recorded for reading only.
PROXY_TRY_CLAIM_READ = "SELECT fencing.try_claim_read(%(lock)s, %(fence)s::bigint) AS highest"
# Several locks at once, each for its purpose ('write' or 'read'), rows locked in name order.
PROXY_TRY_CLAIM_MANY = ('SELECT "lock", highest FROM fencing.try_claim_many(%(locks)s::text[], '
                        "%(fences)s::bigint[], %(purposes)s::text[])")


def ident(name: str) -> str:
    """A quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    """A quoted SQL string literal (standard_conforming_strings: only ``'`` is special)."""
    return "'" + text.replace("'", "''") + "'"


def digest(text: str) -> str:
    """The short hash install keeps in an object's COMMENT to skip an unchanged definition."""
    return "dbfence:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def object_name(prefix: str, table: str) -> str:
    """``prefix + table`` if it fits PostgreSQL's 63-byte names, else a shortened unique form."""
    name = prefix + table
    if len(name.encode()) <= 63:
        return name
    short = table.encode()[:40].decode(errors="ignore")
    return f"{prefix}{short}_{hashlib.sha256(table.encode()).hexdigest()[:8]}"


# --- the fixed part ---------------------------------------------------------------------------

_LOCK_RE = "^[A-Za-z0-9._:/-]{1,255}$"

_CLAIM_BODY = """
DECLARE
    h bigint;
    claims text;
BEGIN
    IF lock IS NULL OR fence IS NULL OR lock !~ '%(lock_re)s' COLLATE "C" THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('fencing.%(fn)s: %%L is not a lock name (1-255 of A-Za-z0-9._:/-)'
                             ' or the fence is null', lock);
    END IF;%(look)s
    INSERT INTO fencing.fences AS f (lock, highest) VALUES (%(fn)s.lock, %(fn)s.fence)
        ON CONFLICT (lock) DO UPDATE SET highest = GREATEST(f.highest, excluded.highest)
        RETURNING f.highest INTO h;%(looked)s
    IF h > %(fn)s.fence THEN
        %(stale)s
    END IF;
    claims := coalesce(nullif(current_setting('%(setting)s', true), ''), '|');
    IF strpos(claims, '|' || %(fn)s.lock || '|') = 0 THEN
        PERFORM set_config('%(setting)s', claims || %(fn)s.lock || '|', true);
    END IF;
    RETURN h;
END"""

# A read claim looks first: at or below the highest it needs no upsert (nor the row lock).
_LOOK = """
    SELECT f.highest INTO h FROM fencing.fences f WHERE f.lock = %(fn)s.lock;
    IF h IS NULL OR h < %(fn)s.fence THEN"""
_LOOKED = """
    END IF;"""

_RAISE_STALE = """RAISE EXCEPTION USING ERRCODE = 'LF001',
            MESSAGE = format('stale fence %s for lock "%s": highest is %s', fence, lock, h),
            DETAIL = format('lock=%s presented=%s highest=%s', lock, fence, h),
            HINT = 'a newer holder of the lock has written; acquire the lock again';"""


def _claim(fn: str, stale: str, *, read: bool = False) -> str:
    """``fencing.<fn>(lock, fence)``: a write claim (``fencing.claims``), or with ``read`` a
    read claim (``fencing.read_claims``, looked up before the upsert)."""
    look, looked = (_LOOK % {"fn": fn}, _LOOKED) if read else ("", "")
    body = _CLAIM_BODY % {"fn": fn, "stale": stale, "lock_re": _LOCK_RE, "look": look,
                          "looked": looked,
                          "setting": "fencing.read_claims" if read else "fencing.claims"}
    return (f"CREATE OR REPLACE FUNCTION fencing.{fn}(lock text, fence bigint) RETURNS bigint\n"
            f"LANGUAGE plpgsql VOLATILE SECURITY DEFINER {PINNED}\n"
            f"AS $fn$\n#variable_conflict use_column\n{body}\n$fn$")


_TRY_CLAIM_MANY = f"""CREATE OR REPLACE FUNCTION fencing.try_claim_many(locks text[], fences bigint[])
RETURNS TABLE (lock text, highest bigint)
LANGUAGE plpgsql VOLATILE {PINNED}
AS $fn$
BEGIN
    IF cardinality(locks) IS DISTINCT FROM cardinality(fences) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'fencing.try_claim_many: locks and fences differ in length';
    END IF;
    FOR lock, highest IN
        SELECT u.l, u.f FROM unnest(locks, fences) AS u(l, f) ORDER BY u.l COLLATE "C"
    LOOP
        highest := fencing.try_claim(lock, highest);
        RETURN NEXT;
    END LOOP;
END
$fn$"""

_TRY_CLAIM_MANY_FOR = f"""CREATE OR REPLACE FUNCTION fencing.try_claim_many(
    locks text[], fences bigint[], purposes text[])
RETURNS TABLE (lock text, highest bigint)
LANGUAGE plpgsql VOLATILE {PINNED}
AS $fn$
DECLARE
    purpose text;
BEGIN
    IF cardinality(locks) IS DISTINCT FROM cardinality(fences)
       OR cardinality(locks) IS DISTINCT FROM cardinality(purposes) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'fencing.try_claim_many: locks, fences and purposes differ in length';
    END IF;
    FOR lock, highest, purpose IN
        SELECT u.l, u.f, u.p FROM unnest(locks, fences, purposes) AS u(l, f, p)
        ORDER BY u.l COLLATE "C"
    LOOP
        IF purpose = 'write' THEN
            highest := fencing.try_claim(lock, highest);
        ELSIF purpose = 'read' THEN
            highest := fencing.try_claim_read(lock, highest);
        ELSE
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('fencing.try_claim_many: purpose %L is not write or read',
                                 purpose);
        END IF;
        RETURN NEXT;
    END LOOP;
END
$fn$"""

_ESCAPE_BODY = r"""SELECT CASE WHEN t ~ '^[A-Za-z0-9_-][A-Za-z0-9._-]*$' COLLATE "C" THEN t
ELSE coalesce((
    SELECT string_agg(CASE WHEN b BETWEEN 48 AND 57 OR b BETWEEN 65 AND 90
                                OR b BETWEEN 97 AND 122 OR b IN (45, 95) OR (b = 46 AND i > 0)
                           THEN chr(b) ELSE ':' || upper(lpad(to_hex(b), 2, '0')) END,
                      '' ORDER BY i)
    FROM (SELECT i, get_byte(u, i) AS b
          FROM (SELECT convert_to(t, 'UTF8') AS u) AS bytes,
               generate_series(0, octet_length(u) - 1) AS i) AS each_byte), '')
END"""
_ESCAPE = f"""CREATE OR REPLACE FUNCTION fencing.escape(t text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE {PINNED}
AS $fn$
{_ESCAPE_BODY}
$fn$"""

# The canonical text (canonical.canonical) of each supported kind, from the stored value.
KEY_FUNCTIONS: dict[str, tuple[str, str]] = {
    # name: (argument type, body returning text)
    "key_int": ("bigint", "SELECT v::text"),
    "key_numeric": ("numeric", "SELECT trim_scale(v)::text"),
    "key_float8": ("double precision", ""),  # plpgsql: _KEY_FLOAT8
    "key_uuid": ("uuid", "SELECT v::text"),
    "key_bool": ("boolean", "SELECT CASE WHEN v THEN 'true' ELSE 'false' END"),
    "key_timestamp": ("timestamp without time zone", """SELECT CASE WHEN NOT isfinite(v) THEN v::text
    ELSE CASE WHEN v < timestamp '0001-01-01' THEN '-' ELSE '' END
         || to_char(v, 'YYYYMMDD"T"HH24MISS')
         || coalesce('.' || nullif(rtrim(to_char(v, 'US'), '0'), ''), '') || 'Z' END"""),
    "key_timestamptz": ("timestamp with time zone",
                        "SELECT fencing.key_timestamp(v AT TIME ZONE 'UTC')"),
    "key_date": ("date", """SELECT CASE WHEN NOT isfinite(v) THEN v::text
    WHEN v < date '0001-01-01' THEN '-' || to_char(v::timestamp, 'YYYY-MM-DD')
    ELSE to_char(v::timestamp, 'YYYY-MM-DD') END"""),
    "key_time": ("time without time zone", """SELECT CASE WHEN v = time '24:00' THEN '24:00:00'
    ELSE to_char(timestamp '2000-01-01' + v, 'HH24:MI:SS')
         || CASE WHEN to_char(timestamp '2000-01-01' + v, 'US') = '000000' THEN ''
                 ELSE '.' || to_char(timestamp '2000-01-01' + v, 'US') END END"""),
    "key_bytea": ("bytea", "SELECT encode(v, 'hex')"),
}

# Python's repr is the shortest decimal that reads back as the same double, the closest one if
# several; PostgreSQL's shortest text (extra_float_digits > 0) is sometimes one digit longer
# (4.3374900492107776e+16 where repr says 4.337490049210778e+16). So: start from PostgreSQL's
# text and round to one significant digit fewer while the double reads back unchanged.
_KEY_FLOAT8 = """CREATE OR REPLACE FUNCTION fencing.key_float8(v double precision) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET extra_float_digits = 1
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    exact numeric;
    best numeric;
    shorter numeric;
    t text;
    digits int;
    magnitude int;
BEGIN
    IF v = 'NaN'::float8 OR v = 'Infinity'::float8 OR v = '-Infinity'::float8 THEN
        RETURN v::text;
    END IF;
    IF v = 0 THEN
        RETURN '0';
    END IF;
    exact := trim_scale(v::text::numeric);
    best := exact;
    t := abs(best)::text;
    IF abs(best) >= 1 THEN
        magnitude := length(trunc(abs(best))::text) - 1;
    ELSE
        magnitude := -(length(substr(t, 3)) - length(ltrim(substr(t, 3), '0')) + 1);
    END IF;
    digits := length(rtrim(ltrim(replace(t, '.', ''), '0'), '0'));
    WHILE digits > 1 LOOP
        digits := digits - 1;
        shorter := round(exact, digits - 1 - magnitude);
        EXIT WHEN shorter::float8 <> v;
        best := shorter;
    END LOOP;
    RETURN trim_scale(best)::text;
END
$fn$"""


def _key_function(name: str) -> str:
    if name == "key_float8":
        return _KEY_FLOAT8
    arg, body = KEY_FUNCTIONS[name]
    return (f"CREATE OR REPLACE FUNCTION fencing.{name}(v {arg}) RETURNS text\n"
            f"LANGUAGE sql STABLE STRICT PARALLEL SAFE {PINNED}\n"
            f"AS $fn$\n{body}\n$fn$")


def _inline(body: str, param: str, ref: str) -> str:
    """``body`` (``SELECT <expr>`` of a STRICT one-parameter SQL function) as an expression of
    ``ref``: NULL for a NULL ``ref``, as the function's call."""
    expr = re.sub(rf"\b{param}\b", f"({ref})", body.removeprefix("SELECT "))
    return f"(CASE WHEN ({ref}) IS NULL THEN NULL ELSE {expr} END)"


def inline_key(name: str, ref: str) -> str:
    """What ``fencing.<name>(ref)`` (a ``KEY_FUNCTIONS`` entry) computes, as an expression with
    no call (``key_float8``, in PL/pgSQL, stays a call). The row triggers use it: a SQL function
    pinned to a search path is not inlined by the planner, and a call per key and row costs
    about ten times the expression (docs/db-fencing.md, "Cost")."""
    if name == "key_float8":
        return f"fencing.key_float8({ref})"
    if name == "key_timestamptz":
        return inline_key("key_timestamp", f"({ref}) AT TIME ZONE 'UTC'")
    return _inline(KEY_FUNCTIONS[name][1], "v", ref)


def inline_escape(ref: str) -> str:
    """What ``fencing.escape(ref)`` computes, as an expression with no call."""
    return _inline(_ESCAPE_BODY, "t", ref)


_CLAIMED = f"""CREATE OR REPLACE FUNCTION fencing.claimed(lock text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE {PINNED}
AS $fn$
SELECT coalesce(strpos(current_setting('fencing.claims', true), '|' || lock || '|') > 0, false)
$fn$"""

_REFUSE = f"""CREATE OR REPLACE FUNCTION fencing.refuse(lock text, tab text, via text)
RETURNS void LANGUAGE plpgsql STABLE {PINNED}
AS $fn$
DECLARE
    h bigint;
    route text := CASE WHEN via IS DISTINCT FROM tab THEN format(' (written through %I)', via)
                       ELSE '' END;
BEGIN
    IF lock IS NULL OR length(lock) > 255 THEN
        RAISE EXCEPTION USING ERRCODE = 'LF002',
            MESSAGE = format('a row of table %I%s has a key that cannot be bound to a lock name'
                             ' (1-255 of A-Za-z0-9._:/-): %s', tab, route,
                             coalesce(left(lock, 300), 'null')),
            DETAIL = format('table=%s', tab);
    END IF;
    SELECT f.highest INTO h FROM fencing.fences f WHERE f.lock = refuse.lock;
    IF strpos(coalesce(current_setting('fencing.read_claims', true), ''),
              '|' || lock || '|') > 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'LF003',
            MESSAGE = format('row of table %I%s is written under lock "%s", which this '
                             'transaction claimed for reading only (highest fence %s): a '
                             'shared (read) lease never writes', tab, route, lock,
                             coalesce(h::text, 'none')),
            DETAIL = format('lock=%s table=%s highest=%s', lock, tab, coalesce(h::text, '')),
            HINT = 'take the lock exclusive to write its rows';
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'LF002',
        MESSAGE = format('row of table %I%s is written under lock "%s", which this transaction '
                         'has not claimed (highest fence %s); call fencing.claim(%L, fence) '
                         'first', tab, route, lock, coalesce(h::text, 'none'), lock),
        DETAIL = format('lock=%s table=%s highest=%s', lock, tab, coalesce(h::text, '')),
        HINT = 'claim the lock in this transaction at a fence equal to its highest';
END
$fn$"""

# The lock a row of ``tab`` needs, read from what install put there: the row trigger names the
# guard function; its text names the root table (``refuse(n, 'root', ..)``) or, for a literal
# template, the literal; ``lock_of_<root>`` computes a templated one from the key values, each
# given as text and cast to its column's type. ``object_name``'s shortening is mirrored for
# ASCII names (a root name of more than 55 bytes).
_LOCK_FOR = f"""CREATE OR REPLACE FUNCTION fencing.lock_for(tab regclass,
                                            VARIADIC key text[] DEFAULT '{{}}')
RETURNS text LANGUAGE plpgsql STABLE {PINNED}
AS $fn$
DECLARE
    src text;
    root text;
    fn text;
    types oid[];
    names text[];
    args text;
    found text;
BEGIN
    SELECT p.prosrc INTO src FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
    WHERE t.tgrelid = tab AND t.tgname = 'zz_fencing_guard';
    IF src IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('table %s is not fenced (no fence trigger): its rows need no lock',
                             tab),
            HINT = 'resource-proxy db install fences the tables of its policy';
    END IF;
    IF strpos(src, 'PERFORM fencing.refuse(n, ') = 0 THEN  -- a literal template
        found := substring(src FROM $re$PERFORM fencing[.]refuse[(]'((?:[^']|'')*)'$re$);
        RETURN replace(found, '''''', '''');
    END IF;
    root := replace(substring(src FROM $re$refuse[(]n, '((?:[^']|'')*)'$re$), '''''', '''');
    fn := 'lock_of_' || root;
    IF octet_length(fn) > 63 THEN
        fn := 'lock_of_' || left(root, 40) || '_'
              || left(encode(sha256(convert_to(root, 'UTF8')), 'hex'), 8);
    END IF;
    SELECT p.proargtypes::oid[], p.proargnames INTO types, names FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = 'fencing' AND p.proname = fn;
    IF types IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('table %s has a fence trigger but no fencing.%I', tab, fn),
            HINT = 'run resource-proxy db install again';
    END IF;
    IF coalesce(cardinality(key), 0) <> cardinality(types) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('the lock of a row of %s is made of %s key value(s) (%s), got %s',
                             tab, cardinality(types), array_to_string(names, ', '),
                             coalesce(cardinality(key), 0));
    END IF;
    SELECT string_agg(format('%L::%s', key[i - array_lower(types, 1) + 1],
                             format_type(types[i], NULL)), ', ' ORDER BY i)
    INTO args FROM generate_subscripts(types, 1) AS i;
    EXECUTE format('SELECT fencing.%I(%s)', fn, args) INTO found;
    RETURN found;
END
$fn$"""

_GUARD_TRUNCATE = f"""CREATE OR REPLACE FUNCTION fencing.guard_truncate() RETURNS trigger
LANGUAGE plpgsql {PINNED}
AS $fn$
BEGIN
    IF NOT fencing.exempt() THEN
        RAISE EXCEPTION USING ERRCODE = 'LF002',
            MESSAGE = format('TRUNCATE of table %I is refused: its rows are fenced (delete them '
                             'under their locks, or truncate as a role exempt from fencing)',
                             TG_TABLE_NAME),
            DETAIL = format('table=%s', TG_TABLE_NAME);
    END IF;
    RETURN NULL;
END
$fn$"""


def exempt_function(roles: list[str]) -> str:
    """``fencing.exempt()``: whether ``current_user`` is one of ``roles`` (named at install)."""
    if roles:
        body = f"SELECT current_user = ANY (ARRAY[{', '.join(literal(r) for r in roles)}]::name[])"
    else:
        body = "SELECT false"
    return ("CREATE OR REPLACE FUNCTION fencing.exempt() RETURNS boolean\n"
            f"LANGUAGE sql STABLE PARALLEL SAFE {PINNED}\nAS $fn$\n{body}\n$fn$")


# Statements run once per install (CREATE ... IF NOT EXISTS; functions are compared first).
SCHEMA_DDL = [
    f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
    f"CREATE TABLE IF NOT EXISTS {FENCES} (lock text PRIMARY KEY, highest bigint NOT NULL)",
]
# (whether PUBLIC already has it, the grant): GRANT rewrites the catalog row even when nothing
# changes, so install asks first.
GRANTS = [
    ("SELECT EXISTS (SELECT 1 FROM pg_namespace, aclexplode(nspacl) a WHERE nspname = 'fencing'"
     " AND a.grantee = 0 AND a.privilege_type = 'USAGE')",
     f"GRANT USAGE ON SCHEMA {SCHEMA} TO PUBLIC"),
    ("SELECT EXISTS (SELECT 1 FROM aclexplode((SELECT relacl FROM pg_class WHERE oid ="
     " 'fencing.fences'::regclass)) a WHERE a.grantee = 0 AND a.privilege_type = 'SELECT')",
     f"GRANT SELECT ON {FENCES} TO PUBLIC"),
]

# (function signature, CREATE text) for every fixed function, in creation order.
BASE: list[tuple[str, str]] = [
    ("fencing.escape(text)", _ESCAPE),
    *[(f"fencing.{name}({arg})", _key_function(name))
      for name, (arg, _) in KEY_FUNCTIONS.items()],
    ("fencing.claim(text,bigint)", _claim("claim", _RAISE_STALE)),
    ("fencing.try_claim(text,bigint)", _claim("try_claim", "RETURN h;")),
    ("fencing.claim_read(text,bigint)", _claim("claim_read", _RAISE_STALE, read=True)),
    ("fencing.try_claim_read(text,bigint)", _claim("try_claim_read", "RETURN h;", read=True)),
    ("fencing.try_claim_many(text[],bigint[])", _TRY_CLAIM_MANY),
    ("fencing.try_claim_many(text[],bigint[],text[])", _TRY_CLAIM_MANY_FOR),
    ("fencing.claimed(text)", _CLAIMED),
    ("fencing.refuse(text,text,text)", _REFUSE),
    ("fencing.lock_for(regclass,text[])", _LOCK_FOR),
]
# created after exempt(), which it calls
TRUNCATE_GUARD = ("fencing.guard_truncate()", _GUARD_TRUNCATE)
# The functions that raise a fence: EXECUTE is revoked from PUBLIC, granted to named roles.
CLAIM_FUNCTIONS = ["fencing.claim(text,bigint)", "fencing.try_claim(text,bigint)",
                   "fencing.claim_read(text,bigint)", "fencing.try_claim_read(text,bigint)",
                   "fencing.try_claim_many(text[],bigint[])",
                   "fencing.try_claim_many(text[],bigint[],text[])"]


# --- per protected table ----------------------------------------------------------------------

def lock_function(name: str, args: list[tuple[str, str]], expression: str) -> str:
    """``fencing.<name>(k1 type1, ...)``: the lock name from the key values (``expression``
    uses ``$1``, ``$2``...)."""
    params = ", ".join(f"{ident(a)} {t}" for a, t in args)
    return (f"CREATE OR REPLACE FUNCTION fencing.{ident(name)}({params}) RETURNS text\n"
            f"LANGUAGE sql STABLE PARALLEL SAFE {PINNED}\nAS $fn$\nSELECT {expression}\n$fn$")


def guard_function(name: str, table: str, lock_call_new: str | None, lock_call_old: str | None,
                   literal_lock: str | None) -> str:
    """The row trigger function of one protected table (``table``: the root's name).

    ``literal_lock``: the table's template is a literal (the fast path: one constant ``strpos``
    per row). Otherwise ``lock_call_new``/``lock_call_old`` compute the lock from NEW/OLD by
    column name, so the same function serves every partition and inheritance child, whatever
    their column order.
    """
    if literal_lock is not None:
        needle = literal("|" + literal_lock + "|")
        body = f"""BEGIN
    IF coalesce(strpos(current_setting('fencing.claims', true), {needle}), 0) = 0
       AND NOT fencing.exempt() THEN
        PERFORM fencing.refuse({literal(literal_lock)}, {literal(table)}, TG_TABLE_NAME);
    END IF;
    IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    RETURN NEW;
END"""
    else:
        body = f"""DECLARE
    claims text := coalesce(current_setting('fencing.claims', true), '');
    n text;
    o text;
BEGIN
    IF TG_OP <> 'DELETE' THEN
        n := {lock_call_new};
        IF (n IS NULL OR length(n) > 255 OR strpos(claims, '|' || n || '|') = 0)
           AND NOT fencing.exempt() THEN
            PERFORM fencing.refuse(n, {literal(table)}, TG_TABLE_NAME);
        END IF;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        o := {lock_call_old};
        IF (TG_OP = 'DELETE' OR o IS DISTINCT FROM n)
           AND (o IS NULL OR length(o) > 255 OR strpos(claims, '|' || o || '|') = 0)
           AND NOT fencing.exempt() THEN
            PERFORM fencing.refuse(o, {literal(table)}, TG_TABLE_NAME);
        END IF;
        IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    END IF;
    RETURN NEW;
END"""
    return (f"CREATE OR REPLACE FUNCTION fencing.{ident(name)}() RETURNS trigger\n"
            f"LANGUAGE plpgsql {PINNED}\nAS $fn$\n{body}\n$fn$")


def guard_trigger(relation: str, function: str) -> list[str]:
    """The row trigger on ``relation`` (a qualified, quoted name), enabled ALWAYS so that
    ``session_replication_role = replica`` does not skip it."""
    return [f"CREATE TRIGGER {TRIGGER} BEFORE INSERT OR UPDATE OR DELETE ON {relation} "
            f"FOR EACH ROW EXECUTE FUNCTION fencing.{ident(function)}()",
            f"ALTER TABLE {relation} ENABLE ALWAYS TRIGGER {TRIGGER}"]


def truncate_trigger(relation: str) -> list[str]:
    """The statement trigger refusing TRUNCATE of ``relation`` (not cloned to partitions by
    PostgreSQL, so install puts it on each)."""
    return [f"CREATE TRIGGER {TRUNCATE_TRIGGER} BEFORE TRUNCATE ON {relation} "
            "FOR EACH STATEMENT EXECUTE FUNCTION fencing.guard_truncate()",
            f"ALTER TABLE {relation} ENABLE ALWAYS TRIGGER {TRUNCATE_TRIGGER}"]
