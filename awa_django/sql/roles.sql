-- The grants of `manage.py awa_roles` (docs/roles.md): one block per role, printed or run in
-- this order for the roles named on the command line. Each block first takes back what the
-- role may hold on the awa schema, then grants what it needs, so running the script again
-- (after a migrate, or on a database where the role had wider grants) converges.
--
-- The placeholders in braces are role names and the database name, validated and quoted as
-- identifiers by awa_django.db.roles (psycopg.sql.Identifier), the list of ring partitions
-- read from the catalog (quoted the same way) and the entry_points block below. Nothing else is
-- substituted.
--
-- Tables and sequences that later migrations add, and the lane sequences that producers create
-- (awa.ensure_lanes_v1, run as the owner), are covered by default privileges of the owner.

-- name: entry_points
-- The SECURITY DEFINER functions of migrations 0011 and 0012: run as the owner, EXECUTE
-- revoked from PUBLIC, granted to the roles that enqueue or resolve callbacks (and claim:
-- awa.flow_handoff_lane_v1 creates the hand-off lane a claim un-parks jobs into).
FUNCTION awa.ensure_lanes_v1(text, integer, integer),
    awa.flow_handoff_lane_v1(text, integer),
    awa.enqueue_one_v1(text, text, integer, jsonb, integer, timestamptz, double precision,
        double precision, jsonb, text[], jsonb),
    awa.enqueue_one_v2(text, text, integer, jsonb, integer, timestamptz, double precision,
        double precision, jsonb, text[], integer, integer, integer, integer, integer),
    awa.enqueue_one_v3(text, text, integer, jsonb, integer, timestamptz, double precision,
        double precision, jsonb, text[], integer, integer, integer, integer, integer, boolean,
        text, double precision, text[], boolean),
    awa.enqueue_v1(jsonb, jsonb),
    awa.callback_resolve_v2(uuid, jsonb, jsonb, boolean, double precision),
    awa.callback_extend_v1(uuid, double precision),
    awa.callback_receive_v1(uuid, bigint, double precision, text, bytea, jsonb, jsonb, boolean,
        double precision, double precision)

-- name: advisory_functions
-- PostgreSQL's advisory-lock functions (every signature): any role may call them by default.
FUNCTION pg_catalog.pg_advisory_lock(bigint), pg_catalog.pg_advisory_lock(integer, integer),
    pg_catalog.pg_advisory_lock_shared(bigint),
    pg_catalog.pg_advisory_lock_shared(integer, integer),
    pg_catalog.pg_advisory_unlock(bigint), pg_catalog.pg_advisory_unlock(integer, integer),
    pg_catalog.pg_advisory_unlock_shared(bigint),
    pg_catalog.pg_advisory_unlock_shared(integer, integer),
    pg_catalog.pg_advisory_unlock_all(),
    pg_catalog.pg_advisory_xact_lock(bigint), pg_catalog.pg_advisory_xact_lock(integer, integer),
    pg_catalog.pg_advisory_xact_lock_shared(bigint),
    pg_catalog.pg_advisory_xact_lock_shared(integer, integer),
    pg_catalog.pg_try_advisory_lock(bigint), pg_catalog.pg_try_advisory_lock(integer, integer),
    pg_catalog.pg_try_advisory_lock_shared(bigint),
    pg_catalog.pg_try_advisory_lock_shared(integer, integer),
    pg_catalog.pg_try_advisory_xact_lock(bigint),
    pg_catalog.pg_try_advisory_xact_lock(integer, integer),
    pg_catalog.pg_try_advisory_xact_lock_shared(bigint),
    pg_catalog.pg_try_advisory_xact_lock_shared(integer, integer)

-- name: advisory
-- (--lock-advisory; run as a superuser.) awa_django's leader election, lane locks, flow
-- permits and serial keys are advisory locks, which any role may take by default: a session of
-- the app or operator role could hold one for ever (no leader, a stalled queue). In this
-- database only, the functions are taken from PUBLIC and given to the owner and the worker
-- and maintenance roles; the app role takes its locks inside the SECURITY DEFINER entry
-- points (as the owner). Other software in this database that uses advisory locks needs a
-- grant too.
REVOKE EXECUTE ON {advisory_functions} FROM PUBLIC;
GRANT EXECUTE ON {advisory_functions} TO {advisory_roles};

-- name: owner
-- The migration owner runs `manage.py migrate`: it creates the awa schema and owns everything
-- in it, and the entry points run as it. It must not be a superuser (docs/roles.md).
GRANT CONNECT, CREATE ON DATABASE {database} TO {owner};

-- name: app
-- The application: enqueue (a new queue and priority included), resolve callbacks, read job
-- state and results. No INSERT, UPDATE, DELETE or TRUNCATE on any awa table, no CREATE.
GRANT CONNECT ON DATABASE {database} TO {app};
REVOKE CREATE ON SCHEMA awa FROM {app};
GRANT USAGE ON SCHEMA awa TO {app};
REVOKE ALL ON ALL TABLES IN SCHEMA awa FROM {app};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA awa FROM {app};
GRANT SELECT ON ALL TABLES IN SCHEMA awa TO {app};
GRANT SELECT ON ALL SEQUENCES IN SCHEMA awa TO {app};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa GRANT SELECT ON TABLES TO {app};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa GRANT SELECT ON SEQUENCES TO {app};
GRANT EXECUTE ON {entry_points} TO {app};

-- name: worker
-- Workers (`awa_worker --no-maintenance`): claim, heartbeat, finalize, park and resolve
-- callbacks, and enqueue from handlers, through the engine's functions, which run with its
-- privileges: row-level reads and writes of the awa tables. No TRUNCATE (so no prune), no
-- CREATE. LISTEN needs no grant.
GRANT CONNECT ON DATABASE {database} TO {worker};
REVOKE CREATE ON SCHEMA awa FROM {worker};
GRANT USAGE ON SCHEMA awa TO {worker};
REVOKE ALL ON ALL TABLES IN SCHEMA awa FROM {worker};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA awa FROM {worker};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA awa TO {worker};
REVOKE INSERT, UPDATE, DELETE ON awa.schema_migrations FROM {worker};
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA awa TO {worker};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {worker};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa
    GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {worker};
GRANT EXECUTE ON {entry_points} TO {worker};

-- name: maintenance
-- The maintenance leader (`awa_maintenance`, or workers that take part in the election):
-- everything a worker may, plus TRUNCATE of the ring partitions (prune), and nothing else.
GRANT CONNECT ON DATABASE {database} TO {maintenance};
REVOKE CREATE ON SCHEMA awa FROM {maintenance};
GRANT USAGE ON SCHEMA awa TO {maintenance};
REVOKE ALL ON ALL TABLES IN SCHEMA awa FROM {maintenance};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA awa FROM {maintenance};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA awa TO {maintenance};
REVOKE INSERT, UPDATE, DELETE ON awa.schema_migrations FROM {maintenance};
GRANT TRUNCATE ON {ring_partitions} TO {maintenance};
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA awa TO {maintenance};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {maintenance};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa
    GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {maintenance};
GRANT EXECUTE ON {entry_points} TO {maintenance};

-- name: operator
-- A read-only operator (the admin's lists, awa_status, awa_job show, SQL users): SELECT on every
-- awa table, view and sequence. No writes, and no EXECUTE on the entry points, so it cannot
-- enqueue or resolve callbacks either.
GRANT CONNECT ON DATABASE {database} TO {operator};
REVOKE CREATE ON SCHEMA awa FROM {operator};
GRANT USAGE ON SCHEMA awa TO {operator};
REVOKE ALL ON ALL TABLES IN SCHEMA awa FROM {operator};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA awa FROM {operator};
REVOKE EXECUTE ON {entry_points} FROM {operator};
GRANT SELECT ON ALL TABLES IN SCHEMA awa TO {operator};
GRANT SELECT ON ALL SEQUENCES IN SCHEMA awa TO {operator};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa GRANT SELECT ON TABLES TO {operator};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA awa GRANT SELECT ON SEQUENCES TO {operator};
