"""What each least-privilege role may touch, read from the catalog and tried for real
(docs/roles.md, "What each role can do").

Every table, partition, view and sequence of the awa schema is looked up in the catalog, so a
table a later migration adds is covered without naming it here. As each role: every INSERT,
UPDATE, DELETE and TRUNCATE, every row lock and every table lock stronger than a read is refused;
no sequence can be advanced; the role may execute exactly the functions of its lists in
awa_django/sql/roles.sql; the functions it may call that change anything run as the owner with a
fixed search_path; the read functions run with JIT off.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from awa_django.db.roles import function_names
from tests.support.roles import RolesDB, refused

#: Every role the script grants to (the owner owns everything).
ROLES = ("app", "worker", "maintenance", "operator", "reader")

#: The functions each role may execute: the lists of roles.sql its block grants.
LISTS = {
    "app": ("producer_functions", "app_functions"),
    "worker": ("producer_functions", "read_functions", "worker_functions"),
    "maintenance": (
        "producer_functions",
        "read_functions",
        "worker_functions",
        "maintenance_functions",
    ),
    "operator": ("read_functions", "operator_functions"),
    "reader": ("read_functions",),
}

#: Functions a role may call that run with the caller's privileges, and why: the two that the
#: views call (they only read, and run once per lane or per statement), and the two that end
#: other sessions, which must happen with the caller's pg_signal_backend, not the owner's.
INVOKER = {"lane_cursor_v1", "_queue_names_v1", "leader_takeover_v1", "flow_reap_v1"}

#: The tables the application role may read: control tables without job data.
APP_READS = {"queue_lanes", "runtime_instances"}

SEARCH_PATH = "search_path=pg_catalog, pg_temp"


def _allowed(kind: str) -> set[str]:
    return {name for group in LISTS[kind] for name in function_names(group)}


def _relations(conn: psycopg.Connection[Any], kinds: str) -> list[tuple[str, str, str]]:
    """(name, relkind, first column) of every relation of the awa schema of these relkinds."""
    rows = conn.execute(
        "SELECT c.relname, c.relkind::text, "
        "       (SELECT a.attname FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 "
        "        AND NOT a.attisdropped ORDER BY a.attnum LIMIT 1) "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'awa' AND c.relkind = ANY (%s) ORDER BY c.relname",
        [list(kinds)],
    ).fetchall()
    return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


def _functions(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, bool, list[str]]]:
    """Every awa function: name -> (oid, SECURITY DEFINER, proconfig)."""
    rows = conn.execute(
        "SELECT p.proname, p.oid, p.prosecdef, COALESCE(p.proconfig, '{}') FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'awa'"
    ).fetchall()
    return {str(r[0]): (int(r[1]), bool(r[2]), list(r[3])) for r in rows}


# Tables, partitions, views and sequences -------------------------------------------------------


@pytest.mark.parametrize("kind", ROLES)
def test_every_write_to_every_table_and_partition_is_refused(roles_db: RolesDB, kind: str) -> None:
    with roles_db.connect("owner") as owner:
        tables = _relations(owner, "rp")
    assert len(tables) > 60  # the rings' partitions are in the loop
    with roles_db.connect(kind) as conn:
        for name, _, column in tables:
            table = sql.Identifier("awa", name)
            col = sql.Identifier(column)
            refused(conn, sql.SQL("INSERT INTO {} DEFAULT VALUES").format(table))
            refused(conn, sql.SQL("UPDATE {} SET {} = {} WHERE false").format(table, col, col))
            refused(conn, sql.SQL("DELETE FROM {} WHERE false").format(table))
            refused(conn, sql.SQL("TRUNCATE {}").format(table))
            refused(conn, sql.SQL("COPY {} ({}) FROM STDIN").format(table, col))


@pytest.mark.parametrize("kind", ROLES)
def test_no_role_may_lock_rows_or_take_a_table_lock_stronger_than_a_read(
    roles_db: RolesDB, kind: str
) -> None:
    # A claim locks its lane row FOR UPDATE SKIP LOCKED; a prune takes ACCESS EXCLUSIVE on a
    # slot. A role that could lock lane rows or a partition would stall either for as long as
    # its transaction lasts.
    with roles_db.connect("owner") as owner:
        tables = _relations(owner, "rp")
    modes = ("ROW SHARE", "ROW EXCLUSIVE", "SHARE", "EXCLUSIVE", "ACCESS EXCLUSIVE")
    with roles_db.connect(kind) as conn:
        refused(conn, "SELECT 1 FROM awa.queue_lanes FOR UPDATE")
        refused(conn, "SELECT 1 FROM awa.queue_lanes FOR KEY SHARE")
        for name, _, _ in tables:
            for mode in modes:
                with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
                    conn.execute(
                        sql.SQL("LOCK TABLE {} IN {} MODE").format(
                            sql.Identifier("awa", name), sql.SQL(mode)
                        )
                    )


@pytest.mark.parametrize("kind", ROLES)
def test_no_view_or_table_grants_a_write_and_the_schema_grants_no_create(
    roles_db: RolesDB, kind: str
) -> None:
    with roles_db.connect("owner") as owner:
        relations = _relations(owner, "rpvS")
        role = roles_db.names[kind]
        writable = owner.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'awa' AND ("
            "  has_table_privilege(%(r)s, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE, TRIGGER, "
            "REFERENCES') OR (c.relkind = 'S' AND has_sequence_privilege(%(r)s, c.oid, "
            "'USAGE, UPDATE')))",
            {"r": role},
        ).fetchall()
        may_create = owner.execute(
            "SELECT has_schema_privilege(%s, 'awa', 'CREATE')", [role]
        ).fetchone()
        owns = owner.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'awa' AND pg_get_userbyid(c.relowner) = %s",
            [role],
        ).fetchone()
    assert {kind for _, kind, _ in relations} == {"r", "p", "v", "S"}
    assert writable == []
    assert may_create == (False,)
    assert owns == (0,)


@pytest.mark.parametrize("kind", ROLES)
def test_no_role_may_advance_or_set_a_sequence(roles_db: RolesDB, kind: str) -> None:
    enqueue = "SELECT awa.ensure_lanes_v1('catalog-lanes', 0, 1)"
    with roles_db.connect("owner") as owner:
        owner.execute(enqueue)  # a lane sequence made at run time, by the owner's default ACL
        sequences = [name for name, _, _ in _relations(owner, "S")]
    assert "job_id_seq" in sequences and any(s.startswith("lane_seq_") for s in sequences)
    with roles_db.connect(kind) as conn:
        for name in sequences:
            qualified = f"awa.{name}"
            refused(conn, "SELECT nextval(%s::regclass)", [qualified])
            refused(conn, "SELECT setval(%s::regclass, 1)", [qualified])


def test_the_application_reads_two_control_tables_and_no_job(roles_db: RolesDB) -> None:
    with roles_db.connect("owner") as owner:
        relations = _relations(owner, "rpvS")
        readable = {
            str(r[0])
            for r in owner.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'awa' AND has_table_privilege(%s, c.oid, 'SELECT')",
                [roles_db.names["app"]],
            )
        }
    assert readable == APP_READS
    with roles_db.connect("app") as app:
        for name, _, _ in relations:
            if name not in APP_READS:
                refused(
                    app, sql.SQL("SELECT 1 FROM {} LIMIT 1").format(sql.Identifier("awa", name))
                )


@pytest.mark.parametrize("kind", ("worker", "maintenance", "operator", "reader"))
def test_the_other_roles_read_every_table_view_and_sequence(roles_db: RolesDB, kind: str) -> None:
    with roles_db.connect("owner") as owner:
        relations = _relations(owner, "rpvS")
    with roles_db.connect(kind) as conn:
        for name, _, _ in relations:
            conn.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(sql.Identifier("awa", name)))


# Functions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ROLES)
def test_each_role_may_execute_exactly_the_functions_of_its_lists(
    roles_db: RolesDB, kind: str
) -> None:
    with roles_db.connect("owner") as owner:
        rows = owner.execute(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'awa' AND has_function_privilege(%s, p.oid, 'EXECUTE')",
            [roles_db.names[kind]],
        ).fetchall()
    assert {str(r[0]) for r in rows} == _allowed(kind)


@pytest.mark.parametrize("kind", ROLES)
def test_functions_outside_a_roles_lists_are_refused(roles_db: RolesDB, kind: str) -> None:
    with roles_db.connect(kind) as conn:
        for name, statement in (
            ("dlq_purge_v1", "SELECT awa.dlq_purge_v1(ARRAY[1]::bigint[])"),
            ("prune_v1", "SELECT awa.prune_v1('claim')"),
            ("claim_v3", "SELECT * FROM awa.claim_v3('catalog-q', 1)"),
            ("enqueue_v1", 'SELECT * FROM awa.enqueue_v1(\'[{"kind": "k"}]\')'),
            ("reserve_v1", "SELECT * FROM awa.reserve_v1('{}', '{}', '{}', 0)"),
            ("_lane_for_v1", "SELECT awa._lane_for_v1('q', 0, true)"),
        ):
            if name not in _allowed(kind):
                refused(conn, statement)


def test_public_may_execute_no_awa_function(roles_db: RolesDB) -> None:
    with roles_db.connect("owner") as owner:
        rows = owner.execute(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'awa' AND EXISTS ("
            "  SELECT 1 FROM aclexplode(COALESCE(p.proacl, acldefault('f', p.proowner))) a "
            "  WHERE a.grantee = 0)"
        ).fetchall()
    assert rows == []


def test_what_a_role_calls_runs_as_the_owner_with_a_fixed_search_path(
    roles_db: RolesDB,
) -> None:
    granted = {name for kind in ROLES for name in _allowed(kind)}
    with roles_db.connect("owner") as owner:
        functions = _functions(owner)
        super_owner = owner.execute(
            "SELECT r.rolsuper FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner "
            "WHERE n.nspname = 'awa'"
        ).fetchone()
    assert super_owner == (False,)
    assert granted <= set(functions), granted - set(functions)
    for name in sorted(granted - INVOKER):
        _, definer, config = functions[name]
        assert definer, f"awa.{name} is granted to a role and runs with its privileges"
    for name in sorted(INVOKER):
        assert not functions[name][1], f"awa.{name} should run with the caller's privileges"
    # Every function that runs as the owner, granted or not, names its search_path.
    for name, (_, definer, config) in sorted(functions.items()):
        if definer:
            assert SEARCH_PATH in config, f"awa.{name}: {config}"


def test_the_read_functions_run_without_jit(roles_db: RolesDB) -> None:
    # An operator's psql session with JIT on: these compile nothing, whatever the session says
    # (the views themselves cannot carry a setting: see docs/roles.md).
    with roles_db.connect("owner") as owner:
        functions = _functions(owner)
    reads = set(function_names("read_functions")) - INVOKER
    assert {"job_v1", "job_list_v1", "queue_stats_v1", "queue_counts_v1"} <= reads
    for name in sorted(reads):
        assert "jit=off" in functions[name][2], f"awa.{name}: {functions[name][2]}"


def test_every_listed_function_exists_once(roles_db: RolesDB) -> None:
    # roles.sql grants by name alone: each name must have exactly one signature.
    names = [n for group in LISTS["maintenance"] + LISTS["operator"] + LISTS["app"] for n in
             function_names(group)]  # fmt: skip
    with roles_db.connect("owner") as owner:
        counts = dict(
            owner.execute(
                "SELECT p.proname::text, count(*) FROM pg_proc p JOIN pg_namespace n "
                "ON n.oid = p.pronamespace WHERE n.nspname = 'awa' AND p.proname = ANY (%s) "
                "GROUP BY 1",
                [names],
            ).fetchall()
        )
    assert counts == {name: 1 for name in names}
