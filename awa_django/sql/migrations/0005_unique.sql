-- awa_django 0005: unique jobs (issue 15).
--
-- A unique job holds a key in awa.unique_keys, taken in the producer's transaction: the primary
-- key makes two producers racing in separate transactions get one job (the second waits for the
-- first to commit or roll back; a rolled-back enqueue never held the key). A key blocks a
-- duplicate while its holder is in one of the key's states and, with unique_for, until it
-- expires. Release is lazy: a producer that finds a holder no longer blocking takes the key over
-- in place, and awa.unique_sweep_v1 (run by the maintenance leader) deletes keys whose holders
-- stopped blocking, so the table holds about one row per unique job in its scope. It is the
-- only row-mutating table unique jobs add: one insert, then one update or delete per unique job
-- (docs/storage.md, "Unique jobs"), never per plain job.
--
-- The key is stored as a SHA-256 digest of the kind and the key text (awa.unique_digest_v1):
-- keys are per kind; the key text is 'key:' and an explicit key, or 'args:' and the arguments'
-- canonical JSON (jsonb's text form), computed here so that raw-SQL producers and Python agree
-- (awa.unique_key_text_v1). The spec travels with the job in its metadata ("awa:unique": the
-- explicit key or null, states, for), so a DLQ retry can take the key again; the digest is
-- always recomputed from the job's own kind and arguments, so a spec written by hand can only
-- name a key of its own kind, as any producer can.
--
-- Reversing this migration drops its functions and keeps the table (IF NOT EXISTS below lets
-- migrating forward again find it). awa.enqueue_one_v2 stays as it was for raw-SQL producers;
-- awa.enqueue_one_v3 is its superset, which the Python producer calls for unique jobs.

CREATE TABLE IF NOT EXISTS awa.unique_keys (
    unique_key bytea PRIMARY KEY,
    job_id bigint NOT NULL,
    kind text NOT NULL,
    -- The start of the key text, for operators (the digest is what is unique).
    key_text text NOT NULL,
    states text[] NOT NULL,
    expires_at timestamptz,
    -- Changed by every take: the version a takeover or sweep compares against.
    taken_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS unique_keys_job_idx ON awa.unique_keys (job_id);
CREATE INDEX IF NOT EXISTS unique_keys_taken_idx ON awa.unique_keys (taken_at, unique_key);

-- The states a unique key can name, and the default (jobs not finished yet).
CREATE FUNCTION awa.unique_states_v1() RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY['scheduled', 'available', 'running', 'waiting_external', 'retryable',
                 'completed', 'failed', 'cancelled']
$$;

CREATE FUNCTION awa.unique_default_states_v1() RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY['scheduled', 'available', 'running', 'waiting_external', 'retryable']
$$;

-- The digest of a key: per kind (the kind's length prefixes it, so no two (kind, key) pairs
-- share a text).
CREATE FUNCTION awa.unique_digest_v1(p_kind text, p_key text) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT sha256(convert_to(length(p_kind)::text || ':' || p_kind || p_key, 'UTF8'))
$$;

-- The key text of a job: 'key:' and its explicit key, else 'args:' and its arguments' canonical
-- JSON (the django.tasks envelope's "task" member, the backend's bookkeeping, left out). The
-- prefixes keep an explicit key from ever equalling an argument key.
CREATE FUNCTION awa.unique_key_text_v1(p_key text, p_args jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_key IS NOT NULL THEN 'key:' || p_key ELSE 'args:' || (p_args - 'task')::text END
$$;

-- What is wrong with unique options (NULL when nothing).
CREATE FUNCTION awa._unique_error_v1(p_key text, p_for double precision, p_states text[])
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_key IS NOT NULL AND length(p_key) > 10000 THEN
            format('unique_key: %s characters exceeds the limit of 10000', length(p_key))
        WHEN p_for IS NOT NULL AND NOT (p_for > 0 AND p_for <= 3155760000) THEN
            'unique_for: must be a positive number of seconds, at most 3155760000 (100 years)'
        WHEN p_states IS NOT NULL AND (
                cardinality(p_states) = 0 OR array_ndims(p_states) <> 1
                OR array_position(p_states, NULL) IS NOT NULL
                OR NOT p_states <@ awa.unique_states_v1()) THEN
            format('unique_states: %s: must be a non-empty list of %s', p_states::text,
                   array_to_string(awa.unique_states_v1(), ', '))
    END
$$;

-- The state, queue and priority of a job by id, read in one statement (one snapshot) from the
-- planes by their job-id indexes: a job moves between planes in one transaction, so exactly one
-- answers, live planes first. No row: no such job, or pruned from history. Dead-lettered jobs
-- are 'failed'. An unclaimed ready row counts only above its lane's cursor (rows below it are
-- earlier attempts whose claims may have been pruned).
CREATE FUNCTION awa._job_brief_v1(p_job_id bigint)
RETURNS TABLE (state text, queue text, priority integer)
LANGUAGE sql STABLE AS $$
    SELECT b.state, b.queue, b.priority FROM (
        SELECT 1 AS o, d.state, d.queue, d.priority::integer
        FROM awa.deferred_jobs d WHERE d.job_id = p_job_id
        UNION ALL
        SELECT 2, 'failed', q.queue, q.priority::integer
        FROM awa.dlq_entries q WHERE q.job_id = p_job_id
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

-- Take the key p_digest for job p_job. Returns a NULL holder when taken (a new key, a key whose
-- holder no longer blocks, or the job's own key), else the holder's id, state, queue and
-- priority as read for the decision (one snapshot: the state is the one that blocked). A key
-- inserted by a transaction still open is waited for (the INSERT's conflict check), so its fate
-- is known. Takeovers compare the version (taken_at) they read: two producers never both take
-- one key. A holder blocks while it is in one of the key's states and the key has not expired.
CREATE FUNCTION awa._unique_take_v1(
    p_digest bytea, p_job bigint, p_kind text, p_key_text text, p_states text[],
    p_for double precision,
    OUT holder bigint, OUT holder_state text, OUT holder_queue text, OUT holder_priority integer)
LANGUAGE plpgsql AS $$
DECLARE
    h awa.unique_keys%ROWTYPE;
    v_expires timestamptz;
BEGIN
    PERFORM awa._require_read_committed_v1('a unique enqueue');
    FOR i IN 1..20 LOOP
        v_expires := clock_timestamp() + make_interval(secs => p_for);
        INSERT INTO awa.unique_keys (unique_key, job_id, kind, key_text, states, expires_at)
        VALUES (p_digest, p_job, p_kind, left(p_key_text, 200), p_states, v_expires)
        ON CONFLICT (unique_key) DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
        SELECT * INTO h FROM awa.unique_keys u WHERE u.unique_key = p_digest;
        CONTINUE WHEN NOT FOUND;  -- swept meanwhile: insert again
        IF h.job_id <> p_job AND (h.expires_at IS NULL OR h.expires_at > clock_timestamp()) THEN
            SELECT b.state, b.queue, b.priority INTO holder_state, holder_queue, holder_priority
            FROM awa._job_brief_v1(h.job_id) b;
            IF holder_state = ANY (h.states) THEN
                holder := h.job_id;
                RETURN;
            END IF;
            holder_state := NULL;
            holder_queue := NULL;
            holder_priority := NULL;
        END IF;
        UPDATE awa.unique_keys u
        SET job_id = p_job, kind = p_kind, key_text = left(p_key_text, 200), states = p_states,
            expires_at = v_expires, taken_at = clock_timestamp()
        WHERE u.unique_key = p_digest AND u.job_id = h.job_id AND u.taken_at = h.taken_at;
        IF FOUND THEN
            RETURN;
        END IF;
        -- Taken over or swept by another transaction since it was read: look again.
    END LOOP;
    RAISE EXCEPTION 'unique key of kind % is contended; retry the transaction', p_kind
        USING ERRCODE = '40001';
END
$$;

-- Enqueue one job in the caller's transaction, optionally unique. awa.enqueue_one_v2's
-- arguments, checks and body (its lane protocol included), then:
--   p_unique         true: the job holds a key (default key text: its arguments' canonical JSON)
--   p_unique_key     the key text; keys are per kind (this, p_unique_for or p_unique_states
--                    make the job unique too)
--   p_unique_for     seconds the key blocks duplicates at most (NULL: as long as the holder is
--                    in a blocking state)
--   p_unique_states  the holder's states that block (NULL: awa.unique_default_states_v1())
--   p_isolation_state  a unique enqueue needs READ COMMITTED: at another level it raises
--                    SQLSTATE 25000, or with this true writes nothing and returns a NULL job_id
--                    with the level as state (so the caller's transaction stays usable)
-- Returns the job's id, state, queue and priority, and duplicate = false; for a duplicate,
-- nothing is written and the holder's id, state, queue and priority come back with
-- duplicate = true. Refused requests raise SQLSTATE 22023 and write nothing.
CREATE FUNCTION awa.enqueue_one_v3(
    p_kind text, p_queue text, p_priority integer, p_args jsonb, p_max_attempts integer,
    p_run_at timestamptz DEFAULT NULL, p_delay double precision DEFAULT NULL,
    p_deadline double precision DEFAULT NULL, p_metadata jsonb DEFAULT NULL,
    p_tags text[] DEFAULT NULL,
    p_args_max_bytes integer DEFAULT 1048576, p_metadata_max_bytes integer DEFAULT 65536,
    p_json_max_depth integer DEFAULT 32, p_max_tags integer DEFAULT 20,
    p_tag_max_length integer DEFAULT 100,
    p_unique boolean DEFAULT false, p_unique_key text DEFAULT NULL,
    p_unique_for double precision DEFAULT NULL, p_unique_states text[] DEFAULT NULL,
    p_isolation_state boolean DEFAULT false,
    OUT job_id bigint, OUT state text, OUT queue text, OUT priority integer,
    OUT duplicate boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    v_error text;
    v_now timestamptz;
    v_run_at timestamptz;
    v_lanes integer[];
    v_seqs regclass[];
    v_n integer;
    v_home integer;
    v_lane integer;
    v_seq regclass;
    v_id bigint;
    v_key text;
    v_digest bytea;
    v_states text[];
    v_holder bigint;
    v_metadata jsonb := p_metadata;
    i integer;
BEGIN
    queue := p_queue;
    priority := p_priority;
    duplicate := false;
    -- Enough to be valid (the depth bound: n bytes of jsonb nest at most about n / 4 levels).
    IF NOT COALESCE(
        p_json_max_depth BETWEEN 1 AND 256 AND p_args_max_bytes >= 1
        AND p_metadata_max_bytes >= 1 AND p_max_tags >= 0 AND p_tag_max_length >= 1
        AND p_kind <> '' AND length(p_kind) <= 255 AND awa.valid_queue_name(p_queue)
        AND p_priority BETWEEN -100 AND 100 AND p_max_attempts BETWEEN 1 AND 1000
        AND pg_column_size(p_args) <= LEAST(p_args_max_bytes, 4 * (p_json_max_depth + 2))
        AND jsonb_typeof(p_args) = 'object' AND jsonb_typeof(p_args -> 'args') = 'array'
        AND jsonb_typeof(p_args -> 'kwargs') = 'object'
        AND (p_deadline IS NULL OR (p_deadline > 0 AND p_deadline <= 3155760000))
        AND (p_metadata IS NULL
             OR (jsonb_typeof(p_metadata) = 'object'
                 AND pg_column_size(p_metadata) <= LEAST(p_metadata_max_bytes, 4 * p_json_max_depth)))
        AND p_tags IS NULL AND p_run_at IS NULL AND p_delay IS NULL, false)
    THEN
        v_error := awa._enqueue_one_error_v2(
            p_kind, p_queue, p_priority, p_args, p_max_attempts, p_run_at, p_delay, p_deadline,
            p_metadata, p_tags, p_args_max_bytes, p_metadata_max_bytes, p_json_max_depth,
            p_max_tags, p_tag_max_length);
        IF v_error IS NOT NULL THEN
            RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
        END IF;
    END IF;
    IF p_unique OR p_unique_key IS NOT NULL OR p_unique_for IS NOT NULL
       OR p_unique_states IS NOT NULL THEN
        v_error := awa._unique_error_v1(p_unique_key, p_unique_for, p_unique_states);
        IF v_error IS NOT NULL THEN
            RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
        END IF;
        IF p_isolation_state
           AND current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
            state := current_setting('transaction_isolation');
            RETURN;  -- nothing written, the transaction usable: the caller raises
        END IF;
        v_key := awa.unique_key_text_v1(p_unique_key, p_args);
        v_digest := awa.unique_digest_v1(p_kind, v_key);
        v_states := COALESCE(p_unique_states, awa.unique_default_states_v1());
        v_id := nextval('awa.job_id_seq');
        -- The key first, the lane after: a producer waiting for a key holds no lane.
        SELECT t.holder, t.holder_state, t.holder_queue, t.holder_priority
        INTO v_holder, state, queue, priority
        FROM awa._unique_take_v1(v_digest, v_id, p_kind, v_key, v_states, p_unique_for) t;
        IF v_holder IS NOT NULL THEN
            job_id := v_holder;
            duplicate := true;
            RETURN;
        END IF;
        queue := p_queue;
        priority := p_priority;
        v_metadata := COALESCE(p_metadata, '{}'::jsonb) || jsonb_build_object(
            'awa:unique', jsonb_build_object('key', p_unique_key, 'states', v_states,
                                             'for', p_unique_for));
    END IF;
    IF p_run_at IS NOT NULL OR p_delay > 0 THEN
        v_now := clock_timestamp();
        v_run_at := GREATEST(COALESCE(p_run_at, v_now + make_interval(secs => COALESCE(p_delay, 0))), v_now);
        IF v_run_at > v_now THEN
            job_id := COALESCE(v_id, nextval('awa.job_id_seq'));
            INSERT INTO awa.deferred_jobs (
                job_id, state, queue, priority, kind, args, attempt, max_attempts, run_lease,
                run_at, created_at, deadline_secs, metadata, tags)
            VALUES (job_id, 'scheduled', p_queue, p_priority, p_kind, p_args, 0,
                    p_max_attempts, 0, v_run_at, v_now, p_deadline, v_metadata, p_tags);
            state := 'scheduled';
            RETURN;
        END IF;
    END IF;
    -- The lane protocol of awa._lane_for_v1 (same lock class, home shard and awa.xact_lanes
    -- record), inline for its common case: this transaction holds no lane yet and the lanes
    -- exist. Otherwise awa._lane_for_v1 itself.
    IF COALESCE(current_setting('awa.xact_lanes', true), '') = '' THEN
        SELECT array_agg(l.lane_id ORDER BY l.shard), array_agg(l.enqueue_seq ORDER BY l.shard)
        INTO v_lanes, v_seqs
        FROM awa.queue_lanes l WHERE l.queue = p_queue AND l.priority = p_priority;
    END IF;
    IF v_lanes IS NULL THEN
        v_lane := awa._lane_for_v1(p_queue, p_priority, true);
        SELECT l.enqueue_seq INTO v_seq FROM awa.queue_lanes l WHERE l.lane_id = v_lane;
    ELSE
        v_n := cardinality(v_lanes);
        v_home := pg_backend_pid() % v_n;
        FOR i IN 0..(v_n - 1) LOOP
            v_lane := v_lanes[((v_home + i) % v_n) + 1];
            EXIT WHEN pg_try_advisory_xact_lock(4282177, v_lane);
            v_lane := NULL;
        END LOOP;
        IF v_lane IS NULL THEN
            v_lane := v_lanes[v_home + 1];
            PERFORM pg_advisory_xact_lock(4282177, v_lane);
        END IF;
        v_seq := v_seqs[array_position(v_lanes, v_lane)];
        PERFORM set_config('awa.xact_lanes', v_lane::text, true);
    END IF;
    -- The ring slot and the clock are read after the lane lock is held (the wait may have
    -- spanned a rotation).
    INSERT INTO awa.ready_entries AS e (
        ready_slot, ready_generation, lane_id, lane_seq, job_id, priority, attempt, max_attempts,
        run_lease, queue, kind, args, run_at, created_at, deadline_secs, metadata, tags)
    SELECT r.slot, r.generation, v_lane, nextval(v_seq), COALESCE(v_id, nextval('awa.job_id_seq')),
           p_priority, 0, p_max_attempts, 0, p_queue, p_kind, p_args, n.now, n.now, p_deadline,
           v_metadata, p_tags
    FROM (SELECT clock_timestamp() AS now) n,
         (SELECT r.slot, r.generation FROM awa.ring_rotations r WHERE r.ring = 'queue'
          ORDER BY r.generation DESC LIMIT 1) r
    RETURNING e.job_id INTO job_id;
    PERFORM pg_notify('awa_jobs', p_queue);
    state := 'available';
END
$$;

-- Retry dead-lettered jobs (awa.dlq_retry_v1's moves) with their unique keys: a job that held a
-- key takes it again; when another job holds it and blocks (an earlier job of the same call
-- included), p_on_conflict decides: 'refuse' (default) leaves the job in the DLQ, 'run' retries
-- it without the key. Returns one row per requested job found in the DLQ: 'retried' or
-- 'refused' (with the holder's id). The key is recomputed from the job's kind, its arguments
-- and the spec's explicit key: a spec written by hand names a key of its own kind only.
CREATE FUNCTION awa.dlq_retry_v2(p_job_ids bigint[], p_queue text DEFAULT NULL,
                                 p_priority integer DEFAULT NULL,
                                 p_on_conflict text DEFAULT 'refuse')
RETURNS TABLE (job_id bigint, outcome text, holder bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    d record;
    v_holder bigint;
    v_digest bytea;
    v_key text;
    v_taken bytea[] := '{}';
    v_takers bigint[] := '{}';
    v_retry bigint[] := '{}';
    v_refused bigint[] := '{}';
    v_holders bigint[] := '{}';
    v_spec jsonb;
    v_for numeric;
BEGIN
    IF p_on_conflict IS NULL OR p_on_conflict NOT IN ('refuse', 'run') THEN
        RAISE EXCEPTION 'on_conflict: % is not refuse or run', quote_nullable(p_on_conflict)
            USING ERRCODE = '22023';
    END IF;
    FOR d IN
        SELECT q.job_id, q.kind, q.args, q.metadata -> 'awa:unique' AS spec
        FROM awa.dlq_entries q WHERE q.job_id = ANY (p_job_ids)
        ORDER BY q.job_id
        FOR UPDATE
    LOOP
        v_spec := d.spec;
        v_holder := NULL;
        IF jsonb_typeof(v_spec) = 'object' AND jsonb_typeof(v_spec -> 'key') IN ('string', 'null')
           AND length(v_spec ->> 'key') <= 10000 IS NOT false THEN
            v_key := awa.unique_key_text_v1(v_spec ->> 'key', d.args);
            v_digest := awa.unique_digest_v1(d.kind, v_key);
            v_for := CASE WHEN jsonb_typeof(v_spec -> 'for') = 'number'
                          THEN (v_spec ->> 'for')::numeric END;
            -- An earlier job of this call took the key: it blocks (it is leaving the DLQ).
            v_holder := v_takers[array_position(v_taken, v_digest)];
            IF v_holder IS NULL THEN
                SELECT t.holder INTO v_holder FROM awa._unique_take_v1(
                    v_digest, d.job_id, d.kind, v_key,
                    COALESCE((SELECT array_agg(DISTINCT s) FROM jsonb_array_elements_text(
                                  CASE WHEN jsonb_typeof(v_spec -> 'states') = 'array'
                                       THEN v_spec -> 'states' END) s
                              WHERE s = ANY (awa.unique_states_v1())),
                             awa.unique_default_states_v1()),
                    CASE WHEN v_for > 0 THEN LEAST(v_for, 3155760000)::double precision END) t;
                IF v_holder IS NULL THEN
                    v_taken := v_taken || v_digest;
                    v_takers := v_takers || d.job_id;
                END IF;
            END IF;
        END IF;
        IF v_holder IS NOT NULL AND p_on_conflict = 'refuse' THEN
            v_refused := v_refused || d.job_id;
            v_holders := v_holders || v_holder;
        ELSE
            v_retry := v_retry || d.job_id;
        END IF;
    END LOOP;
    RETURN QUERY
    SELECT r, 'retried'::text, NULL::bigint
    FROM awa.dlq_retry_v1(v_retry, p_queue, p_priority) r;
    RETURN QUERY
    SELECT u.j, 'refused'::text, u.h FROM unnest(v_refused, v_holders) AS u(j, h);
END
$$;

-- Delete up to p_limit keys whose holders no longer block (finished, pruned, outside the key's
-- states, or expired), in taken_at order after (p_after_taken, p_after_key). Returns how many
-- were deleted and where to go on from (NULLs: the end was reached; start again). A key taken
-- over since it was read is left alone.
CREATE FUNCTION awa.unique_sweep_v1(p_after_taken timestamptz DEFAULT NULL,
                                    p_after_key bytea DEFAULT NULL, p_limit integer DEFAULT 500)
RETURNS TABLE (deleted integer, next_taken timestamptz, next_key bytea)
LANGUAGE plpgsql AS $$
DECLARE
    v_page awa.unique_keys[];
    v_n integer;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.unique_sweep_v1');
    -- The page, for the cursor; then the released keys of it, locked without waiting: a key a
    -- producer is taking is left for the next round, so the sweep never waits for a producer
    -- (and never deadlocks with one that takes several keys).
    SELECT array_agg(x.u ORDER BY (x.u).taken_at, (x.u).unique_key) INTO v_page
    FROM (SELECT u FROM awa.unique_keys u
          WHERE p_after_taken IS NULL
             OR (u.taken_at, u.unique_key) > (p_after_taken, COALESCE(p_after_key, ''::bytea))
          ORDER BY u.taken_at, u.unique_key
          LIMIT GREATEST(p_limit, 1)) x;
    v_n := COALESCE(cardinality(v_page), 0);
    WITH locked AS (
        SELECT k.unique_key, k.job_id, k.states, k.expires_at
        FROM awa.unique_keys k
        WHERE k.unique_key IN (SELECT r.unique_key FROM unnest(v_page) AS r)
          AND (k.unique_key, k.taken_at) IN (SELECT r.unique_key, r.taken_at FROM unnest(v_page) AS r)
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM awa.unique_keys k
        USING locked l
        WHERE k.unique_key = l.unique_key
          AND NOT ((l.expires_at IS NULL OR l.expires_at > clock_timestamp())
                   AND COALESCE((SELECT b.state FROM awa._job_brief_v1(l.job_id) b)
                                = ANY (l.states), false))
        RETURNING 1
    )
    SELECT count(*)::integer INTO deleted FROM gone;
    IF v_n < GREATEST(p_limit, 1) THEN
        next_taken := NULL;
        next_key := NULL;
    ELSE
        next_taken := v_page[v_n].taken_at;
        next_key := v_page[v_n].unique_key;
    END IF;
    RETURN NEXT;
END
$$;
