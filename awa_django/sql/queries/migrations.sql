-- Statements used by awa_django.db.migration.RunAwaSQL.

-- name: migration_lock
-- Serialises concurrent `migrate` runs for the awa schema until the transaction ends. Class
-- 4282180 is the migrations' own key space (0002_functions.sql lists every class).
SELECT pg_advisory_xact_lock(4282180, 0)

-- name: migrations_table_exists
SELECT to_regclass('awa.schema_migrations') IS NOT NULL

-- name: migration_applied
SELECT EXISTS (SELECT 1 FROM awa.schema_migrations WHERE name = %s)

-- name: migration_record
INSERT INTO awa.schema_migrations (name) VALUES (%s)

-- name: migration_forget
DELETE FROM awa.schema_migrations WHERE name = %s

-- name: schema_exists
SELECT to_regnamespace('awa') IS NOT NULL

-- name: schema_drop
DROP SCHEMA IF EXISTS awa CASCADE

-- name: migration_drop_created
-- Unapplies a functions file: drops the views it created (named in {views}, latest first, so
-- that a view goes before those it reads), then its functions (named in {functions}): ARRAY
-- literals of names RunAwaSQL read from the file and validated. Nothing CASCADEs: an object of
-- the user's that depends on one of them stops the migration (SQLSTATE 2BP01, nothing dropped)
-- instead of vanishing with it. Tables and their rows stay.
DO $awa$
DECLARE
    v_name text;
BEGIN
    FOREACH v_name IN ARRAY {views}::text[] LOOP
        EXECUTE format('DROP VIEW IF EXISTS awa.%I', v_name);
    END LOOP;
    FOREACH v_name IN ARRAY ARRAY(
        SELECT p.oid::regprocedure::text FROM pg_proc p
        WHERE p.pronamespace = to_regnamespace('awa') AND p.proname = ANY ({functions}::text[])
    ) LOOP
        EXECUTE 'DROP FUNCTION IF EXISTS ' || v_name;
    END LOOP;
END
$awa$
