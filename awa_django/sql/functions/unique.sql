CREATE OR REPLACE FUNCTION awa.unique_default_states_v1()
 RETURNS text[]
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ARRAY['scheduled', 'available', 'running', 'waiting_external', 'retryable']
$$;

-- The states a unique key can name, and the default (jobs not finished yet).
CREATE OR REPLACE FUNCTION awa.unique_states_v1()
 RETURNS text[]
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ARRAY['scheduled', 'available', 'running', 'waiting_external', 'retryable',
                 'completed', 'failed', 'cancelled']
$$;

-- The key text of a job: 'key:' and its explicit key, else 'args:' and its arguments' canonical
-- JSON (the django.tasks envelope's "task" member, the backend's bookkeeping, left out). The
-- prefixes keep an explicit key from ever equalling an argument key.
CREATE OR REPLACE FUNCTION awa.unique_key_text_v1(p_key text, p_args jsonb)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_key IS NOT NULL THEN 'key:' || p_key ELSE 'args:' || (p_args - 'task')::text END
$$;

-- The digest of a key: per kind (the kind's length prefixes it, so no two (kind, key) pairs
-- share a text).
CREATE OR REPLACE FUNCTION awa.unique_digest_v1(p_kind text, p_key text)
 RETURNS bytea
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT sha256(convert_to(length(p_kind)::text || ':' || p_kind || p_key, 'UTF8'))
$$;

-- What is wrong with unique options (NULL when nothing).
CREATE OR REPLACE FUNCTION awa._unique_error_v1(p_key text, p_for double precision, p_states text[])
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $$
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

-- Take the key p_digest for job p_job. Returns a NULL holder when taken (a new key, a key whose
-- holder no longer blocks, or the job's own key), else the holder's id, state, queue and
-- priority as read for the decision (one snapshot: the state is the one that blocked). A key
-- inserted by a transaction still open is waited for (the INSERT's conflict check), so its fate
-- is known. Takeovers compare the version (taken_at) they read: two producers never both take
-- one key. A holder blocks while it is in one of the key's states and the key has not expired.
CREATE OR REPLACE FUNCTION awa._unique_take_v1(
    p_digest bytea, p_job bigint, p_kind text, p_key_text text, p_states text[],
    p_for double precision, OUT holder bigint, OUT holder_state text, OUT holder_queue text,
    OUT holder_priority integer)
 RETURNS record
 LANGUAGE plpgsql
AS $$
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

-- Delete up to p_limit keys whose holders no longer block (finished, pruned, outside the key's
-- states, or expired), in taken_at order after (p_after_taken, p_after_key). Returns how many
-- were deleted and where to go on from (NULLs: the end was reached; start again). A key taken
-- over since it was read is left alone.
CREATE OR REPLACE FUNCTION awa.unique_sweep_v1(
    p_after_taken timestamp with time zone DEFAULT NULL::timestamp with time zone,
    p_after_key bytea DEFAULT NULL::bytea, p_limit integer DEFAULT 500)
 RETURNS TABLE(deleted integer, next_taken timestamp with time zone, next_key bytea)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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
