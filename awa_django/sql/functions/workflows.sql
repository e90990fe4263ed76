-- Workflows and batches (docs/workflows.md): steps written in the producer's transaction, each
-- released to its queue by the transaction that ends its last dependency. Tables: tables.sql.

-- The most steps of one workflow, and of one batch (100,000 members and 3 callbacks).
CREATE OR REPLACE FUNCTION awa._workflow_max_steps_v1(p_kind text)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE p_kind WHEN 'batch' THEN 100003 ELSE 10000 END
$$;

-- Write job bodies that may run now to the ready ring and those with a later run_at to the
-- deferred plane (scheduled). Every workflow step reaches its queue through here.
CREATE OR REPLACE FUNCTION awa._workflow_emit_v1(p_bodies awa.job_body[])
 RETURNS void
 LANGUAGE plpgsql
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_ready awa.job_body[];
BEGIN
    IF COALESCE(cardinality(p_bodies), 0) = 0 THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM unnest(p_bodies) u WHERE u.run_at > v_now) THEN
        PERFORM awa._append_ready_grouped_v1(p_bodies, true);
        RETURN;
    END IF;
    INSERT INTO awa.deferred_jobs (
        job_id, state, queue, priority, kind, args, attempt, max_attempts, run_lease, run_at,
        created_at, deadline_secs, metadata, tags)
    SELECT u.job_id, 'scheduled', u.queue, u.priority, u.kind, u.args, 0, u.max_attempts, 0,
           u.run_at, u.created_at, u.deadline_secs, u.metadata, u.tags
    FROM unnest(p_bodies) u
    WHERE u.run_at > v_now;
    v_ready := ARRAY(SELECT u FROM unnest(p_bodies) u WHERE u.run_at <= v_now);
    PERFORM awa._append_ready_grouped_v1(v_ready, true);
END
$$;

-- Release waiting steps (their bodies) to their queues, in the caller's transaction; never
-- raises for a body that cannot be written (a data or constraint error: the table checks make
-- it impossible, this is the last line): such a step goes to history as failed ("release
-- failed: ..."), and its id is returned for the caller to settle. Other errors (a deadlock, a
-- lost lock, a cancel) are raised: the caller's transaction is retried as a whole.
CREATE OR REPLACE FUNCTION awa._workflow_release_v1(p_bodies awa.job_body[])
 RETURNS bigint[]
 LANGUAGE plpgsql
AS $$
DECLARE
    b awa.job_body;
    v_failed bigint[] := '{}';
    v_message text;
    v_gen bigint;
    v_slot integer;
BEGIN
    IF COALESCE(cardinality(p_bodies), 0) = 0 THEN
        RETURN v_failed;
    END IF;
    BEGIN
        PERFORM awa._workflow_emit_v1(p_bodies);
        RETURN v_failed;
    EXCEPTION WHEN data_exception OR integrity_constraint_violation THEN
        NULL;  -- one body is bad: release them one by one below
    END;
    FOREACH b IN ARRAY p_bodies LOOP
        BEGIN
            PERFORM awa._workflow_emit_v1(ARRAY[b]);
        EXCEPTION WHEN data_exception OR integrity_constraint_violation THEN
            GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT;
            SELECT r.generation, r.slot INTO v_gen, v_slot
            FROM awa.ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
            INSERT INTO awa.done_entries (
                ready_slot, ready_generation, job_id, run_lease, state, attempt, errors, kind,
                queue, priority, args, max_attempts, run_at, created_at, metadata, tags)
            VALUES (v_slot, v_gen, b.job_id, 0, 'failed', 0,
                    jsonb_build_array(jsonb_build_object(
                        'type', 'awa_django.ReleaseFailed',
                        'message', 'release failed: ' || left(v_message, 2000),
                        'attempt', 0, 'at', now())),
                    b.kind, b.queue, b.priority, b.args, b.max_attempts, b.run_at, b.created_at,
                    b.metadata, b.tags);
            INSERT INTO awa.done_counts (ready_slot, queue, state, n)
            VALUES (v_slot, b.queue, 'failed', 1);
            v_failed := v_failed || b.job_id;
        END;
    END LOOP;
    RETURN v_failed;
END
$$;

-- What the ends of jobs p_ids (each with its state in p_states: completed, failed, cancelled,
-- or skipped) do to their workflows, in the caller's transaction: the workflows' counters move;
-- each waiting step whose dependencies have now all ended is released to its queue (or, when
-- one of them failed or was cancelled, cancelled or skipped as its on_failure says, and that
-- end settled in turn); a workflow whose last step ended is marked finished and announced on
-- the channel awa_done (payload: its id). Jobs that are not steps of an open workflow are
-- passed over (one index probe when some workflow is open, none otherwise).
--
-- Every settle of a workflow locks its row first (workflows in id order), so two transactions
-- ending steps of one workflow settle one after the other, each seeing the other's counts
-- (READ COMMITTED: every statement below takes a new snapshot): a step is released by exactly
-- one of them, and never before its last dependency's end has committed.
CREATE OR REPLACE FUNCTION awa._workflow_settle_v1(p_ids bigint[], p_states text[])
 RETURNS void
 LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[] := p_ids;
    v_states text[] := p_states;
    v_sstates text[];
    v_swfs bigint[];
    v_down bigint[];
    v_n bigint[];
    v_c bigint[];
    v_f bigint[];
    v_k bigint[];
    v_s bigint[];
    v_release bigint[];
    v_cancel bigint[];
    v_skip bigint[];
    v_bodies awa.job_body[];
    v_failed bigint[];
    v_gen bigint;
    v_slot integer;
BEGIN
    IF COALESCE(cardinality(p_ids), 0) = 0
       OR NOT EXISTS (SELECT 1 FROM awa.workflows w WHERE w.finished_at IS NULL) THEN
        RETURN;
    END IF;
    LOOP
        WITH ended AS MATERIALIZED (
            SELECT s.job_id, s.workflow_id, s.feeds, x.state
            FROM unnest(v_ids, v_states) AS x(id, state)
            JOIN awa.workflow_steps s ON s.job_id = x.id
        ), hit AS (
            SELECT d.downstream, count(*) AS n,
                   count(*) FILTER (WHERE e.state = 'completed') AS c,
                   count(*) FILTER (WHERE e.state = 'failed') AS f,
                   count(*) FILTER (WHERE e.state = 'cancelled') AS k,
                   count(*) FILTER (WHERE e.state = 'skipped') AS s
            FROM ended e CROSS JOIN LATERAL unnest(e.feeds) AS d(downstream)
            GROUP BY d.downstream
        )
        SELECT (SELECT array_agg(e.workflow_id) FROM ended e),
               (SELECT array_agg(e.state) FROM ended e),
               h.down, h.n, h.c, h.f, h.k, h.s
        INTO v_swfs, v_sstates, v_down, v_n, v_c, v_f, v_k, v_s
        FROM (SELECT array_agg(downstream) AS down, array_agg(n) AS n, array_agg(c) AS c,
                     array_agg(f) AS f, array_agg(k) AS k, array_agg(s) AS s FROM hit) h;
        EXIT WHEN v_swfs IS NULL;
        PERFORM 1 FROM awa.workflows w
        WHERE w.workflow_id IN (SELECT DISTINCT u FROM unnest(v_swfs) u)
        ORDER BY w.workflow_id FOR UPDATE;

        WITH tally AS (
            SELECT x.workflow_id, count(*) AS n,
                   count(*) FILTER (WHERE x.state = 'completed') AS c,
                   count(*) FILTER (WHERE x.state = 'failed') AS f,
                   count(*) FILTER (WHERE x.state = 'cancelled') AS k,
                   count(*) FILTER (WHERE x.state = 'skipped') AS s
            FROM unnest(v_swfs, v_sstates) AS x(workflow_id, state)
            GROUP BY x.workflow_id
        ), moved AS (
            UPDATE awa.workflows w
            SET completed = w.completed + t.c, failed = w.failed + t.f,
                cancelled = w.cancelled + t.k, skipped = w.skipped + t.s,
                finished_at = CASE WHEN w.completed + w.failed + w.cancelled + w.skipped + t.n
                                        >= w.steps THEN now() END
            FROM tally t
            WHERE w.workflow_id = t.workflow_id
            RETURNING w.workflow_id, w.finished_at
        )
        SELECT count(pg_notify('awa_done', m.workflow_id::text)) INTO v_slot
        FROM moved m WHERE m.finished_at IS NOT NULL;

        -- A step whose last dependencies these are, all of them completed (or skipped), is
        -- released by deleting its row (one write); the others' rows are updated and decided.
        WITH hit AS (
            SELECT * FROM unnest(v_down, v_n, v_c, v_f, v_k, v_s) AS h(downstream, n, c, f, k, s)
        ), ready AS (
            DELETE FROM awa.workflow_waiting w
            USING hit h, awa.workflow_steps s
            WHERE w.job_id = h.downstream AND s.job_id = w.job_id AND w.deps_left = h.n
              AND w.failed + w.cancelled + h.f + h.k = 0 AND s.on_failure <> 'failed_only'
            RETURNING w.*, h.c AS hc, h.s AS hs
        ), moved AS (
            UPDATE awa.workflow_waiting w
            SET deps_left = w.deps_left - h.n, completed = w.completed + h.c,
                failed = w.failed + h.f, cancelled = w.cancelled + h.k, skipped = w.skipped + h.s
            FROM hit h
            WHERE w.job_id = h.downstream AND w.job_id NOT IN (SELECT r.job_id FROM ready r)
            RETURNING w.job_id, w.deps_left, w.failed + w.cancelled AS bad
        ), decided AS (
            SELECT m.job_id,
                   -- Decided once every dependency has ended, never before: a step after
                   -- this one never starts while one of its ancestors still runs.
                   CASE WHEN m.deps_left > 0 THEN 'wait'
                        WHEN m.bad > 0 AND s.on_failure IN ('cancel', 'skip') THEN s.on_failure
                        WHEN m.bad = 0 AND s.on_failure = 'failed_only' THEN 'skip'
                        ELSE 'release' END AS what
            FROM moved m JOIN awa.workflow_steps s ON s.job_id = m.job_id
        )
        SELECT (SELECT array_agg(ROW(
                    g.job_id, g.kind, g.queue, g.priority, g.args, 0, g.max_attempts, 0,
                    CASE WHEN g.delay IS NOT NULL
                         THEN clock_timestamp() + make_interval(secs => g.delay)
                         ELSE GREATEST(COALESCE(g.run_at, clock_timestamp()),
                                       clock_timestamp()) END,
                    g.created_at, g.deadline_secs,
                    jsonb_set(COALESCE(g.metadata, '{}'::jsonb), '{awa:workflow,deps}',
                              jsonb_build_object('completed', g.completed + g.hc, 'failed', 0,
                                                 'cancelled', 0, 'skipped', g.skipped + g.hs)),
                    g.tags, NULL, NULL)::awa.job_body ORDER BY g.job_id) FROM ready g),
               (SELECT array_agg(d.job_id) FILTER (WHERE d.what = 'release') FROM decided d),
               (SELECT array_agg(d.job_id) FILTER (WHERE d.what = 'cancel') FROM decided d),
               (SELECT array_agg(d.job_id) FILTER (WHERE d.what = 'skip') FROM decided d)
        INTO v_bodies, v_release, v_cancel, v_skip;
        v_failed := awa._workflow_release_v1(v_bodies);

        IF v_release IS NOT NULL THEN
            -- Steps that run whatever their dependencies did (on_failure 'run', or a batch's
            -- 'failed_only' callback after a failure).
            WITH gone AS (
                DELETE FROM awa.workflow_waiting w WHERE w.job_id = ANY (v_release)
                RETURNING w.*
            )
            SELECT array_agg(ROW(
                       g.job_id, g.kind, g.queue, g.priority, g.args, 0, g.max_attempts, 0,
                       CASE WHEN g.delay IS NOT NULL
                            THEN clock_timestamp() + make_interval(secs => g.delay)
                            ELSE GREATEST(COALESCE(g.run_at, clock_timestamp()),
                                          clock_timestamp()) END,
                       g.created_at, g.deadline_secs,
                       jsonb_set(COALESCE(g.metadata, '{}'::jsonb), '{awa:workflow,deps}',
                                 jsonb_build_object('completed', g.completed, 'failed', g.failed,
                                                    'cancelled', g.cancelled,
                                                    'skipped', g.skipped)),
                       g.tags, NULL, NULL)::awa.job_body ORDER BY g.job_id)
            INTO v_bodies FROM gone g;
            v_failed := v_failed || awa._workflow_release_v1(v_bodies);
        END IF;

        EXIT WHEN v_cancel IS NULL AND v_skip IS NULL AND cardinality(v_failed) = 0;
        -- Steps that will not run: into history as cancelled, then settled in turn.
        SELECT r.generation, r.slot INTO v_gen, v_slot
        FROM awa.ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
        WITH gone AS (
            DELETE FROM awa.workflow_waiting w
            WHERE w.job_id = ANY (COALESCE(v_cancel, '{}') || COALESCE(v_skip, '{}'))
            RETURNING w.*, w.job_id = ANY (COALESCE(v_skip, '{}')) AS skipped_step
        ), written AS (
            INSERT INTO awa.done_entries (
                ready_slot, ready_generation, job_id, run_lease, state, attempt, errors, kind,
                queue, priority, args, max_attempts, run_at, created_at, metadata, tags)
            SELECT v_slot, v_gen, g.job_id, 0, 'cancelled', 0,
                   jsonb_build_array(jsonb_build_object(
                       'type', CASE WHEN g.skipped_step THEN 'awa_django.StepSkipped'
                                    ELSE 'awa_django.StepCancelled' END,
                       'message', CASE
                           WHEN g.skipped_step AND g.failed + g.cancelled = 0
                               THEN 'skipped: every dependency completed'
                           WHEN g.skipped_step
                               THEN format('skipped: %s of its dependencies failed or were '
                                           'cancelled', g.failed + g.cancelled)
                           ELSE format('cancelled: %s of its dependencies failed or were '
                                       'cancelled', g.failed + g.cancelled) END,
                       'attempt', 0, 'at', now())),
                   g.kind, g.queue, g.priority, g.args, g.max_attempts,
                   COALESCE(g.run_at, g.created_at), g.created_at, g.metadata, g.tags
            FROM gone g
            RETURNING job_id, queue
        ), counted AS (
            INSERT INTO awa.done_counts (ready_slot, queue, state, n)
            SELECT v_slot, w.queue, 'cancelled', count(*) FROM written w GROUP BY w.queue
        )
        SELECT COALESCE(array_agg(w.job_id ORDER BY w.job_id), '{}') || v_failed,
               COALESCE(array_agg(CASE WHEN w.job_id = ANY (COALESCE(v_skip, '{}'))
                                       THEN 'skipped' ELSE 'cancelled' END ORDER BY w.job_id),
                        '{}')
               || array_fill('failed'::text, ARRAY[cardinality(v_failed)])
        INTO v_ids, v_states
        FROM written w;
        EXIT WHEN v_ids IS NULL;
    END LOOP;
END
$$;

-- Cancel the steps p_ids that still wait for their dependencies (others are passed over):
-- into history as cancelled with p_reason, then settled. Returns the ids cancelled.
CREATE OR REPLACE FUNCTION awa._workflow_cancel_waiting_v1(p_ids bigint[], p_reason text)
 RETURNS bigint[]
 LANGUAGE plpgsql
AS $$
DECLARE
    v_gen bigint;
    v_slot integer;
    v_ids bigint[];
BEGIN
    IF COALESCE(cardinality(p_ids), 0) = 0
       OR NOT EXISTS (SELECT 1 FROM awa.workflow_waiting w WHERE w.job_id = ANY (p_ids)) THEN
        RETURN '{}';
    END IF;
    SELECT r.generation, r.slot INTO v_gen, v_slot
    FROM awa.ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
    -- The workflows' rows first, as every settle takes them (no deadlock with a finalize).
    PERFORM 1 FROM awa.workflows f
    WHERE f.workflow_id IN (SELECT w.workflow_id FROM awa.workflow_waiting w
                            WHERE w.job_id = ANY (p_ids))
    ORDER BY f.workflow_id FOR UPDATE;
    WITH gone AS (
        DELETE FROM awa.workflow_waiting w WHERE w.job_id = ANY (p_ids) RETURNING w.*
    ), written AS (
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, state, attempt, errors, kind, queue,
            priority, args, max_attempts, run_at, created_at, metadata, tags)
        SELECT v_slot, v_gen, g.job_id, 0, 'cancelled', 0,
               jsonb_build_array(jsonb_build_object('type', 'Cancelled', 'message', p_reason,
                                                    'attempt', 0, 'at', now())),
               g.kind, g.queue, g.priority, g.args, g.max_attempts,
               COALESCE(g.run_at, g.created_at), g.created_at, g.metadata, g.tags
        FROM gone g
        RETURNING job_id, queue
    ), counted AS (
        INSERT INTO awa.done_counts (ready_slot, queue, state, n)
        SELECT v_slot, w.queue, 'cancelled', count(*) FROM written w GROUP BY w.queue
    )
    SELECT array_agg(w.job_id ORDER BY w.job_id) INTO v_ids FROM written w;
    PERFORM awa._workflow_settle_as_v1(v_ids, 'cancelled');
    RETURN COALESCE(v_ids, '{}');
END
$$;

-- awa._workflow_settle_v1 for jobs p_ids that all ended in p_state.
CREATE OR REPLACE FUNCTION awa._workflow_settle_as_v1(p_ids bigint[], p_state text)
 RETURNS void
 LANGUAGE sql
AS $$
    SELECT awa._workflow_settle_v1(
        p_ids, array_fill(p_state, ARRAY[COALESCE(cardinality(p_ids), 0)]))
$$;

-- The end of p_job_id (any job) as the workflows see it: 'completed', 'failed', 'cancelled'
-- from history (a step cancelled because it was skipped reads 'skipped'); NULL while it has
-- not ended (a dead-lettered step has not: its workflow waits for a retry or a purge).
CREATE OR REPLACE FUNCTION awa._workflow_end_of_v1(p_job_id bigint)
 RETURNS text
 LANGUAGE sql
 STABLE
AS $$
    SELECT CASE WHEN d.state = 'cancelled'
                     AND d.errors -> -1 ->> 'type' = 'awa_django.StepSkipped'
                THEN 'skipped' ELSE d.state END
    FROM awa.done_entries d WHERE d.job_id = p_job_id
    ORDER BY d.finalized_at DESC LIMIT 1
$$;

-- Enqueue a workflow or a batch in the caller's transaction (docs/workflows.md, "Raw SQL").
-- p_workflow: {"name": text, "kind": "workflow" (default) | "batch", "steps": [step, ...]}; a
-- step: {"step": its name (default: its position), "job": a job object of awa.enqueue_v1,
-- "after": [names of earlier steps] or "*" (every earlier step that is not itself "*"),
-- "on_failure": "cancel" (default) | "skip" | "run" | "failed_only"}. Steps without "after"
-- are written to their queues at once; the others wait for their dependencies. At most
-- awa._workflow_max_steps_v1(kind) steps. Refused input writes nothing: SQLSTATE 22023 naming
-- the step and field. Returns one row per step, in order: the workflow's id, the step, its job
-- id and state (available, scheduled; a waiting step is scheduled).
CREATE OR REPLACE FUNCTION awa.workflow_enqueue_v1(p_workflow jsonb, p_limits jsonb DEFAULT '{}'::jsonb)
 RETURNS TABLE(workflow_id bigint, step text, job_id bigint, state text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET plan_cache_mode TO 'force_generic_plan'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
    v_name text;
    v_kind text;
    v_steps jsonb;
    v_n integer;
    v_error text;
    v_deferred bigint;
    v_jobs jsonb;
    v_wf bigint;
    v_ids bigint[];
    v_names text[];
    v_policies text[];
    v_delays double precision[];
    v_all awa.job_body[];
    v_roots awa.job_body[];
    v_waits boolean[];
BEGIN
    IF p_workflow IS NULL OR jsonb_typeof(p_workflow) <> 'object' THEN
        RAISE EXCEPTION 'workflow: expected a JSON object' USING ERRCODE = '22023';
    END IF;
    v_error := awa._limits_error_v1(p_limits);
    IF v_error IS NULL THEN
        SELECT format('workflow: unknown key %s', quote_literal(left(k, 100))) INTO v_error
        FROM jsonb_object_keys(p_workflow - '{name,kind,steps}'::text[]) k LIMIT 1;
    END IF;
    IF v_error IS NULL AND jsonb_typeof(p_workflow -> 'name') IS DISTINCT FROM 'string' THEN
        v_error := 'name: must be a string';
    END IF;
    v_name := p_workflow ->> 'name';
    IF v_error IS NULL AND (v_name = '' OR length(v_name) > 200) THEN
        v_error := 'name: must be 1 to 200 characters';
    END IF;
    IF v_error IS NULL AND (v_name ~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]') THEN
        v_error := 'name: must not contain control characters';
    END IF;
    v_kind := COALESCE(p_workflow ->> 'kind', 'workflow');
    IF v_error IS NULL AND (jsonb_typeof(p_workflow -> 'kind') NOT IN ('string', 'null')
                            OR v_kind NOT IN ('workflow', 'batch')) THEN
        v_error := 'kind: must be "workflow" or "batch"';
    END IF;
    v_steps := p_workflow -> 'steps';
    IF v_error IS NULL AND jsonb_typeof(v_steps) IS DISTINCT FROM 'array' THEN
        v_error := 'steps: must be a JSON array of step objects';
    END IF;
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;
    v_n := jsonb_array_length(v_steps);
    IF v_n = 0 THEN
        RAISE EXCEPTION 'steps: a % needs at least one step', v_kind USING ERRCODE = '22023';
    ELSIF v_n > awa._workflow_max_steps_v1(v_kind) THEN
        RAISE EXCEPTION 'steps: % steps exceeds the limit of % for a %', v_n,
            awa._workflow_max_steps_v1(v_kind), v_kind USING ERRCODE = '22023';
    END IF;

    -- The shape of each step: its keys, name, dependencies and policy.
    SELECT format('step %s: %s', e.ord - 1, x.err) INTO v_error
    FROM jsonb_array_elements(v_steps) WITH ORDINALITY AS e(value, ord)
    CROSS JOIN LATERAL (SELECT CASE
        WHEN jsonb_typeof(e.value) <> 'object' THEN 'must be a JSON object'
        WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(e.value - '{step,job,after,on_failure}'::text[]))
            THEN format('unknown key %s', (SELECT quote_literal(left(k, 100))
                 FROM jsonb_object_keys(e.value - '{step,job,after,on_failure}'::text[]) k LIMIT 1))
        WHEN jsonb_typeof(e.value -> 'step') NOT IN ('string', 'null')
            THEN 'step: must be a string'
        WHEN e.value ? 'step' AND (e.value ->> 'step' = '' OR length(e.value ->> 'step') > 200
                                   OR e.value ->> 'step' ~ '[\x01-\x1f\x7f-\x9f\u2028\u2029]')
            THEN 'step: must be 1 to 200 characters, no control characters'
        WHEN jsonb_typeof(e.value -> 'job') IS DISTINCT FROM 'object'
            THEN 'job: must be a job object'
        WHEN jsonb_typeof(e.value -> 'on_failure') NOT IN ('string', 'null')
             OR COALESCE(e.value ->> 'on_failure', 'cancel')
                NOT IN ('cancel', 'skip', 'run', 'failed_only')
            THEN 'on_failure: must be "cancel", "skip", "run" or "failed_only"'
        WHEN e.value -> 'after' = '"*"' AND e.ord = 1
            THEN 'after: "*" needs an earlier step'
        WHEN jsonb_typeof(e.value -> 'after') NOT IN ('array', 'null')
             AND e.value -> 'after' <> '"*"'
            THEN 'after: must be a list of earlier steps'' names, or "*"'
        WHEN jsonb_typeof(e.value -> 'after') = 'array'
             AND jsonb_array_length(e.value -> 'after') > awa._workflow_max_steps_v1(v_kind)
            THEN 'after: too many dependencies'
        -- A batch is members and callbacks: nothing else may wait (its bound is a batch's).
        WHEN v_kind = 'batch' AND e.value ? 'after' AND e.value -> 'after' <> '"*"'
            THEN 'after: a batch''s steps wait for nothing (members) or for "*" (callbacks)'
        END AS err) x
    WHERE x.err IS NOT NULL
    ORDER BY e.ord LIMIT 1;
    IF v_error IS NULL THEN
        SELECT format('steps: %s dependencies exceed the limit of %s for a workflow', sum(n),
                      awa._workflow_max_steps_v1('batch'))
        INTO v_error
        FROM (SELECT jsonb_array_length(e.value -> 'after') AS n
              FROM jsonb_array_elements(v_steps) e
              WHERE jsonb_typeof(e.value -> 'after') = 'array') x
        HAVING sum(n) > awa._workflow_max_steps_v1('batch');
    END IF;
    IF v_error IS NULL AND v_kind = 'batch' THEN
        SELECT 'steps: a batch has at most 3 callbacks (steps after "*")' INTO v_error
        FROM jsonb_array_elements(v_steps) e
        WHERE e.value -> 'after' = '"*"'
        HAVING count(*) > 3;
    END IF;
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;

    -- Names are unique; every dependency names an earlier step, once (so no cycle can be
    -- written: a step can only wait for steps before it).
    WITH s AS (
        SELECT e.ord, COALESCE(e.value ->> 'step', (e.ord - 1)::text) AS name, e.value
        FROM jsonb_array_elements(v_steps) WITH ORDINALITY AS e(value, ord)
    )
    SELECT err INTO v_error FROM (
        SELECT b.ord, format('step %s: step: %s is the name of step %s too', b.ord - 1,
                             quote_literal(left(b.name, 100)), a.ord - 1) AS err
        FROM s a JOIN s b ON a.name = b.name AND a.ord < b.ord
        UNION ALL
        SELECT s.ord, format('step %s (%s): after: %s', s.ord - 1, quote_literal(left(s.name, 100)),
            CASE WHEN jsonb_typeof(d.value) <> 'string' THEN 'must list step names (strings)'
                 WHEN d.value #>> '{}' = s.name
                     THEN 'a step cannot wait for itself (workflows have no cycles)'
                 WHEN u.ord IS NULL AND EXISTS (SELECT 1 FROM s z WHERE z.name = d.value #>> '{}')
                     THEN format('%s is a later step: a step waits only for steps added before '
                                 'it (workflows have no cycles)', quote_literal(left(d.value #>> '{}', 100)))
                 WHEN u.ord IS NULL
                     THEN format('%s is not a step of this workflow',
                                 quote_literal(left(d.value #>> '{}', 100)))
                 ELSE format('%s is listed twice', quote_literal(left(d.value #>> '{}', 100))) END)
        FROM s
        CROSS JOIN LATERAL (
            SELECT x.value, x.k,
                   row_number() OVER (PARTITION BY x.value ORDER BY x.k) AS nth
            FROM jsonb_array_elements(
                CASE WHEN jsonb_typeof(s.value -> 'after') = 'array' THEN s.value -> 'after'
                     ELSE '[]'::jsonb END) WITH ORDINALITY AS x(value, k)) d
        LEFT JOIN s u ON jsonb_typeof(d.value) = 'string' AND u.name = d.value #>> '{}'
                     AND u.ord < s.ord
        WHERE u.ord IS NULL OR d.nth > 1
    ) bad ORDER BY bad.ord LIMIT 1;
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;

    -- The jobs, validated as awa.enqueue_v1 validates them ('job N' named as 'step N').
    v_jobs := (SELECT jsonb_agg(e.value -> 'job' ORDER BY e.ord)
               FROM jsonb_array_elements(v_steps) WITH ORDINALITY AS e(value, ord));
    BEGIN
        SELECT c.first_error, c.deferred_count INTO v_error, v_deferred
        FROM awa._enqueue_check_v1(v_jobs, v_now, 0, awa._limit_v1(p_limits, 'args_max_bytes'),
                                   awa._limit_v1(p_limits, 'metadata_max_bytes'),
                                   awa._limit_v1(p_limits, 'json_max_depth'),
                                   awa._limit_v1(p_limits, 'max_tags'),
                                   awa._limit_v1(p_limits, 'tag_max_length')) c;
    EXCEPTION WHEN data_exception THEN
        v_error := awa._enqueue_conversion_error_v1(
            v_jobs, v_now, awa._limit_v1(p_limits, 'args_max_bytes'),
            awa._limit_v1(p_limits, 'metadata_max_bytes'), awa._limit_v1(p_limits, 'json_max_depth'),
            awa._limit_v1(p_limits, 'max_tags'), awa._limit_v1(p_limits, 'tag_max_length'));
        IF v_error IS NULL THEN
            RAISE;
        END IF;
    END;
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', regexp_replace(v_error, '^job ', 'step ') USING ERRCODE = '22023';
    END IF;
    SELECT CASE WHEN e.value -> 'metadata' ? 'awa:workflow'
                THEN format('step %s: job: metadata key %s is reserved for awa_django',
                            e.ord - 1, quote_literal('awa:workflow'))
                ELSE format('step %s: metadata: awa:retry: %s', e.ord - 1,
                            awa._retry_policy_error_v1(e.value -> 'metadata' -> 'awa:retry'))
           END
    INTO v_error
    FROM jsonb_array_elements(v_jobs) WITH ORDINALITY AS e(value, ord)
    WHERE jsonb_typeof(e.value -> 'metadata') = 'object'
      AND (e.value -> 'metadata' ? 'awa:workflow'
           OR awa._retry_policy_error_v1(e.value -> 'metadata' -> 'awa:retry') IS NOT NULL)
    ORDER BY e.ord LIMIT 1;
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION '%', v_error USING ERRCODE = '22023';
    END IF;

    v_wf := nextval('awa.workflow_id_seq');
    v_ids := ARRAY(SELECT nextval('awa.job_id_seq') FROM generate_series(1, v_n));
    INSERT INTO awa.workflows (workflow_id, name, kind, steps, created_at)
    VALUES (v_wf, v_name, v_kind, v_n, v_now);

    -- Each step's name, dependencies, policy and job body, by position.
    SELECT array_agg(COALESCE(e.value ->> 'step', (e.ord - 1)::text) ORDER BY e.ord),
           array_agg(COALESCE(e.value ->> 'on_failure', 'cancel') ORDER BY e.ord),
           array_agg(j.delay ORDER BY e.ord),
           array_agg(ROW(
               v_ids[e.ord], j.kind, COALESCE(j.queue, 'default'), COALESCE(j.priority, 0),
               COALESCE(j.args, '{"args": [], "kwargs": {}}'), 0, COALESCE(j.max_attempts, 25),
               0, COALESCE(j.run_at, v_now + make_interval(secs => COALESCE(j.delay, 0))), v_now,
               j.deadline,
               COALESCE(j.metadata, '{}'::jsonb) || jsonb_build_object('awa:workflow',
                   jsonb_build_object('id', v_wf,
                                      'step', COALESCE(e.value ->> 'step', (e.ord - 1)::text))),
               j.tags, NULL, NULL)::awa.job_body ORDER BY e.ord)
    INTO v_names, v_policies, v_delays, v_all
    FROM jsonb_array_elements(v_steps) WITH ORDINALITY AS e(value, ord),
         jsonb_to_record(e.value -> 'job') AS j(kind text, queue text, priority integer,
             args jsonb, max_attempts integer, run_at timestamptz, delay double precision,
             deadline double precision, metadata jsonb, tags text[]);

    -- The dependencies, the steps and the waiting steps' bodies, in one statement.
    WITH n AS (
        SELECT u.name, u.ord FROM unnest(v_names) WITH ORDINALITY AS u(name, ord)
    ), pairs AS MATERIALIZED (
        -- Named dependencies.
        SELECT v_ids[n.ord] AS upstream, v_ids[e.ord] AS downstream
        FROM jsonb_array_elements(v_steps) WITH ORDINALITY AS e(value, ord)
        CROSS JOIN LATERAL jsonb_array_elements_text(
            CASE WHEN jsonb_typeof(e.value -> 'after') = 'array' THEN e.value -> 'after'
                 ELSE '[]'::jsonb END) AS d(name)
        JOIN n ON n.name = d.name
        UNION ALL
        -- "*": every earlier step that is not itself "*".
        SELECT v_ids[u.ord], v_ids[e.ord]
        FROM jsonb_array_elements(v_steps) WITH ORDINALITY AS e(value, ord)
        JOIN jsonb_array_elements(v_steps) WITH ORDINALITY AS u(value, ord)
          ON u.ord < e.ord AND u.value -> 'after' IS DISTINCT FROM '"*"'::jsonb
        WHERE e.value -> 'after' = '"*"'::jsonb
    ), edges AS (
        INSERT INTO awa.workflow_edges (upstream, downstream)
        SELECT p.upstream, p.downstream FROM pairs p
    ), needs AS (
        SELECT p.downstream, count(*)::integer AS n FROM pairs p GROUP BY p.downstream
    ), feeds AS (
        SELECT p.upstream, array_agg(p.downstream ORDER BY p.downstream) AS ids
        FROM pairs p GROUP BY p.upstream
    ), steps AS (
        INSERT INTO awa.workflow_steps (
            job_id, workflow_id, step, kind, queue, needs, on_failure, feeds)
        -- (Arrays are read by unnest, never by subscript: a subscript of a text array reads
        -- it from the start, quadratic over a batch of 100,000.)
        SELECT u.id, v_wf, u.name, u.kind, u.queue, COALESCE(d.n, 0), u.policy, f.ids
        FROM unnest(v_ids, v_names, v_policies, v_all) AS u(id, name, policy, job_id, kind,
            queue, priority, args, attempt, max_attempts, run_lease, run_at, created_at,
            deadline_secs, metadata, tags, errors, progress)
        LEFT JOIN needs d ON d.downstream = u.id
        LEFT JOIN feeds f ON f.upstream = u.id
        RETURNING job_id, needs
    ), waiting AS (
        INSERT INTO awa.workflow_waiting (
            job_id, workflow_id, deps_left, delay, queue, priority, kind, args, max_attempts,
            run_at, created_at, deadline_secs, metadata, tags)
        SELECT b.job_id, v_wf, d.n, b.delay, b.queue, b.priority, b.kind, b.args,
               b.max_attempts, CASE WHEN b.delay IS NULL THEN b.run_at END, v_now,
               b.deadline_secs, b.metadata, b.tags
        FROM unnest(v_all, v_delays) AS b(job_id, kind, queue, priority, args, attempt,
            max_attempts, run_lease, run_at, created_at, deadline_secs, metadata, tags, errors,
            progress, delay)
        JOIN needs d ON d.downstream = b.job_id
    )
    -- Each step's body, if it runs at once, and whether it waits (joined, never searched:
    -- a search of an array per step is quadratic over a batch).
    SELECT array_agg(ROW(b.job_id, b.kind, b.queue, b.priority, b.args, b.attempt,
                         b.max_attempts, b.run_lease, b.run_at, b.created_at, b.deadline_secs,
                         b.metadata, b.tags, b.errors, b.progress)::awa.job_body ORDER BY b.ord)
               FILTER (WHERE s.needs = 0),
           array_agg(s.needs > 0 ORDER BY b.ord)
    INTO v_roots, v_waits
    FROM unnest(v_all) WITH ORDINALITY AS b(job_id, kind, queue, priority, args, attempt,
        max_attempts, run_lease, run_at, created_at, deadline_secs, metadata, tags, errors,
        progress, ord)
    JOIN steps s ON s.job_id = b.job_id;

    PERFORM awa._workflow_emit_v1(v_roots);

    RETURN QUERY
    SELECT v_wf, u.name, u.job_id,
           CASE WHEN u.waits OR u.run_at > v_now THEN 'scheduled' ELSE 'available' END
    FROM unnest(v_names, v_ids, v_waits, ARRAY(SELECT b.run_at FROM unnest(v_all) b))
         WITH ORDINALITY AS u(name, job_id, waits, run_at, ord)
    ORDER BY u.ord;
END
$$;

-- Reads ---------------------------------------------------------------------------------------

-- One workflow: its row and its state: running until its last step ends, then completed (every
-- step completed or skipped) or failed.
CREATE OR REPLACE FUNCTION awa.workflow_v1(p_workflow_id bigint)
 RETURNS TABLE(workflow_id bigint, name text, kind text, state text, steps integer,
               completed integer, failed integer, cancelled integer, skipped integer,
               created_at timestamptz, finished_at timestamptz)
 LANGUAGE sql
 STABLE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT w.workflow_id, w.name, w.kind,
           CASE WHEN w.finished_at IS NULL THEN 'running'
                WHEN w.failed + w.cancelled = 0 THEN 'completed' ELSE 'failed' END,
           w.steps, w.completed, w.failed, w.cancelled, w.skipped, w.created_at, w.finished_at
    FROM awa.workflows w WHERE w.workflow_id = p_workflow_id
$$;

-- Workflows newest first (ids below p_before when given), of one state when p_state is given.
CREATE OR REPLACE FUNCTION awa.workflows_v1(
    p_state text DEFAULT NULL, p_limit integer DEFAULT 100, p_before bigint DEFAULT NULL)
 RETURNS TABLE(workflow_id bigint, name text, kind text, state text, steps integer,
               completed integer, failed integer, cancelled integer, skipped integer,
               created_at timestamptz, finished_at timestamptz)
 LANGUAGE sql
 STABLE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT v.* FROM (
        SELECT w.workflow_id, w.name, w.kind,
               CASE WHEN w.finished_at IS NULL THEN 'running'
                    WHEN w.failed + w.cancelled = 0 THEN 'completed' ELSE 'failed' END AS state,
               w.steps, w.completed, w.failed, w.cancelled, w.skipped, w.created_at,
               w.finished_at
        FROM awa.workflows w
        WHERE p_before IS NULL OR w.workflow_id < p_before
        ORDER BY w.workflow_id DESC
    ) v
    WHERE p_state IS NULL OR v.state = p_state
    LIMIT LEAST(GREATEST(p_limit, 0), 10000)
$$;

-- How many workflows (and batches) are in each state.
CREATE OR REPLACE FUNCTION awa.workflow_counts_v1()
 RETURNS TABLE(kind text, state text, n bigint)
 LANGUAGE sql
 STABLE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT w.kind,
           CASE WHEN w.finished_at IS NULL THEN 'running'
                WHEN w.failed + w.cancelled = 0 THEN 'completed' ELSE 'failed' END,
           count(*)
    FROM awa.workflows w GROUP BY 1, 2 ORDER BY 1, 2
$$;

-- The steps of a workflow, in the order they were added (at most p_limit): each one's job, its
-- dependencies (job ids), policy and state: 'waiting' for its dependencies, a job state
-- (scheduled, available, running, waiting_external, retryable, completed, failed, cancelled),
-- 'dead_lettered', 'skipped', or 'gone' (purged from the DLQ, or its history pruned).
CREATE OR REPLACE FUNCTION awa.workflow_steps_v1(p_workflow_id bigint, p_limit integer DEFAULT 10000)
 RETURNS TABLE(step text, job_id bigint, kind text, queue text, on_failure text, state text,
               after bigint[])
 LANGUAGE sql
 STABLE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    -- Index probes per step (awa._job_brief_v1 looks in each plane by job id), never a read of
    -- a whole plane: a batch of 100,000 is read in about a second.
    SELECT s.step, s.job_id, s.kind, s.queue, s.on_failure,
           CASE WHEN EXISTS (SELECT 1 FROM awa.workflow_waiting w WHERE w.job_id = s.job_id)
                    THEN 'waiting'
                WHEN EXISTS (SELECT 1 FROM awa.dlq_entries q WHERE q.job_id = s.job_id)
                    THEN 'dead_lettered'
                ELSE COALESCE(
                    (SELECT CASE WHEN b.state = 'cancelled'
                                      AND awa._workflow_end_of_v1(s.job_id) = 'skipped'
                                 THEN 'skipped' ELSE b.state END
                     FROM awa._job_brief_v1(s.job_id) b),
                    'gone') END,
           ARRAY(SELECT e.upstream FROM awa.workflow_edges e WHERE e.downstream = s.job_id
                 ORDER BY e.upstream)
    FROM awa.workflow_steps s
    WHERE s.workflow_id = p_workflow_id
    ORDER BY s.job_id
    LIMIT LEAST(GREATEST(p_limit, 0), 100002)
$$;

-- Results of a workflow's steps p_steps (by name; NULL: its final steps, those nothing waits
-- for), from history: each step's job, how it ended (NULL: not yet) and its result.
CREATE OR REPLACE FUNCTION awa.workflow_results_v1(p_workflow_id bigint, p_steps text[] DEFAULT NULL)
 RETURNS TABLE(step text, job_id bigint, state text, result jsonb)
 LANGUAGE sql
 STABLE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT s.step, s.job_id, awa._workflow_end_of_v1(s.job_id),
           (SELECT d.result FROM awa.done_entries d WHERE d.job_id = s.job_id
            ORDER BY d.finalized_at DESC LIMIT 1)
    FROM awa.workflow_steps s
    WHERE s.workflow_id = p_workflow_id
      AND CASE WHEN p_steps IS NULL
               THEN NOT EXISTS (SELECT 1 FROM awa.workflow_edges e WHERE e.upstream = s.job_id)
               ELSE s.step = ANY (p_steps) END
    ORDER BY s.job_id
$$;

-- The dependencies of the step p_job_id: each one's name, job, how it ended and its result
-- (with p_results; the results' total stored size is bounded by p_max_bytes: over it, SQLSTATE
-- 54000 and nothing is read, so that a fan-in of large results cannot exhaust the reader).
CREATE OR REPLACE FUNCTION awa.workflow_upstream_v1(
    p_job_id bigint, p_results boolean DEFAULT true, p_max_bytes bigint DEFAULT 67108864)
 RETURNS TABLE(step text, job_id bigint, state text, result jsonb)
 LANGUAGE plpgsql
 STABLE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_bytes bigint;
    v_n integer;
BEGIN
    IF p_results THEN
        SELECT COALESCE(sum(pg_column_size(d.result)), 0), count(*) INTO v_bytes, v_n
        FROM awa.workflow_edges e
        CROSS JOIN LATERAL (
            SELECT x.result FROM awa.done_entries x WHERE x.job_id = e.upstream
            ORDER BY x.finalized_at DESC LIMIT 1) d
        WHERE e.downstream = p_job_id;
        IF v_bytes > p_max_bytes THEN
            RAISE EXCEPTION 'upstream: the results of % dependencies take % bytes, over the '
                'limit of % bytes: read them one at a time (ctx.upstream_result(step))',
                v_n, v_bytes, p_max_bytes USING ERRCODE = '54000';
        END IF;
    END IF;
    RETURN QUERY
    SELECT s.step, s.job_id, COALESCE(awa._workflow_end_of_v1(s.job_id), 'gone'),
           CASE WHEN p_results THEN
               (SELECT d.result FROM awa.done_entries d WHERE d.job_id = s.job_id
                ORDER BY d.finalized_at DESC LIMIT 1) END
    FROM awa.workflow_edges e
    JOIN awa.workflow_steps s ON s.job_id = e.upstream
    WHERE e.downstream = p_job_id
    ORDER BY s.job_id;
END
$$;

-- The result of the dependency named p_step of the step p_job_id (NULL: none, or no result).
CREATE OR REPLACE FUNCTION awa.workflow_upstream_result_v1(p_job_id bigint, p_step text)
 RETURNS jsonb
 LANGUAGE sql
 STABLE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT (SELECT x.result FROM awa.done_entries x WHERE x.job_id = s.job_id
            ORDER BY x.finalized_at DESC LIMIT 1)
    FROM awa.workflow_edges e
    JOIN awa.workflow_steps s ON s.job_id = e.upstream
    WHERE e.downstream = p_job_id AND s.step = p_step
$$;

-- The workflow and step of the job p_job_id (no row: not a step).
CREATE OR REPLACE FUNCTION awa.workflow_of_v1(p_job_id bigint)
 RETURNS TABLE(workflow_id bigint, name text, kind text, step text)
 LANGUAGE sql
 STABLE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT w.workflow_id, w.name, w.kind, s.step
    FROM awa.workflow_steps s JOIN awa.workflows w ON w.workflow_id = s.workflow_id
    WHERE s.job_id = p_job_id
$$;

-- Operators -------------------------------------------------------------------------------------

-- Cancel the steps p_ids that are scheduled, retryable or available (not yet claimed), in sets:
-- the deferred plane's rows at once, the ready ring's lane by lane (tombstones, as a queue drain
-- writes them, and one skip of the lane's cursor each). Their ends are the caller's to settle.
-- Returns the ids cancelled.
CREATE OR REPLACE FUNCTION awa._workflow_cancel_unclaimed_v1(p_ids bigint[], p_reason text)
 RETURNS bigint[]
 LANGUAGE plpgsql
AS $$
DECLARE
    v_error jsonb := jsonb_build_object('type', 'Cancelled', 'message', p_reason);
    v_gen bigint;
    v_slot integer;
    v_lane integer;
    v_cursor bigint;
    v_got bigint[];
    v_out bigint[] := '{}';
BEGIN
    IF COALESCE(cardinality(p_ids), 0) = 0 THEN
        RETURN v_out;
    END IF;
    SELECT r.generation, r.slot INTO v_gen, v_slot
    FROM awa.ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
    WITH gone AS (
        DELETE FROM awa.deferred_jobs d WHERE d.job_id = ANY (p_ids) RETURNING d.*
    ), retried AS (
        -- A retry cancelled while it waits was still scheduled in its minute (queue charts).
        INSERT INTO awa.queue_minute_retries AS t (queue, minute, retries)
        SELECT g.queue, date_trunc('minute', g.deferred_at), count(*)
        FROM gone g
        WHERE g.state = 'retryable' AND g.deferred_at >= now() - interval '25 hours'
        GROUP BY g.queue, date_trunc('minute', g.deferred_at)
        ON CONFLICT (queue, minute) DO UPDATE SET retries = t.retries + excluded.retries
    ), done AS (
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, state, attempt, attempted_at,
            errors, progress, kind, queue, priority, args, max_attempts, run_at, created_at,
            metadata, tags)
        SELECT v_slot, v_gen, g.job_id, g.run_lease, 'cancelled', g.attempt, g.attempted_at,
               COALESCE(g.errors, '[]'::jsonb)
               || jsonb_build_array(v_error || jsonb_build_object('attempt', g.attempt, 'at', now())),
               g.progress, g.kind, g.queue, g.priority, g.args, g.max_attempts, g.run_at,
               g.created_at, g.metadata, g.tags
        FROM gone g
        RETURNING ready_slot, queue, state, job_id
    ), counted AS (
        INSERT INTO awa.done_counts (ready_slot, queue, state, n)
        SELECT d.ready_slot, d.queue, d.state, count(*) FROM done d
        GROUP BY d.ready_slot, d.queue, d.state
    )
    SELECT COALESCE(array_agg(job_id), '{}') INTO v_out FROM done;

    -- The claim ring's locks first, as a drain takes them (see awa.queue_drain_v2).
    LOCK TABLE awa.claims, awa.lane_floors IN ACCESS SHARE MODE;
    FOR v_lane IN
        SELECT DISTINCT e.lane_id FROM awa.ready_entries e WHERE e.job_id = ANY (p_ids) ORDER BY 1
    LOOP
        PERFORM 1 FROM awa.queue_lanes l WHERE l.lane_id = v_lane FOR UPDATE;
        v_cursor := awa.lane_cursor_v1(v_lane);
        WITH picked AS MATERIALIZED (
            SELECT e.* FROM awa.ready_entries e
            WHERE e.job_id = ANY (p_ids) AND e.lane_id = v_lane AND e.lane_seq > v_cursor
              AND NOT EXISTS (
                  SELECT 1 FROM awa.ready_tombstones t
                  WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                    AND t.ready_slot = e.ready_slot)
        ), tomb AS (
            INSERT INTO awa.ready_tombstones (ready_slot, ready_generation, lane_id, lane_seq, job_id)
            SELECT p.ready_slot, p.ready_generation, p.lane_id, p.lane_seq, p.job_id FROM picked p
            ON CONFLICT DO NOTHING
            RETURNING lane_id, lane_seq, ready_slot
        ), done AS (
            INSERT INTO awa.done_entries (
                ready_slot, ready_generation, job_id, run_lease, lane_id, lane_seq, state,
                attempt, errors, progress, queue, kind)
            SELECT p.ready_slot, p.ready_generation, p.job_id, p.run_lease, p.lane_id,
                   p.lane_seq, 'cancelled', p.attempt,
                   COALESCE(p.errors, '[]'::jsonb)
                   || jsonb_build_array(v_error || jsonb_build_object('attempt', p.attempt, 'at', now())),
                   p.progress, p.queue, p.kind
            FROM picked p
            JOIN tomb t
              ON t.lane_id = p.lane_id AND t.lane_seq = p.lane_seq AND t.ready_slot = p.ready_slot
            RETURNING ready_slot, queue, state, job_id
        ), counted AS (
            INSERT INTO awa.done_counts (ready_slot, queue, state, n)
            SELECT d.ready_slot, d.queue, d.state, count(*) FROM done d
            GROUP BY d.ready_slot, d.queue, d.state
        )
        SELECT COALESCE(array_agg(job_id), '{}') INTO v_got FROM done;
        v_out := v_out || v_got;
        PERFORM awa._lane_skip_v1(v_lane);
    END LOOP;
    RETURN v_out;
END
$$;

-- Cancel every step of a workflow that has not ended: waiting steps, live jobs (a running one is
-- told to stop, as awa.cancel_v1 does) and dead-lettered ones (they leave the DLQ for history).
-- Returns the number of steps cancelled. READ COMMITTED is required.
--
-- Live steps are ended first, each as awa.cancel_v1 ends it, before the workflow's row is
-- locked: a finalize takes an attempt's closure first and its workflow's row second, and so
-- does this, so the two never wait for each other in a cycle. Then, under the row's lock,
-- the waiting steps, the steps a finalize released meanwhile, and the dead-lettered ones;
-- every end is settled once, in sets (linear in the steps).
CREATE OR REPLACE FUNCTION awa.workflow_cancel_v1(p_workflow_id bigint, p_reason text DEFAULT 'workflow cancelled')
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_n integer := 0;
    v_live bigint;
    v_ids bigint[];
    v_gen bigint;
    v_slot integer;
    v_pass integer;
BEGIN
    PERFORM awa._require_read_committed_v1('awa.workflow_cancel_v1');
    IF p_reason IS NULL OR length(p_reason) > 10000 THEN
        RAISE EXCEPTION 'reason: must be text of at most 10000 characters' USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM awa.workflows w WHERE w.workflow_id = p_workflow_id) THEN
        RETURN 0;
    END IF;
    FOR v_pass IN 1..2 LOOP
        -- Unclaimed steps in sets; then the others (running, parked) one by one.
        v_ids := awa._workflow_cancel_unclaimed_v1(ARRAY(
            SELECT s.job_id FROM awa.workflow_steps s
            WHERE s.workflow_id = p_workflow_id
              AND NOT EXISTS (SELECT 1 FROM awa.workflow_waiting w WHERE w.job_id = s.job_id)
              AND NOT EXISTS (SELECT 1 FROM awa.done_entries d WHERE d.job_id = s.job_id)
              AND NOT EXISTS (SELECT 1 FROM awa.dlq_entries q WHERE q.job_id = s.job_id)),
            p_reason);
        FOR v_live IN
            SELECT s.job_id FROM awa.workflow_steps s
            WHERE s.workflow_id = p_workflow_id
              AND NOT EXISTS (SELECT 1 FROM awa.workflow_waiting w WHERE w.job_id = s.job_id)
              AND NOT EXISTS (SELECT 1 FROM awa.done_entries d WHERE d.job_id = s.job_id)
              AND NOT EXISTS (SELECT 1 FROM awa.dlq_entries q WHERE q.job_id = s.job_id)
            ORDER BY s.job_id
        LOOP
            IF awa._cancel_one_v1(v_live, p_reason) IS NOT NULL THEN
                v_ids := v_ids || v_live;
            END IF;
        END LOOP;
        IF v_pass = 1 THEN
            -- The waiting steps (this locks the workflow's row until the transaction ends: no
            -- step is released any more).
            v_n := cardinality(v_ids) + COALESCE(cardinality(awa._workflow_cancel_waiting_v1(
                ARRAY(SELECT w.job_id FROM awa.workflow_waiting w
                      WHERE w.workflow_id = p_workflow_id ORDER BY w.job_id), p_reason)), 0);
            PERFORM 1 FROM awa.workflows w WHERE w.workflow_id = p_workflow_id FOR UPDATE;
        ELSE
            v_n := v_n + cardinality(v_ids);
        END IF;
        PERFORM awa._workflow_settle_as_v1(v_ids, 'cancelled');
    END LOOP;
    -- Dead-lettered steps: out of the DLQ, into history as cancelled.
    SELECT r.generation, r.slot INTO v_gen, v_slot
    FROM awa.ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
    WITH gone AS (
        DELETE FROM awa.dlq_entries q
        WHERE q.job_id IN (SELECT s.job_id FROM awa.workflow_steps s
                           WHERE s.workflow_id = p_workflow_id)
        RETURNING q.*
    ), written AS (
        INSERT INTO awa.done_entries (
            ready_slot, ready_generation, job_id, run_lease, state, attempt, attempted_at,
            errors, progress, kind, queue, priority, args, max_attempts, run_at, created_at,
            metadata, tags)
        SELECT v_slot, v_gen, g.job_id, g.run_lease, 'cancelled', g.attempt, g.attempted_at,
               COALESCE(g.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                   'type', 'Cancelled', 'message', p_reason, 'attempt', g.attempt, 'at', now())),
               g.progress, g.kind, g.queue, g.priority, g.args, g.max_attempts, g.run_at,
               g.created_at, g.metadata, g.tags
        FROM gone g
        RETURNING job_id, queue
    ), counted AS (
        INSERT INTO awa.done_counts (ready_slot, queue, state, n)
        SELECT v_slot, w.queue, 'cancelled', count(*) FROM written w GROUP BY w.queue
    )
    SELECT array_agg(w.job_id ORDER BY w.job_id) INTO v_ids FROM written w;
    PERFORM awa._workflow_settle_as_v1(v_ids, 'cancelled');
    RETURN v_n + COALESCE(cardinality(v_ids), 0);
END
$$;

-- Retry the dead-lettered steps of a workflow (awa.dlq_retry_v2): once they complete, the
-- workflow goes on. Returns the job ids retried.
CREATE OR REPLACE FUNCTION awa.workflow_retry_v1(p_workflow_id bigint)
 RETURNS SETOF bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
BEGIN
    RETURN QUERY
    SELECT r.job_id FROM awa.dlq_retry_v2(ARRAY(
        SELECT q.job_id FROM awa.dlq_entries q
        JOIN awa.workflow_steps s ON s.job_id = q.job_id
        WHERE s.workflow_id = p_workflow_id ORDER BY q.job_id)) r
    WHERE r.outcome = 'retried';
END
$$;

-- Delete up to p_limit workflows that finished more than p_retention seconds ago, with their
-- steps and edges (their jobs' history stays until its ring slot is pruned). Returns the count.
CREATE OR REPLACE FUNCTION awa.workflows_prune_v1(p_retention double precision, p_limit integer DEFAULT 1000)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_ids bigint[];
BEGIN
    v_ids := ARRAY(
        SELECT w.workflow_id FROM awa.workflows w
        WHERE w.finished_at < now() - make_interval(secs => LEAST(GREATEST(p_retention, 0),
                                                                  awa._max_seconds_v1()))
        ORDER BY w.finished_at LIMIT GREATEST(p_limit, 0)
        FOR UPDATE SKIP LOCKED);
    IF cardinality(v_ids) = 0 THEN
        RETURN 0;
    END IF;
    DELETE FROM awa.workflow_edges e
    USING awa.workflow_steps s
    WHERE s.workflow_id = ANY (v_ids) AND e.downstream = s.job_id;
    DELETE FROM awa.workflow_steps s WHERE s.workflow_id = ANY (v_ids);
    DELETE FROM awa.workflows w WHERE w.workflow_id = ANY (v_ids);
    RETURN cardinality(v_ids);
END
$$;
