-- Unapplies awa_django migration 0014 (sql/migrations/0014_drain.sql), before RunAwaSQL drops
-- the function that file created (awa.queues_idle_v2): finalize_v2 plans as before.

ALTER FUNCTION awa.finalize_v2(jsonb) RESET enable_seqscan;
