-- claim_v1, same contract, planned for ring partitions whose statistics lag their size.
--
-- Measured by benchmarks/run: after an ANALYZE of an empty claim slot, a backlog of 20,000 jobs
-- drained with claim_v1 at 5-7k jobs/s, each claim slower than the last (8 ms -> 37 ms for 128
-- jobs) because the lane cursor (max lane_seq over the claim ring) was read by seq scan, and
-- evaluated once per ready partition. Same signature and results; only the plan changes, so
-- reversing this migration keeps this definition (it only forgets the record).

CREATE OR REPLACE FUNCTION awa.claim_v1(
    p_queue text, p_max integer, p_worker uuid DEFAULT NULL,
    p_aging_secs double precision DEFAULT 60, p_default_deadline double precision DEFAULT NULL)
RETURNS TABLE (job_id bigint, run_lease bigint, attempt smallint, max_attempts smallint,
               claim_slot integer, kind text, args jsonb, queue text, priority smallint,
               deadline_at timestamptz, timeout_secs double precision, progress jsonb)
LANGUAGE plpgsql
-- Ring partitions are analyzed while small (a fresh or just-truncated claim slot, a quiet ready
-- slot) and then grow by thousands of rows per second before autovacuum analyzes them again.
-- With those statistics the planner scans them sequentially, and every claim costs O(rows
-- claimed so far). The claim's lookups are all selective index probes: never plan a seq scan.
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_remaining integer := p_max;
    v_got integer;
    v_cursor bigint;
    v_cslot integer;
    v_cgen bigint;
    v_aging double precision := GREATEST(COALESCE(p_aging_secs, 60), 0.001);
    r record;
BEGIN
    IF p_max IS NULL OR p_max <= 0 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'awa.claim_v1 needs READ COMMITTED isolation' USING ERRCODE = '25000';
    END IF;
    IF EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = p_queue AND m.paused) THEN
        RETURN;
    END IF;
    SELECT r2.generation, r2.slot INTO v_cgen, v_cslot
    FROM awa.ring_rotations r2 WHERE r2.ring = 'claim' ORDER BY r2.generation DESC LIMIT 1;

    FOR r IN
        -- Each lane's cursor once (a value the probe below takes as a parameter), not once per
        -- ready partition the probe visits.
        WITH k AS MATERIALIZED (
            SELECT l.lane_id, l.priority, l.enqueue_seq, awa.lane_cursor_v1(l.lane_id) AS c
            FROM awa.queue_lanes l
            WHERE l.queue = p_queue
        )
        SELECT k.lane_id
        FROM k
        CROSS JOIN LATERAL (
            SELECT e.run_at FROM awa.ready_entries e
            WHERE e.lane_id = k.lane_id AND e.lane_seq > k.c
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq LIMIT 1) h
        WHERE COALESCE(pg_sequence_last_value(k.enqueue_seq), 0) > k.c
        ORDER BY k.priority + floor(extract(epoch FROM now() - h.run_at) / v_aging) DESC,
                 h.run_at, k.lane_id
    LOOP
        PERFORM 1 FROM awa.queue_lanes l WHERE l.lane_id = r.lane_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        -- A new statement, so a new snapshot: it sees every claim committed before the lock.
        v_cursor := awa.lane_cursor_v1(r.lane_id);
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT e.* FROM awa.ready_entries e
            WHERE e.lane_id = r.lane_id AND e.lane_seq > v_cursor
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq
            LIMIT v_remaining
        ), ins AS (
            INSERT INTO awa.claims (
                claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
                lane_id, lane_seq, attempt, deadline_at, worker_id)
            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot, p.ready_generation,
                   p.lane_id, p.lane_seq, p.attempt + 1,
                   now() + make_interval(secs => COALESCE(p.deadline_secs, p_default_deadline)),
                   p_worker
            FROM picked p
            RETURNING lane_seq, deadline_at
        )
        SELECT p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint, p.max_attempts, v_cslot,
               p.kind, p.args, p.queue, p.priority, i.deadline_at,
               COALESCE(p.deadline_secs, p_default_deadline), p.progress
        FROM picked p JOIN ins i ON i.lane_seq = p.lane_seq
        ORDER BY p.lane_seq;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_remaining := v_remaining - v_got;
        EXIT WHEN v_remaining <= 0;
    END LOOP;
END
$$;
