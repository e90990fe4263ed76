-- Every queue that queue_counts_v1() reports (one with metadata, history, deferred jobs or dead
-- letters), from the control table and a skip scan of each plane's queue index (one probe per
-- queue), without computing any statistic.
CREATE OR REPLACE FUNCTION awa._queue_names_v1()
 RETURNS SETOF text
 LANGUAGE sql
 STABLE
AS $$
    WITH RECURSIVE done_q AS (
        (SELECT d.queue FROM awa.done_entries d ORDER BY d.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT d.queue FROM awa.done_entries d WHERE d.queue > q.queue
                ORDER BY d.queue LIMIT 1)
        FROM done_q q WHERE q.queue IS NOT NULL
    ), deferred_q AS (
        (SELECT d.queue FROM awa.deferred_jobs d ORDER BY d.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT d.queue FROM awa.deferred_jobs d WHERE d.queue > q.queue
                ORDER BY d.queue LIMIT 1)
        FROM deferred_q q WHERE q.queue IS NOT NULL
    ), dlq_q AS (
        (SELECT d.queue FROM awa.dlq_entries d ORDER BY d.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT d.queue FROM awa.dlq_entries d WHERE d.queue > q.queue
                ORDER BY d.queue LIMIT 1)
        FROM dlq_q q WHERE q.queue IS NOT NULL
    )
    SELECT m.queue FROM awa.queue_meta m
    UNION SELECT q.queue FROM done_q q WHERE q.queue IS NOT NULL
    UNION SELECT q.queue FROM deferred_q q WHERE q.queue IS NOT NULL
    UNION SELECT q.queue FROM dlq_q q WHERE q.queue IS NOT NULL
$$;

-- Jobs of one queue completed since p_since (the last hour, for queue_stats_v1): an index range
-- of done_entries_queue_state_idx, newest first.
CREATE OR REPLACE FUNCTION awa._completed_since_v1(p_queue text, p_since timestamp with time zone)
 RETURNS bigint
 LANGUAGE sql
 STABLE
AS $$
    SELECT count(*) FROM awa.done_entries d
    WHERE d.queue = p_queue AND d.state = 'completed' AND d.finalized_at > p_since
$$;

-- Counts ------------------------------------------------------------------------------------------

-- Terminal history per queue and outcome, exact at any size: per (queue, state, ready slot),
-- the latest fold of awa.done_counts plus the deltas written since (at most a few hundred per
-- key between two of the leader's folds, more only while a long transaction holds the fold
-- back). Costs a few index probes per queue, outcome and slot holding history.
CREATE OR REPLACE FUNCTION awa._history_counts_v2()
 RETURNS TABLE(queue text, state text, n bigint)
 LANGUAGE sql
 STABLE
AS $$
    SELECT l.queue, l.state, sum(COALESCE(l.fold_n, 0) + COALESCE(d.n, 0))::bigint
    FROM awa._done_count_folds_v1() l
    CROSS JOIN LATERAL (
        SELECT sum(c.n) AS n FROM awa.done_counts c
        WHERE c.queue = l.queue AND c.state = l.state AND c.ready_slot = l.ready_slot
          AND c.folded_before IS NULL
          AND c.xid >= COALESCE(l.folded_before, '0'::xid8)) d
    GROUP BY l.queue, l.state
$$;

-- The read surfaces below that see the claim ring are VOLATILE: their one statement reads in a
-- snapshot taken after its locks, so a claim prune that carried a running job's claim forward
-- and truncated its slot while the read waited for it is seen whole; a STABLE function reads in
-- its caller's snapshot and would miss the job (docs/design/derived-claim-cursor.md).

-- Counts per queue and state, all exact: the live planes (available, running,
-- waiting_external, scheduled, retryable, dlq) counted, terminal history (completed, failed,
-- cancelled) from its counts (awa._history_counts_v2). Costs what the
-- live planes hold plus a few index probes per queue, outcome and ring slot.
CREATE OR REPLACE FUNCTION awa.queue_counts_v1()
 RETURNS TABLE(
    queue text, available bigint, running bigint, waiting_external bigint, scheduled bigint,
    retryable bigint, completed bigint, failed bigint, cancelled bigint, dlq bigint,
    paused boolean)
 LANGUAGE sql
 VOLATILE
 SECURITY DEFINER
 SET work_mem TO '32MB'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    WITH live AS (
        SELECT j.queue, j.state, count(*) AS n
        FROM awa.live_jobs j
        GROUP BY j.queue, j.state
    ), done AS (
        SELECT h.queue, h.state, h.n FROM awa._history_counts_v2() h
    ), dead AS (
        SELECT q.queue, 'dlq'::text AS state, count(*) AS n FROM awa.dlq_entries q GROUP BY q.queue
    ), allq AS (
        SELECT * FROM live UNION ALL SELECT * FROM done UNION ALL SELECT * FROM dead
    ), names AS (
        SELECT a.queue FROM allq a UNION SELECT m.queue FROM awa.queue_meta m
    )
    SELECT n.queue,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'available'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'running'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'waiting_external'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'scheduled'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'retryable'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'completed'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'failed'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'cancelled'), 0)::bigint,
           COALESCE(sum(a.n) FILTER (WHERE a.state = 'dlq'), 0)::bigint,
           COALESCE((SELECT m.paused FROM awa.queue_meta m WHERE m.queue = n.queue), false)
    FROM names n
    LEFT JOIN allq a ON a.queue = n.queue
    GROUP BY n.queue
    ORDER BY n.queue
$$;

-- The jobs waiting in one lane above its cursor p_cursor, up to its last enqueue position
-- p_last: exact (one index range of the lane, at most 10,001 rows, each row's tombstone
-- probed) while the lane holds at most 10,000 rows above its cursor; beyond, the positions
-- between them, which over-count by the lane's cancelled rows (a lane that deep is a backlog
-- whatever the exact figure). Rows, not positions: a rolled-back enqueue spends a position and
-- writes no row, and the cursor passes its gap only when a later job is claimed, so a
-- difference of positions alone reads a quiet queue as non-empty for good.
CREATE OR REPLACE FUNCTION awa._lane_depth_v1(p_lane_id integer, p_cursor bigint, p_last bigint)
 RETURNS bigint
 LANGUAGE sql
 STABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT CASE
        WHEN p_last <= p_cursor THEN 0::bigint
        ELSE (SELECT CASE WHEN count(*) > 10000 THEN p_last - p_cursor
                          ELSE count(*) FILTER (WHERE NOT r.dead) END
              FROM (SELECT EXISTS (
                               SELECT 1 FROM awa.ready_tombstones t
                               WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                                 AND t.ready_slot = e.ready_slot) AS dead
                    FROM awa.ready_entries e
                    WHERE e.lane_id = p_lane_id AND e.lane_seq > p_cursor
                      AND e.lane_seq <= p_last
                    LIMIT 10001) r)
    END
$$;

-- Depth per queue for the hot path and metrics: the jobs waiting in the queue's lanes
-- (awa._lane_depth_v1: exact while a lane holds at most 10,000 rows above its cursor, the
-- positions beyond) plus the jobs parked by a limit or a serial key (flow_waiting,
-- serial_waiting), which run once they may. Never scans history.
CREATE OR REPLACE FUNCTION awa.queue_depth_v1(p_queue text DEFAULT NULL::text)
 RETURNS TABLE(queue text, available bigint)
 LANGUAGE sql
 VOLATILE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT q.queue, sum(q.n)::bigint
    FROM (
        SELECT l.queue,
               awa._lane_depth_v1(l.lane_id, awa.lane_cursor_v1(l.lane_id),
                                  COALESCE(pg_sequence_last_value(l.enqueue_seq), 0)) AS n
        FROM awa.queue_lanes l
        WHERE p_queue IS NULL OR l.queue = p_queue
        UNION ALL
        SELECT w.queue, count(*) FROM awa.flow_waiting w
        WHERE p_queue IS NULL OR w.queue = p_queue GROUP BY w.queue
        UNION ALL
        SELECT w.queue, count(*) FROM awa.serial_waiting w
        WHERE p_queue IS NULL OR w.queue = p_queue GROUP BY w.queue
    ) q
    GROUP BY q.queue
    ORDER BY q.queue
$$;

-- Lag ----------------------------------------------------------------------------------------------

-- One row per queue that has lanes: available (as awa.queue_depth_v1 counts: exact while a
-- lane holds at most 10,000 rows above its cursor, parked jobs included), lag_seconds (now() minus the
-- run_at of the oldest unclaimed, uncancelled job at the head of a lane; NULL when nothing
-- waits) and paused. Each lane costs its cursor, its sequence, one index probe of
-- ready_entries from the cursor on and the range of its rows above it (at most 10,001): the head of a lane is its oldest job in lane order, so lag_seconds is the age of the
-- oldest waiting job give or take the FIFO order of lanes (a promoted job is appended when it
-- is promoted, behind jobs enqueued after its run_at).
CREATE OR REPLACE FUNCTION awa.queue_lag_v1()
 RETURNS TABLE(queue text, available bigint, lag_seconds double precision, paused boolean)
 LANGUAGE sql
 VOLATILE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    WITH lanes AS (
        SELECT l.queue, l.lane_id, awa.lane_cursor_v1(l.lane_id) AS cursor,
               COALESCE(pg_sequence_last_value(l.enqueue_seq), 0) AS last_seq
        FROM awa.queue_lanes l
    )
    SELECT x.queue,
           (sum(awa._lane_depth_v1(x.lane_id, x.cursor, x.last_seq))
            + (SELECT count(*) FROM awa.flow_waiting w WHERE w.queue = x.queue)
            + (SELECT count(*) FROM awa.serial_waiting w WHERE w.queue = x.queue))::bigint,
           extract(epoch FROM now() - min(h.run_at))::double precision,
           COALESCE(bool_or(m.paused), false)
    FROM lanes x
    LEFT JOIN LATERAL (
        SELECT e.run_at FROM awa.ready_entries e
        WHERE x.last_seq > x.cursor AND e.lane_id = x.lane_id AND e.lane_seq > x.cursor
          AND NOT EXISTS (
              SELECT 1 FROM awa.ready_tombstones t
              WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq
                AND t.ready_slot = e.ready_slot)
        ORDER BY e.lane_seq
        LIMIT 1
    ) h ON true
    LEFT JOIN awa.queue_meta m ON m.queue = x.queue
    GROUP BY x.queue
    ORDER BY x.queue
$$;

-- Per queue: the counts of queue_counts_v1, the age of the oldest available job (lag, seconds)
-- and the jobs completed in the last hour.
CREATE OR REPLACE FUNCTION awa.queue_stats_v1()
 RETURNS TABLE(
    queue text, available bigint, running bigint, waiting_external bigint, scheduled bigint,
    retryable bigint, completed bigint, failed bigint, cancelled bigint, dlq bigint,
    paused boolean, lag_seconds double precision, completed_last_hour bigint)
 LANGUAGE sql
 VOLATILE
 SECURITY DEFINER
 SET work_mem TO '32MB'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT c.*,
           (SELECT extract(epoch FROM now() - min(j.run_at)) FROM awa.live_jobs j
            WHERE j.queue = c.queue AND j.state = 'available'),
           awa._completed_since_v1(c.queue, now() - interval '1 hour')
    FROM awa.queue_counts_v1() c
$$;

-- Completions per minute of the last hour for one queue (NULL: all), oldest first, 60 buckets:
-- one index range of the last hour (every outcome of the last hour when p_queue is NULL; the
-- queue's completions only otherwise), whatever the statistics say.
CREATE OR REPLACE FUNCTION awa.throughput_v1(p_queue text DEFAULT NULL::text)
 RETURNS TABLE(minute timestamp with time zone, completed bigint)
 LANGUAGE plpgsql
 STABLE
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
#variable_conflict use_column
DECLARE
    v_start timestamptz := date_trunc('minute', now()) - interval '59 minutes';
BEGIN
    IF p_queue IS NULL THEN
        RETURN QUERY
        SELECT g.minute, COALESCE(c.n, 0)::bigint
        FROM generate_series(v_start, v_start + interval '59 minutes', interval '1 minute')
             AS g (minute)
        LEFT JOIN (
            SELECT date_trunc('minute', d.finalized_at) AS minute,
                   count(*) FILTER (WHERE d.state = 'completed') AS n
            FROM awa.done_entries d
            WHERE d.finalized_at >= v_start
            GROUP BY 1) c ON c.minute = g.minute
        ORDER BY g.minute;
    ELSE
        RETURN QUERY
        SELECT g.minute, COALESCE(c.n, 0)::bigint
        FROM generate_series(v_start, v_start + interval '59 minutes', interval '1 minute')
             AS g (minute)
        LEFT JOIN (
            SELECT date_trunc('minute', d.finalized_at) AS minute, count(*) AS n
            FROM awa.done_entries d
            WHERE d.queue = p_queue AND d.state = 'completed' AND d.finalized_at >= v_start
            GROUP BY 1) c ON c.minute = g.minute
        ORDER BY g.minute;
    END IF;
END
$$;

-- One queue's outcomes per minute over the last hour, oldest first, 60 buckets: completed,
-- failed and cancelled (terminal history: one index range of the queue's history per outcome)
-- and dead-lettered (one index range of its DLQ). The dashboard's chart.
CREATE OR REPLACE FUNCTION awa.outcomes_per_minute_v1(p_queue text)
 RETURNS TABLE(
    minute timestamp with time zone, completed bigint, failed bigint, cancelled bigint,
    dead_lettered bigint)
 LANGUAGE sql
 STABLE
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    WITH span AS (
        SELECT date_trunc('minute', now()) - interval '59 minutes' AS start
    ), done AS (
        SELECT date_trunc('minute', d.finalized_at) AS minute, d.state, count(*) AS n
        FROM span, unnest(ARRAY['completed', 'failed', 'cancelled']) AS o (state)
        CROSS JOIN LATERAL (
            SELECT d.finalized_at, d.state FROM awa.done_entries d
            WHERE d.queue = p_queue AND d.state = o.state AND d.finalized_at >= span.start) d
        GROUP BY 1, 2
    ), dead AS (
        SELECT date_trunc('minute', q.dlq_at) AS minute, count(*) AS n
        FROM span, awa.dlq_entries q
        WHERE q.queue = p_queue AND q.dlq_at >= span.start
        GROUP BY 1
    )
    SELECT g.minute,
           COALESCE(sum(d.n) FILTER (WHERE d.state = 'completed'), 0)::bigint,
           COALESCE(sum(d.n) FILTER (WHERE d.state = 'failed'), 0)::bigint,
           COALESCE(sum(d.n) FILTER (WHERE d.state = 'cancelled'), 0)::bigint,
           COALESCE((SELECT x.n FROM dead x WHERE x.minute = g.minute), 0)::bigint
    FROM span,
         generate_series(span.start, span.start + interval '59 minutes', interval '1 minute')
             AS g (minute)
    LEFT JOIN done d ON d.minute = g.minute
    GROUP BY g.minute
    ORDER BY g.minute
$$;

-- One queue's roll-up (awa.queue_minutes) over its last p_minutes minutes (1 to 1,440; a
-- queue name and a span outside these are refused), oldest first, one row per minute up to the
-- last that ended 10 s ago: recorded is false for a minute the leader has not rolled up (not
-- yet, or not at all: no leader then), whose figures are NULL. A minute rolled up with nothing
-- to show reads zero outcomes, NULL times, and zero depth when its depth was read (the newest
-- minute of each roll-up), NULL when not. It waits at most 2 s for a lock (a page never hangs).
CREATE OR REPLACE FUNCTION awa.queue_minutes_v2(p_queue text, p_minutes integer)
 RETURNS TABLE(
    minute timestamp with time zone, recorded boolean, completed integer, failed integer,
    cancelled integer, dead_lettered integer, retried integer, wait_p50 double precision,
    wait_p95 double precision, run_p50 double precision, run_p95 double precision,
    available bigint, retryable bigint, oldest_seconds double precision)
 LANGUAGE plpgsql
 STABLE
 SECURITY DEFINER
 SET jit TO 'off'
 SET lock_timeout TO '2s'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    v_last timestamptz := date_trunc('minute', now() - interval '10 seconds') - interval '1 minute';
BEGIN
    IF NOT COALESCE(awa.valid_queue_name(p_queue) AND p_minutes BETWEEN 1 AND 1440, false) THEN
        RAISE EXCEPTION 'awa: queue_minutes_v2: a queue name and 1 to 1440 minutes, got % and %',
            quote_nullable(p_queue), quote_nullable(p_minutes) USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    SELECT g.minute, mark.minute IS NOT NULL,
           CASE WHEN mark.minute IS NOT NULL THEN COALESCE(m.completed, 0) END,
           CASE WHEN mark.minute IS NOT NULL THEN COALESCE(m.failed, 0) END,
           CASE WHEN mark.minute IS NOT NULL THEN COALESCE(m.cancelled, 0) END,
           CASE WHEN mark.minute IS NOT NULL THEN COALESCE(m.dead_lettered, 0) END,
           CASE WHEN mark.minute IS NOT NULL THEN COALESCE(m.retried, 0) END,
           m.wait_p50, m.wait_p95, m.run_p50, m.run_p95,
           CASE WHEN mark.available IS NOT NULL THEN COALESCE(m.available, 0) END,
           CASE WHEN mark.available IS NOT NULL THEN COALESCE(m.retryable, 0) END,
           m.oldest_seconds
    FROM generate_series(v_last - make_interval(mins => p_minutes - 1), v_last,
                         interval '1 minute') AS g (minute)
    LEFT JOIN awa.queue_minutes mark ON mark.queue = '' AND mark.minute = g.minute
    LEFT JOIN awa.queue_minutes m ON m.queue = p_queue AND m.minute = g.minute
    ORDER BY g.minute;
END
$$;

-- Per ring and slot: the rows its children hold and the last prune outcome. rows is exact for
-- children of up to 1,000 pages (8 MB); a bigger child is estimated from its size and the row
-- density PostgreSQL last measured (pg_class), as the planner does, or, when it has none, from a
-- sample of about 100 of its pages. This never counts history row by row.
CREATE OR REPLACE FUNCTION awa.ring_slots_v1()
 RETURNS TABLE(
    ring text, slot integer, is_current boolean, rows bigint, last_prune text,
    last_prune_at timestamp with time zone)
 LANGUAGE plpgsql
 STABLE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
DECLARE
    g record;
    v_slot integer;
    v_table text;
    v_rows bigint;
    v_n bigint;
    v_pages double precision;
    v_relpages double precision;
    v_reltuples double precision;
BEGIN
    FOR g IN SELECT s.ring, s.slot_count, s.current_slot FROM awa.ring_state s ORDER BY s.ring LOOP
        FOR v_slot IN 0..(g.slot_count - 1) LOOP
            v_rows := 0;
            FOREACH v_table IN ARRAY awa._ring_children_v1(g.ring, v_slot) LOOP
                SELECT pg_relation_size(c.oid) / current_setting('block_size')::double precision,
                       c.relpages, c.reltuples
                INTO v_pages, v_relpages, v_reltuples
                FROM pg_class c
                WHERE c.oid = format('awa.%I', v_table)::regclass;
                IF v_pages <= 1000 THEN
                    EXECUTE format('SELECT count(*) FROM awa.%I', v_table) INTO v_n;
                ELSIF v_relpages > 0 AND v_reltuples > 0 THEN
                    v_n := round(v_reltuples / v_relpages * v_pages);
                ELSE
                    EXECUTE format('SELECT round(count(*) * %s) FROM awa.%I '
                                   'TABLESAMPLE SYSTEM (%s) REPEATABLE (0)',
                                   v_pages / 100, v_table, 10000 / v_pages) INTO v_n;
                END IF;
                v_rows := v_rows + v_n;
            END LOOP;
            ring := g.ring;
            slot := v_slot;
            is_current := v_slot = g.current_slot;
            rows := v_rows;
            SELECT p.outcome, p.pruned_at INTO last_prune, last_prune_at
            FROM awa.ring_prunes p WHERE p.ring = g.ring AND p.slot = v_slot
            ORDER BY p.pruned_at DESC LIMIT 1;
            RETURN NEXT;
        END LOOP;
    END LOOP;
END
$$;

-- The admin's queue list. Same rows as queue_stats_v1(), but a query that reads only the queue
-- names (the admin's capped count of the list) computes no statistic: the statistics are
-- computed once per query, when a column needs them, into one JSON object by queue (an init
-- plan), which each row then reads by key (a lookup per row, not a scan of every queue).
CREATE OR REPLACE VIEW awa.queue_stats AS
WITH s AS MATERIALIZED (SELECT * FROM awa.queue_stats_v1())
SELECT n.queue,
       COALESCE((x.r ->> 'available')::bigint, 0) AS available,
       COALESCE((x.r ->> 'running')::bigint, 0) AS running,
       COALESCE((x.r ->> 'waiting_external')::bigint, 0) AS waiting_external,
       COALESCE((x.r ->> 'scheduled')::bigint, 0) AS scheduled,
       COALESCE((x.r ->> 'retryable')::bigint, 0) AS retryable,
       COALESCE((x.r ->> 'completed')::bigint, 0) AS completed,
       COALESCE((x.r ->> 'failed')::bigint, 0) AS failed,
       COALESCE((x.r ->> 'cancelled')::bigint, 0) AS cancelled,
       COALESCE((x.r ->> 'dlq')::bigint, 0) AS dlq,
       COALESCE((x.r ->> 'paused')::boolean, false) AS paused,
       (x.r ->> 'lag_seconds')::double precision AS lag_seconds,
       COALESCE((x.r ->> 'completed_last_hour')::bigint, 0) AS completed_last_hour
FROM awa._queue_names_v1() AS n (queue)
CROSS JOIN LATERAL (
    SELECT (SELECT jsonb_object_agg(s.queue, to_jsonb(s)) FROM s) -> n.queue AS r) x;

-- One job by id -------------------------------------------------------------------------------

-- One job as awa.jobs shows it, from whichever plane holds it (no row: unknown, or aged out of
-- history), and claims: [attempt, worker_id] of each of its claims still in the claim ring, by
-- run lease. The read of an application role (docs/roles.md): it runs as the owner, so the role
-- needs no privilege on the tables, and reads one job whose id it knows, never a list. JIT is
-- off whatever the session says: the view spans every partition, and compiling it costs seconds
-- for a few rows (docs/configuration.md). Planned for the id at each call, as a client's
-- statement would be.
CREATE OR REPLACE FUNCTION awa.job_v1(p_job_id bigint)
 RETURNS TABLE(
    id bigint, kind text, queue text, state text, priority smallint, attempt smallint,
    max_attempts smallint, run_lease bigint, args jsonb, run_at timestamp with time zone,
    created_at timestamp with time zone, attempted_at timestamp with time zone,
    finalized_at timestamp with time zone, deadline_at timestamp with time zone,
    heartbeat_at timestamp with time zone, errors jsonb, result jsonb, progress jsonb,
    metadata jsonb, tags text[], in_dlq boolean, dlq_reason text, claims jsonb)
 LANGUAGE plpgsql
 VOLATILE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
BEGIN
    RETURN QUERY EXECUTE
        'SELECT j.*, (SELECT jsonb_agg(jsonb_build_array(k.attempt, k.worker_id) '
        '             ORDER BY k.run_lease) FROM awa.claims k WHERE k.job_id = j.id) '
        'FROM awa.jobs j WHERE j.id = $1 LIMIT 1'
        USING p_job_id;
END
$$;

-- When a job was enqueued (its created_at on the database clock), while it is available or
-- scheduled: what the django.tasks backend shows right after an enqueue. Two index probes.
CREATE OR REPLACE FUNCTION awa.job_enqueued_at_v1(p_job_id bigint)
 RETURNS timestamp with time zone
 LANGUAGE sql
 STABLE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
    SELECT x.created_at FROM (
        SELECT r.created_at FROM awa.ready_entries r WHERE r.job_id = p_job_id
        UNION ALL
        SELECT d.created_at FROM awa.deferred_jobs d WHERE d.job_id = p_job_id
    ) x
    LIMIT 1
$$;

-- Jobs of every plane, newest (highest id) first, at most p_limit (1 to 100,000), filtered by
-- state, queue, kind (exactly), a tag the job carries and whether it is dead-lettered (NULL: no
-- filter). Each filter is pushed into every plane of awa.jobs (history: the kind, queue and
-- state indexes of done_entries; a tag alone filters history rows as they are read): the
-- statement is planned with the values at each call. JIT is off whatever the session says.
CREATE OR REPLACE FUNCTION awa.job_list_v1(
    p_state text DEFAULT NULL::text, p_queue text DEFAULT NULL::text,
    p_kind text DEFAULT NULL::text, p_tag text DEFAULT NULL::text,
    p_in_dlq boolean DEFAULT NULL::boolean, p_limit integer DEFAULT 100)
 RETURNS TABLE(
    id bigint, kind text, queue text, state text, priority smallint, attempt smallint,
    max_attempts smallint, run_at timestamp with time zone, created_at timestamp with time zone,
    finalized_at timestamp with time zone, tags text[], in_dlq boolean)
 LANGUAGE plpgsql
 VOLATILE
 SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
        RAISE EXCEPTION 'p_limit: must be an integer from 1 to 100000, not %',
            COALESCE(p_limit::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    RETURN QUERY EXECUTE
        'SELECT j.id, j.kind, j.queue, j.state, j.priority, j.attempt, j.max_attempts, '
        '       j.run_at, j.created_at, j.finalized_at, j.tags, j.in_dlq '
        'FROM awa.jobs j '
        'WHERE ($1::text IS NULL OR j.state = $1::text) '
        '  AND ($2::text IS NULL OR j.queue = $2::text) '
        '  AND ($3::text IS NULL OR j.kind = $3::text) '
        '  AND ($4::text IS NULL OR j.tags @> ARRAY[$4::text]) '
        '  AND ($5::boolean IS NULL OR j.in_dlq = $5::boolean) '
        'ORDER BY j.id DESC '
        'LIMIT $6'
        USING p_state, p_queue, p_kind, p_tag, p_in_dlq, p_limit;
END
$$;
