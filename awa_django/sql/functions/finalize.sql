-- Finalize ----------------------------------------------------------------------------------------

-- The first invalid item of a finalize batch, as a message naming its index and job (NULL when
-- every item is valid). Same bounds as the Python outcome constructors.
CREATE OR REPLACE FUNCTION awa._finalize_error_v1(p_items jsonb)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $$
    SELECT format('item %s (job %s): %s', x.ord - 1, x.value ->> 'id', x.err)
    FROM (
        SELECT e.ord, e.value, CASE
            WHEN jsonb_typeof(e.value) <> 'object' THEN 'must be a JSON object'
            WHEN jsonb_typeof(e.value -> 'id') IS DISTINCT FROM 'number'
                 OR jsonb_typeof(e.value -> 'lease') IS DISTINCT FROM 'number'
                 OR jsonb_typeof(e.value -> 'slot') IS DISTINCT FROM 'number' THEN
                'id, lease and slot must be numbers'
            WHEN e.value ->> 'outcome' IS NULL OR e.value ->> 'outcome' NOT IN (
                     'completed', 'retry', 'snooze', 'cancel', 'fail', 'wait') THEN
                'outcome: expected completed, retry, snooze, cancel, fail or wait'
            WHEN jsonb_typeof(e.value -> 'delay') NOT IN ('number', 'null') THEN
                'delay: must be a number of seconds'
            WHEN jsonb_typeof(e.value -> 'delay') = 'number'
                 AND NOT ((e.value ->> 'delay')::float8 BETWEEN 0 AND 3155760000) THEN
                'delay: must be a number of seconds in 0..3155760000 (100 years)'
            WHEN jsonb_typeof(e.value -> 'error') NOT IN ('object', 'null') THEN
                'error: must be a JSON object'
            WHEN e.value ->> 'outcome' <> 'wait' THEN NULL
            WHEN e.value ->> 'callback_id' IS NULL
                 OR e.value ->> 'callback_id' !~* '^[0-9a-f]{8}-?([0-9a-f]{4}-?){3}[0-9a-f]{12}$' THEN
                'callback_id: must be a uuid'
            WHEN jsonb_typeof(e.value -> 'timeout') IS DISTINCT FROM 'number'
                 OR NOT ((e.value ->> 'timeout')::float8 > 0
                         AND (e.value ->> 'timeout')::float8 <= 3155760000) THEN
                'timeout: must be a number of seconds in (0, 3155760000]'
        END AS err
        FROM jsonb_array_elements(p_items) WITH ORDINALITY AS e(value, ord)
    ) x
    WHERE x.err IS NOT NULL
    ORDER BY x.ord
    LIMIT 1
$$;

-- Every retry's wait now comes from awa._backoff_v2 and the job's policy (explicit delays of
-- RetryAfter and Snooze aside); a retry that would run after created_at + max_age goes to the
-- DLQ (or failed) like exhausted attempts, with the reason "max_age exceeded: ...".
CREATE OR REPLACE FUNCTION awa._finalize_pass_v1(p_items jsonb, p_hint boolean)
 RETURNS jsonb
 LANGUAGE plpgsql
AS $$
DECLARE
    v_stale jsonb;
    v_ended bigint[];
    v_states text[];
BEGIN
    WITH items AS (
        SELECT x.*, e.value AS raw
        FROM jsonb_array_elements(p_items) AS e(value),
             jsonb_to_record(e.value) AS x(id bigint, lease bigint, slot integer, outcome text,
                 result jsonb, error jsonb, delay double precision, progress jsonb, st boolean,
                 closed_as text, backoff_base double precision)
    ), cl AS MATERIALIZED (
        -- A lateral lookup (not a join) keeps the row estimate at the item count, so the
        -- planner hash-joins the CTEs below instead of nesting loops over them.
        SELECT i.id, i.lease, i.outcome, i.result, i.error, i.delay, i.backoff_base, i.progress,
               COALESCE(i.st, false) AS st, COALESCE(i.closed_as, i.outcome) AS closed_as,
               c.claim_slot, c.ready_slot, c.ready_generation,
               c.lane_id, c.lane_seq, c.attempt, c.claimed_at, c.kind AS claim_kind
        FROM items i
        CROSS JOIN LATERAL (
            SELECT c.* FROM awa.claims c
            WHERE c.job_id = i.id AND c.run_lease = i.lease
              AND (c.claim_slot = i.slot OR NOT p_hint)
              AND (p_hint OR NOT EXISTS (
                  SELECT 1 FROM awa.claim_closures z
                  WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                    AND z.claim_slot = c.claim_slot))
            LIMIT 1) c
    ), closed AS (
        INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
        SELECT claim_slot, id, lease, closed_as FROM cl
        ON CONFLICT DO NOTHING
        RETURNING claim_slot, job_id, run_lease
    ), won AS MATERIALIZED (
        SELECT cl.* FROM cl
        JOIN closed k ON k.job_id = cl.id AND k.run_lease = cl.lease AND k.claim_slot = cl.claim_slot
    ), completed AS (
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
            attempted_at, result, queue, kind)
        SELECT w.ready_slot, w.ready_generation, w.id, w.lease, w.lane_id, w.lane_seq, 'completed',
               w.attempt, w.claimed_at, w.result, l.queue,
               -- A claim without a kind (written by raw SQL): read it from the ready row.
               COALESCE(w.claim_kind, (SELECT r.kind FROM awa.ready_entries r
                                 WHERE r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq
                                   AND r.ready_slot = w.ready_slot))
        FROM won w JOIN awa.queue_lanes l ON l.lane_id = w.lane_id
        WHERE w.outcome = 'completed'
        RETURNING ready_slot, queue, state, job_id
    ), other AS MATERIALIZED (
        SELECT w.*, r.queue, r.priority, r.kind, r.args, r.max_attempts, r.run_at, r.created_at,
               r.deadline_secs, r.metadata, r.tags,
               CASE WHEN w.outcome = 'snooze' THEN r.errors
                    ELSE COALESCE(r.errors, '[]'::jsonb) || jsonb_build_array(
                        COALESCE(w.error, jsonb_build_object('message', w.outcome))
                        || jsonb_build_object('attempt', w.attempt, 'at', now()))
               END AS new_errors,
               COALESCE(w.progress, s.progress, r.progress) AS new_progress, b.wait,
               CASE
                   WHEN w.outcome = 'snooze' THEN 'scheduled'
                   WHEN w.outcome = 'cancel' THEN 'cancelled'
                   WHEN w.outcome = 'retry' AND w.attempt < r.max_attempts AND NOT b.too_old
                       THEN 'retryable'
                   WHEN COALESCE(m.dlq_enabled, true) THEN 'dlq'
                   ELSE 'failed'
               END AS dest
        FROM won w
        JOIN awa.ready_entries r
          ON r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq AND r.ready_slot = w.ready_slot
        LEFT JOIN awa.queue_meta m ON m.queue = r.queue
        LEFT JOIN awa.attempt_state s ON w.st AND s.job_id = w.id AND s.run_lease = w.lease
        -- The wait before the next run: the explicit delay (RetryAfter, Snooze), else the
        -- backoff of the job's own retry policy (metadata "awa:retry"). A retry that would run
        -- after created_at + the policy's max_age is given up like exhausted attempts.
        CROSS JOIN LATERAL (
            SELECT x.wait,
                   COALESCE(w.outcome = 'retry'
                            AND now() + make_interval(secs => x.wait) > r.created_at
                                + make_interval(secs => awa._retry_number_v1(
                                      r.metadata -> 'awa:retry', 'max_age', 0.001,
                                      awa._max_seconds_v1())),
                            false) AS too_old
            FROM (SELECT CASE WHEN w.outcome = 'retry'
                              THEN COALESCE(w.delay, awa._backoff_v2(
                                  w.attempt, w.backoff_base, r.metadata -> 'awa:retry'))
                              ELSE COALESCE(w.delay, 0) END AS wait) x) b
        WHERE w.outcome <> 'completed'
    ), terminal AS (
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
            attempted_at, errors, progress, queue, kind)
        SELECT o.ready_slot, o.ready_generation, o.id, o.lease, o.lane_id, o.lane_seq, o.dest,
               o.attempt, o.claimed_at, o.new_errors, o.new_progress, o.queue, o.kind
        FROM other o WHERE o.dest IN ('cancelled', 'failed')
        RETURNING ready_slot, queue, state, job_id
    ), counted AS (
        -- The history these wrote, counted (awa.done_counts).
        INSERT INTO awa.done_counts (ready_slot, queue, state, n)
        SELECT x.ready_slot, x.queue, x.state, count(*)
        FROM (SELECT * FROM completed UNION ALL SELECT * FROM terminal) x
        GROUP BY x.ready_slot, x.queue, x.state
    ), deferred AS (
        INSERT INTO awa.deferred_jobs (
            job_id, state, queue, priority, kind, args, attempt, max_attempts, run_lease, run_at,
            created_at, attempted_at, deadline_secs, metadata, tags, errors, progress)
        SELECT o.id, o.dest, o.queue, o.priority, o.kind, o.args,
               CASE WHEN o.dest = 'scheduled' THEN o.attempt - 1 ELSE o.attempt END,
               o.max_attempts, o.lease,
               now() + make_interval(secs => o.wait),
               o.created_at, o.claimed_at, o.deadline_secs, o.metadata, o.tags, o.new_errors,
               o.new_progress
        FROM other o WHERE o.dest IN ('scheduled', 'retryable')
    ), dead AS (
        INSERT INTO awa.dlq_entries (
            job_id, queue, priority, kind, args, attempt, max_attempts, run_lease,
            original_run_lease, run_at, created_at, attempted_at, deadline_secs, metadata, tags,
            errors, progress, dlq_reason)
        SELECT o.id, o.queue, o.priority, o.kind, o.args, o.attempt, o.max_attempts, o.lease,
               o.lease, o.run_at, o.created_at, o.claimed_at, o.deadline_secs, o.metadata, o.tags,
               o.new_errors, o.new_progress,
               CASE WHEN o.outcome <> 'retry' THEN 'terminal error: '
                    WHEN o.attempt < o.max_attempts THEN 'max_age exceeded: '
                    ELSE 'max_attempts exhausted: ' END
               || COALESCE(o.error ->> 'message', o.outcome)
        FROM other o WHERE o.dest = 'dlq'
    ), cleared AS (
        DELETE FROM awa.attempt_state s
        USING won w
        WHERE w.st AND s.job_id = w.id AND s.run_lease = w.lease
    )
    SELECT (SELECT jsonb_agg(i.raw) FROM items i
            WHERE NOT EXISTS (SELECT 1 FROM closed k
                              WHERE k.job_id = i.id AND k.run_lease = i.lease)),
           x.ids, x.states
    INTO v_stale, v_ended, v_states
    FROM (SELECT array_agg(y.job_id ORDER BY y.job_id) AS ids,
                 array_agg(y.state ORDER BY y.job_id) AS states
          FROM (SELECT * FROM completed UNION ALL SELECT * FROM terminal) y) x;
    -- Their workflows, when some workflow is open (awa._workflow_settle_v1).
    PERFORM awa._workflow_settle_v1(v_ended, v_states);
    RETURN v_stale;
END
$$;

-- Finalize a batch of attempts in one transaction. p_items is a JSON array of objects:
--   id, lease, slot    the attempt identity and the claim slot it was claimed in
--   outcome            completed | retry | snooze | cancel | fail | wait
--   callback_id,       (wait) the attempt parks, waiting_external, until awa.callback_resolve_v2
--   timeout            is called with callback_id or `timeout` seconds pass (then it is rescued)
--   result             (completed) the JSON return value
--   error              (retry, fail, cancel) {"type", "message", "traceback"}
--   delay              (retry: explicit RetryAfter delay; snooze) seconds
--   progress           the latest progress snapshot, kept across retries, cleared on success
--   st                 true when the attempt may have an attempt_state row to remove
--   closed_as          the closure's recorded outcome when it differs (rescue records 'rescued')
-- Each attempt is closed at most once; retry past max_attempts and fail go to the DLQ when the
-- queue's DLQ is on (default), else to terminal history as failed. Returns the attempts that
-- were stale (already closed by rescue, cancel or another finalizer): nothing was written for
-- them.
--
-- Also: every item is validated first (SQLSTATE 22023 naming the item,
-- nothing written), READ COMMITTED is required, and parking is idempotent and applies a
-- callback resolution that arrived before the park.
CREATE OR REPLACE FUNCTION awa.finalize_v1(p_items jsonb)
 RETURNS TABLE(job_id bigint, run_lease bigint)
 LANGUAGE plpgsql
AS $$
DECLARE
    v_error text;
    v_stale jsonb;
    v_park jsonb;
    v_wait_stale jsonb := '[]'::jsonb;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.finalize_v1');
    IF p_items IS NULL OR jsonb_typeof(p_items) <> 'array' THEN
        RAISE EXCEPTION 'items: expected a JSON array' USING ERRCODE = '22023';
    END IF;
    v_error := awa._finalize_error_v1(p_items);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_items) e WHERE e.value ->> 'outcome' = 'wait')
    THEN
        v_park := awa._park_v2(
            (SELECT jsonb_agg(e.value) FROM jsonb_array_elements(p_items) e
             WHERE e.value ->> 'outcome' = 'wait'));
        v_wait_stale := v_park -> 'stale';
        p_items := (SELECT COALESCE(jsonb_agg(e.value), '[]'::jsonb)
                    FROM jsonb_array_elements(p_items) e WHERE e.value ->> 'outcome' <> 'wait')
                   || (v_park -> 'finalize');
    END IF;
    v_stale := awa._finalize_pass_v1(p_items, true);
    IF v_stale IS NOT NULL THEN
        -- A concurrent carry-forward may have moved the claim to another slot; this second
        -- statement runs with a snapshot taken after any closure we conflicted with.
        v_stale := awa._finalize_pass_v1(v_stale, false);
    END IF;
    RETURN QUERY
    SELECT (e.value ->> 'id')::bigint, (e.value ->> 'lease')::bigint
    FROM jsonb_array_elements(COALESCE(v_stale, '[]'::jsonb) || v_wait_stale) AS e(value);
END
$$;

-- Finalize a batch of attempts: the items and results of awa.finalize_v1 (see its comment). A
-- batch of plain completions (every outcome 'completed', no attempt state, no recorded
-- closure other than the outcome) is written by one statement over the claim and terminal
-- planes; any other batch goes through awa.finalize_v1. An item not closed where it was looked
-- for (a carry-forward may have moved its claim, also while this call waited for it) is looked
-- for again, up to three more times, each in a new statement that sees what the transactions
-- it waited for committed; an attempt closed by rescue, cancel or another finalizer stays
-- stale. Parks ('wait' items) found stale are reported at once, as by finalize_v1.
CREATE OR REPLACE FUNCTION awa.finalize_v2(p_items jsonb)
 RETURNS TABLE(job_id bigint, run_lease bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
#variable_conflict use_column
DECLARE
    v_error text;
    v_stale jsonb;
    v_pairs jsonb;
    v_pass integer;
    v_other boolean;
    v_slot integer;
    v_done bigint[];
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'awa.finalize_v2 needs READ COMMITTED isolation' USING ERRCODE = '25000';
    END IF;
    IF p_items IS NULL OR jsonb_typeof(p_items) <> 'array' THEN
        RAISE EXCEPTION 'items: expected a JSON array' USING ERRCODE = '22023';
    END IF;
    v_error := awa._finalize_error_v1(p_items);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;
    -- Whether any item is not a plain completion, and the claim slot shared by every item
    -- (else NULL).
    SELECT bool_or(e.value ->> 'outcome' <> 'completed'
                   OR COALESCE(e.value -> 'st', 'null') NOT IN ('false', 'null')
                   OR e.value ? 'closed_as'),
           CASE WHEN min(e.value ->> 'slot') = max(e.value ->> 'slot')
                     AND min(e.value ->> 'slot') ~ '^[0-9]$'
                THEN min(e.value ->> 'slot')::integer END
    INTO v_other, v_slot
    FROM jsonb_array_elements(p_items) e;
    IF v_other THEN
        SELECT jsonb_agg(jsonb_build_array(f.job_id, f.run_lease)) INTO v_pairs
        FROM awa.finalize_v1(p_items) f;
        IF v_pairs IS NULL THEN
            RETURN;
        END IF;
        -- Items (not parks) reported stale are looked for again below; parks are reported.
        SELECT jsonb_agg(e.value) INTO v_stale
        FROM jsonb_array_elements(p_items) e
        WHERE e.value ->> 'outcome' <> 'wait'
          AND jsonb_build_array((e.value ->> 'id')::bigint, (e.value ->> 'lease')::bigint)
              IN (SELECT p.value FROM jsonb_array_elements(v_pairs) p);
        RETURN QUERY
        SELECT (p.value ->> 0)::bigint, (p.value ->> 1)::bigint
        FROM jsonb_array_elements(v_pairs) p
        WHERE NOT EXISTS (
            SELECT 1 FROM jsonb_array_elements(COALESCE(v_stale, '[]')) e
            WHERE (e.value ->> 'id')::bigint = (p.value ->> 0)::bigint
              AND (e.value ->> 'lease')::bigint = (p.value ->> 1)::bigint);
    ELSE
        CASE v_slot
        --@each claim_slot
        WHEN {claim_slot} THEN
            WITH items AS (
                SELECT x.id, x.lease, x.slot, x.result, e.value AS raw
                FROM jsonb_array_elements(p_items) AS e(value),
                     jsonb_to_record(e.value) AS x(id bigint, lease bigint, slot integer, result jsonb)
            ), cl AS MATERIALIZED (
                SELECT i.id, i.lease, i.result, c.claim_slot, c.ready_slot, c.ready_generation,
                       c.lane_id, c.lane_seq, c.attempt, c.claimed_at, c.kind
                FROM items i
                CROSS JOIN LATERAL (
                    SELECT c.* FROM awa.claims_{claim_slot} c
                    WHERE c.job_id = i.id AND c.run_lease = i.lease AND c.claim_slot = i.slot
                    LIMIT 1) c
            ), closed AS (
                INSERT INTO awa.claim_closures_{claim_slot} (claim_slot, job_id, run_lease, outcome)
                SELECT cl.claim_slot, cl.id, cl.lease, 'completed' FROM cl
                ON CONFLICT DO NOTHING
                RETURNING claim_slot, job_id, run_lease
            ), completed AS (
                INSERT INTO awa.done_entries (
                    ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
                    attempted_at, result, queue, kind)
                SELECT w.ready_slot, w.ready_generation, w.id, w.lease, w.lane_id, w.lane_seq,
                       'completed', w.attempt, w.claimed_at, w.result, l.queue,
                       -- A claim without a kind (written by raw SQL): read it from the ready row.
                       COALESCE(w.kind, awa._ready_kind_v2(w.lane_id, w.lane_seq, w.ready_slot))
                FROM cl w
                JOIN closed k
                  ON k.job_id = w.id AND k.run_lease = w.lease AND k.claim_slot = w.claim_slot
                JOIN awa.queue_lanes l ON l.lane_id = w.lane_id
                RETURNING ready_slot, queue, job_id
            ), counted AS (
                INSERT INTO awa.done_counts (ready_slot, queue, state, n)
                SELECT c.ready_slot, c.queue, 'completed', count(*)
                FROM completed c GROUP BY c.ready_slot, c.queue
            )
            SELECT (SELECT jsonb_agg(i.raw) FROM items i
                    WHERE NOT EXISTS (SELECT 1 FROM closed k
                                      WHERE k.job_id = i.id AND k.run_lease = i.lease)),
                   (SELECT array_agg(c.job_id) FROM completed c)
            INTO v_stale, v_done;
        --@end
        ELSE
            WITH items AS (
                SELECT x.id, x.lease, x.slot, x.result, e.value AS raw
                FROM jsonb_array_elements(p_items) AS e(value),
                     jsonb_to_record(e.value) AS x(id bigint, lease bigint, slot integer, result jsonb)
            ), cl AS MATERIALIZED (
                SELECT i.id, i.lease, i.result, c.claim_slot, c.ready_slot, c.ready_generation,
                       c.lane_id, c.lane_seq, c.attempt, c.claimed_at, c.kind
                FROM items i
                CROSS JOIN LATERAL (
                    SELECT c.* FROM awa.claims c
                    WHERE c.job_id = i.id AND c.run_lease = i.lease AND c.claim_slot = i.slot
                    LIMIT 1) c
            ), closed AS (
                INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
                SELECT cl.claim_slot, cl.id, cl.lease, 'completed' FROM cl
                ON CONFLICT DO NOTHING
                RETURNING claim_slot, job_id, run_lease
            ), completed AS (
                INSERT INTO awa.done_entries (
                    ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state, attempt,
                    attempted_at, result, queue, kind)
                SELECT w.ready_slot, w.ready_generation, w.id, w.lease, w.lane_id, w.lane_seq,
                       'completed', w.attempt, w.claimed_at, w.result, l.queue,
                       -- A claim without a kind (written by raw SQL): read it from the ready row.
                       COALESCE(w.kind, awa._ready_kind_v2(w.lane_id, w.lane_seq, w.ready_slot))
                FROM cl w
                JOIN closed k
                  ON k.job_id = w.id AND k.run_lease = w.lease AND k.claim_slot = w.claim_slot
                JOIN awa.queue_lanes l ON l.lane_id = w.lane_id
                RETURNING ready_slot, queue, job_id
            ), counted AS (
                INSERT INTO awa.done_counts (ready_slot, queue, state, n)
                SELECT c.ready_slot, c.queue, 'completed', count(*)
                FROM completed c GROUP BY c.ready_slot, c.queue
            )
            SELECT (SELECT jsonb_agg(i.raw) FROM items i
                    WHERE NOT EXISTS (SELECT 1 FROM closed k
                                      WHERE k.job_id = i.id AND k.run_lease = i.lease)),
                   (SELECT array_agg(c.job_id) FROM completed c)
            INTO v_stale, v_done;
        END CASE;
        -- Their workflows, when some workflow is open (awa._workflow_settle_v1).
        PERFORM awa._workflow_settle_as_v1(v_done, 'completed');
    END IF;
    FOR v_pass IN 1..3 LOOP
        EXIT WHEN v_stale IS NULL;
        v_stale := awa._finalize_pass_v1(v_stale, false);
    END LOOP;
    RETURN QUERY
    SELECT (e.value ->> 'id')::bigint, (e.value ->> 'lease')::bigint
    FROM jsonb_array_elements(COALESCE(v_stale, '[]')) e;
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
CREATE OR REPLACE FUNCTION awa.finalize_v3(p_items jsonb)
 RETURNS TABLE(job_id bigint, run_lease bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
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

-- Park the 'wait' items of a batch (see finalize_v1). Idempotent: an attempt that is already
-- parked stays parked (a batch resent after a reconnect changes nothing). An attempt whose
-- registered callback was resolved before it parked is not parked: its resolution comes back as
-- a finalize item. Returns {"finalize": [items], "stale": [items]}.
CREATE OR REPLACE FUNCTION awa._park_v2(p_items jsonb)
 RETURNS jsonb
 LANGUAGE plpgsql
AS $$
DECLARE
    v_gen bigint;
    v_slot integer;
    v_rows jsonb;
    v_early jsonb;
    v_stale jsonb;
BEGIN
    -- Serialise with callback_resolve_v2 for these jobs, in a stable order.
    PERFORM pg_advisory_xact_lock(4282179, awa._job_key_v1(s.id))
    FROM (SELECT DISTINCT (e.value ->> 'id')::bigint AS id
          FROM jsonb_array_elements(p_items) e ORDER BY 1) s;
    -- From here on, each statement sees every resolution committed before the locks.
    SELECT generation, slot INTO v_gen, v_slot
    FROM awa.ring_rotations WHERE ring = 'lease' ORDER BY generation DESC LIMIT 1;
    SELECT jsonb_agg(jsonb_build_object(
               'id', x.id, 'lease', x.lease, 'callback_id', x.callback_id, 'timeout', x.timeout,
               'progress', x.progress, 'raw', e.value,
               'open_slot', (
                   SELECT c.claim_slot FROM awa.claims c
                   WHERE c.job_id = x.id AND c.run_lease = x.lease
                     AND NOT EXISTS (
                         SELECT 1 FROM awa.claim_closures z
                         WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                           AND z.claim_slot = c.claim_slot)
                   LIMIT 1),
               'parked', EXISTS (
                   SELECT 1 FROM awa.leases ls WHERE ls.job_id = x.id AND ls.run_lease = x.lease),
               'result', (
                   SELECT s.callback_result FROM awa.attempt_state s
                   WHERE s.job_id = x.id AND s.run_lease = x.lease
                     AND s.callback_id = x.callback_id)))
    INTO v_rows
    FROM jsonb_array_elements(p_items) e,
         jsonb_to_record(e.value) AS x(id bigint, lease bigint, callback_id uuid,
                                        timeout double precision, progress jsonb);

    -- Resolved before parking: finalize now with the kept resolution.
    SELECT jsonb_agg(jsonb_build_object(
               'id', p.id, 'lease', p.lease, 'slot', p.open_slot, 'st', true,
               'outcome', CASE WHEN jsonb_typeof(p.result -> 'error') IS DISTINCT FROM 'object'
                                   THEN 'completed'
                               WHEN (p.result ->> 'terminal')::boolean THEN 'fail'
                               ELSE 'retry' END,
               'result', p.result -> 'result', 'error', p.result -> 'error',
               'backoff_base', p.result -> 'backoff_base', 'progress', p.progress))
    INTO v_early
    FROM jsonb_to_recordset(v_rows) AS p(id bigint, lease bigint, open_slot integer,
                                          parked boolean, result jsonb, progress jsonb)
    WHERE p.open_slot IS NOT NULL AND NOT p.parked AND p.result IS NOT NULL;

    -- Park the others once, keeping their latest progress for the resolution. The early ones get
    -- their lease too (closed with the attempt just after), so that a later resolution of the
    -- same callback finds it and is told 'stale', not 'unknown'.
    INSERT INTO awa.leases (lease_slot, lease_generation, job_id, run_lease, claim_slot, state,
                            callback_id, callback_timeout_at)
    SELECT v_slot, v_gen, p.id, p.lease, p.open_slot, 'waiting_external', p.callback_id,
           -- An extension that arrived before the park (a heartbeat) is kept.
           GREATEST(now() + make_interval(secs => p.timeout),
                    (SELECT s.callback_extend_to FROM awa.attempt_state s
                     WHERE s.job_id = p.id AND s.run_lease = p.lease
                       AND s.callback_id = p.callback_id))
    FROM jsonb_to_recordset(v_rows) AS p(id bigint, lease bigint, open_slot integer,
                                          parked boolean, callback_id uuid,
                                          timeout double precision)
    WHERE p.open_slot IS NOT NULL AND NOT p.parked
    ON CONFLICT DO NOTHING;
    INSERT INTO awa.attempt_state AS s (job_id, run_lease, progress, callback_id)
    SELECT p.id, p.lease, p.progress, p.callback_id
    FROM jsonb_to_recordset(v_rows) AS p(id bigint, lease bigint, open_slot integer,
                                          parked boolean, result jsonb, callback_id uuid,
                                          progress jsonb)
    WHERE p.open_slot IS NOT NULL AND NOT p.parked AND p.result IS NULL
      AND p.progress IS NOT NULL
    ON CONFLICT (job_id, run_lease) DO UPDATE
    SET progress = EXCLUDED.progress, updated_at = now();

    SELECT jsonb_agg(p.raw) INTO v_stale
    FROM jsonb_to_recordset(v_rows) AS p(open_slot integer, raw jsonb)
    WHERE p.open_slot IS NULL;
    RETURN jsonb_build_object('finalize', COALESCE(v_early, '[]'::jsonb),
                              'stale', COALESCE(v_stale, '[]'::jsonb));
END
$$;

-- Heartbeat -------------------------------------------------------------------------------------

-- Refresh the heartbeat (and, when given, the progress) of a batch of live attempts:
-- p_items is a JSON array of {"id", "lease", "progress"?}. Returns the attempts that are no
-- longer open (finished, rescued or cancelled elsewhere); nothing is written for those.
CREATE OR REPLACE FUNCTION awa.heartbeat_v1(p_items jsonb)
 RETURNS TABLE(job_id bigint, run_lease bigint)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    WITH items AS (
        SELECT x.id, x.lease, x.progress
        FROM jsonb_to_recordset(p_items) AS x(id bigint, lease bigint, progress jsonb)
    ), live AS (
        SELECT i.* FROM items i
        WHERE EXISTS (
            SELECT 1 FROM awa.claims c
            WHERE c.job_id = i.id AND c.run_lease = i.lease
              AND NOT EXISTS (
                  SELECT 1 FROM awa.claim_closures z
                  WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                    AND z.claim_slot = c.claim_slot))
    ), up AS (
        INSERT INTO awa.attempt_state AS s (job_id, run_lease, heartbeat_at, progress, updated_at)
        SELECT id, lease, now(), progress, now() FROM live
        ON CONFLICT (job_id, run_lease) DO UPDATE
        SET heartbeat_at = now(), progress = COALESCE(EXCLUDED.progress, s.progress),
            updated_at = now()
    )
    SELECT i.id, i.lease FROM items i
    WHERE NOT EXISTS (SELECT 1 FROM live l WHERE l.id = i.id AND l.lease = i.lease)
$$;

-- Whether the attempt (p_job_id, p_run_lease) is open: a claim of it without closure.
-- VOLATILE: it reads in a snapshot taken after its locks, so a claim prune that carried the
-- claim forward and truncated its slot while this waited is seen whole (awa.lane_cursor_v1).
CREATE OR REPLACE FUNCTION awa._attempt_open_v1(p_job_id bigint, p_run_lease bigint)
 RETURNS boolean
 LANGUAGE sql
 VOLATILE
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT EXISTS (
        SELECT 1 FROM awa.claims c
        WHERE c.job_id = p_job_id AND c.run_lease = p_run_lease
          AND NOT EXISTS (
              SELECT 1 FROM awa.claim_closures z
              WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease
                AND z.claim_slot = c.claim_slot))
$$;
