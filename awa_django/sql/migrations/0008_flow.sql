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
-- Per-key serialisation: jobs enqueued with a serial key (metadata "awa:serial") of one queue
-- run one at a time, oldest first; see the section "Per-key serialisation" below.
--
-- Advisory-lock classes: 4282182 (permits), 4282183 (serial keys' run locks) and 4282184
-- (serial keys' decision locks) are this file's; see 0002_functions.sql for the others.

CREATE TABLE IF NOT EXISTS awa.flow_limits (
    queue text PRIMARY KEY CHECK (awa.valid_queue_name(queue)),
    max_running integer CHECK (max_running BETWEEN 1 AND 10000),
    rate double precision CHECK (rate >= 0.001 AND rate <= 1000000),
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
        metadata jsonb, tags text[], errors jsonb, weight integer, permits integer[],
        serial_lock integer, wait_secs double precision);
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

-- Free the permits and serial keys of awa worker processes that are gone but whose sessions
-- live on (frozen, wedged or partitioned: runtime row older than p_staleness seconds, or none):
-- their backends are terminated. Rows: pid, instance (application_name), action ('terminated' or
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
          AND l.classid IN (4282182::oid, 4282183::oid) AND l.pid <> pg_backend_pid()
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

-- Per-key serialisation -----------------------------------------------------------------------
--
-- A job enqueued with serial_key (metadata "awa:serial", docs/flow.md) runs only while no other
-- job of its key (per queue) runs, and after every older job of its key that is due. A key
-- is one number, awa._serial_lock_v1(queue, key), used in two advisory-lock classes:
--   4282183  the key's run lock: a session lock held by the claim connection of the worker
--            that runs the key's job, from its claim until the worker hands it back after the
--            handler really ended (like a permit; p_serial_release of its next claim, or
--            awa.serial_release_v1), or its session ends;
--   4282184  the key's decision lock: a transaction lock taken (without waiting) by a claim
--            before it decides about a job of the key, and (waiting, in key order) by a release
--            before it frees the run lock; so a claim that parks a job and the release that
--            would hand the key on never miss each other.
-- A claim takes a job with a key when the key's run lock is free (and not held by this session
-- for another attempt, p_serial_held), no older job of the key waits in awa.serial_waiting,
-- no older job of the key is ready in any lane of the queue (and unclaimed), and no earlier
-- row of this claim has the key. Otherwise the job is parked: its claim is closed at once
-- (outcome 'parked', no attempt counted; its run_lease is spent) and its body moves to
-- awa.serial_waiting. Releasing a key hands it on: the key's oldest waiting job goes back to
-- the ready ring (unless an older job of the key is still ready there: it runs first, and hands
-- on in turn). The maintenance leader sweeps keys that nobody will hand on (their run lock is
-- free: a worker died, or a ready head job was cancelled) with awa.serial_sweep_v1.
-- Collisions of two keys on one number only serialise them with each other.

CREATE TABLE IF NOT EXISTS awa.serial_waiting (
    job_id bigint PRIMARY KEY,
    lock_key integer NOT NULL,
    serial_key text NOT NULL,
    queue text NOT NULL,
    priority smallint NOT NULL,
    kind text NOT NULL,
    args jsonb NOT NULL,
    attempt smallint NOT NULL,
    max_attempts smallint NOT NULL,
    run_lease bigint NOT NULL,
    run_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    deadline_secs double precision,
    metadata jsonb,
    tags text[],
    errors jsonb,
    progress jsonb,
    parked_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS serial_waiting_key_idx ON awa.serial_waiting (lock_key, job_id);
CREATE INDEX IF NOT EXISTS serial_waiting_queue_idx ON awa.serial_waiting (queue, job_id);

-- The number of serial key p_key of queue p_queue (both lock classes use it). NULL: no key.
CREATE FUNCTION awa._serial_lock_v1(p_queue text, p_key text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtext(p_queue || '/' || p_key)
$$;

-- Ready rows of jobs with a key, by key, lane and position: the "older job of the key still
-- ready" test of claims and hand-offs reads a range of it per lane. Partial: rows without a
-- key (nearly all) cost nothing here.
CREATE INDEX IF NOT EXISTS ready_entries_serial_idx ON awa.ready_entries
    (awa._serial_lock_v1(queue, metadata ->> 'awa:serial'), lane_id, lane_seq, job_id)
    WHERE metadata ? 'awa:serial';

-- Whether a job of key p_lock older than p_job is ready and unclaimed in a lane of p_queue.
-- Per lane that may hold rows above p_bounds (the lane's cursor as known earlier: rows at or
-- below it are claimed; 0 when not given), the newest such row is compared with the lane's
-- cursor now.
CREATE FUNCTION awa._serial_older_ready_v1(p_queue text, p_lock integer, p_job bigint,
                                           p_lanes integer[] DEFAULT NULL,
                                           p_bounds bigint[] DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $$
DECLARE
    l record;
    c record;
BEGIN
    FOR l IN
        SELECT q.lane_id, COALESCE(u.b, 0) AS bound
        FROM awa.queue_lanes q
        LEFT JOIN unnest(p_lanes, p_bounds) AS u(lane_id, b) ON u.lane_id = q.lane_id
        WHERE q.queue = p_queue
          AND COALESCE(pg_sequence_last_value(q.enqueue_seq), 0) > COALESCE(u.b, 0)
    LOOP
        FOR c IN
            SELECT e.lane_seq, e.ready_slot
            FROM awa.ready_entries e
            WHERE e.metadata ? 'awa:serial'
              AND awa._serial_lock_v1(e.queue, e.metadata ->> 'awa:serial') = p_lock
              AND e.lane_id = l.lane_id AND e.lane_seq > l.bound AND e.job_id < p_job
            ORDER BY e.lane_seq DESC
        LOOP
            CONTINUE WHEN EXISTS (
                SELECT 1 FROM awa.ready_tombstones t
                WHERE t.lane_id = l.lane_id AND t.lane_seq = c.lane_seq
                  AND t.ready_slot = c.ready_slot);
            IF c.lane_seq > awa.lane_cursor_v1(l.lane_id) THEN
                RETURN true;
            END IF;
            EXIT;  -- the newest live one is claimed, so every older one is too
        END LOOP;
    END LOOP;
    RETURN false;
END
$$;

-- Hand key p_lock on: move its oldest waiting job back to the ready ring, unless an older job
-- of the key is ready there already (it runs first and hands on when it ends), or every lane
-- of the job's (queue, priority) is held by producers (the sweep tries again). The caller holds
-- the key's decision lock and knows its run lock is free. Returns the job moved, or NULL.
CREATE FUNCTION awa._serial_hand_off_v1(p_lock integer) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    w awa.serial_waiting%ROWTYPE;
    v_lane integer;
BEGIN
    -- SKIP LOCKED: a job being cancelled is passed over.
    SELECT * INTO w FROM awa.serial_waiting x
    WHERE x.lock_key = p_lock
    ORDER BY x.job_id
    LIMIT 1
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND OR awa._serial_older_ready_v1(w.queue, p_lock, w.job_id) THEN
        RETURN NULL;
    END IF;
    v_lane := awa._lane_for_v1(w.queue, w.priority, false);
    IF v_lane IS NULL THEN
        RETURN NULL;
    END IF;
    DELETE FROM awa.serial_waiting x WHERE x.job_id = w.job_id;
    PERFORM awa._append_ready_v1(v_lane, ARRAY[ROW(
        w.job_id, w.kind, w.queue, w.priority, w.args, w.attempt, w.max_attempts, w.run_lease,
        w.run_at, w.created_at, w.deadline_secs, w.metadata, w.tags, w.errors,
        w.progress)::awa.job_body]);
    RETURN w.job_id;
END
$$;

-- Hand back run locks of serial keys this session holds (keys from the serial_lock column of
-- claimed rows) and hand each key on. Waits, in key order, for claims deciding about the same
-- keys (short). A key this session no longer holds (released by an earlier statement whose
-- transaction then failed: session locks do not roll back) is still handed on when its run
-- lock is free. Returns how many were held.
CREATE FUNCTION awa.serial_release_v1(p_keys integer[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    k integer;
    v_n integer := 0;
BEGIN
    FOR k IN SELECT DISTINCT u.k FROM unnest(p_keys) AS u(k) WHERE u.k IS NOT NULL ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(4282184, k);
        IF pg_advisory_unlock(4282183, k) THEN
            v_n := v_n + 1;
        ELSIF pg_try_advisory_lock(4282183, k) THEN
            PERFORM pg_advisory_unlock(4282183, k);  -- not held here, and free
        ELSE
            CONTINUE;  -- another session's job of the key runs: it hands on when it ends
        END IF;
        IF EXISTS (SELECT 1 FROM awa.serial_waiting w WHERE w.lock_key = k) THEN
            PERFORM awa._serial_hand_off_v1(k);
        END IF;
    END LOOP;
    RETURN v_n;
END
$$;

-- Take again, after a reconnect, the run locks of keys whose jobs this session's process still
-- runs. Returns the keys it could not take (another worker's job of the key runs meanwhile:
-- until the two end, two jobs of the key may run at once, and the worker logs it).
CREATE FUNCTION awa.serial_retake_v1(p_keys integer[]) RETURNS integer[]
LANGUAGE sql AS $$
    SELECT COALESCE(array_agg(k), '{}')
    FROM unnest(COALESCE(p_keys, '{}')) AS k
    WHERE NOT pg_try_advisory_lock(4282183, k)
$$;

-- After a claim failed part-way: release (and hand on) every serial run lock this session
-- holds except p_keep (a session lock taken by a statement that then failed stays held), and
-- hand on p_release (keys whose release that claim carried: session locks do not roll back,
-- the hand-off did), except those in p_keep. Returns how many it released.
CREATE FUNCTION awa.serial_reset_v1(p_keep integer[], p_release integer[] DEFAULT NULL)
RETURNS integer
LANGUAGE sql AS $$
    SELECT awa.serial_release_v1(
        COALESCE(array_agg(k.key), '{}')
        || ARRAY(SELECT r FROM unnest(COALESCE(p_release, '{}')) AS r
                 WHERE NOT r = ANY (COALESCE(p_keep, '{}'))))
    FROM (
        SELECT CASE WHEN l.objid < 2147483648 THEN l.objid::bigint::integer
                    ELSE (l.objid::bigint - 4294967296)::integer END AS key
        FROM pg_locks l
        WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory' AND l.granted
          AND l.objsubid = 2 AND l.classid = 4282183::oid
    ) k
    WHERE NOT k.key = ANY (COALESCE(p_keep, '{}'))
$$;

-- Hand on the keys that nobody else will: keys with waiting jobs whose run lock is free (the
-- worker that held it died, or the job it was handed to was cancelled before it ran) and no
-- older job of the key is ready. Keys that a claim or a release is deciding about now are left
-- for the next call. Run by the maintenance leader after rescue. Returns the jobs moved back
-- to the ready ring.
CREATE FUNCTION awa.serial_sweep_v1(p_limit integer DEFAULT 1000)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    k integer;
    v_job bigint;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.serial_sweep_v1');
    FOR k IN
        SELECT w.lock_key
        FROM (SELECT DISTINCT x.lock_key FROM awa.serial_waiting x) w
        WHERE NOT EXISTS (
            SELECT 1 FROM pg_locks l
            WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
              AND l.classid = 4282183::oid
              AND l.objid = (w.lock_key::bigint & 4294967295)::oid
              AND l.database = (SELECT d.oid FROM pg_database d
                                WHERE d.datname = current_database()))
        ORDER BY w.lock_key
        LIMIT GREATEST(COALESCE(p_limit, 1000), 1)
    LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(4282184, k);
        -- Under the decision lock nobody takes the run lock: free now means free.
        CONTINUE WHEN NOT pg_try_advisory_lock(4282183, k);
        PERFORM pg_advisory_unlock(4282183, k);
        v_job := awa._serial_hand_off_v1(k);
        IF v_job IS NOT NULL THEN
            RETURN NEXT v_job;
        END IF;
    END LOOP;
END
$$;

-- The slow path of awa.claim_v3 for one lane whose next rows include a job with a serial key:
-- the lane's rows after p_cursor, in order (at most a bounded number looked at), each taken
-- (it fits in the units and jobs left; for a job with a key, as the file's header says) or
-- parked; the first job that would run but does not fit stops the lane, as does a key another
-- claim is deciding about (o_retry: claim again soon). p_taken: keys taken by this claim so
-- far; o_taken: with those of this lane.
CREATE FUNCTION awa._claim_serial_v1(
    p_lane integer, p_cursor bigint, p_cslot integer, p_cgen bigint, p_worker uuid,
    p_units integer, p_jobs integer, p_wcap integer, p_default double precision,
    p_held integer[], p_taken integer[], p_lanes integer[], p_bounds bigint[],
    OUT o_rows awa.claimed_v3[], OUT o_taken integer[], OUT o_units integer,
    OUT o_retry boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    e record;
    v_lock integer;
    v_park boolean;
    v_lease bigint;
    v_deadline timestamptz;
    v_scan integer := LEAST(LEAST(p_units, p_jobs) * 2 + 64, 512);
    v_seen integer := 0;
    v_jobs integer := 0;
BEGIN
    o_rows := '{}';
    o_taken := COALESCE(p_taken, '{}');
    o_units := 0;
    o_retry := false;
    FOR e IN
        SELECT x.*, COALESCE(awa._deadline_secs_v1(x.deadline_secs), p_default) AS timeout,
               awa._job_weight_v1(x.metadata, p_wcap) AS w,
               x.metadata ->> 'awa:serial' AS skey
        FROM awa.ready_entries x
        WHERE x.lane_id = p_lane AND x.lane_seq > p_cursor
          AND NOT EXISTS (
              SELECT 1 FROM awa.ready_tombstones t
              WHERE t.lane_id = x.lane_id AND t.lane_seq = x.lane_seq
                AND t.ready_slot = x.ready_slot)
        ORDER BY x.lane_seq
        LIMIT v_scan
    LOOP
        v_seen := v_seen + 1;
        v_park := false;
        v_lock := NULL;
        IF e.skey IS NULL THEN
            EXIT WHEN e.w > p_units - o_units OR v_jobs >= p_jobs;
        ELSE
            v_lock := awa._serial_lock_v1(e.queue, e.skey);
            IF v_lock = ANY (COALESCE(p_held, '{}')) OR v_lock = ANY (o_taken) THEN
                v_park := true;  -- a job of the key runs (here, or from this claim)
            ELSIF NOT pg_try_advisory_xact_lock(4282184, v_lock) THEN
                o_retry := true;  -- another claim or a release decides about the key now
                EXIT;
            ELSIF EXISTS (SELECT 1 FROM awa.serial_waiting w
                          WHERE w.lock_key = v_lock AND w.job_id < e.job_id) THEN
                v_park := true;  -- older jobs of the key wait
            ELSIF NOT pg_try_advisory_lock(4282183, v_lock) THEN
                v_park := true;  -- a job of the key runs elsewhere
            ELSIF awa._serial_older_ready_v1(e.queue, v_lock, e.job_id, p_lanes, p_bounds) THEN
                PERFORM pg_advisory_unlock(4282183, v_lock);
                v_park := true;  -- an older job of the key is ready: it goes first
            ELSIF e.w > p_units - o_units OR v_jobs >= p_jobs THEN
                PERFORM pg_advisory_unlock(4282183, v_lock);
                EXIT;  -- it would run, but does not fit: the lane stops here, in order
            END IF;
        END IF;
        v_lease := e.run_lease + 1;
        INSERT INTO awa.claims (
            claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
            lane_id, lane_seq, attempt, deadline_at, worker_id, kind)
        VALUES (p_cslot, p_cgen, e.job_id, v_lease, e.ready_slot, e.ready_generation, e.lane_id,
                e.lane_seq, e.attempt + 1, now() + make_interval(secs => e.timeout), p_worker,
                e.kind)
        RETURNING deadline_at INTO v_deadline;
        IF v_park THEN
            INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
            VALUES (p_cslot, e.job_id, v_lease, 'parked');
            INSERT INTO awa.serial_waiting (
                job_id, lock_key, serial_key, queue, priority, kind, args, attempt, max_attempts,
                run_lease, run_at, created_at, deadline_secs, metadata, tags, errors, progress)
            VALUES (e.job_id, v_lock, e.skey, e.queue, e.priority, e.kind, e.args, e.attempt,
                    e.max_attempts, v_lease, e.run_at, e.created_at, e.deadline_secs,
                    e.metadata, e.tags, e.errors, e.progress);
        ELSE
            o_rows := o_rows || ROW(e.job_id, v_lease, (e.attempt + 1)::smallint,
                                    e.max_attempts, p_cslot, e.kind, e.args, e.queue,
                                    e.priority, v_deadline, e.timeout, e.progress, e.metadata,
                                    e.tags, e.errors, e.w, NULL, v_lock,
                                    extract(epoch FROM now() - e.run_at)::double precision
                                   )::awa.claimed_v3;
            o_units := o_units + e.w;
            v_jobs := v_jobs + 1;
            IF v_lock IS NOT NULL THEN
                o_taken := o_taken || v_lock;
            END IF;
            EXIT WHEN o_units >= p_units OR v_jobs >= p_jobs;
        END IF;
    END LOOP;
    IF v_seen >= v_scan AND o_units < p_units AND v_jobs < p_jobs THEN
        o_retry := true;  -- looked at as many rows as allowed: the rest next claim, soon
    END IF;
END
$$;

-- Claim jobs of one queue within its flow limits: the contract and lane order of claim_v2 (see
-- its comment), with weights, permits and the rate limit.
--   p_max         execution units the worker has free (a job takes its weight)
--   p_max_weight  the most units the worker could ever give one job (weights are capped to it)
--   p_held        permits this session holds for attempts still running (never taken twice)
--   p_release     permits to hand back first (attempts that ended)
--   p_serial_held, p_serial_release   the same for serial keys' run locks
-- Each job row carries its weight and, on a queue with a concurrency limit, the permit keys it
-- holds (hand them back with p_release, or awa.flow_release_v1, when its handler ends); a job
-- with a serial key carries its run lock in serial_lock (hand it back with p_serial_release,
-- or awa.serial_release_v1); wait_secs is how long it waited since it was due (run_at), on the
-- database clock (the queue-wait histogram). A marker row (job_id NULL) ends the result when a flow limit held
-- the claim back (see the file's header), or with timeout_secs 0.02 when a serial key being
-- decided by another claim stopped a lane. Also with p_max = 0, p_release and p_serial_release
-- are applied.
CREATE FUNCTION awa.claim_v3(
    p_queue text, p_max integer, p_worker uuid DEFAULT NULL,
    p_aging_secs double precision DEFAULT 60, p_default_deadline double precision DEFAULT NULL,
    p_max_weight integer DEFAULT NULL, p_held integer[] DEFAULT NULL,
    p_release integer[] DEFAULT NULL, p_serial_held integer[] DEFAULT NULL,
    p_serial_release integer[] DEFAULT NULL)
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
    v_row awa.claimed_v3;
    v_weight integer;
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
    v_all_lanes integer[];
    v_all_cursors bigint[];
    v_serial_at bigint;
    v_taken integer[] := '{}';
    v_retry boolean := false;
    -- The claim's time: now(), or for a rate-limited queue the clock once its rate state is
    -- locked (claims of the queue are serialised there, so their times only move forward:
    -- a claim whose transaction began before the last one committed never sees the state
    -- "ahead" and gives tokens back). Written as the attempts' claimed_at.
    v_now timestamptz := now();
    v_srows awa.claimed_v3[];
    v_sunits integer;
    v_sretry boolean;
    r record;
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'awa.claim_v3 needs READ COMMITTED isolation' USING ERRCODE = '25000';
    END IF;
    IF p_release IS NOT NULL THEN
        PERFORM awa.flow_release_v1(p_release);
    END IF;
    IF p_serial_release IS NOT NULL THEN
        PERFORM awa.serial_release_v1(p_serial_release);
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
    -- Every lane's cursor is kept too: a lower bound of it for the serial-key tests below.
    SELECT array_agg(b.lane_id ORDER BY b.lane_id) FILTER (WHERE b.work),
           array_agg(b.priority ORDER BY b.lane_id) FILTER (WHERE b.work),
           array_agg(b.c ORDER BY b.lane_id) FILTER (WHERE b.work),
           array_agg(b.lane_id), array_agg(b.c)
    INTO v_lanes, v_priorities, v_cursors, v_all_lanes, v_all_cursors
    FROM (SELECT b0.*, COALESCE(pg_sequence_last_value(b0.enqueue_seq), 0) > b0.c AS work
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
    ) b0) b;
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
                            NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::awa.claimed_v3;
            RETURN;
        END IF;
    END IF;
    IF v_limit.rate IS NOT NULL THEN
        v_period := 1.0 / v_limit.rate;
        INSERT INTO awa.flow_rate_state (queue, tat) VALUES (p_queue, now())
        ON CONFLICT (queue) DO NOTHING;
        SELECT s.tat INTO v_tat FROM awa.flow_rate_state s WHERE s.queue = p_queue FOR UPDATE;
        v_now := clock_timestamp();
        -- Never further ahead than the current limits allow (burst × T): a state left by a
        -- slower rate, or by a cleared one, holds nothing back once the limit is raised.
        IF v_tat > v_now + make_interval(secs => COALESCE(
                v_limit.burst, GREATEST(1, ceil(v_limit.rate / 10)::integer)) * v_period) THEN
            v_tat := v_now + make_interval(secs => COALESCE(
                v_limit.burst, GREATEST(1, ceil(v_limit.rate / 10)::integer)) * v_period);
            UPDATE awa.flow_rate_state s SET tat = v_tat WHERE s.queue = p_queue;
        END IF;
        v_tat := GREATEST(v_tat, v_now);
        v_jobs := floor((extract(epoch FROM v_now - v_tat)
                         + COALESCE(v_limit.burst, GREATEST(1, ceil(v_limit.rate / 10)::integer))
                           * v_period) / v_period + 1e-9)::integer;
        v_jobs_left := GREATEST(v_jobs, 0);
        IF v_jobs_left = 0 THEN
            PERFORM awa.flow_release_v1(v_keys);
            v_wait := GREATEST(extract(epoch FROM v_tat - v_now)
                               - (COALESCE(v_limit.burst,
                                           GREATEST(1, ceil(v_limit.rate / 10)::integer)) - 1)
                                 * v_period, 0.001);
            RETURN NEXT ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, p_queue, NULL, NULL, v_wait,
                            NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::awa.claimed_v3;
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
                   awa._job_weight_v1(f.metadata, v_wcap) AS w,
                   COALESCE(f.metadata ? 'awa:serial', false) AS s
            FROM found f
            WHERE f.lane_seq = v_cursor + f.n AND NOT f.dead
        ), picked AS MATERIALIZED (
            -- Up to the first job with a serial key (the slow path below decides about it).
            SELECT z.* FROM (
                SELECT g.*, sum(g.w) OVER (ORDER BY g.lane_seq) AS cw,
                       row_number() OVER (ORDER BY g.lane_seq) AS k,
                       bool_or(g.s) OVER (ORDER BY g.lane_seq) AS sk
                FROM weighed g) z
            WHERE z.cw <= v_remaining AND z.k <= v_jobs_left AND NOT z.sk
        ), ins AS (
            INSERT INTO awa.claims (
                claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
                lane_id, lane_seq, attempt, deadline_at, worker_id, kind, claimed_at)
            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot, p.ready_generation,
                   p.lane_id, p.lane_seq, p.attempt + 1,
                   now() + make_interval(secs => p.timeout), p_worker, p.kind, v_now
            FROM picked p
        )
        -- The rows of picked, not a join with ins (the planner, expecting one row from each,
        -- joined them in a nested loop: 512² comparisons): ins runs to completion anyway, and
        -- now() is the statement's, so the deadline is the one written.
        SELECT array_agg(ROW(p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint,
                             p.max_attempts, v_cslot, p.kind, p.args, p.queue, p.priority,
                             now() + make_interval(secs => p.timeout), p.timeout, p.progress,
                             p.metadata, p.tags, p.errors, p.w, NULL, NULL,
                             extract(epoch FROM now() - p.run_at)::double precision
                            )::awa.claimed_v3
                         ORDER BY p.lane_seq),
               COALESCE(sum(p.w), 0), (SELECT min(g.lane_seq) FROM weighed g WHERE g.s)
        INTO v_part, v_weight, v_serial_at
        FROM picked p;
        v_got := COALESCE(cardinality(v_part), 0);
        IF v_got > 0 THEN
            v_batch := v_batch || v_part;
            v_remaining := v_remaining - v_weight;
            v_jobs_left := v_jobs_left - v_got;
        END IF;
        EXIT WHEN v_remaining <= 0 OR v_jobs_left <= 0;
        IF v_serial_at IS NOT NULL THEN
            -- A job with a serial key is next: the rest of this lane takes the slow path.
            SELECT x.o_rows, x.o_taken, x.o_units, x.o_retry
            INTO v_srows, v_taken, v_sunits, v_sretry
            FROM awa._claim_serial_v1(r.lane_id, awa.lane_cursor_v1(r.lane_id), v_cslot, v_cgen,
                                      p_worker, v_remaining, v_jobs_left, v_wcap, v_default,
                                      p_serial_held, v_taken, v_all_lanes, v_all_cursors) x;
            v_retry := v_retry OR v_sretry;
            IF cardinality(v_srows) > 0 THEN
                v_batch := v_batch || v_srows;
                v_remaining := v_remaining - v_sunits;
                v_jobs_left := v_jobs_left - cardinality(v_srows);
            END IF;
            EXIT WHEN v_remaining <= 0 OR v_jobs_left <= 0;
            CONTINUE;
        END IF;
        -- Then, when the lane may hold more, from every ready slot (as claim_v2).
        CONTINUE WHEN COALESCE(pg_sequence_last_value(v_seq), 0) <= v_cursor + v_got;
        IF v_got > 0 THEN
            v_cursor := awa.lane_cursor_v1(r.lane_id);  -- sees the claims just made
        END IF;
        WITH weighed AS MATERIALIZED (
            SELECT e.*, COALESCE(awa._deadline_secs_v1(e.deadline_secs), v_default) AS timeout,
                   awa._job_weight_v1(e.metadata, v_wcap) AS w,
                   COALESCE(e.metadata ? 'awa:serial', false) AS s
            FROM awa.ready_entries e
            WHERE e.lane_id = r.lane_id AND e.lane_seq > v_cursor
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq
            LIMIT v_remaining
        ), picked AS MATERIALIZED (
            -- Up to the first job with a serial key (the slow path below decides about it).
            SELECT z.* FROM (
                SELECT g.*, sum(g.w) OVER (ORDER BY g.lane_seq) AS cw,
                       row_number() OVER (ORDER BY g.lane_seq) AS k,
                       bool_or(g.s) OVER (ORDER BY g.lane_seq) AS sk
                FROM weighed g) z
            WHERE z.cw <= v_remaining AND z.k <= v_jobs_left AND NOT z.sk
        ), ins AS (
            INSERT INTO awa.claims (
                claim_slot, claim_generation, job_id, run_lease, ready_slot, ready_generation,
                lane_id, lane_seq, attempt, deadline_at, worker_id, kind, claimed_at)
            SELECT v_cslot, v_cgen, p.job_id, p.run_lease + 1, p.ready_slot, p.ready_generation,
                   p.lane_id, p.lane_seq, p.attempt + 1,
                   now() + make_interval(secs => p.timeout), p_worker, p.kind, v_now
            FROM picked p
        )
        -- The rows of picked, not a join with ins (the planner, expecting one row from each,
        -- joined them in a nested loop: 512² comparisons): ins runs to completion anyway, and
        -- now() is the statement's, so the deadline is the one written.
        SELECT array_agg(ROW(p.job_id, p.run_lease + 1, (p.attempt + 1)::smallint,
                             p.max_attempts, v_cslot, p.kind, p.args, p.queue, p.priority,
                             now() + make_interval(secs => p.timeout), p.timeout, p.progress,
                             p.metadata, p.tags, p.errors, p.w, NULL, NULL,
                             extract(epoch FROM now() - p.run_at)::double precision
                            )::awa.claimed_v3
                         ORDER BY p.lane_seq),
               COALESCE(sum(p.w), 0), (SELECT min(g.lane_seq) FROM weighed g WHERE g.s)
        INTO v_part, v_weight, v_serial_at
        FROM picked p;
        v_got := COALESCE(cardinality(v_part), 0);
        IF v_got > 0 THEN
            v_batch := v_batch || v_part;
            v_remaining := v_remaining - v_weight;
            v_jobs_left := v_jobs_left - v_got;
        END IF;
        EXIT WHEN v_remaining <= 0 OR v_jobs_left <= 0;
        IF v_serial_at IS NOT NULL THEN
            -- A job with a serial key is next: the rest of this lane takes the slow path.
            SELECT x.o_rows, x.o_taken, x.o_units, x.o_retry
            INTO v_srows, v_taken, v_sunits, v_sretry
            FROM awa._claim_serial_v1(r.lane_id, awa.lane_cursor_v1(r.lane_id), v_cslot, v_cgen,
                                      p_worker, v_remaining, v_jobs_left, v_wcap, v_default,
                                      p_serial_held, v_taken, v_all_lanes, v_all_cursors) x;
            v_retry := v_retry OR v_sretry;
            IF cardinality(v_srows) > 0 THEN
                v_batch := v_batch || v_srows;
                v_remaining := v_remaining - v_sunits;
                v_jobs_left := v_jobs_left - cardinality(v_srows);
            END IF;
            EXIT WHEN v_remaining <= 0 OR v_jobs_left <= 0;
            CONTINUE;
        END IF;
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
            v_wait := GREATEST(extract(epoch FROM v_tat - v_now) + v_jobs * v_period
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
    -- Each job with its share of the permits, in claim order (no SQL statement: a loop).
    v_used := 0;
    FOREACH v_row IN ARRAY v_batch LOOP
        IF v_keys IS NOT NULL THEN
            v_row.permits := v_keys[v_used + 1:v_used + v_row.weight];
            v_used := v_used + v_row.weight;
        END IF;
        RETURN NEXT v_row;
    END LOOP;
    IF v_retry AND v_remaining > 0 AND v_jobs_left > 0 THEN
        -- A serial key was being decided by another claim, or rows are left to look at: claim
        -- again soon rather than after a poll interval.
        v_bound := true;
        v_wait := 0.02;
    END IF;
    IF v_bound THEN
        RETURN NEXT ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, p_queue, NULL, NULL, v_wait,
                        NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::awa.claimed_v3;
    END IF;
END
$$;

-- Write the limits the project's settings give (p_limits: {"queue": {"max_running": n | null,
-- "rate": r | null, "burst": b | null}, ...}) as source 'settings' rows; operator rows are left
-- alone; settings rows of queues p_limits does not name lose their limits. One transaction.
CREATE FUNCTION awa.flow_sync_v1(p_limits jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_changed integer := 0;
    v_n integer;
BEGIN
    IF p_limits IS NULL OR jsonb_typeof(p_limits) <> 'object' THEN
        RAISE EXCEPTION 'flow limits: expected a JSON object' USING ERRCODE = '22023';
    END IF;
    -- Settings rows of queues the settings no longer limit lose their limits; the row stays,
    -- so that max_seen keeps counting permits still held if a limit comes back.
    UPDATE awa.flow_limits f SET max_running = NULL, rate = NULL, burst = NULL,
                                 updated_by = 'settings', updated_at = now()
    WHERE f.source = 'settings' AND NOT p_limits ? f.queue
      AND (f.max_running IS NOT NULL OR f.rate IS NOT NULL);
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

-- Set (source 'operator') or clear the limits of one queue. Clearing replaces the operator's
-- limits with p_settings (the project's settings for the queue, {"max_running", "rate",
-- "burst"}, or NULL: none), as a 'settings' row (a row without limits limits nothing). Returns
-- the row now in force, if it limits anything.
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
        -- An upsert, not a delete and an insert: concurrent changes of one queue serialise on
        -- its row, and max_seen keeps counting permits still held above the new limit.
        IF p_settings IS NULL OR jsonb_typeof(p_settings) <> 'object'
           OR (p_settings ->> 'max_running') IS NULL AND (p_settings ->> 'rate') IS NULL THEN
            UPDATE awa.flow_limits f
            SET max_running = NULL, rate = NULL, burst = NULL, source = 'settings',
                updated_by = p_actor, updated_at = now()
            WHERE f.queue = p_queue;
            RETURN;
        END IF;
        INSERT INTO awa.flow_limits AS f (queue, max_running, rate, burst, max_seen, source,
                                          updated_by)
        VALUES (p_queue, (p_settings ->> 'max_running')::integer,
                (p_settings ->> 'rate')::double precision,
                (p_settings ->> 'burst')::integer, (p_settings ->> 'max_running')::integer,
                'settings', p_actor)
        ON CONFLICT (queue) DO UPDATE
        SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst,
            max_seen = GREATEST(f.max_running, f.max_seen, excluded.max_running),
            source = 'settings', updated_by = p_actor, updated_at = now();
    ELSE
        INSERT INTO awa.flow_limits AS f (queue, max_running, rate, burst, max_seen, source,
                                          updated_by)
        VALUES (p_queue, p_max_running, p_rate, p_burst, p_max_running, 'operator', p_actor)
        ON CONFLICT (queue) DO UPDATE
        SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst,
            max_seen = GREATEST(f.max_running, f.max_seen, excluded.max_running),
            source = 'operator', updated_by = p_actor, updated_at = now();
    END IF;
    RETURN QUERY SELECT * FROM awa.flow_limits f
                 WHERE f.queue = p_queue AND (f.max_running IS NOT NULL OR f.rate IS NOT NULL);
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
    WHERE f.max_running IS NOT NULL OR f.rate IS NOT NULL
    ORDER BY f.queue
$$;

-- Parked jobs on the read surfaces and the operator's paths ------------------------------------
--
-- A job parked behind its serial key (awa.serial_waiting) is available to everyone but the
-- claim: awa.live_jobs (and so awa.jobs, the queue counts and awa_status) shows it as
-- 'available'; cancel (awa.cancel_v1) and queue drain (awa.queue_drain_v2) remove it with a
-- cancelled terminal row; unique keys (awa._job_brief_v1) keep blocking while it waits; a
-- burst worker (awa.queues_idle_v1) does not stop while one waits. These are the bodies of
-- migrations 0002 and 0005 with the parked plane added (sql/reverse/0008_flow.sql restores
-- them).

CREATE OR REPLACE FUNCTION awa._job_brief_v1(p_job_id bigint)
RETURNS TABLE (state text, queue text, priority integer)
LANGUAGE sql STABLE AS $$
    SELECT b.state, b.queue, b.priority FROM (
        SELECT 1 AS o, d.state, d.queue, d.priority::integer
        FROM awa.deferred_jobs d WHERE d.job_id = p_job_id
        UNION ALL
        SELECT 2, 'failed', q.queue, q.priority::integer
        FROM awa.dlq_entries q WHERE q.job_id = p_job_id
        UNION ALL
        SELECT 2, 'available', w.queue, w.priority::integer
        FROM awa.serial_waiting w WHERE w.job_id = p_job_id
        UNION ALL
        (SELECT 3, CASE WHEN EXISTS (
                        SELECT 1 FROM awa.leases ls
                        WHERE ls.job_id = c.job_id AND ls.run_lease = c.run_lease
                          AND ls.state = 'waiting_external')
                   THEN 'waiting_external' ELSE 'running' END,
                l.queue, l.priority::integer
         FROM awa.claims c JOIN awa.queue_lanes l ON l.lane_id = c.lane_id
         WHERE c.job_id = p_job_id
           AND NOT EXISTS (
               SELECT 1 FROM awa.claim_closures z
               WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                 AND z.claim_slot = c.claim_slot)
         ORDER BY c.run_lease DESC LIMIT 1)
        UNION ALL
        (SELECT 4, 'available', l.queue, l.priority::integer
         FROM awa.ready_entries e JOIN awa.queue_lanes l ON l.lane_id = e.lane_id
         WHERE e.job_id = p_job_id
           AND e.lane_seq > awa.lane_cursor_v1(e.lane_id)
           AND NOT EXISTS (
               SELECT 1 FROM awa.ready_tombstones t
               WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                 AND t.ready_slot = e.ready_slot)
         LIMIT 1)
        UNION ALL
        (SELECT 5, t.state, t.queue, l.priority::integer
         FROM awa.done_entries t LEFT JOIN awa.queue_lanes l ON l.lane_id = t.lane_id
         WHERE t.job_id = p_job_id
         ORDER BY t.finalized_at DESC LIMIT 1)
    ) b
    ORDER BY b.o
    LIMIT 1
$$;

CREATE OR REPLACE FUNCTION awa.cancel_v1(p_job_id bigint, p_reason text DEFAULT 'cancelled')
RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_try integer := 0;
    v_gen bigint;
    v_slot integer;
    v_state text;
    d awa.deferred_jobs%ROWTYPE;
    w awa.serial_waiting%ROWTYPE;
    c awa.claims%ROWTYPE;
    r awa.ready_entries%ROWTYPE;
    v_error jsonb;
BEGIN
    -- The bounds of awa_django.cancel (limits.MAX_TEXT), for callers that skip Python.
    IF p_reason IS NULL THEN
        RAISE EXCEPTION 'reason: must be text, not NULL' USING ERRCODE = '22023';
    ELSIF length(p_reason) > 10000 THEN
        RAISE EXCEPTION 'reason: % characters exceeds the limit of 10000', length(p_reason)
            USING ERRCODE = '22023';
    END IF;
    v_error := jsonb_build_object('type', 'Cancelled', 'message', p_reason);
    PERFORM awa._require_read_committed_v1('awa.cancel_v1');
    WHILE v_try < 5 LOOP
        v_try := v_try + 1;

        DELETE FROM awa.deferred_jobs WHERE job_id = p_job_id RETURNING * INTO d;
        IF FOUND THEN
            SELECT generation, slot INTO v_gen, v_slot
            FROM awa.ring_rotations WHERE ring = 'queue' ORDER BY generation DESC LIMIT 1;
            INSERT INTO awa.done_entries (
                ready_slot, ready_generation, job_id, run_lease, state, attempt, attempted_at,
                errors, progress, kind, queue, priority, args, max_attempts, run_at, created_at,
                metadata, tags)
            VALUES (v_slot, v_gen, d.job_id, d.run_lease, 'cancelled', d.attempt, d.attempted_at,
                    COALESCE(d.errors, '[]'::jsonb)
                    || jsonb_build_array(v_error || jsonb_build_object('attempt', d.attempt, 'at', now())),
                    d.progress, d.kind, d.queue, d.priority, d.args, d.max_attempts, d.run_at,
                    d.created_at, d.metadata, d.tags);
            RETURN d.state;
        END IF;

        -- Parked behind its serial key: available, in the eyes of everyone but the claim.
        DELETE FROM awa.serial_waiting WHERE job_id = p_job_id RETURNING * INTO w;
        IF FOUND THEN
            SELECT generation, slot INTO v_gen, v_slot
            FROM awa.ring_rotations WHERE ring = 'queue' ORDER BY generation DESC LIMIT 1;
            INSERT INTO awa.done_entries (
                ready_slot, ready_generation, job_id, run_lease, state, attempt, attempted_at,
                errors, progress, kind, queue, priority, args, max_attempts, run_at, created_at,
                metadata, tags)
            VALUES (v_slot, v_gen, w.job_id, w.run_lease, 'cancelled', w.attempt, NULL,
                    COALESCE(w.errors, '[]'::jsonb)
                    || jsonb_build_array(v_error || jsonb_build_object('attempt', w.attempt, 'at', now())),
                    w.progress, w.kind, w.queue, w.priority, w.args, w.max_attempts, w.run_at,
                    w.created_at, w.metadata, w.tags);
            RETURN 'available';
        END IF;

        SELECT * INTO c FROM awa.claims cl
        WHERE cl.job_id = p_job_id
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = cl.job_id AND z.run_lease = cl.run_lease AND z.claim_slot = cl.claim_slot)
        ORDER BY cl.run_lease DESC LIMIT 1;
        IF FOUND THEN
            INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
            VALUES (c.claim_slot, c.job_id, c.run_lease, 'cancel')
            ON CONFLICT DO NOTHING;
            IF NOT FOUND THEN
                CONTINUE;  -- another closer won; look again
            END IF;
            v_state := CASE WHEN EXISTS (
                SELECT 1 FROM awa.leases ls
                WHERE ls.job_id = c.job_id AND ls.run_lease = c.run_lease
                  AND ls.state = 'waiting_external') THEN 'waiting_external' ELSE 'running' END;
            INSERT INTO awa.done_entries (
                ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
                attempted_at, errors, progress, queue, kind)
            SELECT c.ready_slot, c.ready_generation, c.job_id, c.run_lease, c.lane_id, c.lane_seq,
                   'cancelled', c.attempt, c.claimed_at,
                   COALESCE(e.errors, '[]'::jsonb)
                   || jsonb_build_array(v_error || jsonb_build_object('attempt', c.attempt, 'at', now())),
                   COALESCE(s.progress, e.progress), e.queue, e.kind
            FROM awa.ready_entries e
            LEFT JOIN awa.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
            WHERE e.lane_id = c.lane_id AND e.lane_seq = c.lane_seq AND e.ready_slot = c.ready_slot;
            DELETE FROM awa.attempt_state WHERE job_id = c.job_id AND run_lease = c.run_lease;
            PERFORM pg_notify('awa_cancel',
                              json_build_object('id', c.job_id, 'lease', c.run_lease)::text);
            RETURN v_state;
        END IF;

        SELECT * INTO r FROM awa.ready_entries e
        WHERE e.job_id = p_job_id
          AND NOT EXISTS (
              SELECT 1 FROM awa.ready_tombstones t
              WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.ready_slot = e.ready_slot)
        ORDER BY e.run_lease DESC, e.lane_seq DESC LIMIT 1;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        -- Serialise with claimers of the lane, then look again with a fresh snapshot.
        PERFORM 1 FROM awa.queue_lanes l WHERE l.lane_id = r.lane_id FOR UPDATE;
        IF r.lane_seq <= awa.lane_cursor_v1(r.lane_id) THEN
            CONTINUE;  -- claimed meanwhile (or long ago): look for the open claim
        END IF;
        INSERT INTO awa.ready_tombstones (ready_slot, ready_generation, lane_id, lane_seq, job_id)
        VALUES (r.ready_slot, r.ready_generation, r.lane_id, r.lane_seq, r.job_id)
        ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            RETURN NULL;  -- cancelled concurrently
        END IF;
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
            errors, progress, queue, kind)
        VALUES (r.ready_slot, r.ready_generation, r.job_id, r.run_lease, r.lane_id, r.lane_seq,
                'cancelled', r.attempt,
                COALESCE(r.errors, '[]'::jsonb)
                || jsonb_build_array(v_error || jsonb_build_object('attempt', r.attempt, 'at', now())),
                r.progress, r.queue, r.kind);
        PERFORM awa._lane_skip_v1(r.lane_id);
        RETURN 'available';
    END LOOP;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION awa.queue_drain_v2(p_queue text, p_limit integer DEFAULT 1000,
                                   p_max_job_id bigint DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_error jsonb := jsonb_build_object('type', 'Cancelled', 'message', 'queue drained');
    v_gen bigint;
    v_slot integer;
    v_lane integer;
    v_cursor bigint;
    v_n integer := 0;
    v_got integer;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.queue_drain_v2');
    IF NOT awa.valid_queue_name(p_queue) THEN
        RAISE EXCEPTION 'queue: % is not a valid queue name ([a-z0-9_.-]{1,63})', quote_nullable(p_queue)
            USING ERRCODE = '22023';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'limit: must be at least 1' USING ERRCODE = '22023';
    END IF;
    SELECT generation, slot INTO v_gen, v_slot
    FROM awa.ring_rotations WHERE ring = 'queue' ORDER BY generation DESC LIMIT 1;
    WITH gone AS (
        DELETE FROM awa.deferred_jobs d
        WHERE d.job_id IN (
            SELECT d2.job_id FROM awa.deferred_jobs d2
            WHERE d2.queue = p_queue AND (p_max_job_id IS NULL OR d2.job_id <= p_max_job_id)
            ORDER BY d2.job_id LIMIT p_limit
            FOR UPDATE SKIP LOCKED)
        RETURNING d.*
    )
    INSERT INTO awa.done_entries (
        ready_slot, ready_generation, job_id, run_lease, state, attempt, attempted_at, errors,
        progress, kind, queue, priority, args, max_attempts, run_at, created_at, metadata, tags)
    SELECT v_slot, v_gen, g.job_id, g.run_lease, 'cancelled', g.attempt, g.attempted_at,
           COALESCE(g.errors, '[]'::jsonb)
           || jsonb_build_array(v_error || jsonb_build_object('attempt', g.attempt, 'at', now())),
           g.progress, g.kind, g.queue, g.priority, g.args, g.max_attempts, g.run_at, g.created_at,
           g.metadata, g.tags
    FROM gone g;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    -- Jobs parked behind their serial keys.
    WITH gone AS (
        DELETE FROM awa.serial_waiting w
        WHERE w.job_id IN (
            SELECT w2.job_id FROM awa.serial_waiting w2
            WHERE w2.queue = p_queue AND (p_max_job_id IS NULL OR w2.job_id <= p_max_job_id)
            ORDER BY w2.job_id LIMIT GREATEST(p_limit - v_n, 0)
            FOR UPDATE SKIP LOCKED)
        RETURNING w.*
    )
    INSERT INTO awa.done_entries (
        ready_slot, ready_generation, job_id, run_lease, state, attempt, errors, progress, kind,
        queue, priority, args, max_attempts, run_at, created_at, metadata, tags)
    SELECT v_slot, v_gen, g.job_id, g.run_lease, 'cancelled', g.attempt,
           COALESCE(g.errors, '[]'::jsonb)
           || jsonb_build_array(v_error || jsonb_build_object('attempt', g.attempt, 'at', now())),
           g.progress, g.kind, g.queue, g.priority, g.args, g.max_attempts, g.run_at, g.created_at,
           g.metadata, g.tags
    FROM gone g;
    GET DIAGNOSTICS v_got = ROW_COUNT;
    v_n := v_n + v_got;

    FOR v_lane IN SELECT l.lane_id FROM awa.queue_lanes l WHERE l.queue = p_queue ORDER BY l.lane_id
    LOOP
        EXIT WHEN v_n >= p_limit;
        PERFORM 1 FROM awa.queue_lanes l WHERE l.lane_id = v_lane FOR UPDATE;
        v_cursor := awa.lane_cursor_v1(v_lane);
        WITH picked AS MATERIALIZED (
            SELECT e.* FROM awa.ready_entries e
            WHERE e.lane_id = v_lane AND e.lane_seq > v_cursor
              AND (p_max_job_id IS NULL OR e.job_id <= p_max_job_id)
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
            ORDER BY e.lane_seq
            LIMIT p_limit - v_n
        ), tomb AS (
            INSERT INTO awa.ready_tombstones (ready_slot, ready_generation, lane_id, lane_seq, job_id)
            SELECT p.ready_slot, p.ready_generation, p.lane_id, p.lane_seq, p.job_id FROM picked p
            ON CONFLICT DO NOTHING
            RETURNING lane_id, lane_seq, ready_slot
        )
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
            errors, progress, queue, kind)
        SELECT p.ready_slot, p.ready_generation, p.job_id, p.run_lease, p.lane_id, p.lane_seq,
               'cancelled', p.attempt,
               COALESCE(p.errors, '[]'::jsonb)
               || jsonb_build_array(v_error || jsonb_build_object('attempt', p.attempt, 'at', now())),
               p.progress, p.queue, p.kind
        FROM picked p
        JOIN tomb t ON t.lane_id = p.lane_id AND t.lane_seq = p.lane_seq AND t.ready_slot = p.ready_slot;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_n := v_n + v_got;
        PERFORM awa._lane_skip_v1(v_lane);
    END LOOP;
    RETURN v_n;
END
$$;

CREATE OR REPLACE FUNCTION awa.queues_idle_v1(p_queues text[])
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
$$;

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
FROM awa.serial_waiting w;
