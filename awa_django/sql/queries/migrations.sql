-- Statements used by awa_django.db.migration.RunAwaSQL.

-- name: migration_lock
-- Serialises concurrent `migrate` runs for the awa schema until the transaction ends. Class
-- 4282180 is the migrations' own key space (tables.sql lists every class).
SELECT pg_advisory_xact_lock(4282180, 0)

-- name: migrations_table_exists
-- From the catalog: to_regclass would raise for a schema this role may not use.
SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = 'awa' AND c.relname = 'schema_migrations')

-- name: migration_schema_usable
SELECT has_schema_privilege('awa', 'USAGE')

-- name: migration_may_lock
-- Whether this role may take advisory locks (awa_roles --lock-advisory takes them from PUBLIC).
SELECT has_function_privilege('pg_catalog.pg_advisory_xact_lock(integer, integer)', 'EXECUTE')

-- name: migration_schema_searched
-- Whether the schema, just created, is on this connection's search_path as the server reads it.
SELECT 'awa' = ANY (current_schemas(false))

-- name: migration_applied
SELECT EXISTS (SELECT 1 FROM awa.schema_migrations WHERE name = %s)

-- name: migration_record
-- installed_for: the schema of the Django project's own django_migrations table (through its
-- search_path), which tells one project's installation from another's.
INSERT INTO awa.schema_migrations (name, installed_for)
VALUES (%s, (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.oid = to_regclass('django_migrations')))

-- name: migration_project
-- The schema of this Django project's django_migrations table (NULL: none yet).
SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass('django_migrations')

-- name: migration_installed_for
-- The project a migration was recorded for (NULL: not recorded, or by a version that did not
-- say). Read through to_jsonb: a database of a development version has no such column.
SELECT to_jsonb(m) ->> 'installed_for' FROM awa.schema_migrations m WHERE m.name = %s

-- name: migration_schema_keyword
-- Whether the schema's name is an SQL keyword of this server that cannot qualify a type name.
SELECT EXISTS (SELECT 1 FROM pg_get_keywords() k WHERE k.catcode <> 'U' AND k.word = 'awa')

-- name: migration_schema_on_search_path
-- Whether the schema would be on this connection's search_path (by name, or as "$user"), so
-- that Django would create its own tables in it. Unquoted entries are folded to lower case, as
-- the server folds them; migration_schema_searched asks the server itself once it exists.
SELECT EXISTS (
    SELECT 1
    FROM unnest(string_to_array(current_setting('search_path'), ',')) AS p (entry)
    CROSS JOIN LATERAL (SELECT btrim(p.entry) AS e) t
    CROSS JOIN LATERAL (
        SELECT CASE WHEN t.e LIKE '"%"' THEN replace(substr(t.e, 2, length(t.e) - 2), '""', '"')
                    ELSE lower(t.e) END AS name) n
    WHERE n.name = 'awa' OR (n.name = '$user' AND current_user = 'awa'))

-- name: migration_queue_schemas
-- Every schema of this database that holds an awa_django queue (any AWA["SCHEMA"]).
SELECT n.nspname FROM pg_namespace n
WHERE EXISTS (SELECT 1 FROM pg_class c
              WHERE c.relnamespace = n.oid AND c.relname = 'schema_migrations')
  AND EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'ready_entries')
ORDER BY n.nspname

-- name: migration_forget
DELETE FROM awa.schema_migrations WHERE name = %s

-- name: schema_exists
SELECT to_regnamespace('awa') IS NOT NULL

-- name: schema_drop
DROP SCHEMA IF EXISTS awa CASCADE

-- name: migration_drop_created
-- Unapplies a migration's schema files: drops the views they created (named in {views}, latest
-- first, so that a view goes before those it reads), then their triggers ({triggers}, on the
-- tables {trigger_tables}), then their functions ({functions}): ARRAY literals of names
-- RunAwaSQL read from the files and validated. Nothing CASCADEs: an object of the user's that
-- depends on one of them stops the migration (SQLSTATE 2BP01, nothing dropped) instead of
-- vanishing with it. Tables and their rows stay.
DO $awa$
DECLARE
    v_name text;
    v_triggers text[] := {triggers};
    v_tables text[] := {trigger_tables};
BEGIN
    FOREACH v_name IN ARRAY {views} LOOP
        EXECUTE format('DROP VIEW IF EXISTS awa.%I', v_name);
    END LOOP;
    FOR i IN 1..COALESCE(cardinality(v_triggers), 0) LOOP
        IF to_regclass(format('awa.%I', v_tables[i])) IS NOT NULL THEN
            EXECUTE format('DROP TRIGGER IF EXISTS %I ON awa.%I', v_triggers[i], v_tables[i]);
        END IF;
    END LOOP;
    FOREACH v_name IN ARRAY ARRAY(
        SELECT p.oid::regprocedure::text FROM pg_proc p
        WHERE p.pronamespace = to_regnamespace('awa') AND p.proname = ANY ({functions})
    ) LOOP
        EXECUTE 'DROP FUNCTION IF EXISTS ' || v_name;
    END LOOP;
END
$awa$
