-- Functions that development versions of awa_django installed and nothing calls any more: a
-- database migrated before the settled schema drops them here (elsewhere this does nothing).
DROP FUNCTION IF EXISTS awa.claim_v1(text, integer, uuid, double precision, double precision);
DROP FUNCTION IF EXISTS awa.claim_v2(text, integer, uuid, double precision, double precision);
DROP FUNCTION IF EXISTS awa.queues_idle_v1(text[]);
DROP FUNCTION IF EXISTS awa._backoff_v1(integer, double precision);
DROP FUNCTION IF EXISTS awa._flow_unpark_v1(text, integer, integer[]);
DROP FUNCTION IF EXISTS awa.callback_resolve_v1(uuid, jsonb, jsonb, boolean, double precision);
DROP FUNCTION IF EXISTS awa.queues_ready_v1(text[]);
DROP FUNCTION IF EXISTS awa.queue_minutes_v1(text, integer);
DROP FUNCTION IF EXISTS awa._queue_minute_outcomes_v1(timestamptz);
DROP FUNCTION IF EXISTS awa._history_counts_v1(integer, integer);
