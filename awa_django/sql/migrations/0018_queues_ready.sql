-- awa_django migration 0018: which queues have work, for many queues in one statement.
--
-- A worker serving many queues finds the idle ones that have work again with this probe
-- instead of one claim per queue per POLL_INTERVAL (docs/worker.md, "Many queues"). A queue is
-- reported when it is not paused and a lane of it has a position past its claim cursor (the
-- lanes statement of awa.claim_v3: the lane's last enqueued position against the cursor, read
-- from the newest claim of the current claim slot when there is one), or a job of it waits for
-- its kind's limits (flow_waiting, which the queue's next claim un-parks). It may report a
-- queue a claim then finds nothing in (a producer rolled back the lane's last position, a flow
-- limit holds the jobs back); it never leaves out a queue a claim would take a job from.
--
-- Each lane's last position is a read of its sequence, which takes a lock until the statement
-- ends: the worker asks about a bounded number of queues per call (awa_django.worker.dispatch).

CREATE FUNCTION awa.queues_ready_v1(p_queues text[])
RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_cgen bigint;
    v_cslot integer;
BEGIN
    SELECT r.generation, r.slot INTO v_cgen, v_cslot
    FROM awa.ring_rotations r WHERE r.ring = 'claim' ORDER BY r.generation DESC LIMIT 1;
    RETURN QUERY
    SELECT q.queue
    FROM unnest(p_queues) AS q(queue)
    WHERE NOT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = q.queue AND m.paused)
      AND (EXISTS (SELECT 1 FROM awa.flow_waiting w WHERE w.queue = q.queue)
           OR EXISTS (
               SELECT 1
               FROM awa.queue_lanes l
               CROSS JOIN LATERAL (SELECT pg_sequence_last_value(l.enqueue_seq) AS last) s
               WHERE l.queue = q.queue AND s.last IS NOT NULL
                 AND s.last > COALESCE(
                     (SELECT CASE WHEN c.claim_generation = v_cgen THEN c.lane_seq END
                      FROM awa.claims c
                      WHERE c.claim_slot = v_cslot AND c.lane_id = l.lane_id
                      ORDER BY c.lane_seq DESC LIMIT 1),
                     awa.lane_cursor_v1(l.lane_id))));
END
$$;

-- Claim-ring rotation at any number of lanes (awa.rotate_v3, same arguments and outcomes):
--
-- 1. A ring whose current slot holds only cursor markers is idle: it stops rotating. Before,
--    the markers a rotation appends made the new slot look busy, so the ring rotated every
--    CLAIM_ROTATE_INTERVAL for ever, on an idle database too.
-- 2. Markers go to the lanes claimed from in the slot just left (a real claim there), not to
--    every lane: the rotation locks each lane it marks until it commits, and claims pass over
--    locked lanes, so with 40,000 lanes (10,000 queues) every rotation took 0.6 s during which
--    claims came back empty. A lane without a marker in the current slot reads its cursor
--    from every slot on its next claim (the cursor is the same); a slot's prune still appends
--    a marker for each cursor in the slot it truncates.
CREATE OR REPLACE FUNCTION awa.rotate_v3(p_ring text, p_interval double precision DEFAULT 0)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_outcome text;
    v_lanes integer[];
    v_left integer;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.rotate_v3');
    IF p_ring = 'claim' THEN
        SELECT g.slot INTO v_left FROM awa.ring_rotations g
        WHERE g.ring = 'claim' ORDER BY g.generation DESC LIMIT 1;
        IF NOT EXISTS (SELECT 1 FROM awa.claims c WHERE c.claim_slot = v_left AND c.job_id > 0)
        THEN
            RETURN 'skipped_idle';
        END IF;
    END IF;
    v_outcome := awa.rotate_v2(p_ring, p_interval);
    IF v_outcome <> 'rotated' OR p_ring <> 'claim' THEN
        RETURN v_outcome;
    END IF;
    v_lanes := ARRAY(SELECT l.lane_id FROM awa.queue_lanes l
                     WHERE l.lane_id IN (SELECT c.lane_id FROM awa.claims c
                                         WHERE c.claim_slot = v_left AND c.job_id > 0)
                     ORDER BY l.lane_id
                     FOR UPDATE SKIP LOCKED);
    -- Locked: a new statement sees every claim committed before the locks were taken.
    WITH cur AS (
        SELECT g.generation, g.slot FROM awa.ring_rotations g
        WHERE g.ring = 'claim' ORDER BY g.generation DESC LIMIT 1
    ), tops AS (
        SELECT l.lane_id,
               GREATEST(COALESCE(f.floor_seq, 0), COALESCE(t.lane_seq, 0)) AS top
        FROM unnest(v_lanes) AS l(lane_id)
        LEFT JOIN LATERAL (
            SELECT c.lane_seq FROM awa.claims c
            WHERE c.lane_id = l.lane_id ORDER BY c.lane_seq DESC LIMIT 1) t ON true
        LEFT JOIN awa.lane_floors f ON f.lane_id = l.lane_id
    ), markers AS (
        INSERT INTO awa.claims (claim_slot, claim_generation, job_id, run_lease, ready_slot,
                                ready_generation, lane_id, lane_seq, attempt)
        SELECT cur.slot, cur.generation, -t.lane_id, t.top, -1, -1, t.lane_id, t.top, 0
        FROM tops t CROSS JOIN cur
        WHERE t.top > 0
        ON CONFLICT DO NOTHING
        RETURNING claim_slot, job_id, run_lease
    )
    INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
    SELECT m.claim_slot, m.job_id, m.run_lease, 'marker' FROM markers m
    ON CONFLICT DO NOTHING;
    RETURN v_outcome;
END
$$;
