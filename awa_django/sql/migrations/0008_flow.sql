-- awa_django migration 0008: flow control across the fleet (issue 16): global concurrency per
-- queue counted by job weight, and rate limits per queue, enforced at claim time in Postgres.
--
-- Global concurrency: permits are session-level advisory locks (class 4282182, key
-- awa._flow_key_v1(queue, i) for permit i in 0 .. max_running - 1) held by the claiming
-- worker's claim connection, one per unit of weight, from the claim until the worker hands them
-- back (p_release of its next claim) after the handler really ended. No row is written per job:
-- a permit lives in the server's lock table. A worker that dies (SIGKILL, crash, OOM) loses its
-- session and with it its permits; a worker that is partitioned or frozen while its connection
-- lives on is found by awa.flow_reap_v1 (run by the maintenance leader after rescue), which
-- terminates the backends of awa worker instances whose runtime row is stale and that hold
-- permits. A permit is taken only when free, so the number of attempts holding permits never
-- passes the limit, also while rescue runs or the leader moves. A lowered limit takes effect at
-- once: while permits above the new limit are still held (max_seen > max_running), a claim
-- counts every held permit of the queue before taking one.
--
-- Weights: a job's metadata key "awa:weight" (1 .. 10000, default 1) is the number of permits
-- and of the worker's execution slots it takes; a weight above the queue's limit, or above
-- what the claiming process could ever run (p_max_weight), counts as that bound, so that no
-- job can block its lane for ever.
--
-- Rate limits: GCRA on the database clock. One row per rate-limited queue in
-- awa.flow_rate_state holds the theoretical arrival time (tat); a claim locks it (FOR UPDATE,
-- so claims of one rate-limited queue are serialised), takes at most
-- floor((now + burst × T − max(tat, now)) / T) jobs (T = 1 / rate seconds) and moves tat by
-- T per job taken. The row is updated once per claim that took jobs, so its dead tuples are
-- bounded by the claim rate, never by the job count (docs/storage.md).
--
-- A claim that a limit held back ends with a marker row (job_id NULL): timeout_secs is then the
-- seconds until the rate limit lets the next job through, or NULL when permits ran out. The
-- worker sleeps that long (or until a permit comes back) instead of polling.
--
-- Limits live in awa.flow_limits: rows from the project's settings (source 'settings', written
-- by awa.flow_sync_v1 when a worker starts) and operator overrides (source 'operator', from the
-- admin or `awa_queue limit`), which settings syncs leave alone until cleared.
--
-- Advisory-lock classes: 4282182 is this file's (permits); see 0002_functions.sql for the
-- others.

CREATE TABLE IF NOT EXISTS awa.flow_limits (
    queue text PRIMARY KEY CHECK (awa.valid_queue_name(queue)),
    max_running integer CHECK (max_running BETWEEN 1 AND 10000),
    rate double precision CHECK (rate > 0 AND rate <= 1000000),
    burst integer CHECK (burst BETWEEN 1 AND 1000000),
    -- The highest max_running since every permit above max_running was last free.
    max_seen integer CHECK (max_seen BETWEEN 1 AND 10000),
    source text NOT NULL DEFAULT 'settings' CHECK (source IN ('settings', 'operator')),
    updated_by text,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK (burst IS NULL OR rate IS NOT NULL)
);

CREATE TABLE IF NOT EXISTS awa.flow_rate_state (
    queue text PRIMARY KEY,
    tat timestamptz NOT NULL
) WITH (fillfactor = 50);

DO $$
BEGIN
    CREATE TYPE awa.claimed_v3 AS (
        job_id bigint, run_lease bigint, attempt smallint, max_attempts smallint,
        claim_slot integer, kind text, args jsonb, queue text, priority smallint,
        deadline_at timestamptz, timeout_secs double precision, progress jsonb,
        metadata jsonb, tags text[], errors jsonb, weight integer, permits integer[]);
EXCEPTION WHEN duplicate_object THEN
    NULL;  -- migrated forward again after a reversal (types stay, like tables)
END
$$;

-- The advisory-lock key (class 4282182) of permit p_i of queue p_queue.
CREATE FUNCTION awa._flow_key_v1(p_queue text, p_i integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtext(p_queue || '/' || p_i::text)
$$;

-- The weight a job counts for: metadata "awa:weight" when it is an integer 1 .. 10000, else 1;
-- never above p_cap (when given).
CREATE FUNCTION awa._job_weight_v1(p_metadata jsonb, p_cap integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT LEAST(
        CASE WHEN jsonb_typeof(p_metadata -> 'awa:weight') = 'number'
                  AND (p_metadata ->> 'awa:weight') ~ '^[0-9]{1,5}$'
                  AND (p_metadata ->> 'awa:weight')::integer BETWEEN 1 AND 10000
             THEN (p_metadata ->> 'awa:weight')::integer ELSE 1 END,
        GREATEST(COALESCE(p_cap, 10000), 1))
$$;

-- Take up to p_want free permits of p_queue (limit p_limit, highest limit in use p_seen) for
-- this session, skipping the keys it holds already (p_held: session advisory locks are
-- re-entrant, so a held key would be "taken" twice). Returns the keys taken.
CREATE FUNCTION awa._flow_take_v1(p_queue text, p_limit integer, p_seen integer, p_want integer,
                                  p_held integer[])
RETURNS integer[]
LANGUAGE plpgsql AS $$
DECLARE
    v_keys integer[] := '{}';
    v_start integer;
    v_room integer := LEAST(p_want, p_limit);
    v_busy integer;
BEGIN
    IF v_room <= 0 THEN
        RETURN v_keys;
    END IF;
    IF p_seen IS NOT NULL AND p_seen > p_limit THEN
        -- The limit was lowered: permits above it may still be held. Count every held one.
        SELECT count(*) INTO v_busy
        FROM generate_series(0, p_seen - 1) AS g(i)
        JOIN pg_locks l
          ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
         AND l.classid = 4282182::oid
         AND l.objid = (awa._flow_key_v1(p_queue, g.i)::bigint & 4294967295)::oid
         AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database());
        IF NOT EXISTS (
            SELECT 1 FROM generate_series(p_limit, p_seen - 1) AS g(i)
            JOIN pg_locks l
              ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
             AND l.classid = 4282182::oid
             AND l.objid = (awa._flow_key_v1(p_queue, g.i)::bigint & 4294967295)::oid) THEN
            UPDATE awa.flow_limits f SET max_seen = f.max_running
            WHERE f.queue = p_queue AND f.max_seen > f.max_running;
        END IF;
        v_room := LEAST(v_room, p_limit - v_busy);
        IF v_room <= 0 THEN
            RETURN v_keys;
        END IF;
    END IF;
    -- From a random permit on (claimers rarely probe the same taken permits), in one
    -- statement that stops at v_room taken. CASE keeps the order: a key this session holds
    -- is never passed to pg_try_advisory_lock (which would take it a second time).
    v_start := floor(random() * p_limit)::integer;
    SELECT COALESCE(array_agg(t.k), '{}') INTO v_keys
    FROM (
        SELECT c.k
        -- generate_series in the select list runs value per call, so LIMIT stops it early
        -- (in FROM it would produce every one of p_limit rows first).
        FROM (SELECT awa._flow_key_v1(p_queue, (v_start + generate_series(0, p_limit - 1))
                                               % p_limit) AS k) c
        WHERE CASE WHEN c.k IN (SELECT h.k FROM unnest(p_held) AS h(k)) THEN false
                   ELSE pg_try_advisory_lock(4282182, c.k) END
        LIMIT v_room) t;
    RETURN v_keys;
END
$$;

-- Hand back permits this session holds (keys from a claim's permits column). Returns how many
-- were held; a key not held is passed over.
CREATE FUNCTION awa.flow_release_v1(p_keys integer[]) RETURNS integer
LANGUAGE sql AS $$
    SELECT count(*) FILTER (WHERE pg_advisory_unlock(4282182, k))::integer
    FROM unnest(COALESCE(p_keys, '{}')) AS k
$$;

-- Take again, after a reconnect, the permits of attempts this session's process still runs.
-- Returns the keys it could not take (held by another session meanwhile: for those attempts
-- the limit may be passed until they end, and the worker logs it).
CREATE FUNCTION awa.flow_retake_v1(p_keys integer[]) RETURNS integer[]
LANGUAGE sql AS $$
    SELECT COALESCE(array_agg(k), '{}')
    FROM unnest(COALESCE(p_keys, '{}')) AS k
    WHERE NOT pg_try_advisory_lock(4282182, k)
$$;

-- Release every permit this session holds except p_keep (after a claim failed part-way: a
-- session lock taken by a statement that then failed stays held). Returns how many it released.
CREATE FUNCTION awa.flow_reset_v1(p_keep integer[]) RETURNS integer
LANGUAGE sql AS $$
    SELECT count(*) FILTER (WHERE pg_advisory_unlock(4282182, k.key))::integer
    FROM (
        SELECT l.objid::bigint::integer AS key
        FROM pg_locks l
        WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory' AND l.granted
          AND l.objsubid = 2 AND l.classid = 4282182::oid
          AND l.objid < 2147483648
        UNION ALL
        SELECT (l.objid::bigint - 4294967296)::integer
        FROM pg_locks l
        WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory' AND l.granted
          AND l.objsubid = 2 AND l.classid = 4282182::oid
          AND l.objid >= 2147483648
    ) k
    WHERE NOT k.key = ANY (COALESCE(p_keep, '{}'))
$$;

-- Permits in use per queue with a concurrency limit (reads the server's lock table).
CREATE FUNCTION awa.flow_in_use_v1()
RETURNS TABLE (queue text, in_use integer)
LANGUAGE sql STABLE AS $$
    SELECT f.queue, count(l.pid)::integer
    FROM awa.flow_limits f
    CROSS JOIN LATERAL generate_series(0, GREATEST(f.max_running, COALESCE(f.max_seen, 0)) - 1)
        AS g(i)
    LEFT JOIN pg_locks l
      ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
     AND l.classid = 4282182::oid
     AND l.objid = (awa._flow_key_v1(f.queue, g.i)::bigint & 4294967295)::oid
     AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
    WHERE f.max_running IS NOT NULL
    GROUP BY f.queue
$$;

-- Free the permits of awa worker processes that are gone but whose sessions live on (frozen,
-- wedged or partitioned: runtime row older than p_staleness seconds, or none): their backends
-- are terminated. Rows: pid, instance (application_name), action ('terminated' or
-- 'not_permitted'). Run by the maintenance leader after rescue.
CREATE FUNCTION awa.flow_reap_v1(p_staleness double precision)
RETURNS TABLE (pid integer, instance text, action text)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT l.pid AS holder, a.application_name AS app
        FROM pg_locks l
        JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
          AND l.classid = 4282182::oid AND l.pid <> pg_backend_pid()
          AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
          AND a.application_name ~ '^awa:worker:[0-9a-f-]{36}$'
          AND NOT EXISTS (
              SELECT 1 FROM awa.runtime_instances i
              WHERE i.instance_id = substr(a.application_name, 12)::uuid
                AND i.last_seen_at >= now() - make_interval(secs => p_staleness))
    LOOP
        pid := r.holder;
        instance := r.app;
        BEGIN
            action := CASE WHEN pg_terminate_backend(r.holder) THEN 'terminated'
                           ELSE 'not_permitted' END;
        EXCEPTION WHEN insufficient_privilege THEN
            action := 'not_permitted';
        END;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Claim jobs of one queue within its flow limits: the contract and lane order of claim_v2 (see
-- its comment), with weights, permits and the rate limit.
--   p_max         execution units the worker has free (a job takes its weight)
--   p_max_weight  the most units the worker could ever give one job (weights are capped to it)
--   p_held        permits this session holds for attempts still running (never taken twice)
--   p_release     permits to hand back first (attempts that ended)
-- Each job row carries its weight and, on a queue with a concurrency limit, the permit keys it
-- holds (hand them back with p_release, or awa.flow_release_v1, when its handler ends). A
-- marker row (job_id NULL) ends the result when a flow limit held the claim back (see the
-- file's header). Also with p_max = 0, p_release is applied.
CREATE FUNCTION awa.claim_v3(
    p_queue text, p_max integer, p_worker uuid DEFAULT NULL,
    p_aging_secs double precision DEFAULT 60, p_default_deadline double precision DEFAULT NULL,
    p_max_weight integer DEFAULT NULL, p_held integer[] DEFAULT NULL,
    p_release integer[] DEFAULT NULL)
RETURNS SETOF awa.claimed_v3
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_remaining integer;
    v_jobs_left integer := 2147483647;
    v_got integer;
    v_units integer;
    v_batch awa.claimed_v3[] := '{}';
    v_part awa.claimed_v3[];
    v_paused boolean;
    v_cursor bigint;
    v_cslot integer;
    v_cgen bigint;
    v_lanes integer[];
    v_priorities integer[];
    v_cursors bigint[];
    v_heads timestamptz[];
    v_head timestamptz;
    v_qslot integer;
    v_seq regclass;
    v_aging double precision := GREATEST(COALESCE(p_aging_secs, 60), 0.001);
    v_default double precision := awa._deadline_secs_v1(p_default_deadline);
    v_wcap integer := LEAST(GREATEST(COALESCE(p_max_weight, 10000), 1), 10000);
    v_limit awa.flow_limits%ROWTYPE;
    v_keys integer[];
    v_tat timestamptz;
    v_period double precision;
    v_wait double precision;
    v_bound boolean := false;
    v_jobs integer;
    v_used integer;
    r record;
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'awa.claim_v3 needs READ COMMITTED isolation' USING ERRCODE = '25000';
    END IF;
    IF p_release IS NOT NULL THEN
        PERFORM awa.flow_release_v1(p_release);
    END IF;
    IF p_max IS NULL OR p_max <= 0 THEN
        RETURN;
    END IF;
    v_remaining := p_max;
    SELECT EXISTS (SELECT 1 FROM awa.queue_meta m WHERE m.queue = p_queue AND m.paused),
           c.generation, c.slot, q.slot
    INTO v_paused, v_cgen, v_cslot, v_qslot
    FROM (SELECT r2.generation, r2.slot FROM awa.ring_rotations r2
          WHERE r2.ring = 'claim' ORDER BY r2.generation DESC LIMIT 1) c,
         (SELECT r2.slot FROM awa.ring_rotations r2
          WHERE r2.ring = 'queue' ORDER BY r2.generation DESC LIMIT 1) q;
    IF v_paused THEN
        RETURN;
    END IF;

    -- Lanes with work (as claim_v2): the flow limits are looked at only when there is some.
    SELECT array_agg(b.lane_id ORDER BY b.lane_id), array_agg(b.priority ORDER BY b.lane_id),
           array_agg(b.c ORDER BY b.lane_id)
    INTO v_lanes, v_priorities, v_cursors
    FROM (
        SELECT l.lane_id, l.priority, l.enqueue_seq,
               COALESCE(x.fast, awa.lane_cursor_v1(l.lane_id)) AS c
        FROM awa.queue_lanes l
        LEFT JOIN LATERAL (
            SELECT CASE WHEN c.claim_generation = v_cgen THEN c.lane_seq END AS fast
            FROM awa.claims c
            WHERE c.claim_slot = v_cslot AND c.lane_id = l.lane_id
            ORDER BY c.lane_seq DESC LIMIT 1) x ON true
        WHERE l.queue = p_queue AND pg_sequence_last_value(l.enqueue_seq) IS NOT NULL
    ) b
    WHERE COALESCE(pg_sequence_last_value(b.enqueue_seq), 0) > b.c;
    IF v_lanes IS NULL THEN
        RETURN;
    END IF;

    SELECT * INTO v_limit FROM awa.flow_limits f WHERE f.queue = p_queue;
    IF FOUND AND v_limit.max_running IS NOT NULL THEN
        v_wcap := LEAST(v_wcap, v_limit.max_running);
        v_keys := awa._flow_take_v1(p_queue, v_limit.max_running, v_limit.max_seen, p_max,
                                    p_held);
        IF cardinality(v_keys) < p_max THEN
            v_bound := true;
        END IF;
        v_remaining := cardinality(v_keys);
        IF v_remaining = 0 THEN
            RETURN NEXT ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, p_queue, NULL, NULL, NULL,
                            NULL, NULL, NULL, NULL, NULL, NULL)::awa.claimed_v3;
            RETURN;
        END IF;
    END IF;
    IF v_limit.rate IS NOT NULL THEN
        v_period := 1.0 / v_limit.rate;
        INSERT INTO awa.flow_rate_state (queue, tat) VALUES (p_queue, now())
        ON CONFLICT (queue) DO NOTHING;
        SELECT s.tat INTO v_tat FROM awa.flow_rate_state s WHERE s.queue = p_queue FOR UPDATE;
        v_tat := GREATEST(v_tat, now());
        v_jobs := floor((extract(epoch FROM now() - v_tat)
                         + COALESCE(v_limit.burst, GREATEST(1, ceil(v_limit.rate / 10)::integer))
                           * v_period) / v_period + 1e-9)::integer;
        v_jobs_left := GREATEST(v_jobs, 0);
        IF v_jobs_left = 0 THEN
            PERFORM awa.flow_release_v1(v_keys);
            v_wait := GREATEST(extract(epoch FROM v_tat - now())
                               - (COALESCE(v_limit.burst,
                                           GREATEST(1, ceil(v_limit.rate / 10)::integer)) - 1)
                                 * v_period, 0.001);
            RETURN NEXT ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, p_queue, NULL, NULL, v_wait,
                            NULL, NULL, NULL, NULL, NULL, NULL)::awa.claimed_v3;
            RETURN;
        END IF;
    END IF;
    v_units := v_remaining;

    -- Lane heads and order: as claim_v2.
    IF cardinality(v_lanes) > 1 THEN
        SELECT array_agg(h.run_at ORDER BY u.i) INTO v_heads
        FROM unnest(v_lanes, v_cursors) WITH ORDINALITY AS u(lane_id, c, i)
        LEFT JOIN LATERAL (
            SELECT e.run_at FROM awa.ready_entries e
            WHERE e.ready_slot = v_qslot AND e.lane_id = u.lane_id AND e.lane_seq > u.c
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.ready_slot = v_qslot AND t.lane_id = e.lane_id
                    AND t.lane_seq = e.lane_seq)
            ORDER BY e.lane_seq
            LIMIT 1) h ON true;
        FOR i IN 1..cardinality(v_lanes) LOOP
            CONTINUE WHEN v_heads[i] IS NOT NULL;
            SELECT e.run_at INTO v_head FROM awa.ready_entries e
            WHERE e.lane_id = v_lanes[i] AND e.lane_seq > v_cursors[i]
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq
            LIMIT 1;
            v_heads[i] := v_head;
        END LOOP;
    END IF;

    FOR r IN
        SELECT u.lane_id
        FROM unnest(v_lanes, v_priorities, v_heads) AS u(lane_id, priority, head)
        ORDER BY u.priority + floor(extract(epoch FROM now() - u.head) / v_aging) DESC NULLS LAST,
                 u.head, u.lane_id
    LOOP
        SELECT l.enqueue_seq INTO v_seq
        FROM awa.queue_lanes l WHERE l.lane_id = r.lane_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        SELECT c.generation, c.slot,
               CASE WHEN x.claim_generation = c.generation THEN x.lane_seq END
        INTO v_cgen, v_cslot, v_cursor
        FROM (SELECT r2.generation, r2.slot FROM awa.ring_rotations r2
              WHERE r2.ring = 'claim' ORDER BY r2.generation DESC LIMIT 1) c
        LEFT JOIN LATERAL (
            SELECT cl.lane_seq, cl.claim_generation FROM awa.claims cl
            WHERE cl.claim_slot = c.slot AND cl.lane_id = r.lane_id
            ORDER BY cl.lane_seq DESC LIMIT 1) x ON true;
        IF v_cursor IS NULL THEN
            v_cursor := awa.lane_cursor_v1(r.lane_id);
        END IF;
        -- The run of positions right after the cursor in the current queue slot, as claim_v2,
        -- taken while the running sum of weights fits the units left (a prefix: a job that
        -- does not fit stops the lane here, in order).
        WITH found AS MATERIALIZED (
            SELECT e.*,
                   EXISTS (SELECT 1 FROM awa.ready_tombstones t
                           WHERE t.ready_slot = v_qslot AND t.lane_id = e.lane_id
                             AND t.lane_seq = e.lane_seq) AS dead,
                   row_number() OVER (ORDER BY e.lane_seq) AS n
            FROM awa.ready_entries e
            WHERE e.ready_slot = v_qslot AND e.lane_id = r.lane_id AND e.lane_seq > v_cursor
            ORDER BY e.lane_seq
            LIMIT v_remaining
        ), weighed AS MATERIALIZED (
            SELECT f.*, COALESCE(awa._deadline_secs_v1(f.deadline_secs), v_default) AS timeout,
                   awa._job_weight_v1(f.metadata, v_wcap) AS w
            FROM found f
            WHERE f.lane_seq = v_cursor + f.n AND NOT f.dead
        ), picked AS MATERIALIZED (
            SELECT z.* FROM (
                SELECT g.*, sum(g.w) OVER (ORDER BY g.lane_seq) AS cw,
                       row_number() OVER (ORDER BY g.lane_seq) AS k
                FROM weighed g) z
            WHERE z.cw <= v_remaining AND z.k <= v_jobs_left
        ), ins AS (
            INSERT INTO awa.claims (
                claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
                lane_id, lane_seq, attempt, deadline_at, worker_id, kind)
            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot, p.ready_generation,
                   p.lane_id, p.lane_seq, p.attempt + 1,
                   now() + make_interval(secs => p.timeout), p_worker, p.kind
            FROM picked p
            RETURNING lane_seq, deadline_at
        )
        SELECT array_agg(ROW(p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint,
                             p.max_attempts, v_cslot, p.kind, p.args, p.queue, p.priority,
                             i.deadline_at, p.timeout, p.progress, p.metadata, p.tags,
                             p.errors, p.w, NULL)::awa.claimed_v3 ORDER BY p.lane_seq)
        INTO v_part
        FROM picked p JOIN ins i ON i.lane_seq = p.lane_seq;
        v_got := COALESCE(cardinality(v_part), 0);
        IF v_got > 0 THEN
            v_batch := v_batch || v_part;
            v_remaining := v_remaining - (SELECT sum(b.weight) FROM unnest(v_part) b)::integer;
            v_jobs_left := v_jobs_left - v_got;
        END IF;
        EXIT WHEN v_remaining <= 0 OR v_jobs_left <= 0;
        -- Then, when the lane may hold more, from every ready slot (as claim_v2).
        CONTINUE WHEN COALESCE(pg_sequence_last_value(v_seq), 0) <= v_cursor + v_got;
        IF v_got > 0 THEN
            v_cursor := awa.lane_cursor_v1(r.lane_id);  -- sees the claims just made
        END IF;
        WITH weighed AS MATERIALIZED (
            SELECT e.*, COALESCE(awa._deadline_secs_v1(e.deadline_secs), v_default) AS timeout,
                   awa._job_weight_v1(e.metadata, v_wcap) AS w
            FROM awa.ready_entries e
            WHERE e.lane_id = r.lane_id AND e.lane_seq > v_cursor
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq
            LIMIT v_remaining
        ), picked AS MATERIALIZED (
            SELECT z.* FROM (
                SELECT g.*, sum(g.w) OVER (ORDER BY g.lane_seq) AS cw,
                       row_number() OVER (ORDER BY g.lane_seq) AS k
                FROM weighed g) z
            WHERE z.cw <= v_remaining AND z.k <= v_jobs_left
        ), ins AS (
            INSERT INTO awa.claims (
                claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
                lane_id, lane_seq, attempt, deadline_at, worker_id, kind)
            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot, p.ready_generation,
                   p.lane_id, p.lane_seq, p.attempt + 1,
                   now() + make_interval(secs => p.timeout), p_worker, p.kind
            FROM picked p
            RETURNING lane_seq, deadline_at
        )
        SELECT array_agg(ROW(p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint,
                             p.max_attempts, v_cslot, p.kind, p.args, p.queue, p.priority,
                             i.deadline_at, p.timeout, p.progress, p.metadata, p.tags,
                             p.errors, p.w, NULL)::awa.claimed_v3 ORDER BY p.lane_seq)
        INTO v_part
        FROM picked p JOIN ins i ON i.lane_seq = p.lane_seq;
        v_got := COALESCE(cardinality(v_part), 0);
        IF v_got > 0 THEN
            v_batch := v_batch || v_part;
            v_remaining := v_remaining - (SELECT sum(b.weight) FROM unnest(v_part) b)::integer;
            v_jobs_left := v_jobs_left - v_got;
        END IF;
        EXIT WHEN v_remaining <= 0 OR v_jobs_left <= 0;
    END LOOP;

    v_jobs := cardinality(v_batch);
    v_used := v_units - v_remaining;
    IF v_limit.rate IS NOT NULL THEN
        IF v_jobs > 0 THEN
            UPDATE awa.flow_rate_state s
            SET tat = v_tat + make_interval(secs => v_jobs * v_period)
            WHERE s.queue = p_queue;
        END IF;
        IF v_jobs_left <= 0 THEN
            v_bound := true;
            v_wait := GREATEST(extract(epoch FROM v_tat - now()) + v_jobs * v_period
                               - (COALESCE(v_limit.burst,
                                           GREATEST(1, ceil(v_limit.rate / 10)::integer)) - 1)
                                 * v_period, 0.001);
        END IF;
    END IF;
    IF v_keys IS NOT NULL THEN
        -- Permits not needed after all (fewer or lighter jobs than units) go back at once.
        PERFORM awa.flow_release_v1(v_keys[v_used + 1:]);
        IF v_used < v_units THEN
            v_bound := v_bound AND v_jobs_left <= 0;  -- the lanes ran dry, not the permits
        END IF;
    END IF;
    RETURN QUERY
    SELECT b.job_id, b.run_lease, b.attempt, b.max_attempts, b.claim_slot, b.kind, b.args,
           b.queue, b.priority, b.deadline_at, b.timeout_secs, b.progress, b.metadata, b.tags,
           b.errors, b.weight,
           CASE WHEN v_keys IS NULL THEN NULL
                ELSE v_keys[(b.cw - b.weight + 1)::integer:b.cw::integer] END
    FROM (SELECT u.*, sum(u.weight) OVER (ORDER BY u.ord) AS cw
          FROM unnest(v_batch) WITH ORDINALITY
               AS u(job_id, run_lease, attempt, max_attempts, claim_slot, kind, args, queue,
                    priority, deadline_at, timeout_secs, progress, metadata, tags, errors,
                    weight, permits, ord)) b
    ORDER BY b.ord;
    IF v_bound THEN
        RETURN NEXT ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, p_queue, NULL, NULL, v_wait,
                        NULL, NULL, NULL, NULL, NULL, NULL)::awa.claimed_v3;
    END IF;
END
$$;

-- Write the limits the project's settings give (p_limits: {"queue": {"max_running": n | null,
-- "rate": r | null, "burst": b | null}, ...}) as source 'settings' rows; operator rows are left
-- alone; settings rows of queues p_limits does not name are removed. One transaction.
CREATE FUNCTION awa.flow_sync_v1(p_limits jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_changed integer := 0;
    v_n integer;
BEGIN
    IF p_limits IS NULL OR jsonb_typeof(p_limits) <> 'object' THEN
        RAISE EXCEPTION 'flow limits: expected a JSON object' USING ERRCODE = '22023';
    END IF;
    DELETE FROM awa.flow_limits f
    WHERE f.source = 'settings' AND NOT p_limits ? f.queue;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_changed := v_changed + v_n;
    INSERT INTO awa.flow_limits AS f (queue, max_running, rate, burst, max_seen, source,
                                      updated_by)
    SELECT e.key, (e.value ->> 'max_running')::integer, (e.value ->> 'rate')::double precision,
           (e.value ->> 'burst')::integer, (e.value ->> 'max_running')::integer, 'settings',
           'settings'
    FROM jsonb_each(p_limits) e
    ON CONFLICT (queue) DO UPDATE
    SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst,
        max_seen = GREATEST(f.max_running, f.max_seen, excluded.max_running),
        updated_by = 'settings', updated_at = now()
    WHERE f.source = 'settings'
      AND (f.max_running, f.rate, f.burst) IS DISTINCT FROM
          (excluded.max_running, excluded.rate, excluded.burst);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_changed + v_n;
END
$$;

-- Set (source 'operator') or clear the limits of one queue. Clearing removes the operator row;
-- p_settings (the project's settings for the queue, {"max_running", "rate", "burst"}, or NULL)
-- is then written as its 'settings' row. Returns the row now in force, if any.
CREATE FUNCTION awa.flow_set_v1(p_queue text, p_max_running integer, p_rate double precision,
                                p_burst integer, p_actor text, p_clear boolean,
                                p_settings jsonb DEFAULT NULL)
RETURNS SETOF awa.flow_limits
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT awa.valid_queue_name(p_queue) THEN
        RAISE EXCEPTION 'queue: % is not a valid queue name', quote_literal(p_queue)
            USING ERRCODE = '22023';
    END IF;
    IF p_clear THEN
        DELETE FROM awa.flow_limits f WHERE f.queue = p_queue;
        IF p_settings IS NOT NULL AND jsonb_typeof(p_settings) = 'object' THEN
            INSERT INTO awa.flow_limits (queue, max_running, rate, burst, max_seen, source,
                                         updated_by)
            VALUES (p_queue, (p_settings ->> 'max_running')::integer,
                    (p_settings ->> 'rate')::double precision,
                    (p_settings ->> 'burst')::integer, (p_settings ->> 'max_running')::integer,
                    'settings', p_actor);
        END IF;
    ELSE
        INSERT INTO awa.flow_limits AS f (queue, max_running, rate, burst, max_seen, source,
                                          updated_by)
        VALUES (p_queue, p_max_running, p_rate, p_burst, p_max_running, 'operator', p_actor)
        ON CONFLICT (queue) DO UPDATE
        SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst,
            max_seen = GREATEST(f.max_running, f.max_seen, excluded.max_running),
            source = 'operator', updated_by = p_actor, updated_at = now();
    END IF;
    RETURN QUERY SELECT * FROM awa.flow_limits f WHERE f.queue = p_queue;
END
$$;

-- Every queue with flow limits: the limits, their source, and the permits in use now.
CREATE FUNCTION awa.flow_status_v1()
RETURNS TABLE (queue text, max_running integer, in_use integer, rate double precision,
               burst integer, source text, updated_by text, updated_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT f.queue, f.max_running, u.in_use, f.rate, f.burst, f.source, f.updated_by,
           f.updated_at
    FROM awa.flow_limits f
    LEFT JOIN awa.flow_in_use_v1() u ON u.queue = f.queue
    ORDER BY f.queue
$$;
