-- Statements of the django.tasks backend (awa_django/backends/).

-- name: task_row
-- A task as get_result shows it, with [attempt, worker_id] of each claim still in the claim
-- ring: awa.job_v1, which an application role may call (docs/roles.md).
SELECT kind, state, args, attempt, created_at, attempted_at, finalized_at, errors, result,
       progress, claims
FROM awa.job_v1(%s)

-- name: task_enqueued_at
-- When a task that was just enqueued (available or scheduled) was written, on the database clock.
SELECT awa.job_enqueued_at_v1(%s)

-- name: task_attempt
-- A running task attempt (job id, run lease): when the task was enqueued, the errors of its earlier
-- attempts, when this attempt was claimed, and [attempt, worker_id] of each claim of the job.
SELECT r.created_at, r.errors, c.claimed_at,
       (SELECT jsonb_agg(jsonb_build_array(k.attempt, k.worker_id) ORDER BY k.run_lease)
        FROM awa.claims k WHERE k.job_id = c.job_id)
FROM awa.claims c
JOIN awa.ready_entries r
  ON r.lane_id = c.lane_id AND r.lane_seq = c.lane_seq AND r.ready_slot = c.ready_slot
WHERE c.job_id = %s AND c.run_lease = %s
LIMIT 1
