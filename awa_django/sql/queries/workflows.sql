-- Statements of workflows and batches (awa_django/workflows.py).

-- name: workflow_enqueue
SELECT workflow_id, step, job_id, state FROM awa.workflow_enqueue_v1(%s::jsonb, %s::jsonb)

-- name: workflow_get
SELECT workflow_id, name, kind, state, steps, completed, failed, cancelled, skipped,
       created_at, finished_at
FROM awa.workflow_v1(%s)

-- name: workflow_list
SELECT workflow_id AS id, name, kind, state, steps, completed, failed, cancelled, skipped,
       created_at, finished_at
FROM awa.workflows_v1(%s, %s, %s)

-- name: workflow_counts
SELECT kind, state, n FROM awa.workflow_counts_v1()

-- name: workflow_steps
SELECT step, job_id, kind, queue, on_failure, state, after FROM awa.workflow_steps_v1(%s, %s)

-- name: workflow_results
SELECT step, job_id, state, result FROM awa.workflow_results_v1(%s, %s::text[])

-- name: workflow_upstream
SELECT step, job_id, state, result FROM awa.workflow_upstream_v1(%s, %s, %s)

-- name: workflow_upstream_result
SELECT awa.workflow_upstream_result_v1(%s, %s)

-- name: workflow_of
SELECT workflow_id, name, kind, step FROM awa.workflow_of_v1(%s)

-- name: workflow_cancel
SELECT awa.workflow_cancel_v1(%s, %s)

-- name: workflow_retry
SELECT job_id FROM awa.workflow_retry_v1(%s) AS r(job_id)

-- name: job_outcome
-- A job's state and, once it ended, its result and errors (the waits of awa_django.workflows).
SELECT state, result, errors, in_dlq FROM awa.job_v1(%s)

-- name: listen_done
LISTEN awa_done

-- name: unlisten_done
UNLISTEN awa_done
