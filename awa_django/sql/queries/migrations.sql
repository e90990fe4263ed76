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
-- Unapplies a functions file: drops the views, then the functions, that it created (named in
-- {views} and {functions}, ARRAY literals of names RunAwaSQL read from the file and
-- validated). Whatever depends on them goes too (CASCADE); tables and data stay.
DO $awa$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT c.oid::regclass AS obj FROM pg_class c
             WHERE c.relnamespace = to_regnamespace('awa') AND c.relkind = 'v'
               AND c.relname = ANY ({views}::text[]) LOOP
        EXECUTE format('DROP VIEW IF EXISTS %s CASCADE', r.obj);
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS obj FROM pg_proc p
             WHERE p.pronamespace = to_regnamespace('awa')
               AND p.proname = ANY ({functions}::text[]) LOOP
        EXECUTE format('DROP FUNCTION IF EXISTS %s CASCADE', r.obj);
    END LOOP;
END
$awa$
