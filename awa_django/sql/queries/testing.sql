-- Statements of awa_django.testing (docs/testing.md): the test kit reads and moves jobs through
-- the test's own Django connection, inside its transaction.

-- name: testing_waiting_jobs
-- The jobs waiting to run (available, scheduled, retryable), oldest first, of the given queues
-- (NULL: every queue).
SELECT j.id, j.kind, j.queue, j.state, j.priority, j.attempt, j.max_attempts, j.args, j.run_at,
       j.tags, j.metadata
FROM awa.live_jobs j
WHERE j.state IN ('available', 'scheduled', 'retryable')
  AND (%(queues)s::text[] IS NULL OR j.queue = ANY (%(queues)s::text[]))
ORDER BY j.id

-- name: testing_make_due
-- drain(with_scheduled=True): the scheduled and retryable jobs of the queues (and kinds: NULL,
-- every kind) become due now.
UPDATE awa.deferred_jobs SET run_at = now()
WHERE queue = ANY (%(queues)s::text[]) AND run_at > now()
  AND (%(kinds)s::text[] IS NULL OR kind = ANY (%(kinds)s::text[]))

-- name: testing_due
-- drain(): the deferred jobs of the queues that are due by the wall clock (a test's
-- transaction keeps the time it began as now()) become due now.
UPDATE awa.deferred_jobs SET run_at = now()
WHERE queue = ANY (%(queues)s::text[]) AND run_at > now() AND run_at <= clock_timestamp()
  AND (%(kinds)s::text[] IS NULL OR kind = ANY (%(kinds)s::text[]))
