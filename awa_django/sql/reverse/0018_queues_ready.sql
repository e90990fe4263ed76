-- Unapplying migration 0018: rotate_v3 as migration 0004 wrote it.

-- Rotate a ring (awa.rotate_v2: same arguments and outcomes). A claim ring rotation also appends,
-- in the same transaction, a closed marker claim at the cursor of every lane it can lock
-- (FOR UPDATE SKIP LOCKED: a lane being claimed right now gets a real claim instead), so that
-- claim_v2 finds each lane's cursor with one probe of the new slot, idle lanes included, instead
-- of reading every slot until the lane's next claim. Needs READ COMMITTED (SQLSTATE 25000
-- otherwise): a marker computed from an older snapshot would put a cursor below claims made
-- since, and hand their jobs out again.
CREATE OR REPLACE FUNCTION awa.rotate_v3(p_ring text, p_interval double precision DEFAULT 0)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_outcome text;
    v_lanes integer[];
BEGIN
    PERFORM awa._require_read_committed_v1('awa.rotate_v3');
    v_outcome := awa.rotate_v2(p_ring, p_interval);
    IF v_outcome <> 'rotated' OR p_ring <> 'claim' THEN
        RETURN v_outcome;
    END IF;
    v_lanes := ARRAY(SELECT l.lane_id FROM awa.queue_lanes l ORDER BY l.lane_id
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
        ON CONFLICT DO NOTHING
        RETURNING claim_slot, job_id, run_lease
    )
    INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
    SELECT m.claim_slot, m.job_id, m.run_lease, 'marker' FROM markers m
    ON CONFLICT DO NOTHING;
    RETURN v_outcome;
END
$$;
