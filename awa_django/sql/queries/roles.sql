-- Statements of manage.py awa_roles (awa_django.db.roles): what the grant script needs to know
-- about the database it is for.

-- name: roles_schema
-- The database, the owner of the awa schema and whether it is a superuser (no row: the schema
-- does not exist).
SELECT current_database(), r.rolname, r.rolsuper
FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner
WHERE n.nspname = 'awa'

-- name: roles_ring_partitions
-- The children of the ring tables named by the parameter (awa.prune_v1 truncates them).
SELECT c.relname
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
JOIN pg_namespace n ON n.oid = p.relnamespace
WHERE n.nspname = 'awa' AND p.relname = ANY (%s)
ORDER BY c.relname
