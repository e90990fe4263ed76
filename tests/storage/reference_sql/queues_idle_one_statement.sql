-- The burst worker's exit check as one statement, as it was before awa.queues_idle_v2 answered
-- from bounded probes: the plan reads the whole backlog, so it is slow, but its answer is
-- plainly right. tests/storage/test_idle_check.py creates it as a temporary function and checks that
-- awa.queues_idle_v2 gives the same answer. Test data only: never installed by a migration.
CREATE FUNCTION pg_temp.queues_idle_reference(p_queues text[])
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM awa.queue_lanes l
        -- OFFSET 0: the cursor is computed once per lane. Flattened, the call became a filter
        -- evaluated per row of every ready partition the planner chose to scan (470 s for one
        -- call over 450,000 retained rows without maintenance).
        CROSS JOIN LATERAL (SELECT awa.lane_cursor_v1(l.lane_id) AS c OFFSET 0) k
        WHERE l.queue = ANY (p_queues)
          AND NOT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = l.queue AND m.paused)
          AND EXISTS (
              SELECT 1 FROM awa.ready_entries e
              WHERE e.lane_id = l.lane_id AND e.lane_seq > k.c
                AND NOT EXISTS (
                    SELECT 1 FROM awa.ready_tombstones t
                    WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                      AND t.ready_slot = e.ready_slot)))
    AND NOT EXISTS (
        SELECT 1 FROM awa.claims c
        JOIN awa.queue_lanes l ON l.lane_id = c.lane_id
        WHERE l.queue = ANY (p_queues)
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot))
    AND NOT EXISTS (
        SELECT 1 FROM awa.serial_waiting w
        WHERE w.queue = ANY (p_queues)
          AND NOT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = w.queue AND m.paused))
    AND NOT EXISTS (
        SELECT 1 FROM awa.flow_waiting w
        WHERE w.queue = ANY (p_queues)
          AND NOT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = w.queue AND m.paused))
$$;
