-- SQLSTATE 22023 unless p_timeout is NULL or a number of seconds in (0, 100 years].
CREATE OR REPLACE FUNCTION awa._check_callback_timeout_v1(p_timeout double precision)
 RETURNS void
 LANGUAGE plpgsql
 IMMUTABLE
AS $$
BEGIN
    IF p_timeout IS NOT NULL
       AND NOT (p_timeout > 0 AND p_timeout <= awa._max_seconds_v1()) THEN
        RAISE EXCEPTION 'timeout: must be a number of seconds in (0, 3155760000]'
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- Give the job resumed by its callback (now in deferred_jobs, same run_lease) the callback's id
-- and result, in its metadata under "awa:callback" (the handler's ctx.callback_result).
CREATE OR REPLACE FUNCTION awa._callback_stamp_v1(
    p_job_id bigint, p_run_lease bigint, p_callback_id uuid, p_result jsonb)
 RETURNS void
 LANGUAGE sql
AS $$
    UPDATE awa.deferred_jobs d
    SET metadata = CASE WHEN jsonb_typeof(d.metadata) = 'object' THEN d.metadata
                        ELSE '{}'::jsonb END
                   || jsonb_build_object('awa:callback', jsonb_build_object(
                          'id', p_callback_id, 'result', COALESCE(p_result, 'null'::jsonb)))
    WHERE d.job_id = p_job_id AND d.run_lease = p_run_lease
$$;

-- Helpers -----------------------------------------------------------------------------------------

-- The attempt that holds p_callback_id: parked (a lease) or registered and not parked yet
-- (attempt_state). No row when none does.
CREATE OR REPLACE FUNCTION awa._callback_attempt_v1(p_callback_id uuid)
 RETURNS TABLE(job_id bigint, run_lease bigint)
 LANGUAGE plpgsql
 STABLE
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT ls.job_id, ls.run_lease FROM awa.leases ls
    WHERE ls.callback_id = p_callback_id ORDER BY ls.run_lease DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN QUERY
        SELECT s.job_id, s.run_lease FROM awa.attempt_state s
        WHERE s.callback_id = p_callback_id ORDER BY s.run_lease DESC LIMIT 1;
    END IF;
END
$$;

-- Resolve p_callback_id of the attempt (p_job_id, p_run_lease), whose callback lock the caller
-- holds. A parked attempt is finalized at once: completed with p_result (or resumed, when its
-- wait asked for it), or failed with p_error (retried unless p_terminal). An attempt not parked
-- yet keeps the first resolution for its park. Returns 'resolved' (applied), 'accepted' (kept
-- for the park) or 'stale' (the attempt is closed, or its callback was resolved already).
CREATE OR REPLACE FUNCTION awa._callback_apply_v1(
    p_callback_id uuid, p_job_id bigint, p_run_lease bigint, p_result jsonb, p_error jsonb,
    p_terminal boolean, p_backoff_base double precision)
 RETURNS text
 LANGUAGE plpgsql
AS $$
DECLARE
    l awa.leases%ROWTYPE;
    v_resume boolean;
    v_stale jsonb;
BEGIN
    -- A caller's backoff base (a retry's delay grows from it): a number of seconds from 0 to
    -- 1e9; NaN, infinities and negatives (a retry in the past) are refused.
    IF p_backoff_base IS NOT NULL AND NOT (p_backoff_base >= 0 AND p_backoff_base <= 1e9) THEN
        RAISE EXCEPTION 'backoff_base must be a number of seconds from 0 to 1e9, got %',
            p_backoff_base USING ERRCODE = '22023';
    END IF;
    SELECT * INTO l FROM awa.leases ls
    WHERE ls.callback_id = p_callback_id AND ls.job_id = p_job_id
      AND ls.run_lease = p_run_lease AND ls.state = 'waiting_external'
    LIMIT 1;
    IF FOUND THEN
        SELECT s.callback_resume INTO v_resume FROM awa.attempt_state s
        WHERE s.job_id = p_job_id AND s.run_lease = p_run_lease
          AND s.callback_id = p_callback_id;
        IF p_error IS NULL AND COALESCE(v_resume, false) THEN
            v_stale := awa._finalize_pass_v1(jsonb_build_array(jsonb_build_object(
                'id', l.job_id, 'lease', l.run_lease, 'slot', l.claim_slot, 'st', true,
                'outcome', 'snooze', 'delay', 0, 'closed_as', 'resumed')), false);
            IF v_stale IS NOT NULL THEN
                RETURN 'stale';
            END IF;
            PERFORM awa._callback_stamp_v1(l.job_id, l.run_lease, p_callback_id, p_result);
            RETURN 'resolved';
        END IF;
        v_stale := awa._finalize_pass_v1(jsonb_build_array(jsonb_build_object(
            'id', l.job_id, 'lease', l.run_lease, 'slot', l.claim_slot, 'st', true,
            'outcome', CASE WHEN p_error IS NULL THEN 'completed'
                            WHEN p_terminal THEN 'fail' ELSE 'retry' END,
            'result', p_result, 'error', p_error, 'backoff_base', p_backoff_base)), false);
        RETURN CASE WHEN v_stale IS NULL THEN 'resolved' ELSE 'stale' END;
    END IF;
    -- Registered but not parked yet: keep the first resolution for the park.
    UPDATE awa.attempt_state s
    SET callback_result = jsonb_build_object('result', p_result, 'error', p_error,
                                             'terminal', COALESCE(p_terminal, false),
                                             'backoff_base', p_backoff_base),
        updated_at = now()
    WHERE s.job_id = p_job_id AND s.run_lease = p_run_lease AND s.callback_id = p_callback_id
      AND s.callback_result IS NULL
      AND awa._attempt_open_v1(s.job_id, s.run_lease);
    RETURN CASE WHEN FOUND THEN 'accepted' ELSE 'stale' END;
END
$$;

-- Extend the wait of p_callback_id's attempt (p_job_id, p_run_lease), whose callback lock the
-- caller holds: its timeout becomes now() + p_timeout (NULL: the wait's own timeout), unless it
-- is later already. Returns ('extended', the new timeout); ('pending', the time the wait will
-- last at least until, or NULL) when the attempt registered the callback but has not parked
-- yet: the extension is kept (attempt_state.callback_extend_to) and the wait, when it starts,
-- lasts until the later of it and its own timeout; or ('stale', NULL) when the attempt is
-- closed or its callback already resolved.
CREATE OR REPLACE FUNCTION awa._callback_extend_locked_v1(
    p_callback_id uuid, p_job_id bigint, p_run_lease bigint, p_timeout double precision)
 RETURNS TABLE(outcome text, timeout_at timestamp with time zone)
 LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_until timestamptz;
BEGIN
    IF NOT awa._attempt_open_v1(p_job_id, p_run_lease) THEN
        RETURN QUERY SELECT 'stale'::text, NULL::timestamptz;
        RETURN;
    END IF;
    WITH moved AS (
        UPDATE awa.leases ls
        SET callback_timeout_at = GREATEST(ls.callback_timeout_at, now() + make_interval(
                secs => LEAST(COALESCE(
                    p_timeout,
                    (SELECT s.callback_timeout FROM awa.attempt_state s
                     WHERE s.job_id = ls.job_id AND s.run_lease = ls.run_lease),
                    extract(epoch FROM ls.callback_timeout_at - ls.created_at)::double precision),
                    awa._max_seconds_v1())))
        WHERE ls.job_id = p_job_id AND ls.run_lease = p_run_lease
          AND ls.callback_id = p_callback_id AND ls.state = 'waiting_external'
        RETURNING ls.callback_timeout_at
    )
    SELECT min(m.callback_timeout_at) INTO v_until FROM moved m;
    IF v_until IS NOT NULL THEN
        RETURN QUERY SELECT 'extended'::text, v_until;
        RETURN;
    END IF;
    -- Not parked yet: keep the extension for the park (an early resolution is kept the same way).
    -- A heartbeat without a timeout asks for the wait's own timeout, which the park sets anyway:
    -- nothing to keep (and the answer's timeout_at is an extension kept before, or NULL).
    UPDATE awa.attempt_state s
    SET callback_extend_to = CASE WHEN p_timeout IS NULL THEN s.callback_extend_to
            ELSE GREATEST(
                s.callback_extend_to,
                now() + make_interval(secs => LEAST(p_timeout, awa._max_seconds_v1()))) END,
        updated_at = now()
    WHERE s.job_id = p_job_id AND s.run_lease = p_run_lease
      AND s.callback_id = p_callback_id AND s.callback_result IS NULL
    RETURNING s.callback_extend_to INTO v_until;
    IF FOUND THEN
        RETURN QUERY SELECT 'pending'::text, v_until;
    ELSE
        RETURN QUERY SELECT 'stale'::text, NULL::timestamptz;
    END IF;
END
$$;

-- Callbacks -----------------------------------------------------------------------------------------

-- Register p_callback_id as the callback of the open attempt (p_job_id, p_run_lease), before
-- the handler hands it to an external system, so that a resolution arriving before the attempt
-- parks is kept (see callback_resolve_v2). A new id replaces the attempt's previous one.
-- Returns false when the attempt is no longer open (nothing is written).
CREATE OR REPLACE FUNCTION awa.callback_register_v1(
    p_job_id bigint, p_run_lease bigint, p_callback_id uuid)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
BEGIN
    PERFORM awa._require_read_committed_v1('awa.callback_register_v1');
    IF p_callback_id IS NULL THEN
        RAISE EXCEPTION 'callback_id: must not be NULL' USING ERRCODE = '22023';
    END IF;
    PERFORM pg_advisory_xact_lock(4282179, awa._job_key_v1(p_job_id));
    IF NOT EXISTS (
        SELECT 1 FROM awa.claims c
        WHERE c.job_id = p_job_id AND c.run_lease = p_run_lease
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot)) THEN
        RETURN false;
    END IF;
    INSERT INTO awa.attempt_state AS s (job_id, run_lease, callback_id)
    VALUES (p_job_id, p_run_lease, p_callback_id)
    ON CONFLICT (job_id, run_lease) DO UPDATE
    SET callback_id = EXCLUDED.callback_id,
        callback_result = CASE WHEN s.callback_id IS NOT DISTINCT FROM EXCLUDED.callback_id
                               THEN s.callback_result END,
        heartbeat_at = now(), updated_at = now();
    RETURN true;
END
$$;

-- Resolve and extend ------------------------------------------------------------------------------

-- Resolve a callback (awa_django.resolve_callback): complete the attempt with p_result, or fail
-- it (p_error, retried like any failure unless p_terminal), through the normal fenced
-- finalization; a wait that asked for it (WaitForCallback(..., resume=True)) resumes the job
-- instead of completing it. A parked attempt is finalized at once ('resolved'); an attempt that
-- registered the id but has not parked yet keeps the resolution, which its park then applies
-- ('accepted'). Returns the outcome ('resolved', 'accepted', 'stale': already resolved, rescued
-- after its timeout, cancelled or finished otherwise; or 'unknown') and the attempt that held
-- the callback.
CREATE OR REPLACE FUNCTION awa.callback_resolve_v2(
    p_callback_id uuid, p_result jsonb DEFAULT NULL::jsonb, p_error jsonb DEFAULT NULL::jsonb,
    p_terminal boolean DEFAULT false, p_backoff_base double precision DEFAULT 1.0)
 RETURNS TABLE(outcome text, job_id bigint, run_lease bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
#variable_conflict use_column
DECLARE
    v_job bigint;
    v_lease bigint;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.callback_resolve_v2');
    IF p_error IS NOT NULL AND jsonb_typeof(p_error) <> 'object' THEN
        RAISE EXCEPTION 'error: must be a JSON object' USING ERRCODE = '22023';
    END IF;
    SELECT a.job_id, a.run_lease INTO v_job, v_lease FROM awa._callback_attempt_v1(p_callback_id) a;
    IF v_job IS NULL THEN
        RETURN QUERY SELECT 'unknown'::text, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;
    -- Serialised with the attempt's park; later statements see what it committed.
    PERFORM pg_advisory_xact_lock(4282179, awa._job_key_v1(v_job));
    RETURN QUERY
    SELECT awa._callback_apply_v1(p_callback_id, v_job, v_lease, p_result, p_error,
                                  COALESCE(p_terminal, false), p_backoff_base),
           v_job, v_lease;
END
$$;

-- Extend a wait (awa_django.extend_callback): see awa._callback_extend_locked_v1. p_timeout in
-- seconds, in (0, 100 years], or NULL for the wait's own timeout. 'unknown' when no attempt
-- holds the callback.
CREATE OR REPLACE FUNCTION awa.callback_extend_v1(
    p_callback_id uuid, p_timeout double precision DEFAULT NULL::double precision)
 RETURNS TABLE(outcome text, timeout_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
#variable_conflict use_column
DECLARE
    v_job bigint;
    v_lease bigint;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.callback_extend_v1');
    PERFORM awa._check_callback_timeout_v1(p_timeout);
    SELECT a.job_id, a.run_lease INTO v_job, v_lease FROM awa._callback_attempt_v1(p_callback_id) a;
    IF v_job IS NULL THEN
        RETURN QUERY SELECT 'unknown'::text, NULL::timestamptz;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(4282179, awa._job_key_v1(v_job));
    RETURN QUERY
    SELECT e.outcome, e.timeout_at
    FROM awa._callback_extend_locked_v1(p_callback_id, v_job, v_lease, p_timeout) e;
END
$$;

-- The HTTP receiver ------------------------------------------------------------------------------

-- One signed request of the HTTP receiver, whose signature Python has checked: resolve
-- (p_action 'resolve': p_result, or p_error and p_terminal) or extend (p_action 'heartbeat':
-- p_timeout) the callback, at most once per request. p_sent_at is the request's timestamp (Unix
-- seconds); a request more than p_window seconds from now() on the database clock is
-- 'expired'. p_digest identifies the request (see awa.callback_receipts).
--
-- Returns (outcome, replayed, timeout_at):
--   'resolved' / 'accepted'   resolved now / kept for a park that has not happened yet
--   'extended' / 'pending'    the new timeout / not parked yet (see _callback_extend_locked_v1)
--   'conflict'                a resolution of a callback resolved by another request
--   'stale'                   the attempt is closed (resolved otherwise, rescued, cancelled)
--   'unknown'                 no attempt holds the callback
--   'expired'                 the timestamp is outside the window
-- replayed is true when this request was received before: its recorded outcome is returned and
-- nothing is done again. Two deliveries of one request at once: one acts, the other replays.
CREATE OR REPLACE FUNCTION awa.callback_receive_v1(
    p_callback_id uuid, p_sent_at bigint, p_window double precision, p_action text,
    p_digest bytea, p_result jsonb DEFAULT NULL::jsonb, p_error jsonb DEFAULT NULL::jsonb,
    p_terminal boolean DEFAULT false, p_timeout double precision DEFAULT NULL::double precision,
    p_backoff_base double precision DEFAULT 1.0)
 RETURNS TABLE(outcome text, replayed boolean, timeout_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
#variable_conflict use_column
DECLARE
    v_job bigint;
    v_lease bigint;
    v_outcome text;
    v_until timestamptz;
    r awa.callback_receipts%ROWTYPE;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.callback_receive_v1');
    IF p_callback_id IS NULL OR p_sent_at IS NULL THEN
        RAISE EXCEPTION 'callback_id and sent_at: must not be NULL' USING ERRCODE = '22023';
    ELSIF p_action IS NULL OR p_action NOT IN ('resolve', 'heartbeat') THEN
        RAISE EXCEPTION 'action: expected resolve or heartbeat' USING ERRCODE = '22023';
    ELSIF p_digest IS NULL OR octet_length(p_digest) <> 32 THEN
        RAISE EXCEPTION 'digest: expected 32 bytes (SHA-256)' USING ERRCODE = '22023';
    ELSIF p_window IS NULL OR NOT (p_window > 0 AND p_window <= 86400) THEN
        RAISE EXCEPTION 'window: must be a number of seconds in (0, 86400]' USING ERRCODE = '22023';
    ELSIF p_error IS NOT NULL AND jsonb_typeof(p_error) <> 'object' THEN
        RAISE EXCEPTION 'error: must be a JSON object' USING ERRCODE = '22023';
    END IF;
    PERFORM awa._check_callback_timeout_v1(p_timeout);
    IF abs(extract(epoch FROM now())::double precision - p_sent_at::double precision) > p_window
    THEN
        RETURN QUERY SELECT 'expired'::text, false, NULL::timestamptz;
        RETURN;
    END IF;
    -- The attempt: from an earlier receipt (its lease may be gone), else from its lease or state.
    SELECT rc.job_id, rc.run_lease INTO v_job, v_lease
    FROM awa.callback_receipts rc WHERE rc.callback_id = p_callback_id LIMIT 1;
    IF v_job IS NULL THEN
        SELECT a.job_id, a.run_lease INTO v_job, v_lease
        FROM awa._callback_attempt_v1(p_callback_id) a;
    END IF;
    IF v_job IS NULL THEN
        RETURN QUERY SELECT 'unknown'::text, false, NULL::timestamptz;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(4282179, awa._job_key_v1(v_job));
    -- From here on, every receipt committed before the lock is seen.
    SELECT * INTO r FROM awa.callback_receipts rc
    WHERE rc.callback_id = p_callback_id AND rc.request_digest = p_digest;
    IF FOUND AND r.action = p_action THEN
        RETURN QUERY SELECT r.outcome, true, r.timeout_at;
        RETURN;
    END IF;
    IF FOUND OR EXISTS (SELECT 1 FROM awa.callback_receipts rc
                        WHERE rc.callback_id = p_callback_id AND rc.action = 'resolve') THEN
        RETURN QUERY SELECT CASE WHEN p_action = 'resolve' THEN 'conflict' ELSE 'stale' END,
                            false, NULL::timestamptz;
        RETURN;
    END IF;
    IF p_action = 'resolve' THEN
        v_outcome := awa._callback_apply_v1(p_callback_id, v_job, v_lease, p_result, p_error,
                                            COALESCE(p_terminal, false), p_backoff_base);
    ELSE
        SELECT e.outcome, e.timeout_at INTO v_outcome, v_until
        FROM awa._callback_extend_locked_v1(p_callback_id, v_job, v_lease, p_timeout) e;
    END IF;
    IF v_outcome IN ('resolved', 'accepted', 'extended', 'pending') THEN
        INSERT INTO awa.callback_receipts (callback_id, request_digest, action, job_id,
                                           run_lease, outcome, timeout_at)
        VALUES (p_callback_id, p_digest, p_action, v_job, v_lease, v_outcome, v_until)
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN QUERY SELECT v_outcome, false, v_until;
END
$$;

-- Delete up to p_limit receipts older than p_keep seconds (the leader's retention task, with
-- p_keep twice the receiver's timestamp window plus a minute); returns how many. Rows locked
-- elsewhere are skipped, never waited for.
CREATE OR REPLACE FUNCTION awa.callback_receipts_prune_v1(
    p_keep double precision, p_limit integer DEFAULT 1000)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_count integer;
BEGIN
    IF p_keep IS NULL OR NOT (p_keep > 0 AND p_keep <= awa._max_seconds_v1()) THEN
        RAISE EXCEPTION 'keep: must be a number of seconds in (0, 3155760000]'
            USING ERRCODE = '22023';
    END IF;
    WITH old AS (
        SELECT rc.callback_id, rc.request_digest FROM awa.callback_receipts rc
        WHERE rc.received_at < now() - make_interval(secs => p_keep)
        ORDER BY rc.received_at
        LIMIT GREATEST(p_limit, 0)
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM awa.callback_receipts rc USING old
        WHERE rc.callback_id = old.callback_id AND rc.request_digest = old.request_digest
        RETURNING 1
    )
    SELECT count(*) INTO v_count FROM gone;
    RETURN v_count;
END
$$;
