-- Statements used by awa_django.operations.

-- name: cancel
SELECT awa.cancel_v1(%s, %s)

-- name: dlq_retry
SELECT job_id FROM awa.dlq_retry_v1(%s::bigint[], %s, %s) AS job_id

-- name: dlq_purge
SELECT job_id FROM awa.dlq_purge_v1(%s::bigint[]) AS job_id

-- name: task_result
SELECT kind, state, args, attempt, created_at, attempted_at, finalized_at, errors, result
FROM awa.jobs WHERE id = %s

-- name: task_workers
SELECT worker_id FROM awa.claims WHERE job_id = %s ORDER BY run_lease

-- name: callback_resolve
SELECT awa.callback_resolve_v1(%s::uuid, %s::jsonb, %s::jsonb, %s)
