-- Simple definitions of the read surfaces, which read history without bounds: the reference for
-- the installed views and functions, which read only bounded index ranges of it.
-- tests/storage/test_read_surfaces.py re-creates them as temporary objects and checks that the
-- installed views and functions return the same rows. Test data only: never installed by a
-- migration.

CREATE VIEW awa.terminal_jobs AS
SELECT d.job_id AS id,
       COALESCE(d.kind, r.kind) AS kind,
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
LEFT JOIN awa.ready_entries r
  ON r.lane_id = d.lane_id AND r.lane_seq = d.lane_seq AND r.ready_slot = d.ready_slot;

CREATE VIEW awa.live_jobs AS
SELECT r.job_id AS id, r.kind, r.queue, 'available'::text AS state, r.priority, r.attempt,
       r.max_attempts, r.run_lease, r.args, r.run_at, r.created_at,
       NULL::timestamptz AS attempted_at, NULL::timestamptz AS finalized_at,
       NULL::timestamptz AS deadline_at, NULL::timestamptz AS heartbeat_at,
       r.errors, NULL::jsonb AS result, r.progress, r.metadata, r.tags,
       false AS in_dlq, NULL::text AS dlq_reason
FROM awa.queue_lanes l
CROSS JOIN LATERAL (SELECT awa.lane_cursor_v1(l.lane_id) AS c) k
JOIN awa.ready_entries r ON r.lane_id = l.lane_id AND r.lane_seq > k.c
WHERE NOT EXISTS (
    SELECT 1 FROM awa.ready_tombstones t
    WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.ready_slot = r.ready_slot)
UNION ALL
SELECT c.job_id, r.kind, r.queue,
       CASE WHEN EXISTS (
           SELECT 1 FROM awa.leases ls
           WHERE ls.job_id = c.job_id AND ls.run_lease = c.run_lease
             AND ls.state = 'waiting_external') THEN 'waiting_external' ELSE 'running' END,
       r.priority, c.attempt, r.max_attempts, c.run_lease, r.args, r.run_at, r.created_at,
       c.claimed_at, NULL, c.deadline_at, s.heartbeat_at, r.errors, NULL,
       COALESCE(s.progress, r.progress), r.metadata, r.tags, false, NULL
FROM awa.claims c
JOIN awa.ready_entries r
  ON r.lane_id = c.lane_id AND r.lane_seq = c.lane_seq AND r.ready_slot = c.ready_slot
LEFT JOIN awa.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
WHERE NOT EXISTS (
    SELECT 1 FROM awa.claim_closures z
    WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease AND z.claim_slot = c.claim_slot)
UNION ALL
SELECT d.job_id, d.kind, d.queue, d.state, d.priority, d.attempt, d.max_attempts, d.run_lease,
       d.args, d.run_at, d.created_at, d.attempted_at, NULL, NULL, NULL, d.errors, NULL,
       d.progress, d.metadata, d.tags, false, NULL
FROM awa.deferred_jobs d;

CREATE VIEW awa.jobs AS
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

CREATE FUNCTION awa.queue_counts_v1()
RETURNS TABLE (queue text, available bigint, running bigint, waiting_external bigint,
               scheduled bigint, retryable bigint, completed bigint, failed bigint,
               cancelled bigint, dlq bigint, paused boolean)
LANGUAGE sql STABLE AS $$
    WITH live AS (
        SELECT j.queue, j.state, count(*) AS n
        FROM awa.live_jobs j
        GROUP BY j.queue, j.state
    ), done AS (
        SELECT d.queue, d.state, count(*) AS n FROM awa.done_entries d GROUP BY d.queue, d.state
    ), dead AS (
        SELECT q.queue, 'dlq'::text AS state, count(*) AS n FROM awa.dlq_entries q GROUP BY q.queue
    ), allq AS (
        SELECT * FROM live UNION ALL SELECT * FROM done UNION ALL SELECT * FROM dead
    ), names AS (
        SELECT a.queue FROM allq a UNION SELECT m.queue FROM awa.queue_meta m
    )
    SELECT n.queue,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'available'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'running'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'waiting_external'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'scheduled'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'retryable'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'completed'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'failed'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'cancelled'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'dlq'), 0)::bigint,
           COALESCE((SELECT m.paused FROM awa.queue_meta m WHERE m.queue = n.queue), false)
    FROM names n
    LEFT JOIN allq a ON a.queue = n.queue
    GROUP BY n.queue
    ORDER BY n.queue
$$;

CREATE FUNCTION awa.queue_stats_v1()
RETURNS TABLE (queue text, available bigint, running bigint, waiting_external bigint,
               scheduled bigint, retryable bigint, completed bigint, failed bigint,
               cancelled bigint, dlq bigint, paused boolean, lag_seconds double precision,
               completed_last_hour bigint)
LANGUAGE sql STABLE AS $$
    SELECT c.*,
           (SELECT extract(epoch FROM now() - min(j.run_at)) FROM awa.live_jobs j
            WHERE j.queue = c.queue AND j.state = 'available'),
           (SELECT count(*) FROM awa.done_entries d
            WHERE d.queue = c.queue AND d.state = 'completed'
              AND d.finalized_at > now() - interval '1 hour')
    FROM awa.queue_counts_v1() c
$$;

CREATE FUNCTION awa.throughput_v1(p_queue text DEFAULT NULL)
RETURNS TABLE (minute timestamptz, completed bigint)
LANGUAGE sql STABLE AS $$
    SELECT b.minute, count(d.job_id)
    FROM generate_series(date_trunc('minute', now()) - interval '59 minutes',
                         date_trunc('minute', now()), interval '1 minute') AS b(minute)
    LEFT JOIN awa.done_entries d
      ON d.state = 'completed' AND (p_queue IS NULL OR d.queue = p_queue)
     AND d.finalized_at >= b.minute AND d.finalized_at < b.minute + interval '1 minute'
    GROUP BY b.minute
    ORDER BY b.minute
$$;
