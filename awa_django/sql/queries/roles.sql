-- Statements of manage.py awa_roles (awa_django.db.roles): what the grant script needs to know
-- about the database it is for.

-- name: roles_schema
-- The database, the owner of the awa schema and whether it is a superuser (no row: the schema
-- does not exist).
SELECT current_database(), r.rolname, r.rolsuper
FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner
WHERE n.nspname = 'awa'

-- name: roles_other_queues
-- The other awa_django queues of this database (other AWA["SCHEMA"]s) and their owners.
SELECT n.nspname, r.rolname
FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner
WHERE n.nspname <> 'awa'
  AND EXISTS (SELECT 1 FROM pg_class c
              WHERE c.relnamespace = n.oid AND c.relname = 'schema_migrations')
  AND EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'ready_entries')
ORDER BY n.nspname
