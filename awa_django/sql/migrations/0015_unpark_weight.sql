-- awa_django migration 0015: parked jobs' weights counted as the claim counts them (issue 16).
--
-- awa._flow_unpark_v1 (0012) counted a parked job's weight up to its kind's limit only, while
-- the claim (awa.claim_v3) counts it up to the least of the process's most units (p_max_weight),
-- the queue's global limit and the kind's limit. A job heavier than what any claiming process
-- can run, of a kind whose limit is above that (weight 3, kind limit 3, workers of 2 slots), was
-- parked with the claim's count (2) and then never fit the un-parking's count (3): stranded for
-- good, against docs/flow.md ("a heavy job can never block its lane for ever"). v2 takes the
-- claim's cap (p_wcap: the claim's v_wcap, its process bound) and applies the queue's limit
-- itself. And v1 counted a kind's rate tokens (jobs) against the jobs' weights (units): a job of
-- weight 2 or more of a kind with a rate and a concurrency limit, parked while its burst was 1
-- token (the default burst at 10 jobs/s or less), never fit either; v2 bounds the number of jobs
-- moved by the tokens and their weights by the free units and permits. Units and permits are
-- two bounds, as in the claim: a job takes min(weight, process bound, queue limit) units of the
-- claim and min(that, kind limit) permits of its kind (v1 checked one sum against both, and a
-- rate-only kind's against neither, so a job was moved back that the claim then could not take,
-- at the head of the hand-off lane, in front of jobs it could). And the jobs are chosen once,
-- then moved by priority (v1 read the oldest-first window again for each priority, after the
-- rows it had just moved were gone, so more than fit came back and were parked again).
-- And when a kind's rate tokens are all spent on the jobs moved while more of its jobs wait,
-- o_wait is about 1 / rate, so that the claim reports a soft wait and the worker claims again
-- when the next token is due (v1 reported nothing then, and a worker whose freed slots do not
-- wake it after a claim that found its queue dry waited its whole POLL_INTERVAL).
-- Everything else is v1's. awa.claim_v3 calls it from migration 0016 on.

-- Un-park jobs of p_queue parked by their kind (awa._flow_unpark_v1, which see), each job's
-- weight capped at min(p_wcap, the queue's global limit, its kind's limit) as the claim caps it.
CREATE FUNCTION awa._flow_unpark_v2(p_queue text, p_max integer, p_held integer[],
                                    p_wcap integer,
                                    OUT o_moved integer, OUT o_wait double precision)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    k record;
    lim awa.flow_kind_limits%ROWTYPE;
    v_room integer;
    v_keys integer[];
    v_tat timestamptz;
    v_tokens integer;
    v_wait double precision;
    v_lane integer;
    p record;
    v_moved integer;
    v_bodies awa.job_body[];
    v_qcap integer;
    v_cap integer;
    v_jobs integer;
    v_used integer := 0;
    v_wmoved integer;
    v_perm integer;
    v_ids bigint[];
    v_prios integer[];
    v_kmoved integer;
BEGIN
    o_moved := 0;
    -- The claim's cap on one job's weight (0013: the process's most units, then the queue's
    -- global limit): a parked job counts here as the claim will count it.
    SELECT LEAST(GREATEST(COALESCE(p_wcap, 10000), 1), 10000, f.max_running)
    INTO v_qcap
    FROM (SELECT p_queue AS queue) one
    LEFT JOIN awa.flow_limits f ON f.queue = one.queue;
    FOR k IN
        WITH RECURSIVE kinds AS (
            (SELECT w.kind FROM awa.flow_waiting w WHERE w.queue = p_queue
             ORDER BY w.kind LIMIT 1)
            UNION ALL
            SELECT (SELECT w.kind FROM awa.flow_waiting w
                    WHERE w.queue = p_queue AND w.kind > s.kind ORDER BY w.kind LIMIT 1)
            FROM kinds s WHERE s.kind IS NOT NULL
        )
        SELECT s.kind FROM kinds s WHERE s.kind IS NOT NULL
    LOOP
        EXIT WHEN v_used >= p_max;
        -- Three bounds, each as the claim counts it: v_room, the claim's units left (a job
        -- takes min(weight, v_qcap)); v_perm, the kind's free permits (a job takes
        -- min(weight, v_cap)); v_jobs, jobs (rate tokens count jobs started, whatever their
        -- weight).
        v_room := p_max - v_used;
        v_jobs := v_room;
        v_perm := NULL;
        lim := NULL;
        SELECT * INTO lim FROM awa.flow_kind_limits f WHERE f.kind = k.kind;
        v_cap := LEAST(lim.max_running, v_qcap);
        IF lim.rate IS NOT NULL THEN
            SELECT s.tat INTO v_tat FROM awa.flow_kind_rate_state s WHERE s.kind = k.kind;
            SELECT t.o_tokens, t.o_wait INTO v_tokens, v_wait
            FROM awa._flow_kind_tokens_v1(lim.rate, lim.burst, v_tat, clock_timestamp()) t;
            IF v_tokens = 0 THEN
                o_wait := LEAST(COALESCE(o_wait, v_wait), v_wait);
                CONTINUE;
            END IF;
            v_jobs := LEAST(v_jobs, v_tokens);
        END IF;
        IF lim.max_running IS NOT NULL THEN
            v_keys := awa._flow_kind_take_v1(k.kind, lim.max_running, lim.max_seen,
                                             LEAST(v_room, lim.max_running), p_held);
            PERFORM awa.flow_release_v1(v_keys);
            v_perm := cardinality(v_keys);
            CONTINUE WHEN v_perm <= 0;
        END IF;
        -- The oldest waiting jobs of the kind in the queue while they fit all three, in job
        -- order: a heavy job waits, parked, until it fits (never moved only to be parked again
        -- or to stop the claim), and younger jobs of its kind wait behind it. Chosen once, then
        -- moved by priority, one hand-off lane each (a lane another claim is filling is passed
        -- over: its jobs stay parked).
        SELECT array_agg(x.job_id ORDER BY x.job_id), array_agg(x.priority ORDER BY x.job_id)
        INTO v_ids, v_prios
        FROM (
            SELECT w.job_id, w.priority,
                   sum(awa._job_weight_v1(w.metadata, v_qcap)) OVER (ORDER BY w.job_id) AS cu,
                   sum(awa._job_weight_v1(w.metadata, v_cap)) OVER (ORDER BY w.job_id) AS cp
            FROM awa.flow_waiting w
            WHERE w.queue = p_queue AND w.kind = k.kind
            ORDER BY w.job_id
            LIMIT v_jobs) x
        WHERE x.cu <= v_room AND (v_perm IS NULL OR x.cp <= v_perm);
        CONTINUE WHEN v_ids IS NULL;
        v_kmoved := 0;
        FOR p IN SELECT DISTINCT u.priority FROM unnest(v_prios) AS u(priority)
        LOOP
            v_lane := awa.flow_handoff_lane_v1(p_queue, p.priority);
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(4282177, v_lane);
            WITH gone AS (
                -- SKIP LOCKED: a job being cancelled is passed over.
                DELETE FROM awa.flow_waiting w
                WHERE w.job_id IN (
                    SELECT w2.job_id FROM awa.flow_waiting w2
                    WHERE w2.job_id IN (
                        SELECT i.id FROM unnest(v_ids, v_prios) AS i(id, priority)
                        WHERE i.priority = p.priority)
                    FOR UPDATE SKIP LOCKED)
                RETURNING w.*
            )
            SELECT array_agg(ROW(
                       g.job_id, g.kind, g.queue, g.priority, g.args, g.attempt, g.max_attempts,
                       g.run_lease, g.run_at, g.created_at, g.deadline_secs, g.metadata, g.tags,
                       g.errors, g.progress)::awa.job_body ORDER BY g.job_id),
                   sum(awa._job_weight_v1(g.metadata, v_qcap))
            INTO v_bodies, v_wmoved
            FROM gone g;
            v_moved := COALESCE(cardinality(v_bodies), 0);
            IF v_moved > 0 THEN
                PERFORM awa._append_ready_v1(v_lane, v_bodies);
                o_moved := o_moved + v_moved;
                v_used := v_used + v_wmoved;
                v_kmoved := v_kmoved + v_moved;
            END IF;
        END LOOP;
        -- The kind's tokens are spent and more of its jobs wait: the next one is due in about
        -- 1 / rate (a soft wait: the worker claims again then, rather than at its poll
        -- interval; the claim after computes the exact wait).
        IF lim.rate IS NOT NULL AND v_kmoved >= v_tokens
           AND EXISTS (SELECT 1 FROM awa.flow_waiting w
                       WHERE w.queue = p_queue AND w.kind = k.kind) THEN
            o_wait := LEAST(COALESCE(o_wait, 1.0 / lim.rate), 1.0 / lim.rate);
        END IF;
    END LOOP;
END
$$;
