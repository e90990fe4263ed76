-- The advisory-lock key (class 4282182) of permit p_i of queue p_queue.
CREATE OR REPLACE FUNCTION awa._flow_key_v1(p_queue text, p_i integer)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT hashtext(p_queue || '/' || p_i::text)
$$;

-- Take, of the permit keys p_keys (permits above a limit, which no claim takes while the limit
-- holds), those that are free, for this session, skipping those it holds or hands out already
-- (p_held: advisory locks are re-entrant, so one would be "taken" twice). Returns the keys taken
-- (a key another session holds is passed over).
CREATE OR REPLACE FUNCTION awa._flow_take_above_v1(p_keys integer[], p_held integer[])
 RETURNS integer[]
 LANGUAGE sql
AS $$
    SELECT COALESCE(array_agg(k.k ORDER BY k.i), '{}')
    FROM unnest(p_keys) WITH ORDINALITY AS k(k, i)
    WHERE CASE WHEN k.k = ANY (COALESCE(p_held, '{}')) THEN false
               ELSE pg_try_advisory_lock(4282182, k.k) END
$$;

-- Take up to p_want free permits of p_queue (limit p_limit, highest limit in use p_seen) for
-- this session, skipping the keys it holds already (p_held: session advisory locks are
-- re-entrant, so a held key would be "taken" twice). Returns the keys taken.
CREATE OR REPLACE FUNCTION awa._flow_take_v1(
    p_queue text, p_limit integer, p_seen integer, p_want integer, p_held integer[])
 RETURNS integer[]
 LANGUAGE plpgsql
AS $$
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
CREATE OR REPLACE FUNCTION awa.flow_release_v1(p_keys integer[])
 RETURNS integer
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT count(*) FILTER (WHERE pg_advisory_unlock(4282182, k))::integer
    FROM unnest(COALESCE(p_keys, '{}')) AS k
$$;

-- Take again, after a reconnect, the permits of attempts this session's process still runs.
-- Returns the keys it could not take (held by another session meanwhile: for those attempts
-- the limit may be passed until they end, and the worker logs it).
CREATE OR REPLACE FUNCTION awa.flow_retake_v1(p_keys integer[])
 RETURNS integer[]
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT COALESCE(array_agg(k), '{}')
    FROM unnest(COALESCE(p_keys, '{}')) AS k
    WHERE NOT pg_try_advisory_lock(4282182, k)
$$;

-- Release every permit this session holds except p_keep (after a claim failed part-way: a
-- session lock taken by a statement that then failed stays held). Returns how many it released.
CREATE OR REPLACE FUNCTION awa.flow_reset_v1(p_keep integer[])
 RETURNS integer
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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

-- Free the permits and serial keys of awa worker processes that are gone but whose sessions
-- live on (frozen, wedged or partitioned: runtime row older than p_staleness seconds, or none):
-- their backends are terminated. Rows: pid, instance (application_name), action ('terminated' or
-- 'not_permitted'). Run by the maintenance leader after rescue.
CREATE OR REPLACE FUNCTION awa.flow_reap_v1(p_staleness double precision)
 RETURNS TABLE(pid integer, instance text, action text)
 LANGUAGE plpgsql
AS $$
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
          -- A session opened within the bound is of a process that was running then: one
          -- that reconnected after an outage, its runtime row not refreshed yet.
          AND a.backend_start < now() - make_interval(secs => LEAST(p_staleness, 3155760000))
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

-- Permits in use per queue with a concurrency limit (reads the server's lock table).
CREATE OR REPLACE FUNCTION awa.flow_in_use_v1()
 RETURNS TABLE(queue text, in_use integer)
 LANGUAGE sql
 STABLE
AS $$
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

-- Set (source 'operator') or clear the limits of one queue. Clearing replaces the operator's
-- limits with p_settings (the project's settings for the queue, {"max_running", "rate",
-- "burst"}, or NULL: none), as a 'settings' row (a row without limits limits nothing). Returns
-- the row now in force, if it limits anything.
CREATE OR REPLACE FUNCTION awa.flow_set_v1(
    p_queue text, p_max_running integer, p_rate double precision, p_burst integer, p_actor text,
    p_clear boolean, p_settings jsonb DEFAULT NULL::jsonb)
 RETURNS SETOF awa.flow_limits
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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

-- Write the limits the project's settings give (p_limits: {"queue": {"max_running": n | null,
-- "rate": r | null, "burst": b | null}, ...}) as source 'settings' rows; operator rows are left
-- alone; settings rows of queues p_limits does not name lose their limits. One transaction.
CREATE OR REPLACE FUNCTION awa.flow_sync_v1(p_limits jsonb)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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

-- Every queue with flow limits: the limits, their source, and the permits in use now.
CREATE OR REPLACE FUNCTION awa.flow_status_v1()
 RETURNS TABLE(
    queue text, max_running integer, in_use integer, rate double precision, burst integer,
    source text, updated_by text, updated_at timestamp with time zone)
 LANGUAGE sql
 STABLE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT f.queue, f.max_running, u.in_use, f.rate, f.burst, f.source, f.updated_by,
           f.updated_at
    FROM awa.flow_limits f
    LEFT JOIN awa.flow_in_use_v1() u ON u.queue = f.queue
    WHERE f.max_running IS NOT NULL OR f.rate IS NOT NULL
    ORDER BY f.queue
$$;

-- The advisory-lock key (class 4282182, shared with queue permits) of permit p_i of kind p_kind.
CREATE OR REPLACE FUNCTION awa._flow_kind_key_v1(p_kind text, p_i integer)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT hashtext('kind:' || p_kind || '/' || p_i::text)
$$;

-- The state time a kind's rate counts from at p_now: p_tat (NULL: none yet) but never in the
-- past, and, when p_tat is further ahead than the current limits allow (burst x T: it was
-- left by a slower rate, or by a limit since cleared), p_now + (burst - 1) x T: one token now,
-- then the current rate. So a raised rate takes effect at once, and a state no claim writes
-- (jobs of the kind all parked) never holds the kind back for what an old rate accumulated.
-- A state within the limits is never moved: no token is given early.
CREATE OR REPLACE FUNCTION awa._flow_kind_tat_v1(
    p_rate double precision, p_burst integer, p_tat timestamp with time zone,
    p_now timestamp with time zone)
 RETURNS timestamp with time zone
 LANGUAGE sql
 IMMUTABLE
AS $$
    SELECT CASE
        WHEN p_tat IS NULL OR p_tat < p_now THEN p_now
        WHEN p_tat > p_now + make_interval(secs => b.n / p_rate)
            THEN p_now + make_interval(secs => (b.n - 1) / p_rate)
        ELSE p_tat END
    FROM (SELECT COALESCE(p_burst, GREATEST(1, ceil(p_rate / 10)::integer))::double precision
                 AS n) b
$$;

-- The rate tokens kind limits row p_limit allows now given state p_tat (no lock, no write), and
-- the seconds until the next one when none (else NULL). As the queue rate of awa.claim_v3,
-- from the state time awa._flow_kind_tat_v1 gives.
CREATE OR REPLACE FUNCTION awa._flow_kind_tokens_v1(
    p_rate double precision, p_burst integer, p_tat timestamp with time zone,
    p_now timestamp with time zone, OUT o_tokens integer, OUT o_wait double precision)
 RETURNS record
 LANGUAGE plpgsql
 IMMUTABLE
AS $$
DECLARE
    v_period double precision := 1.0 / p_rate;
    v_burst integer := COALESCE(p_burst, GREATEST(1, ceil(p_rate / 10)::integer));
    v_tat timestamptz := awa._flow_kind_tat_v1(p_rate, p_burst, p_tat, p_now);
BEGIN
    o_tokens := GREATEST(floor((extract(epoch FROM p_now - v_tat) + v_burst * v_period)
                               / v_period + 1e-9)::integer, 0);
    IF o_tokens = 0 THEN
        o_wait := GREATEST(extract(epoch FROM v_tat - p_now) - (v_burst - 1) * v_period, 0.001);
    END IF;
END
$$;

-- Take up to p_want free permits of kind p_kind (limit p_limit, highest limit in use p_seen)
-- for this session, skipping keys in p_held (held already: session locks are re-entrant).
-- As awa._flow_take_v1, for kinds. Returns the keys taken.
CREATE OR REPLACE FUNCTION awa._flow_kind_take_v1(
    p_kind text, p_limit integer, p_seen integer, p_want integer, p_held integer[])
 RETURNS integer[]
 LANGUAGE plpgsql
AS $$
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
         AND l.objid = (awa._flow_kind_key_v1(p_kind, g.i)::bigint & 4294967295)::oid
         AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database());
        IF NOT EXISTS (
            SELECT 1 FROM generate_series(p_limit, p_seen - 1) AS g(i)
            JOIN pg_locks l
              ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
             AND l.classid = 4282182::oid
             AND l.objid = (awa._flow_kind_key_v1(p_kind, g.i)::bigint & 4294967295)::oid) THEN
            -- Only when no other claim holds the row (it is resetting it too): a claim that
            -- waited here, holding another kind's row, could deadlock with one taking the two
            -- kinds in the other order.
            UPDATE awa.flow_kind_limits f SET max_seen = f.max_running
            WHERE f.kind = p_kind AND f.max_seen > f.max_running
              AND f.kind IN (SELECT l.kind FROM awa.flow_kind_limits l
                             WHERE l.kind = p_kind FOR UPDATE SKIP LOCKED);
        END IF;
        v_room := LEAST(v_room, p_limit - v_busy);
        IF v_room <= 0 THEN
            RETURN v_keys;
        END IF;
    END IF;
    v_start := floor(random() * p_limit)::integer;
    SELECT COALESCE(array_agg(t.k), '{}') INTO v_keys
    FROM (
        SELECT c.k
        FROM (SELECT awa._flow_kind_key_v1(p_kind, (v_start + generate_series(0, p_limit - 1))
                                                   % p_limit) AS k) c
        WHERE CASE WHEN c.k IN (SELECT h.k FROM unnest(p_held) AS h(k)) THEN false
                   ELSE pg_try_advisory_lock(4282182, c.k) END
        LIMIT v_room) t;
    RETURN v_keys;
END
$$;

CREATE OR REPLACE FUNCTION awa._flow_kind_rate_row_v1()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.rate IS NOT NULL THEN
        INSERT INTO awa.flow_kind_rate_state (kind, tat) VALUES (NEW.kind, now())
        ON CONFLICT (kind) DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

-- Set (source 'operator') or clear the limits of one kind, as awa.flow_set_v1 for a queue.
-- Returns the row now in force, if it limits anything.
CREATE OR REPLACE FUNCTION awa.flow_kind_set_v1(
    p_kind text, p_max_running integer, p_rate double precision, p_burst integer, p_actor text,
    p_clear boolean, p_settings jsonb DEFAULT NULL::jsonb)
 RETURNS SETOF awa.flow_kind_limits
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
BEGIN
    IF p_kind IS NULL OR length(p_kind) NOT BETWEEN 1 AND 255
       OR p_kind ~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]' THEN
        RAISE EXCEPTION 'kind: % is not a job kind (1-255 characters, no control characters)',
            quote_nullable(p_kind) USING ERRCODE = '22023';
    END IF;
    IF p_clear THEN
        IF p_settings IS NULL OR jsonb_typeof(p_settings) <> 'object'
           OR (p_settings ->> 'max_running') IS NULL AND (p_settings ->> 'rate') IS NULL THEN
            UPDATE awa.flow_kind_limits f
            SET max_running = NULL, rate = NULL, burst = NULL, source = 'settings',
                updated_by = p_actor, updated_at = now()
            WHERE f.kind = p_kind;
            RETURN;
        END IF;
        INSERT INTO awa.flow_kind_limits AS f (kind, max_running, rate, burst, max_seen, source,
                                               updated_by)
        VALUES (p_kind, (p_settings ->> 'max_running')::integer,
                (p_settings ->> 'rate')::double precision,
                (p_settings ->> 'burst')::integer, (p_settings ->> 'max_running')::integer,
                'settings', p_actor)
        ON CONFLICT (kind) DO UPDATE
        SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst,
            max_seen = GREATEST(f.max_running, f.max_seen, excluded.max_running),
            source = 'settings', updated_by = p_actor, updated_at = now();
    ELSE
        INSERT INTO awa.flow_kind_limits AS f (kind, max_running, rate, burst, max_seen, source,
                                               updated_by)
        VALUES (p_kind, p_max_running, p_rate, p_burst, p_max_running, 'operator', p_actor)
        ON CONFLICT (kind) DO UPDATE
        SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst,
            max_seen = GREATEST(f.max_running, f.max_seen, excluded.max_running),
            source = 'operator', updated_by = p_actor, updated_at = now();
    END IF;
    RETURN QUERY SELECT * FROM awa.flow_kind_limits f
                 WHERE f.kind = p_kind AND (f.max_running IS NOT NULL OR f.rate IS NOT NULL);
END
$$;

-- Kind limits: settings sync, operator set/clear, status --------------------------------------

-- Write the kind limits the project's settings give (p_limits: {"kind": {"max_running": n |
-- null, "rate": r | null, "burst": b | null}, ...}: @job options and AWA["KINDS"]) as source
-- 'settings' rows; operator rows are left alone; settings rows of kinds p_limits does not name
-- lose their limits when p_prune (a worker that registers every kind of the project; a
-- process that knows only some kinds passes false). One transaction.
CREATE OR REPLACE FUNCTION awa.flow_kind_sync_v1(p_limits jsonb, p_prune boolean DEFAULT true)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_changed integer := 0;
    v_n integer;
BEGIN
    IF p_limits IS NULL OR jsonb_typeof(p_limits) <> 'object' THEN
        RAISE EXCEPTION 'kind flow limits: expected a JSON object' USING ERRCODE = '22023';
    END IF;
    IF p_prune THEN
        UPDATE awa.flow_kind_limits f SET max_running = NULL, rate = NULL, burst = NULL,
                                          updated_by = 'settings', updated_at = now()
        WHERE f.source = 'settings' AND NOT p_limits ? f.kind
          AND (f.max_running IS NOT NULL OR f.rate IS NOT NULL);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_changed := v_changed + v_n;
    END IF;
    INSERT INTO awa.flow_kind_limits AS f (kind, max_running, rate, burst, max_seen, source,
                                           updated_by)
    SELECT e.key, (e.value ->> 'max_running')::integer, (e.value ->> 'rate')::double precision,
           (e.value ->> 'burst')::integer, (e.value ->> 'max_running')::integer, 'settings',
           'settings'
    FROM jsonb_each(p_limits) e
    ON CONFLICT (kind) DO UPDATE
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

-- Every kind with flow limits: the limits, their source, the permits in use now and the jobs
-- the kind's limits hold parked.
CREATE OR REPLACE FUNCTION awa.flow_kind_status_v1()
 RETURNS TABLE(
    kind text, max_running integer, in_use integer, rate double precision, burst integer,
    waiting bigint, source text, updated_by text, updated_at timestamp with time zone)
 LANGUAGE sql
 STABLE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT f.kind, f.max_running,
           CASE WHEN f.max_running IS NOT NULL THEN (
               SELECT count(l.pid)::integer
               FROM generate_series(0, GREATEST(f.max_running, COALESCE(f.max_seen, 0)) - 1)
                   AS g(i)
               JOIN pg_locks l
                 ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                AND l.classid = 4282182::oid
                AND l.objid = (awa._flow_kind_key_v1(f.kind, g.i)::bigint & 4294967295)::oid
                AND l.database = (SELECT d.oid FROM pg_database d
                                  WHERE d.datname = current_database())) END,
           f.rate, f.burst,
           (SELECT count(*) FROM awa.flow_waiting w WHERE w.kind = f.kind),
           f.source, f.updated_by, f.updated_at
    FROM awa.flow_kind_limits f
    WHERE f.max_running IS NOT NULL OR f.rate IS NOT NULL
       OR EXISTS (SELECT 1 FROM awa.flow_waiting w WHERE w.kind = f.kind)
    ORDER BY f.kind
$$;

-- The hand-off lane (shard 64) of (p_queue, p_priority), created when missing; NULL while
-- another transaction is making it (never waits for one). Runs as its
-- owner (it creates the lane's sequence); granted like awa.ensure_lanes_v1 (sql/roles.sql).
CREATE OR REPLACE FUNCTION awa.flow_handoff_lane_v1(p_queue text, p_priority integer)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_id integer;
    v_seq text;
BEGIN
    SELECT l.lane_id INTO v_id FROM awa.queue_lanes l
    WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard = 64;
    IF FOUND THEN
        RETURN v_id;
    END IF;
    IF NOT awa.valid_queue_name(p_queue) OR NOT awa.valid_priority(p_priority) THEN
        RAISE EXCEPTION 'hand-off lane: % / % is not a valid queue and priority',
            quote_nullable(p_queue), p_priority USING ERRCODE = '22023';
    END IF;
    -- One transaction at a time makes a lane, and another one never waits for it: the insert
    -- below would wait for a concurrent one's transaction to end, and two claims making two
    -- priorities' lanes in opposite orders deadlocked. NULL: being made (its jobs stay parked
    -- for the next claim).
    IF NOT pg_try_advisory_xact_lock(4282185, hashtext(p_queue || '/' || p_priority)) THEN
        RETURN NULL;
    END IF;
    v_id := nextval('awa.lane_id_seq');
    v_seq := 'lane_seq_' || v_id;
    EXECUTE format('CREATE SEQUENCE awa.%I AS bigint', v_seq);
    INSERT INTO awa.queue_lanes (lane_id, queue, priority, shard, enqueue_seq)
    VALUES (v_id, p_queue, p_priority, 64, format('awa.%I', v_seq)::regclass)
    ON CONFLICT (queue, priority, shard) DO NOTHING;
    IF NOT FOUND THEN
        EXECUTE format('DROP SEQUENCE awa.%I', v_seq);
        SELECT l.lane_id INTO v_id FROM awa.queue_lanes l
        WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard = 64;
    END IF;
    RETURN v_id;
END
$$;

-- Un-park jobs of p_queue parked by their kind (called by awa.claim_v3 when flow_waiting has
-- rows of the queue): per kind waiting there, its oldest jobs go back to the ready ring, in the
-- hand-off lane of their (queue, priority), keeping their run_at, as many as fit its free
-- permits and rate tokens now and p_max units. Each job's weight counts as the claim counts it:
-- min(weight, p_wcap, the queue's global limit) units of the claim and min(that, the kind's
-- limit) permits of its kind, so a job moved back is one the claim can take (a heavy job waits,
-- parked, until enough is free at once, and younger jobs of its kind wait behind it). The jobs
-- are chosen once, then moved by priority. Permits are counted by taking and releasing them
-- (p_held: this session's, never counted as free); a claim racing for the same permits may take
-- them first, and the job is parked again. A hand-off lane another claim is filling is passed
-- over. o_moved: jobs moved; o_wait: seconds until the next rate token of a kind whose waiting
-- jobs the rate holds back (NULL: none), also when its tokens were all spent on the jobs moved
-- while more of its jobs wait, so that the claim reports a soft wait.
CREATE OR REPLACE FUNCTION awa._flow_unpark_v2(
    p_queue text, p_max integer, p_held integer[], p_wcap integer, OUT o_moved integer,
    OUT o_wait double precision)
 RETURNS record
 LANGUAGE plpgsql
AS $$
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
    -- The claim's cap on one job's weight (the process's most units, then the queue's
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
            CONTINUE WHEN v_lane IS NULL OR NOT pg_try_advisory_xact_lock(4282177, v_lane);
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

-- How many of the first p_want permits of queue (or, p_kind, kind) p_name's limit p_limit are
-- free now: each is taken and released at once (a claim racing for it may find it taken for
-- that instant). The calling session must hold none of them (session locks are re-entrant).
CREATE OR REPLACE FUNCTION awa._flow_free_v1(
    p_name text, p_kind boolean, p_limit integer, p_want integer)
 RETURNS integer
 LANGUAGE sql
AS $$
    SELECT count(*)::integer
    FROM (
        SELECT 1
        -- generate_series in the select list runs value per call, so LIMIT stops it early;
        -- CASE keeps the order: a key is released only when it was taken here.
        FROM (SELECT CASE WHEN p_kind THEN awa._flow_kind_key_v1(p_name, s.g)
                          ELSE awa._flow_key_v1(p_name, s.g) END AS k
              FROM (SELECT generate_series(0, p_limit - 1) AS g) s) c
        WHERE CASE WHEN pg_try_advisory_lock(4282182, c.k)
                   THEN pg_advisory_unlock(4282182, c.k) ELSE false END
        LIMIT GREATEST(p_want, 1)) x
$$;

-- Of the queues p_queues (each with jobs its kind parked in awa.flow_waiting), those where a
-- parked job could start now, as awa._flow_unpark_v2 would put it back: for some kind waiting
-- there, a rate token is due (if it has a rate) and, if it has a concurrency limit, as many of
-- its permits are free as the kind's oldest job there weighs (capped as the claim caps it:
-- p_caps, the worker's most units for one job of the queue, then the queue's and the kind's
-- limits). A kind whose limit was lowered while permits above it are held, or whose limits
-- are gone, counts as able to start. The sweep of idle queues (awa.queues_ready_v2) asks this,
-- so that a queue whose parked jobs wait for a limit costs no claim until it frees. Nothing
-- is written; permits are probed as awa._flow_free_v1 does, once per kind.
CREATE OR REPLACE FUNCTION awa._flow_parked_ready_v1(p_queues text[], p_caps integer[])
 RETURNS text[]
 LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_out text[] := '{}';
    v_kinds text[] := '{}';  -- the kinds looked at so far
    v_rate boolean[] := '{}';  -- per kind: a rate token is due (or no rate)
    v_free integer[] := '{}';  -- per kind: its free permits found, looking for v_upto
    v_upto integer[] := '{}';
    v_queue text;
    v_qmax integer;
    v_w integer;
    v_j integer;
    v_tokens integer;
    k record;
    lim awa.flow_kind_limits%ROWTYPE;
BEGIN
    FOR i IN 1..COALESCE(cardinality(p_queues), 0) LOOP
        v_queue := p_queues[i];
        v_qmax := NULL;
        SELECT f.max_running INTO v_qmax FROM awa.flow_limits f WHERE f.queue = v_queue;
        FOR k IN
            WITH RECURSIVE kinds AS (
                (SELECT w.kind FROM awa.flow_waiting w WHERE w.queue = v_queue
                 ORDER BY w.kind LIMIT 1)
                UNION ALL
                SELECT (SELECT w.kind FROM awa.flow_waiting w
                        WHERE w.queue = v_queue AND w.kind > s.kind ORDER BY w.kind LIMIT 1)
                FROM kinds s WHERE s.kind IS NOT NULL
            )
            SELECT s.kind,
                   (SELECT w.metadata FROM awa.flow_waiting w
                    WHERE w.queue = v_queue AND w.kind = s.kind
                    ORDER BY w.job_id LIMIT 1) AS metadata
            FROM kinds s WHERE s.kind IS NOT NULL
        LOOP
            lim := NULL;
            SELECT * INTO lim FROM awa.flow_kind_limits f WHERE f.kind = k.kind;
            v_j := array_position(v_kinds, k.kind);
            IF v_j IS NULL THEN
                v_kinds := v_kinds || k.kind;
                v_j := cardinality(v_kinds);
                v_tokens := 1;
                IF lim.rate IS NOT NULL THEN
                    SELECT t.o_tokens INTO v_tokens
                    FROM awa._flow_kind_tokens_v1(
                        lim.rate, lim.burst,
                        (SELECT s.tat FROM awa.flow_kind_rate_state s WHERE s.kind = k.kind),
                        clock_timestamp()) t;
                END IF;
                v_rate := v_rate || (v_tokens > 0);
                v_free := v_free || 0;
                v_upto := v_upto || 0;
            END IF;
            CONTINUE WHEN NOT v_rate[v_j];
            IF lim.max_running IS NULL OR COALESCE(lim.max_seen, 0) > lim.max_running THEN
                v_out := v_out || v_queue;
                EXIT;
            END IF;
            v_w := awa._job_weight_v1(k.metadata, LEAST(COALESCE(p_caps[i], 10000),
                                                        COALESCE(v_qmax, 10000),
                                                        lim.max_running));
            IF v_free[v_j] = v_upto[v_j] AND v_upto[v_j] < v_w THEN
                -- Not looked for that many yet (fewer found than looked for: all are known).
                v_free[v_j] := awa._flow_free_v1(k.kind, true, lim.max_running, v_w);
                v_upto[v_j] := v_w;
            END IF;
            IF v_free[v_j] >= v_w THEN
                v_out := v_out || v_queue;
                EXIT;
            END IF;
        END LOOP;
    END LOOP;
    RETURN v_out;
END
$$;

-- Whether a job of key p_lock older than p_job is ready and unclaimed in a lane of p_queue.
-- Per lane that may hold rows above p_bounds (the lane's cursor as known earlier: rows at or
-- below it are claimed; 0 when not given), the newest such row is compared with the lane's
-- cursor now.
CREATE OR REPLACE FUNCTION awa._serial_older_ready_v1(
    p_queue text, p_lock integer, p_job bigint, p_lanes integer[] DEFAULT NULL::integer[],
    p_bounds bigint[] DEFAULT NULL::bigint[])
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE
 SET enable_seqscan TO 'off'
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
CREATE OR REPLACE FUNCTION awa._serial_hand_off_v1(p_lock integer)
 RETURNS bigint
 LANGUAGE plpgsql
AS $$
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
CREATE OR REPLACE FUNCTION awa.serial_release_v1(p_keys integer[])
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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

-- After a claim failed part-way: release (and hand on) every serial run lock this session
-- holds except p_keep (a session lock taken by a statement that then failed stays held), and
-- hand on p_release (keys whose release that claim carried: session locks do not roll back,
-- the hand-off did), except those in p_keep. Returns how many it released.
CREATE OR REPLACE FUNCTION awa.serial_reset_v1(
    p_keep integer[], p_release integer[] DEFAULT NULL::integer[])
 RETURNS integer
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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

-- Take again, after a reconnect, the run locks of keys whose jobs this session's process still
-- runs. Returns the keys it could not take (another worker's job of the key runs meanwhile:
-- until the two end, two jobs of the key may run at once, and the worker logs it).
CREATE OR REPLACE FUNCTION awa.serial_retake_v1(p_keys integer[])
 RETURNS integer[]
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT COALESCE(array_agg(k), '{}')
    FROM unnest(COALESCE(p_keys, '{}')) AS k
    WHERE NOT pg_try_advisory_lock(4282183, k)
$$;

-- Hand on the keys that nobody else will: keys with waiting jobs whose run lock is free (the
-- worker that held it died, or the job it was handed to was cancelled before it ran) and no
-- older job of the key is ready. Keys that a claim or a release is deciding about now are left
-- for the next call. Run by the maintenance leader after rescue. Returns the jobs moved back
-- to the ready ring.
CREATE OR REPLACE FUNCTION awa.serial_sweep_v1(p_limit integer DEFAULT 1000)
 RETURNS SETOF bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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

-- Every kind with a rate limit has its rate state row, made when the limit is set (by any
-- writer) rather than by its first claim: two claims making the states of two kinds in
-- opposite orders could deadlock.
CREATE OR REPLACE TRIGGER flow_kind_rate_row AFTER INSERT OR UPDATE OF rate ON awa.flow_kind_limits
FOR EACH ROW EXECUTE FUNCTION awa._flow_kind_rate_row_v1();
