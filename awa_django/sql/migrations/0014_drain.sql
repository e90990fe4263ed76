-- awa_django migration 0014: drains at the default settings (issue 14).
--
-- 1. finalize_v2 reads each outcome's claim by its key, always through the claims' primary
-- key. It runs with plan_cache_mode = force_generic_plan (migration 0004), so a session keeps
-- the plan it made on its first call; a worker's first finalize after the claim partitions
-- were vacuumed near empty (a fresh or quiet database, the start of every benchmark drain)
-- planned a sequential scan of the claim partition, and kept it until autovacuum analyzed
-- the partition: each finalize then read every claim of the slot. A 32-outcome finalize took
-- 4.4 ms with 4,000 claims in the slot and 21 ms with 20,000 (O(claims) per call, O(n^2) per
-- drain), against 0.7 ms throughout with the index. enable_seqscan = off on the function, as
-- claim_v2 and claim_v3 have, makes the generic plan probe the index whatever the statistics
-- say when it is made (finalize_v3 and finalize_v1, called from it, run with it too).
ALTER FUNCTION awa.finalize_v2(jsonb) SET enable_seqscan = off;

-- 2. A cheap exit check for burst workers.
--
-- awa.queues_idle_v1 answers in one statement whose plan reads the whole backlog (a hash
-- anti-join of every ready row above the cursors with the tombstones) and anti-joins every
-- retained claim of the queues with its closure: 10-35 ms per call on a backlog of 50,000-
-- 100,000 jobs, paid by a --burst worker every POLL_INTERVAL in which it has nothing in
-- flight, which in a drain is whenever another process's claim held the lanes.
--
-- awa.queues_idle_v2 gives the same answer (same snapshot: a STABLE function sees the one of
-- its caller) from the cheapest evidence first, each step a bounded probe, and stops at the
-- first that says "not idle":
--   1. available: per lane of a queue not paused, its cursor, then the first ready row above
--      it that no tombstone covers (an index probe per lane, never a scan of the backlog);
--   2. parked: a job of a queue not paused waiting for its serial key (serial_waiting) or its
--      kind's limits (flow_waiting) (index probes);
--   3. running: per lane of the queues (paused ones too, as v1), its 128 latest claims are
--      looked for one without a closure (the attempts in flight are nearly always there);
--   4. only then every claim of those lanes against the closures (what v1 always did): the
--      answer "idle", or an attempt open behind 128 later closed ones (a stuck handler).
-- Scheduled and retryable jobs (deferred_jobs) do not count, as in v1. The worker's
-- queues_idle query calls v2; v1 stays, unchanged, for callers of the released function.

CREATE FUNCTION awa.queues_idle_v2(p_queues text[])
RETURNS boolean
LANGUAGE plpgsql STABLE
-- Index probes, not the scans of a whole table a generic plan can pick for a lane array of
-- unknown size; and no parallel workers for step 4 (their start costs more than they save).
SET enable_seqscan = off
SET max_parallel_workers_per_gather = 0
AS $$
DECLARE
    v_lanes integer[];
    v_open integer[];
    v_cursors bigint[];
BEGIN
    SELECT array_agg(l.lane_id),
           array_agg(l.lane_id) FILTER (WHERE NOT EXISTS (
               SELECT 1 FROM awa.queue_meta m WHERE m.queue = l.queue AND m.paused))
    INTO v_lanes, v_open
    FROM awa.queue_lanes l
    WHERE l.queue = ANY (p_queues);
    -- 1. Available. The cursors first, in a statement of their own: inside the probe below the
    -- planner would evaluate lane_cursor_v1 once per ready row.
    SELECT array_agg(awa.lane_cursor_v1(u.lane_id) ORDER BY u.i) INTO v_cursors
    FROM unnest(v_open) WITH ORDINALITY AS u(lane_id, i);
    IF EXISTS (
        SELECT 1
        FROM unnest(v_open, v_cursors) AS u(lane_id, c)
        CROSS JOIN LATERAL (
            SELECT 1 FROM awa.ready_entries e
            WHERE e.lane_id = u.lane_id AND e.lane_seq > u.c
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            LIMIT 1) x) THEN
        RETURN false;
    END IF;
    -- 2. Parked.
    IF EXISTS (
        SELECT 1 FROM awa.serial_waiting w
        WHERE w.queue = ANY (p_queues)
          AND NOT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = w.queue AND m.paused))
    OR EXISTS (
        SELECT 1 FROM awa.flow_waiting w
        WHERE w.queue = ANY (p_queues)
          AND NOT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = w.queue AND m.paused))
    THEN
        RETURN false;
    END IF;
    -- 3. Running, where an attempt in flight nearly always is: among its lane's latest claims.
    IF EXISTS (
        SELECT 1
        FROM unnest(v_lanes) AS u(lane_id)
        CROSS JOIN LATERAL (
            SELECT c.job_id, c.run_lease, c.claim_slot FROM awa.claims c
            WHERE c.lane_id = u.lane_id
            ORDER BY c.lane_seq DESC
            LIMIT 128) c
        WHERE NOT EXISTS (
            SELECT 1 FROM awa.claim_closures z
            WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
              AND z.claim_slot = c.claim_slot)) THEN
        RETURN false;
    END IF;
    -- 4. Running, anywhere in the lanes' claims.
    RETURN NOT EXISTS (
        SELECT 1 FROM awa.claims c
        WHERE c.lane_id = ANY (v_lanes)
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot));
END
$$;
