-- The read surfaces of the awa schema (docs/storage.md, "Read surfaces"): each costs what the
-- live planes hold plus bounded index ranges of history, never a scan of retained history.

-- Read surfaces ---------------------------------------------------------------------------------

-- Terminal facts hydrated with their retained bodies.
--
-- Terminal facts hydrated with their retained bodies, with the body read by one
-- primary-key probe of the done row's ready row (in its own partition), whatever the
-- statistics say: with statistics of empty partitions the planner estimated a lookup by id at
-- 0.5 % of history and hashed every retained ready row to hydrate it. Newest first, by outcome,
-- by queue, by kind and by finished time are index ranges of done_entries (the indexes above).
CREATE OR REPLACE VIEW awa.terminal_jobs AS
SELECT d.job_id AS id,
       d.kind,
       d.queue,
       d.state,
       COALESCE(d.priority, r.priority) AS priority,
       d.attempt,
       COALESCE(d.max_attempts, r.max_attempts) AS max_attempts,
       d.run_lease,
       COALESCE(d.args, r.args) AS args,
       COALESCE(d.run_at, r.run_at) AS run_at,
       COALESCE(d.created_at, r.created_at) AS created_at,
       d.attempted_at,
       d.finalized_at,
       COALESCE(d.errors, r.errors) AS errors,
       d.result,
       d.progress,
       COALESCE(d.metadata, r.metadata) AS metadata,
       COALESCE(d.tags, r.tags) AS tags,
       d.ready_slot,
       d.ready_generation
FROM awa.done_entries d
LEFT JOIN LATERAL (
    SELECT e.kind, e.priority, e.max_attempts, e.args, e.run_at, e.created_at, e.errors,
           e.metadata, e.tags, random() AS plan_fence
    FROM awa.ready_entries e
    WHERE e.lane_id = d.lane_id AND e.lane_seq = d.lane_seq AND e.ready_slot = d.ready_slot
) r ON true;

CREATE OR REPLACE VIEW awa.live_jobs AS
SELECT r.job_id AS id, r.kind, l.queue, 'available'::text AS state, r.priority, r.attempt,
       r.max_attempts, r.run_lease, r.args, r.run_at, r.created_at,
       NULL::timestamptz AS attempted_at, NULL::timestamptz AS finalized_at,
       NULL::timestamptz AS deadline_at, NULL::timestamptz AS heartbeat_at,
       r.errors, NULL::jsonb AS result, r.progress, r.metadata, r.tags,
       false AS in_dlq, NULL::text AS dlq_reason
FROM awa.queue_lanes l
CROSS JOIN LATERAL (
    SELECT e.job_id, e.kind, e.priority, e.attempt, e.max_attempts, e.run_lease, e.args,
           e.run_at, e.created_at, e.errors, e.progress, e.metadata, e.tags,
           random() AS plan_fence
    FROM awa.ready_entries e
    WHERE e.lane_id = l.lane_id
      AND e.lane_seq > (SELECT awa.lane_cursor_v1(l.lane_id))
      AND e.lane_seq <= (SELECT max(x.lane_seq) FROM awa.ready_entries x
                         WHERE x.lane_id = l.lane_id)
      AND NOT EXISTS (
          SELECT 1 FROM awa.ready_tombstones t
          WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.ready_slot = e.ready_slot)
) r
UNION ALL
SELECT c.job_id, r.kind, l.queue, 'running', r.priority, c.attempt, r.max_attempts, c.run_lease,
       r.args, r.run_at, r.created_at, c.claimed_at, NULL, c.deadline_at, s.heartbeat_at,
       r.errors, NULL, COALESCE(s.progress, r.progress), r.metadata, r.tags, false, NULL
FROM (
    SELECT c.job_id, c.run_lease, c.lane_id, c.lane_seq, c.ready_slot, c.attempt, c.claimed_at,
           c.deadline_at, random() AS plan_fence
    FROM awa.claims c
    WHERE NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot)
      AND NOT EXISTS (
              SELECT 1 FROM awa.leases ls
              WHERE ls.job_id = c.job_id AND ls.run_lease = c.run_lease
                AND ls.state = 'waiting_external')
) c
JOIN awa.queue_lanes l ON l.lane_id = c.lane_id
CROSS JOIN LATERAL (
    SELECT e.kind, e.priority, e.max_attempts, e.args, e.run_at, e.created_at, e.errors,
           e.progress, e.metadata, e.tags, random() AS plan_fence
    FROM awa.ready_entries e
    WHERE e.lane_id = c.lane_id AND e.lane_seq = c.lane_seq AND e.ready_slot = c.ready_slot
) r
LEFT JOIN awa.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
UNION ALL
SELECT c.job_id, r.kind, l.queue, 'waiting_external', r.priority, c.attempt, r.max_attempts,
       c.run_lease, r.args, r.run_at, r.created_at, c.claimed_at, NULL, c.deadline_at,
       s.heartbeat_at, r.errors, NULL, COALESCE(s.progress, r.progress), r.metadata, r.tags,
       false, NULL
FROM (SELECT DISTINCT ls.job_id, ls.run_lease FROM awa.leases ls
      WHERE ls.state = 'waiting_external') w
JOIN awa.claims c ON c.job_id = w.job_id AND c.run_lease = w.run_lease
JOIN awa.queue_lanes l ON l.lane_id = c.lane_id
CROSS JOIN LATERAL (
    SELECT e.kind, e.priority, e.max_attempts, e.args, e.run_at, e.created_at, e.errors,
           e.progress, e.metadata, e.tags, random() AS plan_fence
    FROM awa.ready_entries e
    WHERE e.lane_id = c.lane_id AND e.lane_seq = c.lane_seq AND e.ready_slot = c.ready_slot
) r
LEFT JOIN awa.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
WHERE NOT EXISTS (
          SELECT 1 FROM awa.claim_closures z
          WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease AND z.claim_slot = c.claim_slot)
UNION ALL
SELECT d.job_id, d.kind, d.queue, d.state, d.priority, d.attempt, d.max_attempts, d.run_lease,
       d.args, d.run_at, d.created_at, d.attempted_at, NULL, NULL, NULL, d.errors, NULL,
       d.progress, d.metadata, d.tags, false, NULL
FROM awa.deferred_jobs d
UNION ALL
SELECT w.job_id, w.kind, w.queue, 'available', w.priority, w.attempt, w.max_attempts,
       w.run_lease, w.args, w.run_at, w.created_at, NULL, NULL, NULL, NULL, w.errors, NULL,
       w.progress, w.metadata, w.tags, false, NULL
FROM awa.serial_waiting w
UNION ALL
SELECT w.job_id, w.kind, w.queue, 'available', w.priority, w.attempt, w.max_attempts,
       w.run_lease, w.args, w.run_at, w.created_at, NULL, NULL, NULL, NULL, w.errors, NULL,
       w.progress, w.metadata, w.tags, false, NULL
FROM awa.flow_waiting w
UNION ALL
-- Workflow steps waiting for their dependencies: scheduled (run_at: when they were enqueued,
-- or the time they asked for).
SELECT w.job_id, w.kind, w.queue, 'scheduled', w.priority, 0::smallint, w.max_attempts,
       0::bigint, w.args, COALESCE(w.run_at, w.created_at), w.created_at, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, w.metadata, w.tags, false, NULL
FROM awa.workflow_waiting w;

-- One row per job across every plane. state is one of scheduled, available, running,
-- waiting_external, retryable, completed, failed, cancelled; dead-lettered jobs show as failed
-- with in_dlq = true.
CREATE OR REPLACE VIEW awa.jobs AS
SELECT * FROM awa.live_jobs
UNION ALL
SELECT t.id, t.kind, t.queue, t.state, t.priority, t.attempt, t.max_attempts, t.run_lease,
       t.args, t.run_at, t.created_at, t.attempted_at, t.finalized_at, NULL, NULL, t.errors,
       t.result, t.progress, t.metadata, t.tags, false, NULL
FROM awa.terminal_jobs t
UNION ALL
SELECT q.job_id, q.kind, q.queue, 'failed', q.priority, q.attempt, q.max_attempts, q.run_lease,
       q.args, q.run_at, q.created_at, q.attempted_at, q.dlq_at, NULL, NULL, q.errors, NULL,
       q.progress, q.metadata, q.tags, true, q.dlq_reason
FROM awa.dlq_entries q;

-- Current cursor of every ring.
CREATE OR REPLACE VIEW awa.ring_state AS
SELECT g.ring, g.slot_count, c.slot AS current_slot, c.generation, c.rotated_at
FROM awa.rings g
CROSS JOIN LATERAL (
    SELECT r.slot, r.generation, r.rotated_at FROM awa.ring_rotations r
    WHERE r.ring = g.ring ORDER BY r.generation DESC LIMIT 1) c;


-- Schedules as operators see them: the row, now() on the database clock, and the state of
-- the last job a schedule enqueued (NULL once it left history), one index probe per schedule.
CREATE OR REPLACE VIEW awa.cron_schedule_status AS
SELECT c.name, c.kind, c.cron_expr, c.timezone, c.catch_up, c.queue, c.priority,
       c.max_attempts, c.args, c.metadata, c.tags, c.fire_after, c.last_fire_at, c.last_job_id,
       j.state AS last_job_state, c.paused_at IS NULL AS enabled, c.paused_at, c.paused_by,
       c.created_at, c.updated_at
FROM awa.cron_schedules c
LEFT JOIN LATERAL (SELECT s.state FROM awa.jobs s WHERE s.id = c.last_job_id LIMIT 1) j ON true;

-- Read surface --------------------------------------------------------------------------------

-- The attempts parked now, waiting for their callback: one row per job (a job has at most one
-- open attempt). timeout_at is when rescue will take it ("callback timed out"); resume tells
-- whether a result resumes the job (WaitForCallback(resume=True)) or completes it.
CREATE OR REPLACE VIEW awa.callback_waits AS
SELECT w.job_id, w.run_lease, w.callback_id, w.parked_at, w.timeout_at,
       COALESCE(s.callback_resume, false) AS resume, c.attempt, r.kind, l.queue, r.priority,
       r.max_attempts, r.created_at, r.metadata, COALESCE(s.progress, r.progress) AS progress
FROM (
    SELECT ls.job_id, ls.run_lease, (array_agg(ls.callback_id))[1] AS callback_id,
           min(ls.created_at) AS parked_at, min(ls.callback_timeout_at) AS timeout_at
    FROM awa.leases ls
    WHERE ls.state = 'waiting_external'
    GROUP BY ls.job_id, ls.run_lease
) w
CROSS JOIN LATERAL (
    SELECT c.attempt, c.lane_id, c.lane_seq, c.ready_slot FROM awa.claims c
    WHERE c.job_id = w.job_id AND c.run_lease = w.run_lease
      AND NOT EXISTS (
          SELECT 1 FROM awa.claim_closures z
          WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
            AND z.claim_slot = c.claim_slot)
    LIMIT 1
) c
JOIN awa.queue_lanes l ON l.lane_id = c.lane_id
JOIN awa.ready_entries r
  ON r.lane_id = c.lane_id AND r.lane_seq = c.lane_seq AND r.ready_slot = c.ready_slot
LEFT JOIN awa.attempt_state s ON s.job_id = w.job_id AND s.run_lease = w.run_lease;

-- Workflows and batches as the admin lists them (awa.workflow_v1 for one).
CREATE OR REPLACE VIEW awa.workflow_status AS
SELECT w.workflow_id AS id, w.name, w.kind,
       CASE WHEN w.finished_at IS NULL THEN 'running'
            WHEN w.failed + w.cancelled = 0 THEN 'completed' ELSE 'failed' END AS state,
       w.steps, w.completed, w.failed, w.cancelled, w.skipped, w.created_at, w.finished_at
FROM awa.workflows w;
