-- awa_django migration 0009: external callbacks, complete (issue 17). docs/callbacks.md
-- describes them.
--
-- * Receipts of the signed HTTP receiver (awa_django.urls, POST <prefix>/callbacks/<id>/):
--   awa.callback_receive_v1 resolves or extends a wait and records what it did in
--   awa.callback_receipts, keyed by (callback id, SHA-256 of the request). The same request
--   again gets the recorded outcome and acts no second time; another resolution of a resolved
--   callback is a 'conflict'. A receipt is only needed while a replay of its request could still
--   pass the receiver's timestamp window (a request is accepted within ±window of its timestamp,
--   on the database clock), so the maintenance leader deletes receipts older than twice the
--   window plus a minute (awa.callback_receipts_prune_v1, in its retention task): the table
--   holds at most the last ~11 minutes of receipts (default window 300 s).
-- * Extending a wait: awa.callback_extend_v1 moves the lease's callback_timeout_at (the column
--   rescue reads) forward, never back. This is the one UPDATE of a lease row: one dead tuple
--   per extension in the lease's slot, reclaimed with the slot (or by vacuum).
-- * Sequential waits: WaitForCallback(..., resume=True) makes a result resume the job instead
--   of completing it: the attempt is closed as 'resumed' and the job scheduled again at once
--   (like a Snooze of 0 s: no attempt is counted, progress is kept), with the callback's id and
--   result in its metadata under the reserved key "awa:callback" (ctx.callback_result). An
--   error still retries or fails the job. awa.finalize_v3 is finalize_v2 plus what such a wait
--   needs at park: it records the wait's mode and timeout in attempt_state, and resumes at once
--   a wait whose result arrived before it parked. awa.callback_resolve_v2 is
--   callback_resolve_v1 plus the resume, and tells an early resolution ('accepted', kept for the
--   park) from one applied at once ('resolved').
-- * awa.callback_waits: the attempts parked now, with their callback and timeout (the admin).
--
-- Nothing earlier is redefined. Resolutions, extensions, parks and receipts of one job are
-- serialised by the callbacks' advisory lock (class 4282179, key from the job id).

-- What a parked attempt asked of its wait: a result resumes it (instead of completing it), and
-- the wait's timeout (the default extension of a heartbeat). Written by awa.finalize_v3.
ALTER TABLE awa.attempt_state ADD COLUMN IF NOT EXISTS callback_resume boolean;
ALTER TABLE awa.attempt_state ADD COLUMN IF NOT EXISTS callback_timeout double precision;

-- One row per request the HTTP receiver acted on: a resolution (at most one per callback) or a
-- heartbeat. request_digest is SHA-256 of the body for a resolution (a re-sent resolution with
-- the same body is the same resolution), of the timestamp and body for a heartbeat.
CREATE TABLE IF NOT EXISTS awa.callback_receipts (
    callback_id uuid NOT NULL,
    request_digest bytea NOT NULL CHECK (octet_length(request_digest) = 32),
    action text NOT NULL CHECK (action IN ('resolve', 'heartbeat')),
    job_id bigint NOT NULL,
    run_lease bigint NOT NULL,
    outcome text NOT NULL,
    timeout_at timestamptz,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (callback_id, request_digest)
);
CREATE UNIQUE INDEX IF NOT EXISTS callback_receipts_resolution_idx
    ON awa.callback_receipts (callback_id) WHERE action = 'resolve';
CREATE INDEX IF NOT EXISTS callback_receipts_received_idx
    ON awa.callback_receipts (received_at);

-- Helpers -----------------------------------------------------------------------------------------

-- The attempt that holds p_callback_id: parked (a lease) or registered and not parked yet
-- (attempt_state). No row when none does.
CREATE FUNCTION awa._callback_attempt_v1(p_callback_id uuid)
RETURNS TABLE (job_id bigint, run_lease bigint)
LANGUAGE plpgsql STABLE AS $$
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

-- Whether the attempt (p_job_id, p_run_lease) is open: a claim of it without closure.
CREATE FUNCTION awa._attempt_open_v1(p_job_id bigint, p_run_lease bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM awa.claims c
        WHERE c.job_id = p_job_id AND c.run_lease = p_run_lease
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot))
$$;

-- SQLSTATE 22023 unless p_timeout is NULL or a number of seconds in (0, 100 years].
CREATE FUNCTION awa._check_callback_timeout_v1(p_timeout double precision)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
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
CREATE FUNCTION awa._callback_stamp_v1(p_job_id bigint, p_run_lease bigint, p_callback_id uuid,
                                       p_result jsonb)
RETURNS void
LANGUAGE sql AS $$
    UPDATE awa.deferred_jobs d
    SET metadata = CASE WHEN jsonb_typeof(d.metadata) = 'object' THEN d.metadata
                        ELSE '{}'::jsonb END
                   || jsonb_build_object('awa:callback', jsonb_build_object(
                          'id', p_callback_id, 'result', COALESCE(p_result, 'null'::jsonb)))
    WHERE d.job_id = p_job_id AND d.run_lease = p_run_lease
$$;

-- Resolve p_callback_id of the attempt (p_job_id, p_run_lease), whose callback lock the caller
-- holds. A parked attempt is finalized at once: completed with p_result (or resumed, when its
-- wait asked for it), or failed with p_error (retried unless p_terminal). An attempt not parked
-- yet keeps the first resolution for its park. Returns 'resolved' (applied), 'accepted' (kept
-- for the park) or 'stale' (the attempt is closed, or its callback was resolved already).
CREATE FUNCTION awa._callback_apply_v1(
    p_callback_id uuid, p_job_id bigint, p_run_lease bigint, p_result jsonb, p_error jsonb,
    p_terminal boolean, p_backoff_base double precision)
RETURNS text
LANGUAGE plpgsql AS $$
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
-- is later already. Returns ('extended', the new timeout), ('pending', NULL) when the attempt
-- registered the callback but has not parked yet (its wait starts with its full timeout when
-- it parks), or ('stale', NULL) when the attempt is closed or its callback already resolved.
CREATE FUNCTION awa._callback_extend_locked_v1(
    p_callback_id uuid, p_job_id bigint, p_run_lease bigint, p_timeout double precision)
RETURNS TABLE (outcome text, timeout_at timestamptz)
LANGUAGE plpgsql AS $$
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
    ELSIF EXISTS (
        SELECT 1 FROM awa.attempt_state s
        WHERE s.job_id = p_job_id AND s.run_lease = p_run_lease
          AND s.callback_id = p_callback_id AND s.callback_result IS NULL) THEN
        RETURN QUERY SELECT 'pending'::text, NULL::timestamptz;
    ELSE
        RETURN QUERY SELECT 'stale'::text, NULL::timestamptz;
    END IF;
END
$$;

-- Resolve and extend ------------------------------------------------------------------------------

-- Resolve a callback (awa_django.resolve_callback): callback_resolve_v1, plus the resume of a
-- wait that asked for it, and 'accepted' for a resolution kept for a park that has not happened
-- yet (v1 says 'resolved' for both). Returns the outcome ('resolved', 'accepted', 'stale' or
-- 'unknown') and the attempt that held the callback.
CREATE FUNCTION awa.callback_resolve_v2(
    p_callback_id uuid, p_result jsonb DEFAULT NULL, p_error jsonb DEFAULT NULL,
    p_terminal boolean DEFAULT false, p_backoff_base double precision DEFAULT 1.0)
RETURNS TABLE (outcome text, job_id bigint, run_lease bigint)
LANGUAGE plpgsql AS $$
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
CREATE FUNCTION awa.callback_extend_v1(p_callback_id uuid, p_timeout double precision DEFAULT NULL)
RETURNS TABLE (outcome text, timeout_at timestamptz)
LANGUAGE plpgsql AS $$
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
CREATE FUNCTION awa.callback_receive_v1(
    p_callback_id uuid, p_sent_at bigint, p_window double precision, p_action text,
    p_digest bytea, p_result jsonb DEFAULT NULL, p_error jsonb DEFAULT NULL,
    p_terminal boolean DEFAULT false, p_timeout double precision DEFAULT NULL,
    p_backoff_base double precision DEFAULT 1.0)
RETURNS TABLE (outcome text, replayed boolean, timeout_at timestamptz)
LANGUAGE plpgsql AS $$
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
CREATE FUNCTION awa.callback_receipts_prune_v1(p_keep double precision,
                                               p_limit integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql AS $$
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

-- Park ----------------------------------------------------------------------------------------

-- Finalize a batch of attempts: awa.finalize_v2 (same items and results), plus what 'wait'
-- items need. A wait item may carry "resume": true (WaitForCallback(resume=True)). Under the
-- callbacks' lock of each waiting job, before the park:
--   * a resume wait whose callback already has a result (the external system answered before
--     the handler returned) is not parked: the attempt is closed as 'resumed' and the job
--     scheduled again at once with the result (awa._callback_stamp_v1);
--   * every other wait records its mode and timeout with its registered callback
--     (attempt_state.callback_resume, callback_timeout), read by resolutions and extensions.
-- The worker sends batches without waits to finalize_v2 directly.
CREATE FUNCTION awa.finalize_v3(p_items jsonb)
RETURNS TABLE (job_id bigint, run_lease bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_error text;
    v_items jsonb;
    v_resumed jsonb;
    v_stale jsonb;
    v_gen bigint;
    v_slot integer;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.finalize_v3');
    IF p_items IS NULL OR jsonb_typeof(p_items) <> 'array' THEN
        RAISE EXCEPTION 'items: expected a JSON array' USING ERRCODE = '22023';
    END IF;
    v_error := awa._finalize_error_v1(p_items);
    IF v_error IS NULL THEN
        SELECT format('item %s (job %s): resume: must be true or false', e.ord - 1,
                      e.value ->> 'id')
        INTO v_error
        FROM jsonb_array_elements(p_items) WITH ORDINALITY AS e(value, ord)
        WHERE jsonb_typeof(e.value -> 'resume') NOT IN ('boolean', 'null')
        ORDER BY e.ord LIMIT 1;
    END IF;
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM jsonb_array_elements(p_items) e
                   WHERE e.value ->> 'outcome' = 'wait') THEN
        RETURN QUERY SELECT f.job_id, f.run_lease FROM awa.finalize_v2(p_items) f;
        RETURN;
    END IF;
    -- Serialise with resolutions of the waiting jobs, in a stable order (the park takes the
    -- same locks again). From here on, each statement sees every resolution committed before.
    PERFORM pg_advisory_xact_lock(4282179, awa._job_key_v1(s.id))
    FROM (SELECT DISTINCT (e.value ->> 'id')::bigint AS id
          FROM jsonb_array_elements(p_items) e
          WHERE e.value ->> 'outcome' = 'wait' ORDER BY 1) s;

    -- Resume waits already answered with a result become resumptions.
    WITH w AS (
        SELECT e.ord, e.value AS raw, x.*
        FROM jsonb_array_elements(p_items) WITH ORDINALITY AS e(value, ord),
             jsonb_to_record(e.value) AS x(id bigint, lease bigint, slot integer, outcome text,
                                            callback_id uuid, resume boolean)
    ), early AS (
        SELECT w.ord, w.id, w.lease, w.callback_id, s.callback_result -> 'result' AS result
        FROM w
        JOIN awa.attempt_state s
          ON s.job_id = w.id AND s.run_lease = w.lease AND s.callback_id = w.callback_id
        WHERE w.outcome = 'wait' AND COALESCE(w.resume, false)
          AND s.callback_result IS NOT NULL
          AND jsonb_typeof(s.callback_result -> 'error') IS DISTINCT FROM 'object'
          AND NOT EXISTS (SELECT 1 FROM awa.leases ls
                          WHERE ls.job_id = w.id AND ls.run_lease = w.lease)
    )
    SELECT jsonb_agg(CASE WHEN y.ord IS NULL THEN w.raw
                          ELSE jsonb_build_object('id', w.id, 'lease', w.lease, 'slot', w.slot,
                                                  'outcome', 'snooze', 'delay', 0, 'st', true,
                                                  'closed_as', 'resumed')
                               || CASE WHEN w.raw ? 'progress'
                                       THEN jsonb_build_object('progress', w.raw -> 'progress')
                                       ELSE '{}'::jsonb END
                     END ORDER BY w.ord),
           jsonb_agg(jsonb_build_object('id', y.id, 'lease', y.lease,
                                        'callback_id', y.callback_id, 'result', y.result))
               FILTER (WHERE y.ord IS NOT NULL)
    INTO v_items, v_resumed
    FROM w LEFT JOIN early y ON y.ord = w.ord;

    -- The other waits: what they asked for, with their registered callback.
    UPDATE awa.attempt_state s
    SET callback_resume = COALESCE(x.resume, false), callback_timeout = x.timeout
    FROM jsonb_to_recordset(v_items) AS x(id bigint, lease bigint, outcome text, callback_id uuid,
                                           timeout double precision, resume boolean)
    WHERE x.outcome = 'wait' AND s.job_id = x.id AND s.run_lease = x.lease
      AND s.callback_id = x.callback_id;

    IF v_resumed IS NOT NULL THEN
        -- Each resumed attempt gets its lease too, closed with it below (as a park does for an
        -- early resolution), so that a later resolution of the same callback is told 'stale'.
        SELECT generation, slot INTO v_gen, v_slot
        FROM awa.ring_rotations WHERE ring = 'lease' ORDER BY generation DESC LIMIT 1;
        INSERT INTO awa.leases (lease_slot, lease_generation, job_id, run_lease, claim_slot,
                                state, callback_id, callback_timeout_at)
        SELECT v_slot, v_gen, x.id, x.lease, c.claim_slot, 'waiting_external', x.callback_id,
               now()
        FROM jsonb_to_recordset(v_resumed) AS x(id bigint, lease bigint, callback_id uuid)
        CROSS JOIN LATERAL (
            SELECT c.claim_slot FROM awa.claims c
            WHERE c.job_id = x.id AND c.run_lease = x.lease
              AND NOT EXISTS (
                  SELECT 1 FROM awa.claim_closures z
                  WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                    AND z.claim_slot = c.claim_slot)
            LIMIT 1) c
        ON CONFLICT DO NOTHING;
    END IF;

    SELECT jsonb_agg(jsonb_build_array(f.job_id, f.run_lease)) INTO v_stale
    FROM awa.finalize_v2(v_items) f;

    IF v_resumed IS NOT NULL THEN
        PERFORM awa._callback_stamp_v1(x.id, x.lease, x.callback_id, x.result)
        FROM jsonb_to_recordset(v_resumed) AS x(id bigint, lease bigint, callback_id uuid,
                                                 result jsonb)
        WHERE jsonb_build_array(x.id, x.lease) NOT IN (
            SELECT p.value FROM jsonb_array_elements(COALESCE(v_stale, '[]'::jsonb)) p);
    END IF;
    RETURN QUERY
    SELECT (p.value ->> 0)::bigint, (p.value ->> 1)::bigint
    FROM jsonb_array_elements(COALESCE(v_stale, '[]'::jsonb)) p;
END
$$;

-- Read surface --------------------------------------------------------------------------------

-- The attempts parked now, waiting for their callback: one row per job (a job has at most one
-- open attempt). timeout_at is when rescue will take it ("callback timed out"); resume tells
-- whether a result resumes the job (WaitForCallback(resume=True)) or completes it.
CREATE VIEW awa.callback_waits AS
SELECT w.job_id, w.run_lease, w.callback_id, w.parked_at, w.timeout_at,
       COALESCE(s.callback_resume, false) AS resume, c.attempt, r.kind, l.queue, r.priority,
       r.max_attempts, r.created_at, r.metadata, COALESCE(s.progress, r.progress) AS progress
FROM (
    SELECT ls.job_id, ls.run_lease, (array_agg(ls.callback_id))[1] AS callback_id,
           min(ls.created_at) AS parked_at, min(ls.callback_timeout_at) AS timeout_at
    FROM awa.leases ls
    WHERE ls.state = 'waiting_external'
    GROUP BY ls.job_id, ls.run_lease
) w
CROSS JOIN LATERAL (
    SELECT c.attempt, c.lane_id, c.lane_seq, c.ready_slot FROM awa.claims c
    WHERE c.job_id = w.job_id AND c.run_lease = w.run_lease
      AND NOT EXISTS (
          SELECT 1 FROM awa.claim_closures z
          WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
            AND z.claim_slot = c.claim_slot)
    LIMIT 1
) c
JOIN awa.queue_lanes l ON l.lane_id = c.lane_id
JOIN awa.ready_entries r
  ON r.lane_id = c.lane_id AND r.lane_seq = c.lane_seq AND r.ready_slot = c.ready_slot
LEFT JOIN awa.attempt_state s ON s.job_id = w.job_id AND s.run_lease = w.run_lease;
